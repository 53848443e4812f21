"""Reading the small JSON files of a model directory, safely.

Owns ``read_small_file`` (a regular, non-symlink file whose size is checked
against a bound before any byte is read, counted through the shared
``ReadRateLimiter``) and ``read_json_object`` (the same, parsed as a strict
JSON object).  Weight files are never read here: they are streamed by
``kiln_registry.identity.hashing``.

Imports: standard library and ``kiln_registry.identity`` / ``kiln_registry.errors``;
never torch or transformers.
"""

from __future__ import annotations

import errno
import os
import stat

from kiln_registry.errors import IdentityError
from kiln_registry.identity.canonical import strict_json_loads
from kiln_registry.identity.hashing import ReadRateLimiter

MAX_CONFIG_BYTES = 64 * 1024 * 1024
_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_NONBLOCK", 0)
)


def _open(path: str, rule: str) -> int:
    try:
        return os.open(path, _FLAGS)
    except FileNotFoundError:
        raise IdentityError(f"{path} does not exist", rule=f"{rule}.missing") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise IdentityError(f"{path} is a symbolic link", rule=f"{rule}.symlink") from None
        raise IdentityError(
            f"cannot open {path}: {exc.strerror}", rule=f"{rule}.unreadable"
        ) from None


def read_small_file(
    path: str | os.PathLike[str],
    *,
    max_bytes: int,
    rule: str,
    limiter: ReadRateLimiter | None = None,
) -> bytes:
    """All bytes of a regular file of at most ``max_bytes`` (checked before reading)."""
    text = os.fspath(path)
    fd = _open(text, rule)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise IdentityError(f"{text} is not a regular file", rule=f"{rule}.not_regular")
        if info.st_size > max_bytes:
            raise IdentityError(
                f"{text} is {info.st_size} bytes, over the limit of {max_bytes}",
                rule=f"{rule}.too_large",
            )
        if limiter is not None:
            limiter.acquire(info.st_size)
        chunks: list[bytes] = []
        remaining = info.st_size
        while remaining:
            chunk = os.read(fd, min(remaining, 1024 * 1024))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        if remaining or os.read(fd, 1):
            raise IdentityError(f"{text} changed size while it was read", rule=f"{rule}.changed")
        return b"".join(chunks)
    except OSError as exc:
        raise IdentityError(
            f"cannot read {text}: {exc.strerror}", rule=f"{rule}.unreadable"
        ) from None
    finally:
        os.close(fd)


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
