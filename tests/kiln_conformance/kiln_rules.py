"""Kiln's off-policy preparation rules, re-implemented for the tests from Kiln's source.

Independent of ``kiln_registry.jobs.generation.kiln`` (the product's copy):
the conformance tests hold the product's corpora to these.  Each rule names
its Kiln file (ericflo/kiln):

- ``render``: ``crates/kiln-core/src/tokenizer.rs`` (minijinja: ``messages``,
  ``tools``/``tool_choice`` none, ``bos_token``/``eos_token`` empty strings; no
  trim_blocks or lstrip_blocks) with ``add_generation_prompt`` false for a
  training render (``crates/kiln-train/tests/qwen35_sft_oracle.rs``:
  ``mask_contract.add_generation_prompt`` is false);
- ``training_tokens``: ``crates/kiln-train/src/trainer/sft_data.rs``
  ``tokenize_for_training``, ``label_mask_from_rendered_assistant_spans``,
  ``mark_offsets_overlapping_span``, ``label_mask_by_prefix_tokenization``,
  ``has_supervised_shifted_labels`` (offsets are UTF-8 byte offsets there);
- ``prepare_example``: ``crates/kiln-train/src/opd.rs``
  ``prepare_off_policy_distillation_dataset_with_identity`` (reverse_kl) and
  ``crates/kiln-train/src/logit_source.rs``
  (``target_token_positions_to_logits_rows``, ``validate_topk_logprob_row``,
  ``FixtureLogitSource::insert``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment

F32_EPSILON = float(np.finfo(np.float32).eps)
Messages = list[dict[str, str]]
Encoder = Callable[[str], tuple[list[int], list[tuple[int, int]]]]


class KilnRuleError(AssertionError):
    """An example Kiln's preparation would refuse (the message says which rule)."""


def render(template: str, messages: Messages) -> str:
    """tokenizer.rs render_jinja_template, as a training render."""

    def raise_exception(message: str) -> None:
        raise KilnRuleError(f"raise_exception: {message}")

    env = ImmutableSandboxedEnvironment()
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(
        messages=messages, tools=None, tool_choice=None, add_generation_prompt=False,
        bos_token="", eos_token="",
    )  # fmt: skip


