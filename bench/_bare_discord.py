"""The plainest discord.py echo bot: contestant (a) of bench/e2e_discord.py.

    python bench/_bare_discord.py API_BASE GATEWAY_URL TOKEN [BOTBOUNCER_CONFIG | REDIS_URL]

discord.py's "A Minimal Bot" (discordpy.readthedocs.io, Quickstart) with one
change: it answers every message, not only "$hello". A `discord.Client` with
the default intents plus message_content that answers every message not
written by a bot (itself included) with its own text, as a reply to it
(`message.reply`): what botbouncer posts, so both contestants ask
the same of the platform (a reply carries a message reference, and its echo
the message it answers), as the Telegram bare bot's `reply_text` does. It is
pointed at a fake Discord the way `pointed_at` of tests/fakes/discord/ does
it: `Route.BASE` and `DiscordWebSocket.DEFAULT_GATEWAY` (a plain `Client`
connects to DEFAULT_GATEWAY and never asks /gateway/bot). discord.py logs as
`Client.run` would set it up (INFO to stderr); SIGTERM or SIGINT closes the
client and the process exits 0.

With a botbouncer config it is contestant (b) of bench/middleware_discord.py:
the same bot plus the one line a user adds, `guard(client, Bouncer(config))`.
With a redis:// URL instead, it is that benchmark's floor (--floor): the same
bot making one redis-py PING per message before it answers, and nothing
else, the least any guard that keeps its state in Redis can cost.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import discord
import yarl
from discord.gateway import DiscordWebSocket
from discord.http import Route


async def serve(token: str, config: str | None) -> None:
    intents = discord.Intents.default()
    intents.message_content = True
    client = discord.Client(intents=intents)
    ping = None
    if config is not None and config.startswith("redis://"):
        import redis.asyncio as aioredis

        ping = aioredis.from_url(config).ping
    elif config is not None:
        from botbouncer import Bouncer
        from botbouncer.discord import guard

        guard(client, Bouncer(config))

    @client.event
    async def on_ready() -> None:
        print(f"ready as {client.user} (id {client.user and client.user.id})", flush=True)

    @client.event
    async def on_message(message: discord.Message) -> None:
        if message.author == client.user or message.author.bot:
            return
        if ping is not None:
            await ping()
        await message.reply(message.content)

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(client.close()))
    async with client:
        await client.start(token)


def main() -> int:
    if len(sys.argv) not in (4, 5):
        print(__doc__, file=sys.stderr)
        return 2
    api_base, gateway_url, token = sys.argv[1:4]
    config = sys.argv[4] if len(sys.argv) == 5 else None
    Route.BASE = api_base.rstrip("/")
    DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(gateway_url)
    discord.utils.setup_logging()
    asyncio.run(serve(token, config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
