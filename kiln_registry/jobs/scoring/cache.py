"""The score cache: verified teacher scores keyed by (identity digest, K, token-ids SHA-256).

A row holds one sequence's scores as binary numpy columns (``.tobytes()``
of little-endian int32 top-K ids, float32 top-K logprobs and float32
next-token logprobs), never JSON per candidate.  The identity digest is
part of the key, so a teacher whose identity changed can never be served
another identity's scores; a row is written only after its response passed
every probe rule with the pinned fingerprint.  Lengths are checked when a
row is read back, and a row that does not decode is refused, not used.

Imports: the standard library, numpy, SQLAlchemy, ``kiln_registry.db``,
``jobs.core.models`` and ``kiln_registry.domain.errors``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from kiln_registry.db.engine import BEGIN_OPTION
from kiln_registry.db.models import utc_timestamp
from kiln_registry.db.repository import insert_ignoring_duplicates
from kiln_registry.domain.errors import InputError, JobConflict
from kiln_registry.jobs.core.models import ScoreCacheRow

LOOKUP_CHUNK: Final = 500  # keys per IN (...) query; also the generation cache's
HEX64_CHARS: Final = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True, eq=False)
class ScoredSequence:
    """The teacher's scores for one sequence of ``n`` tokens at top-``k``.

    ``topk_ids``/``topk_logprobs`` are ``(n, k)``: row ``i`` is the teacher's
    distribution over the token after position ``i`` (row ``n - 1`` comes from
    the causal final-row probe).  ``token_logprobs`` are the ``n - 1``
    logprobs of the sequence's own next tokens.
    """

    topk_ids: npt.NDArray[np.int32]
    topk_logprobs: npt.NDArray[np.float32]
    token_logprobs: npt.NDArray[np.float32]

    @property
    def row_count(self) -> int:
        return int(self.topk_ids.shape[0])


@dataclass(frozen=True, slots=True)
class CacheStats:
    identity_digest: str
    top_k: int
    rows: int
    bytes: int


def check_identity_digest(value: str) -> str:
    """Accept ``<64 hex>`` or ``sha256:<64 hex>``; return the bare digest."""
    digest = value.removeprefix("sha256:")
    if len(digest) != 64 or not set(digest) <= HEX64_CHARS:
        raise InputError(
            "an identity must be its 64-hex digest or 'sha256:<digest>' revision",
            rule="cache.identity",
        )
    return digest


def _decode(
    digest: str, k: int, sha: str, n: int, ids: bytes, lps: bytes, own: bytes
) -> ScoredSequence:
    if not (n >= 1 and len(ids) == len(lps) == n * k * 4 and len(own) == (n - 1) * 4):
        raise JobConflict(
            f"score cache row for {sha[:16]}... does not decode",
            rule="cache.corrupt",
            hint=f"run `kiln cache prune --identity {digest}`",
        )
    return ScoredSequence(
        topk_ids=np.frombuffer(ids, dtype="<i4").reshape(n, k),
        topk_logprobs=np.frombuffer(lps, dtype="<f4").reshape(n, k),
        token_logprobs=np.frombuffer(own, dtype="<f4"),
    )


def _deferred(session: Session) -> None:
    """Read-only work takes no write lock (WAL readers run beside the writer)."""
    if not session.in_transaction():
        session.connection(execution_options={BEGIN_OPTION: "DEFERRED"})


def lookup(
    session: Session, identity_digest: str, k: int, shas: Sequence[str]
) -> dict[str, ScoredSequence]:
    """The cached scores among ``shas`` for this identity and K."""
    _deferred(session)
    found: dict[str, ScoredSequence] = {}
    columns = (
        ScoreCacheRow.token_sha256,
        ScoreCacheRow.row_count,
        ScoreCacheRow.topk_ids,
        ScoreCacheRow.topk_logprobs,
        ScoreCacheRow.token_logprobs,
    )
    for start in range(0, len(shas), LOOKUP_CHUNK):
        chunk = list(set(shas[start : start + LOOKUP_CHUNK]))
        query = select(*columns).where(
            ScoreCacheRow.identity_digest == identity_digest,
            ScoreCacheRow.top_k == k,
            ScoreCacheRow.token_sha256.in_(chunk),
        )
        for sha, n, ids, lps, own in session.execute(query):
            found[sha] = _decode(identity_digest, k, sha, n, ids, lps, own)
    return found


def store(
    session: Session, identity_digest: str, k: int, items: Iterable[tuple[str, ScoredSequence]]
) -> None:
    """Insert verified scores; an existing key keeps its row (same identity, same scores)."""
    now = utc_timestamp()
    values = [
        {
            "identity_digest": identity_digest,
            "top_k": k,
            "token_sha256": sha,
            "row_count": scored.row_count,
            "topk_ids": scored.topk_ids.astype("<i4").tobytes(),
            "topk_logprobs": scored.topk_logprobs.astype("<f4").tobytes(),
            "token_logprobs": scored.token_logprobs.astype("<f4").tobytes(),
            "created_at": now,
        }
        for sha, scored in items
    ]
    if values:
        session.execute(insert_ignoring_duplicates(session, ScoreCacheRow), values)


def stats(session: Session) -> list[CacheStats]:
    """Rows and stored bytes per (identity, K)."""
    _deferred(session)
    size = (
        func.length(ScoreCacheRow.topk_ids)
        + func.length(ScoreCacheRow.topk_logprobs)
        + func.length(ScoreCacheRow.token_logprobs)
    )
    query = (
        select(
            ScoreCacheRow.identity_digest,
            ScoreCacheRow.top_k,
            func.count(),
            func.coalesce(func.sum(size), 0),
        )
        .group_by(ScoreCacheRow.identity_digest, ScoreCacheRow.top_k)
        .order_by(ScoreCacheRow.identity_digest, ScoreCacheRow.top_k)
    )
    return [CacheStats(d, int(k), int(n), int(b)) for d, k, n, b in session.execute(query)]


def prune(session: Session, identity_digest: str) -> int:
    """Delete every cached row of one identity; the count deleted."""
    digest = check_identity_digest(identity_digest)
    result = session.execute(delete(ScoreCacheRow).where(ScoreCacheRow.identity_digest == digest))
    return int(getattr(result, "rowcount", 0))


def count(session: Session, identity_digest: str | None = None) -> int:
    _deferred(session)
    query = select(func.count()).select_from(ScoreCacheRow)
    if identity_digest is not None:
        query = query.where(ScoreCacheRow.identity_digest == identity_digest)
    return int(session.scalar(query) or 0)
