"""Fuzzing ``import_legacy_registry`` with mutated legacy ``teachers.json`` files.

Every case writes a real file and imports it into one real, migrated SQLite
registry (aliases already imported are left alone, so cases do not depend on
each other).  Properties: only ``InputError`` with a ``legacy.*`` rule
escapes; a refused file is left byte for byte as it was; the planted
``api_key_env`` value never appears in a message, and after an accepted
import it is gone from the file; a re-spelled registry (key order, white
space, escapes) is accepted; unknown fields, wrong types, bad aliases, kinds
and bounds, duplicate keys, non-standard JSON and random byte edits are
refused or imported, never anything else.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.orm import Session, sessionmaker

from kiln_registry.db.engine import open_engine, session_factory, upgrade_to_head
from kiln_registry.domain.errors import InputError
from kiln_registry.legacy.entries import SPEC_FIELDS
from kiln_registry.legacy.registry import ImportResult, import_legacy_registry
from tests.reliability.strategies import (
    attempt,
    fuzz_settings,
    json_values,
    mutated_bytes,
    spell,
    spellings,
)
from tests.test_legacy_registry import legacy_registry

SECRET = "sk-fuzz-PLANTED-5e0c9a71"
PREFIXES = ("legacy.",)
SEED = legacy_registry(SECRET)  # the legacy tests' three entries, with this secret
TEXT_FIELDS = ("provider", "model_id", "url", "credential_id", "adapter", "tokenizer_hash", "notes")
# What Kiln's parser refuses (crates/kiln-server/src/api/teachers.rs TeacherSpec:
# usize bounds, closed enums, strict identity); 0 and blank strings it accepts.
BAD_VALUES: dict[str, tuple[object, ...]] = {
    "alias": ("other", "", None, 1),
    "kind": ("Remote", "cloud", "", None, 1, ["remote"]),
    "max_top_k": (-1, 2**64, 1.5, True, "20", [], {}),
    "vocab_size": (-1, 2**64, 1.0, False, "1"),
    "supports_full_vocab": (0, 1, "true", [], {}),
    "identity": ("x", 1, [], True, {}),
    "provider": ("openai", "VLLM", "", 1),
    "model_id": (None, 1, []),
}
BAD_TEXT: tuple[object, ...] = ("a\x00b", "a\x1bb", "a\x7fb", "x" * 4097, 1, True, [], {})
BAD_ALIASES = ("", " ", "\t", "x" * 257, "a\n", "a\x00", "a/probe", "a/receipts", "b/launch")


@pytest.fixture(scope="module")
def registry_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    root = tmp_path_factory.mktemp("fuzz-legacy")
    engine = open_engine(root / "registry.db")
    upgrade_to_head(engine)
    yield root, session_factory(engine)
    engine.dispose()


def run(target: str, env: tuple[Path, sessionmaker[Session]], data: bytes) -> object:
    root, sessions = env
    path = root / "teachers.json"
    path.write_bytes(data)
    path.chmod(0o640)
    outcome = attempt(
        target,
        lambda: import_legacy_registry(path, sessions),
        refusal=InputError,
        prefixes=PREFIXES,
    )
    after = path.read_bytes()
    assert SECRET.encode() not in after or after == data
    if isinstance(outcome, InputError):
        assert after == data, "a refused registry file was changed"
        assert SECRET not in str(outcome) and SECRET not in outcome.one_line()
    else:
        assert isinstance(outcome, ImportResult)
        assert b'"api_key_env"' not in after, "an imported registry still holds api_key_env"
    return outcome


def encode(doc: object) -> bytes:
    return json.dumps(doc, indent=2, ensure_ascii=False).encode("utf-8")


seeds = st.just(SEED).map(copy.deepcopy)


@fuzz_settings(0.5)
@given(seeds, spellings())
def test_respelled_registries_are_imported(
    registry_env: tuple[Path, sessionmaker[Session]], doc: dict[str, Any], style: Any
) -> None:
    outcome = run("legacy.respelled", registry_env, spell(doc, style).encode("utf-8"))
    assert isinstance(outcome, ImportResult)


@st.composite
def invalid_registries(draw: st.DrawFn) -> bytes:
    doc = draw(seeds)
    alias = draw(st.sampled_from(sorted(doc)))
    entry = doc[alias]
    kind = draw(st.sampled_from(("unknown", "value", "text", "alias", "shape", "json")))
    if kind == "unknown":
        known = SPEC_FIELDS | {"api_key_env"}
        entry[draw(st.text(max_size=12).filter(lambda k: k not in known))] = draw(json_values)
    elif kind == "value":
        field = draw(st.sampled_from(sorted(BAD_VALUES)))
        entry[field] = draw(st.sampled_from(BAD_VALUES[field]))
    elif kind == "text":
        entry[draw(st.sampled_from(TEXT_FIELDS))] = draw(st.sampled_from(BAD_TEXT))
    elif kind == "alias":
        new = draw(st.sampled_from(BAD_ALIASES))
        doc[new] = dict(doc.pop(alias), alias=new)
    elif kind == "shape":
        return encode(draw(st.sampled_from(([doc], None, "x", {alias: None}, {alias: [entry]}))))
    else:
        return json_fault(draw, encode(doc))
    return encode(doc)


def json_fault(draw: st.DrawFn, data: bytes) -> bytes:
    kind = draw(st.sampled_from(("nan", "dup_alias", "dup_field", "trailing", "utf8", "deep")))
    if kind == "nan":
        literal = draw(st.sampled_from((b"NaN", b"Infinity", b"-Infinity")))
        return data.replace(b'"max_top_k": 20', b'"max_top_k": ' + literal)
    if kind == "dup_alias":
        return data[: data.rindex(b"}")] + b', "fix": {"alias": "fix", "kind": "fixture"}}'
    if kind == "dup_field":
        return data.replace(b'"kind": "local"', b'"kind": "local", "kind": "local"')
    if kind == "trailing":
        return data + draw(st.sampled_from((b"x", b"{}", b"\x00", b",")))
    if kind == "utf8":
        at = data.index(b'"org/big') + 2
        return data[:at] + draw(st.sampled_from((b"\xff", b"\xc3", b"\xed\xa0\x80"))) + data[at:]
    depth = draw(st.integers(1, 50_000))
    return data.replace(b'"identity": null', b'"identity": ' + b"[" * depth + b"]" * depth)


@fuzz_settings(1.5)
@given(invalid_registries())
def test_invalid_registries_are_refused_untouched(
    registry_env: tuple[Path, sessionmaker[Session]], data: bytes
) -> None:
    assert isinstance(run("legacy.invalid", registry_env, data), InputError)


@fuzz_settings(1.5)
@given(seeds.flatmap(lambda doc: mutated_bytes(encode(doc))))
def test_random_byte_edits_never_crash(
    registry_env: tuple[Path, sessionmaker[Session]], data: bytes
) -> None:
    run("legacy.byte_edit", registry_env, data)


@pytest.mark.parametrize(
    "body",
    [
        b'{"a": {"alias": "a", "kind": "remote", "notes": "x\\ud800y"}}',
        b'{"b": {"alias": "b", "kind": "remote", "identity": {"k": "\\udfff"},'
        b' "api_key_env": "S"}}',
    ],
    ids=["notes", "identity_rewrite"],
)
def test_lone_surrogate_escapes_are_refused(
    registry_env: tuple[Path, sessionmaker[Session]], body: bytes
) -> None:
    assert isinstance(run("legacy.surrogate", registry_env, body), InputError)
