"""The fake Discord works with the REAL discord.py client (2.7.x)."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import discord
import pytest
from discord import app_commands
from discord.gateway import DiscordWebSocket
from discord.http import Route

from tests.fakes.discord import (
    ALICE,
    BOT_A,
    BOT_B,
    EPHEMERAL,
    GENERAL,
    GUILD,
    MOD,
    MOD_ROLE,
    OTHER_BOT,
    OWNER,
    RANDOM,
    THREAD,
    TOKEN_A,
    TOKEN_B,
    FakeDiscord,
    Intent,
    MessageType,
    RecordedMessage,
    guild_id_for_shard,
    member,
    pointed_at,
    populate,
    shard_of,
    text_channel,
)

pytestmark = pytest.mark.timeout(30)


INTENTS = discord.Intents.default() | discord.Intents(message_content=True)
T = TypeVar("T")


class Recorder:
    """Mixed into a discord.py client: records ready and on_message, waits with deadlines."""

    def _setup_recorder(self) -> None:
        self.ready_event = asyncio.Event()
        self.seen: list[discord.Message] = []
        self.changed = asyncio.Condition()

    async def on_ready(self) -> None:
        self.ready_event.set()

    async def on_message(self, message: discord.Message) -> None:
        self.seen.append(message)
        async with self.changed:
            self.changed.notify_all()

    async def wait_seen(
        self,
        predicate: Callable[[discord.Message], bool],
        timeout: float = 5.0,  # noqa: ASYNC109
    ) -> discord.Message:
        def found() -> discord.Message | None:
            return next((m for m in self.seen if predicate(m)), None)

        async with asyncio.timeout(timeout), self.changed:
            got = await self.changed.wait_for(found)
        assert got is not None
        return got


class Client(Recorder, discord.Client):
    def __init__(self, **options: Any) -> None:
        options.setdefault("intents", INTENTS)
        super().__init__(guild_ready_timeout=0.05, **options)
        self._setup_recorder()


class ShardedClient(Recorder, discord.AutoShardedClient):
    def __init__(self, **options: Any) -> None:
        super().__init__(intents=INTENTS, guild_ready_timeout=0.05, **options)
        self._setup_recorder()

    async def before_identify_hook(self, shard_id: int | None, *, initial: bool = False) -> None:
        return None  # discord.py sleeps 5 s before every non-initial IDENTIFY


C = TypeVar("C", bound=Recorder)


@asynccontextmanager
async def running(client: C, token: str) -> AsyncIterator[C]:
    timeout = 5.0
    assert isinstance(client, discord.Client)
    task = asyncio.create_task(client.start(token))
    ready = asyncio.create_task(client.ready_event.wait())
    try:
        done, _ = await asyncio.wait({task, ready}, timeout=timeout, return_when="FIRST_COMPLETED")
        if task in done:
            task.result()  # raises what start() raised
        assert ready in done, "client never became ready"
        yield client
    finally:
        ready.cancel()
        await client.close()
        await asyncio.wait_for(task, timeout)  # a clean close: start() returns, no exception


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    base, gateway = Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY
    async with FakeDiscord() as f:
        populate(f)
        with pointed_at(f):
            yield f
        assert f.unknown_routes == []
    assert (base, gateway) == (Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY)


def message_id(wanted: int) -> Callable[[discord.Message], bool]:
    return lambda m: m.id == wanted


def recorded(fake: FakeDiscord, wanted: int) -> RecordedMessage:
    """The fake's record of message `wanted`."""
    return next(m for c in fake.channels for m in fake.messages(c) if m.id == wanted)


def channel_of(client: discord.Client, channel_id: int) -> discord.TextChannel:
    channel = client.get_channel(channel_id)
    assert isinstance(channel, discord.TextChannel)
    return channel


