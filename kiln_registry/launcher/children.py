"""Helper children of a launch that run while the launcher does other work.

Owns ``HelperChild``: a child started like vLLM (the given interpreter, no
shell, ``cwd="/"``, the exact child environment, stderr inherited so its
one-line error reaches the operator) whose stdout is read in bounded JSON
lines (``read_line``) or whole (``finish``), with a deadline, and which is
killed and reaped by ``close()`` whatever happened (a failure elsewhere in
the launch, a signal).  The identity probe (``launcher.identity_probe``) and
the pre-spawn recheck (``launcher.teacher_input``) run as helper children,
so they overlap staging and the runtime digest.

Imports: standard library, ``kiln_registry.domain.errors``.
"""

from __future__ import annotations

import os
import select
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

from kiln_registry.domain.errors import LauncherError

MAX_OUTPUT_BYTES = 64 * 1024
READ_BYTES = 16 * 1024
POLL_SECONDS = 0.25
Interrupted = Callable[[], bool]


class ChildWaitInterrupted(Exception):
    """``interrupted()`` became true while waiting (a signal arrived); the child still runs."""


class HelperChild:
    """One running helper; at most ``MAX_OUTPUT_BYTES`` of stdout are ever read."""

    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str], *, what: str, stdin: bool = False
    ) -> None:
        self.what = what
        self.started = time.monotonic()
        self._buffer = b""
        self._taken = 0
        try:
            self.proc = subprocess.Popen(
                list(argv),
                cwd="/",
                env=dict(env),
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                bufsize=0,
            )
        except OSError as exc:
            raise LauncherError(
                f"cannot start the {what}: {exc.strerror}", rule="launcher.child"
            ) from None

    def _fill(self, deadline: float | None, interrupted: Interrupted | None = None) -> bool:
        """Read what is available into the buffer; False at end of output."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise LauncherError(f"the {self.what} timed out", rule="launcher.child")
            if interrupted is not None:
                if interrupted():
                    raise ChildWaitInterrupted
                left = POLL_SECONDS if left is None else min(left, POLL_SECONDS)
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                break
        chunk = os.read(fd, READ_BYTES)
        self._taken += len(chunk)
        if self._taken > MAX_OUTPUT_BYTES:
            raise LauncherError(
                f"the {self.what} printed more than {MAX_OUTPUT_BYTES} bytes",
                rule="launcher.child",
            )
        self._buffer += chunk
        return bool(chunk)

    def read_line(self, deadline: float | None = None) -> bytes:
        """The next line of output (with its newline); a failed child raises."""
        while b"\n" not in self._buffer:
            if not self._fill(deadline):
                self._failed()
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line + b"\n"

    def send(self, data: bytes) -> None:
        """Write ``data`` to the child's stdin and close it."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.close()
        except OSError:
            self._failed()  # it exited before reading: its status says why

    def finish(
        self, deadline: float | None = None, interrupted: Interrupted | None = None
    ) -> bytes:
        """All remaining output once the child exits with status 0.

        ``interrupted`` is polled every ``POLL_SECONDS``; when it returns true,
        ``ChildWaitInterrupted`` is raised and the child keeps running.
        """
        while self._fill(deadline, interrupted):
            pass
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            status = self.proc.wait(left)
        except subprocess.TimeoutExpired:
            raise LauncherError(f"the {self.what} timed out", rule="launcher.child") from None
        if status != 0:
            self._failed()
        data, self._buffer = self._buffer, b""
        return data

    def _failed(self) -> None:
        try:
            status: int | None = self.proc.wait(5)
        except subprocess.TimeoutExpired:
            status = None
        raise LauncherError(
            f"the {self.what} failed (exit status {status}); its error is printed above",
            rule="launcher.child",
        )

    def close(self) -> None:
        """Kill (if still running) and reap the child; close its pipes (idempotent)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
