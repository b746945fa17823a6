"""botbouncer for a python-telegram-bot (v22) Application that keeps its token.

    app = ApplicationBuilder().token(TOKEN).build()
    guard(app, Bouncer("botbouncer.yml", bot="helper"))
    app.add_handler(MessageHandler(filters.TEXT & ~filters.COMMAND, echo))

`guard` wires a `Bouncer` into the application, at three places:

- a `TypeHandler(Update)` in its own handler group, `GROUP`, which runs before
  every group a bot uses. Each new message (`update.message`) is mapped by
  the daemon's own adapter (`adapters.telegram.to_message`: chat and forum
  topic, author with anonymous admins, mentions, system messages) and
  decided. On `reply` the bot's handlers run; on `drop` and `warn` they do
  not (`ApplicationHandlerStop`), and on `warn` the guard posts the warning
  in the message's chat and topic (plain text, not a reply), unless
  `warnings=False`. Other updates (edits, callback queries, channel posts)
  and messages the adapter cannot read pass through untouched. A dedicated
  group, not -1: PTB runs at most one handler per group, so a guard sharing
  group -1 with a bot's own pre-processing handler (PTB's documented
  pattern for an allow-list) would either skip it or be skipped by it.
- `Application.process_update`, wrapped on the instance, which says when the
  handling of an update is over (see `TelegramGuard._process`).
- `Bot._post`, wrapped on the instance of `application.bot`, which sees
  every message the bot sends (see `TelegramGuard._posting`).

When the store is unreachable (`StoreError`), a message is not let through:
an ERROR line says so and the bot's handlers never see it, as the daemon's
adapter does not answer then (`adapters.common.handle_event`). A chat where
bots loop is exactly where failing open would hurt; a person can ask again
once the store is back. Any other failure of the guard's decision fails
closed the same way, with its traceback. The guard's own sends (a warning)
and its counting of the bot's sends never raise into PTB: they are logged.

The Bouncer is the caller's to close (`async with Bouncer(...)`, or in
`post_shutdown`).
"""

from __future__ import annotations

import asyncio
import logging
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeGuard

from telegram import Bot, Update, User
from telegram import Message as TgMessage
from telegram.ext import Application, ApplicationHandlerStop, ContextTypes, TypeHandler

from adapters.common import clean
from adapters.telegram import Unreadable, chat_of, to_message
from botbouncer._middleware import count_sent, release, telegram_chat
from botbouncer.bouncer import Bouncer
from gateway.config import ConfigError
from gateway.model import Action, ChatRef, Decision
from gateway.store import StoreError

log = logging.getLogger(__name__)

# The guard's handler group: before any group a bot would choose.
GROUP = -1_000_000
# Bot API methods whose name starts so may post a message (sendMessage,
# sendPhoto, sendMediaGroup, forwardMessage, copyMessages...); what each
# answered says whether it did (sendChatAction answers True).
_SENDING = ("send", "forward", "copy")

AnyApplication = Application[Any, Any, Any, Any, Any, Any]


@dataclass(eq=False)
class _Handling:
    """One update being processed by one guarded application."""

    guard: TelegramGuard
    decision: Decision | None = None  # reply or warn: its ticket
    sent: int = 0  # messages counted under the ticket
    open: bool = True  # until process_update returned


# The update the current task is handling (None: a job, a task of the bot's
# own, start-up). A task created while handling, e.g. for a block=False
# handler, copies it, so its sends are seen as the update's.
_handling: ContextVar[_Handling | None] = ContextVar("botbouncer_telegram", default=None)


def _is_message(value: object) -> TypeGuard[dict[str, Any]]:
    return isinstance(value, dict) and "chat" in value and "message_id" in value


