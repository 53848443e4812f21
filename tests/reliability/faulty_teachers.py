"""Misbehaving vLLM-like teachers on real loopback sockets, for the reliability suite.

Builds on ``tests/probe/teacher_server.py``: ``FaultyTeacher`` is its
``TeacherServer`` plus one more reply mode, ``"reset"`` (the head and part of
the body, a pause so the client has read them, then a TCP RST through
``SO_LINGER`` 0).  ``ScriptedTeacher`` is a handler that answers like vLLM
for a switchable identity (``good_teacher`` underneath) unless a fault is
scripted for a request index; it also records the Authorization headers it
received (to prove a credential reached it) and can reflect them into the
``model`` field of a 200 answer or into an error body.  ``twin_identity``
derives another teacher that the same student accepts (only the base hash
differs), so a teacher can swap identities without failing the student
checks first.  ``wrong_name_tls`` issues a trustme certificate for another
host name.

Standard library, trustme and the test helpers only; nothing at import time.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import itertools
import json
import socket
import struct
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trustme

from kiln_registry.identity.document import TeacherIdentity
from tests.probe.teacher_server import Handler, Reply, Request, TeacherServer, good_teacher

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]

RESET_PAUSE_S = 0.3
ENDLESS_BYTES = 1 << 40
MAX_REQUEST_BYTES = 1 << 20


class FaultyTeacher(TeacherServer):
    """``TeacherServer`` with a ``"reset"`` mode: part of the body, then an RST."""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _answer(self, writer: asyncio.StreamWriter, reply: Reply) -> None:
        if reply.mode != "reset":
            await super()._answer(writer, reply)
            return
        head = (
            f"HTTP/1.1 {reply.status} OK\r\ncontent-type: application/json\r\n"
            f"content-length: {len(reply.body)}\r\nconnection: close\r\n\r\n"
        ).encode()
        await self._send(writer, head + reply.body[: len(reply.body) // 2])
        await asyncio.sleep(RESET_PAUSE_S)  # the client has read the head: a mid-body reset
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()


def twin_identity(identity: TeacherIdentity, label: str) -> TeacherIdentity:
    """Another teacher the same student accepts: only ``base_model_sha256`` differs."""
    base = hashlib.sha256(f"{label}:{identity.base_model_sha256}".encode()).hexdigest()
    return dataclasses.replace(identity, base_model_sha256=base)


@dataclass
class ScriptedTeacher:
    """A vLLM-shaped handler: good answers for ``identity`` except the scripted faults.

    ``faults`` maps a request index (0 = the first request this handler saw)
    to the reply sent instead; ``fingerprints`` (per index, last one repeats)
    overrides the advertised fingerprint; ``reflect`` echoes the received
    Authorization value into the ``model`` field (``"model"``) or into a 500
    error body (``"error"``).
    """

    identity: TeacherIdentity
    faults: dict[int, Reply] = field(default_factory=dict)
    fingerprints: list[str] | None = None
    reflect: str | None = None
    api_key: str | None = None
    authorizations: list[str] = field(default_factory=list)

    def __call__(self, request: Request, index: int) -> Reply:
        sent = request.headers.get("authorization", "")
        if sent:
            self.authorizations.append(sent)
        if index in self.faults:
            return self.faults[index]
        if self.reflect == "error":
            return Reply(status=500, body=json.dumps({"error": {"message": sent}}).encode())
        reply = good_teacher(self.identity, fingerprints=self.fingerprints, api_key=self.api_key)(
            request, index
        )
        if self.reflect == "model" and reply.status == 200:
            doc = json.loads(reply.body)
            doc["model"] = reflection(str(request.json()["model"]), sent.removeprefix("Bearer "))
            reply = dataclasses.replace(reply, body=json.dumps(doc).encode())
        return reply


REFLECTIONS: dict[str, Callable[[str], str]] = {
    "verbatim": lambda key: key,
    "bearer": lambda key: "Bearer " + key,
    "truncated": lambda key: "m" * 56 + key,  # the probe quotes 80 characters: a key prefix
    "base64": lambda key: base64.b64encode(key.encode()).decode(),
    "urlencoded": lambda key: urllib.parse.quote(key, safe=""),
}


def reflection(requested_model: str, key: str) -> str:
    """The key as a reflecting teacher echoes it: ``reflect-<form>`` picks the form."""
    form = requested_model.removeprefix("reflect-")
    return REFLECTIONS.get(form, REFLECTIONS["verbatim"])(key)


def asgi_teacher(handler: Handler) -> ASGIApp:
    """``handler`` as an ASGI app (normal replies only), to serve it over TLS with uvicorn."""
    count = itertools.count()

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if len(body) > MAX_REQUEST_BYTES:  # only the registry talks to it: a bug if hit
                raise ValueError("request body over the test teacher's bound")
            if not message.get("more_body", False):
                break
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        reply = handler(Request(scope["method"], scope["path"], headers, body), next(count))
        head = {"content-type": "application/json", **reply.headers}
        await send({"type": "http.response.start", "status": reply.status,
                    "headers": [(k.encode(), v.encode()) for k, v in head.items()]})  # fmt: skip
        await send({"type": "http.response.body", "body": reply.body})

    return app


def reset_mid_body() -> Reply:
    return Reply(body=b'{"id":"cmpl-reset","object":"text_completion","choices":[]}' * 4,
                 mode="reset")  # fmt: skip


def slow_loris(interval_s: float = 0.25, size: int = 400) -> Reply:
    """A 200 whose body arrives one byte per ``interval_s`` (each read is quick)."""
    return Reply(body=b" " * size, mode="drip", drip_interval=interval_s)


def endless_body() -> Reply:
    """A 200 without Content-Length whose body never ends (generated, never buffered)."""
    return Reply(mode="stream", length=ENDLESS_BYTES)


def huge_claim() -> Reply:
    """A 200 that declares a terabyte of body."""
    return Reply(mode="claim", length=ENDLESS_BYTES)


def redirect_to(url: str, status: int = 307) -> Reply:
    return Reply(status=status, headers={"location": url})


@dataclass(frozen=True)
class TlsPair:
    ca_pem: Path
    cert_pem: Path


def wrong_name_tls(directory: Path, name: str = "other.example") -> TlsPair:
    """A CA and a server certificate (with key) valid only for ``name``."""
    ca = trustme.CA()
    pair = TlsPair(ca_pem=directory / "ca.pem", cert_pem=directory / f"{name}.pem")
    ca.cert_pem.write_to_path(str(pair.ca_pem))
    ca.issue_cert(name).private_key_and_cert_chain_pem.write_to_path(str(pair.cert_pem))
    return pair


def header_map(headers: Mapping[str, str]) -> str:
    """Headers as one text blob, for secret scanning."""
    return "\n".join(f"{name}: {value}" for name, value in headers.items())
