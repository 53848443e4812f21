"""What the synchronous and asynchronous registry clients share (no I/O here).

Owns ``RegistryClientError``, the checks of the base URL, alias and job id,
the client's settings (``ClientSettings``: base URL, headers with the bearer
token, timeout, TLS context), ``Call`` (one API operation: method, path,
body and how its JSON answer is parsed; one constructor per operation is in
``client.ops``), ``Request`` (an operation of several requests), the paging
guard (``Pager``),
and ``interpret``, which turns a status and a bounded body into a value or a
``RegistryClientError``.  ``kiln_registry.client.sync`` (``RegistryClient``) and
``kiln_registry.client.asynchronous`` (``AsyncRegistryClient``) only move bytes.

Imports httpx (types only), pydantic, ``kiln_registry.domain`` (errors, text, vocabulary),
``client.tls`` and the wire schemas; never FastAPI, the database or numpy.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import sys
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from kiln_registry.client.tls import (
    ca_file_from,
    check_token,
    client_cert_from,
    tls_context,
    tls_refusal,
    token_from_env,
)
from kiln_registry.domain.aliases import alias_path_segment, alias_problem
from kiln_registry.domain.errors import InputError, KilnError
from kiln_registry.domain.text import error_location, line_excerpt, quoted
from kiln_registry.domain.vocabulary import TERMINAL_JOB_STATUSES
from kiln_registry.wire.jobs import JOB_ID_PATTERN, JobPublic
from kiln_registry.wire.system import ErrorResponse

DEFAULT_SERVER = "http://127.0.0.1:8420"
DEFAULT_TIMEOUT_S = 60.0
MAX_RESPONSE_BYTES = 32 * 1024 * 1024
MAX_RESULT_BYTES = 1 << 40  # a corpus is streamed to disk, never held in memory
MAX_EXCERPT_CHARS = 200
MAX_RECEIPTS = 1000
MAX_PAGES = 10_000  # a list that never ends is refused after this many pages
TERMINAL = frozenset(TERMINAL_JOB_STATUSES)
CONNECT_HINT = (
    "is `kiln serve` running there? check with `curl {url}/health`; pass --server URL or set"
    " KILN_SERVER"
)

T = TypeVar("T")
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


def excerpt(data: bytes) -> str:
    """A short, single-line, printable excerpt of an unexpected body."""
    return line_excerpt(data, MAX_EXCERPT_CHARS)


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


def job_id_path(job_id: str) -> str:
    if not re.fullmatch(JOB_ID_PATTERN, job_id):
        raise InputError(
            f"{quoted(job_id, 40)} is not a job id (job-<24 hex>)", rule="client.job_id"
        )
    return job_id


def check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_RECEIPTS:
        raise InputError(f"limit must be in 1..={MAX_RECEIPTS}", rule="client.limit")
    return limit


@dataclass(frozen=True)
class ClientSettings:
    """The checked constructor arguments both clients build their httpx client from."""

    base_url: str
    timeout: float
    headers: dict[str, str] = field(repr=False)
    verify: ssl.SSLContext = field(repr=False)
    max_response_bytes: int

    @classmethod
    def build(
        cls,
        base_url: str,
        *,
        timeout: float,
        max_response_bytes: int,
        token: str | None,
        token_env: str | None,
        ca_file: Path | None,
        client_cert: tuple[Path, Path] | None,
    ) -> ClientSettings:
        if not 0 < timeout <= 3600:
            raise InputError("client timeout must be in (0, 3600] seconds", rule="client.timeout")
        url = check_base_url(base_url)
        headers = {"accept": "application/json", "accept-encoding": "identity"}
        if token is None:
            token = token_from_env(token_env, os.environ)  # $token_env, else $KILN_TOKEN
        if token is not None:
            headers["authorization"] = f"Bearer {check_token(token)}"
        # The options, else $KILN_CA_FILE / $KILN_CLIENT_CERT_FILE / $KILN_CLIENT_KEY_FILE.
        if client_cert is None:
            client_cert = client_cert_from(None, None, os.environ)
        verify = tls_context(ca_file_from(ca_file, os.environ), client_cert)
        return cls(url, timeout, headers, verify, max_response_bytes)


@dataclass(frozen=True)
class Call(Generic[T]):
    """One operation: ``method path`` with an optional JSON body, and its answer's parser."""

    method: str
    path: str
    parse: Callable[[Any], T]
    body: object = None

    def content(self) -> tuple[bytes | None, dict[str, str] | None]:
        if self.body is None:
            return None, None
        return json.dumps(self.body).encode("utf-8"), {"content-type": "application/json"}

    @property
    def where(self) -> str:
        return f"{self.method} {self.path.split('?')[0]}"


