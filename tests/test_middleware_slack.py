"""The Slack Bolt middleware (botbouncer.slack) end to end: real slack_bolt
AsyncApps, written as Bolt's docs write them, plus one `guard(...)` line,
connected by Socket Mode to the fake Slack of tests/fakes/slack/.

Decisions are awaited through the decision log lines the gateway writes, the
platform side through the fake's recorded messages and acks: nothing sleeps.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_bolt.context.say.async_say import AsyncSay
from slack_bolt.listener.asyncio_runner import AsyncioListenerRunner
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

import botbouncer.slack
from botbouncer import Bouncer, ConfigError
from botbouncer.slack import SlackGuard, guard
from gateway.store import Limits, Store, StoreError
from gateway.store.redis import RedisStore
from tests.conftest import StoreFactory
from tests.daemons import running
from tests.decisions import Decisions
from tests.examples import EXAMPLES, example, program_env, run_once
from tests.fakes.slack import FakeSlack, Json
from tests.fakes.slack.payloads import new_message
from tests.fakes.slack.world import FakeApp
from tests.redis_server import free_port

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
ALICE = "U0ALICE"
ALPHA, BETA = "A0ALPHA", "A0BETA"  # app ids
A_USER, B_USER = "U0ALPHA", "U0BETA"  # their bot users
USER_OF = {ALPHA: A_USER, BETA: B_USER}
CHAN = "C0GENERAL"
WARNING = "Bot turn limit reached (4/4)"

Listener = Callable[..., Awaitable[None]]


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as f:
        w = f.world
        w.add_user(ALICE, "alice")
        w.add_app(ALPHA, "alpha", bot_id="B0ALPHA", bot_user_id=A_USER)
        w.add_app(BETA, "beta", bot_id="B0BETA", bot_user_id=B_USER)
        w.add_channel(CHAN, "general", ALICE, A_USER, B_USER)
        yield f
        assert f.unknown_methods == []


def chat(channel: str, thread: str | None = None) -> str:
    return f"slack:{channel}" if thread is None else f"slack:{channel}:{thread}"


def config(name: str, **policy: Any) -> dict[str, Any]:
    """A decide bot that answers every message, people's and bots'."""
    bot = {
        "name": name,
        "platform": "slack",
        "mode": "decide",
        "bot_messages": "all",
        "respond_to": "all",
        "turns": {"soft_limit": 4, "hard_limit": 10},
        **policy,
    }
    return {"bots": [bot]}


async def echo(message: Json, say: AsyncSay, **_: Any) -> None:
    """Answer with the message's text, in its thread if it is in one."""
    await say(text=message.get("text") or "", thread_ts=message.get("thread_ts"))


class Shown(list[Json]):
    """The message events an app's listeners were called with."""


def bolt(
    fake: FakeSlack,
    app_id: str,
    bouncer: Bouncer,
    listener: Listener = echo,
    *,
    app_kw: dict[str, Any] | None = None,
    **kw: Any,
) -> tuple[AsyncApp, SlackGuard, Shown]:
    """A Bolt app as its docs write one: guarded, then `@app.message()` with
    `listener` (given message, say and client). Every message its listener
    was shown is in the Shown."""
    app = AsyncApp(client=fake.web_client(app_id), **(app_kw or {}))
    g = guard(app, bouncer, **kw)
    shown = Shown()

    @app.message()
    async def on_message(message: Json, say: AsyncSay, client: AsyncWebClient) -> None:
        shown.append(message)
        await listener(message=message, say=say, client=client)

    return app, g, shown


@asynccontextmanager
async def online(fake: FakeSlack, *apps: tuple[AsyncApp, str]) -> AsyncIterator[None]:
    """Each app connected by Socket Mode; disconnected in reverse."""
    async with AsyncExitStack() as stack:
        for app, app_id in apps:
            handler = AsyncSocketModeHandler(app, fake.world.apps[app_id].app_token)
            await handler.connect_async()  # type: ignore[no-untyped-call]
            stack.push_async_callback(handler.close_async)
            await fake.wait_until(partial(fake.connected, app_id), what=f"{app_id} connected")
        yield


def idle(*guards: SlackGuard) -> Callable[[], Awaitable[None]]:
    async def settle() -> None:
        for g in guards:
            await g.idle()

    return settle


async def quiet(
    fake: FakeSlack,
    decisions: Decisions,
    channel: str,
    apps: tuple[str, ...],
    settle: Callable[[], Awaitable[Any]],
    *,
    warnings: bool = True,
    since: int = 0,
) -> list[Json]:
    """Wait until the apps in `channel` have stopped: each decided every
    message there (from the `since`th on) that is not its own, every request
    it got is handled (`settle`), and each `reply` (and, with `warnings`,
    `warn`) was answered. Returns what the apps posted there."""
    users = [USER_OF[a] for a in apps]
    while True:
        said = fake.messages(channel)[since:]
        for m in said:
            for user in users:
                if user != m["user"]:
                    await decisions.wait(m["ts"], user)
        await fake.wait_until(lambda: all(not fake.pending(a) for a in apps), what="all acked")
        await settle()
        if len(fake.messages(channel)) == since + len(said):
            sent = [m for m in said if m["user"] in users]
            acted = ("reply", "warn") if warnings else ("reply",)
            keys = {chat(channel, m.get("thread_ts")) for m in said}
            expected = [d for d in decisions.seen if d["chat"] in keys and d["action"] in acted]
            assert len(sent) == len(expected)
            return sent


def warnings_in(sent: list[Json]) -> list[Json]:
    return [m for m in sent if "limit reached" in m["text"]]


async def status(store: Store, key: str, user: str) -> tuple[int, int]:
    """(soft, rate slots used by `user`) in chat `key`."""
    s = await store.status(key, user, Limits())
    return s.soft, s.rate_used


@asynccontextmanager
async def alpha_and_beta(
    fake: FakeSlack, stores: StoreFactory, **kw: Any
) -> AsyncIterator[tuple[Store, SlackGuard, SlackGuard]]:
    """alpha and beta, two echo apps, each with its own Bouncer on one shared
    store (on Redis, two clients), connected."""
    store, other = await stores(2)
    async with (
        Bouncer(config("alpha"), platform="slack", store=store) as b1,
        Bouncer(config("beta"), platform="slack", store=other) as b2,
    ):
        a1, g1, _ = bolt(fake, ALPHA, b1, **kw)
        a2, g2, _ = bolt(fake, BETA, b2, **kw)
        async with online(fake, (a1, ALPHA), (a2, BETA)):
            yield store, g1, g2


@contextmanager
def watching(level: int) -> Iterator[list[logging.LogRecord]]:
    """The records botbouncer.slack logs at `level` or above meanwhile."""
    records: list[logging.LogRecord] = []

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("botbouncer.slack")
    watch, old = Watch(level), logger.level
    logger.addHandler(watch)
    logger.setLevel(min(level, old or logging.WARNING))
    try:
        yield records
    finally:
        logger.removeHandler(watch)
        logger.setLevel(old)


# -- a mention, its answer ---------------------------------------------------------------


