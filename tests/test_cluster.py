"""`store.url: redis+cluster://…` on a real three-master Redis Cluster.

The cluster is started for this module from local redis-server processes on
free ports (tests/redis_cluster.py). The store, the agent guard and two
daemons run on it and must answer exactly as on memory or on one Redis: every
script's keys share a chat's (or a session's) hash tag, so each call lands on
one node, and different chats land on different nodes.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
import yaml
from redis.asyncio.cluster import RedisCluster

from gateway.config import parse_config
from gateway.daemon import Daemon
from gateway.guard.engine import MemoryEngine, RedisEngine
from gateway.guard.service import Guard
from gateway.model import Action, ChatKind, Reason
from gateway.pipeline import limits_for
from gateway.store import Limits, MemoryStore, Overrides, Store, StoreError
from gateway.store.redis import RedisStore
from tests.daemons import forget, pingpong, redis_of, running
from tests.redis_cluster import LocalCluster
from tests.redis_server import INSTALL_HINT, free_port
from tests.store.harness import Chat

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

# Chat names whose hash tags fall on all three masters (slots are fixed by the
# names, so this spread is deterministic).
CHATS = [f"test:c{i}" for i in range(6)]
SESSIONS = ["s1", "s2", "s3"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    if shutil.which("redis-server") is None:
        pytest.fail("the Redis Cluster tests start their own redis-server processes: "
                    + INSTALL_HINT, pytrace=False)  # fmt: skip
    c = LocalCluster()
    try:
        c.start()
    except RuntimeError as exc:
        pytest.fail(f"could not start a local Redis Cluster: {exc}", pytrace=False)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
async def prefix(cluster: LocalCluster) -> AsyncIterator[str]:
    """This test's key prefix; every key under it is deleted afterwards."""
    p = f"bbtest-{uuid.uuid4().hex[:12]}"
    yield p
    await forget(cluster.url, p)
    assert cluster.keys_by_node(f"{p}:*") == {}


@pytest.fixture
async def open_stores(cluster: LocalCluster, prefix: str) -> AsyncIterator[list[RedisStore]]:
    """Cluster stores opened by a test (append to it), closed afterwards."""
    opened: list[RedisStore] = []
    yield opened
    for s in opened:
        await s.close()


def cluster_store(cluster: LocalCluster, prefix: str, opened: list[RedisStore]) -> RedisStore:
    store = RedisStore.from_url(cluster.url, prefix=prefix, context_size=8)
    opened.append(store)
    return store


# -- the store -------------------------------------------------------------------

SMALL = Limits(soft_limit=3, hard_limit=5, max_replies=2, pair_max_events=2,
               pair_window_ms=60_000, pair_cooldown_ms=30_000)  # fmt: skip


async def scenario(store: Store, name: str) -> list[Any]:
    """Every store operation on one chat; what each one answered."""
    chat = Chat(store, chat=name, limits=SMALL)
    out: list[Any] = [await chat.admit("B")]  # own message: counted, B has spoken
    out += [await chat.admit("A"), await chat.admit("A")]  # the 3rd: B warns
    out.append(await chat.sent("B", mid=f"{name}/warn"))
    out.append(await chat.admit("A", mid=f"{name}/dup"))
    out.append(await chat.admit("A", mid=f"{name}/dup"))  # duplicate
    out.append(await chat.admit("C", bot="D", local=Reason.BOT_IGNORED))
    out.append(await chat.human(mid=f"{name}/h1"))  # resets; A's 2nd message took a slot
    out.append(await chat.human(mid=f"{name}/h2"))  # rate capped (2 of 2)
    await store.release(name, "B", f"{name}/h1", {"id": f"{name}/h1", "reason": "backend_empty"})
    out.append(await chat.human(mid=f"{name}/h3", context=3))  # the released slot, with context
    await store.set_paused(name, True)
    out.append(await chat.human())
    out.append(await store.status(name, "B", SMALL, now_ms=chat.now_ms))
    await store.set_paused(name, False)
    await store.set_overrides(name, Overrides(soft_limit=2, max_replies=5))
    await store.set_overrides(name, Overrides(hard_limit=9), merge=True)
    out.append(await store.status(name, "B", SMALL, now_ms=chat.now_ms))
    out += [await chat.admit("A"), await chat.admit("A")]  # soft 2 now: the override holds
    await store.reset(name)
    out.append(await store.status(name, "B", SMALL, now_ms=chat.now_ms))
    out.append(await store.decisions(name))
    out.append(await store.decisions(name, limit=3))
    return out


