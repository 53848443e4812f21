"""Data access for jobs and their sequences: the only place job-queue SQL is built.

``JobRepository`` wraps a caller's ``Session`` and never commits; callers use
``db.repository.unit_of_work`` and keep transactions short (every session
begins IMMEDIATE, so a transaction holds the write lock).

On SQLite the claim is one statement: ``UPDATE jobs ... WHERE id = (oldest
queued) AND status = 'queued' RETURNING *`` (the write lock serialises
claims); on PostgreSQL the oldest queued row is selected ``FOR UPDATE SKIP
LOCKED`` and then updated, so concurrent workers skip each other's rows
instead of waiting.  A claim is a lease: a fresh claim token, the worker's
``lease_owner`` and a ``lease_expires_at`` the holder pushes forward
(``renew_lease``); ``requeue_expired`` puts jobs whose lease ran out back to
``queued`` (any worker, at start and in its claim loop).  Every later change
by a worker is conditional on its claim token (``update_claimed``), so a
worker that lost its claim (lease taken over, cancellation of a queued job)
changes nothing.

Imports: the standard library, SQLAlchemy, ``kiln_registry.db.models`` (the
timestamp), ``jobs.core.models`` and ``kiln_registry.domain`` (errors, text, vocabulary).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final, NamedTuple, cast

from sqlalchemy import ColumnElement, CursorResult, delete, func, insert, select, update
from sqlalchemy.orm import Session

from kiln_registry.db.models import TIMESTAMP_FORMAT, utc_timestamp
from kiln_registry.domain.errors import InputError, JobConflict, JobNotFound
from kiln_registry.domain.text import clipped
from kiln_registry.domain.vocabulary import ACTIVE_JOB_STATUSES, TERMINAL_JOB_STATUSES, JobStatus
from kiln_registry.jobs.core.models import JOB_STATUSES, JobRow, JobSequenceRow

MAX_LIST_LIMIT: Final = 1_000
MAX_PAGE: Final = 10_000
MAX_ERROR_CHARS: Final = 2_000
_RESET_PHASES: Final = {
    "spec_checked_at": None,
    "probed_at": None,
    "leased_at": None,
    "scoring_started_at": None,
    "device": None,
    "scored_count": 0,
    "cache_hits": 0,
    "requests_sent": 0,
    "retries": 0,
}
_NO_LEASE: Final = {"claim_token": None, "lease_owner": None, "lease_expires_at": None}
DEFAULT_LEASE_TIMEOUT_S: Final = 30.0


# PostgreSQL's spelling of TIMESTAMP_FORMAT (fixed width, microseconds, "Z").
_PG_TIMESTAMP_FORMAT: Final = 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'


def lease_expiry(timeout_s: float) -> str:
    """The timestamp ``timeout_s`` from now on this host's clock, in the stored format."""
    return (datetime.now(UTC) + timedelta(seconds=timeout_s)).strftime(TIMESTAMP_FORMAT)


def database_time(session: Session, plus_s: float = 0.0) -> ColumnElement[str] | str:
    """Now plus ``plus_s`` on the database's clock, in the stored timestamp format.

    Leases are decided on one clock, whichever host asks: PostgreSQL's statement time
    when the registry is shared by several hosts; a SQLite file is only ever opened on
    one host, whose clock is the database's.  A worker whose clock is skewed therefore
    neither steals a live lease nor keeps a dead one.
    """
    if session.get_bind().dialect.name != "postgresql":
        return lease_expiry(plus_s)
    moment: ColumnElement[Any] = func.timezone("UTC", func.statement_timestamp())
    if plus_s:
        moment = moment + func.make_interval(0, 0, 0, 0, 0, 0, float(plus_s))
    return func.to_char(moment, _PG_TIMESTAMP_FORMAT)


class SequenceItem(NamedTuple):
    """One stored input sequence: its position, id, int32 LE ids and their SHA-256."""

    idx: int
    seq_id: str
    token_ids: bytes
    token_sha256: str


def _rowcount(result: object) -> int:
    return cast("CursorResult[Any]", result).rowcount


def _held(job_id: str, token: str) -> tuple[ColumnElement[bool], ...]:
    """The job is active and still claimed under ``token`` (every fenced write's condition)."""
    return (JobRow.id == job_id, JobRow.claim_token == token,
            JobRow.status.in_(ACTIVE_JOB_STATUSES))  # fmt: skip


def clip_message(message: str) -> str:
    """A job's stored error message: at most ``MAX_ERROR_CHARS`` characters."""
    return clipped(message, MAX_ERROR_CHARS)


