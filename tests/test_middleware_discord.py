"""The discord.py middleware (botbouncer.discord) end to end: real discord.py
Clients, written as discord.py's quickstart does, plus one `guard(...)` line,
connected to the fake Discord of tests/fakes/discord/.

Decisions are awaited through the decision log lines the gateway writes, the
platform side through the fake's recorded messages: nothing sleeps.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import discord
import pytest

from botbouncer import Bouncer, ConfigError
from botbouncer.discord import DiscordGuard, guard
from gateway.store import Limits, Store
from gateway.store.redis import RedisStore
from tests.conftest import StoreFactory
from tests.daemons import running
from tests.decisions import Decisions
from tests.examples import EXAMPLES, example, program_env
from tests.fakes.discord import (
    ALICE,
    ALPHA_ROLE,
    BOT_A,
    BOT_B,
    GENERAL,
    THREAD,
    TOKEN_A,
    TOKEN_B,
    FakeDiscord,
    RecordedMessage,
    pointed_at,
    populate,
)
from tests.redis_server import free_port

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = EXAMPLES / "discord_bot.py"
WARNING = "Bot turn limit reached (4/4)"


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord() as f:
        populate(f)
        with pointed_at(f):
            yield f
        assert f.unknown_routes == []


def chat(channel: int) -> str:
    return f"discord:{channel}"


def config(name: str, **policy: Any) -> dict[str, Any]:
    """A decide bot that answers every message, people's and bots'."""
    bot = {
        "name": name,
        "platform": "discord",
        "mode": "decide",
        "bot_messages": "all",
        "respond_to": "all",
        "turns": {"soft_limit": 4, "hard_limit": 10},
        **policy,
    }
    return {"bots": [bot]}


Handler = Callable[[discord.Client, discord.Message], Awaitable[None]]


class Shown(list[discord.Message]):
    """The messages a client's on_message was called with, awaitable."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Condition()

    async def add(self, message: discord.Message) -> None:
        self.append(message)
        async with self.changed:
            self.changed.notify_all()

    async def wait_for(self, message_id: int) -> None:
        async with asyncio.timeout(5), self.changed:
            await self.changed.wait_for(lambda: message_id in [m.id for m in self])

    @staticmethod
    def of(client: discord.Client) -> Shown:
        shown: Shown = client.shown  # type: ignore[attr-defined]
        return shown


async def echo(client: discord.Client, message: discord.Message) -> None:
    await message.reply(message.content, mention_author=False)


def bot(
    bouncer: Bouncer, handler: Handler = echo, **kw: Any
) -> tuple[discord.Client, DiscordGuard]:
    """A quickstart client whose on_message skips its own messages and hands
    the rest to `handler`; every message it was shown is in `Shown.of(client)`."""
    intents = discord.Intents.default()
    intents.message_content = True
    # The fake sends its guild right after READY: no need to wait discord.py's
    # default 2 s for more guilds before on_ready.
    client = discord.Client(intents=intents, guild_ready_timeout=0.05)
    g = guard(client, bouncer, **kw)
    shown = Shown()
    client.shown = shown  # type: ignore[attr-defined]

    @client.event
    async def on_message(message: discord.Message) -> None:
        await shown.add(message)
        if message.author == client.user:
            return
        await handler(client, message)

    return client, g


@asynccontextmanager
async def online(*clients: tuple[discord.Client, str]) -> AsyncIterator[None]:
    """Each client logged in, connected and ready; closed in reverse."""
    async with AsyncExitStack() as stack:
        for client, token in clients:
            await client.login(token)
            task = asyncio.create_task(client.connect(reconnect=False))

            async def close(
                client: discord.Client = client, task: asyncio.Task[None] = task
            ) -> None:
                await client.close()
                with suppress(Exception):
                    await task

            stack.push_async_callback(close)
            async with asyncio.timeout(10):
                await client.wait_until_ready()
        yield


async def quiet(
    fake: FakeDiscord,
    decisions: Decisions,
    channel: int,
    bots: tuple[int, ...],
    settle: Callable[[], Awaitable[Any]],
    *,
    warnings: bool = True,
) -> list[RecordedMessage]:
    """Wait until the bots in `channel` have stopped: each bot decided every
    message there that is not its own, its handlers ended (`settle`), and
    each `reply` (and, with `warnings`, `warn`) was answered. Returns what
    the bots sent there."""
    while True:
        said = fake.messages(channel)
        for m in said:
            for b in bots:
                if b != m.author_id:
                    await decisions.wait(m.id, b)
        await settle()
        if len(fake.messages(channel)) == len(said):
            sent = [m for m in said if m.author_id in bots]
            acted = ("reply", "warn") if warnings else ("reply",)
            expected = [d for d in decisions.seen
                        if d["chat"] == chat(channel) and d["action"] in acted]  # fmt: skip
            assert len(sent) == len(expected)
            return sent


