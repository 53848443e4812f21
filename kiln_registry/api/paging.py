"""Opaque list cursors (issue 15, attack 7: bounded list answers).

Every list route answers one page (``limit``) and, when more follow, a
``next_cursor`` to pass back as ``cursor``.  A cursor is the URL-safe base64
of a small JSON document naming the last item of the previous page; callers
must treat it as opaque.  ``encode_cursor``/``decode_cursor`` carry the alias
of ``GET /v1/teachers``; ``encode_key``/``decode_key`` carry the sort key of
the other lists (receipts, jobs, audit events), tagged with the list's name
so a cursor of one list is refused by another.

Decoding is strict and bounded before any JSON parser runs (issue 27, item
11: a cursor of 1,530 ``[`` was a RecursionError and a 500): at most
``MAX_CURSOR_CHARS`` characters of the URL-safe base64 alphabet, a JSON
object nested at most ``MAX_CURSOR_DEPTH`` deep (scanned first, strings
skipped), holding exactly the keys this module writes.  Any other cursor is
``400 invalid_request`` (rule ``page.cursor``).

Imports the standard library and ``kiln_registry.domain.errors`` only.
"""

from __future__ import annotations

import base64
import binascii
import json

from kiln_registry.domain.errors import KilnError

DEFAULT_PAGE = 1000
MAX_PAGE = 1000
MAX_CURSOR_CHARS = 2048
MAX_CURSOR_DEPTH = 2  # {"list": ..., "after": [...]}
_B64_ALPHABET = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


MAX_KEY_INT = 2**62
MAX_KEY_CHARS = 512
KeyPart = str | int


def _bad_cursor() -> KilnError:
    return KilnError(
        "cursor is not one this registry issued",
        rule="page.cursor",
        code="invalid_request",
        status=400,
        hint="pass next_cursor from the previous page unchanged, or omit cursor",
    )


def _b64(doc: object) -> str:
    raw = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def encode_key(list_name: str, *key: KeyPart) -> str:
    """The cursor after the item whose sort key is ``key`` in the list ``list_name``."""
    return _b64({"list": list_name, "after": list(key)})


def _key_part(value: object, kind: type) -> KeyPart | None:
    if kind is int and type(value) is int and 0 <= value <= MAX_KEY_INT:
        return value
    if kind is str and isinstance(value, str) and len(value) <= MAX_KEY_CHARS:
        try:
            value.encode("utf-8")  # a lone surrogate never reaches the database
        except UnicodeEncodeError:
            return None
        return value
    return None


def decode_key(cursor: str, list_name: str, kinds: tuple[type, ...]) -> tuple[KeyPart, ...]:
    """The sort key ``encode_key(list_name, ...)`` put in ``cursor``, typed as ``kinds``."""
    doc = _cursor_document(cursor, {"list", "after"})
    after = doc.get("after") if doc.get("list") == list_name else None
    if not isinstance(after, list) or len(after) != len(kinds):
        raise _bad_cursor()
    parts = tuple(_key_part(v, k) for v, k in zip(after, kinds, strict=True))
    if any(p is None for p in parts):
        raise _bad_cursor()
    return tuple(p for p in parts if p is not None)


def encode_cursor(after: str) -> str:
    raw = json.dumps({"after": after}, separators=(",", ":")).encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(cursor: str) -> str:
    """The alias ``encode_cursor`` put in ``cursor``."""
    after = _cursor_document(cursor, {"after"}).get("after")
    if not isinstance(after, str) or _key_part(after, str) is None:
        raise _bad_cursor()
    return after


def _nesting_depth(raw: bytes) -> int:
    """How deep ``raw``'s brackets nest, outside strings (one bounded pass, no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif byte in b"]}":
            depth -= 1
    return deepest


def _cursor_document(cursor: str, keys: set[str]) -> dict[str, object]:
    """The JSON object in ``cursor``, with exactly ``keys``; any other cursor is refused."""
    if not 0 < len(cursor) <= MAX_CURSOR_CHARS or len(cursor) % 4 == 1:
        raise _bad_cursor()
    if not cursor.isascii() or not _B64_ALPHABET.issuperset(cursor.encode("ascii")):
        raise _bad_cursor()
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except (binascii.Error, ValueError):
        raise _bad_cursor() from None
    if raw[:1] != b"{" or _nesting_depth(raw) > MAX_CURSOR_DEPTH:
        raise _bad_cursor()
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # RecursionError cannot happen past the depth scan
        raise _bad_cursor() from None
    if not isinstance(doc, dict) or set(doc) != keys:
        raise _bad_cursor()
    return doc
