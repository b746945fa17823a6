"""What bench/e2e_discord.py and bench/e2e_telegram.py share: the closed-loop
load driver, the statistics, the alternation of the two contestants and the
report whose last line is `throughput_ratio=<b/a> p99_ratio=<b/a>`.

A contestant is measured by `drive()`: MESSAGES messages are injected into
the fake platform, at most WINDOW awaiting their reply at any time (a
closed loop, so latency measures the bot, not a queue the benchmark built).
A message's latency runs from just before it is injected to the moment the
fake platform receives the bot's reply to it; throughput is messages over
the wall time from the first injection to the last reply.

The two contestants run alternately, ROUNDS times each after one warm-up
run each that is not counted, so a machine that slows down or speeds up
during the invocation touches both alike. A round is an a run and the b run
right after it; the ratios are the medians of the rounds' b/a, as in the
other benchmarks: on a shared machine a slow spell spoils the round it falls
in, not the comparison.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MESSAGES = int(os.environ.get("E2E_MESSAGES", "1500"))
WINDOW = int(os.environ.get("E2E_WINDOW", "32"))
ROUNDS = int(os.environ.get("E2E_ROUNDS", "5"))
# The stores botbouncer runs on, one measurement each (redis first)
STORES = [s for s in os.environ.get("E2E_STORES", "redis,memory").split(",") if s]
# In front of each platform's quickstart bot, on Redis (b/a, medians of the rounds):
THROUGHPUT_TARGET = 0.9  # at least
P99_TARGET = 1.1  # at most
CPU_TARGET = 1.05  # at most: the bot's process, botbouncer's daemon against the bare bot


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

    def expect(self, key: str) -> asyncio.Future[float]:
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        at = self._early.pop(key, None)
        if at is not None:
            fut.set_result(at)
        else:
            self._waiting[key] = fut
        return fut

    def arrived(self, key: str) -> None:
        fut = self._waiting.pop(key, None)
        if fut is None:
            self._early[key] = time.perf_counter()
        elif not fut.done():
            fut.set_result(time.perf_counter())

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

    # This process is the platform: its collector stays off while a run is
    # measured and collects between runs. Left on, a full collection over the
    # fake's records of the run (hundreds of thousands of objects by its end)
    # held this process ~100 ms, the p99 of whichever contestant was running.
    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(messages)))
        return Run(label, messages, time.perf_counter() - started, latencies)
    finally:
        gc.enable()


def process_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) a child has used, from /proc (Linux); None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
