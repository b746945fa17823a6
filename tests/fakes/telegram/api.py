"""The Bot API over HTTP: each request is recorded (`calls`), then answered by its
method, or by an error queued with `fail_next`.

What python-telegram-bot 22.8 and aiogram 3 send: every method is a POST to
`{base_url}{token}/{method}`, its parameters form-encoded with None values left out
(see params.py; aiogram also leaves out false and empty ones). Only the methods and
parameters that botbouncer's adapter and middlewares, the benchmark's bare PTB bot and
the clients' own start-up and shutdown use are implemented
(`BotApi.methods`); any other parameter is refused with a 400 that says so, so that a
client starting to use one fails loudly instead of being half-served.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.fakes.telegram.params import (
    ApiError,
    opt_bool,
    opt_int,
    opt_json,
    opt_json_object,
    opt_str,
)
from tests.fakes.telegram.payloads import (
    MAX_TEXT_LENGTH,
    find_entities,
    me_payload,
    member_payload,
    new_message,
    utf16_len,
)
from tests.fakes.telegram.updates import Updates
from tests.fakes.telegram.world import MEMBER_STATUSES, FakeBot, FakeChat, Json

CLIENT_CLOSED = 499  # ApiCall.status of a request the client abandoned (nginx's code)
CHAT_ACTIONS = frozenset(
    {
        "typing",
        "upload_photo",
        "record_video",
        "upload_video",
        "record_voice",
        "upload_voice",
        "upload_document",
        "choose_sticker",
        "find_location",
        "record_video_note",
        "upload_video_note",
    }
)
# the scopes without a chat_id (the fake keeps no per-chat commands)
SCOPE_TYPES = frozenset(
    {"default", "all_private_chats", "all_group_chats", "all_chat_administrators"}
)
_COMMAND_NAME = re.compile(r"[a-z0-9_]{1,32}")

Handler = Callable[[FakeBot, Json], Awaitable[Any]]


@dataclass
class ApiCall:
    """One HTTP request to the API; `params` exactly as received (form values are str)."""

    token: str
    method: str
    params: Json
    status: int = 0  # the HTTP status answered; 0 while running, 499 if the client hung up


@dataclass
class SentMessage:
    """A message a bot sent with sendMessage."""

    bot_user_id: int
    chat_id: int
    thread_id: int | None
    text: str
    message: Json  # the Message as returned to the bot
    reply_to: int | None  # the explicitly replied-to message id


@dataclass(frozen=True)
class ChatAction:
    """A sendChatAction ("typing")."""

    bot_user_id: int
    chat_id: int
    action: str
    thread_id: int | None


def scope_key(scope: Json | None) -> str:
    """A BotCommandScope as the key of `FakeTelegram.commands`."""
    return json.dumps(scope or {"type": "default"}, sort_keys=True)


def _json_response(body: Json, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(body).encode(), status=status, content_type="application/json"
    )


async def _read_params(request: web.Request) -> Json:
    """The form fields of a request (an empty body: none)."""
    params: Json = {}
    if request.body_exists:
        for key, value in (await request.post()).items():
            if not isinstance(value, str):
                raise ApiError(400, "Bad Request: the fake Bot API takes no file uploads")
            params[key] = value
    return params


class BotApi(Updates):
    """The world and its update queues, served as the Bot API's methods."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[ApiCall] = []
        self.sent: list[SentMessage] = []
        self.chat_actions: list[ChatAction] = []
        self.commands: dict[tuple[str, str], list[Json]] = {}  # (token, scope_key) -> list
        self._faults: dict[str, deque[ApiError]] = {}
        # method -> (handler, the parameters it takes); bound here, so that a subclass
        # may override a handler
        self.methods: dict[str, tuple[Handler, frozenset[str]]] = {
            "getMe": (self._get_me, frozenset()),
            "getUpdates": (self._get_updates, _names("offset timeout allowed_updates")),
            "setWebhook": (self._set_webhook, _names("url secret_token allowed_updates")),
            "deleteWebhook": (self._delete_webhook, frozenset()),
            "sendMessage": (
                self._send_message,
                _names("chat_id text message_thread_id reply_parameters"),
            ),
            "sendChatAction": (self._send_chat_action, _names("chat_id action message_thread_id")),
            "setMyCommands": (self._set_my_commands, _names("commands scope")),
            "getChatMember": (self._get_chat_member, _names("chat_id user_id")),
        }

    # -- for tests ---------------------------------------------------------------------

    def fail_next(
        self,
        method: str,
        status: int,
        description: str | None = None,
        *,
        retry_after: int | None = None,
    ) -> None:
        """Answer the next call of `method` (by any bot) with this error (429: with
        `retry_after`, 1 s unless given)."""
        if status == 429 and retry_after is None:
            retry_after = 1
        error = ApiError(status, description, retry_after=retry_after)
        self._faults.setdefault(method, deque()).append(error)

    def calls_of(self, method: str, token: str | None = None) -> list[ApiCall]:
        return [c for c in self.calls if c.method == method and token in (None, c.token)]

    def commands_for(self, token: str, scope: Json | None = None) -> list[Json] | None:
        """The commands set for a bot and scope (default {"type": "default"})."""
        return self.commands.get((token, scope_key(scope)))

    async def wait_sent(
        self,
        count: int,
        *,
        chat_id: int | None = None,
        timeout: float = 5.0,  # noqa: ASYNC109
    ) -> list[SentMessage]:
        """Wait until at least `count` messages were sent (to `chat_id`); return them all."""

        def matching() -> list[SentMessage]:
            return [s for s in self.sent if chat_id in (None, s.chat_id)]

        await self.wait_until(
            lambda: len(matching()) >= count,
            timeout,
            f"{count} sent message(s)" + (f" in chat {chat_id}" if chat_id is not None else ""),
        )
        return matching()

    # -- HTTP --------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        token, method = request.match_info["token"], request.match_info["method"]
        call = ApiCall(token, method, {})
        self.calls.append(call)
        try:
            call.params = await _read_params(request)
            bot = self.bots.get(token)
            if bot is None:
                raise ApiError(401, "Unauthorized")
            if method not in self.methods:
                raise ApiError(404, "Not Found")
            handler, takes = self.methods[method]
            if unknown := sorted(set(call.params) - takes):
                implemented = "the fake Bot API does not implement"
                raise ApiError(400, f"Bad Request: {implemented} {method}'s {', '.join(unknown)}")
            if faults := self._faults.get(method):
                raise faults.popleft()
            result = await handler(bot, call.params)
        except ApiError as exc:
            call.status = exc.status
            await self.changed()
            return _json_response(exc.body(), exc.status)
        except asyncio.CancelledError:
            call.status = CLIENT_CLOSED  # the client hung up (e.g. PTB abandoning a long poll)
            raise
        call.status = 200
        await self.changed()
        return _json_response({"ok": True, "result": result})

    # -- the methods (getUpdates and the webhook ones are in updates.py) ---------------

    async def _get_me(self, bot: FakeBot, params: Json) -> Json:
        return me_payload(bot)

    async def _send_message(self, bot: FakeBot, params: Json) -> Json:
        chat = self._chat_for_bot(bot, params, sending=True)
        text = opt_str(params, "text") or ""
        if not text.strip():
            raise ApiError(400, "Bad Request: message text is empty")
        if utf16_len(text) > MAX_TEXT_LENGTH:
            raise ApiError(400, "Bad Request: message is too long")
        thread_id = self._thread(chat, params)
        replied: Json | None = None
        reply = opt_json_object(params, "reply_parameters", "reply parameters")
        if reply is not None:
            reply_id = opt_int(reply, "message_id")
            if reply_id is None:
                raise ApiError(400, "Bad Request: can't parse reply parameters JSON object")
            replied = chat.messages.get(reply_id)
            if replied is None and not opt_bool(reply, "allow_sending_without_reply"):
                raise ApiError(400, "Bad Request: message to be replied not found")
        if thread_id is None and replied is not None and replied.get("is_topic_message"):
            thread_id = int(replied["message_thread_id"])  # a reply lands in its topic
        msg = new_message(
            chat,
            bot.user,
            text=text,
            entities=find_entities(text),
            thread_id=thread_id,
            reply_to=replied,
        )
        reply_to = None if replied is None else int(replied["message_id"])
        self.sent.append(
            SentMessage(bot.id, chat.id, thread_id, text, copy.deepcopy(msg), reply_to)
        )
        self.deliver(chat, msg)
        await self.changed()
        return copy.deepcopy(msg)

    async def _send_chat_action(self, bot: FakeBot, params: Json) -> bool:
        chat = self._chat_for_bot(bot, params, sending=True)
        action = opt_str(params, "action")
        if action not in CHAT_ACTIONS:
            raise ApiError(400, "Bad Request: wrong parameter action in request")
        thread_id = self._thread(chat, params)
        self.chat_actions.append(ChatAction(bot.id, chat.id, action, thread_id))
        return True

    async def _set_my_commands(self, bot: FakeBot, params: Json) -> bool:
        commands = opt_json(params, "commands", "BotCommand array")
        if not isinstance(commands, list) or len(commands) > 100:
            raise ApiError(400, "Bad Request: can't parse BotCommand array JSON object")
        for cmd in commands:
            if not isinstance(cmd, dict):
                raise ApiError(400, "Bad Request: can't parse BotCommand JSON object")
            name, description = cmd.get("command"), cmd.get("description")
            if not isinstance(name, str) or not _COMMAND_NAME.fullmatch(name):
                raise ApiError(400, "Bad Request: BOT_COMMAND_INVALID")
            if not isinstance(description, str) or not 1 <= len(description) <= 256:
                raise ApiError(400, "Bad Request: command description is empty")
        scope = opt_json_object(params, "scope", "BotCommandScope")
        if scope is not None and scope.get("type") not in SCOPE_TYPES:
            types = ", ".join(sorted(SCOPE_TYPES))
            raise ApiError(400, f"Bad Request: the fake Bot API implements the scopes {types}")
        self.commands[(bot.token, scope_key(scope))] = [
            {"command": c["command"], "description": c["description"]} for c in commands
        ]
        return True

    async def _get_chat_member(self, bot: FakeBot, params: Json) -> Json:
        chat = self._chat_for_bot(bot, params)
        user_id = opt_int(params, "user_id", "Bad Request: invalid user_id specified")
        user = None if user_id is None else self.users.get(user_id)
        if user is None:
            raise ApiError(400, "Bad Request: user not found")
        return member_payload(chat, user)

    # -- checks ------------------------------------------------------------------------

    def _chat_for_bot(self, bot: FakeBot, params: Json, *, sending: bool = False) -> FakeChat:
        """The chat `chat_id` names, which the bot must be a member of."""
        chat_id = opt_int(params, "chat_id", "Bad Request: chat not found")
        if chat_id is None:
            raise ApiError(400, "Bad Request: chat_id is empty")
        chat = self.chats.get(chat_id) or self.privates.get((chat_id, bot.id))
        if chat is None:
            user = self.users.get(chat_id)
            if sending and user is not None and user.is_bot:
                raise ApiError(403, "Forbidden: bot can't send messages to bots")
            if sending and user is not None:
                raise ApiError(403, "Forbidden: bot can't initiate conversation with a user")
            raise ApiError(400, "Bad Request: chat not found")
        if chat.members.get(bot.id) not in MEMBER_STATUSES:
            raise ApiError(403, f"Forbidden: bot is not a member of the {chat.type} chat")
        return chat

    def _thread(self, chat: FakeChat, params: Json) -> int | None:
        """The forum topic `message_thread_id` names, if any."""
        thread_id = opt_int(params, "message_thread_id", "Bad Request: message thread not found")
        if thread_id is not None and thread_id not in chat.topics:
            raise ApiError(400, "Bad Request: message thread not found")
        return thread_id


def _names(names: str) -> frozenset[str]:
    return frozenset(names.split())