async def test_a_mention_is_answered_and_its_reply_counted_once(
    fake: FakeSlack, stores: StoreFactory, decisions: Decisions
) -> None:
    """alpha answers a mention with `say`; beta, a second guarded app in the
    channel that answers mentions only, decides alpha's reply: the store
    counted it once, when alpha posted it."""
    store, other = await stores(2)
    mentions = {"respond_to": "mentions"}
    async with (
        Bouncer(config("alpha", **mentions), platform="slack", store=store) as b1,
        Bouncer(config("beta", **mentions), platform="slack", store=other) as b2,
    ):

        async def answer(message: Json, say: AsyncSay, **_: Any) -> None:
            await say(f"hi <@{message['user']}>")

        a1, g1, shown = bolt(fake, ALPHA, b1, answer)
        a2, g2, _ = bolt(fake, BETA, b2, answer)
        async with online(fake, (a1, ALPHA), (a2, BETA)):
            said = await fake.user_says(CHAN, ALICE, f"<@{A_USER}> hello")
            seen = await decisions.wait(said["ts"], A_USER)
            assert (seen["action"], seen["turn"]) == ("reply", "reset")
            [_, reply] = await fake.wait_for_messages(CHAN, 2)
            assert (reply["user"], reply["text"]) == (A_USER, f"hi <@{ALICE}>")
            theirs = await decisions.wait(reply["ts"], B_USER)
            assert (theirs["reason"], theirs["soft"]) == ("not_addressed", 1)
            await idle(g1, g2)()
            assert await status(store, chat(CHAN), A_USER) == (1, 1)
            assert [m["ts"] for m in shown] == [said["ts"]]  # its own reply: Bolt dropped it
            assert b1.bot_id == A_USER  # from Bolt's authorisation
    assert len(fake.messages(CHAN)) == 2


async def test_a_person_posting_through_another_app_reaches_the_listener(
    fake: FakeSlack, stores: StoreFactory, decisions: Decisions
) -> None:
    # Breaks if the guard reads every message carrying an app's bot_id as a
    # bot's: a person posting through another app with their own user token
    # was dropped (bot_ignored) before the app's listener saw it.
    (store,) = await stores(1)
    async with Bouncer(config("alpha"), platform="slack", store=store) as b1:

        async def answer(message: Json, say: AsyncSay, **_: Any) -> None:
            await say("hi")

        a1, g1, shown = bolt(fake, ALPHA, b1, answer)
        async with online(fake, (a1, ALPHA)):
            said = await fake.user_says(CHAN, ALICE, f"<@{A_USER}> hello", via_app=BETA)
            seen = await decisions.wait(said["ts"], A_USER)
            assert (seen["action"], seen["turn"]) == ("reply", "reset")
            await idle(g1)()
            assert [m["ts"] for m in shown] == [said["ts"]]


# -- two guarded apps --------------------------------------------------------------------


async def test_two_guarded_apps_stop_at_the_soft_limit_with_one_warning(
    fake: FakeSlack, stores: StoreFactory, decisions: Decisions
) -> None:
    """alpha and beta echo every message, each other's too: they stop at the
    soft limit, one of them posts the one warning, every message is counted
    once."""
    async with alpha_and_beta(fake, stores) as (store, g1, g2):
        said = await fake.user_says(CHAN, ALICE, "hello bots")
        sent = await quiet(fake, decisions, CHAN, (ALPHA, BETA), idle(g1, g2))
        assert (await status(store, chat(CHAN), A_USER))[0] == 5  # 4 replies + the warning
    [warning] = warnings_in(sent)
    assert WARNING in warning["text"] and "thread_ts" not in warning
    replies = [m for m in sent if m is not warning]
    assert len(replies) == 4  # the soft limit
    assert {m["text"] for m in replies} == {"hello bots"}
    assert {m["user"] for m in replies} == {A_USER, B_USER}
    # the warned-about message reached no listener: nobody echoed it after the warning
    [warned] = [d for d in decisions.seen if d["action"] == "warn"]
    assert USER_OF[ALPHA if warning["user"] == A_USER else BETA] == warned["bot"]
    assert fake.messages(CHAN)[-1] is warning
    assert said["ts"] == fake.messages(CHAN)[0]["ts"]
    # the warning went out plain: no link or name expansion
    [posted] = [c for c in fake.calls_of("chat.postMessage") if c.params["text"] == warning["text"]]
    assert (posted.params["parse"], posted.params["link_names"]) == ("none", False)


async def test_a_loop_in_a_thread_is_warned_about_in_the_thread_escaped(
    fake: FakeSlack, decisions: Decisions
) -> None:
    """A thread is its own chat: the echoes stay in it, so does the warning,
    whose `<!here>` notifies no one. (The thread's parent was posted before
    the apps came.)"""
    turns = {"soft_limit": 4, "hard_limit": 10, "warn_soft": "<!here> stop at {n}/{limit}"}
    shared = Bouncer(config("alpha", turns=turns), platform="slack")
    async with (
        shared as b1,
        Bouncer(config("beta", turns=turns), platform="slack", store=shared.store) as b2,
    ):
        a1, g1, _ = bolt(fake, ALPHA, b1)
        a2, g2, _ = bolt(fake, BETA, b2)
        async with online(fake, (a1, ALPHA), (a2, BETA)):
            parent = new_message(fake.world, fake.world.users[ALICE], "a thread")
            fake.messages(CHAN).append(parent)
            await fake.user_says(CHAN, ALICE, "hello in here", thread_ts=parent["ts"])
            sent = await quiet(fake, decisions, CHAN, (ALPHA, BETA), idle(g1, g2), since=1)
            thread = chat(CHAN, parent["ts"])
            assert (await status(b1.store, thread, A_USER))[0] == 5
            assert (await status(b1.store, chat(CHAN), A_USER))[0] == 0
    assert all(m.get("thread_ts") == parent["ts"] for m in sent)
    [warning] = [m for m in sent if "stop at" in m["text"]]
    assert warning["text"] == "&lt;!here> stop at 4/4"


async def test_warnings_false_posts_no_warning(
    fake: FakeSlack, stores: StoreFactory, decisions: Decisions
) -> None:
    async with alpha_and_beta(fake, stores, warnings=False) as (store, g1, g2):
        await fake.user_says(CHAN, ALICE, "hello bots")
        sent = await quiet(fake, decisions, CHAN, (ALPHA, BETA), idle(g1, g2), warnings=False)
        assert len(sent) == 4 and warnings_in(sent) == []
        assert (await status(store, chat(CHAN), A_USER))[0] == 4
    # one bot was warned, about one of the last two echoes; nothing answered it
    [warned] = [d for d in decisions.seen if d["action"] == "warn"]
    assert warned["id"] in [m["ts"] for m in fake.messages(CHAN)[-2:]]


# -- a guarded app and a fronted bot -----------------------------------------------------


async def test_a_guarded_app_and_a_fronted_bot_share_one_count(
    fake: FakeSlack, redis_url: str, key_prefix: str, decisions: Decisions
) -> None:
    """beta (a Bolt app, its Bouncer on Redis) and alpha (fronted by the
    daemon's Slack adapter, echo backend) answer each other in one channel,
    on one Redis: each message is counted once, by its sender when posted;
    the other, receiving it, finds it counted."""
    app = fake.world.apps[ALPHA]
    fronted = {
        "name": "alpha",
        "platform": "slack",
        "token": app.bot_token,
        "api_base": fake.api_base,
        "slack": {"app_token": app.app_token},
        "backend": {"type": "echo"},
        "bot_messages": "all",
        "turns": {"soft_limit": 4, "hard_limit": 10},
    }
    store = RedisStore.from_url(redis_url, prefix=key_prefix, context_size=8)
    try:
        async with (
            running(redis_url, key_prefix, fronted) as daemon,
            Bouncer(config("beta"), platform="slack", store=store) as b2,
        ):
            await fake.wait_until(lambda: fake.connected(ALPHA) > 0, what="the daemon connected")
            a2, g2, _ = bolt(fake, BETA, b2)
            async with online(fake, (a2, BETA)):

                async def settle() -> None:
                    await g2.idle()
                    await daemon.inflight.idle()

                await fake.user_says(CHAN, ALICE, f"<@{A_USER}> hello")
                sent = await quiet(fake, decisions, CHAN, (ALPHA, BETA), settle)
            assert {m["user"] for m in sent} == {A_USER, B_USER}
            assert len(warnings_in(sent)) == 1
            # no turn counted twice: the counter is the number of bot messages
            assert (await status(store, chat(CHAN), A_USER))[0] == len(sent) == 5
            places = []
            for m in sent:
                receiver = A_USER if m["user"] == B_USER else B_USER
                places.append((await decisions.wait(m["ts"], receiver))["soft"])
            assert sorted(places) == list(range(1, len(sent) + 1))
    finally:
        await store.close()


