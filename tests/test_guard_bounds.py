"""What one agent-guard session, and the process, may hold: every collection a
session keeps is bounded by the profile (least recently used forgotten first),
on memory and on a real Redis, and a loop on the newest name is still caught;
the in-process engine keeps at most guard.max_sessions sessions; a budget too
small to count in is refused, any other is enforced."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gateway.config import ConfigError, GuardConfig
from gateway.guard.engine import MemoryEngine, RedisEngine
from gateway.guard.service import Guard, GuardInputError
from gateway.http import HttpServer
from gateway.store import MemoryStore
from gateway.store.redis import RedisStore
from tests.conftest import delete_prefix
from tests.test_guard import Clock, guard_config

# docs/operations.md: with the default bounds a session's stored value stays
# under this, for names of up to 40 characters (typically 1-5 KB).
SESSION_BYTES = 50 * 1024
BOT = "bots: [{name: a, platform: http, backend: {type: echo}}]\n"
NO_CEILINGS = "steps: {max_steps: 1000000, max_per_tool: 1000000}"


def profile(text: str) -> GuardConfig:
    return guard_config(f"guard: {{profiles: {{default: {{{text}}}}}}}\n")


@pytest.fixture(params=["memory", "redis"])
async def make(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """make(config) -> a Guard on this test's engine."""
    clock = Clock()
    stores: list[RedisStore] = []

    def build(config: GuardConfig | None = None) -> Guard:
        config = config or guard_config()
        if request.param == "memory":
            return Guard(config, MemoryEngine(clock), clock)
        url = request.getfixturevalue("redis_url")
        store = RedisStore.from_url(url, prefix=request.getfixturevalue("key_prefix"))
        stores.append(store)
        return Guard(config, RedisEngine(store), clock)

    yield build
    for store in stores:
        await delete_prefix(store, store.prefix)
        await store.close()


async def stored(guard: Guard, session: str = "s") -> tuple[int, dict[str, Any]]:
    """The session's stored size in bytes (Redis: STRLEN of its key; memory:
    the same JSON text, which is what an idle session is kept as) and state."""
    raw = (await guard.engine.run(session, "state", "{}", "{}", "", None))[2]
    if isinstance(guard.engine, RedisEngine):
        size = await guard.engine.store.client.strlen(guard.engine.key(session))
    else:
        size = len(raw.encode())
    return int(size), json.loads(raw)


def name(kind: str, i: int) -> str:
    return f"{kind}_{i:05d}_" + "x" * 20  # 31 characters


# -- every per-session collection is bounded ------------------------------------------


async def test_distinct_tools_are_bounded_and_a_failing_one_still_blocks(make: Any) -> None:
    """Reported results for 150 distinct tools keep the newest 32; a tool
    failing five times, with 20 new tools between failures, is still blocked:
    it is in use, so never the one forgotten."""
    guard = make()
    for i in range(150):
        await guard.result("s", {"tool": name("tool", i), "ok": True, "output": i})
    got = []
    for attempt in range(5):
        got.append(await guard.result("s", {"tool": "deploy", "ok": False, "output": attempt}))
        for i in range(20):
            await guard.result("s", {"tool": name("later", attempt * 20 + i), "output": i})
    assert [a.reason for a in got][-1] == "failure_streak" and got[-1].decision == "block"
    size, state = await stored(guard)
    assert len(state["tools"]) == 32 and "deploy" in state["tools"]
    assert size < SESSION_BYTES


async def test_distinct_tasks_are_bounded_and_a_retried_one_still_blocks(make: Any) -> None:
    guard = make()
    for i in range(150):
        await guard.retry("s", {"task": name("task", i), "input": "x"})
    got = []
    for attempt in range(3):
        got.append(await guard.retry("s", {"task": "summarise", "input": "x"}))
        for i in range(20):
            await guard.retry("s", {"task": name("other", attempt * 20 + i), "input": "x"})
    assert [(a.decision, a.reason) for a in got][-1] == ("block", "retry_limit")
    size, state = await stored(guard)
    assert len(state["retry"]) == 32 and "summarise" in state["retry"]
    assert size < SESSION_BYTES


async def test_distinct_kb_topics_are_bounded_and_a_reasked_one_still_blocks(make: Any) -> None:
    guard = make()
    for i in range(300):
        await guard.kb_query("s", {"question": f"what does clause {i} of contract {i} say?"})
    question = "What is the refund policy for annual plans?"
    got = []
    for attempt in range(3):
        got.append(await guard.kb_query("s", {"question": question, "confidence": 0.4}))
        for i in range(40):
            await guard.kb_query("s", {"question": f"where is office {attempt} {i} located?"})
    assert [(a.decision, a.reason) for a in got][-1] == ("block", "kb_requery")
    size, state = await stored(guard)
    assert len(state["kb"]) == 64
    assert size < SESSION_BYTES


