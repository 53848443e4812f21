"""A job's input sequences: inline lists or a corpus file confined to ``[jobs] corpus_root``.

Owns the request planning rules every sequence must pass before a job is
queued (``check_sequence``: ids below ``vocab_size``, room in ``max_model_len``
for Kiln's causal final-row probe token and vLLM's generation slot, and a
response that cannot exceed ``max_prompt_logprob_candidates``), the token-id
digest (``token_ids_sha256``: SHA-256 of the ids as little-endian uint32),
and the bounded, strict corpus reader: a regular file under the root (no
symlink escapes, checked again on the opened descriptor), at most
``MAX_CORPUS_BYTES``, one ``{"id", "token_ids"}`` object per line, no blank
lines, no duplicate keys or ids.

Refusals are ``JobInvalid`` naming the line or index and the rule.  Imports:
standard library, numpy, ``kiln_registry.domain.errors`` and ``identity.document``;
never the database, httpx or FastAPI.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Final

import numpy as np

from kiln_registry.domain.errors import JobInvalid
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.strict_read import loads_strict

MAX_SEQUENCES: Final = 100_000
MAX_JOB_TOKENS: Final = 64_000_000
MAX_CORPUS_BYTES: Final = 512 << 20
MAX_LINE_BYTES: Final = 64 << 20
MAX_SEQ_ID_CHARS: Final = 256
CORPUS_KEYS: Final = frozenset({"id", "token_ids"})
# Kiln's causal final-row probe repeats the last token (one more prompt token)
# and vLLM reserves one generated token: n + 2 <= max_model_len.
EXTRA_CONTEXT_TOKENS: Final = 2


@dataclass(frozen=True, slots=True)
class JobSequence:
    """One validated input sequence; ``tokens`` are int32 little-endian bytes."""

    seq_id: str
    tokens: bytes
    sha256: str

    @property
    def length(self) -> int:
        return len(self.tokens) // 4


@dataclass(frozen=True, slots=True)
class LoadedSequences:
    sequences: list[JobSequence]
    token_count: int
    corpus_path: str | None = None
    corpus_sha256: str | None = None


def token_ids_sha256(ids: Sequence[int] | np.ndarray[Any, Any]) -> str:
    """SHA-256 (hex) of the token ids as 4-byte little-endian unsigned integers."""
    return hashlib.sha256(np.asarray(ids, dtype="<u4").tobytes()).hexdigest()


def _invalid(where: str, rule: str, message: str) -> JobInvalid:
    return JobInvalid(f"{where}: {message}", rule=f"job.{rule}")


def check_sequence(
    tokens: Sequence[object], identity: TeacherIdentity, k: int, where: str
) -> bytes:
    """Validate one sequence for ``identity`` at top-``k``; return its int32 LE bytes."""
    n = len(tokens)
    if n < 1:
        raise _invalid(where, "sequence_empty", "a sequence needs at least one token")
    room = identity.max_model_len - EXTRA_CONTEXT_TOKENS
    if n > room:
        raise _invalid(
            where,
            "sequence_length",
            f"{n} tokens do not fit: with the causal final-row probe token and the generation"
            f" slot a sequence may have at most {room} tokens (max_model_len"
            f" {identity.max_model_len})",
        )
    if not all(type(t) is int for t in tokens):
        raise _invalid(where, "token_type", "token ids must be JSON integers")
    try:
        array = np.asarray(tokens, dtype=np.int64)
    except OverflowError:  # an id of 2^63 or more: out of vocabulary, never a 500
        raise _invalid(where, "token_id", "a token id is out of vocabulary (too large)") from None
    bad = (array < 0) | (array >= identity.vocab_size)
    if bad.any():
        at = int(np.flatnonzero(bad)[0])
        raise _invalid(
            where,
            "token_id",
            f"token {at} (id {int(array[at])}) is out of vocabulary: ids must be in"
            f" 0..{identity.vocab_size - 1}",
        )
    width = min(k + 1, identity.vocab_size)
    if n * width > identity.max_prompt_logprob_candidates:
        raise _invalid(
            where,
            "candidates",
            f"{n} scored rows of up to {width} candidates could exceed the identity's"
            f" max_prompt_logprob_candidates {identity.max_prompt_logprob_candidates}",
        )
    return array.astype("<i4").tobytes()


def _check_seq_id(value: object, where: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_SEQ_ID_CHARS:
        raise _invalid(where, "sequence_id", f"id must be a string of 1..{MAX_SEQ_ID_CHARS} chars")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        raise _invalid(where, "sequence_id", "id contains a control character")
    return value


class _Collector:
    """Accumulates sequences with the per-job bounds checked before each append."""

    def __init__(self, identity: TeacherIdentity, k: int) -> None:
        self.identity = identity
        self.k = k
        self.items: list[JobSequence] = []
        self.ids: set[str] = set()
        self.tokens = 0

    def add(self, seq_id: str, tokens: Sequence[object], where: str) -> None:
        if len(self.items) >= MAX_SEQUENCES:
            raise _invalid(where, "too_many_sequences", f"a job holds at most {MAX_SEQUENCES}")
        if seq_id in self.ids:
            raise _invalid(where, "duplicate_id", f"id {seq_id!r} repeats an earlier sequence")
        if self.tokens + len(tokens) > MAX_JOB_TOKENS:
            raise _invalid(where, "too_many_tokens", f"a job holds at most {MAX_JOB_TOKENS} tokens")
        data = check_sequence(tokens, self.identity, self.k, where)
        self.ids.add(seq_id)
        self.tokens += len(tokens)
        # Ids are non-negative, so their int32 and uint32 encodings are the same bytes.
        self.items.append(JobSequence(seq_id, data, hashlib.sha256(data).hexdigest()))


def inline_sequences(
    sequences: Iterable[Sequence[object]], identity: TeacherIdentity, k: int
) -> LoadedSequences:
    """Inline ``[[ids], ...]``; sequence ``i`` gets the id ``str(i)``."""
    collector = _Collector(identity, k)
    for index, tokens in enumerate(sequences):
        collector.add(str(index), tokens, f"sequences[{index}]")
    if not collector.items:
        raise _invalid("sequences", "empty", "a job needs at least one sequence")
    return LoadedSequences(collector.items, collector.tokens)


def confined_corpus_path(root: Path | None, given: str) -> Path:
    """The resolved corpus file: it must exist, be regular and lie under ``root``.

    ``given`` is judged lexically first, before the filesystem is touched: a
    ``..`` step, or an absolute path that does not start with the root (as
    configured or as resolved), gets the one ``corpus_unavailable`` refusal, so
    no answer depends on what exists outside the root (issue 27, item 5).  Only
    then is the path under the root resolved (symlinks followed) and checked
    again.
    """
    if root is None:
        raise JobInvalid(
            "corpus.path: corpus jobs are disabled because [jobs] corpus_root is not configured",
            rule="job.corpus_root",
            hint="set [jobs] corpus_root in kiln.toml, or submit inline sequences",
        )
    if not given or "\x00" in given or len(given) > 4096:
        raise _invalid("corpus.path", "corpus_path", "must be a non-empty path")
    try:
        base = root.resolve(strict=True)
    except (OSError, RuntimeError):
        raise _unavailable() from None
    relative = _lexically_under(PurePosixPath(given), (Path(os.path.abspath(root)), base))
    try:
        resolved = (base / relative).resolve(strict=True)
    except (OSError, RuntimeError):
        raise _unavailable() from None
    if not resolved.is_relative_to(base):
        # The same refusal as a missing file: which paths exist outside the root is not
        # the caller's business (issue 15, attack 8).
        raise _unavailable()
    return resolved


def _lexically_under(given: PurePosixPath, roots: tuple[Path, ...]) -> PurePosixPath:
    """``given`` relative to the first of ``roots`` it names, judged without the filesystem."""
    if ".." in given.parts:
        raise _unavailable()
    if not given.is_absolute():
        return given
    for root in roots:
        if given.is_relative_to(root.as_posix()):
            return given.relative_to(root.as_posix())
    raise _unavailable()


def _unavailable() -> JobInvalid:
    return _invalid(
        "corpus.path",
        "corpus_unavailable",
        "no corpus file at this path under [jobs] corpus_root (missing, unreadable, or"
        " resolving outside the root; symlinks are followed first)",
    )


def _open_confined(path: Path, base: Path) -> BinaryIO:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        raise _unavailable() from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _invalid("corpus.path", "corpus_not_regular", "not a regular file")
        proc = Path(f"/proc/self/fd/{fd}")
        if proc.exists() and not proc.resolve().is_relative_to(base):
            raise _unavailable()
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _parse_line(raw: bytes, where: str) -> tuple[str, list[object]]:
    try:
        value = loads_strict(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _invalid(where, "corpus_json", f"not a strict JSON object ({exc})") from None
    if not isinstance(value, dict) or set(value) != CORPUS_KEYS:
        raise _invalid(where, "corpus_keys", 'each line must be exactly {"id", "token_ids"}')
    tokens = value["token_ids"]
    if not isinstance(tokens, list):
        raise _invalid(where, "token_type", "token_ids must be a JSON array of integers")
    return _check_seq_id(value["id"], where), tokens


def corpus_sequences(
    root: Path | None, given: str, identity: TeacherIdentity, k: int
) -> LoadedSequences:
    """Read and validate the corpus at ``given`` (see the module docstring)."""
    path = confined_corpus_path(root, given)
    assert root is not None
    collector = _Collector(identity, k)
    digest = hashlib.sha256()
    total = 0
    with _open_confined(path, root.resolve()) as handle:
        for number in range(1, MAX_SEQUENCES + 2):
            raw = handle.readline(MAX_LINE_BYTES + 1)
            if not raw:
                break
            where = f"corpus line {number}"
            total += len(raw)
            if len(raw) > MAX_LINE_BYTES or total > MAX_CORPUS_BYTES:
                raise _invalid(where, "corpus_size", "the line or the corpus is too large")
            digest.update(raw)
            if not raw.strip():
                raise _invalid(where, "corpus_blank_line", "blank lines are not allowed")
            seq_id, tokens = _parse_line(raw, where)
            collector.add(seq_id, tokens, where)
    if not collector.items:
        raise _invalid("corpus.path", "empty", "the corpus holds no sequences")
    # Job rows show the path relative to the root, never the server's absolute layout.
    shown = str(path.relative_to(root.resolve()))
    return LoadedSequences(collector.items, collector.tokens, shown, digest.hexdigest())
