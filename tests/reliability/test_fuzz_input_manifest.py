"""Fuzzing ``parse_teacher_input`` with mutations of the seed's input manifest.

The seeds are the valid documents of ``tests/vectors/teacher_input.json`` (the
product description's example first).  Properties: only ``IdentityError``
with an ``input.*`` or ``json.*`` rule escapes; re-spelling a document (key
order, white space, escapes) gives the same ``TeacherInput``; a removed or
unknown key, a wrong type, a bad value, a non-standard or duplicate JSON
construct, deep nesting or an oversized file is refused; random byte edits are
refused or give an input that satisfies the cross-field rules.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity.input_manifest import (
    MAX_INPUT_BYTES,
    TeacherInput,
    parse_teacher_input,
)
from tests.reliability.strategies import (
    attempt,
    fuzz_settings,
    json_values,
    mutated_bytes,
    spell,
    spellings,
)

VECTORS = Path(__file__).resolve().parent.parent / "vectors" / "teacher_input.json"
SEEDS: list[dict[str, Any]] = [case["input"] for case in json.loads(VECTORS.read_text())["valid"]]
PREFIXES = ("input.", "json.")
SOURCE = "fuzz/teacher-input.json"
HEX_FIELDS = (
    "base_model_sha256",
    "snapshot_content_sha256",
    "model_config_sha256",
    "tokenizer_vocab_sha256",
    "tokenizer_config_sha256",
    "runtime_content_sha256",
)
# Kiln's runtime values: 1..=512 UTF-8 bytes without C0 or DEL (edge spaces, C1 and
# U+2028 are allowed), so each of these breaks exactly one of those rules.
BAD_TEXT = ("", "a\nb", "\x00", "x\x7f", "\tx", "x" * 513, "é" * 257, "€" * 171)
BAD_HEX = ("A" * 64, "a" * 63, "a" * 65, "g" * 64, "sha256:" + "a" * 64, "")
WRONG_TYPES: st.SearchStrategy[object] = st.sampled_from((None, True, 1, 1.5, [], {}))


def parse(target: str, data: bytes) -> TeacherInput | IdentityError:
    outcome = attempt(
        target,
        lambda: parse_teacher_input(data, source=SOURCE),
        refusal=IdentityError,
        prefixes=PREFIXES,
    )
    if isinstance(outcome, TeacherInput):
        assert outcome.implementation == "vllm:" + outcome.runtime_versions["vllm"]
        assert [d.index for d in outcome.accelerator.devices] == list(
            range(len(outcome.accelerator.devices))
        )
        assert (outcome.adapter is None) == (outcome.adapter_max_rank is None)
        return outcome
    assert isinstance(outcome, IdentityError)
    return outcome


def encode(obj: object) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


seeds = st.sampled_from(SEEDS).map(copy.deepcopy)


@fuzz_settings()
@given(seeds, spellings())
def test_respelled_documents_parse_the_same(seed: dict[str, Any], style: Any) -> None:
    expected = parse_teacher_input(encode(seed), source=SOURCE)
    outcome = parse("input.respelled", spell(seed, style).encode("utf-8"))
    assert outcome == expected


def _objects(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every JSON object of the document: top, versions, accelerator, devices, adapter."""
    found = [doc, doc["runtime_versions"], doc["accelerator"], *doc["accelerator"]["devices"]]
    return found + ([doc["adapter"]] if isinstance(doc["adapter"], dict) else [])


