"""A real Daemon in this test's process, on Redis under the test's key
prefix (deleted afterwards): what the adapter end-to-end tests run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import yaml

from gateway.config import parse_config
from gateway.daemon import Daemon
from gateway.store.redis import RedisStore
from tests.conftest import delete_prefix
from tests.redis_server import free_port


def build(redis_url: str, prefix: str, *bots: dict[str, Any], port: int | None = None) -> Daemon:
    config = {
        "store": {"url": redis_url},
        "http": {"listen": f"127.0.0.1:{port or free_port()}"},
        "bots": list(bots),
    }
    d = Daemon(parse_config(yaml.safe_dump(config)))
    redis_of(d).prefix = prefix  # this test's keys only
    return d


def redis_of(d: Daemon) -> RedisStore:
    """The daemon's Redis store (behind its failover wrapper, if any)."""
    store = getattr(d.store, "primary", d.store)
    assert isinstance(store, RedisStore)
    return store


async def forget(redis_url: str, prefix: str) -> None:
    """Delete every key under `prefix`."""
    store = RedisStore.from_url(redis_url, prefix=prefix)
    try:
        await delete_prefix(store, prefix)
    finally:
        await store.close()


@asynccontextmanager
async def running(
    redis_url: str, prefix: str, *bots: dict[str, Any], port: int | None = None
) -> AsyncIterator[Daemon]:
    """Started, yielded, stopped; the keys it wrote are deleted."""
    d = build(redis_url, prefix, *bots, port=port)
    await d.start()
    try:
        yield d
    finally:
        await d.stop()
        await forget(redis_url, prefix)
