"""The real launch path as a library: prepare, spawn, supervise, clean up.

Owns ``prepare_launch`` (validated request -> vLLM build present -> inherited
group checked -> port free -> roots distinct -> snapshot staged -> identity
from the staged manifest -> private cache -> pre-spawn recheck child),
``PreparedLaunch.spawn`` (``verify_snapshot`` immediately before spawn, then
the announcement, then the process group) and ``LaunchedTeacher`` (the running
group: ``wait_ready``, ``stop``, context manager).  The vLLM argv and the
launch identity are built by ``launcher.vllm_command`` (its public names are
re-exported here).  A registry server can drive it: nothing here installs
signal handlers or prints; the CLI does both.

Decisions:

* The staged identity is computed from the staging manifest's records
  (shard digests and lengths); only ``config.json``, ``tokenizer.json`` and
  ``adapter_config.json`` are re-read, and each must match its manifest
  digest.  No extra full hash pass over the weights happens in this process.
* vLLM puts engine IPC sockets under ``TMPDIR``; a Unix socket path has at
  most 107 bytes and cache paths are long, so each launch gets a private
  ``/tmp/kiln-<pid>-<random>`` directory (mode 0700) as ``TMPDIR``, removed
  with the snapshot and cache.  ``TMPDIR`` is not an identity input.
* Startup attempts are appended to ``<cache-root>/attempts.jsonl`` so that
  they outlive the private cache.
* With the gateway (the default; ``launcher.front``) vLLM listens on
  ``vllm.sock`` in that directory and the gateway (same process group,
  started once vLLM answers) on the user's host and port: ``target`` is the
  public address, ``vllm_target`` where vLLM itself is polled.

Imports: standard library, ``kiln_registry.domain.errors``, ``kiln_registry.identity``,
``kiln_registry.model`` and sibling launcher modules; never torch or vLLM.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType

from kiln_registry.domain.errors import LauncherError
from kiln_registry.identity.compose import ComposedIdentity
from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.identity.input_manifest import TeacherInput
from kiln_registry.launcher.front import (
    boundary_document,
    gateway_front,
    gateway_key,
    socket_path,
)
from kiln_registry.launcher.measure_launch import PendingRecheck, launch_argv, stage_and_measure
from kiln_registry.launcher.phases import PhaseClock
from kiln_registry.launcher.policy import LauncherRequest, check_launch_environment
from kiln_registry.launcher.readiness import HealthTarget, check_port_free
from kiln_registry.launcher.roots import check_distinct_roots
from kiln_registry.launcher.staging import (
    PrivateCache,
    Progress,
    StagedSnapshot,
    create_private_cache,
    remove_private_cache,
    remove_snapshot,
    verify_snapshot,
)
from kiln_registry.launcher.supervisor import (
    DETACHED,
    INHERITED,
    AttemptsLog,
    Front,
    ProcessGroup,
    check_inherited_group,
)
from kiln_registry.launcher.vllm_command import (
    AdapterLaunch,
    base_model_name,
    health_target,
    redact_argv,
    require_vllm_build,
    vllm_build,
    vllm_server_argv,
)

__all__ = [
    "AdapterLaunch",
    "LaunchedTeacher",
    "PreparedLaunch",
    "base_model_name",
    "health_target",
    "prepare_launch",
    "redact_argv",
    "require_vllm_build",
    "vllm_build",
    "vllm_server_argv",
]

SOCKET_PARENT = "/tmp"
ATTEMPTS_NAME = "attempts.jsonl"
DEFAULT_STOP_GRACE = 15.0


# -- the prepared launch ---------------------------------------------------------------


@dataclass
class PreparedLaunch:
    """A staged, measured and rechecked launch that has not spawned vLLM yet.

    Owns the snapshot, the private cache and the socket directory until
    ``close()``; use it as a context manager.
    """

    request: LauncherRequest
    inputs: TeacherInput
    composed: ComposedIdentity
    snapshot: StagedSnapshot
    cache: PrivateCache
    socket_dir: str
    limiter: ReadRateLimiter
    target: HealthTarget
    attempts: AttemptsLog
    child_env: Mapping[str, str] = field(repr=False)
    argv: tuple[str, ...] = field(repr=False)
    redacted_argv: tuple[str, ...]
    vllm_target: HealthTarget | None = None
    spawned_at: float = 0.0
    front: Front | None = field(default=None, repr=False)
    clock: PhaseClock = field(default_factory=PhaseClock, repr=False)
    recheck: PendingRecheck | None = field(default=None, repr=False)
    closed: bool = False

    @property
    def fingerprint(self) -> str:
        return self.composed.identity.fingerprint()

    @property
    def url(self) -> str:
        return self.target.url

    def announcement(self) -> dict[str, object]:
        """The one line printed immediately before spawn."""
        return {
            "fingerprint": self.fingerprint,
            "identity_sha256": self.composed.identity.digest(),
            "served_model_id": self.request.served_model_id,
            "snapshot_path": str(self.snapshot.path),
            "url": self.url,
            "boundary": boundary_document(self.request),
        }

    def spawn(self, announce: Callable[[PreparedLaunch], None] | None = None) -> LaunchedTeacher:
        """Verify the snapshot, announce, and start vLLM in its process group."""
        if self.closed:
            raise LauncherError("this launch was already closed", rule="launcher.closed")
        with self.clock.phase("verify"):
            verify_snapshot(self.snapshot, limiter=self.limiter)
        if announce is not None:
            announce(self)
        try:
            group = ProcessGroup(self.argv, self.child_env, mode=self.request.process_group_mode)
        except LauncherError:
            self.attempts.record(
                pid=None, argv=self.redacted_argv, outcome="spawn_failed", timings=self.timings()
            )
            raise
        self.spawned_at = time.monotonic()
        launched = LaunchedTeacher(self, group)
        if self.recheck is not None:
            try:
                self.recheck.start()  # overlaps vLLM's start-up; the gateway waits for it
            except BaseException:  # any failure here (a bug, a signal) drains vLLM
                launched.stop()
                raise
        return launched

    def timings(self) -> dict[str, object]:
        """The phase timings so far (the attempts log and ``--timings`` carry them)."""
        return self.clock.document()

    def confirm(self, interrupted: Callable[[], bool] | None = None) -> bool:
        """Wait for the deferred recheck (gateway mode) to agree; call before serving.

        False when ``interrupted()`` turned true first; a disagreement raises.
        """
        return self.recheck is None or self.recheck.wait(interrupted)

    def close(self) -> None:
        """Remove the snapshot, the cache and the socket directory (idempotent)."""
        if self.closed:
            return
        self.closed = True
        if self.recheck is not None:
            self.recheck.close()
        _cleanup(self.snapshot, self.cache, self.socket_dir)

    def __enter__(self) -> PreparedLaunch:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class LaunchedTeacher:
    """A running vLLM process group; stopping it drains the group and cleans up."""

    def __init__(self, prepared: PreparedLaunch, group: ProcessGroup) -> None:
        self.prepared = prepared
        self.group = group

    @property
    def fingerprint(self) -> str:
        return self.prepared.fingerprint

    @property
    def identity(self) -> ComposedIdentity:
        return self.prepared.composed

    @property
    def url(self) -> str:
        return self.prepared.url

    def wait_ready(self, deadline: float) -> None:
        """Poll /health until ready or ``deadline`` (a ``time.monotonic()`` value): vLLM's
        socket first, then (with the gateway) start the gateway and poll the public port."""
        prepared, clock = self.prepared, self.prepared.clock
        outcome = self.group.wait_ready(prepared.vllm_target or prepared.target, deadline)
        clock.end("vllm_ready", prepared.spawned_at)
        if outcome == "ready" and prepared.front is not None:
            self._confirm()
            with clock.phase("gateway"):
                self.group.start_front(prepared.front)
                outcome = self.group.wait_ready(prepared.target, deadline)
        self.prepared.attempts.record(
            pid=self.group.pid,
            argv=self.prepared.redacted_argv,
            outcome=outcome,
            timings=prepared.timings(),
        )
        if outcome != "ready":
            self.group.drain(grace=DEFAULT_STOP_GRACE)
            raise LauncherError(
                f"vLLM did not become ready at {self.url}/health ({outcome})",
                rule="supervisor.not_ready",
            )

    def _confirm(self) -> None:
        """The deferred recheck must agree before the gateway opens; else drain and fail."""
        try:
            self.prepared.confirm()
        except LauncherError:
            self.prepared.attempts.record(
                pid=self.group.pid,
                argv=self.prepared.redacted_argv,
                outcome="recheck_failed",
                timings=self.prepared.timings(),
            )
            self.group.drain(grace=DEFAULT_STOP_GRACE)
            raise

    def stop(self, grace: float = DEFAULT_STOP_GRACE) -> None:
        """Drain the process group, then remove the snapshot and cache."""
        try:
            self.group.drain(grace=grace)
        finally:
            self.prepared.close()

    def __enter__(self) -> LaunchedTeacher:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def prepare_launch(
    request: LauncherRequest,
    env: Mapping[str, str],
    *,
    progress: Progress | None = None,
    python: str = sys.executable,
    stop_grace: float = DEFAULT_STOP_GRACE,
    clock: PhaseClock | None = None,
) -> PreparedLaunch:
    """Everything before spawn; on any failure what was created is removed."""
    clock = clock or PhaseClock()
    with clock.phase("resolve"):
        paths = _launch_paths(request)
        decision = check_launch_environment(env)
        gateway_key(request, env)  # a missing or malformed key fails before any staging
        build = require_vllm_build()
        _check_group_mode(request.process_group_mode)
        target = health_target(request.vllm_options)
        check_port_free(target, request.vllm_options.host)
        check_distinct_roots(paths[0], request.adapter_path, paths[1], paths[2])
    limiter = ReadRateLimiter(request.max_provenance_read_mib_per_second)
    created: list[object] = []
    try:
        cache = create_private_cache(paths[2])
        created.append(cache)
        socket_dir = tempfile.mkdtemp(prefix=f"kiln-{os.getpid()}-", dir=SOCKET_PARENT)
        created.append(socket_dir)
        child_env = {
            **decision.child_environment,
            "VLLM_CACHE_ROOT": str(cache.path),
            "TMPDIR": socket_dir,
        }
        snapshot, inputs, composed, recheck = stage_and_measure(
            request, paths, child_env, limiter=limiter, python=python, progress=progress,
            clock=clock, created=created, defer_recheck=request.gateway,
        )  # fmt: skip
        if recheck is not None:
            created.append(recheck)
        uds = socket_path(socket_dir) if request.gateway else None
        argv = launch_argv(request, snapshot, inputs, composed, python=python, build=build, uds=uds)
        alias = base_model_name(inputs.base_model_sha256) if inputs.adapter else None
        front = (
            None
            if uds is None
            else gateway_front(
                request, env, uds=uds, python=python, base_alias=alias, stop_grace=stop_grace
            )
        )
    except BaseException:
        for pending in (c for c in created if isinstance(c, PendingRecheck)):
            pending.close()
        _cleanup(*_split_created(created))
        raise
    return PreparedLaunch(
        request=request,
        inputs=inputs,
        composed=composed,
        snapshot=snapshot,
        cache=cache,
        socket_dir=socket_dir,
        limiter=limiter,
        target=target,
        attempts=AttemptsLog(os.path.join(paths[2], ATTEMPTS_NAME)),
        child_env=child_env,
        argv=tuple(argv),
        redacted_argv=tuple(redact_argv(argv)),
        vllm_target=HealthTarget(uds=uds) if uds is not None else None,
        front=front,
        clock=clock,
        recheck=recheck,
    )


def _check_group_mode(mode: str) -> None:
    if mode == INHERITED:
        check_inherited_group()
    elif mode != DETACHED:
        raise LauncherError("unknown process-group mode", rule="launcher.value")


def _launch_paths(request: LauncherRequest) -> tuple[str, str, str]:
    """(model path, snapshot root, cache root)."""
    if request.model_path is None or request.identity_input is not None:
        raise LauncherError(
            "a launch needs --model-path and never takes --identity-input", rule="launcher.mode"
        )
    if request.snapshot_root is None or request.cache_root is None:
        raise LauncherError(
            "no snapshot or cache root: set --snapshot-root and --cache-root (or HOME)",
            rule="launcher.roots",
        )
    return request.model_path, request.snapshot_root, request.cache_root


def _split_created(
    created: Sequence[object],
) -> tuple[StagedSnapshot | None, PrivateCache | None, str | None]:
    snapshot = next((c for c in created if isinstance(c, StagedSnapshot)), None)
    cache = next((c for c in created if isinstance(c, PrivateCache)), None)
    socket_dir = next((c for c in created if isinstance(c, str)), None)
    return snapshot, cache, socket_dir


def _cleanup(
    snapshot: StagedSnapshot | None, cache: PrivateCache | None, socket_dir: str | None
) -> None:
    """Remove everything a launch created; every step runs even if one fails."""
    errors: list[BaseException] = []
    for step in (
        (lambda: remove_snapshot(snapshot)) if snapshot is not None else None,
        (lambda: remove_private_cache(cache)) if cache is not None else None,
        (lambda: shutil.rmtree(socket_dir)) if socket_dir is not None else None,
    ):
        if step is None:
            continue
        try:
            step()
        except (OSError, LauncherError) as exc:
            errors.append(exc)
    if errors:
        raise LauncherError(
            f"cleanup after the launch failed: {errors[0]}", rule="launcher.cleanup"
        )