class JobRepository:
    """Jobs and their sequences within the caller's session and transaction."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def insert(self, row: JobRow, sequences: Sequence[tuple[str, bytes, str]]) -> None:
        """Add a queued job with its sequences as ``(seq_id, int32 bytes, sha256)``."""
        self._session.add(row)
        self._session.flush()
        for start in range(0, len(sequences), MAX_PAGE):
            chunk = sequences[start : start + MAX_PAGE]
            self._session.execute(
                insert(JobSequenceRow),
                [
                    {"job_id": row.id, "idx": start + i, "seq_id": s, "token_ids": t,
                     "token_sha256": h}
                    for i, (s, t, h) in enumerate(chunk)
                ],
            )  # fmt: skip

    def get(self, job_id: str) -> JobRow | None:
        return self._session.get(JobRow, job_id)

    def require(self, job_id: str, viewer: str | None = None) -> JobRow:
        """The job; ``JobNotFound`` when it is missing or, with ``viewer`` (a token name
        without ``admin``), when another token submitted it: one answer for both."""
        row = self.get(job_id)
        if row is None or (viewer is not None and row.owner != viewer):
            raise JobNotFound(f"job {job_id!r} does not exist")
        return row

    def active_totals(self, *, owner: str | None, per_owner: bool) -> tuple[int, int]:
        """``(jobs, input tokens)`` of the unfinished (queued or active) jobs: all of them,
        or one owner's."""
        unfinished = (JobStatus.queued, *ACTIVE_JOB_STATUSES)
        query = select(func.count(), func.coalesce(func.sum(JobRow.token_count), 0)).where(
            JobRow.status.in_(unfinished)
        )
        if per_owner:
            query = query.where(JobRow.owner.is_(None) if owner is None else JobRow.owner == owner)
        jobs, tokens = self._session.execute(query).one()
        return int(jobs), int(tokens)

    def list_jobs(
        self,
        *,
        limit: int = 100,
        status: str | None = None,
        before: tuple[str, str] | None = None,
        viewer: str | None = None,
    ) -> list[JobRow]:
        """Up to ``limit`` jobs, newest first, optionally of one status (and only
        ``viewer``'s when given).

        ``before`` is the ``(created_at, id)`` of the last job of the previous page.
        """
        if not 1 <= limit <= MAX_LIST_LIMIT + 1:
            raise InputError(f"limit must be 1..{MAX_LIST_LIMIT}", rule="db.limit")
        query = select(JobRow).order_by(JobRow.created_at.desc(), JobRow.id.desc())
        if status is not None:
            if status not in JOB_STATUSES:
                raise InputError(f"status {status!r} is not a job status", rule="job.status")
            query = query.where(JobRow.status == status)
        if viewer is not None:
            query = query.where(JobRow.owner == viewer)
        if before is not None:
            created, last = before
            older = JobRow.created_at < created
            query = query.where(older | ((JobRow.created_at == created) & (JobRow.id < last)))
        return list(self._session.scalars(query.limit(limit)))

    def delete_finished(self, job_id: str, viewer: str | None = None) -> None:
        """Remove a finished job and its sequences; ``JobConflict`` while it is not finished."""
        row = self.require(job_id, viewer)
        if row.status not in TERMINAL_JOB_STATUSES:
            raise JobConflict(
                f"job {job_id!r} is {row.status}; only a finished job (succeeded, failed or"
                " cancelled) can be deleted",
                rule="job.delete_active",
                hint=f"cancel it first (`kiln jobs cancel {job_id}`), then delete it once it"
                " shows cancelled",
            )
        self._session.expunge(row)
        self._session.execute(delete(JobSequenceRow).where(JobSequenceRow.job_id == job_id))
        gone = self._session.execute(
            delete(JobRow)
            .where(JobRow.id == job_id, JobRow.status.in_(TERMINAL_JOB_STATUSES))
            .execution_options(synchronize_session=False)
        )
        if _rowcount(gone) != 1:  # unreachable under the write lock; fail closed anyway
            raise JobConflict(f"job {job_id!r} changed while it was being deleted")

    def finished_before(self, cutoff: str, *, limit: int) -> list[tuple[str, str | None]]:
        """``(id, result_path)`` of up to ``limit`` finished jobs whose ``finished_at < cutoff``."""
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise InputError(f"limit must be 1..{MAX_LIST_LIMIT}", rule="db.limit")
        ended = func.coalesce(JobRow.finished_at, JobRow.updated_at)
        query = (
            select(JobRow.id, JobRow.result_path)
            .where(JobRow.status.in_(TERMINAL_JOB_STATUSES), ended < cutoff)
            .order_by(ended, JobRow.id)
            .limit(limit)
        )
        return [(str(i), p) for i, p in self._session.execute(query)]

    def claim_next(
        self, token: str, *, owner: str = "", timeout_s: float = DEFAULT_LEASE_TIMEOUT_S
    ) -> JobRow | None:
        """Move the oldest queued job to ``probing`` under ``token``, leased to ``owner``."""
        oldest = (
            select(JobRow.id)
            .where(JobRow.status == JobStatus.queued)
            .order_by(JobRow.created_at, JobRow.id)
            .limit(1)
        )
        if self._session.get_bind().dialect.name == "postgresql":
            # Concurrent claimers skip a row another transaction has locked, then update it.
            job_id = self._session.scalar(oldest.with_for_update(skip_locked=True))
            if job_id is None:
                return None
            target = JobRow.id == job_id
        else:  # SQLite: one atomic UPDATE; the write lock serialises claims
            target = JobRow.id == oldest.scalar_subquery()
        now = utc_timestamp()
        stmt = (
            update(JobRow)
            .where(target, JobRow.status == JobStatus.queued)
            .values(
                status=JobStatus.probing,
                claim_token=token,
                lease_owner=owner,
                lease_expires_at=database_time(self._session, timeout_s),
                claimed_at=now,
                updated_at=now,
                attempts=JobRow.attempts + 1,
                **_RESET_PHASES,
            )
            .returning(JobRow)
            .execution_options(synchronize_session=False)
        )
        return self._session.scalars(stmt).one_or_none()

    def renew_lease(self, job_id: str, token: str, timeout_s: float) -> bool | None:
        """Push a held job's lease forward; None if the claim was lost, else its cancel flag."""
        stmt = (
            update(JobRow)
            .where(*_held(job_id, token))
            .values(lease_expires_at=database_time(self._session, timeout_s))
            .returning(JobRow.cancel_requested)
            .execution_options(synchronize_session=False)
        )
        flag = self._session.scalars(stmt).one_or_none()
        return None if flag is None else bool(flag)

    def update_claimed(self, job_id: str, token: str, **values: object) -> bool:
        """Change an active job this worker holds; False if the claim was lost."""
        stmt = (
            update(JobRow)
            .where(*_held(job_id, token))
            .values(updated_at=utc_timestamp(), **values)
            .execution_options(synchronize_session=False)
        )
        return _rowcount(self._session.execute(stmt)) == 1

    def finish(self, job_id: str, token: str, status: str, **values: object) -> bool:
        """Move a held job to a terminal ``status``; the claim token is cleared."""
        now = utc_timestamp()
        values = {**values, **_NO_LEASE}
        return self.update_claimed(job_id, token, status=status, finished_at=now, **values)

    def cancel_requested(self, job_id: str) -> bool:
        value = self._session.scalar(select(JobRow.cancel_requested).where(JobRow.id == job_id))
        return bool(value)

    def request_cancel(self, job_id: str, viewer: str | None = None) -> JobRow:
        """Cancel now (queued), at the next request boundary (active), or refuse (done)."""
        row = self.require(job_id, viewer)
        now = utc_timestamp()
        if row.status == JobStatus.queued:
            self._session.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.status == JobStatus.queued)
                .values(
                    status=JobStatus.cancelled, cancel_requested=1, finished_at=now, updated_at=now
                )
                .execution_options(synchronize_session=False)
            )
        elif row.status in ACTIVE_JOB_STATUSES:
            self._session.execute(
                update(JobRow)
                .where(JobRow.id == job_id)
                .values(cancel_requested=1, updated_at=now)
                .execution_options(synchronize_session=False)
            )
        elif row.status != JobStatus.cancelled:
            raise JobConflict(
                f"job {job_id!r} already {row.status}; only queued or running jobs can be cancelled"
            )
        self._session.expire(row)
        return self.require(job_id)

    def requeue_expired(self) -> list[str]:
        """Active jobs whose lease ran out go back to ``queued`` (or ``cancelled`` if asked).

        A job without a lease (claimed before revision 0006) counts as expired.  Expiry is
        judged on the database's clock (``database_time``).
        """
        now = database_time(self._session)
        expired = JobRow.status.in_(ACTIVE_JOB_STATUSES) & (
            JobRow.lease_expires_at.is_(None) | (JobRow.lease_expires_at < now)
        )
        cancelled = self._session.scalars(
            update(JobRow)
            .where(expired, JobRow.cancel_requested == 1)
            .values(status=JobStatus.cancelled, finished_at=now, updated_at=now, **_NO_LEASE)
            .returning(JobRow.id)
            .execution_options(synchronize_session=False)
        ).all()
        requeued = self._session.scalars(
            update(JobRow)
            .where(expired)
            .values(status=JobStatus.queued, updated_at=now, **_NO_LEASE, **_RESET_PHASES)
            .returning(JobRow.id)
            .execution_options(synchronize_session=False)
        ).all()
        return sorted([*cancelled, *requeued])

    def release_claim(self, job_id: str, token: str) -> bool:
        """A worker that stops mid-job puts it back to ``queued`` for any worker to claim."""
        stmt = (
            update(JobRow)
            .where(*_held(job_id, token))
            .values(
                status=JobStatus.queued, updated_at=utc_timestamp(), **_NO_LEASE, **_RESET_PHASES
            )
            .execution_options(synchronize_session=False)
        )
        return _rowcount(self._session.execute(stmt)) == 1

    def sequences(self, job_id: str, *, after: int, limit: int) -> list[SequenceItem]:
        """Sequences with ``idx > after`` in order, at most ``limit`` (<= ``MAX_PAGE``)."""
        if not 1 <= limit <= MAX_PAGE:
            raise InputError(f"limit must be 1..{MAX_PAGE}", rule="db.limit")
        query = (
            select(
                JobSequenceRow.idx,
                JobSequenceRow.seq_id,
                JobSequenceRow.token_ids,
                JobSequenceRow.token_sha256,
            )
            .where(JobSequenceRow.job_id == job_id, JobSequenceRow.idx > after)
            .order_by(JobSequenceRow.idx)
            .limit(limit)
        )
        return [SequenceItem(*row) for row in self._session.execute(query)]
