"""The aiogram 3 middleware end to end: real aiogram Dispatchers and Bots,
written as aiogram's quickstart writes them (`@dp.message()` handlers,
`dp.start_polling(bot)`) plus one `guard(...)` line, polling the fake
Telegram of tests/fakes/telegram/. The echo bot is docs/examples/aiogram_bot.py's,
which is also run as a program.

Nothing sleeps: decisions are awaited through the decision log lines, sends
through the fake's records, and a chat is "settled" when every update the
bots were given was fetched and each guard has nothing in flight
(`settled`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from aiogram import Bot, Dispatcher, F
from aiogram.filters import CommandStart
from aiogram.types import ErrorEvent, Message

from botbouncer import Bouncer
from botbouncer.aiogram import AiogramGuard, guard
from gateway.daemon import Daemon
from gateway.store import Limits, MemoryStore, Store
from gateway.store.redis import RedisStore
from tests.conftest import StoreFactory
from tests.daemons import running
from tests.decisions import Decisions
from tests.examples import example, program, run_once
from tests.fakes.telegram import FakeTelegram, SentMessage, aiogram_session
from tests.redis_server import free_port

pytestmark = pytest.mark.timeout(60)

ALICE = 1001
ALPHA, BETA, CHATTY, FRONTED = 7001, 7002, 7003, 7004
TOKENS = {ALPHA: "7001:alpha", BETA: "7002:beta", CHATTY: "7003:chatty", FRONTED: "7004:front"}
NAMES = {ALPHA: "alpha", BETA: "beta", CHATTY: "chatty", FRONTED: "fronted"}
GROUP = -1001500  # a forum supergroup
WARNING = "Bot turn limit reached"


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    """Alice and four bots in GROUP. Each bot has bot-to-bot mode, is an
    administrator and has privacy off: it sees every message, other bots' too."""
    async with FakeTelegram() as f:
        f.add_user(ALICE, "Alice", "alice")
        f.add_chat(GROUP, "supergroup", "the group", is_forum=True)
        f.add_member(GROUP, ALICE, "creator")
        for user_id, name in NAMES.items():
            f.add_bot(TOKENS[user_id], user_id, f"{name}_bot", name.title(), bot_to_bot=True,
                      privacy=False)  # fmt: skip
            f.add_member(GROUP, user_id, "administrator")
        yield f


def config(name: str, **policy: Any) -> dict[str, Any]:
    """One decide bot on Telegram that answers every message, bots' too."""
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


def chat(topic: int | None = None) -> str:
    return f"telegram:{GROUP}" if topic is None else f"telegram:{GROUP}:{topic}"


def echo_bot(bouncer: Bouncer, *, warnings: bool = True) -> tuple[Dispatcher, AiogramGuard]:
    """aiogram's quickstart (greet on /start, echo every other message) with
    the guard: docs/examples/aiogram_bot.py's `build`. And its guard."""
    dp: Dispatcher = example("aiogram_bot").build(bouncer, warnings=warnings)
    [guarded] = [m for m in dp.message.outer_middleware if isinstance(m, AiogramGuard)]
    return dp, guarded


@asynccontextmanager
async def polling(fake: FakeTelegram, dp: Dispatcher, user_id: int) -> AsyncIterator[Bot]:
    """`dp.start_polling(bot)` in a task, until its first long poll waits."""
    bot = Bot(TOKENS[user_id], session=aiogram_session(fake.api_base))
    task = asyncio.create_task(dp.start_polling(bot, handle_signals=False))
    try:
        try:
            await fake.wait_until(lambda: fake.bot(user_id).polling > 0, what="polling")
        except TimeoutError:
            if task.done():
                task.result()  # what stopped it
            raise
        yield bot
    finally:
        with suppress(RuntimeError):  # polling already over
            await dp.stop_polling()
        await task


async def settled(fake: FakeTelegram, *guards: AiogramGuard, daemon: Daemon | None = None) -> None:
    """Until every update the guarded bots (and the daemon's) were given was
    fetched and handled, and nothing new came of it.

    An update leaves the fake's queue when the bot's next getUpdates arrives,
    which aiogram sends after creating the update's task; that task runs
    (and the guard tracks it, before its first real wait) before the request
    can reach the fake, which runs on the same loop."""
    ids = [g.bot.id for g in guards if g.bot is not None]
    ids += [] if daemon is None else [FRONTED]

    def fetched() -> bool:
        return not any(fake.bot(i).pending for i in ids)

    while True:
        await fake.wait_until(fetched, what="the updates fetched")
        for g in guards:
            await g.idle()
        if daemon is not None:
            await daemon.inflight.idle()
        if fetched():
            return


