"""The fast validation path for vLLM's compact prompt-logprobs bodies.

Owns ``parse_completion_fast``: the same contract as ``parse.parse_completion``
(same arguments, same ``ParsedCompletion``, same refusals), checked with
vectorized numpy over the raw bytes when the rows array has the exact layout
vLLM and the reference teacher emit::

    [null,{"<id>":{"logprob":<number>,"rank":<int>,"decoded_token":"<string>"},...},...]

(no white space, keys in that order, nothing else in a candidate, a string
token, float32-exact numbers).  Anything else -- another key order, white
space, an unknown candidate key, a ``decoded_token`` of another JSON type or
with a lone surrogate escape (``probe.serde_rules`` names it), a
logprob that rounds to float32 (Kiln accepts it; the strict parser keeps the
float64 numbers beside the rounded column), a null row, any rule failure --
raises ``FastPathDeferred`` inside and the strict parser decides, accepting
or refusing with its own rule and message.  So the fast
path never refuses on its own and accepts only bodies the strict parser
accepts, with byte-identical columns:

- every byte of the array is covered: candidates tile it contiguously, their
  ten unescaped quotes bound fixed templates, digit runs, a JSON number, and a
  decoded-token string whose escapes, control bytes and UTF-8 are checked;
- the envelope (everything but the array) is parsed by ``strict_loads`` with
  the array replaced by a unique float literal, which must come back as
  ``choices[0].prompt_logprobs``, so the cut is exactly that value (and
  ``strict_loads`` applies Kiln's serde_json rules to it; the array adds
  three nesting levels at depth three, far below the 128 limit);
- ids, ranks and logprobs are converted exactly by ``probe.exact_numbers``.

Work is done in chunks of about ``CHUNK_BYTES`` so temporaries stay small; no
Python object is made per candidate on the common path.  Imports numpy, the
standard library, ``kiln_registry.domain.errors``, ``probe.parse`` and
``probe.exact_numbers``; no sockets, httpx or database.
"""

from __future__ import annotations

import codecs
from array import array
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kiln_registry.domain.errors import ProbeFailed
from kiln_registry.probe.exact_numbers import (
    I64,
    JSON_NUMBER,
    U64,
    Bytes,
    FastPathDeferred,
    exact_logprobs,
    small_ints,
    valid_logprobs,
)
from kiln_registry.probe.parse import (
    MAX_VOCAB_SIZE,
    ParsedCompletion,
    PromptLogprobColumns,
    check_logprob,
    completion_from_tree,
    parse_completion,
    response_body_limit,
    strict_loads,
)

try:
    from kiln_registry.probe import _rowscan
except ImportError:  # built without a C compiler: the numpy scan decides alone
    _rowscan = None  # type: ignore[assignment]

__all__ = [
    "CHUNK_BYTES",
    "FastPathDeferred",
    "check_rows_array",
    "compiled_check",
    "first_duplicate",
    "numpy_check_rows_array",
    "parse_completion_fast",
    "scan_completion",
    "scan_rows_array",
    "sparse_positions",
]

CHUNK_BYTES = 1 << 20
_ARRAY_KEY = b'"prompt_logprobs":['
_CUT_TEXT = "-0.0e-7777777"
_ESCAPABLE = np.zeros(256, dtype=bool)
_ESCAPABLE[list(b'"\\/bfnrtu')] = True
_HEX = np.zeros(256, dtype=bool)
_HEX[list(b"0123456789abcdefABCDEF")] = True
_SURROGATE_2ND = np.zeros(256, dtype=bool)  # \\uD800..\\uDFFF: 'd' then one of these
_SURROGATE_2ND[list(b"89abcdefABCDEF")] = True
_HIGH_2ND = np.zeros(256, dtype=bool)  # \\uD800..\\uDBFF
_HIGH_2ND[list(b"89abAB")] = True
_NO_ROWS = np.zeros(0, dtype=np.int64)


