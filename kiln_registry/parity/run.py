"""``kiln teachers parity``: compare two teachers' prompt_logprobs on the same prompts.

Owns the parity run: each teacher is probed first (``probe_teacher``: K=1
discovery, K=max_top_k, the cap probe), which proves its Kiln identity; the
two identities must share ``tokenizer_vocab_sha256`` and ``vocab_size`` or the
run is refused.  Then the same deterministic numeric prompts are scored on
both with ``score_prompt`` (every response verified against its teacher's
identity) and graded ``identical`` (ids, ranks and float32 logprobs equal),
``within_tolerance`` (no row differs by more than ``atol``) or ``mismatch``
(with the first diverging position).

Positions are vLLM's ``prompt_logprobs`` indices: position ``p`` scores prompt
token ``p`` given tokens ``0..p-1``.  ``first`` is position 1, ``final`` the
last position of the longest prompt both teachers accept, ``interior`` every
position in between.

A row's difference is a lower bound that ties cannot inflate: a token in both
top-K lists contributes ``|lp_a - lp_b|``; a token in only one list
contributes how far its logprob is above the other teacher's K-th logprob
(zero for a boundary tie); the prompt token itself contributes
``|lp_a - lp_b|``.

Secrets: API keys are read from the named variables just before each request
(``SecretHandle``) and never stored or reported.  httpx is only the injected
client: every transport failure is mapped in ``kiln_registry.probe``
(``get_side``, ``HttpxTransport``).  Imports httpx, numpy, ``kiln_registry.probe``,
``credentials`` and ``identity``; never the API, database or launcher.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from kiln_registry.credentials.origin import parse_teacher_url
from kiln_registry.credentials.secrets import SecretHandle
from kiln_registry.domain.errors import InputError, KilnError, ProbeFailed
from kiln_registry.identity.document import TeacherIdentity, same_identity
from kiln_registry.identity.fingerprint import verify_fingerprint
from kiln_registry.parity.grade import POSITION_CLASSES, Grader
from kiln_registry.probe.client import ProbeLimiter, probe_teacher, score_prompt
from kiln_registry.probe.httpx_transport import get_side
from kiln_registry.probe.transport import request_headers
from kiln_registry.probe.verify import RowsCheck

REPORT_SCHEMA = "kiln.teacher-parity-report.v1"
SHORT_PROMPT_LEN = 64
MAX_PROMPTS = 16
MODELS_BODY_LIMIT = 1024 * 1024
DEFAULT_TOP_K = 20


@dataclass(frozen=True, slots=True)
class ParityTarget:
    """One teacher: its URL, optional served model id and optional key variable name."""

    url: str
    model_id: str | None = None
    api_key_env: str | None = None


@dataclass(frozen=True, slots=True)
class ParityOptions:
    positions: tuple[str, ...] = POSITION_CLASSES
    top_k: int | None = None
    prompts: int = 2
    max_prompt_len: int | None = None
    atol: float = 1e-3
    timeout_s: float = 60.0
    ca_file: Path | None = None

    def check(self) -> None:
        bad = [p for p in self.positions if p not in POSITION_CLASSES]
        if bad or not self.positions:
            raise InputError(
                f"--positions must be a comma list of {', '.join(POSITION_CLASSES)}",
                rule="parity.positions",
            )
        if not 1 <= self.prompts <= MAX_PROMPTS:
            raise InputError(f"--prompts must be in 1..={MAX_PROMPTS}", rule="parity.prompts")
        if not (0.0 <= self.atol < 100.0):
            raise InputError("--atol must be in [0, 100)", rule="parity.atol")
        if self.max_prompt_len is not None and self.max_prompt_len < 2:
            raise InputError("--max-prompt-len must be at least 2", rule="parity.prompt_len")


@dataclass(frozen=True, slots=True)
class _Teacher:
    completions_url: str
    model_id: str
    secret: SecretHandle | None
    identity: TeacherIdentity


def parity_prompts(count: int, length: int, vocab_size: int) -> list[tuple[int, ...]]:
    """``count`` deterministic prompts of ``length`` ids (splitmix64 over prompt and index).

    Ids stay below 7/8 of ``vocab_size``: a padded model width can exceed the
    tokenizer, and vLLM refuses ids the tokenizer does not know.
    """
    span = max(1, vocab_size * 7 // 8)
    mask = (1 << 64) - 1
    prompts = []
    for p in range(count):
        state = (0x9E3779B97F4A7C15 * (p + 1)) & mask
        ids = []
        for _ in range(length):
            state = (state + 0x9E3779B97F4A7C15) & mask
            z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & mask
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
            ids.append((z ^ (z >> 31)) % span)
        prompts.append(tuple(ids))
    return prompts


def check_comparable(a: TeacherIdentity, b: TeacherIdentity) -> None:
    """Refuse two teachers whose numeric vocabularies differ (their ids mean different things)."""
    if a.tokenizer_vocab_sha256 != b.tokenizer_vocab_sha256:
        raise InputError(
            f"teacher A tokenizer_vocab_sha256 {a.tokenizer_vocab_sha256} differs from teacher"
            f" B's {b.tokenizer_vocab_sha256}: token ids are not comparable",
            rule="parity.vocab",
        )
    if a.vocab_size != b.vocab_size:
        raise InputError(
            f"teacher A vocab_size {a.vocab_size} differs from teacher B's {b.vocab_size}",
            rule="parity.vocab_size",
        )


def choose_top_k(a: TeacherIdentity, b: TeacherIdentity, requested: int | None) -> int:
    ceiling = min(a.max_top_k, b.max_top_k)
    if requested is None:
        return min(ceiling, DEFAULT_TOP_K)
    if not 1 <= requested <= ceiling:
        raise InputError(
            f"--top-k {requested} is outside 1..={ceiling} (the smaller max_top_k)",
            rule="parity.top_k",
        )
    return requested


def choose_prompt_len(
    a: TeacherIdentity, b: TeacherIdentity, k: int, options: ParityOptions
) -> tuple[int, bool]:
    """(prompt length, whether it reaches the longest prompt both teachers accept)."""
    width = min(k + 1, a.vocab_size)
    budget = min(a.max_prompt_logprob_candidates, b.max_prompt_logprob_candidates)
    longest = min(a.max_model_len - 1, b.max_model_len - 1, budget // width + 1)
    length = longest
    if "final" not in options.positions:
        length = min(length, SHORT_PROMPT_LEN)
    if options.max_prompt_len is not None:
        length = min(length, options.max_prompt_len)
    needed = 4 if "interior" in options.positions else 2
    if length < needed:
        raise InputError(
            f"the teachers accept prompts of at most {longest} tokens; the requested positions"
            f" need {needed}",
            rule="parity.prompt_len",
        )
    return length, length == longest


async def _discover_model_id(
    http: httpx.AsyncClient, completions_url: str, secret: SecretHandle | None, timeout_s: float
) -> str:
    """The one model a teacher lists at ``/v1/models`` (bounded read, no redirects)."""
    url = completions_url.removesuffix("/completions") + "/models"
    headers = request_headers(secret, json_body=False)
    status, body = await get_side(
        http, url, headers=headers, limit=MODELS_BODY_LIMIT, timeout_s=timeout_s,
        side=("GET /v1/models", "parity.models"),
    )  # fmt: skip
    if status in (401, 403):
        raise ProbeFailed(
            f"GET /v1/models answered HTTP {status}",
            rule="parity.unauthorized",
            hint="name the variable holding the teacher's key with --api-key-env-a/-b",
        )
    try:
        data = json.loads(body) if status == 200 else None
        ids = [m["id"] for m in data["data"]] if isinstance(data, dict) else []
    except (ValueError, KeyError, TypeError):
        ids = []
    if len(ids) != 1 or not isinstance(ids[0], str):
        raise ProbeFailed(
            f"GET /v1/models (HTTP {status}) does not list exactly one model",
            rule="parity.models",
            hint="name the served model with --model-id-a / --model-id-b",
        )
    return ids[0]


async def _open_teacher(
    http: httpx.AsyncClient, side: str, target: ParityTarget, options: ParityOptions
) -> _Teacher:
    endpoint = parse_teacher_url(target.url)
    secret = None
    if target.api_key_env is not None:
        secret = SecretHandle(credential_id=f"parity-{side}", env_name=target.api_key_env)
        secret.check()
    model_id = target.model_id or await _discover_model_id(
        http, endpoint.completions_url, secret, options.timeout_s
    )
    report = await probe_teacher(
        http,
        completions_url=endpoint.completions_url,
        model_id=model_id,
        student=None,
        pinned=None,
        secret=secret,
        timeout_s=options.timeout_s,
        limiter=ProbeLimiter(1),
    )
    assert report.fingerprint is not None  # a passed report always carries it
    identity = verify_fingerprint(report.fingerprint)
    return _Teacher(endpoint.completions_url, model_id, secret, identity)


async def _sided(side: str, coro: Any) -> Any:
    """Await ``coro``; a KilnError is re-raised naming the teacher it came from."""
    try:
        return await coro
    except KilnError as exc:
        try:
            named = type(exc)(f"teacher {side}: {exc.message}", rule=exc.rule, hint=exc.hint)
        except TypeError:  # a subclass with its own constructor: keep it as it is
            raise exc from None
        raise named from exc


async def _score(
    http: httpx.AsyncClient, t: _Teacher, prompt: Sequence[int], k: int, timeout_s: float
) -> RowsCheck:
    scored = await score_prompt(
        http,
        completions_url=t.completions_url,
        model_id=t.model_id,
        prompt=prompt,
        k=k,
        identity=t.identity,
        secret=t.secret,
        timeout_s=timeout_s,
    )
    return scored.check


def _teacher_summary(t: _Teacher) -> dict[str, Any]:
    i = t.identity
    return {
        "url": t.completions_url,
        "model_id": t.model_id,
        "identity_revision": i.revision(),
        "implementation": i.implementation,
        "base_model_sha256": i.base_model_sha256,
        "inference_config_sha256": i.inference_config_sha256,
        "max_top_k": i.max_top_k,
        "max_model_len": i.max_model_len,
    }


async def run_parity(
    http: httpx.AsyncClient, a: ParityTarget, b: ParityTarget, options: ParityOptions
) -> dict[str, Any]:
    """Probe both teachers, score the same prompts on both, and grade them."""
    options.check()
    started = time.perf_counter()
    ta = await _sided("A", _open_teacher(http, "A", a, options))
    tb = await _sided("B", _open_teacher(http, "B", b, options))
    check_comparable(ta.identity, tb.identity)
    k = choose_top_k(ta.identity, tb.identity, options.top_k)
    length, reaches_limit = choose_prompt_len(ta.identity, tb.identity, k, options)
    grader = Grader(options.positions, options.atol)
    for index, prompt in enumerate(parity_prompts(options.prompts, length, ta.identity.vocab_size)):
        rows_a, rows_b = await asyncio.gather(
            _sided("A", _score(http, ta, prompt, k, options.timeout_s)),
            _sided("B", _score(http, tb, prompt, k, options.timeout_s)),
        )
        grader.add(index, rows_a, rows_b)
    graded = grader.result()
    return {
        "schema": REPORT_SCHEMA,
        "grade": graded.pop("grade"),
        "teachers": {"a": _teacher_summary(ta), "b": _teacher_summary(tb)},
        "same_identity": same_identity(ta.identity, tb.identity),
        "k": k,
        "prompt_count": options.prompts,
        "prompt_len": length,
        "final_is_longest_accepted": reaches_limit,
        "positions": list(options.positions),
        "atol": options.atol,
        **graded,
        "elapsed_ms": round((time.perf_counter() - started) * 1000.0, 3),
    }


def _verify(ca_file: Path | None) -> ssl.SSLContext | bool:
    if ca_file is None:
        return True
    try:
        return ssl.create_default_context(cafile=str(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise InputError(
            f"--ca-file {ca_file} is not a readable PEM CA bundle ({type(exc).__name__})",
            rule="parity.ca_file",
        ) from None


def parity(a: ParityTarget, b: ParityTarget, options: ParityOptions) -> dict[str, Any]:
    """Synchronous entry point: its own httpx client (no env proxies, no redirects)."""

    async def main() -> dict[str, Any]:
        async with httpx.AsyncClient(
            trust_env=False, follow_redirects=False, verify=_verify(options.ca_file)
        ) as http:
            return await run_parity(http, a, b, options)

    return asyncio.run(main())
