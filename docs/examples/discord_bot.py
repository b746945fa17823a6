"""discord.py's quickstart bot, guarded by botbouncer.

    pip install 'botbouncer[discord]'
    DISCORD_TOKEN=... BOTBOUNCER_CONFIG=botbouncer.yml python discord_bot.py

The bot is discord.py's own quickstart (it answers "$hello" with "Hello!")
plus one line, `guard(client, Bouncer(...))`. The config names a bot with
`mode: decide` and `platform: discord` (docs/examples/sidecar.yml); as the
quickstart answers messages that do not mention it, give it
`respond_to: all`. BOTBOUNCER_BOT picks the bot by name when the config has
several. tests/test_middleware_discord.py runs `build` against a fake Discord.
"""

from __future__ import annotations

import asyncio
import os
import sys

import discord

from botbouncer import Bouncer, ConfigError
from botbouncer.discord import guard


def build(bouncer: Bouncer) -> discord.Client:
    intents = discord.Intents.default()
    intents.message_content = True

    client = discord.Client(intents=intents)
    guard(client, bouncer)

    @client.event
    async def on_ready() -> None:
        print(f"We have logged in as {client.user}")

    @client.event
    async def on_message(message: discord.Message) -> None:
        if message.author == client.user:
            return

        if message.content.startswith("$hello"):
            await message.channel.send("Hello!")

    return client


async def serve(token: str, bouncer: Bouncer) -> None:
    async with bouncer, build(bouncer) as client:
        await client.start(token)


def main() -> int:
    token = os.environ.get("DISCORD_TOKEN")
    if not token:
        print("discord_bot.py: set DISCORD_TOKEN to the bot's token", file=sys.stderr)
        return 2
    config = os.environ.get("BOTBOUNCER_CONFIG", "botbouncer.yml")
    try:
        bouncer = Bouncer(config, bot=os.environ.get("BOTBOUNCER_BOT"), platform="discord")
    except ConfigError as exc:
        print(f"discord_bot.py: {exc}", file=sys.stderr)
        return 2
    discord.utils.setup_logging()  # what client.run would do
    try:
        asyncio.run(serve(token, bouncer))
    except discord.LoginFailure as exc:
        print(f"discord_bot.py: Discord refused DISCORD_TOKEN: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
