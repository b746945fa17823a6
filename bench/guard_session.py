"""One agent-guard session that lives long: its stored value and its latency
must stay flat however many distinct names it is fed (review finding: 18,600
distinct kb questions made a 969 KB value, 27 ms a call inside Redis, the
median latency from 11 to 200 ms, and other sessions on that Redis slowed).

For each engine - Redis, and memory:// (the daemon's own process) - a
botbouncer daemon runs as its own process (`python -m gateway run`), and one
client here POSTs one call at a time to ONE session: BENCH_NAMES (default
20,000) distinct knowledge-base questions (/kb-query), as many distinct tool
names (/result) and task names (/retry), interleaved, so the first and the
last calls are the same mix. Every 20th call a control step goes to a fresh
session: the traffic of others, side by side with the hammered session.

Per engine: the median latency of the first and of the last 1,000 calls and
their ratio (all calls, and per kind: its first and last 1,000; the target:
<= 1.5), the control's ratio, the session's stored value after the first
1,000 calls and at the end (Redis: STRLEN, and MEMORY USAGE, of its key;
memory: its state as compact JSON, also what the engine keeps an idle session
as), Redis's own time per script call in the first and last 1,000 calls (INFO
commandstats; a private redis-server only; the control steps count too) and
the daemon's RSS.

BENCH_BASELINE=<directory of another checkout> runs the same against a daemon
from there first, side by side (e.g. `mkdir /tmp/before && git archive HEAD |
tar -x -C /tmp/before`; with unbounded sessions use BENCH_NAMES=3000 or so,
as each call there costs more than the last). Last line: `redis_last_first=<x>
memory_last_first=<x> redis_session_kb=<x> memory_session_kb=<x>`.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from _redis import ROOT, delete_matching, main_on_redis, verdict, wait_healthy

NAMES = int(os.environ.get("BENCH_NAMES", "20000"))
WINDOW = min(1000, max(1, NAMES // 4))  # calls (of one kind, or of all) at each end
KINDS = ("kb-query", "result", "retry")
CONTROL_EVERY = 20
TARGET = 1.5
SESSION = "hammer"
KEY = f"bb:guard:{{{SESSION}}}"  # RedisEngine.key with the default prefix


@dataclass
class Run:
    """One engine's run: latencies per kind of call, and what was measured."""

    engine: str
    lat: dict[str, list[float]]  # "all" and each kind, in call order
    control: list[tuple[int, float]]  # (index of the call it followed, ms)
    stored: tuple[int, int]  # bytes after the first WINDOW calls, at the end
    memory_usage: int | None
    redis_us: tuple[float, float] | None  # per script call: first, last WINDOW calls
    rss_mb: float

    def ends(self, kind: str) -> tuple[float, float]:
        lat = self.lat[kind]
        return statistics.median(lat[:WINDOW]), statistics.median(lat[-WINDOW:])

    def ratio(self, kind: str = "all") -> float:
        first, last = self.ends(kind)
        return last / first

    def control_ratio(self) -> float:
        total = len(self.lat["all"])
        first = [ms for i, ms in self.control if i < WINDOW]
        last = [ms for i, ms in self.control if i >= total - WINDOW]
        return statistics.median(last) / statistics.median(first)


def free_port() -> int:
    sys.path.insert(0, str(ROOT / "tests"))
    port: int = importlib.import_module("redis_server").free_port()
    return port


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def start(store_url: str, port: int, workdir: str, root: Path) -> subprocess.Popen[bytes]:
    config = Path(workdir) / f"session-{port}.yml"
    config.write_text(
        f"store: {{url: '{store_url}'}}\n"
        f"http: {{listen: '127.0.0.1:{port}'}}\n"
        "bots: [{name: bench, platform: http, backend: {type: echo}}]\n",
        encoding="utf-8",
    )
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", "run", "-c", str(config)],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def body(kind: str, i: int) -> dict[str, Any]:
    if kind == "kb-query":
        return {"question": f"what does clause {i} of contract {i * 7919} say?"}
    if kind == "result":
        return {"tool": f"tool_{i:06d}", "ok": True, "output": {"n": i}}
    return {"task": f"task_{i:06d}", "input": "again", "error": "timeout"}


async def call(http: aiohttp.ClientSession, url: str, data: dict[str, Any]) -> float:
    started = time.perf_counter()
    async with http.post(url, json=data) as resp:
        await resp.read()
        if resp.status >= 500:
            raise RuntimeError(f"{url} answered {resp.status}")
    return (time.perf_counter() - started) * 1000


async def stored_size(
    http: aiohttp.ClientSession, url: str, rclient: aioredis.Redis | None
) -> tuple[int, int | None]:
    if rclient is not None:
        return int(await rclient.strlen(KEY)), await rclient.memory_usage(KEY)
    async with http.get(f"{url}/v1/guard/{SESSION}") as resp:
        state = (await resp.json())["state"]
    return len(json.dumps(state, separators=(",", ":"), ensure_ascii=False).encode()), None


async def redis_us(rclient: aioredis.Redis) -> float:
    stats = await rclient.info("commandstats")
    return float(stats.get("cmdstat_evalsha", {}).get("usec_per_call", 0))


