"""Start-up of ``kiln teacher-endpoint``: listening rules, the alias, the proof, uvicorn.

The fail-closed order: the listening rules first (``check_listen``: a host
other than loopback needs TLS files and an API key variable, or
``--insecure-no-auth``), then the alias is read from the registry and
refused unless usable with a pinned identity; every endpoint of it (each
replica of a replica set) is proved with the registry's probes
(``teachers.probing.run_probes``: discovery, K=max_top_k and the cap probe,
against the pin) under the local ``[teachers.credentials.<id>]`` of
``--config``, bound to their exact origin; a replica that fails its proof is
left out and named; with none proved the start fails.  Only then is the port
bound and the base URL printed; the registry is re-read every
``recheck_s`` while serving.

Imports the configuration, credentials, probe and probing seam, the registry
client and (inside ``serve``) uvicorn; nothing happens at import time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kiln_registry.config.access import is_loopback
from kiln_registry.config.settings import CredentialConfig, KilnConfig
from kiln_registry.credentials.resolve import ResolvedTeacher, resolve_teacher_endpoint
from kiln_registry.domain.errors import ConfigError, InputError, KilnError, ProbeFailed
from kiln_registry.endpoint.admission import Limits, Pin
from kiln_registry.endpoint.metrics import EndpointMetrics
from kiln_registry.endpoint.pool import Replica, ReplicaPool
from kiln_registry.endpoint.state import EndpointState, Registry
from kiln_registry.identity.canonical import canonical_json
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.probe.limiter import ProbeLimiter
from kiln_registry.probe.transport import teacher_tls_context
from kiln_registry.probe.wire import TeacherWire
from kiln_registry.teachers.probing import ProbeSetup, run_probes
from kiln_registry.wire.teachers import TeacherEntry

log = logging.getLogger("kiln_registry.endpoint")


@dataclass(frozen=True)
class ListenOptions:
    host: str = "127.0.0.1"
    port: int = 8001
    api_key_env: str | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    insecure_no_auth: bool = False

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert_file is not None else "http"


@dataclass(frozen=True)
class EndpointOptions:
    alias: str
    listen: ListenOptions = field(default_factory=ListenOptions)
    config: KilnConfig | None = None
    limits: Limits = field(default_factory=Limits)
    recheck_s: float = 30.0
    probe_timeout_s: float = 30.0
    request_timeout_s: float = 600.0


def check_listen(listen: ListenOptions) -> None:
    """Off loopback: TLS and an API key, or ``--insecure-no-auth`` (as ``kiln serve``)."""
    if (listen.tls_cert_file is None) != (listen.tls_key_file is None):
        raise ConfigError(
            "--tls-cert-file and --tls-key-file go together", rule="endpoint.tls",
            hint="give both PEM files, or neither",
        )  # fmt: skip
    if is_loopback(listen.host) or listen.insecure_no_auth:
        return
    if listen.api_key_env is None or listen.tls_cert_file is None:
        raise ConfigError(
            f"listening on the non-loopback host {listen.host!r} needs TLS and an API key",
            rule="endpoint.listen_off_loopback",
            hint="pass --tls-cert-file/--tls-key-file and --api-key-env NAME, listen on"
            " 127.0.0.1, or pass --insecure-no-auth to accept the risk",
        )


def tls_context(listen: ListenOptions) -> ssl.SSLContext | None:
    """Load the TLS files once, so a bad one fails before the port is bound."""
    if listen.tls_cert_file is None or listen.tls_key_file is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(listen.tls_cert_file, listen.tls_key_file, password=lambda: b"")
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"--tls-cert-file {listen.tls_cert_file} could not be loaded ({type(exc).__name__})",
            rule="endpoint.tls",
            hint="give the PEM certificate chain and its unencrypted private key",
        ) from None
    return context


def pinned_identity(entry: TeacherEntry) -> TeacherIdentity:
    """The entry's identity, read through the one strict reader, or a refusal."""
    alias = entry.spec.alias
    if not entry.usable or entry.spec.identity is None or entry.identity_revision is None:
        detail = f" ({entry.status_message})" if entry.status_message else ""
        raise InputError(
            f"the alias {alias} is {entry.status.value}, not usable with a pinned identity{detail}",
            rule="endpoint.alias_unusable",
            hint="re-probe or relaunch it (`kiln teachers probe`), or pick a verified alias",
        )
    raw = entry.spec.identity.model_dump(mode="json", by_alias=True)
    identity = TeacherIdentity.from_canonical_json(canonical_json(raw))
    if identity.revision() != entry.identity_revision:
        raise InputError(
            f"the registry's identity of {alias} does not match its revision",
            rule="endpoint.identity_revision",
        )
    return identity


