"""The registry's access control: a pure ASGI layer in front of everything else.

Every HTTP request's scope comes from ``auth.scopes.required_scope`` (anything
unlisted needs ``admin``; the open paths are open for ``GET``/``HEAD`` only).
When ``[server] auth = "required"`` the request
must carry ``Authorization: Bearer <token>`` naming a stored, unexpired token
(``auth.cache.TokenTable``: one SHA-256 and one dict lookup; a commit by any
process, such as ``kiln tokens revoke``, reloads the table before the next
request).  Missing, malformed, unknown, expired or revoked tokens get ``401``
``unauthorized`` with ``WWW-Authenticate: Bearer``; a token without the scope
gets ``403`` ``forbidden``; a token in the query string is refused (it would
land in access logs).  Bodies use Kiln's error envelope.

The caller identity is stored for inner layers and routes as
``scope["state"]["kiln_token"]``: a frozen ``auth.tokens.TokenIdentity``
(``name``, ``scopes``) or ``None`` when auth is off.  (Per-token probe-slot
caps read it there.)

Every state change (one of the routes ``auth.scopes.audit_action`` names)
that passes the check is written to ``audit_events`` before its last response
byte is sent: token name, action, alias or job id (secrets and token-shaped
text redacted, as in the log file), outcome (``ok`` < 400, ``refused`` < 500,
else ``failed``) and status.  A request whose handler raised before its
response was complete (a crash) is recorded as ``failed`` with status 500
before the exception goes on to the server's error handler.  A token's
attempt past its scope (403) is recorded too, and so is a token holder's
non-GET request to any other path (``post /v1/x``: a route added later is
audited before it is listed).  Nothing else writes a row: a request refused
with 401 never does, and without a token (auth off) only the listed state
changes do (``POST /health``, any method on the pages, an unknown path write
nothing), so an anonymous caller cannot grow the table (issue 27, item 1).

The log never forgets to make room: before a state change runs, the log must
have room for its row (``AuthStore.room``: fewer than ``audit_max_events``
events, or an oldest one older than ``audit_keep_days``); when it has none the
change is refused with ``503 audit_log_full`` and ``Retry-After`` (when the
oldest event may be dropped) and nothing changes.
A token holder's state changes are admitted by ``auth.gate.CallerGate``:
a few at a time per token, more waiting their turn, past that ``429
caller_busy`` with ``Retry-After`` before anything is read or written, so
one token's flood leaves the server to other callers and to lookups.  An
``admin`` token (the operator, trusted with every scope) keeps the per-token
concurrency bound but not the start rate: an operator's script of many quick
changes, or one refused at once (a 405), is never slowed to the flood rate.
Last-used times are written in batches (``TokenTable.due_last_used``).
Imports the standard library, anyio and the ``auth`` package.
"""

from __future__ import annotations

import json
from typing import Final

import anyio

from kiln_registry.auth.cache import TokenTable
from kiln_registry.auth.gate import CallerBusy, CallerGate
from kiln_registry.auth.repository import AuditRoom
from kiln_registry.auth.scopes import audit_action, fallback_action, required_scope
from kiln_registry.auth.store import AuthStore
from kiln_registry.auth.tokens import TokenIdentity
from kiln_registry.credentials.redaction import redact_text, redact_tokens, token_problem
from kiln_registry.db.data_version import version_scope
from kiln_registry.domain.asgi import ASGIApp, Message, Receive, Scope, Send

STATE_KEY: Final = "kiln_token"
READ_ONLY: Final = frozenset({"GET", "HEAD", "OPTIONS"})
ADMIN_RATE_PER_S: Final = 1000.0  # admin tokens: the concurrency bound only, in effect
ADMIN_BURST: Final = 1000
MAX_CAPTURE: Final = 64 * 1024
QUERY_TOKEN_MARKS: Final = (b"kiln_", b"kiln%5f", b"kiln%5F", b"access_token=", b"token=")
HOW_TO: Final = (
    "create a token with `kiln tokens create --scope ...` and send it as"
    " `Authorization: Bearer <token>` (the CLI reads it from --token-env NAME or KILN_TOKEN)"
)


