"""botbouncer for an aiogram 3 bot: one line between the Dispatcher and its
handlers.

    dp = Dispatcher()
    guard(dp, Bouncer("botbouncer.yml", bot="helper"))

    @dp.message()
    async def echo(message: Message) -> None:
        await message.answer(message.text or "")

    await dp.start_polling(bot)

Two aiogram hooks, both documented extension points:

- an outer middleware on `dispatcher.message` sees every new message before
  any filter. It maps the message with the Telegram adapter's own mapping
  (`adapters.telegram.to_message`: chat and forum topic, anonymous admins,
  mentions, system messages) and asks the Bouncer. `drop`: no handler runs.
  `warn`: the guard posts the warning in the message's chat and topic (plain
  text, not as a reply; `warnings=False`: nothing) and no handler runs.
  `reply`: the handlers run with the message's ticket, which is released
  when they sent nothing (no handler matched, or they raised: the exception
  goes on to aiogram's error handlers). A message a handler returns for
  aiogram to send (`return message.answer(...)`, aiogram's answer into a
  webhook, which it sends after the handlers) is sent by the guard while
  the ticket is open, as aiogram would, so that it is counted under it.
- a request middleware on the bot's session (`bot.session.middleware`) sees
  every method the bot calls. Telegram never shows a bot its own messages,
  so each message the bot sends (any send*/forward*/copy* method:
  sendMessage, sendPhoto, sendMediaGroup, copyMessage...) is counted as its turn
  when Telegram answers with its id: under the ticket of the message being
  handled when it was sent from a handler into that message's chat (the
  first one fills the turn its reply held), else on its own
  (`Bouncer.posted`: a scheduled post, a callback query's answer, a send
  into another chat). Copies (copyMessage, copyMessages, forwardMessages
  answer MessageIds without their chat) are counted in the chat the call
  named. Edits are no new turn and are not counted.

Which bot: `guard(dp, bouncer, bot=bot)` guards that bot from now on (its
session middleware is installed at once, so a send before polling starts
is counted too). Without `bot`, the guard takes the bot that
`dp.start_polling(bot)` was given, at startup; several bots need one guard
(and one Bouncer) each, with `bot=`: a guard lets the updates of another bot
through untouched. With a webhook and no `bot=`, the guard takes the bot of
the first message it sees, unless `setup_application(app, dp, bot=bot)` named
it. The bot's id and username come from getMe (cached by aiogram).

Failures, as in botbouncer's own Telegram adapter
(`adapters.common.handle_event`): a store that cannot be reached
(`gateway.store.StoreError`) is logged as an ERROR and the message is not
handled - no handler runs, nothing is raised into aiogram. A message sent
while the store is down is sent; that it could not be counted is logged as
an ERROR. A warning Telegram refuses is logged, never raised. A message
python-telegram-bot cannot read is ignored with a line saying why, as the
adapter ignores it.

Cost: the mapping converts aiogram's message to Bot API JSON
(`model_dump(by_alias=True)`, ~25 µs) and builds python-telegram-bot's
objects from it (`Update.de_json`, most of the cost), then runs the
adapter's `to_message` (~40 µs): ~160 µs for a plain text message, ~360 µs
for a reply in a forum topic (timeit on the development machine). A sent
message costs one more de_json, ~100 µs, beside a Bot API call.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiogram import Bot, Dispatcher
from aiogram.client.session.middlewares.base import (
    BaseRequestMiddleware,
    NextRequestMiddlewareType,
)
from aiogram.dispatcher.middlewares.base import BaseMiddleware
from aiogram.methods import Response, TelegramMethod
from aiogram.methods.base import TelegramType
from aiogram.types import Message as AiogramMessage
from aiogram.types import MessageId, TelegramObject
from telegram import Message as TgMessage
from telegram import Update, User

from adapters.common import clean, handle_event
from adapters.telegram import Unreadable, chat_of, to_message
from botbouncer._middleware import count_sent, release, telegram_chat
from botbouncer.bouncer import Bouncer
from gateway.config import ConfigError
from gateway.model import Action, Decision, Message
from gateway.store import StoreError

__all__ = ["AiogramGuard", "guard"]

log = logging.getLogger("botbouncer.aiogram")

Handler = Callable[[TelegramObject, dict[str, Any]], Awaitable[Any]]

# Bot API methods that post a new message (their answer is the Message, a
# list of them, or for copies their MessageIds); edits answer a Message too,
# but are no new turn.
_SENDING = ("send", "forward", "copy")


@dataclass(eq=False)
class _Ticket:
    """The decision of the message being handled in this context (an update's
    task and the tasks it starts copy it)."""

    guard: AiogramGuard
    decision: Decision
    used: bool = False  # a message was reported on it (or is being)
    done: bool = False  # the handlers returned: later sends are posts of their own


_current: contextvars.ContextVar[_Ticket | None] = contextvars.ContextVar(
    "botbouncer_aiogram_ticket", default=None
)


def _bot_api(obj: TelegramObject) -> dict[str, Any]:
    """An aiogram object as the Bot API's JSON ("from", not "from_user")."""
    data: dict[str, Any] = obj.model_dump(
        mode="json", exclude_none=True, by_alias=True, warnings=False
    )
    return data


