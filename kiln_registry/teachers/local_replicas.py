"""A local alias served by several processes: ``replicas = N`` in its launch profile.

The manager (``local.process_groups``) prepares the snapshot once and spawns
one process group per port (and device).  Here the registry proves them through
the probing code a remote replica set uses (``teachers.replicas.prove_endpoints``:
two at a time, one byte-identical identity), and that identity must be the one
the launcher composed.  The alias is then stored as a replica set: E's
``teacher_replicas`` rows (``replicas.replica_rows``), one receipt per replica,
``url`` the first replica's.  A single-process profile keeps the single-URL
shape (no replica rows).  Relaunch must find the ports it registered; the
start-up reconcile marks each replica unavailable with its alias.

Imports the teachers layer (probing, replicas), the configuration, database,
identity and ``kiln_registry.local``; never the API layer or FastAPI.
"""

from __future__ import annotations

from collections.abc import Sequence

from kiln_registry.config.settings import LocalTeacherConfig
from kiln_registry.db.models import TeacherRow, utc_timestamp
from kiln_registry.domain.errors import IdentityMismatch, KilnError, RegistrationInvalid
from kiln_registry.identity.document import TeacherIdentity, same_identity
from kiln_registry.identity.fingerprint import verify_fingerprint
from kiln_registry.local.launch_spec import LOOPBACK_HOST, RunningTeacher
from kiln_registry.teachers.context import TeacherServices
from kiln_registry.teachers.probing import Receipt, loopback_endpoint, registry_setup
from kiln_registry.teachers.replicas import (
    REPLICA_UNAVAILABLE,
    REPLICA_VERIFIED,
    prove_endpoints,
)


def replica_urls(profile: LocalTeacherConfig) -> list[str]:
    """Each replica's teacher URL on loopback, replica 0 first."""
    return [f"http://{LOOPBACK_HOST}:{port}/v1" for port in profile.replica_ports()]


def check_launched(alias: str, proved: TeacherIdentity, handles: Sequence[RunningTeacher]) -> None:
    """Every process answering for ``alias`` must be the one the launcher started."""
    for idx, handle in enumerate(handles):
        try:
            launched: TeacherIdentity | None = verify_fingerprint(handle.fingerprint)
        except KilnError:
            launched = None
        if launched is None or not same_identity(proved, launched):
            where = f"replica {idx} of " if len(handles) > 1 else ""
            raise IdentityMismatch(
                f"the teacher answering for {where}{alias!r} is not the one the launcher started",
                rule="local.probe_identity",
                hint="another server may hold the profile's port",
            )


async def probe_launched(
    ctx: TeacherServices,
    alias: str,
    handles: Sequence[RunningTeacher],
    urls: Sequence[str],
    model_id: str,
    pinned: TeacherIdentity | None,
) -> tuple[TeacherIdentity, list[Receipt]]:
    """Both probes of every launched replica; their one identity and one receipt each."""
    endpoints = [loopback_endpoint(url) for url in urls]
    identity, receipts = await prove_endpoints(registry_setup(ctx), endpoints, model_id, pinned)
    check_launched(alias, identity, handles)
    return identity, receipts


def check_relaunch_urls(row: TeacherRow, urls: Sequence[str]) -> None:
    """A relaunch serves the replicas it registered: same count, same ports."""
    stored = [replica.url for replica in row.replicas] or [row.url or ""]
    if list(urls) != stored:
        raise RegistrationInvalid(
            f"profile {row.launch_profile!r} now places alias {row.alias!r} on"
            f" {len(urls)} replica(s) at {', '.join(urls)}, but it was registered on"
            f" {len(stored)} at {', '.join(stored)}",
            rule="local.relaunch_replicas",
            hint="restore the profile's replicas and ports, or delete the alias and register it"
            " again",
        )


def mark_replicas(row: TeacherRow, digest: str | None, message: str | None) -> None:
    """Set every replica row of ``row`` (in the caller's session): verified with ``digest``,
    else unavailable with ``message``."""
    now = utc_timestamp()
    for replica in row.replicas:
        replica.checked_at = now
        if digest is not None:
            replica.status, replica.status_message = REPLICA_VERIFIED, None
            replica.identity_digest = digest
        else:
            replica.status, replica.status_message = REPLICA_UNAVAILABLE, message
