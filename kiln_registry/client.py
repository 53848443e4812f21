"""A small typed, synchronous client for the registry API.

Owns ``RegistryClient`` (one method per ``/v1/teachers`` operation plus
``/health`` and ``/ready``), the translation of every failure into
``RegistryClientError`` at exactly one place, and the bounded reading of
response bodies.  Responses are validated into the wire schemas of
``kiln_registry.api.schemas``; a body that does not fit is refused, never
half-trusted.

Transport rules: redirects are never followed (a 3xx is an error), proxy and
certificate settings are taken from the environment only when
``trust_env=True`` is asked for, and the base URL may not carry userinfo, a
query or a fragment.  Imports httpx, pydantic, ``kiln_registry.errors`` and
``kiln_registry.api.schemas`` only; never FastAPI, the database, the probe or
the launcher.  Nothing happens at import time.

Access (issue 15): ``token`` (else the variable ``token_env`` names, else
``$KILN_TOKEN``) is sent as ``Authorization: Bearer`` (it never appears in
``repr`` or an error); TLS is verified against the system store
or ``ca_file``, with ``client_cert`` (cert, key) for mutual TLS
(``kiln_registry.client_tls``).
"""

from __future__ import annotations

import json
import os
import urllib.parse
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from kiln_registry.aliases import alias_path_segment, alias_problem
from kiln_registry.api.schemas import (
    DeleteTeacherResponse,
    ErrorResponse,
    HealthResponse,
    ProbeReceipt,
    ProbeReportPublic,
    ReadyResponse,
    ReceiptsResponse,
    TeacherEntry,
    TeachersListResponse,
)
from kiln_registry.auth.wire import AuditEvent, AuditResponse, ReleaseResponse
from kiln_registry.client_tls import check_token, tls_context, token_from_env
from kiln_registry.errors import InputError, KilnError

DEFAULT_SERVER = "http://127.0.0.1:8420"
DEFAULT_TIMEOUT_S = 60.0
MAX_RESPONSE_BYTES = 32 * 1024 * 1024
MAX_EXCERPT_CHARS = 200
MAX_RECEIPTS = 1000

_Model = TypeVar("_Model", bound=BaseModel)


class RegistryClientError(KilnError):
    """The registry refused a request, or could not be reached or understood.

    ``status`` is the HTTP status the registry answered (502 for an answer
    that could not be understood, 503 when it could not be reached) and
    ``code`` the envelope's code (``teacher_alias_exists`` ...) or one of
    ``registry_unreachable``, ``registry_redirect``,
    ``registry_response_invalid``.  ``server_message`` is the registry's own
    message, unchanged.
    """

    status = 502
    code = "registry_response_invalid"

    def __init__(
        self,
        message: str,
        *,
        status: int,
        code: str,
        hint: str | None = None,
        rule: str | None = None,
        server_message: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message, rule=rule, hint=hint, code=code, status=status)
        self.server_message = server_message
        self.retry_after = retry_after


def _excerpt(data: bytes) -> str:
    """A short, single-line, printable excerpt of an unexpected body."""
    text = data[: MAX_EXCERPT_CHARS * 4].decode("utf-8", errors="replace")
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    return " ".join(text.split())[:MAX_EXCERPT_CHARS]


def check_base_url(base_url: str) -> str:
    """The base URL without a trailing ``/``; refused unless plain http(s)://host[:port][/path]."""
    if len(base_url) > 2048 or any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in base_url):
        raise InputError(
            "registry URL is too long or contains white space or control characters",
            rule="client.server_url",
        )
    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(
            "registry URL must be http://host[:port] or https://host[:port]",
            rule="client.server_url",
            hint="for example --server http://127.0.0.1:8420",
        )
    if "@" in parts.netloc or parts.query or parts.fragment or "?" in base_url:
        # Never echo the URL: userinfo or a query could hold a secret.
        raise InputError(
            "registry URL must not carry userinfo, a query or a fragment",
            rule="client.server_url",
        )
    try:
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        raise InputError("registry URL has an invalid port", rule="client.server_url") from None
    return base_url.rstrip("/")


