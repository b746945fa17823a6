"""Telegram end to end: messages/s and message-to-reply latency of the plainest
python-telegram-bot echo bot (a) against botbouncer in front of the same echo
(b), both on the fake Bot API of tests/fakes/telegram/, in one invocation.

The contestants, each its own process, started once and kept for all its
runs (start-up is not measured):

- a: bench/_bare_telegram.py, PTB's echo example: a MessageHandler for text
  that answers `message.reply_text(text)` (a reply to the message in a group,
  as botbouncer's adapter answers: a send_message with reply_parameters),
  long polling with `run_polling`'s defaults, which are the adapter's too
  (timeout 10 s, no interval), no rate limiter, nothing logged per message.
  E2E_BARE picks its concurrency: `example` (the default) leaves it as the
  example is written, one update at a time; `adapter` sets
  `concurrent_updates` to the adapter's CONCURRENT_UPDATES.
- b: the real daemon, `python -m gateway run -c <config>`: one Telegram bot in
  polling mode, the echo backend, the store on a real Redis (a private
  redis-server, or REDIS_URL), the rate cap lifted (max_replies 1,000,000, so
  every message is answered) and PTB's send-rate limits lifted
  (`telegram.rate_limit` 0/0: the fake has no flood limits, and PTB's 30/s and
  20/min per group would measure the limiter, not the guard). Its default INFO
  log, one decision line per message, stays on: that is the real cost.

Each contestant has its own fake server instance in this process, with one
bot (privacy mode on, BotFather's default), CHATS supergroups and USERS
people. Message i of a run goes to chat i % CHATS from person i % USERS and
reads `@bench_bot r<run>m<i>`: it mentions the bot, because a group bot with
privacy mode on gets only mentions, commands and replies, and botbouncer's
default `respond_to: mentions` answers exactly those. Both bots echo the
text, so the fake reports each reply (its sendMessage) to `Replies` under the
text's last word, in O(1). bench/_e2e.py's `drive` keeps WINDOW messages in
flight (closed loop) and `alternate` runs a warm-up each, then a, b, a, b, ...
Subprocess output goes to files in a temporary directory; a contestant that
exits or stops answering for STALL_S seconds ends the benchmark with its
log's last lines (exit 2).

Run from the repo root:  .venv/bin/python bench/e2e_telegram.py
(E2E_MESSAGES, E2E_WINDOW, E2E_ROUNDS size it.) The last line is
`throughput_ratio=<b/a> p99_ratio=<b/a> p50_ratio=<b/a> cpu_ratio=<b/a>
cpu_with_redis_ratio=<b/a>` (targets: throughput >= 0.9, p99 <= 1.1, cpu, the
bot's process alone, <= 1.05), then the memory store's, prefixed `memory_`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for `tests`

import aiohttp
import redis.asyncio as aioredis
import telegram
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
from _redis import delete_matching, main_on_redis, redis_version

from adapters.telegram import CONCURRENT_UPDATES
from tests.fakes.telegram import FakeBot, FakeTelegram, Json
from tests.redis_server import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CHATS = 50
USERS = 8
CHAT_BASE = -1008800000000  # chat k is CHAT_BASE - k
USER_BASE = 880001
BOT_ID = 8800
NAME = "e2e_telegram"
# a's concurrency: PTB's example as written (one update at a time) or the adapter's
BARE = os.environ.get("E2E_BARE", "example")
if BARE not in ("example", "adapter"):
    raise SystemExit(f"E2E_BARE={BARE!r}: must be 'example' or 'adapter'")
BARE_CONCURRENCY = CONCURRENT_UPDATES if BARE == "adapter" else 0
BOT_USERNAME = "bench_bot"
MAX_REPLIES = 1_000_000  # the config's upper bound: the rate cap never bites
READY_S = 60.0  # start-up of a contestant, until it long-polls (and is healthy)
STALL_S = 15.0  # no reply for this long while messages wait: the contestant is stuck
STOP_S = 15.0  # SIGTERM to exit, then SIGKILL

PROCS: list[subprocess.Popen[bytes]] = []  # stopped at the end, whatever happened


class Failed(Exception):
    """A contestant could not be measured."""


class BenchTelegram(FakeTelegram):
    """The fake Bot API, reporting each sendMessage to `replies` under the
    text's last word (both bots echo `@bench_bot r<run>m<i>`)."""

    def __init__(self, replies: Replies) -> None:
        super().__init__()
        self.replies = replies
        self.last_reply = time.perf_counter()

    async def _send_message(self, bot: FakeBot, params: Json) -> Json:
        msg = await super()._send_message(bot, params)
        self.last_reply = time.perf_counter()
        self.replies.arrived(str(msg.get("text", "")).rpartition(" ")[2])
        return msg


