"""Gateway.handle() end to end on a real store (docs/architecture.md), memory and Redis."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest

from gateway.backends import EchoBackend
from gateway.config import BotConfig, parse_config
from gateway.model import Action, Author, ChatKind, ChatRef, Decision, Message, Reason, Turn
from gateway.pipeline import Gateway, limits_for
from gateway.store import ContextEntry, Store
from tests.conftest import StoreFactory

ROOM = ChatRef(platform="http", id="room")


def bot_config(name: str = "helper", **policy: object) -> BotConfig:
    lines = [f"  - name: {name}", "    platform: http", "    backend: {type: echo}"]
    lines += [f"    {k}: {v}" for k, v in policy.items()]
    return parse_config("bots:\n" + "\n".join(lines) + "\n").bots[0]


def human(text: str, *, mid: str, mentions: Sequence[str] = ("helper",),
          chat: ChatRef = ROOM) -> Message:  # fmt: skip
    return Message(id=mid, chat=chat, author=Author("alice", "Alice"), text=text,
                   mentions=tuple(mentions))  # fmt: skip


class Failing:
    name = "failing"

    async def reply(self, msg: Message, context: Sequence[ContextEntry]) -> list[str]:
        raise TimeoutError("backend took too long")


class Empty:
    name = "empty"

    async def reply(self, msg: Message, context: Sequence[ContextEntry]) -> list[str]:
        return ["   "]


class Held:
    """Answers only once released: lets a test hold every call at the first await."""

    name = "held"

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.called = asyncio.Event()
        self.calls = 0

    async def reply(self, msg: Message, context: Sequence[ContextEntry]) -> list[str]:
        self.calls += 1
        self.called.set()
        await self.gate.wait()
        return [f"re: {msg.text}"]


async def test_an_addressed_human_gets_the_echo_and_the_reply_counts_once(store: Store) -> None:
    gw = Gateway(bot_config(), store, EchoBackend())
    d = await gw.handle(human("hello @helper", mid="h1"))
    assert (d.action, d.reason, d.turn, d.replies) == (Action.REPLY, None, Turn.RESET,
                                                       ("hello @helper",))  # fmt: skip
    sent = await gw.sent(d, "r1", d.replies[0])
    assert (sent.turn, sent.soft) == (Turn.OK, 1)
    echo = Message(id="r1", chat=ROOM, author=Author("helper", is_bot=True), text="hello")
    seen = await gw.handle(echo)
    assert (seen.action, seen.reason, seen.soft) == (Action.DROP, Reason.OWN_MESSAGE, 1)
    # the echo of what it sent was decided without the store: nothing to count
    # or file; another replica that sees it asks the store, with the same answer
    log = await store.decisions(ROOM.key)
    assert [(e["id"], e["action"], e["reason"]) for e in log] == [("h1", "reply", None)]
    replica = Gateway(bot_config(), store, EchoBackend())
    there = await replica.handle(echo)
    fields = ("action", "reason", "turn", "soft", "hard")
    assert [getattr(there, f) for f in fields] == [getattr(seen, f) for f in fields]
    assert [e["id"] for e in await store.decisions(ROOM.key)] == ["r1", "h1"]


async def test_unaddressed_and_bot_messages_never_reach_the_backend(store: Store) -> None:
    backend = Held()
    gw = Gateway(bot_config(), store, backend)
    d1 = await gw.handle(human("just chatting", mid="h1", mentions=()))
    other = Message(id="b1", chat=ROOM, author=Author("otherbot", is_bot=True), text="hi",
                    mentions=("helper",))  # fmt: skip
    d2 = await gw.handle(other)
    assert (d1.reason, d2.reason, backend.calls) == (Reason.NOT_ADDRESSED, Reason.BOT_IGNORED, 0)
    assert d2.soft == 1  # counted before gating


@pytest.mark.parametrize(
    ("backend", "reason"), [(Failing(), Reason.BACKEND_ERROR), (Empty(), Reason.BACKEND_EMPTY)]
)
async def test_a_failing_or_empty_backend_releases_the_slot(
    store: Store, backend: Failing | Empty, reason: Reason, caplog: pytest.LogCaptureFixture
) -> None:
    gw = Gateway(bot_config(rate_cap="{max_replies: 1}"), store, backend)
    first = await gw.handle(human("one", mid="h1"))
    assert (first.action, first.reason) == (Action.DROP, reason)
    # the slot came back: an answering backend may use it
    gw.configure(gw.bot, EchoBackend(), None)
    second = await gw.handle(human("two", mid="h2"))
    assert second.action is Action.REPLY
    third = await gw.handle(human("three", mid="h3"))
    assert third.reason is Reason.RATE_CAPPED
    assert (await store.decisions(ROOM.key))[-1]["reason"] == reason.value
    if reason is Reason.BACKEND_ERROR:
        assert "backend took too long" in caplog.text


async def test_fifty_concurrent_messages_with_cap_six_give_exactly_six_replies(
    stores: StoreFactory,
) -> None:
    """The slot is reserved before the backend is awaited: a burst cannot overshoot,
    also when it arrives through three replicas."""
    backend = Held()
    gateways = [Gateway(bot_config(), s, backend) for s in await stores(3)]
    tasks = [asyncio.create_task(gateways[i % 3].handle(human(f"q{i}", mid=f"h{i}")))
             for i in range(50)]  # fmt: skip
    # The backend is held: the only tasks that can finish are those the cap refused.
    pending: set[asyncio.Task[Decision]] = set(tasks)
    while len(pending) > 6:
        _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    done = [t for t in tasks if t.done()]
    assert len(done) == 44 and all(t.result().reason is Reason.RATE_CAPPED for t in done)
    backend.gate.set()
    results = await asyncio.gather(*tasks)
    assert sum(d.action is Action.REPLY for d in results) == 6
    assert backend.calls == 6


async def test_two_bots_ping_pong_stops_at_the_soft_limit_with_one_warning(
    stores: StoreFactory,
) -> None:
    """Two bots on one store answer each other through a fan-out that delivers every
    sent message to both, as a platform would."""
    policy = {"bot_messages": "mentions", "rate_cap": "{max_replies: 1000}"}
    store_a, store_b = await stores(2)
    bots = {
        "alpha": Gateway(bot_config("alpha", **policy), store_a, EchoBackend()),
        "beta": Gateway(bot_config("beta", **policy), store_b, EchoBackend()),
    }
    posted: list[tuple[str, str]] = []  # (author, text) in chat order
    queue: list[Message] = [human("start talking", mid="h0", mentions=("alpha",))]
    seq = 0
    while queue:
        msg = queue.pop(0)
        for name, gw in bots.items():
            d = await gw.handle(msg)
            out = d.replies if d.action is Action.REPLY else (
                (d.warning,) if d.action is Action.WARN and d.warning else ())  # fmt: skip
            for text in out:
                seq += 1
                mid = f"{name}-{seq}"
                await gw.sent(d, mid, text)
                posted.append((name, text))
                other = "beta" if name == "alpha" else "alpha"  # each addresses the other
                queue.append(Message(id=mid, chat=ROOM, author=Author(name, is_bot=True),
                                     text=text, mentions=(other,)))  # fmt: skip
        assert seq < 100, "the loop did not stop"
    warnings = [p for p in posted if p[1].startswith("⚠️")]
    assert len(warnings) == 1
    assert "(20/20)" in warnings[0][1]
    # 20 bot turns, then the warning (itself a bot message), then silence
    assert len(posted) == 21
    status = await store_a.status(ROOM.key, "alpha", limits_for(bots["alpha"].bot, ROOM.kind))
    assert (status.soft, status.turn) == (21, Turn.THROTTLED)


async def test_an_answer_being_written_holds_its_turn_until_sent_or_given_back(
    stores: StoreFactory,
) -> None:
    """soft_limit 2: a bot message that is the chat's 1st bot turn may get one
    answer. While one bot's backend writes it, a second bot stays silent; an
    answer that fails, or a dry run, holds nothing once it is decided."""
    policy = {"bot_messages": "all", "turns": "{soft_limit: 2}"}
    s1, s2 = await stores(2)
    held = Held()
    one = Gateway(bot_config("one", **policy), s1, held)
    two = Gateway(bot_config("two", **policy), s2, Failing())

    def from_peer(mid: str) -> Message:
        return Message(id=mid, chat=ROOM, author=Author("peer", is_bot=True), text="hi",
                       mentions=("one", "two", "dry"))  # fmt: skip

    first = asyncio.create_task(one.handle(from_peer("p1")))
    await held.called.wait()  # one's answer is being written: it holds the 2nd turn
    second = await two.handle(from_peer("p1"))
    assert (second.soft, second.action, second.reason) == (1, Action.DROP,
                                                           Reason.TURN_THROTTLED)  # fmt: skip
    held.gate.set()
    answer = await first
    assert answer.action is Action.REPLY
    assert (await one.sent(answer, "one-1", answer.replies[0])).soft == 2

    await one.handle(human("again", mid="h1", mentions=()))  # a person: back to 0
    failed = await two.handle(from_peer("p2"))  # two's backend fails: its hold goes back
    assert (failed.soft, failed.reason) == (1, Reason.BACKEND_ERROR)
    dry = Gateway(bot_config("dry", **policy), s2, dry_run=True)
    assert (await dry.handle(from_peer("p2"))).action is Action.REPLY  # held nothing
    late = await one.handle(from_peer("p2"))  # 1 + nothing ahead
    assert (late.soft, late.action) == (1, Action.REPLY)


async def test_the_warning_text_names_the_limit_in_force(store: Store) -> None:
    gw = Gateway(bot_config(turns="{soft_limit: 2, hard_limit: 4}", bot_messages="all"),
                 store, EchoBackend())  # fmt: skip
    peer = Author("peer", is_bot=True)
    mk = lambda i, a: Message(id=f"m{i}", chat=ROOM, author=a, text="x",  # noqa: E731
                              mentions=("helper",))  # fmt: skip
    await gw.handle(mk(1, Author("helper", is_bot=True)))
    d = await gw.handle(mk(2, peer))
    assert (d.action, d.warning) == (
        Action.WARN,
        "⚠️ Bot turn limit reached (2/2). A human must reply here to continue the "
        "bot-to-bot conversation.",
    )
    await gw.handle(mk(3, peer))
    d = await gw.handle(mk(4, peer))
    assert d.warning == "🛑 Hard bot turn limit reached (4). A human must reply to continue."


async def test_dm_is_always_addressed_and_not_capped_under_scope_groups(store: Store) -> None:
    gw = Gateway(bot_config(rate_cap="{max_replies: 1}"), store, EchoBackend())
    dm = ChatRef(platform="http", id="dm-alice", kind=ChatKind.DM)
    results = [await gw.handle(human(f"q{i}", mid=f"d{i}", mentions=(), chat=dm))
               for i in range(3)]  # fmt: skip
    assert [d.action for d in results] == [Action.REPLY] * 3


async def test_bot_gating_modes(store: Store) -> None:
    def from_bot(author: str, mid: str, mention: bool) -> Message:
        return Message(id=mid, chat=ROOM, author=Author(author, is_bot=True), text="hey",
                       mentions=("helper",) if mention else ())  # fmt: skip

    mentions = Gateway(bot_config(bot_messages="mentions", respond_to="all"), store,
                       EchoBackend())  # fmt: skip
    assert (await mentions.handle(from_bot("b1", "x1", False))).reason is Reason.BOT_IGNORED
    assert (await mentions.handle(from_bot("b1", "x2", True))).action is Action.REPLY
    trusted = Gateway(bot_config("t", bot_messages="all", trusted_bots="[friend]",
                                 respond_to="all"), store, EchoBackend())  # fmt: skip
    assert (await trusted.handle(from_bot("stranger", "y1", True))).reason is Reason.BOT_IGNORED
    assert (await trusted.handle(from_bot("friend", "y2", True))).action is Action.REPLY


async def test_one_log_line_per_decision(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    gw = Gateway(bot_config(), store, EchoBackend())
    with caplog.at_level(logging.INFO, logger="botbouncer.decision"):
        await gw.handle(human("hi", mid="h1", mentions=()))
    lines = [r for r in caplog.records if r.name == "botbouncer.decision"]
    assert len(lines) == 1
    assert "action=drop reason=not_addressed" in lines[0].getMessage()
    assert lines[0].decision["reason"] == "not_addressed"  # type: ignore[attr-defined]
