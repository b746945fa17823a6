"""The agent guard's throughput: checks/s over HTTP, botbouncer on Redis
against what a user would otherwise write (bench/_sqlite_guard.py: aiohttp
over SQLite, one table, a query per check), side by side in one run.

Both servers run as their own processes (botbouncer: `python -m gateway run`
with a Redis store; the baseline: one aiohttp process), and one load generator
here drives each in turn with the same traffic: 32 concurrent agents, each
step a POST /v1/guard/<session>/step with a tool and arguments that mostly
differ (a few repeat, so some answers are warnings and blocks). Rounds
alternate which server goes first; the ratio is the median of per-round
ratios. Last line: `guard_vs_sqlite=<ratio>` (target >= 3).
"""

from __future__ import annotations

import asyncio
import importlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from _redis import wait_healthy

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORKERS = 32
SECONDS = float(os.environ.get("BENCH_SECONDS", "3"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
TARGET = 3.0
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/15"


def free_port() -> int:
    sys.path.insert(0, str(ROOT / "tests"))
    port: int = importlib.import_module("redis_server").free_port()
    return port


async def drive(url: str, tag: str) -> tuple[float, dict[str, int]]:
    """Checks/s for SECONDS of WORKERS agents stepping as fast as answers come."""
    stop = time.perf_counter() + SECONDS
    done = 0
    statuses: dict[str, int] = {}
    connector = aiohttp.TCPConnector(limit=WORKERS)

    async with aiohttp.ClientSession(connector=connector) as http:

        async def agent(n: int) -> None:
            nonlocal done
            i = 0
            while time.perf_counter() < stop:
                session = f"{tag}-{n}-{i // 40}"  # a fresh session every 40 steps
                tool = f"tool{i % 7}"
                args = {"q": f"query {i % 13}", "n": i % 3}
                async with http.post(f"{url}/v1/guard/{session}/step",
                                     json={"tool": tool, "args": args}) as resp:  # fmt: skip
                    await resp.read()
                    key = str(resp.status)
                    statuses[key] = statuses.get(key, 0) + 1
                done += 1
                i += 1

        started = time.perf_counter()
        await asyncio.gather(*(agent(n) for n in range(WORKERS)))
        return done / (time.perf_counter() - started), statuses


def start_botbouncer(redis_url: str, port: int, workdir: str) -> subprocess.Popen[bytes]:
    config = Path(workdir) / "bench.yml"
    config.write_text(
        f"store: {{url: '{redis_url}'}}\n"
        f"http: {{listen: '127.0.0.1:{port}'}}\n"
        "bots: [{name: bench, platform: http, backend: {type: echo}}]\n",
        encoding="utf-8",
    )
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", "run", "-c", str(config)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def start_baseline(port: int, workdir: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "_sqlite_guard.py"), str(port), f"{workdir}/guard.db"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def measure(bb_url: str, base_url: str, procs: list[subprocess.Popen[bytes]]) -> float:
    await wait_healthy(bb_url, procs[0], "botbouncer")
    await wait_healthy(base_url, procs[1], "the SQLite baseline")
    await drive(bb_url, "warm")  # warm both: connections, script cache, page cache
    await drive(base_url, "warm")
    ratios = []
    print(f"{'round':<7}{'botbouncer/s':>14}{'sqlite/s':>12}{'ratio':>8}   statuses (bb | sqlite)")
    for r in range(ROUNDS):
        order = [("bb", bb_url), ("base", base_url)]
        if r % 2:
            order.reverse()
        rates: dict[str, tuple[float, dict[str, int]]] = {}
        for name, url in order:
            rates[name] = await drive(url, f"r{r}{name}")
        ratio = rates["bb"][0] / rates["base"][0]
        ratios.append(ratio)
        print(f"{r + 1:<7}{rates['bb'][0]:>14.0f}{rates['base'][0]:>12.0f}{ratio:>8.2f}   "
              f"{rates['bb'][1]} | {rates['base'][1]}")  # fmt: skip
    return statistics.median(ratios)


def main() -> int:
    sys.path.insert(0, str(ROOT / "tests"))
    redis_server: Any = importlib.import_module("redis_server")
    server = None
    if shutil.which("redis-server"):
        server = redis_server.RedisServer().start()
        url = server.url
    else:
        url = os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)
        parts = urlsplit(url)
        if not redis_server.answers(parts.hostname or "127.0.0.1", parts.port or 6379):
            print(f"guard: no redis-server to start and none answers at {url}; install "
                  "redis-server (apt-get install redis-server) or set REDIS_URL",
                  file=sys.stderr)  # fmt: skip
            return 2
    bb_port, base_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as workdir:
        procs = [start_botbouncer(url, bb_port, workdir), start_baseline(base_port, workdir)]
        try:
            ratio = asyncio.run(
                measure(f"http://127.0.0.1:{bb_port}", f"http://127.0.0.1:{base_port}", procs)
            )
        except RuntimeError as exc:
            print(f"guard: {exc}", file=sys.stderr)
            return 2
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(10)
            if server is not None:
                server.stop()
    verdict = "PASS" if ratio >= TARGET else "MISS"
    print(f"median ratio {ratio:.2f} (target >= {TARGET:g}): {verdict}")
    print(f"guard_vs_sqlite={ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