class AiogramGuard(BaseMiddleware):
    """What `guard` installed: the dispatcher's outer message middleware, and
    (through `counter`) the bot session's request middleware."""

    def __init__(self, bouncer: Bouncer, *, bot: Bot | None = None, warnings: bool = True) -> None:
        if bouncer.bot.platform != "telegram":
            raise ConfigError(f"bot {bouncer.bot.name!r} is configured for platform "
                              f"{bouncer.bot.platform}, not telegram: chats are counted "
                              "per platform")  # fmt: skip
        self.bouncer = bouncer
        self.warnings = warnings
        self.bot: Bot | None = None
        self.counter = _Counter(self)
        self._me: User | None = None
        if bot is not None:
            self.attach(bot)

    # -- which bot ---------------------------------------------------------------

    def attach(self, bot: Bot) -> None:
        """Guard `bot`: count what it sends from now on (once per session)."""
        if self.bot is not None and self.bot.id != bot.id:
            raise ValueError(f"this guard guards bot {self.bot.id}, not {bot.id}: "
                             "one guard (and one Bouncer) per bot")  # fmt: skip
        self.bot = bot
        self.bouncer.bot_id = str(bot.id)  # from the token; getMe confirms it
        if self.counter not in bot.session.middleware:
            bot.session.middleware(self.counter)

    def guards(self, bot: Bot) -> bool:
        return self.bot is not None and self.bot.id == bot.id

    async def on_startup(self, bots: Sequence[Bot] = (), bot: Bot | None = None) -> None:
        """The dispatcher starts: `start_polling` passes its bots, a webhook's
        `setup_application(app, dp, bot=bot)` its bot."""
        if self.bot is None:
            if len(bots) > 1:
                raise ValueError(
                    f"the dispatcher runs {len(bots)} bots: pass bot= to guard(), "
                    "one guard (and one Bouncer) per bot"
                )
            chosen = bots[0] if bots else bot
            if chosen is not None:  # else a webhook: the bot of the first message
                self.attach(chosen)
        if self.bot is not None:
            await self._login(self.bot)

    async def _login(self, bot: Bot) -> User:
        """The bot as python-telegram-bot's User (what to_message reads)."""
        if self._me is None:
            me = await bot.me()
            self._me = User.de_json(_bot_api(me), None)
            self.bouncer.bot_id = str(me.id)
        return self._me

    async def idle(self) -> None:
        """Until no message this guard let through is being handled (handlers
        and the release after them): e.g. in a shutdown hook, before closing
        the Bouncer."""
        await self.bouncer.gateway.inflight.idle()

    # -- each message -----------------------------------------------------------

    async def __call__(self, handler: Handler, event: TelegramObject, data: dict[str, Any]) -> Any:
        bot = data.get("bot")
        if not isinstance(event, AiogramMessage) or not isinstance(bot, Bot):
            return await handler(event, data)
        if self.bot is None:
            self.attach(bot)
        elif not self.guards(bot):
            return await handler(event, data)  # another bot's: its own guard's business
        with self.bouncer.gateway.inflight.track():
            return await self._guarded(handler, event, data, bot)

    async def _guarded(
        self, handler: Handler, event: AiogramMessage, data: dict[str, Any], bot: Bot
    ) -> Any:
        msg = self._map(event, await self._login(bot))
        if msg is None:
            return None
        decided: list[Decision] = []

        async def decide() -> None:
            decided.append(await self.bouncer.decide(msg))

        what = f"message {msg.id} in {msg.chat.key}"
        await handle_event(self.bouncer.gateway, what, decide)  # logs a store error
        if not decided:
            return None
        d = decided[0]
        if d.action is Action.DROP:
            return None
        if d.action is Action.WARN:
            if self.warnings and d.warning:
                await self._warn(bot, event, msg, d)
            return None
        ticket = _Ticket(self, d)
        token = _current.set(ticket)
        try:
            result = await handler(event, data)
            if isinstance(result, TelegramMethod) and result.__api_method__.startswith(_SENDING):
                # A reply returned for aiogram to send ("answer into webhook", in
                # polling too) would go after the handlers, outside the ticket:
                # sent here, under it, as aiogram would (its errors logged).
                await Dispatcher.silent_call_request(bot=bot, result=result)
                return None
            return result
        finally:
            _current.reset(token)
            # also while this task is being cancelled: the slot goes back
            await asyncio.shield(self._settle(ticket))

    def _map(self, event: AiogramMessage, me: User) -> Message | None:
        """The adapter's mapping, on python-telegram-bot's objects built from
        the message's Bot API JSON; None (logged) for a message it cannot place."""
        what = f"message {event.message_id} in chat {event.chat.id}"
        try:
            update = Update.de_json({"update_id": 0, "message": _bot_api(event)}, None)
        except Exception as exc:  # whatever PTB trips on: skipped, as the adapter does
            log.warning("bot %s: %s ignored: python-telegram-bot cannot read it: %r",
                        self.bouncer.bot.name, what, exc)  # fmt: skip
            return None
        try:
            return to_message(update, me)
        except Unreadable as exc:
            log.info("bot %s: %s ignored: %s", self.bouncer.bot.name, what, exc)
            return None

    async def _warn(self, bot: Bot, event: AiogramMessage, msg: Message, d: Decision) -> None:
        """Post the warning (counted by the session middleware under `d`)."""
        assert d.warning is not None
        token = _current.set(_Ticket(self, d))
        try:
            await bot.send_message(
                chat_id=event.chat.id,
                text=d.warning,
                message_thread_id=int(msg.chat.topic) if msg.chat.topic else None,
                parse_mode=None,  # plain text, whatever the bot's defaults
            )
        except Exception as exc:
            log.warning("bot %s: posting the limit warning in %s failed: %s",
                        self.bouncer.bot.name, msg.chat.key, exc)  # fmt: skip
        finally:
            _current.reset(token)

    async def _settle(self, ticket: _Ticket) -> None:
        """The handlers are done: a ticket nothing was sent on goes back."""
        ticket.done = True
        if not ticket.used:
            await release(self.bouncer, ticket.decision, log)

    # -- each message sent ------------------------------------------------------

    async def count(self, method: TelegramMethod[Any], result: object) -> None:
        """Count the messages a Bot API call posted (none for other calls)."""
        if not method.__api_method__.startswith(_SENDING):
            return
        sent = result if isinstance(result, list) else [result]
        for one in sent:
            if isinstance(one, AiogramMessage | MessageId):
                try:
                    if isinstance(one, AiogramMessage):
                        await self._count_one(one)
                    else:
                        await self._count_copy(method, one)
                except StoreError as exc:
                    log.error("bot %s: message %s was sent but not counted: %s",
                              self.bouncer.bot.name, one.message_id, exc)  # fmt: skip

    async def _count_one(self, sent: AiogramMessage) -> None:
        try:
            tg = TgMessage.de_json(_bot_api(sent), None)
            chat = chat_of(tg).key
        except Exception as exc:  # Unreadable, or what PTB trips on
            log.warning("bot %s: message %s was sent but cannot be counted: %r",
                        self.bouncer.bot.name, sent.message_id, exc)  # fmt: skip
            return
        await self._count_in(chat, str(sent.message_id), clean(tg.text or tg.caption))

    async def _count_copy(self, method: TelegramMethod[Any], sent: MessageId) -> None:
        """A copy (copyMessage, copyMessages, forwardMessages) answers its id
        only: its chat is the one the call named."""
        chat_id = getattr(method, "chat_id", None)
        chat = telegram_chat(chat_id, getattr(method, "message_thread_id", None))
        if chat is None:
            log.info("bot %s: a message sent to chat %r is not counted: no chat id",
                     self.bouncer.bot.name, chat_id)  # fmt: skip
            return
        await self._count_in(chat, str(sent.message_id), "")

    async def _count_in(self, chat: str, message_id: str, text: str) -> None:
        ticket, d = _current.get(), None
        if (
            ticket is not None
            and ticket.guard is self
            and not ticket.done
            and ticket.decision.chat == chat
        ):
            d = ticket.decision
            ticket.used = True
        await count_sent(self.bouncer, d, chat, message_id, text, log)


