"""What the discord.py middleware costs a bot: the plainest discord.py echo
bot (a) against the same bot with `botbouncer.discord.guard` (b), its
Bouncer on Redis, both on a fake Discord.

Both contestants are bench/_bare_discord.py: (b) is started with a
botbouncer config, so it adds the one line a user adds,
`guard(client, Bouncer(config))`, and nothing else. The machinery (one fake
Discord per contestant in this process, closed-loop driving, alternating
rounds, CPU per message) is bench/e2e_discord.py's; see its docstring.

What (b) does per message that (a) does not: the payload mapped by the
adapter's own `from_payload`, one admit script call (decide), the reply's
`sent` call (the ticket spent, the reply counted), a decision log line, and
the echo of its own reply recognised without a store call.

Run from the repo root:  .venv/bin/python bench/middleware_discord.py [--floor]
With --floor, (b) is the floor instead: the same bare bot making one redis-py
PING to the same Redis per message before it answers, and nothing else (no
rules, no state): what any guard that asks Redis once per message costs at
least, on this machine, in this closed loop.
Size: E2E_MESSAGES (1500), E2E_WINDOW (32), E2E_ROUNDS (5).
Last line: throughput_ratio=<b/a> p99_ratio=<b/a> (target throughput >= 0.9).
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

import discord
import redis.asyncio as aioredis
import yaml
from _e2e import MESSAGES, ROUNDS, WINDOW, bench_main, compare, started
from _redis import delete_matching, redis_version
from e2e_discord import (
    BOT_ID,
    CHANNELS,
    HERE,
    HUMANS,
    TOKEN,
    DiscordContestant,
    snowflake_base,
)

NAME = "middleware_discord"
TARGET = 0.9
FLOOR = "--floor" in sys.argv[1:]


def bouncer_config(workdir: Path, redis_url: str) -> Path:
    config = {
        "store": {"url": redis_url},
        "bots": [
            {
                "name": "bench",
                "platform": "discord",
                "mode": "decide",
                "user_id": str(BOT_ID),
                "respond_to": "mentions",
                "rate_cap": {"max_replies": 1_000_000},
                # The simulated people answer at machine pace by design.
                "machine_pace": {"within_seconds": 0},
            }
        ],
    }
    path = workdir / "botbouncer.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


async def measure(url: str, private: bool) -> str:
    workdir = Path(tempfile.mkdtemp(prefix="bb-middleware-discord-"))
    base = snowflake_base()
    channel_ids = [base + n for n in range(CHANNELS)]
    bare = DiscordContestant("a bare", workdir, channel_ids)
    wrapped = DiscordContestant("b floor" if FLOOR else "b guarded", workdir, channel_ids)
    wrapped.redis = aioredis.from_url(url)
    ok = False
    try:
        async with started(bare, wrapped):
            config = bouncer_config(workdir, url)
            bot = str(HERE / "_bare_discord.py")
            bare.spawn([sys.executable, bot, bare.fake.api_base, bare.fake.gateway_url, TOKEN])
            b_arg = url if FLOOR else str(config)
            wrapped.spawn([sys.executable, bot, wrapped.fake.api_base, wrapped.fake.gateway_url,
                           TOKEN, b_arg])  # fmt: skip
            where = "a private redis-server" if private else f"REDIS_URL {url} (keys deleted after)"
            print(f"fake Discord in this process, one per contestant; {CHANNELS} channels, "
                  f"{HUMANS} humans; every message mentions the bot")  # fmt: skip
            print(f"a: bench/_bare_discord.py (discord.py {discord.__version__} Client, echo)")
            b_is = (
                "one redis-py PING per message (--floor)"
                if FLOOR
                else "guard(client, Bouncer(config))"
            )
            print(f"b: the same, plus {b_is}: Redis {await redis_version(url)} on {where}")
            print(f"{MESSAGES} messages per run, {WINDOW} in flight, {ROUNDS} rounds after a "
                  f"warm-up; Python {platform.python_version()}, {os.cpu_count()} CPUs",
                  flush=True)  # fmt: skip
            await bare.ready()
            await wrapped.ready()
            print()
            last = await compare(bare, wrapped, throughput_target=TARGET)
            ok = True
            return last
    finally:
        if not private:
            await delete_matching(url, *(f"bb:{{discord:{c}}}:*" for c in channel_ids),
                                  "bb:t:bench/*")  # fmt: skip
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"{NAME}: logs kept in {workdir}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(bench_main(NAME, measure))
