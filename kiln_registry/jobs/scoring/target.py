"""Scoring one sequence against a pinned teacher: request planning, retries, verification.

Request planning follows Kiln's remote teacher: prompt-logprobs position
``i`` comes from logits row ``i - 1``, so to expose the final row the last
token is sent twice (the causal final-row probe).  A sequence of ``n``
tokens is one request of ``n + 1`` prompt tokens with ``max_tokens = 1``,
answered by ``n`` rows; ``jobs.scoring.sources.check_sequence`` already refused a
sequence that would not fit ``max_model_len`` (``n + 2``) or whose response
could exceed ``max_prompt_logprob_candidates`` (``n * min(K + 1, vocab)``),
so every request is one sequence and no response can exceed the budget.

Retries with exponential backoff only for connection failures (no response,
or the connection ended mid-body) and HTTP 503; a timeout, any other status
and every verification failure (a changed fingerprint above all) fail at
once.  Every answer is parsed and verified by the probe module's rules with
``pinned`` = the job's identity.

Requests go through a ``probe.transport.TeacherTransport``: the job runner
passes ``probe.wire.TeacherWire`` (keep-alive HTTP/1.1 to the one teacher;
the same head and body rules as the probe client, at a fraction of httpx's
CPU per request).  ``send_with_retries`` is the retry loop that generation
requests share.

Imports: standard library, numpy, ``kiln_registry.domain.errors``,
``identity.document``, ``probe`` and ``jobs.scoring.cache``; no database or FastAPI.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

import numpy as np

from kiln_registry.domain.errors import ProbeFailed
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.jobs.scoring.cache import ScoredSequence
from kiln_registry.probe.candidate_scan import parse_completion_fast
from kiln_registry.probe.client import completion_request, status_failure
from kiln_registry.probe.parse import response_body_limit
from kiln_registry.probe.transport import Exchange, SecretSource, TeacherTransport
from kiln_registry.probe.verify import verify_completion

SCORE_TIMEOUT_S: Final = 60.0
MAX_ATTEMPTS: Final = 6
BACKOFF_BASE_S: Final = 0.2
BACKOFF_MAX_S: Final = 5.0
# probe.unreachable: any failure before an HTTP head (issue 15 folded connect/transport/TLS).
RETRYABLE_RULES: Final = frozenset(
    {"probe.unreachable", "probe.connect", "probe.transport", "probe.incomplete_body"}
)
RETRYABLE_STATUS: Final = 503


@dataclass(frozen=True, slots=True)
class ScoringTarget:
    """Where and how a job scores: the pinned identity and the resolved endpoint."""

    wire: TeacherTransport
    model_id: str
    secret: SecretSource | None
    identity: TeacherIdentity
    k: int
    timeout_s: float = SCORE_TIMEOUT_S


def probe_prompt(tokens: np.ndarray[Any, Any]) -> list[int]:
    """The request prompt: the sequence plus its last token again (causal final-row probe)."""
    ids = [int(t) for t in tokens]
    return [*ids, ids[-1]]


def backoff_s(attempt: int) -> float:
    return float(min(BACKOFF_MAX_S, BACKOFF_BASE_S * (2**attempt)))


def verify_scores(target: ScoringTarget, prompt: list[int], body: bytes) -> ScoredSequence:
    """Parse and verify one answer with every probe rule and the pinned fingerprint."""
    identity = target.identity
    # The same parser the probe client uses: the vectorized path, deferring to the strict
    # parser for any layout it cannot prove, so it accepts and refuses exactly the same.
    parsed = parse_completion_fast(
        body,
        expected_prompt_len=len(prompt),
        k=target.k,
        vocab_size=identity.vocab_size,
        max_candidates=identity.max_prompt_logprob_candidates,
    )
    check = verify_completion(
        parsed,
        request_model=target.model_id,
        prompt=prompt,
        k=target.k,
        identity=identity,
        pinned=identity,
        student=None,
    )
    return ScoredSequence(
        topk_ids=check.topk_ids,
        topk_logprobs=check.topk_logprobs,
        # The last row's observed token is the probe's repeated token, not data.
        token_logprobs=check.actual_logprobs[:-1].copy(),
    )


class Endpoint(Protocol):
    """What a retried request needs of its target (``ScoringTarget``, ``GenerationTarget``)."""

    @property
    def wire(self) -> TeacherTransport: ...

    @property
    def secret(self) -> SecretSource | None: ...

    @property
    def timeout_s(self) -> float: ...


Hooks = tuple[Callable[[], None], Callable[[], None]]  # (on_request, on_retry)


async def send_with_retries(
    target: Endpoint, payload: dict[str, object], limit: int, what: str, hooks: Hooks
) -> Exchange:
    """A 2xx answer to ``payload``, retrying connection failures and 503 with backoff."""
    on_request, on_retry = hooks
    for attempt in range(MAX_ATTEMPTS):
        last = attempt == MAX_ATTEMPTS - 1
        on_request()
        try:
            answer = await target.wire.exchange(
                payload, secret=target.secret, timeout_s=target.timeout_s, limit=limit
            )
        except ProbeFailed as exc:
            if exc.rule not in RETRYABLE_RULES or last:
                raise
        else:
            if 200 <= answer.status < 300:  # any 2xx, as Kiln's is_success()
                return answer
            if answer.status != RETRYABLE_STATUS or last:
                raise status_failure(answer, what)
        on_retry()
        await asyncio.sleep(backoff_s(attempt))
    raise AssertionError("unreachable: the last attempt returns or raises")


async def score_sequence(
    target: ScoringTarget,
    tokens: np.ndarray[Any, Any],
    *,
    on_request: Callable[[], None] = lambda: None,
    on_retry: Callable[[], None] = lambda: None,
) -> ScoredSequence:
    """Score one planned sequence; see the module docstring for the retry rule."""
    prompt = probe_prompt(tokens)
    payload = completion_request(target.model_id, prompt, target.k)
    limit = response_body_limit(len(prompt), target.k)
    hooks = (on_request, on_retry)
    answer = await send_with_retries(target, payload, limit, "scoring request", hooks)
    return verify_scores(target, prompt, answer.body)