class _Counter(BaseRequestMiddleware):
    """The session's request middleware: every call goes through, and what
    it posted is counted once Telegram answered."""

    def __init__(self, guard: AiogramGuard) -> None:
        self.guard = guard

    async def __call__(
        self,
        make_request: NextRequestMiddlewareType[TelegramType],
        bot: Bot,
        method: TelegramMethod[TelegramType],
    ) -> Response[TelegramType]:
        answer = await make_request(bot, method)
        if self.guard.guards(bot):
            # The chain hands on the method's result (typed as its Response).
            result = answer.result if isinstance(answer, Response) else answer
            await self.guard.count(method, result)
        return answer


def guard(
    dispatcher: Dispatcher, bouncer: Bouncer, *, bot: Bot | None = None, warnings: bool = True
) -> AiogramGuard:
    """Let `bouncer` decide which messages `dispatcher`'s handlers see, and
    count what the bot sends. `bot`: the bot to guard (default: the one
    start_polling runs; required for several bots, one guard each).
    `warnings=False`: a limit warning is not posted (the message is still
    kept from the handlers). At the dispatcher's shutdown the guard waits
    until the messages it let through are handled (`idle`)."""
    for other in dispatcher.message.outer_middleware:
        # a second guard of one bot would decide each message again: duplicate
        if isinstance(other, AiogramGuard) and (
            other.bouncer is bouncer or bot is None or other.bot is None or other.bot.id == bot.id
        ):
            raise ValueError("this dispatcher is guarded already: one guard per bot, "
                             "each with bot= when there are several")  # fmt: skip
    g = AiogramGuard(bouncer, bot=bot, warnings=warnings)
    dispatcher.message.outer_middleware(g)
    dispatcher.startup.register(g.on_startup)
    # aiogram does not wait for updates still being handled when polling
    # stops: the messages let through end (and their tickets are released)
    # before the dispatcher's shutdown is over, so the Bouncer can close after
    dispatcher.shutdown.register(g.idle)
    return g