class Contestant:
    def __init__(self, label: str, token: str, logs: Path) -> None:
        self.label = label
        self.token = token
        self.log = logs / f"{label.split()[0]}.log"
        self.replies = Replies()
        self.fake = BenchTelegram(self.replies)
        self.proc: subprocess.Popen[bytes] | None = None
        self.health: str | None = None  # b: its /healthz
        self.redis: aioredis.Redis | None = None  # b: its store, whose CPU counts too
        self.runs = 0

    async def start_fake(self) -> None:
        await self.fake.start()
        self.fake.add_bot(self.token, BOT_ID, BOT_USERNAME, "Bench")
        for u in range(USERS):
            self.fake.add_user(USER_BASE + u, f"Person {u}", f"person{u}")
        for k in range(CHATS):
            self.fake.add_chat(CHAT_BASE - k, "supergroup", f"group {k}")
            self.fake.add_member(CHAT_BASE - k, BOT_ID)
            for u in range(USERS):
                self.fake.add_member(CHAT_BASE - k, USER_BASE + u)

    def spawn(self, args: list[str]) -> None:
        with self.log.open("wb") as out:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)  # fmt: skip
        PROCS.append(self.proc)

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join("    " + line for line in text[-lines:]) or "    (empty log)"

    def exited(self) -> str | None:
        if self.proc is not None and self.proc.poll() is not None:
            return f"{self.label} exited with {self.proc.returncode}; its log ends:\n{self.tail()}"
        return None

    async def ready(self, http: aiohttp.ClientSession) -> None:
        """Until it long-polls getUpdates (and, for b, /healthz says ok)."""
        bot = self.fake.bots[self.token]
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if (gone := self.exited()) is not None:
                raise Failed(gone)
            if bot.polling > 0 and (self.health is None or await self._healthy(http)):
                return
            await asyncio.sleep(0.05)  # a process starting up: nothing to await on
        raise Failed(f"{self.label} was not polling within {READY_S:g} s; its log ends:\n"
                     f"{self.tail()}")  # fmt: skip

    async def _healthy(self, http: aiohttp.ClientSession) -> bool:
        assert self.health is not None
        try:
            async with http.get(self.health) as resp:
                return resp.status == 200 and (await resp.json()).get("status") == "ok"
        except (aiohttp.ClientError, ValueError):
            return False

    async def inject(self, i: int) -> str:
        key = f"r{self.runs}m{i}"
        await self.fake.user_says(CHAT_BASE - i % CHATS, USER_BASE + i % USERS,
                                  f"@{BOT_USERNAME} {key}")  # fmt: skip
        return key

    async def cpu_now(self) -> tuple[float, float] | None:
        """CPU seconds its process used so far, and its Redis's (b) or 0."""
        used = None if self.proc is None else process_cpu(self.proc.pid)
        if used is None:
            return None
        redis = 0.0
        if self.redis is not None:
            info = await self.redis.info("cpu")
            redis = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        return used, redis

    async def run(self) -> Run:
        """One drive(), watched, with the CPU it cost per message."""
        before = await self.cpu_now()
        run = await self._run()
        after = await self.cpu_now()
        if before is None or after is None:
            return run
        bot, redis = ((y - x) * 1000 / run.messages for x, y in zip(before, after, strict=True))
        return replace(run, cpu_ms=bot + redis, bot_cpu_ms=bot)

    async def _run(self) -> Run:
        """One drive(), watched: a contestant that exits, or answers nothing for
        STALL_S while messages wait, fails the benchmark with its log."""
        self.runs += 1
        self.fake.last_reply = time.perf_counter()
        task = asyncio.create_task(
            drive(self.label, self.inject, self.replies, reply_within=4 * STALL_S)
        )
        while not task.done():
            await asyncio.wait({task}, timeout=0.5)
            problem = self.exited()
            if problem is None and time.perf_counter() - self.fake.last_reply > STALL_S:
                problem = (f"{self.label}: no reply for {STALL_S:g} s in run {self.runs} "
                           f"({len(self.fake.sent)} replies so far); its log ends:\n"
                           f"{self.tail()}")  # fmt: skip
            if problem is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise Failed(problem)
        return task.result()

    async def stop(self) -> None:
        if self.proc is not None:
            await asyncio.to_thread(stop, [self.proc], NAME, STOP_S)
        await self.fake.close()


