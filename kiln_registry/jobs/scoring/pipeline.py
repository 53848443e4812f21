"""Phase (d): scoring a claimed job's sequences into its identity-bound corpus.

Requests go to the job's proved endpoints (``jobs.core.endpoints``): its one
URL, or spread over a replica set's standing replicas with fencing.

Sequences are read from the job in pages; each page's cache hits are looked
up in one query (only for the job's identity and K).  Misses are scored with
at most ``[jobs] concurrency`` requests in flight, and results are written in
input order through a bounded reorder window, so memory does not grow with
the job.  Verified scores are committed to the cache in small batches
together with the progress counters (and the durable cancel flag is read
back then).  When any answer fails, every outstanding request is cancelled,
the unflushed batch is dropped and the partial corpus deleted by the caller.
The corpus is signed (once, over the digest taken while writing) and published
atomically before the job is marked ``succeeded``; a job with ``output``
``kiln-logit-cache-v3`` then publishes that corpus's rows into ``[jobs]
logit_cache_root`` as Kiln logit-cache entries (``jobs.scoring.logit_cache_export``), and
fails (its corpus removed) if any entry conflicts with one already there.  The loop itself is
``jobs.core.ordered_pipeline`` (shared with off-policy generation); this module
says how sequences are read, scored, cached and written.

Imports: standard library, numpy, ``kiln_registry.db`` and ``jobs``.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar, Final

import numpy as np
import numpy.typing as npt
from sqlalchemy.orm import Session

from kiln_registry.domain.errors import JobInvalid
from kiln_registry.jobs.core.endpoints import Endpoint, JobTeachers
from kiln_registry.jobs.core.ordered_pipeline import OrderedPipeline
from kiln_registry.jobs.core.repository import JobRepository, SequenceItem
from kiln_registry.jobs.core.state import ClaimedJob
from kiln_registry.jobs.scoring import cache as score_cache
from kiln_registry.jobs.scoring.cache import ScoredSequence
from kiln_registry.jobs.scoring.corpus import CorpusWriter, RowContext
from kiln_registry.jobs.scoring.logit_cache import kiln_timestamp
from kiln_registry.jobs.scoring.logit_cache_export import publish_corpus
from kiln_registry.jobs.scoring.submit import LOGIT_CACHE_OUTPUT
from kiln_registry.jobs.scoring.target import ScoringTarget, score_sequence

PAGE_SIZE: Final = 1_000

Tokens = npt.NDArray[np.int32]


def _tokens(row: SequenceItem) -> Tokens:
    return np.frombuffer(row.token_ids, dtype="<i4")


class ScoringPipeline(OrderedPipeline[SequenceItem, ScoredSequence, CorpusWriter]):
    """Scores one claimed job against ``target`` and publishes its corpus."""

    page_size: ClassVar[int] = PAGE_SIZE
    noun: ClassVar[str] = "sequences"

    def __init__(self, claimed: ClaimedJob, teachers: JobTeachers) -> None:
        super().__init__(claimed, use_cache=claimed.env.config.jobs.cache)
        self._key = (claimed.identity.digest(), claimed.job.top_k)
        self.teachers = teachers
        job = claimed.job
        self.targets = [
            ScoringTarget(wire=e.open_wire(), model_id=job.teacher_model_id, secret=e.secret,
                          identity=claimed.identity, k=job.top_k)
            for e in teachers.endpoints
        ]  # fmt: skip
        self.pending = claimed.progress.pending  # the progress counters' uncommitted scores

    def _open_writer(self, final: Path) -> CorpusWriter:
        job = self.claimed.job
        ctx = RowContext(job.id, job.teacher_alias, self.claimed.identity, job.top_k)
        signer = self.claimed.env.signer
        assert signer is not None, "JobWorkers.start loads the corpus-signing key"
        return CorpusWriter(final, ctx, signer, tag=self.claim_tag)

    def _rows(self, session: Session, after: int) -> list[SequenceItem]:
        return JobRepository(session).sequences(self.claimed.job.id, after=after, limit=PAGE_SIZE)

    def _lookup(self, session: Session, shas: list[str]) -> dict[str, ScoredSequence]:
        return score_cache.lookup(session, *self._key, shas)

    def _store(self, session: Session, pending: list[tuple[str, ScoredSequence]]) -> None:
        score_cache.store(session, *self._key, pending)

    def _hit(self, row: SequenceItem, hits: dict[str, ScoredSequence]) -> ScoredSequence | None:
        hit = hits.get(row.token_sha256)
        return hit if hit is not None and hit.row_count == _tokens(row).size else None

    async def _request(self, row: SequenceItem) -> ScoredSequence:
        tokens = _tokens(row)

        async def on(endpoint: Endpoint) -> ScoredSequence:
            target = self.targets[endpoint.slot]
            return await score_sequence(
                target, tokens, on_request=self.count_request, on_retry=self.count_retry
            )

        return await self.teachers.call(row.idx, on)

    async def _settle(self, row: SequenceItem, result: ScoredSequence) -> ScoredSequence:
        """A replica's result is requested again if the replica was fenced meanwhile."""
        return await self.teachers.settle(row.idx, result, lambda: self._one(row))

    def _requested(self, seconds: float) -> None:
        count = self.claimed.env.count_sequence
        if count is not None:
            count(False, seconds)

    def _cached(self) -> None:
        count = self.claimed.env.count_sequence
        if count is not None:
            count(True, None)

    def _write(self, writer: CorpusWriter, row: SequenceItem, result: ScoredSequence) -> None:
        writer.write(row.seq_id, _tokens(row), result, row.token_sha256)

    async def _committed(self, path: Path, sha256: str) -> None:
        """``output`` ``kiln-logit-cache-v3``: publish the signed corpus's rows into Kiln's
        cache root; on any failure the corpus is removed and the job fails."""
        if self.claimed.job.output != LOGIT_CACHE_OUTPUT:
            return
        root = self.claimed.env.config.jobs.logit_cache_root
        produced_at = kiln_timestamp(datetime.now(UTC))
        try:
            if root is None:
                raise JobInvalid(
                    "[jobs] logit_cache_root is no longer set: the job cannot publish its"
                    " logit-cache entries",
                    rule="job.logit_cache_root",
                )
            await asyncio.to_thread(
                publish_corpus, path, self.claimed.identity, None, root, produced_at
            )
        except BaseException:
            path.unlink(missing_ok=True)
            raise


async def scoring_pipeline(claimed: ClaimedJob, teachers: JobTeachers) -> ScoringPipeline:
    """Phase (d) of a teacher-scoring job, once phases (a) to (c) passed."""
    return ScoringPipeline(claimed, teachers)
