"""The Discord adapter (discord.py 2.x): translate events, send replies, offer
the admin commands as `/bouncer ...` application commands. It knows nothing
about limits; Gateway.handle decides.

One sharded client per configured bot. Reconnects, resumes, heartbeats and
HTTP 429s are discord.py's own: the adapter never retries a send. Messages
skip discord.py's object model: a MESSAGE_CREATE payload is translated as it
arrives (`from_payload`) and a reply is POSTed through discord.py's HTTP client
(its rate limits and retries) with the id read from the answer. A discord.Message
per event and per reply, its author, member and mentions, cost more CPU than
everything botbouncer decides (bench/README.md, "End to end"); nothing here
needs them. With `api_base` set (an API
proxy, a self-hosted gateway), the gateway URL comes from GET
{api_base}/gateway/bot, as Discord's sharded clients do, or from `gateway_url`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
import discord
import yarl
from discord import app_commands
from discord.gateway import DiscordWebSocket
from discord.http import Route

from adapters.common import (
    SendFailed,
    clean,
    deliver,
    handle_event,
    split_message,
    typing_beside,
)
from gateway.admin import Admin, AdminError
from gateway.config import BotConfig
from gateway.errors import BotbouncerError, StartupError, StartupUnreachable
from gateway.http import HttpServer
from gateway.model import Action, Author, ChatKind, ChatRef, Decision, Message
from gateway.pipeline import Gateway
from gateway.store import StoreError

log = logging.getLogger("botbouncer.discord")


def _not_voice(record: logging.LogRecord) -> bool:
    """discord.py warns on every start that voice needs PyNaCl and davey; the
    daemon speaks no voice, and the warning reads as if something were wrong."""
    return "voice will NOT be supported" not in str(record.msg)


logging.getLogger("discord.client").addFilter(_not_voice)

MESSAGE_LIMIT = 2000  # Discord's per-message character limit
# A reply may ping the users it names and the author it answers, never
# @everyone, @here or a role: a bot echoing "@everyone" must not page a server.
SAFE_MENTIONS = discord.AllowedMentions(everyone=False, roles=False, users=True, replied_user=True)
NO_MENTIONS = discord.AllowedMentions.none()
SAFE_MENTIONS_JSON: dict[str, Any] = dict(SAFE_MENTIONS.to_dict())
NO_MENTIONS_JSON: dict[str, Any] = dict(NO_MENTIONS.to_dict())
# Message types people and bots write; any other is one Discord made (a pin,
# a join, a boost): discord.py's Message.is_system(), by number.
WRITTEN_TYPES = frozenset({0, 19, 20, 21, 23, 46})
# The /bouncer subcommands that take no options.
SIMPLE_COMMANDS = {
    "status": "Turn counters, limits, pause and cooldowns",
    "reset": "Zero the turn counters and cooldowns",
    "pause": "No bot answers here until resumed",
    "resume": "Bots answer here again",
}

# discord.py keeps the REST base and the default gateway as class attributes,
# so every Discord bot of one process must use the same endpoints.
_DEFAULT_BASE = Route.BASE
_DEFAULT_GATEWAY = DiscordWebSocket.DEFAULT_GATEWAY
_endpoints: dict[str, tuple[str, str | None]] = {}  # running bot -> (REST base, gateway)


class PayloadError(BotbouncerError, ValueError):
    """A MESSAGE_CREATE payload the adapter cannot read; the text says why."""


def _snowflake(value: object, what: str) -> str:
    """A Discord id as the gateway keeps it (decimal digits), or PayloadError."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return value
    raise PayloadError(f"{what} {value!r} is not a Discord id")


def from_payload(data: Any, own_role: tuple[str, str] | None = None) -> Message:
    """A MESSAGE_CREATE payload as the gateway sees it: the channel is the chat
    (a thread is a channel), a message without a guild is a DM, a reply names
    the author it answers (None when Discord sent no readable author for it).
    `own_role`: (the bot's role in the guild, the bot's id): a mention of the
    role is a mention of the bot (Discord's autocomplete offers both, under
    the one name).

    Raises PayloadError naming the field when the id, channel, author, type or
    content is missing or unreadable; whatever else is odd is left unread.
    """
    if not isinstance(data, dict):
        raise PayloadError(f"the payload is {type(data).__name__}, not an object")
    author = data.get("author")
    if not isinstance(author, dict):
        raise PayloadError("no author")
    message_id = _snowflake(data.get("id"), "id")
    channel = _snowflake(data.get("channel_id"), "channel_id")
    author_id = _snowflake(author.get("id"), "author id")
    kind_of = data.get("type")
    if not isinstance(kind_of, int) or isinstance(kind_of, bool):
        raise PayloadError(f"type {kind_of!r} is not a message type")
    if "content" not in data:
        raise PayloadError("no content")
    content = data["content"]
    if content is not None and not isinstance(content, str):
        raise PayloadError(f"content is {type(content).__name__}, not text")
    member = data.get("member")
    nick = member.get("nick") if isinstance(member, dict) else None
    name = nick or author.get("global_name") or author.get("username") or author_id
    mentions = data.get("mentions")
    referenced = data.get("referenced_message")
    replied = referenced.get("author") if isinstance(referenced, dict) else None
    replied_id = replied.get("id") if isinstance(replied, dict) else None
    return Message(
        id=message_id,
        chat=ChatRef(
            platform="discord",
            id=channel,
            kind=ChatKind.DM if data.get("guild_id") is None else ChatKind.GROUP,
        ),
        author=Author(author_id, clean(str(name)), author.get("bot") is True),
        text=clean(content),  # None in a payload with "content": null
        mentions=tuple(
            str(u["id"])
            for u in (mentions if isinstance(mentions, list) else ())
            if isinstance(u, dict) and _is_id(u.get("id"))
        )
        + _role_mention(data, own_role),
        reply_to=str(replied_id) if _is_id(replied_id) else None,
        system=kind_of not in WRITTEN_TYPES,
    )


