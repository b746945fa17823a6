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
this process collects its garbage between runs only (bench/_e2e.drive), so no
run pays for this process's heap.

It stops with a clear message (exit 2) when a contestant dies, posts a reply
no waiting message owns, or stays silent for QUIET seconds; logs are kept then.

Run from the repo root:  .venv/bin/python bench/e2e_discord.py
Size: E2E_MESSAGES (1500), E2E_WINDOW (32), E2E_ROUNDS (5).
The last line is
`throughput_ratio=<b/a> p99_ratio=<b/a> p50_ratio=<b/a> cpu_ratio=<b/a>
cpu_with_redis_ratio=<b/a>` (targets: throughput >= 0.9, p99 <= 1.1, cpu, the
bot's process alone, <= 1.05), then the memory store's, prefixed `memory_`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import aiohttp
import discord
import redis.asyncio as aioredis
import yaml
from _e2e import (
    MESSAGES,
    ROUNDS,
    WINDOW,
    Replies,
    Run,
    alternate,
    drive,
    on_each_store,
    process_cpu,
    report,
    stop,
)
from _redis import ROOT, delete_matching, main_on_redis, redis_version

sys.path.insert(0, str(ROOT))  # tests.fakes: the repo root is not on sys.path for bench/

from tests.fakes.discord import (
    DISCORD_EPOCH_MS,
    FakeDiscord,
    RecordedMessage,
    member,
    text_channel,
)
from tests.redis_server import free_port

T = TypeVar("T")

NAME = "e2e_discord"
HERE = Path(__file__).resolve().parent
CHANNELS = 50
HUMANS = 5
TOKEN = "bench-discord-token"
BOT_ID = 1_200_000_000_000_000_077
GUILD_ID = 1_100_000_000_000_000_077
HUMAN_IDS = [1_400_000_000_000_000_100 + n for n in range(HUMANS)]
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # discord.py colours its log lines
QUIET = 10.0  # seconds without any reply while messages wait: the contestant is stuck
STARTUP = 60.0  # seconds to connect
PROBE = 20.0  # seconds to answer the probe (below drive()'s own 30 s)
TICK = 0.25  # how often the watchdog looks (a timed wait in this process, nothing more)
STARTED: list[subprocess.Popen[bytes]] = []  # every child, stopped whatever happens


class Unmeasurable(Exception):
    """A contestant could not be measured: the benchmark says why and exits 2."""


class BenchDiscord(FakeDiscord):
    """The fake, reporting each message the bot POSTs to a channel, in O(1):
    a reply to a message that awaits one goes to `replies`; anything else
    (no key, an unknown key, a second reply) is a stray, which stops the run."""

    def __init__(self, who: str, replies: Replies) -> None:
        super().__init__()
        self.label = f"fake discord ({who})"
        self.replies = replies
        self.pending: set[str] = set()  # keys injected and not answered yet
        self.answered = 0
        self.strays: list[str] = []

    async def _store_and_fanout(
        self, rec: RecordedMessage, *, ephemeral_to: int | None = None
    ) -> None:
        if rec.via == "rest" and rec.author_id == BOT_ID:
            key = rec.content.rpartition(" ")[2]
            if key in self.pending:
                self.pending.discard(key)
                self.answered += 1
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


def spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """A child with stdout and stderr in `log` (never an unread pipe)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    STARTED.append(proc)
    return proc


def tail(path: Path, lines: int = 8) -> str:
    try:
        text = ANSI.sub("", path.read_text(encoding="utf-8", errors="replace")).splitlines()
    except OSError:
        return "(no log)"
    return "\n".join("    " + line for line in text[-lines:]) or "    (empty log)"


def lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


class Contestant:
    """One bot under test: its own fake Discord, its process, its log."""

    def __init__(self, label: str, workdir: Path, channel_ids: list[int]) -> None:
        self.label = label
        self.channel_ids = channel_ids
        self.replies = Replies()
        self.fake = BenchDiscord(label, self.replies)
        populate(self.fake, channel_ids)
        self.log = workdir / f"{label.split()[0]}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.run_no = 0
        self.redis: aioredis.Redis | None = None  # (b) its store, whose CPU counts too
        self.cpu: list[dict[str, float]] = []  # per run: CPU ms per message, by process

    async def cpu_now(self) -> dict[str, float]:
        """CPU seconds used so far by the contestant, its Redis and this process."""
        now = {"fake+driver": time.process_time()}
        if self.proc is not None:
            used = process_cpu(self.proc.pid)
            if used is not None:
                now["bot"] = used
        if self.redis is not None:
            info = await self.redis.info("cpu")
            now["redis"] = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        return now

    async def inject(self, i: int) -> str:
        key = f"k{self.run_no}-{i}"
        self.fake.pending.add(key)
        channel = self.channel_ids[i % CHANNELS]
        human = HUMAN_IDS[(i // CHANNELS) % HUMANS]
        await self.fake.user_says(channel, human, f"<@{BOT_ID}> {key}")
        return key

    def problem(self) -> str | None:
        if self.proc is not None and self.proc.poll() is not None:
            return f"the process exited with status {self.proc.returncode}"
        if self.fake.strays:
            return (f"it posted {len(self.fake.strays)} message(s) that answer no waiting "
                    f"message, the first: {self.fake.strays[0][:200]!r}")  # fmt: skip
        return None

    async def watched(self, aw: Awaitable[T], what: str, quiet: float) -> T:
        """Await `aw`, giving up at once when the process dies or posts a
        stray, or when no reply came for `quiet` seconds."""
        task = asyncio.ensure_future(aw)
        seen, since = self.fake.answered, time.monotonic()
        try:
            while True:
                done, _ = await asyncio.wait([task], timeout=TICK)
                if done:
                    try:
                        return task.result()
                    except TimeoutError as exc:
                        raise Unmeasurable(self.explain(what, str(exc))) from None
                if self.fake.answered != seen:
                    seen, since = self.fake.answered, time.monotonic()
                problem = self.problem()
                if problem is None and time.monotonic() - since > quiet:
                    problem = self.silence(quiet)
                if problem is not None:
                    raise Unmeasurable(self.explain(what, problem))
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def silence(self, quiet: float) -> str:
        said = (f"no reply for {quiet:g} s ({self.fake.answered} replies so far, "
                f"{len(self.fake.pending)} awaited)")  # fmt: skip
        if unclaimed := self.replies.unclaimed():
            said += (f"; {len(unclaimed)} replies came under keys drive() never "
                     f"awaited, e.g. {unclaimed[0]!r}: does inject() return "
                     "the key the reply carries?")  # fmt: skip
        return said

    def explain(self, what: str, problem: str) -> str:
        where = f"its log {self.log}, last lines:\n{tail(self.log)}"
        return f"{self.label}: {what}: {problem}\n  {where}"

    async def ready(self, healthz: str | None = None) -> None:
        """Connected to the fake, healthy, and answering a probe message."""
        await self.watched(self.fake.wait_connected(BOT_ID, timeout=STARTUP), "connecting", STARTUP)
        if healthz is not None:
            async with aiohttp.ClientSession() as http, http.get(healthz) as resp:
                body = await resp.text()
                if resp.status != 200 or '"ok"' not in body:
                    raise Unmeasurable(self.explain("/healthz", f"{resp.status} {body}"))
        probe = drive(f"{self.label} probe", self.inject, self.replies, messages=1, window=1)
        await self.watched(probe, "the probe message", PROBE)

    async def run(self) -> Run:
        self.run_no += 1
        self.fake.forget()
        before = await self.cpu_now()
        run = await self.watched(
            drive(self.label, self.inject, self.replies), f"run {self.run_no}", QUIET
        )
        after = await self.cpu_now()
        per = {k: (after[k] - before[k]) * 1000 / run.messages for k in after}
        self.cpu.append(per)
        own = [per[k] for k in ("bot", "redis") if k in per]
        return replace(run, cpu_ms=sum(own), bot_cpu_ms=per["bot"]) if "bot" in per else run

    def cpu_line(self) -> str:
        """Median CPU ms per message over the counted runs (the first is the warm-up)."""
        counted = self.cpu[1:] or self.cpu
        parts = [f"{k} {statistics.median(c[k] for c in counted):.2f}" for k in counted[0]]
        return f"{self.label}: " + ", ".join(parts)


def daemon_config(workdir: Path, redis_url: str, api_base: str, port: int) -> Path:
    config = {
        "store": {"url": redis_url},
        "http": {"listen": f"127.0.0.1:{port}"},
        "bots": [
            {
                "name": "bench",
                "platform": "discord",
                "token": TOKEN,
                "api_base": api_base,
                "backend": {"type": "echo"},
                "respond_to": "mentions",
                "rate_cap": {"max_replies": 1_000_000},
                # The simulated people answer at machine pace by design; the
                # machine-pace backstop would rightly stop them.
                "machine_pace": {"within_seconds": 0},
            }
        ],
    }
    path = workdir / "botbouncer.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


async def measure(url: str, private: bool, store_kind: str = "redis") -> str:
    workdir = Path(tempfile.mkdtemp(prefix="bb-e2e-discord-"))
    base = snowflake_base()
    channel_ids = [base + n for n in range(CHANNELS)]
    bare = Contestant("a bare", workdir, channel_ids)
    bb = Contestant("b botbouncer", workdir, channel_ids)
    on_redis = store_kind == "redis"
    bb.redis = store = aioredis.from_url(url) if on_redis else None
    procs: list[subprocess.Popen[bytes]] = []
    ok = False
    try:
        for c in (bare, bb):
            await c.fake.start()
        port = free_port()
        config = daemon_config(workdir, url if on_redis else "memory://", bb.fake.api_base, port)
        bare.proc = spawn([sys.executable, str(HERE / "_bare_discord.py"), bare.fake.api_base,
                           bare.fake.gateway_url, TOKEN], bare.log)  # fmt: skip
        bb.proc = spawn([sys.executable, "-m", "gateway", "run", "-c", str(config)], bb.log)
        procs = [bare.proc, bb.proc]
        where = "a private redis-server" if private else f"REDIS_URL {url} (keys deleted after)"
        print(f"fake Discord in this process, one per contestant; {CHANNELS} channels, "
              f"{HUMANS} humans; every message mentions the bot")  # fmt: skip
        print(f"a: bench/_bare_discord.py (discord.py {discord.__version__} Client, echo)")
        on = f"Redis {await redis_version(url)} on {where}" if on_redis else "memory://"
        print(f"b: python -m gateway run (discord.py {discord.__version__}, echo backend, "
              f"{on}, INFO log to a file)")  # fmt: skip
        print(
            f"{MESSAGES} messages per run, {WINDOW} in flight, {ROUNDS} rounds after a "
            f"warm-up; Python {platform.python_version()}, {os.cpu_count()} CPUs",
            flush=True,
        )
        await bare.ready()
        await bb.ready(healthz=f"http://127.0.0.1:{port}/healthz")
        print()
        a, b = await alternate(bare.run, bb.run)
        last = report(a, b)
        shared = "" if private else "; redis: the shared server's, other clients included"
        print(f"CPU ms per message, median over the rounds (fake+driver: this process{shared}):")
        for c in (bare, bb):
            print(f"  {c.cpu_line()}")
        print(f"b's log: {lines(bb.log)} lines for {bb.fake.answered} replies (a decision "
              "line for each message; the echoes of its own replies are at DEBUG)")  # fmt: skip
        ok = True
        return last
    finally:
        stop(procs, NAME)
        if store is not None:
            await store.aclose()
        for c in (bare, bb):
            await c.fake.close()
        if on_redis and not private:
            await delete_matching(url, *(f"bb:{{discord:{c}}}:*" for c in channel_ids))
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"{NAME}: logs kept in {workdir}", file=sys.stderr)


def main() -> int:
    try:
        return main_on_redis(NAME, on_each_store(measure))
    except Unmeasurable as exc:
        print(f"{NAME}: cannot measure: {exc}", file=sys.stderr)
        return 2
    finally:
        stop(STARTED, NAME)


if __name__ == "__main__":
    sys.exit(main())
