"""The reference teacher's numbers are eager Transformers' numbers, exactly.

An independently loaded ``AutoModelForCausalLM`` is the oracle: every row's
logprobs must equal ``torch.log_softmax(model(ids).logits.float(), -1)`` bit
for bit, ranks must follow vLLM's rule, and the captured float32 vLLM body
(served from the same seed-0 tiny Llama weights) must agree within 1e-5.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from kiln_registry.reference_teacher.model import ReferenceTeacher
from kiln_registry.testing.tiny_models import TinyModel
from tests.helpers import captured

PROMPT = [1, 268, 71, 223, 86, 71, 67, 69, 74, 260, 223, 75]


def _teacher(model: TinyModel, max_top_k: int = 32) -> ReferenceTeacher:
    return ReferenceTeacher.load(
        model.path, served_model_id="teacher-tiny", max_top_k=max_top_k, max_model_len=256,
        system_fingerprint="fp",
    )  # fmt: skip


@pytest.fixture(scope="module")
def teacher(tiny_model: TinyModel) -> ReferenceTeacher:
    return _teacher(tiny_model)


@pytest.fixture(scope="module")
def oracle(tiny_model: TinyModel) -> torch.Tensor:
    model: Any = AutoModelForCausalLM.from_pretrained(
        str(tiny_model.path), local_files_only=True, dtype=torch.float32
    )
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits
    return torch.log_softmax(logits[0].float(), dim=-1)


def test_rows_equal_eager_log_softmax_exactly(
    teacher: ReferenceTeacher, oracle: torch.Tensor
) -> None:
    scored = teacher.score(PROMPT, 32, 1)
    assert scored.rows is not None and len(scored.rows) == len(PROMPT) - 1
    for position, row in enumerate(scored.rows):
        expected = oracle[position]
        assert row.token_id == PROMPT[position + 1]
        assert row.logprob == expected[row.token_id].item()
        assert row.rank == int((expected >= expected[row.token_id]).sum())
        order = torch.sort(expected, descending=True, stable=True).indices[:32].tolist()
        assert [token for token, _ in row.top] == order
        assert [value for _, value in row.top] == [expected[t].item() for t in order]


def test_logprobs_method_is_the_same_oracle(
    teacher: ReferenceTeacher, oracle: torch.Tensor
) -> None:
    assert torch.equal(teacher.logprobs(PROMPT), oracle)


def test_greedy_token_is_the_argmax_of_the_last_position(
    teacher: ReferenceTeacher, oracle: torch.Tensor
) -> None:
    scored = teacher.score(PROMPT, None, 1)
    assert scored.rows is None and scored.completion_tokens == 1
    assert scored.text == teacher.decode_token(int(torch.argmax(oracle[-1])))
    longer = teacher.score(PROMPT, None, 4)
    assert longer.completion_tokens in range(1, 5)
    assert longer.finish_reason in ("length", "stop")


def test_scores_do_not_depend_on_other_prompts(teacher: ReferenceTeacher) -> None:
    alone = teacher.score(PROMPT[:6], 4, 1)
    teacher.score(PROMPT, 4, 1)
    assert teacher.score(PROMPT[:6], 4, 1) == alone


def test_matches_captured_float32_vllm_body(teacher: ReferenceTeacher) -> None:
    raw, meta = captured("fp32_pl32_64tok")
    prompt = meta["request"]["body"]["prompt"]
    rows = json.loads(raw)["choices"][0]["prompt_logprobs"]
    scored = teacher.score(prompt, 32, 1)
    assert scored.rows is not None and rows[0] is None
    for theirs, ours in zip(rows[1:], scored.rows, strict=True):
        entries = {int(k): v for k, v in theirs.items()}
        assert entries[ours.token_id]["rank"] == ours.rank
        assert abs(entries[ours.token_id]["logprob"] - ours.logprob) < 1e-5
        assert set(entries) - {ours.token_id} == {t for t, _ in ours.top} - {ours.token_id}


def test_decoded_tokens_follow_vllm(teacher: ReferenceTeacher) -> None:
    assert teacher.decode_token(1) == "<s>"
    assert teacher.decode_token(207) == "\x10"
    assert teacher.decode_token(122) == ""  # a lone UTF-8 continuation byte
    assert teacher.decode_token(10_000) == ""


def test_padded_rows_span_the_model_width(tiny_model_padded: TinyModel) -> None:
    teacher = _teacher(tiny_model_padded)
    assert (teacher.limits.vocab_width, teacher.limits.max_token_id) == (544, 511)
    assert teacher.logprobs([1, 543]).shape == (2, 544)
    scored = teacher.score([1, 543, 5], 32, 1)
    assert scored.rows is not None and scored.rows[0].token_id == 543
    assert teacher.decode_token(543) == ""


def test_sharded_model_scores_like_the_single_file(
    teacher: ReferenceTeacher, tiny_model_sharded: TinyModel
) -> None:
    sharded = _teacher(tiny_model_sharded)
    assert sharded.score(PROMPT, 8, 1) == teacher.score(PROMPT, 8, 1)
