"""Shared fixtures: a real Redis for every Store test.

REDIS_URL (default redis://127.0.0.1:6379/15) is used when it answers;
otherwise a private redis-server is started on a free port for the session.
Each test gets its own key prefix and its keys are deleted afterwards, so a
shared Redis is left as it was found.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).parent))

from redis_server import RedisServer, answers  # noqa: E402

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/15"


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
