"""Who gets an update for a message, and how it gets there: fetched with getUpdates
(long polling) or POSTed by the fake to the bot's webhook.

Updates are queued per bot (`FakeBot.pending`) until getUpdates confirms them (its
`offset`) or the webhook took them. Only "message" updates arise from what happens
in the world; `push_raw` queues any update as given.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import re
from dataclasses import dataclass

import aiohttp
from yarl import URL

from tests.fakes.telegram.params import ApiError, opt_float, opt_int, opt_str, opt_strings
from tests.fakes.telegram.payloads import entity_text
from tests.fakes.telegram.world import (
    ADMIN_STATUSES,
    GROUP_ANONYMOUS_BOT_ID,
    MEMBER_STATUSES,
    FakeBot,
    FakeChat,
    Json,
    Webhook,
    World,
)

# Telegram sends these kinds only to a bot that names them in allowed_updates
OPT_IN_UPDATES = frozenset({"chat_member", "message_reaction", "message_reaction_count"})
MAX_UPDATES = 100  # getUpdates' default (and largest) limit
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
WEBHOOK_TIMEOUT = 5.0
WEBHOOK_CONFLICT = (
    "Conflict: can't use getUpdates method while webhook is active; "
    "use deleteWebhook to delete the webhook first"
)
_SECRET_TOKEN = re.compile(r"[A-Za-z0-9_-]+")


def update_kind(update: Json) -> str | None:
    """The update's kind ("message", "edited_message", ...): its field besides update_id."""
    return next((key for key in update if key != "update_id"), None)


def wanted(kind: str | None, allowed: list[str] | None) -> bool:
    """Whether an update of `kind` goes to a bot with these allowed_updates (None or
    empty: every kind but the opt-in ones). An update of no kind is never filtered."""
    if kind is None:
        return True
    return kind in allowed if allowed else kind not in OPT_IN_UPDATES


@dataclass
class WebhookAttempt:
    """One POST of an update to a webhook; `status` None for a connection error."""

    token: str
    update: Json
    status: int | None
    secret_token: str | None = None  # the header value sent, if any


