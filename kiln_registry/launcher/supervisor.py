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
* A front (``Front``: the teacher gateway) is a second child started only
  after the server is ready, and then polled on its own address.  In
  ``inherited`` mode it shares the launcher's group; in ``detached`` mode it
  gets its own session (a process cannot join a group of another session),
  and both groups are signalled and drained together.  Either child exiting
  ends the supervision and drains both.  A drain signals the front first and
  gives it the grace period to finish the requests in flight, then signals
  the rest.
* ``AttemptsLog`` (``launcher.attempts``) and ``SignalGate``
  (``launcher.signals``) are re-exported here.

Imports: standard library and ``kiln_registry.domain.errors`` only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from kiln_registry.domain.errors import LauncherError, PolicyError
from kiln_registry.launcher.attempts import (
    MAX_ATTEMPT_LINE_BYTES,
    MAX_ATTEMPTS_LOG_BYTES,
    AttemptsLog,
)
from kiln_registry.launcher.phases import PhaseClock
from kiln_registry.launcher.readiness import (
    HEALTH_TIMEOUT_SECONDS,
    HealthTarget,
    check_port_free,
    health_ok,
)
from kiln_registry.launcher.signals import FORWARDED_SIGNALS, Interrupted, SignalGate

__all__ = [
    "DETACHED",
    "FORWARDED_SIGNALS",
    "HEALTH_TIMEOUT_SECONDS",
    "INHERITED",
    "MAX_ATTEMPTS_LOG_BYTES",
    "MAX_ATTEMPT_LINE_BYTES",
    "AttemptsLog",
    "Front",
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

DETACHED = "detached"
INHERITED = "inherited"
POLL_SECONDS = 0.05
KILL_WAIT_SECONDS = 10.0
MAX_PROC_ENTRIES = 4_194_304  # pid_max on 64-bit Linux


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
        self.front: subprocess.Popen[bytes] | None = None

    def start_front(self, front: Front) -> None:
        """Start the front in this group (once, after the server is ready)."""
        if self.front is not None:
            raise LauncherError("the front was already started", rule="supervisor.front")
        try:
            self.front = subprocess.Popen(
                list(front.argv),
                cwd="/",
                env=dict(front.env),
                stdin=subprocess.DEVNULL,
                close_fds=True,
                start_new_session=self.mode == DETACHED,
            )
        except OSError as exc:
            raise LauncherError(
                f"cannot start {os.path.basename(front.argv[0])}: {exc.strerror}",
                rule="supervisor.spawn",
            ) from None

    def exited(self) -> subprocess.Popen[bytes] | None:
        """The first child (server, then front) that has exited, if any."""
        for child in (self.popen, self.front):
            if child is not None and child.poll() is not None:
                return child
        return None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def members(self) -> list[int]:
        self.popen.poll()  # reap the direct child so it does not linger as a zombie
        return [pid for pgid in self.pgids() for pid in group_members(pgid, exclude=os.getpid())]

    def pgids(self) -> list[int]:
        """The server's group, and in detached mode the front's own session group."""
        front = self.front is not None and self.mode == DETACHED
        return [self.pgid, self.front.pid] if front and self.front else [self.pgid]

    def send(self, signum: int) -> None:
        """Signal the group (detached) or every peer (inherited), never ourselves."""
        if self.mode == DETACHED:
            for pgid in self.pgids():
                try:
                    os.killpg(pgid, signum)
                except ProcessLookupError:
                    pass
                except PermissionError as exc:
                    raise LauncherError(
                        f"cannot signal process group {pgid}", rule="supervisor.signal"
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
        """Signal (the front first), wait ``grace`` seconds, SIGKILL what remains, reap."""
        deadline = time.monotonic() + grace
        if self.front is not None and self.front.poll() is None:
            self.front.send_signal(first)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.front.wait(grace)
        self.send(first)
        if not self.wait_empty(max(1.0, deadline - time.monotonic())):
            self.send(signal.SIGKILL)
            if not self.wait_empty(KILL_WAIT_SECONDS):
                raise LauncherError(
                    f"processes of group {self.pgid} survived SIGKILL",
                    rule="supervisor.drain",
                )
        for child in (self.popen, self.front):
            if child is None:
                continue
            try:
                child.wait(KILL_WAIT_SECONDS)
            except subprocess.TimeoutExpired:
                raise LauncherError(
                    f"child {child.pid} was not reaped", rule="supervisor.drain"
                ) from None

    def wait_ready(
        self, target: HealthTarget, deadline: float, gate: SignalGate | None = None
    ) -> str:
        """Poll ``/health`` until ready: 'ready', 'exited', 'signal' or 'deadline'."""
        while True:
            if gate is not None and gate.received:
                return "signal"
            if self.exited() is not None:
                return "exited"
            if health_ok(target, timeout=min(HEALTH_TIMEOUT_SECONDS, _left(deadline))):
                return "ready"
            if time.monotonic() >= deadline:
                return "deadline"
            time.sleep(min(0.25, _left(deadline)))


def _left(deadline: float) -> float:
    return max(0.01, deadline - time.monotonic())


@dataclass(frozen=True, slots=True)
class Front:
    """A child started after the server is ready, polled at ``target`` (the gateway)."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(repr=False)
    target: HealthTarget


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
    front: Front | None = None,
    clock: PhaseClock | None = None,
    on_ready: Callable[[], None] | None = None,
    before_front: Callable[[Callable[[], bool]], bool] | None = None,
) -> int:
    """Run the group in the foreground; return the launcher's exit status.

    128+N when signal N arrived; the status of the child that exited first
    when one exits by itself; a ``LauncherError`` (status 2) when readiness
    misses its deadline.  With a ``front`` it starts once ``target`` is ready,
    and readiness then means the front's ``/health``.  ``clock`` (started
    phases of the launch) gets ``vllm_ready`` and ``gateway``; the attempts
    log line carries its document.  ``before_front`` (the deferred identity
    recheck, told how to see a signal) runs between the server's readiness and
    the front's start; a ``LauncherError`` from it drains the group and is
    raised.
    """
    gate.record_only()
    clock = clock or PhaseClock()
    started = time.monotonic()
    deadline = started + options.ready_timeout
    outcome = group.wait_ready(target, deadline, gate)
    clock.end("vllm_ready", started)
    checked = outcome != "ready" or front is None
    if not checked and not _before_front(
        before_front, group, gate, attempts, redacted_argv, clock, options
    ):
        outcome = "signal" if gate.received else "exited"
    if outcome == "ready" and front is not None:
        with clock.phase("gateway"):
            group.start_front(front)
            target = front.target
            outcome = group.wait_ready(target, deadline, gate)
    attempts.record(
        pid=group.pid,
        argv=redacted_argv,
        outcome=_describe(outcome, group, gate),
        timings=clock.document(),
    )
    if outcome == "deadline":
        group.drain(signal.SIGTERM, grace=options.grace)
        raise LauncherError(
            f"the server was not ready at {target.url}/health within "
            f"{options.ready_timeout:g} s; its process group was drained",
            rule="supervisor.ready_deadline",
        )
    if outcome == "ready":
        sys.stderr.write(f"kiln-teacher: ready at {target.url}\n")
        if on_ready is not None:
            on_ready()
        while gate.first is None and group.exited() is None:
            time.sleep(POLL_SECONDS)
    if gate.first is not None:
        group.drain(gate.first, grace=options.grace)
        return 128 + gate.first
    child = group.exited()
    status = exit_status(child.wait() if child is not None else group.popen.wait())
    group.drain(signal.SIGTERM, grace=options.grace)  # the other child and any descendants
    if outcome == "ready":
        attempts.record(pid=group.pid, argv=redacted_argv, outcome=f"exited:{status}")
    return status


def _before_front(
    check: Callable[[Callable[[], bool]], bool] | None,
    group: ProcessGroup,
    gate: SignalGate,
    attempts: AttemptsLog,
    redacted_argv: Sequence[str],
    clock: PhaseClock,
    options: SuperviseOptions,
) -> bool:
    """Run ``check`` (False: a signal arrived first); a refusal drains and raises."""
    if check is None:
        return True
    try:
        return check(lambda: bool(gate.received) or group.exited() is not None)
    except LauncherError:
        attempts.record(
            pid=group.pid, argv=redacted_argv, outcome="recheck_failed", timings=clock.document()
        )
        group.drain(signal.SIGTERM, grace=options.grace)
        raise


def _describe(outcome: str, group: ProcessGroup, gate: SignalGate) -> str:
    if outcome == "exited":
        child = group.exited() or group.popen
        return f"exited:{exit_status(child.wait())}"
    if outcome == "signal":
        return f"signal:{gate.first}"
    return outcome
