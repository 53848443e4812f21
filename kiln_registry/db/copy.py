"""``kiln db copy``: move a registry's rows into a new, empty database (SQLite to PostgreSQL).

``copy_database(source, target)`` reads a registry database that is exactly
at this release's head revision and writes every row of every table into a
target that has no tables at all, in ONE target transaction:

1. the target's shape is checked (``detect_database_shape == "empty"``;
   anything else is refused with ``db.copy_target_not_empty``);
2. the schema is created there by the same Alembic revisions
   (``upgrade_connection``), rows those revisions inserted are deleted;
3. every table is copied in foreign-key order, read in primary-key order in
   pages of ``BATCH_ROWS`` (one page in memory at a time) and inserted with
   one ``executemany`` per page;
4. each autoincrement counter is carried over (PostgreSQL: the serial
   sequence set past the highest id, and past any id the source already
   handed out and deleted; SQLite: ``sqlite_sequence``), and on PostgreSQL
   ``kiln_data_version`` is bumped so no cache survives the copy;
5. the per-table row counts of source and target are compared; only then
   does the transaction commit.  Any failure rolls everything back, the
   schema too: the target is left without tables, ready for another try.

The source is only read, in one deferred (never write-locking) transaction,
so the copy is a consistent snapshot (PostgreSQL: ``REPEATABLE READ READ
ONLY``).  Stop the registry before copying all the same: writes committed to
the source after the snapshot are not in the target.  Files beside a SQLite
database (the corpus-signing key, job results, local-teacher state) are not
rows: ``FILES_NOTE`` tells the operator to point ``[server] state_dir`` at
them.  Nothing here reads or prints a password.

Imports: the standard library, SQLAlchemy and ``kiln_registry.db``/``domain``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from sqlalchemy import (
    Connection,
    Engine,
    Integer,
    MetaData,
    Table,
    delete,
    func,
    insert,
    select,
    text,
)
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.exc import SQLAlchemyError

from kiln_registry.config.database import PostgresDatabase, database_value
from kiln_registry.db.engine import (
    database_label,
    detect_database_shape,
    read_connection,
    upgrade_connection,
)
from kiln_registry.db.opening import require_head
from kiln_registry.domain.errors import ConfigError

BATCH_ROWS: Final = 500
MAX_TABLES: Final = 200
# Alembic's bookkeeping is written by the upgrade itself; the data version is per database.
SKIPPED_TABLES: Final = frozenset({"alembic_version", "kiln_data_version"})
FILES_NOTE: Final = (
    "files are not rows: the corpus-signing key, job results and local-teacher state stay "
    "beside the old database; set [server] state_dir to that folder (or copy them there)"
)
_MAX_ERROR_CHARS: Final = 300


@dataclass(frozen=True)
class CopySummary:
    """What ``kiln db copy`` prints: never a password."""

    source: str
    target: str
    revision: str
    rows: dict[str, int]
    next_ids: dict[str, int]

    def as_json(self) -> dict[str, object]:
        return {
            "source": self.source,
            "target": self.target,
            "revision": self.revision,
            "rows": self.rows,
            "total_rows": sum(self.rows.values()),
            "next_ids": self.next_ids,
            "note": FILES_NOTE,
        }


def parse_location(value: str, *, flag: str, cwd: Path) -> Path | PostgresDatabase:
    """A ``--from``/``--to`` value by the ``[server] database`` rules; paths relative to ``cwd``."""
    try:
        parsed = database_value(value)
    except ValueError as exc:  # the message never repeats the value (it may hold a password)
        raise ConfigError(
            f"{flag}: {exc}",
            rule="db.copy_location",
            hint="give a SQLite path, sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DB",
        ) from None
    if isinstance(parsed, PostgresDatabase):
        return parsed
    if not isinstance(parsed, str) or not parsed:
        raise ConfigError(f"{flag}: no database named", rule="db.copy_location")
    return cwd / Path(parsed)


def copy_database(source: Engine, target: Engine) -> CopySummary:
    """Copy every row of ``source`` (at head) into the empty ``target``; one transaction."""
    revision = require_head(source)
    where = database_label(target)
    try:
        with read_connection(source) as src:
            if src.dialect.name == "postgresql":
                src.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
            with target.begin() as dst:
                _require_empty(dst, where)
                if upgrade_connection(dst) != revision:
                    raise ConfigError(
                        f"the target {where} was created at another revision than {revision}",
                        rule="db.copy_revision",
                    )
                rows, next_ids = _copy_rows(src, dst)
    except SQLAlchemyError as exc:
        detail = str(getattr(exc, "orig", None) or type(exc).__name__).strip().splitlines()
        raise ConfigError(
            f"copying into {where} failed ({detail[0][:_MAX_ERROR_CHARS] if detail else ''}); "
            "nothing was committed: the target still has no tables",
            rule="db.copy_failed",
            hint="fix the cause and run `kiln db copy` again",
        ) from None
    return CopySummary(database_label(source), where, revision, rows, next_ids)


def _require_empty(dst: Connection, where: str) -> None:
    if detect_database_shape(dst) != "empty":
        raise ConfigError(
            f"the target database {where} is not empty: `kiln db copy` writes only into a "
            "database without tables",
            rule="db.copy_target_not_empty",
            hint="create a new empty database (PostgreSQL: CREATE DATABASE ... OWNER ...; "
            "SQLite: a new path) and copy into it",
        )


def _reflect(conn: Connection) -> MetaData:
    names = [n for n in sa_inspect(conn).get_table_names() if n not in SKIPPED_TABLES]
    if len(names) > MAX_TABLES:
        raise ConfigError(
            f"the database {database_label(conn.engine)} has more than {MAX_TABLES} tables; "
            "it is not a registry database",
            rule="db.copy_tables",
        )
    metadata = MetaData()
    metadata.reflect(bind=conn, only=names)
    return metadata


def _copy_rows(src: Connection, dst: Connection) -> tuple[dict[str, int], dict[str, int]]:
    source_meta, target_meta = _reflect(src), _reflect(dst)
    _require_same_tables(source_meta, target_meta)
    ordered = [target_meta.tables[t.name] for t in target_meta.sorted_tables]
    for table in reversed(ordered):  # rows the revisions themselves wrote
        dst.execute(delete(table))
    rows: dict[str, int] = {}
    for table in ordered:
        rows[table.name] = _copy_table(src, dst, source_meta.tables[table.name], table)
    high = _high_water(src, source_meta)
    next_ids = _carry_counters(dst, ordered, high)
    if dst.dialect.name == "postgresql":
        dst.execute(text("UPDATE kiln_data_version SET version = version + 1 WHERE id = 1"))
    _verify(src, dst, source_meta, ordered, rows)
    return dict(sorted(rows.items())), next_ids


def _require_same_tables(source: MetaData, target: MetaData) -> None:
    problems = sorted(set(source.tables) ^ set(target.tables))
    for name in sorted(set(source.tables) & set(target.tables)):
        if set(source.tables[name].columns.keys()) != set(target.tables[name].columns.keys()):
            problems.append(f"{name} (columns differ)")
    if problems:
        raise ConfigError(
            f"source and target schemas differ at the same revision: {', '.join(problems)}",
            rule="db.copy_schema",
            hint="the source was changed by hand; repair it or restore a backup first",
        )


def _copy_table(src: Connection, dst: Connection, source: Table, target: Table) -> int:
    order = list(source.primary_key.columns) or list(source.columns)
    names = list(source.columns.keys())
    result = src.execute(
        select(*source.columns).order_by(*order), execution_options={"yield_per": BATCH_ROWS}
    )
    copied = 0
    for page in result.partitions(BATCH_ROWS):
        dst.execute(insert(target), [dict(zip(names, row, strict=True)) for row in page])
        copied += len(page)
    return copied


def _serial_column(table: Table) -> str | None:
    """The single integer primary-key column, the only kind that may count ids."""
    columns = list(table.primary_key.columns)
    if len(columns) == 1 and isinstance(columns[0].type, Integer):
        return columns[0].name
    return None


def _pg_sequence(conn: Connection, table: str, column: str) -> str | None:
    found = conn.execute(
        text("SELECT pg_get_serial_sequence(:t, :c)"), {"t": table, "c": column}
    ).scalar()
    return None if found is None else str(found)


def _high_water(src: Connection, meta: MetaData) -> dict[str, int]:
    """Per table, the highest id the source ever handed out (deleted rows included)."""
    if src.dialect.name == "sqlite":
        exists = src.execute(
            text("SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_sequence'")
        ).scalar()
        if not exists:
            return {}
        found = src.execute(text("SELECT name, seq FROM sqlite_sequence LIMIT :cap"),
                            {"cap": MAX_TABLES}).all()  # fmt: skip
        return {str(name): int(seq) for name, seq in found if name in meta.tables}
    high: dict[str, int] = {}
    for table in meta.sorted_tables:
        column = _serial_column(table)
        sequence = _pg_sequence(src, table.name, column) if column else None
        if sequence is not None:
            last = src.execute(
                text("SELECT pg_sequence_last_value(CAST(:s AS regclass))"), {"s": sequence}
            ).scalar()
            high[table.name] = int(last or 0)
    return high


def _carry_counters(dst: Connection, tables: list[Table], high: dict[str, int]) -> dict[str, int]:
    """Set each target counter past every id used; return the next id per counted table."""
    next_ids: dict[str, int] = {}
    for table in tables:
        column = _serial_column(table)
        if column is None:
            continue
        top = int(dst.execute(select(func.coalesce(func.max(table.c[column]), 0))).scalar_one())
        used = max(top, high.get(table.name, 0))
        if dst.dialect.name == "postgresql":
            sequence = _pg_sequence(dst, table.name, column)
            if sequence is None:
                continue
            dst.execute(
                text("SELECT setval(CAST(:s AS regclass), :v, :called)"),
                {"s": sequence, "v": max(used, 1), "called": used > 0},
            )
        elif table.name in high:
            dst.execute(text("DELETE FROM sqlite_sequence WHERE name = :t"), {"t": table.name})
            dst.execute(
                text("INSERT INTO sqlite_sequence (name, seq) VALUES (:t, :v)"),
                {"t": table.name, "v": used},
            )
        else:
            continue
        next_ids[table.name] = used + 1
    return dict(sorted(next_ids.items()))


def _count(conn: Connection, table: Table) -> int:
    return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def _verify(
    src: Connection, dst: Connection, source: MetaData, tables: list[Table], rows: dict[str, int]
) -> None:
    """Before COMMIT: every table holds as many rows as the source snapshot."""
    for table in tables:
        expected = _count(src, source.tables[table.name])
        found = _count(dst, table)
        if not expected == found == rows[table.name]:
            raise ConfigError(
                f"table {table.name}: the source has {expected} rows, {rows[table.name]} were "
                f"copied and the target holds {found}; nothing was committed",
                rule="db.copy_verify",
            )
