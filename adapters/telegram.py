"""The Telegram adapter (python-telegram-bot 22): translate updates, send
replies, answer the admin commands `/bouncer_status` etc. It knows nothing
about limits; Gateway.handle decides.

Updates come by long polling, or, with `telegram.webhook_url` set, as POSTs to
the daemon's own server (`/v1/webhooks/<bot name>`), each checked against
`telegram.secret_token` before its body is read. Telegram never shows a bot
its own messages, so every message this bot sends is counted when sent, under
the id Telegram returns; another bot that receives it in bot-to-bot mode
counts the same id, once. Sends go through PTB's AIORateLimiter (Telegram's
flood limits, `telegram.rate_limit`); a 429 is retried there, since it
delivered nothing.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import warnings
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any

import aiohttp
from aiohttp import web
from telegram import (
    BotCommand,
    BotCommandScopeAllChatAdministrators,
    MessageEntity,
    Update,
    User,
)
from telegram import Message as TgMessage
from telegram.constants import ChatAction, ChatMemberStatus, ChatType
from telegram.error import InvalidToken, RetryAfter, TelegramError
from telegram.ext import AIORateLimiter, Application, ContextTypes, TypeHandler, filters
from telegram.request import BaseRequest, HTTPXRequest, RequestData
from telegram.warnings import PTBDeprecationWarning

from adapters.common import (
    SendFailed,
    clean,
    deliver,
    handle_event,
    split_message,
    typing_beside,
    utf16_len,
)
from gateway.admin import Admin, AdminError
from gateway.config import BotConfig
from gateway.errors import BotbouncerError, StartupError, StartupUnreachable
from gateway.http import BadRequest, HttpServer, error, json_body
from gateway.model import Action, Author, ChatKind, ChatRef, Decision, Message
from gateway.outbound import client_session
from gateway.pipeline import Gateway
from gateway.store import StoreError

log = logging.getLogger("botbouncer.telegram")
# PTB 22's own RetryAfter constructor reads its deprecated int attribute: a
# warning on every flood limit that no user of botbouncer can act on.
warnings.filterwarnings(
    "ignore", message="Deprecated since version v22.2", category=PTBDeprecationWarning
)

API_BASE = "https://api.telegram.org"
MESSAGE_LIMIT = 4096  # UTF-16 code units
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
ALLOWED_UPDATES = ["message"]  # edits, reactions, channel posts: not conversation turns
CONCURRENT_UPDATES = 256
SEND_RETRIES = 2  # after a 429 (nothing was delivered), PTB's limiter waits and retries
# A reply's sendMessage: PTB's own defaults (5 s to connect, 5 s to read)
SEND_TIMEOUT = aiohttp.ClientTimeout(connect=5, sock_read=5)
COMMAND_PREFIX = "bouncer_"
COMMANDS = {
    "status": "Turn counters, limits, pause and cooldowns",
    "reset": "Zero the turn counters and cooldowns",
    "pause": "No bot answers here until resumed",
    "resume": "Bots answer here again",
    "limits": "Show or set limits: soft=N hard=N rate=N window=S, or clear",
    "why": "The last decisions here, with reasons (why N)",
}
ADMIN_STATUSES = (ChatMemberStatus.OWNER, ChatMemberStatus.ADMINISTRATOR)
_ADDRESSING = (MessageEntity.MENTION, MessageEntity.TEXT_MENTION, MessageEntity.BOT_COMMAND)
# Someone else's admin command: no conversation turn, no answer from this bot.
FOREIGN = "foreign"


# Reading a message: python-telegram-bot's de_json builds its objects from
# whatever it is given, as long as the fields its constructors require are
# there. A message without `chat` gets chat None; a chat id may be a string, a
# text a list, an entity's offset null, a sender's is_bot "yes". Telegram sends
# none of these, but a webhook takes what is POSTed with the secret and a Bot
# API server may have its own bugs: every field read here is checked for the
# type the Bot API gives it, and a message that cannot be placed (no chat, no
# usable id) is ignored with a line saying why - never a 500 or a traceback.


class Unreadable(BotbouncerError):
    """A message the gateway cannot decide on; the text says what is odd."""


def _int(value: object) -> int | None:
    """An id or a count as the Bot API sends one (a bool is no number)."""
    return value if type(value) is int else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _show(value: object) -> str:
    return "missing" if value is None else f"{type(value).__name__} {str(value)[:40]!r}"


def _thread(m: TgMessage) -> int | None:
    """The forum topic a message is in (the General topic has none)."""
    return _int(m.message_thread_id) if m.is_topic_message is True else None


def chat_of(m: TgMessage) -> ChatRef:
    """Chat id plus the forum topic when the message is in one; a private
    chat is a DM. Unreadable when there is no chat or its id is no number."""
    chat = m.chat
    if chat is None:
        raise Unreadable("its message has no chat")
    chat_id = _int(chat.id)
    if chat_id is None:
        raise Unreadable(f"its chat id is {_show(chat.id)}, not a number")
    kind = ChatKind.DM if chat.type == ChatType.PRIVATE else ChatKind.GROUP
    thread = _thread(m)
    topic = str(thread) if thread else None
    return ChatRef(platform="telegram", id=str(chat_id), topic=topic, kind=kind)


def _full_name(user: User) -> str:
    return " ".join(p for p in (_str(user.first_name), _str(user.last_name)) if p)


def author_of(m: TgMessage) -> Author:
    """The sender. A message posted as a chat (an anonymous group admin, a
    linked channel) comes from a placeholder bot account, GroupAnonymousBot or
    Channel_Bot, on behalf of people: it is a person speaking, never a bot turn.
    A sender without a usable id is "unknown", a person; one whose is_bot is
    anything but false is a bot, erring towards stopping a loop."""
    chat = m.sender_chat
    if chat is not None and _int(chat.id) is not None:
        return Author(str(chat.id), clean(_str(chat.title) or _str(chat.username)), False)
    user = m.from_user
    if user is None or _int(user.id) is None:  # Telegram always says who, in chats
        return Author("unknown", "", False)
    return Author(str(user.id), clean(_full_name(user)), user.is_bot is not False)


def entity_texts(text: str, entities: object) -> list[tuple[MessageEntity, str]]:
    """The text each addressing entity covers, counted in UTF-16 code units as
    Telegram does. PTB's own parse_entities raises on a lone surrogate in the
    text or an entity that cuts a surrogate pair; here an entity before, past
    or inside the text covers what is there, half characters as U+FFFD. An
    entity without a numeric offset and length covers nothing. (Pairs, not a
    dict: an entity whose type is a list cannot be hashed.)"""
    if not isinstance(entities, Sequence):
        return []
    units = text.encode("utf-16-le", "surrogatepass")
    out: list[tuple[MessageEntity, str]] = []
    for entity in entities:
        if not isinstance(entity, MessageEntity) or entity.type not in _ADDRESSING:
            continue
        offset, length = _int(entity.offset), _int(entity.length)
        if offset is None or length is None:
            continue
        start = max(0, offset)
        end = max(start, offset + length)
        out.append((entity, units[2 * start : 2 * end].decode("utf-16-le", "replace")))
    return out


def to_message(update: Update, me: User) -> Message:
    """A Telegram message as the gateway sees it; Unreadable names what keeps
    it from being one."""
    m = update.message
    assert m is not None  # dispatch() passes messages only
    message_id = _int(m.message_id)
    if message_id is None:
        raise Unreadable(f"its message_id is {_show(m.message_id)}, not a number")
    chat = chat_of(m)
    own = (me.username or "").lower()
    text = _str(m.text)
    if text is not None:
        entities = entity_texts(text, m.entities)
    else:
        text = _str(m.caption) or ""
        entities = entity_texts(text, m.caption_entities)
    mentions: set[str] = set()
    for entity, said in entities:
        if entity.type == MessageEntity.TEXT_MENTION:
            user_id = None if entity.user is None else _int(entity.user.id)
            if user_id is not None:
                mentions.add(str(user_id))
        elif entity.type == MessageEntity.MENTION and said[1:].lower() == own:
            mentions.add(str(me.id))
        elif entity.type == MessageEntity.BOT_COMMAND:
            target = said.partition("@")[2].lower()
            # /help@thisbot anywhere; a bare /help that opens the message, as
            # PTB's CommandHandler and aiogram's Command filter take it:
            # Telegram shows a bot with privacy mode on only the bare commands
            # meant for it, and one without sees what its own handlers answer.
            if target == own or (not target and _int(entity.offset) == 0):
                mentions.add(str(me.id))
    reply_to = None
    replied = m.reply_to_message
    # In a forum topic, a message that replies to nothing carries the topic's
    # opening (forum_topic_created) as reply_to_message: that is not a reply.
    if isinstance(replied, TgMessage) and replied.forum_topic_created is None:
        reply_to = author_of(replied).id
    return Message(
        id=str(message_id),
        chat=chat,
        author=author_of(m),
        text=clean(text),
        mentions=tuple(sorted(mentions)),
        reply_to=reply_to,
        system=bool(filters.StatusUpdate.ALL.check_update(update)),
    )


def update_kinds(update: Update) -> str:
    """What an update carries ("edited_message", "callback_query"...), for the
    line that says it was ignored."""
    kinds = [k for k in Update.ALL_TYPES if getattr(update, k, None) is not None]
    # kinds PTB does not know, shown so that no key can forge a log line
    kinds += [k if k.isidentifier() else repr(k[:40]) for k in update.api_kwargs]
    return ", ".join(kinds) or "nothing"


def admin_command(m: TgMessage, username: str) -> str | None:
    """`status`, `limits soft=5`, ... for `/bouncer_<command>[@thisbot] args`;
    FOREIGN for a /bouncer_ command addressed to another bot; None otherwise."""
    text = clean(_str(m.text))
    if not text.startswith("/" + COMMAND_PREFIX):
        return None
    head, *args = text.split()  # any whitespace: "/bouncer_why\n5" is "why 5"
    command, _, target = head[1 + len(COMMAND_PREFIX) :].partition("@")
    if target and target.lower() != username.lower():
        return FOREIGN
    return " ".join([command, *args])


_NO_BATCH = object()


class ReadableUpdates(HTTPXRequest):
    """The getUpdates connection (PTB's defaults: one connection, HTTP/1.1),
    which replaces each update python-telegram-bot cannot parse - a field it
    requires is missing (a Bot API server older than PTB, e.g. a poll option
    without persistent_id), a malformed payload - by its bare update_id. That
    update is then skipped and confirmed; otherwise PTB fails on the whole
    batch, fetches it again, and the bot hears nothing any more.

    Checking costs a second parse of every update, so it is done only when it
    is needed: when PTB asks again from the offset of a batch it was given,
    it could not read that batch (a batch it read moves the offset on). PTB's
    two CRITICAL lines about that first, unchecked, batch are held back
    (`_QuietFirstFailure`): the check that follows names the update it skips.
    """

    def __init__(self, bot_name: str) -> None:
        super().__init__()
        self.bot_name = bot_name
        self._offset: object = None  # of the call in flight (one connection: one call)
        self._unread: object = _NO_BATCH  # the offset of the last batch given to PTB
        self.unchecked: object = None  # that batch's list, when it went unchecked
        quiet = _QuietFirstFailure(self)
        logging.getLogger("telegram.ext.ExtBot").addFilter(quiet)
        logging.getLogger("telegram.ext.Updater").addFilter(quiet)
        self.quiet = quiet

    async def do_request(
        self,
        url: str,
        method: str,
        request_data: RequestData | None = None,
        read_timeout: Any = BaseRequest.DEFAULT_NONE,
        write_timeout: Any = BaseRequest.DEFAULT_NONE,
        connect_timeout: Any = BaseRequest.DEFAULT_NONE,
        pool_timeout: Any = BaseRequest.DEFAULT_NONE,
    ) -> tuple[int, bytes]:
        self._offset = None if request_data is None else request_data.parameters.get("offset")
        return await super().do_request(url, method, request_data, read_timeout, write_timeout,
                                        connect_timeout, pool_timeout)  # fmt: skip

    def parse_json_payload(self, payload: bytes) -> dict[str, Any]:  # type: ignore[override]
        data = HTTPXRequest.parse_json_payload(payload)
        result = data.get("result")
        self.unchecked = None
        if isinstance(result, list) and result:
            if self._offset == self._unread:  # the same batch again: PTB could not read it
                data["result"] = [self._readable(update) for update in result]
            else:
                self.unchecked = result
            self._unread = self._offset
        return data

    def close_filters(self) -> None:
        logging.getLogger("telegram.ext.ExtBot").removeFilter(self.quiet)
        logging.getLogger("telegram.ext.Updater").removeFilter(self.quiet)

    def _readable(self, update: Any) -> Any:
        try:
            Update.de_json(update, None)
        except Exception as exc:
            update_id = update.get("update_id") if isinstance(update, dict) else None
            if not isinstance(update_id, int):
                return update  # not from Telegram; PTB says what is wrong
            log.warning("bot %s: skipped update %d, which python-telegram-bot cannot read: %r",
                        self.bot_name, update_id, exc)  # fmt: skip
            return {"update_id": update_id}
        return update


class _QuietFirstFailure(logging.Filter):
    """Holds back PTB's CRITICAL lines about a batch ReadableUpdates handed
    over unchecked: "Error while parsing updates! Received data was ..." from
    the bot (recognised by that very list), then the updater's "Something went
    wrong processing the data ..." that follows it in the same task. The next
    fetch checks that batch and logs the update it skips; a failure of a
    checked batch is logged by PTB as usual."""

    def __init__(self, request: ReadableUpdates) -> None:
        super().__init__()
        self.request = request
        self.held = False

    def filter(self, record: logging.LogRecord) -> bool:
        unchecked = self.request.unchecked
        if (
            unchecked is not None
            and record.name == "telegram.ext.ExtBot"
            and isinstance(record.args, tuple)
            and record.args
            and record.args[0] is unchecked
        ):
            self.held = True
            return False
        if self.held and record.name == "telegram.ext.Updater":
            self.held = False
            return False
        return True


class TelegramAdapter:
    def __init__(self, bot: BotConfig, gateway: Gateway, server: HttpServer) -> None:
        if bot.token is None:  # the config refuses this; a clear error if it ever slips
            raise StartupError(f"bot {bot.name}: a Telegram bot needs a token")
        self.bot = bot
        self.gateway = gateway
        self.server = server
        self.admin = server.admins.get(bot.name) or Admin(gateway)
        self.webhook = bot.telegram.webhook_url
        secret = bot.telegram.secret_token
        self._secret = secret.get_secret_value().encode() if secret is not None else b""
        self.api = (bot.api_base or API_BASE).rstrip("/")
        self.updates = ReadableUpdates(bot.name)
        builder = (
            Application.builder()
            .token(bot.token.get_secret_value())
            .base_url(f"{self.api}/bot")
            .base_file_url(f"{self.api}/file/bot")
            .rate_limiter(
                AIORateLimiter(
                    overall_max_rate=bot.telegram.rate_limit.overall_per_second,
                    group_max_rate=bot.telegram.rate_limit.group_per_minute,
                    max_retries=SEND_RETRIES,
                )
            )
            .concurrent_updates(CONCURRENT_UPDATES)
            .get_updates_request(self.updates)
        )
        if self.webhook is not None:
            builder = builder.updater(None)
        self.app = builder.build()
        self.app.add_handler(TypeHandler(Update, self._on_update))
        self.app.add_error_handler(self._on_error)
        self.me: User | None = None
        self._token = bot.token.get_secret_value()
        self._http: aiohttp.ClientSession | None = None  # replies (see _send)

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        """getMe (a bad token stops the daemon), register the commands, then
        take updates by webhook or long polling."""
        try:
            await self.app.initialize()
        except InvalidToken:
            raise StartupError(f"bot {self.bot.name}: Telegram refused the token") from None
        except TelegramError as exc:
            raise StartupUnreachable(
                f"bot {self.bot.name}: cannot reach the Bot API at {self.api}: {exc}"
            ) from None
        me = self.app.bot.bot
        self.me = me
        self.gateway.bot_id = str(me.id)
        how = (
            f"by webhook: Telegram POSTs to {self.webhook}, which must reach this "
            f"daemon's /v1/webhooks/{self.bot.name}"
            if self.webhook
            else "by long polling"
        )
        log.info("bot %s is on Telegram as @%s (id %s), %s", self.bot.name, me.username,
                 me.id, how)  # fmt: skip
        if not me.can_read_all_group_messages:
            log.info("bot %s: privacy mode is on, so in groups it sees only commands, replies "
                     "and mentions (BotFather /setprivacy)", self.bot.name)  # fmt: skip
        await self._register_commands()
        self._http = client_session(timeout=SEND_TIMEOUT)
        try:
            await self.app.start()
            if self.webhook is not None:
                self.server.add_webhook(self.bot.name, self._on_webhook)
                await self.app.bot.set_webhook(
                    self.webhook,
                    secret_token=self._secret.decode(),
                    allowed_updates=ALLOWED_UPDATES,
                )
            else:
                assert self.app.updater is not None  # built with one for polling
                await self.app.updater.start_polling(allowed_updates=ALLOWED_UPDATES)
        except TelegramError as exc:
            await self.stop()
            raise StartupError(f"bot {self.bot.name}: Telegram refused to start: {exc}") from None

    async def stop_intake(self) -> None:
        """Fetch no more updates; those already fetched start being handled
        before the daemon refuses new work. (A webhook needs nothing: the
        daemon's listener closes and Telegram delivers again later.)"""
        updater = self.app.updater
        if updater is not None and updater.running:
            try:
                await updater.stop()  # its last getUpdates confirms what was fetched
            except TelegramError as exc:
                log.warning("bot %s: confirming the last updates failed (%s); Telegram "
                            "may deliver them again, and they count once", self.bot.name,
                            exc)  # fmt: skip
        # PTB's fetcher empties the queue into one task per update in a single
        # step, and each task is tracked as in flight on its first: a few
        # yields, bounded, not a wait on anything slow.
        with suppress(TimeoutError):
            async with asyncio.timeout(1):
                while not self.app.update_queue.empty():  # noqa: ASYNC110 - see above
                    await asyncio.sleep(0)
        await asyncio.sleep(0)

    async def stop(self) -> None:
        self.server.remove_webhook(self.bot.name)
        # The webhook stays registered: Telegram keeps updates for the next
        # start or another replica.
        with suppress(TelegramError):
            if self.app.updater is not None and self.app.updater.running:
                await self.app.updater.stop()
            if self.app.running:
                await self.app.stop()
            await self.app.shutdown()
        if self._http is not None:
            await self._http.close()
            self._http = None
        self.updates.close_filters()

    async def _register_commands(self) -> None:
        commands = [BotCommand(COMMAND_PREFIX + name, text) for name, text in COMMANDS.items()]
        try:
            await self.app.bot.set_my_commands(
                commands, scope=BotCommandScopeAllChatAdministrators()
            )
        except TelegramError as exc:
            # Commands are a convenience (the menu); they work without it.
            log.error("bot %s: registering the /bouncer_ commands failed: %s", self.bot.name, exc)

    # -- updates ------------------------------------------------------------------

    async def _on_update(self, update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        """Long polling: PTB hands every update here, concurrently."""
        if isinstance(update, Update):
            what = f"update {update.update_id}"
            await handle_event(self.gateway, what, lambda: self.dispatch(update))

    async def _on_error(self, update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        log.error("bot %s: handling an update failed: %r", self.bot.name, context.error)

    async def _on_webhook(self, request: web.Request) -> web.Response:
        """One update POSTed by Telegram. Handled before answering, so a
        refusal (503 while stopping, store down) makes Telegram deliver it again."""
        given = request.headers.get(SECRET_HEADER, "")
        # Header bytes that are not UTF-8 arrive surrogate-escaped.
        if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), self._secret):
            log.warning("bot %s: webhook call from %s with a wrong or missing secret token; "
                        "ignored", self.bot.name, request.remote)  # fmt: skip
            return error(403, "wrong or missing secret token")
        body = await json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("update_id"), int):
            raise BadRequest("body: must be a Telegram Update object with an update_id")
        try:
            update = Update.de_json(body, self.app.bot)
        except Exception as exc:  # whatever PTB's parser trips on ("message": 5): a 400
            raise BadRequest(f"body: not a Telegram Update: {exc!r}") from None
        with self.gateway.inflight.track():
            await self.dispatch(update)
        return web.json_response({})

    async def dispatch(self, update: Update) -> None:
        """One update: an admin command, a message for the gateway, or
        ignored with a line saying why."""
        m = update.message
        if self.me is None:
            return
        if m is None:  # edits, channel posts, callbacks...: no conversation turns
            log.debug("bot %s: update %s ignored: it carries %s, not a new message",
                      self.bot.name, update.update_id, update_kinds(update))  # fmt: skip
            return
        try:
            msg = to_message(update, self.me)
        except Unreadable as exc:
            log.info("bot %s: update %s ignored: %s", self.bot.name, update.update_id, exc)
            return
        command = admin_command(m, self.me.username or "")
        if command == FOREIGN:
            return
        if command is not None:
            await self._admin(m, msg, command)
            return
        d = await self.gateway.handle(
            msg, busy=lambda: typing_beside(lambda: self._typing(m), f"chat {msg.chat.id}")
        )
        if d.action is Action.REPLY and d.replies:
            await self._post(m, d, list(d.replies), reply=True)
        elif d.action is Action.WARN and d.warning:
            await self._post(m, d, [d.warning], reply=False, warning=True)

    # -- sending ------------------------------------------------------------------

    async def _send(self, m: TgMessage, text: str, *, reply: bool) -> str:
        """Into the message's chat and topic; as a reply when asked (without
        failing if the message was deleted meanwhile). Plain text, no markup.
        Returns the id Telegram gave it.

        One `sendMessage` POST on the adapter's own aiohttp session, through
        PTB's AIORateLimiter (the flood limits, and a 429 waited out and
        retried up to SEND_RETRIES times), not through PTB's Bot and its httpx
        stack: that path was most of the daemon's CPU a message
        (bench/README.md, "Where the daemon's time goes")."""
        params: dict[str, str] = {"chat_id": str(m.chat.id), "text": text}
        thread = _thread(m)
        if thread is not None:
            params["message_thread_id"] = str(thread)
        if reply:
            params["reply_parameters"] = json.dumps(
                {"message_id": m.message_id, "allow_sending_without_reply": True}
            )
        limiter = self.app.bot.rate_limiter
        assert limiter is not None  # built with one
        try:
            sent = await limiter.process_request(
                callback=self._send_message, args=(params,), kwargs={}, endpoint="sendMessage",
                data={"chat_id": m.chat.id}, rate_limit_args=None,
            )  # fmt: skip
        except RetryAfter as exc:  # still flood-limited after the retries: nothing went
            raise SendFailed(f"still flood-limited after {SEND_RETRIES} retries: {exc}") from None
        assert isinstance(sent, dict)  # _send_message's answer
        return str(sent["message_id"])

    async def _send_message(self, params: dict[str, str]) -> dict[str, Any]:
        """One sendMessage call; Telegram's refusal as SendFailed, a 429 as
        PTB's RetryAfter (for the limiter to wait out)."""
        assert self._http is not None  # opened by start
        url = f"{self.api}/bot{self._token}/sendMessage"
        try:
            async with self._http.post(url, data=params) as resp:
                status, raw = resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            # the URL holds the token: name the error's kind, not its text
            raise SendFailed(f"Telegram could not be reached ({type(exc).__name__})") from None
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise SendFailed(f"Telegram answered HTTP {status} without a JSON object")
        if body.get("ok") is True and isinstance(body.get("result"), dict):
            result: dict[str, Any] = body["result"]
            if isinstance(result.get("message_id"), int):
                return result
        parameters = body.get("parameters")
        wait = parameters.get("retry_after") if isinstance(parameters, dict) else None
        if body.get("error_code") == 429 and isinstance(wait, int):
            raise RetryAfter(wait)
        raise SendFailed(f"Telegram refused the message: {body.get('description', body)}")

    async def _post(
        self, m: TgMessage, d: Decision, texts: list[str], *, reply: bool, warning: bool = False
    ) -> None:
        async def send(piece: str, index: int) -> str:
            return await self._send(m, piece, reply=reply and index == 0)

        pieces = [p for text in texts for p in split_message(text, MESSAGE_LIMIT, utf16_len)]
        await deliver(self.gateway, d, pieces, send, warning=warning)

    @asynccontextmanager
    async def _typing(self, m: TgMessage) -> AsyncIterator[None]:
        """ "typing…": Telegram shows it for 5 s or until the bot's next message."""
        await self.app.bot.send_chat_action(
            m.chat.id, ChatAction.TYPING, message_thread_id=_thread(m)
        )
        yield

    # -- admin commands -----------------------------------------------------------

    async def is_admin(self, m: TgMessage) -> bool:
        """Configured user ids, or the chat's administrators (docs/http-api.md).
        Called with a message to_message could read: its chat id is a number."""
        user = m.from_user
        user_id = None if user is None else _int(user.id)
        if user_id is not None and str(user_id) in self.bot.admins.user_ids:
            return True
        if m.chat.type == ChatType.PRIVATE:
            return False
        if m.sender_chat is not None:
            # Only administrators can post as the group itself (anonymously).
            return m.sender_chat.id == m.chat.id
        if user_id is None:
            return False
        member = await self.app.bot.get_chat_member(m.chat.id, user_id)
        return member.status in ADMIN_STATUSES

    async def _admin(self, m: TgMessage, msg: Message, command: str) -> None:
        """Run an admin command and answer it in the chat. The answer is filed
        as an aside, not a turn: no bot counts or answers it."""
        chat = msg.chat
        actor = f"telegram:{msg.author.id}"
        try:
            allowed = await self.is_admin(m)
        except TelegramError as exc:
            log.error("bot %s: checking %s's rights failed: %s", self.bot.name, actor, exc)
            await self._answer(m, chat, "Could not check your admin rights; nothing was changed.")
            return
        if not allowed:
            log.info("bot %s: /%s%s refused for %s", self.bot.name, COMMAND_PREFIX, command,
                     actor)  # fmt: skip
            await self._answer(m, chat, "Only chat administrators and botbouncer admins may "
                                        "do this; nothing was changed.")  # fmt: skip
            return
        try:
            text = await self.admin.run(chat.key, command, actor, chat.kind)
        except AdminError as exc:
            text = f"Not done: {exc}"
        except StoreError as exc:
            log.error("bot %s: /%s%s failed: %s", self.bot.name, COMMAND_PREFIX, command, exc)
            text = "The state store is unavailable; nothing was changed. Try again."
        await self._answer(m, chat, text)

    async def _answer(self, m: TgMessage, chat: ChatRef, text: str) -> None:
        for i, piece in enumerate(split_message(text, MESSAGE_LIMIT, utf16_len)):
            try:
                sent = await self._send(m, piece, reply=i == 0)
            except SendFailed as exc:
                log.warning("bot %s: answering an admin command failed: %s", self.bot.name, exc)
                return
            await self.gateway.note(chat.key, sent, piece)


def create(bot: BotConfig, gateway: Gateway, server: HttpServer) -> TelegramAdapter:
    return TelegramAdapter(bot, gateway, server)