def _bad_value(draw: st.DrawFn, key: str, doc: dict[str, Any], current: object) -> object:
    """A value that ``key`` (now ``current``) must refuse in ``doc``."""
    if key in HEX_FIELDS or key.endswith("sha256"):
        return draw(st.sampled_from(BAD_HEX) | WRONG_TYPES)
    if key == "schema":
        return draw(
            st.sampled_from(("kiln.vllm-teacher-input.v1", "", "KILN.VLLM-TEACHER-INPUT.V2"))
        )
    if key == "vocab_size":
        return draw(st.sampled_from((0, -1, 16_777_217, 1.0, True, "1", None)))
    if key == "adapter_max_rank":
        if doc["adapter"] is None:
            return draw(st.sampled_from((1, 8, 0, "8")))
        return draw(st.sampled_from((0, 2, 3, 1024, 8.0, True, None, "8")))
    if key == "implementation":
        return draw(st.sampled_from(("vllm:0.25.1", "vllm: 0.25.0", "vllm-0.25.0", "0.25.0")))
    if key == "type":
        return draw(st.sampled_from(("tpu", "CUDA", "", None, 1)))
    if key == "devices":
        return draw(st.sampled_from(([], None, {}, "gpu", [None], [1])))
    if key == "index":
        assert isinstance(current, int)
        return draw(st.sampled_from((-1, current + 1, 256, 0.0, True, None)))
    if key == "total_memory_bytes":
        # 0 is valid: Kiln's CPU, Metal and unknown devices report no memory.
        return draw(st.sampled_from((-1, 2**64, 1.5, True, "1", None)))
    if key == "adapter":
        return draw(st.sampled_from((1, "x", [], {"name": "x"})))
    return draw(st.sampled_from(BAD_TEXT) | WRONG_TYPES)


@st.composite
def invalid_documents(draw: st.DrawFn) -> bytes:
    doc = draw(seeds)
    kind = draw(st.sampled_from(("drop", "unknown", "value", "text", "deep", "devices")))
    obj = draw(st.sampled_from(_objects(doc)))
    key = draw(st.sampled_from(sorted(obj)))
    if kind == "drop":
        del obj[key]
    elif kind == "unknown":
        obj[draw(st.text(max_size=10).filter(lambda k: k not in obj))] = draw(json_values)
    elif kind == "value":
        obj[key] = _bad_value(draw, key, doc, obj[key])
    elif kind == "deep":
        depth = draw(st.integers(1, 30_000))
        obj[key] = "\x00deep\x00"
        return encode(doc).replace(b'"\\u0000deep\\u0000"', b"[" * depth + b"]" * depth)
    elif kind == "devices":
        devices = doc["accelerator"]["devices"]
        count = draw(st.sampled_from((257, 300)))
        doc["accelerator"]["devices"] = [dict(devices[0], index=i) for i in range(count)]
    else:
        return text_fault(draw, encode(doc))
    return encode(doc)


def text_fault(draw: st.DrawFn, data: bytes) -> bytes:
    """A construct strict JSON refuses, or a file over the size limit."""
    kind = draw(st.sampled_from(("nan", "dup", "trailing", "utf8", "oversize", "comment")))
    if kind == "nan":
        literal = draw(st.sampled_from((b"NaN", b"Infinity", b"-Infinity", b"1e999")))
        return data.replace(b'"vocab_size": 152064', b'"vocab_size": ' + literal)
    if kind == "dup":
        return data[:-1] + b', "schema": "kiln.vllm-teacher-input.v2"}'
    if kind == "trailing":
        return data + draw(st.sampled_from((b"x", b"{}", b"\x00", b",")))
    if kind == "utf8":
        at = data.index(b'"driver": "') + len(b'"driver": "')
        return data[:at] + draw(st.sampled_from((b"\xff", b"\xc3", b"\xed\xa0\x80"))) + data[at:]
    if kind == "oversize":
        return data + b" " * (MAX_INPUT_BYTES - len(data) + draw(st.integers(1, 4096)))
    return data[:-1] + b"/* note */}"


@fuzz_settings(3)
@given(invalid_documents())
def test_invalid_documents_are_refused(data: bytes) -> None:
    assert isinstance(parse("input.invalid", data), IdentityError)


@fuzz_settings(2)
@given(seeds.flatmap(lambda doc: mutated_bytes(encode(doc))))
def test_random_byte_edits_never_crash(data: bytes) -> None:
    parse("input.byte_edit", data)
