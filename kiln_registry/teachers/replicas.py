"""Teacher replica sets: one alias, several endpoints that must prove one identity.

A replica set is a property of a remote or local alias, not a kind of its
own: the code here proves one endpoint or several (``prove_endpoints``).  A
remote registration may give ``urls`` (2 to ``MAX_REPLICA_URLS`` distinct
base URLs) instead of ``url`` (``teachers.kinds.remote``).  Every replica
passes the rules of ``url`` (``teacher_hosts``, the credential's exact
origin) and is probed through the one probing seam
(``teachers.probing.run_probes``), at most ``REPLICA_PROBES`` at a time;
the alias is accepted only if every replica proved the byte-identical
canonical identity.  The alias row (whose ``url``
is the first replica's) and one ``teacher_replicas`` row and one receipt per
replica are written in one transaction.  A re-probe re-proves each replica
against the pinned identity and records each replica's status; the alias
stays usable while one replica is verified.

Errors name the replica by its index (and its identity revision), never a
secret.  Imports the probing seam, the database and the identity layer;
never the API layer, the job queue or FastAPI.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Final

from kiln_registry.credentials.redaction import redact_text
from kiln_registry.credentials.resolve import ResolvedTeacher
from kiln_registry.db.models import TeacherReplicaRow, TeacherRow, utc_timestamp
from kiln_registry.db.repository import TeacherRepository
from kiln_registry.domain.errors import (
    IdentityMismatch,
    KilnError,
    ProbeBusy,
    RegistrationInvalid,
    TeacherNotFound,
)
from kiln_registry.domain.limits import MAX_REPLICA_URLS, MAX_TEXT_CHARS, MIN_REPLICA_URLS
from kiln_registry.domain.text import clipped
from kiln_registry.identity.diff import mismatch_detail
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.teachers.context import TeacherServices
from kiln_registry.teachers.probing import (
    ProbeOutcome,
    ProbeSetup,
    Receipt,
    failure_receipt,
    registry_setup,
    resolve_endpoint,
    run_probes,
)

# Replicas probed at once by one registration or re-probe (the registry limiter's
# per-caller cap is 2: more would only be refused as busy).
REPLICA_PROBES: Final = 2
REPLICA_VERIFIED: Final = "verified"
REPLICA_UNAVAILABLE: Final = "unavailable"

Probed = ProbeOutcome | KilnError


def replica_urls(url: str | None, urls: Sequence[str] | None) -> tuple[str, ...] | None:
    """The replica URLs of a remote registration, or None for a single ``url``."""
    if urls is None:
        return None
    if url is not None:
        raise RegistrationInvalid(
            "give either url (one endpoint) or urls (a replica set), not both",
            rule="registration.urls.exclusive",
        )
    if not MIN_REPLICA_URLS <= len(urls) <= MAX_REPLICA_URLS:
        raise RegistrationInvalid(
            f"urls holds {len(urls)} URL(s); a replica set has {MIN_REPLICA_URLS} to"
            f" {MAX_REPLICA_URLS} (use url for a single endpoint)",
            rule="registration.urls.count",
        )
    seen: dict[str, int] = {}
    for idx, item in enumerate(urls):
        key = item.rstrip("/")
        if key in seen:
            raise RegistrationInvalid(
                f"replica {idx} repeats replica {seen[key]}'s URL; every replica URL must"
                " be distinct",
                rule="registration.urls.distinct",
            )
        seen[key] = idx
    return tuple(urls)


def _for_replica(exc: KilnError, idx: int) -> KilnError:
    """``exc`` with its message prefixed by the replica's index (same class, rule, hint)."""
    exc.message = f"replica {idx}: {exc.message}"
    exc.args = (exc.message,)
    return exc


def resolve_replicas(
    ctx: TeacherServices, urls: Sequence[str], credential_id: str | None
) -> list[ResolvedTeacher]:
    """Each replica's endpoint and secret handle, by the rules of ``url``."""
    resolved: list[ResolvedTeacher] = []
    for idx, url in enumerate(urls):
        try:
            resolved.append(resolve_endpoint(ctx.config, url, credential_id))
        except KilnError as exc:
            raise _for_replica(exc, idx) from None
    return resolved


async def probe_each(
    setup: ProbeSetup,
    resolved: Sequence[ResolvedTeacher],
    model_id: str,
    pinned: TeacherIdentity | None,
) -> list[Probed]:
    """Both probes of every replica, ``REPLICA_PROBES`` at a time; an outcome or error each."""
    gate = asyncio.Semaphore(REPLICA_PROBES)

    async def one(idx: int, target: ResolvedTeacher) -> Probed:
        async with gate:
            try:
                return await run_probes(setup, target, model_id, pinned, replica=idx)
            except KilnError as exc:
                return _for_replica(exc, idx)

    return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(resolved))))


