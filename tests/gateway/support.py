"""A fake vLLM on a Unix socket and an in-process gateway, for the gateway tests.

``FakeUpstream`` is a real uvicorn server on a real Unix socket running a
small ASGI app that records every request it receives (method, raw path,
headers) and answers by the ``kiln_test`` field of a completion body:

* absent: the captured vLLM body ``pl1.json`` with its Content-Length;
* ``"slow"``: the same body after ``SLOW_SECONDS``;
* ``"drop"``: a head with Content-Length 1000, 10 bytes, then the app
  raises (uvicorn ends the connection: the body broke off);
* ``"huge"``: a 2 MiB body with its Content-Length (over a short prompt's bound);
* ``"stream"``: ``STREAM_EVENTS`` server-sent events, chunked;
* ``"stream_huge"``: chunked events past the bound of a short prompt;
* ``"stream_drop"``: one chunked event, then the app raises.

``GET /v1/models`` answers the captured ``models.json``; ``GET /health`` 200
with an empty body; every other route answers 200 ``{"reached": true}`` so a
forwarded request would be visible.  ``running_gateway`` runs a ``Gateway``
on an event loop in a thread and yields its port.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

from kiln_registry.gateway.config import GatewayConfig
from kiln_registry.gateway.server import Gateway
from tests.helpers import VLLM_RESPONSES

SLOW_SECONDS = 3.0
STREAM_EVENTS = 5
SERVED = "teacher-tiny"
BASE_ALIAS = "kiln-base-0123456789abcdef"
PL1 = (VLLM_RESPONSES / "pl1.json").read_bytes()
MODELS = (VLLM_RESPONSES / "models.json").read_bytes()


@dataclass
class Seen:
    method: str
    path: str
    query: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes


@dataclass
class FakeUpstream:
    path: str
    seen: list[Seen] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.seen.append(
            Seen(scope["method"], scope["raw_path"].decode(), scope["query_string"],
                 list(scope["headers"]), body)
        )  # fmt: skip
        await self._answer(scope, body, send)

    async def _answer(self, scope: dict[str, Any], body: bytes, send: Any) -> None:
        path = scope["raw_path"]
        if path == b"/health":
            return await _reply(send, 200, b"")
        if path == b"/v1/models":
            return await _reply(send, 200, MODELS)
        if path != b"/v1/completions":
            return await _reply(send, 200, b'{"reached":true}')
        mode = json.loads(body).get("kiln_test")
        if mode == "slow":
            await asyncio.sleep(SLOW_SECONDS)
        if mode == "drop":
            await _start(send, 200, [(b"content-length", b"1000")])
            await send({"type": "http.response.body", "body": b"x" * 10, "more_body": True})
            raise RuntimeError("fake upstream drops the connection on purpose")
        if mode == "huge":
            return await _reply(send, 200, b"x" * (2 << 20))
        if mode == "stream_drop":
            await _start(send, 200, [])
            await send({"type": "http.response.body", "body": stream_event(0), "more_body": True})
            raise RuntimeError("fake upstream drops the stream on purpose")
        if mode in ("stream", "stream_huge"):
            return await _stream(send, 4000 if mode == "stream_huge" else STREAM_EVENTS)
        await _reply(send, 200, PL1)


async def _start(send: Any, status: int, headers: list[tuple[bytes, bytes]]) -> None:
    headers = [(b"content-type", b"application/json"), *headers]
    await send({"type": "http.response.start", "status": status, "headers": headers})


async def _reply(send: Any, status: int, body: bytes) -> None:
    await _start(send, status, [(b"content-length", b"%d" % len(body))])
    await send({"type": "http.response.body", "body": body})


def stream_event(index: int) -> bytes:
    return b'data: {"index": %d, "pad": "%s"}\n\n' % (index, b"p" * 500)


async def _stream(send: Any, events: int) -> None:
    await _start(send, 200, [])
    for index in range(events):
        await send({"type": "http.response.body", "body": stream_event(index), "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


@contextmanager
def fake_upstream(directory: Path) -> Iterator[FakeUpstream]:
    """Serve the fake app with uvicorn on ``directory/vllm.sock`` in a thread."""
    app = FakeUpstream(str(directory / "vllm.sock"))
    config = uvicorn.Config(app, uds=app.path, log_level="critical", lifespan="off",
                            access_log=False)  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    _wait(lambda: server.started, thread)
    try:
        yield app
    finally:
        server.should_exit = True
        thread.join(10)


def _wait(ready: Any, thread: threading.Thread, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("a test server did not start")
        time.sleep(0.01)


def config_for(upstream: str, **overrides: Any) -> GatewayConfig:
    values: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": 0,
        "upstream_uds": upstream,
        "served_model_id": SERVED,
        "max_model_len": 256,
        "max_top_k": 32,
        "upstream_timeout": 60.0,
    }
    values.update(overrides)
    return GatewayConfig(**values)


@dataclass
class RunningGateway:
    gateway: Gateway
    loop: asyncio.AbstractEventLoop

    @property
    def port(self) -> int:
        return self.gateway.port

    def drain(self, seconds: float) -> threading.Thread:
        """Start a drain from another thread; the returned thread ends when it is done."""
        future = asyncio.run_coroutine_threadsafe(self.gateway.drain(seconds), self.loop)
        waiter = threading.Thread(target=future.result, daemon=True)
        waiter.start()
        return waiter


@contextmanager
def running_gateway(config: GatewayConfig) -> Iterator[RunningGateway]:
    loop = asyncio.new_event_loop()
    gateway = Gateway(config)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(gateway.start(), loop).result(10)
    try:
        yield RunningGateway(gateway, loop)
    finally:
        if not gateway.draining:
            asyncio.run_coroutine_threadsafe(gateway.drain(1.0), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def raw_exchange(port: int, data: bytes, *, timeout: float = 10.0) -> bytes:
    """Send ``data`` on a fresh connection and read until the gateway closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def completion(**fields: Any) -> bytes:
    body: dict[str, Any] = {"model": SERVED, "prompt": [1, 2, 3], "max_tokens": 1,
                            "prompt_logprobs": 1}  # fmt: skip
    body.update(fields)
    return json.dumps(body).encode()


def post(path: str, body: bytes, *extra: bytes) -> bytes:
    """A raw POST with one Content-Length and ``connection: close``."""
    head = [b"POST " + path.encode() + b" HTTP/1.1", b"host: gw", b"content-type: application/json",
            b"content-length: %d" % len(body), b"connection: close", *extra]  # fmt: skip
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response else 0


def body_of(response: bytes) -> bytes:
    return response.split(b"\r\n\r\n", 1)[1]
