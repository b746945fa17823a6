"""Who and what exists on the fake Discord: users, bots, guilds with their roles,
members and channels, DMs; the numbers Discord uses for them (permission and intent
bits, message types, snowflakes); and the small world the tests share (`populate`).

Only set-up and lookups live here; what happens in the world (messages, gateway
sessions, REST calls, interactions) is built on top of it in the other modules.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.recording import Recording

Json = dict[str, Any]  # a JSON object as Discord reads and writes it

API_VERSION = 10
DISCORD_EPOCH_MS = 1420070400000
EPHEMERAL = 1 << 6  # the message flag


class Perm:
    """Permission bits (https://discord.com/developers/docs/topics/permissions)."""

    CREATE_INSTANT_INVITE = 1 << 0
    ADMINISTRATOR = 1 << 3
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
    GUILD_MESSAGES = 1 << 9
    DIRECT_MESSAGES = 1 << 12
    MESSAGE_CONTENT = 1 << 15


class MessageType:
    DEFAULT = 0
    CHANNEL_PINNED_MESSAGE = 6
    REPLY = 19
    CHAT_INPUT_COMMAND = 20


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


def iso(ms: float | None = None) -> str:
    """A Discord timestamp (ISO 8601, UTC) of `ms` since the Unix epoch (None: now)."""
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


# -- who and what ----------------------------------------------------------------------


@dataclass
class FakeUser:
    id: int
    username: str
    bot: bool = False

    def payload(self) -> Json:
        """The User object."""
        data: Json = {
            "id": str(self.id),
            "username": self.username,
            "discriminator": "0",
            "global_name": None,
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
    bot_id: int | None = None  # a bot's own role, made when it joined (managed)


@dataclass
class FakeMember:
    user: FakeUser
    roles: list[int] = field(default_factory=list)

    @property
    def id(self) -> int:
        return self.user.id


@dataclass
class FakeChannel:
    id: int
    name: str
    type: int = 0  # 0 text, 11 public thread, 1 DM
    parent_id: int | None = None  # the text channel of a thread
    position: int = 0
    owner_id: int | None = None  # threads: who started it (the guild's owner)
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
    members: dict[int, FakeMember]  # as given (every FakeBot is a member as well)
    bot_role_id: int
    joined_at: str = field(default_factory=iso)


@dataclass
class FakeBot:
    token: str
    user: FakeUser

    @property
    def application_id(self) -> int:
        return self.user.id  # as for every bot created since 2016


def text_channel(channel_id: int, name: str, *, position: int = 0) -> FakeChannel:
    return FakeChannel(channel_id, name, type=0, position=position)


def thread_channel(channel_id: int, name: str, parent_id: int) -> FakeChannel:
    """A public thread under the text channel `parent_id`."""
    return FakeChannel(channel_id, name, type=11, parent_id=parent_id)


def member(
    user_id: int, username: str, *, bot: bool = False, roles: Iterable[int] = ()
) -> FakeMember:
    return FakeMember(FakeUser(user_id, username, bot=bot), list(roles))


def role(
    role_id: int,
    name: str,
    permissions: int = 0,
    *,
    mentionable: bool = False,
    bot_id: int | None = None,
) -> FakeRole:
    return FakeRole(role_id, name, permissions, mentionable=mentionable, bot_id=bot_id)


class World(Recording):
    """The users, bots, guilds and channels of one fake Discord, and how to find them."""

    label = "fake discord"

    def __init__(self) -> None:
        super().__init__()
        self._last_id = 0
        self.bots: dict[str, FakeBot] = {}  # by token
        self.users: dict[int, FakeUser] = {}  # people and bots
        self.guilds: dict[int, FakeGuild] = {}
        self.channels: dict[int, FakeChannel] = {}  # guild channels, threads and DMs
        self._channel_guild: dict[int, int] = {}

    # -- set-up ------------------------------------------------------------------------

    def next_id(self) -> int:
        """A fresh, increasing snowflake for now."""
        now = (int(time.time() * 1000) - DISCORD_EPOCH_MS) << 22
        self._last_id = max(self._last_id + 1, now)
        return self._last_id

    def add_bot(self, token: str, user_id: int, username: str) -> FakeBot:
        """A bot user (its application id is its user id); it is a member of every guild,
        with the guild's role "bots" (BOT_PERMISSIONS)."""
        bot = FakeBot(token, FakeUser(user_id, username, bot=True))
        self.bots[token] = bot
        self.users[user_id] = bot.user
        return bot

    def add_guild(
        self,
        guild_id: int,
        name: str,
        *,
        channels: Iterable[FakeChannel] = (),
        members: Iterable[FakeMember] = (),
        roles: Iterable[FakeRole] = (),
        owner_id: int | None = None,
    ) -> FakeGuild:
        """A guild. Its @everyone role has id == guild_id (EVERYONE_PERMISSIONS); bots
        join with a "bots" role. The owner (default: the first member given) has every
        permission, as on Discord; a thread is started by the owner."""
        members_by_id = {m.id: m for m in members}
        all_roles = {guild_id: FakeRole(guild_id, "@everyone", EVERYONE_PERMISSIONS, 0)}
        bot_role = FakeRole(self.next_id(), "bots", BOT_PERMISSIONS, position=1)
        all_roles[bot_role.id] = bot_role
        all_roles.update({r.id: r for r in roles})
        if owner_id is None:
            owner_id = next(iter(members_by_id), None) or self.next_id()
        guild = FakeGuild(
            guild_id, name, owner_id, {}, all_roles, members_by_id, bot_role_id=bot_role.id
        )
        self.guilds[guild_id] = guild
        for m in members_by_id.values():
            self.users.setdefault(m.id, m.user)
        for channel in channels:
            if channel.is_thread:
                if channel.parent_id is None:
                    raise ValueError(f"fake discord: thread {channel.id} needs a parent_id")
                channel.owner_id = owner_id
            guild.channels[channel.id] = channel
            self.channels[channel.id] = channel
            self._channel_guild[channel.id] = guild_id
        return guild

    def add_dm(self, channel_id: int, user: FakeUser, *, bot_id: int | None = None) -> FakeChannel:
        """A DM channel between `user` and a bot (`bot_id`; None: every bot gets its messages)."""
        self.users.setdefault(user.id, user)
        channel = FakeChannel(channel_id, "", type=1, dm_bot_id=bot_id)
        self.channels[channel_id] = channel
        return channel

    # -- lookups -------------------------------------------------------------------------

    def bot(self, user_id: int) -> FakeBot:
        for bot in self.bots.values():
            if bot.user.id == user_id:
                return bot
        raise KeyError(f"fake discord: no bot with user id {user_id}")

    def user(self, user_id: int) -> FakeUser:
        try:
            return self.users[user_id]
        except KeyError:
            raise KeyError(f"fake discord: unknown user {user_id}") from None

    def guild_of(self, channel_id: int) -> FakeGuild | None:
        """The guild of a channel or thread; None for a DM."""
        guild_id = self._channel_guild.get(channel_id)
        return None if guild_id is None else self.guilds[guild_id]

    def guild_members(self, guild: FakeGuild) -> list[FakeMember]:
        """The members given to add_guild, then every bot."""
        found = dict(guild.members)
        for bot in self.bots.values():
            found.setdefault(bot.user.id, FakeMember(bot.user, [guild.bot_role_id]))
        return list(found.values())

    def member_of(self, guild: FakeGuild, user_id: int) -> FakeMember | None:
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
        found = self.member_of(guild, user_id)
        perms = guild.roles[guild.id].permissions
        for role_id in found.roles if found else []:
            if role_id in guild.roles:
                perms |= guild.roles[role_id].permissions
        return Perm.ALL if perms & Perm.ADMINISTRATOR else perms


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
ALPHA_ROLE = 1_500_000_000_000_000_002  # alpha's own role, named as the bot is


def populate(world: World) -> None:
    """Bots alpha (BOT_A) and beta (BOT_B); guild GUILD with #general, #random and
    a thread under #general; members owner, alice, mod (Manage Server) and otherbot."""
    world.add_bot(TOKEN_A, BOT_A, "alpha")
    world.add_bot(TOKEN_B, BOT_B, "beta")
    world.add_guild(
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
        roles=[
            role(MOD_ROLE, "mods", Perm.MANAGE_GUILD, mentionable=True),
            role(ALPHA_ROLE, "alpha", mentionable=True, bot_id=BOT_A),
        ],
        owner_id=OWNER,
    )