async def test_login_ready_and_guild_cache(fake: FakeDiscord) -> None:
    intents = INTENTS | discord.Intents(members=True)  # else discord.py caches only itself
    async with running(Client(intents=intents), TOKEN_A) as client:
        assert client.user is not None and client.user.id == BOT_A and client.user.bot
        assert client.application_id == BOT_A
        guild = client.get_guild(GUILD)
        assert guild is not None and guild.name == "test guild" and guild.owner_id == OWNER
        assert {c.id for c in guild.text_channels} == {GENERAL, RANDOM}
        thread = guild.get_thread(THREAD)
        assert thread is not None and thread.parent_id == GENERAL
        assert {m.id for m in guild.members} >= {OWNER, ALICE, MOD, OTHER_BOT, BOT_A, BOT_B}
        assert guild.me.guild_permissions.send_messages
        mod = guild.get_member(MOD)
        assert mod is not None and mod.guild_permissions.manage_guild
        alice = guild.get_member(ALICE)
        assert alice is not None and not alice.guild_permissions.manage_guild
        [session] = fake.connected(BOT_A)
        assert (session.shard_id, session.shard_count) == (0, 1)
        assert session.intents & Intent.MESSAGE_CONTENT
        called = [(r.method, r.path) for r in fake.requests]
        assert called == [("GET", "/users/@me"), ("GET", "/oauth2/applications/@me")]
    assert fake.connected(BOT_A) == []


async def test_user_message_reaches_on_message(fake: FakeDiscord) -> None:
    async with running(Client(), TOKEN_A) as client:
        first = await fake.user_says(GENERAL, ALICE, "hello there")
        msg = await client.wait_seen(lambda m: m.id == int(first["id"]))
        assert msg.content == "hello there"
        assert msg.author.id == ALICE and isinstance(msg.author, discord.Member)
        assert msg.channel.id == GENERAL and msg.guild is not None and msg.guild.id == GUILD
        assert msg.type is discord.MessageType.default and not msg.author.bot

        said = await fake.user_says(GENERAL, OTHER_BOT, f"<@{BOT_A}> and <@&{MOD_ROLE}> @everyone")
        pings = await client.wait_seen(lambda m: m.id == int(said["id"]))
        assert pings.author.bot
        assert [u.id for u in pings.mentions] == [BOT_A]
        assert [r.id for r in pings.role_mentions] == [MOD_ROLE]
        assert pings.mention_everyone
        assert [m.id for m in fake.messages(GENERAL)] == [int(first["id"]), int(said["id"])]


async def test_channel_send_is_recorded_and_seen_by_every_bot(fake: FakeDiscord) -> None:
    async with running(Client(), TOKEN_A) as a, running(Client(), TOKEN_B) as b:
        sent = await channel_of(a, GENERAL).send("from alpha")
        [rec] = fake.messages(GENERAL)
        assert (rec.id, rec.author_id, rec.content, rec.via) == (
            sent.id,
            BOT_A,
            "from alpha",
            "rest",
        )
        assert sent.author.id == BOT_A
        own = await a.wait_seen(lambda m: m.id == sent.id)
        assert own.author == a.user
        theirs = await b.wait_seen(lambda m: m.id == sent.id)
        assert theirs.author.id == BOT_A and theirs.author.bot and theirs.content == "from alpha"

        reply = await theirs.reply("beta replies")
        rec2 = recorded(fake, reply.id)
        assert rec2.author_id == BOT_B and rec2.type == MessageType.REPLY
        assert rec2.message_reference is not None
        assert int(rec2.message_reference["message_id"]) == sent.id
        assert rec2.pinged_users == [BOT_A]  # discord.py pings the replied author by default
        seen = await a.wait_seen(lambda m: m.id == reply.id)
        assert seen.type is discord.MessageType.reply
        assert seen.reference is not None and seen.reference.message_id == sent.id
        assert isinstance(seen.reference.resolved, discord.Message)
        assert seen.reference.resolved.content == "from alpha"
        assert [m.id for m in fake.sent_by(BOT_B)] == [reply.id]
        assert len(fake.dispatched("MESSAGE_CREATE")) == 4  # 2 messages x 2 bots


async def test_thread_message_arrives_in_thread(fake: FakeDiscord) -> None:
    async with running(Client(), TOKEN_A) as client:
        said = await fake.user_says(THREAD, ALICE, "in the thread")
        msg = await client.wait_seen(lambda m: m.id == int(said["id"]))
        assert isinstance(msg.channel, discord.Thread)
        assert msg.channel.id == THREAD and msg.channel.parent_id == GENERAL
        sent = await msg.channel.send("thread answer")
        assert recorded(fake, sent.id).channel_id == THREAD


