"""Automatic pipelining of script calls: shared trips, separate outcomes."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from gateway.store import AdmitRequest, Limits, Observed, StoreError
from gateway.store.batching import AutoPipeline, _Link
from gateway.store.redis import RedisStore, connect
from gateway.turns import Count
from tests.redis_server import RedisServer

ECHO = "if ARGV[1] == 'boom' then return redis.error_reply('boom') end return ARGV[1]"


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    c = aioredis.from_url(redis_url, decode_responses=True)
    yield c
    await c.aclose()


def count_writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every write any pipeline makes (calls per write)."""
    writes: list[int] = []
    real = _Link.send

    def counting(self: _Link, calls: list, deadline: float | None) -> None:  # type: ignore[type-arg]
        writes.append(len(calls))
        real(self, calls, deadline)

    monkeypatch.setattr(_Link, "send", counting)
    return writes


def count_checkouts(monkeypatch: pytest.MonkeyPatch, client: aioredis.Redis) -> list[object]:
    """Every connection taken out of the client's pool."""
    taken: list[object] = []
    pool = client.connection_pool
    real = pool.get_connection

    async def counted(*args: object, **kwargs: object) -> object:
        conn = await real(*args, **kwargs)  # type: ignore[arg-type]
        taken.append(conn)
        return conn

    monkeypatch.setattr(pool, "get_connection", counted)
    return taken


async def test_concurrent_calls_share_writes_and_each_gets_its_own_answer(
    client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    auto = AutoPipeline(client, max_batch=8)
    script = client.register_script(ECHO)
    await client.script_load(ECHO)  # else the first calls come back NOSCRIPT and retry
    writes, taken = count_writes(monkeypatch), count_checkouts(monkeypatch, client)
    results = await asyncio.gather(*(auto.script(script, [], [f"v{i}"]) for i in range(40)))
    assert results == [f"v{i}" for i in range(40)]
    # 40 calls in one loop iteration, 8 to a write, every write down one
    # connection before any answer came back: answers resolve in order
    assert writes == [8] * 5
    assert len(taken) == 1


async def test_answers_come_back_in_the_type_the_client_asks_for(redis_url: str) -> None:
    for decode, expected in ((True, "é"), (False, "é".encode())):
        c = aioredis.from_url(redis_url, decode_responses=decode)
        try:
            assert await AutoPipeline(c).call("ECHO", "é") == expected
        finally:
            await c.aclose()


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
    batch; calls written after it on the same connection hear at once that it
    closed; the answers Redis owes never reach a later caller."""
    server = RedisServer().start()
    client = connect(server.url, socket_timeout=None)  # the batch's timer is the only one
    other = aioredis.from_url(server.url)
    auto = AutoPipeline(client, timeout=0.2)
    try:
        busy, echo = client.register_script(BUSY), client.register_script(ECHO)
        await client.script_load(BUSY)
        await client.script_load(ECHO)
        assert await auto.script(echo, [], ["connected"]) == "connected"
        started = time.monotonic()
        first = asyncio.gather(
            auto.script(busy, [], [1500]), auto.script(echo, [], ["x"]), return_exceptions=True
        )
        await asyncio.sleep(0.05)  # a later write, on the same connection, behind the busy one
        second = await asyncio.gather(auto.script(echo, [], ["y"]), return_exceptions=True)
        results = await first
        took = time.monotonic() - started
        assert all(isinstance(r, TimeoutError) for r in results), results
        assert isinstance(second[0], RedisConnectionError), second  # closed under it
        assert took < 1.0  # before Redis could have answered anything: the deadline did it
        await other.ping()  # Redis is done with the busy script
        assert await auto.script(echo, [], ["after"]) == "after"  # not the stale 'late'
    finally:
        await client.aclose()
        await other.aclose()
        server.stop()


async def test_no_timeout_given_means_the_clients_socket_timeout() -> None:
    server = RedisServer().start()
    client = connect(server.url, socket_timeout=0.2)
    try:
        busy = client.register_script(BUSY)
        await client.script_load(BUSY)
        auto = AutoPipeline(client)
        with pytest.raises(TimeoutError):
            await auto.script(busy, [], [1500])
    finally:
        await client.aclose()
        server.stop()


async def test_a_call_given_up_before_redis_was_reached_is_never_sent() -> None:
    """Redis frozen while the connection opens: the caller times out and
    answers without Redis (FailoverStore counts it locally). When Redis wakes
    the call must not run there as well, or it would count twice."""
    server = RedisServer().start()
    client = connect(server.url, socket_timeout=None)
    auto = AutoPipeline(client, timeout=0.2)
    assert server.proc is not None
    try:
        server.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(TimeoutError):
                await auto.call("INCR", "given-up")
        finally:
            server.proc.send_signal(signal.SIGCONT)
        # in order behind the given-up call, on the connection it waited for
        assert await auto.call("GET", "given-up") is None
        assert await auto.call("INCR", "given-up") == 1
    finally:
        await client.aclose()
        server.stop()


async def test_one_connection_for_every_trip_and_a_lost_one_goes_back_to_the_pool(
    client: aioredis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipeline keeps the connection it uses (no pool checkout per trip);
    one Redis closed is handed back to the pool, closed, and the next call
    connects afresh."""
    auto = AutoPipeline(client)
    script = client.register_script(ECHO)
    await client.script_load(ECHO)
    taken = count_checkouts(monkeypatch, client)
    for i in range(20):  # one after the other: one trip at a time
        assert await auto.script(script, [], [f"v{i}"]) == f"v{i}"
    assert len(taken) == 1
    killer = aioredis.from_url(redis_url)
    try:
        my_id = await auto.call("CLIENT", "ID")
        assert await killer.client_kill_filter(_id=my_id) == 1
        # the next call either finds the connection gone and connects afresh, or
        # was written before the close reached this process and hears of it
        try:
            assert await auto.script(script, [], ["again"]) == "again"
        except RedisConnectionError:
            assert await auto.script(script, [], ["again"]) == "again"
    finally:
        await killer.aclose()
    assert len(taken) == 2  # the pool's: redis-py may hand back the same object, reconnected
    assert await auto.call("CLIENT", "ID") != my_id


async def test_an_argument_redis_cannot_take_fails_its_batch_not_the_connection(
    client: aioredis.Redis,
) -> None:
    auto = AutoPipeline(client)
    assert await auto.call("ECHO", "before") == "before"
    with pytest.raises(TypeError):
        await auto.call("ECHO", None)
    assert await auto.call("ECHO", "after") == "after"
