"""aiogram 3's quickstart bot, guarded by botbouncer.

    pip install 'botbouncer[aiogram]'
    TELEGRAM_TOKEN=... BOTBOUNCER_CONFIG=botbouncer.yml python aiogram_bot.py

The bot is aiogram's quickstart (it greets on /start and echoes every other
message) plus one line, `guard(dp, Bouncer(...))`. Two changes to the
quickstart: the echo answers with the message's text, in its forum topic
(`message.answer`; `send_copy` would post in the General topic), and the
bot sends plain text (no `parse_mode=HTML` default: an echo of "a < b" is
no HTML). The config names a bot with `mode: decide` and `platform:
telegram`, shaped like docs/examples/sidecar.yml:

    bots:
      - name: helper
        platform: telegram
        mode: decide
        respond_to: all        # the echo answers messages that do not mention it
        rate_cap: {max_replies: 2}

BOTBOUNCER_BOT picks the bot by name when the config has several (default:
the first with `mode: decide`). TELEGRAM_API_BASE (optional) points the bot
at a local Bot API server, e.g. http://127.0.0.1:8081, instead of
https://api.telegram.org. tests/test_middleware_aiogram.py runs `build` and
`main` against a fake Bot API.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from aiogram import Bot, Dispatcher
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.exceptions import TelegramUnauthorizedError
from aiogram.filters import CommandStart
from aiogram.types import Message
from aiogram.utils.token import TokenValidationError

from botbouncer import Bouncer, ConfigError
from botbouncer.aiogram import guard


def build(bouncer: Bouncer, *, warnings: bool = True) -> Dispatcher:
    """The dispatcher, guarded, with the quickstart's handlers."""
    dp = Dispatcher()
    guard(dp, bouncer, warnings=warnings)

    @dp.message(CommandStart())
    async def command_start_handler(message: Message) -> None:
        """This handler receives messages with `/start` command"""
        name = message.from_user.full_name if message.from_user else "there"
        await message.answer(f"Hello, {name}!")

    @dp.message()
    async def echo_handler(message: Message) -> None:
        """Handler will answer every other message with its text"""
        if message.text is None:  # a photo, a sticker...
            await message.answer("Nice try!")
        else:
            await message.answer(message.text)

    return dp


async def main() -> int:
    token = os.environ.get("TELEGRAM_TOKEN")
    if not token:
        print("aiogram_bot.py: set TELEGRAM_TOKEN to the bot's token", file=sys.stderr)
        return 2
    config = os.environ.get("BOTBOUNCER_CONFIG", "botbouncer.yml")
    try:
        bouncer = Bouncer(config, bot=os.environ.get("BOTBOUNCER_BOT") or None, platform="telegram")
    except ConfigError as exc:
        print(f"aiogram_bot.py: {exc}", file=sys.stderr)
        return 2
    api_base = os.environ.get("TELEGRAM_API_BASE")
    session = AiohttpSession(api=TelegramAPIServer.from_base(api_base)) if api_base else None
    try:
        async with bouncer, Bot(token=token, session=session) as bot:
            await build(bouncer).start_polling(bot)
    except (TokenValidationError, TelegramUnauthorizedError) as exc:
        print(f"aiogram_bot.py: Telegram refused TELEGRAM_TOKEN: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)
    sys.exit(asyncio.run(main()))