async def test_fixation_on_a_tool_in_use_is_caught_among_many_others(make: Any) -> None:
    guard = make()
    for i in range(100):
        await guard.result("s", {"tool": name("tool", i), "output": i})
    query = "cheap flights paris london march"
    rephrased = [query, query + " tickets", query + " deals", query + " fares"]
    got = []
    for n, text in enumerate(rephrased):
        got.append(await guard.step("s", {"tool": "web_search", "args": {"query": text}}))
        for i in range(20):
            await guard.result("s", {"tool": name("other", n * 20 + i), "output": i})
    assert [(a.decision, a.reason) for a in got] == [("allow", "ok")] * 3 + [
        ("block", "input_fixation")]  # fmt: skip
    _, state = await stored(guard)
    assert len(state["tools"]) == 32


async def test_the_least_recently_used_tool_is_the_one_forgotten(make: Any) -> None:
    guard = make(profile("session: {max_tools: 3}"))
    for tool in ("a", "b", "c"):
        await guard.step("s", {"tool": tool, "args": {}})
    await guard.result("s", {"tool": "a", "output": 1})  # a is used again: b is oldest now
    await guard.step("s", {"tool": "d", "args": {}})
    _, state = await stored(guard)
    assert sorted(state["tools"]) == ["a", "c", "d"]


async def test_a_lowered_bound_applies_at_the_next_new_name(make: Any) -> None:
    wide = make(profile("session: {max_topics: 10}"))
    for i in range(10):
        await wide.kb_query("s", {"question": f"topic alpha{i}"})
    narrow = make(profile("session: {max_topics: 3}"))  # as a reload would
    narrow.engine = wide.engine
    await narrow.kb_query("s", {"question": "topic alpha4"})  # in use: nothing dropped
    assert len((await stored(narrow))[1]["kb"]) == 10
    await narrow.kb_query("s", {"question": "a new one"})
    _, state = await stored(narrow)
    assert len(state["kb"]) == 3
    again = [await narrow.kb_query("s", {"question": q}) for q in ["topic alpha9"] * 2]
    assert [a.reason for a in again] == ["ok", "kb_requery"]  # the newest were kept


def test_the_chain_kept_must_show_a_revisit() -> None:
    with pytest.raises(ConfigError) as err:
        profile("handoff: {max_visits: 40}")
    assert err.value.problems == [
        "guard.profiles.default: session.max_chain must be at least 2 * handoff.max_visits"
    ]
    assert profile("handoff: {max_visits: 40}, session: {max_chain: 80}")


async def test_the_handoff_chain_keeps_its_newest_agents(make: Any) -> None:
    guard = make(profile("handoff: {max_handoffs: 1000}, session: {max_chain: 16}"))
    for i in range(100):
        await guard.handoff("s", {"source": name("agent", i), "target": name("agent", i + 1)})
    _, state = await stored(guard)
    assert state["hand"]["chain"][-1] == name("agent", 100) and len(state["hand"]["chain"]) == 16
    hops = [("x", "subs"), ("subs", "billing")] * 2 + [("billing", "subs")]
    got = [await guard.handoff("s", {"source": s, "target": t}) for s, t in hops]
    assert [a.decision for a in got] == ["allow"] * 4 + ["block"]
    assert got[-1].reason == "handoff_revisit" and got[-1].evidence["visits"] == 3


async def test_a_worst_case_session_stays_under_the_documented_size(make: Any) -> None:
    """Every bounded collection full, with names of 40 characters and tool
    arguments of 300 distinct 40-character words (an input's tokens are kept
    as 64 hashes of 4 characters, whatever the words)."""
    guard = make(profile(NO_CEILINGS + ", handoff: {max_handoffs: 1000}, exploration: "
                         "{min_calls: 1000}, fixation: {similarity: 1.0}"))  # fmt: skip

    def long(kind: str, i: int) -> str:
        return f"{kind}{i}".ljust(40, "x")

    for r in range(4):  # full fixation windows: no result in between
        for i in range(40):
            words = " ".join(f"w{r}x{i}x{j}".ljust(40, "y") for j in range(300))
            await guard.step("s", {"tool": long("tool", i), "args": {"q": words}})
    for i in range(40):
        await guard.result("s", {"tool": long("tool", i), "ok": False, "output": "same"})
        for _ in range(2):
            await guard.retry("s", {"task": long("task", i), "input": "x"})
    for i in range(100):
        for _ in range(2):
            await guard.kb_query("s", {"question": long(f"q{i}", i), "confidence": 0.123456})
        await guard.handoff("s", {"source": long("agent", i), "target": long("agent", i + 1)})
    size, state = await stored(guard)
    assert (len(state["tools"]), len(state["retry"]), len(state["kb"])) == (32, 32, 64)
    assert len(state["hand"]["chain"]) == 64 and len(state["hist"]) == 64
    assert size < SESSION_BYTES, size


# -- the in-process engine keeps at most guard.max_sessions -------------------------