# -- tickets ------------------------------------------------------------------------------


@pytest.mark.parametrize("before", [False, True], ids=["ack-first", "process-before-response"])
async def test_a_listener_that_sends_nothing_or_raises_releases_its_slot(
    fake: FakeSlack, decisions: Decisions, before: bool
) -> None:
    """Rate cap 1: had the quiet listener or the failing one kept the slot,
    the next mention would not be answered. Bolt runs the listener after the
    ack by default, before it with process_before_response."""

    async def answer(message: Json, say: AsyncSay, **_: Any) -> None:
        if "quiet" in message["text"]:
            return
        if "boom" in message["text"]:
            raise RuntimeError("boom")
        await say("at your service")

    policy = {"respond_to": "mentions", "rate_cap": {"max_replies": 1}}
    async with Bouncer(config("alpha", **policy), platform="slack") as bouncer:
        app, g, shown = bolt(fake, ALPHA, bouncer, answer,
                             app_kw={"process_before_response": before})  # fmt: skip
        async with online(fake, (app, ALPHA)):
            for text in ("be quiet", "boom"):
                said = await fake.user_says(CHAN, ALICE, f"<@{A_USER}> {text}")
                await decisions.wait(said["ts"], A_USER)
                await g.idle()
                assert await status(bouncer.store, chat(CHAN), A_USER) == (0, 0)
                released = [d for d in decisions.seen if d["id"] == said["ts"]]
                assert [d["reason"] for d in released] == [None, "backend_empty"]
            said = await fake.user_says(CHAN, ALICE, f"<@{A_USER}> hello")
            reply = (await fake.wait_for_messages(CHAN, 4))[-1]  # after the three said
            assert (reply["user"], reply["text"]) == (A_USER, "at your service")
            await g.idle()
            assert await status(bouncer.store, chat(CHAN), A_USER) == (1, 1)
            capped = await fake.user_says(CHAN, ALICE, f"<@{A_USER}> and again")
            seen = await decisions.wait(capped["ts"], A_USER)
            assert (seen["action"], seen["reason"]) == ("drop", "rate_capped")
            await g.idle()
    assert [m["user"] for m in fake.messages(CHAN)].count(A_USER) == 1
    assert len(shown) == 3  # the capped one reached no listener
    assert not any(a.duplicate for a in fake.acks)


async def test_a_message_dropped_reaches_no_listener_and_is_acked(
    fake: FakeSlack, decisions: Decisions
) -> None:
    async with Bouncer(config("alpha", respond_to="mentions"), platform="slack") as bouncer:
        app, g, shown = bolt(fake, ALPHA, bouncer)
        async with online(fake, (app, ALPHA)):
            chatting = await fake.user_says(CHAN, ALICE, "just chatting")
            asked = await fake.user_says(CHAN, ALICE, f"<@{A_USER}> and you?")
            assert (await decisions.wait(chatting["ts"], A_USER))["reason"] == "not_addressed"
            await decisions.wait(asked["ts"], A_USER)
            await fake.wait_for_messages(CHAN, 3)
            await fake.wait_until(lambda: not fake.pending(ALPHA), what="all acked")
            await g.idle()
    assert [m["ts"] for m in shown] == [asked["ts"]]
    assert len(fake.event_envelopes(ALPHA)) == 3 and all(
        e.acked for e in fake.event_envelopes(ALPHA)
    )


async def test_a_redelivered_event_is_a_duplicate_and_answered_once(
    fake: FakeSlack, decisions: Decisions
) -> None:
    """Slack repeats an event it thinks was lost: the same message, the same
    ts. The store decides it `duplicate`; the listener does not run again."""
    async with Bouncer(config("alpha"), platform="slack") as bouncer:
        app, g, shown = bolt(fake, ALPHA, bouncer)
        async with online(fake, (app, ALPHA)):
            said = await fake.user_says(CHAN, ALICE, "once")
            await fake.wait_for_messages(CHAN, 2)
            await fake.wait_until(lambda: not fake.pending(ALPHA), what="all acked")
            again = await fake.deliver_event(fake.world.apps[ALPHA], fake.message_event(CHAN, said))
            await fake.wait_until(lambda: again.acked, what="the repeat acked")
            await g.idle()
            assert await status(bouncer.store, chat(CHAN), A_USER) == (1, 1)
    assert [d["reason"] for d in decisions.seen if d["id"] == said["ts"]] == [None, "duplicate"]
    assert [m["ts"] for m in shown] == [said["ts"]]
    assert len(fake.messages(CHAN)) == 2


async def test_message_and_app_mention_of_one_message_share_its_decision(
    fake: FakeSlack, decisions: Decisions
) -> None:
    """An app subscribed to both gets a mention twice: as `app_mention` and as
    `message`. The first decides, the other gets the same decision without
    deciding again; the answer is counted under its ticket. A repeat of
    either is a duplicate."""
    async with Bouncer(config("alpha", respond_to="mentions"), platform="slack") as bouncer:
        app, g, shown = bolt(fake, ALPHA, bouncer, lambda **_: asyncio.sleep(0))
        mentioned: list[Json] = []

        @app.event("app_mention")
        async def on_mention(event: Json, say: AsyncSay) -> None:
            mentioned.append(event)
            await say("you called?")

        async with online(fake, (app, ALPHA)):
            alpha, channel = fake.world.apps[ALPHA], fake.world.channels[CHAN]
            said = new_message(fake.world, fake.world.users[ALICE], f"<@{A_USER}> hi")
            mention = {**fake.message_event(CHAN, said), "type": "app_mention"}
            await fake.deliver_event(alpha, mention)  # Slack sends them in any order
            channel.messages.append(said)
            await fake.deliver_message(channel, said)
            await fake.wait_for_messages(CHAN, 2)
            await fake.wait_until(lambda: not fake.pending(ALPHA), what="all acked")
            await g.idle()
            assert await status(bouncer.store, chat(CHAN), A_USER) == (1, 1)
            again = await fake.deliver_event(alpha, mention)
            await fake.wait_until(lambda: again.acked, what="the repeat acked")
            await g.idle()
    assert [d["reason"] for d in decisions.seen if d["id"] == said["ts"]] == [None, "duplicate"]
    assert [e["ts"] for e in mentioned] == [said["ts"]]
    assert [m["ts"] for m in shown] == [said["ts"]]
    assert [m["text"] for m in fake.messages(CHAN)] == [said["text"], "you called?"]


def mention_app(
    fake: FakeSlack, bouncer: Bouncer, answered: list[str], replicas: bool = False
) -> tuple[AsyncApp, SlackGuard]:
    """The usual Bolt app for mentions: an app_mention listener that answers
    (each event's ts into `answered`), and Bolt's suggested no-op listener
    for the message events it is subscribed to as well. `replicas`: its
    guard shares a mention's decision through the store."""
    app, g, _ = bolt(fake, ALPHA, bouncer, lambda **_: asyncio.sleep(0), replicas=replicas)

    @app.event("app_mention")
    async def on_mention(event: Json, say: AsyncSay) -> None:
        answered.append(event["ts"])
        await say("you called?")

    return app, g


