"""The identity-bound corpus: its exact layout, atomic publication, and every verification rule.

Corpora here are signed with a real Ed25519 key (``jobs.core.signing``) created in
the test's directory; the signature rules themselves are in
``test_corpus_signature.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kiln_registry.domain.errors import InputError
from kiln_registry.identity.off_policy import off_policy_manifest
from kiln_registry.jobs.core.signing import CorpusSigner, PublicKey, key_path, load_or_create_signer
from kiln_registry.jobs.kinds import verify_corpus
from kiln_registry.jobs.scoring.cache import ScoredSequence
from kiln_registry.jobs.scoring.corpus import CorpusWriter, RowContext
from kiln_registry.jobs.scoring.sources import token_ids_sha256
from tests.jobs.harness import student_identity

IDENTITY = student_identity("b" * 64)
K = 3


def scored(n: int, seed: int = 0) -> ScoredSequence:
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.permutation(50)[:K] for _ in range(n)]).astype(np.int32)
    lps = -np.sort(rng.uniform(0.1, 9.0, size=(n, K)), axis=1).astype(np.float32)
    own = -rng.uniform(0.1, 9.0, size=n - 1).astype(np.float32)
    return ScoredSequence(topk_ids=ids, topk_logprobs=lps, token_logprobs=own)


def make_signer(directory: Path) -> CorpusSigner:
    directory.mkdir(exist_ok=True)
    return load_or_create_signer(key_path(directory))


def keyring(signer: CorpusSigner) -> dict[str, PublicKey]:
    return {signer.public.key_id: signer.public}


def write_corpus(path: Path, seqs: list[list[int]], signer: CorpusSigner | None = None) -> Path:
    signer = signer or make_signer(path.parent)
    writer = CorpusWriter(path, RowContext("job-" + "1" * 24, "t@x", IDENTITY, K), signer)
    for i, tokens in enumerate(seqs):
        writer.write(f"s{i}", np.array(tokens, dtype=np.int32), scored(len(tokens), i))
    writer.commit()
    return path


def test_layout_first_line_is_the_exact_manifest_then_one_row_per_sequence(tmp_path: Path) -> None:
    signer = make_signer(tmp_path)
    path = write_corpus(tmp_path / "c.jsonl", [[1, 2, 3], [4]], signer)
    lines = path.read_text().splitlines()
    assert len(lines) == 4
    assert lines[0] == off_policy_manifest(IDENTITY)
    assert lines[0].startswith('{"schema":"kiln.off-policy-distillation-manifest.v1"')
    row = json.loads(lines[1])
    assert list(row) == ["format", "job_id", "teacher", "identity_digest", "top_k", "id",
                         "token_ids_sha256", "token_ids", "topk_ids", "topk_logprobs",
                         "token_logprobs"]  # fmt: skip
    assert row["token_ids_sha256"] == token_ids_sha256([1, 2, 3])
    # float32 values round-trip exactly from their shortest text
    expected = scored(3, 0)
    assert np.array_equal(np.array(row["topk_logprobs"], dtype=np.float32), expected.topk_logprobs)
    assert json.loads(lines[2])["token_logprobs"] == []
    summary = verify_corpus(path, keyring(signer))
    assert (summary.sequences, summary.top_k, summary.teacher) == (2, K, "t@x")
    assert summary.key_id == signer.public.key_id
    assert not list(tmp_path.glob(".*partial"))


def test_discard_leaves_nothing(tmp_path: Path) -> None:
    signer = make_signer(tmp_path / "keys")
    writer = CorpusWriter(tmp_path / "c.jsonl", RowContext("job-x", "t", IDENTITY, K), signer)
    writer.write("a", np.array([1, 2], dtype=np.int32), scored(2))
    writer.discard()
    assert [p.name for p in tmp_path.iterdir()] == ["keys"]


def _edit_row(index: int, change: Callable[[dict[str, Any]], None]) -> Callable[[list[str]], None]:
    def edit(lines: list[str]) -> None:
        row = json.loads(lines[index])
        change(row)
        lines[index] = json.dumps(row, separators=(",", ":"))

    return edit


def _set(key: str, value: object) -> Callable[[dict[str, Any]], None]:
    return lambda row: row.__setitem__(key, value)


TAMPERING: dict[str, tuple[Callable[[list[str]], None], str]] = {
    "header spacing": (
        lambda ls: ls.__setitem__(0, ls[0].replace(":", ": ", 1)),
        "manifest_noncanonical",
    ),
    "header identity": (
        lambda ls: ls.__setitem__(0, ls[0].replace("vllm:0.32.0", "vllm:0.32.1")),
        "identity",
    ),
    "other identity": (_edit_row(1, _set("identity_digest", "0" * 64)), "identity"),
    "job id": (_edit_row(2, _set("job_id", "job-other")), "mixed"),
    "k": (_edit_row(2, _set("top_k", 2)), "mixed"),
    "token sha": (_edit_row(1, lambda r: r["token_ids"].__setitem__(0, 9)), "token_sha256"),
    "oov": (_edit_row(1, lambda r: r["token_ids"].__setitem__(0, 512)), "token_id"),
    "order": (_edit_row(1, lambda r: r["topk_logprobs"][0].reverse()), "topk_order"),
    "positive": (_edit_row(1, lambda r: r["topk_logprobs"][0].__setitem__(0, 0.5)), "logprob"),
    "rows": (_edit_row(1, lambda r: r["topk_ids"].pop()), "row_shape"),
    "dup id": (
        _edit_row(1, lambda r: r["topk_ids"][0].__setitem__(1, r["topk_ids"][0][0])),
        "duplicate_id",
    ),
    "keys": (_edit_row(1, lambda r: r.pop("format")), "row_keys"),
    "same seq id": (_edit_row(2, _set("id", "s0")), "id"),
    "not json": (lambda ls: ls.__setitem__(1, ls[1][:-3]), "json"),
    "bool token": (_edit_row(1, lambda r: r["token_ids"].__setitem__(0, True)), "row_shape"),
}


@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_tampered_corpora_are_refused_naming_the_line_and_rule(tmp_path: Path, case: str) -> None:
    """A structurally bad line is named first, before the signature's digest is compared."""
    signer = make_signer(tmp_path)
    path = write_corpus(tmp_path / "c.jsonl", [[1, 2, 3], [4, 5]], signer)
    lines = path.read_text().splitlines()
    edit, rule = TAMPERING[case]
    edit(lines)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as caught:
        verify_corpus(path, keyring(signer))
    assert caught.value.rule == f"corpus.{rule}", caught.value
