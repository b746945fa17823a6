"""botbouncer for a discord.py (2.x) Client or commands.Bot that keeps its token.

    client = discord.Client(intents=intents)
    guard(client, Bouncer("botbouncer.yml", bot="helper"))

`guard` wires a `Bouncer` into the client at three places:

- the gateway's MESSAGE_CREATE parser (`client._connection.parsers`, the
  table discord.py's websocket reads, which botbouncer's own Discord adapter
  replaces the same way). Each new message is mapped by the adapter's own
  `adapters.discord.from_payload` (the channel or thread is the chat, a
  message without a guild is a DM, mentions, replies, system messages) and
  decided before discord.py builds a `discord.Message` of it. On `reply` it
  is dispatched as usual (`on_message`, listeners, commands); on `drop` and
  `warn` it is not, and on `warn` the guard posts the warning in the channel
  (no pings), unless `warnings=False`. The bot's own messages are always
  dispatched: when the bot sent them through discord.py they were counted
  already and are recognised as echoes without a store call.
- `client._schedule_event`, wrapped on the instance, through which discord.py
  starts every event handler in a task of its own: the guard collects the
  tasks a decided message started and, when they have all ended (at most
  the bot's `ticket_seconds`), releases the ticket if nothing was sent.
- `client.http.send_message`, wrapped on the instance: every message the bot
  sends through discord.py (`channel.send`, `message.reply`, `ctx.send`) is
  counted, under the ticket of the message being handled when it goes to
  that message's channel, else as the bot's own turn in its channel
  (`Bouncer.posted`).

Delivery order: a decided message reaches the bot after one store call, so
events discord.py parses meanwhile (an edit or delete of that message) may
come first. A message the guard cannot read is dispatched undecided, with an
INFO line, as discord.py would; when the store is unreachable (`StoreError`)
nothing is dispatched and an ERROR line says so (a chat where bots loop is
exactly where failing open would hurt; a person can ask again).

Not covered: messages sent without `http.send_message` (webhooks, interaction
responses, forum posts that open a thread) are seen only as echoes, decided
and counted by the store then. `wait_for("message")` resolves only with a
message the guard dispatches (let through, or the bot's own), once decided;
what the waiting code sends then counts under the ticket of the message
whose handler waits, while it is open.

The Bouncer is the caller's to close (`async with Bouncer(...)`, or after
`client.close()`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import discord

from adapters.common import clean
from adapters.discord import PayloadError, from_payload, own_role
from botbouncer._middleware import count_sent, release
from botbouncer.bouncer import Bouncer
from gateway.config import ConfigError
from gateway.model import Action, ChatRef, Decision, Message
from gateway.store import StoreError

log = logging.getLogger(__name__)

Parser = Callable[[Any], None]


@dataclass(eq=False)
class _Handling:
    """One decided message being handled by one guarded client."""

    guard: DiscordGuard
    decision: Decision
    sent: int = 0  # messages counted under the ticket
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)  # its event handlers
    open: bool = True  # until its handlers ended

    def wait(self) -> None:
        """Once every handler started for the message ended (done callbacks:
        no task waits on them), or its ticket lapsed, the guard hears of it."""
        pending = [t for t in self.tasks if not t.done()]
        if not pending:
            self.end(lapsed=False)
            return
        self.tasks = pending
        for task in pending:
            task.add_done_callback(self._one_done)
        self.guard._watch(self)

    def _one_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.remove(task)
        if not self.tasks:
            self.end(lapsed=False)

    def end(self, *, lapsed: bool) -> None:
        if self.open:
            self.open = False
            self.guard._handled(self, lapsed=lapsed)


# The message the current task handles (None: on_ready, a loop task, start-up).
# discord.py starts each event handler with loop.create_task, which copies the
# context: a handler, and any task it starts, sees the message it handles.
_handling: ContextVar[_Handling | None] = ContextVar("botbouncer_discord", default=None)


class DiscordGuard:
    """What `guard` installed on one client (see the module docstring)."""

    def __init__(self, client: discord.Client, bouncer: Bouncer, *, warnings: bool) -> None:
        self.client = client
        self.bouncer = bouncer
        self.warnings = warnings
        self.known = False  # bouncer.bot_id set from client.user
        self._parse: Parser = client._connection.parsers["MESSAGE_CREATE"]
        self._schedule_event = client._schedule_event
        self._send_message = client.http.send_message
        self._tasks: set[asyncio.Task[Any]] = set()  # deciding, handling, releasing
        # messages whose handlers still run, oldest first -> when their ticket lapses
        self._running: dict[_Handling, float] = {}
        self._sweeper: asyncio.TimerHandle | None = None

    @property
    def name(self) -> str:
        return self.bouncer.bot.name

    def _install(self) -> None:
        self.client._connection.parsers["MESSAGE_CREATE"] = self._on_create
        self.client._schedule_event = self._scheduling  # type: ignore[method-assign]
        self.client.http.send_message = self._sending  # type: ignore[method-assign]

    def _me(self) -> None:
        """The Bouncer learns the bot's id once discord.py knows it (login)."""
        if not self.known and (user := self.client.user) is not None:
            self.bouncer.bot_id = str(user.id)
            self.known = True

    async def wait_idle(self) -> None:
        """Until every message received so far is decided and handled (tests)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- deciding ----------------------------------------------------------------------

    def _on_create(self, data: Any) -> None:
        """discord.py's MESSAGE_CREATE parser: the bot's own echo goes through
        at once; anything else is decided in a task and dispatched, or not."""
        self._me()
        try:
            msg = from_payload(data, own_role(self.client, data))
        except PayloadError as exc:
            what = data.get("id") if isinstance(data, dict) else "?"
            log.info("bot %s: message %s passed through undecided: %s", self.name, what, exc)
            self._parse(data)
            return
        if self.bouncer.echo(msg):  # sent through this client: counted then
            self._parse(data)
            return
        self._track(asyncio.ensure_future(self._decide(msg, data)))

    async def _decide(self, msg: Message, data: Any) -> None:
        try:
            d = await self.bouncer.decide(msg)
        except StoreError as exc:
            log.error("bot %s: message %s not handled: %s", self.name, msg.id, exc)
            return
        except Exception:
            log.exception("bot %s: deciding on message %s failed; not handled", self.name, msg.id)
            return
        if msg.author.id == self.bouncer.bot_id:  # its own, sent some other way: counted now
            self._parse(data)
            return
        if d.ticket is None:  # drop
            return
        handling = _Handling(self, d)
        token = _handling.set(handling)
        try:
            if d.action is Action.REPLY:
                self._dispatch(data, msg)
            elif self.warnings and d.warning:
                await self._warn(msg.chat, d.warning)
        finally:  # cancelled too (the client closing): the ticket is still seen to
            _handling.reset(token)
            handling.wait()

    def _watch(self, handling: _Handling) -> None:
        """Handlers still running: their ticket lapses after ticket_seconds.
        One timer for all of them, a second apart at most, not one per
        message (each a heap entry and an object the collector tracks until
        it would have fired)."""
        loop = asyncio.get_running_loop()
        self._running[handling] = loop.time() + self.bouncer.bot.ticket_seconds
        if self._sweeper is None:
            self._sweeper = loop.call_later(1.0, self._sweep)

    def _sweep(self) -> None:
        self._sweeper = None
        now = asyncio.get_running_loop().time()
        for handling, lapses in list(self._running.items()):  # oldest first
            if not handling.open:
                del self._running[handling]
            elif lapses <= now:
                handling.end(lapsed=True)
            else:
                break
        if self._running:
            self._sweeper = asyncio.get_running_loop().call_later(1.0, self._sweep)

    def _handled(self, handling: _Handling, *, lapsed: bool) -> None:
        """The message's handlers have all ended (or `ticket_seconds` passed):
        a ticket under which nothing was sent is released."""
        self._running.pop(handling, None)
        if lapsed:
            log.warning("bot %s: the handlers of message %s still run after %g s; its ticket "
                        "has lapsed", self.name, handling.decision.message_id,
                        self.bouncer.bot.ticket_seconds)  # fmt: skip
        if handling.sent == 0:
            self._track(asyncio.ensure_future(release(self.bouncer, handling.decision, log)))

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _dispatch(self, data: Any, msg: Message) -> None:
        try:
            self._parse(data)
        except Exception:  # discord.py could not build it: as its websocket would log it
            log.exception("bot %s: discord.py failed to parse message %s", self.name, msg.id)

    async def _warn(self, chat: ChatRef, text: str) -> None:
        """Post the warning in the channel, pinging no one; counted under the
        ticket by `_sending`, like any message sent while handling."""
        channel = self.client.get_partial_messageable(int(chat.id))
        try:
            await channel.send(text, allowed_mentions=discord.AllowedMentions.none())
        except Exception as exc:  # discord.HTTPException mostly; never into discord.py
            log.warning("bot %s: posting the warning in %s failed: %s", self.name, chat.key, exc)

    def _scheduling(
        self,
        coro: Callable[..., Coroutine[Any, Any, Any]],
        event_name: str,
        *args: Any,
        **kwargs: Any,
    ) -> asyncio.Task[Any]:
        """`Client._schedule_event`: every event handler discord.py starts
        (on_message, listeners, commands.Bot's extra events) is a task; those
        started while a decided message is dispatched are its handlers."""
        task = self._schedule_event(coro, event_name, *args, **kwargs)
        handling = _handling.get()
        if handling is not None and handling.guard is self and handling.open:
            handling.tasks.append(task)
            self._track(task)
        return task

    # -- counting what the bot sends ---------------------------------------------------

    async def _sending(self, channel_id: Any, *, params: Any) -> Any:
        """`HTTPClient.send_message`, which every `Messageable.send` (and so
        `message.reply`, `ctx.send`) calls and which answers with the message
        Discord created. Its echo may arrive on the gateway before this
        answer: `Bouncer.sending` makes it wait for the count instead of
        counting it twice. A failure to count is logged: the message was
        sent, and the bot's code is told so."""
        self._me()
        chat = ChatRef("discord", str(channel_id)).key
        with self.bouncer.sending(chat):
            sent = await self._send_message(channel_id, params=params)
            try:
                await self._count(chat, sent)
            except StoreError as exc:
                log.error("bot %s: a message sent in %s was not counted: %s", self.name, chat,
                          exc)  # fmt: skip
            except Exception:
                log.exception("bot %s: counting a message sent in %s failed", self.name, chat)
        return sent

    async def _count(self, chat: str, sent: Any) -> None:
        if not isinstance(sent, dict) or sent.get("id") is None:
            log.info("bot %s: Discord answered a send in %s without a message id; not counted",
                     self.name, chat)  # fmt: skip
            return
        message_id, text = str(sent["id"]), clean(sent.get("content"))
        handling, d = _handling.get(), None
        if (
            handling is not None
            and handling.guard is self
            and handling.open
            and handling.decision.chat == chat
        ):
            d = handling.decision
            handling.sent += 1  # before any await: the release at the end sees it
        await count_sent(self.bouncer, d, chat, message_id, text, log)


def guard(client: discord.Client, bouncer: Bouncer, *, warnings: bool = True) -> DiscordGuard:
    """Put `bouncer` in front of `client`'s message handlers and count every
    message it sends (see the module docstring). Call it once, before the
    client connects. `warnings=False`: on `warn` nothing is posted (the
    handlers still do not see the message; its ticket is released)."""
    if bouncer.bot.platform != "discord":
        raise ConfigError(f"bot {bouncer.bot.name!r} is configured for platform "
                          f"{bouncer.bot.platform}, not discord: chats are counted per "
                          "platform")  # fmt: skip
    parsers = getattr(client._connection, "parsers", None)
    if not isinstance(parsers, dict) or "MESSAGE_CREATE" not in parsers:
        raise RuntimeError("botbouncer.discord needs discord.py 2 (its MESSAGE_CREATE parser)")
    if isinstance(getattr(parsers["MESSAGE_CREATE"], "__self__", None), DiscordGuard):
        raise ValueError("this client is guarded already")
    g = DiscordGuard(client, bouncer, warnings=warnings)
    g._install()
    return g
