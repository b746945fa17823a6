"""Automatic pipelining of script calls: shared trips, separate outcomes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from gateway.store import AdmitRequest, Limits, Observed, StoreError
from gateway.store.batching import AutoPipeline
from gateway.store.redis import RedisStore
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