def by(user_id: int, sent: list[SentMessage]) -> list[SentMessage]:
    return [s for s in sent if s.bot_user_id == user_id]


def warnings_in(sent: list[SentMessage]) -> list[SentMessage]:
    return [s for s in sent if WARNING in s.text]


async def soft_of(store: Store, chat_key: str, bot: int) -> tuple[int, int]:
    status = await store.status(chat_key, str(bot), Limits())
    return status.soft, status.rate_used


async def test_two_wrapped_bots_stop_at_the_soft_limit_with_one_warning(
    fake: FakeTelegram, stores: StoreFactory, decisions: Decisions
) -> None:
    """alpha and beta, each behind its own Bouncer on one store (memory; two
    Redis clients), answer each other forever. alpha opens with a scheduled
    post; 3 answers later the chat is at the soft limit (4): one warning,
    then silence. Then Alice speaks, and both answer her again."""
    store_a, store_b = await stores(2)
    async with (
        Bouncer(config("alpha"), store=store_a) as ba,
        Bouncer(config("beta"), store=store_b) as bb,
    ):
        (da, ga), (db, gb) = echo_bot(ba), echo_bot(bb)
        async with polling(fake, da, ALPHA) as alpha, polling(fake, db, BETA):
            await alpha.send_message(GROUP, "hello")
            await fake.wait_until(lambda: warnings_in(fake.sent), what="a warning")
            await settled(fake, ga, gb)
            sent = fake.sent
            assert [(s.bot_user_id, s.text) for s in sent[:4]] == [
                (ALPHA, "hello"),
                (BETA, "hello"),
                (ALPHA, "hello"),
                (BETA, "hello"),
            ]
            [warning] = warnings_in(sent)
            assert warning is sent[4] and len(sent) == 5
            assert warning.bot_user_id == ALPHA and "(4/4)" in warning.text
            assert (warning.reply_to, warning.thread_id) == (None, None)
            # each message was counted once, by its sender, when sent: the
            # bot that received it found it counted
            for n, s in enumerate(sent[1:4], start=1):
                seen = await decisions.wait(s.message["message_id"], ALPHA if n % 2 else BETA)
                assert (seen["soft"], seen["action"]) == (n + 1, "reply" if n < 3 else "warn")
            seen = await decisions.wait(warning.message["message_id"], BETA)
            assert (seen["soft"], seen["action"]) == (5, "drop")
            assert (await soft_of(store_a, chat(), ALPHA))[0] == 5

            said = await fake.user_says(GROUP, ALICE, "carry on, bots")
            for b in (ALPHA, BETA):
                seen = await decisions.wait(said["message_id"], b)
                assert (seen["turn"], seen["action"]) == ("reset", "reply")
            await fake.wait_until(lambda: len(warnings_in(fake.sent)) == 2, what="a 2nd warning")
            await settled(fake, ga, gb)
            after = fake.sent[5:]
            assert sorted((s.bot_user_id, s.text) for s in after[:2]) == [
                (ALPHA, "carry on, bots"),
                (BETA, "carry on, bots"),
            ]
            assert len(warnings_in(fake.sent)) == 2  # one per run up to the limit


async def test_a_forum_topic_is_counted_apart_from_the_general_chat(
    fake: FakeTelegram, decisions: Decisions
) -> None:
    """A loop in a topic stops there; the general chat of the same group is
    still at 0 and runs its own course, up to its own warning."""
    store = MemoryStore()
    async with (
        Bouncer(config("alpha"), store=store) as ba,
        Bouncer(config("beta"), store=store) as bb,
    ):
        (da, ga), (db, gb) = echo_bot(ba), echo_bot(bb)
        async with polling(fake, da, ALPHA) as alpha, polling(fake, db, BETA):
            topic = fake.create_topic(GROUP, ALICE, "bots corner")
            await alpha.send_message(GROUP, "in the topic", message_thread_id=topic)
            await fake.wait_until(lambda: warnings_in(fake.sent), what="the topic's warning")
            await settled(fake, ga, gb)
            assert len(fake.sent) == 5
            assert {s.thread_id for s in fake.sent} == {topic}  # answers stay in the topic
            assert (await soft_of(store, chat(topic), ALPHA))[0] == 5
            assert (await soft_of(store, chat(), ALPHA))[0] == 0

            opener = await alpha.send_message(GROUP, "in general")
            seen = await decisions.wait(opener.message_id, BETA)
            assert (seen["chat"], seen["soft"], seen["action"]) == (chat(), 1, "reply")
            await fake.wait_until(lambda: len(warnings_in(fake.sent)) == 2, what="2nd warning")
            await settled(fake, ga, gb)
            general = fake.sent[5:]
            assert len(general) == 5 and {s.thread_id for s in general} == {None}
            assert (await soft_of(store, chat(), ALPHA))[0] == 5
            assert (await soft_of(store, chat(topic), ALPHA))[0] == 5


