"""Scores into Kiln's logit cache: a scored sequence, or a verified corpus, as v3 entries.

Kiln's trainer asks its (cached) teacher for logits row ``q - 1`` of every
action token ``q`` of the token sequence it trains on
(``logit_source::target_token_positions_to_logits_rows``), and looks each row
up under the causal prefix ``tokens[..=q - 1]``.  A teacher-scoring row ``i``
is exactly that row: the teacher's top-K after ``tokens[..=i]``, its final row
from Kiln's causal final-row probe.  So a sequence of ``n`` tokens publishes
``n`` entries, positions ``0..n-1``, and every row an OPD run over that
sequence (or any sequence it is a prefix of) asks for is a hit, at any
``top_k`` up to the job's K.

``export_corpus`` reads a signed ``kiln.teacher-scores.v1`` corpus
(``jobs.scoring.corpus_verify`` first: signature and every line), then publishes its
rows into a cache root directory (merging, ``jobs.scoring.logit_cache_store``) or into
a ``.tar.gz`` (entries staged in a fresh hidden root beside it, archived by
Kiln's layout, the staging root removed).  ``produced_at`` defaults to the
corpus file's modification time, whole seconds, in Kiln's form, so exporting
the same file twice gives the same bytes.

Imports: standard library, numpy, ``kiln_registry.domain.errors``,
``identity.document`` and ``jobs``.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import numpy as np

from kiln_registry.domain.errors import InputError
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.jobs.core.signing import PublicKey
from kiln_registry.jobs.scoring.corpus import ROW_FORMAT
from kiln_registry.jobs.scoring.corpus_signed import (
    MAX_HEADER_BYTES,
    MAX_ROW_BYTES,
    CorpusSummary,
    SignedBody,
    loads_line,
    read_trailer,
)
from kiln_registry.jobs.scoring.logit_cache import CacheRow, kiln_timestamp, make_entry, to_f32
from kiln_registry.jobs.scoring.logit_cache_store import Outcome, put_entry, write_archive

FORMAT: Final = "kiln-logit-cache-v3"
ARCHIVE_SUFFIX: Final = ".tar.gz"


@dataclass
class ExportSummary:
    """What an export did: entries by outcome, sequences, and the archive if any."""

    sequences: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("written", "kept", "upgraded"), 0))  # fmt: skip
    archive_bytes: int | None = None

    def count(self, outcome: Outcome) -> None:
        self.outcomes[outcome] += 1

    @property
    def entries(self) -> int:
        return sum(self.outcomes.values())


def publish_sequence(
    root: Path,
    identity: TeacherIdentity,
    tokens: list[int],
    topk_ids: np.ndarray[Any, Any],
    topk_logprobs: np.ndarray[Any, Any],
    produced_at: str,
    summary: ExportSummary,
) -> None:
    """Every logits row of one scored sequence as a v3 entry under ``root``."""
    if len(topk_ids) != len(tokens) or len(topk_logprobs) != len(tokens):
        raise InputError(
            f"a scored sequence of {len(tokens)} tokens has {len(topk_ids)} rows",
            rule="logit_cache.rows",
        )
    for position in range(len(tokens)):
        row = CacheRow(
            tuple(int(i) for i in topk_ids[position]),
            tuple(to_f32(float(v)) for v in topk_logprobs[position]),
            produced_at,
        )
        summary.count(put_entry(root, make_entry(identity, tokens, position, row)))
    summary.sequences += 1


def _rows(path: Path, sha256: str | None) -> Iterator[dict[str, Any]]:
    """The row objects of the corpus at ``path``, whose bytes before the trailer must hash to
    the trailer's signed SHA-256 (and to ``sha256``, the verified one, when given)."""
    with path.open("rb") as handle:
        trailer = read_trailer(handle, os.fstat(handle.fileno()).st_size)
        handle.seek(0)
        body = SignedBody(handle, trailer.offset, None)
        body.line(MAX_HEADER_BYTES)
        number = 1
        while body.done < body.end:
            number += 1
            row = loads_line(body.line(MAX_ROW_BYTES).removesuffix(b"\n"), f"line {number}")
            if not isinstance(row, dict) or row.get("format") != ROW_FORMAT:
                raise InputError(
                    f"{path}: line {number} is not a {ROW_FORMAT} row: only teacher-scoring"
                    " corpora hold scores to export",
                    rule="logit_cache.corpus_format",
                )
            yield row
    digest = body.sha256.hexdigest()
    if digest != trailer.sha256 or (sha256 is not None and digest != sha256):
        raise InputError(
            f"{path} changed while it was exported: export it again",
            rule="logit_cache.corpus_changed",
        )


def default_produced_at(path: Path) -> str:
    mtime = int(path.stat().st_mtime)
    return kiln_timestamp(datetime.fromtimestamp(mtime, UTC))


def publish_corpus(
    path: Path, identity: TeacherIdentity, sha256: str | None, root: Path, produced_at: str
) -> ExportSummary:
    summary = ExportSummary()
    for row in _rows(path, sha256):
        publish_sequence(
            root, identity, list(row["token_ids"]),
            np.asarray(row["topk_ids"], dtype=np.int64),
            np.asarray(row["topk_logprobs"], dtype=np.float64),
            produced_at, summary,
        )  # fmt: skip
    return summary


def export_corpus(
    path: Path, keys: dict[str, PublicKey], to: Path, produced_at: str | None = None, *,
    verify: Callable[[Path, dict[str, PublicKey]], CorpusSummary],
) -> ExportSummary:  # fmt: skip
    """Verify the corpus at ``path`` with ``verify`` (``jobs.kinds.verify_corpus``: any
    kind's corpus) and publish its rows into ``to`` (see the module docstring)."""
    checked = verify(path, keys)
    if path.with_name(path.name + ".sig").is_file():
        raise InputError(
            f"{path} is an off-policy generation corpus, which Kiln reads as it is: only"
            f" teacher-scoring corpora ({ROW_FORMAT}) are exported to the logit cache",
            rule="logit_cache.corpus_format",
        )
    if checked.top_k is None:
        raise InputError(f"{path}: the corpus has no rows to export", rule="corpus.empty")
    stamp = produced_at or default_produced_at(path)
    if not to.name.endswith(ARCHIVE_SUFFIX):
        to.mkdir(mode=0o755, parents=True, exist_ok=True)
        return publish_corpus(path, checked.identity, checked.sha256, to, stamp)
    staging = to.parent / f".{to.name}.{secrets.token_hex(8)}.staging"
    staging.mkdir(mode=0o700)
    try:
        summary = publish_corpus(path, checked.identity, checked.sha256, staging, stamp)
        summary.archive_bytes = write_archive(staging, to).bytes
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return summary
