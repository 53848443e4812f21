"""Deleting finished jobs (``DELETE /v1/jobs/{id}``) and ``[jobs] retain_days`` retention.

``delete_job`` removes a finished job (succeeded, failed or cancelled): its
row, its sequences and its result files (the corpus and, for a generation
job, its detached ``<corpus>.sig``), atomically.  A job still queued,
probing or running is refused (``409 job_conflict``, rule
``job.delete_active``): cancel it first, then delete it.  Atomicity across the
database and the file system: inside the delete transaction the result file is
renamed to a tombstone (``.<name>.deleting`` beside it, directory
fsynced); if the transaction fails the file is renamed back, otherwise the
tombstone is unlinked after the commit.  A crash in between leaves a
tombstone that ``recover_deletions`` (run at the workers' start) renames back
when the job row still exists and removes otherwise.

``sweep_expired`` deletes finished jobs whose end is older than
``[jobs] retain_days`` days, in bounded batches; ``JobWorkers`` runs it at
start and then every ``SWEEP_INTERVAL_S``.  Several workers may sweep the same
jobs at once: each delete is one transaction under the write lock, so a job
and its files go exactly once, and a job another sweep took first is skipped
silently.  The score cache is shared by
identity and is not touched (``kiln cache prune`` owns it).

Call these from a worker thread.  Imports: standard library, SQLAlchemy,
``kiln_registry.config.settings``/``db`` and ``jobs``; never the API layer.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from kiln_registry.config.settings import KilnConfig
from kiln_registry.db.models import TIMESTAMP_FORMAT
from kiln_registry.db.repository import unit_of_work
from kiln_registry.db.space import reclaim_space
from kiln_registry.domain.errors import JobNotFound, KilnError
from kiln_registry.jobs.core.repository import JobRepository
from kiln_registry.jobs.core.service import result_dir
from kiln_registry.jobs.core.signing import fsync_dir, signature_path

log = logging.getLogger("kiln_registry.jobs")

SWEEP_INTERVAL_S: Final = 600.0
SWEEP_BATCH: Final = 100
MAX_SWEEP_ROUNDS: Final = 1000  # 100,000 jobs per sweep; the next sweep takes the rest
MAX_TOMBSTONES: Final = 10_000
TOMBSTONE_SUFFIX: Final = ".deleting"


def tombstone(path: Path) -> Path:
    """Where ``path`` waits while its job's delete commits: ``.<name>.deleting`` beside it."""
    return path.with_name(f".{path.name}{TOMBSTONE_SUFFIX}")


def _result_files(result_path: str | None) -> list[Path]:
    """The corpus and, for a generation job, its detached ``<corpus>.sig``."""
    if result_path is None:
        return []
    corpus = Path(result_path)
    return [corpus, signature_path(corpus)]


def _set_aside(result_path: str | None) -> list[tuple[Path, Path]]:
    """Rename the job's result files to their tombstones; the (file, tombstone) pairs moved."""
    moved: list[tuple[Path, Path]] = []
    for path in _result_files(result_path):
        try:
            os.replace(path, tombstone(path))
        except FileNotFoundError:
            continue
        moved.append((path, tombstone(path)))
    if moved:
        fsync_dir(moved[0][0].parent)
    return moved


def delete_job(
    sessions: sessionmaker[Session],
    job_id: str,
    viewer: str | None = None,
    *,
    reclaim: bool = True,
) -> None:
    """Remove a finished job's rows and result files atomically (``JobConflict`` if active).

    ``viewer`` (a non-admin token's name) may delete only its own jobs.  On SQLite
    the freed pages go back to the file system (``reclaim_space``).
    """
    moved: list[tuple[Path, Path]] = []
    try:
        with unit_of_work(sessions) as session:
            repo = JobRepository(session)
            row = repo.require(job_id, viewer)
            result_path = row.result_path
            repo.delete_finished(job_id, viewer)  # refuses an active job before any file moves
            moved = _set_aside(result_path)
    except BaseException:
        for path, grave in moved:
            os.replace(grave, path)
        if moved:
            fsync_dir(moved[0][0].parent)
        raise
    for _path, grave in moved:
        grave.unlink(missing_ok=True)
    if moved:
        fsync_dir(moved[0][0].parent)
    if reclaim:
        reclaim_space(sessions)


def recover_deletions(config: KilnConfig, sessions: sessionmaker[Session]) -> int:
    """Finish or undo deletions a crash interrupted; the number of tombstones handled."""
    root = result_dir(config)
    if not root.is_dir():
        return 0
    graves = list(itertools.islice(root.glob(f".job-*{TOMBSTONE_SUFFIX}"), MAX_TOMBSTONES))
    for grave in graves:
        original = grave.with_name(grave.name[1 : -len(TOMBSTONE_SUFFIX)])
        job_id = original.name.split(".", 1)[0]
        with unit_of_work(sessions) as session:
            row = JobRepository(session).get(job_id)
            kept = {p.name for p in _result_files(None if row is None else row.result_path)}
        if original.name in kept:
            # The delete never committed: the job keeps its result.  Another process's
            # failed delete may have renamed it back already (several workers share a database).
            with contextlib.suppress(FileNotFoundError):
                os.replace(grave, original)
        else:
            grave.unlink(missing_ok=True)
    if graves:
        fsync_dir(root)
    return len(graves)


def cutoff(retain_days: int, now: datetime | None = None) -> str:
    """The timestamp before which a finished job is expired."""
    moment = (now or datetime.now(UTC)) - timedelta(days=retain_days)
    return moment.strftime(TIMESTAMP_FORMAT)


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
                delete_job(sessions, job_id, reclaim=False)
            except JobNotFound:  # another worker's sweep deleted it first: nothing to do
                continue
            except (KilnError, OSError, SQLAlchemyError) as exc:  # the next sweep retries
                log.warning("retention: job %s not deleted (%s)", job_id, type(exc).__name__)
                continue
            removed += 1
        deleted += removed
        if len(batch) < SWEEP_BATCH or removed == 0:
            break
    if deleted:
        reclaim_space(sessions)
        log.info("retention: deleted %d finished job(s) older than %d day(s)", deleted, days)
    return deleted
