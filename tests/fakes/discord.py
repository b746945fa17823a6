"""A fake Discord (REST + gateway) that the real discord.py client can talk to.

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

The gateway always answers with uncompressed TEXT frames: discord.py 2.7.1 parses
text frames as JSON directly and only decompresses BINARY frames
(`DiscordWebSocket.received_message`), whatever `compress=` it asked for.

Everything is recorded (`messages`, `typing`, `commands`, `callbacks`, `followups`,
`requests`, `dispatches`, `unknown_routes`) and every change notifies one
asyncio.Condition, so tests wait with deadlines (`wait_until`, `wait_for_messages`)
instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from tests.fakes.recording import Recording

Json = dict[str, Any]

log = logging.getLogger("tests.fakes.discord")

API_VERSION = 10
DISCORD_EPOCH_MS = 1420070400000


class Perm:
    """Permission bits (https://discord.com/developers/docs/topics/permissions)."""

    CREATE_INSTANT_INVITE = 1 << 0
    KICK_MEMBERS = 1 << 1
    BAN_MEMBERS = 1 << 2
    ADMINISTRATOR = 1 << 3
    MANAGE_CHANNELS = 1 << 4
    MANAGE_GUILD = 1 << 5
    ADD_REACTIONS = 1 << 6
    VIEW_CHANNEL = 1 << 10
    SEND_MESSAGES = 1 << 11
    MANAGE_MESSAGES = 1 << 13
    EMBED_LINKS = 1 << 14
    ATTACH_FILES = 1 << 15
    READ_MESSAGE_HISTORY = 1 << 16
    MENTION_EVERYONE = 1 << 17
    USE_EXTERNAL_EMOJIS = 1 << 18
    CHANGE_NICKNAME = 1 << 26
    USE_APPLICATION_COMMANDS = 1 << 31
    CREATE_PUBLIC_THREADS = 1 << 35
    SEND_MESSAGES_IN_THREADS = 1 << 38
    ALL = (1 << 51) - 1


class Intent:
    """Gateway intent bits."""

    GUILDS = 1 << 0
    GUILD_MEMBERS = 1 << 1
    GUILD_PRESENCES = 1 << 8
    GUILD_MESSAGES = 1 << 9
    DIRECT_MESSAGES = 1 << 12
    MESSAGE_CONTENT = 1 << 15
    PRIVILEGED = GUILD_MEMBERS | GUILD_PRESENCES | MESSAGE_CONTENT


class MessageType:
    DEFAULT = 0
    MEMBER_JOIN = 7
    CHANNEL_PINNED_MESSAGE = 6
    PREMIUM_GUILD_SUBSCRIPTION = 8
    THREAD_CREATED = 18
    REPLY = 19
    CHAT_INPUT_COMMAND = 20


class OptionType:
    SUB_COMMAND = 1
    SUB_COMMAND_GROUP = 2
    STRING = 3
    INTEGER = 4
    BOOLEAN = 5
    USER = 6
    CHANNEL = 7
    ROLE = 8
    MENTIONABLE = 9
    NUMBER = 10
    ATTACHMENT = 11


EVERYONE_PERMISSIONS = (
    Perm.CREATE_INSTANT_INVITE
    | Perm.ADD_REACTIONS
    | Perm.VIEW_CHANNEL
    | Perm.SEND_MESSAGES
    | Perm.EMBED_LINKS
    | Perm.ATTACH_FILES
    | Perm.READ_MESSAGE_HISTORY
    | Perm.MENTION_EVERYONE
    | Perm.USE_EXTERNAL_EMOJIS
    | Perm.CHANGE_NICKNAME
    | Perm.USE_APPLICATION_COMMANDS
    | Perm.CREATE_PUBLIC_THREADS
    | Perm.SEND_MESSAGES_IN_THREADS
)
BOT_PERMISSIONS = EVERYONE_PERMISSIONS | Perm.MANAGE_MESSAGES
EPHEMERAL = 1 << 6

_USER_MENTION = re.compile(r"<@!?([0-9]{15,20})>")
_ROLE_MENTION = re.compile(r"<@&([0-9]{15,20})>")
_EVERYONE = re.compile(r"@(everyone|here)\b")


def _iso(ms: float | None = None) -> str:
    when = time.time() if ms is None else ms / 1000
    return dt.datetime.fromtimestamp(when, dt.UTC).isoformat()


def snowflake_time_ms(snowflake: int) -> int:
    return (snowflake >> 22) + DISCORD_EPOCH_MS


def shard_of(guild_id: int, shard_count: int) -> int:
    """The shard that owns a guild, as Discord computes it."""
    return (guild_id >> 22) % shard_count


def guild_id_for_shard(shard_id: int, shard_count: int, index: int = 0) -> int:
    """A realistic (19-digit) guild snowflake owned by `shard_id` of `shard_count`."""
    base = (int(time.time() * 1000) - DISCORD_EPOCH_MS) // shard_count
    return (((base + index) * shard_count + shard_id) << 22) | 1


# -- guild setup objects -------------------------------------------------------------


@dataclass
class FakeUser:
    id: int
    username: str
    bot: bool = False
    global_name: str | None = None

    def payload(self) -> Json:
        data: Json = {
            "id": str(self.id),
            "username": self.username,
            "discriminator": "0",
            "global_name": self.global_name,
            "avatar": None,
            "public_flags": 0,
        }
        if self.bot:
            data["bot"] = True
        return data


@dataclass
class FakeRole:
    id: int
    name: str
    permissions: int = 0
    position: int = 1
    mentionable: bool = False
    managed: bool = False

    def payload(self) -> Json:
        return {
            "id": str(self.id),
            "name": self.name,
            "permissions": str(self.permissions),
            "position": self.position,
            "color": 0,
            "colors": {"primary_color": 0, "secondary_color": None, "tertiary_color": None},
            "hoist": False,
            "icon": None,
            "unicode_emoji": None,
            "managed": self.managed,
            "mentionable": self.mentionable,
            "flags": 0,
        }


@dataclass
class FakeMember:
    user: FakeUser
    roles: list[int] = field(default_factory=list)
    nick: str | None = None

    @property
    def id(self) -> int:
        return self.user.id


@dataclass
class FakeChannel:
    id: int
    name: str
    type: int = 0  # 0 text, 11 public thread, 12 private thread, 1 DM
    parent_id: int | None = None  # the text channel of a thread, or a category
    position: int = 0
    owner_id: int | None = None  # threads
    topic: str | None = None
    recipient: FakeUser | None = None  # DMs
    dm_bot_id: int | None = None  # DMs: the bot on the other end (None: every bot)

    @property
    def is_thread(self) -> bool:
        return self.type in (10, 11, 12)


@dataclass
class FakeGuild:
    id: int
    name: str
    owner_id: int
    channels: dict[int, FakeChannel]
    roles: dict[int, FakeRole]
    members: dict[int, FakeMember]
    bot_role_id: int
    joined_at: str = field(default_factory=_iso)


@dataclass
class FakeBot:
    token: str
    user: FakeUser
    application_id: int
    allowed_intents: int = Intent.PRIVILEGED  # privileged intents enabled in the "portal"


def text_channel(channel_id: int, name: str, *, position: int = 0) -> FakeChannel:
    return FakeChannel(channel_id, name, type=0, position=position)


def thread_channel(
    channel_id: int,
    name: str,
    parent_id: int,
    *,
    owner_id: int | None = None,
    private: bool = False,
) -> FakeChannel:
    return FakeChannel(
        channel_id, name, type=12 if private else 11, parent_id=parent_id, owner_id=owner_id
    )


def member(
    user_id: int,
    username: str,
    *,
    bot: bool = False,
    roles: Iterable[int] = (),
    nick: str | None = None,
) -> FakeMember:
    return FakeMember(FakeUser(user_id, username, bot=bot), list(roles), nick)


def role(
    role_id: int,
    name: str,
    permissions: int = 0,
    *,
    position: int = 1,
    mentionable: bool = False,
) -> FakeRole:
    return FakeRole(role_id, name, permissions, position, mentionable)


# -- records -------------------------------------------------------------------------


@dataclass
class RecordedMessage:
    """One message in a channel, said by a user (`user_says`) or sent by a bot (REST)."""

    id: int
    channel_id: int
    guild_id: int | None
    author_id: int
    content: str
    type: int
    payload: Json  # the MESSAGE_CREATE data as dispatched (before per-bot intent filtering)
    via: str  # "user_says" | "rest" | "interaction" | "followup"
    allowed_mentions: Json | None = None  # exactly as sent (None: not sent)
    message_reference: Json | None = None  # exactly as sent
    pinged_everyone: bool = False
    pinged_roles: list[int] = field(default_factory=list)
    pinged_users: list[int] = field(default_factory=list)
    content_user_mentions: list[int] = field(default_factory=list)  # every <@id> in content
    flags: int = 0
    nonce: str | int | None = None
    embeds: list[Json] = field(default_factory=list)
    attachments: list[str] = field(default_factory=list)  # file names
    interaction_id: int | None = None
    bot_token_user: int | None = None  # for REST sends: the bot whose token was used

    @property
    def ephemeral(self) -> bool:
        return bool(self.flags & EPHEMERAL)


@dataclass(frozen=True)
class TypingEvent:
    channel_id: int
    user_id: int


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str  # below /api/v10, e.g. "/channels/123/messages"
    status: int
    user_id: int | None  # the bot whose token authenticated it


@dataclass(frozen=True)
class Dispatch:
    session_id: str
    user_id: int
    shard_id: int
    event: str
    data: Json


@dataclass
class RecordedCallback:
    interaction_id: int
    token: str
    bot_user_id: int
    type: int  # 4 message, 5 deferred message, 6 deferred update, 7 update, 9 modal...
    data: Json
    with_response: bool
    message_id: int | None = None

    @property
    def flags(self) -> int:
        return int(self.data.get("flags") or 0)

    @property
    def ephemeral(self) -> bool:
        return bool(self.flags & EPHEMERAL)

    @property
    def content(self) -> str | None:
        content = self.data.get("content")
        return None if content is None else str(content)


@dataclass
class RecordedFollowup:
    interaction_id: int
    bot_user_id: int
    method: str  # POST (followup), PATCH (edit), DELETE
    message_id: str  # "@original" or an id; "" for a new followup
    data: Json


@dataclass
class CommandSync:
    application_id: int
    guild_id: int | None
    payload: list[Json]


class PendingInteraction:
    """An INTERACTION_CREATE sent by `invoke`; `await response()` for its callback."""

    def __init__(self, payload: Json, bot_user_id: int) -> None:
        self.payload = payload
        self.bot_user_id = bot_user_id
        self.id = int(payload["id"])
        self.token = str(payload["token"])
        self.callback: asyncio.Future[RecordedCallback] = asyncio.get_running_loop().create_future()
        self.original_message: Json | None = None

    async def response(self, timeout: float = 5.0) -> RecordedCallback:  # noqa: ASYNC109
        try:
            return await asyncio.wait_for(asyncio.shield(self.callback), timeout)
        except TimeoutError:
            raise TimeoutError(
                f"fake discord: no callback for interaction {self.id} within {timeout}s"
            ) from None


class _Json404(Exception):
    pass


class _HttpError(Exception):
    def __init__(self, status: int, message: str, code: int = 0, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body: Json = {"message": message, "code": code, **extra}


# -- gateway sessions ----------------------------------------------------------------


@dataclass
class SessionState:
    """A gateway session (survives its websocket for RESUME)."""

    session_id: str
    bot: FakeBot
    shard_id: int
    shard_count: int
    intents: int
    seq: int = 0
    resumes: int = 0


class _Connection:
    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self.state: SessionState | None = None
        self.lock = asyncio.Lock()

    async def send(self, op: int, d: Any, t: str | None = None) -> None:
        async with self.lock:
            seq: int | None = None
            if op == 0 and self.state is not None:
                self.state.seq += 1
                seq = self.state.seq
            frame = json.dumps({"op": op, "d": d, "s": seq, "t": t}, separators=(",", ":"))
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self.ws.send_str(frame)


def _json_response(
    body: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    # discord.py only parses a body as JSON when content-type is exactly application/json
    # (no "; charset=utf-8"), so set the header by hand.
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    return web.Response(body=json.dumps(body).encode(), status=status, headers=hdrs)


def _route_bucket(method: str, path: str) -> str:
    return uuid.uuid5(uuid.NAMESPACE_URL, method + re.sub(r"\d{5,}", "{id}", path)).hex[:16]


class FakeDiscord(Recording):
    """An aiohttp fake of Discord's REST API (v10) and gateway for discord.py clients."""

    label = "fake discord"

    def __init__(self, *, heartbeat_interval_ms: int = 41250, recommended_shards: int = 1) -> None:
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.recommended_shards = recommended_shards
        self.url = ""
        self.gateway_url = ""
        self._runner: web.AppRunner | None = None
        super().__init__()
        self._last_id = 0

        self.bots: dict[str, FakeBot] = {}  # by token
        self.users: dict[int, FakeUser] = {}
        self.guilds: dict[int, FakeGuild] = {}
        self.channels: dict[int, FakeChannel] = {}
        self._channel_guild: dict[int, int] = {}

        self._messages: dict[int, list[RecordedMessage]] = {}
        self._by_id: dict[int, RecordedMessage] = {}
        self.typing: list[TypingEvent] = []
        self.commands: dict[tuple[int, int | None], list[Json]] = {}
        self.command_syncs: list[CommandSync] = []
        self.callbacks: list[RecordedCallback] = []
        self.followups: list[RecordedFollowup] = []
        self.interactions: dict[int, PendingInteraction] = {}
        self.requests: list[RecordedRequest] = []
        self.unknown_routes: list[tuple[str, str]] = []
        self.dispatches: list[Dispatch] = []
        self.rate_limited: list[tuple[str, str]] = []
        self._rate_limit_next: dict[tuple[str, str], list[float]] = {}

        self.sessions: dict[str, SessionState] = {}  # every session ever identified
        self._conns: set[_Connection] = set()
        self.identify_failures: list[tuple[int, str]] = []  # (close code, reason)

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> FakeDiscord:
        app = web.Application(middlewares=[self._middleware])
        api = f"/api/v{API_VERSION}"
        r = app.router
        r.add_get("/gateway", self._gateway)
        r.add_get("/gateway/", self._gateway)
        r.add_get(f"{api}/gateway", self._get_gateway)
        r.add_get(f"{api}/gateway/bot", self._get_gateway_bot)
        r.add_get(f"{api}/users/@me", self._get_me)
        r.add_get(f"{api}/oauth2/applications/@me", self._get_application)
        r.add_get(f"{api}/applications/@me", self._get_application)
        r.add_post(f"{api}/users/@me/channels", self._create_dm)
        r.add_get(f"{api}/users/{{user_id:\\d+}}", self._get_user)
        r.add_get(f"{api}/channels/{{channel_id:\\d+}}", self._get_channel)
        r.add_post(f"{api}/channels/{{channel_id:\\d+}}/messages", self._post_message)
        r.add_get(f"{api}/channels/{{channel_id:\\d+}}/messages", self._get_messages)
        r.add_get(
            f"{api}/channels/{{channel_id:\\d+}}/messages/{{message_id:\\d+}}", self._get_message
        )
        r.add_post(f"{api}/channels/{{channel_id:\\d+}}/typing", self._post_typing)
        r.add_get(f"{api}/guilds/{{guild_id:\\d+}}", self._get_guild)
        r.add_get(f"{api}/guilds/{{guild_id:\\d+}}/channels", self._get_guild_channels)
        r.add_get(f"{api}/guilds/{{guild_id:\\d+}}/members/{{user_id:\\d+}}", self._get_member)
        cmds = f"{api}/applications/{{app_id:\\d+}}"
        r.add_put(f"{cmds}/commands", self._put_commands)
        r.add_get(f"{cmds}/commands", self._get_commands)
        r.add_put(f"{cmds}/guilds/{{guild_id:\\d+}}/commands", self._put_commands)
        r.add_get(f"{cmds}/guilds/{{guild_id:\\d+}}/commands", self._get_commands)
        r.add_post(
            f"{api}/interactions/{{interaction_id:\\d+}}/{{token}}/callback", self._post_callback
        )
        hooks = f"{api}/webhooks/{{app_id:\\d+}}/{{token}}"
        r.add_post(hooks, self._post_followup)
        r.add_route("*", f"{hooks}/messages/{{message_id}}", self._webhook_message)
        r.add_route("*", "/{tail:.*}", self._unknown)
        self._runner = web.AppRunner(app, shutdown_timeout=1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        self.gateway_url = f"ws://127.0.0.1:{port}/gateway"
        return self

    @property
    def api_base(self) -> str:
        return f"{self.url}/api/v{API_VERSION}"

    async def close(self) -> None:
        for conn in list(self._conns):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.ws.close(code=1001, message=b"fake closing"), 1)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeDiscord:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- setup -----------------------------------------------------------------------

    def next_id(self) -> int:
        """A fresh, increasing snowflake for now."""
        now = (int(time.time() * 1000) - DISCORD_EPOCH_MS) << 22
        self._last_id = max(self._last_id + 1, now)
        return self._last_id

    def add_bot(
        self,
        token: str,
        user_id: int,
        username: str,
        *,
        application_id: int | None = None,
        allowed_intents: int = Intent.PRIVILEGED,
    ) -> FakeBot:
        """A bot user; it is a member of every guild (role "bots" with BOT_PERMISSIONS).

        `allowed_intents`: the privileged intents switched on for it in the "developer
        portal"; IDENTIFY asking for others is closed with 4014 as on Discord.
        """
        bot = FakeBot(
            token, FakeUser(user_id, username, bot=True), application_id or user_id, allowed_intents
        )
        self.bots[token] = bot
        self.users[user_id] = bot.user
        return bot

    def bot(self, user_id: int) -> FakeBot:
        for bot in self.bots.values():
            if bot.user.id == user_id:
                return bot
        raise KeyError(f"fake discord: no bot with user id {user_id}")

    def add_guild(
        self,
        guild_id: int,
        name: str,
        *,
        channels: Iterable[FakeChannel] = (),
        members: Iterable[FakeMember] = (),
        roles: Iterable[FakeRole] = (),
        owner_id: int | None = None,
        everyone_permissions: int = EVERYONE_PERMISSIONS,
    ) -> FakeGuild:
        """A guild. Its @everyone role has id == guild_id; bots join with a "bots" role.

        The owner (default: the first member given) has every permission, as on Discord.
        """
        members_by_id = {m.id: m for m in members}
        all_roles = {guild_id: FakeRole(guild_id, "@everyone", everyone_permissions, position=0)}
        bot_role = FakeRole(self.next_id(), "bots", BOT_PERMISSIONS, position=1, managed=False)
        all_roles[bot_role.id] = bot_role
        all_roles.update({r.id: r for r in roles})
        if owner_id is None:
            owner_id = next(iter(members_by_id), None) or self.next_id()
        guild = FakeGuild(
            guild_id,
            name,
            owner_id,
            channels={},
            roles=all_roles,
            members=members_by_id,
            bot_role_id=bot_role.id,
        )
        self.guilds[guild_id] = guild
        for m in members_by_id.values():
            self.users.setdefault(m.id, m.user)
        for channel in channels:
            self.add_channel(guild_id, channel)
        return guild

    def add_channel(self, guild_id: int, channel: FakeChannel) -> FakeChannel:
        """A text channel or thread in an existing guild (before clients connect)."""
        guild = self.guilds[guild_id]
        if channel.is_thread:
            if channel.parent_id is None:
                raise ValueError(f"thread {channel.id} needs a parent_id")
            if channel.owner_id is None:
                channel.owner_id = guild.owner_id
        guild.channels[channel.id] = channel
        self.channels[channel.id] = channel
        self._channel_guild[channel.id] = guild_id
        return channel

    def add_member(self, guild_id: int, new: FakeMember) -> FakeMember:
        self.guilds[guild_id].members[new.id] = new
        self.users.setdefault(new.id, new.user)
        return new

    def add_dm(self, channel_id: int, user: FakeUser, *, bot_id: int | None = None) -> FakeChannel:
        """A DM channel between `user` and a bot (`bot_id`; None: every bot gets its messages)."""
        self.users.setdefault(user.id, user)
        channel = FakeChannel(channel_id, "", type=1, recipient=user, dm_bot_id=bot_id)
        self.channels[channel_id] = channel
        return channel

    def rate_limit_next(self, method: str, path: str, retry_after: float = 0.05) -> None:
        """Answer the next `method path` (below /api/v10, e.g. "/channels/1/messages") with 429."""
        self._rate_limit_next.setdefault((method.upper(), path), []).append(retry_after)

    # -- inspection and waiting --------------------------------------------------------

    def messages(self, channel_id: int) -> list[RecordedMessage]:
        return list(self._messages.get(channel_id, []))

    def all_messages(self) -> list[RecordedMessage]:
        return sorted(self._by_id.values(), key=lambda m: m.id)

    def message(self, message_id: int) -> RecordedMessage:
        return self._by_id[message_id]

    def sent_by(self, user_id: int) -> list[RecordedMessage]:
        return [m for m in self.all_messages() if m.author_id == user_id]

    def connected(self, user_id: int | None = None) -> list[SessionState]:
        """Identified sessions with an open websocket (of one bot user, or all)."""
        return [
            c.state
            for c in self._conns
            if c.state is not None
            and not c.ws.closed
            and (user_id is None or c.state.bot.user.id == user_id)
        ]

    def dispatched(self, event: str, user_id: int | None = None) -> list[Dispatch]:
        return [
            d
            for d in self.dispatches
            if d.event == event and (user_id is None or d.user_id == user_id)
        ]

    async def wait_for_messages(
        self,
        channel_id: int,
        n: int,
        timeout: float = 5.0,  # noqa: ASYNC109
    ) -> list[RecordedMessage]:
        await self.wait_until(
            lambda: len(self._messages.get(channel_id, [])) >= n,
            timeout,
            f"{n} messages in channel {channel_id} (have {len(self.messages(channel_id))})",
        )
        return self.messages(channel_id)

    async def wait_connected(
        self,
        user_id: int,
        shards: int = 1,
        timeout: float = 5.0,  # noqa: ASYNC109
    ) -> None:
        await self.wait_until(
            lambda: len(self.connected(user_id)) >= shards,
            timeout,
            f"{shards} gateway session(s) of bot {user_id}",
        )

    # -- payload builders -----------------------------------------------------------

    def _user(self, user_id: int) -> FakeUser:
        try:
            return self.users[user_id]
        except KeyError:
            raise KeyError(f"fake discord: unknown user {user_id}") from None

    def _guild_members(self, guild: FakeGuild) -> list[FakeMember]:
        found = dict(guild.members)
        for bot in self.bots.values():
            found.setdefault(bot.user.id, FakeMember(bot.user, [guild.bot_role_id]))
        return list(found.values())

    def _member(self, guild: FakeGuild, user_id: int) -> FakeMember | None:
        if user_id in guild.members:
            return guild.members[user_id]
        for bot in self.bots.values():
            if bot.user.id == user_id:
                return FakeMember(bot.user, [guild.bot_role_id])
        return None

    def permissions(self, guild_id: int, user_id: int) -> int:
        """Guild-level permissions of a member (owner and administrators: everything)."""
        guild = self.guilds[guild_id]
        if user_id == guild.owner_id:
            return Perm.ALL
        found = self._member(guild, user_id)
        perms = guild.roles[guild.id].permissions
        for role_id in found.roles if found else []:
            if role_id in guild.roles:
                perms |= guild.roles[role_id].permissions
        return Perm.ALL if perms & Perm.ADMINISTRATOR else perms

    def _member_payload(self, guild: FakeGuild, m: FakeMember, *, with_user: bool = True) -> Json:
        data: Json = {
            "roles": [str(r) for r in m.roles],
            "nick": m.nick,
            "avatar": None,
            "banner": None,
            "joined_at": guild.joined_at,
            "premium_since": None,
            "deaf": False,
            "mute": False,
            "flags": 0,
            "pending": False,
            "communication_disabled_until": None,
        }
        if with_user:
            data["user"] = m.user.payload()
        return data

    def _channel_payload(self, channel: FakeChannel) -> Json:
        if channel.type == 1:
            assert channel.recipient is not None
            return {
                "id": str(channel.id),
                "type": 1,
                "last_message_id": None,
                "recipients": [channel.recipient.payload()],
                "flags": 0,
            }
        guild_id = self._channel_guild[channel.id]
        data: Json = {
            "id": str(channel.id),
            "type": channel.type,
            "guild_id": str(guild_id),
            "name": channel.name,
            "parent_id": None if channel.parent_id is None else str(channel.parent_id),
            "last_message_id": None,
            "rate_limit_per_user": 0,
            "flags": 0,
        }
        if channel.is_thread:
            data.update(
                owner_id=str(channel.owner_id),
                message_count=0,
                member_count=1,
                total_message_sent=0,
                thread_metadata={
                    "archived": False,
                    "auto_archive_duration": 1440,
                    "archive_timestamp": self.guilds[guild_id].joined_at,
                    "locked": False,
                    "create_timestamp": self.guilds[guild_id].joined_at,
                },
            )
        else:
            data.update(
                position=channel.position,
                permission_overwrites=[],
                topic=channel.topic,
                nsfw=False,
                default_auto_archive_duration=1440,
            )
        return data

    def _guild_create(self, guild: FakeGuild) -> Json:
        members = self._guild_members(guild)
        channels = [c for c in guild.channels.values() if not c.is_thread]
        threads = [c for c in guild.channels.values() if c.is_thread]
        return {
            "id": str(guild.id),
            "name": guild.name,
            "icon": None,
            "splash": None,
            "discovery_splash": None,
            "banner": None,
            "description": None,
            "owner_id": str(guild.owner_id),
            "region": None,
            "afk_channel_id": None,
            "afk_timeout": 300,
            "verification_level": 0,
            "default_message_notifications": 0,
            "explicit_content_filter": 0,
            "roles": [r.payload() for r in guild.roles.values()],
            "emojis": [],
            "stickers": [],
            "features": [],
            "mfa_level": 0,
            "application_id": None,
            "system_channel_id": str(channels[0].id) if channels else None,
            "system_channel_flags": 0,
            "rules_channel_id": None,
            "public_updates_channel_id": None,
            "safety_alerts_channel_id": None,
            "vanity_url_code": None,
            "premium_tier": 0,
            "premium_subscription_count": 0,
            "premium_progress_bar_enabled": False,
            "preferred_locale": "en-US",
            "nsfw_level": 0,
            "max_members": 500000,
            "max_video_channel_users": 25,
            "joined_at": guild.joined_at,
            "large": False,
            "unavailable": False,
            "lazy": True,
            "member_count": len(members),
            "members": [self._member_payload(guild, m) for m in members],
            "channels": [self._channel_payload(c) for c in channels],
            "threads": [self._channel_payload(c) for c in threads],
            "presences": [],
            "voice_states": [],
            "stage_instances": [],
            "guild_scheduled_events": [],
            "soundboard_sounds": [],
            "embedded_activities": [],
        }

    def _resolve_mentions(
        self,
        guild: FakeGuild | None,
        author_id: int,
        content: str,
        allowed: Json | None,
        replied: RecordedMessage | None,
    ) -> tuple[list[int], list[int], bool]:
        """(pinged users, pinged roles, pinged everyone) the way Discord decides them.

        No allowed_mentions: everything in the content pings (replies ping the replied
        author). Any allowed_mentions object: only what its `parse` list / `users` /
        `roles` / `replied_user` allow. @everyone and roles that are not mentionable need
        MENTION_EVERYONE.
        """
        if allowed is None:
            parse = {"users", "roles", "everyone"}
            allow_users: set[int] = set()
            allow_roles: set[int] = set()
            ping_replied = True
        else:
            parse = set(allowed.get("parse") or [])
            allow_users = {int(u) for u in allowed.get("users") or []}
            allow_roles = {int(r) for r in allowed.get("roles") or []}
            ping_replied = bool(allowed.get("replied_user", False))
        can_everyone = guild is None or bool(
            self.permissions(guild.id, author_id) & Perm.MENTION_EVERYONE
        )
        users: list[int] = []
        for uid in (int(u) for u in _USER_MENTION.findall(content)):
            if uid in self.users and ("users" in parse or uid in allow_users) and uid not in users:
                users.append(uid)
        if (
            replied is not None
            and ping_replied
            and replied.author_id not in users
            and replied.author_id != author_id
        ):
            users.append(replied.author_id)
        roles: list[int] = []
        if guild is not None:
            for rid in (int(r) for r in _ROLE_MENTION.findall(content)):
                r = guild.roles.get(rid)
                if (
                    r is not None
                    and ("roles" in parse or rid in allow_roles)
                    and (r.mentionable or can_everyone)
                    and rid not in roles
                ):
                    roles.append(rid)
        everyone = bool(_EVERYONE.search(content)) and "everyone" in parse and can_everyone
        return users, roles, everyone

    def _mention_payloads(self, guild: FakeGuild | None, user_ids: Iterable[int]) -> list[Json]:
        out = []
        for uid in user_ids:
            data = self._user(uid).payload()
            m = self._member(guild, uid) if guild else None
            if guild is not None and m is not None:
                data["member"] = self._member_payload(guild, m, with_user=False)
            out.append(data)
        return out

    def _reference_payload(self, referenced: RecordedMessage) -> Json:
        data = copy.deepcopy(referenced.payload)
        for key in ("referenced_message", "member", "guild_id"):
            data.pop(key, None)
        return data

    def _new_message(
        self,
        *,
        channel_id: int,
        author_id: int,
        content: str,
        message_type: int,
        via: str,
        allowed_mentions: Json | None,
        message_reference: Json | None,
        referenced: RecordedMessage | None,
        extra_mentions: Sequence[int] = (),
        extra_role_mentions: Sequence[int] = (),
        mention_everyone: bool | None = None,
        flags: int = 0,
        nonce: str | int | None = None,
        embeds: Sequence[Json] = (),
        tts: bool = False,
        attachments: Sequence[str] = (),
        extra: Mapping[str, Any] | None = None,
        interaction: PendingInteraction | None = None,
        bot_token_user: int | None = None,
    ) -> RecordedMessage:
        channel = self.channels.get(channel_id)
        if channel is None:
            raise KeyError(f"fake discord: unknown channel {channel_id}")
        guild_id = self._channel_guild.get(channel_id)
        guild = self.guilds[guild_id] if guild_id is not None else None
        author = self._user(author_id)
        users, roles, everyone = self._resolve_mentions(
            guild, author_id, content, allowed_mentions, referenced
        )
        for uid in extra_mentions:
            if uid not in users:
                users.append(uid)
        for rid in extra_role_mentions:
            if rid not in roles:
                roles.append(rid)
        if mention_everyone is not None:
            everyone = mention_everyone
        message_id = self.next_id()
        data: Json = {
            "id": str(message_id),
            "channel_id": str(channel_id),
            "author": author.payload(),
            "content": content,
            "timestamp": _iso(snowflake_time_ms(message_id)),
            "edited_timestamp": None,
            "tts": tts,
            "mention_everyone": everyone,
            "mentions": self._mention_payloads(guild, users),
            "mention_roles": [str(r) for r in roles],
            "attachments": [
                {
                    "id": str(self.next_id()),
                    "filename": name,
                    "size": 0,
                    "url": f"{self.url}/attachments/{name}",
                    "proxy_url": f"{self.url}/attachments/{name}",
                }
                for name in attachments
            ],
            "embeds": list(embeds),
            "pinned": False,
            "type": message_type,
            "flags": flags,
            "components": [],
        }
        if nonce is not None:
            data["nonce"] = nonce
        if guild is not None:
            data["guild_id"] = str(guild.id)
            m = self._member(guild, author_id)
            if m is not None:
                data["member"] = self._member_payload(guild, m, with_user=False)
        if referenced is not None:
            data["message_reference"] = {
                "type": 0,
                "message_id": str(referenced.id),
                "channel_id": str(referenced.channel_id),
                **({"guild_id": str(guild_id)} if guild_id is not None else {}),
            }
            data["referenced_message"] = self._reference_payload(referenced)
        if interaction is not None:
            data["application_id"] = str(self.bot(author_id).application_id)
            data["webhook_id"] = str(self.bot(author_id).application_id)
            user = interaction.payload.get("member", {}).get("user") or interaction.payload["user"]
            data["interaction_metadata"] = {
                "id": str(interaction.id),
                "type": interaction.payload["type"],
                "user": user,
                "authorizing_integration_owners": interaction.payload[
                    "authorizing_integration_owners"
                ],
                "name": interaction.payload["data"].get("name", ""),
                "command_type": 1,
            }
        if extra:
            data.update(extra)
        rec = RecordedMessage(
            id=message_id,
            channel_id=channel_id,
            guild_id=guild_id,
            author_id=author_id,
            content=content,
            type=message_type,
            payload=data,
            via=via,
            allowed_mentions=copy.deepcopy(allowed_mentions),
            message_reference=copy.deepcopy(message_reference),
            pinged_everyone=everyone,
            pinged_roles=roles,
            pinged_users=users,
            content_user_mentions=[int(u) for u in _USER_MENTION.findall(content)],
            flags=flags,
            nonce=nonce,
            embeds=list(embeds),
            attachments=list(attachments),
            interaction_id=interaction.id if interaction else None,
            bot_token_user=bot_token_user,
        )
        return rec

    async def _store_and_fanout(
        self, rec: RecordedMessage, *, ephemeral_to: int | None = None
    ) -> None:
        """Record a message and dispatch MESSAGE_CREATE (ephemeral ones are never dispatched)."""
        if ephemeral_to is None:
            self._messages.setdefault(rec.channel_id, []).append(rec)
            self._by_id[rec.id] = rec
            await self._fanout("MESSAGE_CREATE", rec.payload, rec.guild_id, message=rec)
        await self.changed()

    # -- dispatch helpers ---------------------------------------------------------------

    async def user_says(
        self,
        channel_id: int,
        author_id: int,
        content: str,
        *,
        mentions: Sequence[int] = (),
        mention_roles: Sequence[int] = (),
        mention_everyone: bool | None = None,
        message_type: int = MessageType.DEFAULT,
        referenced_message_id: int | None = None,
        embeds: Sequence[Json] = (),
        extra: Mapping[str, Any] | None = None,
    ) -> Json:
        """A message by any known user (human or bot), as if typed in a Discord client.

        Mentions: <@id>, <@&id>, @everyone/@here in the content ping (as Discord does
        without allowed_mentions), plus `mentions` / `mention_roles` given explicitly.
        `referenced_message_id` makes it a reply (type 19 unless `message_type` says
        otherwise). `extra` is merged into the payload (e.g. a "thread" object for 18).
        Returns the MESSAGE_CREATE payload.
        """
        referenced = None
        if referenced_message_id is not None:
            referenced = self._by_id[referenced_message_id]
            if message_type == MessageType.DEFAULT:
                message_type = MessageType.REPLY
        rec = self._new_message(
            channel_id=channel_id,
            author_id=author_id,
            content=content,
            message_type=message_type,
            via="user_says",
            allowed_mentions=None,
            message_reference=None,
            referenced=referenced,
            extra_mentions=mentions,
            extra_role_mentions=mention_roles,
            mention_everyone=mention_everyone,
            embeds=embeds,
            extra=extra,
        )
        await self._store_and_fanout(rec)
        return rec.payload

    def message_payload(
        self, channel_id: int, author_id: int, content: str, *, message_type: int = 0
    ) -> Json:
        """A MESSAGE_CREATE payload as `user_says` would build it (fresh id, mentions
        resolved), neither recorded nor dispatched: a starting point for
        `dispatch_raw` payloads that Discord should never send."""
        rec = self._new_message(
            channel_id=channel_id,
            author_id=author_id,
            content=content,
            message_type=message_type,
            via="raw",
            allowed_mentions=None,
            message_reference=None,
            referenced=None,
        )
        return copy.deepcopy(rec.payload)

    async def dispatch_raw(
        self,
        event: str,
        data: Any,
        *,
        guild_id: int | None = None,
        user_id: int | None = None,
    ) -> list[Dispatch]:
        """Dispatch `data` exactly as given (no checks, no intent filtering, not
        recorded as a message) to every session that gets events of `guild_id`
        (None: as a DM, to shard 0), or only to bot `user_id`'s. Returns the
        dispatches made."""
        before = len(self.dispatches)
        await self._fanout(event, data, guild_id, only_user=user_id)
        await self.changed()
        return self.dispatches[before:]

    async def _fanout(
        self,
        event: str,
        data: Json,
        guild_id: int | None,
        *,
        only_user: int | None = None,
        message: RecordedMessage | None = None,
    ) -> None:
        """Send a dispatch to every identified session that should get it."""
        for conn in sorted(self._conns, key=lambda c: c.state.session_id if c.state else ""):
            state = conn.state
            if state is None or conn.ws.closed:
                continue
            uid = state.bot.user.id
            if only_user is not None and uid != only_user:
                continue
            if guild_id is not None:
                if shard_of(guild_id, state.shard_count) != state.shard_id:
                    continue
            else:
                if state.shard_id != 0:  # DMs go to shard 0
                    continue
                channel = self.channels.get(int(data.get("channel_id", 0)))
                if channel is not None and channel.dm_bot_id not in (None, uid):
                    continue
            payload = data
            if message is not None:
                needed = Intent.GUILD_MESSAGES if guild_id is not None else Intent.DIRECT_MESSAGES
                if not state.intents & needed:
                    continue
                payload = self._filter_content(state, message)
            self.dispatches.append(Dispatch(state.session_id, uid, state.shard_id, event, payload))
            await conn.send(0, payload, event)

    def _filter_content(self, state: SessionState, message: RecordedMessage) -> Json:
        """Without MESSAGE_CONTENT, a bot sees content only of its own messages, DMs, pings."""
        uid = state.bot.user.id
        if (
            state.intents & Intent.MESSAGE_CONTENT
            or message.guild_id is None
            or message.author_id == uid
            or uid in message.pinged_users
        ):
            return message.payload
        data = dict(message.payload)
        data.update(content="", embeds=[], attachments=[], components=[])
        return data

    async def invoke(
        self,
        bot_user_id: int,
        guild_id: int,
        channel_id: int,
        user_id: int,
        command_path: Sequence[str],
        options: Mapping[str, Any] | None = None,
        *,
        locale: str = "en-US",
    ) -> PendingInteraction:
        """Dispatch an APPLICATION_COMMAND interaction to `bot_user_id`'s session(s).

        The command is looked up among those the bot synced (guild ones first, then
        global) to get option types and the command id; an unsynced command gets types
        guessed from the Python values. `command_path` is ["cmd"], ["cmd", "sub"] or
        ["cmd", "group", "sub"]. The member's `permissions` come from their roles (owner
        and administrators: all). `await result.response()` gives the callback.
        """
        bot = self.bot(bot_user_id)
        guild = self.guilds[guild_id]
        channel = self.channels[channel_id]
        invoker = self._member(guild, user_id)
        if invoker is None:
            raise KeyError(f"fake discord: user {user_id} is not a member of guild {guild_id}")
        data = self._command_data(bot.application_id, guild_id, list(command_path), options or {})
        interaction_id = self.next_id()
        token = f"fake-interaction-token-{interaction_id}-{uuid.uuid4().hex}"
        member_data = self._member_payload(guild, invoker)
        member_data["permissions"] = str(self.permissions(guild_id, user_id))
        channel_data = self._channel_payload(channel)
        channel_data["permissions"] = member_data["permissions"]
        payload: Json = {
            "id": str(interaction_id),
            "application_id": str(bot.application_id),
            "type": 2,
            "data": data,
            "guild_id": str(guild_id),
            "guild": {"id": str(guild_id), "locale": "en-US", "features": []},
            "channel_id": str(channel_id),
            "channel": channel_data,
            "member": member_data,
            "token": token,
            "version": 1,
            "app_permissions": str(self.permissions(guild_id, bot_user_id)),
            "locale": locale,
            "guild_locale": "en-US",
            "entitlements": [],
            "authorizing_integration_owners": {"0": str(guild_id)},
            "context": 0,
            "attachment_size_limit": 10 * 1024 * 1024,
        }
        pending = PendingInteraction(payload, bot_user_id)
        self.interactions[interaction_id] = pending
        await self._fanout("INTERACTION_CREATE", payload, guild_id, only_user=bot_user_id)
        await self.changed()
        return pending

    def _find_command(self, application_id: int, guild_id: int, name: str) -> Json | None:
        for key in ((application_id, guild_id), (application_id, None)):
            for cmd in self.commands.get(key, []):
                if cmd["name"] == name and cmd.get("type", 1) == 1:
                    return cmd
        return None

    def _command_data(
        self, application_id: int, guild_id: int, path: list[str], options: Mapping[str, Any]
    ) -> Json:
        if not path:
            raise ValueError("command_path must name a command")
        cmd = self._find_command(application_id, guild_id, path[0])
        resolved: Json = {}
        schema: list[Json] | None = cmd.get("options", []) if cmd else None
        leaf_values = [
            self._option(name, value, schema, resolved) for name, value in options.items()
        ]
        # build the nesting from the inside out
        nested: list[Json] = leaf_values
        for depth in range(len(path) - 1, 0, -1):
            opt_type = (
                OptionType.SUB_COMMAND if depth == len(path) - 1 else OptionType.SUB_COMMAND_GROUP
            )
            nested = [{"type": opt_type, "name": path[depth], "options": nested}]
        if cmd is not None:
            level = cmd.get("options", [])
            for name in path[1:]:
                match = [o for o in level if o["name"] == name and o["type"] in (1, 2)]
                if not match:
                    raise LookupError(f"fake discord: /{' '.join(path)}: no subcommand {name!r}")
                level = match[0].get("options", [])
        data: Json = {
            "id": cmd["id"] if cmd else str(self.next_id()),
            "name": path[0],
            "type": 1,
            "options": nested,
        }
        if cmd is not None and cmd.get("guild_id"):
            data["guild_id"] = cmd["guild_id"]
        if resolved:
            data["resolved"] = resolved
        return data

    def _option(self, name: str, value: Any, schema: list[Json] | None, resolved: Json) -> Json:
        opt_type: int
        if schema is not None:
            found = self._find_leaf_option(schema, name)
            if found is None:
                raise LookupError(f"fake discord: the synced command has no option {name!r}")
            opt_type = int(found["type"])
        elif isinstance(value, bool):
            opt_type = OptionType.BOOLEAN
        elif isinstance(value, int):
            opt_type = OptionType.INTEGER
        elif isinstance(value, float):
            opt_type = OptionType.NUMBER
        else:
            opt_type = OptionType.STRING
        if opt_type in (OptionType.USER, OptionType.MENTIONABLE) and int(value) in self.users:
            uid = int(value)
            resolved.setdefault("users", {})[str(uid)] = self._user(uid).payload()
        elif opt_type == OptionType.ROLE:
            for g in self.guilds.values():
                if int(value) in g.roles:
                    resolved.setdefault("roles", {})[str(value)] = g.roles[int(value)].payload()
        elif opt_type == OptionType.CHANNEL and int(value) in self.channels:
            ch = self._channel_payload(self.channels[int(value)])
            ch["permissions"] = str(Perm.ALL)
            resolved.setdefault("channels", {})[str(value)] = ch
        if opt_type in (
            OptionType.USER,
            OptionType.CHANNEL,
            OptionType.ROLE,
            OptionType.MENTIONABLE,
        ):
            value = str(value)
        return {"name": name, "type": opt_type, "value": value}

    def _find_leaf_option(self, options: list[Json], name: str) -> Json | None:
        for opt in options:
            if opt.get("type") in (1, 2):
                found = self._find_leaf_option(opt.get("options", []), name)
                if found is not None:
                    return found
            elif opt.get("name") == name:
                return opt
        return None

    # -- gateway ops ---------------------------------------------------------------

    async def disconnect(self, user_id: int, code: int = 4000) -> int:
        """Close a bot's websockets from the server side (4000: discord.py will RESUME)."""
        closed = 0
        for conn in list(self._conns):
            if conn.state is not None and conn.state.bot.user.id == user_id and not conn.ws.closed:
                await conn.ws.close(code=code, message=b"fake disconnect")
                closed += 1
        return closed

    async def request_reconnect(self, user_id: int) -> None:
        """Send op 7 RECONNECT to a bot's sessions (discord.py closes and RESUMEs)."""
        for conn in list(self._conns):
            if conn.state is not None and conn.state.bot.user.id == user_id:
                await conn.send(7, None)

    async def _gateway(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(max_msg_size=0, heartbeat=None)
        await ws.prepare(request)
        conn = _Connection(ws)
        self._conns.add(conn)
        try:
            await conn.send(
                10, {"heartbeat_interval": self.heartbeat_interval_ms, "_trace": ["fake"]}
            )
            async for msg in ws:
                if msg.type is not WSMsgType.TEXT:
                    if msg.type is WSMsgType.BINARY:
                        await ws.close(code=4002, message=b"Error while decoding payload.")
                    continue
                try:
                    frame = json.loads(msg.data)
                except ValueError:
                    await ws.close(code=4002, message=b"Error while decoding payload.")
                    break
                await self._gateway_op(conn, frame)
        finally:
            self._conns.discard(conn)
            await self.changed()
        return ws

    async def _gateway_op(self, conn: _Connection, frame: Json) -> None:
        op = frame.get("op")
        d = frame.get("d")
        if op == 1:
            await conn.send(11, None)
        elif op == 2:
            await self._identify(conn, d or {})
        elif op == 6:
            await self._resume(conn, d or {})
        elif conn.state is None:
            await conn.ws.close(code=4003, message=b"Not authenticated.")
        elif op == 8:
            await self._request_members(conn, d or {})
        elif op in (3, 4):
            pass  # presence / voice state updates: accepted, ignored
        else:
            await conn.ws.close(code=4001, message=b"Unknown opcode.")

    async def _fail(self, conn: _Connection, code: int, reason: str) -> None:
        self.identify_failures.append((code, reason))
        await conn.ws.close(code=code, message=reason.encode())
        await self.changed()

    async def _identify(self, conn: _Connection, d: Json) -> None:
        if conn.state is not None:
            await self._fail(conn, 4005, "Already authenticated.")
            return
        bot = self.bots.get(str(d.get("token", "")))
        if bot is None:
            await self._fail(conn, 4004, "Authentication failed.")
            return
        shard_id, shard_count = d.get("shard") or [0, 1]
        if not (0 <= shard_id < shard_count):
            await self._fail(conn, 4010, "Invalid shard.")
            return
        intents = int(d.get("intents", 0))
        if intents & Intent.PRIVILEGED & ~bot.allowed_intents:
            await self._fail(conn, 4014, "Disallowed intent(s).")
            return
        state = SessionState(uuid.uuid4().hex, bot, shard_id, shard_count, intents)
        self.sessions[state.session_id] = state
        conn.state = state
        guilds = [g for g in self.guilds.values() if shard_of(g.id, shard_count) == shard_id]
        ready = {
            "v": API_VERSION,
            "user": {
                **bot.user.payload(),
                "verified": True,
                "mfa_enabled": False,
                "email": None,
                "flags": 0,
                "locale": "en-US",
            },
            "guilds": [{"id": str(g.id), "unavailable": True} for g in guilds],
            "session_id": state.session_id,
            "session_type": "normal",
            "resume_gateway_url": self.gateway_url,
            "shard": [shard_id, shard_count],
            "application": {"id": str(bot.application_id), "flags": 0},
            "private_channels": [],
            "relationships": [],
            "presences": [],
            "user_settings": {},
            "guild_join_requests": [],
            "geo_ordered_rtc_regions": [],
            "_trace": ["fake-discord"],
        }
        await self._send_dispatch(conn, "READY", ready)
        if intents & Intent.GUILDS:
            for g in guilds:
                await self._send_dispatch(conn, "GUILD_CREATE", self._guild_create(g))
        await self.changed()

    async def _send_dispatch(self, conn: _Connection, event: str, data: Json) -> None:
        assert conn.state is not None
        state = conn.state
        self.dispatches.append(
            Dispatch(state.session_id, state.bot.user.id, state.shard_id, event, data)
        )
        await conn.send(0, data, event)

    async def _resume(self, conn: _Connection, d: Json) -> None:
        state = self.sessions.get(str(d.get("session_id")))
        if state is None or state.bot.token != d.get("token") or conn.state is not None:
            await conn.send(9, False)  # INVALID_SESSION, not resumable
            return
        for other in list(self._conns):
            if other is not conn and other.state is state and not other.ws.closed:
                await other.ws.close(code=4000, message=b"session resumed elsewhere")
                other.state = None
        state.resumes += 1
        conn.state = state
        await self._send_dispatch(conn, "RESUMED", {"_trace": ["fake-discord"]})
        await self.changed()

    async def _request_members(self, conn: _Connection, d: Json) -> None:
        guild = self.guilds.get(int(d.get("guild_id", 0)))
        if guild is None:
            return
        members = self._guild_members(guild)
        wanted = d.get("user_ids")
        if wanted:
            ids = {int(u) for u in (wanted if isinstance(wanted, list) else [wanted])}
            members = [m for m in members if m.id in ids]
        query = d.get("query")
        if query:
            members = [m for m in members if m.user.username.lower().startswith(str(query).lower())]
        limit = int(d.get("limit") or 0)
        if limit:
            members = members[:limit]
        chunk: Json = {
            "guild_id": str(guild.id),
            "members": [self._member_payload(guild, m) for m in members],
            "chunk_index": 0,
            "chunk_count": 1,
            "not_found": [],
        }
        if d.get("nonce") is not None:
            chunk["nonce"] = d["nonce"]
        await self._send_dispatch(conn, "GUILD_MEMBERS_CHUNK", chunk)

    # -- REST ------------------------------------------------------------------------

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        prefix = f"/api/v{API_VERSION}"
        if not request.path.startswith(prefix + "/"):
            result: web.StreamResponse = await handler(request)
            return result
        path = request.path[len(prefix) :]
        bot = self._auth(request)
        headers = {
            "X-RateLimit-Limit": "50",
            "X-RateLimit-Remaining": "49",
            "X-RateLimit-Reset": f"{time.time() + 1:.3f}",
            "X-RateLimit-Reset-After": "1.000",
            "X-RateLimit-Bucket": _route_bucket(request.method, path),
        }
        queued = self._rate_limit_next.get((request.method, path))
        response: web.StreamResponse
        if queued:
            retry_after = queued.pop(0)
            self.rate_limited.append((request.method, path))
            response = _json_response(
                {
                    "message": "You are being rate limited.",
                    "retry_after": retry_after,
                    "global": False,
                },
                429,
                {
                    "Retry-After": f"{retry_after}",
                    "X-RateLimit-Scope": "user",
                    "Via": "1.1 google",  # discord.py treats a 429 without Via as a Cloudflare ban
                    **{**headers, "X-RateLimit-Remaining": "0"},
                },
            )
        elif bot is None and not self._unauthenticated(path):
            response = _json_response({"message": "401: Unauthorized", "code": 0}, 401, headers)
        else:
            try:
                response = await handler(request)
            except _HttpError as exc:
                response = _json_response(exc.body, exc.status)
            except _Json404:
                response = _json_response({"message": "404: Not Found", "code": 0}, 404)
            response.headers.update(headers)
        self.requests.append(
            RecordedRequest(request.method, path, response.status, bot.user.id if bot else None)
        )
        await self.changed()
        return response

    def _auth(self, request: web.Request) -> FakeBot | None:
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bot "):
            return None
        return self.bots.get(header[4:])

    @staticmethod
    def _unauthenticated(path: str) -> bool:
        return path.startswith(("/interactions/", "/webhooks/")) or path == "/gateway"

    def _bot(self, request: web.Request) -> FakeBot:
        bot = self._auth(request)
        if bot is None:
            raise _HttpError(401, "401: Unauthorized")
        return bot

    async def _unknown(self, request: web.Request) -> web.StreamResponse:
        self.unknown_routes.append((request.method, request.path))
        log.warning("fake discord: unknown route %s %s", request.method, request.path)
        return _json_response({"message": "404: Not Found", "code": 0}, 404)

    async def _get_gateway(self, request: web.Request) -> web.StreamResponse:
        return _json_response({"url": self.gateway_url})

    async def _get_gateway_bot(self, request: web.Request) -> web.StreamResponse:
        self._bot(request)
        return _json_response(
            {
                "url": self.gateway_url,
                "shards": self.recommended_shards,
                "session_start_limit": {
                    "total": 1000,
                    "remaining": 1000,
                    "reset_after": 0,
                    "max_concurrency": 1,
                },
            }
        )

    async def _get_me(self, request: web.Request) -> web.StreamResponse:
        bot = self._bot(request)
        return _json_response(
            {
                **bot.user.payload(),
                "verified": True,
                "mfa_enabled": False,
                "flags": 0,
                "locale": "en-US",
            }
        )

    async def _get_application(self, request: web.Request) -> web.StreamResponse:
        bot = self._bot(request)
        owner = FakeUser(bot.application_id + 1, f"{bot.user.username}-owner")
        return _json_response(
            {
                "id": str(bot.application_id),
                "name": bot.user.username,
                "icon": None,
                "description": "",
                "summary": "",
                "type": None,
                "bot": bot.user.payload(),
                "bot_public": True,
                "bot_require_code_grant": False,
                "owner": owner.payload(),
                "team": None,
                "verify_key": "0" * 64,
                "flags": 0,
                "interactions_endpoint_url": None,
                "redirect_uris": [],
                "approximate_guild_count": len(self.guilds),
                "tags": [],
            }
        )

    async def _get_user(self, request: web.Request) -> web.StreamResponse:
        self._bot(request)
        user = self.users.get(int(request.match_info["user_id"]))
        if user is None:
            raise _HttpError(404, "Unknown User", 10013)
        return _json_response(user.payload())

    async def _create_dm(self, request: web.Request) -> web.StreamResponse:
        bot = self._bot(request)
        body = await request.json()
        recipient = int(body["recipient_id"])
        for ch in self.channels.values():
            if (
                ch.type == 1
                and ch.recipient
                and ch.recipient.id == recipient
                and ch.dm_bot_id in (None, bot.user.id)
            ):
                return _json_response(self._channel_payload(ch))
        user = self.users.get(recipient)
        if user is None:
            raise _HttpError(404, "Unknown User", 10013)
        ch = self.add_dm(self.next_id(), user, bot_id=bot.user.id)
        return _json_response(self._channel_payload(ch))

    def _channel_for(self, request: web.Request) -> FakeChannel:
        channel = self.channels.get(int(request.match_info["channel_id"]))
        if channel is None:
            raise _HttpError(404, "Unknown Channel", 10003)
        return channel

    async def _get_channel(self, request: web.Request) -> web.StreamResponse:
        self._bot(request)
        return _json_response(self._channel_payload(self._channel_for(request)))

    async def _get_guild(self, request: web.Request) -> web.StreamResponse:
        self._bot(request)
        guild = self.guilds.get(int(request.match_info["guild_id"]))
        if guild is None:
            raise _HttpError(404, "Unknown Guild", 10004)
        data = self._guild_create(guild)
        for key in ("members", "channels", "threads", "presences", "voice_states", "joined_at"):
            data.pop(key, None)
        return _json_response(data)

    async def _get_guild_channels(self, request: web.Request) -> web.StreamResponse:
        self._bot(request)
        guild = self.guilds.get(int(request.match_info["guild_id"]))
        if guild is None:
            raise _HttpError(404, "Unknown Guild", 10004)
        return _json_response(
            [self._channel_payload(c) for c in guild.channels.values() if not c.is_thread]
        )

    async def _get_member(self, request: web.Request) -> web.StreamResponse:
        self._bot(request)
        guild = self.guilds.get(int(request.match_info["guild_id"]))
        found = guild and self._member(guild, int(request.match_info["user_id"]))
        if guild is None or not found:
            raise _HttpError(404, "Unknown Member", 10007)
        return _json_response(self._member_payload(guild, found))

    async def _read_payload(self, request: web.Request) -> tuple[Json, list[str]]:
        """A JSON body or a multipart one (payload_json + files[n]) -> (payload, file names)."""
        if request.content_type.startswith("multipart/"):
            form = await request.post()
            raw = form.get("payload_json")
            payload: Json = json.loads(str(raw)) if raw is not None else {}
            files = [
                str(getattr(v, "filename", k)) for k, v in form.items() if k.startswith("files[")
            ]
            return payload, files
        if not request.can_read_body:
            return {}, []
        body = await request.json()
        return (body if isinstance(body, dict) else {"_": body}), []

    async def _post_message(self, request: web.Request) -> web.StreamResponse:
        bot = self._bot(request)
        channel = self._channel_for(request)
        payload, files = await self._read_payload(request)
        guild_id = self._channel_guild.get(channel.id)
        if guild_id is not None:
            perms = self.permissions(guild_id, bot.user.id)
            needed = Perm.SEND_MESSAGES_IN_THREADS if channel.is_thread else Perm.SEND_MESSAGES
            if not perms & needed:
                raise _HttpError(403, "Missing Permissions", 50013)
        elif channel.dm_bot_id not in (None, bot.user.id):
            raise _HttpError(403, "Missing Access", 50001)
        content = payload.get("content") or ""
        if (
            not content
            and not payload.get("embeds")
            and not files
            and not payload.get("sticker_ids")
        ):
            raise _HttpError(400, "Cannot send an empty message", 50006)
        reference = payload.get("message_reference")
        referenced = None
        if reference and reference.get("message_id") is not None:
            referenced = self._by_id.get(int(reference["message_id"]))
            if referenced is None and reference.get("fail_if_not_exists", True):
                raise _HttpError(
                    400,
                    "Invalid Form Body",
                    50035,
                    errors={
                        "message_reference": {
                            "_errors": [
                                {
                                    "code": "MESSAGE_REFERENCE_UNKNOWN_MESSAGE",
                                    "message": "Unknown message",
                                }
                            ]
                        }
                    },
                )
        rec = self._new_message(
            channel_id=channel.id,
            author_id=bot.user.id,
            content=content,
            message_type=MessageType.REPLY if referenced else MessageType.DEFAULT,
            via="rest",
            allowed_mentions=payload.get("allowed_mentions"),
            message_reference=reference,
            referenced=referenced,
            flags=int(payload.get("flags") or 0),
            nonce=payload.get("nonce"),
            embeds=payload.get("embeds") or [],
            tts=bool(payload.get("tts")),
            attachments=files,
            bot_token_user=bot.user.id,
        )
        await self._store_and_fanout(rec)
        response = dict(rec.payload)
        response.pop("member", None)
        return _json_response(response)

    async def _get_messages(self, request: web.Request) -> web.StreamResponse:
        self._bot(request)
        channel = self._channel_for(request)
        limit = int(request.query.get("limit", "50"))
        found = list(reversed(self._messages.get(channel.id, [])))[:limit]
        return _json_response([m.payload for m in found])

    async def _get_message(self, request: web.Request) -> web.StreamResponse:
        self._bot(request)
        channel = self._channel_for(request)
        rec = self._by_id.get(int(request.match_info["message_id"]))
        if rec is None or rec.channel_id != channel.id:
            raise _HttpError(404, "Unknown Message", 10008)
        return _json_response(rec.payload)

    async def _post_typing(self, request: web.Request) -> web.StreamResponse:
        bot = self._bot(request)
        channel = self._channel_for(request)
        self.typing.append(TypingEvent(channel.id, bot.user.id))
        await self.changed()
        return web.Response(status=204)

    # -- application commands ----------------------------------------------------------

    def _app_bot(self, request: web.Request) -> tuple[FakeBot, int, int | None]:
        bot = self._bot(request)
        app_id = int(request.match_info["app_id"])
        if app_id != bot.application_id:
            raise _HttpError(403, "Missing Access", 50001)
        gid = request.match_info.get("guild_id")
        guild_id = int(gid) if gid is not None else None
        if guild_id is not None and guild_id not in self.guilds:
            raise _HttpError(403, "Missing Access", 50001)
        return bot, app_id, guild_id

    async def _put_commands(self, request: web.Request) -> web.StreamResponse:
        _, app_id, guild_id = self._app_bot(request)
        body = await request.json()
        if not isinstance(body, list):
            raise _HttpError(400, "Invalid Form Body", 50035)
        old = {
            (c["name"], c.get("type", 1)): c["id"]
            for c in self.commands.get((app_id, guild_id), [])
        }
        stored: list[Json] = []
        for cmd in body:
            if not isinstance(cmd, dict) or not cmd.get("name"):
                raise _HttpError(400, "Invalid Form Body", 50035)
            kind = cmd.get("type", 1)
            data: Json = {
                "default_member_permissions": None,
                "dm_permission": True,
                "nsfw": False,
                "description": "",
                "options": [],
                **copy.deepcopy(cmd),
                "id": old.get((cmd["name"], kind)) or str(self.next_id()),
                "application_id": str(app_id),
                "type": kind,
                "version": str(self.next_id()),
            }
            if guild_id is not None:
                data["guild_id"] = str(guild_id)
            stored.append(data)
        self.commands[(app_id, guild_id)] = stored
        self.command_syncs.append(CommandSync(app_id, guild_id, copy.deepcopy(body)))
        await self.changed()
        return _json_response(stored)

    async def _get_commands(self, request: web.Request) -> web.StreamResponse:
        _, app_id, guild_id = self._app_bot(request)
        return _json_response(self.commands.get((app_id, guild_id), []))

    # -- interaction callbacks and followups -----------------------------------------------

    def _pending(self, interaction_id: int, token: str) -> PendingInteraction:
        pending = self.interactions.get(interaction_id)
        if pending is None or pending.token != token:
            raise _HttpError(404, "Unknown interaction", 10062)
        return pending

    def _pending_by_token(self, app_id: int, token: str) -> PendingInteraction:
        for pending in self.interactions.values():
            if pending.token == token and int(pending.payload["application_id"]) == app_id:
                return pending
        raise _HttpError(404, "Unknown Webhook", 10015)

    async def _interaction_message(
        self, pending: PendingInteraction, payload: Json, files: list[str], via: str
    ) -> RecordedMessage:
        flags = int(payload.get("flags") or 0)
        rec = self._new_message(
            channel_id=int(pending.payload["channel_id"]),
            author_id=pending.bot_user_id,
            content=payload.get("content") or "",
            message_type=MessageType.CHAT_INPUT_COMMAND,
            via=via,
            allowed_mentions=payload.get("allowed_mentions"),
            message_reference=None,
            referenced=None,
            flags=flags,
            embeds=payload.get("embeds") or [],
            attachments=files,
            interaction=pending,
            bot_token_user=pending.bot_user_id,
        )
        await self._store_and_fanout(
            rec, ephemeral_to=pending.bot_user_id if flags & EPHEMERAL else None
        )
        return rec

    async def _post_callback(self, request: web.Request) -> web.StreamResponse:
        pending = self._pending(
            int(request.match_info["interaction_id"]), request.match_info["token"]
        )
        if pending.callback.done():
            raise _HttpError(400, "Interaction has already been acknowledged.", 40060)
        body, files = await self._read_payload(request)
        kind = int(body.get("type", 0))
        data: Json = body.get("data") or {}
        with_response = request.query.get("with_response", "").lower() in ("1", "true")
        message: RecordedMessage | None = None
        if kind == 4:
            message = await self._interaction_message(pending, data, files, "interaction")
            pending.original_message = message.payload
        recorded = RecordedCallback(
            interaction_id=pending.id,
            token=pending.token,
            bot_user_id=pending.bot_user_id,
            type=kind,
            data=data,
            with_response=with_response,
            message_id=message.id if message else None,
        )
        self.callbacks.append(recorded)
        pending.callback.set_result(recorded)
        await self.changed()
        if not with_response:
            return web.Response(status=204)
        interaction: Json = {
            "id": str(pending.id),
            "type": 2,
            "activity_instance_id": None,
            "response_message_id": str(message.id) if message else None,
            "response_message_loading": kind == 5,
            "response_message_ephemeral": bool(int(data.get("flags") or 0) & EPHEMERAL),
        }
        answer: Json = {"interaction": interaction}
        if message is not None:
            answer["resource"] = {"type": kind, "message": message.payload}
        return _json_response(answer)

    async def _post_followup(self, request: web.Request) -> web.StreamResponse:
        pending = self._pending_by_token(
            int(request.match_info["app_id"]), request.match_info["token"]
        )
        payload, files = await self._read_payload(request)
        rec = await self._interaction_message(pending, payload, files, "followup")
        self.followups.append(
            RecordedFollowup(pending.id, pending.bot_user_id, "POST", "", payload)
        )
        await self.changed()
        if request.query.get("wait", "").lower() in ("1", "true"):
            return _json_response(rec.payload)
        return web.Response(status=204)

    async def _webhook_message(self, request: web.Request) -> web.StreamResponse:
        pending = self._pending_by_token(
            int(request.match_info["app_id"]), request.match_info["token"]
        )
        message_id = request.match_info["message_id"]
        method = request.method
        if method == "GET":
            if pending.original_message is None:
                raise _HttpError(404, "Unknown Message", 10008)
            return _json_response(pending.original_message)
        payload: Json = {}
        if method in ("PATCH", "POST"):
            payload, _ = await self._read_payload(request)
        elif method != "DELETE":
            raise _Json404()
        self.followups.append(
            RecordedFollowup(pending.id, pending.bot_user_id, method, message_id, payload)
        )
        await self.changed()
        if method == "DELETE":
            return web.Response(status=204)
        base = pending.original_message or {
            "id": str(self.next_id()),
            "channel_id": pending.payload["channel_id"],
            "author": self._user(pending.bot_user_id).payload(),
            "content": "",
            "timestamp": _iso(),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": [],
            "mention_roles": [],
            "attachments": [],
            "embeds": [],
            "pinned": False,
            "type": MessageType.CHAT_INPUT_COMMAND,
            "flags": 0,
            "components": [],
        }
        edited = {
            **base,
            **{k: v for k, v in payload.items() if k in ("content", "embeds", "flags")},
        }
        edited["edited_timestamp"] = _iso()
        if message_id == "@original":
            pending.original_message = edited
        rec = self._by_id.get(int(edited["id"]))
        if rec is not None:  # a channel message: update the record, dispatch MESSAGE_UPDATE
            rec.payload = edited
            rec.content = str(edited.get("content") or "")
            await self._fanout("MESSAGE_UPDATE", edited, rec.guild_id, message=rec)
            await self.changed()
        return _json_response(edited)


@contextlib.contextmanager
def pointed_at(fake: FakeDiscord) -> Iterator[None]:
    """Point discord.py (REST base and default gateway) at `fake`; restore on exit."""
    import yarl
    from discord.gateway import DiscordWebSocket
    from discord.http import Route

    old_base, old_gateway = Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY
    Route.BASE = fake.api_base
    DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(fake.gateway_url)
    try:
        yield
    finally:
        Route.BASE = old_base
        DiscordWebSocket.DEFAULT_GATEWAY = old_gateway


# -- a small world the tests share: two bots, one guild, a person, a mod, a bot ----

TOKEN_A, TOKEN_B = "token-alpha", "token-beta"
BOT_A, BOT_B = 1_200_000_000_000_000_001, 1_200_000_000_000_000_002
GUILD = 1_100_000_000_000_000_000
GENERAL, RANDOM, THREAD = (
    1_300_000_000_000_000_001,
    1_300_000_000_000_000_002,
    1_300_000_000_000_000_003,
)
OWNER, ALICE, MOD, OTHER_BOT = (
    1_400_000_000_000_000_001,
    1_400_000_000_000_000_002,
    1_400_000_000_000_000_003,
    1_400_000_000_000_000_004,
)
MOD_ROLE = 1_500_000_000_000_000_001


def populate(fake: FakeDiscord) -> None:
    """Bots alpha (BOT_A) and beta (BOT_B); guild GUILD with #general, #random and
    a thread under #general; members owner, alice, mod (Manage Server) and otherbot."""
    fake.add_bot(TOKEN_A, BOT_A, "alpha")
    fake.add_bot(TOKEN_B, BOT_B, "beta")
    fake.add_guild(
        GUILD,
        "test guild",
        channels=[
            text_channel(GENERAL, "general"),
            text_channel(RANDOM, "random", position=1),
            thread_channel(THREAD, "a thread", GENERAL),
        ],
        members=[
            member(OWNER, "owner"),
            member(ALICE, "alice"),
            member(MOD, "mod", roles=[MOD_ROLE]),
            member(OTHER_BOT, "otherbot", bot=True),
        ],
        roles=[role(MOD_ROLE, "mods", Perm.MANAGE_GUILD, mentionable=True)],
        owner_id=OWNER,
    )
