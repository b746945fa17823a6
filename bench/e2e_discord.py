"""End to end on a fake Discord: the plainest discord.py echo bot (a) against
botbouncer (b), the real daemon in front of the echo backend on Redis.

What runs:
- The fake Discord of tests/fakes/discord/ (REST + gateway), in this
  process, one instance per contestant so neither sees the other's traffic.
  Each has one bot user, one guild with CHANNELS text channels and HUMANS
  human members.
- (a) bench/_bare_discord.py: a `discord.Client` (default intents +
  message_content) that answers every non-bot message with its text, as a
  reply (`message.reply`: what botbouncer posts, so the platform does the same
  work for both).
- (b) `python -m gateway run -c <config>`: one Discord bot, `api_base` at the
  fake, the echo backend, `respond_to: mentions` (the default: every injected
  message mentions the bot, so both contestants get the very same traffic),
  the rate cap lifted (max_replies 1,000,000 per 120 s) so every message is
  answered, its store a real Redis (a private redis-server, or REDIS_URL:
  bench/_redis.py), INFO logging on (one decision line per message, written
  to a file: that is the daemon's real cost).
  Both are started once and kept for all their rounds; startup is not measured.

How it is measured (bench/_e2e.py): message i is `<@bot> k<run>-<i>`, said
by a human in channel i % CHANNELS; the fake reports each reply the bot
POSTs to /channels/{id}/messages under the key that ends its text (the echo
backend answers the text as it is, mention included). A closed loop keeps
WINDOW messages awaiting their reply; latency runs from just before a message
is injected to the moment the fake receives the reply to it. Both contestants
must be connected, (b) healthy (/healthz) and both must answer a probe message
before the warm-up; then a warm-up run each and ROUNDS alternating rounds (a, then b); the ratios
are the medians of the rounds' b/a.

What (b) does per message that (a) does not: two atomic Redis calls (admit,
then `sent()` for the reply), allowed_mentions on the reply, a logged
decision line, and the decision on the echo of its own reply (which both bots
receive and (a) drops at once): from what `sent()` counted, no store call,
logged at DEBUG. The fake, as Discord may, sends that echo over the gateway
before it answers the POST; the daemon holds it until the send is counted.
A typing indicator would cost one more REST call, but only once the backend
took 0.3 s, which the echo backend never does.

Beside the table: CPU ms per message of each process (from /proc and Redis's
INFO cpu), the median over the counted rounds; "fake+driver" is this process,
which serves both contestants. Before each run the fake forgets what it recorded, and
this process collects its garbage between runs only (bench/_e2e.Contestant.run), so no
run pays for this process's heap.

It stops with a clear message (exit 2) when a contestant dies, posts a reply
no waiting message owns, or stays silent for QUIET seconds; logs are kept then.
The contestant's lifecycle (its process and log, ready, the watched runs, the
CPU reading) is bench/_e2e.py's `Contestant`; `DiscordContestant` here adds
the fake Discord, the probe and the strays.

Run from the repo root:  .venv/bin/python bench/e2e_discord.py
Size: E2E_MESSAGES (1500), E2E_WINDOW (32), E2E_ROUNDS (5).
The last line is
`throughput_ratio=<b/a> p99_ratio=<b/a> p50_ratio=<b/a> cpu_ratio=<b/a>
cpu_with_redis_ratio=<b/a>` (targets: throughput >= 0.9, p99 <= 1.1, cpu, the
bot's process alone, <= 1.05), then the memory store's, prefixed `memory_`.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import discord
import redis.asyncio as aioredis
from _e2e import (
    BASELINE,
    MESSAGES,
    ROUNDS,
    WINDOW,
    Contestant,
    Replies,
    baseline_store,
    bench_main,
    compare,
    drive,
    on_each_store,
    say_baseline,
    started,
)
from _redis import ROOT, delete_matching, redis_version

sys.path.insert(0, str(ROOT))  # tests.fakes: the repo root is not on sys.path for bench/

from tests.fakes.discord import (
    DISCORD_EPOCH_MS,
    FakeDiscord,
    RecordedMessage,
    member,
    text_channel,
)

NAME = "e2e_discord"
HERE = Path(__file__).resolve().parent
CHANNELS = 50
HUMANS = 5
TOKEN = "bench-discord-token"
BOT_ID = 1_200_000_000_000_000_077
GUILD_ID = 1_100_000_000_000_000_077
HUMAN_IDS = [1_400_000_000_000_000_100 + n for n in range(HUMANS)]
QUIET = 10.0  # seconds without any reply while messages wait: the contestant is stuck
STARTUP = 60.0  # seconds to connect
PROBE = 20.0  # seconds to answer the probe (below drive()'s own 30 s)


class BenchDiscord(FakeDiscord):
    """The fake, reporting each message the bot POSTs to a channel, in O(1):
    a reply to a message that awaits one goes to `replies`; anything else
    (no key, an unknown key, a second reply) is a stray, which stops the run."""

    def __init__(self, who: str, replies: Replies) -> None:
        super().__init__()
        self.label = f"fake discord ({who})"
        self.replies = replies
        self.pending: set[str] = set()  # keys injected and not answered yet
        self.strays: list[str] = []

    async def _store_and_fanout(
        self, rec: RecordedMessage, *, ephemeral_to: int | None = None
    ) -> None:
        if rec.via == "rest" and rec.author_id == BOT_ID:
            key = rec.content.rpartition(" ")[2]
            if key in self.pending:
                self.pending.discard(key)
                self.replies.arrived(key)
            else:
                self.strays.append(rec.content)
        await super()._store_and_fanout(rec, ephemeral_to=ephemeral_to)

    def forget(self) -> None:
        """Drop what the fake recorded (between runs, nothing in flight): its
        records would otherwise grow through the invocation, and so would the
        time this process's garbage collector spends walking them, in the
        middle of later runs."""
        for records in (self._messages, self._by_id, self.dispatches, self.requests, self.typing):
            records.clear()


def snowflake_base() -> int:
    """Fresh ids for this invocation's channels: a shared REDIS_URL may hold
    keys of earlier runs, which must not count here."""
    return (int(time.time() * 1000) - DISCORD_EPOCH_MS) << 22


def populate(fake: FakeDiscord, channel_ids: list[int]) -> None:
    fake.add_bot(TOKEN, BOT_ID, "echo")
    fake.add_guild(
        GUILD_ID,
        "bench",
        channels=[text_channel(c, f"chan{n}", position=n) for n, c in enumerate(channel_ids)],
        members=[member(h, f"human{n}") for n, h in enumerate(HUMAN_IDS)],
        owner_id=HUMAN_IDS[0],
    )


def lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


class DiscordContestant(Contestant[BenchDiscord]):
    """One bot under test on its own fake Discord: ready once connected to
    the gateway (and healthy) and it answered a probe message; a message it
    posts that answers no waiting message stops it at once."""

    READY_S = STARTUP
    CONNECTING = "connected to the gateway"
    STALL_S = QUIET
    REPLY_WITHIN = 30.0
    TICK = 0.25

    def __init__(self, label: str, workdir: Path, channel_ids: list[int]) -> None:
        super().__init__(label, workdir)
        self.channel_ids = channel_ids
        populate(self.fake, channel_ids)

    def make_fake(self) -> BenchDiscord:
        return BenchDiscord(self.label, self.replies)

    def connected(self) -> bool:
        return len(self.fake.connected(BOT_ID)) > 0

    async def inject(self, i: int) -> str:
        key = f"k{self.runs}-{i}"
        self.fake.pending.add(key)
        channel = self.channel_ids[i % CHANNELS]
        human = HUMAN_IDS[(i // CHANNELS) % HUMANS]
        await self.fake.user_says(channel, human, f"<@{BOT_ID}> {key}")
        return key

    def forget(self) -> None:
        self.fake.forget()

    def problem(self) -> str | None:
        exited = super().problem()
        if exited is None and self.fake.strays:
            return (f"it posted {len(self.fake.strays)} message(s) that answer no waiting "
                    f"message, the first: {self.fake.strays[0][:200]!r}")  # fmt: skip
        return exited

    async def ready(self) -> None:
        """Connected to the fake, healthy, and answering a probe message."""
        await super().ready()
        probe = drive(f"{self.label} probe", self.inject, self.replies, messages=1, window=1)
        await self.watched(probe, "the probe message", PROBE)


async def measure(url: str, private: bool, store_kind: str = "redis") -> str:
    workdir = Path(tempfile.mkdtemp(prefix="bb-e2e-discord-"))
    base = snowflake_base()
    channel_ids = [base + n for n in range(CHANNELS)]
    bare = DiscordContestant("a bare", workdir, channel_ids)
    bb = DiscordContestant("b botbouncer", workdir, channel_ids)
    on_redis = store_kind == "redis"
    store = url if on_redis else "memory://"
    if on_redis:  # its CPU counts, a shared server's too (other clients included)
        bb.redis = aioredis.from_url(url)
        if BASELINE is not None:
            bare.redis = aioredis.from_url(url)
    ok = False
    try:
        async with started(bare, bb):
            if BASELINE is None:
                bare.spawn([sys.executable, str(HERE / "_bare_discord.py"), bare.fake.api_base,
                            bare.fake.gateway_url, TOKEN])  # fmt: skip
            else:
                bare.label = f"a {BASELINE.name}"
                bare.spawn_daemon("discord", TOKEN, baseline_store(store), BASELINE)
            bb.spawn_daemon("discord", TOKEN, store)
            where = "a private redis-server" if private else f"REDIS_URL {url} (keys deleted after)"
            print(f"fake Discord in this process, one per contestant; {CHANNELS} channels, "
                  f"{HUMANS} humans; every message mentions the bot")  # fmt: skip
            if BASELINE is None:
                print(f"a: bench/_bare_discord.py (discord.py {discord.__version__} Client, echo)")
            on = f"Redis {await redis_version(url)} on {where}" if on_redis else "memory://"
            print(f"b: python -m gateway run (discord.py {discord.__version__}, echo backend, "
                  f"{on}, INFO log to a file)")  # fmt: skip
            print(
                f"{MESSAGES} messages per run, {WINDOW} in flight, {ROUNDS} rounds after a "
                f"warm-up; Python {platform.python_version()}, {os.cpu_count()} CPUs",
                flush=True,
            )
            say_baseline()
            await bare.ready()
            await bb.ready()
            print()
            shared = "" if private else "; redis: the shared server's, other clients included"
            last = await compare(bare, bb, shared)
            print(f"b's log: {lines(bb.log)} lines for {bb.replies.count} replies (a decision "
                  "line for each message; the echoes of its own replies are at DEBUG)")  # fmt: skip
            ok = True
            return last
    finally:
        if on_redis and not private:
            for db in (url, baseline_store(url)):
                await delete_matching(db, *(f"bb:{{discord:{c}}}:*" for c in channel_ids))
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"{NAME}: logs kept in {workdir}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(bench_main(NAME, on_each_store(measure)))
