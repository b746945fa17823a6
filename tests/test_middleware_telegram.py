"""The python-telegram-bot middleware (botbouncer.telegram) end to end: real
PTB Applications, written as PTB's quickstart does, plus one `guard(...)`
line, polling the fake Bot API of tests/fakes/telegram/. The echo bot is
docs/examples/telegram_bot.py's, which is also run as a program.

Decisions are awaited through the decision log lines the gateway writes, the
platform side through the fake's recorded sends: nothing sleeps.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import telegram
from telegram import InputMediaPhoto, Update
from telegram.ext import (
    Application,
    ApplicationBuilder,
    CommandHandler,
    ContextTypes,
    MessageHandler,
    TypeHandler,
    filters,
)
from telegram.request import BaseRequest, RequestData

from botbouncer import Bouncer, ConfigError
from botbouncer.telegram import GROUP as GUARD_GROUP
from botbouncer.telegram import TelegramGuard, guard
from gateway.store import Limits, Store
from gateway.store.redis import RedisStore
from tests.conftest import StoreFactory
from tests.daemons import running
from tests.decisions import Decisions
from tests.examples import example, program, run_once
from tests.fakes.telegram import FakeTelegram, SentMessage, fast_request
from tests.redis_server import free_port

pytestmark = pytest.mark.timeout(60)

ALICE = 1001
ANN, BEN, ALPHA = 7101, 7102, 7001  # ann and ben are wrapped; alpha is fronted by the daemon
TOKEN_ANN, TOKEN_BEN, TOKEN_ALPHA = "7101:ann-secret", "7102:ben-secret", "7001:alpha-secret"
GROUP = -1001700  # a forum supergroup
WARNING = "Bot turn limit reached (4/4)"


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as f:
        # bot-to-bot mode, administrators, privacy off: each reads the whole group
        f.add_bot(TOKEN_ANN, ANN, "ann_bot", "Ann", bot_to_bot=True, privacy=False)
        f.add_bot(TOKEN_BEN, BEN, "ben_bot", "Ben", bot_to_bot=True, privacy=False)
        f.add_bot(TOKEN_ALPHA, ALPHA, "alpha_bot", "Alpha", bot_to_bot=True)
        f.add_user(ALICE, "Alice", "alice")
        f.add_chat(GROUP, "supergroup", "the group", is_forum=True)
        f.add_member(GROUP, ALICE)
        for b in (ANN, BEN):
            f.add_member(GROUP, b, "administrator")
        f.add_member(GROUP, ALPHA)
        yield f


def config(name: str, **policy: Any) -> dict[str, Any]:
    """A decide bot that answers every message, people's and bots'."""
    bot = {
        "name": name,
        "platform": "telegram",
        "mode": "decide",
        "bot_messages": "all",
        "respond_to": "all",
        "turns": {"soft_limit": 4, "hard_limit": 10},
        **policy,
    }
    return {"bots": [bot]}


def chat(thread: int | None = None) -> str:
    return f"telegram:{GROUP}" if thread is None else f"telegram:{GROUP}:{thread}"


def echo_bot(
    fake: FakeTelegram,
    token: str,
    bouncer: Bouncer,
    *,
    warnings: bool = True,
    concurrent: bool = False,
) -> Application[Any, Any, Any, Any, Any, Any]:
    """PTB's quickstart echo bot with the guard, docs/examples/telegram_bot.py's
    `build`, against the fake."""
    builder = (
        ApplicationBuilder()
        .base_url(f"{fake.api_base}/bot")
        .request(fast_request())
        .get_updates_request(fast_request())
        .concurrent_updates(concurrent)
    )
    app: Application[Any, Any, Any, Any, Any, Any] = example("telegram_bot").build(
        token, bouncer, builder, warnings=warnings
    )
    return app


def bot_with(
    fake: FakeTelegram, token: str, bouncer: Bouncer, *handlers: Any
) -> Application[Any, Any, Any, Any, Any, Any]:
    app = (
        ApplicationBuilder()
        .token(token)
        .base_url(f"{fake.api_base}/bot")
        .request(fast_request())
        .get_updates_request(fast_request())
        .build()
    )
    guard(app, bouncer)
    for handler in handlers:
        app.add_handler(handler)
    return app


@asynccontextmanager
async def polling(*apps: Application[Any, Any, Any, Any, Any, Any]) -> AsyncIterator[None]:
    """Each application initialized, started and polling; stopped in reverse."""
    async with AsyncExitStack() as stack:
        for app in apps:
            await stack.enter_async_context(app)  # initialize / shutdown
            await app.start()
            stack.push_async_callback(app.stop)
            assert app.updater is not None
            await app.updater.start_polling(poll_interval=0)
            stack.push_async_callback(app.updater.stop)
        yield


@asynccontextmanager
async def ann_and_ben(stores: StoreFactory, fake: FakeTelegram, **kw: Any) -> AsyncIterator[Store]:
    """ann and ben, two echo bots, each with its own Bouncer, on one shared
    store (two handles on it: on Redis, two clients), polling; ben handles
    its updates concurrently, ann one after the other."""
    store, other = await stores(2)
    async with (
        Bouncer(config("ann"), platform="telegram", store=store) as b1,
        Bouncer(config("ben"), platform="telegram", store=other) as b2,
        polling(
            echo_bot(fake, TOKEN_ANN, b1, **kw),
            echo_bot(fake, TOKEN_BEN, b2, concurrent=True, **kw),
        ),
    ):
        yield store


async def until(decisions: Decisions, predicate: Callable[[], Any], what: str) -> Any:
    """Wait for a decision line that makes `predicate` true."""
    try:
        async with asyncio.timeout(10), decisions.changed:
            return await decisions.changed.wait_for(predicate)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def decided(
    decisions: Decisions, message_id: int, bot: int, **fields: Any
) -> Callable[[], dict[str, Any] | None]:
    def find() -> dict[str, Any] | None:
        return next(
            (
                d
                for d in decisions.seen
                if d["id"] == str(message_id)
                and d["bot"] == str(bot)
                and all(d[k] == v for k, v in fields.items())
            ),
            None,
        )

    return find


def in_chat(fake: FakeTelegram, key: str) -> list[SentMessage]:
    """What bots sent in one chat (a topic: `chat(thread)`)."""
    return [s for s in fake.sent if chat(s.thread_id) == key]


def warnings_in(sent: list[SentMessage]) -> list[SentMessage]:
    return [s for s in sent if "limit reached" in s.text]


async def quiet(
    fake: FakeTelegram,
    decisions: Decisions,
    key: str,
    bots: tuple[int, ...],
    people: list[int],
    *,
    warnings: bool = True,
) -> list[SentMessage]:
    """Wait until the bots in chat `key` have stopped: every message there,
    the people's (`people`: their ids) and the bots', was decided on by each
    bot that receives it, and every `reply` (and, with `warnings`, `warn`)
    decision was answered. Returns what the bots sent there."""
    while True:
        sent = in_chat(fake, key)
        for said in people:
            for b in bots:
                await decisions.wait(said, b)
        for s in sent:
            for b in bots:
                if b != s.bot_user_id:
                    await decisions.wait(s.message["message_id"], b)
        acted = ("reply", "warn") if warnings else ("reply",)
        expected = sum(1 for d in decisions.seen if d["chat"] == key and d["action"] in acted)
        await fake.wait_until(
            lambda: len(in_chat(fake, key)) >= expected,  # noqa: B023 - awaited right here
            what=f"{expected} messages in {key}",
        )
        if len(in_chat(fake, key)) == len(sent):
            assert len(sent) == expected
            return sent


async def status(store: Store, key: str, bot: int) -> tuple[int, int]:
    """(soft, rate slots used by `bot`) in chat `key`."""
    s = await store.status(key, str(bot), Limits())
    return s.soft, s.rate_used


# -- two wrapped bots -------------------------------------------------------------------


async def test_two_wrapped_bots_stop_at_the_soft_limit_with_one_warning(
    fake: FakeTelegram, stores: StoreFactory, decisions: Decisions
) -> None:
    """ann and ben echo every message, each other's too, each with its own
    Bouncer on one shared store: they stop at the soft limit, one of them
    posts the one warning, and every message is counted once."""
    async with ann_and_ben(stores, fake) as store:
        said = await fake.user_says(GROUP, ALICE, "hello bots")
        await quiet(fake, decisions, chat(), (ANN, BEN), [said["message_id"]])
    sent = in_chat(fake, chat())  # all of it: both bots stopped, done with every update
    [warning] = warnings_in(sent)
    assert WARNING in warning.text
    assert (warning.reply_to, warning.thread_id) == (None, None)  # plain, in the chat
    replies = [s for s in sent if s is not warning]
    assert len(replies) == 4  # the soft limit
    assert {s.text for s in replies} == {"hello bots"}
    assert {s.bot_user_id for s in replies} == {ANN, BEN}
    assert (await status(store, chat(), ANN))[0] == 5  # 4 replies + the warning
    # the warned-about message reached no handler: nobody answered it
    [warned] = [d for d in decisions.seen if d["action"] == "warn"]
    assert str(warning.bot_user_id) == warned["bot"]
    assert not [s for s in sent if s.reply_to == int(warned["id"])]


async def test_a_person_resumes_them(
    fake: FakeTelegram, stores: StoreFactory, decisions: Decisions
) -> None:
    async with ann_and_ben(stores, fake) as store:
        first = await fake.user_says(GROUP, ALICE, "hello bots")
        before = await quiet(fake, decisions, chat(), (ANN, BEN), [first["message_id"]])
        assert len(warnings_in(before)) == 1
        again = await fake.user_says(GROUP, ALICE, "carry on")
        for b in (ANN, BEN):
            seen = await decisions.wait(again["message_id"], b)
            assert (seen["turn"], seen["action"], seen["soft"]) == ("reset", "reply", 0)
        said = [first["message_id"], again["message_id"]]
        await quiet(fake, decisions, chat(), (ANN, BEN), said)
    resumed = in_chat(fake, chat())[len(before) :]
    answers = [s for s in resumed if s.reply_to == again["message_id"]]
    assert sorted(s.bot_user_id for s in answers) == [ANN, BEN]
    assert {s.text for s in answers} == {"carry on"}
    assert len(resumed) == 5 and len(warnings_in(resumed)) == 1  # the limit again, warned
    assert (await status(store, chat(), ANN))[0] == 5


async def test_a_forum_topic_is_counted_on_its_own(
    fake: FakeTelegram, stores: StoreFactory, decisions: Decisions
) -> None:
    async with ann_and_ben(stores, fake) as store:
        said = await fake.user_says(GROUP, ALICE, "hello bots")
        general = await quiet(fake, decisions, chat(), (ANN, BEN), [said["message_id"]])
        assert len(warnings_in(general)) == 1
        topic = fake.create_topic(GROUP, ALICE, "side room")
        inside = await fake.user_says(GROUP, ALICE, "hello in here", thread_id=topic)
        await quiet(fake, decisions, chat(topic), (ANN, BEN), [inside["message_id"]])
    # the General topic's limit holds nothing up in the topic: its own count and warning
    sent = in_chat(fake, chat(topic))
    assert len(sent) == 5
    [warning] = warnings_in(sent)
    assert warning.thread_id == topic
    assert (await status(store, chat(topic), ANN))[0] == 5
    assert in_chat(fake, chat()) == general
    assert (await status(store, chat(), ANN))[0] == 5  # untouched, not reset


async def test_warnings_false_posts_no_warning(
    fake: FakeTelegram, stores: StoreFactory, decisions: Decisions
) -> None:
    async with ann_and_ben(stores, fake, warnings=False) as store:
        said = await fake.user_says(GROUP, ALICE, "hello bots")
        await quiet(fake, decisions, chat(), (ANN, BEN), [said["message_id"]], warnings=False)
    sent = in_chat(fake, chat())
    assert len(sent) == 4 and warnings_in(sent) == []
    [warned] = [d for d in decisions.seen if d["action"] == "warn"]
    assert not [s for s in sent if s.reply_to == int(warned["id"])]
    assert (await status(store, chat(), ANN))[0] == 4


# -- a wrapped bot and a fronted one ----------------------------------------------------


async def test_a_wrapped_bot_and_a_fronted_bot_share_one_count(
    fake: FakeTelegram, redis_url: str, key_prefix: str, decisions: Decisions
) -> None:
    """ann (wrapped, its Bouncer on Redis) and alpha (fronted by the daemon,
    echo backend) answer each other on one Redis: each message is counted
    once, by its sender when sent; the other, receiving it, finds it counted."""
    fronted = {
        "name": "alpha",
        "platform": "telegram",
        "token": TOKEN_ALPHA,
        "api_base": fake.api_base,
        "backend": {"type": "echo"},
        "bot_messages": "all",
        "turns": {"soft_limit": 4, "hard_limit": 10},
    }
    fake.add_member(GROUP, ALPHA, "administrator")
    fake.bot(ALPHA).privacy = False  # with bot-to-bot mode: reads ann's messages too
    store = RedisStore.from_url(redis_url, prefix=key_prefix, context_size=8)
    try:
        async with (
            running(redis_url, key_prefix, fronted) as daemon,
            Bouncer(config("ann"), platform="telegram", store=store) as b1,
            polling(echo_bot(fake, TOKEN_ANN, b1)),
        ):
            said = await fake.user_says(GROUP, ALICE, "@alpha_bot hello")
            sent = await quiet(fake, decisions, chat(), (ANN, ALPHA), [said["message_id"]])
            await daemon.inflight.idle()
            assert {s.bot_user_id for s in sent} == {ANN, ALPHA}
            assert len(warnings_in(sent)) == 1
            # no turn counted twice: the counter is the number of bot messages
            assert (await status(store, chat(), ANN))[0] == len(sent) == 5
            # and each receiver found each message counted already, at its own place
            places = []
            for s in sent:
                receiver = ANN if s.bot_user_id == ALPHA else ALPHA
                places.append((await decisions.wait(s.message["message_id"], receiver))["soft"])
            assert sorted(places) == list(range(1, len(sent) + 1))
    finally:
        await store.close()


# -- tickets: released when nothing was sent ----------------------------------------------


async def test_a_handler_that_sends_nothing_or_raises_releases_its_slot(
    fake: FakeTelegram, decisions: Decisions
) -> None:
    """Rate cap 1: had the quiet handler or the failing one kept the slot,
    the next addressed message would not be answered."""
    errors: list[object] = []

    async def answer(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.message is not None and update.message.text is not None
        if "quiet" in update.message.text:
            return
        if "boom" in update.message.text:
            raise RuntimeError("boom")
        await update.message.reply_text("at your service")

    async def on_error(update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        errors.append(context.error)

    policy = {"respond_to": "mentions", "rate_cap": {"max_replies": 1}}
    async with Bouncer(config("ann", **policy), platform="telegram") as bouncer:
        app = bot_with(fake, TOKEN_ANN, bouncer, MessageHandler(filters.TEXT, answer))
        app.add_error_handler(on_error)
        async with polling(app):
            for text in ("@ann_bot be quiet", "@ann_bot boom"):
                said = await fake.user_says(GROUP, ALICE, text)
                await until(
                    decisions,
                    decided(decisions, said["message_id"], ANN, reason="backend_empty"),
                    f"{text!r} released",
                )
                assert await status(bouncer.store, chat(), ANN) == (0, 0)
            assert [str(e) for e in errors] == ["boom"]
            said = await fake.user_says(GROUP, ALICE, "@ann_bot hello")
            [reply] = await fake.wait_sent(1)
            assert (reply.text, reply.reply_to) == ("at your service", said["message_id"])
            # the cap is 1: the next one is not answered
            capped = await fake.user_says(GROUP, ALICE, "@ann_bot and again")
            seen = await decisions.wait(capped["message_id"], ANN)
            assert (seen["action"], seen["reason"]) == ("drop", "rate_capped")
            # (decided after the update before it was done with: the reply was counted)
            assert await status(bouncer.store, chat(), ANN) == (0, 1)  # alice reset it
            assert len(fake.sent) == 1


async def test_a_message_sent_outside_an_update_is_counted(
    fake: FakeTelegram, decisions: Decisions
) -> None:
    """A scheduled post (a job, a task of the bot's own) is this bot's turn;
    so is what a block=False handler sends after its update was processed
    (the ticket was released by then: the rate slot is back)."""
    gate = asyncio.Event()

    async def later(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.message is not None
        await gate.wait()
        await update.message.reply_text("sorry for the wait")

    policy = {"respond_to": "mentions"}
    async with Bouncer(config("ann", **policy), platform="telegram") as bouncer:
        app = bot_with(fake, TOKEN_ANN, bouncer, MessageHandler(filters.TEXT, later, block=False))
        async with polling(app):
            posted = await app.bot.send_message(GROUP, "the daily digest")
            await asyncio.create_task(app.bot.send_message(GROUP, "and a reminder"))
            assert await status(bouncer.store, chat(), ANN) == (2, 0)
            said = await fake.user_says(GROUP, ALICE, "@ann_bot take your time")
            await until(
                decisions,
                decided(decisions, said["message_id"], ANN, reason="backend_empty"),
                "the ticket released",
            )
            assert await status(bouncer.store, chat(), ANN) == (0, 0)  # a person reset it
            gate.set()
            sent = await fake.wait_sent(3)
            assert sent[2].text == "sorry for the wait"
            assert posted.message_id == sent[0].message["message_id"]
        # counted once sent: Application.stop waits for its block=False tasks
        assert await status(bouncer.store, chat(), ANN) == (1, 0)


async def test_a_bots_own_group_minus_1_handler_does_not_shadow_the_guard(
    fake: FakeTelegram, decisions: Decisions
) -> None:
    """PTB's pattern for an allow-list is a TypeHandler in group -1, and PTB
    runs one handler per group: the guard has a group of its own, before it."""
    checked: list[int] = []

    async def allow(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        checked.append(update.update_id)  # everyone is allowed

    policy = {"respond_to": "mentions", "rate_cap": {"max_replies": 1}}
    async with Bouncer(config("ann", **policy), platform="telegram") as bouncer:
        app = bot_with(
            fake, TOKEN_ANN, bouncer, MessageHandler(filters.TEXT, example("telegram_bot").echo)
        )
        app.add_handler(TypeHandler(Update, allow), -1)
        async with polling(app):
            first = await fake.user_says(GROUP, ALICE, "@ann_bot one")
            second = await fake.user_says(GROUP, ALICE, "@ann_bot two")
            seen = await decisions.wait(second["message_id"], ANN)
            assert (seen["action"], seen["reason"]) == ("drop", "rate_capped")
            [reply] = await fake.wait_sent(1)
            assert reply.reply_to == first["message_id"]
            assert len(checked) == 1  # the first: the second never got past the guard


async def test_a_bare_command_reaches_the_bots_command_handler(
    fake: FakeTelegram, decisions: Decisions
) -> None:
    # Breaks if a bare `/help` in a group is `not_addressed`: the guard kept
    # it from the bot's CommandHandler, which answers it without the guard,
    # so a guarded bot never answered the commands its users typed.
    helped: list[str] = []

    async def help_command(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.message is not None and update.message.text is not None
        helped.append(update.message.text)

    policy = {"respond_to": "mentions"}
    async with Bouncer(config("ann", **policy), platform="telegram") as bouncer:
        app = bot_with(fake, TOKEN_ANN, bouncer, CommandHandler("help", help_command))
        async with polling(app):
            said = await fake.user_says(GROUP, ALICE, "/help")
            seen = await decisions.wait(said["message_id"], ANN)
            assert seen["action"] == "reply", seen
            other = await fake.user_says(GROUP, ALICE, "/help@ben_bot")
            seen = await decisions.wait(other["message_id"], ANN)
            assert (seen["action"], seen["reason"]) == ("drop", "not_addressed")
            await fake.wait_until(lambda: helped, what="the help command handled")
    assert helped == ["/help"]


# -- what passes through ------------------------------------------------------------------


async def test_an_unreadable_message_reaches_the_handlers_undecided(
    fake: FakeTelegram, decisions: Decisions, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "botbouncer.telegram")
    seen: asyncio.Queue[Update] = asyncio.Queue()

    async def record(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        await seen.put(update)

    async with Bouncer(config("ann"), platform="telegram") as bouncer:
        app = bot_with(fake, TOKEN_ANN, bouncer, MessageHandler(filters.ALL, record))
        async with polling(app):
            odd = fake.message_payload(GROUP, ALICE, "hello")
            odd["chat"]["id"] = "not-a-number"
            await fake.push_raw(ANN, {"message": odd})
            async with asyncio.timeout(5):
                update = await seen.get()
            assert update.message is not None and update.message.text == "hello"
    assert decisions.seen == []
    [line] = [r for r in caplog.records if "passed through" in r.getMessage()]
    assert line.levelno == logging.INFO
    assert "its chat id is str 'not-a-number'" in line.getMessage()


async def test_when_the_store_is_down_nothing_is_answered(fake: FakeTelegram) -> None:
    called: list[Update] = []
    failed = asyncio.Event()

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno == logging.ERROR and "not handled" in record.getMessage():
                failed.set()

    async def answer(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        called.append(update)

    watch = Watch()
    logging.getLogger("botbouncer.telegram").addHandler(watch)
    down = RedisStore.from_url(f"redis://127.0.0.1:{free_port()}/0", call_timeout=1)
    try:
        async with Bouncer(config("ann"), platform="telegram", store=down) as bouncer:
            app = bot_with(fake, TOKEN_ANN, bouncer, MessageHandler(filters.TEXT, answer))
            async with polling(app):
                await fake.user_says(GROUP, ALICE, "@ann_bot hello?")
                async with asyncio.timeout(10):
                    await failed.wait()
        assert called == [] and fake.sent == []
    finally:
        logging.getLogger("botbouncer.telegram").removeHandler(watch)
        await down.close()


# -- the hooks in python-telegram-bot ---------------------------------------------------


class CannedApi(BaseRequest):
    """Telegram's answers for the methods besides sendMessage (the fake
    implements none of them): an album, copies, forwards, a chat action, an edit."""

    def __init__(self) -> None:
        self.next_id = 100
        self.calls: list[str] = []

    @property
    def read_timeout(self) -> float | None:
        return 1.0

    async def initialize(self) -> None:
        pass

    async def shutdown(self) -> None:
        pass

    def message(self, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {
            "message_id": self.next_id,
            "date": 0,
            "chat": {"id": int(params["chat_id"]), "type": "supergroup", "title": "the group"},
            "from": {"id": ANN, "is_bot": True, "first_name": "Ann", "username": "ann_bot"},
        }
        if "message_thread_id" in params:
            msg["message_thread_id"] = int(params["message_thread_id"])
            msg["is_topic_message"] = True
        return msg

    async def do_request(
        self,
        url: str,
        method: str,
        request_data: RequestData | None = None,
        read_timeout: Any = BaseRequest.DEFAULT_NONE,
        write_timeout: Any = BaseRequest.DEFAULT_NONE,
        connect_timeout: Any = BaseRequest.DEFAULT_NONE,
        pool_timeout: Any = BaseRequest.DEFAULT_NONE,
    ) -> tuple[int, bytes]:
        endpoint = url.rsplit("/", 1)[1]
        self.calls.append(endpoint)
        params = {} if request_data is None else request_data.parameters
        result: Any
        if endpoint == "getMe":
            result = {"id": ANN, "is_bot": True, "first_name": "Ann", "username": "ann_bot"}
        elif endpoint == "sendMediaGroup":
            result = [self.message(params) for _ in params["media"]]
        elif endpoint == "copyMessage":
            self.next_id += 1
            result = {"message_id": self.next_id}
        elif endpoint == "forwardMessage":
            result = self.message(params)
        elif endpoint in ("copyMessages", "forwardMessages"):
            result = []
            for _ in params["message_ids"]:
                self.next_id += 1
                result.append({"message_id": self.next_id})
        elif endpoint == "editMessageText":
            result = {**self.message(params), "message_id": int(params["message_id"])}
        else:  # sendChatAction
            result = True
        return 200, json.dumps({"ok": True, "result": result}).encode()


async def test_albums_copies_and_forwards_are_counted_but_not_edits_or_actions() -> None:
    """Every Bot API method passes Bot._post (a private method of PTB: this
    test fails if a send stops going through it), not only sendMessage."""
    api = CannedApi()
    app = ApplicationBuilder().token(TOKEN_ANN).request(api).updater(None).build()
    async with Bouncer(config("ann"), platform="telegram") as bouncer:
        guarded = guard(app, bouncer)
        assert isinstance(guarded, TelegramGuard)
        async with app:
            media = [InputMediaPhoto("https://example.org/1.jpg")] * 3
            await app.bot.send_media_group(GROUP, media, message_thread_id=5)
            await app.bot.copy_message(GROUP, from_chat_id=ALICE, message_id=1)
            await app.bot.copy_messages(GROUP, from_chat_id=ALICE, message_ids=[1, 2])
            await app.bot.forward_message(GROUP, from_chat_id=ALICE, message_id=1)
            await app.bot.forward_messages(GROUP, from_chat_id=ALICE, message_ids=[1, 2])
            await app.bot.send_chat_action(GROUP, "typing")
            await app.bot.edit_message_text("edited", GROUP, 101)
            await app.bot.copy_message("@somechannel", from_chat_id=ALICE, message_id=1)
        assert bouncer.bot_id == str(ANN)  # from getMe
        assert api.calls[1:] == [
            "sendMediaGroup",
            "copyMessage",
            "copyMessages",
            "forwardMessage",
            "forwardMessages",
            "sendChatAction",
            "editMessageText",
            "copyMessage",
        ]
        assert (await status(bouncer.store, chat(5), ANN))[0] == 3  # the album, in its topic
        assert (await status(bouncer.store, chat(), ANN))[0] == 6  # copies and forwards


def test_ptb_still_has_the_hooks_the_guard_uses() -> None:
    """The guard wraps two methods on the instance: Application.process_update
    (public) and Bot._post (private, named here so that a change of PTB fails
    this test by name): the update fetcher calls self.process_update, and
    every Bot API method self._post(endpoint, data, ...)."""
    params = list(inspect.signature(telegram.Bot._post).parameters)
    assert params[:3] == ["self", "endpoint", "data"]
    assert "self.process_update(update)" in inspect.getsource(Application)


async def test_guard_refuses_a_second_guard_and_another_platform() -> None:
    app = ApplicationBuilder().token(TOKEN_ANN).updater(None).build()
    async with Bouncer(config("ann"), platform="telegram") as bouncer:
        g = guard(app, bouncer)
        assert [h for h in app.handlers[GUARD_GROUP]] == [g.handler]
        with pytest.raises(ValueError, match="guarded already"):
            guard(app, bouncer)
    elsewhere = {"bots": [{"name": "d", "platform": "discord", "mode": "decide"}]}
    async with Bouncer(elsewhere) as bouncer:
        with pytest.raises(ConfigError, match="not telegram"):
            guard(ApplicationBuilder().token(TOKEN_BEN).updater(None).build(), bouncer)


# -- docs/examples/telegram_bot.py as a program -------------------------------------------

ANN_DECIDES = """\
bots:
  - name: ann
    platform: telegram
    mode: decide
