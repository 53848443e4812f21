"""Bounded, strict parsing of vLLM ``/v1/completions`` prompt-logprobs bodies.

Owns the wire facts shared by the probe, the scoring path and the jobs module:
the response-body bound, strict JSON (no duplicate keys, no NaN/Infinity
literals, UTF-8 only, and the rules Kiln's ``serde_json`` adds, from
``probe.serde_rules``), the per-candidate value rules as Kiln's
``remote_teacher.rs`` applies them (canonical decimal token ids below the
vocabulary; any finite JSON number ``<= 0`` as the logprob, rounded to float32
and refused only when that rounding overflows; integer ranks in
``1..=vocab_size``; ``decoded_token`` and any other candidate key ignored), and
the compact columnar form of the rows (``array`` columns plus row offsets,
never a dict per candidate).  Rows are maps: the wire order of candidates
carries no meaning.  Cross-row semantics (the observed token, rank structure,
ties, order, probability mass, identity) are ``kiln_registry.probe.verify``'s
job.

Refusals are ``ProbeFailed`` with ``rule="probe.<name>"``.  Pure: imports only
the standard library, ``kiln_registry.domain`` (errors, limits, text excerpts) and
``probe.serde_rules``; no sockets, numpy or httpx.
"""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import NoReturn

from kiln_registry.domain.errors import ProbeFailed
from kiln_registry.domain.limits import MAX_BODY_LIMIT, MIN_BODY_LIMIT
from kiln_registry.domain.limits import MAX_VOCAB_SIZE as MAX_VOCAB_SIZE
from kiln_registry.domain.text import escaped_excerpt
from kiln_registry.probe import serde_rules

NEG_INF_SENTINEL = -9999.0
MAX_ERROR_TEXT = 400
# Doubles at or beyond FLT_MAX + half an ulp round (to nearest, ties to even) to
# infinity as float32; Kiln refuses those ("not representable as finite f32").
F32_OVERFLOW = 2.0**128 - 2.0**103
_MAX_ID_DIGITS = len(str(MAX_VOCAB_SIZE))


def response_body_limit(prompt_len: int, k: int) -> int:
    """Largest body accepted for a prompt of ``prompt_len`` tokens at top-``k``.

    ``clamp(prompt_len * (k + 1) * 128 + prompt_len * 32 + 65536, 1 MiB, 256 MiB)``.
    """
    raw = prompt_len * (k + 1) * 128 + prompt_len * 32 + 65536
    return max(MIN_BODY_LIMIT, min(MAX_BODY_LIMIT, raw))


def fail(rule: str, message: str) -> NoReturn:
    raise ProbeFailed(message, rule=f"probe.{rule}")


# False while a response to an authenticated request is parsed or verified: a
# teacher could reflect the bearer key into any field, so no response text may
# reach a message then (``withholding_response_text``).
_ECHO_RESPONSE_TEXT: ContextVar[bool] = ContextVar("kiln_echo_response_text", default=True)
WITHHELD = "<withheld: the request carried a credential>"


@contextmanager
def withholding_response_text(authenticated: bool) -> Iterator[None]:
    """Within the block, ``shown`` never quotes response text if ``authenticated``."""
    token = _ECHO_RESPONSE_TEXT.set(not authenticated)
    try:
        yield
    finally:
        _ECHO_RESPONSE_TEXT.reset(token)


def shown(value: str, limit: int = MAX_ERROR_TEXT) -> str:
    """``escaped_excerpt`` of an untrusted decoded string; lone surrogates escaped, not raised.

    Response text is withheld entirely while an authenticated response is checked.
    """
    if not _ECHO_RESPONSE_TEXT.get():
        return WITHHELD
    return escaped_excerpt(value[: limit * 2].encode("utf-8", errors="backslashreplace"), limit)


@dataclass(frozen=True, slots=True)
class PromptLogprobColumns:
    """Rows 1..n-1 of ``prompt_logprobs`` as flat columns.

    Row ``r`` (prompt position ``r + 1``) owns candidates
    ``offsets[r]:offsets[r + 1]`` in wire order (which means nothing: the
    observed token may sit anywhere; ``verify`` finds it).  ``logprobs`` are
    the numbers rounded to float32, as Kiln keeps them.  ``sources`` holds the
    numbers as float64 when some of them are not float32-exact (Kiln compares
    ties, order and mass on those); None when ``logprobs`` are exact.
    ``distinct_ids``: the producer proved no row repeats an id (both parsers
    do: strict JSON refuses a repeated key, and ids are canonical).
    """

    ids: array[int]
    logprobs: array[float]
    ranks: array[int]
    offsets: array[int]
    sources: array[float] | None = None
    distinct_ids: bool = False

    @property
    def row_count(self) -> int:
        return len(self.offsets) - 1

    @property
    def candidate_count(self) -> int:
        return len(self.ids)

    def row_width(self, row: int) -> int:
        return self.offsets[row + 1] - self.offsets[row]


