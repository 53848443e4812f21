"""Strict, bounded parsing of real vLLM bodies (tests/data/vllm_responses)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kiln_registry.domain.errors import ProbeFailed
from kiln_registry.probe.exposure import parse_error_body
from kiln_registry.probe.parse import (
    ParsedCompletion,
    parse_completion,
    response_body_limit,
    strict_loads,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "vllm_responses"
SUCCESS = ["pl0", "pl1", "pl32", "fp32_pl32_64tok", "pl1_greedy_tail", "pl1_single_token"]


def request_of(name: str) -> dict[str, object]:
    meta = json.loads((DATA / f"{name}.meta.json").read_text())
    body = meta["request"]["body"]
    assert isinstance(body, dict)
    return body


def parse_named(name: str, body: bytes | None = None, **overrides: int) -> ParsedCompletion:
    req = request_of(name)
    prompt = req["prompt"]
    assert isinstance(prompt, list)
    args = {
        "expected_prompt_len": len(prompt),
        "k": int(req["prompt_logprobs"]),  # type: ignore[call-overload]
        "vocab_size": 512,
        "max_candidates": 1_000_000,
    }
    args.update(overrides)
    return parse_completion(body or (DATA / f"{name}.json").read_bytes(), **args)


@pytest.mark.parametrize("name", SUCCESS)
def test_every_captured_success_body_parses(name: str) -> None:
    parsed = parse_named(name)
    prompt = request_of(name)["prompt"]
    assert isinstance(prompt, list)
    assert parsed.object == "text_completion" and parsed.model == "teacher-tiny"
    assert parsed.prompt_tokens == len(prompt) and parsed.choice_index == 0
    assert parsed.rows.row_count == len(prompt) - 1
    for row in range(parsed.rows.row_count):
        assert parsed.rows.ids[parsed.rows.offsets[row]] == prompt[row + 1]  # vLLM: first


def test_row_widths_and_ranks_of_captured_bodies() -> None:
    pl0 = parse_named("pl0").rows
    assert {pl0.row_width(r) for r in range(pl0.row_count)} == {1}
    assert pl0.ranks[0] == 410 and pl0.logprobs[0] == pytest.approx(-6.46706)
    assert pl0.sources is None  # vLLM's numbers are float32-exact
    pl1 = parse_named("pl1").rows
    assert {pl1.row_width(r) for r in range(pl1.row_count)} == {2}
    assert list(pl1.ranks[:2]) == [410, 1]
    pl32 = parse_named("pl32").rows
    widths = [pl32.row_width(r) for r in range(pl32.row_count)]
    assert set(widths) == {32, 33} and widths[7] == 32  # position 8: token 74 has rank 4
    start = pl32.offsets[7]
    assert list(pl32.ranks[start : start + 6]) == [4, 1, 2, 3, 5, 6]
    fp32 = parse_named("fp32_pl32_64tok")
    assert fp32.system_fingerprint == "teacher-fp-test" and fp32.rows.row_count == 63
    assert fp32.rows.candidate_count == sum(fp32.rows.row_width(r) for r in range(63))


def test_columns_are_compact_arrays() -> None:
    rows = parse_named("pl32").rows
    assert rows.ids.typecode == "i" and rows.ranks.typecode == "i"
    assert rows.logprobs.typecode == "f" and rows.offsets.typecode == "q"
    assert rows.offsets[0] == 0 and rows.offsets[-1] == rows.candidate_count == 362


@pytest.mark.parametrize("name", ["pl1_n2", "pl1_batch2"])
def test_more_than_one_choice_is_refused(name: str) -> None:
    req = request_of(name)
    prompt = req["prompt"]
    assert isinstance(prompt, list)
    length = len(prompt) if isinstance(prompt[0], int) else len(prompt[0])
    with pytest.raises(ProbeFailed) as info:
        parse_named(name, expected_prompt_len=length)
    assert info.value.rule == "probe.choice_count"


@pytest.mark.parametrize(
    ("name", "message", "kind"),
    [
        ("err_no_key", "Unauthorized", None),
        ("err_bad_key", "Unauthorized", None),
        ("err_pl33", "Requested prompt logprobs of 33", "BadRequestError"),
        ("err_token_oob", "Token id 99999 is out of vocabulary", "BadRequestError"),
        ("err_wrong_model", "The model `nope` does not exist", "NotFoundError"),
        ("err_too_long", "maximum context length is 256", "BadRequestError"),
    ],
)
def test_error_bodies(name: str, message: str, kind: str | None) -> None:
    err = parse_error_body((DATA / f"{name}.json").read_bytes())
    assert err is not None and message in err.message and err.type == kind


def test_non_error_bodies_are_not_error_envelopes() -> None:
    assert parse_error_body((DATA / "version.json").read_bytes()) is None
    assert parse_error_body(b"<html>oops</html>") is None
    assert parse_error_body(b'{"error": NaN}') is None


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        (b'{"a":1,"a":2}', "probe.json_duplicate_key"),
        (b'{"a":NaN}', "probe.json_constant"),
        (b'{"a":-Infinity}', "probe.json_constant"),
        (b'{"a":1', "probe.json"),
        (b'{"a":"\xff"}', "probe.json_utf8"),
        (b"\xef\xbb\xbf{}", "probe.json"),
        (b"[" * 100_000 + b"]" * 100_000, "probe.json"),
        (b'{"a":' + b"9" * 5000 + b"}", "probe.json"),
    ],
)
def test_strict_json(text: bytes, rule: str) -> None:
    with pytest.raises(ProbeFailed) as info:
        strict_loads(text)
    assert info.value.rule == rule


def test_body_limit_formula_and_bound() -> None:
    assert response_body_limit(2, 1) == 1 << 20
    assert response_body_limit(30_000, 32) == 30_000 * 33 * 128 + 30_000 * 32 + 65536
    assert response_body_limit(10**7, 1000) == 256 << 20
    with pytest.raises(ProbeFailed) as info:
        parse_named("pl1", body=b" " * ((1 << 20) + 1))
    assert info.value.rule == "probe.body_too_large"


def test_unknown_fields_are_ignored() -> None:
    top = json.loads((DATA / "pl1.json").read_bytes())
    top["choices"][0]["vllm_0_33_field"] = {"nested": [1, 2]}
    top["another_top_level"] = None
    parsed = parse_named("pl1", body=json.dumps(top).encode())
    assert parsed.rows.row_count == 11


def test_candidate_budget_and_row_width_bounds() -> None:
    with pytest.raises(ProbeFailed) as info:
        parse_named("pl32", max_candidates=100)
    assert info.value.rule == "probe.candidate_budget"
    with pytest.raises(ProbeFailed) as info:
        parse_named("pl32", k=8)
    assert info.value.rule == "probe.row_width"
    with pytest.raises(ProbeFailed) as info:
        parse_named("pl32", expected_prompt_len=13)
    assert info.value.rule == "probe.prompt_logprobs_length"