store: {url: "memory://"}
"""
BROKEN = """\
bots:
  - name: ann
    platform: telegram
    mode: decide
    rate_cap: {max_replies: 0}
"""


@pytest.mark.parametrize(
    ("env", "config", "says"),
    [
        ({}, ANN_DECIDES, "set TELEGRAM_TOKEN to the bot's token"),
        ({"TELEGRAM_TOKEN": TOKEN_ANN}, BROKEN, "bots[0].rate_cap.max_replies: must be >= 1"),
        (
            {"TELEGRAM_TOKEN": TOKEN_ANN, "BOTBOUNCER_BOT": "bob"},
            ANN_DECIDES,
            "no bot named 'bob' (configured: ann)",
        ),
    ],
    ids=["no-token", "broken-config", "unknown-bot"],
)
def test_the_example_refuses_a_missing_token_or_a_bad_config_in_one_line(
    tmp_path: Path, env: dict[str, str], config: str, says: str
) -> None:
    """Exit 2 and one line on stderr that says what to change; the config is
    the default one, botbouncer.yml in the working directory."""
    run = run_once("telegram_bot", tmp_path, config, **env)
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == [f"telegram_bot.py: {says}"]


async def test_the_example_runs_as_a_program_and_stops_on_sigint(
    fake: FakeTelegram, tmp_path: Path
) -> None:
    """`main` for real: the guard keeps a message that does not address ann
    from the echo (respond_to: mentions, the default), the echo answers the
    one that does, and SIGINT stops it cleanly (post_shutdown closes the
    Bouncer)."""
    async with program(fake, tmp_path, "telegram_bot", ANN_DECIDES, TOKEN_ANN) as run:
        await run.polling(fake, ANN)
        await fake.user_says(GROUP, ALICE, "not for you")
        said = await fake.user_says(GROUP, ALICE, "@ann_bot hello")
        [reply] = await fake.wait_sent(1, timeout=10)
        assert (reply.bot_user_id, reply.text) == (ANN, "@ann_bot hello")
        assert reply.reply_to == said["message_id"]
    assert run.proc.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    assert "bot ann is on Telegram as @ann_bot" in run.stderr  # the guard's login line
    assert fake.sent == [reply]  # updates are handled in order: the first was dropped


async def test_the_example_says_so_when_telegram_refuses_the_token(
    fake: FakeTelegram, tmp_path: Path
) -> None:
    """Exit 2, its last line naming TELEGRAM_TOKEN (PTB logs the getMe that
    failed, with its traceback, as an ERROR before it)."""
    async with program(fake, tmp_path, "telegram_bot", ANN_DECIDES, "1234:unknown") as run:
        async with asyncio.timeout(30):
            await run.proc.wait()
    assert run.proc.returncode == 2, run.stderr
    last = run.stderr.splitlines()[-1]
    assert last.startswith("telegram_bot.py: Telegram refused TELEGRAM_TOKEN: "), run.stderr
