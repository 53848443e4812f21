"""Deleting finished jobs (``DELETE /v1/jobs/{id}``) and ``[jobs] retain_days`` retention.

``delete_job`` removes a finished job (succeeded, failed or cancelled): its
row, its sequences and its result file, atomically.  A job still queued,
probing or running is refused (``409 job_conflict``, rule
``job.delete_active``): cancel it first, then delete it.  Atomicity across the
database and the file system: inside the delete transaction the result file is
renamed to a tombstone (``.<id>.jsonl.deleting`` beside it, directory
fsynced); if the transaction fails the file is renamed back, otherwise the
tombstone is unlinked after the commit.  A crash in between leaves a
tombstone that ``recover_deletions`` (run at the workers' start) renames back
when the job row still exists and removes otherwise.

``sweep_expired`` deletes finished jobs whose end is older than
``[jobs] retain_days`` days, in bounded batches; ``JobWorkers`` runs it at
start and then every ``SWEEP_INTERVAL_S``.  The score cache is shared by
identity and is not touched (``kiln cache prune`` owns it).

Call these from a worker thread.  Imports: standard library, SQLAlchemy,
``kiln_registry.config``/``db`` and ``jobs``; never the API layer.
"""

from __future__ import annotations

import itertools
import logging
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from kiln_registry.config import KilnConfig
from kiln_registry.db.repository import unit_of_work
from kiln_registry.errors import KilnError
from kiln_registry.jobs.repository import JobRepository
from kiln_registry.jobs.service import result_dir

log = logging.getLogger("kiln_registry.jobs")

SWEEP_INTERVAL_S: Final = 600.0
SWEEP_BATCH: Final = 100
MAX_SWEEP_ROUNDS: Final = 1000  # 100,000 jobs per sweep; the next sweep takes the rest
MAX_TOMBSTONES: Final = 10_000
TOMBSTONE_SUFFIX: Final = ".jsonl.deleting"
TIME_FORMAT: Final = "%Y-%m-%dT%H:%M:%S.%fZ"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tombstone(path: Path, job_id: str) -> Path:
    return path.with_name(f".{job_id}{TOMBSTONE_SUFFIX}")


def _set_aside(result_path: str | None, job_id: str) -> tuple[Path, Path] | None:
    """Rename the result file to its tombstone; (file, tombstone) when there was one."""
    if result_path is None:
        return None
    path = Path(result_path)
    grave = tombstone(path, job_id)
    try:
        os.replace(path, grave)
    except FileNotFoundError:
        return None
    _fsync_dir(path.parent)
    return path, grave


def delete_job(sessions: sessionmaker[Session], job_id: str) -> None:
    """Remove a finished job's rows and result file atomically (``JobConflict`` if active)."""
    moved: tuple[Path, Path] | None = None
    try:
        with unit_of_work(sessions) as session:
            repo = JobRepository(session)
            row = repo.require(job_id)
            result_path = row.result_path
            repo.delete_finished(job_id)  # refuses an active job before any file moves
            moved = _set_aside(result_path, job_id)
    except BaseException:
        if moved is not None:
            os.replace(moved[1], moved[0])
            _fsync_dir(moved[0].parent)
        raise
    if moved is not None:
        moved[1].unlink(missing_ok=True)
        _fsync_dir(moved[0].parent)


def recover_deletions(config: KilnConfig, sessions: sessionmaker[Session]) -> int:
    """Finish or undo deletions a crash interrupted; the number of tombstones handled."""
    root = result_dir(config)
    if not root.is_dir():
        return 0
    found = root.glob(f".job-*{TOMBSTONE_SUFFIX}")
    graves = list(itertools.islice(found, MAX_TOMBSTONES))
    for grave in graves:
        job_id = grave.name[1 : -len(TOMBSTONE_SUFFIX)]
        with unit_of_work(sessions) as session:
            row = JobRepository(session).get(job_id)
            target = None if row is None or row.result_path is None else Path(row.result_path)
        if target is not None:
            os.replace(grave, target)  # the delete never committed: the job keeps its result
        else:
            grave.unlink(missing_ok=True)
    if graves:
        _fsync_dir(root)
    return len(graves)


def cutoff(retain_days: int, now: datetime | None = None) -> str:
    """The timestamp before which a finished job is expired."""
    moment = (now or datetime.now(UTC)) - timedelta(days=retain_days)
    return moment.strftime(TIME_FORMAT)


def sweep_expired(config: KilnConfig, sessions: sessionmaker[Session]) -> int:
    """Delete finished jobs older than ``[jobs] retain_days``; the number deleted."""
    days = config.jobs.retain_days
    if days is None:
        return 0
    before = cutoff(days)
    deleted = 0
    for _ in range(MAX_SWEEP_ROUNDS):
        with unit_of_work(sessions) as session:
            batch = JobRepository(session).finished_before(before, limit=SWEEP_BATCH)
        removed = 0
        for job_id, _path in batch:
            try:
                delete_job(sessions, job_id)
            except (KilnError, OSError, SQLAlchemyError) as exc:  # the next sweep retries
                log.warning("retention: job %s not deleted (%s)", job_id, type(exc).__name__)
                continue
            removed += 1
        deleted += removed
        if len(batch) < SWEEP_BATCH or removed == 0:
            break
    if deleted:
        log.info("retention: deleted %d finished job(s) older than %d day(s)", deleted, days)
    return deleted
