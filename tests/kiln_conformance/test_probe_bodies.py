"""Probe response bodies exactly as Kiln's ``remote_teacher.rs`` accepts and refuses them.

Values come from ericflo/kiln ``crates/kiln-train/src/remote_teacher.rs``
(the newest stored version, commit 0751a8c6; an older stored version,
e783faae, has no response parser) and its tests: the configuration
``vllm_config()`` (identity: vocab 128, max_top_k 8, max_model_len 4096,
candidates 1_000_000, ``teacher-model``, implementation ``vllm-test``), the
body ``valid_response()`` for the sent tokens ``[10, 20, 30]`` at top-K 2,
``probe_response()`` for the two-token identity probe, and every ``parser_*``
and ``scoring_*`` case.  Bodies are serialized as serde_json does
(``Map`` is sorted by key, so the observed token is not always first).  Each
body goes through both this project's parsers (the strict one and the fast
path, which must agree exactly) and then ``verify_completion``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kiln_registry.domain.errors import ProbeFailed
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.probe.candidate_scan import parse_completion_fast
from kiln_registry.probe.parse import ParsedCompletion, parse_completion
from kiln_registry.probe.verify import RowsCheck, verify_completion

HASH_A, HASH_B, HASH_C = "a" * 64, "b" * 64, "c" * 64
SENT = [10, 20, 30]


def teacher_identity(model: str = "teacher-model", inference: str = HASH_A) -> TeacherIdentity:
    """remote_teacher.rs tests: ``teacher_identity(model, 8)`` (and ``..._with_inference_hash``)."""
    return TeacherIdentity(
        served_model_id=model,
        base_model_sha256=HASH_A,
        tokenizer_vocab_sha256=HASH_B,
        tokenizer_config_sha256=HASH_C,
        adapter=None,
        vocab_size=128,
        max_top_k=8,
        max_model_len=4096,
        max_prompt_logprob_candidates=1_000_000,
        implementation="vllm-test",
        inference_config_sha256=inference,
    )


IDENTITY = teacher_identity()


def candidate(logprob: object, rank: object) -> dict[str, object]:
    return {"logprob": logprob, "rank": rank, "decoded_token": "unused"}


def prompt_row(entries: list[tuple[int, float, int]]) -> dict[str, object]:
    return {str(t): candidate(lp, r) for t, lp, r in entries}


def valid_response() -> dict[str, Any]:
    """remote_teacher.rs ``valid_response`` for sent tokens [10, 20, 30]."""
    return {
        "object": "text_completion",
        "model": "teacher-model",
        "system_fingerprint": IDENTITY.fingerprint(),
        "choices": [
            {
                "index": 0,
                "prompt_logprobs": [
                    None,
                    prompt_row([(20, -1.0, 1), (5, -1.2, 2)]),
                    prompt_row([(6, -0.8, 1), (7, -1.1, 2), (30, -3.0, 5)]),
                ],
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


def serde(body: object) -> bytes:
    """``serde_json::to_string`` of a ``Value``: compact, object keys sorted."""
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def parsed_both(raw: bytes, sent: list[int], k: int) -> ParsedCompletion:
    """Both parsers, which must give the same columns or the same refusal."""
    args = {"expected_prompt_len": len(sent), "k": k, "vocab_size": 128, "max_candidates": 10**6}
    outcomes: list[object] = []
    for parse in (parse_completion, parse_completion_fast):
        try:
            outcomes.append(parse(raw, **args))
        except ProbeFailed as exc:
            outcomes.append((exc.rule, exc.message))
    assert outcomes[0] == outcomes[1]
    if isinstance(outcomes[0], tuple):
        raise ProbeFailed(outcomes[0][1], rule=outcomes[0][0])
    assert isinstance(outcomes[0], ParsedCompletion)
    return outcomes[0]


def check(
    body: object, sent: list[int] = SENT, k: int = 2, *, raw: bytes | None = None
) -> RowsCheck:
    parsed = parsed_both(raw if raw is not None else serde(body), sent, k)
    return verify_completion(
        parsed,
        request_model="teacher-model",
        prompt=sent,
        k=k,
        identity=IDENTITY,
        pinned=IDENTITY,
        student=None,
    )


def refused(rule: str, body: object, sent: list[int] = SENT, k: int = 2, **kw: Any) -> None:
    with pytest.raises(ProbeFailed) as info:
        check(body, sent, k, **kw)
    assert info.value.rule == rule, str(info.value)


def row(body: dict[str, Any], pos: int) -> dict[str, Any]:
    value: dict[str, Any] = body["choices"][0]["prompt_logprobs"][pos]
    return value


def f32(*values: float) -> list[float]:
    return [float(v) for v in np.array(values, dtype=np.float32)]


# --- accepted ------------------------------------------------------------------------------


def test_valid_response_maps_rows_to_topk_by_rank() -> None:
    """parser_maps_logits_rows_to_next_prompt_positions_in_requested_order."""
    result = check(valid_response())
    assert result.topk_ids.tolist() == [[20, 5], [6, 7]]
    # Kiln keeps ``logprob_f64 as f32``: -1.2, -0.8 and -1.1 are rounded, not refused.
    assert result.topk_logprobs.tolist() == [f32(-1.0, -1.2), f32(-0.8, -1.1)]
    assert result.actual_ids.tolist() == [20, 30] and result.actual_ranks.tolist() == [1, 5]


def test_extra_observed_token_tied_at_the_topk_boundary() -> None:
    """parser_accepts_extra_observed_token_tied_at_the_topk_boundary."""
    body = valid_response()
    body["choices"][0]["prompt_logprobs"][1] = prompt_row(
        [(5, -1.5, 1), (6, -2.0, 2), (20, -2.0, 2)]
    )
    result = check(body)
    assert result.topk_ids[0].tolist() == [5, 6]
    assert result.topk_logprobs[0].tolist() == [-1.5, -2.0]
    assert result.actual_ranks[0] == 2 and result.max_row_width == 3


def test_selected_observed_token_with_sequential_tie_rank() -> None:
    """parser_accepts_selected_observed_token_with_sequential_tie_rank."""
    body = valid_response()
    body["choices"][0]["prompt_logprobs"][1] = prompt_row([(5, -2.0, 1), (20, -2.0, 2)])
    result = check(body)
    assert result.topk_ids[0].tolist() == [5, 20]
    assert result.topk_logprobs[0].tolist() == [-2.0, -2.0]


def test_causal_probe_for_the_final_logits_row() -> None:
    """parser_accepts_the_causal_probe_for_the_original_final_logits_row (usage: prompt only)."""
    body = valid_response()
    body["choices"][0]["prompt_logprobs"][2] = prompt_row(
        [(6, -0.8, 1), (7, -1.1, 2), (20, -3.0, 5)]
    )
    body["usage"] = {"prompt_tokens": 3}
    assert check(body, [10, 20, 20]).topk_ids[1].tolist() == [6, 7]


@pytest.mark.parametrize("top_k", [1, 3])
def test_identity_probe_response(top_k: int) -> None:
    """``probe_response``: tokens 0..K-1, logprob -2 - id, rank id + 1; sent [0, 0]."""
    entries = [(t, -2.0 - t, t + 1) for t in range(top_k)]
    body = valid_response()
    body["choices"][0]["prompt_logprobs"] = [None, prompt_row(entries)]
    body["usage"] = {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}
    result = check(body, [0, 0], top_k)
    assert result.topk_ids[0].tolist() == list(range(top_k)) and result.actual_ids.tolist() == [0]


def test_any_finite_logprob_at_most_zero_is_rounded_to_float32() -> None:
    """parse_prompt_logprob_candidate: finite, <= 0, ``as f32`` finite; -0.1 is valid."""
    body = valid_response()
    body["choices"][0]["prompt_logprobs"][1] = prompt_row([(20, -0.1, 1), (5, -3, 2)])
    result = check(body)
    assert result.topk_logprobs[0].tolist() == f32(-0.1, -3.0)
    for text in ("-0.1", "-1e-50", "-0", "-0.0", "-16777217", "-3.4028235e38", "-7"):
        high = float(text) > -20.0  # keep rank 1 >= rank 2 (e**-20 keeps mass <= 1 + tol)
        entries = [(20, -1234.5, 1), (5, -20.0, 2)] if high else [(20, -1.0, 1), (5, -1234.5, 2)]
        body = valid_response()
        body["choices"][0]["prompt_logprobs"][1] = prompt_row(entries)
        raw = serde(body).replace(b"-1234.5", text.encode(), 1)
        got = check(None, raw=raw)
        assert got.topk_logprobs[0, 0 if high else 1] == np.float32(float(text))


@pytest.mark.parametrize(
    "decoded", [None, 1, -2.5, True, [], ["a", 1], {}, {"logprob": 1, "rank": 2}, "", "\u00e9"]
)
def test_decoded_token_of_any_json_type_is_ignored(decoded: object) -> None:
    body = valid_response()
    for value in row(body, 1).values():
        value["decoded_token"] = decoded
    row(body, 2)["6"].pop("decoded_token")
    assert check(body).topk_ids.tolist() == [[20, 5], [6, 7]]


def test_rows_are_maps_candidate_order_means_nothing() -> None:
    baseline = check(valid_response())
    body = valid_response()
    for pos in (1, 2):
        items = list(row(body, pos).items())
        body["choices"][0]["prompt_logprobs"][pos] = dict(reversed(items))
    raw = json.dumps(body, separators=(",", ":")).encode()  # unsorted: wire order as built
    result = check(None, raw=raw)
    for name in ("actual_ids", "actual_logprobs", "actual_ranks", "topk_ids", "topk_logprobs"):
        assert np.array_equal(getattr(result, name), getattr(baseline, name))


# --- refused -------------------------------------------------------------------------------

Edit = Callable[[dict[str, Any]], object]


def _set_row(pos: int, entries: list[tuple[int, float, int]]) -> Edit:
    return lambda b: b["choices"][0]["prompt_logprobs"].__setitem__(pos, prompt_row(entries))


def _drop(obj: Callable[[dict[str, Any]], dict[str, Any]], key: str) -> Edit:
    return lambda b: obj(b).pop(key)


REFUSALS: list[tuple[str, str, Edit]] = [
    # parser_rejects_extra_observed_in_topk_rank_without_a_tie
    ("no tie", "probe.actual_tie", _set_row(1, [(5, -1.5, 1), (6, -2.0, 2), (20, -2.5, 2)])),
    # parser_rejects_false_observed_tie_hidden_by_f32_rounding
    (
        "f32 tie",
        "probe.actual_tie",
        _set_row(1, [(5, -1.5, 1), (6, -2.0, 2), (20, -2.00000001, 2)]),
    ),
    # parser_rejects_malformed_response_envelopes
    ("wrong object", "probe.object", lambda b: b.update(object="chat.completion")),
    ("missing model", "probe.shape", lambda b: b.pop("model")),
    ("wrong model", "probe.model", lambda b: b.update(model="wrong-model")),
    ("wrong usage", "probe.usage", lambda b: b["usage"].update(prompt_tokens=2)),
    ("choice count", "probe.choice_count", lambda b: b.update(choices=[])),
    ("choice index", "probe.choice_index", lambda b: b["choices"][0].update(index=1)),
    (
        "first non-null",
        "probe.prompt_logprobs_first",
        lambda b: b["choices"][0]["prompt_logprobs"].__setitem__(0, {}),
    ),
    (
        "short rows",
        "probe.prompt_logprobs_length",
        lambda b: b["choices"][0]["prompt_logprobs"].pop(),
    ),
    (
        "long rows",
        "probe.prompt_logprobs_length",
        lambda b: b["choices"][0]["prompt_logprobs"].append(None),
    ),
    (
        "null target",
        "probe.row_type",
        lambda b: b["choices"][0]["prompt_logprobs"].__setitem__(1, None),
    ),
    # parser_rejects_malformed_candidate_ids_values_logprobs_and_ranks
    ("noncanonical id", "probe.token_id", lambda b: row(b, 1).update({"01": candidate(-4.0, 3)})),
    ("oov id", "probe.token_id_range", lambda b: row(b, 1).update({"128": candidate(-4.0, 3)})),
    ("non-object", "probe.candidate_shape", lambda b: row(b, 1).update({"5": -1.2})),
    ("missing logprob", "probe.candidate_shape", _drop(lambda b: row(b, 1)["5"], "logprob")),
    ("string logprob", "probe.logprob_type", lambda b: row(b, 1)["5"].update(logprob="-1.2")),
    ("f32 overflow", "probe.logprob_float32", lambda b: row(b, 1)["5"].update(logprob=-1.0e100)),
    ("positive logprob", "probe.logprob_positive", lambda b: row(b, 1)["5"].update(logprob=0.1)),
    (
        "positive hidden by f32 underflow",
        "probe.logprob_positive",
        lambda b: row(b, 1)["5"].update(logprob=1.0e-100),
    ),
    ("missing rank", "probe.candidate_shape", _drop(lambda b: row(b, 1)["5"], "rank")),
    ("float rank", "probe.rank_type", lambda b: row(b, 1)["5"].update(rank=2.0)),
    ("zero rank", "probe.rank_range", lambda b: row(b, 1)["5"].update(rank=0)),
    ("oov rank", "probe.rank_range", lambda b: row(b, 1)["5"].update(rank=129)),
    # parser_validates_unrequested_prompt_rows_before_returning_requested_data
    (
        "unrequested row",  # refused here by the K+1 width bound first: same verdict
        "probe.row_width",
        lambda b: row(b, 2).update({"128": candidate(-4.0, 3)}),
    ),
    # parser_rejects_observed_cardinality_rank_and_probability_contract_violations
    (
        "missing observed",
        "probe.actual_missing",
        lambda b: row(b, 1).update({"8": row(b, 1).pop("20")}),
    ),
    (
        "extra non-observed",
        "probe.topk_ranks",
        lambda b: row(b, 1).update({"8": candidate(-4.0, 3)}),
    ),
    ("duplicate top rank", "probe.topk_ranks", lambda b: row(b, 1)["5"].update(rank=1)),
    ("wrong K+1 cardinality", "probe.actual_rank", lambda b: row(b, 1)["20"].update(rank=5)),
    ("rank order", "probe.topk_order", lambda b: row(b, 1)["5"].update(logprob=-0.5)),
    (
        "observed exceeds kth",
        "probe.actual_rank_inconsistent",
        _set_row(2, [(6, -1.5, 1), (7, -2.0, 2), (30, -1.9, 5)]),
    ),
    # parser_rejects_topk_probability_mass_above_one
    ("mass", "probe.probability_mass", _set_row(1, [(20, -0.1, 1), (5, -0.2, 2)])),
    # parser_counts_the_extra_observed_candidate_in_probability_mass
    (
        "extra observed mass",
        "probe.probability_mass",
        _set_row(2, [(6, -0.7, 1), (7, -0.8, 2), (30, -0.8, 5)]),
    ),
    # scoring_rejects_missing_malformed_stock_and_mismatched_fingerprints
    ("fingerprint missing", "probe.fingerprint_missing", lambda b: b.pop("system_fingerprint")),
    ("fingerprint null", "probe.fingerprint_missing", lambda b: b.update(system_fingerprint=None)),
    ("fingerprint default", "probe.fingerprint", lambda b: b.update(system_fingerprint="default")),
    ("fingerprint stock", "probe.fingerprint", lambda b: b.update(system_fingerprint="vllm")),
    (
        "fingerprint malformed",
        "probe.fingerprint",
        lambda b: b.update(system_fingerprint="kiln-teacher-v1.invalid.invalid"),
    ),
    (
        "fingerprint mismatch",
        "probe.fingerprint_changed",
        lambda b: b.update(system_fingerprint=teacher_identity(inference=HASH_C).fingerprint()),
    ),
]


@pytest.mark.parametrize(("name", "rule", "edit"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_kiln_refusals_are_refused(name: str, rule: str, edit: Edit) -> None:
    body = copy.deepcopy(valid_response())
    edit(body)
    refused(rule, body)


def test_duplicate_keys_are_refused() -> None:
    """strict_json_parser_rejects_identical_duplicate_candidate_keys / ..._fingerprints."""
    raw = serde(valid_response()).replace(b'{"20":', b'{"20":{"logprob":-1.2,"rank":2},"20":', 1)
    refused("probe.json_duplicate_key", None, raw=raw)
    fp = json.dumps(IDENTITY.fingerprint()).encode()
    raw = serde(valid_response())[:-1] + b',"system_fingerprint":' + fp + b"}"
    refused("probe.json_duplicate_key", None, raw=raw)


def test_zero_topk_is_refused() -> None:
    """parser_rejects_zero_topk_without_indexing_an_empty_support."""
    parsed = parsed_both(serde(valid_response()), SENT, 2)
    with pytest.raises(ProbeFailed) as info:
        verify_completion(
            parsed, request_model="teacher-model", prompt=SENT, k=0,
            identity=IDENTITY, pinned=IDENTITY, student=None,
        )  # fmt: skip
    assert info.value.rule == "probe.k_range"
