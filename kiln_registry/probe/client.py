"""The dual probe and the scoring request, over a ``TeacherTransport``.

Owns Kiln's probe exchange with a vLLM teacher: the prompt-logprobs request
body, the probe sequence (K=1 discovery, K=max_top_k, and a cap probe at
max_top_k+1 that must be refused with 400) under an overall deadline and the
in-flight limiter, one verified scoring request (``score_prompt``), the
refusal of a non-success status (the body echoed only for unauthenticated
requests, and then only vLLM's error shape), and the probe report.  The
request, head and body rules and every failure below HTTP are
``probe.transport``'s; requests go through ``probe.httpx_transport`` over the
caller's injected httpx client.

Secrets: a ``SecretSource`` is read immediately before each request and the
value lives only in that request's headers; it is never stored, logged or put
in a message.  Never creates an httpx client and does nothing at import time.
Imports httpx (the injected client's type), the probe modules,
``kiln_registry.domain.errors`` and ``kiln_registry.identity``; no database or
FastAPI.  ``ProbeLimiter``, ``PROBE_CALLER``, ``SecretSource`` and
``untrusted_certificate`` are re-exported for the registry's callers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import httpx

from kiln_registry.domain.errors import KilnError, ProbeFailed
from kiln_registry.identity.bounds import MAX_CANDIDATES, allocation_bound
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.probe.candidate_scan import parse_completion_fast
from kiln_registry.probe.exposure import NOT_SHOWN, vllm_error_text
from kiln_registry.probe.httpx_transport import HttpxTransport
from kiln_registry.probe.limiter import PROBE_CALLER, ProbeCaller, ProbeLimiter
from kiln_registry.probe.parse import (
    MAX_VOCAB_SIZE,
    fail,
    response_body_limit,
    withholding_response_text,
)
from kiln_registry.probe.report import ProbeAttempt, ProbeReport, attach_report
from kiln_registry.probe.transport import (
    Exchange,
    SecretSource,
    TeacherTransport,
    untrusted_certificate,
)
from kiln_registry.probe.verify import (
    RowsCheck,
    StudentView,
    identity_from_fingerprint,
    verify_completion,
)

__all__ = [
    "PROBE_CALLER",
    "PROBE_PROMPT",
    "ProbeCaller",
    "ProbeLimiter",
    "ScoredRows",
    "SecretSource",
    "completion_request",
    "probe_teacher",
    "score_prompt",
    "status_failure",
    "untrusted_certificate",
]

PROBE_PROMPT: tuple[int, ...] = (0, 0)
TOTAL_PROBE_FACTOR = 2  # a registration's probes together: at most twice one request's timeout


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

    def update(self, attempt: ProbeAttempt) -> None:
        """Replace the latest attempt with what is now known of it."""
        self.report = replace(self.report, attempts=(*self.report.attempts[:-1], attempt))

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
    transport: TeacherTransport
    model_id: str
    secret: SecretSource | None
    timeout_s: float

    async def send(self, prompt: Sequence[int], k: int) -> Exchange:
        """One prompt-logprobs request, bounded for its prompt length and K."""
        return await self.transport.exchange(
            completion_request(self.model_id, prompt, k),
            secret=self.secret,
            timeout_s=self.timeout_s,
            limit=response_body_limit(len(prompt), k),
        )


def _checked(
    t: _Target,
    ex: Exchange,
    request: tuple[Sequence[int], int],
    identity: TeacherIdentity | None,
    pinned: TeacherIdentity | None,
    student: StudentView | None,
) -> RowsCheck:
    """Parse and verify a 2xx answer to (prompt, K); ``identity`` None = take the response's."""
    prompt, k = request
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
        return verify_completion(
            parsed,
            request_model=t.model_id,
            prompt=prompt,
            k=k,
            identity=identity,
            pinned=pinned,
            student=student,
        )


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
    ex = await t.send(prompt, k)
    attempt = replace(
        attempt, status_code=ex.status, elapsed_ms=ex.elapsed_ms, bytes_read=len(ex.body)
    )
    rec.update(attempt)
    if not 200 <= ex.status < 300:  # any 2xx with a valid body, as Kiln's is_success()
        raise status_failure(ex, f"{purpose} probe (K={k})")
    check = _checked(t, ex, (prompt, k), identity, pinned, student)
    rec.update(
        replace(
            attempt,
            fingerprint=check.fingerprint,
            identity_digest=check.identity.digest(),
            min_row_width=check.min_row_width,
            max_row_width=check.max_row_width,
            candidate_count=check.candidate_count,
        )
    )
    return check


async def _cap_probe(t: _Target, rec: _Recorder, identity: TeacherIdentity) -> None:
    k = identity.max_top_k + 1
    ex = await t.send(PROBE_PROMPT, k)
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
    async with limiter.turn(PROBE_CALLER.get()):
        t = _Target(HttpxTransport(http, completions_url), model_id, secret, timeout_s)
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
    t = _Target(HttpxTransport(http, completions_url), model_id, secret, timeout_s)
    rec = _Recorder(completions_url, model_id, secret is not None)
    check = await _scored(t, rec, "score", k, prompt, identity, identity, None)
    return ScoredRows(check=check, attempt=rec.report.attempts[-1])