async def run_engine(engine: str, redis_url: str, private: bool, root: Path, workdir: str) -> Run:
    port = free_port()
    store_url = redis_url if engine == "redis" else "memory://"
    proc = start(store_url, port, workdir, root)
    url = f"http://127.0.0.1:{port}"
    rclient = aioredis.from_url(redis_url) if engine == "redis" else None
    timed = rclient if private else None  # commandstats of a shared Redis count others
    lat: dict[str, list[float]] = {k: [] for k in ("all", *KINDS)}
    control: list[tuple[int, float]] = []
    total = NAMES * len(KINDS)
    first_size, first_us = 0, 0.0
    try:
        if rclient is not None:
            await rclient.delete(KEY)
        async with aiohttp.ClientSession() as http:
            await wait_healthy(url, proc)
            for i in range(200):  # warm: connections, script cache
                await call(http, f"{url}/v1/guard/warm-{i}/step", {"tool": "t", "args": {}})
            if timed is not None:
                await timed.config_resetstat()
            for j in range(total):
                kind = KINDS[j % len(KINDS)]
                ms = await call(http, f"{url}/v1/guard/{SESSION}/{kind}", body(kind, j // 3))
                lat["all"].append(ms)
                lat[kind].append(ms)
                if j % CONTROL_EVERY == 0:
                    step = {"tool": "search", "args": {"q": j}}
                    control.append((j, await call(http, f"{url}/v1/guard/c{j}/step", step)))
                if j == WINDOW - 1:
                    first_size, _ = await stored_size(http, url, rclient)
                    first_us = await redis_us(timed) if timed is not None else 0.0
                if j == total - WINDOW - 1 and timed is not None:
                    await timed.config_resetstat()
                if j % max(1, total // 10) == 0:
                    print(f"  {engine}: {j:,} calls", flush=True)
            size, usage = await stored_size(http, url, rclient)
            us = (first_us, await redis_us(timed)) if timed is not None else None
            return Run(engine, lat, control, (first_size, size), usage, us, rss_mb(proc.pid))
    finally:
        proc.terminate()
        proc.wait(10)
        if rclient is not None:
            await rclient.aclose()
            await delete_matching(redis_url, KEY, "bb:guard:{c*}", "bb:guard:{warm-*}")


def report(title: str, runs: list[Run]) -> None:
    print(f"\n{title}: {NAMES:,} distinct names of each kind, interleaved, into one session;")
    print(f"median ms of the first and the last {WINDOW:,} calls (of all, or of one kind)")
    print(f"{'engine':<8}{'calls':<16}{'first':>8}{'last':>8}{'last/first':>12}")
    for run in runs:
        for kind in ("all", *KINDS):
            first, last = run.ends(kind)
            print(f"{run.engine:<8}{kind:<16}{first:>8.2f}{last:>8.2f}{last / first:>12.2f}")
        print(f"{run.engine:<8}{'control step':<16}{'':>16}{run.control_ratio():>12.2f}")
    print(
        f"\n{'engine':<8}{'stored B: first':>16}{'end':>10}{'MEMORY USAGE':>14}"
        f"{'Redis us/call: first':>22}{'last':>7}{'RSS MB':>8}"
    )
    for run in runs:
        usage = "-" if run.memory_usage is None else f"{run.memory_usage:,}"
        us = ("-", "-") if run.redis_us is None else tuple(f"{u:.0f}" for u in run.redis_us)
        print(
            f"{run.engine:<8}{run.stored[0]:>16,}{run.stored[1]:>10,}{usage:>14}"
            f"{us[0]:>22}{us[1]:>7}{run.rss_mb:>8.0f}"
        )


async def measure(url: str, private: bool) -> str:
    runs: dict[str, Run] = {}
    with tempfile.TemporaryDirectory() as workdir:
        baseline = os.environ.get("BENCH_BASELINE")
        if baseline:
            before = [
                await run_engine(e, url, private, Path(baseline), workdir)
                for e in ("redis", "memory")
            ]
            report(f"baseline ({baseline})", before)
        for engine in ("redis", "memory"):
            runs[engine] = await run_engine(engine, url, private, ROOT, workdir)
    report("this checkout", list(runs.values()))
    ratio = {e: r.ratio() for e, r in runs.items()}
    size = {e: r.stored[1] / 1024 for e, r in runs.items()}
    ok = all(x <= TARGET for x in ratio.values())
    print(
        f"\nlast/first: redis {ratio['redis']:.2f}, memory {ratio['memory']:.2f} "
        f"(target <= {TARGET:g}): {verdict(ok)}; stored value at the end: redis "
        f"{size['redis']:.1f} KB, memory {size['memory']:.1f} KB"
    )
    return (
        f"redis_last_first={ratio['redis']:.2f} memory_last_first={ratio['memory']:.2f} "
        f"redis_session_kb={size['redis']:.1f} memory_session_kb={size['memory']:.1f}"
    )


if __name__ == "__main__":
    sys.exit(main_on_redis("guard_session", measure))
