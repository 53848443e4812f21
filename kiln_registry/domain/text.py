"""Untrusted text in messages: the one way to quote, clip and excerpt it.

A message that names a value someone else supplied (a key, a header, a
label, a response body) shows a bounded form of it, so no input can make a
message long, multi-line or terminal-unsafe:

* ``quoted(value, limit, mark)``: ``repr`` of at most ``limit`` characters
  (``mark``, e.g. ``"..."``, appended when the value was cut);
* ``shown(value)``: a name (alias, key, id) quoted to ``SHOWN_CHARS``, ``...`` when cut;
* ``clipped(text, limit, mark)``: at most ``limit`` characters in all, the
  last one ``mark`` when cut (stored status and error messages);
* ``clipped_repr(value, limit)``: ``repr`` of any value, clipped as above with ``...``;
* ``escaped_excerpt(data, limit)``: decoded bytes, control characters escaped;
* ``line_excerpt(data, limit)``: decoded bytes on one line, white space folded;
* ``render_errors``/``error_location``/``error_message``: one line per
  pydantic error (``ValidationError.errors()``), never the submitted values.

Imports the standard library only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

ELLIPSIS: Final = "…"
DOTS: Final = "..."
VALUE_ERROR_PREFIX: Final = "Value error, "
SHOWN_CHARS: Final = 64  # how much of a name (alias, key, id) a message quotes

ErrorItem = Mapping[str, Any]


def quoted(value: object, limit: int, mark: str = "") -> str:
    """``repr`` of ``str(value)`` cut to ``limit`` characters, ``mark`` appended when cut."""
    text = value if isinstance(value, str) else str(value)
    return repr(text if len(text) <= limit else text[:limit] + mark)


def shown(value: object) -> str:
    """A name in a message: ``quoted`` to ``SHOWN_CHARS`` characters, ``...`` when cut."""
    return quoted(value, SHOWN_CHARS, DOTS)


def clipped(text: str, limit: int, mark: str = ELLIPSIS) -> str:
    """``text``, or its first ``limit - len(mark)`` characters and ``mark``."""
    return text if len(text) <= limit else text[: limit - len(mark)] + mark


def clipped_repr(value: object, limit: int) -> str:
    """``repr(value)`` of at most ``limit`` characters, ``...`` at the end when cut."""
    return clipped(repr(value), limit, DOTS)


def escaped_excerpt(data: bytes, limit: int) -> str:
    """At most ``limit`` characters of untrusted bytes, control characters escaped."""
    text = data[: limit * 4].decode("utf-8", errors="replace")[:limit]
    return "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in text)


def line_excerpt(data: bytes, limit: int) -> str:
    """A short, single-line, printable excerpt of untrusted bytes."""
    text = data[: limit * 4].decode("utf-8", errors="replace")
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    return " ".join(text.split())[:limit]


def error_location(loc: Iterable[object], *, empty: str, skip: tuple[str, ...] = ()) -> str:
    """A pydantic ``loc`` as ``a.b.0``, without the parts in ``skip``; ``empty`` if none."""
    return ".".join(str(part) for part in loc if part not in skip) or empty


def error_message(error: ErrorItem) -> str:
    """A pydantic error's message; a validator's ``ValueError`` is its own text."""
    if error.get("type") == "value_error" and "error" in error.get("ctx", {}):
        return str(error["ctx"]["error"])
    return str(error.get("msg", "invalid")).removeprefix(VALUE_ERROR_PREFIX)


def render_errors(
    errors: Sequence[ErrorItem], limit: int, line: Callable[[ErrorItem], str]
) -> list[str]:
    """``line`` of each of the first ``limit`` errors, then ``... and N more``."""
    lines = [line(error) for error in list(errors)[:limit]]
    if len(errors) > limit:
        lines.append(f"... and {len(errors) - limit} more")
    return lines
