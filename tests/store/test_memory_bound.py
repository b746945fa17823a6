"""store.max_chats: the memory store (`memory://`, and the local fallback of a
Redis store) holds at most that many chats, forgetting the least recently used
one first, so whoever can reach the token-less ingress cannot grow the daemon
without end. And what one chat costs there."""

from __future__ import annotations

import gc
import logging
import tracemalloc

import pytest
from pydantic import ValidationError

from gateway.config import StoreConfig
from gateway.model import Action, Decision, Reason, Turn
from gateway.store import Limits, MemoryStore, Observed, SentRequest, open_store
from gateway.store import memory as memory_module
from gateway.store.failover import FailoverStore
from gateway.turns import Count
from tests.store.harness import Chat

SMALL = Limits(soft_limit=3, hard_limit=5)


def evictions(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "store.max_chats" in r.getMessage()]


async def test_past_the_bound_the_least_recently_used_chat_is_forgotten(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore(max_chats=3)
    a, b, c, d = (Chat(store, chat=f"test:{n}", limits=SMALL) for n in "abcd")
    for chat in (a, b, c):
        await chat.admit("A")
        await chat.admit("B")
    await a.admit("A")  # a is used again: b is now the least recently used
    assert store.chats() == 3
    caplog.set_level(logging.WARNING, "botbouncer.store")
    await d.admit("A")
    assert store.chats() == 3
    # b was forgotten (status makes it anew)
    assert (await store.status("test:b", "B", SMALL, b.now_ms)).soft == 0
    # ... which pushed out c, now the least recently used; a kept its counters
    assert store.chats() == 3
    res = await a.admit("B")
    assert (res.soft, res.turn) == (4, Turn.THROTTLED)
    assert (await store.status("test:d", "B", SMALL, d.now_ms)).soft == 1
    [warning] = evictions(caplog)
    assert warning.levelno == logging.WARNING
    assert "forgot 1 chat" in warning.getMessage()


async def test_an_admin_call_counts_as_use(caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore(max_chats=2)
    old, new = Chat(store, chat="test:old"), Chat(store, chat="test:new")
    await old.admit("A")
    await new.admit("A")
    await store.set_paused("test:old", True)  # the oldest chat is used: new is now the oldest
    await Chat(store, chat="test:third").admit("A")
    assert (await store.status("test:old", "B", Limits())).paused
    assert (await store.decisions("test:new")) == []


async def test_the_warning_comes_at_most_once_a_minute_with_the_count(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(memory_module, "monotonic", lambda: clock[0])
    caplog.set_level(logging.WARNING, "botbouncer.store")
    store = MemoryStore(max_chats=10)
    for i in range(200):
        await Chat(store, chat=f"test:{i}").admit("A")
    assert store.chats() == 10
    [first] = evictions(caplog)
    assert "forgot 1 chat " in first.getMessage()  # the first eviction is told at once
    clock[0] += 30
    for i in range(200, 250):
        await Chat(store, chat=f"test:{i}").admit("A")
    assert len(evictions(caplog)) == 1  # within the minute: counted, not told
    clock[0] += 31
    await Chat(store, chat="test:last").admit("A")
    second = evictions(caplog)[1]
    # 189 after the first warning, 50 more, and this one
    assert "forgot 240 chats" in second.getMessage(), second.getMessage()
    assert store.chats() == 10


async def test_a_chat_that_held_nothing_live_any_more_is_not_counted_as_forgotten(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A chat whose state the TTL would already have dropped costs nothing to
    forget: no warning for it."""
    caplog.set_level(logging.WARNING, "botbouncer.store")
    store = MemoryStore(max_chats=1, state_ttl_seconds=60)
    old = Chat(store, chat="test:old")
    await old.admit("A")
    await Chat(store, chat="test:new", now_ms=old.now_ms + 3_600_000).admit("A")
    assert store.chats() == 1
    assert evictions(caplog) == []


async def test_the_decision_log_and_dedupe_still_hold_in_the_compact_form() -> None:
    """The memory store keeps its log entries as tuples and its dedupe
    records without a set per id; what comes out is what went in."""
    store = MemoryStore(max_chats=10)
    chat = Chat(store, limits=SMALL)
    first = await chat.admit("A", mid="m1", local=Reason.BOT_IGNORED)
    entry = Decision("B", "m1", chat.chat, "A", Action.DROP, Reason.BOT_IGNORED, Turn.OK, 1, 1,
                     at=chat.now_ms / 1000).log_entry()  # fmt: skip
    assert (await store.decisions(chat.chat)) == [entry]
    odd = {"at": 1.5, "bot": "B", "id": "x", "extra": [1]}  # not the usual shape: kept as is
    sent = Observed(chat.chat, "s1", "B", "B", Count.BOT)
    await store.record_sent(SentRequest(sent, "B", SMALL, log=odd, now_ms=chat.now_ms))
    assert (await store.decisions(chat.chat)) == [odd, entry]
    assert (await store.decisions(chat.chat, 1)) == [odd]
    again = await chat.admit("A", mid="m1", bot="C", local=Reason.BOT_IGNORED)
    assert (again.soft, first.soft) == (1, 1)  # counted once
    dup = await chat.admit("A", mid="m1", bot="C", local=Reason.BOT_IGNORED)
    assert dup.reason is Reason.DUPLICATE  # C is now recorded as having handled it
    for i in range(60):
        await chat.admit("A", mid=f"n{i}", local=Reason.BOT_IGNORED)
    log = await store.decisions(chat.chat)
    assert len(log) == 50 and log[0]["id"] == "n59"


async def test_the_sweep_never_takes_the_chat_a_call_is_using() -> None:
    """Every SWEEP_EVERY-th call swept the store after looking up its own
    chat: a chat new to the store holds nothing live yet, so it was swept
    away under the call, which wrote into a chat nobody kept: its count,
    dedupe mark and rate slot were lost, and a redelivery of the message was
    counted and answered again."""
    store = MemoryStore()
    busy = Chat(store, chat="test:busy")
    for _ in range(memory_module.SWEEP_EVERY - 1):
        await busy.human(local=Reason.NOT_ADDRESSED)
    new = Chat(store, chat="test:new")
    first = await new.admit("A", mid="x1")  # the call that starts a sweep
    again = await new.admit("A", mid="x1")  # the platform delivers it again
    assert (first.soft, first.reserved) == (1, True)
    assert (again.reason, again.soft, again.reserved) == (Reason.DUPLICATE, 1, False)


async def test_a_sweep_is_spread_over_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep for chats that hold nothing live looked at every chat in one
    call (0.3 s of a blocked event loop at 100,000 chats): now a few a call,
    and every idle chat still goes."""
    store = MemoryStore(state_ttl_seconds=60)
    n = 3000
    for i in range(n):
        await Chat(store, chat=f"test:{i}").human(local=Reason.NOT_ADDRESSED)
    looked: list[int] = []
    idle = store._idle
    monkeypatch.setattr(store, "_idle", lambda chat, now: looked.append(1) or idle(chat, now))
    live = Chat(store, chat="test:live", now_ms=1_000_000 + 7_200_000)  # past every TTL
    most = 0
    for _ in range(memory_module.SWEEP_EVERY + n // memory_module.SWEEP_STEP + 1):
        before = len(looked)
        await live.human(local=Reason.NOT_ADDRESSED)
        most = max(most, len(looked) - before)
    assert most == memory_module.SWEEP_STEP
    assert store.chats() == 1


async def test_max_chats_is_configured_and_passed_to_every_memory_store(redis_url: str) -> None:
    assert StoreConfig().max_chats == 100_000
    assert StoreConfig.model_validate({"max_chats": 500}).max_chats == 500
    for bad in (0, -1, True, 1.5, "many"):
        with pytest.raises(ValidationError, match="max_chats"):
            StoreConfig.model_validate({"max_chats": bad})
    store = open_store("memory://", max_chats=7)
    assert isinstance(store, MemoryStore) and store.max_chats == 7
    failover = open_store(redis_url, max_chats=9)
    try:
        assert isinstance(failover, FailoverStore) and failover.fallback.max_chats == 9
    finally:
        await failover.close()


async def test_footprint_of_a_chat() -> None:
    """Four messages in a chat (a person asks, the bot answers, another bot
    chats, a person chats) cost about 3.1 KB in the memory store (6.3 KB
    before the log, context and dedupe records were made compact); 4 KB is
    the alarm."""
    n = 2000
    store = MemoryStore(context_size=8, max_chats=n)
    limits = Limits()
    gc.collect()
    tracemalloc.start()
    try:
        now = 1_700_000_000_000
        for i in range(n):
            chat = f"telegram:-100{1_000_000_000 + i}"
            now += 1
            asked = Observed(chat, f"{i}1", "1001", "Alice", Count.RESET, "@alpha_bot hello there")
            res = await Chat(store, chat=chat, now_ms=now).admit(
                "1001", bot="7001", count=Count.RESET, author_is_bot=False, mid=asked.message_id,
                text=asked.text, context=8, hold_ms=60_000, tick=0,
            )  # fmt: skip
            d = Decision("alpha", asked.message_id, chat, "1001", Action.REPLY, None, res.turn,
                         res.soft, res.hard, at=now / 1000)  # fmt: skip
            answer = Observed(chat, f"{i}2", "7001", "Alpha", Count.BOT, "@alpha_bot hello there")
            await store.record_sent(SentRequest(answer, "7001", limits, log=d.log_entry(),
                                                now_ms=now, answered=asked.message_id))  # fmt: skip
            other = Chat(store, chat=chat, now_ms=now)
            await other.admit("7002", bot="7001", mid=f"{i}3", local=Reason.BOT_IGNORED,
                              text="thanks alpha, nice to meet you", tick=0)  # fmt: skip
            await other.human("1001", text="just chatting", bot="7001", mid=f"{i}4",
                              local=Reason.NOT_ADDRESSED, tick=0)  # fmt: skip
        gc.collect()
        used, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert store.chats() == n
    print(f"{used / n:.0f} B a chat")
    assert used / n < 4000, f"{used / n:.0f} B a chat"


def test_the_daemon_and_replay_pass_store_max_chats_on(redis_url: str) -> None:
    from gateway.config import parse_config
    from gateway.daemon import Daemon
    from gateway.store.failover import FailoverStore

    bots = "bots: [{name: a, platform: http, backend: {type: echo}}]\n"
    on_memory = Daemon(parse_config("store: {max_chats: 7}\n" + bots))
    assert isinstance(on_memory.store, MemoryStore) and on_memory.store.max_chats == 7
    on_redis = Daemon(parse_config(f"store: {{url: '{redis_url}', max_chats: 9}}\n" + bots))
    assert isinstance(on_redis.store, FailoverStore) and on_redis.store.fallback.max_chats == 9


async def test_cursors_are_bounded_and_lapse_with_the_state_ttl(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Breaks if the memory store keeps every cursor for ever: the LLM proxy
    # saves one per agent session and one per answer it may continue, so a
    # daemon on memory:// grew by one for each, without end.
    store = MemoryStore(max_chats=3, state_ttl_seconds=60)
    clock = [1_800_000_000.0]
    monkeypatch.setattr(memory_module.time, "time", lambda: clock[0])
    for name in "abcd":
        await store.set_cursor(f"llm:{name}", name)
    assert await store.get_cursor("llm:a") is None  # the least recently set, past the bound
    assert [await store.get_cursor(f"llm:{n}") for n in "bcd"] == ["b", "c", "d"]
    clock[0] += 30
    await store.set_cursor("llm:b", "b2")  # set again: lapses a full TTL from now
    clock[0] += 29
    await store.set_cursor("llm:e", "e")  # past the bound: c goes
    clock[0] += 2  # 61 s after c and d were set: d has lapsed
    assert [await store.get_cursor(f"llm:{n}") for n in "bcde"] == ["b2", None, None, "e"]
