"""What the endpoint lets through to the teacher: the allowlist and the pin's bounds.

A completion body is one strict JSON object (UTF-8, no duplicate keys, no
``NaN``/``Infinity``) whose every key is in ``ALLOWED_FIELDS``; any other key
(``logit_bias``, ``allowed_token_ids``, ``bad_words``, ``logits_processors``,
``structured_outputs``/``guided_*``/``response_format``, ``vllm_xargs``,
``kv_transfer_params``, ``lora_request``, ``truncate_prompt_tokens`` ... and
anything unknown) is a vLLM-shaped 400 naming it.  The fields:

* ``model``: exactly the pinned ``served_model_id`` (else 404, as vLLM says
  of an unknown model: never an adapter or another model of the server);
* ``prompt``: one string, one token-id list, or a list of either (not mixed),
  at most ``max_prompts``; token ids below the pin's ``vocab_size``; a token
  prompt plus ``max_tokens`` within ``max_model_len``;
* ``prompt_logprobs`` / ``logprobs``: null or ``0..=max_top_k``; a token
  prompt's rows within ``max_prompt_logprob_candidates``;
* ``max_tokens`` null or ``1..=max_model_len``; ``n`` ``1..=max_n``
  (``best_of`` null or equal to ``n``); ``temperature`` >= 0, ``top_p`` in
  (0, 1], ``seed`` an integer; ``stream`` and ``echo`` false only (every
  answer is checked whole before it is relayed); the plain sampling options
  in ``SAMPLING_FIELDS`` with their vLLM types.

Every bound is checked before the teacher is asked.  Imports the standard
library, ``identity.strict_read``, ``domain.limits`` and ``endpoint.errors``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

from kiln_registry.domain.limits import MAX_BODY_LIMIT, MIN_BODY_LIMIT
from kiln_registry.endpoint.errors import NOT_FOUND, EndpointRefusal, bad_request
from kiln_registry.identity.strict_read import loads_strict

CORE_FIELDS: Final = frozenset(
    {"model", "prompt", "max_tokens", "prompt_logprobs", "logprobs", "n", "best_of",
     "temperature", "top_p", "seed", "stream", "echo", "user", "add_special_tokens",
     "return_token_ids", "return_tokens_as_token_ids"}
)  # fmt: skip
NUMBER_FIELDS: Final = frozenset(
    {"presence_penalty", "frequency_penalty", "repetition_penalty", "min_p"}
)
INT_FIELDS: Final = frozenset({"top_k", "min_tokens"})
BOOL_FIELDS: Final = frozenset(
    {"ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
     "include_stop_str_in_output", "add_special_tokens", "return_token_ids",
     "return_tokens_as_token_ids"}
)  # fmt: skip
SAMPLING_FIELDS: Final = NUMBER_FIELDS | INT_FIELDS | {"stop", "stop_token_ids"}
ALLOWED_FIELDS: Final = CORE_FIELDS | SAMPLING_FIELDS | BOOL_FIELDS
MAX_STOP_ENTRIES: Final = 16
MAX_STOP_CHARS: Final = 256
MAX_SHOWN_KEY: Final = 64
DEFAULT_MAX_TOKENS: Final = 16  # vLLM's default for /v1/completions


@dataclass(frozen=True, slots=True)
class Pin:
    """The bounds of the pinned identity that requests are checked against."""

    served_model_id: str
    vocab_size: int
    max_top_k: int
    max_model_len: int
    max_candidates: int


@dataclass(frozen=True, slots=True)
class Limits:
    """The endpoint's own bounds (flags of ``kiln teacher-endpoint``)."""

    max_prompts: int = 256
    max_n: int = 16
    max_body_bytes: int = 64 << 20


@dataclass(frozen=True, slots=True)
class Admitted:
    """A request that may go to the teacher, and what its answer must look like.

    ``prompts``: each prompt's token ids, or None for a text prompt (the
    teacher tokenizes it; its rows are bounded by ``max_model_len``).
    """

    payload: dict[str, Any]
    prompts: tuple[tuple[int, ...] | None, ...]
    n: int
    prompt_logprobs: int | None
    logprobs: int | None
    max_tokens: int
    response_limit: int

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.n

    @property
    def scored_tokens(self) -> int:
        """Prompt tokens whose rows the answer carries (text prompts count 0)."""
        if self.prompt_logprobs is None:
            return 0
        return sum(len(p) for p in self.prompts if p is not None) * self.n