def idle(*guards: DiscordGuard) -> Callable[[], Awaitable[None]]:
    async def settle() -> None:
        for g in guards:
            await g.wait_idle()

    return settle


def warnings_in(sent: list[RecordedMessage]) -> list[RecordedMessage]:
    return [m for m in sent if "limit reached" in m.content]


async def status(store: Store, key: str, bot: int) -> tuple[int, int]:
    """(soft, rate slots used by `bot`) in chat `key`."""
    s = await store.status(key, str(bot), Limits())
    return s.soft, s.rate_used


@asynccontextmanager
async def alpha_and_beta(
    stores: StoreFactory, **kw: Any
) -> AsyncIterator[tuple[Store, DiscordGuard, DiscordGuard]]:
    """alpha and beta, two echo bots, each with its own Bouncer on one shared
    store (on Redis, two clients), connected."""
    store, other = await stores(2)
    async with (
        Bouncer(config("alpha"), platform="discord", store=store) as b1,
        Bouncer(config("beta"), platform="discord", store=other) as b2,
    ):
        (c1, g1), (c2, g2) = bot(b1, **kw), bot(b2, **kw)
        async with online((c1, TOKEN_A), (c2, TOKEN_B)):
            yield store, g1, g2


# -- two wrapped bots -------------------------------------------------------------------


async def test_two_wrapped_bots_stop_at_the_soft_limit_with_one_warning(
    fake: FakeDiscord, stores: StoreFactory, decisions: Decisions
) -> None:
    """alpha and beta echo every message, each other's too: they stop at the
    soft limit, one of them posts the one warning, every message is counted
    once (its echo, which discord.py shows its sender, adds nothing)."""
    async with alpha_and_beta(stores) as (store, g1, g2):
        said = await fake.user_says(GENERAL, ALICE, "hello bots")
        sent = await quiet(fake, decisions, GENERAL, (BOT_A, BOT_B), idle(g1, g2))
        assert (await status(store, chat(GENERAL), BOT_A))[0] == 5  # 4 replies + the warning
        # each bot was shown its own messages: on_message saw them, nothing counted them twice
        mine = [m.id for m in Shown.of(g1.client) if m.author.id == BOT_A]
        assert sorted(mine) == [m.id for m in sent if m.author_id == BOT_A]
    [warning] = warnings_in(sent)
    assert WARNING in warning.content
    assert warning.message_reference is None  # plain, in the channel
    assert warning.payload["mentions"] == []
    replies = [m for m in sent if m is not warning]
    assert len(replies) == 4  # the soft limit
    assert {m.content for m in replies} == {"hello bots"}
    assert {m.author_id for m in replies} == {BOT_A, BOT_B}
    assert {int(m.message_reference["message_id"]) for m in replies if m.message_reference} >= {
        int(said["id"])
    }
    # the warned-about message reached no handler: nobody answered it
    [warned] = [d for d in decisions.seen if d["action"] == "warn"]
    assert str(warning.author_id) == warned["bot"]
    answered = [m.message_reference["message_id"] for m in replies if m.message_reference]
    assert int(warned["id"]) not in {int(a) for a in answered}


async def test_a_person_resumes_them_and_a_thread_is_counted_on_its_own(
    fake: FakeDiscord, stores: StoreFactory, decisions: Decisions
) -> None:
    async with alpha_and_beta(stores) as (store, g1, g2):
        await fake.user_says(GENERAL, ALICE, "hello bots")
        before = await quiet(fake, decisions, GENERAL, (BOT_A, BOT_B), idle(g1, g2))
        assert len(warnings_in(before)) == 1
        inside = await fake.user_says(THREAD, ALICE, "hello in here")
        threaded = await quiet(fake, decisions, THREAD, (BOT_A, BOT_B), idle(g1, g2))
        assert len(threaded) == 5 and len(warnings_in(threaded)) == 1
        assert (await status(store, chat(THREAD), BOT_A))[0] == 5
        assert fake.messages(GENERAL)[1:] == before  # the channel's count held nothing up
        again = await fake.user_says(GENERAL, ALICE, "carry on")
        for b in (BOT_A, BOT_B):
            seen = await decisions.wait(again["id"], b)
            assert (seen["turn"], seen["action"], seen["soft"]) == ("reset", "reply", 0)
        after = await quiet(fake, decisions, GENERAL, (BOT_A, BOT_B), idle(g1, g2))
    resumed = after[len(before) :]
    assert len(resumed) == 5 and len(warnings_in(resumed)) == 1
    assert inside["id"] not in {m.id for m in after}


