"""What both registry clients are made of: construction, the table of operations, transport.

``ClientCore`` checks the constructor arguments (``ClientSettings``), opens
the httpx client and holds the one table of API operations: each public
operation (``health``, ``get_teacher``, ``submit_job``, ``wait_job``,
``download_result`` ...) is an ``Operation`` built from its constructor in
``kiln_registry.client.ops``: a ``Call`` (one request) or a ``Request``
(several, in ``client.jobs``) that each kind of client knows how to run.
Read from a ``Blocking`` client (``RegistryClient``) it is a plain method
that returns the answer; read from an ``Awaiting`` client
(``AsyncRegistryClient``) it is a coroutine function.  Either way the
arguments are checked by the ``ops`` function (on the call, or when the
coroutine runs) and the request goes through the client's own ``_run``.
``translate_errors`` maps httpx failures to ``RegistryClientError`` and
``BoundedBody`` reads an answer within the size limit, for both.

Imports httpx, ``client.base`` and ``client.ops``; never FastAPI, the
database, the probe or the launcher.  Nothing happens at import time.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, Generic, ParamSpec, TypeVar, overload

import httpx

from kiln_registry.client import base, ops
from kiln_registry.client.base import (
    DEFAULT_SERVER,
    DEFAULT_TIMEOUT_S,
    MAX_RESPONSE_BYTES,
    Call,
    ClientSettings,
    Request,
)

P = ParamSpec("P")
T = TypeVar("T")
TransportT = TypeVar("TransportT")
HttpT = TypeVar("HttpT")
F = TypeVar("F", bound=Callable[..., Any])


class Operation(Generic[P, T]):
    """One API operation as a method of both clients (see the module docstring)."""

    def __init__(self, build: Callable[P, Call[T] | Request[T]]) -> None:
        self.build = build
        self.__doc__ = build.__doc__
        self.name = build.__name__

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> Callable[..., Any]: ...

    @overload
    def __get__(self, obj: Blocking, owner: type[Any]) -> Callable[P, T]: ...

    @overload
    def __get__(self, obj: Awaiting, owner: type[Any]) -> Callable[P, Coroutine[Any, Any, T]]: ...

    def __get__(self, obj: object, owner: type[Any]) -> Any:
        if obj is None:
            return self._unbound(owner)
        build = self.build
        if isinstance(obj, Awaiting):

            async def awaited(*args: P.args, **kwargs: P.kwargs) -> T:
                request = build(*args, **kwargs)
                if isinstance(request, Request):
                    return await request.awaiting(obj)
                return await obj._run(request)

            return _documented(functools.update_wrapper(awaited, build), build, False)
        assert isinstance(obj, Blocking)

        def blocking(*args: P.args, **kwargs: P.kwargs) -> T:
            request = build(*args, **kwargs)
            if isinstance(request, Request):
                return request.blocking(obj)
            return obj._run(request)

        return _documented(functools.update_wrapper(blocking, build), build, False)

    def _unbound(self, owner: type[Any]) -> Callable[..., Any]:
        """``RegistryClient.submit_job`` itself: a function ``help()`` shows with its signature."""
        name = self.name

        def method(self_: Any, *args: Any, **kwargs: Any) -> Any:
            return getattr(self_, name)(*args, **kwargs)

        method.__name__, method.__qualname__ = name, f"{owner.__name__}.{name}"
        method.__doc__, method.__module__ = self.build.__doc__, owner.__module__
        return _documented(method, self.build, True)


# What a multi-request operation answers (its ``Request`` subclass is not the answer).
_ANSWERS = {"Waiter": "JobPublic", "Download": "DownloadedCorpus"}


def _documented(method: F, build: Callable[..., Any], bound: bool) -> F:
    """Give ``method`` the operation's real signature, answering the answer type."""
    signature = inspect.signature(build)
    answer = str(signature.return_annotation)
    for wrapper in ("Call[", "Request["):
        if answer.startswith(wrapper) and answer.endswith("]"):
            answer = answer[len(wrapper) : -1]
    params = list(signature.parameters.values())
    if bound:
        params.insert(0, inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY))
    method.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=params, return_annotation=_ANSWERS.get(answer, answer)
    )
    return method