def _role_mention(data: dict[str, Any], own_role: tuple[str, str] | None) -> tuple[str, ...]:
    roles = data.get("mention_roles")
    if own_role is None or not isinstance(roles, list) or own_role[0] not in map(str, roles):
        return ()
    return (own_role[1],)


def own_role(client: discord.Client, data: Any) -> tuple[str, str] | None:
    """For from_payload: (the client's bot's own role in the message's guild,
    the bot's id), when the message mentions roles and the bot has one."""
    if not isinstance(data, dict) or not data.get("mention_roles"):
        return None
    try:
        guild = client.get_guild(int(data.get("guild_id") or 0))
    except (TypeError, ValueError):
        return None
    role = guild.self_role if guild is not None else None
    user = client.user
    return (str(role.id), str(user.id)) if role is not None and user is not None else None


def _ignore_edit(data: Any) -> None:
    """MESSAGE_UPDATE: an edit, or Discord filling in a message's embeds."""


def _is_id(value: object) -> bool:
    try:
        _snowflake(value, "")
    except PayloadError:
        return False
    return True


class DiscordAdapter:
    def __init__(self, bot: BotConfig, gateway: Gateway, server: HttpServer) -> None:
        if bot.token is None:  # the config refuses this; a clear error if it ever slips
            raise StartupError(f"bot {bot.name}: a Discord bot needs a token")
        self.bot = bot
        self.gateway = gateway
        self.admin = server.admins.get(bot.name) or Admin(gateway)
        intents = discord.Intents.default()
        intents.message_content = True  # privileged: enable it in the developer portal
        sharding: dict[str, Any] = {"shard_count": bot.shard_count}
        if bot.shard_ids is not None:
            sharding["shard_ids"] = list(bot.shard_ids)
        self.client = discord.AutoShardedClient(
            # no message cache: messages never become discord.py objects here
            intents=intents,
            allowed_mentions=SAFE_MENTIONS,
            max_messages=None,
            **sharding,
        )
        self.tree = app_commands.CommandTree(self.client)
        self.tree.on_error = self._command_error  # type: ignore[method-assign]
        self._add_commands()
        self.client.event(self.on_ready)
        # Every MESSAGE_CREATE comes here as discord.py received it, in place
        # of its parser (which would build a discord.Message and, for one it
        # cannot read, end the shard's whole connection).
        self.client._connection.parsers["MESSAGE_CREATE"] = self.on_message_create
        # Edits are not taken (no conversation turn), and discord.py's parser
        # would build a discord.Message of each, ending the connection on one
        # it cannot read (a partial update, as Discord long sent them).
        self.client._connection.parsers["MESSAGE_UPDATE"] = _ignore_edit
        self.ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._opened = False  # login() was called (a daemon stops every adapter it made)
        self._handling: set[asyncio.Task[None]] = set()

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        """Log in (a bad token stops the daemon), register the commands, connect."""
        self._use_endpoints()
        self._opened = True
        token = self.bot.token.get_secret_value() if self.bot.token else ""
        try:
            await self.client.login(token)
        except discord.LoginFailure:
            raise StartupError(f"bot {self.bot.name}: Discord refused the token") from None
        except (discord.HTTPException, OSError) as exc:
            raise StartupUnreachable(f"bot {self.bot.name}: cannot reach Discord: {exc}") from None
        user = self.client.user
        assert user is not None  # set by login
        self.gateway.bot_id = str(user.id)  # own messages are recognised by user id
        await self._locate_gateway()
        await self._register_commands()
        self._task = asyncio.create_task(self._run(), name=f"discord:{self.bot.name}")

    async def _run(self) -> None:
        try:
            await self.client.connect(reconnect=True)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # discord.py gave up (bad intents, bad shard): say so
            log.error("bot %s: the Discord connection ended: %s", self.bot.name, exc)

    async def stop_intake(self) -> None:
        """Nothing to do: events that arrive while stopping are logged, not handled."""

    async def stop(self) -> None:
        if self._opened:
            await self.client.close()
        else:  # never logged in: the client's close() needs what login() sets up
            await self.client.http.close()
        if self._task is not None:
            await asyncio.wait([self._task], timeout=5)
        _endpoints.pop(self.bot.name, None)
        if not _endpoints:
            Route.BASE = _DEFAULT_BASE
            DiscordWebSocket.DEFAULT_GATEWAY = _DEFAULT_GATEWAY

    def _use_endpoints(self) -> None:
        base = (self.bot.api_base or _DEFAULT_BASE).rstrip("/")
        for name, (other, _) in _endpoints.items():
            if other != base:
                raise StartupError(
                    f"bot {self.bot.name}: api_base {base} differs from bot {name}'s {other}; "
                    "discord.py allows one API base per process: run them in two daemons"
                )
        _endpoints[self.bot.name] = (base, self.bot.gateway_url)
        Route.BASE = base

    async def _locate_gateway(self) -> None:
        """Behind a proxy, find the gateway the way sharded clients do, and make
        it the default so a reconnect after an invalidated session goes there too."""
        if self.bot.api_base is None and self.bot.gateway_url is None:
            return  # Discord itself: discord.py knows the way
        try:
            shards, url, _ = await self.client.http.get_bot_gateway()
        except (discord.HTTPException, OSError) as exc:
            raise StartupError(
                f"bot {self.bot.name}: GET {Route.BASE}/gateway/bot failed: {exc}"
            ) from None
        DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(self.bot.gateway_url or url)
        if self.client.shard_count is None:
            self.client.shard_count = shards

    async def on_ready(self) -> None:
        log.info("bot %s is on Discord as %s (id %s), %d guild(s)", self.bot.name,
                 self.client.user, self.gateway.bot_id, len(self.client.guilds))  # fmt: skip
        self.ready.set()

    # -- messages ---------------------------------------------------------------

    def on_message_create(self, data: Any) -> None:
        """One MESSAGE_CREATE: translated at once; the echo of a message this
        bot sent is decided here and then (no task, no store call), anything
        else is handled in a task of its own."""
        try:
            msg = from_payload(data, own_role(self.client, data))
        except PayloadError as exc:
            what = data.get("id") if isinstance(data, dict) else "?"
            log.warning("bot %s: could not read message %s from Discord (%s); ignored",
                        self.bot.name, what, exc)  # fmt: skip
            return
        if self.gateway.echo(msg):
            return
        guild = data.get("guild_id")
        task = asyncio.ensure_future(
            handle_event(self.gateway, f"message {msg.id}", lambda: self._handle(msg, guild))
        )
        self._handling.add(task)
        task.add_done_callback(self._handled)

    def _handled(self, task: asyncio.Task[None]) -> None:
        self._handling.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("bot %s: handling a message failed", self.bot.name, exc_info=exc)

    async def _handle(self, msg: Message, guild: object) -> None:
        channel = int(msg.chat.id)
        d = await self.gateway.handle(msg, busy=lambda: typing_beside(
            self.client.get_partial_messageable(channel).typing, f"channel {channel}"))  # fmt: skip
        if d.action is Action.REPLY and d.replies:
            ref: dict[str, Any] = {"message_id": msg.id, "channel_id": msg.chat.id,
                                   "fail_if_not_exists": False}  # fmt: skip
            if guild is not None:
                ref["guild_id"] = guild
            await self._post(channel, d, list(d.replies), SAFE_MENTIONS_JSON, ref)
        elif d.action is Action.WARN and d.warning:
            await self._post(channel, d, [d.warning], NO_MENTIONS_JSON, None, warning=True)

    async def _post(
        self,
        channel: int,
        d: Decision,
        texts: list[str],
        mentions: dict[str, Any],
        reference: dict[str, Any] | None,
        *,
        warning: bool = False,
    ) -> None:
        """Send each piece (the first as a reply) and count it under its id.
        No retry here: discord.py retries 429s, which delivered nothing."""
        route = Route("POST", "/channels/{channel_id}/messages", channel_id=channel)

        async def send(piece: str, index: int) -> str:
            payload: dict[str, Any] = {"content": piece, "allowed_mentions": mentions}
            if index == 0 and reference is not None:
                payload["message_reference"] = reference
            try:
                sent = await self.client.http.request(route, json=payload)
            except discord.HTTPException as exc:
                raise SendFailed(f"Discord refused the message: {exc}") from None
            except (OSError, aiohttp.ClientError) as exc:
                raise SendFailed(f"Discord could not be reached: {exc}") from None
            if not isinstance(sent, dict) or not _is_id(sent.get("id")):
                raise SendFailed(f"Discord answered without a message id: {str(sent)[:200]}")
            return str(sent["id"])

        pieces = [p for text in texts for p in split_message(text, MESSAGE_LIMIT)]
        await deliver(self.gateway, d, pieces, send, warning=warning)

    # -- admin commands -----------------------------------------------------------

    def _simple(self, command: str) -> Callable[[discord.Interaction], Coroutine[Any, Any, None]]:
        async def run(interaction: discord.Interaction) -> None:
            await self._admin(interaction, command)

        return run

    def _add_commands(self) -> None:
        group = app_commands.Group(
            name="bouncer",
            description="botbouncer: bot loop limits for this channel",
            default_permissions=discord.Permissions(manage_guild=True),
            guild_only=True,
        )

        for name, description in SIMPLE_COMMANDS.items():
            group.add_command(
                app_commands.Command(
                    name=name, description=description, callback=self._simple(name)
                )
            )

        @group.command(name="limits", description="Show or override this channel's limits")
        @app_commands.describe(
            soft="bot turns before the warning",
            hard="bot turns before the hard stop",
            rate="replies per bot per window",
            window="rate window in seconds",
            clear="drop every override",
        )
        async def limits(
            interaction: discord.Interaction,
            soft: app_commands.Range[int, 1, 1_000_000] | None = None,
            hard: app_commands.Range[int, 1, 1_000_000] | None = None,
            rate: app_commands.Range[int, 1, 1_000_000] | None = None,
            window: app_commands.Range[float, 0.001, 2_592_000.0] | None = None,
            clear: bool = False,
        ) -> None:
            args = ["clear"] if clear else []
            given = (("soft", soft), ("hard", hard), ("rate", rate), ("window", window))
            args += [f"{k}={v}" for k, v in given if v is not None]
            await self._admin(interaction, " ".join(["limits", *args]))

        @group.command(name="why", description="The last decisions here, with reasons")
        @app_commands.describe(count="how many (1-50)")
        async def why(
            interaction: discord.Interaction, count: app_commands.Range[int, 1, 50] = 10
        ) -> None:
            await self._admin(interaction, f"why {count}")

        guilds = [discord.Object(int(g)) for g in self.bot.guild_ids]
        self.tree.add_command(group, guilds=guilds or discord.utils.MISSING)

    async def _register_commands(self) -> None:
        try:
            if self.bot.guild_ids:
                for gid in self.bot.guild_ids:
                    await self.tree.sync(guild=discord.Object(int(gid)))
            else:
                await self.tree.sync()
        except discord.HTTPException as exc:
            # Commands are a convenience; the gate works without them.
            log.error("bot %s: registering /bouncer failed: %s", self.bot.name, exc)

    def is_admin(self, interaction: discord.Interaction) -> bool:
        """Configured user or role ids, or Manage Server (docs/http-api.md)."""
        admins = self.bot.admins
        user = interaction.user
        if str(user.id) in admins.user_ids:
            return True
        if isinstance(user, discord.Member) and any(
            str(r.id) in admins.role_ids for r in user.roles
        ):
            return True
        perms = interaction.permissions
        return perms.manage_guild or perms.administrator

    async def _admin(self, interaction: discord.Interaction, command: str) -> None:
        if not self.is_admin(interaction):
            log.info("bot %s: /bouncer %s refused for %s", self.bot.name, command,
                     interaction.user.id)  # fmt: skip
            await _answer(interaction, "Only server managers and botbouncer admins may do this.")
            return
        chat = ChatRef("discord", str(interaction.channel_id)).key
        actor = f"discord:{interaction.user.id}"
        try:
            text = await self.admin.run(chat, command, actor)
        except AdminError as exc:
            text = f"Not done: {exc}"
        except StoreError as exc:
            log.error("bot %s: /bouncer %s failed: %s", self.bot.name, command, exc)
            text = "The state store is unavailable; nothing was changed. Try again."
        await _answer(interaction, text)

    async def _command_error(
        self, interaction: discord.Interaction, error: app_commands.AppCommandError
    ) -> None:
        log.error("bot %s: command failed: %s", self.bot.name, error)
        if not interaction.response.is_done():
            await _answer(interaction, "Not done: the command failed.")


async def _answer(interaction: discord.Interaction, text: str) -> None:
    """Ephemeral: only the person who asked sees the answer."""
    await interaction.response.send_message(
        text[:MESSAGE_LIMIT], ephemeral=True, allowed_mentions=NO_MENTIONS
    )


def create(bot: BotConfig, gateway: Gateway, server: HttpServer) -> DiscordAdapter:
    return DiscordAdapter(bot, gateway, server)