async def test_warnings_false_posts_no_warning(
    fake: FakeDiscord, stores: StoreFactory, decisions: Decisions
) -> None:
    async with alpha_and_beta(stores, warnings=False) as (store, g1, g2):
        await fake.user_says(GENERAL, ALICE, "hello bots")
        sent = await quiet(fake, decisions, GENERAL, (BOT_A, BOT_B), idle(g1, g2), warnings=False)
        assert len(sent) == 4 and warnings_in(sent) == []
        assert (await status(store, chat(GENERAL), BOT_A))[0] == 4
    [warned] = [d for d in decisions.seen if d["action"] == "warn"]
    assert int(warned["id"]) not in {
        int(m.message_reference["message_id"]) for m in sent if m.message_reference
    }


# -- a wrapped bot and a fronted one ----------------------------------------------------


async def test_a_wrapped_bot_and_a_fronted_bot_share_one_count(
    fake: FakeDiscord, redis_url: str, key_prefix: str, decisions: Decisions
) -> None:
    """beta (wrapped, its Bouncer on Redis) and alpha (fronted by the daemon,
    echo backend) answer each other on one Redis: each message is counted
    once, by its sender when sent; the other, receiving it, finds it counted."""
    fronted = {
        "name": "alpha",
        "platform": "discord",
        "token": TOKEN_A,
        "api_base": fake.api_base,
        "backend": {"type": "echo"},
        "bot_messages": "all",
        "turns": {"soft_limit": 4, "hard_limit": 10},
    }
    store = RedisStore.from_url(redis_url, prefix=key_prefix, context_size=8)
    try:
        async with (
            running(redis_url, key_prefix, fronted) as daemon,
            Bouncer(config("beta"), platform="discord", store=store) as b2,
        ):
            await fake.wait_connected(BOT_A)
            client, g2 = bot(b2)
            async with online((client, TOKEN_B)):

                async def settle() -> None:
                    await g2.wait_idle()
                    await daemon.inflight.idle()

                await fake.user_says(GENERAL, ALICE, f"<@{BOT_A}> hello")
                sent = await quiet(fake, decisions, GENERAL, (BOT_A, BOT_B), settle)
            assert {m.author_id for m in sent} == {BOT_A, BOT_B}
            assert len(warnings_in(sent)) == 1
            # no turn counted twice: the counter is the number of bot messages
            assert (await status(store, chat(GENERAL), BOT_A))[0] == len(sent) == 5
            places = []
            for m in sent:
                receiver = BOT_A if m.author_id == BOT_B else BOT_B
                places.append((await decisions.wait(m.id, receiver))["soft"])
            assert sorted(places) == list(range(1, len(sent) + 1))
    finally:
        await store.close()


# -- tickets, drops, own messages ---------------------------------------------------------


async def test_a_handler_that_sends_nothing_or_raises_releases_its_slot(
    fake: FakeDiscord, decisions: Decisions, caplog: pytest.LogCaptureFixture
) -> None:
    """Rate cap 1: had the quiet handler or the failing one kept the slot,
    the next addressed message would not be answered."""

    async def answer(client: discord.Client, message: discord.Message) -> None:
        if "quiet" in message.content:
            return
        if "boom" in message.content:
            raise RuntimeError("boom")
        await message.reply("at your service")

    policy = {"respond_to": "mentions", "rate_cap": {"max_replies": 1}}
    async with Bouncer(config("alpha", **policy), platform="discord") as bouncer:
        client, g = bot(bouncer, answer)
        async with online((client, TOKEN_A)):
            for text in ("be quiet", "boom"):
                said = await fake.user_says(GENERAL, ALICE, f"<@{BOT_A}> {text}")
                await decisions.wait(said["id"], BOT_A)
                await g.wait_idle()
                assert await status(bouncer.store, chat(GENERAL), BOT_A) == (0, 0)
                released = [d for d in decisions.seen if d["id"] == str(said["id"])]
                assert [d["reason"] for d in released] == [None, "backend_empty"]
            said = await fake.user_says(GENERAL, ALICE, f"<@{BOT_A}> hello")
            reply = (await fake.wait_for_messages(GENERAL, 4))[-1]  # after the three said
            assert reply.content == "at your service"
            assert reply.message_reference is not None
            assert int(reply.message_reference["message_id"]) == int(said["id"])
            await g.wait_idle()
            capped = await fake.user_says(GENERAL, ALICE, f"<@{BOT_A}> and again")
            seen = await decisions.wait(capped["id"], BOT_A)
            assert (seen["action"], seen["reason"]) == ("drop", "rate_capped")
            await g.wait_idle()
    assert [m.author_id for m in fake.messages(GENERAL)].count(BOT_A) == 1
    assert "boom" in caplog.text  # discord.py's on_error logged it


