"""kiln.toml: ``load_config`` (bounded read, TOML, validation) and the start-up checks.

``load_config`` reads the file (a regular file of at most ``MAX_CONFIG_BYTES``,
``identity.strict_read``), parses it with ``tomllib`` and validates it with the
models of ``config.settings``: any problem is one ``ConfigError`` naming every
bad key path (unknown keys included: ``config.errors.validation_error``) and
the file.  It then checks the student's model directory and each local
profile's ``vllm_args`` with the reviewed option policy
(``kiln_registry.vllm_options``).  ``check_startup_environment`` refuses to
start while a secret's variable is missing.

Imports: standard library, pydantic, ``kiln_registry.domain.errors``, the sibling
``config`` modules, ``credentials.secrets``, ``identity.strict_read`` and
``vllm_options.options``; never the launcher, database, probe, API or FastAPI.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kiln_registry.config.errors import validation_error
from kiln_registry.config.settings import BASE_DIR_CONTEXT, KilnConfig, StudentConfig
from kiln_registry.credentials.secrets import check_environment_variable
from kiln_registry.domain.errors import ConfigError, KilnError, PolicyError
from kiln_registry.identity.strict_read import FileProblem, Problem, read_regular_file
from kiln_registry.vllm_options.options import classify_vllm_options

MAX_CONFIG_BYTES = 1024 * 1024


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
