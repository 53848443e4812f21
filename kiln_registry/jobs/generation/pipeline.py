"""Phase (d) of an off-policy generation job: prompts to a signed Kiln off-policy corpus.

Prompts are read in pages; with deterministic settings each page's cache
hits are looked up in one query.  Misses are generated with at most ``[jobs]
concurrency`` requests in flight and written in input order through a
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
from kiln_registry.jobs.core.ordered_pipeline import OrderedPipeline
from kiln_registry.jobs.core.state import ClaimedJob
from kiln_registry.jobs.generation import output as out
from kiln_registry.jobs.generation.kiln import KilnRenderer
from kiln_registry.jobs.generation.output import ExampleContext, ExampleWriter, PromptItem
from kiln_registry.jobs.generation.sources import GenerationSettings
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

    def __init__(self, claimed: ClaimedJob, target: GenerationTarget, tokenizer: Any) -> None:
        settings: GenerationSettings = target.settings
        super().__init__(
            claimed, use_cache=claimed.env.config.jobs.cache and settings.deterministic
        )
        self.key = (claimed.identity.digest(), cache_settings_key(settings, tokenizer))
        self.target = target
        self.settings = settings
        job = claimed.job
        self.ctx = ExampleContext(job.id, job.teacher_alias, claimed.identity, settings, tokenizer)
        self.renderer = KilnRenderer.for_tokenizer(tokenizer) if settings.top_k > 0 else None
        self.scoring = ScoringTarget(
            wire=target.wire, model_id=target.model_id, secret=target.secret,
            identity=target.identity, k=settings.top_k, timeout_s=target.timeout_s,
        )  # fmt: skip

    def _open_writer(self, final: Path) -> ExampleWriter:
        signer = self.claimed.env.signer
        assert signer is not None, "JobWorkers.start loads the corpus-signing key"
        return ExampleWriter(final, self.claimed.identity, signer, tag=self.claim_tag)

    def _rows(self, session: Session, after: int) -> list[PromptItem]:
        return out.prompt_page(session, self.claimed.job.id, after=after, limit=PAGE_SIZE)

    def _lookup(self, session: Session, shas: list[str]) -> dict[str, Generated]:
        return out.cache_lookup(session, *self.key, shas)

    def _hit(self, row: PromptItem, hits: dict[str, Generated]) -> Generated | None:
        hit = hits.get(row.token_sha256)
        stale = self.renderer is not None and hit is not None and hit.kiln is None
        return None if stale else hit

    def _store(self, session: Session, pending: list[tuple[str, Generated]]) -> None:
        out.cache_store(session, *self.key, pending)

    async def _request(self, row: PromptItem) -> Generated:
        gen = await generate(
            self.target, row.token_ids, on_request=self.count_request, on_retry=self.count_retry
        )
        if self.renderer is None:
            return gen
        return Generated(gen.token_ids, gen.finish_reason, gen.logprobs, gen.top_ids,
                         gen.top_logprobs, await self._kiln_tokens(row, gen))  # fmt: skip

    async def _kiln_tokens(self, row: PromptItem, gen: Generated) -> KilnTokens:
        """Score the conversation as Kiln tokenizes it: one prompt-logprobs pass."""
        assert self.renderer is not None
        where = f"prompt {row.seq_id!r}"
        text = out.response_text(self.ctx, row.seq_id, gen)
        seq = await asyncio.to_thread(
            self.renderer.sequence, json.loads(row.messages_json), text, where
        )
        try:
            check_sequence(seq.token_ids, self.target.identity, self.settings.top_k, where)
        except JobInvalid as exc:
            raise JobInvalid(
                f"{exc.message} (the conversation as Kiln tokenizes it, to be scored by the"
                " teacher)", rule="generation.kiln_sequence", hint="lower max_tokens",
            ) from None  # fmt: skip
        scored = await score_sequence(
            self.scoring, np.asarray(seq.token_ids, dtype=np.int64),
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
