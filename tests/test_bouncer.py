"""`botbouncer.Bouncer`, the gateway in a bot's own process: its config
sources and refusals, its ticket calls, `answering`, `posted`, echoes, and
that its state is the store's (shared with other Bouncers and daemons on
one Redis) while its tickets are its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from botbouncer import (
    Action,
    Author,
    Bouncer,
    ChatRef,
    ConfigError,
    Message,
    Reason,
    SpentTicket,
    UnknownTicket,
)
from gateway.config import load_config
from gateway.store import Limits, MemoryStore, SentRequest, SentResult, Store, StoreError
from gateway.store.redis import RedisStore
from tests.daemons import running

BOT = "900"
CHAT = ChatRef("discord", "general")


def config(**policy: Any) -> dict[str, Any]:
    bot = {"name": "helper", "platform": "discord", "mode": "decide", "user_id": BOT,
           "turns": {"soft_limit": 3, "hard_limit": 6}, **policy}  # fmt: skip
    return {"bots": [bot]}


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def person(n: int, text: str = "hi <@900>", *, mention: bool = True) -> Message:
    return Message(id=f"m{n}", chat=CHAT, author=Author("7", "alice"), text=text,
                   mentions=(BOT,) if mention else ())  # fmt: skip


def other_bot(n: int) -> Message:
    return Message(id=f"o{n}", chat=CHAT, author=Author("55", "otherbot", True), text="beep")


def own(message_id: str) -> Message:
    return Message(id=message_id, chat=CHAT, author=Author(BOT, "helper", True), text="hello")


async def soft_and_rate(store: Store) -> tuple[int, int]:
    s = await store.status(CHAT.key, BOT, Limits())
    return s.soft, s.rate_used


# -- where the config comes from ------------------------------------------------------


async def test_the_config_may_be_defaults_a_mapping_a_file_or_a_config(tmp_path: Path) -> None:
    async with Bouncer() as b:  # one decide bot on memory://
        assert (b.bot.name, b.bot.mode, b.bot.platform) == ("bot", "decide", "http")
        assert isinstance(b.store, MemoryStore)
    async with Bouncer(bot="mine", platform="discord") as b:
        assert (b.bot.name, b.bot.platform) == ("mine", "discord")
    path = tmp_path / "b.yml"
    path.write_text(
        "bots:\n"
        "  - {name: front, platform: http, backend: {type: echo}}\n"
        "  - {name: helper, platform: discord, mode: decide, user_id: '900'}\n"
    )
    async with Bouncer(path) as b:  # the first decide bot, not the first bot
        assert b.bot.name == "helper" and b.bot_id == BOT
    async with Bouncer(load_config(path), bot="helper") as b:
        assert b.bot.name == "helper"
    async with Bouncer(config()) as b:
        assert b.bot.user_id == BOT


@pytest.mark.parametrize(
    ("source", "kw", "says"),
    [
        ({"bots": [{"name": "f", "platform": "http", "backend": {"type": "echo"}}]}, {},
         "no bot has mode: decide"),
        ({"bots": [{"name": "f", "platform": "http", "backend": {"type": "echo"}}]},
         {"bot": "f"}, "has mode: proxy"),
        (config(), {"platform": "telegram"}, "configured for platform discord, not telegram"),
        (config(), {"bot": "nobody"}, "nobody"),
        ({"bots": [{"name": "x", "platform": "discord", "mode": "decide", "token": "t"}]}, {},
         "token"),
    ],
)  # fmt: skip
def test_a_config_it_cannot_use_is_a_config_error_naming_why(
    source: dict[str, Any], kw: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        Bouncer(source, **kw)


def test_a_broken_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "b.yml"
    path.write_text("bots: [\n")
    with pytest.raises(ConfigError, match=str(path)):
        Bouncer(path)
    with pytest.raises(ConfigError, match="nonexistent"):
        Bouncer(tmp_path / "nonexistent.yml")


# -- tickets ------------------------------------------------------------------------------


async def test_a_reply_ticket_counts_each_id_once_and_its_echo_asks_nothing(store: Store) -> None:
    async with Bouncer(config(), store=store) as b:
        d = await b.decide(person(1))
        assert (d.action, d.ticket is not None) == (Action.REPLY, True)
        assert await soft_and_rate(store) == (0, 1)  # the slot is held for the answer
        [first] = await b.sent(d, ["r1"], ["hello"])
        [second] = await b.sent(d.ticket or "", ["r2"])  # an answer in two messages
        [again] = await b.sent(d, ["r1"])  # a repeated id is not counted again:
        assert (first.soft, second.soft, again.soft) == (1, 2, 1)  # its first count
        assert await soft_and_rate(store) == (2, 1)
        asked: list[Message] = []
        handle = b.gateway.handle

        async def counting(msg: Message, **kw: Any) -> Any:
            asked.append(msg)
            return await handle(msg, **kw)

        b.gateway.handle = counting  # type: ignore[method-assign]
        assert b.echo(own("r1")) is True  # counted when sent: no store call
        assert b.echo(person(9)) is False  # anyone else's: decide it
        assert asked == []
        with pytest.raises(SpentTicket, match="was sent already: its slot stays spent"):
            await b.release(d)


async def test_refused_ticket_calls_say_why(store: Store) -> None:
    clock = Clock()
    async with Bouncer(config(ticket_seconds=10), store=store, clock=clock) as b:
        d = await b.decide(person(1))
        await b.release(d)
        with pytest.raises(SpentTicket, match="was released"):
            await b.sent(d, ["r1"])
        with pytest.raises(SpentTicket, match="was released already"):
            await b.release(d)
        with pytest.raises(UnknownTicket, match="never issued, or it lapsed"):
            await b.sent("no-such-ticket", ["r1"])
        late = await b.decide(person(2))
        clock.now += 10.001
        with pytest.raises(UnknownTicket, match="ticket_seconds, 10 s"):
            await b.sent(late, ["r2"])
        dropped = await b.decide(person(3, "just chatting", mention=False))
        assert (dropped.action, dropped.reason, dropped.ticket) == (
            Action.DROP, Reason.NOT_ADDRESSED, None)  # fmt: skip
        with pytest.raises(ValueError, match="drop: it has no ticket"):
            await b.sent(dropped, ["r3"])
        with pytest.raises(ValueError, match="drop: it has no ticket"):
            await b.release(dropped)


async def test_a_released_ticket_gives_its_slot_back_a_kept_one_does_not(store: Store) -> None:
    async with Bouncer(config(rate_cap={"max_replies": 1}), store=store) as b:
        d = await b.decide(person(1))
        released = await b.release(d)
        assert (released.action, released.reason) == (Action.DROP, Reason.BACKEND_EMPTY)
        kept = await b.decide(person(2))
        assert kept.action is Action.REPLY  # the slot came back
        capped = await b.decide(person(3))
        assert (capped.action, capped.reason) == (Action.DROP, Reason.RATE_CAPPED)
        assert await soft_and_rate(store) == (0, 1)


async def test_answering_releases_unless_something_was_reported(store: Store) -> None:
    async with Bouncer(config(rate_cap={"max_replies": 1}), store=store) as b:
        d = await b.decide(person(1))
        async with b.answering(d):
            pass  # decided not to answer after all
        assert await soft_and_rate(store) == (0, 0)
        d = await b.decide(person(2))
        with pytest.raises(RuntimeError, match="backend down"):
            async with b.answering(d):
                raise RuntimeError("backend down")
        assert await soft_and_rate(store) == (0, 0)
        d = await b.decide(person(3))
        async with b.answering(d) as answer:
            await answer.sent("r3", "hello")
            await answer.sent("r3b", "and more")
        assert answer.ids == ["r3", "r3b"]
        assert await soft_and_rate(store) == (2, 1)  # counted, and the slot stays spent
        with pytest.raises(SpentTicket):
            await b.release(d)


class SentFails(MemoryStore):
    """A store that goes away between a decision and the count of its reply."""

    async def record_sent(self, req: SentRequest) -> SentResult:
        raise StoreError("the store went away")


async def test_answering_lets_a_store_error_of_sent_through_unmasked() -> None:
    """The ticket is spent before the count fails: answering must not try
    to release it (SpentTicket), which would hide the StoreError."""
    async with Bouncer(config(), store=SentFails()) as b:
        d = await b.decide(person(1))
        with pytest.raises(StoreError, match="went away"):
            async with b.answering(d) as answer:
                await answer.sent("r1", "hello")


async def test_posted_counts_a_message_sent_on_its_own_once(store: Store) -> None:
    async with Bouncer(config(), store=store) as b:
        first = await b.posted(CHAT.key, "digest-1", "the daily digest")
        again = await b.posted(CHAT.key, "digest-1", "the daily digest")
        assert (first.soft, again.soft) == (1, 1)
        assert b.echo(own("digest-1")) is True
        assert await soft_and_rate(store) == (1, 0)


async def test_a_warning_ticket_counts_the_warning(store: Store) -> None:
    """soft_limit 3: another bot's message, this bot's answer, and the other
    bot's next message reaches the limit: this bot warns instead, once."""
    policy = {"bot_messages": "all", "respond_to": "all"}
    async with Bouncer(config(**policy), store=store) as b:
        d = await b.decide(other_bot(1))
        assert d.action is Action.REPLY
        await b.sent(d, ["r1"])
        d = await b.decide(other_bot(2))
        assert (d.action, d.reason, d.soft) == (Action.WARN, Reason.TURN_SOFT_LIMIT, 3)
        assert d.warning and d.ticket
        [counted] = await b.sent(d, ["w1"])
        assert counted.soft == 4  # o1 r1 o2, and the warning
        d = await b.decide(other_bot(3))
        assert (d.action, d.reason, d.ticket) == (Action.DROP, Reason.TURN_THROTTLED, None)


