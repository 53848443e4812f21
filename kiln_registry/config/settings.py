"""kiln.toml: frozen, fail-closed configuration models and their loader.

Owns the file format (sections ``[server]``, ``[student]``,
``[teachers.credentials.<id>]``, ``[teachers.local.<profile>]``, ``[jobs]``,
plus every section and key of a Kiln server's own kiln.toml, whose models
live in ``kiln_registry.config.kiln``), ``load_config`` (bounded read,
``tomllib``, one ``ConfigError`` naming every bad key path and the file) and
``check_startup_environment``.  A key neither Kiln nor this project knows is
refused; relative paths of registry keys resolve against the file's
directory, Kiln's ``[model]`` paths as Kiln reads them.  Without
``[student]`` the student is Kiln's ``[model] path`` (with its
``adapter_dir`` and served model id).  Nothing is read at import time:
defaults that depend on the user (the database path) are computed when a
model is built.

Imports: standard library, pydantic, platformdirs, ``kiln_registry.domain.errors``,
``kiln_registry.config.kiln``, ``kiln_registry.config.errors``,
``kiln_registry.credentials``, ``kiln_registry.identity.strict_read`` (the bounded
read) and the pure ``kiln_registry.launcher.policy``; never the database,
probe, API or FastAPI.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import platformdirs
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from kiln_registry.config.access import check_tls_keys
from kiln_registry.config.edge import ServerEdgeKeys
from kiln_registry.config.errors import validation_error
from kiln_registry.config.guard import JobsGuardKeys, ServerGuardKeys
from kiln_registry.config.kiln import KilnSections, KilnServerKeys, kiln_defaults
from kiln_registry.config.local_replicas import (
    CUDA_DEVICE_RE,
    MAX_LOCAL_REPLICAS,
    check_replica_placement,
)
from kiln_registry.credentials.origin import canonical_origin
from kiln_registry.credentials.secrets import (
    ENV_NAME_PATTERN,
    MAX_ENV_NAME_LENGTH,
    check_environment_variable,
    is_valid_env_name,
)
from kiln_registry.db.location import PostgresDatabase, database_value
from kiln_registry.domain.errors import ConfigError, KilnError, PolicyError
from kiln_registry.identity.strict_read import FileProblem, Problem, read_regular_file
from kiln_registry.launcher.policy import classify_vllm_options

MAX_CONFIG_BYTES = 1024 * 1024
MAX_PATH_CHARS = 4096
MAX_ENTRIES = 256
BASE_DIR_CONTEXT = "base_dir"

_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_DEVICE_RE = re.compile(r"cpu|cuda:(?:0|[1-9][0-9]{0,3})")
# A served model id (also the local launcher's adapter names: ``local.student``).
SERVED_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,255}")
_HOST_RE = re.compile(r"[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?")
_FROZEN = ConfigDict(frozen=True, extra="forbid")


def default_database_path() -> Path:
    """``user_data_dir("kiln-registry")/registry.db``, computed when asked."""
    return Path(platformdirs.user_data_dir("kiln-registry")) / "registry.db"


def _path_text(value: object) -> object:
    if not isinstance(value, str):
        return value  # pydantic reports the type error
    if not value or len(value) > MAX_PATH_CHARS or "\x00" in value:
        raise ValueError(f"must be a non-empty path of at most {MAX_PATH_CHARS} characters")
    if value.startswith("~"):
        raise ValueError("'~' is not expanded; use an absolute path or one relative to the file")
    return value


def _resolve_path(value: Path, info: ValidationInfo) -> Path:
    if value.is_absolute():
        return value
    context = info.context if isinstance(info.context, Mapping) else {}
    base = context.get(BASE_DIR_CONTEXT)
    if not isinstance(base, Path):
        raise ValueError("a relative path needs a config file to resolve against")
    return base / value


def _check_id(value: str) -> str:
    if not _ID_RE.fullmatch(value):
        raise ValueError("an id must be 1..64 characters of A-Z a-z 0-9 _ -")
    return value


def _check_origin(value: str) -> str:
    try:
        return canonical_origin(value)
    except KilnError as exc:
        raise ValueError(str(exc)) from None


def _check_env_name(value: str) -> str:
    if not is_valid_env_name(value):
        # Never echo the value: it may be the secret itself, pasted by mistake.
        raise ValueError(
            f"must be the NAME of an environment variable ({ENV_NAME_PATTERN}, "
            f"at most {MAX_ENV_NAME_LENGTH} characters), never the secret"
        )
    return value


def _check_host(value: str) -> str:
    if ":" in value:
        try:
            ipaddress.IPv6Address(value)
        except ValueError:
            raise ValueError("must be a host name or an IP address without brackets") from None
        return value
    if not _HOST_RE.fullmatch(value) or ".." in value:
        raise ValueError("must be a lowercase host name or IPv4 address, like 127.0.0.1")
    return value


def _check_device(value: str) -> str:
    if not _DEVICE_RE.fullmatch(value):
        raise ValueError("a device is 'cpu' or 'cuda:<index>'")
    return value


def _check_cuda_device(value: str) -> str:
    if not CUDA_DEVICE_RE.fullmatch(value):
        raise ValueError("a replica's device is 'cuda:<index>' (its process sees only that GPU)")
    return value


def _check_label(value: str) -> str:
    if not value.strip() or len(value) > 256 or any(ord(c) < 0x20 or c == "\x7f" for c in value):
        raise ValueError("must be 1..256 characters without control characters")
    return value


def _check_served_id(value: str) -> str:
    if not SERVED_ID_RE.fullmatch(value):
        raise ValueError("must match ^[A-Za-z0-9][A-Za-z0-9._/-]*$ (at most 256 characters)")
    return value


ConfigPath = Annotated[Path, BeforeValidator(_path_text), AfterValidator(_resolve_path)]
DatabaseSetting = Annotated[ConfigPath | PostgresDatabase, BeforeValidator(database_value)]
EntryId = Annotated[str, AfterValidator(_check_id)]
Port = Annotated[StrictInt, Field(ge=1, le=65535)]


class ServerConfig(KilnServerKeys, ServerGuardKeys, ServerEdgeKeys):
    """``[server]``: where the registry listens and keeps its state, and Kiln's server keys."""

    model_config = _FROZEN

    host: Annotated[str, AfterValidator(_check_host)] = "127.0.0.1"
    port: Port = 8420
    database: DatabaseSetting = Field(default_factory=default_database_path)
    database_password_env: Annotated[str, AfterValidator(_check_env_name)] | None = None
    state_dir: ConfigPath | None = None
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["info", "debug", "warning"] = "info"
    legacy_registry: ConfigPath | None = None
    probe_timeout_s: Annotated[StrictFloat, Field(gt=0, le=600)] = 10.0
    teacher_ca_file: ConfigPath | None = None
    local_launch_deadline_s: Annotated[StrictFloat, Field(gt=0, le=86400)] | None = None
    # Access control and TLS (issue 15; rules in config.access).
    auth: Literal["required", "off"] | None = None
    metrics_public: StrictBool = False
    tls_cert_file: ConfigPath | None = None
    tls_key_file: ConfigPath | None = None
    tls_client_ca_file: ConfigPath | None = None

    @model_validator(mode="after")
    def _tls_keys(self) -> ServerConfig:
        check_tls_keys(self)
        return self

    @model_validator(mode="after")
    def _database_keys(self) -> ServerConfig:
        if isinstance(self.database, PostgresDatabase):
            if self.state_dir is None:
                raise ValueError(
                    "state_dir is required with a PostgreSQL database: name the directory "
                    "for the corpus-signing key, job results and local-teacher state"
                )
        elif self.database_password_env is not None:
            raise ValueError("database_password_env applies only to a PostgreSQL database")
        return self

    @property
    def sqlite_path(self) -> Path | None:
        """The SQLite file, or None when the database is PostgreSQL."""
        return self.database if isinstance(self.database, Path) else None

    @property
    def state_path(self) -> Path:
        """Where the registry keeps files: ``state_dir``, else the SQLite file's folder."""
        if self.state_dir is not None:
            return self.state_dir
        assert isinstance(self.database, Path)  # _database_keys
        return self.database.parent