def mentioned(fake: FakeSlack, text: str) -> tuple[Json, dict[str, Json]]:
    """A person's message in the channel, and its two events by kind."""
    said = new_message(fake.world, fake.world.users[ALICE], text)
    fake.world.channels[CHAN].messages.append(said)
    message = fake.message_event(CHAN, said)
    return said, {"message": message, "app_mention": {**message, "type": "app_mention"}}


@pytest.mark.parametrize("first", ["message", "app_mention"])
async def test_replicas_answer_a_mention_once_whichever_gets_which_event(
    fake: FakeSlack, stores: StoreFactory, decisions: Decisions, first: str
) -> None:
    # Breaks if a mention's two events are decided together only within one
    # process: with two replicas of the app on one store, the one Slack gave
    # the `message` event ran no app_mention listener and released the ticket,
    # the one it gave the `app_mention` event was told `duplicate`, and the
    # person's mention was never answered.
    store, other = await stores(2)
    policy = {"respond_to": "mentions"}
    answered: list[str] = []
    async with (
        Bouncer(config("alpha", **policy), platform="slack", store=store) as b1,
        Bouncer(config("alpha", **policy), platform="slack", store=other) as b2,
    ):
        a1, g1 = mention_app(fake, b1, answered, replicas=True)
        a2, g2 = mention_app(fake, b2, answered, replicas=True)
        async with online(fake, (a1, ALPHA)), online(fake, (a2, ALPHA)):
            await fake.wait_until(lambda: fake.connected(ALPHA) == 2, what="both replicas")
            alpha = fake.world.apps[ALPHA]
            said, events = mentioned(fake, f"<@{A_USER}> hi")
            second = "app_mention" if first == "message" else "message"
            await fake.deliver_event(alpha, events[first], socket=0)  # the first replica
            await decisions.wait(said["ts"], A_USER)
            await fake.deliver_event(alpha, events[second], socket=1)  # the second
            [_, reply] = await fake.wait_for_messages(CHAN, 2)
            await fake.wait_until(lambda: not fake.pending(ALPHA), what="both acked")
            await idle(g1, g2)()
            assert reply["text"] == "you called?"
            assert await status(store, chat(CHAN), A_USER) == (1, 1)  # under its ticket
            # Slack repeats the second event, to the other replica: a duplicate
            again = await fake.deliver_event(alpha, events[second], socket=0)
            await fake.wait_until(lambda: again.acked, what="the repeat acked")
            await idle(g1, g2)()
            assert await status(store, chat(CHAN), A_USER) == (1, 1)
            logged = [(e["action"], e["reason"]) for e in await store.decisions(chat(CHAN))]
    assert answered == [said["ts"]]
    assert [m["text"] for m in fake.messages(CHAN)] == [said["text"], "you called?"]
    assert sorted(logged, key=str) == [("drop", "duplicate")] * 2 + [("reply", None)]


async def test_a_mention_answered_on_its_app_mention_event_counts_against_the_rate_cap(
    fake: FakeSlack, decisions: Decisions
) -> None:
    # Breaks if the `message` event of a mention, whose listener posts nothing,
    # releases the ticket before the `app_mention` event came: the answer was
    # counted as the bot's own turn, outside the rate cap (three mentions got
    # three answers with max_replies 1), and `why` said `drop backend_empty`
    # for every mention answered.
    policy = {"respond_to": "mentions", "rate_cap": {"max_replies": 1, "window_seconds": 3600}}
    answered: list[str] = []
    async with Bouncer(config("alpha", **policy), platform="slack") as bouncer:
        app, g = mention_app(fake, bouncer, answered)
        async with online(fake, (app, ALPHA)):
            alpha = fake.world.apps[ALPHA]
            asked = []
            for i in range(3):
                said, events = mentioned(fake, f"<@{A_USER}> hi {i}")
                asked.append(said["ts"])
                await fake.deliver_event(alpha, events["message"])  # Slack's usual order
                await decisions.wait(said["ts"], A_USER)
                await fake.wait_until(lambda: not fake.pending(ALPHA), what="acked")
                await g.idle()  # the message's listener, Bolt's no-op, ended
                await fake.deliver_event(alpha, events["app_mention"])
                await fake.wait_until(lambda: not fake.pending(ALPHA), what="acked")
                await g.idle()
            assert await status(bouncer.store, chat(CHAN), A_USER) == (0, 1)
            why = {e["id"]: (e["action"], e["reason"])
                   for e in await bouncer.store.decisions(chat(CHAN))}  # fmt: skip
    assert answered == asked[:1]
    texts = [m["text"] for m in fake.messages(CHAN)]
    assert texts == [f"<@{A_USER}> hi 0", "you called?", f"<@{A_USER}> hi 1", f"<@{A_USER}> hi 2"]
    assert [why[ts] for ts in asked] == [("reply", None)] + [("drop", "rate_capped")] * 2


async def test_a_mentions_ticket_waits_for_its_other_event_for_a_while_only(
    fake: FakeSlack, decisions: Decisions
) -> None:
    # Breaks if the ticket of a mention whose `message` event ended with
    # nothing posted is released at once, or never: Slack sends the
    # `app_mention` event beside it, and its listener answers under that
    # ticket; but an app_mention that does not come (the app is not
    # subscribed to it) must not keep the rate slot until the ticket lapses.
    policy = {"respond_to": "mentions", "rate_cap": {"max_replies": 1}}
    answered: list[str] = []
    async with Bouncer(config("alpha", **policy), platform="slack") as bouncer:
        app, g = mention_app(fake, bouncer, answered)
        g.other_event_seconds = 0.3
        async with online(fake, (app, ALPHA)):
            said, events = mentioned(fake, f"<@{A_USER}> hi")
            await fake.deliver_event(fake.world.apps[ALPHA], events["message"])
            await decisions.wait(said["ts"], A_USER)
            await fake.wait_until(lambda: not fake.pending(ALPHA), what="acked")
            await g.idle()
            assert await status(bouncer.store, chat(CHAN), A_USER) == (0, 1)  # held
            await g.idle(held=True)
            assert await status(bouncer.store, chat(CHAN), A_USER) == (0, 0)
            [entry] = await bouncer.store.decisions(chat(CHAN))
            assert (entry["id"], entry["reason"]) == (said["ts"], "backend_empty")
            # the app_mention that comes after all is taken as a repeat
            late = await fake.deliver_event(fake.world.apps[ALPHA], events["app_mention"])
            await fake.wait_until(lambda: late.acked, what="the late one acked")
            await g.idle()
    assert answered == []
    assert [d["reason"] for d in decisions.seen] == [None, "backend_empty", "duplicate"]


