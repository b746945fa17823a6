"""The fake Telegram works with the REAL python-telegram-bot (22.x) Bot and Application."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import telegram
from aiogram import Bot, Dispatcher, F
from aiogram.exceptions import (
    TelegramBadRequest,
    TelegramForbiddenError,
    TelegramRetryAfter,
    TelegramUnauthorizedError,
)
from aiogram.types import Message as AiogramMessage
from aiohttp import web
from telegram.error import (
    BadRequest,
    Conflict,
    EndPointNotFound,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
)
from telegram.ext import Application, ApplicationBuilder, ContextTypes, MessageHandler, filters

from tests.fakes.telegram import (
    GROUP_ANONYMOUS_BOT_ID,
    FakeTelegram,
    Json,
    aiogram_session,
    fast_request,
    find_entities,
    utf16_len,
)

pytestmark = pytest.mark.timeout(30)

TOKEN_A, TOKEN_B = "1001:alpha-token", "1002:beta-token"
ALPHA, BETA = 1001, 1002
ALICE, BOB = 7, 8
GROUP, FORUM = -1001234, -1005678


def populate(fake: FakeTelegram, **beta: Any) -> None:
    """Bots alpha and beta (beta's flags from `beta`), people alice and bob, a
    supergroup GROUP and a forum FORUM whose members are all four, alice the creator."""
    fake.add_bot(TOKEN_A, ALPHA, "alpha_bot", "Alpha")
    fake.add_bot(TOKEN_B, BETA, "beta_bot", "Beta", **beta)
    fake.add_user(ALICE, "Alice", "alice")
    fake.add_user(BOB, "Bob")
    fake.add_chat(GROUP, "supergroup", "the group")
    fake.add_chat(FORUM, "supergroup", "the forum", is_forum=True)
    for chat in (GROUP, FORUM):
        fake.add_member(chat, ALICE, "creator")
        for uid in (BOB, ALPHA, BETA):
            fake.add_member(chat, uid)


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(webhook_backoff=0.01) as f:
        populate(f)
        yield f


def ptb_bot(fake: FakeTelegram, token: str = TOKEN_A) -> telegram.Bot:
    return telegram.Bot(
        token,
        base_url=f"{fake.api_base}/bot",
        request=fast_request(),
        get_updates_request=fast_request(),
    )


def texts(updates: list[Json]) -> list[str | None]:
    return [u["message"].get("text") for u in updates]


def queued(fake: FakeTelegram, token: str) -> list[Json]:
    """The updates waiting for a bot (nothing here fetches them)."""
    return fake.bots[token].pending


# -- basics ------------------------------------------------------------------------------


async def test_get_me_through_initialize(fake: FakeTelegram) -> None:
    fake.bots[TOKEN_B].privacy = False
    async with ptb_bot(fake) as alpha, ptb_bot(fake, TOKEN_B) as beta:
        assert alpha.username == "alpha_bot"
        assert alpha.id == ALPHA
        assert alpha.bot.can_read_all_group_messages is False
        assert beta.bot.can_read_all_group_messages is True
        me = await alpha.get_me()
    assert me.is_bot and me.first_name == "Alpha" and me.can_join_groups
    assert [c.method for c in fake.calls_of("getMe", TOKEN_A)] == ["getMe", "getMe"]


async def test_send_message_returns_a_ptb_message_and_is_recorded(fake: FakeTelegram) -> None:
    first = await fake.user_says(GROUP, ALICE, "hello")
    async with ptb_bot(fake) as bot:
        sent = await bot.send_message(GROUP, "hi there")
    assert isinstance(sent, telegram.Message)
    assert sent.message_id == first["message_id"] + 1  # one counter per chat
    assert sent.chat.id == GROUP and sent.chat.type == "supergroup"
    assert sent.from_user is not None and sent.from_user.id == ALPHA
    assert sent.text == "hi there"
    [record] = await fake.wait_sent(1, chat_id=GROUP)
    assert (record.bot_user_id, record.chat_id) == (ALPHA, GROUP)
    assert record.text == "hi there" and record.thread_id is None and record.reply_to is None
    assert record.message["message_id"] == sent.message_id
    call = fake.calls_of("sendMessage")[0]
    # PTB sends form fields, non-strings JSON-encoded
    assert call.params == {"chat_id": str(GROUP), "text": "hi there"}


async def test_replies(fake: FakeTelegram) -> None:
    question = await fake.user_says(GROUP, ALICE, "question")
    async with ptb_bot(fake) as bot:
        answer = await bot.send_message(GROUP, "answer", reply_to_message_id=question["message_id"])
        assert answer.reply_to_message is not None
        assert answer.reply_to_message.text == "question"
        assert answer.reply_to_message.from_user.id == ALICE  # type: ignore[union-attr]
        with pytest.raises(BadRequest, match="Message to be replied not found"):
            await bot.send_message(GROUP, "x", reply_to_message_id=999)
        loose = await bot.send_message(
            GROUP,
            "x",
            reply_parameters=telegram.ReplyParameters(999, allow_sending_without_reply=True),
        )
        assert loose.reply_to_message is None
    assert fake.sent[0].reply_to == question["message_id"]
    back = await fake.user_says(GROUP, BOB, "thanks", reply_to=answer.message_id)
    assert back["reply_to_message"]["text"] == "answer"
    assert "reply_to_message" not in back["reply_to_message"]  # not nested further


# -- delivery ----------------------------------------------------------------------------


@dataclass
class BotCase:
    text: str
    expected: bool
    s_mode: bool = False
    r_mode: bool = False
    r_admin: bool = False
    r_privacy: bool = True
    reply_to_r: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


BOT_TO_BOT = {
    "no mode, command for R": BotCase("/ping@beta_bot", False),
    "no mode, reply to R": BotCase("hi", False, reply_to_r=True),
    "no mode, R admin and privacy off": BotCase("hi", False, r_admin=True, r_privacy=False),
    "S mode, reply to R": BotCase("hi", True, s_mode=True, reply_to_r=True),
    "S mode, command for R": BotCase("/ping@beta_bot", True, s_mode=True),
    "R mode, command for R": BotCase("please /ping@beta_bot", True, r_mode=True),
    "R mode, reply to R": BotCase("hi", True, r_mode=True, reply_to_r=True),
    "R mode, bare command": BotCase("/ping", False, r_mode=True),
    "R mode, command for another bot": BotCase("/ping@gamma_bot", False, r_mode=True),
    "R mode, mention only": BotCase("hey @beta_bot", False, r_mode=True),
    "R mode, plain text": BotCase("hi", False, r_mode=True, r_privacy=False),
    "R mode + admin + privacy off: everything": BotCase(
        "hi", True, r_mode=True, r_admin=True, r_privacy=False
    ),
    "R mode + admin, privacy on": BotCase("hi", False, r_mode=True, r_admin=True),
    "S mode only, R admin and privacy off": BotCase(
        "hi", False, s_mode=True, r_admin=True, r_privacy=False
    ),
}


@pytest.mark.parametrize("case", BOT_TO_BOT.values(), ids=BOT_TO_BOT.keys())
async def test_bot_to_bot_delivery(case: BotCase) -> None:
    async with FakeTelegram() as fake:
        populate(fake, bot_to_bot=case.r_mode, privacy=case.r_privacy)
        fake.bots[TOKEN_A].bot_to_bot = case.s_mode
        if case.r_admin:
            fake.add_member(GROUP, BETA, "administrator")
        async with ptb_bot(fake) as alpha, ptb_bot(fake, TOKEN_B) as beta:
            target = await beta.send_message(GROUP, "from beta")
            sent = await alpha.send_message(
                GROUP, case.text, reply_to_message_id=target.message_id if case.reply_to_r else None
            )
        got = [u["message"]["message_id"] for u in queued(fake, TOKEN_B)]
        assert (sent.message_id in got) is case.expected
        assert queued(fake, TOKEN_A) == []  # alpha has no mode: never sees beta's message


TEXT_MENTION_OF_BETA = {
    "type": "text_mention",
    "offset": 4,
    "length": 3,
    "user": {"id": BETA, "is_bot": True, "first_name": "Beta"},
}
HUMAN = {
    "not addressed": ("just chatting", {}, False),
    "mentioned": ("hey @beta_bot look", {}, True),
    "mentioned, other case": ("hey @Beta_Bot", {}, True),
    "command for R": ("/start@beta_bot", {}, True),
    "command for another bot": ("/start@alpha_bot", {}, False),
    "bare command": ("/start", {}, True),
    "text_mention": ("hey you", {"entities": [TEXT_MENTION_OF_BETA]}, True),
    "reply to R": ("sure", {"reply": True}, True),
    "privacy off": ("just chatting", {"privacy": False}, True),
    "admin": ("just chatting", {"admin": True}, True),
    "not a member": ("/start", {"left": True}, False),
}


@pytest.mark.parametrize(("text", "how", "expected"), HUMAN.values(), ids=HUMAN.keys())
async def test_delivery_of_human_messages(text: str, how: dict[str, Any], expected: bool) -> None:
    async with FakeTelegram() as fake:
        populate(fake, privacy=how.get("privacy", True))
        if how.get("admin"):
            fake.add_member(GROUP, BETA, "administrator")
        if how.get("left"):
            fake.add_member(GROUP, BETA, "left")
        reply_to = None
        if how.get("reply"):
            async with ptb_bot(fake, TOKEN_B) as beta:
                reply_to = (await beta.send_message(GROUP, "from beta")).message_id
        msg = await fake.user_says(
            GROUP, ALICE, text, reply_to=reply_to, entities=how.get("entities")
        )
        delivered = [u["message"]["message_id"] for u in queued(fake, TOKEN_B)]
        assert (msg["message_id"] in delivered) is expected


async def test_private_chats_are_per_bot(fake: FakeTelegram) -> None:
    fake.add_private(ALICE, ALPHA)
    fake.add_private(ALICE, BETA)
    to_alpha = await fake.user_says(ALICE, ALICE, "hi alpha", to_bot=ALPHA)
    assert to_alpha["chat"] == {
        "id": ALICE,
        "first_name": "Alice",
        "username": "alice",
        "type": "private",
    }
    assert texts(queued(fake, TOKEN_A)) == ["hi alpha"]
    assert queued(fake, TOKEN_B) == []
    async with ptb_bot(fake, TOKEN_B) as beta:
        reply = await beta.send_message(ALICE, "hello from beta")
        assert reply.chat.type == "private"
        with pytest.raises(Forbidden, match="can't initiate conversation"):
            await beta.send_message(BOB, "cold call")
        with pytest.raises(Forbidden, match="bot can't send messages to bots"):
            await beta.send_message(ALPHA, "hey bot")
    to_beta = fake.privates[(ALICE, BETA)].messages.values()
    assert [m["text"] for m in to_beta] == ["hello from beta"]
    assert queued(fake, TOKEN_A)[-1]["message"]["text"] == "hi alpha"  # not beta's reply


async def test_service_messages_reach_every_member_bot(fake: FakeTelegram) -> None:
    fake.add_bot("1003:gamma", 1003, "gamma_bot")  # no member
    titled = await fake.service(GROUP, ALICE, new_chat_title="renamed")
    assert texts(queued(fake, TOKEN_A)) == [None]
    assert queued(fake, TOKEN_B)[0]["message"]["new_chat_title"] == "renamed"
    assert queued(fake, "1003:gamma") == []
    answer = await fake.user_says(GROUP, BOB, "nice", reply_to=titled["message_id"])
    pinned = await fake.service(GROUP, ALICE, pinned_message=answer)
    assert "reply_to_message" not in pinned["pinned_message"]  # nested only one level
    async with ptb_bot(fake) as bot:
        updates = await bot.get_updates()
    assert updates[-1].message is not None
    assert updates[-1].message.message_id == pinned["message_id"]
    assert updates[-1].message.pinned_message.message_id == answer["message_id"]  # type: ignore[union-attr]


async def test_anonymous_admin_message(fake: FakeTelegram) -> None:
    fake.bots[TOKEN_A].privacy = False
    msg = await fake.user_says(GROUP, ALICE, "we, the admins", sender_chat_id=GROUP)
    assert msg["from"]["id"] == GROUP_ANONYMOUS_BOT_ID
    async with ptb_bot(fake) as bot:
        [update] = await bot.get_updates()
    assert update.message is not None
    assert update.message.sender_chat is not None and update.message.sender_chat.id == GROUP
    assert update.message.from_user is not None
    assert update.message.from_user.username == "GroupAnonymousBot"
    assert update.message.from_user.is_bot


# -- getUpdates --------------------------------------------------------------------------


async def test_get_updates_offset_confirms(fake: FakeTelegram) -> None:
    fake.bots[TOKEN_A].privacy = False
    for text in ("one", "two", "three"):
        await fake.user_says(GROUP, ALICE, text)
    async with ptb_bot(fake) as bot:
        updates = await bot.get_updates()
        assert [u.message.text for u in updates] == ["one", "two", "three"]  # type: ignore[union-attr]
        ids = [u.update_id for u in updates]
        assert ids == sorted(ids) and len(set(ids)) == 3
        again = await bot.get_updates(offset=ids[1])
        assert [u.update_id for u in again] == ids[1:]
        assert [u.update_id for u in await bot.get_updates(offset=ids[-1] + 1)] == []
        assert fake.bots[TOKEN_A].pending == []
        for i in range(101):
            await fake.user_says(GROUP, ALICE, str(i))
        first = await bot.get_updates(offset=ids[-1] + 1)
        assert [u.message.text for u in first] == [str(i) for i in range(100)]  # type: ignore[union-attr]
        rest = await bot.get_updates(offset=first[-1].update_id + 1)
        assert [u.message.text for u in rest] == ["100"]  # type: ignore[union-attr]


async def test_long_poll_wakes_up_on_a_new_update(fake: FakeTelegram) -> None:
    fake.bots[TOKEN_A].privacy = False
    async with ptb_bot(fake) as bot:
        loop = asyncio.get_running_loop()
        started = loop.time()
        poll = asyncio.create_task(bot.get_updates(timeout=20))
        await fake.wait_until(lambda: fake.bots[TOKEN_A].polling)
        await fake.user_says(GROUP, ALICE, "wake up")
        updates = await asyncio.wait_for(poll, 5)
        assert loop.time() - started < 5
        assert [u.message.text for u in updates] == ["wake up"]  # type: ignore[union-attr]
        empty = await bot.get_updates(offset=updates[-1].update_id + 1, timeout=0)
        assert empty == ()


async def test_allowed_updates_filters(fake: FakeTelegram) -> None:
    fake.bots[TOKEN_A].privacy = False
    async with ptb_bot(fake) as bot:
        assert await bot.get_updates(allowed_updates=["callback_query"]) == ()
        await fake.user_says(GROUP, ALICE, "not wanted")
        assert await bot.get_updates() == ()  # the setting sticks
        await bot.get_updates(allowed_updates=[])  # back to the default set
        await fake.user_says(GROUP, ALICE, "wanted")
        assert [u.message.text for u in await bot.get_updates()] == ["wanted"]  # type: ignore[union-attr]


# -- webhooks ------------------------------------------------------------------------------


class Receiver:
    """A webhook endpoint on a free port: records each POST, answers from `statuses`."""

    def __init__(self, *statuses: int) -> None:
        self.statuses = list(statuses)
        self.received: list[tuple[dict[str, Any], str | None]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.received.append(
            (await request.json(), request.headers.get("X-Telegram-Bot-Api-Secret-Token"))
        )
        return web.Response(status=self.statuses.pop(0) if self.statuses else 200)

    async def __aenter__(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self.runner = web.AppRunner(app, shutdown_timeout=1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}/hook"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


async def test_webhook_delivery_in_order_with_secret(fake: FakeTelegram) -> None:
    fake.bots[TOKEN_A].privacy = False
    async with Receiver() as hook, ptb_bot(fake) as bot:
        assert await bot.set_webhook(hook.url, secret_token="s3cret_-X")
        with pytest.raises(Conflict, match="webhook is active"):
            await bot.get_updates()
        await fake.user_says(GROUP, ALICE, "one")
        await fake.user_says(GROUP, ALICE, "two")
        await fake.wait_until(lambda: len(fake.webhook_attempts) == 2)
        assert [r[0]["message"]["text"] for r in hook.received] == ["one", "two"]
        assert {r[1] for r in hook.received} == {"s3cret_-X"}
        assert [a.status for a in fake.webhook_attempts] == [200, 200]
        assert fake.bots[TOKEN_A].pending == []
        assert await bot.delete_webhook()
        await fake.user_says(GROUP, ALICE, "three")
        assert [u.message.text for u in await bot.get_updates()] == ["three"]  # type: ignore[union-attr]
    assert len(hook.received) == 2


async def test_webhook_retries_then_drops(fake: FakeTelegram) -> None:
    fake.bots[TOKEN_A].privacy = False
    async with Receiver(500, 200, 503, 503, 503) as hook, ptb_bot(fake) as bot:
        await bot.set_webhook(hook.url)
        await fake.user_says(GROUP, ALICE, "retried")
        await fake.user_says(GROUP, ALICE, "dropped")
        await fake.user_says(GROUP, ALICE, "after")
        await fake.wait_until(lambda: len(fake.webhook_attempts) == 6)
        assert [(a.update["message"]["text"], a.status) for a in fake.webhook_attempts] == [
            ("retried", 500),
            ("retried", 200),
            ("dropped", 503),
            ("dropped", 503),
            ("dropped", 503),
            ("after", 200),
        ]
        assert fake.bots[TOKEN_A].pending == []
        assert fake.webhook_attempts[0].secret_token is None
        assert {r[1] for r in hook.received} == {None}


async def test_webhook_connection_error_is_recorded(fake: FakeTelegram) -> None:
    fake.bots[TOKEN_A].privacy = False
    async with Receiver() as hook:
        url = hook.url  # closed again: nothing listens there any more
    async with ptb_bot(fake) as bot:
        await bot.set_webhook(url)
        await fake.user_says(GROUP, ALICE, "lost")
        await fake.wait_until(lambda: len(fake.webhook_attempts) == 3)
    assert {a.status for a in fake.webhook_attempts} == {None}


async def test_webhook_parameters_are_validated(fake: FakeTelegram) -> None:
    async with ptb_bot(fake) as bot:
        with pytest.raises(BadRequest, match="unallowed characters"):
            await bot.set_webhook("http://127.0.0.1:1/hook", secret_token="no spaces")
        with pytest.raises(BadRequest, match="too long"):
            await bot.set_webhook("http://127.0.0.1:1/hook", secret_token="a" * 257)
        with pytest.raises(BadRequest, match=r"(?i)bad webhook"):
            await bot.set_webhook("ftp://example.org/hook")
    assert fake.bots[TOKEN_A].webhook is None


# -- topics ----------------------------------------------------------------------------------


async def test_forum_topics(fake: FakeTelegram) -> None:
    fake.bots[TOKEN_B].privacy = False
    await fake.user_says(FORUM, ALICE, "in general")
    topic = fake.create_topic(FORUM, ALICE, "Ideas")
    assert topic == fake.messages(FORUM)[-1]["message_id"] == 2
    await fake.user_says(FORUM, BOB, "an idea", thread_id=topic)
    async with ptb_bot(fake, TOKEN_B) as beta, ptb_bot(fake) as alpha:
        general, created, idea = [u.message for u in await beta.get_updates()]
        assert general is not None and general.message_thread_id is None
        assert created is not None and created.forum_topic_created is not None
        assert created.forum_topic_created.name == "Ideas"
        assert idea is not None
        assert idea.message_thread_id == topic and idea.is_topic_message
        assert idea.reply_to_message is not None
        assert idea.reply_to_message.message_id == topic
        assert idea.reply_to_message.forum_topic_created is not None
        answer = await alpha.send_message(FORUM, "noted", message_thread_id=topic)
        assert answer.message_thread_id == topic and answer.is_topic_message
        assert answer.reply_to_message is not None and answer.reply_to_message.message_id == topic
        follow = await alpha.send_message(FORUM, "and", reply_to_message_id=idea.message_id)
        assert follow.message_thread_id == topic  # a reply lands in the replied topic
        assert follow.reply_to_message is not None
        assert follow.reply_to_message.message_id == idea.message_id
        with pytest.raises(BadRequest, match="Message thread not found"):
            await alpha.send_message(FORUM, "lost", message_thread_id=999)
    assert fake.sent[0].thread_id == topic


async def test_a_topic_a_bot_created_counts_as_replies_to_it(fake: FakeTelegram) -> None:
    """Telegram's topic messages reply (implicitly) to the topic's creation message, so a
    bot in privacy mode gets every message in a topic it created, and none elsewhere."""
    ours = fake.create_topic(FORUM, BETA, "beta's topic")
    theirs = fake.create_topic(FORUM, ALICE, "alice's topic")
    inside = await fake.user_says(FORUM, BOB, "in beta's topic", thread_id=ours)
    outside = await fake.user_says(FORUM, BOB, "in alice's topic", thread_id=theirs)
    got = [u["message"]["message_id"] for u in queued(fake, TOKEN_B)]
    assert got == [theirs, inside["message_id"]]  # its own creation message is not delivered
    assert outside["message_id"] not in got


# -- chat members ----------------------------------------------------------------------------


async def test_get_chat_member_kinds(fake: FakeTelegram) -> None:
    fake.add_member(GROUP, BETA, "administrator")
    fake.add_user(99, "Stranger")
    fake.add_user(66, "Troll")
    fake.add_member(GROUP, 66, "kicked")
    async with ptb_bot(fake) as bot:
        owner = await bot.get_chat_member(GROUP, ALICE)
        admin = await bot.get_chat_member(GROUP, BETA)
        member = await bot.get_chat_member(GROUP, BOB)
        stranger = await bot.get_chat_member(GROUP, 99)
        banned = await bot.get_chat_member(GROUP, 66)
        with pytest.raises(BadRequest, match="Chat not found"):
            await bot.get_chat_member(-42, ALICE)
        with pytest.raises(BadRequest, match="User not found"):
            await bot.get_chat_member(GROUP, 12345)
    assert isinstance(owner, telegram.ChatMemberOwner) and owner.user.id == ALICE
    assert isinstance(admin, telegram.ChatMemberAdministrator)
    assert admin.user.is_bot and admin.can_delete_messages and not admin.can_promote_members
    assert isinstance(member, telegram.ChatMemberMember) and member.status == "member"
    assert isinstance(stranger, telegram.ChatMemberLeft)
    assert isinstance(banned, telegram.ChatMemberBanned)


# -- errors --------------------------------------------------------------------------------


async def test_errors_surface_as_ptb_exceptions(fake: FakeTelegram) -> None:
    fake.add_chat(-999, "group", "without the bots")
    async with ptb_bot(fake) as bot:
        with pytest.raises(BadRequest, match="Message text is empty"):
            await bot.send_message(GROUP, "   ")
        with pytest.raises(BadRequest, match="Message is too long"):
            await bot.send_message(GROUP, "x" * 4097)
        assert (await bot.send_message(GROUP, "😀" * 2048)).text == "😀" * 2048  # 4096 units
        with pytest.raises(BadRequest, match="Message is too long"):
            await bot.send_message(GROUP, "😀" * 2048 + "x")
        with pytest.raises(BadRequest, match="Chat not found"):
            await bot.send_message(-4242, "anyone?")
        with pytest.raises(Forbidden, match="bot is not a member of the group chat"):
            await bot.send_message(-999, "let me in")
        with pytest.raises(EndPointNotFound):
            await bot.do_api_request("noSuchMethod")
    with pytest.raises(InvalidToken):
        async with ptb_bot(fake, "9999:unknown"):
            pass
    statuses = [(c.method, c.status) for c in fake.calls]
    assert ("noSuchMethod", 404) in statuses and ("getMe", 401) in statuses
    assert [s.text for s in fake.sent] == ["😀" * 2048]


@pytest.mark.filterwarnings("ignore::telegram.warnings.PTBDeprecationWarning")  # retry_after
async def test_fail_next(fake: FakeTelegram) -> None:
    fake.fail_next("sendMessage", 429, retry_after=7)
    fake.fail_next("sendMessage", 429, retry_after=7)
    fake.fail_next("sendChatAction", 500, "Internal Server Error")
    async with ptb_bot(fake) as bot:
        for _ in range(2):
            with pytest.raises(RetryAfter, match="Retry in 7 seconds"):
                await bot.send_message(GROUP, "spam")
        assert (await bot.send_message(GROUP, "finally")).text == "finally"
        with pytest.raises(NetworkError, match="Internal Server Error"):
            await bot.send_chat_action(GROUP, "typing")
        assert await bot.send_chat_action(GROUP, "typing")
    assert [s.text for s in fake.sent] == ["finally"]
    assert [c.status for c in fake.calls_of("sendMessage")] == [429, 429, 200]


# -- entities ------------------------------------------------------------------------------


async def test_utf16_offsets_after_an_emoji(fake: FakeTelegram) -> None:
    msg = await fake.user_says(GROUP, ALICE, "😀 hi @beta_bot /go@alpha_bot")
    assert msg["entities"] == [
        {"offset": 6, "length": 9, "type": "mention"},
        {"offset": 16, "length": 13, "type": "bot_command"},
    ]
    async with ptb_bot(fake, TOKEN_B) as beta:
        [update] = await beta.get_updates()
        assert update.message is not None
        assert list(update.message.parse_entities().values()) == ["@beta_bot", "/go@alpha_bot"]
        sent = await beta.send_message(GROUP, "🎉🎉 /done")
    assert sent.entities[0].offset == 5 and sent.entities[0].length == 5
    assert utf16_len("😀") == 2


def test_entity_detection_rules() -> None:
    found = find_entities("/start x/no a@b.cc @abc @abcd /cmd@bot_name!")
    assert [(e["type"], e["offset"], e["length"]) for e in found] == [
        ("bot_command", 0, 6),
        ("mention", 24, 5),
        ("bot_command", 30, 13),
    ]


async def test_what_the_fake_does_not_implement_is_refused(fake: FakeTelegram) -> None:
    """parse_mode, keyboards, other methods' options: a 400 naming them, never ignored."""
    async with ptb_bot(fake) as bot:
        with pytest.raises(BadRequest, match=r"(?i)does not implement sendMessage's parse_mode"):
            await bot.send_message(GROUP, "<b>bold</b>", parse_mode="HTML")
        with pytest.raises(BadRequest, match=r"(?i)does not implement getUpdates's limit"):
            await bot.get_updates(limit=1)
        with pytest.raises(InvalidToken, match="Not Found"):  # PTB's reading of a 404
            await bot.get_webhook_info()
        chat_scope = telegram.BotCommandScopeChat(GROUP)
        with pytest.raises(BadRequest, match=r"(?i)implements the scopes"):
            await bot.set_my_commands([("help", "Show help")], scope=chat_scope)
    assert fake.sent == [] and fake.commands == {}


# -- chat actions and commands ---------------------------------------------------------------


async def test_chat_actions_and_commands(fake: FakeTelegram) -> None:
    topic = fake.create_topic(FORUM, ALICE, "t")
    async with ptb_bot(fake) as bot:
        assert await bot.send_chat_action(FORUM, "typing", message_thread_id=topic)
        with pytest.raises(BadRequest):
            await bot.send_chat_action(FORUM, "dancing")
        admins = telegram.BotCommandScopeAllChatAdministrators()
        assert await bot.set_my_commands([("help", "Show help")])
        assert await bot.set_my_commands([("ban", "Ban someone")], scope=admins)
        with pytest.raises(BadRequest):
            await bot.set_my_commands([("Bad Name", "x")])
    [action] = fake.chat_actions
    assert (action.chat_id, action.action, action.thread_id) == (FORUM, "typing", topic)
    assert fake.commands_for(TOKEN_A) == [{"command": "help", "description": "Show help"}]
    assert fake.commands_for(TOKEN_A, {"type": "all_chat_administrators"}) == [
        {"command": "ban", "description": "Ban someone"}
    ]
    assert fake.commands_for(TOKEN_A, {"type": "all_group_chats"}) is None


# -- a real Application polling ------------------------------------------------------------


async def test_application_polling_round_trip(fake: FakeTelegram) -> None:
    seen: list[telegram.Message] = []
    ready = asyncio.Event()

    async def record(update: telegram.Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.effective_message is not None
        seen.append(update.effective_message)
        if len(seen) == 2:
            ready.set()

    await fake.user_says(GROUP, ALICE, "/start@beta_bot")  # queued before the app starts
    app: Application[Any, Any, Any, Any, Any, Any] = (
        ApplicationBuilder()
        .token(TOKEN_B)
        .base_url(f"{fake.api_base}/bot")
        .base_file_url(f"{fake.api_base}/file/bot")
        .request(fast_request())
        .get_updates_request(fast_request())
        .build()
    )
    app.add_handler(MessageHandler(filters.ALL, record))
    async with app:
        assert app.updater is not None
        await app.updater.start_polling(poll_interval=0)
        await app.start()
        await fake.user_says(GROUP, BOB, "hey @beta_bot")
        await fake.user_says(GROUP, BOB, "not for beta")
        await asyncio.wait_for(ready.wait(), 5)
        await app.bot.send_message(GROUP, "hello from the app")
        await app.updater.stop()
        await app.stop()
    assert [m.text for m in seen] == ["/start@beta_bot", "hey @beta_bot"]
    methods = [c.method for c in fake.calls if c.token == TOKEN_B]
    assert methods[:3] == ["getMe", "deleteWebhook", "getUpdates"]
    last = fake.calls_of("getUpdates", TOKEN_B)[-1]
    assert last.params["timeout"] == "0"  # Updater.stop confirms the offset without waiting
    assert fake.bots[TOKEN_B].pending == []
    assert fake.sent[-1].text == "hello from the app"


# -- aiogram 3 ---------------------------------------------------------------------------


async def test_aiogram_polls_answers_and_stops(fake: FakeTelegram) -> None:
    """A real aiogram Dispatcher polling through `aiogram_session`: start-up, long
    polling, answers in the message's topic and replies, the long poll abandoned at
    stop."""
    dp = Dispatcher()
    seen: list[str | None] = []

    @dp.message(F.text)
    async def echo(message: AiogramMessage) -> None:
        seen.append(message.text)
        await message.reply(f"heard: {message.text}")

    fake.bots[TOKEN_B].privacy = False
    topic = fake.create_topic(FORUM, ALICE, "aiogram")
    bot = Bot(TOKEN_B, session=aiogram_session(fake.api_base))
    polling = asyncio.create_task(dp.start_polling(bot, handle_signals=False))
    try:
        await fake.wait_until(lambda: fake.bots[TOKEN_B].polling > 0, what="polling")
        general = await fake.user_says(GROUP, ALICE, "hello")
        in_topic = await fake.user_says(FORUM, BOB, "in the topic", thread_id=topic)
        first, second = await fake.wait_sent(2)
    finally:
        await dp.stop_polling()
        await polling
    assert sorted(seen, key=str) == ["hello", "in the topic"]
    by_chat = {s.chat_id: s for s in (first, second)}
    assert (by_chat[GROUP].reply_to, by_chat[GROUP].thread_id) == (general["message_id"], None)
    assert (by_chat[FORUM].reply_to, by_chat[FORUM].thread_id) == (in_topic["message_id"], topic)
    assert by_chat[FORUM].text == "heard: in the topic"
    calls = [c for c in fake.calls if c.token == TOKEN_B]
    assert [c.method for c in calls[:2]] == ["getMe", "getUpdates"]  # no deleteWebhook
    assert calls[1].params == {"timeout": "10", "allowed_updates": '["message"]'}
    assert fake.calls_of("getUpdates", TOKEN_B)[-1].status == 499  # stop_polling hung up


async def test_aiogram_gets_its_own_exceptions(fake: FakeTelegram) -> None:
    """Form fields as aiogram sends them; the fake's errors as aiogram's exceptions,
    an unimplemented parameter named in a 400."""
    fake.add_chat(-999, "group", "without the bots")
    bot = Bot(TOKEN_A, session=aiogram_session(fake.api_base))
    nobody = Bot("9999:unknown", session=aiogram_session(fake.api_base))
    try:
        me = await bot.me()
        assert (me.id, me.username, me.is_bot) == (ALPHA, "alpha_bot", True)
        sent = await bot.send_message(GROUP, "hi", message_thread_id=None)
        assert sent.from_user is not None and sent.from_user.id == ALPHA
        assert (sent.chat.id, sent.text) == (GROUP, "hi")
        assert fake.calls_of("sendMessage")[-1].params == {"chat_id": str(GROUP), "text": "hi"}
        with pytest.raises(TelegramBadRequest, match="does not implement sendMessage's parse_mode"):
            await bot.send_message(GROUP, "<b>bold</b>", parse_mode="HTML")
        with pytest.raises(TelegramForbiddenError, match="not a member of the group chat"):
            await bot.send_message(-999, "let me in")
        fake.fail_next("sendMessage", 429, retry_after=3)
        with pytest.raises(TelegramRetryAfter) as retry:
            await bot.send_message(GROUP, "spam")
        assert retry.value.retry_after == 3
        with pytest.raises(TelegramUnauthorizedError):
            await nobody.get_me()
    finally:
        await bot.session.close()
        await nobody.session.close()
    assert [s.text for s in fake.sent] == ["hi"]
