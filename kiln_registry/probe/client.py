"""The dual-probe client and the scoring request, over an injected httpx client.

Owns the wire exchange with a vLLM teacher: Kiln's probe request, the bounded
streaming read (Content-Length and byte count against ``response_body_limit``,
an overall ``asyncio.timeout`` deadline on top of httpx's timeouts, no
redirects, identity encoding only), the translation of httpx failures into
``ProbeFailed`` rules, error-body redaction for authenticated requests, the
probe sequence (K=1 discovery, K=max_top_k, and a cap probe at max_top_k+1 that
must be refused with 400), and the in-flight limiter.

Secrets: a ``SecretSource`` is read immediately before each request and the
value lives only in that request's headers; it is never stored, logged or put
in a message.  Never creates an httpx client (the caller injects one) and does
nothing at import time.  Imports httpx, ``probe.parse``/``verify``/``report``,
``kiln_registry.domain.errors`` and ``kiln_registry.identity``; no database or FastAPI.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import ssl
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Protocol

import httpx

from kiln_registry.domain.errors import KilnError, ProbeBusy, ProbeFailed
from kiln_registry.identity.bounds import MAX_CANDIDATES, allocation_bound
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.probe.candidate_scan import parse_completion_fast
from kiln_registry.probe.exposure import NOT_SHOWN, unreachable, vllm_error_text
from kiln_registry.probe.parse import (
    MAX_VOCAB_SIZE,
    fail,
    response_body_limit,
    withholding_response_text,
)
from kiln_registry.probe.report import ProbeAttempt, ProbeReport, attach_report
from kiln_registry.probe.verify import (
    RowsCheck,
    StudentView,
    identity_from_fingerprint,
    verify_completion,
)

PROBE_PROMPT: tuple[int, ...] = (0, 0)
ERROR_BODY_READ_LIMIT = 64 * 1024


class SecretSource(Protocol):
    """A credential handle: ``read()`` returns the bearer value, fresh each time."""

    def read(self) -> str: ...


TOTAL_PROBE_FACTOR = 2  # a registration's probes together: at most twice one request's timeout

# Who is probing: the API sets it per request (token name, else client address); None
# for the job workers, which have their own limiter.
PROBE_CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "kiln_probe_caller", default=None
)


class ProbeLimiter:
    """A non-blocking slot counter: past ``max_in_flight`` probes in all, or
    ``max_per_caller`` for one caller (``PROBE_CALLER``), a probe gets ProbeBusy."""

    def __init__(self, max_in_flight: int = 2, max_per_caller: int | None = None) -> None:
        if max_in_flight < 1 or (max_per_caller is not None and max_per_caller < 1):
            raise ValueError("max_in_flight and max_per_caller must be at least 1")
        self._max = max_in_flight
        self._per_caller = max_per_caller or max_in_flight
        self._in_flight = 0
        self._by_caller: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @contextmanager
    def slot(self, caller: str | None = None) -> Iterator[None]:
        with self._lock:
            if self._in_flight >= self._max:
                raise ProbeBusy(f"{self._in_flight} teacher probes are already in flight")
            held = self._by_caller.get(caller, 0) if caller is not None else 0
            if held >= self._per_caller:
                raise ProbeBusy(f"this caller already has {held} teacher probes in flight")
            self._in_flight += 1
            if caller is not None:
                self._by_caller[caller] = held + 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1
                if caller is not None:
                    left = self._by_caller[caller] - 1
                    if left:
                        self._by_caller[caller] = left
                    else:
                        del self._by_caller[caller]


@dataclass(frozen=True, slots=True)
class Exchange:
    status: int
    body: bytes
    elapsed_ms: float
    authenticated: bool


@dataclass(frozen=True, slots=True, eq=False)
class ScoredRows:
    """A verified scoring response and the record of its request."""

    check: RowsCheck
    attempt: ProbeAttempt


def completion_request(model_id: str, prompt: Sequence[int], k: int) -> dict[str, object]:
    """Kiln's prompt-logprobs request body."""
    return {
        "model": model_id,
        "prompt": list(prompt),
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": k,
        "n": 1,
        "stream": False,
        "add_special_tokens": False,
    }