async def test_system_messages(fake: FakeDiscord) -> None:
    async with running(Client(), TOKEN_A) as client:
        pin = await fake.user_says(
            GENERAL, ALICE, "", message_type=MessageType.CHANNEL_PINNED_MESSAGE
        )
        got_pin = await client.wait_seen(lambda m: m.id == int(pin["id"]))
        assert got_pin.type is discord.MessageType.pins_add and got_pin.is_system()


async def test_allowed_mentions_decide_pings(fake: FakeDiscord) -> None:
    async with running(Client(), TOKEN_A) as client:
        channel = channel_of(client, GENERAL)
        text = f"@everyone look <@{ALICE}> <@&{MOD_ROLE}>"
        quiet = await channel.send(text, allowed_mentions=discord.AllowedMentions.none())
        loud = await channel.send(text, allowed_mentions=discord.AllowedMentions(everyone=True))
        users_only = await channel.send(
            text, allowed_mentions=discord.AllowedMentions(everyone=False, users=True, roles=False)
        )
        q, lo, u = (recorded(fake, m.id) for m in (quiet, loud, users_only))
        assert (q.pinged_everyone, q.pinged_users, q.pinged_roles) == (False, [], [])
        assert (lo.pinged_everyone, lo.pinged_users, lo.pinged_roles) == (True, [ALICE], [MOD_ROLE])
        assert (u.pinged_everyone, u.pinged_users, u.pinged_roles) == (False, [ALICE], [])
        seen = await client.wait_seen(lambda m: m.id == quiet.id)
        assert not seen.mention_everyone and seen.mentions == []
        assert quiet.mentions == [] and loud.mention_everyone


async def test_dm_reaches_only_its_bot(fake: FakeDiscord) -> None:
    dm = fake.next_id()
    fake.add_dm(dm, fake.users[ALICE], bot_id=BOT_A)
    async with running(Client(), TOKEN_A) as a, running(Client(), TOKEN_B) as b:
        said = await fake.user_says(dm, ALICE, "psst")
        got = await a.wait_seen(lambda m: m.id == int(said["id"]))
        assert isinstance(got.channel, discord.DMChannel) and got.guild is None
        sent = await got.channel.send("hush")
        rec = recorded(fake, sent.id)
        assert (rec.channel_id, rec.guild_id, rec.content) == (dm, None, "hush")
        assert all(m.channel.id != dm for m in b.seen)  # another bot's DM is not delivered
        assert [d.user_id for d in fake.dispatched("MESSAGE_CREATE")] == [BOT_A, BOT_A]


async def test_what_is_not_implemented_fails_clearly(fake: FakeDiscord) -> None:
    async with running(Client(), TOKEN_A) as client:
        channel = channel_of(client, GENERAL)
        with pytest.raises(discord.HTTPException, match="file uploads are not implemented"):
            await channel.send("file", file=discord.File(io.BytesIO(b"x"), "a.txt"))
        with pytest.raises(discord.HTTPException, match="embeds are not implemented"):
            await channel.send(embed=discord.Embed(title="an embed"))
        with pytest.raises(discord.NotFound):
            await client.fetch_user(ALICE)  # GET /users/{id}: not a route of the fake
        assert fake.unknown_routes == [("GET", f"/api/v10/users/{ALICE}")]
        [session] = fake.connected(BOT_A)
        await client.change_presence(status=discord.Status.idle)  # gateway op 3
        await fake.wait_until(lambda: session.resumes == 1 and fake.connected(BOT_A), what="resume")
        assert fake.unknown_routes[1:] == [("WS", "op 3")]
        assert fake.messages(GENERAL) == []
        fake.unknown_routes.clear()  # the fixture checks that nothing else was unknown


