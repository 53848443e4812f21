"""Shared hypothesis strategies, mutators and the case tally of the fuzz suite.

Owns what every fuzz target needs: the settings a target runs under (the
profile ``tests/reliability/conftest.py`` selects), ``attempt`` (call a
target, demand that any refusal is a ``KilnError`` of the expected class with
a dotted rule, and count the case), byte and text mutators, ``to_toml`` (a
small TOML writer) and ``spell``: a JSON writer whose key order, white space,
string escapes and number forms are drawn, so one JSON value can be
re-spelled without changing its meaning.

Imports: standard library, hypothesis and ``kiln_registry.domain.errors`` only; no
product module beyond the error tree, so every target file stays independent.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hypothesis import currently_in_test_context, event, settings
from hypothesis import strategies as st

from kiln_registry.domain.errors import KilnError

T = TypeVar("T")

# Registered by tests/reliability/conftest.py from KILN_FUZZ_PROFILE at collection time.
ACTIVE_PROFILE = "kiln-fuzz"
RULE_PATTERN = re.compile(r"[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)+")


def fuzz_settings(scale: float = 1.0) -> settings:
    """The active profile with its example count scaled for one target."""
    base = settings.get_profile(ACTIVE_PROFILE)
    return settings(base, max_examples=max(1, round(base.max_examples * scale)))


@dataclass
class Tally:
    """Cases run against one target and how each ended."""

    cases: int = 0
    accepted: int = 0
    refused: Counter[str] = field(default_factory=Counter)


TALLIES: dict[str, Tally] = {}


def record(target: str, rule: str | None) -> None:
    tally = TALLIES.setdefault(target, Tally())
    tally.cases += 1
    if rule is None:
        tally.accepted += 1
    else:
        tally.refused[rule] += 1
    if currently_in_test_context():  # parametrized seed cases run outside hypothesis
        event(f"{target}: {rule or 'accepted'}")


def attempt(
    target: str,
    call: Callable[[], T],
    *,
    refusal: type[KilnError] | tuple[type[KilnError], ...],
    prefixes: tuple[str, ...],
) -> T | KilnError:
    """``call()``'s value, or the refusal it raised; any other exception propagates.

    A refusal must be an instance of ``refusal`` whose ``rule`` is a dotted name
    starting with one of ``prefixes``.
    """
    try:
        value = call()
    except KilnError as exc:
        assert isinstance(exc, refusal), f"{type(exc).__name__} is not {refusal}: {exc}"
        rule = exc.rule or ""
        assert RULE_PATTERN.fullmatch(rule), f"refusal without a dotted rule: {exc!r}"
        assert rule.startswith(prefixes), f"rule {rule!r} outside {prefixes}: {exc}"
        record(target, rule)
        return exc
    record(target, None)
    return value


# --- byte and text mutators -------------------------------------------------------------

BYTE_MUTATIONS = ("flip", "set", "delete", "insert", "truncate", "duplicate", "swap")


@st.composite
def mutated_bytes(draw: st.DrawFn, data: bytes, *, max_steps: int = 3) -> bytes:
    """``data`` after one to ``max_steps`` random byte edits (may equal ``data``)."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, max_steps))):
        kind = draw(st.sampled_from(BYTE_MUTATIONS))
        at = draw(st.integers(0, len(out)))
        end = draw(st.integers(at, min(len(out), at + 64)))
        if kind == "flip" and at < len(out):
            out[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and at < len(out):
            out[at] = draw(st.integers(0, 255))
        elif kind == "delete":
            del out[at:end]
        elif kind == "insert":
            out[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "truncate":
            del out[at:]
        elif kind == "duplicate":
            out[end:end] = out[at:end]
        elif kind == "swap" and end - at >= 2:
            out[at], out[end - 1] = out[end - 1], out[at]
    return bytes(out)


# Characters that matter to the parsers under test: separators, quotes, escapes, digits,
# white space, padding, and non-ASCII (multi-byte UTF-8, including astral and U+2028).
INTERESTING_CHARS = '.=-_/\\"{}[]:,0123456789aAfFzZ \t\n\r\x00\x7f\x85é€\u2028\U0001f600'


@st.composite
def mutated_text(draw: st.DrawFn, text: str, *, max_steps: int = 3) -> str:
    """``text`` after one to ``max_steps`` character edits (may equal ``text``)."""
    chars = st.sampled_from(INTERESTING_CHARS) | st.characters(codec="utf-8")
    out = list(text)
    for _ in range(draw(st.integers(1, max_steps))):
        kind = draw(st.sampled_from(("set", "delete", "insert", "truncate", "case", "swap")))
        at = draw(st.integers(0, len(out)))
        end = draw(st.integers(at, min(len(out), at + 64)))
        if kind == "set" and at < len(out):
            out[at] = draw(chars)
        elif kind == "delete":
            del out[at:end]
        elif kind == "insert":
            out[at:at] = draw(st.lists(chars, min_size=1, max_size=8))
        elif kind == "truncate":
            del out[at:]
        elif kind == "case":
            out[at:end] = list("".join(out[at:end]).swapcase())
        elif kind == "swap" and end - at >= 2:
            out[at], out[end - 1] = out[end - 1], out[at]
    return "".join(out)


# --- JSON re-spelling -------------------------------------------------------------------

_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n"}
_SHORT_ESCAPES.update({"\r": "\\r", "\t": "\\t"})


@dataclass(frozen=True)
class Spelling:
    """How ``spell`` writes JSON; every choice keeps the decoded value the same."""

    indent: str | None = None  # None: one line
    key_sep: str = ":"
    item_sep: str = ","
    escaped_ascii: frozenset[str] = frozenset()  # written as \\u00XX
    escape_non_ascii: bool = False
    slash: str = "/"  # "/", "\\/" or "\\u002f"
    shuffle_seed: int | None = None  # permute object keys (where allowed)
    float_suffix: str = ""  # "", "0" (a trailing zero) or "e0"


COMPACT = Spelling()
_ASCII_PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F))


