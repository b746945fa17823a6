"""Slack end to end: messages/s and message-to-reply latency of Bolt for
Python's quickstart echo app (a) against botbouncer in front of the same echo
(b), both over Socket Mode on the fake Slack of tests/fakes/slack/, in one
invocation.

The contestants, each its own process, started once and kept for all its
runs (start-up is not measured):

- a: bench/_bare_slack.py, Bolt's quickstart as its docs write it for asyncio
  and Socket Mode ("Getting started" and "Using Socket Mode", async): an
  `AsyncApp` whose `@app.message()` listener answers `await say(text)`,
  `AsyncSocketModeHandler(app, app_token).start_async()`, Bolt's defaults
  (the envelope acked before the listener runs, its own messages ignored by
  its middleware), pointed at the fake by an `AsyncWebClient(base_url=...)`.
  E2E_BARE picks its Web API client: `docs` (the default) leaves it as the
  docs make it, without a session, so slack_sdk opens a new aiohttp session
  and connection for every call, each reply included; `session` gives it one
  aiohttp session for the process, as botbouncer's adapter has.
- b: the real daemon, `python -m gateway run -c <config>`: one Slack bot in
  Socket Mode (slack_sdk's aiohttp SocketModeClient, replies by
  AsyncWebClient.chat_postMessage), the echo backend, the store on a real
  Redis (a private redis-server, or REDIS_URL) or `memory://`, the rate cap
  lifted (max_replies 1,000,000, so every message is answered) and the
  machine-pace backstop off (the simulated people answer at machine pace by
  design). Its default INFO log, one decision line per message, stays on:
  that is the real cost.

Each contestant has its own fake Slack in this process, with one app (its
bot user U0BENCHBOT), CHATS public channels and USERS people, all members of
every channel. Message i of a run goes to channel i % CHATS from person
i % USERS, top-level (not in a thread: both bots answer a top-level message
at top level, Bolt's `say` and botbouncer's adapter alike), and reads
`<@U0BENCHBOT> r<run>m<i>`: it mentions the bot, which botbouncer's default
`respond_to: mentions` answers. Both bots echo the text, so the fake reports
each reply (its chat.postMessage) to `Replies` under the text's last word,
in O(1) (`BenchSlack`, a subclass here; the fake itself is unchanged). As
Slack does, the fake sends each reply back to the app as a message event
before it answers the POST: Bolt's middleware drops it, botbouncer decides it
from what it counted. bench/_e2e.py's `drive` keeps WINDOW messages in flight
(closed loop) and `alternate` runs a warm-up each, then a, b, a, b, ...
Between runs the fake forgets what it recorded. Subprocess output goes to
files in a temporary directory; a contestant that exits, posts a reply no
message awaits, or answers nothing for STALL_S seconds ends the benchmark
with its log's last lines (exit 2).

Run from the repo root:  .venv/bin/python bench/e2e_slack.py
(E2E_MESSAGES, E2E_WINDOW, E2E_ROUNDS size it; E2E_STORES picks the stores;
E2E_BARE=session gives a its one session.)
The last line is `throughput_ratio=<b/a> p99_ratio=<b/a> p50_ratio=<b/a> cpu_ratio=<b/a>
cpu_with_redis_ratio=<b/a>` (targets: throughput >= 0.9, p99 <= 1.1, cpu, the
bot's process alone, <= 1.05), then the memory store's, prefixed `memory_`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
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
import slack_bolt.version
import slack_sdk.version
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

from tests.fakes.slack import FakeApp, FakeSlack, Json
from tests.redis_server import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NAME = "e2e_slack"
CHATS = 50
USERS = 8
APP_ID, BOT_ID, BOT_USER = "A0BENCH", "B0BENCH", "U0BENCHBOT"
CHANNELS = [f"C0BENCH{k:04d}" for k in range(CHATS)]
PEOPLE = [f"U0PERSON{u:02d}" for u in range(USERS)]
MAX_REPLIES = 1_000_000  # the config's upper bound: the rate cap never bites
# a's Web API client: as the docs make it (a new connection per call) or on one session
BARE = os.environ.get("E2E_BARE", "docs")
if BARE not in ("docs", "session"):
    raise SystemExit(f"E2E_BARE={BARE!r}: must be 'docs' or 'session'")
READY_S = 60.0  # start-up of a contestant, until its socket is open (and it is healthy)
STALL_S = 15.0  # no reply for this long while messages wait: the contestant is stuck
STOP_S = 15.0  # SIGTERM to exit, then SIGKILL

PROCS: list[subprocess.Popen[bytes]] = []  # stopped at the end, whatever happened


class Failed(Exception):
    """A contestant could not be measured."""


class BenchSlack(FakeSlack):
    """The fake Slack, reporting each chat.postMessage to `replies` under the
    text's last word (both bots echo `<@U0BENCHBOT> r<run>m<i>`)."""

    def __init__(self, replies: Replies) -> None:
        super().__init__()
        self.replies = replies
        self.last_reply = time.perf_counter()
        self.answered = 0

    async def _post_message(self, app: FakeApp, params: Json) -> Json:
        answer = await super()._post_message(app, params)  # refused: ApiError, not a reply
        self.last_reply = time.perf_counter()
        self.answered += 1
        self.replies.arrived(str(params.get("text", "")).rpartition(" ")[2])
        return answer

    def forget(self) -> None:
        """Drop what the fake recorded (between runs, nothing in flight): its
        records would grow through the invocation, and so would the time
        this process's collector spends walking them."""
        for records in (self.calls, self.envelopes, self.acks, self.unknown_methods):
            records.clear()
        for channel in self.world.channels.values():
            channel.messages.clear()