async def test_a_handler_that_outlives_its_ticket_is_logged_and_its_reply_still_counted(
    fake: FakeDiscord, decisions: Decisions
) -> None:
    """ticket_seconds 0.5: a handler still running after it is logged once
    (the ticket lapsed); what it sends later is the bot's own turn."""
    gate = asyncio.Event()
    lapsed = asyncio.Event()

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "still run after" in record.getMessage():
                lapsed.set()

    async def slow(client: discord.Client, message: discord.Message) -> None:
        await gate.wait()
        await message.reply("sorry for the wait")

    watch = Watch()
    logging.getLogger("botbouncer.discord").addHandler(watch)
    policy = {"respond_to": "mentions", "ticket_seconds": 0.5}
    try:
        async with Bouncer(config("alpha", **policy), platform="discord") as bouncer:
            client, g = bot(bouncer, slow)
            async with online((client, TOKEN_A)):
                said = await fake.user_says(GENERAL, ALICE, f"<@{BOT_A}> take your time")
                await decisions.wait(said["id"], BOT_A)
                async with asyncio.timeout(10):
                    await lapsed.wait()
                assert await status(bouncer.store, chat(GENERAL), BOT_A) == (0, 1)
                gate.set()
                await g.wait_idle()
                [_, reply] = fake.messages(GENERAL)
                assert reply.content == "sorry for the wait"
                assert (await status(bouncer.store, chat(GENERAL), BOT_A))[0] == 1
    finally:
        logging.getLogger("botbouncer.discord").removeHandler(watch)


async def test_a_message_that_is_dropped_never_reaches_on_message(
    fake: FakeDiscord, decisions: Decisions
) -> None:
    policy = {"respond_to": "mentions"}
    async with Bouncer(config("alpha", **policy), platform="discord") as bouncer:
        client, g = bot(bouncer)
        async with online((client, TOKEN_A)):
            # nor wait_for("message"): it resolves with the message let through
            waiting = asyncio.ensure_future(client.wait_for("message", timeout=5))
            chatting = await fake.user_says(GENERAL, ALICE, "just chatting")
            asked = await fake.user_says(GENERAL, ALICE, f"<@{BOT_A}> and you?")
            assert (await decisions.wait(chatting["id"], BOT_A))["reason"] == "not_addressed"
            await decisions.wait(asked["id"], BOT_A)
            assert (await waiting).id == int(asked["id"])
            await g.wait_idle()
            [reply] = [m for m in fake.messages(GENERAL) if m.author_id == BOT_A]
            await Shown.of(client).wait_for(reply.id)  # its own, shown as usual
            assert [m.id for m in Shown.of(client)] == [int(asked["id"]), reply.id]


async def test_a_mention_of_the_bots_own_role_reaches_on_message(
    fake: FakeDiscord, decisions: Decisions
) -> None:
    # Breaks if the guard reads only user mentions: a person who picked the
    # bot's own role from the autocomplete was decided not_addressed and never
    # reached the bot's code.
    async with Bouncer(config("alpha", respond_to="mentions"), platform="discord") as bouncer:
        client, g = bot(bouncer)
        async with online((client, TOKEN_A)):
            asked = await fake.user_says(GENERAL, ALICE, f"<@&{ALPHA_ROLE}> are you there?")
            assert (await decisions.wait(asked["id"], BOT_A))["action"] == "reply"
            await g.wait_idle()
            assert [m.id for m in Shown.of(client)][:1] == [int(asked["id"])]


async def test_a_message_sent_outside_a_handler_is_a_turn_and_its_echo_is_shown(
    fake: FakeDiscord, decisions: Decisions
) -> None:
    """A scheduled post (from the bot's own task) is this bot's turn in its
    channel, counted when sent; discord.py shows the bot its echo as usual."""
    async with Bouncer(config("alpha"), platform="discord") as bouncer:
        client, _ = bot(bouncer)
        async with online((client, TOKEN_A)):
            posted = await client.get_partial_messageable(GENERAL).send("the daily digest")
            assert await status(bouncer.store, chat(GENERAL), BOT_A) == (1, 0)
            await Shown.of(client).wait_for(posted.id)
            echo = await decisions.wait(posted.id, BOT_A)
            assert (echo["reason"], echo["soft"]) == ("own_message", 1)
            assert await status(bouncer.store, chat(GENERAL), BOT_A) == (1, 0)
            assert bouncer.bot_id == str(BOT_A)


