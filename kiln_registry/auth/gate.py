"""Per-token admission of state-changing requests: fair queuing across callers (issue 27).

``CallerGate`` lets one caller (a token) run at most ``max_active``
state-changing requests at a time; up to ``max_waiting`` more wait in its own
FIFO queue (an idle wait on a future: no CPU, no database), and past that the
request is refused at once with ``429 caller_busy`` and ``Retry-After``,
and one caller starts at most ``rate_per_s`` a second once a burst of
``burst`` is spent (a turn waits, idle, for its start time);
before its body is read, a route runs or an audit row is written.  A caller
flooding registrations or jobs therefore runs a bounded number of them, its
other requests wait their turn, and other callers (each with its own gate)
and every lookup keep the rest of the server.  The auth middleware applies it
to token holders (auth required); with auth off there is one local user.

Everything runs on the server's event loop: no locks.  At most
``max_callers`` callers are tracked; a caller with nothing active or waiting
and its burst back is forgotten.  Imports the standard library only.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Final

MAX_ACTIVE: Final = 2
MAX_WAITING: Final = 16
MAX_CALLERS: Final = 4096
RATE_PER_S: Final = 2.0  # state changes a second per token, after a burst of BURST
BURST: Final = 10


class CallerBusy(Exception):
    """The caller already has ``max_active`` requests running and ``max_waiting`` waiting."""


@dataclass
class _Turns:
    active: int = 0
    waiting: deque[asyncio.Future[None]] = field(default_factory=deque)
    next_start: float = 0.0  # loop time the caller's next turn may start (token bucket)


class CallerGate:
    def __init__(
        self,
        max_active: int = MAX_ACTIVE,
        max_waiting: int = MAX_WAITING,
        max_callers: int = MAX_CALLERS,
        rate_per_s: float = RATE_PER_S,
        burst: int = BURST,
    ) -> None:
        if max_active < 1 or max_waiting < 0 or max_callers < 1 or rate_per_s <= 0 or burst < 1:
            raise ValueError("max_active, max_callers, rate and burst >= 1; max_waiting >= 0")
        self._interval = 1.0 / rate_per_s
        self._burst_s = burst * self._interval
        self._max_active = max_active
        self._max_waiting = max_waiting
        self._max_callers = max_callers
        self._callers: dict[str, _Turns] = {}

    def active(self, key: str) -> int:
        turns = self._callers.get(key)
        return 0 if turns is None else turns.active

    @asynccontextmanager
    async def turn(self, key: str) -> AsyncIterator[None]:
        """Run when ``key`` has a free turn; ``CallerBusy`` when its queue is full."""
        turns = self._callers.get(key)
        if turns is None:
            if len(self._callers) >= self._max_callers:
                self._sweep()
            if len(self._callers) >= self._max_callers:
                raise CallerBusy("too many callers are busy at once")
            turns = self._callers[key] = _Turns()
        if turns.active < self._max_active and not turns.waiting:
            turns.active += 1
        else:
            await self._wait(key, turns)
        try:
            await self._paced(turns)
            yield
        finally:
            self._pass_on(key, turns)

    async def _paced(self, turns: _Turns) -> None:
        """Wait (idle, holding the turn) until the caller's rate allows one more start."""
        now = asyncio.get_running_loop().time()
        start = max(turns.next_start, now - self._burst_s)
        turns.next_start = start + self._interval
        if start > now:
            await asyncio.sleep(start - now)

    async def _wait(self, key: str, turns: _Turns) -> None:
        if len(turns.waiting) >= self._max_waiting:
            self._forget_if_idle(key, turns)
            raise CallerBusy(
                f"this caller already has {turns.active} state-changing requests running"
                f" and {len(turns.waiting)} waiting"
            )
        ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        turns.waiting.append(ticket)
        try:
            await ticket
        except BaseException:
            if ticket.done() and not ticket.cancelled():
                self._pass_on(key, turns)  # the turn was handed over: hand it on
            else:
                turns.waiting.remove(ticket)
                self._forget_if_idle(key, turns)
            raise

    def _pass_on(self, key: str, turns: _Turns) -> None:
        """End one turn: the caller's next waiter takes it, else it is freed."""
        while turns.waiting:
            ticket = turns.waiting.popleft()
            if not ticket.done():
                ticket.set_result(None)  # the active count carries over to the waiter
                return
        turns.active -= 1
        self._forget_if_idle(key, turns)

    def _rested(self, turns: _Turns) -> bool:
        """Nothing running or waiting, and the rate's burst fully back: nothing to remember."""
        now = asyncio.get_running_loop().time()
        return turns.active == 0 and not turns.waiting and turns.next_start <= now - self._burst_s

    def _forget_if_idle(self, key: str, turns: _Turns) -> None:
        if self._rested(turns) and self._callers.get(key) is turns:
            del self._callers[key]

    def _sweep(self) -> None:
        """Forget every rested caller (bounded: at most ``max_callers`` entries)."""
        for key in [k for k, turns in self._callers.items() if self._rested(turns)]:
            del self._callers[key]
