"""adapters.common.WorkSlots: at most n messages worked on at once; one
waiting on a model gives its place up; cancelling never makes a place."""

from __future__ import annotations

import asyncio

import pytest

from adapters.common import WorkSlots


async def test_at_most_n_work_at_once_and_a_waiting_one_gives_its_place_up() -> None:
    slots = WorkSlots(2)
    working: list[int] = []
    most = 0
    backend = asyncio.Event()

    async def message(n: int, *, slow: bool) -> None:
        nonlocal most
        async with slots.working() as slot:
            working.append(n)
            most = max(most, len(working))
            await asyncio.sleep(0)
            working.remove(n)
            if slow:
                async with slot.waiting():
                    await backend.wait()
            working.append(n)
            most = max(most, len(working))
            await asyncio.sleep(0)
            working.remove(n)

    slow = [asyncio.create_task(message(n, slow=True)) for n in range(2)]
    quick = [asyncio.create_task(message(n, slow=False)) for n in range(2, 6)]
    await asyncio.wait_for(asyncio.gather(*quick), 5)  # the slow ones gave their places up
    assert not any(t.done() for t in slow)
    backend.set()
    await asyncio.wait_for(asyncio.gather(*slow), 5)
    assert most == 2


async def test_cancelled_while_queueing_for_a_place_again_makes_no_place() -> None:
    slots = WorkSlots(1)
    backend = asyncio.Event()
    back_in_line = asyncio.Event()

    async def slow() -> None:
        async with slots.working() as slot:
            async with slot.waiting():
                await backend.wait()
            back_in_line.set()

    holder_may_go = asyncio.Event()

    async def holder() -> None:
        async with slots.working():
            await holder_may_go.wait()

    first = asyncio.create_task(slow())
    await asyncio.sleep(0)
    second = asyncio.create_task(holder())  # takes the place the slow one gave up
    await asyncio.sleep(0)
    backend.set()
    await asyncio.sleep(0.01)  # the slow one now queues for a place again
    assert not back_in_line.is_set()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    holder_may_go.set()
    await second
    # exactly one place: two at once would both get in
    inside: list[int] = []
    seen_together = 0

    async def probe(n: int) -> None:
        nonlocal seen_together
        async with slots.working():
            inside.append(n)
            seen_together = max(seen_together, len(inside))
            await asyncio.sleep(0.001)
            inside.remove(n)

    await asyncio.gather(*(probe(n) for n in range(4)))
    assert seen_together == 1