async def test_when_the_store_is_down_nothing_is_answered(fake: FakeDiscord) -> None:
    failed: list[logging.LogRecord] = []
    logged = asyncio.Event()

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.ERROR:
                failed.append(record)
                logged.set()

    watch = Watch()
    logging.getLogger("botbouncer.discord").addHandler(watch)
    down = RedisStore.from_url(f"redis://127.0.0.1:{free_port()}/0", call_timeout=1)
    try:
        async with Bouncer(config("alpha"), platform="discord", store=down) as bouncer:
            client, g = bot(bouncer)
            async with online((client, TOKEN_A)):
                said = await fake.user_says(GENERAL, ALICE, f"<@{BOT_A}> hello?")
                async with asyncio.timeout(10):
                    await logged.wait()
                await g.wait_idle()
            assert Shown.of(client) == []
        assert [m.id for m in fake.messages(GENERAL)] == [int(said["id"])]
        [line] = failed
        assert "not handled" in line.getMessage() and str(said["id"]) in line.getMessage()
    finally:
        logging.getLogger("botbouncer.discord").removeHandler(watch)
        await down.close()


# -- the example, the hooks, the refusals ---------------------------------------------------


async def test_the_documented_example_answers_hello_under_the_guard(
    fake: FakeDiscord, decisions: Decisions
) -> None:
    """docs/examples/discord_bot.py's `build`, as it is: discord.py's
    quickstart plus the guard. Its answer is counted; a bot's "$hello" is
    answered too, until the limit."""
    policy = {"turns": {"soft_limit": 2, "hard_limit": 3}, "rate_cap": {"max_replies": 1}}
    async with Bouncer(config("alpha", **policy), platform="discord") as bouncer:
        client = example("discord_bot").build(bouncer)
        async with online((client, TOKEN_A)):
            said = await fake.user_says(GENERAL, ALICE, "$hello")
            [_, hello] = await fake.wait_for_messages(GENERAL, 2)
            assert (hello.author_id, hello.content) == (BOT_A, "Hello!")
            await decisions.wait(hello.id, BOT_A)  # its echo
            assert await status(bouncer.store, chat(GENERAL), BOT_A) == (1, 1)
            again = await fake.user_says(GENERAL, ALICE, "$hello")
            seen = await decisions.wait(again["id"], BOT_A)
            assert (seen["action"], seen["reason"]) == ("drop", "rate_capped")
    assert len(fake.messages(GENERAL)) == 3
    assert said["id"] != again["id"]


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({}, "set DISCORD_TOKEN"),
        ({"DISCORD_TOKEN": "x", "BOTBOUNCER_CONFIG": "/nonexistent/b.yml"}, "/nonexistent/b.yml"),
    ],
)
def test_the_example_refuses_a_missing_token_or_config_in_one_line(
    env: dict[str, str], says: str
) -> None:
    run = subprocess.run(
        [sys.executable, str(EXAMPLE)], env=program_env(**env),
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert says in run.stderr and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_discord_py_still_has_the_hooks_the_guard_uses() -> None:
    """The guard replaces the MESSAGE_CREATE parser and wraps two methods on
    the instance: Client._schedule_event (private, named here so that a
    change of discord.py fails this test by name), through which dispatch
    starts every handler, and HTTPClient.send_message(channel_id, *, params)."""
    assert "self._schedule_event(coro, method" in inspect.getsource(discord.Client.dispatch)
    params = inspect.signature(discord.http.HTTPClient.send_message).parameters
    assert list(params) == ["self", "channel_id", "params"]
    assert "send_message(" in inspect.getsource(discord.abc.Messageable.send)


async def test_guard_refuses_a_second_guard_and_another_platform() -> None:
    async with Bouncer(config("alpha"), platform="discord") as bouncer:
        client = discord.Client(intents=discord.Intents.default())
        guard(client, bouncer)
        with pytest.raises(ValueError, match="guarded already"):
            guard(client, bouncer)
        await client.close()
    elsewhere = {"bots": [{"name": "t", "platform": "telegram", "mode": "decide"}]}
    async with Bouncer(elsewhere) as bouncer:
        with pytest.raises(ConfigError, match="not discord"):
            guard(discord.Client(intents=discord.Intents.default()), bouncer)
