"""Kiln's teachers.json, imported as Kiln migrates it.

The entries are Kiln's own shapes and test values from ``ericflo/kiln``
``crates/kiln-server/src/api/teachers.rs`` (the newest stored version, with
``migrate_legacy_secret_fields`` and ``teacher_entry``), older versions of
the same file (the shape without ``provider``/``identity``, where
``max_top_k: Some(0)`` was the test value), and the identity helper
``remote_identity`` of its tests (``crates/kiln-train/src/teacher_identity.rs``
field set).  Real files in tmp_path, a real migrated SQLite database, and a
real ``kiln serve`` subprocess for the start-up behaviour.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from kiln_registry.db.engine import open_engine, session_factory, upgrade_to_head
from kiln_registry.db.legacy import LEGACY_NO_IDENTITY_MESSAGE, LEGACY_STATUS_MESSAGE
from kiln_registry.db.repository import TeacherRepository, unit_of_work
from kiln_registry.legacy.registry import import_legacy_registry
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import ServerProcess, write_config

HASH_A, HASH_B, HASH_C = "a" * 64, "b" * 64, "c" * 64
KILN_SECRET_ENV_NAME = "AWS_SECRET_ACCESS_KEY_DO_NOT_USE"  # teachers.rs migration test value


def remote_identity(model: str, vocab_size: int, max_top_k: int) -> dict[str, Any]:
    """teachers.rs tests ``remote_identity``: HASH_A/B/C, no adapter, 4096, 65536, vllm:0.25.0."""
    return {
        "schema": "kiln.teacher-identity.v1",
        "protocol": "vllm.prompt-logprobs.numeric-token-ids.causal.v1",
        "served_model_id": model,
        "base_model_sha256": HASH_A,
        "tokenizer_vocab_sha256": HASH_B,
        "tokenizer_config_sha256": HASH_C,
        "adapter": None,
        "vocab_size": vocab_size,
        "max_top_k": max_top_k,
        "max_model_len": 4096,
        "max_prompt_logprob_candidates": 65536,
        "logprobs_mode": "raw_logprobs",
        "implementation": "vllm:0.25.0",
        "inference_config_sha256": HASH_A,
    }


def kiln_spec(**fields: Any) -> dict[str, Any]:
    """A ``TeacherSpec`` as Kiln's ``serde_json::to_vec_pretty`` writes it (all fields)."""
    spec: dict[str, Any] = {
        "alias": None,
        "kind": None,
        "provider": None,
        "model_id": None,
        "max_top_k": None,
        "vocab_size": None,
        "supports_full_vocab": None,
        "tokenizer_hash": None,
        "url": None,
        "notes": None,
        "adapter": None,
    }
    spec.update(fields)
    return spec


# teachers.rs registry_migrates_legacy_secret_names_without_trusting_or_reexposing_them.
LEGACY_REMOTE = kiln_spec(
    alias="legacy",
    kind="remote",
    provider="vllm",
    model_id="teacher-model",
    max_top_k=20,
    vocab_size=1024,
    supports_full_vocab=False,
    url="https://teacher.example.com",
    api_key_env=KILN_SECRET_ENV_NAME,
)
# teachers.rs spec_round_trips_through_serde (current format, pinned identity).
CURRENT_REMOTE = kiln_spec(
    alias="vllm@qwen",
    kind="remote",
    provider="vllm",
    model_id="qwen/qwen-3.6-27b",
    max_top_k=20,
    supports_full_vocab=False,
    identity=remote_identity("qwen/qwen-3.6-27b", 1024, 20),
    url="https://vllm.internal:8000",
    credential_id="primary-vllm",
)
# teachers.rs registry_round_trip_through_disk.
FIXTURE = kiln_spec(
    alias="fixture@test",
    kind="fixture",
    model_id="test",
    max_top_k=32,
    vocab_size=1024,
    supports_full_vocab=False,
    notes="unit test",
)
# Older teachers.rs registry_insert_get_list_remove: Kiln's old default max_top_k Some(0).
OLD_LOCAL = kiln_spec(
    alias="qwen3.6-27b@local",
    kind="local",
    model_id="qwen/qwen-3.6-27b",
    max_top_k=0,
    vocab_size=152_064,
    supports_full_vocab=True,
    tokenizer_hash="sha256:abc",
)


@pytest.fixture
def sessions(tmp_path: Path) -> Any:
    engine = open_engine(tmp_path / "registry.db")
    upgrade_to_head(engine)
    yield session_factory(engine)
    engine.dispose()


def write(path: Path, specs: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({s["alias"]: s for s in specs}, indent=2), encoding="utf-8")
    return path


def rows(database: Path) -> dict[str, tuple[Any, ...]]:
    conn = sqlite3.connect(database)
    try:
        found = conn.execute(
            "SELECT alias, kind, provider, model_id, url, credential_id, identity_digest, "
            "status, status_message FROM teachers"
        ).fetchall()
    finally:
        conn.close()
    return {row[0]: row[1:] for row in found}


