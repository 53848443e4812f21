"""Helpers for the registry API tests: config files, in-thread servers, a ``kiln serve`` process.

``write_config`` writes a kiln.toml; ``RegistryServer`` runs ``create_app``
under uvicorn on 127.0.0.1 in a thread with its lifespan on (so the
outbound client exists); ``serve_tls`` runs any ASGI app over TLS with a
trustme certificate; ``ServerProcess`` is a real ``kiln serve --config``
subprocess with its stderr captured to a file.  Loopback only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from kiln_registry.api.app import create_app
from kiln_registry.api.context import RegistryContext
from kiln_registry.reference_teacher.app import bind_socket
from kiln_registry.serve.startup import build_context, prepare
from tests.helpers import free_port
from tests.pg_server import database_settings

REPO = Path(__file__).resolve().parents[2]
START_DEADLINE_S = 30.0
# uvicorn re-raises SIGTERM after its graceful shutdown, so a clean stop may
# report the signal instead of 0.
CLEAN_EXIT = frozenset({0, -signal.SIGTERM})


def toml_str(value: str | Path) -> str:
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_config(
    directory: Path,
    *,
    student: Path,
    server: Mapping[str, Any] | None = None,
    credentials: Mapping[str, tuple[str, str]] | None = None,
) -> Path:
    """A kiln.toml in ``directory``: database there, ``credentials`` id -> (origin, env).

    The database is ``directory/registry.db``, or under KILN_TEST_BACKEND=postgres a
    fresh PostgreSQL database with ``state_dir = directory`` (tests/pg_server.py).
    """
    lines = ["[server]"]
    lines += [f"{key} = {toml_str(value)}" for key, value in database_settings(directory).items()]
    for key, value in (server or {}).items():
        text = toml_str(value) if isinstance(value, str | Path) else str(value).lower()
        lines.append(f"{key} = {text}")
    lines += ["", "[student]", f"model_path = {toml_str(student)}", ""]
    for cid, (origin, env) in (credentials or {}).items():
        lines += [f"[teachers.credentials.{cid}]", f"origin = {toml_str(origin)}"]
        lines += [f"api_key_env = {toml_str(env)}", ""]
    path = directory / "kiln.toml"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


@contextmanager
def _uvicorn_thread(config: uvicorn.Config, timeout: float = 10.0) -> Iterator[int]:
    sock = bind_socket("127.0.0.1", 0)
    port: int = sock.getsockname()[1]
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout)
        sock.close()


@contextmanager
def serve_tls(app: Any, cert_pem: Path) -> Iterator[int]:
    """Serve ``app`` over TLS on 127.0.0.1 (certificate + key in ``cert_pem``); yield the port."""
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", ssl_certfile=str(cert_pem)
    )
    with _uvicorn_thread(config) as port:
        yield port


@dataclass
class RegistryServer:
    ctx: RegistryContext
    url: str

    def client(self, timeout: float = 30.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout, trust_env=False)


@contextmanager
def run_registry(
    config_path: Path,
    *,
    host: str | None = None,
    extend: Callable[[Any], None] | None = None,
    upgrade: bool = False,
) -> Iterator[RegistryServer]:
    """``prepare`` + ``build_context`` + ``create_app`` under uvicorn in a thread.

    ``extend(app)`` may add test-only routes before the server starts.
    """
    config = prepare(config_path, host=host, port=None)
    ctx = build_context(config, upgrade=upgrade)
    app = create_app(ctx)
    if extend is not None:
        extend(app)
    uv = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    try:
        with _uvicorn_thread(uv) as port:
            yield RegistryServer(ctx=ctx, url=f"http://127.0.0.1:{port}")
    finally:
        ctx.close()


class ServerProcess:
    """``python -m kiln_registry.cli.main serve --config ... --port P`` with captured stderr."""

    def __init__(
        self,
        config: Path,
        log: Path,
        env: Mapping[str, str] | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        argv = [sys.executable, "-m", "kiln_registry.cli.main", "serve"]
        argv += ["--config", str(config), "--port", str(self.port), *extra]
        full_env = {**os.environ, **(env or {})}
        with log.open("ab") as sink:
            self.proc = subprocess.Popen(
                argv, cwd=REPO, env=full_env, stdout=sink, stderr=subprocess.STDOUT
            )

    def wait_ready(self, deadline_s: float = START_DEADLINE_S) -> None:
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"kiln serve exited {self.proc.returncode}: {self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=1, trust_env=False).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.kill()
        raise AssertionError(f"kiln serve did not answer /health: {self.output()}")

    def wait_exit(self, timeout: float = START_DEADLINE_S) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(20)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def remote(alias: str, url: str, model_id: str = "teacher-tiny", **extra: Any) -> dict[str, Any]:
    """A registration body for a remote vLLM teacher."""
    return {"alias": alias, "kind": "remote", "provider": "vllm", "model_id": model_id,
            "url": url, **extra}  # fmt: skip


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    # Kiln's envelope (crates/kiln-server/src/error.rs): hint is always a string;
    # `rule` is this registry's extra member, present only when a named rule failed.
    assert {"code", "message", "hint"} <= set(error) <= {"code", "message", "hint", "rule"}, error
    assert all(isinstance(error[key], str) for key in error), error
    return error