def _lanes(template: bytes) -> U64:
    """``template`` as little-endian 8-byte lanes, the last zero-padded, then its mask."""
    padded = template.ljust(-(-len(template) // 8) * 8, b"\0")
    mask = (1 << (8 * (len(template) % 8 or 8))) - 1
    return np.append(np.frombuffer(padded, dtype="<u8"), np.uint64(mask))


_T1 = _lanes(b'":{"logprob":')
_T2 = _lanes(b',"rank":')[0]
_T3 = _lanes(b',"decoded_token":"')


class _Cut:
    """The value standing in for the rows array while the envelope is parsed."""


_CUT = _Cut()


def parse_completion_fast(
    body: bytes, *, expected_prompt_len: int, k: int, vocab_size: int, max_candidates: int
) -> ParsedCompletion:
    """``parse.parse_completion``, on the fast path where the layout allows it."""
    args = {
        "expected_prompt_len": expected_prompt_len,
        "k": k,
        "vocab_size": vocab_size,
        "max_candidates": max_candidates,
    }
    try:
        return scan_completion(body, **args)
    except FastPathDeferred:
        return parse_completion(body, **args)


def scan_completion(
    body: bytes, *, expected_prompt_len: int, k: int, vocab_size: int, max_candidates: int
) -> ParsedCompletion:
    """The fast path alone; raises ``FastPathDeferred`` wherever the strict parser must decide."""
    if len(body) > response_body_limit(expected_prompt_len, k):
        raise FastPathDeferred
    key_at = body.find(_ARRAY_KEY)
    if key_at < 0:
        raise FastPathDeferred
    start = key_at + len(_ARRAY_KEY) - 1
    columns, end = scan_rows_array(body, start, expected_prompt_len, k, vocab_size, max_candidates)
    envelope = body[:start] + _CUT_TEXT.encode() + body[end:]
    if envelope.count(_CUT_TEXT.encode()) != 1:
        raise FastPathDeferred
    try:
        top = strict_loads(envelope, parse_float=_cut_float)
        return completion_from_tree(top, lambda entries: _rows_at_cut(entries, columns))
    except ProbeFailed as exc:
        raise FastPathDeferred from exc


def scan_rows_array(
    body: bytes, start: int, prompt_len: int, k: int, vocab_size: int, max_candidates: int
) -> tuple[PromptLogprobColumns, int]:
    """One prompt-logprobs array opening at ``body[start]``: its columns and the index past it.

    The array alone, under ``parse.parse_rows``'s rules; ``FastPathDeferred`` where the
    strict parser must decide (the teacher endpoint checks each choice's array with it).
    """
    limits = _Limits(min(vocab_size, MAX_VOCAB_SIZE), k, prompt_len - 1, max_candidates)
    columns, end = _scan_array(body, start, limits)
    assert columns is not None
    return columns, end


def check_rows_array(
    body: bytes, start: int, prompt_len: int, k: int, vocab_size: int, max_candidates: int
) -> int:
    """``scan_rows_array``'s verdict without its columns: the index past the array.

    For a caller that relays the bytes (the teacher endpoint): the same rules, but a
    logprob is only checked (``exact_numbers.valid_logprobs``: a number ``<= 0``, finite
    as float32), not converted, so a float32-inexact text passes here as the strict
    parser passes it; ``FastPathDeferred`` where the strict parser must decide.

    The one-pass C scan (``_rowscan.check``) decides first where it is built; it passes a
    strict subset of what the numpy scan passes and leaves the rest to it.
    """
    if _rowscan is not None:
        end = _rowscan.check(
            body, start, prompt_len - 1, k, min(vocab_size, MAX_VOCAB_SIZE), max_candidates
        )
        if end >= 0:
            return end
    return numpy_check_rows_array(body, start, prompt_len, k, vocab_size, max_candidates)


def numpy_check_rows_array(
    body: bytes, start: int, prompt_len: int, k: int, vocab_size: int, max_candidates: int
) -> int:
    """``check_rows_array`` on the numpy scan alone."""
    limits = _Limits(
        min(vocab_size, MAX_VOCAB_SIZE), k, prompt_len - 1, max_candidates, values=False
    )
    return _scan_array(body, start, limits)[1]


def compiled_check() -> bool:
    """Whether the one-pass C scan (``kiln_registry.probe._rowscan``) is built."""
    return _rowscan is not None


def _cut_float(text: str) -> object:
    return _CUT if text == _CUT_TEXT else float(text)


def _rows_at_cut(entries: object, columns: PromptLogprobColumns) -> PromptLogprobColumns:
    if entries is not _CUT:
        raise FastPathDeferred
    return columns


@dataclass(frozen=True, slots=True)
class _Limits:
    vocab: int
    k: int
    rows: int
    max_candidates: int
    values: bool = True  # False: check only, keep no logprob or rank column


@dataclass(slots=True)
class _Out:
    """The columns, appended chunk by chunk, and the row-start flags."""

    ids: array[int] = field(default_factory=lambda: array("i"))
    logprobs: array[float] = field(default_factory=lambda: array("f"))
    ranks: array[int] = field(default_factory=lambda: array("i"))
    row_starts: list[npt.NDArray[np.bool_]] = field(default_factory=list)
    new_row: bool = True


def _scan_array(
    body: bytes, start: int, limits: _Limits
) -> tuple[PromptLogprobColumns | None, int]:
    """Validate the rows array opening at ``start``; return its columns (None when
    ``limits.values`` is off) and end."""
    head = body[start : start + 8]
    if head[:6] == b"[null]":
        return _columns(_Out(), limits), start + 6
    if head != b'[null,{"':
        raise FastPathDeferred
    arr = np.frombuffer(body, dtype=np.uint8)
    out = _Out()
    pos, end = start + 7, 0
    while not end:
        pos, end = _scan_chunk(body, arr, pos, out, limits)
    return _columns(out, limits), end


def _quotes(body: bytes, arr: Bytes, pos: int, stop: int) -> tuple[I64, I64]:
    """Unescaped quote positions in ``[pos, stop)`` and the escaping backslashes."""
    region = arr[pos:stop]
    is_quote = region == 0x22
    if body.find(b"\\", pos, stop) < 0:
        return _positions(is_quote, pos), _NO_ROWS
    slashes = sparse_positions(region == 0x5C)
    first = np.ones(slashes.size, dtype=bool)
    first[1:] = np.diff(slashes) != 1
    index = np.arange(slashes.size)
    run_start = np.maximum.accumulate(np.where(first, index, 0))
    escaping = slashes[((index - run_start) & 1) == 0]
    is_quote[escaping[escaping + 1 < region.size] + 1] = False  # an escaped byte is no quote
    return _positions(is_quote, pos), escaping + pos


def _positions(mask: npt.NDArray[np.bool_], offset: int) -> I64:
    """``np.flatnonzero(mask) + offset``, the offset added in place."""
    found: I64 = np.flatnonzero(mask)
    found += offset
    return found


def sparse_positions(mask: npt.NDArray[np.bool_]) -> I64:
    """``np.flatnonzero(mask)`` for a mask with few hits (the backslashes of a rows array):
    the 8-byte words that hold a hit first, then the hits within those words."""
    whole = mask.size & ~7
    words = np.flatnonzero(mask[:whole].view(np.uint64) != 0)
    inner = np.flatnonzero(mask[:whole].reshape(-1, 8)[words])
    found: I64 = words[inner >> 3] * 8 + (inner & 7)
    if whole < mask.size:
        found = np.concatenate((found, np.flatnonzero(mask[whole:]) + whole))
    return found


def _scan_chunk(body: bytes, arr: Bytes, pos: int, out: _Out, limits: _Limits) -> tuple[int, int]:
    """Validate the complete candidates from ``pos``; return (next pos, array end or 0)."""
    size = CHUNK_BYTES
    while True:
        stop = min(pos + size, arr.size)
        quotes, escapes = _quotes(body, arr, pos, stop)
        groups = quotes.size // 10
        if groups or stop == arr.size:
            break
        size *= 2
    if not groups or quotes[0] != pos:
        raise FastPathDeferred
    grouped = quotes[: groups * 10].reshape(groups, 10)
    count, nxt, new_row, end = _gaps(arr, np.ascontiguousarray(grouped[:, 9]))
    # The quotes that bound variable fields (the others sit in fixed templates):
    # id open/close, "rank" open, "decoded_token" open, token string open/close.
    q = np.ascontiguousarray(grouped[:count, [0, 1, 4, 6, 8, 9]].T)
    if (q[0, 1:] != nxt[: count - 1]).any():
        raise FastPathDeferred
    if len(out.ids) + count > limits.max_candidates:
        raise FastPathDeferred
    head, number, tail = _windows(arr, q)
    _check_text(body, arr, pos, int(q[5, -1]) + 1, escapes, q)
    ids = small_ints(head, q[1] - q[0] - 1, 0, limits.vocab - 1)
    ranks = small_ints(tail, q[3] - q[2] - 8, 1, limits.vocab)
    out.ids.frombytes(ids.data.cast("B"))
    if limits.values:
        logprobs = exact_logprobs(body, number, q[1] + 13, q[2] - 1)
        out.ranks.frombytes(ranks.data.cast("B"))
        out.logprobs.frombytes(logprobs.data.cast("B"))
    else:
        for row in valid_logprobs(number, q[2] - q[1] - 14).tolist():
            _check_logprob_text(body[int(q[1, row]) + 13 : int(q[2, row]) - 1])
    starts = np.empty(count, dtype=bool)
    starts[0], starts[1:] = out.new_row, new_row[: count - 1]
    out.row_starts.append(starts)
    out.new_row = bool(new_row[count - 1])
    return int(nxt[count - 1]), end


def _check_logprob_text(text: bytes) -> None:
    """One logprob ``valid_logprobs`` left: a JSON number passing ``check_logprob``, or defer."""
    if JSON_NUMBER.fullmatch(text) is None:
        raise FastPathDeferred
    try:
        check_logprob(float(text), "logprob")  # a huge literal reads as inf: refused
    except ProbeFailed as exc:
        raise FastPathDeferred from exc


def _window(arr: Bytes, starts: I64, width: int) -> Bytes:
    """``arr[s : s + width]`` for every ``s``, as one C-contiguous ``(len(starts), width)``.

    Gathers ``width``-byte items of an overlapping stride-1 view (one index
    and one copy per row), not one index per byte.
    """
    if starts.min() < 0 or starts.max() > arr.size - width:
        raise FastPathDeferred
    items = np.ndarray((arr.size - width + 1,), dtype=f"V{width}", buffer=arr, strides=(1,))
    window: Bytes = items[starts].view(np.uint8).reshape(starts.size, width)
    return window


def _windows(arr: Bytes, q: npt.NDArray[np.int64]) -> tuple[U64, Bytes, U64]:
    """The fixed-width byte windows of each candidate, their templates checked.

    ``head`` (3 lanes): 8 bytes before the id's closing quote, ``":{"logprob":``;
    ``number`` (40 bytes): the 32 bytes ending at the logprob, ``,"rank":``;
    ``tail`` (4 lanes): 8 bytes before ``,"decoded_token":"``, that template.
    """
    head = _window(arr, q[1] - 8, 24).view(np.uint64)
    number = _window(arr, q[2] - 33, 40)
    tail = _window(arr, q[3] - 9, 32).view(np.uint64)
    bad = (head[:, 1] != _T1[0]) | ((head[:, 2] & _T1[2]) != _T1[1])
    bad |= number.view(np.uint64)[:, 4] != _T2
    bad |= (tail[:, 1] != _T3[0]) | (tail[:, 2] != _T3[1]) | ((tail[:, 3] & _T3[3]) != _T3[2])
    if bad.any():
        raise FastPathDeferred
    return head, number, tail


def _gaps(arr: Bytes, q9: I64) -> tuple[int, I64, npt.NDArray[np.bool_], int]:
    """What follows each candidate: ``},"`` (same row), ``}},{"`` (new row) or ``}}]`` (end).

    Returns (candidates up to the end, next candidate starts, new-row flags,
    array end or 0); groups after the end are the envelope's quotes.  The
    quote that opens the next candidate is checked by the caller's links.
    """
    usable = q9 if q9[-1] + 6 <= arr.size else q9[q9 + 6 <= arr.size]
    close, second, third = arr[usable + 1] == 0x7D, arr[usable + 2], arr[usable + 3]
    same = close & (second == 0x2C)
    new = close & (second == 0x7D) & (third == 0x2C) & (arr[usable + 4] == 0x7B)
    ok = same | new
    nxt = usable + np.where(same, 3, 5)
    if ok.all():
        if usable.size < q9.size:
            raise FastPathDeferred
        return q9.size, nxt, new, 0
    bad = int(np.argmin(ok))
    if not (close[bad] and second[bad] == 0x7D and third[bad] == 0x5D):
        raise FastPathDeferred
    return bad + 1, nxt, new, int(usable[bad]) + 4


def _check_text(body: bytes, arr: Bytes, pos: int, last: int, escapes: I64, q: I64) -> None:
    """Control bytes, UTF-8 and escapes of the candidates in ``[pos, last)``."""
    region = arr[pos:last]
    if region.min() < 0x20:
        raise FastPathDeferred
    if region.max() >= 0x80:
        try:
            codecs.utf_8_decode(memoryview(body)[pos:last], "strict", True)
        except UnicodeDecodeError as exc:
            raise FastPathDeferred from exc
    escapes = escapes[escapes < last]
    if not escapes.size:
        return
    owner = np.searchsorted(q[5], escapes)
    if owner.max() >= q.shape[1] or (q[4, owner] >= escapes).any():
        raise FastPathDeferred
    kinds = arr[escapes + 1]
    if not _ESCAPABLE[kinds].all():
        raise FastPathDeferred
    units = escapes[kinds == ord("u")]
    if not units.size:
        return
    digits = _window(arr, units + 2, 4)
    if not _HEX[digits].all():
        raise FastPathDeferred
    _check_surrogate_pairs(units, digits)


def _check_surrogate_pairs(units: I64, digits: Bytes) -> None:
    """Every ``\\uD800``-``\\uDBFF`` escape directly followed by a ``\\uDC00``-``\\uDFFF`` one.

    ``units`` are the sorted positions of the ``\\u`` escapes and ``digits``
    their hex digits.  A lone surrogate (serde_json refuses it) defers.
    """
    surrogate = ((digits[:, 0] | 0x20) == ord("d")) & _SURROGATE_2ND[digits[:, 1]]
    if not surrogate.any():
        return
    high = surrogate & _HIGH_2ND[digits[:, 1]]
    partner = np.minimum(np.searchsorted(units, units + 6), units.size - 1)
    paired = high & (units[partner] == units + 6) & surrogate[partner] & ~high[partner]
    if paired.sum() * 2 != surrogate.sum() or (high & ~paired).any():
        raise FastPathDeferred


def first_duplicate(ids: npt.NDArray[np.integer], offsets: I64) -> tuple[int, int] | None:
    """(row, smallest repeated id) of the first row that repeats an id, or None.

    Rows are padded to the widest row with distinct negative fillers and
    sorted in place, so ``ids`` must be non-negative.
    """
    widths = np.diff(offsets)
    rows = widths.size
    width = int(widths.max()) if rows else 0
    if width < 2:
        return None
    if rows * width > 4 * ids.size + 4096:  # a few very wide rows: sort instead of padding
        row_of = np.repeat(np.arange(rows), widths)
        order = np.lexsort((ids, row_of))
        same = (np.diff(row_of[order]) == 0) & (np.diff(ids[order]) == 0)
        if not same.any():
            return None
        at = order[int(np.argmax(same))]
        return int(row_of[at]), int(ids[at])
    pad = np.broadcast_to(-1 - np.arange(width, dtype=ids.dtype), (rows, width)).copy()
    slots = np.arange(ids.size) + np.repeat(np.arange(rows) * width - offsets[:-1], widths)
    pad.ravel()[slots] = ids
    pad.sort(axis=1)
    same = pad[:, 1:] == pad[:, :-1]
    hit = same.any(axis=1)
    if not hit.any():
        return None
    row = int(np.argmax(hit))
    return row, int(pad[row, int(np.argmax(same[row]))])


def _columns(out: _Out, limits: _Limits) -> PromptLogprobColumns | None:
    """Check the row count, widths and duplicate ids, and pack the columns (if kept)."""
    flags = np.concatenate(out.row_starts) if out.row_starts else np.zeros(0, dtype=bool)
    offsets = np.append(np.flatnonzero(flags), len(out.ids)).astype(np.int64)
    if offsets.size - 1 != limits.rows:
        raise FastPathDeferred
    if offsets.size > 1 and int(np.diff(offsets).max()) > limits.k + 1:
        raise FastPathDeferred
    if first_duplicate(np.frombuffer(out.ids, dtype=np.int32), offsets) is not None:
        raise FastPathDeferred
    if not limits.values:
        return None
    packed = array("q")
    packed.frombytes(offsets.data.cast("B"))
    return PromptLogprobColumns(
        ids=out.ids, logprobs=out.logprobs, ranks=out.ranks, offsets=packed, distinct_ids=True
    )
