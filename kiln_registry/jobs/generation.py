"""Phase (d) of an off-policy generation job: prompts to a signed Kiln off-policy corpus.

Prompts are read in pages; with deterministic settings each page's cache
hits are looked up in one query.  Misses are generated with at most ``[jobs]
concurrency`` requests in flight and written in input order through a
bounded reorder window.  Verified generations are committed to the cache in
small batches with the progress counters.  When any answer fails (a changed
fingerprint above all) every outstanding request is cancelled, the unflushed
batch dropped and the partial corpus deleted by the caller: nothing produced
after the failure is kept, and the job fails.  A killed job is requeued and
starts again; its cached generations make that fast.  The loop itself is
``jobs.ordered_pipeline`` (shared with teacher scoring); this module says how
prompts are read, generated, cached and written.

Imports: standard library, ``kiln_registry.db`` and ``jobs``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Final

from sqlalchemy.orm import Session

from kiln_registry.jobs import generation_output as out
from kiln_registry.jobs.generation_output import ExampleContext, ExampleWriter, PromptItem
from kiln_registry.jobs.generation_sources import GenerationSettings
from kiln_registry.jobs.generation_wire import Generated, GenerationTarget, generate
from kiln_registry.jobs.ordered_pipeline import OrderedPipeline
from kiln_registry.jobs.state import ClaimedJob

PAGE_SIZE: Final = 500


class GenerationPipeline(OrderedPipeline[PromptItem, Generated, ExampleWriter]):
    """Generates one claimed job's prompts against ``target`` and publishes its corpus."""

    page_size: ClassVar[int] = PAGE_SIZE
    noun: ClassVar[str] = "prompts"

    def __init__(self, claimed: ClaimedJob, target: GenerationTarget, tokenizer: Any) -> None:
        settings: GenerationSettings = target.settings
        super().__init__(
            claimed, use_cache=claimed.env.config.jobs.cache and settings.deterministic
        )
        self.key = (claimed.identity.digest(), settings.sha256())
        self.target = target
        self.settings = settings
        job = claimed.job
        self.ctx = ExampleContext(job.id, job.teacher_alias, claimed.identity, settings, tokenizer)

    def _open_writer(self, final: Path) -> ExampleWriter:
        signer = self.claimed.env.signer
        assert signer is not None, "JobWorkers.start loads the corpus-signing key"
        return ExampleWriter(final, self.claimed.identity, signer, tag=self.claim_tag)

    def _rows(self, session: Session, after: int) -> list[PromptItem]:
        return out.prompt_page(session, self.claimed.job.id, after=after, limit=PAGE_SIZE)

    def _lookup(self, session: Session, shas: list[str]) -> dict[str, Generated]:
        return out.cache_lookup(session, *self.key, shas)

    def _store(self, session: Session, pending: list[tuple[str, Generated]]) -> None:
        out.cache_store(session, *self.key, pending)

    async def _request(self, row: PromptItem) -> Generated:
        return await generate(
            self.target, row.token_ids, on_request=self.count_request, on_retry=self.count_retry
        )

    def _write(self, writer: ExampleWriter, row: PromptItem, result: Generated) -> None:
        writer.write(
            out.encode_example(self.ctx, row.seq_id, row.messages_json, row.token_sha256, result)
        )
