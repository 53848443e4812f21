"""What one local launch is made of: the launch spec, the launcher's protocols, the child env.

Owns ``LaunchSpec`` (what ``prepare`` receives), the ``Prepare`` callable and
its default (``launcher.launch.prepare_launch``), the protocols of a prepared
and a running teacher, how a profile becomes launcher flags (host pinned to
loopback) and the child environment (the server's, minus credential variables
and ``KILN_*``), and reading back the identity the launcher prepared.

Pure apart from ``library_prepare``, which imports the launcher when first
used.  Imports the standard library, ``kiln_registry.config.settings``,
``kiln_registry.domain.errors``, the identity layer and the launcher policy;
never FastAPI, the database, the teachers or API layers, or torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from kiln_registry.config.local_replicas import device_index
from kiln_registry.config.settings import LocalTeacherConfig
from kiln_registry.domain.errors import RELEASE_NOTE, IdentityMismatch, KilnError
from kiln_registry.identity.document import TeacherIdentity, same_identity
from kiln_registry.launcher.policy import LauncherRequest

if TYPE_CHECKING:
    from kiln_registry.launcher.launch import PreparedLaunch

LOOPBACK_HOST = "127.0.0.1"
LAUNCHER_PREFIX = "KILN_"
DEVICE_VARIABLE = "CUDA_VISIBLE_DEVICES"

StatusSink = Callable[[str], None]


def prepared_identity(fingerprint: str) -> TeacherIdentity | None:
    """The identity of a fingerprint the launcher produced, or None if it does not decode."""
    from kiln_registry.identity.fingerprint import verify_fingerprint

    try:
        return verify_fingerprint(fingerprint)
    except KilnError:
        return None


def identity_change(expected: TeacherIdentity, found: TeacherIdentity | None) -> str:
    """Which identity fields differ between the stored and the launcher's identity."""
    from kiln_registry.identity.diff import mismatch_detail

    if found is None:
        return "the stored fingerprint could not be compared field by field"
    return mismatch_detail(expected, found)


class RunningTeacher(Protocol):
    """A spawned teacher (the launcher's ``LaunchedTeacher``)."""

    @property
    def fingerprint(self) -> str: ...

    @property
    def url(self) -> str: ...

    def wait_ready(self, deadline: float) -> None: ...

    def stop(self) -> None: ...


class PreparedTeacher(Protocol):
    """A staged launch that has not spawned yet (the launcher's ``PreparedLaunch``).

    ``spawn_replica(index, port, environ)`` (replicas > 1) starts one more process
    group of the same snapshot on ``port`` with ``environ`` added to the child's
    environment; stopping such a replica leaves the snapshot to ``close()``.
    """

    @property
    def fingerprint(self) -> str: ...

    def spawn(self) -> RunningTeacher: ...

    def spawn_replica(
        self, index: int, port: int, environ: Mapping[str, str]
    ) -> RunningTeacher: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class LaunchSpec:
    """What ``prepare`` receives: the parsed request, the child environment, a progress hook."""

    profile: str
    request: LauncherRequest
    environ: Mapping[str, str] = field(repr=False)
    progress: Callable[[str, int, int], None] = field(repr=False)


Prepare = Callable[[LaunchSpec], PreparedTeacher]


def library_prepare(spec: LaunchSpec) -> PreparedTeacher:
    """The real path: ``launcher.launch.prepare_launch`` (imported when first used)."""
    from kiln_registry.launcher.launch import prepare_launch

    return LibraryPrepared(prepare_launch(spec.request, spec.environ, progress=spec.progress))


@dataclass(frozen=True)
class LibraryPrepared:
    """The launcher's ``PreparedLaunch``, with replicas from ``launcher.replica_launch``."""

    launch: PreparedLaunch

    @property
    def fingerprint(self) -> str:
        return self.launch.fingerprint

    def spawn(self) -> RunningTeacher:
        return self.launch.spawn()

    def spawn_replica(self, index: int, port: int, environ: Mapping[str, str]) -> RunningTeacher:
        from kiln_registry.launcher.replica_launch import replica_launch

        replica = replica_launch(self.launch, index, port, environ)
        try:
            return replica.spawn()
        except BaseException:
            replica.close()
            raise

    def close(self) -> None:
        self.launch.close()


def served_model_id(profile_name: str, profile: LocalTeacherConfig) -> str:
    """The profile's ``served_model_id``, else the profile name."""
    return profile.served_model_id or profile_name


def launcher_flags(
    profile_name: str, profile: LocalTeacherConfig
) -> tuple[dict[str, str], list[str]]:
    """The ``kiln-teacher`` flags of a profile and its vLLM options (host pinned to loopback).

    Handed to ``launcher.policy.request_from_flags`` as they are: no command
    line is written and parsed back.
    """
    flags = {
        "model-path": str(profile.model_path),
        "snapshot-root": str(profile.snapshot_root),
        "cache-root": str(profile.cache_root),
        "served-model-id": served_model_id(profile_name, profile),
        "max-top-k": str(profile.max_top_k),
        "max-model-len": str(profile.max_model_len),
    }
    if profile.adapter_path is not None:
        flags["adapter-path"] = str(profile.adapter_path)
    if profile.max_prompt_logprob_candidates is not None:
        flags["max-prompt-logprob-candidates"] = str(profile.max_prompt_logprob_candidates)
    if profile.max_provenance_read_mib_per_second is not None:
        flags["max-provenance-read-mib-per-second"] = str(
            profile.max_provenance_read_mib_per_second
        )
    vllm = [f"--host={LOOPBACK_HOST}", f"--port={profile.first_port}", *profile.vllm_args]
    return flags, vllm


def replica_environment(profile: LocalTeacherConfig, index: int) -> dict[str, str]:
    """What replica ``index`` adds to the child environment: its GPU, if ``devices`` names one.

    Placement, not identity: the identity is composed once, at prepare, from the
    registry's environment (which must not set ``CUDA_VISIBLE_DEVICES`` then).
    """
    if not profile.devices:
        return {}
    return {DEVICE_VARIABLE: str(device_index(profile.devices[index]))}


def launch_environment(environ: Mapping[str, str], secret_names: frozenset[str]) -> dict[str, str]:
    """The server's environment without credential variables and ``KILN_*``."""
    return {
        name: value
        for name, value in environ.items()
        if name not in secret_names and not name.startswith(LAUNCHER_PREFIX)
    }


def check_relaunch_identity(
    alias: str, profile: str, prepared: PreparedTeacher, expected: TeacherIdentity | None
) -> None:
    """A relaunch's prepared identity must be the stored one, before anything spawns."""
    if expected is None:
        return
    found = prepared_identity(prepared.fingerprint)
    if found is None or not same_identity(expected, found):
        raise IdentityMismatch(
            f"relaunching {alias!r} from profile {profile!r} produced a "
            "different teacher identity than the stored one; " + identity_change(expected, found),
            rule="local.relaunch_identity",
            hint="restore the model, runtime and profile it was registered with, or "
            f"delete the alias and register it again {RELEASE_NOTE}",
        )


@contextmanager
def naming_replica(idx: int, count: int) -> Iterator[None]:
    """A replica's failure names its index (only when there are several)."""
    try:
        yield
    except KilnError as exc:
        if count > 1:
            exc.message = f"replica {idx}: {exc.message}"
            exc.args = (exc.message,)
        raise