def admit(body: bytes, pin: Pin, limits: Limits) -> Admitted:
    """Check one completion body (see the module docstring); a refusal raises."""
    request = _strict_object(body)
    _check_keys(request)
    _check_model(request.get("model"), pin)
    prompts = _prompts(request.get("prompt"), pin, limits)
    n = _int(request, "n", 1, 1, limits.max_n)
    best_of = request.get("best_of")
    if best_of is not None and (not _is_int(best_of) or best_of != n):
        raise bad_request("best_of must be null or equal to n", "best_of", "best_of")
    max_tokens = _int(request, "max_tokens", DEFAULT_MAX_TOKENS, 1, pin.max_model_len)
    prompt_k = _logprobs(request, "prompt_logprobs", pin)
    gen_k = _logprobs(request, "logprobs", pin)
    for name in ("stream", "echo"):
        if request.get(name) not in (None, False):
            message = f"{name} must be false: every answer is checked whole before it is relayed"
            raise bad_request(message, name, name)
    _check_sampling(request)
    for prompt in prompts:
        _check_prompt_bounds(prompt, max_tokens, prompt_k, pin)
    limit = response_limit(prompts, n, max_tokens, max(prompt_k or 0, gen_k or 0), pin)
    return Admitted(request, prompts, n, prompt_k, gen_k, max_tokens, limit)


def _strict_object(body: bytes) -> dict[str, Any]:
    try:
        value = loads_strict(body)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise bad_request(
            "the body must be one UTF-8 JSON object without duplicate keys or NaN", "body", "json"
        ) from None
    if not isinstance(value, dict):
        raise bad_request("the body must be one JSON object", "body", "json")
    return value


def _check_keys(request: dict[str, Any]) -> None:
    refused = sorted(key for key in request if key not in ALLOWED_FIELDS)
    if refused:
        name = refused[0][:MAX_SHOWN_KEY].encode("ascii", "backslashreplace").decode()
        raise bad_request(
            f"the field {name!r} is not allowed: it could change what the pinned teacher"
            " computes, or it is unknown (see docs/teacher-endpoint.md for the allowlist)",
            name,
            "field_refused",
        )


def _check_model(model: object, pin: Pin) -> None:
    if model == pin.served_model_id:
        return
    if not isinstance(model, str):
        raise bad_request("model is required and must be the pinned model id", "model", "model")
    raise EndpointRefusal(
        404,
        f"The model `{_printable(model)}` does not exist. Valid aliases: {pin.served_model_id}.",
        kind=NOT_FOUND,
        param="model",
        rule="endpoint.model",
    )


def _printable(text: str) -> str:
    shown = text[:128]
    ok = shown.isascii() and shown.isprintable() and "`" not in shown
    return shown if ok else "<name>"


def _prompts(value: object, pin: Pin, limits: Limits) -> tuple[tuple[int, ...] | None, ...]:
    if isinstance(value, str) or (isinstance(value, list) and value and _is_int(value[0])):
        value = [value]
    if not isinstance(value, list) or not value:
        raise bad_request(
            "prompt must be a string, a token-id list, or a non-empty list of either",
            "prompt",
            "prompt",
        )
    if len(value) > limits.max_prompts:
        raise bad_request(
            f"at most {limits.max_prompts} prompts per request", "prompt", "prompts_per_request"
        )
    return tuple(_one_prompt(item, pin) for item in value)


def _one_prompt(item: object, pin: Pin) -> tuple[int, ...] | None:
    if isinstance(item, str):
        if not item:
            raise bad_request("a text prompt must not be empty", "prompt", "prompt")
        return None
    if not isinstance(item, list) or not item:
        raise bad_request("each prompt must be a string or a non-empty token-id list", "prompt",
                          "prompt")  # fmt: skip
    if len(item) > pin.max_model_len:
        raise bad_request(
            f"This model's maximum context length is {pin.max_model_len} tokens. However, your"
            f" prompt contains {len(item)} input tokens.",
            "prompt",
            "max_model_len",
        )
    if not _token_ids(item, pin.vocab_size):
        raise bad_request(
            f"prompt token ids must be integers in 0..{pin.vocab_size - 1} (the pin's vocab_size)",
            "prompt",
            "token_id",
        )
    return tuple(item)


