"""Replicas of one prepared launch: more process groups over the same staged snapshot.

``replica_launch(prepared, index, port, environ)`` gives replica ``index`` of a
``PreparedLaunch`` its own loopback port, its own socket directory (``TMPDIR``
and, with the gateway, vLLM's ``vllm.sock``), its own empty cache folder
inside the launch's private cache, and ``environ`` (its GPU:
``CUDA_VISIBLE_DEVICES``) on top of the prepared child environment.  The
snapshot is staged and hashed once; each replica's spawn verifies it again.
Closing a replica removes only its socket directory: the snapshot and cache
go with the prepared launch, after every replica stopped.

The identity is the prepared one (port, sockets and cache never enter it).
A replica placed on a GPU is refused unless that GPU is in the launch's
accelerator block and every device there is the same model (name,
architecture, memory), so replicas on identical devices present one identity.

Imports the standard library, ``kiln_registry.domain.errors``, the identity
input manifest and sibling launcher modules; never torch or vLLM.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kiln_registry.domain.errors import LauncherError
from kiln_registry.identity.input_manifest import Accelerator
from kiln_registry.launcher.front import socket_path
from kiln_registry.launcher.launch import SOCKET_PARENT, PreparedLaunch
from kiln_registry.launcher.readiness import HealthTarget, check_port_free
from kiln_registry.launcher.supervisor import Front

DEVICE_VARIABLE = "CUDA_VISIBLE_DEVICES"


@dataclass
class ReplicaLaunch(PreparedLaunch):
    """Replica ``index`` of a prepared launch; ``close`` removes only its own directory."""

    replica_dir: str = ""

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            shutil.rmtree(self.replica_dir)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise LauncherError(
                f"removing a replica's socket directory failed: {exc.strerror}",
                rule="launcher.cleanup",
            ) from None


def swap_option(tokens: Sequence[str], prefix: str, value: str, what: str) -> tuple[str, ...]:
    """``tokens`` with the one ``prefix…`` token replaced by ``prefix + value``."""
    found = [i for i, token in enumerate(tokens) if token.startswith(prefix)]
    if len(found) != 1:
        raise LauncherError(
            f"cannot place a replica: the {what} has {len(found)} {prefix}… option(s), not one",
            rule="launcher.replica",
        )
    out = list(tokens)
    out[found[0]] = prefix + value
    return tuple(out)


def check_replica_device(accelerator: Accelerator, environ: Mapping[str, str]) -> None:
    """A replica's GPU must be one of the launch's identical accelerator devices."""
    value = environ.get(DEVICE_VARIABLE)
    if value is None:
        return
    kinds = {(d.name, d.architecture, d.total_memory_bytes) for d in accelerator.devices}
    indices = {device.index for device in accelerator.devices}
    if accelerator.type != "cuda" or not value.isdigit() or int(value) not in indices:
        raise LauncherError(
            f"a replica is placed on cuda:{value}, which is not among this host's"
            f" {accelerator.type} devices as the launch measured them",
            rule="launcher.replica_device",
        )
    if len(kinds) != 1:
        raise LauncherError(
            "replicas are placed on GPUs of different models; every replica of an alias must"
            " run on the same device model so that all present one identity",
            rule="launcher.replica_device",
        )


def replica_launch(
    prepared: PreparedLaunch, index: int, port: int, environ: Mapping[str, str]
) -> ReplicaLaunch:
    """Replica ``index`` of ``prepared`` on ``port``, with ``environ`` added (not spawned)."""
    check_replica_device(prepared.inputs.accelerator, environ)
    options = prepared.request.vllm_options
    target = HealthTarget(host=prepared.target.host, port=port)
    check_port_free(target, options.host)
    replica_dir = tempfile.mkdtemp(prefix=f"kiln-{os.getpid()}-r{index}-", dir=SOCKET_PARENT)
    try:
        cache = os.path.join(str(prepared.cache.path), f"replica-{index}")
        os.mkdir(cache, 0o700)
        child_env = {
            **prepared.child_env,
            **environ,
            "VLLM_CACHE_ROOT": cache,
            "TMPDIR": replica_dir,
        }
        argv, front, vllm_target = _placed(prepared, port, replica_dir)
    except BaseException:
        shutil.rmtree(replica_dir, ignore_errors=True)
        raise
    fields = {f.name: getattr(prepared, f.name) for f in dataclasses.fields(PreparedLaunch)}
    fields.update(target=target, child_env=child_env, argv=argv, front=front)
    fields.update(vllm_target=vllm_target, closed=False)
    return ReplicaLaunch(**fields, replica_dir=replica_dir)


def _placed(
    prepared: PreparedLaunch, port: int, replica_dir: str
) -> tuple[tuple[str, ...], Front | None, HealthTarget | None]:
    """vLLM's argv, the gateway and vLLM's own target for a replica on ``port``."""
    if prepared.front is None:  # direct mode: vLLM itself listens on the port
        return swap_option(prepared.argv, "--port=", str(port), "vLLM command"), None, None
    uds = socket_path(replica_dir)
    argv = swap_option(prepared.argv, "--uds=", uds, "vLLM command")
    front_argv = swap_option(prepared.front.argv, "--port=", str(port), "gateway command")
    front_argv = swap_option(front_argv, "--upstream-uds=", uds, "gateway command")
    public = HealthTarget(host=prepared.front.target.host, port=port)
    return argv, Front(front_argv, prepared.front.env, public), HealthTarget(uds=uds)
