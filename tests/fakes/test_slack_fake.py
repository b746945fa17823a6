"""The fake Slack works with the REAL slack_sdk (3.48) and slack_bolt (1.30) async clients."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web
from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler
from slack_bolt.app.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.web.async_client import AsyncWebClient

from tests.fakes.slack import FakeSlack, Json

pytestmark = pytest.mark.timeout(30)

APP, BOT_ID, BOT_USER = "A0ECHO", "B0ECHO", "U0ECHOBOT"
ALICE, BOB, CAROL = "U0ALICE", "U0BOB", "U0CAROL"
CHAN, DM = "C0GENERAL", "D0ALICE"
SECRET = "shh-signing-secret"


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as f:
        w = f.world
        for uid, name in ((ALICE, "alice"), (BOB, "bob"), (CAROL, "carol")):
            w.add_user(uid, name)
        w.add_app(APP, "echo", bot_id=BOT_ID, bot_user_id=BOT_USER, signing_secret=SECRET)
        w.add_channel(CHAN, "general", ALICE, BOB, BOT_USER)
        w.add_dm(DM, ALICE, BOT_USER)
        yield f


@asynccontextmanager
async def socket_mode(fake: FakeSlack, bolt: AsyncApp) -> AsyncIterator[AsyncSocketModeHandler]:
    handler = AsyncSocketModeHandler(bolt, fake.world.apps[APP].app_token)
    await handler.connect_async()  # type: ignore[no-untyped-call]
    try:
        yield handler
    finally:
        await handler.close_async()  # type: ignore[no-untyped-call]


def settled(fake: FakeSlack, n_events: int) -> bool:
    """`n_events` events delivered to the app, all acked."""
    return len(fake.event_envelopes(APP)) == n_events and not fake.pending(APP)


async def test_socket_mode_echo_and_own_message(fake: FakeSlack) -> None:
    # process_before_response: the ack is sent after the listener ran, so "acked" means
    # "handled" and the count of listener runs is final once everything is acked
    bolt = AsyncApp(client=fake.web_client(APP), process_before_response=True)
    seen: list[Json] = []

    @bolt.message()
    async def echo(message: Json, say: Any) -> None:
        seen.append(message)
        await say(text=f"echo: {message['text']}", thread_ts=message["ts"])

    async with socket_mode(fake, bolt):
        said = await fake.user_says(CHAN, ALICE, f"hi <@{BOT_USER}>")
        first, reply = await fake.wait_for_messages(CHAN, 2)
        await fake.wait_until(lambda: settled(fake, 2), what="both events acked")

    assert first is said and "bot_id" not in said
    assert reply["text"] == f"echo: hi <@{BOT_USER}>" and reply["thread_ts"] == said["ts"]
    assert (reply["user"], reply["bot_id"], reply["app_id"]) == (BOT_USER, BOT_ID, APP)
    assert [m["ts"] for m in seen] == [said["ts"]]  # echoed once, the echo never handled
    assert [c.method for c in fake.calls] == [
        "apps.connections.open",
        "auth.test",
        "chat.postMessage",
    ]
    # the echo came back to the app as Slack sends it: its bot_id, no subtype ...
    own = fake.event_envelopes(APP)[1]
    event = own.payload["event"]
    assert event["bot_id"] == BOT_ID and event["user"] == BOT_USER and "subtype" not in event
    assert event["bot_profile"]["app_id"] == APP and event["thread_ts"] == said["ts"]
    assert own.payload["authorizations"][0]["user_id"] == BOT_USER
    # ... and Bolt's IgnoringSelfEvents middleware acked it with no listener run
    assert own.acked and own.response is None and len(fake.acks) == 2


async def test_bolt_sees_own_messages_when_self_events_not_ignored(fake: FakeSlack) -> None:
    bolt = AsyncApp(
        client=fake.web_client(APP),
        process_before_response=True,
        ignoring_self_events_enabled=False,
    )
    seen: list[Json] = []

    @bolt.message()
    async def echo(message: Json, say: Any) -> None:
        seen.append(message)
        if "bot_id" not in message:  # without this guard the bot would echo itself forever
            await say(text="echo")

    async with socket_mode(fake, bolt):
        await fake.user_says(CHAN, ALICE, "hello")
        await fake.wait_until(lambda: settled(fake, 2), what="both events acked")
    assert [m.get("bot_id") for m in seen] == [None, BOT_ID]


async def test_socket_mode_reconnect_redelivers_only_unacked(fake: FakeSlack) -> None:
    bolt = AsyncApp(client=fake.web_client(APP), process_before_response=True)
    handled: list[str] = []
    retry_nums: list[Any] = []
    crashed = asyncio.Event()  # the fake sees no change when the listener crashes

    @bolt.message()
    async def handle(message: Json, request: Any) -> None:
        handled.append(message["text"])
        retry_nums.append(request.headers.get("x-slack-retry-num"))
        if message["text"] == "flaky" and handled.count("flaky") == 1:
            crashed.set()
            raise RuntimeError("crashed before the ack")  # Bolt answers 500: no ack

    async with socket_mode(fake, bolt):
        await fake.user_says(CHAN, ALICE, "before")
        await fake.wait_until(lambda: settled(fake, 1), what="'before' acked")
        await fake.user_says(CHAN, ALICE, "flaky")
        await asyncio.wait_for(crashed.wait(), 5)
        assert [e.payload["event"]["text"] for e in fake.pending(APP)] == ["flaky"]

        await fake.close_sockets()
        await fake.wait_until(lambda: len(fake.connections) == 2, what="a reconnection")
        await fake.wait_until(lambda: not fake.pending(APP), what="'flaky' redelivered, acked")
        await fake.user_says(CHAN, ALICE, "after")
        await fake.wait_until(lambda: settled(fake, 3), what="'after' acked")
        await fake.send_disconnect(APP)  # Slack's "please reconnect" message
        await fake.wait_until(lambda: len(fake.connections) == 3, what="a third connection")
        await fake.user_says(CHAN, ALICE, "last")
        await fake.wait_until(lambda: settled(fake, 4), what="'last' acked")

    assert handled == ["before", "flaky", "flaky", "after", "last"]
    assert [e.deliveries for e in fake.event_envelopes(APP)] == [1, 2, 1, 1]
    assert retry_nums == [["0"], ["0"], ["1"], ["0"], ["0"]]  # the envelope's retry_attempt
    assert len(fake.calls_of("apps.connections.open")) == 3  # one URL per connection
    assert not any(a.duplicate for a in fake.acks)


async def test_rate_limited_post_is_retried_after_retry_after(fake: FakeSlack) -> None:
    plain = fake.web_client(APP)
    fake.rate_limit_next("chat.postMessage", retry_after=7)
    with pytest.raises(SlackApiError) as err:
        await plain.chat_postMessage(channel=CHAN, text="no retry handler")
    assert err.value.response.status_code == 429 and err.value.response["error"] == "ratelimited"
    assert err.value.response.headers["Retry-After"] == "7"

    client = fake.web_client(
        APP, retry_handlers=[AsyncRateLimitErrorRetryHandler(max_retry_count=1)]
    )
    fake.rate_limit_next("chat.postMessage", retry_after=1)
    started = time.monotonic()
    resp = await client.chat_postMessage(channel=CHAN, text="hello")
    assert time.monotonic() - started >= 1
    assert resp["ok"] and resp["message"]["text"] == "hello"
    assert [c.status for c in fake.calls_of("chat.postMessage")] == [429, 429, 200]
    assert [m["text"] for m in fake.messages(CHAN)] == ["hello"]


async def test_a_failure_in_front_of_the_api_is_answered_as_given_and_nothing_is_done(
    fake: FakeSlack,
) -> None:
    fake.fail_next("chat.postMessage")
    with pytest.raises(SlackApiError) as err:
        await fake.web_client(APP).chat_postMessage(channel=CHAN, text="lost")
    assert err.value.response.status_code == 503
    assert err.value.response.data == "upstream connect error or disconnect/reset before headers"
    assert fake.messages(CHAN) == []
    assert [c.status for c in fake.calls_of("chat.postMessage")] == [503]
    sent = await fake.web_client(APP).chat_postMessage(channel=CHAN, text="next")
    assert sent["ok"] and [m["text"] for m in fake.messages(CHAN)] == ["next"]


@asynccontextmanager
async def http_app(bolt: AsyncApp) -> AsyncIterator[str]:
    runner = web.AppRunner(bolt.web_app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/slack/events"
    finally:
        await runner.cleanup()


async def test_events_api_over_http_is_signed(fake: FakeSlack) -> None:
    bolt = AsyncApp(client=fake.web_client(APP), signing_secret=SECRET)
    retries: list[Any] = []

    @bolt.message("ping")
    async def pong(message: Json, say: Any, request: Any) -> None:
        retries.append(request.headers.get("x-slack-retry-num"))
        await say(text="pong", thread_ts=message["ts"])

    async with http_app(bolt) as url:
        challenge = await fake.url_verification(url, signing_secret=SECRET, challenge="c-42")
        assert challenge.status == 200 and json.loads(challenge.body) == {"challenge": "c-42"}

        ping = await fake.user_says(DM, ALICE, "ping")
        event = fake.message_event(DM, ping)
        ok = await fake.post_event(url, event, signing_secret=SECRET, retry_num=1)
        assert ok.status == 200
        (_, pong_msg) = await fake.wait_for_messages(DM, 2)
        assert pong_msg["thread_ts"] == ping["ts"] and pong_msg["bot_id"] == BOT_ID
        assert retries == [["1"]]  # X-Slack-Retry-Num, as Bolt's listeners see it

        wrong = await fake.post_event(url, event, signing_secret="not-the-secret")
        stale = await fake.post_event(
            url, event, signing_secret=SECRET, timestamp=int(time.time()) - 301
        )
        forged = await fake.post_event(url, event, signing_secret=SECRET, signature="v0=00")
        assert (wrong.status, stale.status, forged.status) == (401, 401, 401)

    assert len(fake.messages(DM)) == 2  # the refused requests ran no listener
    assert len(fake.http_posts) == 5


async def test_unknown_method_and_bad_tokens(fake: FakeSlack) -> None:
    client = fake.web_client(APP)
    with pytest.raises(SlackApiError) as err:
        await client.api_call("chat.teleport", json={"channel": CHAN})
    assert err.value.response["error"] == "unknown_method"
    assert fake.unknown_methods == ["chat.teleport"]

    for token, error in (
        ("xoxb-wrong", "invalid_auth"),
        (fake.world.apps[APP].app_token, "not_allowed_token_type"),
    ):
        with pytest.raises(SlackApiError) as err:
            await AsyncWebClient(token, base_url=fake.api_base).auth_test()
        assert err.value.response["error"] == error
    with pytest.raises(SlackApiError) as err:
        await client.apps_connections_open(app_token="xapp-wrong")
    assert err.value.response["error"] == "invalid_auth"
    assert [c.token for c in fake.calls][-1] == "xapp-wrong"


async def test_lookups_and_channel_errors(fake: FakeSlack) -> None:
    client = fake.web_client(APP)
    me = await client.auth_test()
    assert (me["user_id"], me["bot_id"], me["team_id"]) == (BOT_USER, BOT_ID, "T0FAKE")
    info = await client.conversations_info(channel=CHAN)
    assert info["channel"]["is_member"] and info["channel"]["name"] == "general"
    dm = await client.conversations_info(channel=DM)
    assert dm["channel"]["is_im"] and dm["channel"]["user"] == ALICE
    bot = await client.users_info(user=BOT_USER)
    assert bot["user"]["is_bot"] and bot["user"]["profile"]["bot_id"] == BOT_ID
    fake.world.add_channel("C0OTHER", "other", ALICE)
    for channel, error in (("C0NOPE", "channel_not_found"), ("C0OTHER", "not_in_channel")):
        with pytest.raises(SlackApiError) as err:
            await client.chat_postMessage(channel=channel, text="hi")
        assert err.value.response["error"] == error
    form = await client.api_call("chat.postMessage", data={"channel": CHAN, "text": "form"})
    assert form["message"]["text"] == "form" and fake.calls[-1].params == {
        "channel": CHAN,
        "text": "form",
    }
    await client.chat_postEphemeral(channel=CHAN, user=BOB, text="only bob")
    assert [(e.user, e.text) for e in fake.ephemeral] == [(BOB, "only bob")]


async def test_slash_command_and_channel_join_over_socket_mode(fake: FakeSlack) -> None:
    bolt = AsyncApp(client=fake.web_client(APP))
    joined: list[str] = []

    @bolt.command("/greet")
    async def greet(ack: Any, command: Json) -> None:
        await ack(f"hello {command['text']}, from {command['user_name']}")

    @bolt.event({"type": "message", "subtype": "channel_join"})
    async def on_join(event: Json) -> None:
        joined.append(event["user"])

    @bolt.message()
    async def never(message: Json) -> None:  # @app.message() skips channel_join
        raise AssertionError(message)

    async with socket_mode(fake, bolt):
        env = await fake.invoke_command(APP, CHAN, BOB, "/greet", "world")
        await fake.wait_until(lambda: env.acked, what="the command acked")
        await fake.user_says(
            CHAN, CAROL, f"<@{CAROL}> has joined the channel", subtype="channel_join"
        )
        await fake.wait_until(lambda: joined == [CAROL], what="the join handled")

    assert env.response == {"text": "hello world, from bob"}
    assert CAROL in fake.world.channels[CHAN].members
