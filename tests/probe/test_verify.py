"""Every verification rule, on mutated real vLLM bodies and reference-style bodies."""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kiln_registry.domain.errors import IdentityMismatch, ProbeFailed
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.probe.parse import PromptLogprobColumns, parse_completion
from kiln_registry.probe.row_checks import verify_rows
from kiln_registry.probe.verify import RowsCheck, StudentView, verify_completion
from tests.probe.teacher_server import HASH_B, completion_body, make_identity

DATA = Path(__file__).resolve().parent.parent / "data" / "vllm_responses"
IDENTITY = make_identity()
FP = IDENTITY.fingerprint()
STUDENT = StudentView(tokenizer_vocab_sha256=HASH_B, model_width=512)


def captured(name: str) -> tuple[dict[str, Any], list[int], int]:
    top = json.loads((DATA / f"{name}.json").read_bytes())
    top["system_fingerprint"] = FP
    req = json.loads((DATA / f"{name}.meta.json").read_text())["request"]["body"]
    return top, req["prompt"], req["prompt_logprobs"]


def dump(top: dict[str, Any]) -> bytes:
    return json.dumps(top, separators=(",", ":")).encode()


def check(
    body: bytes,
    prompt: Sequence[int],
    k: int,
    *,
    identity: TeacherIdentity = IDENTITY,
    pinned: TeacherIdentity | None = IDENTITY,
    student: StudentView | None = STUDENT,
    request_model: str = "teacher-tiny",
) -> RowsCheck:
    parsed = parse_completion(
        body, expected_prompt_len=len(prompt), k=k, vocab_size=512, max_candidates=1_000_000
    )
    return verify_completion(
        parsed,
        request_model=request_model,
        prompt=prompt,
        k=k,
        identity=identity,
        pinned=pinned,
        student=student,
    )


def refused(rule: str, body: bytes, prompt: Sequence[int], k: int, **kw: Any) -> None:
    with pytest.raises(ProbeFailed) as info:
        check(body, prompt, k, **kw)
    assert info.value.rule == rule, str(info.value)


def mutated(name: str, edit: Callable[[dict[str, Any]], object]) -> tuple[bytes, list[int], int]:
    top, prompt, k = captured(name)
    edit(top)
    return dump(top), prompt, k


def row(top: dict[str, Any], pos: int) -> dict[str, Any]:
    value = top["choices"][0]["prompt_logprobs"][pos]
    assert isinstance(value, dict)
    return value


def text_mutated(name: str, old: str, new: str) -> tuple[bytes, list[int], int]:
    top, prompt, k = captured(name)
    text = dump(top).decode()
    assert old in text
    return text.replace(old, new, 1).encode(), prompt, k


@pytest.mark.parametrize("name", ["pl1", "pl32", "fp32_pl32_64tok", "pl1_greedy_tail"])
def test_captured_bodies_verify(name: str) -> None:
    top, prompt, k = captured(name)
    result = check(dump(top), prompt, k)
    assert result.topk_ids.shape == (len(prompt) - 1, k)
    assert list(result.actual_ids) == prompt[1:]
    assert result.fingerprint == FP and result.candidate_count > 0


def test_inside_row_fills_its_topk_slot() -> None:
    top, prompt, k = captured("pl32")
    result = check(dump(top), prompt, k)
    assert result.actual_ranks[7] == 4 and result.topk_ids[7, 3] == prompt[8]
    assert all(result.topk_logprobs[7, i] >= result.topk_logprobs[7, i + 1] for i in range(31))


def test_fingerprint_rules() -> None:
    raw = (DATA / "pl1.json").read_bytes()
    _, prompt, k = captured("pl1")
    refused("probe.fingerprint_stock", raw, prompt, k)
    fp32 = (DATA / "fp32_pl32_64tok.json").read_bytes()
    _, prompt64, k64 = captured("fp32_pl32_64tok")
    refused("probe.fingerprint", fp32, prompt64, k64)
    body, prompt, k = mutated("pl1", lambda t: t.update(system_fingerprint=None))
    refused("probe.fingerprint_missing", body, prompt, k)
    other = make_identity(base="d" * 64)
    good, prompt, k = mutated("pl1", lambda t: None)
    refused("probe.fingerprint_pinned", good, prompt, k, identity=IDENTITY, pinned=other)
    refused("probe.fingerprint_changed", good, prompt, k, identity=other, pinned=None)
    tampered = FP[:-1] + ("0" if FP[-1] != "0" else "1")
    body, prompt, k = mutated("pl1", lambda t: t.update(system_fingerprint=tampered))
    refused("probe.fingerprint", body, prompt, k)


def test_envelope_rules() -> None:
    cases: list[tuple[str, Callable[[dict[str, Any]], object]]] = [
        ("probe.object", lambda t: t.update(object="chat.completion")),
        ("probe.model", lambda t: t.update(model="base-model")),
        ("probe.usage", lambda t: t["usage"].update(prompt_tokens=11)),
        ("probe.choice_index", lambda t: t["choices"][0].update(index=1)),
        (
            "probe.prompt_logprobs_first",
            lambda t: t["choices"][0]["prompt_logprobs"].__setitem__(0, {}),
        ),
    ]
    for rule, edit in cases:
        body, prompt, k = mutated("pl1", edit)
        refused(rule, body, prompt, k)
    good, prompt, k = mutated("pl1", lambda t: None)
    refused("probe.model", good, prompt, k, request_model="base-model")
    alias = replace(IDENTITY, served_model_id="teacher-lora")
    refused("probe.fingerprint_changed", good, prompt, k, identity=alias, pinned=None)


