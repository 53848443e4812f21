"""Protocol rules of the reference teacher, without a model or a server.

Row rules (ranks, ties, widths, the -inf sentinel) run on hand-made logprob
tensors through the same functions the teacher uses; request errors are
compared byte for byte with the captured vLLM bodies.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch

from kiln_registry.reference_teacher.model import prompt_rows, top_entries, true_ranks
from kiln_registry.reference_teacher.protocol import (
    MAX_CHOICES,
    MAX_PROMPTS,
    CompletionRequest,
    Limits,
    ProtocolError,
    check_against_teacher,
    decode_json_body,
    parse_completion_request,
)
from kiln_registry.reference_teacher.responses import (
    PositionScores,
    ScoredPrompt,
    completion_body,
    dumps,
    format_row,
)
from tests.helpers import captured

LIMITS = Limits(
    served_model_id="teacher-tiny", max_top_k=32, max_model_len=256, vocab_width=512,
    max_token_id=511,
)  # fmt: skip


def _decode(token_id: int) -> str:
    return f"t{token_id}"


def _row(values: list[float], actual: int, k: int) -> dict[str, Any]:
    logprobs = torch.tensor([values], dtype=torch.float32)
    (scores,) = prompt_rows(logprobs, torch.tensor([actual]), k)
    return format_row(scores, _decode)


def _request(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "teacher-tiny", "prompt": [1, 5, 9], "max_tokens": 1, "temperature": 0,
        "prompt_logprobs": 1,
    }  # fmt: skip
    body.update(fields)
    return body


def _refusal(body: dict[str, Any]) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        check_against_teacher(parse_completion_request(body), LIMITS)
    return caught.value


# -- rows ------------------------------------------------------------------


def test_ties_rank_lower_id_first_and_actual_gets_worst_tied_rank() -> None:
    values = [-3.0, -1.0, -2.0, -1.0, -2.0, -1.0]
    row = _row(values, actual=4, k=2)
    assert list(row) == ["4", "1", "3"]
    assert row["4"]["rank"] == 5  # ids 1, 3, 5, 2, 4 are >= -2.0
    assert (row["1"]["rank"], row["3"]["rank"]) == (1, 2)


def test_actual_inside_top_k_keeps_first_place_and_takes_its_position_rank() -> None:
    # id 3 ties id 1; its true rank is 2 but the top-K lists it second as well.
    row = _row([-5.0, -1.0, -4.0, -1.0], actual=3, k=2)
    assert list(row) == ["3", "1"]
    assert (row["3"]["rank"], row["1"]["rank"]) == (2, 1)
    # id 1 ties id 3: true rank 2, top-K position 1 wins (vLLM's dict overwrite).
    row = _row([-5.0, -1.0, -4.0, -1.0], actual=1, k=2)
    assert list(row) == ["1", "3"]
    assert (row["1"]["rank"], row["3"]["rank"]) == (1, 2)


@pytest.mark.parametrize(
    ("k", "actual", "width"), [(0, 2, 1), (1, 0, 1), (1, 2, 2), (3, 2, 3), (3, 4, 4)]
)
def test_row_width_is_k_when_actual_is_in_top_k_else_k_plus_one(
    k: int, actual: int, width: int
) -> None:
    values = [-0.5, -1.5, -2.5, -3.5, -4.5]
    row = _row(values, actual=actual, k=k)
    assert len(row) == width
    assert next(iter(row)) == str(actual)
    assert row[str(actual)]["rank"] == actual + 1
    ranks = [entry["rank"] for entry in row.values()]
    top_ranks = sorted(ranks) if width == k else ranks[1:]
    assert top_ranks == list(range(1, k + 1))


def test_prompt_logprobs_zero_gives_only_the_actual_token() -> None:
    assert _row([-1.0, -2.0, -0.1], actual=1, k=0) == {
        "1": {"logprob": -2.0, "rank": 3, "decoded_token": "t1"}
    }


def test_minus_infinity_is_written_as_sentinel() -> None:
    row = _row([0.0, -math.inf, -math.inf], actual=2, k=1)
    assert row["2"] == {"logprob": -9999.0, "rank": 3, "decoded_token": "t2"}
    assert b"Infinity" not in dumps(row)


def test_nan_is_never_written() -> None:
    with pytest.raises(ValueError):
        format_row(PositionScores(token_id=0, logprob=math.nan, rank=1, top=()), _decode)


def test_full_width_top_k_is_stable_sorted() -> None:
    values = torch.tensor([[-1.0, -1.0, -0.5, -1.0, -3.0]])
    (top,) = top_entries(values, 5)
    assert [i for i, _ in top] == [2, 0, 1, 3, 4]


def test_crowded_kth_value_picks_lowest_ids() -> None:
    values = torch.tensor([[-2.0, -1.0, -2.0, -2.0, -2.0, -0.5]])
    (top,) = top_entries(values, 4)
    assert [i for i, _ in top] == [5, 1, 0, 2]


def test_ranks_count_entries_at_or_above() -> None:
    logprobs = torch.tensor([[-1.0, -1.0, -2.0], [-3.0, -1.0, -2.0]])
    assert true_ranks(logprobs, torch.tensor([-1.0, -3.0])) == [2, 3]


# -- bodies ----------------------------------------------------------------


def _scored(count: int, text: str) -> ScoredPrompt:
    rows = tuple(
        PositionScores(token_id=7, logprob=-1.0, rank=1, top=((7, -1.0),)) for _ in range(count - 1)
    )
    return ScoredPrompt(
        token_count=count, rows=rows, text=text, completion_tokens=1, finish_reason="length"
    )


def _body(request: CompletionRequest, scored: list[ScoredPrompt]) -> Any:
    body = completion_body(request, scored, decode=_decode, system_fingerprint="fp")
    return json.loads(dumps(body))


def test_batch_and_n_give_increasing_indexes_and_vllm_usage() -> None:
    request = parse_completion_request(_request(prompt=[[1, 2, 3], [1, 2]], n=2))
    body = _body(request, [_scored(3, "a"), _scored(2, "b")])
    indexes = [(c["index"], c["text"]) for c in body["choices"]]
    assert indexes == [(0, "a"), (1, "a"), (2, "b"), (3, "b")]
    assert body["usage"] == {
        "prompt_tokens": 5, "total_tokens": 9, "completion_tokens": 4,
        "prompt_tokens_details": None, "completion_tokens_details": None,
    }  # fmt: skip


def test_body_keys_match_the_captured_vllm_body() -> None:
    raw, _ = captured("pl1")
    theirs = json.loads(raw)
    ours = _body(parse_completion_request(_request()), [_scored(3, "")])
    assert list(ours) == list(theirs)
    assert list(ours["choices"][0]) == list(theirs["choices"][0])
    assert list(ours["usage"]) == list(theirs["usage"])
    assert ours["id"].startswith("cmpl-") and len(ours["id"]) == 21
    assert ours["choices"][0]["prompt_logprobs"][0] is None


# -- request errors --------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "err_pl33",
        "err_pl_minus2",
        "err_pl_stream",
        "err_wrong_model",
        "err_token_oob",
        "err_too_long",
    ],
)
def test_errors_match_captured_vllm_bodies_byte_for_byte(name: str) -> None:
    raw, meta = captured(name)
    error = _refusal(meta["request"]["body"])
    assert error.status == meta["status"]
    assert dumps(error.body()) == raw


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"surprise": 1}, "surprise"),
        ({"logprobs": -1}, "logprobs"),
        ({"logprobs": 1.5}, "logprobs"),
        ({"echo": True}, "echo"),
        ({"stream": True, "prompt_logprobs": 0}, "stream"),
        ({"top_p": 0}, "top_p"),
        ({"seed": -1}, "seed"),
        ({"return_token_ids": 1}, "return_token_ids"),
        ({"stop": ["x"]}, "stop"),
        ({"best_of": 3}, "best_of"),
        ({"prompt": "the teacher"}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [1, True]}, "prompt"),
        ({"prompt": [1, 2.0]}, "prompt"),
        ({"prompt": [[1]] * (MAX_PROMPTS + 1)}, "prompt"),
        ({"prompt": [[1]] * 8, "n": MAX_CHOICES // 4}, "n"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"prompt_logprobs": 1.0}, "prompt_logprobs"),
        ({"prompt_logprobs": True}, "prompt_logprobs"),
        ({"temperature": -1}, "temperature"),
        ({"model": 3}, "model"),
    ],
)
def test_malformed_requests_are_refused_naming_the_field(
    fields: dict[str, Any], param: str
) -> None:
    error = _refusal(_request(**fields))
    assert (error.status, error.param) == (400, param)
    assert error.body()["error"]["type"] == "BadRequestError"  # type: ignore[index]


def test_neutral_openai_fields_are_accepted() -> None:
    request = parse_completion_request(
        _request(seed=7, user="u", top_p=1, presence_penalty=0, frequency_penalty=0.0,
                 best_of=1, stop=[], logit_bias={}, suffix=None, stream_options=None,
                 stream=False, echo=False, add_special_tokens=True, logprobs=None)
    )  # fmt: skip
    assert request.prompts == ((1, 5, 9),)


def test_prompt_logprobs_minus_one_means_the_whole_vocabulary() -> None:
    error = _refusal(_request(prompt_logprobs=-1))
    assert "Requested prompt logprobs of 512" in error.message
    wide = Limits("teacher-tiny", 512, 256, 512, 511)
    request = parse_completion_request(_request(prompt_logprobs=-1))
    check_against_teacher(request, wide)
    assert request.top_k(512) == 512


@pytest.mark.parametrize(("prompt", "bad"), [([1, 512], 512), ([-1, 3], -1)])
def test_token_ids_outside_the_model_are_refused(prompt: list[int], bad: int) -> None:
    error = _refusal(_request(prompt=prompt))
    assert error.message == f"Token id {bad} is out of vocabulary"


def test_padded_width_accepts_ids_beyond_the_tokenizer() -> None:
    padded = Limits("teacher-tiny", 32, 256, 544, 511)
    check_against_teacher(parse_completion_request(_request(prompt=[1, 543])), padded)
    with pytest.raises(ProtocolError):
        check_against_teacher(parse_completion_request(_request(prompt=[1, 544])), padded)


def test_prompt_plus_max_tokens_must_fit() -> None:
    error = _refusal(_request(prompt=[5] * 256, max_tokens=1))
    assert (error.param, error.status) == ("max_tokens", 400)
    check_against_teacher(parse_completion_request(_request(prompt=[5] * 255)), LIMITS)


def test_json_body_is_strict_and_bounded() -> None:
    for raw in (b"[1]", b"{", b'{"model":1,"model":2}', b"[" * 10_000):
        with pytest.raises(ProtocolError) as caught:
            decode_json_body(raw, LIMITS)
        assert caught.value.status == 400
    with pytest.raises(ProtocolError) as caught:
        decode_json_body(b" " * (LIMITS.max_body_bytes() + 1), LIMITS)
    assert caught.value.status == 413


def test_completion_request_top_k() -> None:
    request = CompletionRequest(model="m", prompts=((1,),), max_tokens=1, prompt_logprobs=None, n=1)
    assert request.top_k(512) is None