async def test_memory_engine_forgets_the_least_recently_used_session(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    engine = MemoryEngine(clock)
    guard = Guard(guard_config("guard: {max_sessions: 5}\n"), engine, clock)
    assert engine.max_sessions == 5
    for i in range(5):
        await guard.step(f"s{i}", {"tool": "t", "args": {}})
    await guard.step("s0", {"tool": "t", "args": {"n": 1}})  # s1 is now the least recent
    with caplog.at_level(logging.WARNING, logger="botbouncer.guard"):
        await guard.step("s5", {"tool": "t", "args": {}})
        assert len(engine) == 5
        assert await guard.state("s1") is None
        assert (await guard.state("s0") or {}).get("steps") == 2
        for i in range(6, 40):  # more evictions within the minute: no more lines
            await guard.step(f"s{i}", {"tool": "t", "args": {}})
        assert len(engine) == 5
        lines = [r.getMessage() for r in caplog.records if r.name == "botbouncer.guard"]
        assert lines == [
            "guard: forgot 1 sessions (the least recently used, before their TTL) to stay "
            "within guard.max_sessions=5; raise it or use a Redis store"
        ]
        clock.now += 61  # the next eviction after a minute tells the count since
        await guard.step("late", {"tool": "t", "args": {}})
        lines = [r.getMessage() for r in caplog.records if r.name == "botbouncer.guard"]
        assert len(lines) == 2 and lines[1].startswith("guard: forgot 35 sessions")


async def test_a_lower_max_sessions_applies_on_reload() -> None:
    engine = MemoryEngine()
    guard = Guard(guard_config(), engine)
    for i in range(10):
        await guard.step(f"s{i}", {"tool": "t", "args": {}})
    guard.configure(guard_config("guard: {max_sessions: 3}\n"))
    assert len(engine) == 3
    assert [await guard.state(f"s{i}") is not None for i in (0, 6, 7, 8, 9)] == [
        False, False, True, True, True]  # fmt: skip


async def test_idle_sessions_kept_as_text_answer_as_live_ones() -> None:
    """Past MemoryEngine.HOT sessions, the idle ones are kept as JSON text; a
    script of interleaved sessions answers alike either way."""

    async def play(hot: int) -> list[Any]:
        clock = Clock()
        engine = MemoryEngine(clock)
        engine.HOT = hot
        guard = Guard(guard_config(), engine, clock)
        out: list[Any] = []
        for round_ in range(4):
            for s in range(6):
                session = f"s{s}"
                answers = [
                    await guard.step(session, {"tool": "search", "args": {"q": s}}),
                    await guard.result(session, {"tool": "search", "output": round_ % 2}),
                    await guard.kb_query(session, {"question": f"q {s}"}),
                ]
                out.extend(a.as_dict() for a in answers)
                clock.now += 1
        out.append([await guard.state(f"s{s}") for s in range(6)])
        return out

    assert await play(hot=1) == await play(hot=1024)


# -- a budget is enforced, or refused when too small to count in ---------------------


async def test_a_budget_below_a_micro_dollar_is_refused(make: Any) -> None:
    guard = make()
    for tiny in (1e-7, 4.9e-7, 5e-7, 9.99e-7, 0):
        with pytest.raises(GuardInputError) as err:
            await guard.usage("s", {"cost_usd": 5, "budget_usd": tiny})
        assert str(err.value) == (
            "budget_usd: must be at least 0.000001 (one micro-dollar, the unit the guard counts in)"
        )
    assert await guard.state("s") is None  # nothing was recorded


@pytest.mark.parametrize("budget", [0.000001, 0.0000015, 0.00001])
async def test_every_budget_from_a_micro_dollar_up_is_enforced(make: Any, budget: float) -> None:
    guard = make()
    spent = await guard.usage("s", {"cost_usd": 5, "budget_usd": budget})
    assert (spent.decision, spent.reason) == ("block", "budget_exhausted")
    assert spent.budget["usd_limit"] == round(budget, 6) and spent.budget["usd_remaining"] == 0
    after = await guard.step("s", {"tool": "t", "args": {}})
    assert (after.decision, after.reason) == ("block", "budget_exhausted")


async def test_a_profile_budget_below_a_micro_dollar_is_a_config_error(make: Any) -> None:
    with pytest.raises(ConfigError) as err:
        profile("budget: {usd: 0.0000001}")
    assert err.value.problems == [
        "guard.profiles.default.budget.usd: must be at least 0.000001 (one micro-dollar, the "
        "unit the guard counts in)"
    ]
    guard = make(profile("budget: {usd: 0.000001}"))
    spent = await guard.usage("s", {"cost_usd": 5})
    assert (spent.decision, spent.budget["usd_limit"]) == ("block", 0.000001)


async def test_a_tiny_budget_over_http_is_a_400_naming_the_smallest() -> None:
    guard = Guard(guard_config(), MemoryEngine())
    server = HttpServer(MemoryStore(), guard=guard)
    async with TestClient(TestServer(server.app)) as client:
        resp = await client.post("/v1/guard/s/usage", json={"cost_usd": 5, "budget_usd": 1e-7})
        assert resp.status == 400
        assert "at least 0.000001" in (await resp.json())["error"]
        resp = await client.post("/v1/guard/s/usage", json={"cost_usd": 5, "budget_usd": 1e-6})
        body = await resp.json()
        assert resp.status == 429 and body["budget"]["usd_limit"] == 0.000001
