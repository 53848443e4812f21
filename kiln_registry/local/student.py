"""Kind ``local`` in Kiln's shape: the loaded student, optionally wearing a named LoRA adapter.

Kiln (``crates/kiln-server/src/api/teachers.rs``) reads ``{"alias", "kind":
"local", "adapter"}`` as "the model this server has loaded, wearing the LoRA
directory ``<adapter dir>/<adapter>``"; ``model_id`` is ignored and
``provider``/``url``/``credential_id`` are refused.  Kiln's adapter directory
is ``[model] adapter_dir``, else ``<model path>/adapters`` (``main.rs``); an
adapter name is refused when empty, ``.``/``..``, containing ``/``, ``\\`` or
``..``, or absolute (``api/adapters.rs``, code ``invalid_adapter_name``), and a
missing directory is refused with "train or upload it first".

Here the student is served by the embedded launcher: this module turns the
student (plus adapter) into a generated launch profile, ``student:<alias>``,
with Kiln's own bounds for a local teacher (``teacher_identity.rs``:
``max_top_k = min(256, vocab)``, ``max_model_len = min(max_position_embeddings,
4096)``), a free loopback port, and snapshot/cache roots beside the database.
The served model id is the adapter name (the launcher serves a static
adapter under its name, which the identity's ``adapter.name`` must equal),
else the student's served id (Kiln's rule: the model directory's last
component, lower-cased, plus ``-kiln``).

Imports the standard library, ``kiln_registry.config.settings``, ``errors``, the
launcher's pure root rules and ``model.files``; never FastAPI or the database.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from kiln_registry.config.settings import SERVED_ID_RE, KilnConfig, LocalTeacherConfig
from kiln_registry.domain.errors import InvalidAdapterName, LauncherError, RegistrationInvalid
from kiln_registry.domain.text import quoted
from kiln_registry.launcher.roots import check_distinct_roots
from kiln_registry.local.process_groups import GENERATED_PREFIX
from kiln_registry.model.files import read_json_object

KILN_LOCAL_MAX_TOP_K = 256  # teacher_identity.rs MAX_COMPLETION_PROMPT_LOGPROBS
KILN_LOCAL_MAX_MODEL_LEN = 4096  # teacher_identity.rs MAX_COMPLETION_PROMPT_TOKENS
STATE_DIR_NAME = "local-teachers"
PROFILE_PREFIX = GENERATED_PREFIX  # not a valid [teachers.local.<id>] name: no collision
MAX_PORT_TRIES = 32
_HINT_ADAPTER = "train or upload it first, or register without 'adapter' for the bare student"


def profile_name(alias: str) -> str:
    """The generated profile name of a Kiln-shape local alias."""
    return PROFILE_PREFIX + alias


def adapter_root(config: KilnConfig) -> Path:
    """The student's adapter directory: ``adapter_dir`` if configured, else ``<model>/adapters``."""
    return config.student_adapter_dir()


def check_adapter_name(name: str) -> None:
    """Kiln's adapter-name rules (``api/adapters.rs``), refused with Kiln's code."""
    if (
        not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or ".." in name
        or os.path.isabs(name)
    ):
        raise InvalidAdapterName(
            f"invalid adapter name {quoted(name, 64)}: a directory name under the student's adapter"
            " directory (no '/', '\\', '..')",
            rule="teacher.local_adapter_name",
        )


def adapter_problem(config: KilnConfig, name: str) -> str | None:
    """Why ``name`` is not usable now (Kiln re-checks this at every read), or None."""
    path = adapter_root(config) / name
    if not path.is_dir():
        return f"teacher adapter `{name}` not found at {path} — {_HINT_ADAPTER}"
    return None


def adapter_path(config: KilnConfig, name: str) -> Path:
    check_adapter_name(name)
    problem = adapter_problem(config, name)
    if problem is not None:
        raise RegistrationInvalid(problem, rule="teacher.local_adapter_missing")
    return adapter_root(config) / name


def student_served_id(config: KilnConfig) -> str:
    """The student's served model id: configured, else ``<model dir name, lower>-kiln``."""
    served = config.student.served_model_id or f"{config.student.model_path.name.lower()}-kiln"
    if not SERVED_ID_RE.fullmatch(served):
        raise RegistrationInvalid(
            f"the student's served model id {quoted(served, 64)} is not a valid served model id"
            " (^[A-Za-z0-9][A-Za-z0-9._/-]*$)",
            rule="teacher.local_served_id",
            hint="rename the student's model directory, or register a [teachers.local.<profile>]",
        )
    return served


def _served_for(config: KilnConfig, adapter: str | None) -> str:
    if adapter is None:
        return student_served_id(config)
    if not SERVED_ID_RE.fullmatch(adapter):
        raise RegistrationInvalid(
            f"adapter name {quoted(adapter, 64)} cannot be a served model id"
            " (^[A-Za-z0-9][A-Za-z0-9._/-]*$): the launcher serves the adapter under its name",
            rule="teacher.local_adapter_name",
        )
    return adapter


def _max_model_len(config: KilnConfig) -> int:
    _, doc = read_json_object(config.student.model_path / "config.json", rule="model.config")
    value = doc.get("max_position_embeddings")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return min(value, KILN_LOCAL_MAX_MODEL_LEN)
    return KILN_LOCAL_MAX_MODEL_LEN


def state_roots(config: KilnConfig) -> tuple[Path, Path]:
    """``(snapshot_root, cache_root)`` beside the database, created with mode 0700."""
    base = config.server.state_path / STATE_DIR_NAME
    roots = (base / "snapshots", base / "cache")
    for path in (base, *roots):
        path.mkdir(mode=0o700, exist_ok=True)
    return roots


def free_loopback_port(config: KilnConfig) -> int:
    """A port free on 127.0.0.1 now, other than the server's and every profile's."""
    taken = {config.server.port, *(p.port for p in config.teachers.local.values())}
    for _ in range(MAX_PORT_TRIES):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in taken:
            return port
    raise RegistrationInvalid("no free loopback port for the local teacher", rule="local.port")


def student_profile(
    config: KilnConfig, adapter: str | None, *, port: int, width: int
) -> LocalTeacherConfig:
    """The generated launch profile of the student (plus ``adapter``), refused with a 400."""
    path = adapter_path(config, adapter) if adapter is not None else None
    snapshots, caches = state_roots(config)
    try:
        check_distinct_roots(config.student.model_path, path, snapshots, caches)
    except LauncherError as exc:
        raise RegistrationInvalid(
            f"the student's adapter cannot be launched: {exc.message}",
            rule="teacher.local_roots",
            hint="set the student's adapter_dir outside its model directory",
        ) from None
    return LocalTeacherConfig.model_validate(
        {
            "model_path": str(config.student.model_path),
            "adapter_path": None if path is None else str(path),
            "snapshot_root": str(snapshots),
            "cache_root": str(caches),
            "served_model_id": _served_for(config, adapter),
            "max_top_k": min(KILN_LOCAL_MAX_TOP_K, width),
            "max_model_len": _max_model_len(config),
            "port": port,
        }
    )
