"""The Telegram adapter end to end: the real python-telegram-bot Application,
inside the real daemon, against the fake Bot API of tests/fakes/telegram/,
on Redis.

The daemon reaches the fake only through `api_base`. Decisions are awaited
through the decision log lines the pipeline writes, the platform side through
the fake's recorded sends: nothing sleeps.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
import telegram

from gateway.daemon import Daemon, StartupError
from gateway.store import Limits
from gateway.store.redis import RedisStore
from tests import sample_backends
from tests.daemons import build, forget
from tests.decisions import Decisions
from tests.fakes.telegram import FakeTelegram, SentMessage, fast_request
from tests.redis_server import free_port

pytestmark = pytest.mark.timeout(60)

ALICE, MOD, OWNER = 1001, 1002, 1003  # a member, an administrator, the creator
BOT_A, BOT_B, CHATTY = 7001, 7002, 7003  # alpha and beta are fronted; chatty is not
TOKEN_A, TOKEN_B, TOKEN_C = "7001:alpha-secret", "7002:beta-secret", "7003:chatty"
GROUP = -1001500  # a forum supergroup
SECRET = "hook-secret_1"


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as f:
        f.add_bot(TOKEN_A, BOT_A, "alpha_bot", "Alpha", bot_to_bot=True)
        f.add_bot(TOKEN_B, BOT_B, "beta_bot", "Beta", bot_to_bot=True)
        f.add_bot(TOKEN_C, CHATTY, "chatty_bot", "Chatty")
        f.add_user(ALICE, "Alice", "alice")
        f.add_user(MOD, "Mo", "mo")
        f.add_user(OWNER, "Olga", "olga")
        f.add_user(ALICE + 100, "Ada", "ada")
        f.add_chat(GROUP, "supergroup", "the group", is_forum=True)
        for user, status in ((ALICE, "member"), (MOD, "administrator"), (OWNER, "creator")):
            f.add_member(GROUP, user, status)
        for b in (BOT_A, BOT_B, CHATTY):
            f.add_member(GROUP, b)
        yield f


def bot(name: str, token: str, fake: FakeTelegram, **policy: Any) -> dict[str, Any]:
    return {
        "name": name,
        "platform": "telegram",
        "token": token,
        "api_base": fake.api_base,
        "backend": {"type": "echo"},
        "turns": {"soft_limit": 4, "hard_limit": 10},
        **policy,
    }


def chat(thread: int | None = None) -> str:
    return f"telegram:{GROUP}" if thread is None else f"telegram:{GROUP}:{thread}"


async def soft_of(d: Daemon, chat_key: str, name: str = "alpha") -> int:
    """The chat's soft counter once the daemon has finished what it was
    handling (a reply is counted just after Telegram took it)."""
    await d.inflight.idle()
    return (await d.server.admins[name].status(chat_key)).soft


def by(user: int, sent: list[SentMessage]) -> list[SentMessage]:
    return [s for s in sent if s.bot_user_id == user]


@asynccontextmanager
async def chatty(fake: FakeTelegram) -> AsyncIterator[telegram.Bot]:
    """A bot in the group that botbouncer does not front."""
    other = telegram.Bot(
        TOKEN_C,
        base_url=f"{fake.api_base}/bot",
        request=fast_request(),
        get_updates_request=fast_request(),
    )
    async with other:
        yield other


async def test_an_addressed_message_is_answered_and_counted_when_sent(
    fake: FakeTelegram, run: Callable[..., Any], decisions: Decisions
) -> None:
    fake.bot(BOT_A).privacy = False  # sees every message of the group
    async with run(bot("alpha", TOKEN_A, fake)) as d:
        said = await fake.user_says(GROUP, ALICE, "@alpha_bot hello there")
        [reply] = await fake.wait_sent(1, chat_id=GROUP)
        assert (reply.bot_user_id, reply.text) == (BOT_A, "@alpha_bot hello there")
        assert reply.reply_to == said["message_id"]
        assert reply.thread_id is None  # the General topic
        assert await soft_of(d, chat()) == 1  # Telegram shows no echo: counted when sent
        # text_mention (a person picked from the list, no username) and a reply address it too
        mention = [{"type": "text_mention", "offset": 0, "length": 5,
                    "user": fake.user_payload(BOT_A)}]  # fmt: skip
        await fake.user_says(GROUP, ALICE, "Alpha, and you?", entities=mention)
        await fake.user_says(GROUP, ALICE, "thanks", reply_to=reply.message["message_id"])
        sent = await fake.wait_sent(3, chat_id=GROUP)
        assert [s.text for s in sent[1:]] == ["Alpha, and you?", "thanks"]
        # someone else's @name, and nobody's, are not addressed
        for text in ("@beta_bot hi", "just chatting"):
            quiet = await fake.user_says(GROUP, ALICE, text)
            seen = await decisions.wait(quiet["message_id"], BOT_A)
            assert (seen["action"], seen["reason"]) == ("drop", "not_addressed")
        assert len(fake.sent) == 3


async def test_a_bare_command_that_opens_a_message_addresses_the_bot(
    fake: FakeTelegram, run: Callable[..., Any], decisions: Decisions
) -> None:
    # Breaks if a person's bare `/help` in a group is taken as addressed to
    # nobody: the bot never answered the command its users typed, which the
    # quickstart bots' CommandHandler answers. With privacy mode on (the
    # default) Telegram shows the bot only the bare commands meant for it.
    async with run(bot("alpha", TOKEN_A, fake)):
        await fake.user_says(GROUP, ALICE, "/help me please")
        [reply] = await fake.wait_sent(1, chat_id=GROUP)
        assert (reply.bot_user_id, reply.text) == (BOT_A, "/help me please")
        # another bot's command, and a command inside the text, are not for it
        fake.bot(BOT_A).privacy = False  # sees them all
        for text in ("/help@beta_bot", "type /help for help"):
            quiet = await fake.user_says(GROUP, ALICE, text)
            seen = await decisions.wait(quiet["message_id"], BOT_A)
            assert (seen["action"], seen["reason"]) == ("drop", "not_addressed"), text
        assert len(fake.sent) == 1


async def test_typing_shows_while_the_backend_works(
    fake: FakeTelegram, run: Callable[..., Any]
) -> None:
    gate = sample_backends.new_gate()
    backend = {"type": "python", "callable": "tests.sample_backends:gated"}
    async with run(bot("alpha", TOKEN_A, fake, backend=backend)):
        topic = fake.create_topic(GROUP, ALICE, "slow answers")
        await fake.user_says(GROUP, ALICE, "@alpha_bot think hard", thread_id=topic)
        await fake.wait_until(lambda: fake.chat_actions != [], what="typing")
        assert fake.sent == []
        [action] = fake.chat_actions
        assert (action.chat_id, action.thread_id, action.action) == (GROUP, topic, "typing")
        gate.set()
        [reply] = await fake.wait_sent(1, chat_id=GROUP)
        assert (reply.text, reply.thread_id) == ("worked on it", topic)


async def test_a_dm_is_always_addressed(
    fake: FakeTelegram, run: Callable[..., Any], decisions: Decisions
) -> None:
    dm = fake.add_private(ALICE, BOT_A)
    async with run(bot("alpha", TOKEN_A, fake)):
        said = await fake.user_says(dm.id, ALICE, "hi", to_bot=BOT_A)
        seen = await decisions.wait(said["message_id"], BOT_A)
        assert (seen["chat"], seen["action"]) == (f"telegram:{ALICE}", "reply")
        [reply] = await fake.wait_sent(1)
        assert (reply.chat_id, reply.text) == (ALICE, "hi")


async def test_two_bots_in_bot_to_bot_mode_stop_at_the_soft_limit_with_one_warning(
    fake: FakeTelegram, run: Callable[..., Any], decisions: Decisions
) -> None:
    """alpha and beta, each behind its own daemon on one Redis, thank each
    other's replies forever: 4 replies (the soft limit), one warning, silence.
    Nothing is echoed, yet each message is counted once: by its sender when
    sent, and the other bot receiving it finds it already counted."""
    fake.add_member(GROUP, BOT_B, "administrator")
    fake.bot(BOT_B).privacy = False  # beta reads the whole group, bot messages too
    policy = {
        "bot_messages": "mentions",
        "backend": {"type": "python", "callable": "tests.sample_backends:greeter"},
    }
    async with (
        run(bot("alpha", TOKEN_A, fake, **policy)) as da,
        run(bot("beta", TOKEN_B, fake, **policy)),
    ):
        await fake.user_says(GROUP, ALICE, "@alpha_bot please greet beta_bot")
        sent = await fake.wait_sent(5, chat_id=GROUP)  # 4 replies + the warning
        warning = sent[4]
        assert warning.bot_user_id in (BOT_A, BOT_B)
        assert "Bot turn limit reached (4/4)" in warning.text
        assert warning.reply_to is None
        for b in (BOT_A, BOT_B):  # the bot that did not post it decides on it too
            if b != warning.bot_user_id:
                seen = await decisions.wait(warning.message["message_id"], b)
                assert seen["soft"] == 5
        replies = sent[:4]
        assert [s.bot_user_id for s in replies] == [BOT_A, BOT_B, BOT_A, BOT_B]
        assert replies[0].text == "hello @beta_bot!"
        # each bot received the other's replies and counted none of them again
        for s in replies[1:]:
            receiver = BOT_A if s.bot_user_id == BOT_B else BOT_B
            seen = await decisions.wait(s.message["message_id"], receiver)
            assert seen["soft"] == replies.index(s) + 1
        assert await soft_of(da, chat()) == 5  # 4 replies + the warning, once each
        assert len(fake.sent) == 5

        again = await fake.user_says(GROUP, ALICE, "@alpha_bot carry on, greet beta_bot")
        resumed = await decisions.wait(again["message_id"], BOT_A)
        assert (resumed["turn"], resumed["action"]) == ("reset", "reply")
        await fake.wait_sent(7, chat_id=GROUP)


async def test_a_forum_topic_is_its_own_chat_and_a_pin_does_not_reset(
    fake: FakeTelegram, run: Callable[..., Any], decisions: Decisions
) -> None:
    fake.add_member(GROUP, BOT_A, "administrator")
    fake.bot(BOT_A).privacy = False  # with bot-to-bot mode: sees other bots' messages
    async with run(bot("alpha", TOKEN_A, fake)) as d, chatty(fake) as other:
        # alpha opens the topic: Telegram then sends every message in it as a
        # "reply" to alpha's opening message, which must not address alpha
        topic = fake.create_topic(GROUP, BOT_A, "releases")
        for i in range(3):
            m = await other.send_message(GROUP, f"bot chatter {i}")
            await decisions.wait(m.message_id, BOT_A)
        pinned = fake.messages(GROUP)[-1]
        pin = await fake.service(GROUP, MOD, pinned_message=pinned)
        seen = await decisions.wait(pin["message_id"], BOT_A)
        assert (seen["reason"], seen["turn"], seen["soft"]) == ("system_message", "none", 3)
        in_topic = await other.send_message(GROUP, "in the topic", message_thread_id=topic)
        seen = await decisions.wait(in_topic.message_id, BOT_A)
        assert (seen["chat"], seen["soft"]) == (chat(topic), 1)
        assert (seen["action"], seen["reason"]) == ("drop", "bot_ignored")
        assert (await soft_of(d, chat()), await soft_of(d, chat(topic))) == (3, 1)
        person = await fake.user_says(GROUP, ALICE, "a person in the topic", thread_id=topic)
        seen = await decisions.wait(person["message_id"], BOT_A)
        assert (seen["turn"], seen["action"], seen["reason"]) == ("reset", "drop", "not_addressed")
        assert (await soft_of(d, chat()), await soft_of(d, chat(topic))) == (3, 0)
        # an answer in a topic goes to that topic
        asked = await fake.user_says(GROUP, ALICE, "@alpha_bot in here?", thread_id=topic)
        [reply] = by(BOT_A, await fake.wait_sent(5, chat_id=GROUP))
        assert (reply.thread_id, reply.reply_to) == (topic, asked["message_id"])


async def test_an_anonymous_admin_is_a_person_not_a_bot_turn(
    fake: FakeTelegram, run: Callable[..., Any], decisions: Decisions
) -> None:
    """Telegram sends a message posted as the group from GroupAnonymousBot,
    whose is_bot is true: it must reset, like any person's message."""
    fake.add_member(GROUP, BOT_A, "administrator")
    fake.bot(BOT_A).privacy = False
    async with run(bot("alpha", TOKEN_A, fake)) as d, chatty(fake) as other:
        for i in range(2):
            m = await other.send_message(GROUP, f"bot chatter {i}")
            await decisions.wait(m.message_id, BOT_A)
        anon = await fake.user_says(GROUP, MOD, "enough, bots", sender_chat_id=GROUP)
        assert anon["from"]["is_bot"] is True
        seen = await decisions.wait(anon["message_id"], BOT_A)
        assert (seen["author"], seen["turn"], seen["soft"]) == (str(GROUP), "reset", 0)
        assert await soft_of(d, chat()) == 0


