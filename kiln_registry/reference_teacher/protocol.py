"""The wire protocol of the reference teacher: vLLM's ``/v1/completions`` subset.

Owns request validation (numeric token-id prompts only, fail closed) and the
vLLM-shaped error bodies.  The response bodies are
``reference_teacher.responses``; row arithmetic (log-softmax, ranks, top-K)
is done by ``reference_teacher.model``.

Accepted request fields (anything else is refused with a 400):

* used: ``model`` (required), ``prompt`` (required: a list of token ids or a
  list of such lists), ``max_tokens`` (default 16), ``prompt_logprobs``,
  ``n`` (default 1), ``temperature`` (absent or 0: greedy), ``top_p``,
  ``seed``, ``logprobs`` (top entries per generated token, 0..=max_top_k),
  ``return_token_ids`` and ``return_tokens_as_token_ids`` (vLLM's switches;
  see ``reference_teacher.sampling``), ``stream`` (only false; true is
  refused), ``echo`` (only false), ``add_special_tokens`` (accepted and
  ignored: token-id prompts are never re-tokenized);
* standard OpenAI completion fields vLLM accepts, allowed only with their
  neutral value: ``user`` (any value), ``presence_penalty`` and
  ``frequency_penalty`` (0), ``best_of`` (equal to ``n``), ``stop`` (empty),
  ``logit_bias`` (empty), ``suffix`` and ``stream_options`` (null).

Imports: standard library, ``kiln_registry.domain.errors`` and
``kiln_registry.identity.canonical`` only; never torch or FastAPI.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kiln_registry.domain.errors import IdentityError, InputError
from kiln_registry.identity.canonical import strict_json_loads
from kiln_registry.reference_teacher.sampling import GREEDY, Sampling

MAX_PROMPTS = 64
MAX_CHOICES = 64
MAX_GENERATED_TOKENS = 4096
DEFAULT_MAX_TOKENS = 16
BASE_BODY_BYTES = 1024 * 1024
BYTES_PER_TOKEN = 12

USED_FIELDS: frozenset[str] = frozenset(
    {"model", "prompt", "max_tokens", "prompt_logprobs", "n", "temperature", "stream",
     "logprobs", "echo", "add_special_tokens", "top_p", "seed", "return_token_ids",
     "return_tokens_as_token_ids"}
)  # fmt: skip
FREE_FIELDS: frozenset[str] = frozenset({"user"})
_NEUTRAL: dict[str, Callable[[Any], bool]] = {
    "presence_penalty": lambda v: v is None or (_is_number(v) and v == 0),
    "frequency_penalty": lambda v: v is None or (_is_number(v) and v == 0),
    "stop": lambda v: v is None or v == [],
    "logit_bias": lambda v: v is None or v == {},
    "suffix": lambda v: v is None,
    "stream_options": lambda v: v is None,
}
ACCEPTED_FIELDS: frozenset[str] = USED_FIELDS | FREE_FIELDS | {"best_of", *_NEUTRAL}


class ProtocolError(InputError):
    """A request the teacher refuses, rendered in vLLM's error shape."""

    code = "reference_request_invalid"

    def __init__(
        self, message: str, *, status: int = 400, error_type: str = "BadRequestError",
        param: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(message, status=status, rule=f"reference.{param or 'request'}")
        self.error_type = error_type
        self.param = param

    def body(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.status,
            }
        }


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)  # type: ignore[arg-type]


def _bad(
    param: str, message: str, value: object = None, *, show_value: bool = True
) -> ProtocolError:
    suffix = f"(parameter={param}, value={value})" if show_value else f"(parameter={param})"
    return ProtocolError(f"{message} {suffix}", param=param)


