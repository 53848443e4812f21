"""Whose answer is checked next: the oldest request's first.

The answer check runs on the event loop, one at a time.  When the answers of two
batches arrive together (two trainer workers in step), checking them in arrival
order interleaves the batches: both wait for all sixteen checks, and the two workers
stay in step, every round.  ``CheckTurns`` hands the loop to the waiting answer of the
oldest request instead (``ticket`` orders requests as they are admitted), so the
first batch is joined and relayed after its own eight checks and the workers fall out
of step.  A waiting answer never waits for one that has not arrived: the turn goes to
the oldest answer that is ready.

Imports the standard library only; one event loop.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class CheckTurns:
    """Turns to check an answer on the loop, oldest ticket first (see the module)."""

    def __init__(self) -> None:
        self._tickets = itertools.count()
        self._arrivals = itertools.count()
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._held = False
        self._scheduled = False

    def ticket(self) -> int:
        """A request's place in line (admission order)."""
        return next(self._tickets)

    @asynccontextmanager
    async def turn(self, ticket: int) -> AsyncIterator[None]:
        """Hold the checking turn; the oldest waiting ticket gets it next."""
        loop = asyncio.get_running_loop()
        granted: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._waiting, (ticket, next(self._arrivals), granted))
        self._schedule(loop)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():  # granted, then cancelled
                self._release(loop)
            raise
        try:
            yield
        finally:
            self._release(loop)

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        # A grant runs on the next loop pass, so every answer completed in this pass
        # is in line before the oldest is chosen.
        if not self._held and not self._scheduled and self._waiting:
            self._scheduled = True
            loop.call_soon(self._grant)

    def _grant(self) -> None:
        self._scheduled = False
        while self._waiting and not self._held:
            _, _, granted = heapq.heappop(self._waiting)
            if not granted.done():  # a cancelled waiter is skipped
                granted.set_result(None)
                self._held = True

    def _release(self, loop: asyncio.AbstractEventLoop) -> None:
        self._held = False
        self._schedule(loop)