async def test_a_reply_in_a_thread_makes_the_thread_address_the_bot(
    fake: FakeSlack, decisions: Decisions
) -> None:
    """respond_to: mentions. The bot answers a mention in a thread of its
    own, with the `client` Bolt gives the listener; a person's follow-up
    there, without a mention, addresses it."""

    async def in_thread(message: Json, client: AsyncWebClient, **_: Any) -> None:
        thread = message.get("thread_ts") or message["ts"]
        await client.chat_postMessage(channel=message["channel"], text="on it", thread_ts=thread)

    async with Bouncer(config("alpha", respond_to="mentions"), platform="slack") as bouncer:
        app, g, _ = bolt(fake, ALPHA, bouncer, in_thread)
        async with online(fake, (app, ALPHA)):
            asked = await fake.user_says(CHAN, ALICE, f"<@{A_USER}> help")
            await fake.wait_for_messages(CHAN, 2)
            await g.idle()
            # the answer opened a thread: its chat, not the channel's, counted it
            thread = chat(CHAN, asked["ts"])
            assert await status(bouncer.store, thread, A_USER) == (1, 0)
            assert await status(bouncer.store, chat(CHAN), A_USER) == (0, 0)
            more = await fake.user_says(CHAN, ALICE, "and one more thing", thread_ts=asked["ts"])
            seen = await decisions.wait(more["ts"], A_USER)
            assert (seen["chat"], seen["action"]) == (thread, "reply")
            [*_, answer] = await fake.wait_for_messages(CHAN, 4)
            assert (answer["text"], answer["thread_ts"]) == ("on it", asked["ts"])
            await g.idle()
            assert await status(bouncer.store, thread, A_USER) == (1, 1)  # a person reset it


async def test_a_post_slack_refused_in_a_thread_does_not_make_it_address_the_bot(
    fake: FakeSlack, decisions: Decisions
) -> None:
    # Breaks if the guard marks a thread as one the bot posted in before Slack
    # took the post: after an answer Slack refused (not_in_channel), every
    # later message in the thread addressed the bot, which answers mentions
    # only, and it answered people talking to each other there.

    async def in_thread(message: Json, client: AsyncWebClient, **_: Any) -> None:
        thread = message.get("thread_ts") or message["ts"]
        with suppress(SlackApiError):
            await client.chat_postMessage(channel=message["channel"], text="on it",
                                          thread_ts=thread)  # fmt: skip

    async with Bouncer(config("alpha", respond_to="mentions"), platform="slack") as bouncer:
        app, g, _ = bolt(fake, ALPHA, bouncer, in_thread)
        async with online(fake, (app, ALPHA)):
            fake.fail_next("chat.postMessage", 200, '{"ok": false, "error": "not_in_channel"}',
                           "application/json")  # fmt: skip
            asked = await fake.user_says(CHAN, ALICE, f"<@{A_USER}> help")
            await decisions.wait(asked["ts"], A_USER)
            await fake.wait_until(lambda: fake.calls_of("chat.postMessage"), what="the try")
            await g.idle()
            aside = await fake.user_says(CHAN, ALICE, "bob, any idea?", thread_ts=asked["ts"])
            seen = await decisions.wait(aside["ts"], A_USER)
            await g.idle()
    assert (seen["action"], seen["reason"]) == ("drop", "not_addressed")
    assert [m["user"] for m in fake.messages(CHAN)] == [ALICE, ALICE]


# -- what is not decided, or not under a ticket -----------------------------------------------


async def test_a_post_outside_a_request_is_the_bots_own_turn(
    fake: FakeSlack, decisions: Decisions
) -> None:
    """A scheduled post through app.client, before any event: auth.test names
    the bot user, the post is its turn in the channel."""
    async with Bouncer(config("alpha"), platform="slack") as bouncer:
        app, _, shown = bolt(fake, ALPHA, bouncer)
        async with online(fake, (app, ALPHA)):
            posted = await app.client.chat_postMessage(channel=CHAN, text="the daily digest")
            assert bouncer.bot_id == A_USER
            assert await status(bouncer.store, chat(CHAN), A_USER) == (1, 0)
            # a /me message is a post too (the fake answers it as chat.postMessage);
            # an ephemeral one, which only one person sees, is no turn
            fake.methods["chat.meMessage"] = fake.methods["chat.postMessage"]
            await app.client.chat_meMessage(channel=CHAN, text="waves")
            await app.client.chat_postEphemeral(channel=CHAN, user=ALICE, text="psst")
            assert await status(bouncer.store, chat(CHAN), A_USER) == (2, 0)
            await fake.wait_until(lambda: not fake.pending(ALPHA), what="its echoes acked")
    assert shown == [] and decisions.seen == []
    assert posted["ts"] == fake.messages(CHAN)[0]["ts"]


async def test_a_slash_commands_answer_is_the_bots_own_turn(
    fake: FakeSlack, decisions: Decisions
) -> None:
    """A command is no message: not decided; what its listener posts with
    `say` is the bot's turn in the channel."""
    async with Bouncer(config("alpha"), platform="slack") as bouncer:
        app, g, _ = bolt(fake, ALPHA, bouncer)

        @app.command("/digest")
        async def digest(ack: Any, say: AsyncSay) -> None:
            await ack()
            await say("today: nothing new")

        async with online(fake, (app, ALPHA)):
            env = await fake.invoke_command(ALPHA, CHAN, ALICE, "/digest")
            await fake.wait_for_messages(CHAN, 1)
            await fake.wait_until(lambda: env.acked, what="the command acked")
            await g.idle()
            assert await status(bouncer.store, chat(CHAN), A_USER) == (1, 0)
    assert decisions.seen == []