async def test_a_5000_character_reply_arrives_as_two_messages(
    fake: FakeTelegram, run: Callable[..., Any], decisions: Decisions
) -> None:
    backend = {"type": "python", "callable": "tests.sample_backends:long_reply"}
    async with run(bot("alpha", TOKEN_A, fake, backend=backend)) as d:
        said = await fake.user_says(GROUP, ALICE, "@alpha_bot tell me everything")
        first, second = await fake.wait_sent(2, chat_id=GROUP)
        assert len(first.text) <= 4096 and len(second.text) <= 4096
        assert first.text + " " + second.text == ("lorem ipsum " * 417)[:5000]
        assert (first.reply_to, second.reply_to) == (said["message_id"], None)
        assert await soft_of(d, chat()) == 2  # each piece is a turn, under its own id
        why = await d.server.admins["alpha"].why(chat(), 10)
        assert [e["action"] for e in why] == ["reply"]  # one decision, filed once


async def test_a_flood_limit_is_waited_out_and_the_reply_sent_once(
    fake: FakeTelegram, run: Callable[..., Any]
) -> None:
    fake.fail_next("sendMessage", 429, retry_after=1)  # PTB waits 1.1 s
    async with run(bot("alpha", TOKEN_A, fake)) as d:
        await fake.user_says(GROUP, ALICE, "@alpha_bot hello")
        [reply] = await fake.wait_sent(1, chat_id=GROUP)
        assert reply.text == "@alpha_bot hello"
        calls = fake.calls_of("sendMessage", TOKEN_A)
        assert [c.status for c in calls] == [429, 200]
        assert await soft_of(d, chat()) == 1


