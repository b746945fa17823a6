"""The Discord adapter end to end: the real discord.py client, inside the real
daemon, against the fake Discord of tests/fakes/discord/, on Redis.

The daemon reaches the fake only through `api_base` (and GET /gateway/bot).
Decisions are awaited through the decision log lines the pipeline writes, the
platform side through the fake's recorded messages: nothing sleeps.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from discord.gateway import DiscordWebSocket
from discord.http import Route

from gateway.daemon import Daemon
from tests import sample_backends
from tests.daemons import admitted_ids, running
from tests.decisions import Decisions
from tests.fakes.discord import (
    ALICE,
    ALPHA_ROLE,
    BOT_A,
    BOT_B,
    GENERAL,
    GUILD,
    MOD,
    MOD_ROLE,
    OTHER_BOT,
    OWNER,
    THREAD,
    TOKEN_A,
    TOKEN_B,
    FakeDiscord,
    MessageType,
    Perm,
    RecordedMessage,
    guild_id_for_shard,
    member,
    populate,
    shard_of,
    text_channel,
)

pytestmark = pytest.mark.timeout(60)


def chat(channel: int) -> str:
    return f"discord:{channel}"


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    base, gateway = Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY
    async with FakeDiscord() as f:
        populate(f)
        yield f
        assert f.unknown_routes == []
    # the adapter gives discord.py's process-wide endpoints back when it stops
    assert (base, gateway) == (Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY)


def bot(name: str, token: str, fake: FakeDiscord, **policy: Any) -> dict[str, Any]:
    return {
        "name": name,
        "platform": "discord",
        "token": token,
        "api_base": fake.api_base,
        "backend": {"type": "echo"},
        "guild_ids": [str(GUILD)],
        "turns": {"soft_limit": 4, "hard_limit": 10},
        **policy,
    }


@asynccontextmanager
async def daemon(
    fake: FakeDiscord, redis_url: str, prefix: str, *bots: dict[str, Any]
) -> AsyncIterator[Daemon]:
    async with running(redis_url, prefix, *bots) as d:
        for b in bots:
            await fake.wait_connected(BOT_A if b["token"] == TOKEN_A else BOT_B)
        yield d


@pytest.fixture
def run(fake: FakeDiscord, redis_url: str, key_prefix: str) -> Callable[..., Any]:
    def start(*bots: dict[str, Any]) -> Any:
        return daemon(fake, redis_url, key_prefix, *bots)

    return start


def by(user: int, messages: list[RecordedMessage]) -> list[RecordedMessage]:
    return [m for m in messages if m.author_id == user]


async def soft_of(d: Daemon, channel: int, name: str = "alpha") -> int:
    return (await d.server.admins[name].status(chat(channel))).soft


async def test_a_mention_is_answered_and_the_reply_and_its_echo_are_one_turn(
    fake: FakeDiscord, run: Callable[..., Any], decisions: Decisions
) -> None:
    async with run(bot("alpha", TOKEN_A, fake)) as d:
        admitted = admitted_ids(d)
        said = await fake.user_says(GENERAL, ALICE, f"<@{BOT_A}> hello there")
        replies = by(BOT_A, await fake.wait_for_messages(GENERAL, 2))
        assert [r.content for r in replies] == [f"<@{BOT_A}> hello there"]
        reply = replies[0]
        assert reply.message_reference is not None
        assert int(reply.message_reference["message_id"]) == int(said["id"])
        assert fake.typing == []  # the echo answered at once: no indicator
        echo = await decisions.wait(reply.id, BOT_A)  # the reply coming back from the gateway
        assert (echo["action"], echo["reason"], echo["soft"]) == ("drop", "own_message", 1)
        # logged at debug: the reply's own decision line said it all
        assert decisions.logged_at(reply.id, BOT_A) == logging.DEBUG
        assert decisions.logged_at(said["id"], BOT_A) == logging.INFO
        assert await soft_of(d, GENERAL) == 1  # counted when sent; the echo added nothing
        # an unaddressed human message is not answered
        quiet = await fake.user_says(GENERAL, ALICE, "just chatting")
        assert (await decisions.wait(quiet["id"], BOT_A))["reason"] == "not_addressed"
        assert len(fake.messages(GENERAL)) == 3
        # the fake (as Discord may) shows the reply before answering its POST:
        # the echo waited for that answer, and asked the store nothing
        assert admitted == [str(said["id"]), str(quiet["id"])]


async def test_typing_shows_while_a_slow_backend_works(
    fake: FakeDiscord, run: Callable[..., Any]
) -> None:
    gate = sample_backends.new_gate()
    backend = {"type": "python", "callable": "tests.sample_backends:gated"}
    async with run(bot("alpha", TOKEN_A, fake, backend=backend)):
        await fake.user_says(GENERAL, ALICE, f"<@{BOT_A}> think hard")
        await fake.wait_until(lambda: fake.typing != [], what="typing")
        assert by(BOT_A, fake.messages(GENERAL)) == []  # typing while nothing is sent yet
        assert [(t.channel_id, t.user_id) for t in fake.typing] == [(GENERAL, BOT_A)]
        gate.set()
        replies = by(BOT_A, await fake.wait_for_messages(GENERAL, 2))
        assert [r.content for r in replies] == ["worked on it"]


async def test_another_bots_message_is_counted_and_ignored_when_bot_messages_is_off(
    fake: FakeDiscord, run: Callable[..., Any], decisions: Decisions
) -> None:
    async with run(bot("alpha", TOKEN_A, fake, bot_messages="off")) as d:
        msg = await fake.user_says(GENERAL, OTHER_BOT, f"<@{BOT_A}> hey, bot to bot")
        seen = await decisions.wait(msg["id"], BOT_A)
        assert (seen["action"], seen["reason"], seen["soft"]) == ("drop", "bot_ignored", 1)
        assert await soft_of(d, GENERAL) == 1
        assert by(BOT_A, fake.messages(GENERAL)) == []


async def test_a_bridge_posting_through_a_webhook_is_a_person_when_listed(
    fake: FakeDiscord, run: Callable[..., Any], decisions: Decisions
) -> None:
    # Breaks if a webhook listed in known_people stays a bot: Discord marks
    # every webhook post `bot`, so the people a bridge or PluralKit posts for
    # were never answered (bot_messages is off by default) and never reset
    # the count between two bots.
    bridge, other = 4_040_001, 4_040_002
    async with run(bot("alpha", TOKEN_A, fake, known_people=[str(bridge)])) as d:
        said = await fake.webhook_says(GENERAL, bridge, "Ann [matrix]", f"<@{BOT_A}> hi", by=ALICE)
        replies = by(BOT_A, await fake.wait_for_messages(GENERAL, 2))
        assert [r.content for r in replies] == [f"<@{BOT_A}> hi"]
        assert (await decisions.wait(said["id"], BOT_A))["action"] == "reply"
        assert await soft_of(d, GENERAL) == 1  # the reply; Ann's message reset the count
        again = await fake.webhook_says(GENERAL, other, "hooked", f"<@{BOT_A}> hi", by=ALICE)
        seen = await decisions.wait(again["id"], BOT_A)
        assert (seen["action"], seen["reason"]) == ("drop", "bot_ignored")  # not listed: a bot


async def test_a_pin_does_not_reset_and_a_thread_is_its_own_chat(
    fake: FakeDiscord, run: Callable[..., Any], decisions: Decisions
) -> None:
    async with run(bot("alpha", TOKEN_A, fake)) as d:
        for i in range(3):
            m = await fake.user_says(GENERAL, OTHER_BOT, f"bot chatter {i}")
            await decisions.wait(m["id"], BOT_A)
        pin = await fake.user_says(
            GENERAL, ALICE, "", message_type=MessageType.CHANNEL_PINNED_MESSAGE
        )
        seen = await decisions.wait(pin["id"], BOT_A)
        assert (seen["reason"], seen["turn"], seen["soft"]) == ("system_message", "none", 3)
        in_thread = await fake.user_says(THREAD, OTHER_BOT, "in the thread")
        seen = await decisions.wait(in_thread["id"], BOT_A)
        assert (seen["chat"], seen["soft"]) == (chat(THREAD), 1)
        assert (await soft_of(d, GENERAL), await soft_of(d, THREAD)) == (3, 1)
        human = await fake.user_says(THREAD, ALICE, "a person in the thread")
        await decisions.wait(human["id"], BOT_A)
        assert (await soft_of(d, GENERAL), await soft_of(d, THREAD)) == (3, 0)


async def test_two_fronted_bots_on_one_redis_stop_at_the_soft_limit_with_one_warning(
    fake: FakeDiscord, run: Callable[..., Any], decisions: Decisions
) -> None:
    """Two daemons, one bot each, answering each other's replies: 4 replies
    (the soft limit), one warning, silence; a person speaks and they resume."""
    policy = {
        "bot_messages": "mentions",
        "backend": {"type": "python", "callable": "tests.sample_backends:polite"},
    }
    async with (
        run(bot("alpha", TOKEN_A, fake, **policy)) as da,
        run(bot("beta", TOKEN_B, fake, **policy)),
    ):
        # names beta by bare id: only alpha is addressed, alpha's greeting starts the loop
        await fake.user_says(GENERAL, ALICE, f"<@{BOT_A}> please greet {BOT_B}")
        # 1 human message, 4 replies, 1 warning
        messages = await fake.wait_for_messages(GENERAL, 6)
        warning = messages[5]
        assert "Bot turn limit reached (4/4)" in warning.content
        for b in (BOT_A, BOT_B):  # both bots have decided on the warning: the chat is quiet
            await decisions.wait(warning.id, b)
        messages = fake.messages(GENERAL)
        replies = [m for m in messages[1:] if m is not warning]
        shown = [(m.author_id, m.content[:40]) for m in messages]
        assert len(messages) == 6 and len(replies) == 4, shown
        assert {m.author_id for m in replies} == {BOT_A, BOT_B}
        assert sum("limit reached" in m.content for m in messages) == 1
        assert not warning.pinged_users and not warning.pinged_everyone
        assert await soft_of(da, GENERAL) == 5  # 4 replies + the warning, each counted once

        again = await fake.user_says(GENERAL, ALICE, f"<@{BOT_A}> carry on, greet {BOT_B}")
        resumed = await decisions.wait(again["id"], BOT_A)
        assert (resumed["turn"], resumed["action"]) == ("reset", "reply")
        await fake.wait_until(lambda: len(fake.messages(GENERAL)) >= 8, what="the resumed loop")


async def test_a_mention_of_the_bots_own_role_is_a_mention_of_the_bot(
    fake: FakeDiscord, run: Callable[..., Any], decisions: Decisions
) -> None:
    # Breaks if only a user mention addresses the bot: Discord's autocomplete
    # offers the bot's own role under the bot's name, and a person who picked
    # it was never answered (not_addressed). Another role is no mention.
    async with run(bot("alpha", TOKEN_A, fake)):
        by_role = await fake.user_says(GENERAL, ALICE, f"<@&{ALPHA_ROLE}> are you there?")
        assert (await decisions.wait(by_role["id"], BOT_A))["action"] == "reply"
        other = await fake.user_says(GENERAL, ALICE, f"<@&{MOD_ROLE}> can someone help?")
        assert (await decisions.wait(other["id"], BOT_A))["reason"] == "not_addressed"


async def test_a_long_reply_is_split_and_never_pings_everyone(
    fake: FakeDiscord, run: Callable[..., Any], decisions: Decisions
) -> None:
    async with run(bot("alpha", TOKEN_A, fake)) as d:
        text = f"<@{BOT_A}> @everyone " + "x" * 2500
        await fake.user_says(GENERAL, OWNER, text)
        pieces = by(BOT_A, await fake.wait_for_messages(GENERAL, 3))
        assert [len(p.content) for p in pieces] == [2000, len(text) - 2000]
        assert "".join(p.content for p in pieces) == text
        assert not any(p.pinged_everyone or p.pinged_roles for p in pieces)
        assert pieces[0].message_reference is not None and pieces[1].message_reference is None
        for p in pieces:
            await decisions.wait(p.id, BOT_A)
        assert await soft_of(d, GENERAL) == 2  # two messages on Discord: two bot turns


@pytest.mark.parametrize(
    ("policy", "soft", "said"),
    [
        ({"turns": {"soft_limit": 2, "hard_limit": 3}}, 3, "stopped after 3 of its 5 messages"),
        ({"max_reply_messages": 2}, 2, "takes 5 messages; the first 2 are sent"),
    ],
    ids=["hard-limit", "max-reply-messages"],
)
async def test_a_long_answer_stops_at_the_hard_limit_or_max_reply_messages(
    fake: FakeDiscord,
    run: Callable[..., Any],
    decisions: Decisions,
    caplog: pytest.LogCaptureFixture,
    policy: dict[str, Any],
    soft: int,
    said: str,
) -> None:
    # Breaks if every piece of a long answer is sent: a backend's 1 MB answer
    # went out as 500 messages, each a bot turn, far past the hard limit.
    async with run(bot("alpha", TOKEN_A, fake, **policy)) as d:
        text = f"<@{BOT_A}> " + "x" * 9000  # five messages on Discord
        await fake.user_says(GENERAL, OWNER, text)
        pieces = by(BOT_A, await fake.wait_for_messages(GENERAL, soft + 1))
        for p in pieces:
            await decisions.wait(p.id, BOT_A)
        await d.inflight.idle()
        assert [len(p.content) for p in by(BOT_A, fake.messages(GENERAL))] == [2000] * soft
        assert await soft_of(d, GENERAL) == soft
    assert said in caplog.text


async def test_bouncer_commands_reset_for_admins_refuse_others_and_explain(
    fake: FakeDiscord, run: Callable[..., Any], decisions: Decisions
) -> None:
    async with run(bot("alpha", TOKEN_A, fake, bot_messages="mentions")) as d:
        synced = fake.commands[(BOT_A, GUILD)]
        assert [c["name"] for c in synced] == ["bouncer"]
        assert int(synced[0]["default_member_permissions"]) == Perm.MANAGE_GUILD
        subcommands = sorted(o["name"] for o in synced[0]["options"])
        assert subcommands == ["limits", "pause", "reset", "resume", "status", "why"]
        for i in range(5):  # another bot talks the channel past the soft limit
            m = await fake.user_says(GENERAL, OTHER_BOT, f"chatter {i}")
            await decisions.wait(m["id"], BOT_A)
        ask = await fake.user_says(GENERAL, OTHER_BOT, f"<@{BOT_A}> answer me")
        assert (await decisions.wait(ask["id"], BOT_A))["reason"] == "turn_throttled"

        refused = await (
            await fake.invoke(BOT_A, GUILD, GENERAL, ALICE, ["bouncer", "reset"])
        ).response()
        assert refused.ephemeral and "Only server managers" in (refused.content or "")
        assert await soft_of(d, GENERAL) == 6  # nothing changed

        why = await (await fake.invoke(BOT_A, GUILD, GENERAL, MOD, ["bouncer", "why"])).response()
        assert why.ephemeral and "turn_throttled" in (why.content or "")
        assert f"msg {ask['id']}" in (why.content or "")

        done = await (
            await fake.invoke(BOT_A, GUILD, GENERAL, MOD, ["bouncer", "reset"])
        ).response()
        assert done.ephemeral and (done.content or "").startswith("Reset")
        assert await soft_of(d, GENERAL) == 0
        ask = await fake.user_says(GENERAL, OTHER_BOT, f"<@{BOT_A}> answer me now")
        assert (await decisions.wait(ask["id"], BOT_A))["action"] == "reply"

        limits = await (
            await fake.invoke(BOT_A, GUILD, GENERAL, OWNER, ["bouncer", "limits"], {"soft": 2})
        ).response()
        assert "soft=2" in (limits.content or "")
        status = await (
            await fake.invoke(BOT_A, GUILD, GENERAL, MOD, ["bouncer", "status"])
        ).response()
        assert "/2 soft" in (status.content or "")


async def test_rate_limits_and_reconnects_stay_discord_pys_and_nothing_doubles(
    fake: FakeDiscord, run: Callable[..., Any], decisions: Decisions
) -> None:
    """A 429 on the send is retried by discord.py (one reply, not two); a
    dropped gateway connection is resumed and the next mention is answered once."""
    async with run(bot("alpha", TOKEN_A, fake)) as d:
        fake.rate_limit_next("POST", f"/channels/{GENERAL}/messages")
        await fake.user_says(GENERAL, ALICE, f"<@{BOT_A}> through a 429")
        replies = by(BOT_A, await fake.wait_for_messages(GENERAL, 2))
        assert len(fake.rate_limited) == 1 and len(replies) == 1
        await decisions.wait(replies[0].id, BOT_A)

        assert await fake.disconnect(BOT_A) == 1
        await fake.wait_until(
            lambda: any(s.resumes for s in fake.connected(BOT_A)), what="a resumed session"
        )
        said = await fake.user_says(GENERAL, ALICE, f"<@{BOT_A}> after the reconnect")
        messages = await fake.wait_for_messages(GENERAL, 4)
        assert [m.content for m in by(BOT_A, messages)][-1] == said["content"]
        await decisions.wait(by(BOT_A, messages)[-1].id, BOT_A)
        assert len(by(BOT_A, fake.messages(GENERAL))) == 2
        assert await soft_of(d, GENERAL) == 1  # the person reset the count; the one reply


async def test_a_dm_is_always_addressed(
    fake: FakeDiscord, run: Callable[..., Any], decisions: Decisions
) -> None:
    dm = 1_300_000_000_000_000_009
    fake.add_dm(dm, fake.users[ALICE], bot_id=BOT_A)
    async with run(bot("alpha", TOKEN_A, fake)):
        said = await fake.user_says(dm, ALICE, "no mention needed here")
        seen = await decisions.wait(said["id"], BOT_A)
        assert (seen["chat"], seen["action"]) == (chat(dm), "reply")
        replies = by(BOT_A, await fake.wait_for_messages(dm, 2))
        assert [r.content for r in replies] == ["no mention needed here"]


async def test_a_process_runs_only_its_shards(
    fake: FakeDiscord, run: Callable[..., Any], decisions: Decisions
) -> None:
    """shard_count 2, shard_ids [the shard of GUILD]: that guild's messages
    arrive here; a guild owned by the other shard belongs to another process."""
    mine = shard_of(GUILD, 2)
    other_guild = guild_id_for_shard(1 - mine, 2)
    other_channel = 1_300_000_000_000_000_008
    fake.add_guild(
        other_guild, "elsewhere", channels=[text_channel(other_channel, "x")],
        members=[member(ALICE, "alice")],
    )  # fmt: skip
    async with run(bot("alpha", TOKEN_A, fake, shard_count=2, shard_ids=[mine])) as d:
        [session] = fake.connected(BOT_A)
        assert (session.shard_id, session.shard_count) == (mine, 2)
        elsewhere = await fake.user_says(other_channel, ALICE, f"<@{BOT_A}> not for this shard")
        here = await fake.user_says(GENERAL, ALICE, f"<@{BOT_A}> for this shard")
        assert (await decisions.wait(here["id"], BOT_A))["action"] == "reply"
        delivered = [x.data["id"] for x in fake.dispatched("MESSAGE_CREATE", BOT_A)]
        assert here["id"] in delivered and elsewhere["id"] not in delivered
        assert await soft_of(d, other_channel) == 0
