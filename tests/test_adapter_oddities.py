"""Platform payload oddities never crash an adapter (issue 8, "Bad input").

The REAL adapters (discord.py, python-telegram-bot) inside a real daemon, on
Redis, against the fake platforms, fed what `user_says` would never build: a
100 KB text, zero-width / right-to-left / combining characters, lone surrogates
(JSON "\\ud800"), NULs, a message with no author or a broken one, unknown
message types and update kinds, unknown fields, mentions of nobody, entities
pointing past the text, replies to odd messages.

For each: the daemon keeps handling (a normal addressed message afterwards is
still answered), nothing is logged at ERROR level or with a traceback, and a
message valid enough to decide on gets its decision. The 100 KB message is
answered in platform-sized pieces and only a prefix of it is kept as context.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from discord.gateway import DiscordWebSocket
from discord.http import Route
from hypothesis import HealthCheck, given, settings

from adapters import telegram as telegram_adapter
from adapters.common import utf16_len
from gateway.daemon import Daemon
from gateway.store.base import CONTEXT_TEXT_CHARS
from gateway.store.redis import unpack_context
from tests import telegram_shapes as shapes
from tests.daemons import redis_of, running
from tests.decisions import Decisions
from tests.fakes.discord import (
    ALICE as D_ALICE,
)
from tests.fakes.discord import (
    BOT_A as D_BOT,
)
from tests.fakes.discord import (
    GENERAL,
    GUILD,
    OTHER_BOT,
    TOKEN_A,
    FakeDiscord,
    populate,
)
from tests.fakes.telegram import FakeTelegram
from tests.redis_server import free_port

pytestmark = pytest.mark.timeout(60)

# Text that is hard on every layer: zero-width space/joiner/non-joiner, a
# right-to-left override and isolate, combining marks, an emoji ZWJ family,
# flags, a BOM, a NUL, and characters outside the BMP (two UTF-16 units each).
SOUP = (
    "a\u200bb\u200dc\u200cd \u202eright-to-left\u202c \u2067isolate\u2069 "
    "e\u0301\u0327\u0308 Z\u0351\u0352\u0353 \U0001f469\u200d\U0001f469\u200d\U0001f467 "
    "\U0001f1fa\U0001f1e6 \ufeffbom nul:\x00: \U00010348 end"
)
SHOUT = "tests.sample_backends:shout"  # the text in capitals
BIG = " ".join(f"word{i:06d}" for i in range(10_000))  # 109,999 characters


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [(r.name, r.levelname, r.getMessage()[:300]) for r in bad]


async def context_texts(d: Daemon, chat: str) -> list[str]:
    """The texts of the chat's recent context, as stored in Redis, newest first."""
    store = redis_of(d)
    raw = await store.client.lrange(store.keys(chat).ctx, 0, -1)
    return [unpack_context(entry).text for entry in raw]


# ==========================================================================
# Discord
# ==========================================================================


@pytest.fixture
async def discord_fake() -> AsyncIterator[FakeDiscord]:
    base, gateway = Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY
    async with FakeDiscord() as f:
        populate(f)
        yield f
    assert (base, gateway) == (Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY)


