"""The endpoint's ASGI application: vLLM's three routes, ``/metrics``, access log.

Routes (exact paths; anything else is a vLLM-shaped 404):

* ``GET /health``: 200 with an empty body while the endpoint serves and a
  replica is live, else 503 with the reason (vLLM's health check, which
  TRL's ``VLLMClient.check_server`` polls);
* ``GET /v1/models``: the one pinned model, ``max_model_len`` from the pin;
* ``POST /v1/completions``: ``relay.relay_completion``;
* ``GET /metrics``: Prometheus text (``endpoint.metrics``).

With an API key (``api_key_env``: the variable is read on every request,
never kept) every route but ``/health`` needs exactly
``Authorization: Bearer <key>``, compared in constant time, as vLLM's
``--api-key``.  A body is read up to ``Limits.max_body_bytes`` (Content-Length
first, then while reading).  Each request gets a request id
(``X-Request-ID``, the caller's when well formed) and one access record on
``kiln_registry.access``, which the JSON formatter writes as fields.

Imports the standard library, ``observability`` (request ids, access
fields), httpx (the outbound client's type) and the endpoint's modules.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import time
from typing import Final

import httpx

from kiln_registry.domain.asgi import Receive, Scope, Send
from kiln_registry.endpoint.errors import EndpointRefusal, bad_request, unavailable
from kiln_registry.endpoint.relay import relay_completion
from kiln_registry.endpoint.state import EndpointState
from kiln_registry.observability.access import ACCESS_LOGGER, FIELDS_ATTR
from kiln_registry.observability.request_id import HEADER, RequestIds, current_request_id

JSON: Final = b"application/json"
PROMETHEUS: Final = b"text/plain; version=0.0.4; charset=utf-8"
access_log = logging.getLogger(ACCESS_LOGGER)
log = logging.getLogger("kiln_registry.endpoint")

Answer = tuple[int, bytes, bytes, dict[str, str]]


class EndpointApp:
    """The pure-ASGI app of one endpoint (see the module docstring)."""

    def __init__(
        self, state: EndpointState, http: httpx.AsyncClient, *, api_key_env: str | None = None
    ) -> None:
        self.state = state
        self.http = http
        self.api_key_env = api_key_env
        self._ids = RequestIds()
        self.created = int(time.time())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        started = time.perf_counter()
        request_id = self._ids.for_headers(scope["headers"])
        reset = current_request_id.set(request_id)
        try:
            status, body, content_type, headers = await self._answer(scope, receive)
        except EndpointRefusal as exc:
            status, body, content_type, headers = exc.status, exc.body(), JSON, exc.headers()
            if exc.rule is not None:
                self.state.metrics.count_refusal(exc.rule)
            if status >= 500:
                log.warning("request %s refused (%d, %s): %s", request_id, status, exc.rule,
                            exc.message)  # fmt: skip
        except Exception:
            log.exception("request %s failed", request_id)
            failure = EndpointRefusal(500, "internal error; the endpoint's log has the detail")
            status, body, content_type, headers = 500, failure.body(), JSON, {}
        finally:
            current_request_id.reset(reset)
        await _send(send, status, body, content_type, headers, request_id)
        self.state.metrics.count_request(scope["path"], status)
        _log_access(scope, status, time.perf_counter() - started, request_id)

    async def _answer(self, scope: Scope, receive: Receive) -> Answer:
        method, path = scope["method"], scope["path"]
        if path == "/health" and method == "GET":
            return self._health()
        if (method, path) not in ROUTES:
            raise EndpointRefusal(404, "Not Found", rule="endpoint.route")
        self._check_key(scope)
        if path == "/v1/models":
            return 200, self._models(), JSON, {}
        if path == "/metrics":
            return 200, self.state.metrics.render(), PROMETHEUS, {}
        body = await _read_body(scope, receive, self.state.limits.max_body_bytes)
        answer = await relay_completion(self.state, self.http, body)
        return 200, answer, JSON, {}

    def _health(self) -> Answer:
        if self.state.stop_reason is not None:
            raise unavailable(self.state.stop_reason)
        if not self.state.pool.live():
            raise unavailable(f"no replica of {self.state.alias} is live now", retry_after=10)
        return 200, b"", JSON, {}

    def _check_key(self, scope: Scope) -> None:
        if self.api_key_env is None:
            return
        key = os.environ.get(self.api_key_env, "").encode()
        values = [v for k, v in scope["headers"] if k == b"authorization"]
        scheme, _, token = (values[0] if len(values) == 1 else b"").partition(b" ")
        if not key or scheme.lower() != b"bearer" or not hmac.compare_digest(token, key):
            raise EndpointRefusal(401, "Unauthorized", rule="endpoint.unauthorized")

    def _models(self) -> bytes:
        pin = self.state.pin
        model = {
            "id": pin.served_model_id,
            "object": "model",
            "created": self.created,
            "owned_by": "vllm",
            "root": pin.served_model_id,
            "parent": None,
            "max_model_len": pin.max_model_len,
            "permission": [],
        }
        return json.dumps({"object": "list", "data": [model]}, separators=(",", ":")).encode()


ROUTES: Final = frozenset({("GET", "/v1/models"), ("POST", "/v1/completions"), ("GET", "/metrics")})


async def _read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    for key, value in scope["headers"]:
        if key == b"content-length" and (not value.isdigit() or int(value) > limit):
            raise bad_request(f"the body exceeds {limit} bytes", "body", "body_size")
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise EndpointRefusal(400, "the client went away", rule="endpoint.disconnect")
        body += message.get("body", b"")
        if len(body) > limit:
            raise bad_request(f"the body exceeds {limit} bytes", "body", "body_size")
        if not message.get("more_body", False):
            return bytes(body)


async def _send(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes,
    extra: dict[str, str],
    request_id: str,
) -> None:
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (HEADER, request_id.encode("ascii")),
    ]
    headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def _log_access(scope: Scope, status: int, seconds: float, request_id: str) -> None:
    if not access_log.isEnabledFor(logging.INFO):
        return
    client = scope.get("client")
    path = scope["path"]
    fields: dict[str, object] = {
        "request_id": request_id,
        "method": scope["method"][:16],
        "route": path if (scope["method"], path) in ROUTES or path == "/health" else "other",
        "path": path[:256],
        "status": status,
        "duration_ms": round(seconds * 1000.0, 3),
        "client": client[0] if client else None,
    }
    record = logging.LogRecord(ACCESS_LOGGER, logging.INFO, __file__, 0, "request", None, None)
    record.__dict__[FIELDS_ATTR] = fields
    access_log.handle(record)
