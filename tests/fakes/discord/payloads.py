"""The JSON the fake hands out: members, channels, guilds (GUILD_CREATE), the bot
user and its application, and messages, with the pings Discord works out from their
content and allowed_mentions (`RecordedMessage` keeps both)."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

from tests.fakes.discord.world import (
    FakeBot,
    FakeChannel,
    FakeGuild,
    FakeMember,
    FakeRole,
    FakeUser,
    Json,
    Perm,
    World,
    iso,
    snowflake_time_ms,
)

_USER_MENTION = re.compile(r"<@!?([0-9]{15,20})>")
_ROLE_MENTION = re.compile(r"<@&([0-9]{15,20})>")
_EVERYONE = re.compile(r"@(everyone|here)\b")


# -- guilds ------------------------------------------------------------------------------


def role_payload(r: FakeRole) -> Json:
    return {
        "id": str(r.id),
        "name": r.name,
        "permissions": str(r.permissions),
        "position": r.position,
        "color": 0,
        "colors": {"primary_color": 0, "secondary_color": None, "tertiary_color": None},
        "hoist": False,
        "icon": None,
        "unicode_emoji": None,
        "managed": r.bot_id is not None,
        "mentionable": r.mentionable,
        "flags": 0,
        **({"tags": {"bot_id": str(r.bot_id)}} if r.bot_id is not None else {}),
    }


def member_payload(guild: FakeGuild, m: FakeMember, *, with_user: bool = True) -> Json:
    data: Json = {
        "roles": [str(r) for r in m.roles],
        "nick": None,
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


def channel_payload(guild: FakeGuild, channel: FakeChannel) -> Json:
    """A guild's text channel or thread."""
    data: Json = {
        "id": str(channel.id),
        "type": channel.type,
        "guild_id": str(guild.id),
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
                "archive_timestamp": guild.joined_at,
                "locked": False,
                "create_timestamp": guild.joined_at,
            },
        )
    else:
        data.update(
            position=channel.position,
            permission_overwrites=[],
            topic=None,
            nsfw=False,
            default_auto_archive_duration=1440,
        )
    return data


def guild_create(world: World, guild: FakeGuild) -> Json:
    """The GUILD_CREATE a session gets for each of its guilds after READY."""
    members = world.guild_members(guild)
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
        "roles": [role_payload(r) for r in guild.roles.values()],
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
        "members": [member_payload(guild, m) for m in members],
        "channels": [channel_payload(guild, c) for c in channels],
        "threads": [channel_payload(guild, c) for c in threads],
        "presences": [],
        "voice_states": [],
        "stage_instances": [],
        "guild_scheduled_events": [],
        "soundboard_sounds": [],
        "embedded_activities": [],
    }


# -- the bot itself ----------------------------------------------------------------------


def me_payload(bot: FakeBot) -> Json:
    """The bot's own user (GET /users/@me, READY's "user")."""
    return {
        **bot.user.payload(),
        "verified": True,
        "mfa_enabled": False,
        "email": None,
        "flags": 0,
        "locale": "en-US",
    }


def application_payload(bot: FakeBot, guild_count: int) -> Json:
    """GET /oauth2/applications/@me (discord.py's login asks it for the application id)."""
    owner = FakeUser(bot.application_id + 1, f"{bot.user.username}-owner")
    return {
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
        "approximate_guild_count": guild_count,
        "tags": [],
    }


# -- messages ----------------------------------------------------------------------------


@dataclass
class RecordedMessage:
    """One message in a channel, said by a user (`user_says`) or sent by a bot (REST, or
    as the answer to an interaction)."""

    id: int
    channel_id: int
    guild_id: int | None
    author_id: int
    content: str
    type: int
    payload: Json  # the MESSAGE_CREATE data as dispatched (before per-bot intent filtering)
    via: str  # "user_says" | "webhook_says" | "rest" | "interaction" | "raw" (message_payload)
    message_reference: Json | None = None  # exactly as sent
    pinged_everyone: bool = False
    pinged_roles: list[int] = field(default_factory=list)
    pinged_users: list[int] = field(default_factory=list)


def resolve_mentions(
    world: World,
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
        world.permissions(guild.id, author_id) & Perm.MENTION_EVERYONE
    )
    users: list[int] = []
    for uid in (int(u) for u in _USER_MENTION.findall(content)):
        if uid in world.users and ("users" in parse or uid in allow_users) and uid not in users:
            users.append(uid)
    if (
        replied is not None
        and ping_replied
        and replied.author_id in world.users  # a webhook's post pings nobody
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


def new_message(
    world: World,
    *,
    channel_id: int,
    author_id: int,
    content: str,
    message_type: int,
    via: str,
    allowed_mentions: Json | None = None,
    message_reference: Json | None = None,
    referenced: RecordedMessage | None = None,
    flags: int = 0,
    nonce: str | int | None = None,
    extra: Json | None = None,
) -> RecordedMessage:
    """A new message (fresh id, pings resolved), neither recorded nor dispatched.
    `referenced`: the message it replies to; `extra` is merged into the payload."""
    if channel_id not in world.channels:
        raise KeyError(f"fake discord: unknown channel {channel_id}")
    guild = world.guild_of(channel_id)
    users, roles, everyone = resolve_mentions(
        world, guild, author_id, content, allowed_mentions, referenced
    )
    message_id = world.next_id()
    data: Json = {
        "id": str(message_id),
        "channel_id": str(channel_id),
        "author": world.user(author_id).payload(),
        "content": content,
        "timestamp": iso(snowflake_time_ms(message_id)),
        "edited_timestamp": None,
        "tts": False,
        "mention_everyone": everyone,
        "mentions": [],
        "mention_roles": [str(r) for r in roles],
        "attachments": [],
        "embeds": [],
        "pinned": False,
        "type": message_type,
        "flags": flags,
        "components": [],
    }
    for uid in users:
        mentioned = world.user(uid).payload()
        m = world.member_of(guild, uid) if guild else None
        if guild is not None and m is not None:
            mentioned["member"] = member_payload(guild, m, with_user=False)
        data["mentions"].append(mentioned)
    if nonce is not None:
        data["nonce"] = nonce
    if guild is not None:
        data["guild_id"] = str(guild.id)
        m = world.member_of(guild, author_id)
        if m is not None:
            data["member"] = member_payload(guild, m, with_user=False)
    if referenced is not None:
        data["message_reference"] = {
            "type": 0,
            "message_id": str(referenced.id),
            "channel_id": str(referenced.channel_id),
            **({"guild_id": str(guild.id)} if guild is not None else {}),
        }
        nested = copy.deepcopy(referenced.payload)
        for key in ("referenced_message", "member", "guild_id"):
            nested.pop(key, None)
        data["referenced_message"] = nested
    data.update(extra or {})
    return RecordedMessage(
        id=message_id,
        channel_id=channel_id,
        guild_id=guild.id if guild else None,
        author_id=author_id,
        content=content,
        type=message_type,
        payload=data,
        via=via,
        message_reference=copy.deepcopy(message_reference),
        pinged_everyone=everyone,
        pinged_roles=roles,
        pinged_users=users,
    )
