"""Opaque list cursors (issue 15, attack 7: bounded list answers).

A cursor is the URL-safe base64 of a small JSON document naming the last
item of the previous page; callers must treat it as opaque.  A cursor that
does not decode is ``400 invalid_request`` (rule ``page.cursor``).

Imports the standard library and ``kiln_registry.errors`` only.
"""

from __future__ import annotations

import base64
import binascii
import json

from kiln_registry.errors import KilnError

DEFAULT_PAGE = 1000
MAX_PAGE = 1000
MAX_CURSOR_CHARS = 2048


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
        raise KilnError(
            "cursor is not one this registry issued",
            rule="page.cursor",
            code="invalid_request",
            status=400,
            hint="pass next_cursor from the previous page unchanged, or omit cursor",
        )
    return after
