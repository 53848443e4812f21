"""Spawn and supervise one server process group (Linux), for any argv.

Owns process-group ownership, signal forwarding, draining, readiness and the
startup-attempts log.  It knows nothing about vLLM or identities: the caller
supplies the argv, the exact child environment and a redacted argv for logs.

* Spawn: no shell, ``cwd="/"``, stdin from ``/dev/null``, the environment
  exactly as given, all other descriptors closed.
* ``detached`` mode: the child gets its own session (``start_new_session``),
  so its process group id is its pid and the whole group is signalled with
  ``killpg``.
* ``inherited`` mode (Linux only): accepted only when the caller already
  leads an *isolated* process group: ``getpgrp() == getpid()`` and no other
  live process belongs to that group when the check runs (a benchmark driver
  creates the group with ``setpgid(0, 0)`` and execs the launcher; a shell
  pipeline, whose members share one group, is refused).  The child stays in
  that group and the supervisor signals each *peer* (every other group
  member, found in ``/proc``) and never itself.
* Drain: the first signal (the forwarded one, or SIGTERM) goes to the group,
  then after ``grace`` seconds SIGKILL; the direct child is reaped.  Zombies
  count as gone (their parent or init reaps them).  A descendant that leaves
  the group with ``setsid`` escapes a group signal; that is a documented
  limit of process-group supervision.
* Readiness: ``GET /health`` over plain HTTP (no proxy, ever; see
  ``launcher.readiness``) until 200, the child exits, or the deadline passes.
* ``AttemptsLog``: one JSON line per startup attempt (time, pid, redacted
  argv, outcome), appended with a single ``write`` to a 0600 file opened
  with ``O_APPEND | O_NOFOLLOW``.

Imports: standard library and ``kiln_registry.errors`` only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import FrameType

from kiln_registry.errors import LauncherError, PolicyError
from kiln_registry.launcher.readiness import (
    HEALTH_TIMEOUT_SECONDS,
    HealthTarget,
    check_port_free,
    health_ok,
)

__all__ = [
    "DETACHED",
    "HEALTH_TIMEOUT_SECONDS",
    "INHERITED",
    "AttemptsLog",
    "HealthTarget",
    "Interrupted",
    "ProcessGroup",
    "SignalGate",
    "SuperviseOptions",
    "check_inherited_group",
    "check_port_free",
    "exit_status",
    "group_members",
    "health_ok",
    "supervise",
]

FORWARDED_SIGNALS: tuple[signal.Signals, ...] = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
)
DETACHED = "detached"
INHERITED = "inherited"
POLL_SECONDS = 0.05
KILL_WAIT_SECONDS = 10.0
MAX_PROC_ENTRIES = 4_194_304  # pid_max on 64-bit Linux
MAX_ATTEMPT_LINE_BYTES = 64 * 1024
# Past this size the log is renamed to ``<name>.1`` (replacing an older one)
# before the next line, so a cache root holds at most about twice this much.
MAX_ATTEMPTS_LOG_BYTES = 1024 * 1024


def exit_status(returncode: int) -> int:
    """A shell-style exit status: the child's code, or 128+N for signal N."""
    return 128 - returncode if returncode < 0 else returncode


# -- process groups ---------------------------------------------------------


def _stat_fields(pid: int) -> tuple[str, int] | None:
    """(state, pgrp) of ``pid`` from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read(4096)
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()  # comm may hold spaces and ')'
    if len(fields) < 3:
        return None
    return fields[0].decode("ascii", "replace"), int(fields[2])


def group_members(pgid: int, *, exclude: int | None = None) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    members: list[int] = []
    with os.scandir("/proc") as entries:
        for count, entry in enumerate(entries):
            if count >= MAX_PROC_ENTRIES:
                raise LauncherError("/proc lists too many entries", rule="supervisor.proc")
            if not entry.name.isdigit() or int(entry.name) == exclude:
                continue
            found = _stat_fields(int(entry.name))
            if found is not None and found[1] == pgid and found[0] not in ("Z", "X"):
                members.append(int(entry.name))
    return members


def check_inherited_group() -> None:
    """Refuse inherited mode unless this process leads an isolated process group."""
    if not sys.platform.startswith("linux"):
        raise PolicyError(
            "--process-group-mode=inherited is Linux-only", rule="launcher.inherited_platform"
        )
    pid, pgrp = os.getpid(), os.getpgrp()
    if pgrp != pid:
        raise PolicyError(
            f"--process-group-mode=inherited needs the launcher to lead its process group "
            f"(pid {pid}, process group {pgrp})",
            rule="launcher.inherited_not_leader",
            hint="start the launcher through a driver that calls setpgid(0, 0) before exec, "
            "or use --process-group-mode=detached",
        )
    peers = group_members(pgrp, exclude=pid)
    if peers:
        raise PolicyError(
            f"--process-group-mode=inherited needs an isolated process group; "
            f"{len(peers)} other process(es) share group {pgrp}",
            rule="launcher.inherited_not_isolated",
            hint="give the launcher its own process group (not a shell pipeline)",
        )


# -- the attempts log ---------------------------------------------------------


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

    def record(self, *, pid: int | None, argv: Sequence[str], outcome: str) -> None:
        entry = {
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "pid": pid,
            "argv": list(argv),
            "outcome": outcome,
        }
        line = (json.dumps(entry, ensure_ascii=True, separators=(",", ":")) + "\n").encode()
        if len(line) > MAX_ATTEMPT_LINE_BYTES:
            entry["argv"] = ["<argv too long to log>"]
            line = (json.dumps(entry, separators=(",", ":")) + "\n").encode()
        fd = self._open_bounded()
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


# -- signals ------------------------------------------------------------------


class Interrupted(BaseException):
    """A forwarded signal arrived before the server was spawned."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