async def test_raw_dispatch_is_delivered_as_given(fake: FakeDiscord) -> None:
    async with running(Client(), TOKEN_A) as client:
        payload = fake.message_payload(GENERAL, ALICE, f"<@{BOT_A}> raw")
        assert [m["id"] for m in payload["mentions"]] == [str(BOT_A)]
        payload["content"] = "changed"
        [sent] = await fake.dispatch_raw("MESSAGE_CREATE", payload, guild_id=GUILD)
        assert (sent.user_id, sent.event, sent.data) == (BOT_A, "MESSAGE_CREATE", payload)
        got = await client.wait_seen(lambda m: m.id == int(payload["id"]))
        assert got.content == "changed"
        assert fake.messages(GENERAL) == []  # not recorded as a message


async def test_typing_is_recorded(fake: FakeDiscord) -> None:
    async with running(Client(), TOKEN_A) as client:
        async with channel_of(client, RANDOM).typing():
            pass
        await fake.wait_until(lambda: fake.typing, what="typing")
        assert fake.typing[0].channel_id == RANDOM and fake.typing[0].user_id == BOT_A


async def test_app_command_sync_and_invoke(fake: FakeDiscord) -> None:
    client = Client()
    tree = app_commands.CommandTree(client)
    group = app_commands.Group(name="bouncer", description="botbouncer controls")
    invoked: list[tuple[int, bool, int]] = []

    @group.command(name="limits", description="set limits")
    async def limits(interaction: discord.Interaction, soft: int) -> None:
        invoked.append((interaction.user.id, interaction.permissions.manage_guild, soft))
        await interaction.response.send_message(f"soft={soft}", ephemeral=True)

    tree.add_command(group, guild=discord.Object(GUILD))  # sync(guild=) syncs only these
    async with running(client, TOKEN_A):
        synced = await tree.sync(guild=discord.Object(GUILD))
        assert [c.name for c in synced] == ["bouncer"]
        [stored] = fake.commands[(BOT_A, GUILD)]
        assert stored["options"][0]["name"] == "limits" and stored["options"][0]["type"] == 1

        pending = await fake.invoke(BOT_A, GUILD, GENERAL, MOD, ["bouncer", "limits"], {"soft": 5})
        answer = await pending.response()
        assert (answer.type, answer.content, answer.flags) == (4, "soft=5", EPHEMERAL)
        assert answer.ephemeral
        assert fake.messages(GENERAL) == []  # ephemeral answers are not channel messages

        plain = await fake.invoke(BOT_A, GUILD, GENERAL, ALICE, ["bouncer", "limits"], {"soft": 7})
        assert (await plain.response()).content == "soft=7"
        assert invoked == [(MOD, True, 5), (ALICE, False, 7)]
        option = pending.payload["data"]["options"][0]
        assert option == {
            "type": 1,
            "name": "limits",
            "options": [{"name": "soft", "type": 4, "value": 5}],
        }
        assert len(fake.dispatched("INTERACTION_CREATE", BOT_A)) == 2


async def test_non_ephemeral_answer_is_a_channel_message(fake: FakeDiscord) -> None:
    client = Client()
    tree = app_commands.CommandTree(client)

    @tree.command(name="ping", description="pong")
    async def ping(interaction: discord.Interaction) -> None:
        await interaction.response.send_message("pong")

    async with running(client, TOKEN_A), running(Client(), TOKEN_B) as other:
        await tree.sync()
        assert (BOT_A, None) in fake.commands
        pending = await fake.invoke(BOT_A, GUILD, GENERAL, ALICE, ["ping"])
        assert (await pending.response()).content == "pong"
        [msg] = await fake.wait_for_messages(GENERAL, 1)
        assert (msg.author_id, msg.content, msg.type, msg.via) == (BOT_A, "pong", 20, "interaction")
        seen = await other.wait_seen(lambda m: m.id == msg.id)
        assert seen.interaction_metadata is not None and seen.interaction_metadata.user.id == ALICE
        assert seen.content == "pong"


