"""The JSON rules Kiln's ``serde_json`` applies to a teacher body beyond RFC 8259.

Kiln reads every prompt-logprobs body into a ``serde_json::Value``
(``crates/kiln-train/src/remote_teacher.rs``, ``parse_vllm_json_response``),
so a body is refused *anywhere*, ignored fields included, for:

- a lone surrogate escape (``\\ud800`` without a following ``\\udc00``..``\\udfff``,
  or a low surrogate on its own), in a string or an object key;
- nesting of ``MAX_NESTING`` (128) arrays/objects or more (serde_json's
  recursion limit: 127 levels parse, 128 do not);
- a number outside the float64 range (``1e400``, a 400-digit integer);

and an integer literal ``-0`` is a float there (``-0.0``), not the integer 0,
so ``"index": -0`` is not "integer zero".  Python's ``json`` accepts all of
these, so ``probe.parse.strict_loads`` applies this module after decoding:
``check_text`` on the raw text (exact for text ``json`` accepted), and
``number_hooks`` (only when ``suspect_numbers`` finds a literal that could
matter; the common body takes Python's C number parsing unchanged).

Refusals are ``ProbeFailed`` with ``rule="probe.json_<name>"``.  Pure:
standard library and ``kiln_registry.domain.errors`` only.
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Callable
from itertools import accumulate

from kiln_registry.domain.errors import ProbeFailed

MAX_NESTING = 128
_ESCAPE = re.compile(rb"\\.", re.DOTALL)  # one escape: in valid JSON, backslash + one byte
_ANY_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
# An escaped backslash or a surrogate escape: a high one with its low partner
# (a valid pair), or either alone.
_SURROGATE = re.compile(
    rb"\\\\"
    rb"|(\\u[dD][89abAB][0-9a-fA-F]{2})(\\u[dD][c-fC-F][0-9a-fA-F]{2})?"
    rb"|\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)
# Literals whose Python reading differs from serde_json's: an integer -0, and
# any number that may lie outside the float64 range (200+ digits in a row, or
# an exponent of three or more digits).  They are looked for with every digit
# read as "0" and "E" as "e"; strings can match too, which only costs the
# exact pass (``number_hooks``).
_NUMBER_SHAPE = bytes.maketrans(b"0123456789E", b"0000000000e")
_MINUS_ZERO = re.compile(rb"-0(?![0.e])")
_LONG_DIGITS = b"0" * 200
_NOT_STRUCTURE = bytes(range(256)).translate(None, b'"[]{}')
_DEPTH_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def _fail(rule: str, message: str) -> ProbeFailed:
    return ProbeFailed(message, rule=f"probe.json_{rule}")


def _check_surrogates(body: bytes, what: str) -> None:
    if _ANY_SURROGATE.search(body) is None:
        return
    for match in _SURROGATE.finditer(body):
        high, low = match.group(1), match.group(2)
        if match.group() == b"\\\\" or (high is not None and low is not None):
            continue
        raise _fail(
            "surrogate",
            f"{what} has a lone surrogate escape at byte {match.start()} (Kiln's JSON"
            " parser refuses one in any string or key)",
        )


def _depth_reaches(body: bytes, limit: int) -> bool:
    """Whether arrays/objects nest ``limit`` deep (``body`` is JSON ``json`` accepted)."""
    if body.count(b"[") + body.count(b"{") < limit:
        return False
    text = _ESCAPE.sub(b"", body) if b"\\" in body else body  # no quote is escaped now
    structure = text.translate(None, _NOT_STRUCTURE)  # quotes and brackets
    outside = b"".join(structure.split(b'"')[::2])  # even pieces lie outside strings
    steps = outside.translate(_DEPTH_STEP)
    return max(accumulate(array("b", steps)), default=0) >= limit


def check_text(body: bytes, what: str) -> None:
    """Refuse a lone surrogate escape or nesting of ``MAX_NESTING`` levels anywhere."""
    if b"\\" in body:
        _check_surrogates(body, what)
    if _depth_reaches(body, MAX_NESTING):
        raise _fail(
            "depth",
            f"{what} nests arrays and objects {MAX_NESTING} levels deep or more"
            " (Kiln's JSON parser stops at 127)",
        )


def suspect_numbers(body: bytes) -> bool:
    """Whether ``body`` may hold an integer ``-0`` or a number outside the float64 range."""
    shape = body.translate(_NUMBER_SHAPE)
    return (
        b"e000" in shape
        or b"e+000" in shape
        or _LONG_DIGITS in shape
        or _MINUS_ZERO.search(shape) is not None
    )


def _out_of_range(text: str, what: str) -> ProbeFailed:
    # The number itself is not quoted: response text stays out of messages.
    return _fail(
        "number_range",
        f"{what} has a number ({len(text)} characters) outside the float64 range"
        " (Kiln's JSON parser refuses it in any field)",
    )


def number_hooks(
    parse_float: Callable[[str], object] | None, what: str
) -> tuple[Callable[[str], object], Callable[[str], object]]:
    """(parse_float, parse_int) for ``json.loads`` that read numbers as serde_json does.

    ``-0`` becomes ``-0.0``; a float that overflows to infinity, or an integer
    too large for a float64, is refused.  ``parse_float`` (default ``float``)
    still decides what a float literal becomes.
    """
    inner = parse_float or float

    def floats(text: str) -> object:
        value = inner(text)
        if isinstance(value, float) and math.isinf(value):
            raise _out_of_range(text, what)
        return value

    def ints(text: str) -> object:
        if text == "-0":
            return -0.0
        value = int(text)
        if len(text) > 300:
            try:
                float(value)
            except OverflowError:
                raise _out_of_range(text, what) from None
        return value

    return floats, ints
