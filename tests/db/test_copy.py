"""``kiln db copy``: a populated SQLite registry moves to PostgreSQL with every row intact.

The source is built the realistic way: a real registry (its job workers running)
registers aliases against the reference teacher (receipts are written), deletes one
(a reserved alias), scores a small job to completion; ``kiln tokens create`` adds a
token (and an audit event).  The real CLI then copies it into a fresh PostgreSQL
database; every table's rows are compared in primary-key order, and a registry
started on the copy (``state_dir`` = the old folder) serves the alias, the job and
its signed result byte for byte, and hands out fresh ids.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, MetaData, select, text

from kiln_registry.config.database import parse_postgres
from kiln_registry.db.engine import (
    detect_database_shape,
    migrations_dir,
    open_engine,
    read_connection,
    upgrade_to_head,
)
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import run_registry, toml_str
from tests.jobs.conftest import REFERENCE_MODEL_ID, ReferenceTeacher
from tests.jobs.conftest import reference_teacher as reference_teacher  # the fixture
from tests.jobs.harness import Registry
from tests.pg_server import PostgresServer

REPO = Path(__file__).resolve().parents[2]
SEQUENCES = [[5, 9, 11, 40], [7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]
# Tables a populated registry must have rows in, or the comparison proves little.
POPULATED = ("teachers", "probe_receipts", "reserved_aliases", "api_tokens", "audit_events",
             "jobs", "job_sequences", "score_cache")  # fmt: skip


def kiln(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kiln_registry.cli.main", *argv],
        cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def write_toml(path: Path, server: dict[str, str], student: Path, corpora: Path) -> Path:
    lines = ["[server]", *(f"{key} = {toml_str(value)}" for key, value in server.items())]
    lines += ["", "[student]", f"model_path = {toml_str(student)}", ""]
    lines += ["[jobs]", f"corpus_root = {toml_str(corpora)}", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def dump(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows ordered by primary key (PostgreSQL's data version left out)."""
    with read_connection(engine) as conn:
        meta = MetaData()
        meta.reflect(bind=conn)
        tables: dict[str, list[tuple[Any, ...]]] = {}
        for table in meta.sorted_tables:
            if table.name == "kiln_data_version":
                continue
            order = list(table.primary_key.columns) or list(table.columns)
            query = select(*table.columns).order_by(*order)
            tables[table.name] = [tuple(row) for row in conn.execute(query)]
        return tables


def populate(config_path: Path, teacher: ReferenceTeacher) -> dict[str, Any]:
    """Aliases, receipts, a reserved alias and a finished job, through a real registry."""
    with registry(config_path) as reg:
        entry = reg.register("ref@tiny", teacher.url, REFERENCE_MODEL_ID)
        reg.register("second@tiny", teacher.url, REFERENCE_MODEL_ID)
        reg.register("gone@tiny", teacher.url, REFERENCE_MODEL_ID)
        assert reg.http.delete("/v1/teachers/gone@tiny").status_code in (200, 204)
        submitted = reg.submit("ref@tiny", 4, sequences=SEQUENCES)
        assert submitted.status_code == 201, submitted.text
        job = reg.wait(submitted.json()["id"], timeout=120.0)
        assert job["status"] == "succeeded", job
        result = reg.http.get(f"/v1/jobs/{job['id']}/result")
        assert result.status_code == 200
        return {"entry": entry, "job": job, "result": result.content,
                "keys": reg.http.get("/v1/keys").json()}  # fmt: skip


@contextmanager
def registry(config_path: Path) -> Iterator[Registry]:
    """A registry with its job workers (``run_registry`` closes every handle after)."""
    with run_registry(config_path) as server, server.client() as http:
        yield Registry(url=server.url, http=http, ctx=server.ctx)


@contextmanager
def pg_engine(url: str, server: PostgresServer) -> Iterator[Engine]:
    engine = open_engine(parse_postgres(url), password_env=server.password_env)
    try:
        yield engine
    finally:
        engine.dispose()