@pytest.fixture
def discord_run(
    discord_fake: FakeDiscord, redis_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> Callable[..., AbstractAsyncContextManager[Daemon]]:
    """A daemon fronting bot alpha (echo unless told) on the fake Discord."""

    @asynccontextmanager
    async def start(**policy: Any) -> AsyncIterator[Daemon]:
        alpha = {
            "name": "alpha",
            "platform": "discord",
            "token": TOKEN_A,
            "api_base": discord_fake.api_base,
            "backend": {"type": "echo"},
            "guild_ids": [str(GUILD)],
            "bot_messages": "mentions",
            **policy,
        }
        caplog.set_level(logging.WARNING)
        async with running(redis_url, key_prefix, alpha) as d:
            await discord_fake.wait_connected(D_BOT)
            caplog.clear()  # what starting logged is not this test's business
            yield d

    return start


def mention(text: str = "hi") -> str:
    return f"<@{D_BOT}> {text}"


async def discord_still_answers(fake: FakeDiscord, decisions: Decisions) -> None:
    said = await fake.user_says(GENERAL, D_ALICE, mention("are you still there?"))
    seen = await decisions.wait(said["id"], D_BOT)
    assert seen["action"] == "reply", seen
    await fake.wait_until(
        lambda: any(
            str((m.message_reference or {}).get("message_id")) == said["id"]
            for m in fake.sent_by(D_BOT)
        ),
        what="the answer to the message after the odd one",
    )


@dataclass(frozen=True)
class Odd:
    """One odd payload: how to change a normal one, and what must follow."""

    change: Callable[[dict[str, Any]], Any]
    expect: str  # "reply", "drop", or "ignored" (unreadable: dropped with a warning)
    content: str = mention()


def _set(**fields: Any) -> Callable[[dict[str, Any]], Any]:
    def change(p: dict[str, Any]) -> Any:
        p.update(fields)
        return p

    return change


def _drop(*keys: str) -> Callable[[dict[str, Any]], Any]:
    def change(p: dict[str, Any]) -> Any:
        for key in keys:
            p.pop(key, None)
        return p

    return change


def _ghost_mentions(p: dict[str, Any]) -> Any:
    ghost = {
        "id": "1999999999999999999",
        "username": "ghost",
        "discriminator": "0",
        "global_name": None,
        "avatar": None,
    }
    p["content"] = "<@1999999999999999999> <@!1888888888888888888> <@&1777777777777777777> hi"
    p["mentions"] = [ghost]
    p["mention_roles"] = ["1777777777777777777"]
    return p


def _reply_to(referenced: Any, *, reference_id: str = "1300000000000099999") -> Any:
    def change(p: dict[str, Any]) -> Any:
        p["type"] = 19
        p["message_reference"] = {
            "type": 0,
            "message_id": reference_id,
            "channel_id": str(GENERAL),
            "guild_id": str(GUILD),
        }
        p["referenced_message"] = referenced(p) if callable(referenced) else referenced
        return p

    return change


def _weird_referenced(p: dict[str, Any]) -> Any:
    ref = dict(p)
    ref.update(
        id="1300000000000099999",
        type=9999,
        content="\u202e\x00",
        flags=2**40,
        brand_new_field={"x": [1]},
        author={**p["author"], "id": str(OTHER_BOT), "bot": True},
    )
    ref.pop("referenced_message", None)
    return ref


def _authorless_referenced(p: dict[str, Any]) -> Any:
    ref = {k: v for k, v in p.items() if k not in ("author", "member")}
    ref["id"] = "1300000000000099999"
    return ref


def _lone_surrogate(p: dict[str, Any]) -> Any:
    p["content"] = mention("broken \ud800 half \udfff pair")
    p["author"]["global_name"] = "name \udc00 too"  # the context keeps author names
    return p


DISCORD_ODDITIES = {
    "unicode-soup": Odd(_set(), "reply", mention(SOUP)),
    "lone-surrogates": Odd(_lone_surrogate, "reply"),
    "no-author": Odd(_drop("author", "member"), "ignored"),
    "null-author": Odd(_set(author=None), "ignored"),
    "author-without-id": Odd(_set(author={"username": "nobody"}), "ignored"),
    "author-id-not-a-number": Odd(_set(author={"id": "alice", "username": "x"}), "ignored"),
    "unknown-type-9999": Odd(_set(type=9999), "drop"),
    "unknown-fields": Odd(
        _set(
            brand_new_field={"nested": [1, None]},
            flags=2**40,
            nonce=[1],
            sticker_items=[],
            poll_v3={"x": 1},
        ),
        "reply",
    ),
    "missing-content": Odd(_drop("content"), "ignored"),
    "null-content": Odd(_set(content=None), "drop"),
    "missing-type": Odd(_drop("type"), "ignored"),
    "id-not-a-number": Odd(_set(id="not-a-snowflake"), "ignored"),
    "unknown-channel": Odd(_set(channel_id="1300000000000077777"), "reply"),
    "mentions-of-nobody": Odd(_ghost_mentions, "drop"),
    "broken-mention-entry": Odd(_set(mentions=[{"username": "no id"}]), "drop"),
    "reply-to-a-deleted-message": Odd(_reply_to(None), "reply"),
    "reply-to-a-weird-bot-message": Odd(_reply_to(_weird_referenced), "reply"),
    # the adapter reads what it needs and leaves the rest: a person is answered
    # whatever else the payload carries
    "reply-to-a-half-message": Odd(_reply_to({"id": "1", "content": "?"}), "reply"),
    "reply-to-an-authorless-message": Odd(_reply_to(_authorless_referenced), "reply"),
    "garbage-embeds-and-attachments": Odd(
        _set(embeds=[{"type": "weird", "fields": [{}]}], attachments=[{"id": "1"}]), "reply"
    ),
}


@pytest.mark.parametrize("case", list(DISCORD_ODDITIES), ids=list(DISCORD_ODDITIES))
async def test_discord_oddities_never_crash_the_adapter(
    case: str,
    discord_fake: FakeDiscord,
    discord_run: Callable[..., AbstractAsyncContextManager[Daemon]],
    decisions: Decisions,
    caplog: pytest.LogCaptureFixture,
) -> None:
    odd = DISCORD_ODDITIES[case]
    async with discord_run():
        payload = odd.change(discord_fake.message_payload(GENERAL, D_ALICE, odd.content))
        [_] = await discord_fake.dispatch_raw("MESSAGE_CREATE", payload, guild_id=GUILD)
        message_id = str(payload.get("id"))
        if odd.expect == "ignored":
            await discord_still_answers(discord_fake, decisions)
            assert all(x["id"] != message_id for x in decisions.seen)
            [warning] = [r for r in caplog.records if "could not read" in r.getMessage()]
            assert (warning.levelno, warning.name) == (logging.WARNING, "botbouncer.discord")
        else:
            seen = await decisions.wait(message_id, D_BOT)
            assert seen["action"] == odd.expect, seen
            if odd.expect == "reply" and case != "unknown-channel":
                want = payload["content"].replace("\ud800", "\ufffd").replace("\udfff", "\ufffd")
                await discord_fake.wait_until(
                    lambda: any(m.content == want for m in discord_fake.sent_by(D_BOT)),
                    what="the echo of the odd message",
                )
            await discord_still_answers(discord_fake, decisions)
        no_tracebacks(caplog)


async def test_discord_a_100_kb_message_is_answered_in_pieces_and_kept_short(
    discord_fake: FakeDiscord,
    discord_run: Callable[..., AbstractAsyncContextManager[Daemon]],
    decisions: Decisions,
    caplog: pytest.LogCaptureFixture,
) -> None:
    text = mention(BIG)
    # a backend that is given context, so the store keeps some
    # every piece sent: max_reply_messages (10 by default) would cut it
    shout = {"type": "python", "callable": SHOUT}
    async with discord_run(backend=shout, max_reply_messages=100) as d:
        payload = discord_fake.message_payload(GENERAL, D_ALICE, text)
        await discord_fake.dispatch_raw("MESSAGE_CREATE", payload, guild_id=GUILD)
        seen = await decisions.wait(payload["id"], D_BOT)
        assert seen["action"] == "reply"
        pieces = await discord_fake.wait_until(
            lambda: (
                (got := discord_fake.sent_by(D_BOT))
                and " ".join(m.content for m in got) == text.upper()
                and got
            ),
            timeout=30,
            what="the whole 100 KB answer",
        )
        assert all(len(p.content) <= 2000 for p in pieces)
        assert len(pieces) == len(text) // 2000 + 1
        for p in pieces:  # each piece was counted as this bot's turn under its id
            await decisions.wait(p.id, D_BOT)
        # the last pieces pushed the message itself out of the context: they were
        # kept as their first CONTEXT_TEXT_CHARS characters (the Telegram test
        # below sees the message itself kept so)
        stored = await context_texts(d, f"discord:{GENERAL}")
        newest_first = [p.content[:CONTEXT_TEXT_CHARS] for p in reversed(pieces)]
        assert 0 < len(stored) < len(pieces) and stored == newest_first[: len(stored)]
        await discord_still_answers(discord_fake, decisions)
        no_tracebacks(caplog)


async def test_discord_events_that_are_not_messages_at_all(
    discord_fake: FakeDiscord,
    discord_run: Callable[..., AbstractAsyncContextManager[Daemon]],
    decisions: Decisions,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An event type nobody knows, a MESSAGE_CREATE whose data is no object,
    and edits discord.py could not read (a partial MESSAGE_UPDATE, as Discord
    long sent them for embeds filled in later): each once ended the client."""
    async with discord_run():
        await discord_fake.dispatch_raw("BRAND_NEW_EVENT", {"x": [1, {"y": None}]}, guild_id=GUILD)
        for data in (None, [], "text", 5):
            await discord_fake.dispatch_raw("MESSAGE_CREATE", data, guild_id=GUILD)
        partial = {"id": "1300000000000011111", "channel_id": str(GENERAL), "embeds": []}
        for data in ({**partial, "guild_id": str(GUILD)}, None):
            await discord_fake.dispatch_raw("MESSAGE_UPDATE", data, guild_id=GUILD)
        await discord_still_answers(discord_fake, decisions)
        no_tracebacks(caplog)


# ==========================================================================
# Telegram
# ==========================================================================

T_ALICE, T_BOT, T_OTHER = 1001, 7001, 7002
T_TOKEN, T_OTHER_TOKEN = "7001:alpha-secret", "7002:beta-secret"
GROUP = -1001500
SECRET = "hook-secret_1"


@pytest.fixture
async def telegram_fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(webhook_backoff=0.01) as f:
        f.add_bot(T_TOKEN, T_BOT, "alpha_bot", "Alpha", privacy=False)  # sees every message
        f.add_bot(T_OTHER_TOKEN, T_OTHER, "beta_bot", "Beta")
        f.add_user(T_ALICE, "Alice", "alice")
        f.add_chat(GROUP, "supergroup", "the group")
        for member in (T_ALICE, T_BOT, T_OTHER):
            f.add_member(GROUP, member)
        f.add_private(T_ALICE, T_BOT)
        yield f


@pytest.fixture
def telegram_run(
    telegram_fake: FakeTelegram, redis_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> Callable[..., AbstractAsyncContextManager[Daemon]]:
    """A daemon fronting bot alpha (echo unless told; long polling unless
    `webhook=True`) on the fake Bot API."""

    @asynccontextmanager
    async def start(*, webhook: bool = False, **policy: Any) -> AsyncIterator[Daemon]:
        port = free_port()
        alpha = {
            "name": "alpha",
            "platform": "telegram",
            "token": T_TOKEN,
            "api_base": telegram_fake.api_base,
            "backend": {"type": "echo"},
            **policy,
        }
        if webhook:
            url = f"http://127.0.0.1:{port}/v1/webhooks/alpha"
            hook = {"webhook_url": url, "secret_token": SECRET}
            alpha["telegram"] = {**alpha.get("telegram", {}), **hook}
        caplog.set_level(logging.WARNING)
        async with running(redis_url, key_prefix, alpha, port=port) as d:
            caplog.clear()
            yield d

    return start


async def telegram_still_answers(fake: FakeTelegram, decisions: Decisions) -> dict[str, Any]:
    said = await fake.user_says(GROUP, T_ALICE, "@alpha_bot are you still there?")
    seen = await decisions.wait(said["message_id"], T_BOT)
    assert seen["action"] == "reply", seen
    await fake.wait_until(
        lambda: any(s.reply_to == said["message_id"] for s in fake.sent),
        what="the answer to the message after the odd one",
    )
    return said


def entity(kind: str, offset: int, length: int, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "offset": offset, "length": length, **extra}


ADDRESSED = "@alpha_bot hi"
AT_ALPHA = [entity("mention", 0, 10)]


@dataclass(frozen=True)
class TgOdd:
    """One odd message: its text and other fields, and the action expected
    ("any": decided, whatever the decision)."""

    expect: str
    text: str | None = ADDRESSED
    fields: dict[str, Any] | None = None
    drop: tuple[str, ...] = ()
    echo: bool = True  # a reply is expected to arrive


def _poll(*, current: bool = True) -> dict[str, Any]:
    """A poll as Telegram sends it, or as a Bot API server from before 9.6 did."""
    option = {"persistent_id": "o1"} if current else {}
    later = {"allows_revoting": False, "members_only": False} if current else {}
    return {
        "id": "p1",
        "question": "lunch?",
        "options": [{"text": "yes", "voter_count": 0, **option}],
        "total_voter_count": 0,
        "is_closed": False,
        "is_anonymous": True,
        "type": "regular",
        "allows_multiple_answers": False,
        **later,
    }


def _bot_message(**fields: Any) -> dict[str, Any]:
    return {
        "message_id": 1,
        "date": 0,
        "chat": {"id": GROUP, "type": "supergroup"},
        "from": {"id": T_BOT, "is_bot": True, "first_name": "Alpha", "username": "alpha_bot"},
        **fields,
    }


TELEGRAM_ODDITIES = {
    "unicode-soup": TgOdd("reply", "@alpha_bot " + SOUP, {"entities": AT_ALPHA}),
    "lone-surrogates": TgOdd(
        "reply",
        "@alpha_bot broken \ud800 half \udfff",
        {"entities": AT_ALPHA, "from": {"id": T_ALICE, "is_bot": False, "first_name": "A\udc00"}},
    ),
    "entity-splitting-a-surrogate-pair": TgOdd(
        "drop", "\U0001f600@alpha_bot hi", {"entities": [entity("mention", 1, 11)]}
    ),
    "entities-past-the-end": TgOdd(
        "reply",
        ADDRESSED,
        {
            "entities": [
                *AT_ALPHA,
                entity("mention", 40, 10),
                entity("bot_command", 5, 500),
                entity("text_mention", 0, 3),
                entity("brand_new_entity", 2, 2),
            ]
        },
    ),
    "negative-entity-offsets": TgOdd(
        "drop", ADDRESSED, {"entities": [entity("mention", -5, 3), entity("mention", 0, -3)]}
    ),
    "no-from-no-sender-chat": TgOdd("any", ADDRESSED, {"entities": AT_ALPHA}, drop=("from",)),
    "null-from": TgOdd("any", ADDRESSED, {"entities": AT_ALPHA, "from": None}),
    "sender-chat-without-title": TgOdd(
        "any", ADDRESSED, {"entities": AT_ALPHA, "sender_chat": {"id": -100777, "type": "channel"}}
    ),
    "dice": TgOdd("drop", None, {"dice": {"emoji": "🎲", "value": 6}}),
    "poll": TgOdd("drop", None, {"poll": _poll()}),
    # Bot API 9.6 added required fields; a server from before it leaves them out,
    # and python-telegram-bot refuses the whole update: skipped, with a warning
    "poll-from-an-older-bot-api": TgOdd("ignored", None, {"poll": _poll(current=False)}),
    "story": TgOdd("drop", None, {"story": {"chat": {"id": GROUP, "type": "supergroup"}, "id": 3}}),
    "only-an-unknown-field": TgOdd("drop", None, {"brand_new_content": {"x": [1, None]}}),
    "unknown-fields-beside-the-text": TgOdd(
        "reply", ADDRESSED, {"entities": AT_ALPHA, "brand_new_field": {"x": 1}, "another": [None]}
    ),
    "unknown-chat-type": TgOdd(
        "any",
        ADDRESSED,
        {"entities": AT_ALPHA, "chat": {"id": GROUP, "type": "brand_new_chat_type"}},
    ),
    "topic-that-does-not-exist": TgOdd(
        "reply",
        ADDRESSED,
        {"entities": AT_ALPHA, "is_topic_message": True, "message_thread_id": 424242},
        echo=False,  # Telegram refuses the answer ("message thread not found"): a warning
    ),
    "mentions-of-nobody": TgOdd(
        "drop",
        "@nobody_bot Ghost hi",
        {
            "entities": [
                entity("mention", 0, 11),
                entity(
                    "text_mention", 12, 5, user={"id": 999999, "is_bot": False, "first_name": "G"}
                ),
            ]
        },
    ),
    "caption-mention-on-a-photo": TgOdd(
        "reply",
        None,
        {
            "caption": "@alpha_bot look",
            "caption_entities": AT_ALPHA,
            "photo": [{"file_id": "f", "file_unique_id": "u", "width": 1, "height": 1}],
        },
    ),
    "reply-to-an-authorless-message": TgOdd(
        "drop",
        "hi",
        {
            "reply_to_message": {
                "message_id": 1,
                "date": 0,
                "chat": {"id": GROUP, "type": "supergroup"},
            }
        },
    ),
    "reply-to-a-dice-of-the-bot": TgOdd(
        "any", "nice roll", {"reply_to_message": _bot_message(dice={"emoji": "🎯", "value": 1})}
    ),
    "reply-to-a-nested-reply": TgOdd(
        "any",
        "and?",
        {
            "reply_to_message": _bot_message(
                text="\u202e", reply_to_message=_bot_message(text=None, brand_new=1)
            )
        },
    ),
    "reply-to-a-topic-opening": TgOdd(
        "drop",
        "hi",
        {
            "reply_to_message": _bot_message(
                forum_topic_created={"name": "t", "icon_color": 7322096}
            )
        },
    ),
}


@pytest.mark.parametrize("case", list(TELEGRAM_ODDITIES), ids=list(TELEGRAM_ODDITIES))
async def test_telegram_oddities_never_crash_the_adapter(
    case: str,
    telegram_fake: FakeTelegram,
    telegram_run: Callable[..., AbstractAsyncContextManager[Daemon]],
    decisions: Decisions,
    caplog: pytest.LogCaptureFixture,
) -> None:
    odd = TELEGRAM_ODDITIES[case]
    async with telegram_run():
        msg = telegram_fake.message_payload(GROUP, T_ALICE, odd.text, **(odd.fields or {}))
        for key in odd.drop:
            msg.pop(key)
        await telegram_fake.push_raw(T_BOT, {"message": msg})
        if odd.expect == "ignored":
            await telegram_still_answers(telegram_fake, decisions)
            assert all(x["id"] != str(msg["message_id"]) for x in decisions.seen)
            assert_skipped(caplog)
            no_tracebacks(caplog)
            return
        seen = await decisions.wait(msg["message_id"], T_BOT)
        if odd.expect != "any":
            assert seen["action"] == odd.expect, seen
        if seen["action"] == "reply" and odd.echo:
            said = odd.text if odd.text is not None else (odd.fields or {})["caption"]
            want = said.replace("\ud800", "\ufffd").replace("\udfff", "\ufffd")
            await telegram_fake.wait_until(
                lambda: any(s.reply_to == msg["message_id"] for s in telegram_fake.sent),
                what="the echo of the odd message",
            )
            [echo] = [s for s in telegram_fake.sent if s.reply_to == msg["message_id"]]
            assert echo.text == want
        await telegram_still_answers(telegram_fake, decisions)
        no_tracebacks(caplog)


async def test_telegram_a_100_kb_message_is_answered_in_pieces_and_kept_short(
    telegram_fake: FakeTelegram,
    telegram_run: Callable[..., AbstractAsyncContextManager[Daemon]],
    decisions: Decisions,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """In a private chat (a group's flood limit, 20 a minute, would make 25
    pieces take a minute). Emoji count twice in Telegram's UTF-16 limit."""
    text = " ".join(f"w{i:05d}\U0001f642" for i in range(11_000))  # 99,999 characters
    backend = {"type": "python", "callable": SHOUT, "context_messages": 50}
    async with telegram_run(backend=backend, max_reply_messages=100) as d:  # every piece
        said = await telegram_fake.user_says(T_ALICE, T_ALICE, text, to_bot=T_BOT)
        seen = await decisions.wait(said["message_id"], T_BOT)
        assert seen["action"] == "reply"
        pieces = await telegram_fake.wait_until(
            lambda: (
                (got := [s.text for s in telegram_fake.sent])
                and " ".join(got) == text.upper()
                and got
            ),
            timeout=30,
            what="the whole 100 KB answer",
        )
        assert all(utf16_len(p) <= 4096 for p in pieces)
        assert len(pieces) == utf16_len(text) // 4096 + 1
        await d.inflight.idle()  # every piece counted
        stored = await context_texts(d, f"telegram:{T_ALICE}")
        assert len(stored) == len(pieces) + 1
        assert stored[-1] == text[:CONTEXT_TEXT_CHARS]  # the message, the oldest entry
        assert all(len(t) <= CONTEXT_TEXT_CHARS for t in stored)
        await telegram_still_answers(telegram_fake, decisions)
        no_tracebacks(caplog)


async def test_telegram_update_kinds_nobody_knows_are_skipped(
    telegram_fake: FakeTelegram,
    telegram_run: Callable[..., AbstractAsyncContextManager[Daemon]],
    decisions: Decisions,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Long polling asks for `message` updates only; were Telegram to send others
    (a kind added after this release, an edit), they are skipped, not fatal."""
    bot = telegram_fake.bot(T_BOT)
    async with telegram_run():
        for update in (
            {"brand_new_update": {"x": [1, {"y": None}]}},
            {
                "edited_message": telegram_fake.message_payload(
                    GROUP, T_ALICE, ADDRESSED, edit_date=1
                )
            },
            {
                "message_reaction": {
                    "chat": {"id": GROUP, "type": "supergroup"},
                    "message_id": 1,
                    "date": 0,
                    "old_reaction": [],
                    "new_reaction": [],
                }
            },
        ):
            # a poll that is already waiting returns it, whatever allowed_updates said
            await telegram_fake.wait_until(lambda: bot.polling > 0, what="a waiting long poll")
            queued = await telegram_fake.push_raw(T_BOT, update)
            await telegram_fake.wait_until(
                lambda q=queued: q not in bot.pending,  # type: ignore[misc]
                what=f"update {queued['update_id']} fetched",
            )
        said = await telegram_still_answers(telegram_fake, decisions)
        assert [x["id"] for x in decisions.seen] == [str(said["message_id"])]
        no_tracebacks(caplog)


MALFORMED = {
    "message-with-only-an-unknown-field": {"message": {"brand_new": 1}},
    "message-is-a-number": {"message": 5},
    "sender-without-a-name": {
        "message": {
            "message_id": 9,
            "date": 0,
            "text": "hi",
            "chat": {"id": GROUP, "type": "supergroup"},
            "from": {"id": 5},
        }
    },
    "entity-without-an-offset": {
        "message": {
            "message_id": 9,
            "date": 0,
            "text": "hi",
            "chat": {"id": GROUP, "type": "supergroup"},
            "entities": [{"type": "mention"}],
        }
    },
    "nothing-but-an-update-id": {},
}
BARE = "nothing-but-an-update-id"


def assert_skipped(caplog: pytest.LogCaptureFixture) -> None:
    [warning] = [r for r in caplog.records if "skipped update" in r.getMessage()]
    assert (warning.levelno, warning.name) == (logging.WARNING, "botbouncer.telegram")


@pytest.mark.parametrize(
    ("case", "mode"),
    # (the fake's getUpdates cannot filter an update of no kind by allowed_updates)
    [(c, m) for c in MALFORMED for m in ("polling", "webhook") if (c, m) != (BARE, "polling")],
    ids=[
        f"{c}-{m}" for c in MALFORMED for m in ("polling", "webhook") if (c, m) != (BARE, "polling")
    ],
)
async def test_telegram_a_malformed_update_is_skipped_and_the_next_is_handled(
    case: str,
    mode: str,
    telegram_fake: FakeTelegram,
    telegram_run: Callable[..., AbstractAsyncContextManager[Daemon]],
    decisions: Decisions,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What python-telegram-bot cannot parse: by long polling it is skipped with a
    warning (once it was fetched again and again, and the bot heard nothing
    more); by webhook it is answered 400 (Telegram gives up on it), never a
    5xx. Either way the updates after it are handled."""
    async with telegram_run(webhook=mode == "webhook"):
        queued = await telegram_fake.push_raw(T_BOT, MALFORMED[case])
        said = await telegram_still_answers(telegram_fake, decisions)
        assert [x["id"] for x in decisions.seen] == [str(said["message_id"])]
        parsed = case == BARE  # an update without anything PTB knows: nothing to skip
        if mode == "webhook":
            statuses = {a.status for a in telegram_fake.webhook_attempts if a.update == queued}
            assert statuses == ({200} if parsed else {400}), statuses
        elif not parsed:
            assert_skipped(caplog)
        no_tracebacks(caplog)


def test_a_batch_is_checked_only_when_ptb_asks_for_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second parse that finds unreadable updates costs as much as PTB's
    own, so a batch is checked only when PTB fetches it again (it could not
    read it): a batch it read moves the offset on."""
    checked: list[int] = []
    real = telegram_adapter.Update.de_json

    def counting(cls: Any, data: Any, bot: Any) -> Any:
        checked.append(data["update_id"])
        return real(data, bot)

    monkeypatch.setattr(telegram_adapter.Update, "de_json", classmethod(counting))
    updates = telegram_adapter.ReadableUpdates("b")
    try:

        def fetch(offset: int | None, *ids: int) -> None:
            updates._offset = offset  # what do_request records of the call in flight
            body = {"ok": True, "result": [{"update_id": i} for i in ids]}
            updates.parse_json_payload(json.dumps(body).encode())

        fetch(None, 1, 2)
        fetch(3, 3)  # PTB read 1 and 2
        fetch(4)  # nothing new
        assert checked == []
        fetch(4, 4, 5)
        fetch(4, 4, 5)  # the same batch again: PTB could not read it
        assert checked == [4, 5]
        fetch(6, 6)
        assert checked == [4, 5]
    finally:
        updates.close_filters()


# -- every update shape is decided or ignored, never a 500 or a traceback ----------
#
# python-telegram-bot builds a Message from whatever it is given as long as the
# fields its constructors require are there: a message without `chat` has
# chat None, a chat id may be a string, a text a list, an entity offset null.


@dataclass(frozen=True)
class Shape:
    """An update (built on the fake's message payload `m`) and what becomes of
    it: "decided" (a decision on its message id), "ignored" (a line at DEBUG
    or INFO naming `why`, no decision) or "answered" (an admin command: the
    bot answers it)."""

    build: Callable[[dict[str, Any]], dict[str, Any]]
    expect: str
    why: str = ""


def _without(m: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in m.items() if k not in keys}


USER = {"id": T_ALICE, "is_bot": False, "first_name": "Alice"}
# Many answers in one group: neither the rate cap nor PTB's flood limiter in the way.
ROOMY: dict[str, Any] = {
    "rate_cap": {"max_replies": 1000},
    "telegram": {"rate_limit": {"overall_per_second": 0, "group_per_minute": 0}},
}
CHANNEL = {"id": -100999, "type": "channel"}
ODD_USER = {"id": [1], "is_bot": None, "first_name": None}
SHAPES = {
    "message-without-chat": Shape(lambda m: {"message": _without(m, "chat")}, "ignored", "no chat"),
    "message-with-a-null-chat": Shape(
        lambda m: {"message": {**m, "chat": None}}, "ignored", "no chat"
    ),
    "chat-id-not-a-number": Shape(
        lambda m: {"message": {**m, "chat": {"id": "x", "type": "supergroup"}}},
        "ignored",
        "chat id",
    ),
    "message-id-not-a-number": Shape(
        lambda m: {"message": {**m, "message_id": "x"}}, "ignored", "message_id"
    ),
    "edited-message-without-chat": Shape(
        lambda m: {"edited_message": _without(m, "chat")}, "ignored", "edited_message"
    ),
    "channel-post-without-sender": Shape(
        lambda m: {
            "channel_post": _without(m, "from") | {"chat": {"id": -100999, "type": "channel"}}
        },
        "ignored",
        "channel_post",
    ),
    "callback-query": Shape(
        lambda m: {
            "callback_query": {"id": "q1", "from": USER, "chat_instance": "c", "message": m}
        },
        "ignored",
        "callback_query",
    ),
    "text-a-number": Shape(lambda m: {"message": {**m, "text": 5}}, "decided"),
    "text-a-list-holding-a-command": Shape(
        lambda m: {"message": {**m, "text": ["/bouncer_reset"]}}, "decided"
    ),
    "caption-an-object": Shape(
        lambda m: {"message": _without(m, "text") | {"caption": {"a": 1}}}, "decided"
    ),
    "entity-offsets-not-numbers": Shape(
        lambda m: {"message": {**m, "entities": [entity("mention", "0", None)]}},  # type: ignore[arg-type]
        "decided",
    ),
    "entity-type-a-list": Shape(
        lambda m: {"message": {**m, "entities": [entity(["mention"], 0, 10)]}},  # type: ignore[arg-type]
        "decided",
    ),
    "text-mention-of-a-user-whose-id-is-a-string": Shape(
        lambda m: {
            "message": {
                **m,
                "entities": [entity("text_mention", 0, 5, user={**USER, "id": str(T_BOT)})],
            }
        },
        "decided",
    ),
    "topic-id-not-a-number": Shape(
        lambda m: {"message": {**m, "is_topic_message": True, "message_thread_id": "7"}}, "decided"
    ),
    "sender-name-a-number": Shape(
        lambda m: {"message": {**m, "from": {**USER, "first_name": 5}}}, "decided"
    ),
    "sender-id-not-a-number": Shape(
        lambda m: {"message": {**m, "from": {**USER, "id": "x"}}}, "decided"
    ),
    "sender-is-bot-a-string": Shape(
        lambda m: {"message": {**m, "from": {**USER, "is_bot": "yes"}}}, "decided"
    ),
    "sender-chat-id-not-a-number": Shape(
        lambda m: {"message": {**m, "sender_chat": {"id": "x", "type": "channel"}}}, "decided"
    ),
    "reply-to-a-message-without-chat": Shape(
        lambda m: {"message": {**m, "reply_to_message": {"message_id": 1, "date": 0}}}, "decided"
    ),
    "reply-to-a-message-whose-sender-is-odd": Shape(
        lambda m: {
            "message": {
                **m,
                "reply_to_message": {"message_id": 1, "date": 0, "chat": None, "from": ODD_USER},
            }
        },
        "decided",
    ),
    "an-admin-command-without-a-sender": Shape(
        lambda m: {"message": _without(m, "from", "entities") | {"text": "/bouncer_status"}},
        "answered",
    ),
}


async def _outcome(
    fake: FakeTelegram, decisions: Decisions, caplog: pytest.LogCaptureFixture, name: str,
    shape: Shape, queued: dict[str, Any], message_id: Any,
) -> None:  # fmt: skip
    """Wait for what the shape expects to happen to the queued update."""
    if shape.expect == "decided":
        await decisions.wait(message_id, T_BOT)
        return
    if shape.expect == "answered":
        await fake.wait_until(
            lambda: any(s.reply_to == message_id for s in fake.sent), what=f"{name}: an answer"
        )
        return
    wanted = f"update {queued['update_id']} ignored"
    for _ in range(500):
        said = [r for r in caplog.records if wanted in r.getMessage()]
        if said:
            break
        await asyncio.sleep(0.01)
    assert said, f"{name}: nothing said about {wanted}"
    [line] = said
    assert line.name == "botbouncer.telegram" and line.levelno in (logging.DEBUG, logging.INFO)
    assert shape.why in line.getMessage(), (name, line.getMessage())
    assert all(x["id"] != str(message_id) for x in decisions.seen), name


@pytest.mark.parametrize("mode", ["polling", "webhook"])
async def test_telegram_every_update_shape_is_decided_or_ignored(
    mode: str,
    telegram_fake: FakeTelegram,
    telegram_run: Callable[..., AbstractAsyncContextManager[Daemon]],
    decisions: Decisions,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each of SHAPES in turn, by long polling and by webhook: never a 500,
    never a line at ERROR or with a traceback, and the bot still answers."""
    bot = telegram_fake.bot(T_BOT)
    async with telegram_run(webhook=mode == "webhook", **ROOMY):
        caplog.set_level(logging.DEBUG, "botbouncer.telegram")
        for name, shape in SHAPES.items():
            m = telegram_fake.message_payload(GROUP, T_ALICE, ADDRESSED, entities=AT_ALPHA)
            message_id = m["message_id"]
            update = shape.build(m)
            if mode == "polling":  # a waiting poll takes any kind of update
                await telegram_fake.wait_until(lambda: bot.polling > 0, what="a waiting poll")
            queued = await telegram_fake.push_raw(T_BOT, update)
            if mode == "webhook":
                [attempt] = await telegram_fake.wait_until(
                    lambda q=queued: [a for a in telegram_fake.webhook_attempts if a.update == q],  # type: ignore[misc]
                    what=f"{name} delivered",
                )
                assert attempt.status == 200, (name, attempt)
            await _outcome(telegram_fake, decisions, caplog, name, shape, queued, message_id)
        await telegram_still_answers(telegram_fake, decisions)
        no_tracebacks(caplog)


FUZZ_EXAMPLES = int(os.environ.get("BOTBOUNCER_FUZZ_EXAMPLES", "150"))


async def telegram_still_answers_a_dm(fake: FakeTelegram) -> None:
    """After updates of any ids in any chats: a DM (no rate cap) from someone
    new, in a chat no random update used (its message ids would be duplicates
    there), with a text of its own, answered."""
    zed = 5_550_123_456_789
    fake.add_user(zed, "Zed", "zed")
    fake.add_private(zed, T_BOT)
    text = "@alpha_bot still there, in private?"
    said = await fake.user_says(zed, zed, text, to_bot=T_BOT)
    await fake.wait_until(
        lambda: any(s.reply_to == said["message_id"] and s.text == text for s in fake.sent),
        what="the answer to a DM after the fuzzing",
    )


@pytest.mark.timeout(180)
async def test_telegram_webhook_answers_any_update_shape_without_a_5xx(
    telegram_fake: FakeTelegram,
    telegram_run: Callable[..., AbstractAsyncContextManager[Daemon]],
    decisions: Decisions,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Updates built from the Bot API shapes with any field missing, null or
    of another type (tests/telegram_shapes.py), POSTed to the webhook with the
    right secret: 200 when python-telegram-bot could read it (decided or
    ignored), 400 when it could not - never a 5xx, never a traceback.
    More examples: BOTBOUNCER_FUZZ_EXAMPLES=2000."""
    update_ids = itertools.count(1_000_000)
    statuses: Counter[int] = Counter()
    async with telegram_run(webhook=True, **ROOMY) as d:
        url = d.config.bot("alpha").telegram.webhook_url
        assert url is not None
        loop = asyncio.get_running_loop()
        async with aiohttp.ClientSession() as http:

            async def post(update: dict[str, Any]) -> int:
                headers = {telegram_adapter.SECRET_HEADER: SECRET}
                async with http.post(url, json=update, headers=headers) as resp:
                    return resp.status

            @settings(
                max_examples=FUZZ_EXAMPLES,
                deadline=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(update=shapes.updates)
            def one(update: dict[str, Any]) -> None:
                body = {"update_id": next(update_ids), **update}
                status = asyncio.run_coroutine_threadsafe(post(body), loop).result(timeout=30)
                statuses[status] += 1
                assert status in (200, 400), (status, body)

            await asyncio.to_thread(one)  # hypothesis drives; the daemon runs on this loop
        assert statuses[200] > sum(statuses.values()) // 10, statuses  # a third get past PTB
        assert decisions.seen, "no update was decided on"
        await telegram_still_answers_a_dm(telegram_fake)
        no_tracebacks(caplog)
