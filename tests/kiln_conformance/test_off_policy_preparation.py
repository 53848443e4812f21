"""Kiln's off-policy preparation: the tests' re-implementation (``kiln_rules``) and the product's
(``jobs.generation.kiln``) agree, on Kiln's own test values and on the tiny student.

Kiln values: ``crates/kiln-train/tests/fixtures/qwen35_sft_oracle_v1.json`` (the
rendered ChatML conversations whose assistant labels run from after
``<|im_start|>assistant\\n`` through ``<|im_end|>\\n``), masking rules from
``crates/kiln-train/src/trainer/sft_data.rs``, the teacher-token count and
id checks from ``crates/kiln-train/src/opd.rs``.
"""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest

from kiln_registry.domain.errors import JobInvalid
from kiln_registry.jobs.generation.kiln import KilnRenderer, _byte_table, _chatml_mask
from kiln_registry.testing.tiny_models import TinyModel
from tests.kiln_conformance import kiln_rules

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Llama-3 framing whose assistant block ends with eos_token, which Kiln renders as "".
LLAMA = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
    "\n\n{{ m['content'] }}{% if m['role'] == 'assistant' %}{{ eos_token }}{% else %}<|eot_id|>"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant"
    "<|end_header_id|>\n\n{% endif %}"
)
TEMPLATES = {"chatml": CHATML, "llama": LLAMA}

# qwen35_sft_oracle_v1.json cases "plain_single_turn" and "multi_turn": rendered text and
# the text of their assistant labels.
ORACLE = [
    (
        "<|im_start|>user\nName one primary color.<|im_end|>\n<|im_start|>assistant\n"
        "<think>\n\n</think>\n\nBlue.<|im_end|>\n",
        1,
        ["<think>\n\n</think>\n\nBlue.<|im_end|>\n"],
    ),
    (
        "<|im_start|>system\nAnswer tersely.<|im_end|>\n<|im_start|>user\nCapital of Japan?"
        "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nTokyo.<|im_end|>\n"
        "<|im_start|>user\nCapital of France?<|im_end|>\n<|im_start|>assistant\n"
        "<think>\n\n</think>\n\nParis.<|im_end|>\n",
        2,
        ["<think>\n\n</think>\n\nTokyo.<|im_end|>\n", "<think>\n\n</think>\n\nParis.<|im_end|>\n"],
    ),
]


