"""One generation request to a pinned teacher: the body, bounded strict parsing, verification.

The request sends the rendered prompt as token ids to ``/v1/completions``
with ``return_token_ids`` (the generated ids come back as ids, never
re-tokenized text) and, when ``top_k > 0``, ``logprobs = top_k`` with
``return_tokens_as_token_ids`` (vLLM's completion logprobs then name tokens
``token_id:N``).  A response is refused before it is parsed when it exceeds
``generation_body_limit``; parsing is the probe's strict JSON (no duplicate
keys, no NaN/Infinity); logprobs follow the probe's ``check_logprob`` rule;
``system_fingerprint`` must be the pinned identity's exact fingerprint on
every response.  A ``length`` finish must carry exactly ``max_tokens`` ids
(fewer is refused), a ``stop`` finish at most that many, and
``usage.completion_tokens`` must equal the count.  Each generated token's
``top_logprobs`` holds the sampled token plus the top ``K`` (vLLM writes the
sampled token first and merges it when it is in the top ``K``): the top
``K`` are kept, best first.  Retries as scoring's (connection failures, 503).

Imports: standard library, ``kiln_registry.domain.errors``/``identity``/``probe``
and ``jobs.generation.sources``/``jobs.scoring.target``; no database.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, NoReturn

from kiln_registry.domain.errors import ProbeFailed
from kiln_registry.domain.limits import MAX_BODY_LIMIT, MIN_BODY_LIMIT
from kiln_registry.domain.text import quoted
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.jobs.generation.sources import GenerationSettings
from kiln_registry.jobs.scoring.target import SCORE_TIMEOUT_S, send_with_retries
from kiln_registry.probe.parse import check_logprob, strict_loads, withholding_response_text
from kiln_registry.probe.transport import SecretSource, TeacherTransport
from kiln_registry.probe.verify import identity_from_fingerprint

FINISH_REASONS: Final = ("length", "stop")
_TOKEN_PREFIX: Final = "token_id:"


def generation_body_limit(prompt_len: int, s: GenerationSettings) -> int:
    """Largest body accepted: fixed room, the echoed prompt ids, per-token and per-candidate."""
    raw = 65536 + prompt_len * 16 + s.max_tokens * (512 + (s.top_k + 1) * 64)
    return max(MIN_BODY_LIMIT, min(MAX_BODY_LIMIT, raw))


def generation_request(
    model_id: str, prompt: list[int], s: GenerationSettings
) -> dict[str, object]:
    body: dict[str, object] = {
        "model": model_id, "prompt": prompt, "max_tokens": s.max_tokens,
        "temperature": s.temperature, "top_p": s.top_p, "n": 1, "stream": False,
        "add_special_tokens": False, "return_token_ids": True,
        "logprobs": s.top_k if s.top_k > 0 else None,
    }  # fmt: skip
    if s.top_k > 0:
        body["return_tokens_as_token_ids"] = True
    if s.seed is not None:
        body["seed"] = s.seed
    return body


@dataclass(frozen=True, slots=True)
class KilnTokens:
    """The teacher's scores in Kiln's tokenization (``jobs.generation.kiln``).

    ``sequence`` is the whole conversation as Kiln tokenizes it, ``positions``
    its action positions; per position, the teacher's logprob of the token
    there and its top-K over the logits row before it, best first.
    """

    sequence: list[int]
    positions: list[int]
    logprobs: list[float]
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]

    def to_json(self) -> dict[str, object]:
        return {"sequence": self.sequence, "positions": self.positions,
                "logprobs": self.logprobs, "top_ids": self.top_ids,
                "top_logprobs": self.top_logprobs}  # fmt: skip

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> KilnTokens:
        return cls(value["sequence"], value["positions"], value["logprobs"], value["top_ids"],
                   value["top_logprobs"])  # fmt: skip


@dataclass(frozen=True, slots=True)
class Generated:
    """A verified generation: ids, finish reason, per-token logprobs when asked, and
    (``top_k > 0``) the teacher's scores in Kiln's tokenization."""

    token_ids: list[int]
    finish_reason: str
    logprobs: list[float] | None = None
    top_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None
    kiln: KilnTokens | None = None

    def to_json(self) -> dict[str, object]:
        return {"token_ids": self.token_ids, "finish_reason": self.finish_reason,
                "logprobs": self.logprobs, "top_ids": self.top_ids,
                "top_logprobs": self.top_logprobs,
                "kiln": self.kiln.to_json() if self.kiln is not None else None}  # fmt: skip

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Generated:
        kiln = value.get("kiln")
        return cls(value["token_ids"], value["finish_reason"], value["logprobs"],
                   value["top_ids"], value["top_logprobs"],
                   KilnTokens.from_json(kiln) if kiln is not None else None)  # fmt: skip


def _fail(rule: str, message: str) -> NoReturn:
    raise ProbeFailed(f"generation response: {message}", rule=f"generation.{rule}")


def _obj(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        _fail("shape", f"{where} is not an object")
    return value


def _list(value: object, n: int, where: str) -> list[Any]:
    if not isinstance(value, list) or len(value) != n:
        _fail("shape", f"{where} is not an array of {n} entries")
    return value


def _token_key(key: object, vocab: int, where: str) -> int:
    if not isinstance(key, str) or not key.startswith(_TOKEN_PREFIX):
        _fail("token", f"{where} does not name a token as token_id:N")
    digits = key[len(_TOKEN_PREFIX) :]
    if not (0 < len(digits) <= 9 and digits.isascii() and digits.isdigit()):
        _fail("token", f"{where} does not name a token as token_id:N")
    value = int(digits)
    if value >= vocab:
        _fail("token_id", f"{where} names id {value}, not below vocab_size {vocab}")
    return value


def _top_row(
    row: object, sampled: int, k: int, vocab: int, where: str
) -> tuple[list[int], list[float]]:
    entries = _obj(row, where)
    if len(entries) not in (k, k + 1):
        _fail("top_logprobs", f"{where} has {len(entries)} entries, expected {k} or {k + 1}")
    pairs = [(_token_key(key, vocab, where), check_logprob(v, where)) for key, v in entries.items()]
    if len(pairs) == k + 1:
        if pairs[0][0] != sampled:
            _fail("top_logprobs", f"{where}: the extra entry is not the sampled token")
        pairs = pairs[1:]
    elif sampled not in {token for token, _ in pairs}:
        _fail("top_logprobs", f"{where} omits the sampled token")
    pairs.sort(key=lambda pair: -pair[1])
    return [t for t, _ in pairs], [lp for _, lp in pairs]


def _logprobs(value: object, ids: list[int], k: int, vocab: int) -> Generated:
    lp = _obj(value, "choices[0].logprobs")
    n = len(ids)
    tokens = _list(lp.get("tokens"), n, "logprobs.tokens")
    own = _list(lp.get("token_logprobs"), n, "logprobs.token_logprobs")
    tops = _list(lp.get("top_logprobs"), n, "logprobs.top_logprobs")
    own_lps: list[float] = []
    top_ids: list[list[int]] = []
    top_lps: list[list[float]] = []
    for i, token in enumerate(ids):
        where = f"logprobs[{i}]"
        if _token_key(tokens[i], vocab, where) != token:
            _fail("token_mismatch", f"{where}: the token differs from token_ids[{i}]")
        own_lps.append(check_logprob(own[i], where))
        row_ids, row_lps = _top_row(tops[i], token, k, vocab, f"top_logprobs[{i}]")
        top_ids.append(row_ids)
        top_lps.append(row_lps)
    return Generated(ids, "", own_lps, top_ids, top_lps)


def _envelope(top: dict[str, Any], model_id: str, identity: TeacherIdentity) -> dict[str, Any]:
    seen = identity_from_fingerprint(top.get("system_fingerprint"))
    if seen.fingerprint() != identity.fingerprint():
        _fail("fingerprint_pinned", f"system_fingerprint identity {seen.revision()} is not the"
              f" pinned {identity.revision()}")  # fmt: skip
    if top.get("object") != "text_completion" or top.get("model") != model_id:
        _fail("envelope", "object is not text_completion or model is not the requested one")
    choices = top.get("choices")
    if not isinstance(choices, list) or len(choices) != 1:
        _fail("choice_count", "the response must have exactly one choice")
    choice = _obj(choices[0], "choices[0]")
    if choice.get("index") != 0:
        _fail("shape", "choices[0].index is not 0")
    return choice


def _ids(
    choice: dict[str, Any], usage: dict[str, Any], s: GenerationSettings, vocab: int
) -> list[int]:
    ids = choice.get("token_ids")
    if not isinstance(ids, list) or not all(type(t) is int and 0 <= t < vocab for t in ids):
        _fail("token_ids", f"choices[0].token_ids is not an array of ids below {vocab}")
    finish = choice.get("finish_reason")
    if finish not in FINISH_REASONS:
        _fail("finish_reason", f"finish_reason {quoted(finish, 20)} is not length or stop")
    if not 1 <= len(ids) <= s.max_tokens or (finish == "length" and len(ids) != s.max_tokens):
        _fail("token_count", f"{len(ids)} tokens came back for max_tokens {s.max_tokens}"
              f" (finish_reason {finish})")  # fmt: skip
    if usage.get("completion_tokens") != len(ids):
        _fail("usage", "usage.completion_tokens differs from the tokens returned")
    return ids


def parse_generation(
    body: bytes, *, model_id: str, prompt_len: int, s: GenerationSettings,
    identity: TeacherIdentity,
) -> Generated:  # fmt: skip
    """Parse and verify one answer (see the module docstring)."""
    limit = generation_body_limit(prompt_len, s)
    if len(body) > limit:
        _fail("body_too_large", f"{len(body)} bytes exceed the bound of {limit}")
    top = _obj(strict_loads(body), "response body")
    choice = _envelope(top, model_id, identity)
    usage = _obj(top.get("usage"), "usage")
    if usage.get("prompt_tokens") != prompt_len:
        _fail("usage", "usage.prompt_tokens differs from the prompt sent")
    ids = _ids(choice, usage, s, identity.vocab_size)
    finish = str(choice["finish_reason"])
    if s.top_k == 0:
        if choice.get("logprobs") is not None:
            _fail("logprobs", "logprobs were returned although none were asked for")
        return Generated(ids, finish)
    got = _logprobs(choice.get("logprobs"), ids, s.top_k, identity.vocab_size)
    return Generated(ids, finish, got.logprobs, got.top_ids, got.top_logprobs)


@dataclass(frozen=True, slots=True)
class GenerationTarget:
    wire: TeacherTransport
    model_id: str
    secret: SecretSource | None
    identity: TeacherIdentity
    settings: GenerationSettings
    timeout_s: float = SCORE_TIMEOUT_S


async def generate(
    target: GenerationTarget,
    prompt: list[int],
    *,
    on_request: Callable[[], None] = lambda: None,
    on_retry: Callable[[], None] = lambda: None,
) -> Generated:
    """Generate for one prompt, retrying only connection failures and 503."""
    payload = generation_request(target.model_id, prompt, target.settings)
    limit = generation_body_limit(len(prompt), target.settings)
    hooks = (on_request, on_retry)
    answer = await send_with_retries(target, payload, limit, "generation request", hooks)
    with withholding_response_text(answer.authenticated):
        return parse_generation(
            answer.body, model_id=target.model_id, prompt_len=len(prompt),
            s=target.settings, identity=target.identity,
        )  # fmt: skip