class StudentConfig(BaseModel):
    """``[student]``: the loaded student model every teacher must match.

    ``adapter_dir`` (default ``<model_path>/adapters``) holds the adapters a
    ``kind: "local"`` teacher may wear; ``served_model_id`` names the student
    as Kiln serves it.  Filled from Kiln's ``[model]`` when absent.
    """

    model_config = _FROZEN

    model_path: ConfigPath
    adapter_dir: ConfigPath | None = None
    served_model_id: Annotated[str, AfterValidator(_check_label)] | None = None


class CredentialConfig(BaseModel):
    """``[teachers.credentials.<id>]``: an exact HTTPS origin and a variable name."""

    model_config = _FROZEN

    origin: Annotated[str, AfterValidator(_check_origin)]
    api_key_env: Annotated[str, AfterValidator(_check_env_name)]


class LocalTeacherConfig(BaseModel):
    """``[teachers.local.<profile>]``: a launch profile for a loopback vLLM teacher."""

    model_config = _FROZEN

    model_path: ConfigPath
    adapter_path: ConfigPath | None = None
    snapshot_root: ConfigPath
    cache_root: ConfigPath
    served_model_id: Annotated[str, AfterValidator(_check_served_id)] | None = None
    max_top_k: Annotated[StrictInt, Field(ge=1, le=65536)]
    max_model_len: Annotated[StrictInt, Field(ge=1, le=16_777_216)]
    max_prompt_logprob_candidates: Annotated[StrictInt, Field(ge=1, le=1_000_000)] | None = None
    port: Port | None = None
    max_provenance_read_mib_per_second: Annotated[StrictInt, Field(ge=1, le=16384)] | None = None
    vllm_args: Annotated[tuple[str, ...], Field(max_length=MAX_ENTRIES)] = ()
    ready_deadline_s: Annotated[StrictFloat, Field(gt=0, le=86400)] = 300.0
    # Issue 17: N vLLM processes of one prepared snapshot, one per port (and device).
    replicas: Annotated[StrictInt, Field(ge=1, le=MAX_LOCAL_REPLICAS)] = 1
    ports: Annotated[tuple[Port, ...], Field(max_length=MAX_LOCAL_REPLICAS)] = ()
    devices: Annotated[
        tuple[Annotated[str, AfterValidator(_check_cuda_device)], ...],
        Field(max_length=MAX_LOCAL_REPLICAS),
    ] = ()

    @model_validator(mode="after")
    def _candidate_ceiling(self) -> LocalTeacherConfig:
        ceiling = self.max_prompt_logprob_candidates
        if ceiling is not None and ceiling > self.max_model_len * (self.max_top_k + 1):
            raise ValueError(
                "max_prompt_logprob_candidates exceeds max_model_len * (max_top_k + 1)"
            )
        check_replica_placement(self.replicas, self.port, self.ports, self.devices)
        return self

    def replica_ports(self) -> tuple[int, ...]:
        """One loopback port per replica (``port`` alone, else ``ports``)."""
        return self.ports or ((self.port,) if self.port is not None else ())

    @property
    def first_port(self) -> int:
        """Replica 0's port (the alias's ``url``)."""
        return self.replica_ports()[0]