def check_head(status: int, encoding: str | None, declared: str | None, limit: int) -> None:
    """The response head's rules: no redirect, no content coding, Content-Length in bounds."""
    if 300 <= status < 400:
        fail("redirect", f"teacher answered HTTP {status}; redirects are refused")
    encoding = (encoding or "identity").strip().lower()
    if encoding not in ("", "identity"):
        fail("content_encoding", f"teacher used Content-Encoding {encoding[:40]!r}")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        fail("body_too_large", f"Content-Length {declared} exceeds the bound of {limit} bytes")


def body_cap(status: int, limit: int) -> int:
    """How much of a body is read: all of a 2xx up to ``limit``, at most 64 KiB of an error."""
    return limit if status < 300 else min(limit, ERROR_BODY_READ_LIMIT)


def request_headers(secret: SecretSource | None) -> dict[str, str]:
    """Kiln's request headers; the bearer value is read from ``secret`` now, never kept."""
    headers = {
        "content-type": "application/json",
        "accept": "application/json",
        "accept-encoding": "identity",
    }
    if secret is not None:
        headers["authorization"] = "Bearer " + secret.read()
    return headers


async def _read_bounded(response: httpx.Response, limit: int) -> bytes:
    """Read at most ``limit`` bytes; a 2xx body over the bound is refused."""
    cap = body_cap(response.status_code, limit)
    body = bytearray()
    async for chunk in response.aiter_raw():
        if len(body) + len(chunk) > cap:
            if response.status_code < 300:
                fail("body_too_large", f"response body exceeds the bound of {limit} bytes")
            body += chunk[: cap - len(body)]
            break
        body += chunk
    return bytes(body)


def transport_failure(
    exc: BaseException, got_head: bool, *, connecting: bool = False
) -> ProbeFailed:
    """The rule for a request that failed below HTTP: timeout, connect, mid-body or transport.

    ``connecting``: the failure happened while opening the connection (the
    lean scoring client says so; httpx says it with its exception types).
    Only the exception's type name reaches the message.
    """
    name = type(exc).__name__
    if not got_head:
        # One answer for every failure before an HTTP head: no port-scan oracle (issue 15).
        stage = "connecting" if connecting else "before the response head"
        return unreachable(f"{name} {stage}: {str(exc)[:300]}")
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return ProbeFailed(f"teacher request timed out ({name})", rule="probe.timeout")
    return ProbeFailed(
        f"teacher connection ended before the complete body ({name})",
        rule="probe.incomplete_body",
    )


def untrusted_certificate(origin: str, cert: ssl.SSLCertVerificationError) -> ProbeFailed:
    """A teacher certificate the configured authorities do not vouch for, and what to do."""
    return unreachable(
        f"the TLS certificate of {origin} is not trusted"
        f" ({cert.verify_message or 'verification failed'}): set [server] teacher_ca_file"
        " to the PEM bundle of the CA that signed it"
    )


async def exchange(
    http: httpx.AsyncClient,
    url: str,
    payload: dict[str, object],
    *,
    secret: SecretSource | None,
    timeout_s: float,
    limit: int,
) -> Exchange:
    """POST ``payload`` and read the bounded body before one overall deadline."""
    content = json.dumps(payload, separators=(",", ":")).encode()
    got_head = False
    start = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            async with http.stream(
                "POST",
                url,
                content=content,
                headers=request_headers(secret),
                timeout=httpx.Timeout(timeout_s),
                follow_redirects=False,
            ) as response:
                got_head = True
                check_head(
                    response.status_code,
                    response.headers.get("content-encoding"),
                    response.headers.get("content-length"),
                    limit,
                )
                body = await _read_bounded(response, limit)
                status = response.status_code
    except (TimeoutError, httpx.HTTPError) as exc:
        raise transport_failure(exc, got_head) from exc
    elapsed = (time.perf_counter() - start) * 1000.0
    return Exchange(status, body, elapsed, secret is not None)


