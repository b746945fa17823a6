"""A bot's own messages coming back (Discord shows a bot what it sent): the
gateway decides on them itself, without a store call, also when the echo
comes before `sent` counted the message or before the platform answered its
id - and asks the store when the echo turns out to be none of its sends.
On a real store, memory and Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.backends import EchoBackend
from gateway.model import Action, Author, Decision, Message, Reason
from gateway.pipeline import Gateway
from gateway.store import AdmitRequest, AdmitResult, SentRequest, SentResult, Store, StoreError
from tests.decisions import Decisions
from tests.test_pipeline import ROOM, bot_config, human


class Watched:
    """A real store, its admit calls counted, its record_sent held or failed
    on demand."""

    def __init__(self, store: Store) -> None:
        self.inner = store
        self.kind = store.kind
        self.admitted: list[str] = []
        self.hold: asyncio.Event | None = None
        self.counting = asyncio.Event()  # record_sent was called
        self.fail_sent = False

    async def admit(self, req: AdmitRequest) -> AdmitResult:
        self.admitted.append(req.msg.message_id)
        return await self.inner.admit(req)

    async def record_sent(self, req: SentRequest) -> SentResult:
        self.counting.set()
        if self.hold is not None:
            await self.hold.wait()
        if self.fail_sent:
            raise StoreError("redis record_sent failed: connection refused")
        return await self.inner.record_sent(req)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def own(mid: str) -> Message:
    return Message(id=mid, chat=ROOM, author=Author("helper", is_bot=True), text="re")


async def answered(gw: Gateway, mid: str = "h1") -> Decision:
    d = await gw.handle(human("hello @helper", mid=mid))
    assert d.action is Action.REPLY
    return d


def decided(decisions: Decisions, mid: str) -> list[tuple[str, str | None, int]]:
    return [(d["action"], d["reason"], d["soft"]) for d in decisions.seen if d["id"] == mid]


@pytest.fixture
def watched(store: Store) -> Watched:
    return Watched(store)


async def test_an_echo_after_its_count_is_decided_at_once(
    watched: Watched, decisions: Decisions
) -> None:
    gw = Gateway(bot_config(), watched, EchoBackend())  # type: ignore[arg-type]
    d = await answered(gw)
    with gw.sending(ROOM.key):
        await gw.sent(d, "r1", "re")
    assert gw.echo(own("r1")) is True
    assert decided(decisions, "r1") == [("drop", "own_message", 1)]
    assert watched.admitted == ["h1"]


async def test_an_echo_before_the_platform_answered_its_id_waits_for_that_send(
    watched: Watched, decisions: Decisions
) -> None:
    gw = Gateway(bot_config(), watched, EchoBackend())  # type: ignore[arg-type]
    d = await answered(gw)
    with gw.sending(ROOM.key):
        # the gateway event comes first: the POST has not answered "r1" yet
        assert gw.echo(own("r1")) is True
        assert decided(decisions, "r1") == []
        await gw.sent(d, "r1", "re")
        assert decided(decisions, "r1") == [("drop", "own_message", 1)]
    assert watched.admitted == ["h1"]  # no store call for the echo
    assert (await watched.inner.status(ROOM.key, "helper", gw.limits(ROOM.kind))).soft == 1


async def test_an_echo_while_its_count_is_under_way_waits_for_it(
    watched: Watched, decisions: Decisions
) -> None:
    gw = Gateway(bot_config(), watched, EchoBackend())  # type: ignore[arg-type]
    d = await answered(gw)
    watched.hold = asyncio.Event()
    with gw.sending(ROOM.key):
        counting = asyncio.ensure_future(gw.sent(d, "r1", "re"))
        await watched.counting.wait()
        assert gw.echo(own("r1")) is True
        assert decided(decisions, "r1") == []
        watched.hold.set()
        assert (await counting).soft == 1
    assert decided(decisions, "r1") == [("drop", "own_message", 1)]
    assert watched.admitted == ["h1"]


async def test_an_own_message_none_of_the_sends_was_goes_to_the_store_when_they_end(
    watched: Watched, decisions: Decisions
) -> None:
    """Sent by another replica of the bot while this one sent in the chat:
    parked until this gateway's send is known, then the store decides (and
    counts it: a turn the other replica reports too, counted once)."""
    gw = Gateway(bot_config(), watched, EchoBackend())  # type: ignore[arg-type]
    d = await answered(gw)
    with gw.sending(ROOM.key):
        assert gw.echo(own("elsewhere")) is True
        await gw.sent(d, "r1", "re")
        assert watched.admitted == ["h1"]
    await decisions.wait("elsewhere", "helper")  # decided in a task of the gateway's
    assert decided(decisions, "elsewhere") == [("drop", "own_message", 2)]
    assert watched.admitted == ["h1", "elsewhere"]


async def test_an_own_message_with_no_send_under_way_is_for_handle(watched: Watched) -> None:
    gw = Gateway(bot_config(), watched, EchoBackend())  # type: ignore[arg-type]
    assert gw.echo(own("before-a-restart")) is False
    d = await gw.handle(own("before-a-restart"))
    assert (d.action, d.reason, d.soft) == (Action.DROP, Reason.OWN_MESSAGE, 1)
    assert watched.admitted == ["before-a-restart"]
    assert gw.echo(human("hi", mid="h9")) is False  # someone else's: never the echo's


async def test_an_echo_whose_count_failed_is_decided_by_the_store(
    watched: Watched, decisions: Decisions
) -> None:
    """`sent` could not count the reply: its echo does (so the turn is not lost)."""
    gw = Gateway(bot_config(), watched, EchoBackend())  # type: ignore[arg-type]
    d = await answered(gw)
    watched.fail_sent = True
    with gw.sending(ROOM.key):
        assert gw.echo(own("r1")) is True
        with pytest.raises(StoreError):
            await gw.sent(d, "r1", "re")
    await decisions.wait("r1", "helper")  # decided in a task of the gateway's
    assert decided(decisions, "r1") == [("drop", "own_message", 1)]
    assert watched.admitted == ["h1", "r1"]
    assert (await watched.inner.status(ROOM.key, "helper", gw.limits(ROOM.kind))).soft == 1


async def test_sends_in_one_chat_overlap_and_the_last_one_releases_the_unmatched(
    watched: Watched, decisions: Decisions
) -> None:
    gw = Gateway(bot_config(), watched, EchoBackend())  # type: ignore[arg-type]
    one, two = await answered(gw, "h1"), await answered(gw, "h2")
    with gw.sending(ROOM.key):
        with gw.sending(ROOM.key):
            assert gw.echo(own("r2")) is True
            assert gw.echo(own("stray")) is True
            await gw.sent(one, "r1", "re")
        # one send ended, the other has not: the stray still waits
        assert watched.admitted == ["h1", "h2"]
        await gw.sent(two, "r2", "re")
        assert decided(decisions, "r2") == [("drop", "own_message", 2)]
    await decisions.wait("stray", "helper")  # decided in a task of the gateway's
    assert watched.admitted == ["h1", "h2", "stray"]


async def test_one_id_reported_sent_twice_at_once_is_counted_once_without_an_error(
    watched: Watched, decisions: Decisions
) -> None:
    """A decide-mode bot that retries `/sent` while its first call still waits
    on the store reports one id twice at once: the second count's bookkeeping
    was the first's, and the later of the two to end failed with a KeyError
    after its count (a 500 for a reply that was counted)."""
    gw = Gateway(bot_config(), watched, EchoBackend())  # type: ignore[arg-type]
    d = await answered(gw)
    watched.hold = asyncio.Event()
    first = asyncio.ensure_future(gw.sent(d, "r1", "re"))
    await watched.counting.wait()
    again = asyncio.ensure_future(gw.sent(d, "r1", "re", first=False))
    await asyncio.sleep(0)
    assert gw.echo(own("r1")) is True  # the echo waits for a count, either one
    watched.hold.set()
    counted = await asyncio.gather(first, again)
    assert [c.soft for c in counted] == [1, 1]
    assert decided(decisions, "r1") == [("drop", "own_message", 1)]
    assert watched.admitted == ["h1"]
    assert gw.echo(own("r1")) is True  # known as counted
