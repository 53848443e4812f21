"""The pre-Alembic SQLite registry: recognised exactly, converted in one transaction, scrubbed.

Every legacy file here is built by the test with the literal legacy DDL and a
planted ``api_key_env`` value; afterwards the value must be gone from the
rows, the schema and the bytes of the database, ``-wal`` and ``-shm`` files.
"""

from __future__ import annotations

import importlib.util
import shutil
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine

from kiln_registry.db.engine import (
    current_revision,
    detect_database_shape,
    head_revision,
    migrations_dir,
    open_engine,
    upgrade_to_head,
)
from kiln_registry.db.legacy import LEGACY_BASE_REVISION, LEGACY_STATUS_MESSAGE
from kiln_registry.domain.errors import ConfigError

LEGACY_DDL = (
    "CREATE TABLE teachers (alias TEXT PRIMARY KEY, kind TEXT NOT NULL, provider TEXT, "
    "model_id TEXT, url TEXT, api_key_env TEXT, notes TEXT, spec_json TEXT NOT NULL, "
    "created_at TEXT NOT NULL)"
)
SECRET = "LEGACY_PLANTED_SECRET_9f3e1c77ab"
SPEC_SECRET = "SPEC_PLANTED_SECRET_51d0c2aa84"
LEGACY_ROWS = [
    (
        "big@vllm",
        "remote",
        "vllm",
        "org/big",
        "https://teacher.example/v1",
        SECRET,
        "the big one",
        '{"alias":"big@vllm","api_key_env":"' + SPEC_SECRET + '","max_top_k":20}',
        "2024-05-01T00:00:00Z",
    ),
    (
        "small",
        "local",
        None,
        "org/small",
        None,
        None,
        None,
        '{"adapter":"lora-a","api_key_env":null}',
        "2024-05-02T00:00:00Z",
    ),
    ("fix", "fixture", None, "fixture-model", None, SECRET, None, "not json {", "2024-05-03"),
]


