"""What the gateway lets through: routes, credentials and request limits.

* Routes: exactly ``POST /v1/completions``, ``GET /v1/models`` and
  ``GET /health``, compared as raw request-target bytes.  Anything else,
  including a query string, a trailing slash, ``//``, percent-encoding or
  an absolute-form target, is a 404 from the gateway and never forwarded.
* Credentials: with a key, ``/v1/*`` needs exactly one
  ``Authorization: Bearer <key>`` (compared with ``hmac.compare_digest``);
  ``/health`` needs none, as in vLLM.  The header is never forwarded.
* A completion body is UTF-8 JSON, one object, no duplicate keys, no
  ``NaN``/``Infinity``.  ``model`` is required and must be the public served
  id (the adapter's internal base alias is refused by name); ``prompt`` is
  one token-id list of 1..``max_model_len`` ids or one string;
  ``prompt_logprobs``/``logprobs`` are null or 0..``max_top_k``; ``n`` and
  ``best_of`` are absent, null or 1; ``max_tokens`` null or >= 0; ``stream``
  a boolean.  Other fields pass through for vLLM to judge.
* The response bound is the probe client's ``response_body_limit`` over the
  tokens a response can describe (prompt plus ``max_tokens``, at most
  ``max_model_len``) at the larger of the two logprob counts, plus 512 bytes
  per token for a stream's event framing; an error body is read up to
  64 KiB, as ``probe.transport.body_cap`` does.

Imports: standard library, orjson (a fast path whose verdicts equal the strict parser's),
sibling gateway modules, ``domain.limits`` (the bounds shared with the probe client) and
``identity.strict_read`` (the strict parser).
"""

from __future__ import annotations

import hmac
import re
from typing import NamedTuple, TypeGuard

import orjson

from kiln_registry.domain.limits import ERROR_BODY_READ_LIMIT, MAX_BODY_LIMIT, MIN_BODY_LIMIT
from kiln_registry.gateway.config import GatewayConfig
from kiln_registry.gateway.http1 import RequestHead
from kiln_registry.gateway.refusals import NOT_FOUND, Refusal, bad_param, not_found
from kiln_registry.identity.strict_read import loads_strict

COMPLETIONS = "completions"
MODELS = "models"
HEALTH = "health"
ROUTES: dict[tuple[bytes, bytes], str] = {
    (b"POST", b"/v1/completions"): COMPLETIONS,
    (b"GET", b"/v1/models"): MODELS,
    (b"GET", b"/health"): HEALTH,
}
MAX_TOKEN_ID = 2**31 - 1
# The probe client's bounds (``probe.parse.response_body_limit``, ``probe.transport.body_cap``)
# come from ``domain.limits``, so the gateway imports neither httpx nor numpy.
STREAM_EVENT_BYTES = 512
_SHOWN_MODEL = re.compile(r"[A-Za-z0-9._/:-]{1,128}")
_KEY_END = re.compile(rb'"[ \t\n\r]*:')
_CONTAINERS = (dict, list)
# Digits to "0", every other byte to "x": a 19-digit run is then a plain substring search.
_DIGIT_MASK = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x78 for byte in range(256))
_LONG_RUN = b"0" * 19


class Admitted(NamedTuple):
    """A completion request that may be forwarded, and its response bound."""

    stream: bool
    response_limit: int


def route(head: RequestHead) -> str:
    """The route ``head`` names, or a 404 refusal."""
    found = ROUTES.get((head.method, head.target))
    if found is None:
        raise not_found()
    return found


def check_credentials(head: RequestHead, key: bytes | None) -> None:
    """Require exactly one ``Authorization: Bearer <key>`` when a key is configured."""
    if key is None:
        return
    values = head.values(b"authorization")
    presented = values[0] if len(values) == 1 else b""
    scheme, _, token = presented.partition(b" ")
    valid = scheme.lower() == b"bearer" and hmac.compare_digest(token, key)
    if not valid:
        raise Refusal(401, "Unauthorized")


def response_body_limit(prompt_len: int, k: int) -> int:
    """``clamp(prompt_len * (k + 1) * 128 + prompt_len * 32 + 65536, 1 MiB, 256 MiB)``."""
    raw = prompt_len * (k + 1) * 128 + prompt_len * 32 + 65536
    return max(MIN_BODY_LIMIT, min(MAX_BODY_LIMIT, raw))


def response_cap(status: int, limit: int | None) -> int:
    """How much of an answer passes: all of a 2xx up to the bound, at most 64 KiB of another
    (``None``: a ``/v1/models`` or ``/health`` answer, bounded at 1 MiB)."""
    bound = MIN_BODY_LIMIT if limit is None else limit
    return bound if status < 300 else min(bound, ERROR_BODY_READ_LIMIT)


