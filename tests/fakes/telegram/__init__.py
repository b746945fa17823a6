"""A fake Telegram Bot API server that the real python-telegram-bot (v22) and aiogram
(v3) can talk to.

Start it, point PTB's `base_url` at it, drive the world from tests:

    async with FakeTelegram() as fake:
        fake.add_bot("111:alpha", 111, "alpha_bot")
        fake.add_user(7, "Alice", "alice")
        fake.add_chat(-1001, "supergroup", "the group")
        fake.add_member(-1001, 7)
        fake.add_member(-1001, 111)
        bot = telegram.Bot("111:alpha", base_url=f"{fake.api_base}/bot",
                           request=fast_request(), get_updates_request=fast_request())
        async with bot:
            await fake.user_says(-1001, 7, "/start@alpha_bot")
            updates = await bot.get_updates(timeout=1)
            await bot.send_message(-1001, "hi")
            sent = await fake.wait_sent(1, chat_id=-1001)

A `telegram.ext.Application` is pointed at it the same way (`ApplicationBuilder()
.token(tok).base_url(f"{fake.api_base}/bot")`). Application.initialize calls getMe;
Updater.start_polling calls deleteWebhook, then getUpdates (offset 0 first, timeout
10 by default) in a loop; Updater.stop abandons the running long poll (the fake sees
the client hang up) and calls getUpdates once more with timeout 0 and the next offset
to confirm what it fetched; Application.stop/shutdown call nothing.

An aiogram Bot takes `session=aiogram_session(fake.api_base)` (an AiohttpSession on
`TelegramAPIServer.from_base`). Dispatcher.start_polling calls getMe, then getUpdates
(timeout 10, allowed_updates from the handlers; the offset from the second call on) in
a loop; it calls no deleteWebhook. stop_polling abandons the running long poll (the
fake sees the client hang up) without confirming what it fetched; the bot's next
getUpdates does that.

The modules, each built on those before it:

- world.py: people, bots, chats and their members (set-up and lookups);
- payloads.py: the JSON handed out: messages, the entities Telegram detects in
  plain text (mentions, bot commands), getMe and getChatMember answers;
- params.py: reading form parameters, ApiError;
- updates.py: who gets an update for a message (privacy mode, bot-to-bot rules:
  `receives`), the per-bot queues, getUpdates long polling and webhook delivery;
- api.py: the HTTP endpoint, the other Bot API methods, the records of calls;
- fake.py: FakeTelegram itself, its lifecycle and what people do (`user_says`).

Only what botbouncer's adapter and middlewares, the benchmark and the clients' start-up
use is implemented:
the methods getMe, getUpdates, setWebhook, deleteWebhook, sendMessage,
sendChatAction, setMyCommands and getChatMember, with the parameters listed in
`BotApi.methods`; another parameter is answered with a 400 that says so. There is no
parse_mode, no keyboards, no files.

Known simplifications: webhooks may be plain http on any port (Telegram wants https
on 443/80/88/8443); message text is not trimmed; a private chat's message ids are one
counter for both sides; replies in non-forum supergroups carry no message_thread_id;
several getUpdates of one bot do not terminate each other.

Everything is recorded (`calls`, `sent`, `chat_actions`, `commands`,
`webhook_attempts`, each bot's `pending` updates) and every change notifies one
asyncio.Condition, so tests wait with deadlines (`wait_until`, `wait_sent`).
"""

from tests.fakes.telegram.api import ApiCall, BotApi, ChatAction, SentMessage
from tests.fakes.telegram.fake import FakeTelegram, aiogram_session, fast_request
from tests.fakes.telegram.params import ApiError
from tests.fakes.telegram.payloads import entity_text, find_entities, utf16_len
from tests.fakes.telegram.updates import WebhookAttempt
from tests.fakes.telegram.world import (
    GROUP_ANONYMOUS_BOT_ID,
    FakeBot,
    FakeChat,
    FakeUser,
    Json,
    Webhook,
)

__all__ = [
    "GROUP_ANONYMOUS_BOT_ID",
    "ApiCall",
    "ApiError",
    "BotApi",
    "ChatAction",
    "FakeBot",
    "FakeChat",
    "FakeTelegram",
    "FakeUser",
    "Json",
    "SentMessage",
    "Webhook",
    "WebhookAttempt",
    "aiogram_session",
    "entity_text",
    "fast_request",
    "find_entities",
    "utf16_len",
]
