"""The Slack adapter end to end: slack_sdk's Socket Mode and Web API clients,
inside the real daemon, against the fake Slack of tests/fakes/slack/, on Redis.

The daemon reaches the fake only through `api_base`. Decisions are awaited
through the decision log lines the pipeline writes, the platform side through
the fake's recorded messages: nothing sleeps.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from gateway.daemon import Daemon, StartupError
from tests import sample_backends
from tests.daemons import admitted_ids, build, forget
from tests.decisions import Decisions
from tests.fakes.slack import FakeSlack, Json
from tests.fakes.slack.payloads import event_callback
from tests.redis_server import free_port

pytestmark = pytest.mark.timeout(60)

ALICE, MOD, OWNER = "U0ALICE", "U0MOD", "U0OWNER"
BOB, CHIEF, NEWBIE = "U0BOB", "U0CHIEF", "U0NEWBIE"  # a member, a workspace owner, a joiner
A_USER, B_USER = "U0ALPHA", "U0BETA"
ALPHA, BETA = "A0ALPHA", "A0BETA"  # the apps
CHANNEL, BOBS, DM = "C0GENERAL", "C0BOBS", "D0ALICE"
WORKFLOW = "B0WORKFLOW"  # a workflow's bot id: no user, no app of ours
SECRET = "fake-signing-secret"  # the fake apps' signing secret


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as f:
        w = f.world
        w.add_user(ALICE, "alice")
        w.add_user(MOD, "mo", is_admin=True)
        w.add_user(OWNER, "olga")
        w.add_user(BOB, "bob")
        w.add_user(CHIEF, "chief", is_owner=True)
        w.add_user(NEWBIE, "newbie")
        w.add_app(ALPHA, "alpha", bot_id="B0ALPHA", bot_user_id=A_USER)
        w.add_app(BETA, "beta", bot_id="B0BETA", bot_user_id=B_USER)
        w.add_channel(CHANNEL, "general", OWNER, ALICE, MOD, A_USER, B_USER, BOB, CHIEF)
        w.add_channel(BOBS, "bobs-corner", BOB, ALICE, A_USER, B_USER)  # bob made it
        w.add_dm(DM, ALICE, A_USER)
        yield f
        assert f.unknown_methods == []


def bot(name: str, fake: FakeSlack, **policy: Any) -> dict[str, Any]:
    app = next(a for a in fake.world.apps.values() if a.name == name)
    return {
        "name": name,
        "platform": "slack",
        "token": app.bot_token,
        "api_base": fake.api_base,
        "slack": {"app_token": app.app_token},
        "backend": {"type": "echo"},
        "turns": {"soft_limit": 4, "hard_limit": 10},
        **policy,
    }


EVENTS = {"mode": "events", "signing_secret": SECRET}


def hook_url(port: int, name: str = "alpha") -> str:
    return f"http://127.0.0.1:{port}/v1/webhooks/{name}"


async def soft_of(d: Daemon, chat_key: str, name: str = "alpha") -> int:
    await d.inflight.idle()
    return (await d.server.admins[name].status(chat_key)).soft


def chat(thread: str | None = None, channel: str = CHANNEL) -> str:
    return f"slack:{channel}" if thread is None else f"slack:{channel}:{thread}"


async def decided_times(
    decisions: Decisions,
    message_id: str,
    n: int,
    bot_id: str = A_USER,
    timeout: float = 10,  # noqa: ASYNC109
) -> list[dict[str, Any]]:
    """The decisions on `message_id` by `bot_id` once there are at least `n`."""

    def found() -> list[dict[str, Any]] | None:
        got = [x for x in decisions.seen if x["id"] == message_id and x["bot"] == bot_id]
        return got if len(got) >= n else None

    async with asyncio.timeout(timeout), decisions.changed:
        return await decisions.changed.wait_for(found)


def times_decided(decisions: Decisions, message_id: str, bot_id: str = A_USER) -> int:
    return sum(1 for x in decisions.seen if x["id"] == message_id and x["bot"] == bot_id)


async def beta_posts(fake: FakeSlack, text: str, thread_ts: str | None = None) -> Json:
    """beta, which no daemon fronts here, posts with its bot token."""
    sent = await fake.web_client(BETA).chat_postMessage(
        channel=CHANNEL, text=text, thread_ts=thread_ts
    )
    message: Json = sent["message"]
    return message


def by(user: str, messages: list[Json]) -> list[Json]:
    return [m for m in messages if m.get("user") == user]


async def settled(fake: FakeSlack, app: str = ALPHA) -> None:
    """Every envelope the app was sent is acked."""
    await fake.wait_until(lambda: not fake.pending(app), what=f"{app}'s envelopes acked")


async def test_two_bots_in_a_thread_stop_at_the_soft_limit_with_one_warning(
    fake: FakeSlack, run: Callable[..., Any], decisions: Decisions
) -> None:
    """alpha and beta, each behind its own daemon on one Redis, answer each
    other in a thread both posted in: 4 replies (the soft limit), one
    warning, silence. A person in the thread resumes them."""
    policy = {
        "bot_messages": "mentions",
        "backend": {"type": "python", "callable": "tests.sample_backends:slack_greeter"},
    }
    async with run(bot("alpha", fake, **policy)) as da, run(bot("beta", fake, **policy)):
        parent = await fake.user_says(CHANNEL, ALICE, "a thread")
        thread = f"slack:{CHANNEL}:{parent['ts']}"
        await fake.user_says(
            CHANNEL, ALICE, f"<@{A_USER}> please greet {B_USER}", thread_ts=parent["ts"]
        )
        msgs = await fake.wait_for_messages(CHANNEL, 2 + 5)
        bots = msgs[2:]
        assert [m["user"] for m in bots[:4]] == [A_USER, B_USER, A_USER, B_USER]
        assert all(m.get("thread_ts") == parent["ts"] for m in bots)
        assert bots[0]["text"] == f"hello <@{B_USER}>!"
        assert "Bot turn limit reached (4/4)" in bots[4]["text"]
        assert await soft_of(da, thread) == 5
        await da.inflight.idle()
        assert len(fake.messages(CHANNEL)) == 7
        again = await fake.user_says(
            CHANNEL, ALICE, f"<@{A_USER}> carry on, greet {B_USER}", thread_ts=parent["ts"]
        )
        resumed = await decisions.wait(again["ts"], A_USER)
        assert (resumed["turn"], resumed["action"]) == ("reset", "reply")
        await fake.wait_for_messages(CHANNEL, 10)


# -- addressing, replying, own posts ----------------------------------------------------


async def test_replies_go_where_the_message_was_and_own_posts_count_once(
    fake: FakeSlack, run: Callable[..., Any], decisions: Decisions
) -> None:
    """A mention at top level is answered at top level; the reply comes back
    as a message event and is decided own_message (at DEBUG), counted once.
    A thread under the bot's post (parent_user_id), or one the bot posted in,
    addresses it without a mention, and is answered in the thread."""
    async with run(bot("alpha", fake)) as d:
        admitted = admitted_ids(d)
        said = await fake.user_says(CHANNEL, ALICE, f"<@{A_USER}> hello there")
        seen = await decisions.wait(said["ts"], A_USER)
        assert (seen["chat"], seen["action"], seen["turn"]) == (chat(), "reply", "reset")
        [reply] = by(A_USER, await fake.wait_for_messages(CHANNEL, 2))
        assert reply["text"] == f"<@{A_USER}> hello there"
        assert "thread_ts" not in reply  # top level, as the question was
        echo = await decisions.wait(reply["ts"], A_USER)
        assert (echo["action"], echo["reason"], echo["soft"]) == ("drop", "own_message", 1)
        assert decisions.logged_at(reply["ts"], A_USER) == logging.DEBUG
        assert await soft_of(d, chat()) == 1  # the reply once, though it was seen twice
        await settled(fake)
        assert times_decided(decisions, reply["ts"]) == 1
        assert admitted == [said["ts"]]  # the echo cost no store call

        # no mention at top level: not addressed
        quiet = await fake.user_says(CHANNEL, ALICE, "just chatting")
        seen = await decisions.wait(quiet["ts"], A_USER)
        assert (seen["action"], seen["reason"]) == ("drop", "not_addressed")

        # a reply in the thread under alpha's post: addressed, answered in the thread
        under = await fake.user_says(CHANNEL, ALICE, "tell me more", thread_ts=reply["ts"])
        assert under["parent_user_id"] == A_USER
        seen = await decisions.wait(under["ts"], A_USER)
        assert (seen["chat"], seen["action"]) == (chat(reply["ts"]), "reply")
        answer = by(A_USER, await fake.wait_for_messages(CHANNEL, 5))[-1]
        assert (answer["text"], answer["thread_ts"]) == ("tell me more", reply["ts"])

        # a thread alice started: addressed by a mention, then by alpha having posted there
        parent = await fake.user_says(CHANNEL, ALICE, "a new topic")
        await decisions.wait(parent["ts"], A_USER)
        ask = await fake.user_says(CHANNEL, ALICE, f"<@{A_USER}> hi", thread_ts=parent["ts"])
        await decisions.wait(ask["ts"], A_USER)
        await fake.wait_until(lambda: len(by(A_USER, fake.messages(CHANNEL))) == 3)
        follow = await fake.user_says(CHANNEL, BOB, "and me?", thread_ts=parent["ts"])
        seen = await decisions.wait(follow["ts"], A_USER)
        assert (seen["chat"], seen["action"]) == (chat(parent["ts"]), "reply")
        # ... while a thread alpha never posted in is not
        other = await fake.user_says(CHANNEL, BOB, "elsewhere", thread_ts=quiet["ts"])
        seen = await decisions.wait(other["ts"], A_USER)
        assert (seen["action"], seen["reason"]) == ("drop", "not_addressed")
        mine = by(A_USER, await fake.wait_for_messages(CHANNEL, 11))
        assert [m.get("thread_ts") for m in mine] == [None, reply["ts"], *[parent["ts"]] * 2]
        assert len(mine) == 4


async def test_a_dm_is_always_addressed(
    fake: FakeSlack, run: Callable[..., Any], decisions: Decisions
) -> None:
    async with run(bot("alpha", fake)):
        said = await fake.user_says(DM, ALICE, "hi, no mention")
        seen = await decisions.wait(said["ts"], A_USER)
        assert (seen["chat"], seen["action"]) == (f"slack:{DM}", "reply")
        [_, reply] = await fake.wait_for_messages(DM, 2)
        assert (reply["user"], reply["text"]) == (A_USER, "hi, no mention")
        assert "thread_ts" not in reply


async def test_a_person_posting_through_an_app_is_a_person(
    fake: FakeSlack, run: Callable[..., Any], decisions: Decisions
) -> None:
    # Breaks if every message carrying an app's bot_id is a bot's: Slack
    # stamps a person's post made through an app with their own user token
    # (a voice front desk, an IRC bridge) so, and that person was never
    # answered (bot_ignored). The app's own bot posts are still a bot's, and
    # users.info is asked once a user.
    async with run(bot("alpha", fake)):
        for i in range(2):
            m = await fake.user_says(CHANNEL, ALICE, f"<@{A_USER}> via the app {i}", via_app=BETA)
            assert m["bot_id"] and m["user"] == ALICE
            seen = await decisions.wait(m["ts"], A_USER)
            assert (seen["author"], seen["action"], seen["turn"]) == (ALICE, "reply", "reset")
        beta = await beta_posts(fake, f"<@{A_USER}> beta itself")
        seen = await decisions.wait(beta["ts"], A_USER)
        assert (seen["action"], seen["reason"]) == ("drop", "bot_ignored")
    asked = [c.params.get("user") for c in fake.calls_of("users.info")]
    assert sorted(asked) == [ALICE, B_USER]


async def test_a_user_slack_will_not_describe_is_asked_about_once(
    fake: FakeSlack, run: Callable[..., Any], decisions: Decisions
) -> None:
    # Breaks if an answer that would be the same again (user_not_found: a
    # user of another workspace) is not remembered: every message of theirs
    # cost a users.info call and a WARNING line.
    refused = '{"ok": false, "error": "user_not_found"}'
    fake.fail_next("users.info", 200, body=refused, content_type="application/json")
    async with run(bot("alpha", fake)):
        for i in range(2):
            m = await fake.user_says(CHANNEL, ALICE, f"<@{A_USER}> relayed {i}", via_app=BETA)
            seen = await decisions.wait(m["ts"], A_USER)
            assert (seen["action"], seen["reason"]) == ("drop", "bot_ignored")  # as stamped
    assert [c.params.get("user") for c in fake.calls_of("users.info")] == [ALICE]


async def test_a_workflow_message_is_a_bot_turn(
    fake: FakeSlack, run: Callable[..., Any], decisions: Decisions
) -> None:
    """A workflow or legacy integration posts with a bot_id and no user
    (subtype bot_message): a bot turn, under its bot id, ignored under
    bot_messages: off even when it mentions alpha; a person resets."""
    async with run(bot("alpha", fake)) as d:
        for i in range(2):
            m = await fake.integration_says(CHANNEL, WORKFLOW, f"<@{A_USER}> standup {i}")
            assert "user" not in m
            seen = await decisions.wait(m["ts"], A_USER)
            assert (seen["author"], seen["turn"], seen["soft"]) == (WORKFLOW, "ok", i + 1)
            assert (seen["action"], seen["reason"]) == ("drop", "bot_ignored")
        threaded = await fake.integration_says(CHANNEL, WORKFLOW, "in a thread", thread_ts=m["ts"])
        seen = await decisions.wait(threaded["ts"], A_USER)
        assert (seen["chat"], seen["soft"]) == (chat(m["ts"]), 1)
        person = await fake.user_says(CHANNEL, ALICE, "thanks, workflow")
        seen = await decisions.wait(person["ts"], A_USER)
        assert (seen["turn"], seen["soft"]) == ("reset", 0)
        assert await soft_of(d, chat()) == 0
        assert by(A_USER, fake.messages(CHANNEL)) == []


# -- chats, threads, system messages, edits -----------------------------------------------


async def test_a_thread_is_independent_of_its_channel(
    fake: FakeSlack, run: Callable[..., Any], decisions: Decisions
) -> None:
    async with run(bot("alpha", fake)) as d:
        top = [await beta_posts(fake, f"beta at top level {i}") for i in range(3)]
        for m in top:
            await decisions.wait(m["ts"], A_USER)
        parent = top[0]["ts"]
        for i in range(2):
            m = await beta_posts(fake, f"beta in the thread {i}", thread_ts=parent)
            seen = await decisions.wait(m["ts"], A_USER)
            assert (seen["chat"], seen["soft"]) == (chat(parent), i + 1)
            assert seen["reason"] == "bot_ignored"
        assert (await soft_of(d, chat()), await soft_of(d, chat(parent))) == (3, 2)
        # a person in the thread resets the thread only
        person = await fake.user_says(CHANNEL, ALICE, "stop it in here", thread_ts=parent)
        seen = await decisions.wait(person["ts"], A_USER)
        assert (seen["chat"], seen["turn"]) == (chat(parent), "reset")
        assert (await soft_of(d, chat()), await soft_of(d, chat(parent))) == (3, 0)
        again = await beta_posts(fake, "beta in the thread again", thread_ts=parent)
        await decisions.wait(again["ts"], A_USER)
        # ... and a person at top level the channel only
        person = await fake.user_says(CHANNEL, ALICE, "and out here")
        seen = await decisions.wait(person["ts"], A_USER)
        assert (seen["chat"], seen["turn"]) == (chat(), "reset")
        assert (await soft_of(d, chat()), await soft_of(d, chat(parent))) == (0, 1)


async def test_joins_topic_changes_and_pins_never_count_or_reset(
    fake: FakeSlack, run: Callable[..., Any], decisions: Decisions
) -> None:
    async with run(bot("alpha", fake)) as d:
        for i in range(3):
            m = await beta_posts(fake, f"bot chatter {i}")
            await decisions.wait(m["ts"], A_USER)
        system = [
            (NEWBIE, f"<@{NEWBIE}> has joined the channel", "channel_join"),
            (MOD, "set the channel topic: no bot loops", "channel_topic"),
            (MOD, "set the channel purpose: talk", "channel_purpose"),
            (MOD, "pinned a message to this channel.", "pinned_item"),
        ]
        for user, text, subtype in system:
            said = await fake.user_says(CHANNEL, user, text, subtype=subtype)
            seen = await decisions.wait(said["ts"], A_USER)
            assert (seen["reason"], seen["turn"], seen["soft"]) == ("system_message", "none", 3)
        # alpha's own join (invited to a channel): its own message, and no turn
        joined = await fake.user_says(
            CHANNEL, A_USER, f"<@{A_USER}> has joined the channel", subtype="channel_join"
        )
        seen = await decisions.wait(joined["ts"], A_USER)
        assert (seen["reason"], seen["turn"], seen["soft"]) == ("own_message", "none", 3)
        assert await soft_of(d, chat()) == 3
        assert NEWBIE in fake.world.channels[CHANNEL].members
        # the newcomer's first words do reset
        said = await fake.user_says(CHANNEL, NEWBIE, "hello all")
        assert (await decisions.wait(said["ts"], A_USER))["turn"] == "reset"
        assert await soft_of(d, chat()) == 0


async def test_edits_and_deletions_are_not_turns(
    fake: FakeSlack,
    run: Callable[..., Any],
    decisions: Decisions,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="botbouncer.slack")
    async with run(bot("alpha", fake)) as d:
        said = await fake.user_says(CHANNEL, ALICE, "hello")
        await decisions.wait(said["ts"], A_USER)
        chatter = [await beta_posts(fake, f"bot chatter {i}") for i in range(2)]
        for m in chatter:
            await decisions.wait(m["ts"], A_USER)
        edit = await fake.edit(CHANNEL, said["ts"], "hello, edited")
        gone = await fake.delete(CHANNEL, chatter[0]["ts"])
        bot_edit = await fake.edit(CHANNEL, chatter[1]["ts"], "bot chatter, edited")
        last = await beta_posts(fake, "bot chatter 3")
        seen = await decisions.wait(last["ts"], A_USER)
        assert (seen["turn"], seen["soft"]) == ("ok", 3)  # nothing reset, nothing counted
        await settled(fake)  # the edits and the deletion were acknowledged
        assert await soft_of(d, chat()) == 3
        for ts in (edit["ts"], gone["ts"], bot_edit["ts"]):
            assert times_decided(decisions, ts) == 0
        for ts in (said["ts"], chatter[0]["ts"], chatter[1]["ts"]):
            assert times_decided(decisions, ts) == 1
    # not "could not read message": an edit is no message at all, not an odd one
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


# -- what is sent ------------------------------------------------------------------------


async def test_broadcast_mentions_are_escaped_and_nothing_is_expanded(
    fake: FakeSlack, run: Callable[..., Any]
) -> None:
    async with run(bot("alpha", fake)):
        loud = (f"<@{A_USER}> <!channel> <!here> <!everyone> <!subteam^S0DEVS|@devs> "
                f"<!here|here> ask <@{ALICE}>")  # fmt: skip
        await fake.user_says(CHANNEL, ALICE, loud)
        [reply] = by(A_USER, await fake.wait_for_messages(CHANNEL, 2))
        assert reply["text"] == (
            f"<@{A_USER}> &lt;!channel> &lt;!here> &lt;!everyone> "
            f"&lt;!subteam^S0DEVS|@devs> &lt;!here|here> ask <@{ALICE}>"
        )
        [call] = fake.calls_of("chat.postMessage")
        assert (call.params["parse"], call.params["link_names"]) == ("none", False)
        assert call.token == fake.world.apps[ALPHA].bot_token


async def test_a_5000_character_reply_is_two_messages_in_the_thread(
    fake: FakeSlack, run: Callable[..., Any], decisions: Decisions
) -> None:
    backend = {"type": "python", "callable": "tests.sample_backends:long_reply"}
    async with run(bot("alpha", fake, backend=backend)) as d:
        parent = await fake.user_says(CHANNEL, ALICE, "a long story")
        said = await fake.user_says(CHANNEL, ALICE, f"<@{A_USER}> go", thread_ts=parent["ts"])
        first, second = by(A_USER, await fake.wait_for_messages(CHANNEL, 4))
        assert len(first["text"]) <= 4000 and len(second["text"]) <= 4000
        assert first["text"] + " " + second["text"] == ("lorem ipsum " * 417)[:5000]
        assert first["thread_ts"] == second["thread_ts"] == parent["ts"]
        assert await soft_of(d, chat(parent["ts"])) == 2  # each piece a turn, once
        why = await d.server.admins["alpha"].why(chat(parent["ts"]), 10)
        assert [(e["id"], e["action"]) for e in why] == [(said["ts"], "reply")]


async def test_a_reply_slack_refused_in_a_thread_does_not_make_it_address_the_bot(
    fake: FakeSlack, run: Callable[..., Any], decisions: Decisions
) -> None:
    # Breaks if the thread is marked as one the bot posted in before its reply
    # is sent: after a reply Slack refused (not_in_channel), every later
    # message in the thread addressed the bot, which answers mentions only,
    # and it answered people talking to each other there.
    async with run(bot("alpha", fake)) as d:
        parent = await fake.user_says(CHANNEL, ALICE, "a thread")
        await decisions.wait(parent["ts"], A_USER)
        fake.fail_next("chat.postMessage", 200, '{"ok": false, "error": "not_in_channel"}',
                       "application/json")  # fmt: skip
        asked = await fake.user_says(CHANNEL, ALICE, f"<@{A_USER}> help", thread_ts=parent["ts"])
        assert (await decisions.wait(asked["ts"], A_USER))["action"] == "reply"
        await fake.wait_until(lambda: fake.calls_of("chat.postMessage"), what="the try")
        await d.inflight.idle()
        aside = await fake.user_says(CHANNEL, ALICE, "bob, any idea?", thread_ts=parent["ts"])
        seen = await decisions.wait(aside["ts"], A_USER)
        await d.inflight.idle()
    assert (seen["action"], seen["reason"]) == ("drop", "not_addressed")
    assert by(A_USER, fake.messages(CHANNEL)) == []


async def test_a_429_is_waited_out_and_the_reply_sent_once(
    fake: FakeSlack, run: Callable[..., Any]
) -> None:
    fake.rate_limit_next("chat.postMessage", retry_after=1)
    async with run(bot("alpha", fake)) as d:
        await fake.user_says(CHANNEL, ALICE, f"<@{A_USER}> hello")
        await fake.wait_until(lambda: fake.calls_of("chat.postMessage"), what="the first try")
        limited = time.monotonic()
        [reply] = by(A_USER, await fake.wait_for_messages(CHANNEL, 2))
        assert time.monotonic() - limited >= 0.9  # Retry-After: 1
        assert reply["text"] == f"<@{A_USER}> hello"
        assert [c.status for c in fake.calls_of("chat.postMessage")] == [429, 200]
        assert await soft_of(d, chat()) == 1
        assert (await d.server.admins["alpha"].status(chat())).rate_used == 1


async def test_a_reply_rate_limited_four_times_is_given_up_and_its_slot_given_back(
    fake: FakeSlack, run: Callable[..., Any]
) -> None:
    """Three waits, then no more: nothing is sent, the slot comes back."""
    fake.rate_limit_next("chat.postMessage", retry_after=0, times=4)
    async with run(bot("alpha", fake)) as d:
        said = await fake.user_says(CHANNEL, ALICE, f"<@{A_USER}> hello")
        await fake.wait_until(lambda: len(fake.calls_of("chat.postMessage")) == 4)
        await d.inflight.idle()
        assert [c.status for c in fake.calls_of("chat.postMessage")] == [429] * 4
        status = await d.server.admins["alpha"].status(chat())
        assert (status.rate_used, status.soft) == (0, 0)
        [entry] = await d.server.admins["alpha"].why(chat(), 1)
        assert (entry["id"], entry["reason"]) == (said["ts"], "backend_error")
        assert by(A_USER, fake.messages(CHANNEL)) == []


@pytest.mark.parametrize("retry_after", ["31", "3600", "soon", "1.5", "nan"])
async def test_a_retry_after_too_long_or_unreadable_fails_the_reply_and_gives_the_slot_back(
    fake: FakeSlack, run: Callable[..., Any], retry_after: str
) -> None:
    fake.rate_limit_next("chat.postMessage", retry_after=retry_after)
    async with run(bot("alpha", fake)) as d:
        said = await fake.user_says(CHANNEL, ALICE, f"<@{A_USER}> hello")
        await fake.wait_until(lambda: fake.calls_of("chat.postMessage"), what="the try")
        await d.inflight.idle()
        assert [c.status for c in fake.calls_of("chat.postMessage")] == [429]  # no wait
        status = await d.server.admins["alpha"].status(chat())
        assert (status.rate_used, status.soft) == (0, 0)
        [entry] = await d.server.admins["alpha"].why(chat(), 1)
        assert (entry["id"], entry["reason"]) == (said["ts"], "backend_error")
        # the next answer goes out as usual
        await fake.user_says(CHANNEL, ALICE, f"<@{A_USER}> again")
        [reply] = by(A_USER, await fake.wait_for_messages(CHANNEL, 3))
        assert reply["text"] == f"<@{A_USER}> again"


async def test_a_connection_cut_mid_send_is_not_retried(
    fake: FakeSlack,
    run: Callable[..., Any],
    decisions: Decisions,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Slack may have posted a message whose answer never came: it is not
    sent again (a second copy would be a second turn)."""
    caplog.set_level(logging.INFO)
    fake.disconnect_next("chat.postMessage")
    async with run(bot("alpha", fake)) as d:
        await fake.user_says(CHANNEL, ALICE, f"<@{A_USER}> hello")
        await fake.wait_until(lambda: fake.calls_of("chat.postMessage"), what="the try")
        await d.inflight.idle()
        await settled(fake)
        assert [c.status for c in fake.calls_of("chat.postMessage")] == [0]
        [posted] = by(A_USER, fake.messages(CHANNEL))  # posted once, by the fake
        status = await d.server.admins["alpha"].status(chat())
        assert status.rate_used == 0  # the reply failed as far as alpha knows
        # what Slack did post comes back as alpha's message: counted then, once
        seen = await decisions.wait(posted["ts"], A_USER)
        assert (seen["reason"], seen["soft"]) == ("own_message", 1)
        assert await soft_of(d, chat()) == 1
    [line] = [r for r in caplog.records if "sending the reply" in r.getMessage()]
    assert "Slack could not be reached" in line.getMessage()


