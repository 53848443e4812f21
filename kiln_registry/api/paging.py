"""Opaque list cursors (issue 15, attack 7: bounded list answers).

Every list route answers one page (``limit``) and, when more follow, a
``next_cursor`` to pass back as ``cursor``.  A cursor is the URL-safe base64
of a small JSON document naming the last item of the previous page; callers
must treat it as opaque.  ``encode_cursor``/``decode_cursor`` carry the alias
of ``GET /v1/teachers``; ``encode_key``/``decode_key`` carry the sort key of
the other lists (receipts, jobs, audit events), tagged with the list's name
so a cursor of one list is refused by another.  A cursor that does not
decode is ``400 invalid_request`` (rule ``page.cursor``).

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
    if len(cursor) > MAX_CURSOR_CHARS:
        raise _bad_cursor()
    try:
        doc = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, RecursionError):
        raise _bad_cursor() from None
    after = doc.get("after") if isinstance(doc, dict) and doc.get("list") == list_name else None
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
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        doc = json.loads(raw.decode("utf-8"))
    except (binascii.Error, ValueError):
        doc = None
    after = doc.get("after") if isinstance(doc, dict) else None
    if isinstance(after, str) and not after.isascii():
        try:
            after.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate escape: never reaches the database
            after = None
    if not isinstance(after, str) or len(cursor) > MAX_CURSOR_CHARS:
        raise _bad_cursor()
    return after
