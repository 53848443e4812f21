"""Identity bounds exactly as Kiln's ``TeacherIdentityV1::validate`` draws them.

Every value here comes from ericflo/kiln ``crates/kiln-train/src/teacher_identity.rs``
(the newest stored version, commit 277e3faa: ``validate()`` and its test
``validates_text_and_numeric_bounds``) or from the identities built by the tests
of ``crates/kiln-train/src/remote_teacher.rs`` (commit 0751a8c6).  Kiln bounds
``vocab_size`` 1..=16_777_216, ``max_top_k`` 1..=65_536 and <= ``vocab_size``,
``max_model_len`` 1..=16_777_216, ``max_prompt_logprob_candidates``
1..=1_000_000 and at least one maximum-K row (``min(max_top_k + 1,
vocab_size)``); ``validate()`` does not tie the budget to ``max_model_len``.
Accepted identities are checked through the document, ``kiln fingerprint
verify`` / ``encode`` (real subprocesses) and a real probe over loopback; the
probe bounds its allocation by the smaller of the budget and what the request
can produce instead of refusing the identity.

Kiln's *launcher* is stricter: ``build_identity`` in ``scripts/vllm_teacher.py``
(commit f1b710f8) refuses a budget above ``min(1_000_000,
max_model_len * min(max_top_k + 1, vocab_size))``, so ``kiln-teacher`` (and
``kiln fingerprint ... --launcher-strict``) refuses (8, 8, 4096, 65536), an
identity the server's ``validate()`` accepts.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity.bounds import allocation_bound
from kiln_registry.identity.canonical import canonical_json
from kiln_registry.identity.compose import compose_identity
from kiln_registry.identity.document import TeacherIdentity, validate_identity
from kiln_registry.identity.fingerprint import verify_fingerprint
from kiln_registry.identity.input_manifest import parse_teacher_input
from kiln_registry.probe.client import ProbeLimiter, probe_teacher
from tests.probe.teacher_server import Reply, Request, TeacherServer, completion_body, vllm_error

A, B, C, F = "a" * 64, "b" * 64, "c" * 64, "f" * 64


def identity(vocab: int, top_k: int, model_len: int, candidates: int) -> TeacherIdentity:
    return TeacherIdentity(
        served_model_id="teacher-model",
        base_model_sha256=A,
        tokenizer_vocab_sha256=B,
        tokenizer_config_sha256=C,
        adapter=None,
        vocab_size=vocab,
        max_top_k=top_k,
        max_model_len=model_len,
        max_prompt_logprob_candidates=candidates,
        implementation="vllm-test",
        inference_config_sha256=F,
    )


# (vocab_size, max_top_k, max_model_len, max_prompt_logprob_candidates) Kiln accepts.
KILN_VALID = [
    (10, 1, 1, 10),  # teacher_identity.rs validates_text_and_numeric_bounds: the valid base
    (248_320, 20, 262_144, 1_000_000),  # teacher_identity.rs tests: identity()
    (128, 8, 4096, 1_000_000),  # remote_teacher.rs tests: teacher_identity()
    (128, 8, 4, 128),  # remote_teacher.rs request_builder_enforces_identity_context_...
    (128, 8, 4096, 9),  # remote_teacher.rs request_builder_enforces_identity_response_...
    (8, 8, 4096, 65_536),  # validate() accepts it; Kiln's launcher does not (see below)
    (16_777_216, 65_536, 16_777_216, 1_000_000),  # every MAX_TEACHER_* at once
    (1, 1, 1, 1),  # one-row minimum: min(1 + 1, 1) = 1
]

# teacher_identity.rs validates_text_and_numeric_bounds: "must reject" tuples, with the
# rule this project names and the field its message names.
KILN_INVALID = [
    ((0, 1, 1, 1), "identity.integer_range", "vocab_size"),
    ((16_777_217, 1, 1, 1), "identity.integer_range", "vocab_size"),
    ((10, 0, 1, 1), "identity.integer_range", "max_top_k"),
    ((10, 11, 1, 1), "identity.top_k_above_vocab", "max_top_k"),
    ((65_537, 65_537, 1, 1), "identity.integer_range", "max_top_k"),
    ((10, 1, 0, 1), "identity.integer_range", "max_model_len"),
    ((10, 1, 16_777_217, 1), "identity.integer_range", "max_model_len"),
    ((10, 1, 1, 0), "bounds.below_row_width", "max_prompt_logprob_candidates"),
    ((10, 1, 1, 1_000_001), "bounds.above_max", "max_prompt_logprob_candidates"),
    # validate(): "must fit one maximum-K response row (min(max_top_k + 1, vocab) candidates)"
    ((128, 8, 4096, 8), "bounds.below_row_width", "max_prompt_logprob_candidates"),
    ((8, 8, 4096, 7), "bounds.below_row_width", "max_prompt_logprob_candidates"),
]


@pytest.mark.parametrize("values", KILN_VALID, ids=str)
def test_identities_kiln_accepts_are_accepted(values: tuple[int, int, int, int]) -> None:
    ident = identity(*values)
    assert verify_fingerprint(ident.fingerprint()) == ident
    assert TeacherIdentity.from_mapping(ident.to_dict()) == ident


@pytest.mark.parametrize(("values", "rule", "field"), KILN_INVALID, ids=str)
def test_identities_kiln_refuses_are_refused(
    values: tuple[int, int, int, int], rule: str, field: str
) -> None:
    vocab, top_k, model_len, candidates = values
    document = identity(10, 1, 1, 10).to_dict()
    document.update(
        vocab_size=vocab,
        max_top_k=top_k,
        max_model_len=model_len,
        max_prompt_logprob_candidates=candidates,
    )
    with pytest.raises(IdentityError) as info:
        TeacherIdentity.from_mapping(document)
    assert info.value.rule == rule
    assert field in str(info.value)


def kiln_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kiln_registry.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        input=stdin,
        check=False,
    )


def test_fingerprint_cli_accepts_the_issue_example(tmp_path: Path) -> None:
    """vocab 8, top-K 8, length 4096, candidates 65536: valid for Kiln's validate(), so here."""
    ident = identity(8, 8, 4096, 65_536)
    done = kiln_cli("fingerprint", "verify", ident.fingerprint())
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["valid"] is True and out["identity"]["max_prompt_logprob_candidates"] == 65_536
    path = tmp_path / "identity.json"
    path.write_text(json.dumps(ident.to_dict()))
    done = kiln_cli("fingerprint", "encode", str(path))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["fingerprint"] == ident.fingerprint()
    # Kiln's launcher (build_identity) refuses it: 65536 > 4096 * min(8 + 1, 8).
    launcher = replace(ident, implementation="vllm:0.25.0").fingerprint()
    done = kiln_cli("fingerprint", "verify", launcher, "--launcher-strict")
    assert done.returncode == 2 and "bounds.above_model_len" in done.stderr, done.stderr


