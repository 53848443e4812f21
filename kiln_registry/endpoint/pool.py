"""The proved replicas of the alias: least-outstanding choice, fencing, short rests.

Every replica was proved against the pin at start.  ``pick`` returns the
live replica with the fewest requests in flight (ties: the first listed).  A
replica whose answer broke a rule is *fenced* for the endpoint's lifetime
(``fence``); one that gave no HTTP answer *rests* for ``REST_S`` seconds
(``rest``) and is tried again after it, so a restarting replica comes back
while a killed one stays out of the way.  With no replica left, ``pick``
returns None and the caller answers 503.

Each replica carries its relay client (``probe.wire.TeacherWire``: keep-alive
HTTP/1.1, the probes' transport rules), made at start and closed by the state's
``drain``.  Imports the standard library, ``credentials`` (the resolved endpoint
and secret handle) and ``probe.wire``'s type; opens no socket itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from kiln_registry.credentials.resolve import ResolvedTeacher
from kiln_registry.probe.wire import TeacherWire

REST_S: Final = 10.0


@dataclass(eq=False)
class Replica:
    """One proved endpoint of the alias and what the endpoint knows of it now."""

    url: str
    resolved: ResolvedTeacher = field(repr=False)
    wire: TeacherWire | None = field(default=None, repr=False)  # the relay's keep-alive client
    outstanding: int = 0
    fenced: str | None = None  # the rule that fenced it; never cleared
    resting_until: float = 0.0

    @property
    def completions_url(self) -> str:
        return self.resolved.endpoint.completions_url


class ReplicaPool:
    """The replicas and the choice among them (one event loop: no lock needed)."""

    def __init__(
        self, replicas: list[Replica], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.replicas = replicas
        self._clock = clock

    def live(self) -> list[Replica]:
        now = self._clock()
        return [r for r in self.replicas if r.fenced is None and r.resting_until <= now]

    def pick(self, exclude: frozenset[int] = frozenset()) -> Replica | None:
        """The live replica with the fewest requests in flight, skipping ``exclude`` (ids)."""
        best: Replica | None = None
        for replica in self.live():
            if id(replica) in exclude:
                continue
            if best is None or replica.outstanding < best.outstanding:
                best = replica
        return best

    def fence(self, replica: Replica, rule: str) -> bool:
        """Fence ``replica`` for good; True when this call fenced it."""
        if replica.fenced is not None:
            return False
        replica.fenced = rule
        return True

    def rest(self, replica: Replica) -> None:
        replica.resting_until = self._clock() + REST_S

    def fenced_count(self) -> int:
        return sum(1 for r in self.replicas if r.fenced is not None)

    def all_fenced(self) -> bool:
        return all(r.fenced is not None for r in self.replicas)