# -- one truth on Redis, tickets of one's own ---------------------------------------------


async def test_bouncers_on_one_redis_share_counts_but_not_tickets(
    redis_url: str, key_prefix: str
) -> None:
    stores = [RedisStore.from_url(redis_url, prefix=key_prefix) for _ in range(2)]
    try:
        async with (
            Bouncer(config(), store=stores[0]) as one,
            Bouncer(config(), store=stores[1]) as two,
        ):
            d = await one.decide(person(1))
            with pytest.raises(UnknownTicket):
                await two.sent(d, ["r1"])  # the ticket is one's own
            await one.sent(d, ["r1"])
            assert await soft_and_rate(stores[1]) == (1, 1)  # the count is everyone's
            seen = await two.decide(own("r1"))  # two sees one's reply: counted already
            assert (seen.reason, seen.soft) == (Reason.OWN_MESSAGE, 1)
            tickets = [k async for k in stores[0].client.scan_iter(match=f"{key_prefix}:t:*")]
            assert tickets == []  # nothing of a Bouncer's tickets is in Redis
    finally:
        for s in stores:
            await s.close()


async def test_a_bouncer_and_a_daemon_on_one_redis_keep_one_count(
    redis_url: str, key_prefix: str
) -> None:
    """A fronted HTTP-ingress bot in the daemon and a Bouncer bot in the same
    chat space (platform http): each one's reply is a turn the other sees."""
    fronted = {"name": "front", "platform": "http", "backend": {"type": "echo"},
               "bot_messages": "all", "respond_to": "all"}  # fmt: skip
    mine = {"bots": [{"name": "helper", "platform": "http", "mode": "decide", "user_id": BOT,
                      "bot_messages": "all", "respond_to": "all"}]}  # fmt: skip
    store = RedisStore.from_url(redis_url, prefix=key_prefix)
    chat = ChatRef("http", "room1")
    try:
        async with (
            running(redis_url, key_prefix, fronted) as daemon,
            Bouncer(mine, store=store) as b,
        ):
            said = Message(id="p1", chat=chat, author=Author("7", "alice"), text="hello all")
            d = await b.decide(said)
            await b.sent(d, ["r1"], ["hi from helper"])
            admin = daemon.server.admins["front"]
            assert (await admin.status(chat.key)).soft == 1
            status = await store.status(chat.key, BOT, Limits())
            assert status.soft == 1
    finally:
        await store.close()


async def test_a_store_passed_in_stays_open_one_opened_is_closed(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[str] = []

    def spy(store: Store, name: str) -> None:
        close = store.close

        async def closing() -> None:
            closed.append(name)
            await close()

        monkeypatch.setattr(store, "close", closing)

    given = MemoryStore()
    spy(given, "given")
    async with Bouncer(config(), store=given) as b:
        await b.decide(person(1))
    assert closed == []
    assert (await given.status(CHAT.key, BOT, Limits())).rate_used == 1  # still usable
    b = Bouncer({"store": {"url": redis_url}, **config()})
    spy(b.store, "opened")
    async with b:
        pass
    assert closed == ["opened"]