class TeachersConfig(BaseModel):
    """``[teachers]``: remote credentials and local launch profiles."""

    model_config = _FROZEN

    credentials: Annotated[dict[EntryId, CredentialConfig], Field(max_length=MAX_ENTRIES)] = {}
    local: Annotated[dict[EntryId, LocalTeacherConfig], Field(max_length=MAX_ENTRIES)] = {}


class JobsConfig(JobsGuardKeys):
    """``[jobs]``: the distillation job queue and its workers."""

    model_config = _FROZEN

    workers: Annotated[StrictInt, Field(ge=1, le=16)] = 1
    concurrency: Annotated[StrictInt, Field(ge=1, le=64)] = 4
    devices: Annotated[
        tuple[Annotated[str, AfterValidator(_check_device)], ...],
        Field(min_length=1, max_length=64),
    ] = ("cpu",)
    corpus_root: ConfigPath | None = None
    result_root: ConfigPath | None = None
    cache: StrictBool = True
    # Issue 26: where scoring jobs with "output": "kiln-logit-cache-v3" publish Kiln's cache.
    logit_cache_root: ConfigPath | None = None
    # Issue 17: a claim is a lease renewed every heartbeat; another worker may take the job
    # over ``lease_timeout_s`` after the last renewal.  ``kiln serve`` runs workers unless false.
    lease_heartbeat_s: Annotated[StrictFloat, Field(gt=0, le=600)] = 5.0
    lease_timeout_s: Annotated[StrictFloat, Field(gt=0, le=3600)] = 30.0
    embedded_workers: StrictBool = True

    @model_validator(mode="after")
    def _unique_devices(self) -> JobsConfig:
        if len(set(self.devices)) != len(self.devices):
            raise ValueError("devices must not repeat a device")
        return self

    @model_validator(mode="after")
    def _lease_timing(self) -> JobsConfig:
        if self.lease_timeout_s <= 2 * self.lease_heartbeat_s:
            raise ValueError(
                f"lease_timeout_s ({self.lease_timeout_s:g}) must be more than twice"
                f" lease_heartbeat_s ({self.lease_heartbeat_s:g}), so one late renewal does"
                " not hand a live job to another worker; raise the timeout or lower the heartbeat"
            )
        return self