class Contestant:
    def __init__(self, label: str, logs: Path) -> None:
        self.label = label
        self.log = logs / f"{label.split()[0]}.log"
        self.replies = Replies()
        self.fake = BenchSlack(self.replies)
        self.app: FakeApp | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.health: str | None = None  # b: its /healthz
        self.redis: aioredis.Redis | None = None  # b: its store, whose CPU counts too
        self.runs = 0
        self.cpu: list[dict[str, float]] = []  # per counted run: CPU ms per message, by process

    async def start_fake(self) -> FakeApp:
        await self.fake.start()
        w = self.fake.world
        for u, person in enumerate(PEOPLE):
            w.add_user(person, f"person{u}")
        self.app = w.add_app(APP_ID, "bench", bot_id=BOT_ID, bot_user_id=BOT_USER)
        for k, channel in enumerate(CHANNELS):
            w.add_channel(channel, f"bench-{k}", *PEOPLE, BOT_USER)
        return self.app

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
        """Until its Socket Mode socket is open (and, for b, /healthz says ok)."""
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if (gone := self.exited()) is not None:
                raise Failed(gone)
            if self.fake.connected(APP_ID) > 0 and (
                self.health is None or await self._healthy(http)
            ):
                return
            await asyncio.sleep(0.05)  # a process starting up: nothing to await on
        raise Failed(f"{self.label} had no Socket Mode connection within {READY_S:g} s; "
                     f"its log ends:\n{self.tail()}")  # fmt: skip

    async def _healthy(self, http: aiohttp.ClientSession) -> bool:
        assert self.health is not None
        try:
            async with http.get(self.health) as resp:
                return resp.status == 200 and (await resp.json()).get("status") == "ok"
        except (aiohttp.ClientError, ValueError):
            return False

    async def inject(self, i: int) -> str:
        key = f"r{self.runs}m{i}"
        await self.fake.user_says(CHANNELS[i % CHATS], PEOPLE[i % USERS], f"<@{BOT_USER}> {key}")
        return key

    async def cpu_now(self) -> dict[str, float]:
        """CPU seconds used so far by its process, its Redis and this process
        (the fake and the driver, serving this contestant while it runs)."""
        now = {"fake+driver": time.process_time()}
        used = None if self.proc is None else process_cpu(self.proc.pid)
        if used is not None:
            now["bot"] = used
        if self.redis is not None:
            info = await self.redis.info("cpu")
            now["redis"] = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        return now

    async def run(self) -> Run:
        """One drive(), watched, with the CPU it cost per message (the bot's
        process and, for b, its Redis)."""
        self.fake.forget()
        before = await self.cpu_now()
        run = await self._run()
        after = await self.cpu_now()
        per = {k: (after[k] - before[k]) * 1000 / run.messages for k in after}
        self.cpu.append(per)
        if "bot" not in per:
            return run
        own = sum(per[k] for k in ("bot", "redis") if k in per)
        return replace(run, cpu_ms=own, bot_cpu_ms=per["bot"])

    async def _run(self) -> Run:
        """One drive(), watched: a contestant that exits, posts a reply no
        message awaits, or answers nothing for STALL_S while messages wait,
        fails the benchmark with its log."""
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
                           f"({self.fake.answered} replies so far); its log ends:\n"
                           f"{self.tail()}")  # fmt: skip
            if problem is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise Failed(problem)
        run = task.result()
        if strays := self.replies.unclaimed():
            raise Failed(f"{self.label}: {len(strays)} replies no message awaited in run "
                         f"{self.runs}, e.g. under {strays[0]!r}; its log ends:\n"
                         f"{self.tail()}")  # fmt: skip
        return run

    def cpu_line(self) -> str:
        """Median CPU ms per message over the counted runs (the first is the warm-up)."""
        counted = self.cpu[1:] or self.cpu
        parts = [f"{k} {statistics.median(c[k] for c in counted):.2f}" for k in counted[0]]
        return f"{self.label}: " + ", ".join(parts)

    async def stop(self) -> None:
        if self.proc is not None:
            await asyncio.to_thread(stop, [self.proc], NAME, STOP_S)
        await self.fake.close()


