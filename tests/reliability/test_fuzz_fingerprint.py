"""Fuzzing ``verify_fingerprint`` with mutations of valid fingerprints.

Properties: the verifier never raises anything but ``FingerprintError`` with a
rule from ``FINGERPRINT_RULES``; a raw edit of a fingerprint is accepted only
when it leaves the text unchanged; a re-signed identity part (valid digest
over a re-spelled or edited ``J``) is accepted only when ``J`` is exactly
canonical; every accepted fingerprint re-encodes to itself byte for byte.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiln_registry.domain.errors import FingerprintError, IdentityError
from kiln_registry.identity.document import AdapterIdentity, TeacherIdentity, check_text
from kiln_registry.identity.fingerprint import (
    FINGERPRINT_PREFIX,
    FINGERPRINT_RULES,
    MAX_FINGERPRINT_BYTES,
    MAX_IDENTITY_BYTES,
    verify_fingerprint,
)
from tests.reliability.strategies import (
    Spelling,
    attempt,
    fuzz_settings,
    json_values,
    mutated_bytes,
    mutated_text,
    spell,
    spellings,
)

VECTORS = Path(__file__).resolve().parent.parent / "vectors" / "fingerprint_valid.json"
GOLDEN = [case["fingerprint"] for case in json.loads(VECTORS.read_text())["cases"]]
PREFIXES = ("fingerprint.",)


def _bounded(text: str) -> bool:
    try:
        check_text(text, "fuzz")
    except IdentityError:
        return False
    return True


hex64 = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
bounded_text = st.text(st.characters(codec="utf-8"), min_size=1, max_size=40).filter(_bounded)


@st.composite
def identities(draw: st.DrawFn) -> TeacherIdentity:
    vocab = draw(st.integers(1, 16_777_216))
    top_k = draw(st.integers(1, min(vocab, 65_536)))
    model_len = draw(st.integers(1, 16_777_216))
    width = min(top_k + 1, vocab)
    return TeacherIdentity(
        served_model_id=draw(bounded_text),
        base_model_sha256=draw(hex64),
        tokenizer_vocab_sha256=draw(hex64),
        tokenizer_config_sha256=draw(hex64),
        adapter=draw(st.none() | st.builds(AdapterIdentity, bounded_text, hex64, hex64)),
        vocab_size=vocab,
        max_top_k=top_k,
        max_model_len=model_len,
        max_prompt_logprob_candidates=draw(st.integers(width, min(1_000_000, model_len * width))),
        implementation=draw(bounded_text),
        inference_config_sha256=draw(hex64),
    )


fingerprints = st.sampled_from(GOLDEN) | identities().map(TeacherIdentity.fingerprint)


def sign(document: bytes) -> str:
    """A fingerprint of arbitrary bytes ``J``: correct base64url and digest."""
    encoded = base64.urlsafe_b64encode(document).rstrip(b"=").decode("ascii")
    return f"{FINGERPRINT_PREFIX}.{encoded}.{hashlib.sha256(document).hexdigest()}"


def document_of(fingerprint: str) -> bytes:
    encoded = fingerprint.split(".")[1]
    return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))


def verify(target: str, text: object) -> TeacherIdentity | FingerprintError:
    outcome = attempt(
        target,
        lambda: verify_fingerprint(text),  # type: ignore[arg-type]  # fuzzing the type check
        refusal=FingerprintError,
        prefixes=PREFIXES,
    )
    if isinstance(outcome, FingerprintError):
        assert outcome.rule in FINGERPRINT_RULES, outcome.rule
        return outcome
    assert isinstance(outcome, TeacherIdentity)
    assert outcome.fingerprint() == text, "an accepted fingerprint must re-encode to itself"
    return outcome


@fuzz_settings()
@given(identities())
def test_valid_fingerprints_round_trip(identity: TeacherIdentity) -> None:
    text = identity.fingerprint()
    assert verify("fingerprint.round_trip", text) == identity
    assert document_of(text) == identity.canonical_bytes()


RAW_KINDS = (
    "text",
    "reorder",
    "pad",
    "digest_case",
    "truncate",
    "oversize",
    "space",
    "extra",
    "std_alphabet",
    "other_digest",
    "stock",
)


@st.composite
def raw_mutations(draw: st.DrawFn, text: str) -> str:
    """Edits of the fingerprint text itself (its digest is not recomputed)."""
    prefix, encoded, digest = text.split(".")
    kind = draw(st.sampled_from(RAW_KINDS))
    if kind == "text":
        return draw(mutated_text(text))
    if kind == "reorder":
        parts = draw(st.permutations([prefix, encoded, digest]))
        return ".".join(parts)
    if kind == "pad":
        where = draw(st.sampled_from((len(prefix) + 1 + len(encoded), len(text), 0)))
        return text[:where] + "=" * draw(st.integers(1, 3)) + text[where:]
    if kind == "digest_case":
        flags = draw(st.lists(st.booleans(), min_size=64, max_size=64))
        new = "".join(c.upper() if f else c for c, f in zip(digest, flags, strict=True))
        return f"{prefix}.{encoded}.{new}"
    if kind == "truncate":
        return text[: draw(st.integers(0, len(text)))]
    if kind == "oversize":
        fill = draw(st.sampled_from(("A", "é", "-", "=")))
        count = draw(st.integers(1, MAX_FINGERPRINT_BYTES))
        where = draw(st.sampled_from((len(prefix) + 1 + len(encoded), len(text))))
        return text[:where] + fill * count + text[where:]
    if kind == "space":
        ws = draw(st.sampled_from((" ", "\t", "\n", "\r\n", "\u00a0", "\ufeff")))
        where = draw(st.sampled_from((0, len(text), len(prefix), len(prefix) + 1)))
        return text[:where] + ws + text[where:]
    if kind == "extra":
        return text + "." + draw(st.text(max_size=8))
    if kind == "std_alphabet":
        return text.replace("-", "+").replace("_", "/")
    if kind == "other_digest":
        return f"{prefix}.{encoded}.{draw(hex64)}"
    return "vllm-" + draw(st.text(max_size=20))


@fuzz_settings(2)
@given(fingerprints.flatmap(lambda fp: st.tuples(st.just(fp), raw_mutations(fp))))
def test_raw_edits_are_refused_unless_identical(case: tuple[str, str]) -> None:
    original, mutated = case
    outcome = verify("fingerprint.raw_edit", mutated)
    assert isinstance(outcome, TeacherIdentity) == (mutated == original), (
        "a raw edit of a fingerprint must be refused unless it is the identical string"
    )


_INT_VALUE = re.compile(rb'(?<=":)[0-9]+(?=[,}])')
NUMBER_FORMS = ("{n}.0", "{n}e0", "{n}E+0", "{n}.00", "0{n}", "{n} ", "-{n}", "{n}e-0")


@st.composite
def noncanonical_documents(draw: st.DrawFn, document: bytes) -> bytes:
    """``J`` re-spelled with the same meaning, or padded, or with a key added twice."""
    kind = draw(st.sampled_from(("spelling", "number", "bom", "pad", "duplicate", "ascii")))
    if kind == "spelling":
        style: Spelling = draw(spellings())
        return spell(json.loads(document), style).encode("utf-8")
    if kind == "number":
        matches = list(_INT_VALUE.finditer(document))
        match = draw(st.sampled_from(matches))
        form = draw(st.sampled_from(NUMBER_FORMS)).format(n=match.group().decode())
        return document[: match.start()] + form.encode() + document[match.end() :]
    if kind == "bom":
        return "\ufeff".encode() + document
    if kind == "pad":
        count = draw(st.integers(1, MAX_IDENTITY_BYTES))
        return document + draw(st.sampled_from((b" ", b"\n", b"\t"))) * count
    if kind == "duplicate":
        return document[:-1] + b',"schema":"kiln.teacher-identity.v1"}'
    return json.dumps(json.loads(document), ensure_ascii=True, separators=(",", ":")).encode()


@fuzz_settings(2)
@given(
    fingerprints.flatmap(
        lambda fp: st.tuples(st.just(document_of(fp)), noncanonical_documents(document_of(fp)))
    )
)
def test_resigned_respellings_are_refused(case: tuple[bytes, bytes]) -> None:
    canonical, document = case
    outcome = verify("fingerprint.respelled", sign(document))
    if document == canonical:
        assert isinstance(outcome, TeacherIdentity)
    else:
        assert isinstance(outcome, FingerprintError), "a non-canonical J was accepted"


@st.composite
def edited_documents(draw: st.DrawFn, document: bytes) -> bytes:
    """``J`` with byte edits, or with one value replaced by an arbitrary JSON value."""
    if draw(st.booleans()):
        return draw(mutated_bytes(document))
    obj = json.loads(document)
    key = draw(st.sampled_from([*obj, "extra"]))
    if draw(st.booleans()):
        obj[key] = draw(json_values)
    else:
        obj.pop(key, None)
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


@fuzz_settings(2)
@given(fingerprints.flatmap(lambda fp: edited_documents(document_of(fp))))
def test_resigned_edits_are_accepted_only_when_canonical(document: bytes) -> None:
    outcome = verify("fingerprint.resigned_edit", sign(document))
    if isinstance(outcome, TeacherIdentity):
        assert outcome.canonical_bytes() == document


@fuzz_settings()
@given(st.text(max_size=200) | st.none() | st.integers() | st.binary(max_size=64))
def test_arbitrary_values_are_refused(value: object) -> None:
    outcome = verify("fingerprint.arbitrary", value)
    assert isinstance(outcome, FingerprintError)


@pytest.mark.parametrize("text", GOLDEN)
def test_golden_vectors_are_the_seeds(text: str) -> None:
    assert isinstance(verify("fingerprint.golden", text), TeacherIdentity)
