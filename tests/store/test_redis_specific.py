"""What only the Redis store promises (docs/architecture.md): TTLs, hash tags, server time,
surviving a script flush."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from redis.crc import key_slot

from gateway.model import Action, Decision, Reason, Turn
from gateway.store import AdmitRequest, Limits, Observed, Overrides, Store
from gateway.store.redis import LateCall, RedisStore, ServerClock, pack_log, unpack_log
from gateway.turns import Count
from tests.store.harness import Chat

PAIRS = Limits(pair_max_events=2, pair_window_ms=60_000, pair_cooldown_ms=60_000)


@pytest.fixture
async def rstore(
    redis_url: str, key_prefix: str, redis_client: object
) -> AsyncIterator[RedisStore]:
    store = RedisStore.from_url(redis_url, prefix=key_prefix)
    yield store
    await store.close()


async def workload(store: RedisStore, chat_key: str) -> None:
    chat = Chat(store, chat=chat_key, limits=PAIRS)
    for i in range(6):
        await chat.admit("A" if i % 2 == 0 else "B", context=3)
    await chat.human(context=3, hold_ms=60_000)  # B holds the turn of its answer
    await chat.admit("A", mid="pending", hold_ms=60_000)  # ...and of another
    await chat.sent("B")
    await store.release(chat_key, "B", "nope", {"id": "nope"})
    await store.set_paused(chat_key, True)
    await store.set_overrides(chat_key, Overrides(soft_limit=5))


async def test_every_key_has_a_ttl(rstore: RedisStore, key_prefix: str) -> None:
    await workload(rstore, "test:ttl")
    keys = [k async for k in rstore.client.scan_iter(match=f"{key_prefix}:*")]
    assert {k.rsplit(":", 1)[-1] for k in keys} >= {"st", "cfg", "ids", "idq", "pr", "ctx",
                                                    "log", "B", "ho"}  # fmt: skip
    for key in keys:
        assert await rstore.client.pttl(key) > 0, key


async def test_all_keys_of_a_chat_share_one_cluster_slot(rstore: RedisStore,
                                                         key_prefix: str) -> None:  # fmt: skip
    await workload(rstore, "tg:-1001:7")
    keys = [k async for k in rstore.client.scan_iter(match=f"{key_prefix}:*")]
    assert len(keys) >= 9
    assert len({key_slot(k.encode()) for k in keys}) == 1


async def test_chat_ids_with_braces_stay_separate(rstore: RedisStore) -> None:
    a, b = Chat(rstore, chat="x{y}z"), Chat(rstore, chat="x{y")
    await a.admit("A")
    await a.admit("A")
    res = await b.admit("A")
    assert res.soft == 1
    keys = rstore.keys("x{y}z").common("B")
    assert len({key_slot(k.encode()) for k in keys}) == 1


async def test_time_comes_from_the_redis_server(rstore: RedisStore) -> None:
    obs = Observed("test:time", "t1", "alice", "alice", Count.RESET, "hi")
    req = AdmitRequest(obs, bot="B", local_reason=None, author_is_bot=False, limits=Limits())
    res = await rstore.admit(req)  # no injected clock: the script asks Redis TIME
    server_sec, _ = await rstore.client.time()
    assert abs(res.at_ms / 1000 - int(server_sec)) < 5


async def test_a_script_flush_never_surfaces(rstore: RedisStore) -> None:
    chat = Chat(rstore, limits=Limits(max_replies=1))
    first = await chat.human()
    await rstore.client.script_flush()
    second = await chat.human()  # register_script reloads on NOSCRIPT
    assert (first.reserved, second.reason) == (True, Reason.RATE_CAPPED)
    await rstore.client.script_flush()
    await chat.sent("B")
    await rstore.client.script_flush()
    await rstore.reset(chat.chat)
    await rstore.client.script_flush()
    await rstore.release(chat.chat, "B", "x", None)


async def test_a_lost_keyspace_starts_the_chat_afresh(rstore: RedisStore, key_prefix: str) -> None:
    chat = Chat(rstore)
    for _ in range(5):
        await chat.admit("A")
    keys = [k async for k in rstore.client.scan_iter(match=f"{key_prefix}:*")]
    await rstore.client.delete(*keys)  # what a restart without persistence leaves
    res = await chat.admit("A")
    assert (res.soft, res.action, res.reason) == (1, None, None)


async def test_decision_log_entries_are_json_with_every_field(rstore: RedisStore) -> None:
    chat = Chat(rstore)
    await chat.human(local=Reason.NOT_ADDRESSED)
    (entry,) = await rstore.decisions(chat.chat)
    assert entry["action"] == Action.DROP.value and entry["reason"] == "not_addressed"
    assert entry["turn"] == "reset" and entry["bot"] == "B"
    raw = await rstore.client.lindex(rstore.keys(chat.chat).log, 0)
    assert raw.startswith("[") and '"action"' not in raw  # positional: no key names
    # what the pipeline files through sent/release packs the same way
    decision = Decision("B", "m9", chat.chat, "al", Action.DROP, Reason.CLASSIFIER_SKIP,
                        Turn.RESET, 0, 0, at=12.5)  # fmt: skip
    packed = pack_log(decision.log_entry())
    assert packed.startswith("[") and unpack_log(packed) == decision.log_entry()


async def test_log_and_context_written_before_the_compact_form_are_still_read(
    rstore: RedisStore,
) -> None:
    """An upgrade meets entries an older version wrote as JSON objects."""
    chat = Chat(rstore)
    keys = rstore.keys(chat.chat)
    old = {"at": 12.5, "bot": "B", "id": "m0", "author": "al", "action": "drop",
           "reason": "not_addressed", "turn": "reset", "soft": 0, "hard": 0}  # fmt: skip
    await rstore.client.lpush(keys.log, json.dumps(old))
    await rstore.client.lpush(keys.ctx, json.dumps(
        {"id": "m0", "author": "al", "name": "Al", "bot": False, "text": "hi"}))  # fmt: skip
    res = await chat.human(context=3)
    assert [(e.id, e.name, e.text) for e in res.context] == [("m0", "Al", "hi")]
    new = {**old, "at": res.at_ms / 1000, "id": "m1", "reason": "classifier_skip"}
    await rstore.release(chat.chat, "B", "m1", new)
    assert await rstore.decisions(chat.chat) == [new, old]


def test_the_server_clock_keeps_the_nearest_offset_and_follows_a_stepped_clock() -> None:
    clock = ServerClock()
    assert clock.deadline(1_000.0, 500) is None  # no sample yet: no deadline
    clock.sample(10_000, 1_004.0)  # answer arrived 4 ms after the script read TIME
    clock.sample(10_050, 1_051.0)  # 1 ms after: nearer the true offset (9,000)
    clock.sample(10_100, 1_130.0)  # a slow answer says less and is not taken
    assert clock.deadline(2_000.0, 500) == 2_000 + 8_999 + 500
    # the local clock stepped back a minute: samples rise, followed at once
    clock.sample(10_200, 1_200.0 - 60_000)
    assert clock.deadline(0.0, 0) == 10_200 - (1_200 - 60_000)
    # stepped forward again: the old, larger offset lasts until two windows pass
    later = 1_200.0 + 2 * ServerClock.WINDOW_MS + 1
    clock.sample(int(later + 9_000), later)
    assert clock.deadline(later, 0) == int(later + 69_000)
    clock.sample(int(later + 9_000 + 31_000), later + 31_000.0 + 1)
    clock.sample(int(later + 9_000 + 62_000), later + 62_000.0 + 2)
    assert clock.deadline(later, 0) == int(later + 9_000 - 1)


async def test_a_late_admit_is_refused_unrun(rstore: RedisStore, key_prefix: str) -> None:
    """An admit whose deadline (server time) has passed when Redis reaches it
    writes nothing and says so; one within its deadline runs as always."""
    late = RedisStore.from_url(_url(rstore), prefix=key_prefix, call_timeout=0.5)
    try:
        obs = Observed("test:late", "b1", "other", "other", Count.BOT)
        req = AdmitRequest(obs, "B", None, True, Limits(), hold_ms=60_000)
        late.clock.sample(0, 10**15)  # Redis's clock taken to be far behind: always late
        with pytest.raises(LateCall):
            await late.admit(req)
        assert await rstore.client.keys(f"{key_prefix}:*late*") == []
        late.clock = ServerClock()  # no offset known: no deadline sent
        assert (await late.admit(req)).soft == 1
        assert late.clock.deadline(0.0, 0) is not None  # ...and now one is learned
    finally:
        await late.close()


def _url(store: RedisStore) -> str:
    kw = store.client.get_connection_kwargs()
    return f"redis://{kw['host']}:{kw['port']}/{kw.get('db', 0)}"


async def test_a_bot_with_a_shorter_pair_window_does_not_lift_another_pairs_cooldown(
    store: Store,
) -> None:
    """Bots with their own `pairs:` policy share a chat's pair windows: an
    exchange counted under a short window and cooldown set the whole key's
    TTL to that, in real time, and the cooldown of a pair under a longer one
    lapsed with it (the memory store keeps it to its end)."""
    long = Limits(pair_max_events=2, pair_window_ms=60_000, pair_cooldown_ms=600_000)
    short = Limits(pair_max_events=2, pair_window_ms=500, pair_cooldown_ms=500)
    chat = Chat(store, chat="test:pair-ttl", limits=long)
    for author in "ABAB":  # A and B answer each other: the pair cools down for 600 s
        await chat.admit(author, bot="X")
    assert (await chat.admit("A", bot="B")).reason is Reason.PAIR_COOLDOWN
    chat.limits = short
    await chat.admit("C", bot="X")  # an exchange of another pair, counted under `short`
    await asyncio.sleep(1.6)  # past the short TTL, in Redis's time
    chat.limits = long
    assert (await chat.admit("A", bot="B", tick=2)).reason is Reason.PAIR_COOLDOWN