def daemon_config(redis_url: str, port: int, api_base: str, app: FakeApp) -> str:
    bot: dict[str, Any] = {
        "name": "bench",
        "platform": "slack",
        "token": app.bot_token,
        "api_base": api_base,
        "slack": {"app_token": app.app_token},
        "backend": {"type": "echo"},
        "respond_to": "mentions",
        "rate_cap": {"max_replies": MAX_REPLIES},
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
    """On a shared Redis: drop what an earlier invocation left for these
    channels (turn counts, remembered message ids)."""
    return delete_matching(redis_url, "bb:{slack:C0BENCH*")


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
    with tempfile.TemporaryDirectory(prefix="bb-e2e-slack-") as tmp:
        logs = Path(tmp)
        a = Contestant("a bare Bolt", logs)
        b = Contestant("b botbouncer", logs)
        try:
            app_a = await a.start_fake()
            app_b = await b.start_fake()
            a.spawn([sys.executable, str(HERE / "_bare_slack.py"), app_a.bot_token,
                     app_a.app_token, a.fake.api_base, BARE])  # fmt: skip
            port = free_port()
            config = logs / "botbouncer.yml"
            store_url = redis_url if on_redis else "memory://"
            config.write_text(daemon_config(store_url, port, b.fake.api_base, app_b))
            b.health = f"http://127.0.0.1:{port}/healthz"
            b.spawn([sys.executable, "-m", "gateway", "run", "-c", str(config)])
            if on_redis and private:  # a shared server's CPU is other clients' too
                b.redis = aioredis.from_url(redis_url)
            async with aiohttp.ClientSession() as http:
                await asyncio.gather(a.ready(http), b.ready(http))
            where = "private redis-server" if private else redis_url
            on = f"Redis {version} ({where})" if on_redis else "memory://"
            print(f"slack_bolt {slack_bolt.version.__version__}, slack_sdk "
                  f"{slack_sdk.version.__version__}, botbouncer on {on}; {MESSAGES} messages "
                  f"a run, {WINDOW} in flight, {ROUNDS} rounds after a warm-up; {CHATS} "
                  f"channels, {USERS} people, top-level messages; "
                  f"{os.cpu_count()} CPUs")  # fmt: skip
            client = ("a new connection per Web API call, as the docs make it" if BARE == "docs"
                      else "one aiohttp session")  # fmt: skip
            print(f"a: Bolt's quickstart echo app (AsyncApp, Socket Mode; {client}); b: "
                  f"botbouncer daemon, Socket Mode, echo backend, {store_kind} store, INFO "
                  "decision log on", flush=True)  # fmt: skip
            runs_a, runs_b = await alternate(a.run, b.run)
            last = report(runs_a, runs_b)
            shared = "" if private or not on_redis else "; no redis: a shared server's"
            print(f"CPU ms per message, median over the rounds (fake+driver: this process"
                  f"{shared}):")  # fmt: skip
            for c in (a, b):
                print(f"  {c.cpu_line()}")
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
