"""Kiln's legacy teachers.json: strict import, api_key_env removed unread, atomic rewrite.

Real files in tmp_path, a real migrated SQLite database, the real ``kiln``
CLI in a subprocess.  The planted ``api_key_env`` value must never reach a
row, a message, a log line, the CLI's output or the rewritten file.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from kiln_registry.config.loader import load_config
from kiln_registry.db.engine import session_factory, upgrade_to_head
from kiln_registry.db.legacy import LEGACY_NO_IDENTITY_MESSAGE, LEGACY_STATUS_MESSAGE
from kiln_registry.db.models import TeacherRow
from kiln_registry.db.repository import TeacherRepository, unit_of_work
from kiln_registry.domain.errors import RELEASE_NOTE, InputError
from kiln_registry.legacy.registry import (
    MAX_REGISTRY_BYTES,
    import_configured_legacy_registry,
    import_legacy_registry,
)
from kiln_registry.testing.tiny_models import TinyModel
from tests.backend import fetch, is_postgres, open_registry_database
from tests.pg_server import database_settings

SECRET = "sk-legacy-PLANTED-7c1e55d0aa93"
REPO_ROOT = Path(__file__).resolve().parents[1]


def legacy_registry(secret: str | None = SECRET) -> dict[str, dict[str, Any]]:
    """Three entries in Kiln's legacy shape; ``secret=None`` leaves api_key_env out."""
    entries: dict[str, dict[str, Any]] = {
        "big@vllm": {
            "alias": "big@vllm",
            "kind": "remote",
            "provider": "vllm",
            "model_id": "org/big",
            "max_top_k": 20,
            "vocab_size": 151936,
            "supports_full_vocab": False,
            "tokenizer_hash": "sha256:" + "a" * 64,
            "url": "https://teacher.example/v1",
            "api_key_env": secret,
            "notes": "carried over\twith a tab",
            "adapter": None,
        },
        "small": {
            "alias": "small",
            "kind": "local",
            "provider": None,
            "model_id": "org/small",
            "max_top_k": None,
            "vocab_size": None,
            "supports_full_vocab": None,
            "tokenizer_hash": None,
            "url": None,
            "api_key_env": None,
            "notes": None,
            "adapter": "lora-a",
        },
        "fix": {"alias": "fix", "kind": "fixture", "model_id": "fixture-model", "identity": None},
    }
    if secret is None:
        for entry in entries.values():
            entry.pop("api_key_env", None)
    return entries


def stripped(doc: dict[str, dict[str, Any]]) -> bytes:
    """The exact bytes the import writes back."""
    clean = {a: {k: v for k, v in e.items() if k != "api_key_env"} for a, e in doc.items()}
    return (json.dumps(clean, indent=2, ensure_ascii=False) + "\n").encode()


def write_registry(path: Path, doc: object, mode: int = 0o640) -> Path:
    path.write_text(json.dumps(doc, indent=4), encoding="utf-8")
    path.chmod(mode)
    return path


def teacher_rows(database: Path) -> list[tuple[Any, ...]]:
    """The teachers table of the registry whose SQLite file would be ``database``."""
    return fetch(
        database,
        "SELECT alias, kind, provider, model_id, url, credential_id, notes, adapter, "
        "identity_json, status, status_message, created_at, updated_at FROM teachers "
        "ORDER BY alias",
    )