async def test_a_plain_text_error_from_in_front_of_slack_fails_the_reply_cleanly(
    fake: FakeSlack, run: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A 503 in plain text (an edge proxy's "upstream connect error"; slack_sdk
    keeps such a body as a string): the reply fails with the status, its slot
    comes back, and no traceback is logged."""
    caplog.set_level(logging.INFO)
    fake.fail_next("chat.postMessage", 503)
    async with run(bot("alpha", fake)) as d:
        said = await fake.user_says(CHANNEL, ALICE, f"<@{A_USER}> hello")
        await fake.wait_until(lambda: fake.calls_of("chat.postMessage"), what="the try")
        await d.inflight.idle()
        status = await d.server.admins["alpha"].status(chat())
        assert (status.rate_used, status.soft) == (0, 0)
        [entry] = await d.server.admins["alpha"].why(chat(), 1)
        assert (entry["id"], entry["reason"]) == (said["ts"], "backend_error")
    [line] = [r for r in caplog.records if "sending the reply" in r.getMessage()]
    assert "Slack refused the message: HTTP 503" in line.getMessage()
    assert not [r for r in caplog.records if r.exc_info]


# -- the Events API ----------------------------------------------------------------------


async def test_events_api_checks_the_signature_before_anything_else(
    fake: FakeSlack, run: Callable[..., Any], decisions: Decisions
) -> None:
    port = free_port()
    url = hook_url(port)
    async with run(bot("alpha", fake, slack=EVENTS), port=port) as d:
        assert fake.calls_of("apps.connections.open") == [] and fake.connections == []
        ok = await fake.url_verification(url, signing_secret=SECRET, challenge="c-42")
        assert (ok.status, json.loads(ok.body)) == (200, {"challenge": "c-42"})
        forged = await fake.url_verification(url, signing_secret="guess", challenge="c-43")
        assert forged.status == 401

        said = await fake.user_says(CHANNEL, ALICE, f"<@{A_USER}> do as I say")
        event = fake.message_event(CHANNEL, said)
        now = int(time.time())
        refused = [
            await fake.post_event(url, event, signing_secret="not-the-secret"),
            await fake.post_event(url, event, signing_secret=SECRET, timestamp=now - 301),
            await fake.post_event(url, event, signing_secret=SECRET, timestamp=now + 301),
            await fake.post_event(url, event, signing_secret=SECRET, signature="v0=00"),
            await fake.post_event(url, event, signing_secret=SECRET, signature="v0=ü"),
            # not even JSON, and unsigned: refused before it is parsed
            await fake.post_raw(url, b"{not json", "not-the-secret"),
        ]
        assert [r.status for r in refused] == [401] * len(refused)
        assert all("signature" in json.loads(r.body)["error"] for r in refused)
        # signed but not JSON: now it is read, and refused as such
        bad = await fake.post_raw(url, b"{not json", SECRET)
        assert bad.status == 400

        # the app_mention Slack sends beside the message event (same ts) is not a turn
        mention = {k: v for k, v in event.items() if k != "channel_type"}
        mentioned = await fake.post_event(url, {**mention, "type": "app_mention"},
                                          signing_secret=SECRET)  # fmt: skip
        assert mentioned.status == 200

        # the same event, signed: handled as new, so none of the above was
        good = await fake.post_event(url, event, signing_secret=SECRET)
        assert good.status == 200
        seen = await decisions.wait(said["ts"], A_USER)
        assert (seen["action"], seen["turn"]) == ("reply", "reset")
        [reply] = by(A_USER, await fake.wait_for_messages(CHANNEL, 2))
        assert reply["text"] == f"<@{A_USER}> do as I say"
        await d.inflight.idle()
        assert times_decided(decisions, said["ts"]) == 1


def rich_text(text: str) -> list[Json]:
    """The `blocks` Slack sends with a message beside its `text`: the text again."""
    section = {"type": "rich_text_section", "elements": [{"type": "text", "text": text}]}
    return [{"type": "rich_text", "block_id": "b1", "elements": [section]}]


async def test_events_api_takes_the_longest_message_slack_sends(
    fake: FakeSlack, run: Callable[..., Any], decisions: Decisions, caplog: pytest.LogCaptureFixture
) -> None:
    # Breaks if the webhook takes no more than the other routes' 64 KiB:
    # Slack sends a message's text twice (`text` and `blocks`), so a message
    # of 33,000 characters, or of 6,000 escaped non-ASCII ones, was refused
    # 413, its retries too, and lost without a line in the log.
    port = free_port()
    url = hook_url(port)
    app = fake.world.apps[ALPHA]
    caplog.set_level(logging.WARNING, logger="botbouncer.http")
    async with run(bot("alpha", fake, slack=EVENTS), port=port):
        for text in ("x" * 39_990, "привет " * 5_700):  # Slack cuts at 40,000
            said = await fake.user_says(CHANNEL, ALICE, text)
            event = {**fake.message_event(CHANNEL, said), "blocks": rich_text(text)}
            raw = json.dumps(event_callback(fake.world, app, event)).encode()  # \u-escaped
            assert len(raw) > 64 * 1024
            assert (await fake.post_raw(url, raw, SECRET)).status == 200
            assert (await decisions.wait(said["ts"], A_USER))["reason"] == "not_addressed"
        assert caplog.records == []
        # past any event Slack sends: refused, and said so
        said = await fake.user_says(CHANNEL, ALICE, "y")
        event = {**fake.message_event(CHANNEL, said), "blocks": rich_text("y" * 1024 * 1024)}
        raw = json.dumps(event_callback(fake.world, app, event)).encode()
        refused = await fake.post_raw(url, raw, SECRET)
        assert refused.status == 413
        assert json.loads(refused.body) == {"error": "request body larger than 1048576 bytes"}
    [line] = [r.getMessage() for r in caplog.records]
    assert "webhook of bot alpha" in line and f"{len(raw)} bytes refused" in line


async def test_events_api_a_retried_delivery_is_a_duplicate_counted_once(
    fake: FakeSlack, run: Callable[..., Any], decisions: Decisions
) -> None:
    port = free_port()
    url = hook_url(port)
    async with run(bot("alpha", fake, slack=EVENTS), port=port) as d:
        chatter = await beta_posts(fake, "bot chatter")
        event = fake.message_event(CHANNEL, chatter)
        assert (await fake.post_event(url, event, signing_secret=SECRET)).status == 200
        first = await decisions.wait(chatter["ts"], A_USER)
        assert (first["reason"], first["soft"]) == ("bot_ignored", 1)
        again = await fake.post_event(url, event, signing_secret=SECRET, retry_num=1)
        assert again.status == 200  # acknowledged, so Slack stops retrying
        _, retried = await decided_times(decisions, chatter["ts"], 2)
        assert (retried["action"], retried["reason"]) == ("drop", "duplicate")
        assert (retried["turn"], retried["soft"]) == ("none", 1)
        assert await soft_of(d, chat()) == 1

        # an addressed message retried while its answer is going out: answered once
        said = await fake.user_says(CHANNEL, ALICE, f"<@{A_USER}> once please")
        asked = fake.message_event(CHANNEL, said)
        replies = await asyncio.gather(
            fake.post_event(url, asked, signing_secret=SECRET),
            fake.post_event(url, asked, signing_secret=SECRET, retry_num=1),
        )
        assert [r.status for r in replies] == [200, 200]
        both = await decided_times(decisions, said["ts"], 2)
        assert sorted(x["action"] for x in both) == ["drop", "reply"]
        await d.inflight.idle()
        assert [m["text"] for m in by(A_USER, fake.messages(CHANNEL))] == [
            f"<@{A_USER}> once please"
        ]


async def test_events_api_an_event_while_the_daemon_stops_is_refused_503(
    fake: FakeSlack, redis_url: str, key_prefix: str, decisions: Decisions
) -> None:
    """An event arriving on a kept-alive connection once the daemon has begun
    to stop is not acknowledged (503: Slack delivers it again, elsewhere),
    and not handled; the answer in progress is still sent."""
    gate = sample_backends.new_gate()
    backend = {"type": "python", "callable": "tests.sample_backends:gated"}
    port = free_port()
    url = hook_url(port)
    d = build(redis_url, key_prefix, bot("alpha", fake, slack=EVENTS, backend=backend), port=port)
    await d.start()
    stopping: asyncio.Task[None] | None = None
    try:
        draining = asyncio.Event()
        drain = d.inflight.drain

        async def spy(grace: float, hurry: asyncio.Event | None = None) -> int:
            draining.set()
            return await drain(grace, hurry)

        d.inflight.drain = spy  # type: ignore[method-assign]
        async with aiohttp.ClientSession() as http:
            first = await fake.user_says(CHANNEL, ALICE, f"<@{A_USER}> take your time")
            event = fake.message_event(CHANNEL, first)
            ok = await fake.post_event(url, event, signing_secret=SECRET, session=http)
            assert ok.status == 200
            async with asyncio.timeout(10):
                await sample_backends.entered().get()
            stopping = asyncio.create_task(d.stop())
            async with asyncio.timeout(5):
                await draining.wait()
            late = await fake.user_says(CHANNEL, ALICE, f"<@{A_USER}> too late")
            event = fake.message_event(CHANNEL, late)
            refused = await fake.post_event(url, event, signing_secret=SECRET, session=http)
            assert refused.status == 503, refused.body
            assert "shutting down" in json.loads(refused.body)["error"]
        assert not stopping.done()
        gate.set()
        await stopping
    finally:
        gate.set()
        if stopping is None:
            await d.stop()
        await forget(redis_url, key_prefix)
    assert [m["text"] for m in by(A_USER, fake.messages(CHANNEL))] == ["worked on it"]
    assert times_decided(decisions, late["ts"]) == 0


async def test_events_api_slash_command_is_answered_in_the_response_body(
    fake: FakeSlack, run: Callable[..., Any]
) -> None:
    port = free_port()
    url = hook_url(port)
    async with run(bot("alpha", fake, slack=EVENTS), port=port) as d:
        refused = await fake.post_command(
            url, ALPHA, CHANNEL, BOB, "/bouncer", "pause", signing_secret=SECRET
        )
        assert refused.status == 200
        answer = json.loads(refused.body)
        assert answer["response_type"] == "ephemeral"
        assert answer["text"].startswith("Only workspace admins and owners")
        assert not (await d.server.admins["alpha"].status(chat())).paused

        forged = await fake.post_command(
            url, ALPHA, CHANNEL, MOD, "/bouncer", "pause", signing_secret="guess"
        )
        assert forged.status == 401
        assert not (await d.server.admins["alpha"].status(chat())).paused

        done = await fake.post_command(
            url, ALPHA, CHANNEL, MOD, "/bouncer", "pause", signing_secret=SECRET
        )
        assert json.loads(done.body) == {
            "response_type": "ephemeral",
            "text": "Paused: no bot answers here until resumed.",
        }
        assert (await d.server.admins["alpha"].status(chat())).paused
        assert by(A_USER, fake.messages(CHANNEL)) == []  # answered only to the one who asked


# -- Socket Mode -------------------------------------------------------------------------


async def test_socket_mode_reconnects_and_loses_no_event(
    fake: FakeSlack, run: Callable[..., Any], decisions: Decisions
) -> None:
    """Slack drops the socket; people keep posting before alpha reconnects:
    every message is decided exactly once, and what was acked before the drop
    is not delivered again. Slack's `disconnect` message is followed too."""
    async with run(bot("alpha", fake)) as d:
        assert fake.connected(ALPHA) == 1
        first = await fake.user_says(CHANNEL, ALICE, f"<@{A_USER}> before")
        await fake.wait_for_messages(CHANNEL, 2)
        await settled(fake)

        # hold the reconnection until the test has posted
        reopen = asyncio.Event()
        opening = fake.methods["apps.connections.open"]

        async def held(app: Any, params: Json) -> Json:
            await reopen.wait()
            return await opening(app, params)

        fake.methods["apps.connections.open"] = held
        await fake.close_sockets()
        await fake.wait_until(lambda: fake.connected(ALPHA) == 0, what="the socket closed")
        away = [await fake.user_says(CHANNEL, ALICE, f"<@{A_USER}> away {i}") for i in range(3)]
        away.append(await beta_posts(fake, "bot chatter while away"))
        assert len(fake.pending(ALPHA)) == 4
        reopen.set()
        await fake.wait_until(lambda: fake.connected(ALPHA) == 1, what="a reconnection")
        await fake.wait_for_messages(CHANNEL, 2 + 4 + 3)
        await settled(fake)

        await fake.send_disconnect(ALPHA)
        await fake.wait_until(lambda: len(fake.connections) == 3, what="a third connection")
        last = await fake.user_says(CHANNEL, ALICE, f"<@{A_USER}> after")
        await fake.wait_for_messages(CHANNEL, 2 + 4 + 3 + 2)
        await settled(fake)
        await d.inflight.idle()

        assert len(fake.calls_of("apps.connections.open")) == 3
        everything = fake.messages(CHANNEL)
        assert len(everything) == 11
        for m in everything:  # people's, beta's, and alpha's own replies
            assert times_decided(decisions, m["ts"]) == 1, m
        assert [m["text"] for m in by(A_USER, everything)] == [
            f"<@{A_USER}> {w}" for w in ("before", "away 0", "away 1", "away 2", "after")
        ]
        envelopes = {e.payload["event"]["ts"]: e for e in fake.event_envelopes(ALPHA)}
        assert envelopes[first["ts"]].deliveries == 1  # acked: not sent again
        assert all(envelopes[m["ts"]].deliveries == 1 for m in away)
        assert envelopes[last["ts"]].deliveries == 1
        assert not any(a.duplicate for a in fake.acks)


async def test_an_envelope_whose_ack_was_lost_is_delivered_again_and_counted_once(
    fake: FakeSlack, run: Callable[..., Any], decisions: Decisions
) -> None:
    async with run(bot("alpha", fake)) as d:
        fake.lose_next_acks(1)
        m = await fake.integration_says(CHANNEL, WORKFLOW, "nightly report")
        first = await decisions.wait(m["ts"], A_USER)
        assert (first["reason"], first["soft"]) == ("bot_ignored", 1)
        await fake.wait_until(lambda: fake.lost_acks, what="the ack lost")
        [env] = fake.pending(ALPHA)
        assert env.payload["event"]["ts"] == m["ts"]
        await fake.close_sockets()
        _, again = await decided_times(decisions, m["ts"], 2)
        assert (again["action"], again["reason"], again["soft"]) == ("drop", "duplicate", 1)
        await settled(fake)
        assert (env.deliveries, env.acked) == (2, True)
        assert await soft_of(d, chat()) == 1


# -- /bouncer ----------------------------------------------------------------------------


async def test_bouncer_for_admins_the_channel_creator_and_configured_ids_only(
    fake: FakeSlack, run: Callable[..., Any], decisions: Decisions
) -> None:
    async def bouncer(user: str, text: str, channel: str = CHANNEL, name: str = "/bouncer") -> str:
        env = await fake.invoke_command(ALPHA, channel, user, name, text)
        await fake.wait_until(lambda: env.acked, what=f"{name} {text} answered")
        assert env.response is not None and env.response["response_type"] == "ephemeral"
        answer: str = env.response["text"]
        return answer

    refusal = "Only workspace admins and owners, the channel's creator and botbouncer admins"
    async with run(bot("alpha", fake, admins={"user_ids": [ALICE]})) as d:
        admin = d.server.admins["alpha"]
        for i in range(3):
            m = await beta_posts(fake, f"bot chatter {i}")
            await decisions.wait(m["ts"], A_USER)

        # a member: refused, nothing changed
        for text in ("reset", "pause", "limits soft=2", ""):
            assert (await bouncer(BOB, text)).startswith(refusal)
        status = await admin.status(chat())
        assert (status.soft, status.paused, status.overrides.soft_limit) == (3, False, None)

        # a workspace admin
        assert (await bouncer(MOD, "reset")).startswith("Reset")
        assert await soft_of(d, chat()) == 0
        # the channel's creator (no workspace role)
        shown = await bouncer(OWNER, "limits soft=5 hard=7")
        assert "0/5 soft, 0/7 hard" in shown
        assert (await admin.status(chat())).limits.soft_limit == 5
        # a workspace owner
        assert (await bouncer(CHIEF, "pause")).startswith("Paused")
        assert (await admin.status(chat())).paused
        # a configured id, asking nobody
        looked_up = len(fake.calls_of("users.info"))
        assert (await bouncer(ALICE, "resume")).startswith("Resumed")
        assert len(fake.calls_of("users.info")) == looked_up
        assert not (await admin.status(chat())).paused
        assert (await bouncer(ALICE, "")).startswith(f"Chat {chat()}: active")  # status
        why = await bouncer(MOD, "why 3")
        assert why.count("\n") == 2 and "bot_ignored" in why
        assert (await bouncer(MOD, "limits soft=zero")).startswith("Not done:")
        assert "answers /bouncer only" in await bouncer(MOD, "status", name="/other")

        # bob created his own channel: he may there, and only there
        assert (await bouncer(BOB, "pause", channel=BOBS)).startswith("Paused")
        assert (await admin.status(chat(channel=BOBS))).paused
        assert not (await admin.status(chat())).paused
        # in a DM nobody is the channel's creator
        fake.world.add_dm("D0BOB", BOB, A_USER)
        assert (await bouncer(BOB, "pause", channel="D0BOB")).startswith(refusal)
        assert not (await admin.status("slack:D0BOB")).paused

        assert fake.ephemeral == []  # every answer went in time, with the ack
        assert by(A_USER, fake.messages(CHANNEL)) == []


# -- starting ----------------------------------------------------------------------------


async def test_startup_errors_name_the_token(
    fake: FakeSlack, run: Callable[..., Any], redis_url: str, key_prefix: str
) -> None:
    try:
        await startup_errors(fake, run)
    finally:  # a daemon that did not start leaves only its store probe (60 s) behind
        await forget(redis_url, key_prefix)


async def startup_errors(fake: FakeSlack, run: Callable[..., Any]) -> None:
    with pytest.raises(StartupError, match="bot alpha: Slack refused the bot token: invalid_auth"):
        async with run(bot("alpha", fake, token="xoxb-wrong")):
            pass
    with pytest.raises(
        StartupError, match="bot alpha: Slack refused the app token for Socket Mode: invalid_auth"
    ):
        async with run(bot("alpha", fake, slack={"app_token": "xapp-1-wrong"})):
            pass
    # the bot token was fine: auth.test passed before the app token was refused
    assert [(c.method, c.status) for c in fake.calls][-2:] == [
        ("auth.test", 200),
        ("apps.connections.open", 200),
    ]
    assert fake.calls[-1].response["ok"] is False and fake.connections == []
    fake.fail_next("auth.test", 503)  # a plain-text answer from in front of Slack
    with pytest.raises(StartupError, match="bot alpha: Slack answered: HTTP 503"):
        async with run(bot("alpha", fake)):
            pass
    unreachable = bot("alpha", fake, api_base=f"http://127.0.0.1:{free_port()}/api/")
    with pytest.raises(StartupError, match="bot alpha: cannot reach Slack at"):
        async with run(unreachable):
            pass