class BlockingClient(Protocol):
    """What a ``Request`` uses of ``RegistryClient`` (``client.core.Blocking``)."""

    base_url: str

    def _run(self, op: Call[T]) -> T: ...

    def _stream_into(self, path: str, write: Callable[[bytes], None]) -> Mapping[str, str]: ...

    def get_job(self, job_id: str) -> JobPublic: ...

    def signing_keys(self) -> dict[str, Any]: ...


class AwaitingClient(Protocol):
    """What a ``Request`` uses of ``AsyncRegistryClient`` (``client.core.Awaiting``)."""

    base_url: str

    async def _run(self, op: Call[T]) -> T: ...

    async def _stream_into(
        self, path: str, write: Callable[[bytes], None]
    ) -> Mapping[str, str]: ...

    async def get_job(self, job_id: str) -> JobPublic: ...

    async def signing_keys(self) -> dict[str, Any]: ...


class Request(Generic[T]):
    """An operation of more than one request (wait, download): either client runs it.

    ``blocking`` runs it on a ``RegistryClient``, ``awaiting`` on an
    ``AsyncRegistryClient``; both through the client's own operations.
    """

    def blocking(self, client: BlockingClient) -> T:
        raise NotImplementedError

    async def awaiting(self, client: AwaitingClient) -> T:
        raise NotImplementedError


def invalid(what: str) -> RegistryClientError:
    return RegistryClientError(
        what, status=502, code="registry_response_invalid", rule="client.response"
    )


def unreachable(base_url: str, what: str) -> RegistryClientError:
    # Called in an except block: a TLS setting may explain the failure (issue 15: mTLS).
    tls = tls_refusal(sys.exc_info()[1], https=base_url.startswith("https://"), base_url=base_url)
    if tls is not None:
        code, message, hint = tls
        return RegistryClientError(
            f"{message} ({base_url})", status=503, code=code, rule="client.tls", hint=hint
        )
    return RegistryClientError(
        f"could not reach the registry at {base_url}: the request {what}",
        status=503,
        code="registry_unreachable",
        rule="client.connect",
        hint=CONNECT_HINT.format(url=base_url),
    )


def _model(model: type[_Model], where: str) -> Callable[[Any], _Model]:
    def parse(data: Any) -> _Model:
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            fields = sorted({error_location(e["loc"], empty="body") for e in exc.errors()})
            raise invalid(
                f"{where} answered a body that is not a {model.__name__}"
                f" (bad fields: {', '.join(fields[:10])})"
            ) from None

    return parse


def call(method: str, path: str, model: type[_Model], body: object = None) -> Call[_Model]:
    return Call(method, path, _model(model, f"{method} {path.split('?')[0]}"), body)


def refusal(status: int, raw: bytes, retry_after: int | None) -> RegistryClientError:
    try:
        envelope = ErrorResponse.model_validate_json(raw)
    except ValidationError:
        return RegistryClientError(
            f"the registry answered HTTP {status} without an error envelope: {excerpt(raw)!r}",
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


def check_status(status: int, raw: bytes, headers: Mapping[str, str]) -> None:
    """Raise for a redirect or an error status (``raw`` is the bounded body)."""
    if 300 <= status < 400:
        raise RegistryClientError(
            f"the registry answered HTTP {status} (a redirect); redirects are not followed",
            status=status,
            code="registry_redirect",
            rule="client.redirect",
            hint="point --server at the registry itself",
        )
    if status >= 400:
        retry = headers.get("retry-after", "")
        raise refusal(status, raw, int(retry) if retry.isdigit() else None)


def interpret(op: Call[T], status: int, raw: bytes, headers: Mapping[str, str]) -> T:
    check_status(status, raw, headers)
    try:
        data = json.loads(raw)
    except ValueError:
        raise invalid(f"{op.where} answered a body that is not JSON") from None
    return op.parse(data)


def declared_too_large(headers: Mapping[str, str], limit: int) -> RegistryClientError | None:
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return invalid(f"the response declares {declared} bytes, over {limit}")
    return None


def too_large(limit: int) -> RegistryClientError:
    return invalid(f"the response is larger than {limit} bytes")


class Pager:
    """Follows ``next_cursor`` across pages; refuses a repeated cursor or endless pages."""

    def __init__(self) -> None:
        self.cursor: str | None = None
        self._seen: set[str] = set()
        self.pages = 0
        self.done = False

    def advance(self, next_cursor: str | None) -> None:
        self.pages += 1
        if next_cursor is None:
            self.done = True
            return
        if next_cursor in self._seen or self.pages >= MAX_PAGES:
            raise invalid("the registry's list did not end (a cursor repeated or too many pages)")
        self._seen.add(next_cursor)
        self.cursor = next_cursor
