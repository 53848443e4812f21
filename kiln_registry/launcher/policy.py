"""The launcher's flag, option and environment policy (pure).

Owns ``parse_launcher_argv``: the ``kiln-teacher`` launch and manifest flags,
then exactly one ``--`` and the extra vLLM options, which
``classify_vllm_options`` (``vllm_options.options``) validates; and
``request_from_flags``, the same rules for flags already separated (a
local-teacher profile: no command line is written and parsed back).  The environment
policy is ``check_launch_environment`` (``policy_env``); both are re-exported
here so callers import one module.

Flag rules: each launcher flag is ``--flag=value`` or ``--flag value`` (exact
names only: no abbreviations, no underscores), appears at most once, and
unknown flags are refused.  Integers are canonical decimals (no sign, no
leading zeros, no underscores or white space).  Modes:

* real launch (neither ``--manifest-only`` nor ``--dry-run``) needs
  ``--model-path`` and never accepts ``--identity-input``: a precomputed input
  can never launch a server;
* ``--manifest-only`` and ``--dry-run`` are exclusive: each selects one output;
* ``--manifest-only`` takes ``--identity-input`` (then no source path, which
  would be ignored) or ``--model-path``;
* ``--dry-run`` always needs ``--model-path``, because the preview labels the
  source paths; with ``--identity-input`` the identity comes from that file.

Imports: standard library, ``kiln_registry.domain.errors``, the sibling pure
policy modules and the option policy leaf ``kiln_registry.vllm_options`` only
(no subprocess, sockets or file access).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kiln_registry.domain.errors import InputError
from kiln_registry.launcher.policy_env import (
    DEVICE_VISIBILITY_VARIABLES,
    FORCED_CHILD_ENVIRONMENT,
    EnvironmentDecision,
    check_launch_environment,
)
from kiln_registry.launcher.policy_gateway import (
    API_KEY_ENV_FLAG,
    GATEWAY_FLAG,
    GATEWAY_ON,
    check_api_key_env,
    check_gateway_options,
)
from kiln_registry.vllm_options.options import (
    VLLM_OPTION_POLICY_VERSION,
    VllmOptions,
    classify_vllm_options,
)
from kiln_registry.vllm_options.tables import ValueRule, canonical_int, one_of

__all__ = [
    "DEVICE_VISIBILITY_VARIABLES",
    "FORCED_CHILD_ENVIRONMENT",
    "VLLM_OPTION_POLICY_VERSION",
    "EnvironmentDecision",
    "LauncherRequest",
    "VllmOptions",
    "check_launch_environment",
    "classify_vllm_options",
    "parse_launcher_argv",
    "request_from_flags",
]

MAX_LAUNCHER_ARGV = 512
MAX_PATH_BYTES = 4096
MAX_SERVED_MODEL_ID_BYTES = 256
SNAPSHOT_ROOT_ENV = "KILN_VLLM_SNAPSHOT_ROOT"
DEFAULT_SNAPSHOT_SUBDIR = ".cache/kiln/teacher-snapshots"
DEFAULT_CACHE_SUBDIR = ".cache/kiln/vllm-runtime-caches"
MODE_LAUNCH = "launch"
MODE_MANIFEST = "manifest"
MODE_DRY_RUN = "dry-run"

_SERVED_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")
_ECHO_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_PATH_FLAGS = frozenset(
    {"model-path", "adapter-path", "snapshot-root", "cache-root", "identity-input"}
)
_CHECKED_FLAGS: Mapping[str, ValueRule] = {
    "max-top-k": canonical_int(1, 65_536),
    "max-model-len": canonical_int(1, 16_777_216),
    "max-prompt-logprob-candidates": canonical_int(1, 1_000_000),
    "max-provenance-read-mib-per-second": canonical_int(1, 16_384),
    "process-group-mode": one_of("detached", "inherited"),
    GATEWAY_FLAG: one_of("on", "off"),
    API_KEY_ENV_FLAG: check_api_key_env,
}
_VALUE_FLAGS = _PATH_FLAGS | {"served-model-id"} | frozenset(_CHECKED_FLAGS)
_SWITCH_FLAGS = frozenset({"manifest-only", "dry-run", "timings"})
_REQUIRED_FLAGS = ("served-model-id", "max-top-k", "max-model-len")


@dataclass(frozen=True, slots=True)
class LauncherRequest:
    """Validated ``kiln-teacher`` flags; paths are as given, not yet resolved.

    ``snapshot_root`` / ``cache_root`` are ``None`` only when neither the flag,
    the environment nor an absolute ``HOME`` supplies one.
    """

    mode: str
    served_model_id: str
    max_top_k: int
    max_model_len: int
    max_prompt_logprob_candidates: int | None
    max_provenance_read_mib_per_second: int | None
    model_path: str | None
    adapter_path: str | None
    identity_input: str | None
    snapshot_root: str | None
    cache_root: str | None
    process_group_mode: str
    vllm_options: VllmOptions
    gateway: bool = True
    api_key_env: str | None = None
    timings: bool = False

    @property
    def manifest_only(self) -> bool:
        return self.mode == MODE_MANIFEST

    @property
    def dry_run(self) -> bool:
        return self.mode == MODE_DRY_RUN


def parse_launcher_argv(argv: Sequence[str], env: Mapping[str, str]) -> LauncherRequest:
    """Parse launcher flags, then validate the extra vLLM options after ``--``."""
    if len(argv) > MAX_LAUNCHER_ARGV:
        raise InputError(
            f"{len(argv)} arguments given; at most {MAX_LAUNCHER_ARGV} are accepted",
            rule="launcher.too_many",
        )
    delimiter = next((i for i, token in enumerate(argv) if token == "--"), len(argv))
    return _request(_parse_flags(argv[:delimiter]), argv[delimiter + 1 :], env)


def request_from_flags(
    flags: Mapping[str, str], vllm_tokens: Sequence[str], env: Mapping[str, str]
) -> LauncherRequest:
    """The request for already separated launcher flags (name without ``--`` -> value).

    What a local-teacher profile is turned into (``local.launch_spec``): each
    flag is checked as the command line's would be (known name, no NUL/CR/LF,
    the value rules), then the request is built by the same code as
    ``parse_launcher_argv``'s.
    """
    if len(flags) + len(vllm_tokens) > MAX_LAUNCHER_ARGV:
        raise InputError(
            f"{len(flags) + len(vllm_tokens)} arguments given; at most {MAX_LAUNCHER_ARGV}"
            " are accepted",
            rule="launcher.too_many",
        )
    for name, value in flags.items():
        _check_flag(name, value)
    return _request(flags, vllm_tokens, env)


def _request(
    flags: Mapping[str, str], vllm_tokens: Sequence[str], env: Mapping[str, str]
) -> LauncherRequest:
    options = classify_vllm_options(vllm_tokens)
    check_gateway_options(flags, options.transport)
    mode = _select_mode(flags)
    missing = [f"--{name}" for name in _REQUIRED_FLAGS if name not in flags]
    if missing:
        raise InputError(
            f"missing required flag(s): {', '.join(missing)}", rule="launcher.required"
        )
    return LauncherRequest(
        mode=mode,
        served_model_id=flags["served-model-id"],
        max_top_k=int(flags["max-top-k"]),
        max_model_len=int(flags["max-model-len"]),
        max_prompt_logprob_candidates=_optional_int(flags, "max-prompt-logprob-candidates"),
        max_provenance_read_mib_per_second=_optional_int(
            flags, "max-provenance-read-mib-per-second"
        ),
        model_path=flags.get("model-path"),
        adapter_path=flags.get("adapter-path"),
        identity_input=flags.get("identity-input"),
        snapshot_root=_snapshot_root(flags, env),
        cache_root=flags.get("cache-root") or _under_home(env, DEFAULT_CACHE_SUBDIR),
        process_group_mode=flags.get("process-group-mode", "detached"),
        vllm_options=options,
        gateway=flags.get(GATEWAY_FLAG, GATEWAY_ON) == GATEWAY_ON,
        api_key_env=flags.get(API_KEY_ENV_FLAG),
        timings="timings" in flags,
    )


def _check_flag(name: str, value: str) -> None:
    """One flag and its value: a known name, no NUL/CR/LF, the value rules.

    ``_read_flag`` ends here once it has split a token (it refuses unknown names
    and malformed tokens first, naming the argument position).
    """
    if name in _SWITCH_FLAGS:
        if value:
            raise InputError(f"--{name} takes no value", rule="launcher.form")
        return
    if name not in _VALUE_FLAGS:
        shown = f"--{name}" if _ECHO_RE.fullmatch(name) else "a flag name"
        raise InputError(f"{shown} is not a kiln-teacher flag", rule="launcher.unknown_flag")
    if any(char in value for char in "\x00\r\n"):
        raise InputError(f"the value of --{name} contains a NUL, CR or LF", rule="launcher.control")
    _check_flag_value(name, value)


def _parse_flags(tokens: Sequence[str]) -> dict[str, str]:
    """Launcher flags as name -> value ("" for switches), each validated."""
    flags: dict[str, str] = {}
    index = 0
    while index < len(tokens):
        name, value, used = _read_flag(tokens, index)
        if name in flags:
            raise InputError(f"--{name} is given twice", rule="launcher.duplicate")
        flags[name] = value
        index += used
    return flags


def _read_flag(tokens: Sequence[str], index: int) -> tuple[str, str, int]:
    """Read the flag at ``index``: (name, value, tokens consumed)."""
    token = tokens[index]
    position = f"launcher argument #{index + 1}"
    if any(char in token for char in "\x00\r\n"):
        raise InputError(f"{position} contains a NUL, CR or LF", rule="launcher.control")
    if not token.startswith("--"):
        raise InputError(
            f"{position} is not a --flag; extra vLLM options go after one '--'",
            rule="launcher.form",
        )
    name, sep, value = token[2:].partition("=")
    if name in _SWITCH_FLAGS:
        if sep:
            raise InputError(f"--{name} takes no value", rule="launcher.form")
        return name, "", 1
    if name not in _VALUE_FLAGS:
        shown = f"--{name}" if _ECHO_RE.fullmatch(name) else position
        raise InputError(
            f"{shown} is not a kiln-teacher flag (abbreviations are not accepted); "
            "extra vLLM options go after one '--'",
            rule="launcher.unknown_flag",
        )
    used = 1
    if not sep:
        following = tokens[index + 1] if index + 1 < len(tokens) else None
        if following is None or following.startswith("--"):
            raise InputError(f"--{name} needs a value", rule="launcher.value")
        value, used = following, 2
    _check_flag(name, value)
    return name, value, used


def _check_flag_value(name: str, value: str) -> None:
    if not value:
        raise InputError(f"--{name} needs a non-empty value", rule="launcher.value")
    if name in _PATH_FLAGS:
        if len(value.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
            raise InputError(
                f"--{name} is longer than {MAX_PATH_BYTES} bytes", rule="launcher.value"
            )
        return
    if name == "served-model-id":
        too_long = len(value.encode("utf-8", "surrogateescape")) > MAX_SERVED_MODEL_ID_BYTES
        if too_long or not _SERVED_ID_RE.fullmatch(value):
            raise InputError(
                "--served-model-id must match ^[A-Za-z0-9][A-Za-z0-9._/-]*$ and be at most "
                f"{MAX_SERVED_MODEL_ID_BYTES} bytes",
                rule="launcher.served_model_id",
            )
        return
    problem = _CHECKED_FLAGS[name](value)
    if problem is not None:
        raise InputError(f"--{name}: {problem}", rule="launcher.value")


def _select_mode(flags: Mapping[str, str]) -> str:
    manifest, dry_run = "manifest-only" in flags, "dry-run" in flags
    precomputed, source = "identity-input" in flags, "model-path" in flags
    if manifest and dry_run:
        raise InputError("--manifest-only and --dry-run are exclusive", rule="launcher.mode")
    if dry_run:
        if not source:
            raise InputError(
                "--dry-run needs --model-path: the preview labels the source paths",
                rule="launcher.mode",
            )
        return MODE_DRY_RUN
    if manifest:
        if precomputed and (source or "adapter-path" in flags):
            raise InputError(
                "--manifest-only with --identity-input takes no --model-path or --adapter-path "
                "(the identity comes from the input file)",
                rule="launcher.mode",
            )
        if not (precomputed or source):
            raise InputError(
                "--manifest-only needs --identity-input or --model-path", rule="launcher.mode"
            )
        return MODE_MANIFEST
    if precomputed:
        raise InputError(
            "--identity-input serves only --manifest-only or --dry-run; a precomputed input "
            "can never launch a server",
            rule="launcher.mode",
        )
    if not source:
        raise InputError("a launch needs --model-path", rule="launcher.mode")
    return MODE_LAUNCH


def _optional_int(flags: Mapping[str, str], name: str) -> int | None:
    return int(flags[name]) if name in flags else None


def _snapshot_root(flags: Mapping[str, str], env: Mapping[str, str]) -> str | None:
    if "snapshot-root" in flags:
        return flags["snapshot-root"]
    if SNAPSHOT_ROOT_ENV in env:
        value = env[SNAPSHOT_ROOT_ENV]
        if not value or any(char in value for char in "\x00\r\n"):
            raise InputError(
                f"{SNAPSHOT_ROOT_ENV} must be a non-empty path", rule="launcher.snapshot_root"
            )
        return value
    return _under_home(env, DEFAULT_SNAPSHOT_SUBDIR)


def _under_home(env: Mapping[str, str], subdir: str) -> str | None:
    home = env.get("HOME", "")
    if not home.startswith("/") or "\x00" in home:
        return None
    return f"{home.rstrip('/')}/{subdir}"
