"""Phase (d) of an off-policy generation job: prompts to a signed Kiln off-policy corpus.

Prompts are read in pages; with deterministic settings each page's cache
hits are looked up in one query.  Misses are generated with at most ``[jobs]
concurrency`` requests in flight (spread over a replica set's proved
replicas, ``jobs.core.endpoints``; with ``top_k > 0`` a prompt's scoring
request goes to the replica that generated it) and written in input order through a
bounded reorder window.  Verified generations are committed to the cache in
small batches with the progress counters.  When any answer fails (a changed
fingerprint above all) every outstanding request is cancelled, the unflushed
batch dropped and the partial corpus deleted by the caller: nothing produced
after the failure is kept, and the job fails.  A killed job is requeued and
starts again; its cached generations make that fast.  With ``top_k > 0`` each
generation is followed by one scoring request over the conversation as
Kiln's off-policy preparation tokenizes it (``jobs.generation.kiln``), so
``teacher_tokens`` are what Kiln's trainer accepts; a response Kiln's
preparation could not reproduce fails the job (``generation.kiln_*``).  The loop itself is
``jobs.core.ordered_pipeline`` (shared with teacher scoring); this module says how
prompts are read, generated, cached and written.

Imports: standard library, ``kiln_registry.db`` and ``jobs``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any, ClassVar, Final

import numpy as np
from sqlalchemy.orm import Session

from kiln_registry.domain.errors import JobInvalid
from kiln_registry.jobs.core.endpoints import Endpoint, JobTeachers
from kiln_registry.jobs.core.ordered_pipeline import OrderedPipeline
from kiln_registry.jobs.core.state import ClaimedJob
from kiln_registry.jobs.generation import output as out
from kiln_registry.jobs.generation import repository as prompts_repo
from kiln_registry.jobs.generation.kiln import KilnRenderer
from kiln_registry.jobs.generation.output import ExampleContext, ExampleWriter
from kiln_registry.jobs.generation.repository import PromptItem
from kiln_registry.jobs.generation.sources import GenerationSettings, student_tokenizer
from kiln_registry.jobs.generation.wire import Generated, GenerationTarget, KilnTokens, generate
from kiln_registry.jobs.scoring.sources import check_sequence
from kiln_registry.jobs.scoring.target import ScoringTarget, score_sequence

PAGE_SIZE: Final = 500
KILN_TOKENS_FORMAT: Final = "kiln-registry.kiln-tokens.v1"


def _f32(value: float | np.floating[Any]) -> float:
    """The shortest spelling of ``value`` as the f32 Kiln reads it."""
    return float(str(np.float32(value)))


def cache_settings_key(settings: GenerationSettings, tokenizer: Any) -> str:
    """The cache's settings key: with ``top_k > 0`` the cached scores follow Kiln's
    tokenization, so the student's template and tokenizer are part of it."""
    if settings.top_k == 0:
        return settings.sha256()
    digest = hashlib.sha256(KILN_TOKENS_FORMAT.encode("ascii"))
    for part in (settings.canonical_json(), str(tokenizer.chat_template),
                 str(tokenizer.backend_tokenizer.to_str())):  # fmt: skip
        digest.update(b"\0" + part.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


class GenerationPipeline(OrderedPipeline[PromptItem, Generated, ExampleWriter]):
    """Generates one claimed job's prompts against ``target`` and publishes its corpus."""

    page_size: ClassVar[int] = PAGE_SIZE
    noun: ClassVar[str] = "prompts"

    def __init__(
        self, claimed: ClaimedJob, teachers: JobTeachers, settings: GenerationSettings,
        tokenizer: Any,
    ) -> None:  # fmt: skip
        super().__init__(
            claimed, use_cache=claimed.env.config.jobs.cache and settings.deterministic
        )
        self.key = (claimed.identity.digest(), cache_settings_key(settings, tokenizer))
        self.teachers = teachers
        self.settings = settings
        job = claimed.job
        self.ctx = ExampleContext(job.id, job.teacher_alias, claimed.identity, settings, tokenizer)
        self.renderer = KilnRenderer.for_tokenizer(tokenizer) if settings.top_k > 0 else None
        model_id = job.teacher_model_id
        self.targets = [
            GenerationTarget(wire=e.open_wire(), model_id=model_id, secret=e.secret,
                             identity=claimed.identity, settings=settings)
            for e in teachers.endpoints
        ]  # fmt: skip
        self.scorings = [
            ScoringTarget(wire=g.wire, model_id=model_id, secret=g.secret, identity=g.identity,
                          k=settings.top_k, timeout_s=g.timeout_s)
            for g in self.targets
        ]  # fmt: skip

    def _open_writer(self, final: Path) -> ExampleWriter:
        signer = self.claimed.env.signer
        assert signer is not None, "JobWorkers.start loads the corpus-signing key"
        return ExampleWriter(final, self.claimed.identity, signer, tag=self.claim_tag)

    def _rows(self, session: Session, after: int) -> list[PromptItem]:
        return prompts_repo.prompt_page(session, self.claimed.job.id, after=after, limit=PAGE_SIZE)

    def _lookup(self, session: Session, shas: list[str]) -> dict[str, Generated]:
        return prompts_repo.cache_lookup(session, *self.key, shas)

    def _hit(self, row: PromptItem, hits: dict[str, Generated]) -> Generated | None:
        hit = hits.get(row.token_sha256)
        stale = self.renderer is not None and hit is not None and hit.kiln is None
        return None if stale else hit

    def _store(self, session: Session, pending: list[tuple[str, Generated]]) -> None:
        prompts_repo.cache_store(session, *self.key, pending)

    async def _request(self, row: PromptItem) -> Generated:
        async def on(endpoint: Endpoint) -> Generated:
            return await self._generate(row, endpoint.slot)

        return await self.teachers.call(row.idx, on)

    async def _settle(self, row: PromptItem, result: Generated) -> Generated:
        """A replica's result is requested again if the replica was fenced meanwhile."""
        return await self.teachers.settle(row.idx, result, lambda: self._one(row))

    async def _generate(self, row: PromptItem, slot: int) -> Generated:
        """Generate on endpoint ``slot``; with ``top_k > 0`` score Kiln's tokens there too."""
        gen = await generate(self.targets[slot], row.token_ids, on_request=self.count_request,
                             on_retry=self.count_retry)  # fmt: skip
        if self.renderer is None:
            return gen
        return Generated(gen.token_ids, gen.finish_reason, gen.logprobs, gen.top_ids,
                         gen.top_logprobs, await self._kiln_tokens(row, gen, slot))  # fmt: skip

    async def _kiln_tokens(self, row: PromptItem, gen: Generated, slot: int) -> KilnTokens:
        """Score the conversation as Kiln tokenizes it: one prompt-logprobs pass."""
        assert self.renderer is not None
        where = f"prompt {row.seq_id!r}"
        text = out.response_text(self.ctx, row.seq_id, gen)
        seq = await asyncio.to_thread(
            self.renderer.sequence, json.loads(row.messages_json), text, where
        )
        try:
            check_sequence(seq.token_ids, self.claimed.identity, self.settings.top_k, where)
        except JobInvalid as exc:
            raise JobInvalid(
                f"{exc.message} (the conversation as Kiln tokenizes it, to be scored by the"
                " teacher)", rule="generation.kiln_sequence", hint="lower max_tokens",
            ) from None  # fmt: skip
        scored = await score_sequence(
            self.scorings[slot], np.asarray(seq.token_ids, dtype=np.int64),
            on_request=self.count_request, on_retry=self.count_retry,
        )  # fmt: skip
        rows = [at - 1 for at in seq.positions]
        return KilnTokens(
            sequence=seq.token_ids, positions=seq.positions,
            logprobs=[_f32(scored.token_logprobs[r]) for r in rows],
            top_ids=[[int(t) for t in scored.topk_ids[r]] for r in rows],
            top_logprobs=[[_f32(v) for v in scored.topk_logprobs[r]] for r in rows],
        )  # fmt: skip

    def _write(self, writer: ExampleWriter, row: PromptItem, result: Generated) -> None:
        writer.write(
            out.encode_example(self.ctx, row.seq_id, row.messages_json, row.token_sha256, result)
        )


async def generation_pipeline(claimed: ClaimedJob, teachers: JobTeachers) -> GenerationPipeline:
    """Phase (d) of an off-policy generation job: its recorded settings, the student's
    tokenizer (read in a thread), once phases (a) to (c) passed."""
    job = claimed.job
    assert job.generation_json is not None, "generation jobs record their settings"
    settings = GenerationSettings.from_json(job.generation_json)
    model_dir = claimed.env.config.student.model_path
    tokenizer = await asyncio.to_thread(student_tokenizer, model_dir)
    return GenerationPipeline(claimed, teachers, settings, tokenizer)
