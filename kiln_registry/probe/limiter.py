"""The in-flight limiter for teacher probes and who is probing.

Owns ``ProbeLimiter`` (slots in all and per caller, with an optional fair,
bounded wait queue and slots reserved for admins), ``ProbeCaller`` and
``PROBE_CALLER`` (the context variable the API sets per request).

Fairness (issue 27, item 7: one flooder took every slot, legitimate
registrations got 0 of 29): a probe that finds no free slot waits in a
bounded queue instead of failing at once.  Each freed slot goes to the
waiting caller with the fewest probes in flight, then the one served longest
ago, then the earliest arrival, so a caller with many requests queued never
starves one with a single request.  A queue past ``max_waiting`` (in all) or
``max_waiting_per_caller``, or a wait past ``max_wait_s``, is ``ProbeBusy``
(503 with ``Retry-After``).  ``admin_reserved`` slots are taken only by admin
callers, so an admin can always probe while others flood.  A limiter with
``max_waiting = 0`` (the job workers') never waits.
Imports the standard library and ``kiln_registry.domain.errors`` only.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field

from kiln_registry.domain.errors import ProbeBusy

MAX_REMEMBERED_CALLERS = 4096  # round-robin memory: the callers served most recently


@dataclass(frozen=True, slots=True)
class ProbeCaller:
    """Who is probing: ``token:<name>`` (else ``addr:<ip>``); ``admin`` may use reserved slots."""

    key: str
    admin: bool = False


# The API sets it per request; None for the job workers, which have their own limiter.
PROBE_CALLER: contextvars.ContextVar[ProbeCaller | None] = contextvars.ContextVar(
    "kiln_probe_caller", default=None
)


@dataclass(eq=False)
class _Waiter:
    caller: ProbeCaller | None
    seq: int
    future: asyncio.Future[None]
    granted: bool = field(default=False)


class ProbeLimiter:
    """Probe slots: ``max_in_flight`` in all, ``max_per_caller`` per caller, fair waiting."""

    def __init__(
        self,
        max_in_flight: int = 2,
        max_per_caller: int | None = None,
        *,
        admin_reserved: int = 0,
        max_waiting: int = 0,
        max_waiting_per_caller: int | None = None,
        max_wait_s: float = 30.0,
    ) -> None:
        if max_in_flight < 1 or (max_per_caller is not None and max_per_caller < 1):
            raise ValueError("max_in_flight and max_per_caller must be at least 1")
        if not 0 <= admin_reserved < max_in_flight or max_waiting < 0 or max_wait_s <= 0:
            raise ValueError("admin_reserved must be below max_in_flight; waits must be >= 0")
        self._max = max_in_flight
        self._per_caller = max_per_caller or max_in_flight
        self._reserved = admin_reserved
        self._max_waiting = max_waiting
        self._waiting_per_caller = max_waiting_per_caller or max_waiting
        self._max_wait_s = max_wait_s
        self._in_flight = 0
        self._by_caller: dict[str, int] = {}
        self._waiters: list[_Waiter] = []
        self._served: OrderedDict[str, int] = OrderedDict()
        self._ticks = itertools.count(1)
        self._lock = threading.Lock()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _refusal(self, caller: ProbeCaller | None) -> str | None:
        """Why ``caller`` cannot take a slot now (None: it can).  Under the lock."""
        limit = self._max if caller is not None and caller.admin else self._max - self._reserved
        if self._in_flight >= limit:
            return f"{self._in_flight} teacher probes are already in flight"
        held = self._by_caller.get(caller.key, 0) if caller is not None else 0
        if held >= self._per_caller:
            return f"this caller already has {held} teacher probes in flight"
        return None

    def _take(self, caller: ProbeCaller | None) -> None:
        self._in_flight += 1
        if caller is not None:
            self._by_caller[caller.key] = self._by_caller.get(caller.key, 0) + 1
            self._served[caller.key] = next(self._ticks)
            self._served.move_to_end(caller.key)
            while len(self._served) > MAX_REMEMBERED_CALLERS:
                self._served.popitem(last=False)

    def _give_back(self, caller: ProbeCaller | None) -> None:
        """Free one slot and hand it to the fairest waiter that may take it (under the lock)."""
        self._in_flight -= 1
        if caller is not None:
            left = self._by_caller[caller.key] - 1
            if left:
                self._by_caller[caller.key] = left
            else:
                del self._by_caller[caller.key]
        self._grant_waiters()

    def _rank(self, waiter: _Waiter) -> tuple[int, int, int]:
        key = waiter.caller.key if waiter.caller is not None else ""
        return (self._by_caller.get(key, 0), self._served.get(key, 0), waiter.seq)

    def _grant_waiters(self) -> None:
        while True:
            ready = [w for w in self._waiters if self._refusal(w.caller) is None]
            if not ready:
                return
            chosen = min(ready, key=self._rank)
            self._waiters.remove(chosen)
            self._take(chosen.caller)
            chosen.granted = True
            chosen.future.get_loop().call_soon_threadsafe(_resolve, chosen.future)

    @contextmanager
    def slot(self, caller: ProbeCaller | None = None) -> Iterator[None]:
        """A slot now or ``ProbeBusy`` (never waits)."""
        with self._lock:
            refusal = self._refusal(caller)
            if refusal is not None:
                raise ProbeBusy(refusal)
            self._take(caller)
        try:
            yield
        finally:
            with self._lock:
                self._give_back(caller)

    @asynccontextmanager
    async def turn(self, caller: ProbeCaller | None = None) -> AsyncIterator[None]:
        """A slot, waiting fairly in the bounded queue; ``ProbeBusy`` past its bounds."""
        waiter = self._enqueue(caller)
        if waiter is not None:
            await self._wait(waiter)
        try:
            yield
        finally:
            with self._lock:
                self._give_back(caller)

    def _enqueue(self, caller: ProbeCaller | None) -> _Waiter | None:
        """None when a slot was taken at once; else the queued waiter (or ``ProbeBusy``)."""
        with self._lock:
            refusal = self._refusal(caller)
            if refusal is None:
                self._take(caller)
                return None
            mine = sum(1 for w in self._waiters if w.caller == caller)
            if len(self._waiters) >= self._max_waiting or mine >= self._waiting_per_caller:
                raise ProbeBusy(
                    f"{refusal}, and {len(self._waiters)} more are waiting"
                    f" ({mine} of them this caller's): the wait queue is full"
                )
            waiter = _Waiter(caller, next(self._ticks), asyncio.get_running_loop().create_future())
            self._waiters.append(waiter)
            return waiter

    async def _wait(self, waiter: _Waiter) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), self._max_wait_s)
        except BaseException as exc:  # a timeout or a cancelled request leaves the queue
            with self._lock:
                if waiter.granted:
                    self._give_back(waiter.caller)
                else:
                    self._waiters.remove(waiter)
            if isinstance(exc, TimeoutError):
                raise ProbeBusy(
                    f"no teacher probe slot came free within {self._max_wait_s:g} s"
                ) from None
            raise


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