async def test_a_flood_limit_that_outlasts_the_retries_gives_the_slot_back(
    fake: FakeTelegram, run: Callable[..., Any], decisions: Decisions
) -> None:
    """Three 429s in a row (PTB's limiter retries twice, then gives up):
    nothing was delivered, so the reply is unsent like any refused one: its
    slot comes back and `why` says backend_error, not reply."""
    for _ in range(3):
        fake.fail_next("sendMessage", 429, retry_after=0)  # PTB waits 0.1 s
    async with run(bot("alpha", TOKEN_A, fake)) as d:
        said = await fake.user_says(GROUP, ALICE, "@alpha_bot hello")
        await fake.wait_until(lambda: len(fake.calls_of("sendMessage", TOKEN_A)) == 3)
        await d.inflight.idle()
        status = await d.server.admins["alpha"].status(chat())
        entries = await d.server.admins["alpha"].why(chat(), 10)
        assert [(e["id"], e["reason"]) for e in entries][:1] == [
            (str(said["message_id"]), "backend_error")
        ]
        assert (status.rate_used, status.soft) == (0, 0)
        # the chat is not stuck: the next message is answered
        await fake.user_says(GROUP, ALICE, "@alpha_bot again")
        [reply] = await fake.wait_sent(1, chat_id=GROUP)
        assert reply.text == "@alpha_bot again"