async def test_a_wrapped_bot_and_a_fronted_bot_keep_one_count(
    fake: FakeTelegram, redis_url: str, key_prefix: str, decisions: Decisions
) -> None:
    """beta (aiogram, guarded) and fronted (botbouncer's daemon holds its
    token, echo backend) on one Redis answer each other: one count for the
    chat, each message counted once whoever sent or saw it."""
    fronted = {
        "name": "fronted",
        "platform": "telegram",
        "token": TOKENS[FRONTED],
        "api_base": fake.api_base,
        "backend": {"type": "echo"},
        "bot_messages": "all",
        "respond_to": "all",
        "turns": {"soft_limit": 4, "hard_limit": 10},
    }
    shared = RedisStore.from_url(redis_url, prefix=key_prefix)
    try:
        async with (
            running(redis_url, key_prefix, fronted) as daemon,
            Bouncer(config("beta"), store=shared) as bb,
        ):
            db, gb = echo_bot(bb)
            async with polling(fake, db, BETA) as beta:
                await beta.send_message(GROUP, "ping")
                await fake.wait_until(lambda: warnings_in(fake.sent), what="a warning")
                await settled(fake, gb, daemon=daemon)
                sent = fake.sent
                assert [(s.bot_user_id, s.text) for s in sent] == [
                    (BETA, "ping"),
                    (FRONTED, "ping"),  # the echo backend
                    (BETA, "ping"),  # the example's echo
                    (FRONTED, "ping"),
                    (BETA, sent[4].text),
                ]
                assert WARNING in sent[4].text
                for n, s in enumerate(sent, start=1):
                    receiver = FRONTED if s.bot_user_id == BETA else BETA
                    seen = await decisions.wait(s.message["message_id"], receiver)
                    assert seen["soft"] == n, (n, seen)
                status = await shared.status(chat(), str(BETA), Limits())
                assert (status.soft, status.hard) == (5, 5)
    finally:
        await shared.close()


async def test_a_handler_that_sends_nothing_or_raises_gives_its_slot_back(
    fake: FakeTelegram, decisions: Decisions
) -> None:
    """Rate cap 1: a handler that sends nothing, and one that raises, leave
    the slot for the next message; one that answers spends it. A send
    outside any update is a turn of its own."""
    dp = Dispatcher()
    errors: list[Exception] = []

    @dp.message(F.text.contains("quiet"))
    async def quiet(message: Message) -> None:
        pass

    @dp.message(F.text.contains("boom"))
    async def boom(message: Message) -> None:
        raise RuntimeError("boom")

    @dp.message()
    async def echo(message: Message) -> None:
        await message.answer(f"you said: {message.text}")

    @dp.errors()
    async def on_error(event: ErrorEvent) -> None:
        errors.append(event.exception)

    one_reply = config("alpha", bot_messages="off", respond_to="mentions",
                       rate_cap={"max_replies": 1, "window_seconds": 3600})  # fmt: skip
    async with Bouncer(one_reply) as bouncer:
        store = bouncer.store
        g = guard(dp, bouncer)
        async with polling(fake, dp, ALPHA) as alpha:
            await alpha.send_message(GROUP, "good morning")  # a scheduled post
            assert await soft_of(store, chat(), ALPHA) == (1, 0)
            topic = fake.create_topic(GROUP, ALICE, "news")
            await alpha.send_message(GROUP, "news of the day", message_thread_id=topic)
            assert await soft_of(store, chat(topic), ALPHA) == (1, 0)

            answers: list[tuple[str, tuple[int, int]]] = []
            for text in ("quiet please", "boom", "hello", "again"):
                said = await fake.user_says(GROUP, ALICE, f"@alpha_bot {text}")
                seen = await decisions.wait(said["message_id"], ALPHA)
                await settled(fake, g)
                # (soft, rate slots used) once it was handled
                answers.append(
                    (seen["reason"] or seen["action"], await soft_of(store, chat(), ALPHA))
                )
            assert answers == [
                ("reply", (0, 0)),  # nothing sent: the slot went back
                ("reply", (0, 0)),  # raised: the slot went back
                ("reply", (1, 1)),  # answered: counted under its ticket, the slot spent
                ("rate_capped", (0, 1)),  # (Alice's message resets the count)
            ]
            assert [str(e) for e in errors] == ["boom"]  # raised on to aiogram
            assert [s.text for s in by(ALPHA, fake.sent)][2:] == ["you said: @alpha_bot hello"]
            # the chat's decision log: the two releases are filed as backend_empty
            logged = [(e["action"], e["reason"]) for e in await store.decisions(chat())]
            assert logged.count(("drop", "backend_empty")) == 2, logged