class ClientCore(Generic[TransportT, HttpT]):
    """The checked settings, the httpx client and the operations both clients share."""

    _label: ClassVar[str]

    def __init__(
        self,
        base_url: str = DEFAULT_SERVER,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: TransportT | None = None,
        trust_env: bool = False,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        token: str | None = None,
        token_env: str | None = None,
        ca_file: Path | None = None,
        client_cert: tuple[Path, Path] | None = None,
    ) -> None:
        settings = ClientSettings.build(
            base_url,
            timeout=timeout,
            max_response_bytes=max_response_bytes,
            token=token,
            token_env=token_env,
            ca_file=ca_file,
            client_cert=client_cert,
        )
        self.base_url = settings.base_url
        self._limit = settings.max_response_bytes
        options: dict[str, Any] = {
            "base_url": self.base_url,
            "timeout": httpx.Timeout(settings.timeout),
            "transport": transport,
            "trust_env": trust_env,
            "follow_redirects": False,
            "headers": settings.headers,
            "verify": settings.verify,
        }
        self._http: HttpT = self._open(options)

    def _open(self, options: Mapping[str, Any]) -> HttpT:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{self._label}(base_url={self.base_url!r})"

    # -- system -------------------------------------------------------------

    health = Operation(ops.health)
    ready = Operation(ops.ready)

    # -- teachers -----------------------------------------------------------

    teachers_page = Operation(ops.teachers_page)
    get_teacher = Operation(ops.get_teacher)
    register_teacher = Operation(ops.register_teacher)
    delete_teacher = Operation(ops.delete_teacher)
    probe_teacher = Operation(ops.probe_teacher)
    report_teacher = Operation(ops.report_teacher)
    launch_teacher = Operation(ops.launch_teacher)
    receipts = Operation(ops.receipts)

    # -- admin --------------------------------------------------------------

    audit = Operation(ops.audit)
    release_alias = Operation(ops.release_alias)

    # -- jobs ---------------------------------------------------------------

    submit_job = Operation(ops.submit_job)
    submit = Operation(ops.submit)
    jobs_page = Operation(ops.jobs_page)
    get_job = Operation(ops.get_job)
    cancel_job = Operation(ops.cancel_job)
    delete_job = Operation(ops.delete_job)
    wait_job = Operation(ops.wait_job)
    signing_keys = Operation(ops.signing_keys)
    download_result = Operation(ops.download_result)


class Blocking(ClientCore[httpx.BaseTransport, httpx.Client]):
    """A client whose ``_run`` returns the answer (``RegistryClient``)."""

    def _open(self, options: Mapping[str, Any]) -> httpx.Client:
        return httpx.Client(**options)

    def _run(self, op: Call[T]) -> T:
        raise NotImplementedError

    def _stream_into(self, path: str, write: Callable[[bytes], None]) -> httpx.Headers:
        raise NotImplementedError


class Awaiting(ClientCore[httpx.AsyncBaseTransport, httpx.AsyncClient]):
    """A client whose ``_run`` is a coroutine (``AsyncRegistryClient``)."""

    def _open(self, options: Mapping[str, Any]) -> httpx.AsyncClient:
        return httpx.AsyncClient(**options)

    async def _run(self, op: Call[T]) -> T:
        raise NotImplementedError

    async def _stream_into(self, path: str, write: Callable[[bytes], None]) -> httpx.Headers:
        raise NotImplementedError


@contextmanager
def translate_errors(base_url: str) -> Iterator[None]:
    """httpx's timeouts and transport failures as ``RegistryClientError`` (503)."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise base.unreachable(base_url, f"timed out ({type(exc).__name__})") from exc
    except httpx.HTTPError as exc:
        raise base.unreachable(base_url, f"failed ({type(exc).__name__})") from exc


class BoundedBody:
    """An answer's body, refused once it (or its declared length) passes ``limit``."""

    def __init__(self, headers: Mapping[str, str], limit: int) -> None:
        error = base.declared_too_large(headers, limit)
        if error is not None:
            raise error
        self._limit = limit
        self._body = bytearray()

    def add(self, chunk: bytes) -> None:
        if len(self._body) + len(chunk) > self._limit:
            raise base.too_large(self._limit)
        self._body += chunk

    def bytes(self) -> bytes:
        return bytes(self._body)
