"""Redis behind Sentinel (tests/redis_sentinel.py: a master, a replica and
three sentinels, all real): the master is SIGKILLed while two daemons work,
the sentinels promote the replica, and the daemons follow it. Loops still
stop at the soft limit with one warning, people are still answered, and no
answer is a 5xx."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from gateway.store import open_store
from gateway.store.failover import FailoverStore
from tests.daemons import pingpong
from tests.redis_sentinel import SentinelSetup
from tests.test_outage import ADDED_LATENCY, SOFT, bot_turn, health, ping_and_pong

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

# What following a failover may take: the sentinels' down-after (0.5 s) and
# election, then the store's next probe (at most its retry interval).
FOLLOWED_WITHIN = 10.0


@pytest.fixture
def sentinel() -> Iterator[SentinelSetup]:
    with SentinelSetup() as setup:
        yield setup


async def test_the_store_follows_the_master_the_sentinels_promote(
    sentinel: SentinelSetup,
) -> None:
    store = open_store(sentinel.url, timeout=0.3)
    assert isinstance(store, FailoverStore)
    try:
        first = await store.admit(bot_turn("s"))
        old = sentinel.kill_master()
        took = await asyncio.to_thread(sentinel.wait_failover)  # the loop runs on
        t0 = time.perf_counter()
        while store.degraded or (await store.admit(bot_turn("s"))).soft <= first.soft:
            await asyncio.sleep(0.05)  # the store decides locally until its probe gets through
            assert time.perf_counter() - t0 < FOLLOWED_WITHIN
        assert not store.degraded
        assert sentinel.master_port() != old
        print(f"promoted in {took:.2f} s; the store followed in {time.perf_counter() - t0:.2f} s")
    finally:
        await store.close()


async def test_two_daemons_follow_a_failover_and_every_loop_still_stops(
    sentinel: SentinelSetup,
) -> None:
    # The traffic's people write the moment they are answered, for longer
    # than in the outage tests (a promotion takes seconds): past the default
    # cap of 1,000 replies a window, which is not what this test is about.
    uncapped = {"rate_cap": {"max_replies": 1_000_000}}
    async with ping_and_pong(sentinel.url, **uncapped) as pp:
        post, http, urls, traffic = pp.post, pp.http, pp.urls, pp.traffic
        before = await pingpong(post, "loop-before", "ping", "pong")
        assert len(before.replies) == SOFT and len(before.warnings) == 1

        sentinel.kill_master()
        traffic.phase = "failover"
        during = await pingpong(post, "loop-during", "ping", "pong")
        assert len(during.replies) == SOFT and len(during.warnings) == 1
        await asyncio.to_thread(sentinel.wait_failover)  # traffic goes on meanwhile
        t0 = time.perf_counter()
        for d in pp.daemons:
            assert isinstance(d.store, FailoverStore)
            await asyncio.wait_for(d.store.wait_recovered(), FOLLOWED_WITHIN)
        followed = time.perf_counter() - t0
        traffic.phase = "after"
        for url in urls.values():
            assert await health(http, url) == ("ok", 0.0)
        after = await pingpong(post, "loop-after", "ping", "pong")
        assert len(after.replies) == SOFT and len(after.warnings) == 1

    print(
        f"the daemons were back on Redis {followed:.2f} s after the promotion; "
        f"{len(traffic.seen)} people's messages, {len(traffic.during('failover'))} in it"
    )
    assert {s[1] for s in traffic.seen} == {200}  # never a 5xx
    assert {s[2] for s in traffic.seen} == {"reply"}  # every person answered
    failover = traffic.during("failover")
    assert failover, "no traffic fell in the failover"
    assert max(s[3] for s in failover) < ADDED_LATENCY  # no one waited on a dead master
