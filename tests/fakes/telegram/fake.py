"""FakeTelegram: the fake Bot API server, and what people do on Telegram in tests."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from typing import TYPE_CHECKING, Any

from aiohttp import web

from tests.fakes.telegram.api import BotApi
from tests.fakes.telegram.payloads import find_entities, nested, new_message, sorted_entities
from tests.fakes.telegram.updates import Updates
from tests.fakes.telegram.world import GROUP_ANONYMOUS_BOT_ID, MEMBER_STATUSES, FakeChat, Json

if TYPE_CHECKING:
    from aiogram.client.session.aiohttp import AiohttpSession
    from telegram.request import HTTPXRequest

TOPIC_ICON_COLOR = 7322096  # 0x6FB9F0, the default forum topic colour


def fast_request(**kwargs: Any) -> HTTPXRequest:
    """A PTB HTTPXRequest for the fake's plain-http server that skips loading the CA
    bundle (which costs ~0.1 s per client; a Bot has two). Pass it as
    `telegram.Bot(..., request=fast_request(), get_updates_request=fast_request())` or to
    `ApplicationBuilder().request(...).get_updates_request(...)`."""
    from telegram.request import HTTPXRequest

    return HTTPXRequest(httpx_kwargs={"verify": False}, **kwargs)


def aiogram_session(api_base: str, **kwargs: Any) -> AiohttpSession:
    """An aiogram 3 session for the fake at `api_base` (`FakeTelegram.api_base`):
    `aiogram.Bot(token, session=aiogram_session(fake.api_base))`. Methods go to
    `{api_base}/bot{token}/{method}`, files to `{api_base}/file/bot{token}/...`."""
    from aiogram.client.session.aiohttp import AiohttpSession
    from aiogram.client.telegram import TelegramAPIServer

    return AiohttpSession(api=TelegramAPIServer.from_base(api_base), **kwargs)


class FakeTelegram(BotApi):
    """An aiohttp fake of the Telegram Bot API for python-telegram-bot and aiogram
    clients."""

    def __init__(
        self,
        *,
        webhook_tries: int = Updates.webhook_tries,
        webhook_backoff: float = Updates.webhook_backoff,
    ) -> None:
        super().__init__()
        self.webhook_tries = webhook_tries
        self.webhook_backoff = webhook_backoff
        self.api_base = ""  # once started; PTB: base_url=f"{api_base}/bot"
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # see _notify_soon

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> FakeTelegram:
        app = web.Application()
        app.router.add_post("/bot{token}/{method}", self._handle)
        # handler_cancellation: a long poll PTB abandons (Updater.stop) ends with it
        self._runner = web.AppRunner(
            app, shutdown_timeout=1, access_log=None, handler_cancellation=True
        )
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.api_base = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def close(self) -> None:
        await self._stop_updates()
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeTelegram:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- what people do ----------------------------------------------------------------

    async def user_says(
        self,
        chat_id: int,
        user_id: int,
        text: str,
        *,
        thread_id: int | None = None,
        reply_to: int | None = None,
        entities: list[Json] | None = None,
        sender_chat_id: int | None = None,
        to_bot: int | None = None,
    ) -> Json:
        """A person posts `text`; returns the Message. `entities` None: detected as
        Telegram does. `sender_chat_id` (the group's own id): posted anonymously by an
        administrator, from GroupAnonymousBot. `to_bot` picks the private chat when the
        person has one with several bots. Someone who posts in a group becomes a member."""
        chat = self.chat_for_user(chat_id, user_id, to_bot)
        sender = self.user(user_id)
        sender_chat: Json | None = None
        if sender_chat_id is not None:
            if sender_chat_id != chat.id:
                raise ValueError("fake telegram: sender_chat_id must be the chat's own id")
            sender, sender_chat = self.user(GROUP_ANONYMOUS_BOT_ID), chat.payload()
        elif chat.members.get(user_id) not in MEMBER_STATUSES:
            chat.members[user_id] = "member"
        replied = self._replied(chat, reply_to)
        if thread_id is not None and thread_id not in chat.topics:
            raise KeyError(f"fake telegram: no topic {thread_id} in chat {chat.id}")
        if thread_id is None and replied is not None and replied.get("is_topic_message"):
            thread_id = int(replied["message_thread_id"])
        msg = new_message(
            chat,
            sender,
            text=text,
            entities=find_entities(text) if entities is None else sorted_entities(entities),
            thread_id=thread_id,
            reply_to=replied,
            sender_chat=sender_chat,
        )
        self.deliver(chat, msg)
        await self.changed()
        return msg

    async def service(self, chat_id: int, user_id: int, **fields: Any) -> Json:
        """A service message of `user_id` (e.g. `pinned_message=<message>`), delivered
        to every member bot."""
        chat = self.chat_for_user(chat_id, user_id, None)
        extra = copy.deepcopy(fields)
        if isinstance(extra.get("pinned_message"), dict):
            extra["pinned_message"] = nested(extra["pinned_message"])
        msg = new_message(chat, self.user(user_id), fields=extra)
        self.deliver(chat, msg, service=True)
        await self.changed()
        return msg

    def create_topic(self, chat_id: int, user_id: int, name: str) -> int:
        """A forum topic created by `user_id`; returns its message_thread_id (the id of
        the `forum_topic_created` service message, which is delivered to member bots)."""
        chat = self.group(chat_id)
        if not chat.is_forum:
            raise ValueError(f"fake telegram: chat {chat_id} is not a forum")
        thread_id = chat.last_message_id + 1
        chat.topics.add(thread_id)
        created = {"name": name, "icon_color": TOPIC_ICON_COLOR}
        msg = new_message(
            chat, self.user(user_id), thread_id=thread_id, fields={"forum_topic_created": created}
        )
        self.deliver(chat, msg, service=True)
        self._notify_soon()
        return thread_id

    def message_payload(
        self, chat_id: int, user_id: int, text: str | None = None, **fields: Any
    ) -> Json:
        """A new Message of `user_id` in `chat_id` (stored in the chat, so replies to
        it resolve) that nobody receives: a starting point for `push_raw`. `fields`
        are merged in as given."""
        chat = self.chat_for_user(chat_id, user_id, None)
        msg = new_message(chat, self.user(user_id), text=text, fields=copy.deepcopy(fields))
        return copy.deepcopy(msg)

    def user_payload(self, user_id: int) -> Json:
        """A User object (e.g. for a text_mention entity)."""
        return self.user(user_id).payload()

    def _replied(self, chat: FakeChat, reply_to: int | None) -> Json | None:
        if reply_to is None:
            return None
        if reply_to not in chat.messages:
            raise KeyError(f"fake telegram: no message {reply_to} in chat {chat.id}")
        return chat.messages[reply_to]

    def _notify_soon(self) -> None:
        """Wake the waiters (a long poll) from synchronous code."""
        with contextlib.suppress(RuntimeError):  # no running loop: nobody is waiting
            task = asyncio.get_running_loop().create_task(self.changed())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