def test_a_populated_sqlite_registry_moves_to_postgresql_intact(
    tmp_path: Path,
    tiny_model: TinyModel,
    reference_teacher: ReferenceTeacher,
    postgres_server: PostgresServer,
    pg_database: str,
) -> None:
    old = tmp_path / "old"
    old.mkdir()
    (tmp_path / "corpora").mkdir()
    sqlite_config = write_toml(old / "kiln.toml", {"database": str(old / "registry.db")},
                               tiny_model.path, tmp_path / "corpora")  # fmt: skip
    before = populate(sqlite_config, reference_teacher)
    made = kiln("tokens", "create", "--config", str(sqlite_config), "--name", "ci",
                "--scope", "read")  # fmt: skip
    assert made.returncode == 0, made.stderr

    # The CLI from the old folder: a relative SQLite path, the password only by its variable.
    copied = kiln("db", "copy", "--from", "registry.db", "--to", pg_database,
                  "--to-password-env", postgres_server.password_env, cwd=old)  # fmt: skip
    assert copied.returncode == 0, copied.stderr
    summary = json.loads(copied.stdout)
    assert postgres_server.password not in copied.stdout + copied.stderr

    source = open_engine(old / "registry.db")
    try:
        old_rows = dump(source)
    finally:
        source.dispose()
    with pg_engine(pg_database, postgres_server) as target:
        new_rows = dump(target)
    assert all(old_rows[name] for name in POPULATED), {k: len(v) for k, v in old_rows.items()}
    assert new_rows == old_rows  # every table, every row, every byte (alembic_version too)
    assert summary["source"] == str(old / "registry.db") and summary["target"] == pg_database
    assert summary["rows"] == {
        name: len(rows) for name, rows in old_rows.items() if name != "alembic_version"
    }
    assert (
        summary["next_ids"]["probe_receipts"] == max(r[0] for r in old_rows["probe_receipts"]) + 1
    )
    assert "state_dir" in summary["note"]

    pg_config = write_toml(
        tmp_path / "kiln-pg.toml",
        {"database": pg_database, "database_password_env": postgres_server.password_env,
         "state_dir": str(old)},
        tiny_model.path, tmp_path / "corpora",
    )  # fmt: skip
    with registry(pg_config) as reg:
        assert reg.http.get("/v1/teachers/ref@tiny").json() == before["entry"]
        assert reg.http.get("/v1/teachers/gone@tiny").status_code == 404
        job = reg.job(before["job"]["id"])
        assert job == before["job"]
        result = reg.http.get(f"/v1/jobs/{job['id']}/result")
        assert result.status_code == 200 and result.content == before["result"]
        assert reg.http.get("/v1/keys").json() == before["keys"]  # the same signing key
        assert reg.register("third@tiny", reference_teacher.url, REFERENCE_MODEL_ID)
    made = kiln(
        "tokens", "create", "--config", str(pg_config), "--name", "after", "--scope", "read"
    )
    assert made.returncode == 0, made.stderr
    with pg_engine(pg_database, postgres_server) as target:
        after = dump(target)
    # Fresh ids continue past the copied ones: nothing collided, nothing was reused.
    for table in ("probe_receipts", "audit_events"):
        old_ids = {row[0] for row in old_rows[table]}
        new_ids = {row[0] for row in after[table]} - old_ids
        assert new_ids and min(new_ids) > max(old_ids), table


# --- refusals, round trips and rollback (a small registry at head, built directly) ---

PLANTED = "Pw-planted-9Xq2-never-echo"


def head_registry(path: Path, report: str = "{}") -> Path:
    """A SQLite registry at head holding two receipts (one id deleted: a gap)."""
    engine = open_engine(path)
    try:
        upgrade_to_head(engine)
        with engine.begin() as conn:
            for created in ("2026-01-01T00:00:00.000000Z", "2026-01-02T00:00:00.000000Z",
                            "2026-01-03T00:00:00.000000Z"):  # fmt: skip
                conn.execute(
                    text("INSERT INTO probe_receipts (alias, created_at, outcome, report_json) "
                         "VALUES ('a@b', :c, 'passed', :r)"),
                    {"c": created, "r": report},
                )  # fmt: skip
            conn.execute(text("DELETE FROM probe_receipts WHERE id = 3"))
    finally:
        engine.dispose()
    return path


def refused(result: subprocess.CompletedProcess[str], rule: str, *secrets: str) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == "" and f"kiln: error: {rule}:" in result.stderr, result.stderr
    assert all(secret not in result.stderr for secret in secrets if secret)
    return result.stderr


def shape_of(engine: Engine) -> str:
    with read_connection(engine) as conn:
        return detect_database_shape(conn)


def test_copies_round_trip_and_a_non_empty_target_is_refused(
    tmp_path: Path, postgres_server: PostgresServer, pg_database: str
) -> None:
    source = head_registry(tmp_path / "registry.db")
    env = postgres_server.password_env
    first = kiln("db", "copy", "--from", f"sqlite:///{source}", "--to", pg_database,
                 "--to-password-env", env)  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["next_ids"]["probe_receipts"] == 4  # id 3 never again
    again = kiln("db", "copy", "--from", str(source), "--to", pg_database, "--to-password-env", env)
    message = refused(again, "db.copy_target_not_empty", postgres_server.password)
    assert pg_database in message and "empty database" in message

    back = tmp_path / "back.db"  # PostgreSQL to SQLite: the same rows and the same counter
    home = kiln("db", "copy", "--from", pg_database, "--from-password-env", env, "--to", str(back))
    assert home.returncode == 0, home.stderr
    assert postgres_server.password not in home.stdout + home.stderr
    with sqlite3.connect(back) as db:
        seq = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'probe_receipts'").fetchall()
    assert seq == [(3,)]
    engines = [open_engine(source), open_engine(back)]
    try:
        original, returned = (dump(engine) for engine in engines)
    finally:
        for engine in engines:
            engine.dispose()
    assert returned == original and len(original["probe_receipts"]) == 2
    refused(kiln("db", "copy", "--from", str(source), "--to", str(back)),
            "db.copy_target_not_empty")  # fmt: skip