def test_fingerprint_cli_refuses_a_budget_kiln_refuses() -> None:
    bad = identity(8, 8, 4096, 65_536).to_dict()
    bad["max_prompt_logprob_candidates"] = 7  # below one row of min(8 + 1, 8)
    with pytest.raises(IdentityError):
        TeacherIdentity.from_mapping(bad)
    good = identity(8, 8, 4096, 8)
    text = good.fingerprint()
    done = kiln_cli("fingerprint", "verify", text.replace("kiln-teacher-v1", "kiln-teacher-v2"))
    assert done.returncode == 2


def test_allocation_is_the_smaller_of_budget_and_request() -> None:
    # The probe's two-token prompt at K=8 with vocab 8: one row of 8, not 65536.
    assert allocation_bound(65_536, prompt_len=2, k=8, vocab_size=8) == 8
    # Kiln's remote_teacher.rs request builder test: budget 9 caps 2 rows of 9 (18).
    assert allocation_bound(9, prompt_len=3, k=8, vocab_size=128) == 9
    assert allocation_bound(1_000_000, prompt_len=1, k=1, vocab_size=2) == 0


def small_vocab_teacher(ident: TeacherIdentity) -> object:
    """A vLLM-like teacher over a vocabulary of ``ident.vocab_size`` tokens (--max-logprobs=K)."""

    def handle(request: Request, index: int) -> Reply:
        req = request.json()
        k = req["prompt_logprobs"]
        assert isinstance(k, int)
        if k > ident.max_top_k:
            return vllm_error(f"Requested prompt logprobs of {k}")
        # Observed token 0 selected at rank 1; the others ranked 2..k, all below vocab.
        row = [(0, -0.5, 1)] + [(t, -3.0 - t, t + 1) for t in range(1, k)]
        body = completion_body(
            model="teacher-model", fingerprint=ident.fingerprint(), prompt=[0, 0], k=k, rows=[row]
        )
        return Reply(body=body)

    return handle


