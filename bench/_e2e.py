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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

MESSAGES = int(os.environ.get("E2E_MESSAGES", "1500"))
WINDOW = int(os.environ.get("E2E_WINDOW", "32"))
ROUNDS = int(os.environ.get("E2E_ROUNDS", "5"))
THROUGHPUT_TARGET = 0.8  # b/a at least
P99_TARGET = 1.25  # b/a at most


@dataclass(frozen=True, slots=True)
class Run:
    label: str
    messages: int
    seconds: float
    latencies: list[float]  # seconds, one per message

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
    return (f"{r.label:<12}{r.throughput:>10.0f}{r.percentile(50) * 1000:>10.1f}"
            f"{r.percentile(99) * 1000:>10.1f}")  # fmt: skip


async def alternate(
    run_a: Callable[[], Awaitable[Run]],
    run_b: Callable[[], Awaitable[Run]],
    rounds: int = ROUNDS,
) -> tuple[list[Run], list[Run]]:
    """A warm-up run of each, then a, b, a, b, ... `rounds` times each."""
    print(f"{'run':<12}{'msgs/s':>10}{'p50 ms':>10}{'p99 ms':>10}", flush=True)
    for warm in (await run_a(), await run_b()):
        print(_row(warm) + "  (warm-up, not counted)", flush=True)
    a: list[Run] = []
    b: list[Run] = []
    for _ in range(rounds):
        a.append(await run_a())
        print(_row(a[-1]), flush=True)
        b.append(await run_b())
        t, p = b[-1].throughput / a[-1].throughput, b[-1].percentile(99) / a[-1].percentile(99)
        print(f"{_row(b[-1])}  b/a {t:.3f}, p99 {p:.3f}", flush=True)
    return a, b


def report(a: list[Run], b: list[Run], throughput_target: float = THROUGHPUT_TARGET) -> str:
    """The medians, the verdicts, and the machine-readable last line."""
    ta = statistics.median(r.throughput for r in a)
    tb = statistics.median(r.throughput for r in b)
    pa = statistics.median(r.percentile(99) for r in a)
    pb = statistics.median(r.percentile(99) for r in b)
    p50a = statistics.median(r.percentile(50) for r in a)
    p50b = statistics.median(r.percentile(50) for r in b)
    print()
    print(f"medians over {len(a)} rounds: a {ta:.0f} msgs/s, p50 {p50a * 1000:.1f} ms, "
          f"p99 {pa * 1000:.1f} ms; b {tb:.0f} msgs/s, p50 {p50b * 1000:.1f} ms, "
          f"p99 {pb * 1000:.1f} ms")  # fmt: skip
    t_ratio = statistics.median(y.throughput / x.throughput for x, y in zip(a, b, strict=True))
    p_ratio = statistics.median(
        y.percentile(99) / x.percentile(99) for x, y in zip(a, b, strict=True)
    )
    print(f"medians of the {len(a)} rounds' b/a: throughput {t_ratio:.3f}, p99 {p_ratio:.3f}")
    t_ok, p_ok = t_ratio >= throughput_target, p_ratio <= P99_TARGET
    print(f"throughput b/a {t_ratio:.3f} (target >= {throughput_target}): "
          f"{'PASS' if t_ok else 'MISS'}")  # fmt: skip
    print(f"p99 latency b/a {p_ratio:.3f} (target <= {P99_TARGET}): "
          f"{'PASS' if p_ok else 'MISS'}")  # fmt: skip
    return f"throughput_ratio={t_ratio:.3f} p99_ratio={p_ratio:.3f}"
