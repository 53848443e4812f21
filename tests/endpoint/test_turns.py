"""``CheckTurns``: answers ready together are checked oldest request first, one at a time,
and a cancelled waiter or holder never blocks the line.  A real event loop, no mocks."""

from __future__ import annotations

import asyncio

import pytest

from kiln_registry.endpoint.turns import CheckTurns


def test_ready_answers_are_checked_oldest_ticket_first_one_at_a_time() -> None:
    async def scenario() -> list[str]:
        turns = CheckTurns()
        tickets = [turns.ticket() for _ in range(3)]
        assert tickets == [0, 1, 2]
        order: list[str] = []
        holding = 0

        async def check(ticket: int, name: str) -> None:
            nonlocal holding
            async with turns.turn(ticket):
                holding += 1
                assert holding == 1
                order.append(name)
                await asyncio.sleep(0)  # a check that yields still holds the turn
                holding -= 1

        # Arrival order: the youngest request's answers first.
        await asyncio.gather(
            check(2, "c1"), check(1, "b1"), check(2, "c2"), check(0, "a1"), check(1, "b2")
        )
        return order

    assert asyncio.run(scenario()) == ["a1", "b1", "b2", "c1", "c2"]


def test_a_cancelled_waiter_and_a_cancelled_holder_free_the_line() -> None:
    async def scenario() -> list[str]:
        turns = CheckTurns()
        order: list[str] = []
        release = asyncio.Event()

        async def hold(ticket: int, name: str) -> None:
            async with turns.turn(ticket):
                order.append(name)
                await release.wait()

        holder = asyncio.create_task(hold(0, "holder"))
        await asyncio.sleep(0.01)
        waiter = asyncio.create_task(hold(1, "cancelled waiter"))
        last = asyncio.create_task(hold(2, "last"))
        await asyncio.sleep(0.01)
        waiter.cancel()
        holder.cancel()  # cancelled while holding: the turn passes on
        with pytest.raises(asyncio.CancelledError):
            await waiter
        with pytest.raises(asyncio.CancelledError):
            await holder
        release.set()
        await asyncio.wait_for(last, 5)
        return order

    assert asyncio.run(scenario()) == ["holder", "last"]