class TelegramGuard:
    """What `guard` installed on one Application (see the module docstring)."""

    def __init__(self, application: AnyApplication, bouncer: Bouncer, *, warnings: bool) -> None:
        self.application = application
        self.bouncer = bouncer
        self.warnings = warnings
        self.handler: TypeHandler[Update, Any, None] = TypeHandler(
            Update,
            self._on_update,
            block=True,  # not DEFAULT_TRUE: Defaults(block=False) too
        )
        self.me: User | None = None
        self._process_update = application.process_update
        bot: Bot = application.bot
        self._post = bot._post

    @property
    def name(self) -> str:
        return self.bouncer.bot.name

    def _install(self) -> None:
        # Instance attributes: PTB's update fetcher calls self.process_update,
        # and every Bot API method self._post. A Bot, once built, refuses to
        # set public names only (TelegramObject.__setattr__); its instances
        # have a __dict__ (contextlib.AbstractAsyncContextManager, one of its
        # bases, declares no __slots__).
        try:
            self.application.bot._post = self._posting
        except AttributeError as exc:
            raise RuntimeError(f"botbouncer.telegram cannot count this bot's messages: {exc}; "
                               "it supports python-telegram-bot 22") from None  # fmt: skip
        self.application.process_update = self._process  # type: ignore[method-assign]
        self.application.add_handler(self.handler, GROUP)

    async def _me(self) -> User:
        """This bot's account (getMe, cached by PTB's initialize); the Bouncer
        learns its id the first time."""
        if self.me is None:
            bot = self.application.bot
            try:
                me = bot.bot
            except RuntimeError:  # not initialized yet: a send before initialize
                me = await bot.get_me()
            self.me = me
            self.bouncer.bot_id = str(me.id)
            log.info("bot %s is on Telegram as @%s (id %s)", self.name, me.username, me.id)
        return self.me

    # -- the end of an update's handling ---------------------------------------------

    async def _process(self, update: object) -> None:
        """`Application.process_update`, around which the update's handling is
        known: PTB awaits each blocking handler (block=True, the default) in
        it, passes their exceptions to the error handlers and returns. So
        when it returns, a ticket under which nothing was sent is released:
        the handler sent nothing, or raised before it did.

        Not covered: a handler with block=False (or Defaults(block=False), or
        a task the bot starts with application.create_task) runs in a task of
        its own that may outlive this call. What it sends while the update
        is still being processed fills the ticket; what it sends afterwards is
        still counted, as the bot's own turn in its chat (`Bouncer.posted`),
        but the ticket was released by then (its rate slot back)."""
        handling = _Handling(self)
        token = _handling.set(handling)
        try:
            await self._process_update(update)
        finally:
            _handling.reset(token)
            handling.open = False
            d = handling.decision
            if d is not None and handling.sent == 0:
                # also when cancelled (shutdown): the slot goes back regardless
                await asyncio.shield(release(self.bouncer, d, log))

    # -- deciding ----------------------------------------------------------------------

    async def _on_update(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        m = update.message
        if m is None:  # edits, callback queries, channel posts...: not conversation turns
            return
        try:
            msg = to_message(update, await self._me())
        except Unreadable as exc:
            log.info("bot %s: update %s passed through undecided: %s", self.name,
                     update.update_id, exc)  # fmt: skip
            return
        except Exception:  # a bug: the handlers do not see what was not decided
            log.exception("bot %s: reading update %s failed; not handled", self.name,
                          update.update_id)  # fmt: skip
            raise ApplicationHandlerStop from None
        try:
            d = await self.bouncer.decide(msg)
        except StoreError as exc:
            log.error("bot %s: update %s not handled: %s", self.name, update.update_id, exc)
            raise ApplicationHandlerStop from None
        except Exception:
            log.exception("bot %s: deciding on update %s failed; not handled", self.name,
                          update.update_id)  # fmt: skip
            raise ApplicationHandlerStop from None
        handling = _handling.get()
        if d.ticket is not None:
            if handling is not None and handling.guard is self:
                handling.decision = d
            else:  # process_update was replaced after guard(): nothing can release it
                log.warning("bot %s: update %s is handled outside Application.process_update; "
                            "its ticket lapses unless sent on", self.name,
                            update.update_id)  # fmt: skip
        if d.action is Action.REPLY:
            return
        if d.action is Action.WARN and self.warnings and d.warning:
            await self._warn(m, msg.chat, d.warning)
        raise ApplicationHandlerStop

    async def _warn(self, m: TgMessage, chat: ChatRef, text: str) -> None:
        """Post the warning in the message's chat and topic; counted under the
        ticket by `_posting`, like any message sent while handling it."""
        try:
            await self.application.bot.send_message(
                m.chat.id,
                text,
                message_thread_id=None if chat.topic is None else int(chat.topic),
                parse_mode=None,  # plain text, whatever the application's Defaults say
            )
        except Exception as exc:  # TelegramError mostly; never into PTB
            log.warning("bot %s: posting the warning in %s failed: %s", self.name, chat.key, exc)

    # -- counting what the bot sends ---------------------------------------------------

    async def _posting(self, endpoint: str, data: dict[str, Any] | None = None,
                       **kwargs: Any) -> Any:  # fmt: skip
        """`Bot._post`, a private method of python-telegram-bot: every Bot API
        method (send_message, send_photo, send_media_group, copy_message,
        Message.reply_text, ...) calls it with the method's name and
        parameters, and gets Telegram's answer back, once, after AIORateLimiter's
        retries. It is the one place that sees every message the bot sends;
        `Bot._send_message` is narrower but misses send_media_group and the
        copy and forward methods that answer with ids. The tests check that
        PTB still routes sends here (tests/test_middleware_telegram.py).

        Each message sent is counted: under the ticket of the update being
        handled when it goes to that update's chat, else as the bot's own
        turn in its chat (`Bouncer.posted`). A failure to count is logged:
        the message was sent, and the bot's code is told so."""
        result = await self._post(endpoint, data, **kwargs)
        if endpoint.startswith(_SENDING):
            try:
                params = {**(kwargs.get("api_kwargs") or {}), **(data or {})}
                for chat, message_id, text in self._sent(result, params):
                    await self._count(chat, message_id, text)
            except StoreError as exc:
                log.error("bot %s: a message sent with %s was not counted: %s", self.name,
                          endpoint, exc)  # fmt: skip
            except Exception:
                log.exception("bot %s: counting a message sent with %s failed", self.name,
                              endpoint)  # fmt: skip
        return result

    def _sent(self, result: object, params: dict[str, Any]) -> list[tuple[str, str, str]]:
        """(chat key, message id, text) of each message an answer says was
        sent: a Message (chat and topic as `adapters.telegram.chat_of` reads
        them), a list of them (an album), or MessageIds (copies, forwards of
        several), which name no chat: theirs is the one the call named."""
        answers = result if isinstance(result, list) else [result]
        out = []
        for one in answers:
            if _is_message(one):
                m = TgMessage.de_json(one, self.application.bot)
                out.append((chat_of(m).key, str(m.message_id), clean(m.text or m.caption)))
            elif isinstance(one, dict) and isinstance(one.get("message_id"), int):
                chat = telegram_chat(params.get("chat_id"), params.get("message_thread_id"))
                if chat is None:
                    log.info("bot %s: a message sent to chat %r is not counted: no chat id",
                             self.name, params.get("chat_id"))  # fmt: skip
                    continue
                out.append((chat, str(one["message_id"]), ""))
        return out

    async def _count(self, chat: str, message_id: str, text: str) -> None:
        await self._me()
        handling, d = _handling.get(), None
        if (
            handling is not None
            and handling.guard is self
            and handling.open
            and handling.decision is not None
            and handling.decision.chat == chat
        ):
            d = handling.decision
            handling.sent += 1  # before any await: the release at the end sees it
        await count_sent(self.bouncer, d, chat, message_id, text, log)


def guard(application: AnyApplication, bouncer: Bouncer, *, warnings: bool = True) -> TelegramGuard:
    """Put `bouncer` in front of `application`'s handlers and count every
    message its bot sends (see the module docstring). Call it once, before
    the application runs; the Bouncer learns the bot's id (`bot_id`) from
    PTB's getMe at the first update or send. `warnings=False`: on `warn`
    nothing is posted (the handlers still do not see the message)."""
    if bouncer.bot.platform != "telegram":
        raise ConfigError(f"bot {bouncer.bot.name!r} is configured for platform "
                          f"{bouncer.bot.platform}, not telegram: chats are counted per "
                          "platform")  # fmt: skip
    bot = application.bot
    if not callable(getattr(type(bot), "_post", None)):
        raise RuntimeError("botbouncer.telegram needs python-telegram-bot 22 (its Bot._post)")
    if isinstance(getattr(bot._post, "__self__", None), TelegramGuard):
        raise ValueError("this application is guarded already")
    g = TelegramGuard(application, bouncer, warnings=warnings)
    g._install()
    return g
