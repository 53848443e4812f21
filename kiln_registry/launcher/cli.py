"""The ``kiln-teacher`` command: launcher flags in, one identity line out.

Owns the command shell: a dispatcher on the first argument (``cleanup``,
``qualify``, otherwise the launch/manifest flags), the one error path (a
``KilnError`` becomes one line on stderr and exit status 2) and the
``--identity-input FILE --manifest-only`` path, which prints the composed
identity as one line of canonical JSON.  Real launches, ``--dry-run``,
``cleanup`` and ``qualify`` are not part of this build and say so.

Flag, option and environment rules live in ``launcher.policy``; identity
documents are built only by ``identity.compose``.  This module must not
import vLLM, torch or Transformers, and does no work at import time.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence

from kiln_registry.errors import KilnError, LauncherError
from kiln_registry.identity.canonical import canonical_json
from kiln_registry.identity.compose import compose_identity
from kiln_registry.identity.input_manifest import load_teacher_input
from kiln_registry.launcher.policy import (
    LauncherRequest,
    check_launch_environment,
    parse_launcher_argv,
)

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
                    [-- EXTRA_VLLM_OPTIONS...]
       kiln-teacher cleanup ... | qualify ...

Extra vLLM options follow one '--', each as one --name=value token (or a
reviewed valueless switch).  Errors print one line and exit with status 2.
"""

Handler = Callable[[Sequence[str], Mapping[str, str]], int]


def run(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Run ``kiln-teacher`` with ``argv`` (without the program name) and ``env``."""
    if list(argv) in (["--help"], ["-h"]):
        sys.stdout.write(USAGE)
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
    if request.manifest_only and request.identity_input is not None:
        return _print_manifest(request, decision.child_environment)
    if request.manifest_only:
        what = "--manifest-only from --model-path"
    elif request.dry_run:
        what = "--dry-run"
    else:
        what = "a real launch"
    raise _not_implemented(what)


def _print_manifest(request: LauncherRequest, child_environment: Mapping[str, str]) -> int:
    assert request.identity_input is not None  # guaranteed by the caller's mode check
    inputs = load_teacher_input(request.identity_input)
    composed = compose_identity(
        inputs,
        served_model_id=request.served_model_id,
        max_top_k=request.max_top_k,
        max_model_len=request.max_model_len,
        max_prompt_logprob_candidates=request.max_prompt_logprob_candidates,
        vllm_args=request.vllm_options.inference,
        environment=child_environment,
        launcher_strict=True,
    )
    sys.stdout.buffer.write(canonical_json(composed.to_output()) + b"\n")
    sys.stdout.buffer.flush()
    return 0


def _cleanup(argv: Sequence[str], env: Mapping[str, str]) -> int:
    raise _not_implemented("kiln-teacher cleanup")


def _qualify(argv: Sequence[str], env: Mapping[str, str]) -> int:
    raise _not_implemented("kiln-teacher qualify")


def _not_implemented(what: str) -> LauncherError:
    return LauncherError(
        f"{what} is not implemented in this build",
        rule="launcher.not_implemented",
        hint="use --identity-input FILE --manifest-only to inspect an identity",
    )


_SUBCOMMANDS: Mapping[str, Handler] = {"cleanup": _cleanup, "qualify": _qualify}
