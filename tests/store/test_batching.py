"""Automatic pipelining of script calls: shared trips, separate outcomes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from gateway.store import AdmitRequest, Limits, Observed, StoreError
from gateway.store.batching import AutoPipeline
from gateway.store.redis import RedisStore, connect
from gateway.turns import Count
from tests.redis_server import RedisServer

ECHO = "if ARGV[1] == 'boom' then return redis.error_reply('boom') end return ARGV[1]"


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    c = aioredis.from_url(redis_url, decode_responses=True)
    yield c
    await c.aclose()


async def test_concurrent_calls_share_writes_and_each_gets_its_own_answer(
    client: aioredis.Redis,
) -> None:
    auto = AutoPipeline(client, max_batch=8)
    sends = 0
    real = auto._send

    async def counting(batch):  # type: ignore[no-untyped-def]
        nonlocal sends
        sends += 1
        await real(batch)

    auto._send = counting  # type: ignore[method-assign]
    script = client.register_script(ECHO)
    await client.script_load(ECHO)  # else the first calls come back NOSCRIPT and retry
    results = await asyncio.gather(*(auto.script(script, [], [f"v{i}"]) for i in range(40)))
    assert results == [f"v{i}" for i in range(40)]
    assert sends == 5  # 40 calls in one loop iteration, 8 to a write


async def test_one_call_failing_leaves_the_others_alone(client: aioredis.Redis) -> None:
    auto = AutoPipeline(client)
    script = client.register_script(ECHO)
    results = await asyncio.gather(
        *(auto.script(script, [], [v]) for v in ("a", "boom", "c")), return_exceptions=True
    )
    assert results[0] == "a" and results[2] == "c"
    assert isinstance(results[1], ResponseError) and "boom" in str(results[1])


async def test_a_cancelled_caller_does_not_disturb_the_batch(client: aioredis.Redis) -> None:
    auto = AutoPipeline(client)
    script = client.register_script(ECHO)
    tasks = [asyncio.create_task(auto.script(script, [], [f"v{i}"])) for i in range(3)]
    await asyncio.sleep(0)  # let all three queue
    tasks[1].cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert done[0] == "v0" and done[2] == "v2"
    assert isinstance(done[1], asyncio.CancelledError)
    assert await auto.script(script, [], ["after"]) == "after"


async def test_a_dead_redis_reaches_every_waiting_caller_as_a_store_error() -> None:
    server = RedisServer().start()
    store = RedisStore.from_url(server.url, prefix="dead")
    try:

        def req(i: int) -> AdmitRequest:
            obs = Observed("c", f"m{i}", "alice", "alice", Count.RESET, "hi")
            return AdmitRequest(obs, "B", None, False, Limits())

        assert (await store.admit(req(0))).reserved
        server.kill()
        results = await asyncio.gather(*(store.admit(req(i)) for i in range(1, 6)),
                                       return_exceptions=True)  # fmt: skip
        assert all(isinstance(r, StoreError) for r in results), results
    finally:
        await store.close()
        server.stop()


async def test_a_redis_never_reached_is_a_store_error_not_a_hang() -> None:
    """No connection at all (nothing listens): the batch could not even check
    one out; every caller must still hear it."""
    from tests.redis_server import free_port

    store = RedisStore.from_url(f"redis://127.0.0.1:{free_port()}/0", prefix="never")
    try:

        def req(i: int) -> AdmitRequest:
            obs = Observed("c", f"m{i}", "alice", "alice", Count.RESET, "hi")
            return AdmitRequest(obs, "B", None, False, Limits())

        async with asyncio.timeout(10):
            results = await asyncio.gather(*(store.admit(req(i)) for i in range(3)),
                                           return_exceptions=True)  # fmt: skip
        assert all(isinstance(r, StoreError) for r in results), results
    finally:
        await store.close()


# Keeps Redis busy for ARGV[1] ms (a script blocks the server while it runs).
BUSY = """
local t = redis.call('TIME')
local start = t[1] * 1000000 + t[2]
repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - start >= ARGV[1] * 1000
return 'late'
"""


async def test_a_batch_past_its_timeout_fails_its_callers_and_its_connection_is_dropped() -> None:
    """With a timeout, callers hear TimeoutError while Redis still works on the
    batch; the answers it owes then never reach a later caller."""
    server = RedisServer().start()
    client = connect(server.url, socket_timeout=None)  # the batch's timer is the only one
    other = aioredis.from_url(server.url)
    auto = AutoPipeline(client, timeout=0.05)
    try:
        busy, echo = client.register_script(BUSY), client.register_script(ECHO)
        await client.script_load(BUSY)
        await client.script_load(ECHO)
        started = time.monotonic()
        results = await asyncio.gather(
            auto.script(busy, [], [1000]), auto.script(echo, [], ["x"]), return_exceptions=True
        )
        assert all(isinstance(r, TimeoutError) for r in results), results
        if auto._sending:
            await asyncio.wait(auto._sending)  # the trip stops too, its connection closed
        took = time.monotonic() - started
        assert took < 1.0  # before Redis could have answered anything: the deadline did it
        await other.ping()  # Redis is done with the busy script
        assert await auto.script(echo, [], ["after"]) == "after"  # not the stale 'late'
    finally:
        await client.aclose()
        await other.aclose()
        server.stop()


async def test_trips_reuse_their_connections_and_a_failed_one_goes_back_to_the_pool(
    client: aioredis.Redis,
) -> None:
    """The pipeline keeps the connections it used (no pool checkout per trip);
    one whose trip failed is closed and handed back, never reused dirty."""
    pool = client.connection_pool
    auto = AutoPipeline(client)
    script = client.register_script(ECHO)
    await client.script_load(ECHO)
    checkouts = 0
    real = pool.get_connection

    async def counted(*args: object, **kwargs: object) -> object:
        nonlocal checkouts
        checkouts += 1
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    pool.get_connection = counted  # type: ignore[method-assign]
    for i in range(20):  # one after the other: one trip at a time, one connection
        assert await auto.script(script, [], [f"v{i}"]) == f"v{i}"
    assert checkouts == 1
    [kept] = auto._idle

    async def broken(*args: object, **kwargs: object) -> None:
        raise ConnectionError("connection reset by peer")

    kept.read_response = broken
    with pytest.raises(ConnectionError):
        await auto.script(script, [], ["lost"])
    assert auto._idle == [] and not kept.is_connected
    assert kept in pool._available_connections  # handed back, closed
    del kept.read_response
    assert await auto.script(script, [], ["again"]) == "again"
    assert checkouts == 2