class SignalGate:
    """Catches SIGINT, SIGTERM, SIGHUP and SIGQUIT while installed (main thread only).

    Before a spawn it raises ``Interrupted`` once, so long work unwinds
    through its cleanup; after ``record_only()`` signals are queued for the
    supervisor to forward.  The first signal decides the exit status.
    """

    def __init__(self) -> None:
        self.received: list[int] = []
        self._raise = True
        self._previous: dict[int, object] = {}

    def __enter__(self) -> SignalGate:
        for sig in FORWARDED_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]

    def record_only(self) -> None:
        self._raise = False

    @property
    def first(self) -> int | None:
        return self.received[0] if self.received else None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if self._raise:
            self._raise = False
            raise Interrupted(signum)


# -- the supervised group -------------------------------------------------------


class ProcessGroup:
    """One spawned child and the process group it runs in."""

    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str], *, mode: str = DETACHED
    ) -> None:
        if mode not in (DETACHED, INHERITED):
            raise PolicyError(f"unknown process-group mode {mode!r}", rule="launcher.value")
        if mode == INHERITED:
            check_inherited_group()
        self.mode = mode
        try:
            self.popen = subprocess.Popen(
                list(argv),
                cwd="/",
                env=dict(env),
                stdin=subprocess.DEVNULL,
                close_fds=True,
                start_new_session=mode == DETACHED,
            )
        except OSError as exc:
            raise LauncherError(
                f"cannot start {os.path.basename(argv[0])}: {exc.strerror}",
                rule="supervisor.spawn",
            ) from None
        self.pid = self.popen.pid
        self.pgid = self.pid if mode == DETACHED else os.getpgrp()

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def members(self) -> list[int]:
        self.popen.poll()  # reap the direct child so it does not linger as a zombie
        return group_members(self.pgid, exclude=os.getpid())

    def send(self, signum: int) -> None:
        """Signal the group (detached) or every peer (inherited), never ourselves."""
        if self.mode == DETACHED:
            try:
                os.killpg(self.pgid, signum)
            except ProcessLookupError:
                pass
            except PermissionError as exc:
                raise LauncherError(
                    f"cannot signal process group {self.pgid}", rule="supervisor.signal"
                ) from exc
            return
        for pid in self.members():
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                continue

    def wait_empty(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while self.members():
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_SECONDS)
        return True

    def drain(self, first: int = signal.SIGTERM, *, grace: float = 10.0) -> None:
        """Signal, wait ``grace`` seconds, SIGKILL what remains, reap the child."""
        self.send(first)
        if not self.wait_empty(grace):
            self.send(signal.SIGKILL)
            if not self.wait_empty(KILL_WAIT_SECONDS):
                raise LauncherError(
                    f"processes of group {self.pgid} survived SIGKILL",
                    rule="supervisor.drain",
                )
        try:
            self.popen.wait(KILL_WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            raise LauncherError(
                f"child {self.pid} was not reaped", rule="supervisor.drain"
            ) from None

    def wait_ready(
        self, target: HealthTarget, deadline: float, gate: SignalGate | None = None
    ) -> str:
        """Poll ``/health`` until ready: 'ready', 'exited', 'signal' or 'deadline'."""
        while True:
            if gate is not None and gate.received:
                return "signal"
            if self.popen.poll() is not None:
                return "exited"
            if health_ok(target, timeout=min(HEALTH_TIMEOUT_SECONDS, _left(deadline))):
                return "ready"
            if time.monotonic() >= deadline:
                return "deadline"
            time.sleep(min(0.25, _left(deadline)))


def _left(deadline: float) -> float:
    return max(0.01, deadline - time.monotonic())


@dataclass(frozen=True, slots=True)
class SuperviseOptions:
    ready_timeout: float = 1800.0
    grace: float = 15.0


def supervise(
    group: ProcessGroup,
    gate: SignalGate,
    target: HealthTarget,
    *,
    attempts: AttemptsLog,
    redacted_argv: Sequence[str],
    options: SuperviseOptions = SuperviseOptions(),
) -> int:
    """Run the group in the foreground; return the launcher's exit status.

    128+N when signal N arrived; the child's status when it exits by itself;
    a ``LauncherError`` (status 2) when readiness misses its deadline.
    """
    gate.record_only()
    outcome = group.wait_ready(target, time.monotonic() + options.ready_timeout, gate)
    attempts.record(pid=group.pid, argv=redacted_argv, outcome=_describe(outcome, group, gate))
    if outcome == "deadline":
        group.drain(signal.SIGTERM, grace=options.grace)
        raise LauncherError(
            f"the server was not ready at {target.url}/health within "
            f"{options.ready_timeout:g} s; its process group was drained",
            rule="supervisor.ready_deadline",
        )
    if outcome == "ready":
        sys.stderr.write(f"kiln-teacher: ready at {target.url}\n")
        while gate.first is None and group.popen.poll() is None:
            time.sleep(POLL_SECONDS)
    if gate.first is not None:
        group.drain(gate.first, grace=options.grace)
        return 128 + gate.first
    status = exit_status(group.popen.wait())
    group.drain(signal.SIGTERM, grace=options.grace)  # descendants left behind by the child
    if outcome == "ready":
        attempts.record(pid=group.pid, argv=redacted_argv, outcome=f"exited:{status}")
    return status


def _describe(outcome: str, group: ProcessGroup, gate: SignalGate) -> str:
    if outcome == "exited":
        return f"exited:{exit_status(group.popen.wait())}"
    if outcome == "signal":
        return f"signal:{gate.first}"
    return outcome