def _write_legacy(path: Path, rows: Sequence[tuple[object, ...]], *, wal: bool = False) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        if wal:
            conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(LEGACY_DDL)
        conn.execute("BEGIN")  # one transaction: one fsync, not one per row
        conn.executemany("INSERT INTO teachers VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        conn.execute("COMMIT")
    finally:
        conn.close()


def _files(path: Path) -> list[Path]:
    return [Path(f"{path}{suffix}") for suffix in ("", "-wal", "-shm", "-journal")]


def _secret_hits(path: Path) -> dict[str, int]:
    hits: dict[str, int] = {}
    for file in _files(path):
        if file.exists():
            data = file.read_bytes()
            hits[file.name] = data.count(SECRET.encode()) + data.count(SPEC_SECRET.encode())
    return hits


def _query(path: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        return list(conn.execute(sql).fetchall())
    finally:
        conn.close()


@pytest.fixture
def legacy_db(tmp_path: Path) -> Path:
    path = tmp_path / "registry.db"
    _write_legacy(path, LEGACY_ROWS)
    return path


@pytest.fixture
def engine(legacy_db: Path) -> Iterator[Engine]:
    eng = open_engine(legacy_db)
    yield eng
    eng.dispose()


def _load_revision(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, migrations_dir() / "versions" / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _refused_upgrade(path: Path) -> ConfigError:
    """The refusal of an upgrade of the database at ``path`` (which must be refused)."""
    eng = open_engine(path)
    try:
        with pytest.raises(ConfigError) as info:
            upgrade_to_head(eng)
    finally:
        eng.dispose()
    return info.value


def test_frozen_copies_of_the_rules_stay_equal() -> None:
    assert _load_revision("0000_legacy_base.py").LEGACY_TEACHERS_DDL == LEGACY_DDL
    initial = _load_revision("0001_initial.py")
    assert initial.LEGACY_TEACHERS_DDL == LEGACY_DDL
    assert initial.LEGACY_STATUS_MESSAGE == LEGACY_STATUS_MESSAGE
    assert initial.down_revision == LEGACY_BASE_REVISION
    assert _load_revision("0003_legacy_imports.py").LEGACY_STATUS_MESSAGE == LEGACY_STATUS_MESSAGE


def test_the_planted_values_are_in_the_legacy_file(legacy_db: Path) -> None:
    assert _secret_hits(legacy_db)["registry.db"] >= 3


def test_a_legacy_registry_upgrades_to_head_in_place(engine: Engine, legacy_db: Path) -> None:
    with engine.connect() as conn:
        assert detect_database_shape(conn) == "legacy_v0"
    assert upgrade_to_head(engine) == head_revision()
    rows = _query(
        legacy_db,
        "SELECT alias, kind, provider, model_id, url, credential_id, notes, adapter, "
        "identity_json, identity_digest, status, status_message, created_at FROM teachers "
        "ORDER BY alias",
    )
    message = LEGACY_STATUS_MESSAGE
    assert rows == [
        ("big@vllm", "remote", "vllm", "org/big", "https://teacher.example/v1", None,
         "the big one", None, None, None, "legacy_unverified", message, "2024-05-01T00:00:00Z"),
        ("fix", "fixture", None, "fixture-model", None, None, None, None, None, None,
         "legacy_unverified", message, "2024-05-03"),
        ("small", "local", None, "org/small", None, None, None, "lora-a", None, None,
         "legacy_unverified", message, "2024-05-02T00:00:00Z"),
    ]  # fmt: skip
    columns = [row[1] for row in _query(legacy_db, "PRAGMA table_info(teachers)")]
    assert "api_key_env" not in columns and "spec_json" not in columns
    assert "credential_id" in message and "delete" in message
    assert _query(legacy_db, "SELECT COUNT(*) FROM probe_receipts") == [(0,)]


def test_the_old_value_is_gone_from_every_file(engine: Engine, legacy_db: Path) -> None:
    upgrade_to_head(engine)
    # While the engine (a running server) still holds its connections ...
    assert set(_secret_hits(legacy_db).values()) == {0}
    assert Path(f"{legacy_db}-wal").stat().st_size == 0  # checkpointed and truncated
    engine.dispose()
    # ... and after it let go.
    assert set(_secret_hits(legacy_db).values()) == {0}
    assert all(SECRET not in str(row) for row in _query(legacy_db, "SELECT * FROM sqlite_master"))


def test_a_legacy_file_in_wal_mode_with_uncheckpointed_frames(tmp_path: Path) -> None:
    source = tmp_path / "source.db"
    conn = sqlite3.connect(source, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute(LEGACY_DDL)
    conn.executemany("INSERT INTO teachers VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", LEGACY_ROWS)
    copy = tmp_path / "registry.db"
    # A copy taken while the writer is open: the rows live only in the -wal file.
    shutil.copyfile(source, copy)
    shutil.copyfile(f"{source}-wal", f"{copy}-wal")
    conn.close()
    assert _secret_hits(copy)["registry.db-wal"] >= 3
    eng = open_engine(copy)
    try:
        assert upgrade_to_head(eng) == head_revision()
    finally:
        eng.dispose()
    assert set(_secret_hits(copy).values()) == {0}
    assert len(_query(copy, "SELECT alias FROM teachers")) == 3


def test_upgrading_twice_is_a_no_op(engine: Engine, legacy_db: Path) -> None:
    upgrade_to_head(engine)
    schema = _query(legacy_db, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
    rows = _query(legacy_db, "SELECT * FROM teachers ORDER BY alias")
    assert upgrade_to_head(engine) == head_revision()
    assert _query(legacy_db, "SELECT type, name, sql FROM sqlite_master ORDER BY name") == schema
    assert _query(legacy_db, "SELECT * FROM teachers ORDER BY alias") == rows


def test_an_empty_legacy_table_converts_too(tmp_path: Path) -> None:
    path = tmp_path / "empty-legacy.db"
    _write_legacy(path, [])
    eng = open_engine(path)
    try:
        assert upgrade_to_head(eng) == head_revision()
    finally:
        eng.dispose()
    assert _query(path, "SELECT COUNT(*) FROM teachers") == [(0,)]


def test_every_connection_zeroes_deleted_content(engine: Engine) -> None:
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA secure_delete").scalar() == 1


@pytest.mark.parametrize(
    ("bad_row", "rule"),
    [
        (("ok", "vllm-remote", None, None, None, SECRET, None, "{}", "t"), "legacy.kind"),
        (("has/probe", "remote", None, None, None, SECRET, None, "{}", "t"), "legacy.alias"),
        (("  ", "remote", None, None, None, SECRET, None, "{}", "t"), "legacy.alias"),
        (("a\x00b", "remote", None, None, None, SECRET, None, "{}", "t"), "legacy.alias"),
        ((None, "remote", None, None, None, SECRET, None, "{}", "t"), "legacy.alias"),
        ((b"blob-alias", "remote", None, None, None, SECRET, None, "{}", "t"), "legacy.alias"),
        (("a" * 257, "remote", None, None, None, SECRET, None, "{}", "t"), "legacy.alias"),
    ],
)
def test_rows_that_cannot_be_carried_refuse_the_upgrade_and_change_nothing(
    tmp_path: Path, bad_row: tuple[object, ...], rule: str
) -> None:
    path = tmp_path / "registry.db"
    _write_legacy(path, [*LEGACY_ROWS, bad_row])
    before = _query(path, "SELECT * FROM teachers ORDER BY rowid")
    eng = open_engine(path)
    try:
        with pytest.raises(ConfigError) as info:
            upgrade_to_head(eng)
        assert current_revision(eng) is None
        with eng.connect() as conn:
            assert detect_database_shape(conn) == "legacy_v0"
    finally:
        eng.dispose()
    assert info.value.rule == rule
    assert str(path) in info.value.message and "nothing was changed" in info.value.message
    assert SECRET not in str(info.value)
    assert _query(path, "SELECT * FROM teachers ORDER BY rowid") == before


@pytest.mark.parametrize(
    "statements",
    [
        [LEGACY_DDL.replace("notes TEXT", "notes TEXT, extra TEXT")],
        [LEGACY_DDL.replace("kind TEXT NOT NULL", "kind TEXT")],
        [LEGACY_DDL.replace("url TEXT", "url BLOB")],
        [LEGACY_DDL.replace("alias TEXT PRIMARY KEY", "alias TEXT")],
        [LEGACY_DDL, "CREATE INDEX ix_kind ON teachers (kind)"],
        [LEGACY_DDL, "CREATE VIEW v AS SELECT alias FROM teachers"],
        [
            LEGACY_DDL,
            "CREATE TRIGGER t AFTER DELETE ON teachers BEGIN SELECT 1; END",
        ],
    ],
)
def test_near_legacy_schemas_are_not_touched(tmp_path: Path, statements: list[str]) -> None:
    path = tmp_path / "registry.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in statements:
        conn.execute(statement)
    conn.close()
    schema = _query(path, "SELECT sql FROM sqlite_master ORDER BY name")
    assert _refused_upgrade(path).rule == "db.unrecognised"
    assert _query(path, "SELECT sql FROM sqlite_master ORDER BY name") == schema


def test_a_stamped_legacy_base_from_a_newer_release_is_refused(legacy_db: Path) -> None:
    conn = sqlite3.connect(legacy_db, isolation_level=None)
    conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
    conn.execute("INSERT INTO alembic_version VALUES ('0042_from_the_future')")
    conn.close()
    assert _refused_upgrade(legacy_db).rule == "db.newer_revision"
    assert _query(legacy_db, "SELECT api_key_env FROM teachers WHERE alias = 'fix'") == [(SECRET,)]


def test_downgrade_to_the_legacy_base_restores_the_legacy_shape(engine: Engine) -> None:
    upgrade_to_head(engine)
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, LEGACY_BASE_REVISION)
    assert current_revision(engine) == LEGACY_BASE_REVISION
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT alias, kind, api_key_env, json_extract(spec_json, '$.adapter') "
            "FROM teachers ORDER BY alias"
        ).all()
    assert [tuple(row) for row in rows] == [
        ("big@vllm", "remote", None, None),
        ("fix", "fixture", None, None),
        ("small", "local", None, "lora-a"),
    ]
    assert upgrade_to_head(engine) == head_revision()


def test_more_legacy_rows_than_the_bound_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "registry.db"
    rows = [(f"a{i}", "fixture", None, None, None, None, None, "{}", "t") for i in range(10_001)]
    _write_legacy(path, rows)
    assert _refused_upgrade(path).rule == "legacy.too_many"
    assert _query(path, "SELECT COUNT(*) FROM teachers") == [(10_001,)]