@asynccontextmanager
async def served(app: AsyncApp) -> AsyncIterator[str]:
    """The app's Events API endpoint (Bolt's aiohttp server), its URL."""
    runner = web.AppRunner(app.web_app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/slack/events"
    finally:
        await runner.cleanup()


async def test_over_the_events_api_a_retry_is_a_duplicate(
    fake: FakeSlack, decisions: Decisions
) -> None:
    """The same guard behind Bolt's HTTP server: the request is verified by
    Bolt, then decided; Slack's retry of it (X-Slack-Retry-Num) is the same
    ts, a duplicate, answered 200 and not handled again."""
    secret = fake.world.apps[ALPHA].signing_secret
    async with Bouncer(config("alpha"), platform="slack") as bouncer:
        app = AsyncApp(client=fake.web_client(ALPHA), signing_secret=secret)
        g = guard(app, bouncer)
        seen: list[Json] = []

        @app.message()
        async def answer(message: Json, say: AsyncSay) -> None:
            seen.append(message)
            await say("got it")

        async with served(app) as url:
            said = await fake.user_says(CHAN, ALICE, "over http")
            event = fake.message_event(CHAN, said)
            first = await fake.post_event(url, event, signing_secret=secret, app_id=ALPHA)
            await fake.wait_for_messages(CHAN, 2)
            retry = await fake.post_event(url, event, signing_secret=secret, app_id=ALPHA,
                                          retry_num=1)  # fmt: skip
            forged = await fake.post_event(url, event, signing_secret="wrong", app_id=ALPHA)
            await g.idle()
            assert await status(bouncer.store, chat(CHAN), A_USER) == (1, 1)
    assert (first.status, retry.status, forged.status) == (200, 200, 401)
    assert [d["reason"] for d in decisions.seen if d["id"] == said["ts"]] == [None, "duplicate"]
    assert [m["ts"] for m in seen] == [said["ts"]]
    assert len(fake.messages(CHAN)) == 2


async def test_its_own_messages_are_recognised_when_bolt_shows_them(
    fake: FakeSlack, decisions: Decisions
) -> None:
    """ignoring_self_events_enabled=False: the app's listener sees its own
    reply, which was counted when posted, and is not counted again."""

    async def people_only(message: Json, say: AsyncSay, **_: Any) -> None:
        if "bot_id" not in message:
            await say(f"echo: {message['text']}")

    async with Bouncer(config("alpha"), platform="slack") as bouncer:
        app, g, shown = bolt(fake, ALPHA, bouncer, people_only,
                             app_kw={"ignoring_self_events_enabled": False})  # fmt: skip
        async with online(fake, (app, ALPHA)):
            await fake.user_says(CHAN, ALICE, "hello")
            [_, reply] = await fake.wait_for_messages(CHAN, 2)
            own = await decisions.wait(reply["ts"], A_USER)
            assert (own["reason"], own["soft"]) == ("own_message", 1)
            await fake.wait_until(lambda: len(shown) == 2, what="its own reply shown")
            await g.idle()
            assert await status(bouncer.store, chat(CHAN), A_USER) == (1, 1)
    assert shown[1]["ts"] == reply["ts"]


async def test_unreadable_messages_and_edits_pass_through_undecided(
    fake: FakeSlack, decisions: Decisions
) -> None:
    async with Bouncer(config("alpha"), platform="slack") as bouncer:
        app, g, shown = bolt(fake, ALPHA, bouncer, lambda **_: asyncio.sleep(0))
        edits: list[Json] = []

        @app.event({"type": "message", "subtype": "message_changed"})
        async def on_edit(event: Json) -> None:
            edits.append(event)

        with watching(logging.INFO) as logged:
            async with online(fake, (app, ALPHA)):
                alpha = fake.world.apps[ALPHA]
                nobody = {"type": "message", "text": "from nowhere", "ts": "1.000001",
                          "channel": CHAN, "channel_type": "channel"}  # fmt: skip
                await fake.deliver_event(alpha, nobody)
                edit = {"type": "message", "subtype": "message_changed", "hidden": True,
                        "channel": CHAN, "ts": "2.000001",
                        "message": {"type": "message", "user": ALICE, "text": "fixed",
                                    "ts": "1.500000"}}  # fmt: skip
                await fake.deliver_event(alpha, edit)
                await fake.wait_until(lambda: not fake.pending(ALPHA), what="both acked")
                await g.idle()
    assert decisions.seen == []
    assert [m["text"] for m in shown] == ["from nowhere"]
    assert [e["ts"] for e in edits] == ["2.000001"]
    [line] = [r.getMessage() for r in logged if "undecided" in r.getMessage()]
    assert "1.000001" in line and "no user or bot_id" in line


async def test_when_the_store_is_down_nothing_is_answered(fake: FakeSlack) -> None:
    down = RedisStore.from_url(f"redis://127.0.0.1:{free_port()}/0", call_timeout=1)
    try:
        with watching(logging.ERROR) as failed:
            async with Bouncer(config("alpha"), platform="slack", store=down) as bouncer:
                app, g, shown = bolt(fake, ALPHA, bouncer)
                async with online(fake, (app, ALPHA)):
                    said = await fake.user_says(CHAN, ALICE, f"<@{A_USER}> hello?")
                    await fake.wait_until(lambda: not fake.pending(ALPHA), 15, "acked")
                    await g.idle()
        assert shown == []
        assert [m["ts"] for m in fake.messages(CHAN)] == [said["ts"]]
        [line] = failed
        assert "not handled" in line.getMessage() and said["ts"] in line.getMessage()
    finally:
        await down.close()


# -- the example -------------------------------------------------------------------------


async def test_the_documented_example_answers_hello_under_the_guard(
    fake: FakeSlack, decisions: Decisions
) -> None:
    """docs/examples/slack_bot.py's `build`, as it is: Bolt's quickstart plus
    the guard. A message no listener takes gives its slot back; the answer
    to "hello" is counted; the next is over the rate cap."""
    policy = {"rate_cap": {"max_replies": 1}}
    async with Bouncer(config("alpha", **policy), platform="slack") as bouncer:
        app, g = example("slack_bot").build(bouncer, fake.web_client(ALPHA))
        async with online(fake, (app, ALPHA)):
            bye = await fake.user_says(CHAN, ALICE, "bye")
            seen = await decisions.wait(bye["ts"], A_USER)
            assert seen["action"] == "reply"  # respond_to: all, but no listener matches
            await g.idle()  # (Bolt answers an event no listener took 404: not acked)
            assert await status(bouncer.store, chat(CHAN), A_USER) == (0, 0)
            await fake.user_says(CHAN, ALICE, "hello")
            [*_, hey] = await fake.wait_for_messages(CHAN, 3)
            assert (hey["user"], hey["text"]) == (A_USER, f"Hey there <@{ALICE}>!")
            await g.idle()
            assert await status(bouncer.store, chat(CHAN), A_USER) == (1, 1)
            again = await fake.user_says(CHAN, ALICE, "hello again")
            seen = await decisions.wait(again["ts"], A_USER)
            assert (seen["action"], seen["reason"]) == ("drop", "rate_capped")
    assert len(fake.messages(CHAN)) == 4


ALPHA_DECIDES = """\
bots:
  - name: helper
    platform: slack
    mode: decide
    respond_to: all
    rate_cap: {max_replies: 2}
"""


async def test_the_example_runs_as_a_program(fake: FakeSlack, tmp_path: Path) -> None:
    """docs/examples/slack_bot.py's `main`: Socket Mode on the fake, "hello"
    answered, SIGINT ends it cleanly."""
    (tmp_path / "botbouncer.yml").write_text(ALPHA_DECIDES)
    alpha = fake.world.apps[ALPHA]
    env = program_env(SLACK_BOT_TOKEN=alpha.bot_token, SLACK_APP_TOKEN=alpha.app_token,
                      SLACK_API_BASE=fake.api_base)  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLES / "slack_bot.py"), env=env, cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await fake.wait_until(lambda: fake.connected(ALPHA) > 0, 30, "the example connected")
        await fake.user_says(CHAN, ALICE, "hello there")
        [_, hey] = await fake.wait_for_messages(CHAN, 2, timeout=15)
        assert (hey["user"], hey["text"]) == (A_USER, f"Hey there <@{ALICE}>!")
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(20):
            out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert "bot helper is on Slack as user U0ALPHA" in out.decode() + err.decode()


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({}, "set SLACK_BOT_TOKEN (xoxb-) and SLACK_APP_TOKEN (xapp-)"),
        ({"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1",
          "BOTBOUNCER_CONFIG": "/nonexistent/b.yml"}, "/nonexistent/b.yml"),
    ],
)  # fmt: skip
def test_the_example_refuses_a_missing_token_or_config_in_one_line(
    env: dict[str, str], says: str, tmp_path: Path
) -> None:
    run = run_once("slack_bot", tmp_path, ALPHA_DECIDES, **env)
    assert run.returncode == 2, run.stderr
    assert says in run.stderr and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