class KilnConfig(KilnSections):
    """The whole of kiln.toml: the registry's tables and Kiln's (see ``config.kiln``)."""

    model_config = _FROZEN

    server: ServerConfig = Field(default_factory=ServerConfig)
    student: StudentConfig
    teachers: TeachersConfig = Field(default_factory=TeachersConfig)
    jobs: JobsConfig = Field(default_factory=JobsConfig)

    @model_validator(mode="before")
    @classmethod
    def _from_kiln_sections(cls, data: Any) -> Any:
        return kiln_defaults(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _one_student(self) -> KilnConfig:
        kiln_path = self.model.kiln_model_dir()
        if kiln_path is not None and kiln_path != self.student.model_path.absolute():
            raise ValueError(
                f"[student] model_path {self.student.model_path} and Kiln's [model] path"
                f" {kiln_path} name different models; keep one, or make them equal"
            )
        return self

    def student_adapter_dir(self) -> Path:
        """Kiln's rule: ``adapter_dir`` if set, else ``<student model>/adapters``."""
        return self.student.adapter_dir or self.student.model_path / "adapters"

    @model_validator(mode="after")
    def _distinct_ports(self) -> KilnConfig:
        seen = {self.server.port: "server.port"}
        for name, profile in sorted(self.teachers.local.items()):
            for port in profile.replica_ports():  # every replica's port is its own
                other = seen.setdefault(port, f"teachers.local.{name}.port")
                if other != f"teachers.local.{name}.port":
                    raise ValueError(f"teachers.local.{name}.port repeats the port of {other}")
        return self

    def secret_env_names(self) -> frozenset[str]:
        """The variable names whose values must be redacted from logs and bodies."""
        return frozenset(c.api_key_env for c in self.teachers.credentials.values())


def _read_bounded(path: Path) -> bytes:
    """The file's bytes: a regular file of at most ``MAX_CONFIG_BYTES`` (symlinks followed)."""

    def refuse(problem: FileProblem) -> ConfigError:
        if problem.kind is Problem.NOT_REGULAR:
            return ConfigError(f"{path}: not a regular file", rule="config.not_regular")
        if problem.kind in (Problem.TOO_LARGE, Problem.GREW):
            return ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes", rule="config.size")
        return ConfigError(f"{path}: cannot open ({problem.detail})", rule="config.open")

    data, _ = read_regular_file(path, limit=MAX_CONFIG_BYTES, refuse=refuse, follow_symlinks=True)
    return data


def _parse_toml(path: Path, data: bytes) -> dict[str, Any]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 (byte {exc.start})", rule="config.encoding") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}", rule="config.toml") from None