def alias_path(alias: str) -> str:
    """The alias as one percent-encoded path segment (``/`` as ``%2F``).

    An alias the registry could never hold (blank, over ``MAX_ALIAS_CHARS``,
    control characters, a reserved last segment) is refused here, before a
    request whose path could be read another way is sent.
    """
    problem = alias_problem(alias)
    if problem is not None:
        raise InputError(f"invalid teacher alias: {problem}", rule="client.alias")
    return alias_path_segment(alias)


class RegistryClient:
    """``with RegistryClient("http://127.0.0.1:8420") as client: client.list_teachers()``."""

    def __init__(
        self,
        base_url: str = DEFAULT_SERVER,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
        trust_env: bool = False,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        token: str | None = None,
        token_env: str | None = None,
        ca_file: Path | None = None,
        client_cert: tuple[Path, Path] | None = None,
    ) -> None:
        if not 0 < timeout <= 3600:
            raise InputError("client timeout must be in (0, 3600] seconds", rule="client.timeout")
        self.base_url = check_base_url(base_url)
        self._limit = max_response_bytes
        headers = {"accept": "application/json", "accept-encoding": "identity"}
        if token is None:
            token = token_from_env(token_env, os.environ)  # $token_env, else $KILN_TOKEN
        if token is not None:
            headers["authorization"] = f"Bearer {check_token(token)}"
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout),
            transport=transport,
            trust_env=trust_env,
            follow_redirects=False,
            headers=headers,
            verify=tls_context(ca_file, client_cert),
        )

    def __repr__(self) -> str:
        return f"RegistryClient(base_url={self.base_url!r})"

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- operations ---------------------------------------------------------

    def health(self) -> HealthResponse:
        return self._call("GET", "/health", HealthResponse)

    def ready(self) -> ReadyResponse:
        return self._call("GET", "/ready", ReadyResponse)

    def list_teachers(self) -> list[TeacherEntry]:
        return self._call("GET", "/v1/teachers", TeachersListResponse).teachers

    def get_teacher(self, alias: str) -> TeacherEntry:
        return self._call("GET", f"/v1/teachers/{alias_path(alias)}", TeacherEntry)

    def register_teacher(
        self,
        *,
        alias: str,
        kind: str,
        provider: str | None = None,
        model_id: str | None = None,
        url: str | None = None,
        credential_id: str | None = None,
        notes: str | None = None,
        adapter: str | None = None,
        launch_profile: str | None = None,
    ) -> TeacherEntry:
        """``POST /v1/teachers``; fields left as None are not sent (the server validates)."""
        fields = {
            "alias": alias,
            "kind": kind,
            "provider": provider,
            "model_id": model_id,
            "url": url,
            "credential_id": credential_id,
            "notes": notes,
            "adapter": adapter,
            "launch_profile": launch_profile,
        }
        body = {name: value for name, value in fields.items() if value is not None}
        return self._call("POST", "/v1/teachers", TeacherEntry, body=body)

    def delete_teacher(self, alias: str) -> DeleteTeacherResponse:
        return self._call("DELETE", f"/v1/teachers/{alias_path(alias)}", DeleteTeacherResponse)

    def probe_teacher(self, alias: str) -> ProbeReportPublic:
        """Re-run the probes against the stored identity; returns the probe report."""
        return self._call("POST", f"/v1/teachers/{alias_path(alias)}/probe", ProbeReportPublic)

    def launch_teacher(self, alias: str) -> TeacherEntry:
        """Relaunch an ``unavailable`` local alias with its stored identity."""
        return self._call("POST", f"/v1/teachers/{alias_path(alias)}/launch", TeacherEntry)

    def receipts(self, alias: str, *, limit: int = 100) -> list[ProbeReceipt]:
        if not 1 <= limit <= MAX_RECEIPTS:
            raise InputError(f"limit must be in 1..={MAX_RECEIPTS}", rule="client.limit")
        path = f"/v1/teachers/{alias_path(alias)}/receipts?limit={limit}"
        return self._call("GET", path, ReceiptsResponse).receipts

    def audit(self, *, limit: int = 100, before: int | None = None) -> list[AuditEvent]:
        """``GET /v1/audit`` (admin): state changes, newest first."""
        if not 1 <= limit <= MAX_RECEIPTS:
            raise InputError(f"limit must be in 1..={MAX_RECEIPTS}", rule="client.limit")
        query = f"?limit={limit}" + ("" if before is None else f"&before={int(before)}")
        return self._call("GET", "/v1/audit" + query, AuditResponse).events

    def release_alias(self, alias: str) -> ReleaseResponse:
        """Free a deleted (reserved) alias (admin)."""
        path = f"/v1/admin/aliases/{alias_path(alias)}/release"
        return self._call("POST", path, ReleaseResponse)

    # -- the one place failures are translated ------------------------------

    def _call(self, method: str, path: str, model: type[_Model], *, body: object = None) -> _Model:
        data = self._request(method, path, body)
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            fields = sorted({".".join(str(p) for p in e["loc"]) or "body" for e in exc.errors()})
            raise self._invalid(
                f"{method} {path.split('?')[0]} answered a body that is not a"
                f" {model.__name__} (bad fields: {', '.join(fields[:10])})"
            ) from None

    def _request(self, method: str, path: str, body: object) -> Any:
        content = None if body is None else json.dumps(body).encode("utf-8")
        headers = {"content-type": "application/json"} if content is not None else None
        try:
            with self._http.stream(method, path, content=content, headers=headers) as response:
                raw = self._read(response)
                status = response.status_code
                retry = response.headers.get("retry-after", "")
        except httpx.TimeoutException as exc:
            raise self._unreachable(f"timed out ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            raise self._unreachable(f"failed ({type(exc).__name__})") from exc
        if 300 <= status < 400:
            raise RegistryClientError(
                f"the registry answered HTTP {status} (a redirect); redirects are not followed",
                status=status,
                code="registry_redirect",
                rule="client.redirect",
                hint="point --server at the registry itself",
            )
        if status >= 400:
            raise self._refusal(status, raw, int(retry) if retry.isdigit() else None)
        try:
            return json.loads(raw)
        except ValueError:
            what = f"{method} {path.split('?')[0]} answered a body that is not JSON"
            raise self._invalid(what) from None

    def _read(self, response: httpx.Response) -> bytes:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._limit:
            raise self._invalid(f"the response declares {declared} bytes, over {self._limit}")
        body = bytearray()
        for chunk in response.iter_raw():
            if len(body) + len(chunk) > self._limit:
                raise self._invalid(f"the response is larger than {self._limit} bytes")
            body += chunk
        return bytes(body)

    def _refusal(self, status: int, raw: bytes, retry_after: int | None) -> RegistryClientError:
        try:
            envelope = ErrorResponse.model_validate_json(raw)
        except ValidationError:
            return RegistryClientError(
                f"the registry answered HTTP {status} without an error envelope: {_excerpt(raw)!r}",
                status=status,
                code="http_error",
                rule="client.http_status",
            )
        err = envelope.error
        return RegistryClientError(
            f"{err.code} (HTTP {status}): {err.message}",
            status=status,
            code=err.code,
            hint=err.hint,
            server_message=err.message,
            retry_after=retry_after,
        )

    def _unreachable(self, what: str) -> RegistryClientError:
        return RegistryClientError(
            f"the request to the registry at {self.base_url} {what}",
            status=503,
            code="registry_unreachable",
            rule="client.connect",
            hint="is `kiln serve` running there? pass --server or set KILN_SERVER",
        )

    def _invalid(self, what: str) -> RegistryClientError:
        return RegistryClientError(
            what, status=502, code="registry_response_invalid", rule="client.response"
        )
