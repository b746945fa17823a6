"""`GET /healthz` and the store's health, caused for real: hundreds of health
checks at once against a real Redis during a two-bot loop, and a Redis out
of memory (`maxmemory` with `noeviction`) that answers PING but refuses
every write."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from gateway.daemon import Daemon
from gateway.health import Health
from gateway.store import StoreError
from gateway.store.failover import FailoverStore
from tests.daemons import build, pingpong
from tests.redis_server import RedisServer

SOFT = 4
CHECKS = 300


def http_bot(name: str) -> dict[str, Any]:
    return {"name": name, "platform": "http", "backend": {"type": "echo"},
            "bot_messages": "all", "respond_to": "all",
            "turns": {"soft_limit": SOFT, "hard_limit": 2 * SOFT},
            "rate_cap": {"max_replies": 1000}}  # fmt: skip


def failover(d: Daemon) -> FailoverStore:
    assert isinstance(d.store, FailoverStore)
    return d.store


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    # no client-side cap on connections: every check is its own request at once
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        yield session


async def health(http: aiohttp.ClientSession, url: str) -> tuple[str, float]:
    """/healthz's status and the store_degraded gauge, read one after the other."""
    async with http.get(f"{url}/healthz") as r:
        assert r.status == 200
        status = (await r.json())["status"]
    async with http.get(f"{url}/metrics") as r:
        families = text_string_to_metric_families(await r.text())
        gauge = next(f for f in families if f.name == "botbouncer_store_degraded")
    return status, gauge.samples[0].value


def poster(http: aiohttp.ClientSession, url: str) -> Any:
    async def post(bot: str, body: dict[str, Any]) -> dict[str, Any]:
        async with http.post(f"{url}/v1/bots/{bot}/messages", json=body) as r:
            assert r.status == 200, await r.text()
            out: dict[str, Any] = await r.json()
            return out

    return post


# -- a flood of health checks -------------------------------------------------


async def test_hundreds_of_concurrent_health_checks_never_degrade_a_healthy_redis(
    redis_url: str, key_prefix: str, http: aiohttp.ClientSession
) -> None:
    """Each check used to take a pooled Redis connection of its own: 300 at
    once emptied redis-py's pool of 100, answered `degraded` and moved the
    store to local memory mid-loop, so loops overran the soft limit and
    warnings were lost. One check runs at a time now; the rest share it.

    The client, its 300 requests and the daemon share one event loop here, so
    on a loaded two-core machine a Redis answer can wait behind them longer
    than the default 0.5 s store timeout: that is this loop's latency, not
    Redis's, and it once degraded the store in CI. The store's timeout is
    raised for that reason only; the pool running dry fails at once, whatever
    the timeout."""
    daemon = build(
        redis_url, key_prefix, http_bot("ping"), http_bot("pong"), store={"timeout_seconds": 5}
    )
    url = await daemon.start()
    statuses: list[str] = []
    stop = asyncio.Event()

    async def flood() -> None:
        while not stop.is_set():
            answers = await asyncio.gather(*(health(http, url) for _ in range(CHECKS)))
            statuses.extend(status for status, _ in answers)

    try:
        flooding = asyncio.create_task(flood())
        post = poster(http, url)
        loops = await asyncio.gather(
            *(pingpong(post, f"loop-{i}", "ping", "pong") for i in range(10))
        )
        stop.set()
        await flooding
    finally:
        await daemon.stop()
        redis = aioredis.from_url(redis_url)
        keys = [k async for k in redis.scan_iter(match=f"{key_prefix}:*")]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()

    assert len(statuses) >= CHECKS
    assert set(statuses) == {"ok"}
    store = failover(daemon)
    assert store.outages == 0
    for relay in loops:  # stopped at exactly the soft limit, one warning each
        assert len(relay.replies) == SOFT and len(relay.warnings) == 1
        assert relay.last["reason"] == "turn_throttled"
    # one check at a time, shared: far fewer store checks than requests
    assert daemon.server.health.checks < len(statuses) / 10