async def test_warnings_false_posts_no_warning(fake: FakeTelegram, decisions: Decisions) -> None:
    store = MemoryStore()
    async with (
        Bouncer(config("alpha"), store=store) as ba,
        Bouncer(config("beta"), store=store) as bb,
    ):
        (da, ga), (db, gb) = echo_bot(ba, warnings=False), echo_bot(bb, warnings=False)
        async with polling(fake, da, ALPHA) as alpha, polling(fake, db, BETA):
            await alpha.send_message(GROUP, "hello")
            await fake.wait_sent(4, chat_id=GROUP)
            last = fake.sent[3]
            seen = await decisions.wait(last.message["message_id"], ALPHA)
            assert (seen["action"], seen["soft"]) == ("warn", 4)
            await settled(fake, ga, gb)
            assert len(fake.sent) == 4 and warnings_in(fake.sent) == []


async def test_a_warning_telegram_refuses_is_logged_not_raised(
    fake: FakeTelegram, decisions: Decisions, caplog: pytest.LogCaptureFixture
) -> None:
    """The guard's own warning fails (403): a line in the log, nothing for
    aiogram's error handlers, and the bot goes on."""
    dp = Dispatcher()
    errors: list[Exception] = []

    @dp.message(CommandStart())
    async def command_start_handler(message: Message) -> None:
        await message.answer("Hello!")

    @dp.errors()
    async def on_error(event: ErrorEvent) -> None:
        errors.append(event.exception)

    async with Bouncer(config("alpha")) as bouncer:
        g = guard(dp, bouncer)
        async with polling(fake, dp, ALPHA) as alpha:
            await alpha.send_message(GROUP, "hello")  # alpha spoke: the warning is its to post
            fake.fail_next("sendMessage", 403, "Forbidden: not enough rights to send messages")
            caplog.set_level(logging.WARNING, logger="botbouncer.aiogram")
            for i in range(3):  # another bot's chatter, handed to alpha only
                chatter = fake.message_payload(GROUP, CHATTY, f"chatter {i}")
                await fake.push_raw(ALPHA, {"message": chatter})
            await settled(fake, g)
            refused = [c.status for c in fake.calls_of("sendMessage", TOKENS[ALPHA])]
            assert refused == [200, 403]
            assert any("warning" in r.getMessage() and "not enough rights" in r.getMessage()
                       for r in caplog.records)  # fmt: skip
            assert errors == []
            said = await fake.user_says(GROUP, ALICE, "/start")
            assert (await decisions.wait(said["message_id"], ALPHA))["action"] == "reply"
            await fake.wait_until(lambda: len(by(ALPHA, fake.sent)) == 2, what="the greeting")


async def test_a_store_that_is_down_is_logged_and_nothing_is_handled(
    fake: FakeTelegram, caplog: pytest.LogCaptureFixture
) -> None:
    """As in the daemon's adapter: an ERROR, no handler, nothing raised into
    aiogram. What the bot sends anyway is sent, and logged as not counted."""
    errors: list[Exception] = []
    down = RedisStore.from_url(f"redis://127.0.0.1:{free_port()}/0")
    try:
        async with Bouncer(config("alpha"), store=down) as bouncer:
            dp, g = echo_bot(bouncer)

            @dp.errors()
            async def on_error(event: ErrorEvent) -> None:
                errors.append(event.exception)

            async with polling(fake, dp, ALPHA) as alpha:
                caplog.set_level(logging.ERROR)
                sent = await alpha.send_message(GROUP, "scheduled")
                assert sent.text == "scheduled"
                await fake.user_says(GROUP, ALICE, "@alpha_bot hello")
                await settled(fake, g)
                assert len(fake.sent) == 1 and errors == []
                lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
                assert any("not counted" in line for line in lines), lines
                assert any("not handled" in line and "redis" in line for line in lines), lines
    finally:
        await down.close()


