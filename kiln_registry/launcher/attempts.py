"""The startup-attempts log of a supervised launch.

``AttemptsLog``: one JSON line per startup attempt (time, pid, redacted
argv, outcome, and the launch's phase timings when given), appended with a
single ``write`` to a 0600 file opened with ``O_APPEND | O_NOFOLLOW``,
rotated once to ``<name>.1`` past 1 MiB.
Re-exported by ``launcher.supervisor``.

Imports: standard library and ``kiln_registry.domain.errors`` only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from kiln_registry.domain.errors import LauncherError

MAX_ATTEMPT_LINE_BYTES = 64 * 1024
# Past this size the log is renamed to ``<name>.1`` (replacing an older one)
# before the next line, so a cache root holds at most about twice this much.
MAX_ATTEMPTS_LOG_BYTES = 1024 * 1024


class AttemptsLog:
    """Append-only JSON lines, one per startup attempt outcome, rotated once at 1 MiB."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _open(self) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            return os.open(self.path, flags, 0o600)
        except OSError as exc:
            raise LauncherError(
                f"cannot open the attempts log {self.path}: {exc.strerror}",
                rule="supervisor.attempts_log",
            ) from None

    def _open_bounded(self) -> int:
        fd = self._open()
        if os.fstat(fd).st_size < MAX_ATTEMPTS_LOG_BYTES:
            return fd
        os.close(fd)
        try:
            os.rename(self.path, f"{self.path}.1")
        except FileNotFoundError:
            pass  # another launcher sharing the cache root rotated it first
        except OSError as exc:
            raise LauncherError(
                f"cannot rotate the attempts log {self.path}: {exc.strerror}",
                rule="supervisor.attempts_log",
            ) from None
        return self._open()

    def record(
        self,
        *,
        pid: int | None,
        argv: Sequence[str],
        outcome: str,
        timings: Mapping[str, object] | None = None,
    ) -> None:
        """Append one line; ``timings`` is the launch's phase document (``launcher.phases``)."""
        entry: dict[str, object] = {
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "pid": pid,
            "argv": list(argv),
            "outcome": outcome,
        }
        if timings is not None:
            entry["timings"] = dict(timings)
        line = (json.dumps(entry, ensure_ascii=True, separators=(",", ":")) + "\n").encode()
        if len(line) > MAX_ATTEMPT_LINE_BYTES:
            entry["argv"] = ["<argv too long to log>"]
            line = (json.dumps(entry, separators=(",", ":")) + "\n").encode()
        fd = self._open_bounded()
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