def temp_leftovers(directory: Path) -> list[Path]:
    return sorted(directory.glob(".*.kiln-import.tmp"))


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    eng = open_registry_database(tmp_path / "registry.db")  # either test backend
    upgrade_to_head(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


@pytest.fixture
def registry(tmp_path: Path) -> Path:
    return write_registry(tmp_path / "teachers.json", legacy_registry())


def test_import_strips_api_key_env_and_rewrites_atomically(
    registry: Path,
    sessions: sessionmaker[Session],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    inode = registry.stat().st_ino
    result = import_legacy_registry(registry, sessions)
    assert result.imported == ("big@vllm", "small", "fix")
    assert (result.already_present, result.stripped_entries, result.rewritten) == ((), 2, True)
    assert registry.read_bytes() == stripped(legacy_registry())
    assert stat.S_IMODE(registry.stat().st_mode) == 0o640
    assert registry.stat().st_ino != inode  # replaced by rename, not rewritten in place
    assert temp_leftovers(tmp_path) == []
    rows = teacher_rows(tmp_path / "registry.db")
    assert [row[:10] for row in rows] == [
        ("big@vllm", "remote", "vllm", "org/big", "https://teacher.example/v1", None,
         "carried over\twith a tab", None, None, "legacy_unverified"),
        ("fix", "fixture", None, "fixture-model", None, None, None, None, None,
         "configured"),
        ("small", "local", None, "org/small", None, None, None, "lora-a", None,
         "legacy_unverified"),
    ]  # fmt: skip
    # Only the entries that carried api_key_env (even null) become unusable; the
    # current-format fixture keeps the status Kiln gives it.
    assert [row[10] for row in rows] == [LEGACY_STATUS_MESSAGE, None, LEGACY_STATUS_MESSAGE]
    assert SECRET not in caplog.text and "imported 3 teacher(s)" in caplog.text
    for file in tmp_path.iterdir():
        assert SECRET.encode() not in file.read_bytes(), file


def test_running_the_import_twice_is_a_no_op(
    registry: Path, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    import_legacy_registry(registry, sessions)
    before = (registry.read_bytes(), registry.stat().st_mtime_ns, registry.stat().st_ino)
    rows = teacher_rows(tmp_path / "registry.db")
    again = import_legacy_registry(registry, sessions)
    assert again.imported == () and again.already_present == ("big@vllm", "small", "fix")
    assert (again.stripped_entries, again.rewritten) == (0, False)
    assert (registry.read_bytes(), registry.stat().st_mtime_ns, registry.stat().st_ino) == before
    assert teacher_rows(tmp_path / "registry.db") == rows


def test_a_file_without_api_key_env_is_imported_and_left_alone(
    tmp_path: Path, sessions: sessionmaker[Session]
) -> None:
    path = write_registry(tmp_path / "teachers.json", legacy_registry(secret=None))
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    result = import_legacy_registry(path, sessions)
    assert (len(result.imported), result.rewritten) == (3, False)
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    rows = teacher_rows(tmp_path / "registry.db")
    assert [(row[0], row[9], row[10]) for row in rows] == [
        ("big@vllm", "legacy_unverified", LEGACY_NO_IDENTITY_MESSAGE),
        ("fix", "configured", None),
        ("small", "legacy_unverified", LEGACY_NO_IDENTITY_MESSAGE),
    ]


def test_an_alias_registered_again_is_not_touched(
    registry: Path, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    with unit_of_work(sessions) as session:
        TeacherRepository(session).insert(
            TeacherRow(alias="small", kind="fixture", model_id="new", status="configured")
        )
    result = import_legacy_registry(registry, sessions)
    assert result.already_present == ("small",)
    small = [row for row in teacher_rows(tmp_path / "registry.db") if row[0] == "small"]
    assert small[0][1:4] == ("fixture", None, "new") and small[0][9] == "configured"


def _duplicate_alias() -> str:
    entry = json.dumps({"alias": "a", "kind": "fixture", "api_key_env": SECRET})
    return '{"a": ' + entry + ', "a": ' + entry + "}"


def _duplicate_field() -> str:
    return '{"a": {"alias": "a", "kind": "fixture", "api_key_env": "X", "api_key_env": "Y"}}'


def _entry(**fields: Any) -> str:
    base: dict[str, Any] = {"alias": "a", "kind": "remote", "model_id": "m", "api_key_env": SECRET}
    base.update(fields)
    return json.dumps({"a": base})


BAD_REGISTRIES = {
    "list": ("[]", "legacy.not_object"),
    "string": ('"teachers"', "legacy.not_object"),
    "entry_not_object": ('{"a": ["remote"]}', "legacy.not_object"),
    "entry_null": ('{"a": null}', "legacy.not_object"),
    "duplicate_alias": (_duplicate_alias(), "legacy.duplicate_key"),
    "duplicate_field": (_duplicate_field(), "legacy.duplicate_key"),
    "unknown_field": (_entry(password="hunter2"), "legacy.entry"),
    "bad_kind": (_entry(kind="vllm"), "legacy.entry"),
    "alias_mismatch": (_entry(alias="b"), "legacy.entry"),
    "alias_missing": (
        json.dumps({"a": {"kind": "fixture", "api_key_env": SECRET}}),
        "legacy.entry",
    ),
    "bad_alias_key": (
        json.dumps({"a/probe": {"alias": "a/probe", "kind": "fixture", "model_id": "m"}}),
        "legacy.alias",
    ),
    "blank_alias_key": (
        json.dumps({" ": {"alias": " ", "kind": "fixture", "model_id": "m"}}),
        "legacy.alias",
    ),
    "model_id_missing": (json.dumps({"a": {"alias": "a", "kind": "fixture"}}), "legacy.entry"),
    "model_id_null": (_entry(model_id=None), "legacy.entry"),
    "bad_provider": (_entry(provider="openai"), "legacy.entry"),
    "negative_top_k": (_entry(max_top_k=-1), "legacy.entry"),
    "bad_identity": (_entry(identity={"schema": "kiln.teacher-identity.v1"}), "legacy.entry"),
    "bool_top_k": (_entry(max_top_k=True), "legacy.entry"),
    "float_vocab": (_entry(vocab_size=1.5), "legacy.entry"),
    "string_full_vocab": (_entry(supports_full_vocab="no"), "legacy.entry"),
    "control_char": (_entry(model_id="a\u0007b"), "legacy.entry"),
    "identity_list": (_entry(identity=[]), "legacy.entry"),
    "nan": ('{"a": {"alias": "a", "kind": "remote", "max_top_k": NaN}}', "legacy.json"),
    "truncated": ('{"a": {"alias": "a", "kind": "rem', "legacy.json"),
    "deep": ("[" * 100_000 + "]" * 100_000, "legacy.json"),
    "too_many": (
        json.dumps({f"a{i}": {"alias": f"a{i}", "kind": "fixture"} for i in range(10_001)}),
        "legacy.too_many",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_REGISTRIES))
def test_bad_registries_are_refused_and_left_untouched(
    tmp_path: Path, sessions: sessionmaker[Session], name: str
) -> None:
    text, rule = BAD_REGISTRIES[name]
    path = tmp_path / "teachers.json"
    path.write_text(text, encoding="utf-8")
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    with pytest.raises(InputError) as info:
        import_legacy_registry(path, sessions)
    assert info.value.rule == rule
    assert str(path) in info.value.message and "not changed" in info.value.message
    assert SECRET not in str(info.value) and "hunter2" not in str(info.value)
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    assert teacher_rows(tmp_path / "registry.db") == []
    assert temp_leftovers(tmp_path) == []


def test_not_utf8_is_refused(tmp_path: Path, sessions: sessionmaker[Session]) -> None:
    path = tmp_path / "teachers.json"
    path.write_bytes(b'{"a": {"alias": "a", "kind": "fixture", "notes": "\xff"}}')
    with pytest.raises(InputError) as info:
        import_legacy_registry(path, sessions)
    assert info.value.rule == "legacy.encoding"


def test_an_oversized_file_is_refused_before_reading(
    tmp_path: Path, sessions: sessionmaker[Session]
) -> None:
    path = tmp_path / "teachers.json"
    with path.open("wb") as handle:  # sparse: costs no disk, and is never read
        handle.truncate(MAX_REGISTRY_BYTES + 1)
    with pytest.raises(InputError) as info:
        import_legacy_registry(path, sessions)
    assert info.value.rule == "legacy.size"
    assert path.stat().st_size == MAX_REGISTRY_BYTES + 1


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory", "missing"])
def test_paths_that_are_not_regular_files_are_refused(
    tmp_path: Path, sessions: sessionmaker[Session], registry: Path, kind: str
) -> None:
    path = tmp_path / "other.json"
    if kind == "symlink":
        path.symlink_to(registry)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    before = registry.read_bytes()
    with pytest.raises(InputError) as info:
        import_legacy_registry(path, sessions)
    expected = {"missing": "legacy.open", "directory": "legacy.not_regular"}
    assert info.value.rule == expected.get(kind, "legacy.not_regular")
    assert registry.read_bytes() == before
    assert path.is_symlink() == (kind == "symlink")
    assert teacher_rows(tmp_path / "registry.db") == []


def test_import_configured_runs_only_when_the_setting_is_present(
    tmp_path: Path, sessions: sessionmaker[Session], registry: Path, tiny_model: TinyModel
) -> None:
    plain = tmp_path / "plain.toml"
    plain.write_text(f'[student]\nmodel_path = "{tiny_model.path}"\n', encoding="utf-8")
    assert import_configured_legacy_registry(load_config(plain), sessions) is None
    with_legacy = tmp_path / "kiln.toml"
    with_legacy.write_text(
        '[server]\nlegacy_registry = "teachers.json"\n'
        f'[student]\nmodel_path = "{tiny_model.path}"\n',
        encoding="utf-8",
    )
    result = import_configured_legacy_registry(load_config(with_legacy), sessions)
    assert result is not None and len(result.imported) == 3
    assert registry.read_bytes() == stripped(legacy_registry())


def _kiln(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kiln_registry.cli.main", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_kiln_registry_import_cli(tmp_path: Path, tiny_model: TinyModel) -> None:
    config = tmp_path / "kiln.toml"
    server = "".join(f'{k} = "{v}"\n' for k, v in database_settings(tmp_path / "data").items())
    if not is_postgres():
        server = 'database = "data/registry.db"\n'  # relative to kiln.toml
    config.write_text(
        f'[server]\n{server}[student]\nmodel_path = "{tiny_model.path}"\n', encoding="utf-8"
    )
    registry = write_registry(tmp_path / "teachers.json", legacy_registry())
    done = _kiln("registry", "import", "--config", str(config), str(registry))
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["imported"] == ["big@vllm", "small", "fix"]
    assert (summary["api_key_env_removed_from"], summary["rewritten"]) == (2, True)
    assert SECRET not in done.stdout + done.stderr
    assert len(teacher_rows(tmp_path / "data" / "registry.db")) == 3
    again = _kiln("registry", "import", "--config", str(config), str(registry))
    assert again.returncode == 0 and json.loads(again.stdout)["imported"] == []
    registry.write_text("[]", encoding="utf-8")
    refused = _kiln("registry", "import", "--config", str(config), str(registry))
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith("kiln: error: legacy.not_object: legacy registry ")
    assert refused.stderr.count("\n") == 1


# ---- Over the real HTTP API: both legacy shapes, then a fresh registration ----

KEY_ENV = "KILN_LEGACY_TEST_TEACHER_KEY"
TEACHER_KEY = "sk-legacy-test-teacher-key-4e8b1f"
LEGACY_DDL = (
    "CREATE TABLE teachers (alias TEXT PRIMARY KEY, kind TEXT NOT NULL, provider TEXT, "
    "model_id TEXT, url TEXT, api_key_env TEXT, notes TEXT, spec_json TEXT NOT NULL, "
    "created_at TEXT NOT NULL)"
)


@pytest.fixture(scope="module")
def tls_teacher(tiny_model: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The reference teacher over HTTPS (trustme), guarded by the bearer key in ``KEY_ENV``."""
    import trustme

    from kiln_registry.reference_teacher.app import create_reference_app
    from kiln_registry.reference_teacher.identity import load_reference_teacher
    from tests.api.support import serve_tls

    teacher, _identity = load_reference_teacher(
        tiny_model.path, served_model_id="teacher-tiny", max_top_k=8, max_model_len=64
    )
    ca = trustme.CA()
    directory = tmp_path_factory.mktemp("legacy-tls")
    ca_pem, cert_pem = directory / "ca.pem", directory / "server.pem"
    ca.cert_pem.write_to_path(str(ca_pem))
    ca.issue_cert("localhost").private_key_and_cert_chain_pem.write_to_path(str(cert_pem))
    with serve_tls(create_reference_app(teacher, api_key_env=KEY_ENV), cert_pem) as port:
        yield ca_pem, f"https://localhost:{port}"


def _legacy_sqlite(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(LEGACY_DDL)
        conn.execute(
            "INSERT INTO teachers VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            ("old-sqlite", "remote", "vllm", "teacher-tiny", "https://old.example/v1", SECRET,
             None, '{"api_key_env":"' + SECRET + '"}', "2024-01-01T00:00:00Z"),
        )  # fmt: skip
    finally:
        conn.close()


def _check_legacy_entry(entry: dict[str, Any]) -> None:
    assert entry["status"] == "legacy_unverified" and entry["usable"] is False, entry
    assert entry.get("capabilities") is None and entry["spec"].get("identity") is None
    assert entry.get("identity_revision") is None and entry.get("off_policy_manifest") is None
    assert entry["status_message"] == f"{LEGACY_STATUS_MESSAGE} {RELEASE_NOTE}"  # issue 15


def _check_refusals(http: Any, alias: str, origin: str) -> None:
    from tests.api.support import error_of, remote

    probe = http.post(f"/v1/teachers/{alias}/probe")
    assert probe.status_code == 409 and error_of(probe)["code"] == "teacher_identity_required"
    again = http.post("/v1/teachers", json=remote(alias, origin + "/v1", credential_id="tls"))
    assert again.status_code == 409 and error_of(again)["code"] == "teacher_alias_exists"


@pytest.mark.slow
@pytest.mark.sqlite_only(reason="starts from a legacy (pre-Alembic) SQLite registry file")
@pytest.mark.secret_env(KEY_ENV)
def test_migrated_aliases_over_the_http_api(
    tmp_path: Path, tiny_model: TinyModel, tls_teacher: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.api.support import remote, run_registry, write_config

    ca_pem, origin = tls_teacher
    monkeypatch.setenv(KEY_ENV, TEACHER_KEY)
    _legacy_sqlite(tmp_path / "registry.db")
    registry = write_registry(tmp_path / "teachers.json", legacy_registry())
    config = write_config(
        tmp_path,
        student=tiny_model.path,
        server={"legacy_registry": registry, "teacher_ca_file": ca_pem},
        credentials={"tls": (origin, KEY_ENV)},
    )
    # A legacy SQLite file is behind head: serving it is an upgrade the operator asks for.
    with run_registry(config, upgrade=True) as server, server.client() as http:
        # build_context ran the start-up import of [server] legacy_registry.
        ready = http.get("/ready").json()
        assert ready["legacy_registry"]["status"] == "imported", ready
        listed = http.get("/v1/teachers")
        assert listed.status_code == 200 and SECRET not in listed.text
        entries = {entry["spec"]["alias"]: entry for entry in listed.json()["teachers"]}
        assert sorted(entries) == ["big@vllm", "fix", "old-sqlite", "small"]
        for alias in ("big@vllm", "old-sqlite", "small"):
            _check_legacy_entry(entries[alias])
        # The current-format fixture keeps the status Kiln gives it.
        assert entries["fix"]["status"] == "configured"
        for alias in ("old-sqlite", "big@vllm"):
            _check_refusals(http, alias, origin)
            assert http.delete(f"/v1/teachers/{alias}").json() == {
                "status": "deleted", "alias": alias,
            }  # fmt: skip
            assert http.get(f"/v1/teachers/{alias}").status_code == 404
            # A deleted alias stays reserved until an admin releases it (issue 15).
            assert http.post(f"/v1/admin/aliases/{alias}/release").status_code == 200
            fresh = http.post(
                "/v1/teachers", json=remote(alias, origin + "/v1", credential_id="tls")
            )
            assert fresh.status_code == 200, fresh.text
            body = fresh.json()
            assert (body["status"], body["usable"]) == ("verified", True)
            assert body["capabilities"]["max_top_k"] == 8 and "status_message" not in body
            assert http.post(f"/v1/teachers/{alias}/probe").status_code == 200
        assert http.get("/v1/teachers/small").json()["usable"] is False
    for file in tmp_path.iterdir():
        if file.is_file():
            assert SECRET.encode() not in file.read_bytes(), file


def test_a_broken_file_at_start_up_is_logged_recorded_and_left_alone(
    tmp_path: Path,
    sessions: sessionmaker[Session],
    tiny_model: TinyModel,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from kiln_registry.db.repository import LegacyImportRepository

    path = write_registry(tmp_path / "teachers.json", {"a": {"alias": "a", "kind": "remote"}})
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    config = tmp_path / "kiln.toml"
    config.write_text(
        '[server]\nlegacy_registry = "teachers.json"\n'
        f'[student]\nmodel_path = "{tiny_model.path}"\n',
        encoding="utf-8",
    )
    assert import_configured_legacy_registry(load_config(config), sessions) is None
    assert "legacy registry not imported (legacy.entry)" in caplog.text
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    assert teacher_rows(tmp_path / "registry.db") == []
    with unit_of_work(sessions) as session:
        status = LegacyImportRepository(session).status()
        assert status is not None
        assert (status.outcome, status.source, status.rule) == (
            "refused",
            str(path),
            "legacy.entry",
        )
    plain = tmp_path / "plain.toml"
    plain.write_text(f'[student]\nmodel_path = "{tiny_model.path}"\n', encoding="utf-8")
    import_configured_legacy_registry(load_config(plain), sessions)
    with unit_of_work(sessions) as session:
        assert LegacyImportRepository(session).status() is None
