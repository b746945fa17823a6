"""Guard checks in turns, in arrival order (gateway/llmproxy/order.py): the
turns themselves, then through the daemon on Redis, where each check waits
on round trips."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gateway.llmproxy.order import Turns
from tests.fakes.llm import FakeLLM, answer
from tests.llm_proxy import proxy_daemon, raw_post


async def test_checks_run_one_at_a_time_in_the_order_they_came() -> None:
    gate, log = Turns(wait=10.0, hold=10.0), []

    async def check(name: str) -> None:
        async with gate.turn():
            log.append(f"{name} in")
            await asyncio.sleep(0.01)  # a round trip to the store
            await asyncio.sleep(0)
            log.append(f"{name} out")

    tasks = [asyncio.create_task(check(n)) for n in "abcd"]
    await asyncio.gather(*tasks)
    assert log == ["a in", "a out", "b in", "b out", "c in", "c out", "d in", "d out"]


async def test_a_check_that_waits_past_the_hold_lets_the_next_start() -> None:
    gate, log = Turns(wait=10.0, hold=0.05), []
    stuck = asyncio.Event()  # a store that does not answer (its own timeout bounds it)

    async def quick(name: str) -> None:
        async with gate.turn():
            log.append(f"{name} in")
            await asyncio.sleep(0)
            log.append(f"{name} out")

    first = asyncio.create_task(_hold(gate, "slow", log, stuck))
    await asyncio.sleep(0)
    others = [asyncio.create_task(quick(n)) for n in "ab"]
    await asyncio.wait_for(asyncio.gather(*others), 1.0)  # not held until `stuck`
    assert log == ["slow in", "a in", "a out", "b in", "b out"]
    stuck.set()
    await first  # released once: a second release would raise here
    await asyncio.wait_for(_enter(gate), 1.0)  # and free again (its wait is 10 s)
    assert log[-1] == "slow out"


async def test_a_check_that_waited_past_its_wait_goes_on_beside_the_others() -> None:
    # A queue that long means requests come faster than turns get through:
    # the rest then share the store's round trips instead of queueing.
    gate, log = Turns(wait=0.05, hold=10.0), []
    release = asyncio.Event()

    async def late() -> None:
        async with gate.turn():
            log.append("late in")

    first = asyncio.create_task(_hold(gate, "holder", log, release))
    await asyncio.sleep(0)
    await asyncio.wait_for(late(), 1.0)  # in after 0.05 s, the holder still in
    assert log == ["holder in", "late in"]
    release.set()
    await first  # the late one did not release the holder's turn: that would raise here
    # free again, sooner than a check that found it taken would go on anyway
    await asyncio.wait_for(_enter(gate), 0.01)
    assert log[-1] == "holder out"


async def test_a_check_that_fails_or_is_cancelled_gives_its_turn_up() -> None:
    gate = Turns(wait=10.0, hold=10.0)
    with pytest.raises(RuntimeError):
        async with gate.turn():
            raise RuntimeError("the store said no")
    holder_in = asyncio.Event()

    async def holder() -> None:
        async with gate.turn():
            holder_in.set()
            await asyncio.sleep(10)

    held = asyncio.create_task(holder())
    await holder_in.wait()
    waiting = asyncio.create_task(_enter(gate))
    await asyncio.sleep(0.01)
    waiting.cancel()  # the agent went away while its check waited for its turn
    held.cancel()
    for task in (waiting, held):
        with pytest.raises(asyncio.CancelledError):
            await task
    await asyncio.wait_for(_enter(gate), 1.0)  # nobody left holding it


async def _enter(gate: Turns) -> None:
    async with gate.turn():
        pass


async def _hold(gate: Turns, name: str, log: list[str], until: asyncio.Event) -> None:
    """A check in its turn until `until` is set (its store answers)."""
    async with gate.turn():
        log.append(f"{name} in")
        await until.wait()
        log.append(f"{name} out")


def _history(i: int) -> dict[str, Any]:
    call = {"id": f"call_{i}", "type": "function",
            "function": {"name": "lookup", "arguments": json.dumps({"key": i})}}  # fmt: skip
    return {"model": "m", "messages": [
        {"role": "user", "content": f"task {i}"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": f"value {i}"},
    ]}  # fmt: skip


async def test_requests_that_come_together_are_checked_one_after_another(
    redis_url: str, key_prefix: str
) -> None:
    # Breaks if the checks of requests that arrive together interleave at
    # their store trips (each reads the session's seen events, then feeds
    # the guard): then every one of them is forwarded as late as the last.
    async with FakeLLM() as llm:
        llm.default = answer("Done.")
        async with proxy_daemon(llm, redis_url, key_prefix) as (d, url):
            assert d.llm_proxy is not None and d.guard is not None
            # a slow machine's check must neither pass its turn on nor skip it
            d.llm_proxy.order.hold = d.llm_proxy.order.wait = 10.0
            log: list[tuple[str, str]] = []
            seen, feed = d.llm_proxy.seen.new, d.guard.feed

            async def reading(session: str, *rest: Any) -> Any:
                log.append((session, "read"))
                return await seen(session, *rest)

            async def feeding(session: str, *rest: Any) -> Any:
                try:
                    return await feed(session, *rest)
                finally:
                    log.append((session, "fed"))

            d.llm_proxy.seen.new = reading  # type: ignore[method-assign]
            d.guard.feed = feeding  # type: ignore[method-assign]
            sessions = [f"{key_prefix}together-{i}" for i in range(6)]
            route = f"{url}/llm/openai/v1/chat/completions"
            posts = [
                raw_post(route, _history(i), **{"X-Botbouncer-Session": s})
                for i, s in enumerate(sessions)
            ]
            results = await asyncio.gather(*posts)
    assert all(code == 200 for code, *_ in results)
    assert len(log) == 12
    # each check's read and feed next to each other: no other check in between
    assert all(log[i][0] == log[i + 1][0] for i in range(0, 12, 2)), log
    assert [step for _, step in log] == ["read", "fed"] * 6
