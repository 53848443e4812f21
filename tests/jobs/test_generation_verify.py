"""`kiln corpus verify` on generation corpora: the detached signature and Kiln's example rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kiln_registry.domain.errors import InputError
from kiln_registry.jobs.core.signing import CorpusSigner, key_path, load_or_create_signer
from kiln_registry.jobs.generation.output import ExampleContext, ExampleWriter, encode_example
from kiln_registry.jobs.generation.sources import GenerationSettings, student_tokenizer
from kiln_registry.jobs.generation.wire import Generated, KilnTokens
from kiln_registry.jobs.kinds import verify_corpus
from kiln_registry.model.tokenizer import student_vocab
from kiln_registry.testing.tiny_models import TinyModel
from tests.jobs.generation_harness import add_chat_template
from tests.jobs.harness import student_identity


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel) -> Any:
    return student_tokenizer(add_chat_template(tiny_model.path, tmp_path_factory.mktemp("c") / "m"))


def _corpus(tmp_path: Path, tokenizer: Any, vocab_sha: str) -> tuple[Path, CorpusSigner]:
    identity = student_identity(vocab_sha)
    ctx = ExampleContext("job-" + "1" * 24, "t", identity, GenerationSettings(3, 2), tokenizer)
    signer = load_or_create_signer(key_path(tmp_path))
    writer = ExampleWriter(tmp_path / "c.jsonl", identity, signer)
    for i in range(3):
        tops = [[70 + i, 5], [71, 5], [72, 5]]
        kiln = KilnTokens([10, 11, 70 + i, 71, 72], [2, 3, 4], [-0.5, -0.2, -0.1], tops,
                          [[-0.5, -1.0]] * 3)  # fmt: skip
        gen = Generated([70 + i, 71, 72], "length", [-0.5, -0.2, -0.1], tops,
                        [[-0.5, -1.0]] * 3, kiln)  # fmt: skip
        messages = json.dumps([{"role": "user", "content": f"q{i}"}])
        writer.write(encode_example(ctx, f"p{i}", messages, "0" * 64, gen))
    writer.commit()
    return tmp_path / "c.jsonl", signer


def _refused(path: Path, signer: CorpusSigner) -> str:
    with pytest.raises(InputError) as caught:
        verify_corpus(path, {signer.public.key_id: signer.public})
    return str(caught.value.rule)


def test_changes_to_a_generation_corpus_or_its_signature_are_refused(
    tmp_path: Path, tokenizer: Any, tiny_model: TinyModel
) -> None:
    path, signer = _corpus(tmp_path, tokenizer, student_vocab(tiny_model.path)[0])
    summary = verify_corpus(path, {signer.public.key_id: signer.public})
    assert (summary.sequences, summary.top_k, summary.teacher) == (3, 2, "t")
    original = path.read_bytes()
    path.write_bytes(original.replace(b'"q1"', b'"q9"'))
    assert _refused(path, signer) == "corpus.sha256"
    lines = original.decode().splitlines(keepends=True)
    bad = json.loads(lines[2])
    bad["teacher_response"] = ""
    path.write_text("".join([*lines[:2], json.dumps(bad) + "\n", *lines[3:]]))
    assert _refused(path, signer) == "corpus.teacher_response"
    # teacher_tokens must be Kiln's sequence at its action positions.
    bad = json.loads(lines[2])
    bad["metadata"]["kiln_action_positions"] = [1, 3, 4]
    path.write_text("".join([*lines[:2], json.dumps(bad) + "\n", *lines[3:]]))
    assert _refused(path, signer) == "corpus.teacher_tokens"
    bad["metadata"]["kiln_action_positions"] = [0, 3, 4]
    path.write_text("".join([*lines[:2], json.dumps(bad) + "\n", *lines[3:]]))
    assert _refused(path, signer) == "corpus.metadata"
    path.write_bytes(original)
    (tmp_path / "other").mkdir(mode=0o700)
    other = load_or_create_signer(key_path(tmp_path / "other"))
    assert _refused(path, other) == "corpus.unknown_key"
    sig = path.with_name("c.jsonl.sig")
    sig.unlink()
    assert _refused(path, signer) == "corpus.unsigned"


def test_an_oversized_or_linked_signature_file_is_refused_before_it_is_read(
    tmp_path: Path, tokenizer: Any, tiny_model: TinyModel
) -> None:
    path, signer = _corpus(tmp_path, tokenizer, student_vocab(tiny_model.path)[0])
    sig = path.with_name("c.jsonl.sig")
    good = sig.read_bytes()
    sig.write_bytes(good + b" " * (1 << 20))  # a bounded read: refused by its size
    assert _refused(path, signer) == "corpus.trailer"
    elsewhere = tmp_path / "real.sig"
    elsewhere.write_bytes(good)
    sig.unlink()
    sig.symlink_to(elsewhere)  # the signature is read only from a regular file
    assert _refused(path, signer) == "corpus.open"
    sig.unlink()
    sig.write_bytes(good)
    assert verify_corpus(path, {signer.public.key_id: signer.public}).sequences == 3


def test_a_v1_corpus_still_verifies_with_its_sampled_teacher_tokens(
    tmp_path: Path, tokenizer: Any, tiny_model: TinyModel
) -> None:
    """Format v1 (before issue 26): teacher_tokens per sampled id, which Kiln refuses to
    train on; the signature and rows still verify."""
    identity = student_identity(student_vocab(tiny_model.path)[0])
    signer = load_or_create_signer(key_path(tmp_path))
    writer = ExampleWriter(tmp_path / "v1.jsonl", identity, signer)
    settings = json.loads(GenerationSettings(3, 2).canonical_json())
    top = [{"token_id": 70, "logprob": -0.5}, {"token_id": 5, "logprob": -1.0}]
    example = {
        "id": "p0", "messages": [{"role": "user", "content": "q"}], "teacher_response": "x",
        "teacher_tokens": [{"token_id": 70, "token": "x", "logprob": -0.5, "top_logprobs": top}],
        "metadata": {"format": "kiln-registry.generation.v1", "job_id": "job-" + "1" * 24,
                     "teacher": "t", "identity_digest": identity.digest(),
                     "prompt_token_ids_sha256": "0" * 64, "completion_token_ids": [70],
                     "finish_reason": "length", "settings": settings},
    }  # fmt: skip
    writer.write(json.dumps(example).encode() + b"\n")
    writer.commit()
    keys = {signer.public.key_id: signer.public}
    assert verify_corpus(tmp_path / "v1.jsonl", keys).sequences == 1