def test_a_teacher_with_the_issue_example_identity_probes() -> None:
    ident = identity(8, 8, 4096, 65_536)

    async def main() -> object:
        async with httpx.AsyncClient(trust_env=False) as http:
            return await probe_teacher(
                http,
                completions_url=server.url,
                model_id="teacher-model",
                student=None,
                pinned=None,
                secret=None,
                limiter=ProbeLimiter(),
            )

    with TeacherServer(small_vocab_teacher(ident)) as server:  # type: ignore[arg-type]
        report = asyncio.run(main())
    assert getattr(report, "outcome", None) == "passed"
    assert getattr(report, "fingerprint", None) == ident.fingerprint()


def test_budget_above_model_len_times_width_is_a_valid_identity() -> None:
    """Kiln's validate() has no max_model_len relation (only its launcher has)."""
    ident = identity(10, 1, 1, 10)  # 1 * min(2, 10) = 2 < 10
    assert ident.max_prompt_logprob_candidates == 10
    assert replace(ident, max_prompt_logprob_candidates=1_000_000).fingerprint()


# scripts/vllm_teacher.py build_identity: one_row_max <= candidates
# <= min(MAX_PROMPT_LOGPROB_CANDIDATES, max_model_len * one_row_max).
LAUNCHER_BUDGETS = [
    ((8, 8, 4096, 65_536), "bounds.above_model_len"),  # 4096 * min(9, 8) = 32768
    ((8, 8, 4096, 32_768), None),
    ((128, 8, 4, 36), None),  # 4 * 9
    ((128, 8, 4, 37), "bounds.above_model_len"),
    ((128, 8, 4096, 1_000_000), "bounds.above_model_len"),  # 36864: valid only for validate()
    ((248_320, 20, 262_144, 1_000_000), None),  # min(1M, 262144 * 21) = 1M
]


@pytest.mark.parametrize(("values", "rule"), LAUNCHER_BUDGETS, ids=str)
def test_the_launcher_refuses_a_budget_kilns_launcher_refuses(
    values: tuple[int, int, int, int], rule: str | None
) -> None:
    ident = replace(identity(*values), implementation="vllm:0.25.0")
    assert TeacherIdentity.from_mapping(ident.to_dict()) == ident  # validate() accepts all
    if rule is None:
        validate_identity(ident, launcher_strict=True)
        return
    with pytest.raises(IdentityError) as info:
        TeacherIdentity.from_mapping(ident.to_dict(), launcher_strict=True)
    assert info.value.rule == rule


def test_kiln_teacher_composes_no_identity_above_the_launcher_budget() -> None:
    """compose_identity (kiln-teacher's path): max_model_len 128, K 8, vocab 64: 128 * 9."""
    vectors = json.loads((Path(__file__).parents[1] / "vectors" / "compose.json").read_text())
    case = next(c for c in vectors["cases"] if c["name"] == "small_model_default_below_million")
    inputs = parse_teacher_input(canonical_json(case["input"]), source=case["name"])
    params = dict(case["parameters"], max_prompt_logprob_candidates=128 * 9)
    assert compose_identity(inputs, **params).identity.max_prompt_logprob_candidates == 1152
    params["max_prompt_logprob_candidates"] = 128 * 9 + 1
    with pytest.raises(IdentityError) as info:
        compose_identity(inputs, **params)
    assert info.value.rule == "bounds.above_model_len" and "1152" in info.value.message
