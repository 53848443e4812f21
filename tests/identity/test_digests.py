"""Golden tests for kiln_registry.identity.digests (docs/identity.md sections 2, 3, 4, 8)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity import digests

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "vectors" / "digests.json").read_text("utf-8")
)


def record(data: bytes) -> digests.FileRecord:
    return digests.FileRecord(hashlib.sha256(data).digest(), len(data))


def test_published_goldens_are_in_the_vectors() -> None:
    base = {c["name"]: c["sha256"] for c in VECTORS["base_model"]}
    vocab = {c["name"]: c["sha256"] for c in VECTORS["tokenizer_vocab"]}
    assert base["kiln_golden_one_shard"] == (
        "aa7e9961df654af2a7405c5d2c07eb5a72b58f86060035c245c3415793c459c1"
    )
    assert vocab["kiln_golden"] == (
        "0e7ed7c4b2c375344d31b534f7cbb119b528114f1301f09d6642801b100710ff"
    )


@pytest.mark.parametrize("case", VECTORS["base_model"], ids=lambda c: c["name"])
def test_base_model(case: dict[str, Any]) -> None:
    shards = [record(s.encode()) for s in case["shards_utf8"]]
    assert digests.base_model_sha256(shards) == case["sha256"]
    assert digests.base_model_sha256(reversed(shards)) == case["sha256"]


def test_base_model_layout_by_hand() -> None:
    data = b"weight-v1"
    expected = hashlib.sha256(
        b"kiln.base-model-content.v1\x00" + (1).to_bytes(8, "little")
        + len(data).to_bytes(8, "little") + hashlib.sha256(data).digest()
    ).hexdigest()  # fmt: skip
    assert digests.base_model_sha256([record(data)]) == expected


def test_base_model_needs_a_shard() -> None:
    with pytest.raises(IdentityError) as info:
        digests.base_model_sha256([])
    assert info.value.rule == "base_model.no_shards"


def test_one_changed_byte_changes_base_model() -> None:
    assert digests.base_model_sha256([record(b"weight-v1")]) != digests.base_model_sha256(
        [record(b"weight-v2")]
    )


@pytest.mark.parametrize("case", VECTORS["tokenizer_vocab"], ids=lambda c: c["name"])
def test_tokenizer_vocab(case: dict[str, Any]) -> None:
    vocab = case["vocab"]
    got = digests.tokenizer_vocab_sha256(
        vocab, vocab_size_with_added=len(vocab), model_width=case["model_width"]
    )
    assert got == case["sha256"]


@pytest.mark.parametrize("case", VECTORS["tokenizer_vocab_invalid"], ids=lambda c: c["name"])
def test_tokenizer_vocab_invalid(case: dict[str, Any]) -> None:
    with pytest.raises(IdentityError) as info:
        digests.tokenizer_vocab_sha256(
            case["vocab"],
            vocab_size_with_added=case["vocab_size_with_added"],
            model_width=case["model_width"],
        )
    assert info.value.rule == case["rule"]


def test_tokenizer_vocab_refuses_boolean_ids() -> None:
    with pytest.raises(IdentityError) as info:
        digests.tokenizer_vocab_sha256({"a": True}, vocab_size_with_added=1, model_width=2)
    assert info.value.rule == "tokenizer_vocab.id_type"


def test_tokenizer_config() -> None:
    case = VECTORS["tokenizer_config"]
    assert digests.tokenizer_config_sha256(case["backend_json"]) == case["sha256"]
    assert case["sha256"] == hashlib.sha256(case["backend_json"].encode()).hexdigest()


@pytest.mark.parametrize("case", VECTORS["adapter_rank_cap"], ids=str)
def test_adapter_rank_cap(case: dict[str, Any]) -> None:
    if "cap" in case:
        assert digests.adapter_rank_cap(case["adapter_config"]) == case["cap"]
    else:
        with pytest.raises(IdentityError) as info:
            digests.adapter_rank_cap(case["adapter_config"])
        assert info.value.rule == case["rule"]


def test_rank_caps_from_the_spec() -> None:
    assert digests.adapter_rank_cap({"r": 8}) == 8
    assert digests.adapter_rank_cap({"r": 8, "rank_pattern": {"layer": 20}}) == 32
    with pytest.raises(IdentityError):
        digests.adapter_rank_cap({"r": 513})


@pytest.mark.parametrize("case", VECTORS["adapter_weights"], ids=lambda c: c["filename"])
def test_adapter_weights(case: dict[str, Any]) -> None:
    data = case["data_utf8"].encode()
    assert digests.adapter_weights_sha256(case["filename"], record(data)) == case["sha256"]


def test_adapter_weights_name_is_bound_and_checked() -> None:
    a, b = VECTORS["adapter_weights"]
    assert a["sha256"] != b["sha256"]
    with pytest.raises(IdentityError) as info:
        digests.adapter_weights_sha256("adapter.pt", record(b"x"))
    assert info.value.rule == "adapter.weights_name"


def test_runtime_content() -> None:
    case = VECTORS["runtime_content"]
    files = [
        digests.LabelledFile(f["label"], record(f["data_utf8"].encode())) for f in case["files"]
    ]
    assert digests.runtime_content_sha256(case["directories"], files) == case["sha256"]
    reordered = digests.runtime_content_sha256(case["directories"][::-1], files[::-1])
    assert reordered == case["sha256"]


@pytest.mark.parametrize(
    ("label", "rule"),
    [("", "runtime_content.label_length"), ("x" * 4097, "runtime_content.label_length"),
     ("a\tb", "runtime_content.label_control"), ("a\x7fb", "runtime_content.label_control")],
)  # fmt: skip
def test_runtime_labels(label: str, rule: str) -> None:
    with pytest.raises(IdentityError) as info:
        digests.runtime_content_sha256([label], [])
    assert info.value.rule == rule