async def test_several_bots_on_one_dispatcher_need_one_guard_each(fake: FakeTelegram) -> None:
    async with Bouncer(config("alpha")) as bouncer:
        dp, _ = echo_bot(bouncer)
        alpha = Bot(TOKENS[ALPHA], session=aiogram_session(fake.api_base))
        beta = Bot(TOKENS[BETA], session=aiogram_session(fake.api_base))
        with pytest.raises(ValueError, match="pass bot= to guard"):
            await dp.start_polling(alpha, beta, handle_signals=False)


async def test_a_second_guard_of_one_bot_is_refused(fake: FakeTelegram) -> None:
    """Two guards of one bot would decide each message twice: the second
    call finds it a duplicate and keeps it from the handlers."""
    alpha = Bot(TOKENS[ALPHA], session=aiogram_session(fake.api_base))
    beta = Bot(TOKENS[BETA], session=aiogram_session(fake.api_base))
    async with Bouncer(config("alpha")) as a, Bouncer(config("beta")) as b:
        dp, _ = echo_bot(a)
        for bouncer, bot in ((a, None), (a, alpha), (b, None)):
            with pytest.raises(ValueError, match="guarded already"):
                guard(dp, bouncer, bot=bot)
        one = Dispatcher()
        guard(one, a, bot=alpha)
        with pytest.raises(ValueError, match="guarded already"):
            guard(one, b, bot=alpha)
        guard(one, b, bot=beta)  # another bot: its own guard
    await alpha.session.close()
    await beta.session.close()


# -- docs/examples/aiogram_bot.py as a program --------------------------------------------

ALPHA_DECIDES = """\
bots:
  - name: alpha
    platform: telegram
    mode: decide
store: {url: "memory://"}
"""
BROKEN = """\
bots:
  - name: alpha
    platform: telegram
    mode: decide
    rate_cap: {max_replies: 0}
"""


@pytest.mark.parametrize(
    ("env", "config", "says"),
    [
        ({}, ALPHA_DECIDES, "set TELEGRAM_TOKEN to the bot's token"),
        ({"TELEGRAM_TOKEN": TOKENS[ALPHA]}, BROKEN, "bots[0].rate_cap.max_replies: must be >= 1"),
        (
            {"TELEGRAM_TOKEN": TOKENS[ALPHA], "BOTBOUNCER_BOT": "bob"},
            ALPHA_DECIDES,
            "no bot named 'bob' (configured: alpha)",
        ),
    ],
    ids=["no-token", "broken-config", "unknown-bot"],
)
def test_the_example_refuses_a_missing_token_or_a_bad_config_in_one_line(
    tmp_path: Path, env: dict[str, str], config: str, says: str
) -> None:
    """Exit 2 and one line on stderr that says what to change; the config is
    the default one, botbouncer.yml in the working directory."""
    run = run_once("aiogram_bot", tmp_path, config, **env)
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == [f"aiogram_bot.py: {says}"]


async def test_the_example_runs_as_a_program_and_stops_on_sigint(
    fake: FakeTelegram, tmp_path: Path
) -> None:
    """`main` for real: the guard keeps a message that does not address alpha
    from the echo (respond_to: mentions, the default), the echo and the
    greeting answer the ones that do, and SIGINT stops it cleanly."""
    async with program(fake, tmp_path, "aiogram_bot", ALPHA_DECIDES, TOKENS[ALPHA]) as run:
        await run.polling(fake, ALPHA)
        await fake.user_says(GROUP, ALICE, "not for you")
        await fake.user_says(GROUP, ALICE, "@alpha_bot hello")
        await fake.user_says(GROUP, ALICE, "/start@alpha_bot")
        await fake.wait_sent(2, timeout=10)
    assert run.proc.returncode == 0, run.stderr
    assert run.stderr == ""  # its log goes to stdout, as aiogram's quickstart has it
    assert "Run polling for bot @alpha_bot" in run.stdout
    assert "Traceback" not in run.stdout
    # all handled by the time it exits (the shutdown hook waits for the guard)
    assert sorted((s.bot_user_id, s.text) for s in fake.sent) == [
        (ALPHA, "@alpha_bot hello"),
        (ALPHA, "Hello, Alice!"),
    ]