@dataclass(frozen=True, slots=True)
class Limits:
    """What the served teacher allows; used to bound and check requests."""

    served_model_id: str
    max_top_k: int
    max_model_len: int
    vocab_width: int
    max_token_id: int

    def max_body_bytes(self) -> int:
        return BASE_BODY_BYTES + BYTES_PER_TOKEN * self.max_model_len * MAX_PROMPTS


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    model: str
    prompts: tuple[tuple[int, ...], ...]
    max_tokens: int
    prompt_logprobs: int | None
    n: int
    sampling: Sampling = GREEDY

    def top_k(self, vocab_width: int) -> int | None:
        """Top entries per row: None (no rows), 0..K, or the full width for -1."""
        if self.prompt_logprobs == -1:
            return vocab_width
        return self.prompt_logprobs


def decode_json_body(data: bytes, limits: Limits) -> dict[str, Any]:
    """Strict JSON object of at most ``limits.max_body_bytes()`` bytes."""
    try:
        obj = strict_json_loads(data, what="request body", max_bytes=limits.max_body_bytes())
    except IdentityError as exc:
        status = 413 if exc.rule == "json.too_large" else 400
        raise ProtocolError(exc.message, status=status) from None
    if not isinstance(obj, dict):
        raise ProtocolError("the request body must be a JSON object")
    return obj


def _check_fields(body: Mapping[str, Any]) -> None:
    unknown = sorted(set(body) - ACCEPTED_FIELDS)
    if unknown:
        raise ProtocolError(
            f"unsupported field {unknown[0]!r}: the reference teacher accepts only "
            f"{', '.join(sorted(ACCEPTED_FIELDS))}",
            param=unknown[0],
        )
    for name, neutral in _NEUTRAL.items():
        if name in body and not neutral(body[name]):
            raise ProtocolError(
                f"{name} must be left at its neutral value: the reference teacher does not"
                " implement it",
                param=name,
            )


def _parse_prompts(value: object) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, list) or not value:
        raise ProtocolError(
            "prompt must be a non-empty list of token ids or a list of such lists "
            "(text prompts are not accepted)",
            param="prompt",
        )
    batch = value if all(isinstance(p, list) for p in value) else [value]
    if len(batch) > MAX_PROMPTS:
        raise ProtocolError(f"at most {MAX_PROMPTS} prompts per request", param="prompt")
    for prompt in batch:
        if not all(_is_int(t) for t in prompt):
            raise ProtocolError("every prompt token must be an integer id", param="prompt")
    return tuple(tuple(p) for p in batch)


