"""The Alembic history: its structure, data kept across upgrades, models in step with it."""

from __future__ import annotations

import itertools
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

import kiln_registry.auth.models
import kiln_registry.jobs.core.models  # noqa: F401  (registers the job tables on the metadata)
from kiln_registry.db.engine import (
    current_revision,
    head_revision,
    migrations_dir,
    open_engine,
    upgrade_to_head,
)
from kiln_registry.db.models import metadata

REPO_ROOT = Path(__file__).resolve().parents[2]
REVISION_ID = re.compile(r"^[0-9]{4}_[a-z0-9_]+$")

# Rows written with the columns of revision 0001 only, as an old server would.
TEACHERS_0001 = [
    (
        "remote-a",
        "remote",
        "openai",
        "org/model-a",
        "https://a.example/v1",
        "cred-a",
        "notes é",
        None,
        None,
        '{"schema":"kiln.teacher-identity.v1"}',
        "sha256:" + "0" * 64,
        "verified",
        None,
        "2025-01-01T00:00:00.000000Z",
        "2025-01-02T00:00:00.000000Z",
    ),
    (
        "local-b",
        "local",
        None,
        "org/model-b",
        None,
        None,
        None,
        "adapter-x",
        "cpu-small",
        None,
        None,
        "configured",
        "waiting for probe",
        "2025-01-03T00:00:00.000000Z",
        "2025-01-03T00:00:00.000000Z",
    ),
]
RECEIPTS_0001 = [
    ("remote-a", "2025-01-02T00:00:00.000000Z", "passed", "sha256:" + "0" * 64, '{"ok":true}'),
    ("gone-alias", "2025-01-01T00:00:00.000000Z", "failed", None, '{"error":"timeout"}'),
]


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    eng = open_engine(tmp_path / "registry.db")
    yield eng
    eng.dispose()


def _script() -> ScriptDirectory:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    return ScriptDirectory.from_config(config)


def _upgrade_to(engine: Engine, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def _dump(path: Path) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    conn = sqlite3.connect(path)
    try:
        teachers = conn.execute(
            "SELECT alias, kind, provider, model_id, url, credential_id, notes, adapter, "
            "launch_profile, identity_json, identity_digest, status, status_message, "
            "created_at, updated_at FROM teachers ORDER BY created_at"
        ).fetchall()
        receipts = conn.execute(
            "SELECT alias, created_at, outcome, identity_digest, report_json "
            "FROM probe_receipts ORDER BY id"
        ).fetchall()
    finally:
        conn.close()
    return teachers, receipts


def test_history_is_linear_with_a_single_head() -> None:
    script = _script()
    assert len(script.get_heads()) == 1
    assert len(script.get_bases()) == 1
    revisions = list(script.walk_revisions())
    for rev in revisions:
        assert REVISION_ID.match(rev.revision), rev.revision
        assert not rev.branch_labels and not rev.dependencies
        assert rev.down_revision is None or isinstance(rev.down_revision, str)
        assert rev.path is not None and Path(rev.path).stem == rev.revision
    # walk_revisions goes head to base: each revises the next one.
    for newer, older in itertools.pairwise(revisions):
        assert newer.down_revision == older.revision
    assert [r.revision for r in revisions[-2:]] == ["0001_initial", "0000_legacy_base"]
    assert head_revision() == revisions[0].revision


def test_a_populated_database_at_0001_is_intact_after_upgrading_to_head(
    engine: Engine, tmp_path: Path
) -> None:
    _upgrade_to(engine, "0001_initial")
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO teachers (alias, kind, provider, model_id, url, credential_id, notes, "
            "adapter, launch_profile, identity_json, identity_digest, status, status_message, "
            "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            TEACHERS_0001,
        )
        conn.exec_driver_sql(
            "INSERT INTO probe_receipts (alias, created_at, outcome, identity_digest, "
            "report_json) VALUES (?, ?, ?, ?, ?)",
            RECEIPTS_0001,
        )
    before = _dump(tmp_path / "registry.db")
    assert upgrade_to_head(engine) == head_revision()
    assert _dump(tmp_path / "registry.db") == before
    assert before == (sorted(TEACHERS_0001, key=lambda row: str(row[13])), RECEIPTS_0001)


def test_models_match_the_migrated_schema(engine: Engine) -> None:
    upgrade_to_head(engine)
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, metadata) == []


def test_downgrade_to_base_and_back(engine: Engine) -> None:
    upgrade_to_head(engine)
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "base")
    assert current_revision(engine) is None
    assert upgrade_to_head(engine) == head_revision()


def test_alembic_by_hand_with_the_repository_ini(tmp_path: Path) -> None:
    db = tmp_path / "by-hand.db"
    ini = str(REPO_ROOT / "alembic.ini")
    result = subprocess.run(
        [sys.executable, "-m", "alembic", "-c", ini, "-x", f"db={db}", "upgrade", "head"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    eng = open_engine(db)
    try:
        assert current_revision(eng) == head_revision()
    finally:
        eng.dispose()


def _legacy_imports(path: Path) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT alias, source FROM legacy_imports ORDER BY alias").fetchall()
    finally:
        conn.close()


def test_0003_on_an_empty_database_creates_empty_legacy_tables(
    engine: Engine, tmp_path: Path
) -> None:
    upgrade_to_head(engine)
    assert _legacy_imports(tmp_path / "registry.db") == []
    conn = sqlite3.connect(tmp_path / "registry.db")
    try:
        assert conn.execute("SELECT COUNT(*) FROM legacy_import_status").fetchone() == (0,)
        with pytest.raises(sqlite3.IntegrityError):  # at most one status row
            conn.execute(
                "INSERT INTO legacy_import_status VALUES (2, 'p', 'imported', NULL, 'm', 't')"
            )
    finally:
        conn.close()


def test_0003_on_a_populated_database_records_the_legacy_rows_as_imported(
    engine: Engine, tmp_path: Path
) -> None:
    from kiln_registry.db.legacy import LEGACY_STATUS_MESSAGE

    _upgrade_to(engine, "0002_jobs")
    legacy = ("old", "remote", None, "m", None, None, None, None, None, None, None,
              "legacy_unverified", LEGACY_STATUS_MESSAGE, "2024-01-01T00:00:00.000000Z",
              "2024-01-01T00:00:00.000000Z")  # fmt: skip
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO teachers (alias, kind, provider, model_id, url, credential_id, notes, "
            "adapter, launch_profile, identity_json, identity_digest, status, status_message, "
            "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [*TEACHERS_0001, legacy],
        )
    before = _dump(tmp_path / "registry.db")
    assert upgrade_to_head(engine) == head_revision()
    assert _dump(tmp_path / "registry.db") == before
    # Only the row an import (or the 0001 conversion) created is recorded as imported.
    assert _legacy_imports(tmp_path / "registry.db") == [("old", None)]
