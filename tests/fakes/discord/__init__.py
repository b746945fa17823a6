"""A fake Discord (REST + gateway) that the real discord.py client (2.7) can talk to.

Start it, point discord.py at it, connect real clients, drive it from tests:

    async with FakeDiscord() as fake:
        fake.add_bot("tok", BOT_ID, "bouncer")
        fake.add_guild(GUILD_ID, "g", channels=[text_channel(CHAN_ID, "general")],
                       members=[member(USER_ID, "alice")])
        with pointed_at(fake):
            ... client.start("tok") in a task, wait for on_ready ...
            await fake.user_says(CHAN_ID, USER_ID, "hello")
            sent = await fake.wait_for_messages(CHAN_ID, 2)

`pointed_at(fake)` sets `discord.http.Route.BASE` to `{fake.url}/api/v10` and
`DiscordWebSocket.DEFAULT_GATEWAY` to the fake's websocket (discord.py's plain
`Client`, and `AutoShardedClient` with an explicit `shard_count`, never ask
`/gateway/bot`: they connect to DEFAULT_GATEWAY), and restores both afterwards.
Client.login asks GET /users/@me and GET /oauth2/applications/@me; then the client
connects to the gateway, IDENTIFYs and gets READY and a GUILD_CREATE per guild of
its shard.

The modules, each built on those before it:

- world.py: users, bots, guilds with roles, members and channels, DMs (set-up and
  lookups); permission and intent bits, message types, snowflakes; the helpers
  text_channel, thread_channel, member, role, and `populate` (the shared world);
- payloads.py: the JSON handed out: members, channels, GUILD_CREATE, the bot and its
  application, and messages with the pings Discord works out (`RecordedMessage`);
- gateway.py: websocket sessions (identify, resume, heartbeats), dispatches by
  shard and intents, the channel messages and their MESSAGE_CREATE;
- rest.py: the REST routes, authentication, rate limits (`rate_limit_next`), the
  records of calls;
- interactions.py: slash commands invoked (`invoke`) and answered (the callback);
- fake.py: FakeDiscord itself, its lifecycle and what people do (`user_says`), and
  `pointed_at`.

Only what botbouncer's adapter, the benchmark and discord.py's start-up use is
implemented: the REST routes listed in rest.py (sending messages as JSON, without
files, embeds or components), gateway ops heartbeat, identify and resume, and
interaction callbacks (no followups or edits). Anything else is answered with a 404
(an unknown gateway op closes the session with 4001) and recorded in
`unknown_routes`, so a test that starts to use it fails with a message naming it.

Everything is recorded (`messages`, `typing`, `commands`, `requests`, `dispatches`,
`rate_limited`, `unknown_routes`, each interaction's callback) and every change
notifies one asyncio.Condition, so tests wait with deadlines (`wait_until`,
`wait_for_messages`, `wait_connected`) instead of sleeping.
"""

from tests.fakes.discord.fake import FakeDiscord, pointed_at
from tests.fakes.discord.gateway import Dispatch, SessionState
from tests.fakes.discord.interactions import PendingInteraction, RecordedCallback
from tests.fakes.discord.payloads import RecordedMessage
from tests.fakes.discord.rest import RecordedRequest, TypingEvent
from tests.fakes.discord.world import (
    ALICE,
    ALPHA_ROLE,
    BOT_A,
    BOT_B,
    BOT_PERMISSIONS,
    DISCORD_EPOCH_MS,
    EPHEMERAL,
    EVERYONE_PERMISSIONS,
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
    FakeBot,
    FakeChannel,
    FakeGuild,
    FakeMember,
    FakeRole,
    FakeUser,
    Intent,
    Json,
    MessageType,
    Perm,
    guild_id_for_shard,
    member,
    populate,
    role,
    shard_of,
    text_channel,
    thread_channel,
)

__all__ = [
    "ALICE",
    "ALPHA_ROLE",
    "BOT_A",
    "BOT_B",
    "BOT_PERMISSIONS",
    "DISCORD_EPOCH_MS",
    "EPHEMERAL",
    "EVERYONE_PERMISSIONS",
    "GENERAL",
    "GUILD",
    "MOD",
    "MOD_ROLE",
    "OTHER_BOT",
    "OWNER",
    "RANDOM",
    "THREAD",
    "TOKEN_A",
    "TOKEN_B",
    "Dispatch",
    "FakeBot",
    "FakeChannel",
    "FakeDiscord",
    "FakeGuild",
    "FakeMember",
    "FakeRole",
    "FakeUser",
    "Intent",
    "Json",
    "MessageType",
    "PendingInteraction",
    "Perm",
    "RecordedCallback",
    "RecordedMessage",
    "RecordedRequest",
    "SessionState",
    "TypingEvent",
    "guild_id_for_shard",
    "member",
    "pointed_at",
    "populate",
    "role",
    "shard_of",
    "text_channel",
    "thread_channel",
]
