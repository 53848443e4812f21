"""A gate in front of the reference teacher: scoring requests wait until the test lets them pass.

``ScoringGate`` wraps the real reference teacher's ASGI app.  Probe requests
(prompt ``[0, 0]``) always pass; every other ``/v1/completions`` request (a
job's scoring request) passes while the gate is open, and after ``hold()``
only as far as ``release(n)`` allows.  The teacher's answers are its own.
This is what lets a browser test watch a real job's progress change on
screen without racing it.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PROBE_PROMPT = [0, 0]
HOLD_LIMIT_S = 120.0
MAX_BODY = 1 << 20


class ScoringGate:
    def __init__(self, app: ASGIApp) -> None:
        self._app = app
        self._cond = threading.Condition()
        self._allowed: float = math.inf
        self.arrived = 0  # scoring requests seen so far
        self.answered = 0  # scoring requests let through

    def hold(self) -> None:
        """From now on, scoring requests wait (those already let through go on)."""
        with self._cond:
            self._allowed = self.answered

    def release(self, count: int) -> None:
        with self._cond:
            self._allowed += count
            self._cond.notify_all()

    def open(self) -> None:
        with self._cond:
            self._allowed = math.inf
            self._cond.notify_all()

    def waiting(self) -> int:
        with self._cond:
            return self.arrived - self.answered

    def _enter(self) -> None:
        with self._cond:
            self.arrived += 1
            turn = self.arrived
            if not self._cond.wait_for(lambda: turn <= self._allowed, timeout=HOLD_LIMIT_S):
                raise RuntimeError("the test never released a held scoring request")
            self.answered += 1

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/completions":
            await self._app(scope, receive, send)
            return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            body.extend(message.get("body", b""))
            more = bool(message.get("more_body", False))
            assert len(body) <= MAX_BODY, "an unexpectedly large completion request"
        if json.loads(body).get("prompt") != PROBE_PROMPT:
            await anyio.to_thread.run_sync(self._enter)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self._app(scope, replay, send)
