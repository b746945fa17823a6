"""Loops with bots nobody marked as bots: `known_bots`, and the machine-pace
backstop (docs/architecture.md) - on memory and on Redis, with one clock.

An auto-responder that posts as a person resets the turn counters with every
message, and in a DM the rate cap does not apply by default: without the
backstop, a bot and an unflagged auto-responder would answer each other for
ever. A person answering at human speed is never stopped."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import pytest

from gateway.backends import EchoBackend
from gateway.config import ConfigError
from gateway.model import Action, Author, ChatKind, ChatRef, Message, Reason
from gateway.pipeline import Gateway
from gateway.store import Store
from gateway.store.base import PACE_SWEEP_AT
from gateway.store.memory import MemoryStore
from gateway.store.redis import RedisStore
from tests.test_pipeline import bot_config

DM = ChatRef(platform="http", id="dm-auto", kind=ChatKind.DM)
GROUP = ChatRef(platform="http", id="group-auto")
DEFAULT_EXCHANGES = 10  # machine_pace.max_exchanges


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def person(author: str, text: str, mid: str, chat: ChatRef) -> Message:
    mentions = ("helper",) if chat.kind is ChatKind.GROUP else ()
    return Message(id=mid, chat=chat, author=Author(author, author), text=text,
                   mentions=mentions)  # fmt: skip


async def converse(
    gw: Gateway,
    clock: Clock,
    chat: ChatRef,
    author: str,
    gaps: list[float],
    think: float = 0.8,
    responder: bool = False,
) -> list[tuple[Action, Reason | None]]:
    """`author` writes, the bot answers `think` seconds later, `author` answers
    back `gaps[i]` seconds after that; the decisions, in order. A `responder`
    (an auto-responder) only ever answers the bot: unanswered, it falls silent."""
    out = []
    for i, gap in enumerate(gaps):
        d = await gw.handle(person(author, f"and then? {i}", f"{chat.id}-{author}-{i}", chat))
        out.append((d.action, d.reason))
        clock.now += think
        if d.action is Action.REPLY:
            await gw.sent(d, f"{chat.id}-reply-{i}", d.replies[0])
        elif responder:
            break
        clock.now += gap
    return out


async def test_an_unflagged_auto_responder_in_a_dm_is_stopped(store: Store) -> None:
    clock = Clock()
    gw = Gateway(bot_config(), store, EchoBackend(), clock=clock)
    got = await converse(gw, clock, DM, "autobot", [0.2] * 40, responder=True)
    # its first message, then max_exchanges fast answers back, are answered;
    # the next is not, and the loop is over
    replies = DEFAULT_EXCHANGES + 1
    assert got == [(Action.REPLY, None)] * replies + [(Action.DROP, Reason.MACHINE_PACE)]
    entry = (await store.decisions(DM.key, 1))[0]
    assert entry["reason"] == "machine_pace"


async def test_an_unflagged_auto_responder_in_a_group_is_stopped(store: Store) -> None:
    clock = Clock()
    gw = Gateway(bot_config(), store, EchoBackend(), clock=clock)
    got = await converse(gw, clock, GROUP, "autobot", [0.0] * 20, responder=True)
    replies = [a for a, _ in got].index(Action.DROP)
    # the rate cap (6 in 120 s) may stop it first in a group; either way, soon
    assert replies <= DEFAULT_EXCHANGES + 1
    lifted = Gateway(bot_config("helper", rate_cap="{scope: groups, max_replies: 1000}"),
                     store, EchoBackend(), clock=clock)  # fmt: skip
    other = ChatRef(platform="http", id="group-auto-2")
    got = await converse(lifted, clock, other, "autobot", [0.0] * 20, responder=True)
    assert got[-1] == (Action.DROP, Reason.MACHINE_PACE) and len(got) == DEFAULT_EXCHANGES + 2


async def test_a_person_answering_every_5_to_20_seconds_is_never_stopped(store: Store) -> None:
    clock = Clock()
    gw = Gateway(bot_config(), store, EchoBackend(), clock=clock)
    rng = random.Random(20)
    got = await converse(gw, clock, DM, "alice", [rng.uniform(5, 20) for _ in range(200)])
    assert got == [(Action.REPLY, None)] * 200


async def test_a_person_who_answers_quickly_now_and_then_is_never_stopped(store: Store) -> None:
    """A quick 'ok' after a reply is human too: only a run of them stops."""
    clock = Clock()
    gw = Gateway(bot_config(), store, EchoBackend(), clock=clock)
    gaps = [0.5 if i % 3 else 8.0 for i in range(120)]  # two quick answers, then a slow one
    got = await converse(gw, clock, DM, "bob", gaps)
    assert got == [(Action.REPLY, None)] * 120


async def test_writing_at_a_human_pace_again_lifts_the_stop(store: Store) -> None:
    clock = Clock()
    gw = Gateway(bot_config(machine_pace="{max_exchanges: 2}"), store, EchoBackend(), clock=clock)
    got = await converse(gw, clock, DM, "autobot", [0.1, 0.1, 0.1, 30.0, 0.1])
    assert [r for _, r in got] == [None, None, None, Reason.MACHINE_PACE, None]


async def test_zero_seconds_turns_the_backstop_off(store: Store) -> None:
    clock = Clock()
    gw = Gateway(bot_config(machine_pace="{within_seconds: 0}"), store, EchoBackend(),
                 clock=clock)  # fmt: skip
    got = await converse(gw, clock, DM, "autobot", [0.1] * 30)
    assert got == [(Action.REPLY, None)] * 30


async def test_an_admin_reset_clears_the_pace(store: Store) -> None:
    clock = Clock()
    gw = Gateway(bot_config(machine_pace="{max_exchanges: 1}"), store, EchoBackend(), clock=clock)
    got = await converse(gw, clock, DM, "autobot", [0.1, 0.1, 0.1])
    assert got[-1] == (Action.DROP, Reason.MACHINE_PACE)
    await store.reset(DM.key)
    d = await gw.handle(person("autobot", "hello again", "after-reset", DM))
    assert (d.action, d.reason) == (Action.REPLY, None)


async def test_known_bots_are_bots_whatever_the_platform_says(store: Store) -> None:
    clock = Clock()
    gw = Gateway(bot_config(known_bots="[autobot]"), store, EchoBackend(), clock=clock)
    d = await gw.handle(person("autobot", "hi", "k1", GROUP))
    # bot_messages is off by default: a known bot is ignored, and counted as a bot turn
    assert (d.action, d.reason) == (Action.DROP, Reason.BOT_IGNORED)
    assert (await store.status(GROUP.key, "helper", gw.limits(ChatKind.GROUP))).soft == 1
    answered = Gateway(bot_config("helper", known_bots="[autobot]", bot_messages="all"),
                       store, EchoBackend(), clock=clock)  # fmt: skip
    dm = ChatRef(platform="http", id="dm-known", kind=ChatKind.DM)
    got = await converse(answered, clock, dm, "autobot", [0.1] * 30)
    # a bot now: the turn limit (soft 20) stops the loop, as for any bot
    assert got[20][1] is not None and got[20][0] is not Action.REPLY


async def test_known_people_are_people_whatever_the_platform_says(store: Store) -> None:
    # Breaks if a bridge's or PluralKit's webhook posts (bots to Discord)
    # stay bot turns when listed in known_people: with bot_messages off by
    # default the people they carry were never answered, and their messages
    # never reset the count.
    clock = Clock()
    gw = Gateway(bot_config(known_people="[bridge]"), store, EchoBackend(), clock=clock)
    bridged = replace(person("bridge", "hi", "p1", GROUP), author=Author("bridge", "Ann", True))
    d = await gw.handle(bridged)
    assert (d.action, d.reason) == (Action.REPLY, None)
    d = await gw.handle(replace(bridged, id="p2"))  # a person: resets the count
    assert d.turn == "reset"
    unlisted = replace(bridged, id="p3", author=Author("other-hook", "Bo", True))
    assert (await gw.handle(unlisted)).reason == Reason.BOT_IGNORED
    # a listed "person" that is a bot answering at once is still stopped
    # by the machine-pace backstop, as any unflagged auto-responder is
    dm = ChatRef(platform="http", id="dm-bridge", kind=ChatKind.DM)
    got = []
    for i in range(DEFAULT_EXCHANGES + 2):
        said = Message(id=f"b{i}", chat=dm, author=Author("bridge", "Ann", True), text=f"{i}")
        d = await gw.handle(said)
        got.append(d.reason)
        clock.now += 0.5
        if d.action is Action.REPLY:
            await gw.sent(d, f"r{i}", d.replies[0])
        clock.now += 0.1
    assert got[-1] == Reason.MACHINE_PACE and got[0] is None


def test_an_author_is_a_known_bot_or_a_known_person_not_both() -> None:
    with pytest.raises(ConfigError, match="known_people: 'x' is in known_bots too"):
        bot_config(known_bots="[x, y]", known_people="[x]")


async def pace_entries(store: Store, chat: ChatRef) -> int:
    if isinstance(store, MemoryStore):
        return len(store._chats[chat.key].pace)
    assert isinstance(store, RedisStore)
    return int(await store.client.hlen(store.keys(chat.key).pace))


async def test_a_busy_chat_keeps_only_the_pace_entries_that_still_decide(store: Store) -> None:
    # Without the sweep, a chat answered often enough that its pace entries
    # never lapse kept one per person ever answered (here 300).
    clock = Clock()
    gw = Gateway(bot_config(rate_cap="{scope: groups, max_replies: 10000}"), store,
                 EchoBackend(), clock=clock)  # fmt: skip
    chat = ChatRef(platform="http", id="group-busy")
    most = 0
    for i in range(300):
        d = await gw.handle(person(f"user{i}", "hi", f"busy-{i}", chat))
        assert d.action is Action.REPLY
        clock.now += 0.2
        await gw.sent(d, f"busy-reply-{i}", d.replies[0])
        most = max(most, await pace_entries(store, chat))
    assert 10 <= most <= PACE_SWEEP_AT + 1
    # and what the sweep keeps still decides: a fast run of answers back stops
    got = await converse(gw, clock, chat, "autobot", [0.1] * 20, responder=True)
    assert got[-1] == (Action.DROP, Reason.MACHINE_PACE)


async def test_a_backend_slower_than_the_pace_does_not_reset_the_count(store: Store) -> None:
    """The auto-responder's fast answers back are counted until the bot's next
    answer, however long its backend takes (an LLM: seconds): on Redis the pace
    entries lapsed `within_seconds` + 1 s after the last one, in real time, so
    a backend slower than that started every count from zero and the loop
    never stopped."""
    clock = Clock()
    gw = Gateway(bot_config(machine_pace="{within_seconds: 0.1, max_exchanges: 2}"), store,
                 EchoBackend(), clock=clock)  # fmt: skip
    got = []
    for i in range(4):
        d = await gw.handle(person("autobot", f"more {i}", f"slow-{i}", DM))
        got.append(d.reason)
        if d.action is not Action.REPLY:
            break
        await asyncio.sleep(1.2)  # the backend writing (real time: Redis's TTLs)
        clock.now += 1.2
        await gw.sent(d, f"slow-reply-{i}", d.replies[0])
        clock.now += 0.05  # the auto-responder answers at once
    assert got == [None, None, None, Reason.MACHINE_PACE]
