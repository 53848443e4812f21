"""Reading the small JSON files of a model directory, safely.

Owns ``read_small_file`` (a regular, non-symlink file whose size is checked
against a bound before any byte is read, counted through the shared
``ReadRateLimiter``) and ``read_json_object`` (the same, parsed as a strict
JSON object).  Weight files are never read here: they are streamed by
``kiln_registry.identity.hashing``.

Imports: standard library and ``kiln_registry.identity`` / ``kiln_registry.domain.errors``;
never torch or transformers.
"""

from __future__ import annotations

import os

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity.canonical import strict_json_loads
from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.identity.strict_read import FileProblem, Problem, read_regular_file

MAX_CONFIG_BYTES = 64 * 1024 * 1024


def read_small_file(
    path: str | os.PathLike[str],
    *,
    max_bytes: int,
    rule: str,
    limiter: ReadRateLimiter | None = None,
) -> bytes:
    """All bytes of a regular file of at most ``max_bytes`` (checked before reading)."""
    text = os.fspath(path)

    def refuse(problem: FileProblem) -> IdentityError:
        kind = problem.kind
        if kind is Problem.MISSING:
            return IdentityError(f"{text} does not exist", rule=f"{rule}.missing")
        if kind is Problem.SYMLINK:
            return IdentityError(f"{text} is a symbolic link", rule=f"{rule}.symlink")
        if kind is Problem.NOT_REGULAR:
            return IdentityError(f"{text} is not a regular file", rule=f"{rule}.not_regular")
        if kind is Problem.GREW:
            return _changed(text, rule)
        verb = "open" if kind is Problem.OPEN else "read"
        return IdentityError(f"cannot {verb} {text}: {problem.detail}", rule=f"{rule}.unreadable")

    def check(info: os.stat_result) -> None:
        if info.st_size > max_bytes:  # before the limiter counts the bytes
            raise IdentityError(
                f"{text} is {info.st_size} bytes, over the limit of {max_bytes}",
                rule=f"{rule}.too_large",
            )
        if limiter is not None:
            limiter.acquire(info.st_size)

    data, info = read_regular_file(text, limit=max_bytes, refuse=refuse, check=check)
    if len(data) != info.st_size:
        raise _changed(text, rule)
    return data


def _changed(text: str, rule: str) -> IdentityError:
    return IdentityError(f"{text} changed size while it was read", rule=f"{rule}.changed")


def read_json_object(
    path: str | os.PathLike[str],
    *,
    rule: str,
    max_bytes: int = MAX_CONFIG_BYTES,
    limiter: ReadRateLimiter | None = None,
) -> tuple[bytes, dict[str, object]]:
    """Raw bytes and the strict-JSON object they hold."""
    text = os.fspath(path)
    data = read_small_file(text, max_bytes=max_bytes, rule=rule, limiter=limiter)
    value = strict_json_loads(data, what=text, max_bytes=max_bytes)
    if not isinstance(value, dict):
        raise IdentityError(f"{text} must hold a JSON object", rule=f"{rule}.not_object")
    return data, value