class Updates(World):
    """The world plus each bot's update queue, and the two ways to empty it."""

    webhook_tries = 3  # attempts per update before it is dropped
    webhook_backoff = 0.05  # seconds before the 2nd attempt, then doubled

    def __init__(self) -> None:
        super().__init__()
        self.webhook_attempts: list[WebhookAttempt] = []
        self._hooks: dict[str, asyncio.Task[None]] = {}  # token -> webhook delivery task
        self._session: aiohttp.ClientSession | None = None  # posts to the webhooks
        self._closing = False  # set by close: ends the long polls

    # -- who gets what -----------------------------------------------------------------

    def receives(self, bot: FakeBot, chat: FakeChat, msg: Json, *, service: bool = False) -> bool:
        """Whether `bot` (R) gets an update for `msg`. Never for its own messages; in a
        private chat only the chat's bot; in groups only member bots, and then:

        - service messages: every member bot;
        - from a person (or an anonymous admin): everything if R has privacy off or is
          an administrator; otherwise only a command for R (`/cmd@R` or a bare `/cmd`,
          anywhere in the text), a reply to one of R's messages, or a mention of R
          (`@R` or a text_mention);
        - from another bot S (https://core.telegram.org/api/bots/bot-to-bot): if S or R
          has bot-to-bot mode and the text has `/cmd@R` or replies to R's message; else
          everything only if R has bot-to-bot mode, is an administrator and has privacy
          off.

        "Reply" includes a forum topic's implicit reply to its creation message, as in
        Telegram: a bot gets every message in a topic it created.
        """
        sender = msg.get("from") or {}
        if sender.get("id") == bot.id:
            return False
        if chat.type == "private":
            return chat.bot_id == bot.id
        status = chat.members.get(bot.id)
        if status not in MEMBER_STATUSES:
            return False
        if service:
            return True
        is_admin = status in ADMIN_STATUSES
        text = msg.get("text") or ""
        entities = msg.get("entities") or []
        commands = [entity_text(text, e) for e in entities if e["type"] == "bot_command"]
        me = f"@{bot.username}".lower()
        command_for_me = any(c.lower().endswith(me) for c in commands)
        replied = msg.get("reply_to_message") or {}
        reply_to_me = (replied.get("from") or {}).get("id") == bot.id
        if sender.get("is_bot") and sender.get("id") != GROUP_ANONYMOUS_BOT_ID:
            other = next((b for b in self.bots.values() if b.id == sender.get("id")), None)
            either_mode = bot.bot_to_bot or (other is not None and other.bot_to_bot)
            if either_mode and (command_for_me or reply_to_me):
                return True
            return bot.bot_to_bot and is_admin and not bot.privacy
        if not bot.privacy or is_admin:
            return True
        bare_command = any("@" not in c for c in commands)
        mentioned = any(
            (e["type"] == "mention" and entity_text(text, e).lower() == me)
            or (e["type"] == "text_mention" and (e.get("user") or {}).get("id") == bot.id)
            for e in entities
        )
        return command_for_me or bare_command or reply_to_me or mentioned

    def deliver(self, chat: FakeChat, msg: Json, *, service: bool = False) -> None:
        """Queue a "message" update for `msg` for every bot that receives it (and wants
        messages); the caller notifies the waiters."""
        for bot in self.bots.values():
            allowed = bot.webhook.allowed_updates if bot.webhook else bot.allowed_updates
            if self.receives(bot, chat, msg, service=service) and wanted("message", allowed):
                self._queue(bot, {"message": copy.deepcopy(msg)})

    def _queue(self, bot: FakeBot, update: Json) -> Json:
        queued = {"update_id": bot.next_update_id, **update}
        bot.next_update_id += 1
        bot.pending.append(queued)
        return queued

    async def push_raw(self, bot_user_id: int, update: Json) -> Json:
        """Queue `update` for one bot exactly as given (its `update_id` is set
        here): any update kind, any message shape, whatever the bot's
        allowed_updates say. Returns the queued update."""
        queued = self._queue(self.bot(bot_user_id), copy.deepcopy(update))
        await self.changed()
        return queued

    # -- getUpdates --------------------------------------------------------------------

    async def _get_updates(self, bot: FakeBot, params: Json) -> list[Json]:
        """Confirms the updates before `offset`, keeps allowed_updates for later calls,
        and waits up to `timeout` seconds while nothing is pending. A poll the client
        abandons is cancelled with its request (the fake's handler_cancellation)."""
        offset = opt_int(params, "offset")
        timeout = max(0.0, opt_float(params, "timeout") or 0.0)
        allowed = opt_strings(params, "allowed_updates", "allowed updates")
        if bot.webhook is not None:
            raise ApiError(409, WEBHOOK_CONFLICT)
        if allowed is not None:
            bot.allowed_updates = allowed or None
            bot.pending = [u for u in bot.pending if wanted(update_kind(u), allowed)]
        if offset:
            bot.pending = [u for u in bot.pending if u["update_id"] >= offset]
        if not bot.pending and timeout > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout), self._cond:
                    bot.polling += 1
                    self._cond.notify_all()  # tests can wait for a poll to be waiting
                    try:
                        await self._cond.wait_for(lambda: bool(bot.pending) or self._closing)
                    finally:
                        bot.polling -= 1
        return copy.deepcopy(bot.pending[:MAX_UPDATES])

    # -- webhooks ----------------------------------------------------------------------

    async def _set_webhook(self, bot: FakeBot, params: Json) -> bool:
        url = opt_str(params, "url") or ""
        secret = opt_str(params, "secret_token")
        parsed = URL(url)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ApiError(400, "Bad Request: bad webhook: Failed to resolve host")
        if secret is not None:
            if len(secret) > 256:
                raise ApiError(400, "Bad Request: secret token is too long")
            if not _SECRET_TOKEN.fullmatch(secret):
                raise ApiError(400, "Bad Request: secret token contains unallowed characters")
        await self._stop_webhook(bot)
        allowed = opt_strings(params, "allowed_updates", "allowed updates")
        bot.webhook = Webhook(url, secret, allowed)
        self._hooks[bot.token] = asyncio.get_running_loop().create_task(self._webhook_loop(bot))
        return True

    async def _delete_webhook(self, bot: FakeBot, params: Json) -> bool:
        await self._stop_webhook(bot)
        return True

    async def _stop_webhook(self, bot: FakeBot) -> None:
        task = self._hooks.pop(bot.token, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        bot.webhook = None

    async def _webhook_loop(self, bot: FakeBot) -> None:
        """Push a bot's updates to its webhook one at a time, in order; an update the
        webhook does not take (no 2xx) is retried with backoff, then dropped."""
        while True:
            async with self._cond:
                await self._cond.wait_for(lambda: bool(bot.pending))
            hook = bot.webhook
            if hook is None:
                return
            update = bot.pending[0]
            for attempt in range(1, self.webhook_tries + 1):
                status = await self._post_update(hook, update)
                self.webhook_attempts.append(
                    WebhookAttempt(bot.token, copy.deepcopy(update), status, hook.secret_token)
                )
                if status is not None and 200 <= status < 300:
                    break
                await self.changed()
                if attempt < self.webhook_tries:
                    await asyncio.sleep(self.webhook_backoff * 2 ** (attempt - 1))
            if bot.pending and bot.pending[0] is update:
                bot.pending.pop(0)
            await self.changed()

    async def _post_update(self, hook: Webhook, update: Json) -> int | None:
        """The HTTP status the webhook answered, None if it could not be reached."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        headers = {"Content-Type": "application/json"}
        if hook.secret_token:
            headers[SECRET_HEADER] = hook.secret_token
        try:
            async with self._session.post(
                hook.url,
                data=json.dumps(update).encode(),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=WEBHOOK_TIMEOUT),
            ) as response:
                await response.read()
                return response.status
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None

    async def _stop_updates(self) -> None:
        """End the long polls and the webhook deliveries (the fake is closing)."""
        self._closing = True
        await self.changed()
        for bot in self.bots.values():
            await self._stop_webhook(bot)
        if self._session is not None:
            await self._session.close()
            self._session = None