def test_a_target_with_any_table_is_refused_untouched(
    tmp_path: Path, postgres_server: PostgresServer, pg_database: str
) -> None:
    source = head_registry(tmp_path / "registry.db")
    with postgres_server.admin(parse_postgres(pg_database).name) as admin:
        admin.execute("CREATE TABLE notes (body TEXT)")
        admin.execute("INSERT INTO notes VALUES ('keep me')")
    result = kiln("db", "copy", "--from", str(source), "--to", pg_database,
                  "--to-password-env", postgres_server.password_env)  # fmt: skip
    refused(result, "db.copy_target_not_empty", postgres_server.password)
    with postgres_server.admin(parse_postgres(pg_database).name) as admin:
        assert admin.execute("SELECT body FROM notes").fetchall() == [("keep me",)]
        tables = admin.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        assert tables.fetchall() == [("notes",)]


def test_a_source_behind_head_or_missing_is_refused_before_the_target_exists(
    tmp_path: Path,
) -> None:
    old = tmp_path / "old.db"
    engine = open_engine(old)
    try:
        config = Config()
        config.set_main_option("script_location", str(migrations_dir()))
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, "0006_worker_leases")
    finally:
        engine.dispose()
    target = tmp_path / "new.db"
    message = refused(kiln("db", "copy", "--from", str(old), "--to", str(target)), "db.revision")
    assert "0006_worker_leases" in message and "kiln db upgrade" in message
    missing = kiln("db", "copy", "--from", str(tmp_path / "nope.db"), "--to", str(target))
    assert "nope.db does not exist" in refused(missing, "db.path")
    assert not target.exists() and not (tmp_path / "nope.db").exists()


def test_bad_spellings_and_passwords_are_refused_without_echoing_a_secret(
    tmp_path: Path, postgres_server: PostgresServer, pg_database: str
) -> None:
    source = str(head_registry(tmp_path / "registry.db"))
    db = parse_postgres(pg_database)
    with_password = f"postgresql+psycopg://kiln:{PLANTED}@127.0.0.1:{db.port}/{db.name}"
    for flags in (["--from", source, "--to", with_password],
                  ["--from", with_password, "--to", str(tmp_path / "t.db")]):  # fmt: skip
        message = refused(kiln("db", "copy", *flags), "db.copy_location", PLANTED)
        assert "carries a password" in message and "database_password_env" in message
    message = refused(kiln("db", "copy", "--from", source, "--to", "mysql://u@h/db"),
                      "db.copy_location")  # fmt: skip
    assert "'mysql' is not supported" in message
    unset = kiln("db", "copy", "--from", source, "--to", pg_database,
                 "--to-password-env", "KILN_COPY_TEST_UNSET")  # fmt: skip
    assert "KILN_COPY_TEST_UNSET" in refused(unset, "db.password_env", postgres_server.password)
    wrong = kiln("db", "copy", "--from", source, "--to", str(tmp_path / "t.db"),
                 "--to-password-env", postgres_server.password_env)  # fmt: skip
    assert "only to a PostgreSQL" in refused(wrong, "db.password_env", postgres_server.password)
    assert not (tmp_path / "t.db").exists()


def test_a_failed_copy_commits_nothing_not_even_the_schema(
    tmp_path: Path, postgres_server: PostgresServer, pg_database: str
) -> None:
    # A real failure mid-copy: PostgreSQL text cannot hold NUL, which SQLite stores.
    source = head_registry(tmp_path / "registry.db", report='{"x": "a\x00b"}')
    env = postgres_server.password_env
    failed = kiln(
        "db", "copy", "--from", str(source), "--to", pg_database, "--to-password-env", env
    )
    assert "nothing was committed" in refused(failed, "db.copy_failed", postgres_server.password)
    target = open_engine(parse_postgres(pg_database), password_env=env)
    try:
        assert shape_of(target) == "empty"  # no table, not even alembic_version's rows
        with read_connection(target) as conn:
            assert conn.execute(text("SELECT count(*) FROM pg_tables WHERE schemaname = "
                                     "current_schema()")).scalar() == 0  # fmt: skip
    finally:
        target.dispose()
    with sqlite3.connect(source) as db:
        db.execute("UPDATE probe_receipts SET report_json = '{}'")
    fixed = kiln("db", "copy", "--from", str(source), "--to", pg_database, "--to-password-env", env)
    assert fixed.returncode == 0, fixed.stderr
    assert json.loads(fixed.stdout)["rows"]["probe_receipts"] == 2