def check_vllm_args(profile: str, tokens: Sequence[str]) -> None:
    """Check a local profile's extra vLLM options with the launcher option policy.

    Also refuses ``--api-key`` (a secret must never sit in kiln.toml) and
    ``--host``/``--port`` (the profile's ``port`` key owns transport).
    """
    key = f"teachers.local.{profile}.vllm_args"
    try:
        options = classify_vllm_options(tokens)
    except PolicyError as exc:
        raise ConfigError(f"{key}: {exc.message}", rule=exc.rule) from None
    if options.api_key_present:
        raise ConfigError(
            f"{key}: --api-key would store a secret in kiln.toml", rule="config.secret_in_file"
        )
    if options.host is not None or options.port is not None:
        raise ConfigError(
            f"{key}: set the port with teachers.local.{profile}.port; the host is always loopback",
            rule="config.launcher_transport",
        )


def _check_student(path: Path, student: StudentConfig) -> None:
    model = student.model_path
    if not model.is_dir():
        raise ConfigError(
            f"{path}: student.model_path {model} is not a directory", rule="config.student"
        )
    for name in ("config.json", "tokenizer.json"):
        if not (model / name).is_file():
            raise ConfigError(
                f"{path}: student.model_path {model} has no {name}", rule="config.student"
            )


def load_config(path: str | os.PathLike[str]) -> KilnConfig:
    """Read, parse and validate a kiln.toml; any problem is one ``ConfigError``."""
    file = Path(path)
    data = _parse_toml(file, _read_bounded(file))
    base_dir = file.absolute().parent
    try:
        config = KilnConfig.model_validate(data, context={BASE_DIR_CONTEXT: base_dir})
    except ValidationError as exc:
        raise validation_error(file, exc, KilnConfig) from None
    _check_student(file, config.student)
    for profile, local in sorted(config.teachers.local.items()):
        try:
            check_vllm_args(profile, local.vllm_args)
        except ConfigError as exc:
            raise ConfigError(f"{file}: {exc.message}", rule=exc.rule) from None
    return config


def check_startup_environment(config: KilnConfig, environ: Mapping[str, str]) -> None:
    """Refuse to start unless every credential's variable is set and usable.

    Names each failing credential and variable, never a value.
    """
    problems: list[str] = []
    rules: set[str | None] = set()
    if config.server.database_password_env is not None:
        try:
            check_environment_variable(config.server.database_password_env, environ)
        except KilnError as exc:
            problems.append(f"server.database_password_env: {exc.message}")
            rules.add(exc.rule)
    for credential_id, credential in sorted(config.teachers.credentials.items()):
        try:
            check_environment_variable(credential.api_key_env, environ)
        except KilnError as exc:
            problems.append(f"teachers.credentials.{credential_id}: {exc.message}")
            rules.add(exc.rule)
    if problems:
        raise ConfigError(
            "; ".join(problems),
            rule=rules.pop() if len(rules) == 1 else "secret.startup",
            hint="export each api_key_env (and database_password_env) variable in the "
            "server's environment",
        )