@pytest.mark.parametrize(
    ("old", "new", "rule"),
    [
        ('"logprob":-6.467060089111328', '"logprob":NaN', "probe.json_constant"),
        ('"logprob":-6.467060089111328', '"logprob":Infinity', "probe.json_constant"),
        ('"logprob":-6.467060089111328', '"logprob":-1e999', "probe.json_number_range"),
        ('"logprob":-6.467060089111328', '"logprob":0.5', "probe.logprob_positive"),
        ('"logprob":-6.467060089111328', '"logprob":-1e39', "probe.logprob_float32"),
        ('"logprob":-6.467060089111328', '"logprob":"-6"', "probe.logprob_type"),
        ('"rank":410', '"rank":0', "probe.rank_range"),
        ('"rank":410', '"rank":410.0', "probe.rank_type"),
        ('"67":{', '"067":{', "probe.token_id"),
        ('"67":{', '" 67":{', "probe.token_id"),
        ('"67":{', '"+67":{', "probe.token_id"),
        ('"67":{', '"-67":{', "probe.token_id"),
        ('"67":{', '"600":{', "probe.token_id_range"),
        ('"67":{', '"268":{', "probe.json_duplicate_key"),
        ('"rank":410,', "", "probe.candidate_shape"),
    ],
)
def test_value_rules(old: str, new: str, rule: str) -> None:
    body, prompt, k = text_mutated("pl1", old, new)
    refused(rule, body, prompt, k)


def test_minus_9999_stands_for_minus_infinity() -> None:
    body, prompt, k = text_mutated("pl1", '"logprob":-6.467060089111328', '"logprob":-9999.0')
    assert check(body, prompt, k).actual_logprobs[0] == -9999.0


def test_row_rules_on_captured_bodies() -> None:
    def drop_actual(t: dict[str, Any]) -> None:
        r = row(t, 1)
        r.pop("268")
        r["5"] = {"logprob": -7.0, "rank": 500, "decoded_token": ""}

    cases: list[tuple[str, str, Callable[[dict[str, Any]], object]]] = [
        ("pl1", "probe.actual_missing", drop_actual),
        ("pl1", "probe.actual_tie", lambda t: row(t, 1)["268"].update(rank=1)),
        ("pl1", "probe.topk_ranks", lambda t: row(t, 1)["67"].update(rank=2)),
        ("pl32", "probe.topk_ranks", lambda t: row(t, 8)["74"].update(rank=5)),
        ("pl32", "probe.actual_rank", lambda t: row(t, 8)["74"].update(rank=40)),
        ("pl32", "probe.row_width", lambda t: [row(t, 1).pop(i) for i in ("397", "67")]),
        ("pl1", "probe.actual_rank_inconsistent", lambda t: row(t, 1)["268"].update(logprob=-1.0)),
    ]
    for name, rule, edit in cases:
        body, prompt, k = mutated(name, edit)
        refused(rule, body, prompt, k)


def test_increasing_topk_logprobs_are_refused() -> None:
    def swap(t: dict[str, Any]) -> None:
        r = row(t, 1)
        r["171"]["logprob"], r["421"]["logprob"] = r["421"]["logprob"], r["171"]["logprob"]

    body, prompt, k = mutated("pl32", swap)
    refused("probe.topk_order", body, prompt, k)


def test_probability_mass_over_one_is_refused() -> None:
    rows = [[(1, -0.5, 9), (2, -0.25, 1), (3, -0.25, 2), (4, -0.5, 3), (5, -0.5, 4)]]
    body = completion_body(model="teacher-tiny", fingerprint=FP, prompt=[0, 1], k=4, rows=rows)
    refused("probe.probability_mass", body, [0, 1], 4)
    fine = [[(1, -5.0, 9), (2, -2.0, 1), (3, -2.0, 2), (4, -3.0, 3), (5, -4.0, 4)]]
    body = completion_body(model="teacher-tiny", fingerprint=FP, prompt=[0, 1], k=4, rows=fine)
    assert check(body, [0, 1], 4).max_row_width == 5


def test_candidate_budget_of_the_identity() -> None:
    small = replace(IDENTITY, max_prompt_logprob_candidates=100)
    top, prompt, k = captured("pl32")
    top["system_fingerprint"] = small.fingerprint()
    refused("probe.candidate_budget", dump(top), prompt, k, identity=small, pinned=small)


def test_duplicate_ids_in_columns_are_refused() -> None:
    rows = PromptLogprobColumns(
        ids=array("i", [7, 3, 3]),
        logprobs=array("f", [-9.0, -1.0, -2.0]),
        ranks=array("i", [50, 1, 2]),
        offsets=array("q", [0, 3]),
    )
    with pytest.raises(ProbeFailed) as info:
        verify_rows(rows, prompt=[0, 7], k=2, identity=IDENTITY)
    assert info.value.rule == "probe.duplicate_id"


def test_student_mismatch_is_identity_mismatch() -> None:
    body, prompt, k = mutated("pl1", lambda t: None)
    with pytest.raises(IdentityMismatch) as info:
        check(body, prompt, k, student=StudentView("0" * 64, 512))
    assert info.value.status == 409 and info.value.rule == "probe.student_vocab"
    with pytest.raises(IdentityMismatch) as info:
        check(body, prompt, k, student=StudentView(HASH_B, 513))
    assert info.value.rule == "probe.student_width"


def test_reference_style_inside_and_outside_rows() -> None:
    prompt = [0, 3, 9, 1]
    for inside in (False, True):
        body = completion_body(
            model="teacher-tiny", fingerprint=FP, prompt=prompt, k=5, inside=inside
        )
        result = check(body, prompt, 5)
        assert result.max_row_width == (5 if inside else 6)
        assert list(result.actual_ids) == prompt[1:]
