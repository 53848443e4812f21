"""One completion request: admit, pick a replica, relay, check the answer, or refuse.

``relay_completion`` returns the teacher's 200 body *unchanged* once it has
passed ``answers.check_answer``.  A batched ``prompt`` list is split into one
request per prompt (``batch.split``), sent concurrently (each to the live
replica with the fewest requests in flight), each answer checked, and the
answers joined into vLLM's answer to the batch (``batch.join``; the rows are
the teacher's bytes); the first refusal, in prompt order, answers the batch.
Answers waiting for their check are taken oldest request first
(``turns.CheckTurns``), so two batches that arrive together are not both delayed
by each other's checks.
Anything else is an ``EndpointRefusal``:

* the request broke the allowlist or a bound: 400 (``admission``), before
  the teacher is asked;
* the endpoint has stopped, or no replica is live: 503 (with
  ``Retry-After`` while a replica only rests);
* a replica gave no HTTP answer: it rests and the request goes to the next
  live replica (each replica once per request);
* a 200 answer broke a rule (another fingerprint, a wrong choice count, rows
  outside the pin, a body over its bound, a redirect, a content coding): 502
  ``teacher_identity_changed`` or ``teacher_answer_refused`` with the rule,
  and the replica is fenced (``EndpointState.fence``);
* the teacher timed out or broke off: 504 / 502, the replica is not fenced;
* the teacher refused the request (4xx): the same status, its vLLM message
  clipped (``probe.exposure.vllm_error_text``) and scrubbed of every
  configured secret value; a 401/403 or 5xx becomes 502 (the trainer cannot
  fix it).

The transport is each replica's keep-alive ``probe.wire.TeacherWire`` (the
job queue's lean HTTP/1.1 client), under the probes' transport rules: the same TLS
trust, bearer header read fresh from the secret handle, no redirects, no
content coding, bounded bodies; the probes' ``probe.httpx_transport`` only
where a replica has no wire.  Imports the probe transport and exposure
modules, ``credentials.redaction`` and the endpoint's modules.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

import httpx

from kiln_registry.credentials.redaction import redact_text
from kiln_registry.domain.errors import ProbeFailed
from kiln_registry.endpoint.admission import Admitted, admit
from kiln_registry.endpoint.answer_scan import Scanned
from kiln_registry.endpoint.answers import AnswerRefused, check_answer
from kiln_registry.endpoint.batch import join, split
from kiln_registry.endpoint.errors import (
    ANSWER_REFUSED,
    BAD_REQUEST,
    IDENTITY_CHANGED,
    EndpointRefusal,
    unavailable,
)
from kiln_registry.endpoint.pool import REST_S, Replica
from kiln_registry.endpoint.state import EndpointState
from kiln_registry.probe.exposure import vllm_error_text
from kiln_registry.probe.httpx_transport import HttpxTransport
from kiln_registry.probe.transport import Exchange

log = logging.getLogger("kiln_registry.endpoint")

NOT_FENCED: Final = frozenset({"probe.timeout", "probe.incomplete_body", "probe.transport"})
# Larger answers are checked off the event loop.  Below it, the check (about 5 ms for the
# 0.73 MB answer to one 511-token prompt at K=20) runs on the loop: eight such checks
# on eight threads spent about 40% more CPU on the GIL's hand-offs than the checks
# themselves (bench/bench_endpoint.py, 2026-12-03: 23.7 -> 13.9 ms per 1,000 tokens).
THREAD_CHECK_BYTES: Final = 4 * 1024 * 1024


async def relay_completion(state: EndpointState, http: httpx.AsyncClient, body: bytes) -> bytes:
    """The checked 200 body for ``body``, or an ``EndpointRefusal`` (see the module)."""
    if state.stop_reason is not None:
        raise unavailable(state.stop_reason)
    admitted = admit(body, state.pin, state.limits)
    ticket = state.turns.ticket()
    if len(admitted.prompts) == 1:
        return (await _relay_one(state, http, admitted, ticket))[0]
    parts = split(admitted, state.pin)
    answers = await asyncio.gather(
        *(_relay_one(state, http, part, ticket) for part in parts), return_exceptions=True
    )
    checked: list[tuple[bytes, Scanned | None]] = []
    for answer in answers:  # the first refusal in prompt order is the batch's answer
        if isinstance(answer, BaseException):
            raise answer
        checked.append(answer)
    return join(checked, admitted.n)


async def _relay_one(
    state: EndpointState, http: httpx.AsyncClient, admitted: Admitted, ticket: int
) -> tuple[bytes, Scanned | None]:
    """One upstream request for ``admitted``: the checked body and where its rows lie."""
    tried: set[int] = set()
    while True:
        replica = state.pool.pick(frozenset(tried))
        if replica is None:
            raise _no_replica(state)
        tried.add(id(replica))
        exchange = await _exchange(state, http, replica, admitted)
        if exchange is not None:
            break
    if exchange.status != 200:
        raise _teacher_refusal(state, exchange)
    scanned = await _checked(state, replica, exchange.body, admitted, ticket)
    state.metrics.count_scored(admitted.scored_tokens)
    return exchange.body, scanned


def _no_replica(state: EndpointState) -> EndpointRefusal:
    if state.stop_reason is not None:
        return unavailable(state.stop_reason)
    return unavailable(
        f"no replica of {state.alias} answered; each rests {REST_S:g} s before it is tried again",
        retry_after=int(REST_S),
    )


async def _exchange(
    state: EndpointState, http: httpx.AsyncClient, replica: Replica, admitted: Admitted
) -> Exchange | None:
    """One relayed request; None when the replica gave no HTTP answer (it then rests)."""
    transport = replica.wire or HttpxTransport(http, replica.completions_url)
    replica.outstanding += 1
    started = time.perf_counter()
    try:
        return await transport.exchange(
            admitted.payload,
            secret=replica.resolved.secret,
            timeout_s=state.request_timeout_s,
            limit=admitted.response_limit,
        )
    except ProbeFailed as exc:
        _transport_failed(state, replica, exc)  # raises unless the replica only rests
        return None
    finally:
        replica.outstanding -= 1
        state.metrics.observe_upstream(time.perf_counter() - started)


def _transport_failed(state: EndpointState, replica: Replica, exc: ProbeFailed) -> None:
    rule = exc.rule or "probe.transport"
    if rule == "probe.unreachable":
        log.warning("replica %s of %s gave no answer; it rests", replica.url, state.alias)
        state.pool.rest(replica)
        state.update_gauges()
        return
    state.metrics.count_refusal(rule)
    if rule in NOT_FENCED:
        status = 504 if rule == "probe.timeout" else 502
        raise EndpointRefusal(status, f"the teacher did not answer whole: {exc.message}", rule=rule)
    state.fence(replica, rule)
    raise EndpointRefusal(
        502, f"the teacher's answer was refused: {exc.message}", kind=ANSWER_REFUSED, rule=rule
    )


async def _checked(
    state: EndpointState, replica: Replica, body: bytes, admitted: Admitted, ticket: int
) -> Scanned | None:
    try:
        if len(body) > THREAD_CHECK_BYTES:
            return await asyncio.to_thread(
                check_answer, body, admitted, state.pin, state.fingerprint
            )
        async with state.turns.turn(ticket):  # the oldest request's answers first
            return check_answer(body, admitted, state.pin, state.fingerprint)
    except AnswerRefused as exc:
        state.metrics.count_refusal(exc.rule)
        state.fence(replica, exc.rule)
        kind = IDENTITY_CHANGED if exc.identity_changed else ANSWER_REFUSED
        raise EndpointRefusal(
            502,
            f"{kind}: {exc.message}; the replica is fenced and the registry re-probes the alias",
            kind=kind,
            rule=exc.rule,
        ) from None


def _teacher_refusal(state: EndpointState, exchange: Exchange) -> EndpointRefusal:
    text = vllm_error_text(exchange.status, exchange.body)
    if text is None:
        message = f"the teacher answered HTTP {exchange.status} (not a vLLM error; not shown)"
    else:
        message = redact_text(text, state.secret_names)
    status = exchange.status
    if status in (401, 403) or status >= 500 or status < 400:
        message = f"the teacher answered HTTP {status}: {message}"
        status = 502
    state.metrics.count_refusal("endpoint.teacher_status")
    kind = BAD_REQUEST if status == 400 else None
    return EndpointRefusal(status, message, kind=kind, rule="endpoint.teacher_status")
