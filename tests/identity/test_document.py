"""TeacherIdentityV1: the golden J, value rules, launcher-strict rules, versions."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity.document import (
    IDENTITY_KEYS,
    LOGPROBS_MODE,
    PROTOCOL,
    SCHEMA,
    AdapterIdentity,
    TeacherIdentity,
    is_hex64,
    same_identity,
    validate_identity,
    vllm_version_supported,
)

VECTOR_DIR = Path(__file__).parents[1] / "vectors"
INVALID: list[dict[str, Any]] = json.loads(
    (VECTOR_DIR / "identity_invalid.json").read_text("utf-8")
)["cases"]
VERSIONS: list[dict[str, Any]] = json.loads((VECTOR_DIR / "vllm_versions.json").read_text("utf-8"))[
    "cases"
]

# docs/identity.md section 1, written out by hand.
GOLDEN_J = (
    '{"schema":"kiln.teacher-identity.v1",'
    '"protocol":"vllm.prompt-logprobs.numeric-token-ids.causal.v1",'
    '"served_model_id":"teacher/model",'
    f'"base_model_sha256":"{"a" * 64}",'
    f'"tokenizer_vocab_sha256":"{"b" * 64}",'
    f'"tokenizer_config_sha256":"{"c" * 64}",'
    '"adapter":null,"vocab_size":248320,"max_top_k":20,"max_model_len":262144,'
    '"max_prompt_logprob_candidates":1000000,"logprobs_mode":"raw_logprobs",'
    '"implementation":"vllm/0.10.2+kiln-identity/1",'
    f'"inference_config_sha256":"{"f" * 64}"}}'
).encode()


def golden(**changes: Any) -> TeacherIdentity:
    identity = TeacherIdentity(
        served_model_id="teacher/model",
        base_model_sha256="a" * 64,
        tokenizer_vocab_sha256="b" * 64,
        tokenizer_config_sha256="c" * 64,
        adapter=None,
        vocab_size=248320,
        max_top_k=20,
        max_model_len=262144,
        max_prompt_logprob_candidates=1_000_000,
        implementation="vllm/0.10.2+kiln-identity/1",
        inference_config_sha256="f" * 64,
    )
    return dataclasses.replace(identity, **changes)


def test_golden_j_byte_for_byte() -> None:
    assert golden().canonical_bytes() == GOLDEN_J
    assert len(GOLDEN_J) <= 4096


def test_to_dict_normative_order_and_constants() -> None:
    document = golden().to_dict()
    assert tuple(document) == IDENTITY_KEYS
    assert len(IDENTITY_KEYS) == 14
    assert (document["schema"], document["protocol"], document["logprobs_mode"]) == (
        SCHEMA,
        PROTOCOL,
        LOGPROBS_MODE,
    )


def test_adapter_keys_in_order() -> None:
    adapter = AdapterIdentity(name="teacher", weights_sha256="d" * 64, config_sha256="e" * 64)
    identity = golden(served_model_id="teacher", adapter=adapter)
    assert b'"adapter":{"name":"teacher","weights_sha256":"' in identity.canonical_bytes()


def test_digest_and_revision() -> None:
    import hashlib

    assert golden().digest() == hashlib.sha256(GOLDEN_J).hexdigest()
    assert golden().revision() == "sha256:" + golden().digest()


def test_from_mapping_accepts_any_key_order() -> None:
    shuffled = dict(reversed(list(golden().to_dict().items())))
    assert TeacherIdentity.from_mapping(shuffled) == golden()


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c["name"])
def test_invalid_vectors(case: dict[str, Any]) -> None:
    with pytest.raises(IdentityError) as info:
        TeacherIdentity.from_mapping(case["identity"], launcher_strict=case["launcher_strict"])
    assert info.value.rule == case["rule"]


def test_construction_validates() -> None:
    with pytest.raises(IdentityError) as info:
        golden(max_top_k=True)
    assert info.value.rule == "identity.integer_type"
    with pytest.raises(IdentityError) as info:
        golden(served_model_id="x" * 300)
    assert info.value.rule == "identity.text_too_long"
    assert "x" * 100 not in str(info.value)
    with pytest.raises(IdentityError) as info:
        golden(adapter={"name": "x"})
    assert info.value.rule == "identity.adapter_shape"


def test_messages_name_the_field() -> None:
    with pytest.raises(IdentityError) as info:
        golden(tokenizer_config_sha256="nope")
    assert "tokenizer_config_sha256" in str(info.value)
    with pytest.raises(IdentityError) as info:
        AdapterIdentity(name="a", weights_sha256="d" * 64, config_sha256="E" * 64)
    assert "adapter.config_sha256" in str(info.value)


def test_launcher_strict() -> None:
    adapter = AdapterIdentity(name="teacher-v7", weights_sha256="d" * 64, config_sha256="e" * 64)
    ok = golden(served_model_id="teacher-v7", adapter=adapter, implementation="vllm:0.20.1rc0")
    validate_identity(ok, launcher_strict=True)
    validate_identity(golden())  # not strict: the golden implementation is fine
    with pytest.raises(IdentityError) as info:
        validate_identity(golden(), launcher_strict=True)
    assert info.value.rule == "identity.implementation"
    with pytest.raises(IdentityError) as info:
        validate_identity(dataclasses.replace(ok, served_model_id="other"), launcher_strict=True)
    assert info.value.rule == "identity.adapter_name"


def test_non_ascii_text_counts_bytes() -> None:
    assert golden(served_model_id="é" * 128).served_model_id == "é" * 128  # 256 bytes
    with pytest.raises(IdentityError):
        golden(served_model_id="é" * 128 + "x")


def test_lone_surrogate_refused() -> None:
    with pytest.raises(IdentityError) as info:
        golden(served_model_id="a\ud800b")
    assert info.value.rule == "identity.text_utf8"


@pytest.mark.parametrize("case", VERSIONS, ids=lambda c: c["version"] or "empty")
def test_vllm_versions(case: dict[str, Any]) -> None:
    assert vllm_version_supported(case["version"]) is case["supported"]


@pytest.mark.parametrize(
    ("value", "ok"),
    [("a" * 64, True), ("0123456789abcdef" * 4, True), ("A" * 64, False), ("a" * 65, False),
     ("a" * 63 + "\n", False), (b"a" * 64, False), (None, False)],
)  # fmt: skip
def test_is_hex64(value: object, ok: bool) -> None:
    assert is_hex64(value) is ok


# -- the stored-identity reader and the sameness check (issue 16) --------------------


def test_from_canonical_json_reads_a_stored_identity_back() -> None:
    assert TeacherIdentity.from_canonical_json(GOLDEN_J.decode()) == golden()
    assert TeacherIdentity.from_canonical_json(GOLDEN_J) == golden()


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        (GOLDEN_J[:-1] + b',"vocab_size":1}', "identity.json"),  # a repeated key
        (GOLDEN_J.replace(b"248320", b"NaN"), "identity.json"),  # not JSON
        (b"\xff", "identity.json"),  # not UTF-8
        (b" " * 4097, "identity.size"),  # over MAX_IDENTITY_BYTES, refused before parsing
        (b'{"schema":"kiln.teacher-identity.v1"}', "identity.keys"),
    ],
)
def test_from_canonical_json_is_strict(text: bytes, rule: str) -> None:
    with pytest.raises(IdentityError) as caught:
        TeacherIdentity.from_canonical_json(text)
    assert caught.value.rule == rule


def test_same_identity() -> None:
    assert same_identity(golden(), golden())
    assert same_identity(golden(), TeacherIdentity.from_canonical_json(GOLDEN_J))
    assert not same_identity(golden(), golden(max_top_k=19))
