"""Decide-mode tickets in both stores: one transition rule, lapse, and a
Redis that goes away (the failover never calls a ticket it cannot see unknown)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.store import MemoryStore, Store, StoreError
from gateway.store.failover import FailoverStore
from gateway.store.redis import LateCall, RedisStore
from gateway.store.tickets import ISSUED, RELEASED, SENT, MemoryTickets
from tests.redis_server import free_port


async def test_an_issued_ticket_is_sent_then_sent_again(store: Store) -> None:
    await store.issue_ticket("b/t1", "{rec}", 60_000)
    assert await store.spend_ticket("b/t1", SENT) == (ISSUED, "{rec}")
    assert await store.spend_ticket("b/t1", SENT) == (SENT, "{rec}")  # a second piece
    # a release after a send is refused by the caller: the state stays sent
    assert await store.spend_ticket("b/t1", RELEASED) == (SENT, "{rec}")
    assert await store.spend_ticket("b/t1", SENT) == (SENT, "{rec}")


async def test_a_released_ticket_stays_released(store: Store) -> None:
    await store.issue_ticket("b/t2", "r", 60_000)
    assert await store.spend_ticket("b/t2", RELEASED) == (ISSUED, "r")
    assert await store.spend_ticket("b/t2", SENT) == (RELEASED, "r")
    assert await store.spend_ticket("b/t2", RELEASED) == (RELEASED, "r")


async def test_an_unknown_ticket_is_none(store: Store) -> None:
    assert await store.spend_ticket("b/never", SENT) is None


async def test_a_ticket_lapses(store: Store) -> None:
    if isinstance(store, MemoryStore):
        await store.issue_ticket("b/t3", "r", 1000, now_ms=5_000)
        assert await store.spend_ticket("b/t3", SENT, now_ms=5_999) == (ISSUED, "r")
        assert await store.spend_ticket("b/t3", SENT, now_ms=6_000) is None
    else:  # Redis's own clock lapses it
        await store.issue_ticket("b/t3", "r", 20)
        await asyncio.sleep(0.1)
        assert await store.spend_ticket("b/t3", SENT) is None


def test_the_memory_store_keeps_a_bounded_number_of_tickets() -> None:
    tickets = MemoryTickets(max_tickets=3)
    for i in range(5):
        tickets.issue(f"t{i}", "r", 60_000, now_ms=i)
    assert tickets.spend("t0", SENT, now_ms=10) is None  # the oldest forgotten
    assert tickets.spend("t4", SENT, now_ms=10) == (ISSUED, "r")


async def test_a_ticket_issued_during_an_outage_is_spent_locally() -> None:
    dead = RedisStore.from_url(f"redis://127.0.0.1:{free_port()}/0", call_timeout=0.2)
    store = FailoverStore(dead, MemoryStore(), timeout=0.2, retry_min=60, retry_max=60)
    try:
        await store.issue_ticket("b/t4", "r", 60_000)
        assert store.degraded
        assert await store.spend_ticket("b/t4", SENT) == (ISSUED, "r")
        # one it does not know may be on Redis: try again later, not "unknown"
        with pytest.raises(StoreError, match="may be filed there"):
            await store.spend_ticket("b/elsewhere", SENT)
    finally:
        await store.close()


async def test_a_ticket_issued_locally_is_found_once_redis_is_back(
    redis_url: str, key_prefix: str
) -> None:
    primary = RedisStore.from_url(redis_url, prefix=key_prefix)
    local = MemoryStore()
    store = FailoverStore(primary, local)
    try:
        await local.issue_ticket("b/t5", "r", 60_000)  # as during an outage
        assert await store.spend_ticket("b/t5", RELEASED) == (ISSUED, "r")
        assert await store.spend_ticket("b/none", SENT) is None  # Redis up: truly unknown
    finally:
        await store.close()


async def test_a_pause_refused_for_a_late_redis_says_why(redis_url: str, key_prefix: str) -> None:
    # Breaks if the refusal reads the outage's error, which a call late alone
    # (Redis answers, this one came after its deadline) leaves unset: the
    # admin was told "Redis is unreachable (None)".
    class Late(RedisStore):
        async def set_paused(self, chat: str, paused: bool) -> None:
            raise LateCall("came after its deadline")

    store = FailoverStore(Late.from_url(redis_url, prefix=key_prefix), MemoryStore())
    try:
        with pytest.raises(StoreError) as refused:
            await store.set_paused("http:room", True)
        assert not store.degraded
        assert "(too slow)" in str(refused.value) and "None" not in str(refused.value)
    finally:
        await store.close()
