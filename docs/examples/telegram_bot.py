"""python-telegram-bot's echo bot, guarded by botbouncer.

    pip install 'botbouncer[telegram]'
    TELEGRAM_TOKEN=... BOTBOUNCER_CONFIG=botbouncer.yml python telegram_bot.py

The bot is python-telegram-bot's quickstart echo bot (it answers each text
message with its text, as a reply) plus one line, `guard(app, Bouncer(...))`.
The config names a bot with `mode: decide` and `platform: telegram`, shaped
like docs/examples/sidecar.yml:

    bots:
      - name: helper
        platform: telegram
        mode: decide
        respond_to: all        # the echo answers messages that do not mention it
        rate_cap: {max_replies: 2}

BOTBOUNCER_BOT picks the bot by name when the config has several (default:
the first with `mode: decide`). TELEGRAM_API_BASE (optional) points the bot
at a local Bot API server, e.g. http://127.0.0.1:8081, instead of
https://api.telegram.org. tests/test_middleware_telegram.py runs `build` and
`main` against a fake Bot API.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from telegram import Update
from telegram.error import InvalidToken
from telegram.ext import Application, ApplicationBuilder, ContextTypes, MessageHandler, filters

from botbouncer import Bouncer, ConfigError
from botbouncer.telegram import guard

AnyApplication = Application[Any, Any, Any, Any, Any, Any]
AnyBuilder = ApplicationBuilder[Any, Any, Any, Any, Any, Any]


async def echo(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """Echo the user message."""
    assert update.message is not None and update.message.text is not None  # filters.TEXT
    await update.message.reply_text(update.message.text)


def build(
    token: str, bouncer: Bouncer, builder: AnyBuilder | None = None, *, warnings: bool = True
) -> AnyApplication:
    """The application, guarded; `builder` may come configured (base_url...)."""
    app = (builder if builder is not None else ApplicationBuilder()).token(token).build()
    guard(app, bouncer, warnings=warnings)
    app.add_handler(MessageHandler(filters.TEXT & ~filters.COMMAND, echo))
    return app


def main() -> int:
    token = os.environ.get("TELEGRAM_TOKEN")
    if not token:
        print("telegram_bot.py: set TELEGRAM_TOKEN to the bot's token", file=sys.stderr)
        return 2
    config = os.environ.get("BOTBOUNCER_CONFIG", "botbouncer.yml")
    try:
        bouncer = Bouncer(config, bot=os.environ.get("BOTBOUNCER_BOT") or None, platform="telegram")
    except ConfigError as exc:
        print(f"telegram_bot.py: {exc}", file=sys.stderr)
        return 2

    async def close(app: AnyApplication) -> None:
        await bouncer.close()

    builder = ApplicationBuilder().post_shutdown(close)
    if api_base := os.environ.get("TELEGRAM_API_BASE"):
        builder = builder.base_url(f"{api_base}/bot").base_file_url(f"{api_base}/file/bot")
    logging.basicConfig(
        format="%(asctime)s - %(name)s - %(levelname)s - %(message)s", level=logging.INFO
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    try:
        build(token, bouncer, builder).run_polling()
    except InvalidToken as exc:
        print(f"telegram_bot.py: Telegram refused TELEGRAM_TOKEN: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