def spellings() -> st.SearchStrategy[Spelling]:
    return st.builds(
        Spelling,
        indent=st.sampled_from((None, "", " ", "  ", "\t", "\r\n")),
        key_sep=st.sampled_from((":", ": ", " :", "\t:\n")),
        item_sep=st.sampled_from((",", ", ", " ,\n")),
        escaped_ascii=st.frozensets(st.sampled_from(_ASCII_PRINTABLE), max_size=8),
        escape_non_ascii=st.booleans(),
        slash=st.sampled_from(("/", "\\/", "\\u002f", "\\u002F")),
        shuffle_seed=st.none() | st.integers(0, 2**32 - 1),
        float_suffix=st.sampled_from(("", "0", "e0", "E+0")),
    )


def _string(text: str, style: Spelling) -> str:
    out = ['"']
    for ch in text:
        if ch in style.escaped_ascii:
            out.append(f"\\u{ord(ch):04x}")
        elif ch in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[ch])
        elif ch == "/":
            out.append(style.slash)
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        elif ord(ch) > 0x7E and style.escape_non_ascii:
            out.append(json.dumps(ch)[1:-1])  # \\uXXXX, surrogate pairs for astral
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _float(value: float, style: Spelling) -> str:
    text = json.dumps(value, allow_nan=False)
    if style.float_suffix == "0" and "e" not in text and "E" not in text:
        return text + "0"
    if style.float_suffix and style.float_suffix != "0" and "e" not in text:
        return text + style.float_suffix
    return text


def spell(
    value: object,
    style: Spelling = COMPACT,
    *,
    keep_order: Callable[[dict[str, object]], bool] = lambda _: False,
    depth: int = 0,
) -> str:
    """``value`` as JSON text in ``style``; objects where ``keep_order`` is true keep theirs."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float(value, style)
    if isinstance(value, str):
        return _string(value, style)
    inner = None if style.indent is None else "\n" + style.indent * (depth + 1)
    outer = None if style.indent is None else "\n" + style.indent * depth
    if isinstance(value, list):
        items = [spell(v, style, keep_order=keep_order, depth=depth + 1) for v in value]
        return _join("[", "]", items, style, inner, outer)
    assert isinstance(value, dict), type(value)
    keys = list(value)
    if style.shuffle_seed is not None and not keep_order(value):
        random.Random(style.shuffle_seed + depth).shuffle(keys)
    items = [
        _string(k, style)
        + style.key_sep
        + spell(value[k], style, keep_order=keep_order, depth=depth + 1)
        for k in keys
    ]
    return _join("{", "}", items, style, inner, outer)


def _join(
    open_: str, close: str, items: list[str], style: Spelling, inner: str | None, outer: str | None
) -> str:
    if not items:
        return open_ + close
    if inner is None or outer is None:
        return open_ + style.item_sep.join(items) + close
    return open_ + inner + (style.item_sep.rstrip() + inner).join(items) + outer + close


# --- TOML writing ---------------------------------------------------------------------


def toml_string(text: str) -> str:
    out = json.dumps(text, ensure_ascii=False)
    return out.replace("\x7f", "\\u007f")  # TOML requires DEL escaped; JSON does not


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    assert isinstance(value, dict), type(value)
    return "{" + ", ".join(f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def _tables(prefix: list[str], table: dict[str, Any]) -> Iterator[str]:
    """Plain keys first, then each sub-table; keys starting with ``x-`` stay inline."""
    plain = {k: v for k, v in table.items() if not isinstance(v, dict) or k.startswith("x-")}
    if prefix:
        yield "[" + ".".join(toml_string(p) for p in prefix) + "]"
    yield from (f"{toml_string(k)} = {toml_value(v)}" for k, v in plain.items())
    for key, value in table.items():
        if key not in plain:
            yield from _tables([*prefix, key], value)


def to_toml(data: dict[str, Any]) -> str:
    """``data`` as a TOML document (every key quoted; no null, so absent keys are left out)."""
    return "\n".join(_tables([], data)) + "\n"


# --- generic JSON values ----------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