def test_only_entries_that_carried_api_key_env_become_unusable(
    tmp_path: Path, sessions: sessionmaker[Session]
) -> None:
    path = write(tmp_path / "teachers.json", [LEGACY_REMOTE, CURRENT_REMOTE, FIXTURE])
    result = import_legacy_registry(path, sessions)
    assert (result.stripped_entries, result.rewritten) == (1, True)
    found = rows(tmp_path / "registry.db")
    assert found["legacy"][6:] == ("legacy_unverified", LEGACY_STATUS_MESSAGE)
    assert found["legacy"][5] is None  # no identity kept or invented
    # The current-format entry keeps its pinned identity and Kiln's status.
    current = found["vllm@qwen"]
    assert current[:5] == (
        "remote",
        "vllm",
        "qwen/qwen-3.6-27b",
        "https://vllm.internal:8000",
        "primary-vllm",
    )
    assert current[5] is not None and len(current[5]) == 64
    assert current[6:] == ("verified", None)
    assert found["fixture@test"][6:] == ("configured", None)
    # As Kiln rewrites it: the variable name is gone from the file.
    text = path.read_text(encoding="utf-8")
    assert "api_key_env" not in text and KILN_SECRET_ENV_NAME not in text


def test_kilns_old_default_max_top_k_zero_imports(
    tmp_path: Path, sessions: sessionmaker[Session]
) -> None:
    # Kiln wrote api_key_env: null in this shape; without it the local entry has no identity.
    with_null = {**OLD_LOCAL, "api_key_env": None}
    fixture_zero = {**FIXTURE, "alias": "zero@fixture", "max_top_k": 0}
    remote_zero = {**CURRENT_REMOTE, "alias": "zero@remote", "max_top_k": 0}
    path = write(tmp_path / "teachers.json", [with_null, fixture_zero, remote_zero])
    import_legacy_registry(path, sessions)
    found = rows(tmp_path / "registry.db")
    assert found["qwen3.6-27b@local"][6:] == ("legacy_unverified", LEGACY_STATUS_MESSAGE)
    # validate_teacher_spec_static: zero only means "unspecified" for a remote teacher.
    status, message = found["zero@fixture"][6:]
    assert status == "unavailable"
    assert "max_top_k must be greater than zero" in message
    assert found["zero@remote"][6:] == ("verified", None)


def test_entries_kiln_would_not_use_import_as_unavailable_or_unverified(
    tmp_path: Path, sessions: sessionmaker[Session]
) -> None:
    # teachers.rs persisted_unsupported_remote_spec_is_rejected_when_reused (no provider,
    # no identity) and spec_round_trips_through_serde's http://vllm.internal:8000 (plain
    # http off loopback: Kiln refuses to use it).
    sglang = {
        "alias": "legacy",
        "kind": "remote",
        "model_id": "old-model",
        "url": "http://sglang.internal:30000",
        "max_top_k": 20,
        "vocab_size": 1024,
    }
    plain = {**CURRENT_REMOTE, "alias": "plain@qwen", "url": "http://vllm.internal:8000"}
    path = write(tmp_path / "teachers.json", [sglang, plain])
    import_legacy_registry(path, sessions)
    found = rows(tmp_path / "registry.db")
    assert found["legacy"][6:] == ("legacy_unverified", LEGACY_NO_IDENTITY_MESSAGE)
    assert found["plain@qwen"][6] == "unavailable"
    assert found["plain@qwen"][5] is not None  # the identity is kept
    assert "https" in found["plain@qwen"][7]


def test_aliases_with_a_slash_import(tmp_path: Path, sessions: sessionmaker[Session]) -> None:
    # The example alias, as people name Hugging Face models.
    spec = {**CURRENT_REMOTE, "alias": "qwen/qwen3-8b@vllm"}
    path = write(tmp_path / "teachers.json", [spec, {**FIXTURE, "alias": "org/fixture"}])
    result = import_legacy_registry(path, sessions)
    assert result.imported == ("qwen/qwen3-8b@vllm", "org/fixture")
    found = rows(tmp_path / "registry.db")
    assert found["qwen/qwen3-8b@vllm"][6] == "verified"
    assert found["org/fixture"][6] == "configured"


def test_an_alias_deleted_after_import_is_not_imported_again(
    tmp_path: Path, sessions: sessionmaker[Session]
) -> None:
    path = write(tmp_path / "teachers.json", [CURRENT_REMOTE, FIXTURE])
    assert len(import_legacy_registry(path, sessions).imported) == 2
    with unit_of_work(sessions) as session:
        assert TeacherRepository(session).delete("vllm@qwen")
    again = import_legacy_registry(path, sessions)
    assert again.imported == ()
    assert again.already_present == ("fixture@test",)
    assert again.deleted_since_import == ("vllm@qwen",)
    assert sorted(rows(tmp_path / "registry.db")) == ["fixture@test"]


@pytest.mark.slow
def test_a_broken_file_does_not_stop_the_server(tmp_path: Path, tiny_model: TinyModel) -> None:
    # Kiln's load_from_path logs "failed to parse teachers.json" and starts empty.
    broken = {**FIXTURE, "unknown_field": 1}
    path = write(tmp_path / "teachers.json", [CURRENT_REMOTE, broken])
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    config = write_config(tmp_path, student=tiny_model.path, server={"legacy_registry": path})
    with ServerProcess(config, tmp_path / "serve.log") as server:
        server.wait_ready()
        ready = httpx.get(server.url + "/ready", timeout=10, trust_env=False)
        listed = httpx.get(server.url + "/v1/teachers", timeout=10, trust_env=False)
        server.stop()
    assert ready.status_code == 200
    report = ready.json()["legacy_registry"]
    assert (report["status"], report["path"], report["rule"]) == (
        "refused",
        str(path),
        "legacy.entry",
    )
    assert "unknown_field" in report["message"] and "not changed" in report["message"]
    assert listed.status_code == 200 and listed.json()["teachers"] == []
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    assert "legacy registry not imported (legacy.entry)" in server.output()