def _check_prompt_bounds(
    prompt: tuple[int, ...] | None, max_tokens: int, k: int | None, pin: Pin
) -> None:
    if prompt is None:
        return
    if len(prompt) + max_tokens > pin.max_model_len:
        raise bad_request(
            f"This model's maximum context length is {pin.max_model_len} tokens. However, you"
            f" requested {len(prompt) + max_tokens} tokens ({len(prompt)} in the prompt,"
            f" {max_tokens} for the completion).",
            "max_tokens",
            "max_model_len",
        )
    if k is not None and (len(prompt) - 1) * min(k + 1, pin.vocab_size) > pin.max_candidates:
        raise bad_request(
            f"a prompt of {len(prompt)} tokens at prompt_logprobs={k} could exceed the pin's"
            f" max_prompt_logprob_candidates {pin.max_candidates}",
            "prompt_logprobs",
            "candidate_budget",
        )


def _logprobs(request: dict[str, Any], name: str, pin: Pin) -> int | None:
    value = request.get(name)
    if value is None:
        return None
    if not _is_int(value) or not 0 <= value <= pin.max_top_k:
        raise bad_request(
            f"Requested {name} of {value if _is_int(value) else '?'}, which is greater than max"
            f" allowed: {pin.max_top_k} (must be null or an integer in 0..{pin.max_top_k})",
            name,
            "max_top_k",
        )
    return int(value)


def _int(request: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = request.get(name)
    if value is None:
        return default
    if not _is_int(value) or not low <= value <= high:
        raise bad_request(f"{name} must be null or an integer in {low}..{high}", name, name)
    return int(value)


def _check_sampling(request: dict[str, Any]) -> None:
    temperature = request.get("temperature")
    if temperature is not None and not (_is_number(temperature) and temperature >= 0):
        raise bad_request("temperature must be a number >= 0", "temperature", "temperature")
    top_p = request.get("top_p")
    if top_p is not None and not (_is_number(top_p) and 0 < top_p <= 1):
        raise bad_request("top_p must be a number in (0, 1]", "top_p", "top_p")
    if request.get("seed") is not None and not _is_int(request["seed"]):
        raise bad_request("seed must be null or an integer", "seed", "seed")
    for name in NUMBER_FIELDS & request.keys():
        if request[name] is not None and not _is_number(request[name]):
            raise bad_request(f"{name} must be null or a finite number", name, name)
    for name in INT_FIELDS & request.keys():
        if request[name] is not None and not _is_int(request[name]):
            raise bad_request(f"{name} must be null or an integer", name, name)
    for name in BOOL_FIELDS & request.keys():
        if request[name] is not None and not isinstance(request[name], bool):
            raise bad_request(f"{name} must be null or a boolean", name, name)
    if request.get("user") is not None and not isinstance(request["user"], str):
        raise bad_request("user must be null or a string", "user", "user")
    _check_stops(request)


def _check_stops(request: dict[str, Any]) -> None:
    stop = request.get("stop")
    stops = [stop] if isinstance(stop, str) else stop
    if stops is not None and not (
        isinstance(stops, list)
        and len(stops) <= MAX_STOP_ENTRIES
        and all(isinstance(s, str) and len(s) <= MAX_STOP_CHARS for s in stops)
    ):
        raise bad_request(
            f"stop must be null, a string or at most {MAX_STOP_ENTRIES} strings", "stop", "stop"
        )
    ids = request.get("stop_token_ids")
    if ids is not None and not (
        isinstance(ids, list) and len(ids) <= MAX_STOP_ENTRIES and all(map(_is_int, ids))
    ):
        raise bad_request(
            f"stop_token_ids must be null or at most {MAX_STOP_ENTRIES} token ids",
            "stop_token_ids",
            "stop_token_ids",
        )


def response_limit(
    prompts: tuple[tuple[int, ...] | None, ...], n: int, max_tokens: int, k: int, pin: Pin
) -> int:
    """Bytes an honest answer can take: the probe's per-token bound over every choice."""
    total = 0
    for prompt in prompts:
        tokens = pin.max_model_len if prompt is None else len(prompt) + max_tokens
        total += n * (tokens * (k + 1) * 128 + tokens * 32 + 4096)
    return max(MIN_BODY_LIMIT, min(MAX_BODY_LIMIT, total + 65536))


def _token_ids(item: list[Any], vocab_size: int) -> bool:
    """Every entry an integer in ``0..vocab_size-1``: the types first, in one pass in C
    (the parser makes exact ``int``s; a bool is not one), then the bounds."""
    return set(map(type, item)) == {int} and min(item) >= 0 and max(item) < vocab_size


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return _is_int(value)
