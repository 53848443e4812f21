"""Shared test helpers: free ports, a uvicorn app server in a thread, captured vLLM bodies.

Used by ``tests/conftest.py`` and test modules.  Real sockets on 127.0.0.1
only; nothing here touches the network beyond loopback.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

VLLM_RESPONSES = Path(__file__).parent / "data" / "vllm_responses"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def captured(name: str) -> tuple[bytes, dict[str, Any]]:
    """A captured vLLM response: (raw body bytes, meta with request/status/headers)."""
    body = (VLLM_RESPONSES / f"{name}.json").read_bytes()
    meta = json.loads((VLLM_RESPONSES / f"{name}.meta.json").read_text(encoding="utf-8"))
    return body, meta


@contextmanager
def serve_app(app: Any, *, timeout: float = 10.0) -> Iterator[str]:
    """Run an ASGI app with uvicorn on a free 127.0.0.1 port in a thread; yield its URL."""
    import uvicorn

    from kiln_registry.reference_teacher.app import bind_socket

    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout)
        sock.close()


@contextmanager
def serve_reference_teacher(model_path: Path, served_model_id: str) -> Iterator[str]:
    """The reference teacher on ``model_path`` (K <= 8, 64 tokens, no API key); yield its URL."""
    from kiln_registry.reference_teacher.app import create_reference_app
    from kiln_registry.reference_teacher.identity import load_reference_teacher

    teacher, _ = load_reference_teacher(
        model_path, served_model_id=served_model_id, max_top_k=8, max_model_len=64
    )
    with serve_app(create_reference_app(teacher, api_key_env=None)) as url:
        yield url