def byte_offsets(text: str, char_offsets: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Python tokenizers give character offsets; Kiln's Rust tokenizers give UTF-8 bytes."""
    starts = np.cumsum([0] + [len(ch.encode("utf-8")) for ch in text])
    return [(int(starts[a]), int(starts[b])) for a, b in char_offsets]


def overlap_mask(offsets: list[tuple[int, int]], start: int, end: int, mask: list[bool]) -> None:
    """sft_data.rs mark_offsets_overlapping_span (byte offsets)."""
    for i, (a, b) in enumerate(offsets):
        if i < len(mask) and a != b and a < end and b > start:
            mask[i] = True


def chatml_mask(
    text: str, offsets: list[tuple[int, int]], n: int, expected: int
) -> list[bool] | None:
    """sft_data.rs label_mask_from_rendered_assistant_spans, on the UTF-8 bytes."""
    raw, head, tail = text.encode("utf-8"), b"<|im_start|>assistant\n", b"<|im_end|>"
    if expected == 0:
        return [False] * n
    mask, at, found = [False] * n, 0, 0
    while (start := raw.find(head, at)) >= 0:
        body = start + len(head)
        stop = raw.find(tail, body)
        if stop < 0:
            break
        end = stop + len(tail) + (1 if raw[stop + len(tail) : stop + len(tail) + 1] == b"\n" else 0)
        overlap_mask(offsets, body, end, mask)
        found, at = found + 1, end
    return mask if found == expected else None


def training_tokens(
    template: str, encode: Encoder, messages: Messages
) -> tuple[list[int], list[bool]]:
    """sft_data.rs tokenize_for_training (no template-declared spans)."""
    text = render(template, messages)
    ids, char_offsets = encode(text)
    offsets = byte_offsets(text, char_offsets)
    if not ids:
        raise KilnRuleError("empty tokenization result")
    count = sum(m["role"] == "assistant" for m in messages)
    mask = chatml_mask(text, offsets, len(ids), count) or [False] * len(ids)
    if not any(mask):
        mask = _prefix_mask(template, encode, messages, text, offsets, len(ids))
    if len(ids) < 2:
        raise KilnRuleError(f"example too short ({len(ids)} tokens)")
    if not any(mask[1:]):
        raise KilnRuleError("example has no supervised assistant tokens after next-token shift")
    return ids, mask


def _prefix_mask(
    template: str, encode: Encoder, messages: Messages, text: str,
    offsets: list[tuple[int, int]], n: int,
) -> list[bool]:  # fmt: skip
    mask = [False] * n
    full = text.encode("utf-8")
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(template, messages[:i]).encode("utf-8") if i else b""
        prefix = render(template, messages[: i + 1]).encode("utf-8")
        if not full.startswith(prefix) or len(before) > len(prefix):
            return _count_mask(template, encode, messages, n)
        overlap_mask(offsets, len(before), min(len(prefix), len(full)), mask)
    return mask


def _count_mask(template: str, encode: Encoder, messages: Messages, n: int) -> list[bool]:
    """sft_data.rs label_mask_by_prefix_tokenization."""
    mask = [False] * n
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            end = min(len(encode(render(template, messages[: i + 1]))[0]), n)
            before = render(template, messages[:i]) if i else ""
            start = len(encode(before)[0]) if before else 0
            mask[start:end] = [True] * (end - start)
    return mask


def check_topk_row(indices: list[int], logprobs: list[float], top_k: int, vocab: int) -> None:
    """logit_source.rs validate_topk_logprob_row (f32 values)."""
    values = [float(np.float32(v)) for v in logprobs]
    if len(indices) != top_k or len(values) != top_k:
        raise KilnRuleError(f"row declares top_k {top_k} but has {len(indices)} indices")
    if len(set(indices)) != top_k or any(not 0 <= t < vocab for t in indices):
        raise KilnRuleError("duplicate or out-of-vocabulary token id")
    if any(not math.isfinite(v) or v > 0 for v in values):
        raise KilnRuleError("invalid logprob")
    if any(b > a for a, b in itertools.pairwise(values)):
        raise KilnRuleError("logprobs are not non-increasing")
    if sum(math.exp(v) for v in values) > 1.0 + 32.0 * F32_EPSILON:
        raise KilnRuleError("sparse probability mass exceeds 1")


def prepare_example(
    example: dict[str, Any], template: str, encode: Encoder, top_k: int, vocab: int,
    fixture: dict[tuple[tuple[int, ...], int], tuple[list[int], list[float]]],
) -> list[int]:  # fmt: skip
    """opd.rs preparation of one example (reverse_kl); returns its action positions."""
    if not example["messages"] or not example["teacher_response"]:
        raise KilnRuleError("no messages or empty teacher_response")
    messages = [*example["messages"], {"role": "assistant", "content": example["teacher_response"]}]
    ids, mask = training_tokens(template, encode, messages)
    positions = [i for i, active in enumerate(mask) if active]
    if not positions or positions[0] == 0:
        raise KilnRuleError("no action tokens, or a target at position 0 (no logits row)")
    tokens = example.get("teacher_tokens", [])
    if len(tokens) != len(positions):
        raise KilnRuleError(f"{len(tokens)} teacher_tokens but {len(positions)} action tokens")
    for index, (token, at) in enumerate(zip(tokens, positions, strict=True)):
        declared = token.get("token_id")
        if declared is not None and declared != ids[at]:
            raise KilnRuleError(f"token {index} declares {declared}, tokenization has {ids[at]}")
        top = token.get("top_logprobs", [])
        if len(top) < top_k:
            raise KilnRuleError(f"token {index} has {len(top)} top_logprobs, need {top_k}")
        row = ([e["token_id"] for e in top[:top_k]], [e["logprob"] for e in top[:top_k]])
        check_topk_row(*row, top_k, vocab)
        key = (tuple(ids), at - 1)
        if fixture.setdefault(key, row) != row:
            raise KilnRuleError(f"token {index} conflicts with another example's fixture row")
    return positions
