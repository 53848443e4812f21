"""Helpers for the scale-out tests: a kiln.toml on a PostgreSQL database, replica processes.

``pg_config`` writes a kiln.toml whose ``[server] database`` is a PostgreSQL
URL (tests/pg_server.py), whatever ``KILN_TEST_BACKEND`` says: these tests are
about several processes sharing one server.  ``replicas`` starts N real
``kiln serve`` processes on it (loopback, free ports).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from tests.api.support import ServerProcess, toml_str
from tests.pg_server import PASSWORD_ENV


def pg_config(
    directory: Path,
    *,
    url: str,
    student: Path,
    name: str = "kiln.toml",
    server: Mapping[str, Any] | None = None,
    jobs: Mapping[str, Any] | None = None,
) -> Path:
    """A kiln.toml in ``directory`` on the PostgreSQL database ``url`` (state_dir there)."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = ["[server]", f"database = {toml_str(url)}",
             f"database_password_env = {toml_str(PASSWORD_ENV)}",
             f"state_dir = {toml_str(directory)}"]  # fmt: skip
    lines += [_line(key, value) for key, value in (server or {}).items()]
    lines += ["", "[student]", f"model_path = {toml_str(student)}", ""]
    if jobs:
        lines += ["[jobs]", *(_line(key, value) for key, value in jobs.items()), ""]
    path = directory / name
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _line(key: str, value: Any) -> str:
    if isinstance(value, str | Path):
        return f"{key} = {toml_str(value)}"
    if isinstance(value, bool):
        return f"{key} = {str(value).lower()}"
    if isinstance(value, list | tuple):
        return f"{key} = [{', '.join(toml_str(v) for v in value)}]"
    return f"{key} = {value}"


@contextmanager
def replicas(configs: list[Path], logs: Path) -> Iterator[list[ServerProcess]]:
    """One ``kiln serve`` per config, all answering /health; killed on exit."""
    logs.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        started = [
            stack.enter_context(ServerProcess(config, logs / f"replica-{i}.log"))
            for i, config in enumerate(configs)
        ]
        for process in started:
            process.wait_ready()
        yield started