async def test_sharded_client_gets_each_guild_once(fake: FakeDiscord) -> None:
    g0, g1 = guild_id_for_shard(0, 2), guild_id_for_shard(1, 2)
    c0, c1 = fake.next_id(), fake.next_id()
    assert (shard_of(g0, 2), shard_of(g1, 2)) == (0, 1)
    fake.add_guild(
        g0, "shard zero", channels=[text_channel(c0, "zero")], members=[member(ALICE, "alice")]
    )
    fake.add_guild(
        g1, "shard one", channels=[text_channel(c1, "one")], members=[member(ALICE, "alice")]
    )
    async with running(ShardedClient(shard_count=2), TOKEN_A) as client:
        assert {g.id for g in client.guilds} == {GUILD, g0, g1}
        g0_obj, g1_obj = client.get_guild(g0), client.get_guild(g1)
        assert g0_obj is not None and g1_obj is not None
        assert (g0_obj.shard_id, g1_obj.shard_id) == (0, 1)
        assert sorted(s.shard_id for s in fake.connected(BOT_A)) == [0, 1]
        for channel in (c0, c1):
            said = await fake.user_says(channel, ALICE, f"hi {channel}")
            await client.wait_seen(message_id(int(said["id"])))
        assert [m.channel.id for m in client.seen] == [c0, c1]
        created = fake.dispatched("MESSAGE_CREATE", BOT_A)
        assert [(d.shard_id, int(d.data["channel_id"])) for d in created] == [(0, c0), (1, c1)]
        assert ("GET", "/gateway/bot") not in [(r.method, r.path) for r in fake.requests]


async def test_sharded_client_without_shard_count_asks_gateway_bot(fake: FakeDiscord) -> None:
    fake.recommended_shards = 2
    async with running(ShardedClient(), TOKEN_A) as client:
        assert client.shard_count == 2
        assert ("GET", "/gateway/bot") in [(r.method, r.path) for r in fake.requests]
        assert sorted(s.shard_id for s in fake.connected(BOT_A)) == [0, 1]


async def test_rate_limited_send_is_retried(fake: FakeDiscord) -> None:
    async with running(Client(), TOKEN_A) as client:
        fake.rate_limit_next("POST", f"/channels/{GENERAL}/messages", retry_after=0.05)
        sent = await channel_of(client, GENERAL).send("after a 429")
        assert fake.rate_limited == [("POST", f"/channels/{GENERAL}/messages")]
        assert [m.id for m in fake.messages(GENERAL)] == [sent.id]
        statuses = [r.status for r in fake.requests if r.path == f"/channels/{GENERAL}/messages"]
        assert statuses == [429, 200]


async def test_resume_after_server_disconnect(fake: FakeDiscord) -> None:
    async with running(Client(), TOKEN_A) as client:
        [session] = fake.connected(BOT_A)
        assert await fake.disconnect(BOT_A) == 1
        await fake.wait_until(lambda: session.resumes == 1 and fake.connected(BOT_A), what="resume")
        said = await fake.user_says(GENERAL, ALICE, "still there?")
        msg = await client.wait_seen(lambda m: m.id == int(said["id"]))
        assert msg.content == "still there?"
        assert len(fake.dispatched("READY", BOT_A)) == 1
        assert len(fake.dispatched("RESUMED", BOT_A)) == 1


async def test_message_content_intent_is_enforced(fake: FakeDiscord) -> None:
    intents = discord.Intents.default()
    async with running(Client(intents=intents), TOKEN_A) as client:
        plain = await fake.user_says(GENERAL, ALICE, "secret")
        pinged = await fake.user_says(GENERAL, ALICE, f"<@{BOT_A}> hi")
        got_plain = await client.wait_seen(lambda m: m.id == int(plain["id"]))
        got_pinged = await client.wait_seen(lambda m: m.id == int(pinged["id"]))
        assert got_plain.content == "" and got_pinged.content == f"<@{BOT_A}> hi"


async def test_bad_token(fake: FakeDiscord) -> None:
    with pytest.raises(discord.LoginFailure):
        async with running(Client(), "not-a-token"):
            pass
    assert [(r.status, r.path) for r in fake.requests] == [(401, "/users/@me")]


async def test_wait_until_times_out_with_a_reason(fake: FakeDiscord) -> None:
    with pytest.raises(TimeoutError, match="2 messages in channel"):
        await fake.wait_for_messages(GENERAL, 2, timeout=0.05)