def status_failure(ex: Exchange, what: str) -> ProbeFailed:
    """A non-success answer; the body is echoed only for unauthenticated requests."""
    rule = "probe.unauthorized" if ex.status in (401, 403) else "probe.http_status"
    if ex.authenticated:
        detail = "body withheld because the request carried a credential"
    else:
        detail = vllm_error_text(ex.status, ex.body) or NOT_SHOWN
    return ProbeFailed(f"{what}: teacher answered HTTP {ex.status}: {detail}", rule=rule)


class _Recorder:
    """Collects attempts; turns them into the final report."""

    def __init__(self, url: str, model_id: str, authenticated: bool) -> None:
        self.report = ProbeReport(url=url, model_id=model_id, authenticated=authenticated)
        self.start = time.perf_counter()

    def add(self, attempt: ProbeAttempt) -> None:
        self.report = replace(self.report, attempts=(*self.report.attempts, attempt))

    def finish(self, identity: TeacherIdentity | None, error: KilnError | None) -> ProbeReport:
        self.report = replace(
            self.report,
            outcome="failed" if error else "passed",
            fingerprint=identity.fingerprint() if identity else None,
            identity_digest=identity.digest() if identity else None,
            failure_code=error.code if error else None,
            failure_rule=error.rule if error else None,
            failure_message=error.message if error else None,
            elapsed_ms=(time.perf_counter() - self.start) * 1000.0,
        )
        return self.report


@dataclass(frozen=True, slots=True)
class _Target:
    http: httpx.AsyncClient
    url: str
    model_id: str
    secret: SecretSource | None
    timeout_s: float


async def _scored(
    t: _Target,
    rec: _Recorder,
    purpose: str,
    k: int,
    prompt: Sequence[int],
    identity: TeacherIdentity | None,
    pinned: TeacherIdentity | None,
    student: StudentView | None,
) -> RowsCheck:
    """One prompt-logprobs request, parsed and verified; ``identity`` None = discover."""
    attempt = ProbeAttempt(purpose=purpose, k=k, prompt_len=len(prompt))
    rec.add(attempt)
    limit = response_body_limit(len(prompt), k)
    ex = await exchange(
        t.http,
        t.url,
        completion_request(t.model_id, prompt, k),
        secret=t.secret,
        timeout_s=t.timeout_s,
        limit=limit,
    )
    attempt = replace(
        attempt, status_code=ex.status, elapsed_ms=ex.elapsed_ms, bytes_read=len(ex.body)
    )
    rec.report = replace(rec.report, attempts=(*rec.report.attempts[:-1], attempt))
    if ex.status != 200:
        raise status_failure(ex, f"{purpose} probe (K={k})")
    known = identity or pinned
    vocab = known.vocab_size if known else MAX_VOCAB_SIZE
    budget = known.max_prompt_logprob_candidates if known else MAX_CANDIDATES
    with withholding_response_text(ex.authenticated):
        parsed = parse_completion_fast(
            ex.body,
            expected_prompt_len=len(prompt),
            k=k,
            vocab_size=vocab,
            # the smaller of the identity's budget and what this request can produce
            max_candidates=allocation_bound(budget, prompt_len=len(prompt), k=k, vocab_size=vocab),
        )
        if identity is None:
            identity = identity_from_fingerprint(parsed.system_fingerprint)
        check = verify_completion(
            parsed,
            request_model=t.model_id,
            prompt=prompt,
            k=k,
            identity=identity,
            pinned=pinned,
            student=student,
        )
    attempt = replace(
        attempt,
        fingerprint=check.fingerprint,
        identity_digest=check.identity.digest(),
        min_row_width=check.min_row_width,
        max_row_width=check.max_row_width,
        candidate_count=check.candidate_count,
    )
    rec.report = replace(rec.report, attempts=(*rec.report.attempts[:-1], attempt))
    return check