def _chars(text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """One token per character: the mask then reads as text."""
    return [ord(c) for c in text], [(i, i + 1) for i in range(len(text))]


def _runs(text: str, mask: list[bool]) -> list[str]:
    runs: list[str] = []
    for i, active in enumerate(mask):
        if active and (i == 0 or not mask[i - 1]):
            runs.append("")
        if active:
            runs[-1] += text[i]
    return runs


@pytest.mark.parametrize(("text", "count", "labelled"), ORACLE)
def test_chatml_labels_are_kilns_oracle_spans(text: str, count: int, labelled: list[str]) -> None:
    ids, offsets = _chars(text)
    rules = kiln_rules.chatml_mask(text, kiln_rules.byte_offsets(text, offsets), len(ids), count)
    assert rules is not None and _runs(text, rules) == labelled
    table = _byte_table(text)
    product = _chatml_mask(text, table, [(table[a], table[b]) for a, b in offsets], count)
    assert product == rules
    # One span too few or too many: Kiln falls back to prefix renders (None here).
    assert kiln_rules.chatml_mask(text, offsets, len(ids), count + 1) is None


@pytest.fixture(scope="module")
def students(tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel) -> dict[str, Any]:
    from transformers import AutoTokenizer

    found: dict[str, Any] = {}
    for name, template in TEMPLATES.items():
        dest = tmp_path_factory.mktemp(name) / "model"
        shutil.copytree(tiny_model.path, dest)
        config = json.loads((dest / "tokenizer_config.json").read_text())
        config["chat_template"] = template
        (dest / "tokenizer_config.json").write_text(json.dumps(config))
        found[name] = AutoTokenizer.from_pretrained(dest, local_files_only=True)
    return found


def _encoder(tokenizer: Any) -> kiln_rules.Encoder:
    def encode(text: str) -> tuple[list[int], list[tuple[int, int]]]:
        got = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
        return list(got.ids), list(got.offsets)

    return encode


# The multi-byte character: byte-level tokens split "é" (C3 A9) in two.
CASES = [
    ("chatml", "zy é ka", "zy é ka<|im_end|>\n"),
    ("llama", "zy é ka", "<|start_header_id|>assistant<|end_header_id|>\n\nzy é ka"),
    ("chatml", "the student listens", "the student listens<|im_end|>\n"),
    ("llama", "doan", "<|start_header_id|>assistant<|end_header_id|>\n\ndoan"),
]


@pytest.mark.parametrize(("name", "response", "trained"), CASES)
def test_action_tokens_are_the_rendered_assistant_block(
    students: dict[str, Any], name: str, response: str, trained: str
) -> None:
    tokenizer = students[name]
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a cat"}]
    full = [*messages, {"role": "assistant", "content": response}]
    ids, mask = kiln_rules.training_tokens(TEMPLATES[name], _encoder(tokenizer), full)
    positions = [i for i, active in enumerate(mask) if active]
    assert tokenizer.decode([ids[i] for i in positions]) == trained
    assert positions == list(range(positions[0], len(ids)))  # the block ends the sequence
    seq = KilnRenderer.for_tokenizer(tokenizer).sequence(messages, response, "p")
    assert (seq.token_ids, seq.positions) == (ids, positions)


def _example(response: str, ids: list[int]) -> dict[str, Any]:
    row = [{"token_id": 5, "logprob": -0.5}, {"token_id": 6, "logprob": -1.0}]
    return {"messages": [{"role": "user", "content": "a cat"}], "teacher_response": response,
            "teacher_tokens": [{"token_id": t, "top_logprobs": row} for t in ids]}  # fmt: skip


def test_teacher_token_count_and_ids_are_checked(students: dict[str, Any]) -> None:
    tokenizer = students["chatml"]
    encode, vocab = _encoder(tokenizer), 512
    messages = [{"role": "user", "content": "a cat"}]
    seq = KilnRenderer.for_tokenizer(tokenizer).sequence(messages, "zy é ka", "p")
    wanted = [seq.token_ids[i] for i in seq.positions]
    good = _example("zy é ka", wanted)
    assert kiln_rules.prepare_example(good, CHATML, encode, 2, vocab, {}) == seq.positions
    # The sampled ids (teacher_tokens per generated token) are not Kiln's action tokens.
    sampled = _example("zy é ka", tokenizer.encode("zy é ka"))
    with pytest.raises(kiln_rules.KilnRuleError, match="teacher_tokens but"):
        kiln_rules.prepare_example(sampled, CHATML, encode, 2, vocab, {})
    wrong = _example("zy é ka", [wanted[0] + 1, *wanted[1:]])
    with pytest.raises(kiln_rules.KilnRuleError, match="declares"):
        kiln_rules.prepare_example(wrong, CHATML, encode, 2, vocab, {})
    with pytest.raises(kiln_rules.KilnRuleError, match="need 3"):
        kiln_rules.prepare_example(good, CHATML, encode, 3, vocab, {})


def test_responses_kiln_cannot_reproduce_are_refused(students: dict[str, Any]) -> None:
    renderer = KilnRenderer.for_tokenizer(students["chatml"])
    messages = [{"role": "user", "content": "a cat"}]
    # U+FFFD (ids ending inside a character) is text Kiln trains on: scored as Kiln reads it.
    replaced = renderer.sequence(messages, "zy \ufffd", "prompt 'p1'")
    assert students["chatml"].decode([replaced.token_ids[i] for i in replaced.positions]) == (
        "zy \ufffd<|im_end|>\n"
    )
    tagged = (
        "{% for m in messages %}{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}"
    )
    with pytest.raises(JobInvalid) as caught:
        KilnRenderer(tagged, _chars).sequence(messages, "x", "prompt 'p1'")
    assert caught.value.rule == "generation.kiln_template"
    assert caught.value.message.startswith("prompt 'p1': ")
    with pytest.raises(JobInvalid, match="does not compile") as caught:
        KilnRenderer("{% for m in %}", _chars).sequence(messages, "x", "p")
    assert caught.value.rule == "generation.kiln_template"
    raising = "{{ raise_exception('no assistant turns here') }}"
    with pytest.raises(JobInvalid, match="no assistant turns here"):
        KilnRenderer(raising, _chars).sequence(messages, "x", "p")


def test_a_template_rendering_nothing_before_the_response_is_refused() -> None:
    only_reply = (
        "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] }}{% endif %}"
        "{% endfor %}"
    )
    with pytest.raises(JobInvalid) as caught:
        KilnRenderer(only_reply, _chars).sequence([{"role": "user", "content": "hi"}], "ok", "p")
    assert caught.value.rule == "generation.kiln_position_zero"
    with pytest.raises(kiln_rules.KilnRuleError):
        example = {"messages": [{"role": "user", "content": "hi"}], "teacher_response": "ok"}
        kiln_rules.prepare_example(example, only_reply, _chars, 1, 512, {})
