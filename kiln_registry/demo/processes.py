"""The child processes of ``kiln demo`` and their unconditional cleanup.

Owns ``DemoRun`` (children spawned as ``python -m kiln_registry.cli.main`` in
their own session, output in files of the work directory, on Linux with
``PR_SET_PDEATHSIG`` so they get SIGTERM if the demo dies), ``Child.stop``
(SIGTERM to the process group, SIGKILL after a grace period, always reaped),
``cleaned_up`` (SIGTERM raises ``KeyboardInterrupt`` in the body; the cleanup
runs with SIGINT and SIGTERM ignored) and ``wait_for`` (poll until ready, the
child exits, or the deadline passes).

Imports: standard library and ``kiln_registry.domain.errors`` only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln_registry.domain.errors import LauncherError

STOP_GRACE_S = 10.0
LOG_TAIL_BYTES = 2000


def _set_parent_death_signal() -> None:  # pragma: no cover - runs in the forked child
    """Linux: the child gets SIGTERM when the demo process dies, even by SIGKILL."""
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


@dataclass
class Child:
    """A child process in its own session, with its output in files of the work dir."""

    name: str
    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path

    def tail(self) -> str:
        """The end of the child's stderr, for error messages (the demo has no secrets)."""
        try:
            with self.stderr.open("rb") as handle:
                handle.seek(max(0, self.stderr.stat().st_size - LOG_TAIL_BYTES))
                text = handle.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text.splitlines()[-6:] if line.strip())

    def failed(self, what: str) -> LauncherError:
        code = self.process.poll()
        state = f"exited with status {code}" if code is not None else "is still running"
        return LauncherError(
            f"{self.name} {what}; it {state}. Last log lines: {self.tail() or '(none)'}",
            rule=f"demo.{self.name.replace(' ', '_')}",
        )

    def stop(self) -> None:
        """SIGTERM to the process group, wait, SIGKILL fallback; always reaped."""
        for sig, grace in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, STOP_GRACE_S)):
            if self.process.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)  # leftovers in the group, if any
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(STOP_GRACE_S)


@dataclass
class DemoRun:
    """What one demo run started; ``close()`` undoes all of it."""

    work_dir: Path
    children: list[Child] = field(default_factory=list)

    def spawn(self, name: str, args: list[str]) -> Child:
        slug = f"{name.replace(' ', '-')}-{len(self.children) + 1}"
        stdout, stderr = self.work_dir / f"{slug}.out", self.work_dir / f"{slug}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with stdout.open("wb") as out, stderr.open("wb") as err:
            process = subprocess.Popen(
                [sys.executable, "-m", "kiln_registry.cli.main", *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                cwd=self.work_dir,
                start_new_session=True,
                preexec_fn=_set_parent_death_signal if sys.platform == "linux" else None,
            )
        child = Child(name, process, stdout, stderr)
        self.children.append(child)
        return child

    def close(self) -> None:
        for child in reversed(self.children):
            child.stop()
        shutil.rmtree(self.work_dir, ignore_errors=True)


@contextlib.contextmanager
def cleaned_up(run: DemoRun) -> Iterator[DemoRun]:
    """Run the body with SIGTERM raising KeyboardInterrupt; then ``run.close()`` with
    SIGINT and SIGTERM ignored, whatever happened, and the old handlers restored."""
    main = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _raise_interrupt) if main else None
    try:
        yield run
    finally:
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        if main:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            run.close()
        finally:
            if main:
                signal.signal(signal.SIGINT, old_int if old_int is not None else signal.SIG_DFL)
                signal.signal(signal.SIGTERM, old_term if old_term is not None else signal.SIG_DFL)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(child: Child, deadline: float, what: str, ready: Callable[[], Any]) -> Any:
    """Poll ``ready()`` until it returns a value, the child exits, or the deadline passes."""
    while True:
        value = ready()
        if value is not None:
            return value
        if child.process.poll() is not None:
            raise child.failed(f"stopped before {what}")
        if time.monotonic() > deadline:
            raise child.failed(f"did not {what} in time")
        time.sleep(0.1)