async def test_the_example_refuses_a_bad_bot_token_in_one_line(
    fake: FakeSlack, tmp_path: Path
) -> None:
    (tmp_path / "botbouncer.yml").write_text(ALPHA_DECIDES)
    env = program_env(SLACK_BOT_TOKEN="xoxb-wrong", SLACK_APP_TOKEN="xapp-wrong",
                      SLACK_API_BASE=fake.api_base)  # fmt: skip
    run = await asyncio.to_thread(
        subprocess.run, [sys.executable, str(EXAMPLES / "slack_bot.py")], env=env,
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip() == "slack_bot.py: Slack refused SLACK_BOT_TOKEN: invalid_auth"


# -- the hooks, the refusals -------------------------------------------------------------


def test_bolt_still_has_the_hooks_the_guard_uses() -> None:
    """The guard wraps AsyncApp.async_dispatch (what every adapter calls),
    the listener runner's run(request, response, listener_name, listener,
    starting_time) and its listener_completion_handler (called in the
    listener's task when it ends), and AsyncWebClient.api_call, which say()
    and every chat method go through; it asks the app's listeners
    (`_async_listeners`, `async_matches`) whether one would take a mention's
    other event. Named here so that a change of Bolt or slack_sdk fails this
    test by name."""
    dispatch = inspect.getsource(AsyncApp.async_dispatch)
    assert "self._async_listener_runner.run(" in dispatch
    assert "for listener in self._async_listeners:" in dispatch
    assert "await listener.async_matches(req=req, resp=resp)" in dispatch
    run = inspect.signature(AsyncioListenerRunner.run).parameters
    assert list(run) == ["self", "request", "response", "listener_name", "listener",
                         "starting_time"]  # fmt: skip
    source = inspect.getsource(AsyncioListenerRunner.run)
    assert source.count("self.listener_completion_handler.handle(") == 2
    assert "asyncio.ensure_future(run_ack_function_asynchronously" in source
    assert "self.client.chat_postMessage(" in inspect.getsource(AsyncSay.__call__)
    assert 'self.api_call("chat.postMessage"' in inspect.getsource(AsyncWebClient.chat_postMessage)


async def test_guard_refuses_a_second_guard_and_another_platform(fake: FakeSlack) -> None:
    async with Bouncer(config("alpha"), platform="slack") as bouncer:
        app = AsyncApp(client=fake.web_client(ALPHA))
        guard(app, bouncer)
        with pytest.raises(ValueError, match="guarded already"):
            guard(app, bouncer)
    elsewhere = {"bots": [{"name": "t", "platform": "telegram", "mode": "decide"}]}
    async with Bouncer(elsewhere) as bouncer:
        with pytest.raises(ConfigError, match="not slack"):
            guard(AsyncApp(client=fake.web_client(ALPHA)), bouncer)


# -- a mention's ticket when the store or a replica misbehaves ----------------------------


class Flaky:
    """A store whose chosen calls are slowed (`delay`) or fail with
    StoreError (`fail`: the method's name, and a test of its arguments)."""

    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self.delay: dict[str, float] = {}
        self.fail: dict[str, Callable[[tuple[Any, ...]], bool]] = {}
        self.calls: list[str] = []  # the names of the calls made, in order

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        async def call(*a: Any, **kw: Any) -> Any:
            self.calls.append(name)
            test = self.fail.get(name)
            if test is not None and test(a):
                raise StoreError(f"{name}: made to fail")
            if name in self.delay:
                await asyncio.sleep(self.delay[name])
            return await attr(*a, **kw)

        return call


def times(n: int, test: Callable[[tuple[Any, ...]], bool] = lambda _: True) -> Any:
    """A `Flaky.fail` test true for the first `n` calls it matches."""
    left = [n]

    def failing(args: tuple[Any, ...]) -> bool:
        if left[0] > 0 and test(args):
            left[0] -= 1
            return True
        return False

    return failing


@asynccontextmanager
async def flaky_app(
    fake: FakeSlack, stores: StoreFactory, answered: list[str]
) -> AsyncIterator[tuple[Store, Flaky, SlackGuard, FakeApp]]:
    """A mention-answering app on a store whose calls a test may fail or
    slow: (the store, its Flaky wrapper, the guard, the app in the fake)."""
    (store,) = await stores(1)
    flaky = Flaky(store)
    bouncer = Bouncer(config("alpha", respond_to="mentions"), platform="slack", store=flaky)  # type: ignore[arg-type]
    async with bouncer:
        app, g = mention_app(fake, bouncer, answered, replicas=True)
        g.other_event_seconds = 0.3
        async with online(fake, (app, ALPHA)):
            yield store, flaky, g, fake.world.apps[ALPHA]


@pytest.mark.parametrize("first", ["message", "app_mention"])
async def test_one_process_answers_a_mention_in_two_store_round_trips(
    fake: FakeSlack, stores: StoreFactory, decisions: Decisions, first: str
) -> None:
    # Breaks if an app of one process shares a mention's decision through the
    # store as replicas must (replicas=True): each answered mention cost
    # three or four store calls more than the admit and the sent.
    (store,) = await stores(1)
    counted = Flaky(store)
    answered: list[str] = []
    async with Bouncer(config("alpha", respond_to="mentions"), platform="slack",
                       store=counted) as bouncer:  # type: ignore[arg-type]  # fmt: skip
        app, g = mention_app(fake, bouncer, answered)
        async with online(fake, (app, ALPHA)):
            alpha = fake.world.apps[ALPHA]
            said, events = mentioned(fake, f"<@{A_USER}> hi")
            for kind in (first, _other_kind(first)):
                await fake.deliver_event(alpha, events[kind])
                await fake.wait_until(lambda: not fake.pending(ALPHA), what="acked")
                await g.idle()
            await g.idle(held=True)
    assert answered == [said["ts"]]
    assert counted.calls == ["admit", "record_sent"]


def _other_kind(kind: str) -> str:
    return "app_mention" if kind == "message" else "message"


async def test_a_store_blip_when_the_other_event_comes_still_settles_the_ticket(
    fake: FakeSlack, stores: StoreFactory, decisions: Decisions
) -> None:
    # Breaks if the other event of a mention stops the ticket's wait before
    # its claim in the store: the claim failed (a short outage), the event
    # was acknowledged unhandled, and the ticket nobody waited for any more
    # held its rate slot until it lapsed.
    answered: list[str] = []
    async with flaky_app(fake, stores, answered) as (store, flaky, g, alpha):
        said, events = mentioned(fake, f"<@{A_USER}> hi")
        await fake.deliver_event(alpha, events["message"])
        await decisions.wait(said["ts"], A_USER)
        await fake.wait_until(lambda: not fake.pending(ALPHA), what="acked")
        await g.idle()
        assert await status(store, chat(CHAN), A_USER) == (0, 1)  # waiting
        flaky.fail["claim"] = times(2, lambda a: str(a[0]).endswith("/app_mention"))
        await fake.deliver_event(alpha, events["app_mention"])
        await fake.wait_until(lambda: not fake.pending(ALPHA), what="acked")
        await g.idle(held=True)
        assert await status(store, chat(CHAN), A_USER) == (0, 0)
    assert answered == []


async def test_a_failed_filing_gives_the_mentions_slot_back(
    fake: FakeSlack, stores: StoreFactory, decisions: Decisions, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Breaks if `Bouncer.decide(shared=...)` keeps the slot its admit reserved
    # when filing the decision fails: no ticket reached anyone, so nothing
    # released it, and the slot stayed taken until it lapsed.
    monkeypatch.setattr(botbouncer.slack, "FILED_WITHIN", 0.2)
    answered: list[str] = []
    async with flaky_app(fake, stores, answered) as (store, flaky, g, alpha):
        flaky.fail["issue_ticket"] = times(1)
        said, events = mentioned(fake, f"<@{A_USER}> hi")
        await fake.deliver_event(alpha, events["message"])
        await decisions.wait(said["ts"], A_USER)
        await fake.wait_until(lambda: not fake.pending(ALPHA), what="acked")
        await fake.deliver_event(alpha, events["app_mention"])
        await fake.wait_until(lambda: not fake.pending(ALPHA), what="acked")
        await g.idle(held=True)
        assert await status(store, chat(CHAN), A_USER) == (0, 0)
    assert answered == []


async def test_a_mention_in_a_dm_does_not_wait_for_an_app_mention(
    fake: FakeSlack, stores: StoreFactory, decisions: Decisions
) -> None:
    # Breaks if a message in a DM that mentions the app is taken as one of a
    # mention's two events: Slack sends no app_mention for a DM, so its
    # ticket held the rate slot for other_event_seconds for nothing.
    dm = "D0ALICE"
    fake.world.add_dm(dm, ALICE, A_USER)
    (store,) = await stores(1)
    answered: list[str] = []
    policy = {"rate_cap": {"max_replies": 1, "scope": "all"}}  # DMs too
    async with Bouncer(config("alpha", **policy), platform="slack", store=store) as bouncer:
        app, g = mention_app(fake, bouncer, answered, replicas=True)
        async with online(fake, (app, ALPHA)):
            said = new_message(fake.world, fake.world.users[ALICE], f"<@{A_USER}> hi")
            fake.world.channels[dm].messages.append(said)
            await fake.deliver_event(fake.world.apps[ALPHA], fake.message_event(dm, said))
            await decisions.wait(said["ts"], A_USER)
            await fake.wait_until(lambda: not fake.pending(ALPHA), what="acked")
            await g.idle()
            assert await status(store, chat(dm), A_USER) == (0, 0)


async def test_closing_the_guard_settles_the_tickets_that_wait(
    fake: FakeSlack, stores: StoreFactory, decisions: Decisions
) -> None:
    # Breaks if stopping the app leaves a mention's ticket waiting for its
    # other event: the process ends, and the rate slot stays held in the
    # store (shared by the app's other replicas) until the ticket lapses.
    (store,) = await stores(1)
    answered: list[str] = []
    async with Bouncer(config("alpha", respond_to="mentions"), platform="slack",
                       store=store) as bouncer:  # fmt: skip
        app, g = mention_app(fake, bouncer, answered, replicas=True)
        async with online(fake, (app, ALPHA)):
            said, events = mentioned(fake, f"<@{A_USER}> hi")
            await fake.deliver_event(fake.world.apps[ALPHA], events["message"])
            await decisions.wait(said["ts"], A_USER)
            await fake.wait_until(lambda: not fake.pending(ALPHA), what="acked")
            await g.idle()
            assert await status(store, chat(CHAN), A_USER) == (0, 1)  # waits 10 s
        async with asyncio.timeout(2):
            await g.close()
        assert await status(store, chat(CHAN), A_USER) == (0, 0)
    assert [d["reason"] for d in decisions.seen] == [None, "backend_empty"]


async def test_a_late_retry_of_a_mentions_event_is_a_repeat_at_once(
    fake: FakeSlack, stores: StoreFactory, decisions: Decisions
) -> None:
    # Breaks if the claims of a mention's events lapse with its ticket
    # (ticket_seconds): Slack's retry a minute or five later found nothing
    # filed and waited 2 s and more for a decision that would never come,
    # then logged that it was decided for its other event.
    (store,) = await stores(1)
    answered: list[str] = []
    policy = {"respond_to": "mentions", "ticket_seconds": 0.3}
    async with Bouncer(config("alpha", **policy), platform="slack", store=store) as bouncer:
        app, g = mention_app(fake, bouncer, answered, replicas=True)
        async with online(fake, (app, ALPHA)):
            alpha = fake.world.apps[ALPHA]
            said, events = mentioned(fake, f"<@{A_USER}> hi")
            await fake.deliver_event(alpha, events["app_mention"])
            await fake.wait_for_messages(CHAN, 2)
            await fake.deliver_event(alpha, events["message"])
            await fake.wait_until(lambda: not fake.pending(ALPHA), what="acked")
            await g.idle()
            await asyncio.sleep(0.5)  # its ticket and filed decision lapsed
            with watching(logging.INFO) as logged:
                async with asyncio.timeout(1):
                    again = await fake.deliver_event(alpha, events["app_mention"])
                    await fake.wait_until(lambda: again.acked, what="the retry acked")
                await g.idle()
    assert answered == [said["ts"]]
    assert not [r for r in logged if "filed" in r.getMessage()]


@asynccontextmanager
async def slow_replicas(
    fake: FakeSlack, stores: StoreFactory, call: str, seconds: float, answered: list[str]
) -> AsyncIterator[tuple[Store, FakeApp, Callable[[], Awaitable[None]]]]:
    """Two replicas of a mention-answering app on one store, the first's
    `call` to the store `seconds` slow: (the store, the app in the fake,
    until both replicas acked and settled everything)."""
    store, other = await stores(2)
    slow = Flaky(store)
    slow.delay[call] = seconds
    policy = {"respond_to": "mentions"}
    async with (
        Bouncer(config("alpha", **policy), platform="slack", store=slow) as b1,  # type: ignore[arg-type]
        Bouncer(config("alpha", **policy), platform="slack", store=other) as b2,
    ):
        a1, g1 = mention_app(fake, b1, answered, replicas=True)
        a2, g2 = mention_app(fake, b2, answered, replicas=True)
        g1.other_event_seconds = g2.other_event_seconds = 0.3

        async def settled() -> None:
            await fake.wait_until(lambda: not fake.pending(ALPHA), what="acked", timeout=10)
            await idle(g1, g2)()
            await g1.idle(held=True)
            await g2.idle(held=True)

        async with online(fake, (a1, ALPHA)), online(fake, (a2, ALPHA)):
            await fake.wait_until(lambda: fake.connected(ALPHA) == 2, what="both replicas")
            yield store, fake.world.apps[ALPHA], settled


async def test_a_retry_to_another_replica_while_the_first_decides_is_answered_once(
    fake: FakeSlack, stores: StoreFactory, decisions: Decisions
) -> None:
    # Breaks if a `duplicate` whose decision was filed for the same kind of
    # event is taken for the mention's other event: Slack retried an
    # app_mention the first replica was slow to decide, the second replica
    # decided and answered it, and the first, told `duplicate`, ran its
    # app_mention listener under that decision: answered twice.
    answered: list[str] = []
    async with slow_replicas(fake, stores, "admit", 0.5, answered) as (store, alpha, settled):
        said, events = mentioned(fake, f"<@{A_USER}> hi")
        first = await fake.deliver_event(alpha, events["app_mention"], socket=0)
        await asyncio.sleep(0.15)  # the first replica claimed it, and admits
        await fake.deliver_event(alpha, events["app_mention"], socket=1)  # Slack's retry
        await fake.wait_for_messages(CHAN, 2)
        await fake.wait_until(lambda: first.acked, what="the first acked", timeout=10)
        await settled()
        assert await status(store, chat(CHAN), A_USER) == (1, 1)
    assert answered == [said["ts"]]
    assert [m["text"] for m in fake.messages(CHAN)] == [said["text"], "you called?"]


async def test_a_replica_that_gives_up_on_a_slow_decider_releases_the_ticket(
    fake: FakeSlack, stores: StoreFactory, decisions: Decisions, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Breaks if the replica that got a mention's other event, finding no
    # decision filed in time, gives up with nothing more: it had claimed its
    # event, so the deciding replica took it as handled there and left the
    # release to it, and the rate slot stayed held until the ticket lapsed.
    monkeypatch.setattr(botbouncer.slack, "FILED_WITHIN", 0.2)  # 2 s in production
    answered: list[str] = []
    async with slow_replicas(fake, stores, "issue_ticket", 0.6, answered) as (
        store, alpha, settled,
    ):  # fmt: skip
        said, events = mentioned(fake, f"<@{A_USER}> hi")
        await fake.deliver_event(alpha, events["message"], socket=0)
        await decisions.wait(said["ts"], A_USER)  # admitted; filing it is slow
        await fake.deliver_event(alpha, events["app_mention"], socket=1)
        await settled()
        assert await status(store, chat(CHAN), A_USER) == (0, 0)
    assert answered == []  # the window the docs name: never answered, but nothing held