async def _cap_probe(t: _Target, rec: _Recorder, identity: TeacherIdentity) -> None:
    k = identity.max_top_k + 1
    limit = response_body_limit(len(PROBE_PROMPT), k)
    ex = await exchange(
        t.http,
        t.url,
        completion_request(t.model_id, PROBE_PROMPT, k),
        secret=t.secret,
        timeout_s=t.timeout_s,
        limit=limit,
    )
    rec.add(
        ProbeAttempt(
            purpose="cap",
            k=k,
            prompt_len=len(PROBE_PROMPT),
            status_code=ex.status,
            elapsed_ms=ex.elapsed_ms,
            bytes_read=len(ex.body),
        )
    )
    if 200 <= ex.status < 300:
        fail(
            "cap_not_enforced",
            f"teacher answered K={k}, above its advertised max_top_k {identity.max_top_k};"
            " it must refuse it with HTTP 400 (vLLM --max-logprobs)",
        )
    if ex.status != 400:
        raise status_failure(ex, f"cap probe (K={k}) expected HTTP 400")


async def probe_teacher(
    http: httpx.AsyncClient,
    *,
    completions_url: str,
    model_id: str,
    student: StudentView | None,
    pinned: TeacherIdentity | None,
    secret: SecretSource | None,
    timeout_s: float = 10.0,
    limiter: ProbeLimiter,
) -> ProbeReport:
    """Discover (K=1), confirm at max_top_k, prove the cap; return a passed report.

    Failures raise ``ProbeFailed``/``IdentityMismatch`` with the failed report
    attached (``probe.report.attached_report(exc)``); a full limiter raises
    ``ProbeBusy``.
    """
    with limiter.slot(PROBE_CALLER.get()):
        t = _Target(http, completions_url, model_id, secret, timeout_s)
        rec = _Recorder(completions_url, model_id, secret is not None)
        identity: TeacherIdentity | None = None
        try:
            # All three probes together are bounded too (issue 15: slot starvation).
            async with asyncio.timeout(TOTAL_PROBE_FACTOR * timeout_s):
                first = await _scored(t, rec, "discover", 1, PROBE_PROMPT, None, pinned, student)
                identity = first.identity
                if identity.max_model_len < len(PROBE_PROMPT) + 1:
                    fail("max_model_len", f"max_model_len {identity.max_model_len} is too small")
                k = identity.max_top_k
                await _scored(t, rec, "max_top_k", k, PROBE_PROMPT, identity, pinned, student)
                await _cap_probe(t, rec, identity)
        except TimeoutError:
            total = ProbeFailed(
                f"the probes took longer than {TOTAL_PROBE_FACTOR} x {timeout_s:g} s in all",
                rule="probe.timeout",
            )
            attach_report(total, rec.finish(identity, total))
            raise total from None
        except KilnError as exc:
            attach_report(exc, rec.finish(identity, exc))
            raise
        return rec.finish(identity, None)


def _check_score_request(prompt: Sequence[int], k: int, identity: TeacherIdentity) -> None:
    if not 1 <= k <= identity.max_top_k:
        fail("request_k", f"K={k} is outside 1..={identity.max_top_k}")
    if not prompt or len(prompt) + 1 > identity.max_model_len:
        fail("request_length", f"a prompt of {len(prompt)} tokens does not fit max_model_len")
    if any(type(t) is not int or not 0 <= t < identity.vocab_size for t in prompt):
        fail("request_token", f"a prompt token is not an id below vocab_size {identity.vocab_size}")
    width = min(k + 1, identity.vocab_size)
    if (len(prompt) - 1) * width > identity.max_prompt_logprob_candidates:
        fail("request_candidates", "the response could exceed max_prompt_logprob_candidates")


async def score_prompt(
    http: httpx.AsyncClient,
    *,
    completions_url: str,
    model_id: str,
    prompt: Sequence[int],
    k: int,
    identity: TeacherIdentity,
    secret: SecretSource | None,
    timeout_s: float = 60.0,
) -> ScoredRows:
    """One scoring request whose response must carry exactly ``identity``."""
    _check_score_request(prompt, k, identity)
    t = _Target(http, completions_url, model_id, secret, timeout_s)
    rec = _Recorder(completions_url, model_id, secret is not None)
    check = await _scored(t, rec, "score", k, prompt, identity, identity, None)
    return ScoredRows(check=check, attempt=rec.report.attempts[-1])