Refusal = tuple[int, bytes]


def _error(status: int, code: str, message: str, hint: str) -> Refusal:
    body = {"error": {"code": code, "message": message, "hint": hint}}
    return status, json.dumps(body).encode("utf-8")


LOG_FULL: Final = _error(
    503,
    "audit_log_full",
    "the audit log is full: it holds [server] audit_max_events events, none older than"
    " audit_keep_days, and keeps them rather than forgetting any; nothing was changed",
    "retry after Retry-After seconds, or an admin raises [server] audit_max_events (or"
    " lowers audit_keep_days) and restarts the registry",
)


def _busy(message: str) -> Refusal:
    return _error(
        429,
        "caller_busy",
        f"{message}; nothing was changed",
        "wait for your earlier requests to finish (retry after Retry-After seconds);"
        " each token runs a few state changes at a time",
    )


async def _reply(send: Send, status: int, body: bytes, retry_after: int | None = None) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode("ascii")),
    ]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode("ascii")))
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def bearer(scope: Scope) -> str | None:
    """The token of the one ``Authorization: Bearer`` header; "" for a malformed one."""
    found: str | None = None
    for key, value in scope["headers"]:
        if key == b"authorization":
            if found is not None:
                return ""
            scheme, _, token = value.partition(b" ")
            if scheme.lower() != b"bearer" or not token or len(token) > 512:
                return ""
            found = token.strip().decode("latin-1")
    return found