@dataclass(frozen=True, slots=True)
class ParsedCompletion:
    """The fields of a completion body that the probe and scoring path check."""

    object: str
    model: str
    system_fingerprint: str | None
    prompt_tokens: int
    choice_count: int
    choice_index: int
    rows: PromptLogprobColumns


class _Cand(tuple[object, object]):
    """A candidate object (``logprob`` and ``rank``; other keys ignored) as a tuple."""

    __slots__ = ()


class _Row(list[tuple[str, _Cand]]):
    """An object whose values are all candidates: a prompt-logprobs row, in order."""

    __slots__ = ()


class _Duplicate(Exception):
    pass


def _pairs_hook(pairs: list[tuple[str, object]]) -> object:
    if len(pairs) > 1 and len({key for key, _ in pairs}) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Duplicate(key)
            seen.add(key)
    if pairs and all(type(value) is _Cand for _, value in pairs):
        return _Row(pairs)  # type: ignore[arg-type]  # every value checked above
    obj = dict(pairs)
    if "logprob" in obj and "rank" in obj:
        return _Cand((obj["logprob"], obj["rank"]))
    return obj


def refuse_constant(name: str) -> object:
    fail("json_constant", f"response body contains the non-standard JSON literal {name}")


def strict_loads(
    body: bytes,
    *,
    what: str = "response body",
    parse_float: Callable[[str], object] | None = None,
) -> object:
    """Strict JSON: UTF-8, no duplicate keys, no NaN/Infinity literals, serde_json's rules.

    ``probe.serde_rules``: no lone surrogate escape, nesting below 128, numbers
    in the float64 range, ``-0`` read as ``-0.0`` (anywhere, as Kiln parses).

    ``parse_float`` replaces ``float`` for float literals (``probe.candidate_scan``
    uses it to locate the one literal it substituted for the rows array).
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        fail("json_utf8", f"{what} is not valid UTF-8 (byte {exc.start})")
    parse_int: Callable[[str], object] | None = None
    if serde_rules.suspect_numbers(body):
        parse_float, parse_int = serde_rules.number_hooks(parse_float, what)
    try:
        value = json.loads(
            text,
            object_pairs_hook=_pairs_hook,
            parse_constant=refuse_constant,
            parse_float=parse_float,
            parse_int=parse_int,
        )
    except _Duplicate as exc:
        fail(
            "json_duplicate_key",
            f"{what} repeats the object key {shown(exc.args[0], 40)!r}",
        )
    except json.JSONDecodeError as exc:
        fail("json", f"{what} is not valid JSON: {exc.msg} at byte offset {exc.pos}")
    except (ValueError, RecursionError) as exc:
        fail("json", f"{what} is not acceptable JSON: {type(exc).__name__}")
    serde_rules.check_text(body, what)
    return value


def _token_id(key: str, where: str, vocab_size: int) -> int:
    if not (0 < len(key) <= _MAX_ID_DIGITS and key.isascii() and key.isdigit()):
        fail(
            "token_id",
            f"{where} has a token key {shown(key, 40)!r} that is not a decimal id",
        )
    if len(key) > 1 and key[0] == "0":
        fail("token_id", f"{where} has a token key {key!r} with a leading zero")
    value = int(key)
    if value >= vocab_size:
        fail("token_id_range", f"{where} has token id {value}, not below vocab_size {vocab_size}")
    return value


def check_logprob(value: object, where: str) -> float:
    """A logprob as Kiln takes it: a finite JSON number <= 0 whose float32 rounding is finite.

    Returns the number as float64; ``-0.1`` is valid and is stored as its
    nearest float32, as Kiln's ``logprob_f64 as f32`` does.
    """
    if type(value) is not float and type(value) is not int:
        fail("logprob_type", f"{where}.logprob is {type(value).__name__}, not a number")
    try:
        number = float(value)
    except OverflowError:
        fail("logprob_finite", f"{where}.logprob is an integer too large for a float")
    if not math.isfinite(number):
        fail("logprob_finite", f"{where}.logprob {number!r} is not finite")
    if number > 0.0:
        fail("logprob_positive", f"{where}.logprob {number!r} is positive")
    if number <= -F32_OVERFLOW:
        fail(
            "logprob_float32",
            f"{where}.logprob {number!r} is not representable as a finite float32",
        )
    return number


def _rank(value: object, where: str, vocab_size: int) -> int:
    if type(value) is not int:
        fail("rank_type", f"{where}.rank is {type(value).__name__}, not an integer")
    if not 1 <= value <= vocab_size:
        fail("rank_range", f"{where}.rank {value} is outside 1..={vocab_size}")
    return value


def _row_entry(row: object, pos: int) -> _Row:
    if type(row) is _Row:
        return row
    if isinstance(row, dict):
        for key, value in row.items():
            if type(value) is not _Cand:
                fail(
                    "candidate_shape",
                    f"prompt_logprobs[{pos}][{shown(str(key), 40)!r}] is not an"
                    " object with logprob and rank",
                )
        fail("row_width", f"prompt_logprobs[{pos}] is an empty object")
    fail("row_type", f"prompt_logprobs[{pos}] is {type(row).__name__}, not an object")


_Cols = tuple["array[int]", "array[float]", "array[int]", "array[float]"]


def _append_row(row: _Row, pos: int, vocab_size: int, cols: _Cols) -> None:
    ids, lps, ranks, sources = cols
    for key, cand in row:
        where = f"prompt_logprobs[{pos}][{key!r}]" if len(key) <= 40 else f"prompt_logprobs[{pos}]"
        ids.append(_token_id(key, where, vocab_size))
        logprob, rank = cand
        number = check_logprob(logprob, where)
        lps.append(number)  # rounds to nearest float32, finite (checked above)
        sources.append(number)
        ranks.append(_rank(rank, where, vocab_size))


def parse_rows(
    entries: object, *, expected_prompt_len: int, k: int, vocab_size: int, max_candidates: int
) -> PromptLogprobColumns:
    """Validate ``choices[0].prompt_logprobs`` and pack it into columns."""
    if not isinstance(entries, list):
        fail("prompt_logprobs_type", "choices[0].prompt_logprobs is not an array")
    if len(entries) != expected_prompt_len:
        fail(
            "prompt_logprobs_length",
            f"choices[0].prompt_logprobs has {len(entries)} entries, expected"
            f" {expected_prompt_len} (one per prompt token)",
        )
    if entries and entries[0] is not None:
        fail("prompt_logprobs_first", "choices[0].prompt_logprobs[0] must be null")
    cols: _Cols = (array("i"), array("f"), array("i"), array("d"))
    offsets = array("q", [0])
    total = 0
    for pos in range(1, len(entries)):
        row = _row_entry(entries[pos], pos)
        if len(row) > k + 1:
            fail(
                "row_width", f"prompt_logprobs[{pos}] has {len(row)} entries, more than K+1={k + 1}"
            )
        total += len(row)
        if total > max_candidates:
            fail("candidate_budget", f"prompt_logprobs has more than {max_candidates} candidates")
        _append_row(row, pos, vocab_size, cols)
        offsets.append(total)
    ids, lps, ranks, sources = cols
    exact = array("d", lps) == sources
    return PromptLogprobColumns(
        ids=ids,
        logprobs=lps,
        ranks=ranks,
        offsets=offsets,
        sources=None if exact else sources,
        distinct_ids=True,  # a repeated key was refused by strict_loads; ids are canonical
    )


def _field(obj: dict[str, object], key: str, kind: type, where: str) -> object:
    value = obj.get(key)
    if type(value) is not kind:
        fail("shape", f"{where}.{key} is {type(value).__name__}, expected {kind.__name__}")
    return value


def _choice(top: dict[str, object]) -> tuple[dict[str, object], int]:
    choices = top.get("choices")
    if not isinstance(choices, list):
        fail("shape", "response choices is not an array")
    if len(choices) != 1:
        fail("choice_count", f"response has {len(choices)} choices, expected exactly one")
    choice = choices[0]
    if not isinstance(choice, dict):
        fail("shape", "response choices[0] is not an object")
    index = _field(choice, "index", int, "choices[0]")
    assert isinstance(index, int)
    return choice, index


def parse_completion(
    body: bytes, *, expected_prompt_len: int, k: int, vocab_size: int, max_candidates: int
) -> ParsedCompletion:
    """Parse and bound a completion body; see the module docstring for the rules."""
    limit = response_body_limit(expected_prompt_len, k)
    if len(body) > limit:
        fail("body_too_large", f"response body of {len(body)} bytes exceeds the bound {limit}")
    top = strict_loads(body)

    def rows(entries: object) -> PromptLogprobColumns:
        return parse_rows(
            entries,
            expected_prompt_len=expected_prompt_len,
            k=k,
            vocab_size=min(vocab_size, MAX_VOCAB_SIZE),
            max_candidates=max_candidates,
        )

    return completion_from_tree(top, rows)


def completion_from_tree(
    top: object, rows: Callable[[object], PromptLogprobColumns]
) -> ParsedCompletion:
    """Check the decoded body around ``choices[0].prompt_logprobs``, which ``rows`` packs.

    Shared by ``parse_completion`` and the fast path (``probe.candidate_scan``), so
    both apply the same envelope rules in the same order.
    """
    if not isinstance(top, dict):
        fail("shape", "response body is not a JSON object")
    usage = top.get("usage")
    if not isinstance(usage, dict):
        fail("usage", "response usage is not an object")
    fingerprint = top.get("system_fingerprint")
    if fingerprint is not None and type(fingerprint) is not str:
        fail("fingerprint_type", "response system_fingerprint is not a string")
    choice, index = _choice(top)
    columns = rows(choice.get("prompt_logprobs"))
    prompt_tokens = _field(usage, "prompt_tokens", int, "usage")
    return ParsedCompletion(
        object=str(_field(top, "object", str, "response")),
        model=str(_field(top, "model", str, "response")),
        system_fingerprint=fingerprint,
        prompt_tokens=int(prompt_tokens),  # type: ignore[call-overload]
        choice_count=1,
        choice_index=index,
        rows=columns,
    )
