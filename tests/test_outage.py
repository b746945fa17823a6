"""Redis outages, caused (docs/architecture.md): a redis-server this test started is
SIGKILLed, frozen (SIGSTOP), flushed of its scripts or restarted empty, while
the daemon works. Never a 5xx, never a wait on Redis timeouts, loops still
stopped by local state, people still answered, back on Redis within 5 s.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import parse_config
from gateway.daemon import Daemon
from gateway.guard.engine import FailoverEngine, engine_for
from gateway.guard.service import Guard
from gateway.model import Action, Turn
from gateway.store import (
    AdmitRequest,
    Limits,
    Observed,
    Overrides,
    SentRequest,
    StoreError,
    open_store,
)
from gateway.store.failover import FailoverStore
from gateway.turns import Count
from tests.daemons import build, pingpong, redis_of
from tests.redis_server import RedisServer

SOFT = 4
LIMITS = Limits(soft_limit=SOFT, hard_limit=8, max_replies=100)
ADDED_LATENCY = 1.0  # the bound on what an outage may add to one message


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


def restart(server: RedisServer) -> None:
    """The same port again, with nothing in it (nothing is kept on disk)."""
    server.kill()
    server.start()


@pytest.fixture
async def store(redis: RedisServer) -> AsyncIterator[FailoverStore]:
    s = open_store(redis.url, timeout=0.3)
    assert isinstance(s, FailoverStore)
    changes: list[bool] = []
    s.on_change = changes.append
    s.changes = changes  # type: ignore[attr-defined]
    yield s
    await s.close()


_ids = itertools.count()


def bot_turn(chat: str = "c", author: str = "other") -> AdmitRequest:
    msg = Observed(chat, f"m{next(_ids)}", author, author, Count.BOT)
    return AdmitRequest(msg, "me", None, True, LIMITS)


async def on_redis(server: RedisServer, chat: str = "c") -> int:
    """The soft counter Redis itself holds for `chat` (0 when it has none)."""
    client = aioredis.from_url(server.url, decode_responses=True)
    try:
        keys = [k async for k in client.scan_iter(match=f"*{{{chat}}}:st")]
        return int(await client.hget(keys[0], "soft") or 0) if keys else 0
    finally:
        await client.aclose()


async def timed(coro: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = await coro
    return out, time.perf_counter() - t0


# -- the store alone ---------------------------------------------------------


async def test_killed_redis_is_answered_from_memory_then_left_when_it_is_back(
    redis: RedisServer, store: FailoverStore
) -> None:
    await store.admit(bot_turn())
    assert await on_redis(redis) == 1

    redis.kill()
    first, took = await timed(store.admit(bot_turn()))
    assert took < ADDED_LATENCY
    assert store.degraded and store.changes == [True]  # type: ignore[attr-defined]
    assert first.soft == 1  # local state starts its own count
    for n in (2, 3, 4):
        assert (await store.admit(bot_turn())).soft == n
    over = await store.admit(bot_turn())
    # local state still stops the loop: past the soft limit, bot turns are dropped
    assert (over.turn, over.soft, over.action) == (Turn.THROTTLED, 5, Action.DROP)
    human = await store.admit(AdmitRequest(Observed("c", "h1", "ann", "Ann", Count.RESET),
                                           "me", None, False, LIMITS))  # fmt: skip
    assert (human.soft, human.action) == (0, None)  # a person goes on to be answered
    with pytest.raises(StoreError, match=r"Redis unreachable for .* answering from"):
        await store.ping()
    with pytest.raises(StoreError, match="pause is refused until it is back"):
        await store.set_paused("c", True)
    with pytest.raises(StoreError, match="changing limits is refused"):
        await store.set_overrides("c", Overrides(soft_limit=2))
    await store.reset("c")  # acts on the local state, which decides now
    assert (await store.status("c", "me", LIMITS)).soft == 0

    redis.start()
    _, took = await timed(store.wait_recovered())
    assert took < 5
    assert not store.degraded and store.changes == [True, False]  # type: ignore[attr-defined]
    await store.ping()
    assert (await store.admit(bot_turn())).soft == 1  # Redis lost its keys: a new count there
    assert await on_redis(redis) == 1
    await store.set_paused("c", True)  # settings are taken again


async def test_a_frozen_redis_costs_one_timeout_then_nothing(
    redis: RedisServer, store: FailoverStore
) -> None:
    await store.admit(bot_turn())
    assert redis.proc is not None
    redis.proc.send_signal(signal.SIGSTOP)  # up but silent: every read would hang
    try:
        _, first = await timed(store.admit(bot_turn()))
        assert store.degraded
        assert store.timeout <= first < ADDED_LATENCY  # waited the store timeout, no more
        _, later = await timed(store.admit(bot_turn()))
        assert later < store.timeout  # straight to memory: no second wait on Redis
    finally:
        redis.proc.send_signal(signal.SIGCONT)
    await asyncio.wait_for(store.wait_recovered(), 5)
    # Redis's own count: the first message and this one. The one that timed
    # out was written before Redis froze and reached it on waking, after its
    # deadline: refused unrun, it was counted only where it was decided.
    assert (await store.admit(bot_turn())).soft == 2


async def test_a_pause_or_limits_refused_on_a_frozen_redis_are_not_applied_after(
    redis: RedisServer, store: FailoverStore
) -> None:
    # Breaks if a settings change Redis reaches after its caller gave up is
    # run anyway: the admin was told "pause is refused" and the chat paused
    # once Redis woke; and a limits change, a delete then a set, could be
    # left half done (the chat's old limits gone, the new ones never set).
    await store.set_overrides("c", Overrides(soft_limit=3))
    await store.admit(bot_turn())  # Redis's clock known: calls carry deadlines
    assert redis.proc is not None
    client = aioredis.from_url(redis.url, decode_responses=True)
    try:
        for change in (
            lambda: store.set_paused("c", True),
            lambda: store.set_overrides("c", Overrides(soft_limit=7)),
        ):
            redis.proc.send_signal(signal.SIGSTOP)
            try:
                with pytest.raises(StoreError, match="refused"):
                    await change()
            finally:
                redis.proc.send_signal(signal.SIGCONT)
            await asyncio.wait_for(store.wait_recovered(), 5)
            [cfg] = [k async for k in client.scan_iter(match="*{c}:cfg")]
            assert await client.hgetall(cfg) == {"soft_limit": "3"}  # as before the refusal
    finally:
        await client.aclose()
    await store.set_paused("c", True)  # taken again once Redis is back
    assert (await store.status("c", "me", LIMITS)).paused


def sent_by_me(msg_id: str, answered: str = "") -> SentRequest:
    return SentRequest(Observed("c", msg_id, "me", "me", Count.BOT), "me", LIMITS,
                       answered=answered)  # fmt: skip


def answerable(msg_id: str) -> AdmitRequest:
    """Another bot's message that `me` would answer: it takes a rate slot and
    holds `me`'s turn for a minute, as the pipeline's admit does."""
    msg = Observed("c", msg_id, "other", "other", Count.BOT)
    return AdmitRequest(msg, "me", None, True, LIMITS, hold_ms=60_000)


async def test_an_admit_redis_reaches_after_its_deadline_leaves_nothing_behind(
    redis: RedisServer, store: FailoverStore
) -> None:
    """Redis frozen while a bot message is admitted: the call times out and
    the message is decided locally. On waking Redis finds the call in its
    socket; run then, it would hold `me`'s turn for a minute and claim the
    chat's soft warning for an answer nobody reads, so the next bot message
    would pass the threshold in silence. It is refused unrun instead."""
    await store.admit(bot_turn(author="warm-up"))  # a first answer: Redis's clock known
    await store.reset("c")
    await store.record_sent(sent_by_me("m0"))  # me has spoken: me may warn here
    await store.admit(answerable("o1"))
    await store.record_sent(sent_by_me("m1", answered="o1"))  # soft 3 of 4
    assert redis.proc is not None
    redis.proc.send_signal(signal.SIGSTOP)
    try:
        late = await store.admit(answerable("o2"))  # local state counts from 1
        assert store.degraded and late.soft == 1
    finally:
        redis.proc.send_signal(signal.SIGCONT)
    await asyncio.wait_for(store.wait_recovered(), 5)
    client = aioredis.from_url(redis.url, decode_responses=True)
    try:
        [holds] = [k async for k in client.scan_iter(match="*{c}:ho")] or [None]
        assert holds is None or await client.zcard(holds) == 0  # no hold outlived o2
        [ids] = [k async for k in client.scan_iter(match="*{c}:ids")]
        assert not await client.hexists(ids, "o2")  # nor was o2 counted there
    finally:
        await client.aclose()
    nxt = await store.admit(answerable("o3"))
    assert (nxt.turn, nxt.soft, nxt.action, nxt.warn) == (Turn.SOFT_LIMIT, 4, Action.WARN, "soft")


async def test_a_slow_call_while_others_are_answered_does_not_leave_redis(
    store: FailoverStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy process (event loop late) can time a call out on a healthy Redis
    (a cluster's calls are each timed by FailoverStore): that call is decided
    locally, the store stays on Redis. On one Redis the pipeline answers in
    order, so one call cannot be late alone; here one call is made to time out
    as a late one would, while Redis answers the others."""
    batches = store.primary._batch
    assert batches is not None and store.primary.bounded  # its calls time out by themselves
    real = batches.call
    holding, others_done = asyncio.Event(), asyncio.Event()

    async def call(*args: Any) -> Any:
        if "slow" in args:
            holding.set()
            await others_done.wait()  # late, behind a busy event loop
            raise TimeoutError("redis did not answer in time")
        return await real(*args)

    monkeypatch.setattr(batches, "call", call)
    slow = AdmitRequest(replace(bot_turn().msg, message_id="slow"), "me", None, True, LIMITS)
    late = asyncio.create_task(store.admit(slow))
    await holding.wait()
    for _ in range(3):
        await store.admit(bot_turn())  # Redis answers these meanwhile
    others_done.set()
    await late
    assert (store.slow, store.outages, store.degraded) == (1, 0, False)
    assert (await store.admit(bot_turn())).soft == 4  # still Redis's count


