"""Request ids: accepted from ``X-Request-ID`` when well-formed, else generated.

An accepted id is 1..``MAX_LENGTH`` characters of ``[A-Za-z0-9._:-]`` and
never token-shaped (nothing containing ``kiln_``: a caller that pastes its
bearer token there must not get it written to the log).  Anything else,
including a second ``X-Request-ID`` header, is replaced by a generated id:
a random per-process prefix and a counter (unique, and cheap enough for the
cached-lookup path).  ``current_request_id`` is the id of the request the
running task serves (a ``ContextVar`` set by ``observability.access``), so
every log line written while serving a request carries it.

Imports the standard library only.
"""

from __future__ import annotations

import itertools
import re
import secrets
from collections.abc import Iterable
from contextvars import ContextVar
from typing import Final

HEADER: Final = b"x-request-id"
MAX_LENGTH: Final = 128
WELL_FORMED: Final = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
TOKEN_MARK: Final = b"kiln_"

current_request_id: ContextVar[str | None] = ContextVar("kiln_request_id", default=None)


class RequestIds:
    """Generates ids ``<12 hex>-<counter hex>``; one instance per application."""

    def __init__(self) -> None:
        self._prefix = secrets.token_hex(6) + "-"
        self._counter = itertools.count(1)

    def new(self) -> str:
        return f"{self._prefix}{next(self._counter):x}"

    def for_headers(self, headers: Iterable[tuple[bytes, bytes]]) -> str:
        """The caller's well-formed ``X-Request-ID``, else a new id."""
        found: bytes | None = None
        for key, value in headers:
            if key == HEADER:
                if found is not None:
                    return self.new()  # two ids: trust neither
                found = value
        if found is None or not accepted(found):
            return self.new()
        return found.decode("ascii")


def accepted(value: bytes) -> bool:
    """Whether a caller's ``X-Request-ID`` value may be used (and logged) as it is."""
    return (
        len(value) <= MAX_LENGTH
        and WELL_FORMED.fullmatch(value) is not None
        and TOKEN_MARK not in value.lower()
    )
