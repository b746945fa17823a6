"""What the Redis benchmarks share: a private redis-server when one can be
started (tests/redis_server.py), else the Redis at REDIS_URL, checked first;
the PASS/MISS word; the run-and-report `main` around a measurement; and
waiting for a daemon started as a process to answer /healthz."""

from __future__ import annotations

import asyncio
import importlib
import os
import shutil
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from redis.exceptions import RedisError

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/15"


class RedisUnavailable(Exception):
    """No Redis to measure against: the benchmark cannot say anything."""


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _redis_server() -> Any:
    """tests/redis_server.py (bench/ runs without the repo root on sys.path)."""
    sys.path.insert(0, str(ROOT / "tests"))
    return importlib.import_module("redis_server")


def redis_server_class() -> Any:
    return _redis_server().RedisServer


async def check_reachable(url: str) -> None:
    client = aioredis.from_url(url, decode_responses=True, socket_connect_timeout=2)
    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(
            f"no redis-server binary on PATH to start a private one, and no Redis answers at "
            f"{url} ({exc}). Install redis-server (e.g. apt-get install redis-server) or set "
            f"REDIS_URL to a Redis this benchmark may write to."
        ) from exc
    finally:
        await client.aclose()


async def redis_version(url: str) -> str:
    client = aioredis.from_url(url, decode_responses=True)
    try:
        return str((await client.info("server")).get("redis_version", "?"))
    finally:
        await client.aclose()


async def delete_matching(url: str, *patterns: str) -> None:
    """Delete the keys matching each SCAN pattern (a benchmark's own, on a
    shared REDIS_URL): tests/redis_server.py's, which the tests use too."""
    await _redis_server().delete_matching(url, *patterns)


def main_on_redis(name: str, measure: Callable[[str, bool], Coroutine[Any, Any, str]]) -> int:
    """Run `measure(url, private)` on a private redis-server (or REDIS_URL),
    then print the time taken and its last line (the ratios run_all.py shows)."""
    started = time.perf_counter()
    server = None
    if shutil.which("redis-server"):
        try:
            server = redis_server_class()().start()
        except RuntimeError as exc:
            print(f"{name}: cannot start a private redis-server: {exc}", file=sys.stderr)
            return 2
        url, private = server.url, True
    else:
        url, private = os.environ.get("REDIS_URL", DEFAULT_REDIS_URL), False
    try:
        if not private:
            asyncio.run(check_reachable(url))
        last = asyncio.run(measure(url, private))
    except RedisUnavailable as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    finally:
        if server is not None:
            server.stop()
    print(f"({time.perf_counter() - started:.1f} s)")
    print(last)
    return 0


async def wait_healthy(url: str, proc: Any, what: str = "the daemon") -> None:
    """Until `url`/healthz answers 200; RuntimeError if `proc` exits first or 30 s pass."""
    async with aiohttp.ClientSession() as http:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}")
            try:
                async with http.get(f"{url}/healthz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)  # a process starting up: nothing to await but its port
    raise RuntimeError(f"{what} did not answer /healthz within 30 s")