async def test_a_refused_reply_gives_its_slot_back(
    fake: FakeTelegram, run: Callable[..., Any], decisions: Decisions
) -> None:
    fake.fail_next("sendMessage", 403, "Forbidden: bot was kicked from the supergroup chat")
    async with run(bot("alpha", TOKEN_A, fake)) as d:
        said = await fake.user_says(GROUP, ALICE, "@alpha_bot hello")
        await fake.wait_until(lambda: fake.calls_of("sendMessage", TOKEN_A) != [])
        await d.inflight.idle()
        status = await d.server.admins["alpha"].status(chat())
        entries = await d.server.admins["alpha"].why(chat(), 10)
        assert [(e["id"], e["reason"]) for e in entries][:1] == [
            (str(said["message_id"]), "backend_error")
        ]
        assert (status.rate_used, status.soft) == (0, 0)


async def test_admin_commands_for_administrators_and_refused_for_others(
    fake: FakeTelegram, run: Callable[..., Any], decisions: Decisions
) -> None:
    fake.add_member(GROUP, BOT_A, "administrator")
    fake.bot(BOT_A).privacy = False
    config = bot("alpha", TOKEN_A, fake, admins={"user_ids": [str(ALICE + 100)]})
    async with run(config) as d, chatty(fake) as other:
        scope = {"type": "all_chat_administrators"}
        commands = fake.commands_for(TOKEN_A, scope)
        assert commands is not None
        assert [c["command"] for c in commands] == [
            "bouncer_status", "bouncer_reset", "bouncer_pause", "bouncer_resume",
            "bouncer_limits", "bouncer_why",
        ]  # fmt: skip
        for i in range(3):
            m = await other.send_message(GROUP, f"bot chatter {i}")
            await decisions.wait(m.message_id, BOT_A)

        async def answer(n: int) -> SentMessage:
            """alpha's n-th message in the group (1-based)."""
            await fake.wait_until(lambda: len(by(BOT_A, fake.sent)) >= n, what=f"answer {n}")
            return by(BOT_A, fake.sent)[n - 1]

        # a member: refused, and the command is no conversation turn (no reset)
        await fake.user_says(GROUP, ALICE, "/bouncer_reset")
        assert "Only chat administrators" in (await answer(1)).text
        assert await soft_of(d, chat()) == 3
        # an administrator, with the @botname suffix: done
        await fake.user_says(GROUP, MOD, "/bouncer_reset@alpha_bot")
        assert (await answer(2)).text.startswith("Reset")
        assert await soft_of(d, chat()) == 0  # the answer is an aside, not a turn
        # the creator sets limits; the status shows them
        await fake.user_says(GROUP, OWNER, "/bouncer_limits soft=2 hard=5")
        shown = (await answer(3)).text
        assert "2" in shown and "5" in shown
        assert (await d.server.admins["alpha"].status(chat())).limits.soft_limit == 2
        # a bad argument says what to change
        await fake.user_says(GROUP, OWNER, "/bouncer_limits soft=zero")
        assert (await answer(4)).text.startswith("Not done:")
        # another bot's /bouncer_ command is not alpha's business
        await fake.user_says(GROUP, MOD, "/bouncer_pause@beta_bot")
        await fake.user_says(GROUP, MOD, "/bouncer_why@alpha_bot\n3")
        why = (await answer(5)).text
        assert "bot_ignored" in why, why
        assert not (await d.server.admins["alpha"].status(chat())).paused
        # a configured user id who is no chat administrator may too
        await fake.user_says(GROUP, ALICE + 100, "/bouncer_status")
        assert "Only chat administrators" not in (await answer(6)).text
        # an anonymous administrator (posting as the group) may; nobody asks Telegram
        checks = len(fake.calls_of("getChatMember", TOKEN_A))
        await fake.user_says(GROUP, MOD, "/bouncer_pause", sender_chat_id=GROUP)
        assert (await answer(7)).text.startswith("Paused")
        assert len(fake.calls_of("getChatMember", TOKEN_A)) == checks
        # each answer was filed, so no bot that sees it counts it
        assert await soft_of(d, chat()) == 0
        assert len(by(BOT_A, fake.sent)) == 7