async def test_the_example_says_so_when_telegram_refuses_the_token(
    fake: FakeTelegram, tmp_path: Path
) -> None:
    async with program(fake, tmp_path, "aiogram_bot", ALPHA_DECIDES, "1234:unknown") as run:
        async with asyncio.timeout(30):
            await run.proc.wait()
    assert run.proc.returncode == 2, run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    [line] = run.stderr.splitlines()
    assert line.startswith("aiogram_bot.py: Telegram refused TELEGRAM_TOKEN: "), line


async def test_a_reply_a_handler_returns_for_aiogram_to_send_is_counted_under_its_ticket(
    fake: FakeTelegram, decisions: Decisions
) -> None:
    """aiogram sends a method a handler returns (`return message.answer(...)`,
    its "answer into webhook", in polling too) after the handlers ended: the
    guard sends it itself while the ticket is open, so it spends the slot."""
    dp = Dispatcher()

    @dp.message()
    async def echo(message: Message) -> Any:
        return message.answer(f"you said: {message.text}")

    one_reply = config("alpha", bot_messages="off", respond_to="mentions",
                       rate_cap={"max_replies": 1, "window_seconds": 3600})  # fmt: skip
    async with Bouncer(one_reply) as bouncer:
        store = bouncer.store
        g = guard(dp, bouncer)
        async with polling(fake, dp, ALPHA):
            seen = []
            for text in ("hello", "again"):
                said = await fake.user_says(GROUP, ALICE, f"@alpha_bot {text}")
                d = await decisions.wait(said["message_id"], ALPHA)
                seen.append(d["reason"] or d["action"])
                await settled(fake, g)
                await fake.wait_until(lambda: by(ALPHA, fake.sent) != [], what="the answer")
            assert seen == ["reply", "rate_capped"]
            assert await soft_of(store, chat(), ALPHA) == (0, 1)  # the slot spent
            assert [s.text for s in by(ALPHA, fake.sent)] == ["you said: @alpha_bot hello"]


async def test_a_copy_the_handler_sends_is_counted_in_the_chat_it_named(
    fake: FakeTelegram, decisions: Decisions
) -> None:
    """copyMessage answers a MessageId without its chat: the copy is counted
    in the chat (and topic) the call named, under the ticket when that is
    the handled message's chat, as the Telegram middlewares say they do."""

    async def copy_message(bot: Any, params: dict[str, Any]) -> dict[str, Any]:
        source = fake.group(int(params["from_chat_id"])).messages[int(params["message_id"])]
        sent = {"chat_id": params["chat_id"], "text": source.get("text", "a copy")}
        if "message_thread_id" in params:
            sent["message_thread_id"] = params["message_thread_id"]
        copied = await fake._send_message(bot, sent)
        return {"message_id": copied["message_id"]}

    takes = frozenset({"chat_id", "from_chat_id", "message_id", "message_thread_id"})
    fake.methods["copyMessage"] = (copy_message, takes)
    dp = Dispatcher()

    @dp.message()
    async def echo(message: Message) -> None:
        await message.copy_to(message.chat.id)
        if "news" in (message.text or ""):
            await message.copy_to(message.chat.id, message_thread_id=topic)

    one_reply = config("alpha", bot_messages="off", respond_to="mentions",
                       rate_cap={"max_replies": 1, "window_seconds": 3600})  # fmt: skip
    async with Bouncer(one_reply) as bouncer:
        store = bouncer.store
        g = guard(dp, bouncer)
        topic = fake.create_topic(GROUP, ALICE, "news")
        async with polling(fake, dp, ALPHA):
            seen = []
            for text in ("hello", "again"):
                said = await fake.user_says(GROUP, ALICE, f"@alpha_bot {text}")
                d = await decisions.wait(said["message_id"], ALPHA)
                seen.append(d["reason"] or d["action"])
                await settled(fake, g)
            assert seen == ["reply", "rate_capped"]
            # the copy spent the slot (Alice's second message reset the count)
            assert await soft_of(store, chat(), ALPHA) == (0, 1)
            # from a topic: a copy into the general chat is a turn there, one
            # into the topic fills the ticket
            said = await fake.user_says(GROUP, ALICE, "@alpha_bot news", thread_id=topic)
            await decisions.wait(said["message_id"], ALPHA)
            await settled(fake, g)
            assert await soft_of(store, chat(), ALPHA) == (1, 1)
            assert await soft_of(store, chat(topic), ALPHA) == (1, 1)