def guard_on(store: FailoverStore) -> tuple[Guard, FailoverEngine]:
    engine = engine_for(store)
    assert isinstance(engine, FailoverEngine)
    config = parse_config("bots: [{name: a, platform: http, backend: {type: echo}}]").guard
    return Guard(config, engine), engine


async def test_script_flush_is_reloaded_without_leaving_redis(
    redis: RedisServer, store: FailoverStore
) -> None:
    guard, engine = guard_on(store)
    await store.admit(bot_turn())
    assert (await guard.step("s", {"tool": "search", "args": {"q": 1}})).decision == "allow"
    client = aioredis.from_url(redis.url)
    try:
        await client.script_flush()
        assert await client.script_exists(engine.redis._script.sha) == [False]
    finally:
        await client.aclose()
    assert (await store.admit(bot_turn())).soft == 2
    await store.release("c", "me", "m-none", None)
    # the identical call, counted on Redis through the reloaded script
    assert (await guard.step("s", {"tool": "search", "args": {"q": 1}})).decision == "warn"
    assert store.outages == 0 and not store.degraded


async def test_guard_checks_go_local_during_an_outage_and_back(
    redis: RedisServer, store: FailoverStore
) -> None:
    guard, _ = guard_on(store)
    redis.kill()
    same = {"tool": "search", "args": {"q": "same"}}
    answers = [(await guard.step("s", same)).decision for _ in range(3)]
    assert store.degraded
    assert answers == ["allow", "warn", "block"]  # a tool loop is still stopped locally
    redis.start()
    await asyncio.wait_for(store.wait_recovered(), 5)
    assert (await guard.step("s", same)).decision == "allow"  # Redis's (empty) session
    assert not store.degraded


