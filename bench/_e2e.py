"""What bench/e2e_discord.py, bench/e2e_slack.py and bench/e2e_telegram.py
share (and bench/middleware_discord.py, through e2e_discord's contestant): the
closed-loop load driver, the statistics, the contestant, the alternation of
the two contestants and the report whose last line is
`throughput_ratio=<b/a> p99_ratio=<b/a> ...`.

A contestant is measured by `drive()`: MESSAGES messages are injected into
the fake platform, at most WINDOW awaiting their reply at any time (a
closed loop, so latency measures the bot, not a queue the benchmark built).
A message's latency runs from just before it is injected to the moment the
fake platform receives the bot's reply to it; throughput is messages over
the wall time from the first injection to the last reply.

`Contestant` is one bot under test, whatever the platform: its own fake
platform in this process, its process (the bare bot, or botbouncer's daemon
with its /healthz) with its log in the invocation's temporary directory,
started once and kept for all its runs; `ready()` until it is connected (and
healthy); each `run()` one drive(), watched (a process that exits, or no
reply for STALL_S while messages wait, ends the benchmark with the log's last
lines: `Unmeasurable`, exit 2 from `bench_main`), with the CPU it cost per
message by process: "bot" (its process, from /proc), "redis" (b's Redis, from
`INFO cpu`, when the benchmark counts it) and "fake+driver" (this process,
serving it); `Run.cpu_ms` is bot + redis, `Run.bot_cpu_ms` bot alone. A
platform's subclass builds the fake and says when the bot is connected and
how message i is said. `Bench` is the measurement of e2e_slack.py and
e2e_telegram.py around two contestants (e2e_discord.py has its own: it keeps
the logs of a failed invocation and counts a shared Redis's CPU).

E2E_BASELINE names a checkout of botbouncer whose daemon is then contestant
a instead of the bare bot (`baseline_store`), to judge a change to the
daemon side by side with the code before it.

The two contestants run alternately, ROUNDS times each after one warm-up
run each that is not counted, so a machine that slows down or speeds up
during the invocation touches both alike. A round is an a run and the b run
right after it; the ratios are the medians of the rounds' b/a, as in the
other benchmarks: on a shared machine a slow spell spoils the round it falls
in, not the comparison.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import gc
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import aiohttp
import redis.asyncio as aioredis
import yaml
from _redis import ROOT, delete_matching, main_on_redis, redis_version

sys.path.insert(0, str(ROOT))  # for `tests`: the repo root is not on sys.path for bench/

from tests.redis_server import free_port

MESSAGES = int(os.environ.get("E2E_MESSAGES", "1500"))
WINDOW = int(os.environ.get("E2E_WINDOW", "32"))
ROUNDS = int(os.environ.get("E2E_ROUNDS", "5"))
# The stores botbouncer runs on, one measurement each (redis first)
STORES = [s for s in os.environ.get("E2E_STORES", "redis,memory").split(",") if s]
# In front of each platform's quickstart bot, on Redis (b/a, medians of the rounds):
THROUGHPUT_TARGET = 0.9  # at least
P99_TARGET = 1.1  # at most
CPU_TARGET = 1.05  # at most: the bot's process, botbouncer's daemon against the bare bot
MAX_REPLIES = 1_000_000  # b's rate cap, the config's upper bound: it never bites
# A checkout of botbouncer whose daemon is contestant a instead of the bare
# bot: two versions side by side, in the same rounds (the targets then say nothing)
BASELINE = Path(os.environ["E2E_BASELINE"]).resolve() if os.environ.get("E2E_BASELINE") else None
STOP_S = 15.0  # SIGTERM to exit, then SIGKILL
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # discord.py colours its log lines

STARTED: list[subprocess.Popen[bytes]] = []  # every contestant's process, stopped at the end


def baseline_store(store_url: str) -> str:
    """The store of E2E_BASELINE's daemon: on Redis the next database of the
    same server (so the two daemons share no key, and the server's CPU is
    read for whichever runs), else the same URL."""
    parts = urllib.parse.urlsplit(store_url)
    if not parts.scheme.startswith("redis"):
        return store_url
    db = int(parts.path.strip("/") or 0)
    return urllib.parse.urlunsplit(parts._replace(path=f"/{(db + 1) % 16}"))


@dataclass(frozen=True, slots=True)
class Run:
    label: str
    messages: int
    seconds: float
    latencies: list[float]  # seconds, one per message
    # CPU ms per message of the contestant's own processes (the bot, and its
    # Redis when it has one), when the benchmark can read it
    cpu_ms: float | None = None
    # ... of the bot's process alone
    bot_cpu_ms: float | None = None
    # ... of every process the run kept busy: this one (the fake and the
    # driver), the bot and its Redis
    all_cpu_ms: float | None = None
    # the wall time over which the CPU was read: the run and its last replies' tail
    cpu_window_s: float | None = None

    @property
    def throughput(self) -> float:
        return self.messages / self.seconds

    def percentile(self, q: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, max(0, round(q / 100 * len(xs)) - 1))]


class Replies:
    """Where the fake platform reports replies: `arrived(key)` wakes the
    message injected under `key`. A reply can land before its message's
    `expect(key)` (injecting may yield after the message went out, e.g. on a
    websocket drain); its arrival time is kept for `expect`."""

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future[float]] = {}
        self._early: dict[str, float] = {}
        self.count = 0  # replies reported so far
        self.last = 0.0  # when the latest came (time.perf_counter())

    def expect(self, key: str) -> asyncio.Future[float]:
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        at = self._early.pop(key, None)
        if at is not None:
            fut.set_result(at)
        else:
            self._waiting[key] = fut
        return fut

    def arrived(self, key: str) -> None:
        self.count += 1
        self.last = now = time.perf_counter()
        fut = self._waiting.pop(key, None)
        if fut is None:
            self._early[key] = now
        elif not fut.done():
            fut.set_result(now)

    def awaited(self) -> int:
        """How many injected messages await their reply."""
        return len(self._waiting)

    def unclaimed(self) -> list[str]:
        """Keys of replies no injected message has claimed (yet)."""
        return list(self._early)


async def drive(
    label: str,
    inject: Callable[[int], Awaitable[str]],
    replies: Replies,
    *,
    messages: int = MESSAGES,
    window: int = WINDOW,
    reply_within: float = 30.0,
) -> Run:
    """Inject `messages` messages, `window` at a time; `inject(i)` posts the
    i-th and returns the key its reply will be reported under."""
    places = asyncio.Semaphore(window)
    latencies: list[float] = []

    async def one(i: int) -> None:
        async with places:
            started = time.perf_counter()
            key = await inject(i)
            fut = replies.expect(key)
            try:
                done = await asyncio.wait_for(fut, reply_within)
            except TimeoutError:
                raise SystemExit(
                    f"{label}: no reply to message {i} within {reply_within:g} s"
                ) from None
            latencies.append(done - started)

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(messages)))
    return Run(label, messages, time.perf_counter() - started, latencies)


def process_cpu(pid: int) -> float | None:
    """CPU seconds every thread of a process has used, from
    /proc/<pid>/task/*/schedstat (Linux; nanoseconds, where /proc/<pid>/stat
    counts 10 ms ticks: a run of half a second read to 2 %); None elsewhere."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    total = 0
    for task in tasks:
        with contextlib.suppress(OSError, IndexError, ValueError):  # a thread that just ended
            total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
    return total / 1e9


def stop(procs: list[subprocess.Popen[bytes]], name: str, wait: float = 10.0) -> None:
    """SIGTERM each contestant, wait up to `wait` s, then SIGKILL; say so when
    one did not exit 0."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        p.send_signal(signal.SIGTERM)
    for p in running:
        try:
            p.wait(wait)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            print(f"{name}: pid {p.pid} ignored SIGTERM for {wait:g} s: killed", file=sys.stderr)
        else:
            if p.returncode != 0:
                print(f"{name}: pid {p.pid} exited with {p.returncode} on SIGTERM", file=sys.stderr)


def _row(r: Run) -> str:
    cpu = "" if r.cpu_ms is None else f"{r.cpu_ms:>9.2f}"
    return (f"{r.label:<12}{r.throughput:>10.0f}{r.percentile(50) * 1000:>10.1f}"
            f"{r.percentile(99) * 1000:>10.1f}{cpu}")  # fmt: skip


def _ratios(x: Run, y: Run) -> dict[str, float]:
    """One round's b/a: throughput, p50, p99 and, where both were read, CPU."""
    out = {
        "throughput": y.throughput / x.throughput,
        "p50": y.percentile(50) / x.percentile(50),
        "p99": y.percentile(99) / x.percentile(99),
    }
    if x.bot_cpu_ms and y.bot_cpu_ms is not None:
        out["cpu"] = y.bot_cpu_ms / x.bot_cpu_ms
    if x.cpu_ms and y.cpu_ms is not None and y.cpu_ms != y.bot_cpu_ms:
        out["cpu_with_redis"] = y.cpu_ms / x.cpu_ms
    return out


def say_ceiling(a: list[Run], b: list[Run]) -> None:
    """What the machine's cores allow b against a, whatever b does.

    b cannot serve more messages a second than the cores' time over what each
    of its messages costs, summed over every process of the run (this one,
    the bot, its Redis): so b/a throughput is at most cores / (b's CPU per
    message x a's throughput). When a already keeps every core busy that is
    a's CPU per message over b's, and whatever b adds in any process, its
    Redis included, comes off it. The median of the rounds'."""
    cores = os.cpu_count() or 1
    bounds, busy = [], []
    for x, y in zip(a, b, strict=True):
        if x.all_cpu_ms and x.cpu_window_s and y.all_cpu_ms:
            bounds.append(cores * 1000 / (y.all_cpu_ms * x.throughput))
            busy.append(x.all_cpu_ms * x.messages / 1000 / x.cpu_window_s)
    if not bounds:
        return
    bound = statistics.median(bounds)
    print(f"b/a throughput can be at most {bound:.3f} here: {cores} cores over b's CPU per "
          f"message, every process counted, against a's throughput (a kept "
          f"{statistics.median(busy):.2f} of the {cores} busy)")  # fmt: skip


async def alternate(
    run_a: Callable[[], Awaitable[Run]],
    run_b: Callable[[], Awaitable[Run]],
    rounds: int = ROUNDS,
) -> tuple[list[Run], list[Run]]:
    """A warm-up run of each, then a, b, a, b, ... `rounds` times each."""
    print(f"{'run':<12}{'msgs/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'CPU ms':>9}", flush=True)
    for warm in (await run_a(), await run_b()):
        print(_row(warm) + "  (warm-up, not counted)", flush=True)
    a: list[Run] = []
    b: list[Run] = []
    for _ in range(rounds):
        a.append(await run_a())
        print(_row(a[-1]), flush=True)
        b.append(await run_b())
        said = ", ".join(f"{k} {v:.3f}" for k, v in _ratios(a[-1], b[-1]).items())
        print(f"{_row(b[-1])}  b/a {said}", flush=True)
    return a, b


def report(a: list[Run], b: list[Run], throughput_target: float = THROUGHPUT_TARGET) -> str:
    """The medians, the verdicts, and the machine-readable last line:
    `throughput_ratio=<b/a> p99_ratio=<b/a> p50_ratio=<b/a>[ cpu_ratio=<b/a>
    cpu_with_redis_ratio=<b/a>]`, each the median of the rounds' ratios. CPU
    ms is per message: `cpu` the bot's process alone (botbouncer's daemon
    against the bare bot), `cpu_with_redis` with b's Redis added."""
    print()
    for who, runs in (("a", a), ("b", b)):
        cpus = [r.cpu_ms for r in runs if r.cpu_ms is not None]
        cpu = f", CPU {statistics.median(cpus):.2f} ms/msg" if cpus else ""
        p50 = statistics.median(r.percentile(50) for r in runs) * 1000
        p99 = statistics.median(r.percentile(99) for r in runs) * 1000
        print(f"medians over {len(runs)} rounds, {who}: "
              f"{statistics.median(r.throughput for r in runs):.0f} msgs/s, "
              f"p50 {p50:.1f} ms, p99 {p99:.1f} ms{cpu}")  # fmt: skip
    rounds = [_ratios(x, y) for x, y in zip(a, b, strict=True)]
    medians = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]
               if all(k in r for r in rounds)}  # fmt: skip
    said = ", ".join(f"{k} {v:.3f}" for k, v in medians.items())
    print(f"medians of the {len(a)} rounds' b/a: {said}")
    t_ratio, p_ratio = medians["throughput"], medians["p99"]
    t_ok, p_ok = t_ratio >= throughput_target, p_ratio <= P99_TARGET
    print(f"throughput b/a {t_ratio:.3f} (target >= {throughput_target}): "
          f"{'PASS' if t_ok else 'MISS'}")  # fmt: skip
    print(f"p99 latency b/a {p_ratio:.3f} (target <= {P99_TARGET}): "
          f"{'PASS' if p_ok else 'MISS'}")  # fmt: skip
    last = f"throughput_ratio={t_ratio:.3f} p99_ratio={p_ratio:.3f} p50_ratio={medians['p50']:.3f}"
    if "cpu" in medians:
        c_ratio = medians["cpu"]
        print(f"CPU per message b/a, the bot's process {c_ratio:.3f} (target <= {CPU_TARGET}): "
              f"{'PASS' if c_ratio <= CPU_TARGET else 'MISS'}")  # fmt: skip
        last += f" cpu_ratio={c_ratio:.3f}"
    if "cpu_with_redis" in medians:
        print(f"CPU per message b/a, with b's Redis {medians['cpu_with_redis']:.3f}")
        last += f" cpu_with_redis_ratio={medians['cpu_with_redis']:.3f}"
    say_ceiling(a, b)
    return last


Measure = Callable[[str, bool, str], Coroutine[Any, Any, str]]


def on_each_store(measure: Measure) -> Callable[[str, bool], Coroutine[Any, Any, str]]:
    """`measure(url, private, store)` once per store in E2E_STORES; the last
    line is Redis's keys, then the memory store's, prefixed `memory_`."""

    async def measure_stores(url: str, private: bool) -> str:
        lines = []
        for store in STORES:
            print(f"== botbouncer's store: {store} ==", flush=True)
            last = await measure(url, private, store)
            print(flush=True)
            keys = last.split()
            lines.append(last if store == "redis" else " ".join(f"{store}_{k}" for k in keys))
        return " ".join(lines)

    return measure_stores


class Fake(Protocol):
    """What a contestant needs of its fake platform (tests/fakes/<platform>/)."""

    @property
    def api_base(self) -> str: ...

    async def start(self) -> object: ...

    async def close(self) -> None: ...


F = TypeVar("F", bound=Fake)
T = TypeVar("T")


class Unmeasurable(Exception):
    """A contestant could not be measured: the benchmark says why and exits 2."""


class Contestant(abc.ABC, Generic[F]):
    """One bot under test: its own fake platform in this process (`fake`,
    which reports each reply of the bot to `replies`), its process, its log
    in the invocation's temporary directory and, for b, its /healthz
    (`health`) and its Redis when its CPU counts (`redis`).

    A platform fills in `make_fake` (the fake), `connected` (the bot is
    there to be driven), `inject` (message i of a run) and, where it sees
    more than a process that exited or a silence, `problem` (looked at while
    waiting) and `after_run`; `forget` runs before each run."""

    READY_S = 60.0  # start-up, until connected() (and, for b, /healthz says ok)
    CONNECTING = "connected"  # what connected() waits for, in words
    STALL_S = 15.0  # no reply for this long while messages wait: the contestant is stuck
    REPLY_WITHIN = 60.0  # drive()'s limit for one message's reply
    TICK = 0.5  # how often the watch looks (a timed wait in this process, nothing more)

    def __init__(self, label: str, logs: Path) -> None:
        self.label = label
        self.log = logs / f"{label.split()[0]}.log"
        self.replies = Replies()
        self.fake: F = self.make_fake()
        self.proc: subprocess.Popen[bytes] | None = None
        self.health: str | None = None  # b: its /healthz
        self.redis: aioredis.Redis | None = None  # b: its store, whose CPU counts too
        self.runs = 0  # runs started; run r's keys carry r
        self.cpu: list[dict[str, float]] = []  # per run: CPU ms per message, by process

    @abc.abstractmethod
    def make_fake(self) -> F:
        """Its fake platform (not started yet), reporting to `replies`."""

    @abc.abstractmethod
    def connected(self) -> bool: ...

    @abc.abstractmethod
    async def inject(self, i: int) -> str:
        """Say message i of the current run; the key its reply is reported under."""

    def forget(self) -> None:
        """Before each run (nothing in flight): what the fake need not keep."""

    def problem(self) -> str | None:
        """What ends the benchmark at once, looked at while waiting."""
        if self.proc is not None and self.proc.poll() is not None:
            return f"the process exited with status {self.proc.returncode}"
        return None

    def after_run(self) -> str | None:
        """What fails a run that got all its replies."""
        return None

    def spawn(self, args: list[str], cwd: Path = ROOT) -> None:
        """Its process, from the repo root (or `cwd`), stdout and stderr in
        its log (never an unread pipe)."""
        with self.log.open("wb") as out:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(args, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)  # fmt: skip
        STARTED.append(self.proc)

    def spawn_daemon(
        self, platform: str, token: str, store_url: str, checkout: Path = ROOT, **settings: Any
    ) -> None:
        """botbouncer's daemon, `python -m gateway run -c <config>` (from
        this repo, or the one at `checkout`): one bot
        of `platform` (its `settings` added) at the fake, the echo backend,
        `respond_to: mentions`, the rate cap lifted (every message is
        answered) and the machine-pace backstop off (the simulated people
        answer at machine pace by design; it would rightly stop them); its
        default INFO log on. Its /healthz becomes `health`."""
        port = free_port()
        bot = {"name": "bench", "platform": platform, "token": token,
               "api_base": self.fake.api_base, **settings, "backend": {"type": "echo"},
               "respond_to": "mentions", "rate_cap": {"max_replies": MAX_REPLIES},
               "machine_pace": {"within_seconds": 0}}  # fmt: skip
        config = {"store": {"url": store_url}, "http": {"listen": f"127.0.0.1:{port}"},
                  "bots": [bot]}  # fmt: skip
        path = self.log.with_suffix(".yml")  # its own: two daemons may share the directory
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        self.health = f"http://127.0.0.1:{port}/healthz"
        # `-m gateway` from `checkout`: its own package comes first on sys.path
        self.spawn([sys.executable, "-m", "gateway", "run", "-c", str(path)], cwd=checkout)

    def tail(self, lines: int = 15) -> str:
        try:
            text = ANSI.sub("", self.log.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            return "    (no log)"
        return "\n".join("    " + line for line in text.splitlines()[-lines:]) or "    (empty log)"

    def log_problems(self) -> list[str]:
        """WARNING/ERROR lines in its log (decision lines are INFO)."""
        try:
            lines = self.log.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return []
        return [line for line in lines if " WARNING " in line or " ERROR " in line]

    def failed(self, what: str, problem: str) -> Unmeasurable:
        return Unmeasurable(f"{self.label}: {what}: {problem}; its log ends:\n{self.tail()}")

    async def ready(self) -> None:
        """Until connected() and, for b, /healthz says ok."""
        deadline = time.monotonic() + self.READY_S
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                if (problem := self.problem()) is not None:
                    raise self.failed("starting", problem)
                if self.connected() and (self.health is None or await self._healthy(http)):
                    return
                await asyncio.sleep(0.05)  # a process starting up: nothing to await on
        healthy = "" if self.health is None else " and healthy"
        raise self.failed("starting", f"not {self.CONNECTING}{healthy} within {self.READY_S:g} s")

    async def _healthy(self, http: aiohttp.ClientSession) -> bool:
        assert self.health is not None
        try:
            async with http.get(self.health) as resp:
                return resp.status == 200 and (await resp.json()).get("status") == "ok"
        except (aiohttp.ClientError, ValueError):
            return False

    async def watched(self, aw: Awaitable[T], what: str, quiet: float) -> T:
        """Await `aw`, giving up at once when `problem()` names one or no
        reply came for `quiet` seconds."""
        task = asyncio.ensure_future(aw)
        since = time.perf_counter()
        try:
            while True:
                done, _ = await asyncio.wait([task], timeout=self.TICK)
                if done:
                    return task.result()
                problem = self.problem()
                if problem is None and time.perf_counter() - max(since, self.replies.last) > quiet:
                    problem = self.silence(quiet)
                if problem is not None:
                    raise self.failed(what, problem)
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def silence(self, quiet: float) -> str:
        said = (f"no reply for {quiet:g} s ({self.replies.count} replies so far, "
                f"{self.replies.awaited()} awaited)")  # fmt: skip
        if unclaimed := self.replies.unclaimed():
            said += (f"; {len(unclaimed)} replies came under keys drive() never "
                     f"awaited, e.g. {unclaimed[0]!r}: does inject() return "
                     "the key the reply carries?")  # fmt: skip
        return said

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
        """One drive(), watched, with the CPU it cost per message: `cpu_ms`
        the bot's process and b's Redis, `bot_cpu_ms` the bot's process."""
        self.runs += 1
        self.forget()
        # This process is the platform: its collector runs between runs and
        # is off from before this run's CPU is read until after. Left on, a
        # full collection over the fake's records (hundreds of thousands of
        # objects by a run's end) held this process ~100 ms, the p99 of
        # whichever contestant was running; run just after the run, it put
        # 20-30 ms of this process's CPU, no message's, in the run's figure.
        gc.collect()
        gc.disable()
        try:
            before = await self.cpu_now()
            since = time.perf_counter()
            what = f"run {self.runs}"
            driven = drive(self.label, self.inject, self.replies, reply_within=self.REPLY_WITHIN)
            run = await self.watched(driven, what, self.STALL_S)
            if (problem := self.after_run()) is not None:
                raise self.failed(what, problem)
            after = await self.cpu_now()
            window = time.perf_counter() - since
        finally:
            gc.enable()
        per = {k: (after[k] - before[k]) * 1000 / run.messages for k in after}
        self.cpu.append(per)
        if "bot" not in per:
            return run
        own = sum(per[k] for k in ("bot", "redis") if k in per)
        every = sum(per.values())
        return replace(
            run, cpu_ms=own, bot_cpu_ms=per["bot"], all_cpu_ms=every, cpu_window_s=window
        )

    def cpu_line(self) -> str:
        """Median CPU ms per message over the counted runs (the first is the warm-up)."""
        counted = self.cpu[1:] or self.cpu
        parts = [f"{k} {statistics.median(c[k] for c in counted):.2f}" for k in counted[0]]
        return f"{self.label}: " + ", ".join(parts)

    async def stop(self) -> None:
        """Its process (SIGTERM, then SIGKILL), its fake, its Redis client."""
        if self.proc is not None:
            await asyncio.to_thread(stop, [self.proc], self.label, STOP_S)
        await self.fake.close()
        if self.redis is not None:
            await self.redis.aclose()


def say_baseline() -> None:
    if BASELINE is not None:
        print(f"a is not the bare bot: botbouncer's daemon from {BASELINE} (E2E_BASELINE; "
              "on Redis, its next database); b/a compares two versions, and the targets, "
              "set against the bare bot, say nothing here")  # fmt: skip


@contextlib.asynccontextmanager
async def started(*contestants: Contestant[Any]) -> AsyncIterator[None]:
    """Their fakes started; at the end, whatever happened, each stopped."""
    try:
        for c in contestants:
            await c.fake.start()
        yield
    finally:
        await asyncio.gather(*(c.stop() for c in contestants))


async def compare(
    a: Contestant[Any],
    b: Contestant[Any],
    shared: str = "",
    throughput_target: float = THROUGHPUT_TARGET,
) -> str:
    """alternate() and report() a against b, then each one's CPU ms per
    message by process (`shared` says what a shared Redis does to it); the
    last line."""
    runs_a, runs_b = await alternate(a.run, b.run)
    last = report(runs_a, runs_b, throughput_target)
    print(f"CPU ms per message, median over the rounds (fake+driver: this process{shared}):")
    for c in (a, b):
        print(f"  {c.cpu_line()}")
    return last


def bench_main(name: str, measure: Callable[[str, bool], Coroutine[Any, Any, str]]) -> int:
    """`main_on_redis(name, measure)`; a contestant that could not be
    measured: why, exit 2. Every contestant's process is stopped at the end."""
    try:
        return main_on_redis(name, measure)  # prints the last line
    except Unmeasurable as exc:
        print(f"{name}: could not measure: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # drive(): one message got no reply within reply_within
        if not isinstance(exc.code, str):
            raise
        print(f"{name}: could not measure: {exc.code}", file=sys.stderr)
        return 2
    finally:
        stop(STARTED, name, STOP_S)


C = TypeVar("C", bound=Contestant[Any])


class Bench(abc.ABC, Generic[C]):
    """A platform's bare bot (a) against botbouncer's daemon (b), each a `C`
    with its log in a temporary directory, measured on each store of
    E2E_STORES (`main`). On a shared Redis (REDIS_URL, no redis-server on
    PATH) the keys matching `keys` are deleted before and after, and b's
    Redis's CPU is not counted (it is other clients' too); on a private one
    it is. The platform says how its contestants are made and started,
    the lines above the table, and what to say of each at the end."""

    name: str  # the benchmark's, for its messages
    keys: str  # a SCAN pattern for its keys on a shared Redis

    @abc.abstractmethod
    def contestants(self, logs: Path) -> tuple[C, C]: ...

    @abc.abstractmethod
    def spawn_bare(self, a: C) -> None:
        """Start the bare bot's process, its fake running."""

    @abc.abstractmethod
    def spawn_bouncer(self, c: C, store_url: str, checkout: Path = ROOT) -> None:
        """Start botbouncer's daemon (`c.spawn_daemon`) from `checkout`, its fake running."""

    @abc.abstractmethod
    def header(self, on: str, store_kind: str) -> None:
        """Print what runs; `on` says botbouncer's store."""

    def notes(self, c: C) -> list[str]:
        """What to say of a contestant after the report, beside its log's
        WARNING/ERROR lines."""
        return []

    async def measure(self, redis_url: str, private: bool, store_kind: str = "redis") -> str:
        on_redis = store_kind == "redis"
        shared = on_redis and not private
        version = await redis_version(redis_url)
        if shared:
            await delete_matching(redis_url, self.keys)
            await delete_matching(baseline_store(redis_url), self.keys)
        try:
            with tempfile.TemporaryDirectory(prefix=f"bb-{self.name}-") as tmp:
                a, b = self.contestants(Path(tmp))
                store = redis_url if on_redis else "memory://"
                async with started(a, b):
                    if BASELINE is None:
                        self.spawn_bare(a)
                    else:
                        a.label = f"a {BASELINE.name}"
                        self.spawn_bouncer(a, baseline_store(store), BASELINE)
                    self.spawn_bouncer(b, store)
                    if on_redis and private:
                        b.redis = aioredis.from_url(redis_url)
                        if BASELINE is not None:
                            a.redis = aioredis.from_url(redis_url)
                    await asyncio.gather(a.ready(), b.ready())
                    where = "private redis-server" if private else redis_url
                    self.header(f"Redis {version} ({where})" if on_redis else "memory://",
                                store_kind)  # fmt: skip
                    say_baseline()
                    last = await compare(a, b, "; no redis: a shared server's" if shared else "")
                    for c in (a, b):
                        for line in self.notes(c):
                            print(line)
                        if odd := c.log_problems():
                            print(f"{c.label}: {len(odd)} WARNING/ERROR log lines, e.g. {odd[0]}")
                    return last
        finally:
            if shared:
                await delete_matching(redis_url, self.keys)
                await delete_matching(baseline_store(redis_url), self.keys)

    def main(self) -> int:
        return bench_main(self.name, on_each_store(self.measure))
