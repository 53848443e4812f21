"""Generation corpora are what Kiln's off-policy distillation reads, field for field.

Values come from ericflo/kiln ``crates/kiln-train/src/opd.rs`` (stored commit
1b6edc69): ``parse_off_policy_distillation_dataset_str`` treats the
``kiln.off-policy-distillation-manifest.v1`` record as the first non-empty
line (byte-exact canonical JSON) and parses every other non-empty line as an
``OffPolicyDistillationExample``: ``id`` ``Option<String>``, ``messages``
``Vec<ChatMessage>`` (``crates/kiln-train/src/lib.rs``: ``role`` and
``content`` strings), ``teacher_response`` ``String``, ``teacher_tokens``
``Vec<TeacherActionToken>`` (``token_id`` ``Option<u32>``, ``token``
``Option<String>``, ``logprob`` ``Option<f32>``, ``top_logprobs``
``Vec<TeacherTopLogprob>`` of ``token_id`` ``u32`` and ``logprob`` ``f32``),
``trajectory`` and ``metadata`` (``serde_json::Value``).  Preparation then
refuses no messages, an empty ``teacher_response``, fewer than ``top_k``
``top_logprobs`` per token, ids outside ``vocab_size`` and non-finite logprobs,
and (``kiln_rules``, newest opd.rs) teacher_tokens that are not one per action
position of its own tokenization with that position's token id.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kiln_registry.identity.off_policy import OFF_POLICY_SCHEMA, off_policy_manifest
from kiln_registry.jobs.core.signing import key_path, load_or_create_signer
from kiln_registry.jobs.generation.kiln import KilnRenderer
from kiln_registry.jobs.generation.output import ExampleContext, ExampleWriter, encode_example
from kiln_registry.jobs.generation.sources import GenerationSettings, render, student_tokenizer
from kiln_registry.jobs.generation.wire import Generated, KilnTokens
from kiln_registry.jobs.kinds import verify_corpus
from kiln_registry.model.tokenizer import student_vocab
from kiln_registry.testing.tiny_models import TinyModel
from tests.jobs.generation_harness import CHAT_TEMPLATE, MESSAGES, add_chat_template
from tests.jobs.harness import student_identity
from tests.kiln_conformance.kiln_rules import Encoder, prepare_example

EXAMPLE_FIELDS = {"id", "messages", "teacher_response", "teacher_tokens", "trajectory", "metadata"}
U32 = 2**32


def _f32(value: object) -> bool:
    """A JSON number serde reads as a finite f32."""
    return type(value) in (int, float) and math.isfinite(float(np.float32(value)))  # type: ignore[arg-type]


def _u32(value: object) -> bool:
    return type(value) is int and 0 <= value < U32


def check_example(value: object, top_k: int, vocab: int) -> None:
    """Kiln's serde types for one example line, then its preparation rules."""
    assert isinstance(value, dict) and set(value) <= EXAMPLE_FIELDS
    assert value.get("id") is None or isinstance(value["id"], str)
    messages = value["messages"]
    assert isinstance(messages, list) and messages
    for message in messages:
        assert isinstance(message, dict) and set(message) == {"role", "content"}
        assert isinstance(message["role"], str) and isinstance(message["content"], str)
    assert isinstance(value["teacher_response"], str) and value["teacher_response"]
    for token in value.get("teacher_tokens", []):
        assert isinstance(token, dict) and set(token) <= {"token_id", "token", "logprob",
                                                          "top_logprobs"}  # fmt: skip
        assert _u32(token["token_id"]) and token["token_id"] < vocab
        assert isinstance(token["token"], str) and _f32(token["logprob"])
        top = token["top_logprobs"]
        assert isinstance(top, list) and len(top) >= top_k
        for entry in top:
            assert set(entry) == {"token_id", "logprob"}
            assert _u32(entry["token_id"]) and entry["token_id"] < vocab
            assert _f32(entry["logprob"]) and math.isfinite(entry["logprob"])


def _encoder(tokenizer: Any) -> Encoder:
    def encode(text: str) -> tuple[list[int], list[tuple[int, int]]]:
        got = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
        return list(got.ids), list(got.offsets)

    return encode


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel) -> Any:
    model = add_chat_template(tiny_model.path, tmp_path_factory.mktemp("chat") / "model")
    return student_tokenizer(model)


@pytest.mark.parametrize("top_k", [0, 4])
def test_a_generation_corpus_parses_as_kiln_off_policy_examples(
    tmp_path: Path, tokenizer: Any, tiny_model: TinyModel, top_k: int
) -> None:
    identity = student_identity(student_vocab(tiny_model.path)[0])
    settings = GenerationSettings(max_tokens=3, top_k=top_k)
    ctx = ExampleContext("job-" + "0" * 24, "ref@chat", identity, settings, tokenizer)
    signer = load_or_create_signer(key_path(tmp_path))
    final = tmp_path / "corpus.jsonl"
    writer = ExampleWriter(final, identity, signer)
    for index, messages in enumerate(MESSAGES):
        ids = [70 + index, 71, 72]
        tops = [[t, *[i for i in range(10, 20) if i != t][: top_k - 1]] for t in ids]
        lps = [[-1.5 - r for r in range(top_k)] for _ in ids]
        gen = Generated(ids, "length", [-0.5, -0.25, -1.0], tops, lps)
        if top_k == 0:
            gen = Generated(ids, "length")
        else:  # the scores of the conversation as Kiln tokenizes it (made-up numbers)
            text = tokenizer.decode(ids, skip_special_tokens=True)
            seq = KilnRenderer.for_tokenizer(tokenizer).sequence(messages, text, "test")
            at = [seq.token_ids[p] for p in seq.positions]
            rows = [[t, *[i for i in range(10, 20) if i != t][: top_k - 1]] for t in at]
            kiln = KilnTokens(seq.token_ids, seq.positions, [-1.5] * len(at), rows,
                              [lps[0]] * len(at))  # fmt: skip
            gen = Generated(ids, "length", [-0.5, -0.25, -1.0], tops, lps, kiln)
        prompt = render(tokenizer, messages, "test")
        sha = hashlib.sha256(str(prompt).encode()).hexdigest()
        writer.write(encode_example(ctx, f"p{index}", json.dumps(messages), sha, gen))
    writer.commit()

    lines = [line for line in final.read_text().splitlines() if line.strip()]
    assert lines[0] == off_policy_manifest(identity)  # byte-exact canonical manifest
    assert json.loads(lines[0])["schema"] == OFF_POLICY_SCHEMA
    examples = [json.loads(line) for line in lines[1:]]
    assert len(examples) == len(MESSAGES)  # every other line is an example: no trailer line
    for example, messages in zip(examples, MESSAGES, strict=True):
        assert example.get("schema") != OFF_POLICY_SCHEMA
        check_example(example, top_k, identity.vocab_size)
        if top_k:  # Kiln's preparation (masking, count and ids, rows): see kiln_rules
            encode = _encoder(tokenizer)
            prepare_example(example, CHAT_TEMPLATE, encode, top_k, identity.vocab_size, {})
        assert example["messages"] == messages
        assert ("teacher_tokens" in example) == (top_k > 0)
    keys = {signer.public.key_id: signer.public}
    assert verify_corpus(final, keys).sequences == len(MESSAGES)
