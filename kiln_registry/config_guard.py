"""The ``[server]`` and ``[jobs]`` keys that confine what callers can do (issue 15).

``ServerGuardKeys`` is mixed into ``ServerConfig``; ``JobsGuardKeys`` into
``JobsConfig``.  The ``[server]`` keys:

* ``allowed_hosts``: the ``Host`` header values served (a name or address,
  with or without a port; ``*`` serves any).  Unset: the bound address,
  ``localhost`` and the loopback names (``api.host_guard``).
* ``cors_origins``: exact ``scheme://host[:port]`` origins that get CORS
  headers; empty (the default) sends none.
* ``teacher_hosts``: host patterns a teacher URL may name (``*.example.org``
  matches sub-domains, ``*`` any); unset allows any host.
* ``max_teachers``: the most aliases the registry holds (default 10000).

Imports pydantic and the standard library only.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt

_FROZEN = ConfigDict(extra="forbid", frozen=True)
MAX_PATTERNS = 256
_HOST_PATTERN = re.compile(
    r"(\*|(\*\.)?[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?|\[[0-9a-f:.]+\])(:\d{1,5})?"
)
_ORIGIN = re.compile(r"https?://([a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?|\[[0-9a-f:.]+\])(:\d{1,5})?")


def _check_host_pattern(value: str) -> str:
    if not _HOST_PATTERN.fullmatch(value) or ".." in value:
        raise ValueError(
            f"{value[:80]!r} is not a host pattern: use a lowercase name or address, optionally"
            " with :port, '*.' for sub-domains, or '*' for any (IPv6 in brackets)"
        )
    return value


def _check_origin(value: str) -> str:
    if not _ORIGIN.fullmatch(value):
        raise ValueError(
            f"{value[:80]!r} is not an origin: use scheme://host[:port] in lowercase, no path"
        )
    return value


HostPattern = Annotated[str, AfterValidator(_check_host_pattern)]
Origin = Annotated[str, AfterValidator(_check_origin)]


class ServerGuardKeys(BaseModel):
    model_config = _FROZEN

    allowed_hosts: Annotated[tuple[HostPattern, ...], Field(max_length=MAX_PATTERNS)] | None = None
    cors_origins: Annotated[tuple[Origin, ...], Field(max_length=MAX_PATTERNS)] = ()
    teacher_hosts: Annotated[tuple[HostPattern, ...], Field(max_length=MAX_PATTERNS)] | None = None
    max_teachers: Annotated[StrictInt, Field(ge=1, le=1_000_000)] = 10_000


class JobsGuardKeys(BaseModel):
    """``[jobs]`` keys of issue 15 (none yet: retention is not implemented)."""

    model_config = _FROZEN