async def test_store_on_the_cluster_answers_as_memory_and_keeps_each_chat_on_one_node(
    cluster: LocalCluster, prefix: str, open_stores: list[RedisStore]
) -> None:
    memory = MemoryStore(context_size=8)
    redis_store = cluster_store(cluster, prefix, open_stores)
    expected = [await scenario(memory, name) for name in CHATS]
    got = await asyncio.gather(*(scenario(redis_store, name) for name in CHATS))
    for name, want, have in zip(CHATS, expected, got, strict=True):
        assert have == want, name
    # the scenario did reach every rule it meant to
    reasons = {r.reason for r in expected[0] if hasattr(r, "reason")}
    assert {Reason.OWN_MESSAGE, Reason.DUPLICATE, Reason.BOT_IGNORED, Reason.RATE_CAPPED,
            Reason.PAUSED, Reason.TURN_SOFT_LIMIT} <= reasons  # fmt: skip
    assert any(getattr(r, "action", None) is Action.WARN for r in expected[0])
    assert any(getattr(r, "context", None) for r in expected[0])
    # the newest decision: the soft limit override (2) stopped the second bot message
    assert [e["reason"] for e in expected[0][-1]][:1] == ["turn_soft_limit"]

    await redis_store.ping()
    where: dict[str, int] = {}
    for name in CHATS:
        base = redis_store.keys(name).base
        held = cluster.keys_by_node(f"{base}:*")
        assert len(held) == 1, f"{name}'s keys are spread over nodes: {held}"
        (port, keys), = held.items()  # fmt: skip
        assert {f"{base}:{k}" for k in ("st", "ids", "log", "cfg", "r:B")} <= keys
        assert port == cluster.node_of(f"{base}:st")
        where[name] = port
    assert len(set(where.values())) > 1, where


async def test_concurrent_admits_on_fresh_clients_route_by_key_and_reserve_exactly_the_cap(
    cluster: LocalCluster, prefix: str, open_stores: list[RedisStore]
) -> None:
    """Fresh clients, many calls at once: each goes straight to the chat's node
    (redis-py would send calls made before its first topology load anywhere)."""
    for port in cluster.ports:
        with cluster.client(port) as c:
            c.config_resetstat()
    handles = [cluster_store(cluster, prefix, open_stores) for _ in range(3)]
    chats = [Chat(h, chat="test:cap") for h in handles]
    assert cluster.node_of(handles[0].keys("test:cap").state) != cluster.ports[0]
    answers = await asyncio.gather(
        *(chats[i % 3].human(mid=f"x{i}", tick=0) for i in range(40)), return_exceptions=True
    )
    results = [r for r in answers if not isinstance(r, BaseException)]
    assert results == answers, [r for r in answers if isinstance(r, BaseException)][:3]
    assert sum(r.reserved for r in results) == 6
    assert sum(r.reason is Reason.RATE_CAPPED for r in results) == 34
    for port in cluster.ports:
        with cluster.client(port) as c:
            errors = c.info("errorstats")
        assert "errorstat_MOVED" not in errors, (port, errors)


