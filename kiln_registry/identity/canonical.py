"""Canonical JSON bytes and a strict, bounded JSON reader.

Owns the two JSON primitives every identity layout is built on:

* ``canonical_json``: compact separators, raw UTF-8 (no ``\\uXXXX`` for
  non-ASCII), ``/`` not escaped, NaN and Infinity refused, the caller's key
  order kept.  This is the byte form of docs/identity.md sections 1, 5, 7.
* ``strict_json_loads``: the reader for untrusted JSON.  It refuses input over
  a byte limit (checked before decoding), invalid UTF-8, duplicate keys,
  NaN/Infinity literals, numbers that overflow to infinity, lone surrogate
  escapes, over-deep nesting and trailing data.

Every refusal is an ``IdentityError`` whose ``rule`` is ``json.<name>`` and
whose message names ``what`` was being read.  Imports: standard library,
``kiln_registry.domain`` (errors, text) and ``identity.strict_read`` (the duplicate-key hook)
only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

from kiln_registry.domain.errors import IdentityError
from kiln_registry.domain.text import quoted
from kiln_registry.identity.strict_read import DuplicateKeyError, unique_object

JSON_RULES: tuple[str, ...] = (
    "json.too_large",
    "json.utf8",
    "json.syntax",
    "json.trailing_data",
    "json.duplicate_key",
    "json.non_finite",
    "json.number_too_large",
    "json.surrogate",
    "json.depth",
)


def canonical_json(value: object) -> bytes:
    """Compact, raw-UTF-8 JSON of ``value`` with dict insertion order kept."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError as exc:
        raise IdentityError(
            f"value is not representable as canonical JSON: {exc}", rule="json.non_finite"
        ) from None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise IdentityError(
            "value contains a lone surrogate, which is not valid UTF-8", rule="json.surrogate"
        ) from None


def _refuse_nan_literal(name: str) -> object:
    raise _Refusal("json.non_finite", f"the non-finite literal {name} is not JSON")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise _Refusal("json.non_finite", f"the number {quoted(text, 40)} overflows to infinity")
    return number


class _Refusal(Exception):
    """Raised inside decoder hooks; converted to IdentityError at the boundary."""

    def __init__(self, rule: str, detail: str) -> None:
        super().__init__(detail)
        self.rule = rule
        self.detail = detail


_DECODER = json.JSONDecoder(
    object_pairs_hook=unique_object,
    parse_constant=_refuse_nan_literal,
    parse_float=_finite_float,
)


def _strings(value: object) -> Iterator[str]:
    """Every string (keys included) in an already-decoded, size-bounded value."""
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for key, child in item.items():
                yield key
                stack.append(child)
        elif isinstance(item, list):
            stack.extend(item)


def _refuse_surrogates(value: object, what: str) -> None:
    for text in _strings(value):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise IdentityError(
                f"{what}: a string holds a lone surrogate escape, which is not valid UTF-8",
                rule="json.surrogate",
            ) from None


def _text_of(data: bytes | str, what: str, max_bytes: int) -> str:
    if isinstance(data, str):
        # A character is at least one UTF-8 byte: refuse before encoding a huge string.
        size = len(data) if len(data) > max_bytes else len(data.encode("utf-8", "surrogatepass"))
    else:
        size = len(data)
    if size > max_bytes:
        raise IdentityError(
            f"{what} is {size} bytes, over the limit of {max_bytes}", rule="json.too_large"
        )
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise IdentityError(
            f"{what} is not valid UTF-8 (byte {exc.start})", rule="json.utf8"
        ) from None


def strict_json_loads(data: bytes | str, *, what: str, max_bytes: int) -> object:
    """Decode untrusted JSON, refusing everything outside strict RFC 8259 JSON."""
    text = _text_of(data, what, max_bytes)
    try:
        value = _DECODER.decode(text)
    except _Refusal as exc:
        raise IdentityError(f"{what}: {exc.detail}", rule=exc.rule) from None
    except DuplicateKeyError as exc:
        raise IdentityError(
            f"{what}: duplicate key {quoted(exc.key, 80)}", rule="json.duplicate_key"
        ) from None
    except json.JSONDecodeError as exc:
        rule = "json.trailing_data" if exc.msg == "Extra data" else "json.syntax"
        raise IdentityError(
            f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            rule=rule,
        ) from None
    except RecursionError:
        raise IdentityError(f"{what} nests too deeply", rule="json.depth") from None
    except ValueError as exc:
        # CPython refuses integers of more than sys.get_int_max_str_digits() digits.
        raise IdentityError(
            f"{what} holds a number too large to read: {str(exc)[:80]}",
            rule="json.number_too_large",
        ) from None
    if "\\u" in text:
        _refuse_surrogates(value, what)
    return value
