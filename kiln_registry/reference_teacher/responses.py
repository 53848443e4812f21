"""The response bodies of the reference teacher, key for key like vLLM's.

Owns the scored rows the model hands over (``PositionScores``,
``ScoredPrompt``), their wire form (``format_row``: the actual token first,
then the top entries; ``-inf`` as vLLM's ``-9999.0``, never NaN), the
completion and model-list bodies and the compact JSON encoding.  Request
validation is ``reference_teacher.protocol``; row arithmetic is
``reference_teacher.model``.

Imports: standard library and ``reference_teacher.protocol`` only; never
torch or FastAPI.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kiln_registry.reference_teacher.protocol import CompletionRequest, Limits

NEG_INF_LOGPROB = -9999.0


@dataclass(frozen=True, slots=True)
class PositionScores:
    """One prompt position: the actual token's score and the top entries, best first."""

    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True, slots=True)
class ScoredPrompt:
    """What the model computed for one prompt."""

    token_count: int
    rows: tuple[PositionScores, ...] | None
    text: str
    completion_tokens: int
    finish_reason: str
    token_ids: tuple[int, ...] = ()
    prompt_ids: tuple[int, ...] = ()
    gen_rows: tuple[PositionScores, ...] | None = None


def wire_logprob(value: float) -> float:
    """vLLM writes -inf as -9999.0; NaN is never written."""
    if math.isnan(value):
        raise ValueError("the model produced a NaN logprob")
    return NEG_INF_LOGPROB if value == -math.inf else value


def format_row(scores: PositionScores, decode: Callable[[int], str]) -> dict[str, object]:
    """The actual token first (true rank), then the top entries ranked 1..K.

    Like vLLM's dict construction, an actual token that is also in the top-K
    keeps its first position but takes the top-K entry's value (its position
    rank, which differs from the true rank only under ties).
    """

    def entry(token_id: int, logprob: float, rank: int) -> dict[str, object]:
        return {"logprob": wire_logprob(logprob), "rank": rank, "decoded_token": decode(token_id)}

    row: dict[str, object] = {
        str(scores.token_id): entry(scores.token_id, scores.logprob, scores.rank)
    }
    for position, (token_id, logprob) in enumerate(scores.top, start=1):
        row[str(token_id)] = entry(token_id, logprob, position)
    return row


def _token_name(token_id: int, decode: Callable[[int], str], as_ids: bool) -> str:
    return f"token_id:{token_id}" if as_ids else decode(token_id)


def completion_logprobs(
    rows: tuple[PositionScores, ...], decode: Callable[[int], str], as_ids: bool
) -> dict[str, object]:
    """vLLM's completion ``logprobs``: the sampled token first in each top dict, then the top."""
    offsets, tops, at = [], [], 0
    for row in rows:
        offsets.append(at)
        at += len(decode(row.token_id))
        top = {_token_name(row.token_id, decode, as_ids): wire_logprob(row.logprob)}
        for token_id, logprob in row.top:
            top[_token_name(token_id, decode, as_ids)] = wire_logprob(logprob)
        tops.append(top)
    return {
        "text_offset": offsets,
        "token_logprobs": [wire_logprob(r.logprob) for r in rows],
        "tokens": [_token_name(r.token_id, decode, as_ids) for r in rows],
        "top_logprobs": tops,
    }


def _choice(
    index: int, scored: ScoredPrompt, decode: Callable[[int], str], request: CompletionRequest
) -> dict[str, object]:
    rows: list[object] | None = None
    if scored.rows is not None:
        rows = [None, *(format_row(r, decode) for r in scored.rows)]
    logprobs = None
    if scored.gen_rows is not None:
        logprobs = completion_logprobs(scored.gen_rows, decode, request.sampling.tokens_as_ids)
    ids = request.sampling.return_token_ids
    return {
        "index": index,
        "text": scored.text,
        "logprobs": logprobs,
        "finish_reason": scored.finish_reason,
        "stop_reason": None,
        "token_ids": list(scored.token_ids) if ids else None,
        "prompt_logprobs": rows,
        "prompt_token_ids": list(scored.prompt_ids) if ids else None,
        "routed_experts": None,
    }


def completion_body(
    request: CompletionRequest,
    scored: list[ScoredPrompt],
    *,
    decode: Callable[[int], str],
    system_fingerprint: str,
) -> dict[str, object]:
    """The response body, key for key like vLLM's."""
    choices = [
        _choice(p * request.n + copy, s, decode, request)
        for p, s in enumerate(scored)
        for copy in range(request.n)
    ]
    prompt_tokens = sum(s.token_count for s in scored)
    completion_tokens = sum(s.completion_tokens for s in scored) * request.n
    return {
        "id": f"cmpl-{secrets.token_hex(8)}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": request.model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": system_fingerprint,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        },
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def models_body(limits: Limits, *, created: int) -> dict[str, object]:
    """``GET /v1/models`` with vLLM's keys; the owner names this teacher, not vLLM."""
    permission = {
        "id": f"modelperm-{secrets.token_hex(8)}", "object": "model_permission",
        "created": created, "allow_create_engine": False, "allow_sampling": True,
        "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
        "allow_fine_tuning": False, "organization": "*", "group": None, "is_blocking": False,
    }  # fmt: skip
    model = {
        "id": limits.served_model_id, "object": "model", "created": created,
        "owned_by": "kiln-reference-teacher", "root": limits.served_model_id, "parent": None,
        "max_model_len": limits.max_model_len, "permission": [permission],
    }  # fmt: skip
    return {"object": "list", "data": [model]}


def dumps(body: Mapping[str, object] | list[object]) -> bytes:
    """Compact, raw-UTF-8 JSON like vLLM's responses."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
