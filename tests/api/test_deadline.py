"""RequestDeadline: Kiln's request_timeout_secs as a 408 request_timeout, over real HTTP.

The envelope and message are Kiln's (crates/kiln-server/src/error.rs,
``ApiError::request_timeout``).  A real uvicorn server on loopback.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from kiln_registry.api.deadline import RequestDeadline
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import _uvicorn_thread, remote, run_registry, write_config


async def _slow(request: Request) -> JSONResponse:
    await asyncio.sleep(float(request.query_params.get("s", "30")))
    return JSONResponse({"ok": True})


def _app() -> RequestDeadline:
    routes = [Route("/slow", _slow), Route("/v1/teachers/a/launch", _slow, methods=["POST"])]
    return RequestDeadline(Starlette(routes=routes), seconds=1)


def test_a_request_past_the_deadline_gets_kilns_408() -> None:
    config = uvicorn.Config(_app(), log_level="warning", access_log=False, lifespan="off")
    with _uvicorn_thread(config) as port, httpx.Client(trust_env=False, timeout=30) as http:
        base = f"http://127.0.0.1:{port}"
        late = http.get(base + "/slow")
        assert late.status_code == 408
        assert late.json() == {
            "error": {
                "code": "request_timeout",
                "message": "Request timed out after 1 seconds",
                "hint": "increase the server's request_timeout_secs in the config file, or retry",
            }
        }
        assert http.get(base + "/slow", params={"s": "0"}).json() == {"ok": True}
        # A launch has its own deadlines (ready_deadline_s, local_launch_deadline_s).
        launch = http.post(base + "/v1/teachers/a/launch", params={"s": "1.5"})
        assert launch.status_code == 200


def test_the_registry_applies_request_timeout_secs(tmp_path: Path, tiny_model: TinyModel) -> None:
    """A registration whose teacher never answers is cut at the configured deadline."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections complete in the backlog; nothing is ever read or answered
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    config = write_config(tmp_path, student=tiny_model.path, server={"request_timeout_secs": 1})
    try:
        with run_registry(config) as server, server.client() as http:
            late = http.post("/v1/teachers", json=remote("silent@vllm", url))
            assert late.status_code == 408
            assert late.json()["error"]["code"] == "request_timeout"
            assert http.get("/v1/teachers/silent@vllm").status_code == 404  # nothing persisted
    finally:
        silent.close()
