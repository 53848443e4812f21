"""The teacher gateway in a launch: vLLM's socket, the gateway's command, the boundary.

Owns how a launch puts the gateway (``kiln_registry.gateway``) in front of
vLLM: ``vllm_transport`` (vLLM's transport options: with the gateway,
``--uds=<private runtime dir>/vllm.sock`` replaces ``--host``, ``--port``
and ``--api-key``), ``gateway_front`` (the gateway's argv and exact
environment, as a supervisor ``Front``) and ``boundary_document`` (what the
dry run, the manifest and the announcement say about the public boundary).

The key (``--api-key-env=KILN_...`` or ``--api-key=...`` after ``--``)
reaches the gateway only through its environment, under
``GATEWAY_KEY_VARIABLE``; the gateway's argv names that variable, never the
key.  The gateway runs with the launcher's interpreter and a minimal
environment (``PATH``, the package root as ``PYTHONPATH``, the key).

Imports: standard library, ``kiln_registry.domain.errors``, ``kiln_registry.gateway.config``
and sibling launcher modules; never vLLM.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import kiln_registry
from kiln_registry.domain.errors import InputError
from kiln_registry.gateway.config import (
    MAX_KEY_BYTES,
    GatewayConfig,
    exposure_warning,
    gateway_argv,
)
from kiln_registry.launcher.policy import LauncherRequest
from kiln_registry.launcher.supervisor import Front
from kiln_registry.launcher.vllm_command import DEFAULT_VLLM_PORT, health_target
from kiln_registry.vllm_options.options import API_KEY_OPTION

VLLM_SOCKET_NAME = "vllm.sock"
SOCKET_PLACEHOLDER = "<private runtime dir>/" + VLLM_SOCKET_NAME
GATEWAY_MODULE = "kiln_registry.gateway"
GATEWAY_KEY_VARIABLE = "KILN_GATEWAY_API_KEY"
GATEWAY_ROUTES = ("POST /v1/completions", "GET /v1/models", "GET /health")
GATEWAY_DEFAULT_HOST = "127.0.0.1"  # an explicit --host after -- goes wider
_DIRECT_ONLY = ("--host=", "--port=", f"--{API_KEY_OPTION}=")
_PATH = "/usr/local/bin:/usr/bin:/bin"


def socket_path(socket_dir: str) -> str:
    return os.path.join(socket_dir, VLLM_SOCKET_NAME)


def vllm_transport(request: LauncherRequest, uds: str | None) -> tuple[str, ...]:
    """vLLM's transport options: the user's in direct mode, else the private socket."""
    transport = request.vllm_options.transport
    if not request.gateway:
        return transport
    if uds is None:
        raise InputError("the gateway needs vLLM's socket path", rule="launcher.gateway")
    kept = tuple(token for token in transport if not token.startswith(_DIRECT_ONLY))
    return (*kept, f"--uds={uds}")


def gateway_key(request: LauncherRequest, env: Mapping[str, str]) -> str | None:
    """The key the gateway checks, from ``--api-key-env`` or ``--api-key`` (never printed)."""
    prefix = f"--{API_KEY_OPTION}="
    given = next(
        (t[len(prefix) :] for t in request.vllm_options.transport if t.startswith(prefix)), None
    )
    name = request.api_key_env
    if name is not None:
        given = env.get(name)
        if not given:
            raise InputError(f"--api-key-env names {name}, which is unset or empty",
                             rule="launcher.api_key_env")  # fmt: skip
    if given is None:
        return None
    encoded = given.encode("utf-8", "surrogateescape")
    if len(encoded) > MAX_KEY_BYTES or not all(0x21 <= byte <= 0x7E for byte in encoded):
        raise InputError(f"the API key must be 1..{MAX_KEY_BYTES} visible ASCII characters",
                         rule="launcher.api_key")  # fmt: skip
    return given


def gateway_front(
    request: LauncherRequest,
    env: Mapping[str, str],
    *,
    uds: str,
    python: str,
    base_alias: str | None,
    stop_grace: float,
) -> Front:
    """The gateway's command and environment for a launch (started once vLLM is ready)."""
    options = request.vllm_options
    config = GatewayConfig(
        host=options.host or GATEWAY_DEFAULT_HOST,
        port=options.port or DEFAULT_VLLM_PORT,
        upstream_uds=uds,
        served_model_id=request.served_model_id,
        max_model_len=request.max_model_len,
        max_top_k=request.max_top_k,
        base_alias=base_alias,
        drain_seconds=max(1.0, stop_grace - 1.0),
    )
    key = gateway_key(request, env)
    argv = [python, "-m", GATEWAY_MODULE,
            *gateway_argv(config, api_key_env=GATEWAY_KEY_VARIABLE if key else None)]  # fmt: skip
    child_env = {
        "PATH": _PATH,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(kiln_registry.__file__))),
    }
    if key is not None:
        child_env[GATEWAY_KEY_VARIABLE] = key
    return Front(tuple(argv), child_env, health_target(options))


def boundary_document(request: LauncherRequest) -> dict[str, object]:
    """What the public boundary is, for the dry run, the manifest and the announcement."""
    if not request.gateway:
        return {
            "mode": "vllm",
            "note": "--gateway=off: vLLM's own port is the boundary; its --api-key guards only "
            "its /v1 routes, and every other route it registers answers",
        }
    has_key = request.api_key_env is not None or request.vllm_options.api_key_present
    source = request.api_key_env or "--api-key"
    document: dict[str, object] = {
        "mode": "gateway",
        "listen": health_target(request.vllm_options).url,
        "routes": list(GATEWAY_ROUTES),
        "api_key": f"checked by the gateway (from {source})" if has_key else "none",
        "vllm": f"Unix socket {SOCKET_PLACEHOLDER}; no key; reachable only through the gateway",
    }
    warning = exposure_warning(request.vllm_options.host or GATEWAY_DEFAULT_HOST, keyed=has_key)
    if warning is not None:
        document["warning"] = warning
    return document
