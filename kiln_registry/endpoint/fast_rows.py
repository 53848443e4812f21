"""The fast path of the answer check: orjson's tree, proved to be the strict parser's.

``fast_tree`` parses a teacher answer with orjson (C; refuses NaN, Infinity and invalid
UTF-8 itself) and counts the keys of the text exactly (``key_endings``: the closing
quotes followed by a colon, found with numpy), so when the parsed objects hold as many
keys as the text, no object repeated a key.  The caller counts the keys:
``envelope_keys`` outside the rows, ``check_rows_fast`` inside them (it visits every
candidate anyway); on any difference it uses the strict parser instead, which refuses
or accepts with its own rule.  orjson reads an integer past 64 bits as a float: every
integer this check reads (a choice's ``index``, a ``rank``) is then refused as not an
integer, as the strict path refuses it (out of range); a logprob keeps its verdict.

``check_rows_fast`` applies ``probe.parse.parse_rows``'s rules to one choice's rows in the
orjson tree (first entry null, one row per prompt token, 1..K+1 candidates a row, the
candidate budget, canonical decimal ids below ``vocab_size``, ``logprob`` a finite number
<= 0 that is finite as float32, ``rank`` an integer in 1..=``vocab_size``) without
building columns.  A broken rule raises ``ProbeFailed`` with the strict rule's name.

Imports the standard library, numpy, orjson and ``probe.parse``; pure.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Final

import numpy as np
import orjson

from kiln_registry.probe.parse import F32_OVERFLOW, fail

_QUOTE: Final = 0x22
_BACKSLASH: Final = 0x5C
_COLON: Final = 0x3A
_BLANK_BYTES: Final = frozenset(b" \t\n\r")
_BLANKS: Final = np.array([0x20, 0x09, 0x0A, 0x0D], dtype=np.uint8)
_CONTAINERS: Final = (dict, list)
BULK_VOCAB_LIMIT: Final = 1 << 20  # above it, ids are checked one by one (no id set)


class KeyCount:
    """Keys seen by ``check_rows_fast`` in rows and candidates (the envelope counts the rest)."""

    def __init__(self) -> None:
        self.keys = 0


def fast_tree(body: bytes) -> tuple[Any, int] | None:
    """orjson's tree of ``body`` and the text's key count; None where orjson cannot parse."""
    try:
        value = orjson.loads(body)
    except (orjson.JSONDecodeError, RecursionError):
        return None
    return value, key_endings(body)


def key_endings(body: bytes) -> int:
    """How many keys the text of a valid JSON document holds.

    The unescaped quotes of valid JSON alternate opening and closing; a closing quote
    whose next non-blank byte is a colon ends a key.  A quote is escaped when an odd run
    of backslashes precedes it (runs are measured only where a backslash precedes one).
    """
    text = np.frombuffer(body, dtype=np.uint8)
    quotes = np.flatnonzero(text == _QUOTE)
    before = text[np.maximum(quotes - 1, 0)]
    escaped = np.zeros(quotes.size, dtype=bool)
    for index in np.flatnonzero(before == _BACKSLASH).tolist():
        at = int(quotes[index]) - 1
        start = at
        while at >= 0 and body[at] == _BACKSLASH:
            at -= 1
        escaped[index] = (start - at) % 2 == 1
    closing = quotes[~escaped][1::2]
    closing = closing[closing + 1 < len(body)]
    after = text[closing + 1]
    count = int(np.count_nonzero(after == _COLON))
    for position in closing[np.isin(after, _BLANKS)].tolist():
        at = position + 1
        while at < len(body) and body[at] in _BLANK_BYTES:  # each run of blanks walked once
            at += 1
        count += at < len(body) and body[at] == _COLON
    return count


def envelope_keys(value: object) -> int:
    """Keys of every object in ``value`` except those inside ``prompt_logprobs`` arrays."""
    if type(value) is dict:
        count = len(value)
        for key, item in value.items():
            if type(item) in _CONTAINERS and key != "prompt_logprobs":
                count += envelope_keys(item)
        return count
    if type(value) is list:
        return sum(envelope_keys(v) for v in value if type(v) in _CONTAINERS)
    return 0


def check_rows_fast(
    entries: object,
    *,
    expected_prompt_len: int,
    k: int,
    vocab_size: int,
    max_candidates: int,
    seen: KeyCount | None = None,
) -> None:
    """``parse_rows``'s verdict on one choice's ``prompt_logprobs`` (see the module).

    The common case is checked in bulk (C-level ``map``/``set`` and numpy); any doubt
    walks the rows one by one (``check_rows_walk``), which names the rule and position.
    """
    keys = _bulk_keys(entries, expected_prompt_len, k, vocab_size, max_candidates)
    if keys is None:
        check_rows_walk(
            entries,
            expected_prompt_len=expected_prompt_len,
            k=k,
            vocab_size=vocab_size,
            max_candidates=max_candidates,
            seen=seen,
        )
    elif seen is not None:
        seen.keys += keys


@functools.lru_cache(maxsize=4)
def _id_strings(vocab_size: int) -> frozenset[str]:
    """Every canonical decimal id below ``vocab_size`` (built once per vocabulary)."""
    return frozenset(map(str, range(vocab_size)))


def _bulk_keys(
    entries: object, expected_len: int, k: int, vocab_size: int, max_candidates: int
) -> int | None:
    """The rows' and candidates' key count when every rule holds in bulk, else None."""
    if type(entries) is not list or len(entries) != expected_len or not entries:
        return None
    rows = entries[1:]
    if entries[0] is not None or (rows and set(map(type, rows)) != {dict}):
        return None
    widths = list(map(len, rows))
    if rows and (min(widths) < 1 or max(widths) > k + 1 or sum(widths) > max_candidates):
        return None
    if vocab_size > BULK_VOCAB_LIMIT:
        return None
    ids = _id_strings(vocab_size)
    if not all(map(ids.issuperset, rows)):
        return None
    cands = [c for row in rows for c in row.values()]
    if cands and set(map(type, cands)) != {dict}:
        return None
    logprobs = [c.get("logprob") for c in cands]
    ranks = [c.get("rank") for c in cands]
    if cands and (not set(map(type, logprobs)) <= {float, int} or set(map(type, ranks)) != {int}):
        return None
    lp = np.array(logprobs, dtype=np.float64)
    rk = np.array(ranks, dtype=np.int64)
    if lp.size and not (lp.max() <= 0.0 and lp.min() > -F32_OVERFLOW):
        return None
    if rk.size and not (rk.min() >= 1 and rk.max() <= vocab_size):
        return None
    return sum(widths) + sum(map(len, cands))


def check_rows_walk(
    entries: object,
    *,
    expected_prompt_len: int,
    k: int,
    vocab_size: int,
    max_candidates: int,
    seen: KeyCount | None = None,
) -> None:
    """``check_rows_fast`` row by row: the first broken rule raises, with its position."""
    if not isinstance(entries, list):
        fail("prompt_logprobs_type", "choices[].prompt_logprobs is not an array")
    if len(entries) != expected_prompt_len:
        fail("prompt_logprobs_length", f"prompt_logprobs has {len(entries)} entries,"
             f" expected {expected_prompt_len} (one per prompt token)")  # fmt: skip
    if entries and entries[0] is not None:
        fail("prompt_logprobs_first", "prompt_logprobs[0] must be null")
    digits = len(str(vocab_size - 1))
    total = keys = 0
    for pos in range(1, len(entries)):
        row = entries[pos]
        if type(row) is not dict or not 0 < len(row) <= k + 1:
            fail("row_width", f"prompt_logprobs[{pos}] is not an object of 1..{k + 1} candidates")
        total += len(row)
        keys += len(row)
        if total > max_candidates:
            fail("candidate_budget", f"prompt_logprobs has more than {max_candidates} candidates")
        for key, cand in row.items():
            if not (0 < len(key) <= digits and key.isascii() and key.isdigit()) or (
                len(key) > 1 and key[0] == "0"
            ):
                fail("token_id", f"prompt_logprobs[{pos}] has a token key that is not an id")
            if int(key) >= vocab_size:
                fail("token_id_range", f"prompt_logprobs[{pos}] has an id over vocab_size")
            keys += _check_candidate(cand, pos, vocab_size)
    if seen is not None:
        seen.keys += keys


def _check_candidate(cand: Any, pos: int, vocab_size: int) -> int:
    """Check one candidate; the number of keys it holds."""
    if type(cand) is not dict:
        fail("candidate_shape", f"prompt_logprobs[{pos}] has a candidate that is not an object")
    logprob, rank = cand.get("logprob"), cand.get("rank")
    if type(logprob) is float:
        if not (-F32_OVERFLOW < logprob <= 0.0):
            if math.isfinite(logprob) and logprob > 0.0:
                fail("logprob_positive", f"prompt_logprobs[{pos}] has a positive logprob")
            fail("logprob_float32", f"prompt_logprobs[{pos}] has a logprob out of float32")
    elif type(logprob) is int:
        if not (-F32_OVERFLOW < logprob <= 0):
            fail("logprob_positive", f"prompt_logprobs[{pos}] has a logprob out of range")
    else:
        fail("logprob_type", f"prompt_logprobs[{pos}] has a logprob that is not a number")
    if type(rank) is not int or not 1 <= rank <= vocab_size:
        fail("rank_range", f"prompt_logprobs[{pos}] has a rank outside 1..={vocab_size}")
    return len(cand)
