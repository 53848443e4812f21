"""The SQL of off-policy generation jobs: the generation cache and a job's prompts.

The cache: ``generation_cache`` rows keyed by (identity digest, settings
SHA-256, prompt ids SHA-256) hold a verified ``Generated`` as JSON; only
deterministic settings are cached (the caller's rule).  A job's prompts are
``job_sequences`` rows with their canonical chat messages.  Like the other
repositories these take the caller's session and never commit.

Imports: standard library, SQLAlchemy, ``kiln_registry.db`` and ``jobs``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from kiln_registry.db.models import utc_timestamp
from kiln_registry.db.repository import insert_ignoring_duplicates
from kiln_registry.jobs.core.models import GenerationCacheRow, JobSequenceRow
from kiln_registry.jobs.generation.wire import Generated
from kiln_registry.jobs.scoring.cache import LOOKUP_CHUNK

# -- the generation cache --------------------------------------------------------


def cache_lookup(
    session: Session, identity_digest: str, settings_sha256: str, prompts: Sequence[str]
) -> dict[str, Generated]:
    """Cached generations of ``prompts`` (ids SHA-256s); rows that do not decode are skipped."""
    found: dict[str, Generated] = {}
    for start in range(0, len(prompts), LOOKUP_CHUNK):
        chunk = list(prompts[start : start + LOOKUP_CHUNK])
        rows = session.execute(
            select(GenerationCacheRow.prompt_sha256, GenerationCacheRow.result_json).where(
                GenerationCacheRow.identity_digest == identity_digest,
                GenerationCacheRow.settings_sha256 == settings_sha256,
                GenerationCacheRow.prompt_sha256.in_(chunk),
            )
        )
        for sha, text in rows:
            try:
                found[sha] = Generated.from_json(json.loads(text))
            except (ValueError, KeyError, TypeError):
                continue
    return found


def cache_store(
    session: Session, identity_digest: str, settings_sha256: str,
    items: Iterable[tuple[str, Generated]],
) -> None:  # fmt: skip
    now = utc_timestamp()
    values = [
        {"identity_digest": identity_digest, "settings_sha256": settings_sha256,
         "prompt_sha256": sha, "result_json": json.dumps(gen.to_json(), separators=(",", ":")),
         "created_at": now}
        for sha, gen in items
    ]  # fmt: skip
    if values:
        session.execute(insert_ignoring_duplicates(session, GenerationCacheRow).values(values))


# -- the prompts of a job ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PromptItem:
    idx: int
    seq_id: str
    token_ids: list[int]
    token_sha256: str
    messages_json: str


def insert_prompts(session: Session, job_id: str, items: Sequence[tuple[Any, str]]) -> None:
    """Store a job's prompts (``(JobSequence, messages_json)``) in pages."""
    for start in range(0, len(items), LOOKUP_CHUNK):
        session.execute(
            insert(JobSequenceRow),
            [
                {"job_id": job_id, "idx": start + i, "seq_id": seq.seq_id,
                 "token_ids": seq.tokens, "token_sha256": seq.sha256, "messages_json": messages}
                for i, (seq, messages) in enumerate(items[start : start + LOOKUP_CHUNK])
            ],
        )  # fmt: skip


def prompt_page(session: Session, job_id: str, *, after: int, limit: int) -> list[PromptItem]:
    rows = session.execute(
        select(JobSequenceRow.idx, JobSequenceRow.seq_id, JobSequenceRow.token_ids,
               JobSequenceRow.token_sha256, JobSequenceRow.messages_json)
        .where(JobSequenceRow.job_id == job_id, JobSequenceRow.idx > after)
        .order_by(JobSequenceRow.idx)
        .limit(limit)
    )  # fmt: skip
    return [
        PromptItem(idx, seq_id, [int.from_bytes(data[i : i + 4], "little")
                                 for i in range(0, len(data), 4)], sha, messages or "[]")
        for idx, seq_id, data, sha, messages in rows
    ]  # fmt: skip