async def test_an_unreachable_cluster_is_a_store_error() -> None:
    """redis-py raises RedisClusterException (not a RedisError) when no node
    answers: the store must still report a StoreError, as for any Redis failure."""
    store = RedisStore.from_url(f"redis+cluster://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(StoreError, match="redis admit failed: redis cluster: "):
            await Chat(store).human()
        with pytest.raises(StoreError, match="redis write check failed"):
            await store.ping()
        with pytest.raises(StoreError, match="redis status failed"):
            await store.status("test:x", "B", Limits())
    finally:
        await store.close()


async def test_every_script_is_reloaded_after_a_script_flush_on_every_node(
    cluster: LocalCluster, prefix: str, open_stores: list[RedisStore]
) -> None:
    store = cluster_store(cluster, prefix, open_stores)
    chat = Chat(store, chat="test:flush", limits=Limits(max_replies=1))
    node = cluster.node_of(store.keys(chat.chat).state)
    scripts = [store._admit, store._sent, store._release, store._reset]

    def flush_everywhere() -> None:
        for port in cluster.ports:
            with cluster.client(port) as c:
                assert c.script_flush()
                assert c.script_exists(*(s.sha for s in scripts)) == [False] * len(scripts)

    assert (await chat.admit("A", local=Reason.BOT_IGNORED)).soft == 1  # loads admit
    flush_everywhere()
    first = await chat.human(mid="h1")
    assert (first.soft, first.reserved) == (0, True)
    flush_everywhere()
    assert (await chat.sent("B")).soft == 1
    flush_everywhere()
    await store.release(chat.chat, "B", "h1", None)
    assert (await chat.human()).reserved  # the slot really was released
    flush_everywhere()
    await store.reset(chat.chat)
    status = await store.status(chat.chat, "B", chat.limits, now_ms=chat.now_ms)
    assert (status.soft, status.hard) == (0, 0)
    with cluster.client(node) as c:
        assert c.script_exists(store._reset.sha) == [True]


# -- the agent guard ----------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


async def play_guard(guard: Guard, clock: Clock) -> list[Any]:
    out: list[Any] = []
    for session in SESSIONS:
        for _ in range(3):
            out.append(await guard.step(session, {"tool": "search", "args": {"q": "x"}}))
            clock.now += 1
        for tool in ["open", "read"] * 3:
            out.append(await guard.step(session, {"tool": tool, "args": {"id": 1}}))
            clock.now += 1
        out.append(await guard.result(session, {"tool": "read", "ok": True, "output": "x"}))
        out.append(await guard.state(session))
    await guard.reset(SESSIONS[0])
    out.append(await guard.state(SESSIONS[0]))
    out.append(await guard.step(SESSIONS[0], {"tool": "search", "args": {"q": "x"}}))
    return out


async def test_the_agent_guard_on_the_cluster_answers_as_on_memory(
    cluster: LocalCluster, prefix: str, open_stores: list[RedisStore]
) -> None:
    config = parse_config("bots: [{name: a, platform: http, backend: {type: echo}}]\n").guard
    mem_clock, redis_clock = Clock(), Clock()
    engine = RedisEngine(cluster_store(cluster, prefix, open_stores))
    want = await play_guard(Guard(config, MemoryEngine(mem_clock), mem_clock), mem_clock)
    got = await play_guard(Guard(config, engine, redis_clock), redis_clock)
    assert got == want
    decisions = [(a.decision, a.reason) for a in want if hasattr(a, "decision")]
    assert ("warn", "identical_call") in decisions and ("block", "identical_call") in decisions
    assert ("warn", "tool_cycle") in decisions
    held = cluster.keys_by_node(f"{prefix}:guard:*")
    assert len(held) > 1, held  # the sessions spread over the masters


# -- two daemons on the cluster, driven through the HTTP ingress -------------------------


def http_bot(name: str, **policy: Any) -> dict[str, Any]:
    bot: dict[str, Any] = {"name": name, "platform": "http", "backend": {"type": "echo"}}
    bot.update(policy)
    return bot


async def ingress(
    http: aiohttp.ClientSession, d: Daemon, bot: str, body: dict[str, Any]
) -> dict[str, Any]:
    async with http.post(f"http://{d.config.http.listen}/v1/bots/{bot}/messages",
                         json=body) as resp:  # fmt: skip
        payload: dict[str, Any] = await resp.json()
        assert resp.status == 200, payload
        return payload


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        yield session


async def test_two_daemons_ping_pong_to_the_soft_limit_then_a_human_resumes_them(
    cluster: LocalCluster, prefix: str, http: aiohttp.ClientSession
) -> None:
    soft_limit = 6
    policy: dict[str, Any] = {"bot_messages": "all", "respond_to": "all",
                              "turns": {"soft_limit": soft_limit},
                              "rate_cap": {"max_replies": 100}}  # fmt: skip
    async with (
        running(cluster.url, prefix, http_bot("ping", **policy)) as ping,
        running(cluster.url, prefix, http_bot("pong", **policy)) as pong,
    ):
        for d in (ping, pong):
            assert isinstance(redis_of(d).client, RedisCluster)
            async with http.get(f"http://{d.config.http.listen}/healthz") as resp:
                assert (resp.status, (await resp.json())["status"]) == (200, "ok")
        daemons = {"ping": ping, "pong": pong}
        chat = "room-a"

        async def post(bot: str, body: dict[str, Any]) -> dict[str, Any]:
            return await ingress(http, daemons[bot], bot, body)

        relay = await pingpong(post, chat, "ping", "pong")
        assert len(relay.replies) == soft_limit, relay.posted
        assert set(relay.replies) == {"ping", "pong"}
        assert relay.posted[-1][0] == "warning" and len(relay.warnings) == 1  # one, and last
        assert (relay.last["action"], relay.last["reason"]) == ("drop", "turn_throttled")

        resumed = await ingress(http, pong, "pong", {"chat": chat, "author": "human",
                                                     "text": "carry on", "id": "h2"})  # fmt: skip
        assert (resumed["turn"], resumed["action"], resumed["reply"]) == (
            "reset", "reply", "carry on"
        )  # fmt: skip
        again = await ingress(http, ping, "ping", {"chat": chat, "author": "pong", "bot": True,
                                                   "text": "carry on",
                                                   "id": resumed["reply_id"]})  # fmt: skip
        assert (again["action"], again["soft"]) == ("reply", 1)


async def test_concurrent_messages_through_two_daemons_get_exactly_the_rate_cap(
    cluster: LocalCluster, prefix: str, http: aiohttp.ClientSession
) -> None:
    cap, sent = 4, 40
    bot = http_bot("helper", rate_cap={"max_replies": cap, "window_seconds": 120})
    async with (
        running(cluster.url, prefix, bot) as one,
        running(cluster.url, prefix, bot) as two,
    ):
        daemons = [one, two]
        chat = "room-b"
        bodies = [{"chat": chat, "author": f"user{i}", "text": f"hi @helper {i}",
                   "mentions": ["helper"], "id": f"q{i}"} for i in range(sent)]  # fmt: skip
        answers = await asyncio.gather(
            *(ingress(http, daemons[i % 2], "helper", b) for i, b in enumerate(bodies)),
            return_exceptions=True,
        )
        got = [g for g in answers if not isinstance(g, BaseException)]
        assert got == answers, [g for g in answers if isinstance(g, BaseException)][:3]
        outcomes = [(g["action"], g["reason"]) for g in got]
        assert outcomes.count(("reply", None)) == cap, outcomes
        assert outcomes.count(("drop", "rate_capped")) == sent - cap, outcomes
        # both replicas were refused: they share the one window on the cluster
        assert {i % 2 for i, o in enumerate(outcomes) if o[1] == "rate_capped"} == {0, 1}

        config = parse_config(yaml.safe_dump({"bots": [bot]}))
        limits = limits_for(config.bot("helper"), ChatKind.GROUP)
        for d in daemons:  # status reads the window on Redis server time (TIME)
            status = await redis_of(d).status(f"http:{chat}", "helper", limits)
            assert (status.rate_used, status.rate_max) == (cap, cap)