def replica_urls(entry: TeacherEntry) -> list[str]:
    if entry.replicas:
        return [replica.url for replica in entry.replicas]
    if entry.spec.url is None:
        raise InputError(f"the alias {entry.spec.alias} has no URL", rule="endpoint.no_url")
    return [entry.spec.url]


def pin_of(entry: TeacherEntry, identity: TeacherIdentity) -> Pin:
    return Pin(
        served_model_id=entry.spec.model_id,
        vocab_size=identity.vocab_size,
        max_top_k=identity.max_top_k,
        max_model_len=identity.max_model_len,
        max_candidates=identity.max_prompt_logprob_candidates,
    )


async def prove_replicas(
    options: EndpointOptions,
    entry: TeacherEntry,
    identity: TeacherIdentity,
    http: httpx.AsyncClient,
) -> list[Replica]:
    """Prove each endpoint of ``entry`` against ``identity``; those that passed."""
    credentials: Mapping[str, CredentialConfig] = (
        options.config.teachers.credentials if options.config else {}
    )
    urls = replica_urls(entry)
    setup = ProbeSetup(
        http=http,
        student=None,  # the registry checked the student at registration
        limiter=ProbeLimiter(len(urls)),
        timeout_s=options.probe_timeout_s,
        secret_names=options.config.secret_env_names() if options.config else frozenset(),
    )
    ca_file = options.config.server.teacher_ca_file if options.config else None
    tls = teacher_tls_context(ca_file)  # one context for every replica's relay client
    proved: list[Replica] = []
    for url in urls:
        try:
            # Loopback: the endpoint's own listening rules guard a credential-free teacher.
            resolved = resolve_teacher_endpoint(
                url, entry.spec.credential_id, credentials=credentials, server_host="127.0.0.1"
            )
            await run_probes(setup, resolved, entry.spec.model_id, identity)
        except KilnError as exc:
            log.error("replica %s of %s failed its proof: %s", url, entry.spec.alias,
                      exc.one_line())  # fmt: skip
            continue
        proved.append(Replica(url=url, resolved=resolved, wire=relay_wire(resolved, tls)))
    if not proved:
        raise ProbeFailed(
            f"no endpoint of {entry.spec.alias} proved the pinned identity"
            f" ({len(urls)} tried; the log names each failure)",
            rule="endpoint.no_replica_proved",
        )
    return proved


RELAY_MAX_IDLE = 64  # kept-alive connections per replica, as the probes' httpx pool keeps


def relay_wire(resolved: ResolvedTeacher, tls: ssl.SSLContext) -> TeacherWire:
    """The relay's keep-alive client to one proved replica: the registry's teacher TLS trust.

    The lean HTTP/1.1 client the job queue scores with (``probe.wire``): the same request,
    head and body rules as the probes' httpx transport at a fraction of its CPU per
    request; a deadline after the head reads as ``probe.timeout`` (504), as httpx's does.
    """
    return TeacherWire(
        resolved.endpoint.completions_url,
        tls=tls,
        max_idle=RELAY_MAX_IDLE,
        report_timeouts=True,
    )


async def build_state(
    options: EndpointOptions, registry: Registry, http: httpx.AsyncClient
) -> EndpointState:
    """Read, check and prove the alias; the state the app serves."""
    entry = await registry.get_teacher(options.alias)
    identity = pinned_identity(entry)
    replicas = await prove_replicas(options, entry, identity, http)
    state = EndpointState(
        alias=entry.spec.alias,
        pin=pin_of(entry, identity),
        fingerprint=identity.fingerprint(),
        revision=identity.revision(),
        pool=ReplicaPool(replicas),
        registry=registry,
        metrics=EndpointMetrics(),
        limits=options.limits,
        secret_names=options.config.secret_env_names() if options.config else frozenset(),
        request_timeout_s=options.request_timeout_s,
        listed_replicas=len(replica_urls(entry)),
    )
    state.update_gauges()
    return state


def outbound_client(config: KilnConfig | None) -> httpx.AsyncClient:
    """The client to the teachers: the registry's teacher TLS trust, no proxies, no redirects."""
    ca_file = config.server.teacher_ca_file if config else None
    return httpx.AsyncClient(
        follow_redirects=False,
        trust_env=False,
        verify=teacher_tls_context(ca_file),
        timeout=httpx.Timeout(30.0),
        limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
    )


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (0: a free port), before anything is served."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ConfigError(f"cannot resolve --listen host {host!r} ({exc})",
                          rule="endpoint.listen") from None  # fmt: skip
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(512)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port} ({exc.strerror})",
                          rule="endpoint.listen") from None  # fmt: skip
    return sock


async def wait_for(coro: asyncio.Future[None] | asyncio.Task[None]) -> None:
    """Await a background task at shutdown, ignoring its cancellation."""
    coro.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await coro
