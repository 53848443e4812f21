"""Giving deleted rows' space back to the file system (issue 27 item 8: growth is bounded).

SQLite keeps freed pages inside the file unless ``auto_vacuum`` is on.  Every
connection asks for ``auto_vacuum = INCREMENTAL`` before anything else
(``db.engine``), so a new database file is created with it; an older file is
converted once by the ``VACUUM`` that ``upgrade_to_head`` runs when it finds
the mode off (``needs_conversion``).  ``reclaim_space`` then runs
``PRAGMA incremental_vacuum`` after a job is deleted (and after each
retention sweep), outside any transaction, and truncates the WAL, so the
file shrinks by what was deleted.  ``secure_delete`` already zeroes the pages
first.  On PostgreSQL nothing is done here: autovacuum makes deleted rows'
space reusable within the table, and returning it to the operating system
is ``VACUUM FULL`` (docs/operations.md).

Imports the standard library and SQLAlchemy only.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Final

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger("kiln_registry.db")

INCREMENTAL: Final = 2  # PRAGMA auto_vacuum's value for INCREMENTAL


def needs_conversion(conn: Connection) -> bool:
    """True for a SQLite file whose ``auto_vacuum`` is not INCREMENTAL yet."""
    return conn.exec_driver_sql("PRAGMA auto_vacuum").scalar() != INCREMENTAL


def reclaim_space(sessions: sessionmaker[Session]) -> int:
    """SQLite: return every free page to the file system; the number of pages freed."""
    with sessions() as session:
        bind = session.get_bind()
    if not isinstance(bind, Engine) or bind.dialect.name != "sqlite":
        return 0
    raw = bind.raw_connection()
    try:
        dbapi = raw.driver_connection
        assert isinstance(dbapi, sqlite3.Connection)
        row = dbapi.execute("PRAGMA freelist_count").fetchone()
        free = int(row[0]) if row else 0
        if free:
            # One page per step: executescript steps the pragma to its end, outside any
            # transaction (the connection has no implicit ones: db.engine._on_connect).
            dbapi.executescript("PRAGMA incremental_vacuum;")
            dbapi.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    except sqlite3.OperationalError as exc:  # busy: the next delete or sweep frees them
        log.info("database space not reclaimed now (%s)", exc)
        return 0
    finally:
        raw.close()
    return free