def same_identity_everywhere(probed: Sequence[Probed]) -> tuple[TeacherIdentity, list[Receipt]]:
    """The one identity every replica proved, or the first failure / differing replica."""
    outcomes: list[ProbeOutcome] = []
    for item in probed:
        if isinstance(item, KilnError):
            raise item
        outcomes.append(item)
    first = outcomes[0].identity
    expected = first.canonical_bytes()
    for idx, outcome in enumerate(outcomes[1:], start=1):
        if outcome.identity.canonical_bytes() != expected:
            raise IdentityMismatch(
                f"replica {idx} proved identity {outcome.identity.revision()} but replica 0"
                f" proved {first.revision()}; {mismatch_detail(first, outcome.identity)}",
                rule="registration.urls.identity",
                hint="every replica of an alias must serve the same model, tokenizer and"
                " inference configuration; fix or drop the differing replica and retry",
            )
    return first, [outcome.receipt for outcome in outcomes]


def replica_row(alias: str, idx: int, url: str, digest: str) -> TeacherReplicaRow:
    return TeacherReplicaRow(
        alias=alias,
        idx=idx,
        url=url,
        status=REPLICA_VERIFIED,
        identity_digest=digest,
        checked_at=utc_timestamp(),
    )


def replica_rows(alias: str, urls: Sequence[str], digest: str) -> list[TeacherReplicaRow]:
    """The ``teacher_replicas`` rows of an alias served at ``urls`` (none for one URL)."""
    if len(urls) < 2:
        return []
    return [replica_row(alias, idx, url, digest) for idx, url in enumerate(urls)]


def resolve_all(
    ctx: TeacherServices, urls: Sequence[str], credential_id: str | None
) -> list[ResolvedTeacher]:
    """Each endpoint's resolution; errors name the replica only in a replica set."""
    if len(urls) == 1:
        return [resolve_endpoint(ctx.config, urls[0], credential_id)]
    return resolve_replicas(ctx, urls, credential_id)


async def prove_endpoints(
    setup: ProbeSetup,
    endpoints: Sequence[ResolvedTeacher],
    model_id: str,
    pinned: TeacherIdentity | None,
) -> tuple[TeacherIdentity, list[Receipt]]:
    """Both probes of every endpoint; their one identity and one receipt each.

    One endpoint is probed as itself; a replica set's are probed ``REPLICA_PROBES`` at
    a time and must all prove the byte-identical identity.
    """
    if len(endpoints) == 1:
        outcome = await run_probes(setup, endpoints[0], model_id, pinned)
        return outcome.identity, [outcome.receipt]
    probed = await probe_each(setup, endpoints, model_id, pinned)
    return same_identity_everywhere(probed)


def _store_reprobe(
    ctx: TeacherServices,
    alias: str,
    probed: Sequence[Probed],
    digest: str,
    alias_status: Callable[[TeacherRepository], None],
    secret_names: frozenset[str],
) -> None:
    """Every replica's status and receipt, and the alias's status, in one transaction."""
    with ctx.writing() as session:
        repo = TeacherRepository(session)
        row = repo.get(alias)
        if row is None:
            return  # deleted meanwhile
        now = utc_timestamp()
        for replica, item in zip(row.replicas, probed, strict=True):
            replica.checked_at = now
            if isinstance(item, KilnError):
                message = clipped(redact_text(str(item), secret_names), MAX_TEXT_CHARS)
                replica.status, replica.status_message = REPLICA_UNAVAILABLE, message
                receipt = failure_receipt(item, secret_names, replica=replica.idx)
            else:
                replica.status, replica.status_message = REPLICA_VERIFIED, None
                replica.identity_digest, receipt = digest, item.receipt
            if receipt is not None:
                receipt.store(session, alias, digest)
        with contextlib.suppress(TeacherNotFound):  # deleted meanwhile; receipts kept
            alias_status(repo)


async def reprobe_replicas(
    ctx: TeacherServices,
    row: TeacherRow,
    identity: TeacherIdentity,
    alias_status: Callable[[KilnError | None], Callable[[TeacherRepository], None]],
) -> ProbeOutcome:
    """Re-prove each replica against the pinned identity; record each one's status.

    Returns the first replica's passed outcome; raises the first failure when no
    replica passed.  ``alias_status(failure)`` gives the alias's status update
    (``failure`` None while any replica passed).
    """
    urls = [replica.url for replica in row.replicas]
    resolved = resolve_replicas(ctx, urls, row.credential_id)
    setup = registry_setup(ctx)
    probed = await probe_each(setup, resolved, identity.served_model_id, identity)
    busy = [item for item in probed if isinstance(item, ProbeBusy)]
    if busy:
        raise busy[0]  # nothing was learnt about that replica: change nothing
    passed = [item for item in probed if isinstance(item, ProbeOutcome)]
    failure = None if passed else next(i for i in probed if isinstance(i, KilnError))
    update = alias_status(failure)
    await asyncio.to_thread(
        _store_reprobe, ctx, row.alias, probed, identity.digest(), update, setup.secret_names
    )
    if failure is not None:
        raise failure
    return passed[0]