def admit_completion(body: bytes, config: GatewayConfig) -> Admitted:
    """Check one completion body against the limits (see the module docstring)."""
    request = _strict_object(body)
    _check_model(request.get("model"), config)
    prompt_len = _prompt_len(request.get("prompt"), config.max_model_len)
    k = max(_logprobs(request, "prompt_logprobs", config), _logprobs(request, "logprobs", config))
    for name in ("n", "best_of"):
        if request.get(name) not in (None, 1) or request.get(name) is True:
            raise bad_param(f"the gateway serves {name} = 1 only", name)
    max_tokens = request.get("max_tokens")
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 0):
        raise bad_param("max_tokens must be null or a non-negative integer", "max_tokens")
    stream = request.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_param("stream must be a boolean", "stream")
    tokens = min(config.max_model_len, prompt_len + (max_tokens or config.max_model_len))
    limit = response_body_limit(tokens, k) + (tokens * STREAM_EVENT_BYTES if stream else 0)
    return Admitted(stream=stream, response_limit=limit)


def _strict_object(body: bytes) -> dict[str, object]:
    value = _fast_parse(body)
    if value is None:
        value = _exact_parse(body)
    if not isinstance(value, dict):
        raise bad_param("the body must be one JSON object", "body")
    return value


def _fast_parse(body: bytes) -> object | None:
    """orjson's value when it is provably the strict parser's, else None.

    orjson refuses NaN, Infinity, invalid UTF-8 and whatever else it cannot parse exactly
    (the strict parser then decides); it reads an integer past 64 bits as a float, so a body
    with a run of 19 digits goes the strict way too.  A duplicate key it accepts: each key
    of the text ends in a quote, optional white space and a colon, so when the parsed objects
    hold as many keys as the text has such endings, no key was given twice."""
    if _LONG_RUN in body.translate(_DIGIT_MASK):
        return None
    try:
        value = orjson.loads(body)
        objects = body.count(b"{")
        keys = len(value) if objects == 1 and type(value) is dict else _count_keys(value)
    except (orjson.JSONDecodeError, RecursionError):
        return None
    return value if keys == len(_KEY_END.findall(body)) else None


def _count_keys(value: object) -> int:
    if type(value) is dict:
        inner = (v for v in value.values() if type(v) in _CONTAINERS)
        return len(value) + sum(map(_count_keys, inner))
    if type(value) is list:
        return sum(map(_count_keys, (v for v in value if type(v) in _CONTAINERS)))
    return 0


def _exact_parse(body: bytes) -> object:
    try:
        return loads_strict(body)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise bad_param(
            "the body must be one UTF-8 JSON object without duplicate keys", "body"
        ) from None


def _check_model(model: object, config: GatewayConfig) -> None:
    if model == config.served_model_id:
        return
    if not isinstance(model, str):
        raise bad_param("model is required and must be the served model id", "model")
    if config.base_alias is not None and model == config.base_alias:
        message = (
            f"The model `{model}` is the adapter's internal base alias and is not served "
            f"here. Valid aliases: {config.served_model_id}."
        )
    else:
        shown = model if _SHOWN_MODEL.fullmatch(model) else "<name>"
        message = f"The model `{shown}` does not exist. Valid aliases: {config.served_model_id}."
    raise Refusal(404, message, kind=NOT_FOUND, param="model", close=False)


def _prompt_len(prompt: object, max_model_len: int) -> int:
    if isinstance(prompt, str) and prompt:
        return max_model_len  # tokens are counted by vLLM; the bound assumes the most
    if not isinstance(prompt, list) or not prompt:
        raise bad_param("prompt must be one non-empty token-id list or one string", "prompt")
    if len(prompt) > max_model_len:
        raise bad_param(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains {len(prompt)} input tokens.",
            "input_tokens",
        )
    exact_ints = set(map(type, prompt)) == {int}  # a bool is not an int here
    if not exact_ints or min(prompt) < 0 or max(prompt) > MAX_TOKEN_ID:
        raise bad_param("prompt token ids must be integers in 0..2^31-1", "prompt")
    return len(prompt)


def _logprobs(request: dict[str, object], name: str, config: GatewayConfig) -> int:
    value = request.get(name)
    if value is None:
        return 0
    if not _is_int(value) or not 0 <= value <= config.max_top_k:
        raise bad_param(
            f"Requested {name} must be null or an integer in 0..{config.max_top_k} "
            f"(the max allowed: {config.max_top_k})",
            name,
        )
    return value


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
