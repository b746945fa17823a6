"""Shared fixtures: a real Redis for every Store test.

`stores(n)` gives n handles on one shared truth: the same MemoryStore n times,
or n RedisStores with their own clients on one key prefix (as n replicas or n
bots would have); tests taking it run once per store kind.

REDIS_URL (default redis://127.0.0.1:6379/15) is used when it answers;
otherwise a private redis-server is started on a free port for the session.
Each test gets its own key prefix and its keys are deleted afterwards, so a
shared Redis is left as it was found.

`synapse` is a private Synapse homeserver (tests/synapse.py), started once per
run by the first test that asks for it and stopped at the end.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import urlparse

import pytest
import redis.asyncio as aioredis

from gateway.outbound import Outbound
from gateway.store import MemoryStore, Store
from gateway.store.redis import RedisStore
from tests.decisions import Decisions, capture
from tests.fakes.webhook import FakeWebhook
from tests.redis_server import RedisServer, answers
from tests.synapse import Synapse

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/15"

# Every server in the tests is on 127.0.0.1: a proxy in the environment of
# the machine running them (which the clients honour) must not be asked.
os.environ["NO_PROXY"] = os.environ["no_proxy"] = ",".join(
    filter(
        None, [os.environ.get("NO_PROXY") or os.environ.get("no_proxy"), "127.0.0.1", "localhost"]
    )
)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    url = os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)
    parsed = urlparse(url)
    if answers(parsed.hostname or "127.0.0.1", parsed.port or 6379):
        yield url
        return
    try:
        server = RedisServer().start()
    except RuntimeError as exc:
        pytest.exit(f"botbouncer tests need Redis: {exc}", returncode=3)
    try:
        yield server.url.rsplit("/", 1)[0] + "/15"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def synapse() -> Iterator[Synapse]:
    """One homeserver for the run. If it cannot start, each test using it
    errors with the reason and Synapse's log tail: never a skip."""
    server = Synapse().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def run(redis_url: str, key_prefix: str) -> Callable[..., Any]:
    """`async with run(bot, ...) as daemon:` a real daemon on this test's
    Redis prefix (tests/daemons.py `running`); a module may define its own."""
    from tests.daemons import running  # tests.daemons imports this module

    def start(*bots: dict[str, Any], port: int | None = None) -> Any:
        return running(redis_url, key_prefix, *bots, port=port)

    return start


@pytest.fixture
def key_prefix() -> str:
    return f"bbtest-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def redis_client(redis_url: str, key_prefix: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(redis_url, decode_responses=True)
    try:
        yield client
    finally:
        keys = [k async for k in client.scan_iter(match=f"{key_prefix}:*", count=1000)]
        if keys:
            await client.delete(*keys)
        await client.aclose()


StoreFactory = Callable[[int], Awaitable[list[Store]]]


@pytest.fixture(params=["memory", "redis"])
async def stores(request: pytest.FixtureRequest, key_prefix: str) -> AsyncIterator[StoreFactory]:
    opened: list[Store] = []
    memory = MemoryStore(context_size=8)

    async def make(n: int = 1) -> list[Store]:
        if request.param == "memory":
            return [memory] * n
        url = request.getfixturevalue("redis_url")  # a sync fixture: safe to pull here
        handles: list[Store] = [
            RedisStore.from_url(url, prefix=key_prefix, context_size=8) for _ in range(n)
        ]
        opened.extend(handles)
        return handles

    yield make
    if opened:
        await delete_prefix(opened[0], key_prefix)
    for store in opened:
        await store.close()


async def delete_prefix(store: Store, prefix: str) -> None:
    """Leave a shared Redis as it was found: drop this test's keys."""
    assert isinstance(store, RedisStore)
    keys = [k async for k in store.client.scan_iter(match=f"{prefix}:*", count=1000)]
    if keys:
        await store.client.delete(*keys)


@pytest.fixture
async def store(stores: StoreFactory) -> Store:
    return (await stores(1))[0]


@pytest.fixture
async def outbound() -> AsyncIterator[Outbound]:
    out = Outbound()
    yield out
    await out.close()


@pytest.fixture
async def hook() -> AsyncIterator[FakeWebhook]:
    async with FakeWebhook() as fake:
        yield fake


@pytest.fixture
async def decisions() -> AsyncIterator[Decisions]:
    """The decisions daemons in this test log, awaitable by message id and bot."""
    async with capture() as handler:
        yield handler
