"""The plainest python-telegram-bot echo bot: bench/e2e_telegram.py's baseline.

    python bench/_bare_telegram.py TOKEN API_BASE CONCURRENT_UPDATES

PTB's own echo example (docs.python-telegram-bot.org, Examples, echobot.py),
pointed at `API_BASE` (the benchmark's fake Bot API):
a MessageHandler for text that is not a command, answering with
`message.reply_text(text)` (in a group: a reply to the message, as
botbouncer's adapter answers), long polling with PTB's defaults (`run_polling`:
timeout 10 s, no poll interval). `CONCURRENT_UPDATES` 0 leaves it as the
example has it (no `concurrent_updates` call: one update at a time);
another number is handed to `concurrent_updates`. There is no rate
limiter (the benchmark lifts botbouncer's). Logging as in PTB's examples: INFO,
with httpx's line per request silenced, so nothing is written per message.
SIGTERM stops it (run_polling's default stop signals).
"""

from __future__ import annotations

import logging
import sys

from telegram import Update
from telegram.ext import Application, ContextTypes, MessageHandler, filters


async def echo(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    message = update.message
    if message is not None and message.text is not None:
        await message.reply_text(message.text)


def main() -> None:
    token, api_base, concurrent = sys.argv[1], sys.argv[2].rstrip("/"), int(sys.argv[3])
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        level=logging.INFO)  # fmt: skip
    logging.getLogger("httpx").setLevel(logging.WARNING)
    builder = (
        Application.builder()
        .token(token)
        .base_url(f"{api_base}/bot")
        .base_file_url(f"{api_base}/file/bot")
    )
    if concurrent:
        builder = builder.concurrent_updates(concurrent)
    app = builder.build()
    app.add_handler(MessageHandler(filters.TEXT & ~filters.COMMAND, echo))
    app.run_polling(allowed_updates=[Update.MESSAGE])


if __name__ == "__main__":
    main()