async def test_concurrent_reports_share_one_check_and_a_fresh_answer() -> None:
    class SlowStore:
        kind = "redis"
        calls = 0

        async def ping(self) -> None:
            self.calls += 1
            await asyncio.sleep(0.05)  # a check in flight while the others arrive

    store = SlowStore()
    h = Health(store, fresh=60)  # type: ignore[arg-type]
    answers = await asyncio.gather(*(h.report() for _ in range(CHECKS)))
    assert store.calls == 1 and all(a == {"status": "ok", "store": "redis"} for a in answers)
    await h.report()
    assert store.calls == 1  # still fresh

    h.fresh = 0
    one = asyncio.ensure_future(h.report())
    two = asyncio.ensure_future(h.report())
    await asyncio.sleep(0)
    one.cancel()  # one caller going away does not cancel the shared check
    assert await two == {"status": "ok", "store": "redis"}
    assert store.calls == 2


# -- a Redis out of memory ----------------------------------------------------


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    server = RedisServer("--maxmemory-policy", "noeviction").start()
    try:
        yield server
    finally:
        server.stop()


async def out_of_memory(server: RedisServer) -> None:
    """Fill Redis a little, then set its `maxmemory` below what it uses:
    every write is refused ("OOM command not allowed"), PING still answers."""
    client = aioredis.from_url(server.url)
    try:
        await client.mset({f"filler:{i}": "x" * 1000 for i in range(500)})
        used = int((await client.info("memory"))["used_memory"])
        await client.config_set("maxmemory", used // 2)
        assert await client.ping()
        with pytest.raises(Exception, match=r"OOM|maxmemory"):
            await client.set("one-more", "x")
    finally:
        await client.aclose()


async def memory_back(server: RedisServer) -> None:
    client = aioredis.from_url(server.url)
    try:
        await client.config_set("maxmemory", 0)
    finally:
        await client.aclose()


@pytest.mark.slow
async def test_redis_out_of_memory_is_degraded_the_whole_time_without_flapping(
    redis: RedisServer, http: aiohttp.ClientSession
) -> None:
    """A Redis that answers PING but refuses writes used to flap: the probe's
    PING switched the store back, the next admit failed (55 switches in 6 s),
    /healthz said `ok` and the gauge read 0 most of the time. The probe is a
    write now, and health reports what the store does."""
    daemon = build(redis.url, "bb", http_bot("ping"), http_bot("pong"))
    url = await daemon.start()
    store = failover(daemon)
    post = poster(http, url)
    try:
        first = await pingpong(post, "before", "ping", "pong")
        assert len(first.replies) == SOFT
        # A call that timed out in a stall of this 2-core machine is an outage
        # too, over when the probe finds Redis: counted from here on.
        if store.degraded:
            await asyncio.wait_for(store.wait_recovered(), 5)
        before = store.outages

        await out_of_memory(redis)
        samples: list[tuple[str, float]] = []
        for i in range(4):  # decisions go on, locally: loops still stopped
            relay = await pingpong(post, f"oom-{i}", "ping", "pong")
            assert len(relay.replies) == SOFT and len(relay.warnings) == 1
            samples.append(await health(http, url))
        assert store.degraded
        # longer than several probe intervals: the probe never takes it back
        for _ in range(15):
            await asyncio.sleep(store.retry_max / 5)  # sampling over time, nothing to await
            samples.append(await health(http, url))
        assert set(samples) == {("degraded", 1.0)}
        assert store.outages == before + 1  # left Redis once, never came back meanwhile
        async with http.get(f"{url}/healthz") as r:
            body = await r.json()
        assert "unreachable" in body["error"] and "maxmemory" in body["error"]

        await memory_back(redis)
        await asyncio.wait_for(store.wait_recovered(), 5)
        assert await health(http, url) == ("ok", 0.0)
        after = await pingpong(post, "after", "ping", "pong")
        assert len(after.replies) == SOFT and len(after.warnings) == 1
    finally:
        await daemon.stop()


async def test_a_failed_health_check_is_reported_but_moves_nothing(
    redis: RedisServer,
) -> None:
    """No decision has failed yet, so the store is on Redis; the health check
    finds that Redis refuses writes and says so, but only decisions' own
    calls move the store to local memory."""
    from gateway.store import open_store

    store = open_store(redis.url, timeout=0.3)
    assert isinstance(store, FailoverStore)
    try:
        await out_of_memory(redis)
        body = await Health(store).report()
        assert body["status"] == "degraded" and "maxmemory" in body["error"]
        assert not store.degraded and store.outages == 0
        with pytest.raises(StoreError, match="write check failed"):
            await store.ping()
        assert not store.degraded
    finally:
        await store.close()
