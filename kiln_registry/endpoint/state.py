"""What the endpoint serves now: the pin, the replicas, the stop reason, the registry it follows.

``EndpointState`` holds the pinned identity's bounds and fingerprint, the
replica pool and ``stop_reason`` (None while serving; once set, every
request gets 503 with it until the endpoint is restarted).  Two things set
it:

* ``fence``: a replica whose answer broke a rule is fenced, the registry is
  told (``POST /v1/teachers/<alias>/report`` in the background, scope
  ``read``: the registry re-probes by itself, marks the alias or replica
  unavailable when the probes fail and audits it), and
  when no replica is left the endpoint stops;
* ``check_registry`` (every ``--recheck-s`` from ``follow``): a deleted or
  released alias (404), one that is no longer usable, or a changed
  ``identity_revision`` stops the endpoint.  A registry that cannot be
  reached is logged and the endpoint keeps serving: every answer is still
  checked against the pin.

Imports the standard library, the registry client's error type, the API's
wire schema of an entry and the endpoint's modules; no sockets of its own.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Protocol

from kiln_registry.client.base import RegistryClientError
from kiln_registry.endpoint.admission import Limits, Pin
from kiln_registry.endpoint.metrics import EndpointMetrics
from kiln_registry.endpoint.pool import Replica, ReplicaPool
from kiln_registry.endpoint.turns import CheckTurns
from kiln_registry.wire.teachers import ProbeReportPublic, TeacherEntry

log = logging.getLogger("kiln_registry.endpoint")


class Registry(Protocol):
    """The registry operations the endpoint uses (``AsyncRegistryClient`` has them)."""

    async def get_teacher(self, alias: str) -> TeacherEntry: ...

    async def report_teacher(self, alias: str) -> ProbeReportPublic: ...


def stop_reason_of(entry: TeacherEntry, revision: str) -> str | None:
    """Why ``entry`` may no longer be served under the pinned ``revision``, or None."""
    alias = entry.spec.alias
    if not entry.usable:
        detail = f": {entry.status_message}" if entry.status_message else ""
        return f"the registry marks {alias} {entry.status.value}{detail}"
    if entry.identity_revision != revision:
        return (
            f"the registry's identity of {alias} is now {entry.identity_revision}, not the"
            f" pinned {revision}; restart the endpoint to serve the new identity"
        )
    return None


@dataclass(eq=False)
class EndpointState:
    """The serving state of one endpoint (one event loop; see the module docstring)."""

    alias: str
    pin: Pin
    fingerprint: str = field(repr=False)
    revision: str
    pool: ReplicaPool
    registry: Registry
    metrics: EndpointMetrics
    limits: Limits = field(default_factory=Limits)
    secret_names: frozenset[str] = frozenset()
    request_timeout_s: float = 600.0
    listed_replicas: int = 1
    stop_reason: str | None = None
    turns: CheckTurns = field(default_factory=CheckTurns)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            log.error("teacher endpoint for %s stopped serving: %s", self.alias, reason)

    def fence(self, replica: Replica, rule: str) -> None:
        """Fence ``replica`` (see the module docstring); the registry re-probes the alias."""
        if not self.pool.fence(replica, rule):
            return
        log.error("replica %s of %s fenced (%s)", replica.url, self.alias, rule)
        self.update_gauges()
        if self.pool.all_fenced():
            self.stop(f"every replica of {self.alias} was fenced (last: {rule})")
        task = asyncio.get_running_loop().create_task(self._reprobe())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def update_gauges(self) -> None:
        self.metrics.fenced.set(self.pool.fenced_count())
        self.metrics.live.set(len(self.pool.live()))

    async def _reprobe(self) -> None:
        try:
            report = await self.registry.report_teacher(self.alias)
            log.warning("registry re-probe of %s: %s", self.alias, report.outcome.value)
        except RegistryClientError as exc:
            # A failed re-probe is the expected answer for a changed teacher.
            log.warning("registry re-probe of %s: %s", self.alias, exc.one_line())
        await self.check_registry()

    async def check_registry(self) -> None:
        """Re-read the entry; stop on a deleted, unusable or re-pinned alias."""
        try:
            entry = await self.registry.get_teacher(self.alias)
        except RegistryClientError as exc:
            if exc.status == 404:
                self.stop(f"the registry no longer has {self.alias} (deleted or released)")
            else:
                log.warning("could not re-read %s from the registry: %s", self.alias,
                            exc.one_line())  # fmt: skip
            return
        reason = stop_reason_of(entry, self.revision)
        if reason is not None:
            self.stop(reason)

    async def follow(self, interval_s: float) -> None:
        """``check_registry`` every ``interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.check_registry()
            except Exception:  # a bug here must not end the follow loop silently
                log.exception("re-reading %s from the registry failed", self.alias)

    async def drain(self) -> None:
        """Wait for the background re-probes and close the relay clients (at shutdown)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for replica in self.pool.replicas:
            if replica.wire is not None:
                await replica.wire.aclose()