class AuthMiddleware:
    """Check the caller's token and scope; record state changes in the audit log."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        table: TokenTable | None,
        store: AuthStore | None,
        metrics_public: bool = False,
        public_docs: bool = False,
        secret_names: frozenset[str] = frozenset(),
        gate: CallerGate | None = None,
    ) -> None:
        self._app = app
        self._table = table
        self._store = store
        self._gate = gate or CallerGate()
        self._admin_gate = CallerGate(rate_per_s=ADMIN_RATE_PER_S, burst=ADMIN_BURST)
        self._metrics_public = metrics_public
        self._public_docs = public_docs
        # A refused body's alias is the caller's text: scrub every configured secret from it.
        self._secret_names = secret_names

    def _check(self, scope: Scope, needed: str) -> tuple[TokenIdentity | None, Refusal | None]:
        """The caller (None if unknown) and the refusal (None when allowed)."""
        assert self._table is not None
        if any(mark in scope.get("query_string", b"") for mark in QUERY_TOKEN_MARKS):
            return None, _error(
                401,
                "unauthorized",
                "tokens are accepted only in the Authorization header, never in the query string",
                HOW_TO,
            )
        token = bearer(scope)
        if token is None:
            return None, _error(
                401, "unauthorized", f"this route needs a token with scope {needed!r}", HOW_TO
            )
        identity = self._table.lookup(token) if token else None
        if identity is None:
            problem = token_problem(token) if token else "not one `Authorization: Bearer TOKEN`"
            what = "not valid (unknown, expired or revoked)"
            what = what if problem is None else f"malformed: {problem}"
            return None, _error(401, "unauthorized", f"the bearer token is {what}", HOW_TO)
        if not identity.allows(needed):
            return identity, _error(
                403,
                "forbidden",
                f"token {identity.name!r} lacks scope {needed!r}"
                f" (it has: {', '.join(sorted(identity.scopes))})",
                "ask an admin for a token with that scope",
            )
        return identity, None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        if scope["method"] in READ_ONLY:
            # One database version read serves the token check and the entry cache.
            with version_scope():
                await self._serve(scope, receive, send)
            return
        await self._serve(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        identity: TokenIdentity | None = None
        if self._table is not None:
            needed = required_scope(
                scope["method"], scope["path"], metrics_public=self._metrics_public,
                public_docs=self._public_docs,
            )  # fmt: skip
            if needed is not None:
                identity, refusal = self._check(scope, needed)
                if refusal is not None:
                    if refusal[0] == 403 and await self._has_room(scope, identity):
                        await self._audit(scope, b"", 403, identity, None)
                    await _reply(send, *refusal)
                    return
            if self._table.pending:
                await self._touch()
        scope.setdefault("state", {})[STATE_KEY] = identity
        if identity is None or scope["method"] in READ_ONLY:
            await self._changing(scope, receive, send, identity)
            return
        gate = self._admin_gate if "admin" in identity.scopes else self._gate
        try:
            async with gate.turn("token:" + identity.name):
                await self._changing(scope, receive, send, identity)
        except CallerBusy as exc:
            await _reply(send, *_busy(str(exc)), retry_after=1)

    async def _changing(
        self, scope: Scope, receive: Receive, send: Send, identity: TokenIdentity | None
    ) -> None:
        if not _audited_request(scope, identity) or self._store is None:
            await self._app(scope, receive, send)
            return
        room = await self._room()
        if not room.free:
            await _reply(send, *LOG_FULL, retry_after=room.retry_after_s)
            return
        await self._audited(scope, receive, send, identity)

    async def _room(self) -> AuditRoom:
        store = self._store
        assert store is not None
        return await anyio.to_thread.run_sync(store.room)

    async def _has_room(self, scope: Scope, identity: TokenIdentity | None) -> bool:
        """A refusal is recorded only while the log has room."""
        if self._store is None or not _audited_request(scope, identity):
            return False
        return (await self._room()).free

    async def _audited(
        self, scope: Scope, receive: Receive, send: Send, identity: TokenIdentity | None
    ) -> None:
        request_body = bytearray()
        response_body = bytearray()
        status = [500]
        recorded = [False]

        async def capture_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request" and len(request_body) < MAX_CAPTURE:
                request_body.extend(message.get("body", b"")[: MAX_CAPTURE - len(request_body)])
            return message

        async def audit_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif message["type"] == "http.response.body":
                if len(response_body) < MAX_CAPTURE:
                    response_body.extend(message.get("body", b"")[:MAX_CAPTURE])
                if not message.get("more_body", False):
                    recorded[0] = True
                    await self._audit(
                        scope, bytes(request_body), status[0], identity, bytes(response_body)
                    )
            await send(message)

        try:
            await self._app(scope, capture_receive, audit_send)
        except Exception:
            if not recorded[0]:  # the handler crashed: the state change is recorded as failed
                recorded[0] = True
                await self._audit(scope, bytes(request_body), 500, identity, None)
            raise

    async def _audit(
        self,
        scope: Scope,
        request_body: bytes,
        status: int,
        identity: TokenIdentity | None,
        response_body: bytes | None,
    ) -> None:
        if self._store is None or not _audited_request(scope, identity):
            return
        method, path = scope["method"], scope["path"]
        action, target = audit_action(method, path) or (fallback_action(method, path), None)
        if target is None:
            source = request_body if action == "teacher.register" else response_body
            key = "alias" if action == "teacher.register" else "id"
            target = _json_text(source, key)
        if target is not None:
            # The same redaction as the log file: secret values, then token shapes (item 15).
            target = redact_tokens(redact_text(target, self._secret_names))
        outcome = "ok" if status < 400 else "refused" if status < 500 else "failed"
        name = None if identity is None else identity.name
        store = self._store
        await anyio.to_thread.run_sync(
            lambda: store.audit(
                token_name=name, action=action, target=target, outcome=outcome, status=status
            )
        )

    async def _touch(self) -> None:
        assert self._table is not None
        due = self._table.due_last_used()
        if due and self._store is not None:
            store = self._store
            await anyio.to_thread.run_sync(lambda: store.touch(due))


def _audited_request(scope: Scope, identity: TokenIdentity | None) -> bool:
    """A listed state change, or a token holder's non-GET request to any path."""
    if scope["method"] in READ_ONLY:
        return False
    return identity is not None or audit_action(scope["method"], scope["path"]) is not None


def _json_text(body: bytes | None, key: str) -> str | None:
    """``body[key]`` when ``body`` is a JSON object with a string there."""
    if not body or len(body) >= MAX_CAPTURE:
        return None
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    value = doc.get(key) if isinstance(doc, dict) else None
    if not isinstance(value, str):
        return None
    # A refused body may hold a lone surrogate (issue 15, attack 6): never store one.
    return value.encode("utf-8", "backslashreplace").decode("utf-8")
