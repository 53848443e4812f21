"""A small controllable vLLM-like teacher on a real loopback socket, for tests.

Raw asyncio HTTP/1.1 in a background thread (its own event loop), one request
per connection.  A handler maps each request to a ``Reply`` that can be a
normal JSON answer, a redirect, a slow-loris drip, a close mid-body, or a huge
streamed body generated on the fly (never buffered).  Also builds response
bodies in vLLM's exact layout with a real Kiln fingerprint.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Self

from kiln_registry.identity.document import TeacherIdentity


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict[str, object]:
        value = json.loads(self.body)
        assert isinstance(value, dict)
        return value


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    mode: str = "normal"  # normal | drip | close_mid | stream | claim
    length: int | None = None  # for stream/claim: bytes to send / to declare
    drip_interval: float = 0.2


Handler = Callable[[Request, int], Reply]

_REASONS = {200: "OK", 307: "Temporary Redirect", 400: "Bad Request", 401: "Unauthorized"}


class TeacherServer:
    """``with TeacherServer(handler) as srv: srv.url`` serves until the block ends."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.requests: list[Request] = []
        self.bytes_sent = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/completions"

    def __enter__(self) -> Self:
        self._thread.start()
        assert self._ready.wait(10), "teacher server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._server.close()
        for task in asyncio.all_tasks(self._loop):
            task.cancel()
        self._loop.run_until_complete(asyncio.sleep(0))
        self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await _read_request(reader)
            self.requests.append(request)
            reply = self.handler(request, len(self.requests) - 1)
            await self._answer(writer, reply)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        await writer.drain()
        self.bytes_sent += len(data)

    async def _answer(self, writer: asyncio.StreamWriter, reply: Reply) -> None:
        head = [f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Status')}"]
        headers = {"content-type": "application/json", "connection": "close", **reply.headers}
        if reply.mode == "claim":
            headers["content-length"] = str(reply.length)
        elif reply.mode != "stream":
            headers["content-length"] = str(len(reply.body))
        head += [f"{k}: {v}" for k, v in headers.items()]
        await self._send(writer, ("\r\n".join(head) + "\r\n\r\n").encode())
        if reply.mode == "normal":
            await self._send(writer, reply.body)
        elif reply.mode == "close_mid":
            await self._send(writer, reply.body[: len(reply.body) // 2])
        elif reply.mode == "drip":
            for i in range(len(reply.body)):
                await self._send(writer, reply.body[i : i + 1])
                await asyncio.sleep(reply.drip_interval)
        else:  # stream / claim: generate without buffering
            chunk = b" " * 65536
            remaining = reply.length or 0
            while remaining > 0:
                await self._send(writer, chunk[: min(remaining, len(chunk))])
                remaining -= len(chunk)


async def _read_request(reader: asyncio.StreamReader) -> Request:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Request(method, path, headers, body)


HASH_A, HASH_B, HASH_C, HASH_F = "a" * 64, "b" * 64, "c" * 64, "f" * 64


def make_identity(
    served: str = "teacher-tiny", *, vocab: int = 512, top_k: int = 32, base: str = HASH_A
) -> TeacherIdentity:
    return TeacherIdentity(
        served_model_id=served,
        base_model_sha256=base,
        tokenizer_vocab_sha256=HASH_B,
        tokenizer_config_sha256=HASH_C,
        adapter=None,
        vocab_size=vocab,
        max_top_k=top_k,
        max_model_len=256,
        max_prompt_logprob_candidates=min(1_000_000, 256 * min(top_k + 1, vocab)),
        implementation="vllm:0.32.0",
        inference_config_sha256=HASH_F,
    )


def row_entries(token: int, k: int, *, inside: bool = False) -> list[tuple[int, float, int]]:
    """One row as (id, logprob, rank) in wire order; logprobs are float32-exact."""

    def lp(rank: int) -> float:
        return -4.0 - 0.25 * (rank - 1)

    others = [t for t in range(1, k + 2) if t != token]
    if inside:  # the prompt token is rank 2 (or 1 when k == 1)
        rank = min(2, k)
        top = others[: k - 1]
        ranks = [r for r in range(1, k + 1) if r != rank]
        return [(token, lp(rank), rank)] + [(t, lp(r), r) for t, r in zip(top, ranks, strict=True)]
    return [(token, lp(k + 3), k + 3)] + [(t, lp(r), r) for r, t in enumerate(others[:k], 1)]


def completion_body(
    *,
    model: str,
    fingerprint: str | None,
    prompt: Sequence[int],
    k: int,
    inside: bool = False,
    rows: list[list[tuple[int, float, int]]] | None = None,
) -> bytes:
    """A vLLM 0.32-shaped completion body (compact, keys in vLLM's order)."""
    if rows is None:
        rows = [row_entries(t, k, inside=inside) for t in prompt[1:]]
    plp: list[object] = [None] + [
        {str(t): {"logprob": v, "rank": r, "decoded_token": ""} for t, v, r in row} for row in rows
    ]
    body = {
        "id": "cmpl-test",
        "object": "text_completion",
        "created": 1795957691,
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": "",
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": None,
                "prompt_logprobs": plp,
                "prompt_token_ids": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + 1},
    }
    return json.dumps(body, separators=(",", ":")).encode()


def vllm_error(message: str, status: int = 400) -> Reply:
    body = {"error": {"message": message, "type": "BadRequestError", "param": None, "code": status}}
    return Reply(status=status, body=json.dumps(body).encode())


def good_teacher(
    identity: TeacherIdentity,
    *,
    fingerprints: Sequence[str] | None = None,
    answer_cap: bool = False,
    api_key: str | None = None,
    model: str | None = None,
) -> Handler:
    """A teacher that answers like vLLM with ``--max-logprobs=identity.max_top_k``."""

    def handle(request: Request, index: int) -> Reply:
        if api_key is not None and request.headers.get("authorization") != f"Bearer {api_key}":
            return Reply(status=401, body=b'{"error":"Unauthorized teacher-body-marker"}')
        req = request.json()
        k = req["prompt_logprobs"]
        assert isinstance(k, int)
        if k > identity.max_top_k and not answer_cap:
            return vllm_error(f"Requested prompt logprobs of {k}, teacher-body-marker")
        fp = fingerprints[min(index, len(fingerprints) - 1)] if fingerprints else None
        prompt = req["prompt"]
        assert isinstance(prompt, list)
        body = completion_body(
            model=model or str(req["model"]),
            fingerprint=fp or identity.fingerprint(),
            prompt=prompt,
            k=k,
        )
        return Reply(body=body)

    return handle
