"""HTTP surface of the reference teacher: a FastAPI app speaking vLLM's protocol.

Owns ``create_reference_app`` (routes ``POST /v1/completions``,
``GET /v1/models``, ``GET /health``, ``GET /version``), the bearer-key guard on
``/v1/*`` (the key is read from the named environment variable on every
request, never stored, compared in constant time), the request-body bound
(checked before and while reading), and ``run_reference_server`` (uvicorn on
an already-bound socket, so the caller learns the real port first).

Imports: standard library, FastAPI/Starlette, uvicorn (inside the runner),
``kiln_registry.domain.errors`` and ``reference_teacher``'s protocol, responses and
model.  The API, database, probe and launcher packages are never imported.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, Response
from starlette.concurrency import run_in_threadpool

from kiln_registry.domain.asgi import ASGIApp, Receive, Scope, Send
from kiln_registry.domain.errors import InputError, KilnError
from kiln_registry.domain.text import quoted
from kiln_registry.reference_teacher.model import ReferenceTeacher
from kiln_registry.reference_teacher.protocol import (
    CompletionRequest,
    ProtocolError,
    check_against_teacher,
    decode_json_body,
    parse_completion_request,
)
from kiln_registry.reference_teacher.responses import completion_body, dumps, models_body

LOG = logging.getLogger("kiln_registry.reference_teacher")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_UNAUTHORIZED = b'{"error":"Unauthorized"}'
_JSON = "application/json"


def check_env_name(name: str) -> str:
    if not _ENV_NAME.fullmatch(name):
        raise InputError(
            f"api_key_env {quoted(name, 40)} is not an environment variable name",
            rule="reference.api_key_env",
        )
    return name


class BearerKeyGuard:
    """Pure-ASGI guard: ``/v1/*`` needs ``Authorization: Bearer <$api_key_env>``.

    A missing or empty variable refuses every request (fail closed).  The
    refusal is vLLM's flat ``{"error":"Unauthorized"}`` with status 401.
    """

    def __init__(self, app: ASGIApp, *, api_key_env: str) -> None:
        self._app = app
        self._env = check_env_name(api_key_env)
        self._warned = False

    def __repr__(self) -> str:
        return f"BearerKeyGuard(api_key_env={self._env!r})"

    def _allowed(self, scope: Scope) -> bool:
        key = os.environ.get(self._env, "")
        if not key:
            if not self._warned:
                self._warned = True
                LOG.warning("API key variable %s is unset or empty: refusing /v1", self._env)
            return False
        expected = b"Bearer " + key.encode("utf-8")
        sent = [v for k, v in scope.get("headers", []) if k == b"authorization"]
        return len(sent) == 1 and hmac.compare_digest(sent[0], expected)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        guarded = path == "/v1" or path.startswith("/v1/")
        if scope["type"] != "http" or not guarded or self._allowed(scope):
            await self._app(scope, receive, send)
            return
        headers = [(b"content-type", _JSON.encode()), (b"content-length", b"24")]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": _UNAUTHORIZED})


def _json_response(body: object, status: int = 200) -> Response:
    return Response(content=dumps(body), status_code=status, media_type=_JSON)  # type: ignore[arg-type]


def _error_response(exc: ProtocolError) -> Response:
    return _json_response(exc.body(), exc.status)


def _internal_error() -> Response:
    body = {"error": {"message": "internal error", "type": "InternalServerError",
                      "param": None, "code": 500}}  # fmt: skip
    return _json_response(body, 500)


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 once it exceeds ``limit`` (before buffering more)."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise ProtocolError(f"request body over {limit} bytes", status=413)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ProtocolError(f"request body over {limit} bytes", status=413)
        chunks.append(chunk)
    return b"".join(chunks)


def _score_all(teacher: ReferenceTeacher, request: CompletionRequest) -> bytes:
    top_k = request.top_k(teacher.limits.vocab_width)
    scored = [
        teacher.score(p, top_k, request.max_tokens, request.sampling) for p in request.prompts
    ]
    body = completion_body(
        request, scored, decode=teacher.decode_token, system_fingerprint=teacher.system_fingerprint
    )
    return dumps(body)


def _add_routes(app: FastAPI, teacher: ReferenceTeacher) -> None:
    limits = teacher.limits
    created = int(time.time())

    @app.get("/health", operation_id="health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/version", operation_id="version")
    async def version() -> Response:
        return _json_response({"version": teacher.version})

    @app.get("/v1/models", operation_id="list_models")
    async def list_models() -> Response:
        return _json_response(models_body(limits, created=created))

    @app.post("/v1/completions", operation_id="create_completion")
    async def create_completion(request: Request) -> Response:
        try:
            raw = await _read_body(request, limits.max_body_bytes())
            parsed = parse_completion_request(decode_json_body(raw, limits))
            check_against_teacher(parsed, limits)
            content = await run_in_threadpool(_score_all, teacher, parsed)
        except ProtocolError as exc:
            return _error_response(exc)
        except KilnError as exc:
            LOG.error("completion failed: %s", exc)
            return _internal_error()
        except Exception:
            LOG.exception("completion failed unexpectedly")
            return _internal_error()
        return Response(content=content, media_type=_JSON)


def create_reference_app(teacher: ReferenceTeacher, *, api_key_env: str | None) -> FastAPI:
    """The reference teacher's app; ``api_key_env`` names the key variable, or None."""
    if api_key_env is not None:
        check_env_name(api_key_env)
    app = FastAPI(title="kiln reference teacher", openapi_url=None, docs_url=None, redoc_url=None)
    _add_routes(app, teacher)
    if api_key_env is not None:
        app.add_middleware(BearerKeyGuard, api_key_env=api_key_env)
    return app


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0 picks a free one)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise InputError(f"cannot resolve host {host!r}: {exc}", rule="reference.host") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise InputError(f"cannot listen on {host}:{port}: {exc}", rule="reference.port") from None
    return sock


def run_reference_server(
    app: FastAPI,
    sock: socket.socket,
    *,
    log_level: str = "warning",
    tls: tuple[Path, Path] | None = None,
) -> None:
    """Serve ``app`` on the bound ``sock`` until SIGINT/SIGTERM (blocking); HTTPS with
    ``tls`` = (certificate chain PEM, key PEM)."""
    import uvicorn

    ssl_options: dict[str, Any] = {}
    if tls is not None:
        ssl_options = {"ssl_certfile": str(tls[0]), "ssl_keyfile": str(tls[1])}
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=5,
        server_header=False,
        **ssl_options,
    )
    uvicorn.Server(config).run(sockets=[sock])