async def test_a_configured_admin_may_pause_even_in_a_dm(
    fake: FakeTelegram, run: Callable[..., Any], decisions: Decisions
) -> None:
    dm = fake.add_private(ALICE, BOT_A)
    async with run(bot("alpha", TOKEN_A, fake, admins={"user_ids": [str(ALICE)]})) as d:
        await fake.user_says(dm.id, ALICE, "/bouncer_pause", to_bot=BOT_A)
        [answer] = await fake.wait_sent(1)
        assert answer.text.startswith("Paused")
        assert (await d.server.admins["alpha"].status(f"telegram:{ALICE}")).paused
        said = await fake.user_says(dm.id, ALICE, "hello?", to_bot=BOT_A)
        assert (await decisions.wait(said["message_id"], BOT_A))["reason"] == "paused"


async def test_webhook_mode_end_to_end_and_a_wrong_secret_is_refused(
    fake: FakeTelegram, run: Callable[..., Any], decisions: Decisions
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/webhooks/alpha"
    hook = {"webhook_url": url, "secret_token": SECRET}
    async with run(bot("alpha", TOKEN_A, fake, telegram=hook), port=port) as d:
        assert fake.bot(BOT_A).webhook is not None
        assert fake.calls_of("getUpdates", TOKEN_A) == []  # no polling
        said = await fake.user_says(GROUP, ALICE, "@alpha_bot via the hook")
        [reply] = await fake.wait_sent(1, chat_id=GROUP)
        assert (reply.text, reply.reply_to) == ("@alpha_bot via the hook", said["message_id"])
        # handled before it was answered: Telegram keeps what a stopping daemon refuses
        [attempt] = await fake.wait_until(lambda: fake.webhook_attempts, what="the answer")
        assert (attempt.status, attempt.secret_token) == (200, SECRET)

        forged = {
            "update_id": 999,
            "message": {
                "message_id": 4242,
                "date": 0,
                "chat": {"id": GROUP, "type": "supergroup", "title": "the group"},
                "from": {"id": ALICE, "is_bot": False, "first_name": "Alice"},
                "text": "@alpha_bot do what I say",
            },
        }
        async with aiohttp.ClientSession() as http:
            for headers in ({}, {"X-Telegram-Bot-Api-Secret-Token": "guess"}):
                async with http.post(url, json=forged, headers=headers) as resp:
                    assert resp.status == 403
                    assert "secret" in (await resp.json())["error"]
            # the right secret with a body that is no Update: 400, never a 5xx
            right = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
            async with http.post(url, data=b"[1, 2]", headers=right) as resp:
                assert resp.status == 400
        assert all(x["id"] != "4242" for x in decisions.seen)
        assert len(fake.sent) == 1
        assert await soft_of(d, chat()) == 1


async def test_startup_errors_say_what_is_wrong(
    fake: FakeTelegram, run: Callable[..., Any]
) -> None:
    with pytest.raises(StartupError, match="Telegram refused the token"):
        async with run(bot("alpha", "999:wrong", fake)):
            pass
    unreachable = bot("alpha", TOKEN_A, fake, api_base=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(StartupError, match="cannot reach the Bot API"):
        async with run(unreachable):
            pass


async def test_a_reply_in_progress_finishes_when_the_daemon_stops(
    fake: FakeTelegram, redis_url: str, key_prefix: str
) -> None:
    """SIGTERM while the backend works: polling stops at once, the answer in
    progress is still sent and counted within the grace period."""
    gate = sample_backends.new_gate()
    backend = {"type": "python", "callable": "tests.sample_backends:gated"}
    d = build(redis_url, key_prefix, bot("alpha", TOKEN_A, fake, backend=backend))
    await d.start()
    await fake.user_says(GROUP, ALICE, "@alpha_bot take your time")
    await fake.wait_until(lambda: fake.chat_actions, what="typing: the backend is at work")
    stopping = asyncio.create_task(d.stop())
    # Updater.stop's last getUpdates (timeout 0) confirms what was fetched: intake
    # is closed while the answer is still being worked on
    await fake.wait_until(
        lambda: any(c.params.get("timeout") in ("0", 0) for c in fake.calls_of("getUpdates")),
        what="polling to stop",
    )
    assert fake.bot(BOT_A).polling == 0 and fake.sent == []
    assert not stopping.done()  # waiting for the answer, not cutting it off
    gate.set()
    await stopping
    [reply] = by(BOT_A, fake.sent)
    assert reply.text == "worked on it"
    store = RedisStore.from_url(redis_url, prefix=key_prefix)
    try:
        status = await store.status(chat(), str(BOT_A), Limits())
        assert (status.soft, status.rate_used) == (1, 1)
    finally:
        await store.close()
        await forget(redis_url, key_prefix)


def test_the_send_rate_limits_come_from_the_config(fake: FakeTelegram, redis_url: str) -> None:
    """PTB's AIORateLimiter keeps no public settings: its private fields are
    read here, the only place they are."""
    lifted = {"rate_limit": {"overall_per_second": 0, "group_per_minute": 0}}
    for telegram_cfg, overall, group in (({}, 30, 20), (lifted, None, 0)):
        d = build(redis_url, "unused", bot("alpha", TOKEN_A, fake, telegram=telegram_cfg))
        (adapter,) = d.adapters
        limiter = adapter.app.bot.rate_limiter  # type: ignore[attr-defined]
        base = limiter._base_limiter
        assert (None if base is None else base.max_rate, limiter._group_max_rate) == (
            overall,
            group,
        )


async def test_httpcore_finds_sniffio_so_no_request_repeats_a_failing_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """httpcore (under PTB's httpx) asks sniffio which event loop runs on every
    request, and falls back to asyncio when `import sniffio` fails, after
    searching sys.path again each time: 5-7 % of a Telegram daemon's CPU.
    The telegram extra installs it; httpx and anyio no longer do."""
    import builtins

    from httpcore._synchronization import current_async_library

    failed: list[str] = []
    real_import = builtins.__import__

    def spying(name: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return real_import(name, *args, **kwargs)
        except ImportError:
            failed.append(name)
            raise

    monkeypatch.setattr(builtins, "__import__", spying)
    assert [current_async_library() for _ in range(3)] == ["asyncio"] * 3
    assert failed == []


async def test_a_slow_backend_holds_up_no_other_chat(
    fake: FakeTelegram, run: Callable[..., Any]
) -> None:
    """Sixteen chats, each with a question the backend is still working on:
    all sixteen reach the backend at once, and all are answered once it
    answers."""
    gate = sample_backends.new_gate()
    backend = {"type": "python", "callable": "tests.sample_backends:gated"}
    chats = 16
    async with run(bot("alpha", TOKEN_A, fake, backend=backend)):
        topics = [fake.create_topic(GROUP, ALICE, f"topic {n}") for n in range(chats)]
        for topic in topics:
            await fake.user_says(GROUP, ALICE, "@alpha_bot think hard", thread_id=topic)
        reached = []
        async with asyncio.timeout(10):
            for _ in topics:
                reached.append(await sample_backends.entered().get())
        assert len({m.chat.key for m in reached}) == chats
        gate.set()
        sent = await fake.wait_sent(chats, chat_id=GROUP)
        assert sorted(s.thread_id or 0 for s in sent) == sorted(topics)


async def test_a_reply_the_bot_api_cannot_take_is_unsent_and_names_no_token(
    fake: FakeTelegram, run: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Replies go out as one sendMessage POST on the adapter's own session:
    the Bot API going away mid-answer releases the slot (the store hears it)
    with a line that names the error's kind, never the URL that holds the
    token."""
    caplog.set_level(logging.INFO)
    gate = sample_backends.new_gate()
    backend = {"type": "python", "callable": "tests.sample_backends:gated"}
    async with run(bot("alpha", TOKEN_A, fake, backend=backend)) as d:
        await fake.user_says(GROUP, ALICE, "@alpha_bot think hard")
        async with asyncio.timeout(10):
            await sample_backends.entered().get()
        await fake.close()  # the Bot API is gone
        gate.set()
        await d.inflight.idle()
        status = await d.server.admins["alpha"].status(chat())
        assert status.rate_used == 0  # the slot came back
    [line] = [r for r in caplog.records if "sending the reply" in r.getMessage()]
    assert "Telegram could not be reached (ClientConnectorError)" in line.getMessage()
    secret = TOKEN_A.split(":", 1)[1]
    # botbouncer's own lines: PTB's and httpx's debug lines carry the URL, which
    # the daemon's formatter masks on the way out (tests/test_log_safety.py)
    ours = [r for r in caplog.records if r.name.startswith("botbouncer")]
    assert ours and not [r for r in ours if secret in r.getMessage()]
