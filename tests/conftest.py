"""Session-wide tiny models and the environment isolation every test gets.

The builders live in ``kiln_registry.testing.tiny_models``; helpers in
``tests/helpers.py``.  Models are built once per session under
``tmp_path_factory``; tests must not modify them (copy first).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln_registry.testing.tiny_models import TinyModel, build_peft_adapter, build_tiny_llama
from tests.helpers import free_port as _free_port
from tests.pg_server import (
    INSTALL_HINT,
    PostgresServer,
    PostgresUnavailable,
    selected_backend,
    set_active_server,
)

CLEARED_PREFIXES = ("KILN_", "VLLM_", "HF_")
CLEARED_NAMES = frozenset(
    name for base in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
    for name in (base, base.upper())
)  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "secret_env(*names): environment variables cleared before and after the test"
    )
    try:
        selected_backend()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


@pytest.fixture(autouse=True)
def _isolated_environment(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Clear KILN_*, VLLM_*, HF_*, proxy and test-marked secret variables."""
    secret: set[str] = set()
    for marker in request.node.iter_markers("secret_env"):
        secret.update(str(name) for name in marker.args)
    for name in list(os.environ):
        if name.startswith(CLEARED_PREFIXES) or name in CLEARED_NAMES or name in secret:
            monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A real PostgreSQL on 127.0.0.1 for the session (tests/pg_server.py); fails, never skips."""
    try:
        server = PostgresServer.start()
    except PostgresUnavailable as exc:
        hint = "" if INSTALL_HINT in str(exc) else f" ({INSTALL_HINT})"
        pytest.fail(f"PostgreSQL could not start: {exc}{hint}", pytrace=False)
    os.environ[server.password_env] = server.password
    set_active_server(server)
    try:
        yield server
    finally:
        set_active_server(None)
        os.environ.pop(server.password_env, None)
        server.stop()


@pytest.fixture
def pg_database(postgres_server: PostgresServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh empty database's URL (role kiln, no password in it), dropped after the test."""
    url = postgres_server.new_database(request.node.name)
    yield url
    postgres_server.drop_database(url)


@pytest.fixture(scope="session", autouse=True)
def _backend_server(request: pytest.FixtureRequest) -> None:
    """Under KILN_TEST_BACKEND=postgres the server starts before every other fixture
    (module-scoped ones write configs too: tests/pg_server.database_settings)."""
    if selected_backend() == "postgres":
        request.getfixturevalue("postgres_server")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under KILN_TEST_BACKEND=postgres, tests marked ``sqlite_only`` are deselected."""
    if selected_backend() != "postgres":
        return
    dropped = [item for item in items if item.get_closest_marker("sqlite_only") is not None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item.get_closest_marker("sqlite_only") is None]


@pytest.fixture(autouse=True)
def _test_backend(
    request: pytest.FixtureRequest, _isolated_environment: None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Under KILN_TEST_BACKEND=postgres (or for a test using the server): the password
    variable back after the isolation, and a scope whose databases are dropped after."""
    if selected_backend() != "postgres" and "postgres_server" not in request.fixturenames:
        yield
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    monkeypatch.setenv(server.password_env, server.password)
    with server.test_scope(request.node.name):
        yield


@pytest.fixture
def free_port() -> int:
    return _free_port()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """Seed-0 tiny Llama, one shard, model width = tokenizer size (512)."""
    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tiny_model_sharded(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """Same weights as ``tiny_model`` in two shards plus model.safetensors.index.json."""
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-sharded") / "model", shards=2)


@pytest.fixture(scope="session")
def tiny_model_padded(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """Model width 544 over a 512-entry tokenizer (padded embedding/output rows)."""
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-padded") / "model", model_width=544)


@pytest.fixture(scope="session")
def tiny_adapter(tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel) -> Path:
    """A PEFT LoRA adapter (r=8, q_proj/v_proj) for ``tiny_model``."""
    path = tmp_path_factory.mktemp("tiny-adapter") / "adapter"
    build_peft_adapter(path, base=tiny_model)
    return path


@pytest.fixture(scope="session")
def python_without_vllm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A python whose environment has everything installed here except vLLM."""
    from tests.no_vllm import build_python_without_vllm

    return build_python_without_vllm(tmp_path_factory.mktemp("no-vllm"))
