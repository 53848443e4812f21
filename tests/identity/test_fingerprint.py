"""kiln-teacher-v1 fingerprints: golden vectors, every rejection rule, round trips."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln_registry.domain.errors import FingerprintError, IdentityError
from kiln_registry.identity.document import AdapterIdentity, TeacherIdentity
from kiln_registry.identity.fingerprint import (
    FINGERPRINT_PREFIX,
    FINGERPRINT_RULES,
    MAX_FINGERPRINT_BYTES,
    MAX_IDENTITY_BYTES,
    encode_fingerprint,
    verify_fingerprint,
)

VECTOR_DIR = Path(__file__).parents[1] / "vectors"
VALID: list[dict[str, Any]] = json.loads(
    (VECTOR_DIR / "fingerprint_valid.json").read_text("utf-8")
)["cases"]
INVALID: list[dict[str, Any]] = json.loads(
    (VECTOR_DIR / "fingerprint_invalid.json").read_text("utf-8")
)["cases"]


def _golden() -> TeacherIdentity:
    return TeacherIdentity.from_mapping(VALID[0]["identity"])


def _fingerprint_of(document: bytes) -> str:
    encoded = base64.urlsafe_b64encode(document).rstrip(b"=").decode()
    return f"kiln-teacher-v1.{encoded}.{hashlib.sha256(document).hexdigest()}"


@pytest.mark.parametrize("case", VALID, ids=lambda c: c["name"])
def test_valid_vectors(case: dict[str, Any]) -> None:
    identity = TeacherIdentity.from_mapping(case["identity"])
    assert identity.canonical_bytes() == case["canonical"].encode("utf-8")
    assert identity.digest() == case["identity_sha256"]
    assert identity.revision() == case["identity_revision"]
    assert encode_fingerprint(identity) == identity.fingerprint() == case["fingerprint"]
    assert verify_fingerprint(case["fingerprint"]) == identity


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c["name"])
def test_invalid_vectors_name_the_first_failed_rule(case: dict[str, Any]) -> None:
    with pytest.raises(FingerprintError) as info:
        verify_fingerprint(case["fingerprint"])
    assert info.value.rule == case["rule"]
    assert info.value.code == "teacher_fingerprint_invalid"
    assert str(info.value).startswith(case["rule"] + ": ")


def test_every_rule_has_a_failing_vector() -> None:
    assert set(FINGERPRINT_RULES) == {case["rule"] for case in INVALID}


def test_golden_fingerprint_built_by_hand() -> None:
    document = _golden().canonical_bytes()
    assert _golden().fingerprint() == _fingerprint_of(document)
    assert _golden().fingerprint().startswith(FINGERPRINT_PREFIX + ".eyJzY2hlbWEiOiJr")


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("vllm-0.32.0-96a60ac7", "fingerprint.prefix"),
        ("vllm-96a60ac7", "fingerprint.parts"),
        ("vllm-0.32.0-96a60ac7.x", "fingerprint.parts"),
    ],
)
def test_stock_vllm_fingerprints_fail(text: str, rule: str) -> None:
    with pytest.raises(FingerprintError) as info:
        verify_fingerprint(text)
    assert info.value.rule == rule
    assert "stock vLLM" in str(info.value)


def test_size_limit_is_exact() -> None:
    padding = "A" * (MAX_FINGERPRINT_BYTES - len("kiln-teacher-v1..") - 64)
    at_limit = f"kiln-teacher-v1.{padding}.{'0' * 64}"
    assert len(at_limit) == MAX_FINGERPRINT_BYTES
    with pytest.raises(FingerprintError) as info:
        verify_fingerprint(at_limit)
    assert info.value.rule == "fingerprint.decoded_size"  # past the size rule
    with pytest.raises(FingerprintError) as info:
        verify_fingerprint(at_limit + "A")
    assert info.value.rule == "fingerprint.size"


def test_decoded_size_limit_is_exact() -> None:
    at_limit = b"x" * MAX_IDENTITY_BYTES
    with pytest.raises(FingerprintError) as info:
        verify_fingerprint(_fingerprint_of(at_limit))
    assert info.value.rule == "fingerprint.json"  # decoded, then refused as JSON
    with pytest.raises(FingerprintError) as info:
        verify_fingerprint(_fingerprint_of(at_limit + b"x"))
    assert info.value.rule == "fingerprint.decoded_size"


def test_spec_rejected_examples() -> None:
    golden = _golden()
    document = golden.canonical_bytes()
    sorted_keys = json.dumps(golden.to_dict(), sort_keys=True, separators=(",", ":"))
    no_adapter = {k: v for k, v in golden.to_dict().items() if k != "adapter"}
    examples = {
        "fingerprint.canonical": [
            _fingerprint_of(b" " + document),
            _fingerprint_of(document.replace(b"teacher/model", b"teacher\\u002fmodel")),
        ],
        "fingerprint.key_order": [_fingerprint_of(sorted_keys.encode())],
        "fingerprint.keys": [
            _fingerprint_of(json.dumps(no_adapter, separators=(",", ":")).encode())
        ],
        "fingerprint.digest_hex": [golden.fingerprint()[:-64] + golden.digest().upper()],
        "fingerprint.prefix": ["kiln-teacher-v2" + golden.fingerprint()[15:]],
        "fingerprint.parts": [golden.fingerprint() + ".x"],
    }
    for rule, texts in examples.items():
        for text in texts:
            with pytest.raises(FingerprintError) as info:
                verify_fingerprint(text)
            assert info.value.rule == rule, text[:40]


def test_padding_example_really_padded() -> None:
    text = _golden().fingerprint()
    prefix, encoded, digest = text.split(".")
    with pytest.raises(FingerprintError) as info:
        verify_fingerprint(f"{prefix}.{encoded}==.{digest}")
    assert info.value.rule == "fingerprint.base64_padding"


def test_value_failure_names_the_inner_rule() -> None:
    bad = dict(_golden().to_dict(), base_model_sha256="A" * 64)
    with pytest.raises(FingerprintError) as info:
        verify_fingerprint(_fingerprint_of(json.dumps(bad, separators=(",", ":")).encode()))
    assert info.value.rule == "fingerprint.value"
    assert "identity.hex" in str(info.value)
    assert "base_model_sha256" in str(info.value)


def test_fingerprint_error_is_an_identity_error() -> None:
    with pytest.raises(IdentityError):
        verify_fingerprint("nope")


hex64 = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
text = st.text(min_size=1, max_size=40).filter(
    lambda s: s == s.strip() and all(c.isprintable() for c in s)
)


@st.composite
def identities(draw: st.DrawFn) -> TeacherIdentity:
    vocab = draw(st.integers(1, 16_777_216))
    top_k = draw(st.integers(1, min(vocab, 65_536)))
    model_len = draw(st.integers(1, 16_777_216))
    width = min(top_k + 1, vocab)
    candidates = draw(st.integers(width, min(1_000_000, model_len * width)))
    adapter = draw(st.none() | st.builds(AdapterIdentity, text, hex64, hex64))
    return TeacherIdentity(
        draw(text), draw(hex64), draw(hex64), draw(hex64), adapter,
        vocab, top_k, model_len, candidates, draw(text), draw(hex64),
    )  # fmt: skip


@settings(max_examples=200)
@given(identities())
def test_round_trip(identity: TeacherIdentity) -> None:
    fingerprint = identity.fingerprint()
    assert len(fingerprint.encode()) <= MAX_FINGERPRINT_BYTES
    assert verify_fingerprint(fingerprint) == identity


@settings(max_examples=200)
@given(identities(), st.data())
def test_any_changed_character_is_refused(identity: TeacherIdentity, data: st.DataObject) -> None:
    fingerprint = identity.fingerprint()
    index = data.draw(st.integers(0, len(fingerprint) - 1))
    replacement = data.draw(st.sampled_from("Aa0_-.=+/ kZ9"))
    changed = fingerprint[:index] + replacement + fingerprint[index + 1 :]
    if changed == fingerprint:
        return
    with pytest.raises(FingerprintError):
        verify_fingerprint(changed)