def _int_field(body: Mapping[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if not _is_int(value) or not low <= value <= high:
        raise _bad(name, f"{name} must be an integer in {low}..={high}, got {value!r}.", value)
    return int(value)


def _check_switches(body: Mapping[str, Any], prompt_logprobs: object) -> None:
    stream = body.get("stream")
    for name in ("stream", "echo", "add_special_tokens", "return_token_ids",
                 "return_tokens_as_token_ids"):  # fmt: skip
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise _bad(name, f"{name} must be a boolean.", body[name])
    if stream and _is_int(prompt_logprobs) and (prompt_logprobs > 0 or prompt_logprobs == -1):  # type: ignore[operator]
        raise _bad(
            "prompt_logprobs",
            "`prompt_logprobs` are not available when `stream=True`.",
            show_value=False,
        )
    if _is_int(prompt_logprobs) and prompt_logprobs < -1:  # type: ignore[operator]
        raise _bad(
            "prompt_logprobs", "`prompt_logprobs` must be a positive value or -1.", prompt_logprobs
        )
    if stream:
        raise _bad("stream", "streaming is not supported by the reference teacher.", stream)
    if body.get("echo"):
        raise _bad("echo", "echo is not supported by the reference teacher.", True)


def _sampling(body: Mapping[str, Any]) -> Sampling:
    temperature = body.get("temperature")
    if temperature is not None and not (_is_number(temperature) and temperature >= 0):
        raise _bad("temperature", "temperature must be a non-negative number.", temperature)
    top_p = body.get("top_p")
    if top_p is not None and not (_is_number(top_p) and 0 < top_p <= 1):
        raise _bad("top_p", "top_p must be in (0, 1].", top_p)
    seed = body.get("seed")
    if seed is not None and not (_is_int(seed) and 0 <= seed < 2**63):
        raise _bad("seed", "seed must be a non-negative 64-bit integer.", seed)
    logprobs = body.get("logprobs")
    if logprobs is not None and not (_is_int(logprobs) and logprobs >= 0):
        raise _bad("logprobs", "logprobs must be a non-negative integer or null.", logprobs)
    return Sampling(
        temperature=float(temperature or 0.0), top_p=float(1.0 if top_p is None else top_p),
        seed=seed, logprobs=logprobs, return_token_ids=bool(body.get("return_token_ids")),
        tokens_as_ids=bool(body.get("return_tokens_as_token_ids")),
    )  # fmt: skip


def parse_completion_request(body: Mapping[str, Any]) -> CompletionRequest:
    """Shape checks, in vLLM's order for the errors both can report."""
    _check_fields(body)
    prompt_logprobs = body.get("prompt_logprobs")
    if prompt_logprobs is not None and not _is_int(prompt_logprobs):
        raise _bad("prompt_logprobs", "prompt_logprobs must be an integer or null.",
                   prompt_logprobs)  # fmt: skip
    _check_switches(body, prompt_logprobs)
    sampling = _sampling(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ProtocolError("model must be a non-empty string", param="model")
    n = _int_field(body, "n", 1, 1, MAX_CHOICES)
    if body.get("best_of") is not None and body["best_of"] != n:
        raise _bad("best_of", "best_of must equal n.", body["best_of"])
    prompts = _parse_prompts(body.get("prompt"))
    if len(prompts) * n > MAX_CHOICES:
        raise ProtocolError(f"prompts x n must not exceed {MAX_CHOICES} choices", param="n")
    max_tokens = _int_field(body, "max_tokens", DEFAULT_MAX_TOKENS, 1, MAX_GENERATED_TOKENS)
    return CompletionRequest(
        model=model,
        prompts=prompts,
        max_tokens=max_tokens,
        prompt_logprobs=prompt_logprobs,
        n=n,
        sampling=sampling,
    )


def check_against_teacher(request: CompletionRequest, limits: Limits) -> None:
    """The checks that need the served model, in vLLM's order."""
    if request.model != limits.served_model_id:
        raise ProtocolError(
            f"The model `{request.model}` does not exist. Valid aliases: {limits.served_model_id}.",
            status=404,
            error_type="NotFoundError",
            param="model",
        )
    for prompt in request.prompts:
        _check_length(len(prompt), request.max_tokens, limits.max_model_len)
    wanted = request.top_k(limits.vocab_width)
    if wanted is not None and wanted > limits.max_top_k:
        raise _bad(
            "prompt_logprobs",
            f"Requested prompt logprobs of {wanted}, which is greater than max allowed: "
            f"{limits.max_top_k}",
            wanted,
        )
    asked = request.sampling.logprobs
    if asked is not None and asked > limits.max_top_k:
        raise _bad(
            "logprobs",
            f"Requested sample logprobs of {asked}, which is greater than max allowed: "
            f"{limits.max_top_k}",
            asked,
        )
    bound = max(limits.max_token_id, limits.vocab_width - 1)
    for prompt in request.prompts:
        if not prompt:
            raise ProtocolError("The decoder prompt cannot be empty")
        worst = max(prompt)
        if worst > bound or min(prompt) < 0:
            bad = worst if worst > bound else min(prompt)
            raise ProtocolError(f"Token id {bad} is out of vocabulary")


def _check_length(tokens: int, max_tokens: int, max_model_len: int) -> None:
    if tokens > max_model_len:
        raise _bad(
            "input_tokens",
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains {tokens} input tokens, which exceeds this limit even without any "
            "output tokens. Please reduce the length of the input prompt.",
            tokens,
        )
    if tokens + max_tokens > max_model_len:
        raise _bad(
            "max_tokens",
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
            f"maximum context length is {max_model_len} tokens and your request has {tokens} "
            f"input tokens ({max_tokens} > {max_model_len} - {tokens}).",
            max_tokens,
        )