# -- the daemon, through its HTTP ingress -------------------------------------


def http_bot(name: str) -> dict[str, Any]:
    return {"name": name, "platform": "http", "backend": {"type": "echo"},
            "bot_messages": "all", "respond_to": "all",
            "turns": {"soft_limit": SOFT, "hard_limit": 2 * SOFT},
            "rate_cap": {"max_replies": 1000},
            # the traffic's "people" write the moment they are answered: a
            # machine's pace, which the backstop would stop; these tests are
            # about outages, so it is off
            "machine_pace": {"within_seconds": 0}}  # fmt: skip


class Traffic:
    """People writing to `ping` in their own chats, all the while: every
    answer's status, action and latency, labelled with the phase it fell in."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http = http
        self.url = url
        self.phase = "before"
        self.seen: list[tuple[str, int, str, float]] = []
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._person(i)) for i in range(8)]

    async def _person(self, i: int) -> None:
        for n in itertools.count():
            if self._stop.is_set():
                return
            body = {"chat": f"people-{i}", "author": f"p{i}", "text": f"hello {n}",
                    "id": f"p{i}-{n}"}  # fmt: skip
            phase = self.phase
            t0 = time.perf_counter()
            async with self.http.post(f"{self.url}/v1/bots/ping/messages", json=body) as r:
                action = (await r.json()).get("action", "") if r.status == 200 else ""
                self.seen.append((phase, r.status, action, time.perf_counter() - t0))

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    def during(self, phase: str) -> list[tuple[str, int, str, float]]:
        return [s for s in self.seen if s[0] == phase]


async def health(http: aiohttp.ClientSession, url: str) -> tuple[str, float]:
    async with http.get(f"{url}/healthz") as r:
        status = (await r.json())["status"]
    async with http.get(f"{url}/metrics") as r:
        families = text_string_to_metric_families(await r.text())
        gauge = next(f for f in families if f.name == "botbouncer_store_degraded")
    return status, gauge.samples[0].value


@dataclass
class PingPong:
    """Two daemons, `ping` and `pong`, on one store, people's traffic to ping
    running all the while (the outage and Sentinel tests)."""

    daemons: tuple[Daemon, Daemon]
    urls: dict[str, str]
    http: aiohttp.ClientSession
    traffic: Traffic

    async def post(self, bot: str, body: dict[str, Any]) -> dict[str, Any]:
        async with self.http.post(f"{self.urls[bot]}/v1/bots/{bot}/messages", json=body) as r:
            assert r.status == 200, await r.text()
            out: dict[str, Any] = await r.json()
            return out


@asynccontextmanager
async def ping_and_pong(url: str, **policy: Any) -> AsyncIterator[PingPong]:
    ping = build(url, "bb", http_bot("ping") | policy)
    pong = build(url, "bb", http_bot("pong") | policy)
    for d in (ping, pong):
        assert isinstance(d.store, FailoverStore)
        d.store.timeout = 0.3
    urls = {"ping": await ping.start(), "pong": await pong.start()}
    async with aiohttp.ClientSession() as http:
        traffic = Traffic(http, urls["ping"])
        try:
            yield PingPong((ping, pong), urls, http, traffic)
        finally:
            await traffic.stop()
            await ping.stop()
            await pong.stop()


@pytest.mark.slow
async def test_redis_killed_mid_traffic_then_restarted(redis: RedisServer) -> None:
    async with ping_and_pong(redis.url) as pp:
        post, http, urls, traffic = pp.post, pp.http, pp.urls, pp.traffic
        before = await pingpong(post, "loop-before", "ping", "pong")
        assert len(before.replies) == SOFT and len(before.warnings) == 1

        redis.kill()
        traffic.phase = "outage"
        during = await pingpong(post, "loop-during", "ping", "pong")
        # local state, one per replica, still stops the loop where Redis would
        assert len(during.replies) == SOFT and len(during.warnings) == 1
        assert (during.last["action"], during.last["reason"]) == ("drop", "turn_throttled")
        for url in urls.values():
            assert await health(http, url) == ("degraded", 1.0)

        redis.start()
        traffic.phase = "after"
        t0 = time.perf_counter()
        for d in pp.daemons:
            assert isinstance(d.store, FailoverStore)
            await asyncio.wait_for(d.store.wait_recovered(), 5)
        back = time.perf_counter() - t0
        for url in urls.values():
            assert await health(http, url) == ("ok", 0.0)
        after = await pingpong(post, "loop-after", "ping", "pong")
        assert len(after.replies) == SOFT
        assert await on_redis(redis, "http:loop-after") == SOFT + 1  # on Redis again

    assert back < 5
    outage = traffic.during("outage")
    assert len(outage) >= 8, "too little traffic fell in the outage to judge it"
    assert {s[1] for s in traffic.seen} == {200}  # never a 5xx, before, during or after
    assert {s[2] for s in traffic.seen} == {"reply"}  # every person answered
    assert max(s[3] for s in outage) < ADDED_LATENCY


@pytest.mark.slow
async def test_script_flush_and_a_restart_that_loses_every_key_never_reach_a_chat(
    redis: RedisServer,
) -> None:
    daemon: Daemon = build(redis.url, "bb", http_bot("ping"), http_bot("pong"))
    url = await daemon.start()
    async with aiohttp.ClientSession() as http:

        async def post(bot: str, body: dict[str, Any]) -> dict[str, Any]:
            async with http.post(f"{url}/v1/bots/{bot}/messages", json=body) as r:
                assert r.status == 200, await r.text()
                out: dict[str, Any] = await r.json()
                return out

        traffic = Traffic(http, url)
        try:
            first = await pingpong(post, "loop", "ping", "pong")
            client = aioredis.from_url(redis.url)
            await client.script_flush()
            await client.aclose()
            traffic.phase = "flushed"
            second = await pingpong(post, "loop2", "ping", "pong")
            assert redis_of(daemon).client is not None
            restart(redis)
            traffic.phase = "restarted"
            third = await pingpong(post, "loop3", "ping", "pong")
            assert isinstance(daemon.store, FailoverStore)
            await asyncio.wait_for(daemon.store.wait_recovered(), 5)
            fourth = await pingpong(post, "loop4", "ping", "pong")
        finally:
            await traffic.stop()
            await daemon.stop()
    for relay in (first, second, third, fourth):
        assert len(relay.replies) == SOFT and len(relay.warnings) == 1
        assert not any(d["reason"] == "backend_error" for d in relay.decisions)
    assert await on_redis(redis, "http:loop4") == SOFT + 1
    assert {s[1] for s in traffic.seen} == {200}
    assert {s[2] for s in traffic.seen} == {"reply"}
    assert traffic.during("flushed") and traffic.during("restarted")


async def test_cursors_go_through_the_scripts_pipeline(
    redis: RedisServer, store: FailoverStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The LLM proxy reads and keeps a cursor on every request: they share the
    scripts' round trips and deadline, not redis-py's own command path."""
    batches = store.primary._batch
    assert batches is not None
    real, sent = batches.call, []

    async def call(*args: Any) -> Any:
        sent.append(args[0])
        return await real(*args)

    monkeypatch.setattr(batches, "call", call)
    await store.set_cursor("llm:s-1", '["k1", "k2"]')
    assert await store.get_cursor("llm:s-1") == '["k1", "k2"]'
    assert await store.get_cursor("llm:never") is None
    assert sent == ["SET", "GET", "GET"]
    client = aioredis.from_url(redis.url)
    try:
        ttl = await client.pttl(f"{store.primary.prefix}:cursor:llm:s-1")
    finally:
        await client.aclose()
    assert 0 < ttl <= 7 * 86400 * 1000  # the state TTL
    assert redis.proc is not None
    redis.proc.send_signal(signal.SIGSTOP)  # a frozen Redis costs one timeout, as a script's
    try:
        got, took = await timed(store.get_cursor("llm:s-1"))
        assert store.degraded and store.timeout <= took < ADDED_LATENCY
        assert got == '["k1", "k2"]'  # kept in this process's memory too
    finally:
        redis.proc.send_signal(signal.SIGCONT)


async def test_a_cursor_saved_while_redis_is_away_is_read_back_from_memory(
    redis: RedisServer, store: FailoverStore
) -> None:
    """A sync position taken during an outage is kept (in this process's
    memory) rather than lost, and read from Redis again once it is back."""
    await store.set_cursor("matrix:@bot:x", "before")
    redis.kill()
    await store.set_cursor("matrix:@bot:x", "during")
    assert store.degraded
    assert await store.get_cursor("matrix:@bot:x") == "during"
    redis.start()  # a fresh Redis: nothing kept on disk
    await store.wait_recovered()
    await store.set_cursor("matrix:@bot:x", "after")
    assert await store.get_cursor("matrix:@bot:x") == "after"