def daemon_config(redis_url: str, port: int, api_base: str, token: str) -> str:
    bot: dict[str, Any] = {
        "name": "bench",
        "platform": "telegram",
        "token": token,
        "api_base": api_base,
        "backend": {"type": "echo"},
        "respond_to": "mentions",
        "rate_cap": {"max_replies": MAX_REPLIES},
        "telegram": {"rate_limit": {"overall_per_second": 0, "group_per_minute": 0}},
        # The simulated people answer at machine pace by design; the
        # machine-pace backstop would rightly stop them.
        "machine_pace": {"within_seconds": 0},
    }
    config = {
        "store": {"url": redis_url},
        "http": {"listen": f"127.0.0.1:{port}"},
        "bots": [bot],
    }
    return yaml.safe_dump(config, sort_keys=False)


def forget_chats(redis_url: str) -> Awaitable[None]:
    """On a shared Redis: drop what an earlier invocation left for these chats
    (its dedupe memory would take the fake's message ids for repeats)."""
    return delete_matching(redis_url, f"bb:{{telegram:{str(CHAT_BASE)[:-3]}*")


def problems(c: Contestant) -> list[str]:
    """WARNING/ERROR lines in a contestant's log (decision lines are INFO)."""
    try:
        lines = c.log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    return [line for line in lines if " WARNING " in line or " ERROR " in line]


async def measure(redis_url: str, private: bool, store_kind: str = "redis") -> str:
    on_redis = store_kind == "redis"
    version = await redis_version(redis_url)
    if on_redis and not private:
        await forget_chats(redis_url)
    with tempfile.TemporaryDirectory(prefix="bb-e2e-tg-") as tmp:
        logs = Path(tmp)
        a = Contestant("a bare PTB", "8800:bare-bench", logs)
        b = Contestant("b botbouncer", "8800:bouncer-bench", logs)
        try:
            for c in (a, b):
                await c.start_fake()
            a.spawn([sys.executable, str(HERE / "_bare_telegram.py"), a.token,
                     a.fake.api_base, str(BARE_CONCURRENCY)])  # fmt: skip
            port = free_port()
            config = logs / "botbouncer.yml"
            store_url = redis_url if on_redis else "memory://"
            config.write_text(daemon_config(store_url, port, b.fake.api_base, b.token))
            b.health = f"http://127.0.0.1:{port}/healthz"
            b.spawn([sys.executable, "-m", "gateway", "run", "-c", str(config)])
            if on_redis and private:  # a shared server's CPU is other clients' too
                b.redis = aioredis.from_url(redis_url)
            async with aiohttp.ClientSession() as http:
                await asyncio.gather(a.ready(http), b.ready(http))
            where = "private redis-server" if private else redis_url
            on = f"Redis {version} ({where})" if on_redis else "memory://"
            print(f"python-telegram-bot {telegram.__version__}, botbouncer on {on}; "
                  f"{MESSAGES} messages a run, {WINDOW} in flight, {ROUNDS} rounds after a "
                  f"warm-up; {CHATS} group chats, {USERS} people; concurrent_updates "
                  f"{CONCURRENT_UPDATES} in b, {BARE_CONCURRENCY or 'none (one at a time)'} "
                  f"in a; {os.cpu_count()} CPUs")  # fmt: skip
            print(f"a: bare PTB echo bot; b: botbouncer daemon, echo backend, {store_kind} store, "
                  "INFO decision log on", flush=True)  # fmt: skip
            runs_a, runs_b = await alternate(a.run, b.run)
            last = report(runs_a, runs_b)
            for c in (a, b):
                if c.fake.chat_actions:
                    print(f"{c.label}: {len(c.fake.chat_actions)} chat actions (typing) sent")
                odd = problems(c)
                if odd:
                    print(f"{c.label}: {len(odd)} WARNING/ERROR log lines, e.g. {odd[0]}")
            return last
        finally:
            await asyncio.gather(a.stop(), b.stop())
            if b.redis is not None:
                await b.redis.aclose()
            if on_redis and not private:
                await forget_chats(redis_url)


def main() -> int:
    try:
        return main_on_redis(NAME, on_each_store(measure))  # prints the last line
    except Failed as exc:
        print(f"{NAME}: could not measure: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # drive(): one message got no reply within reply_within
        if not isinstance(exc.code, str):
            raise
        print(f"{NAME}: could not measure: {exc.code}", file=sys.stderr)
        return 2
    finally:
        stop(PROCS, NAME, STOP_S)


if __name__ == "__main__":
    sys.exit(main())
