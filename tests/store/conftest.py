"""The store contract harness: every test here runs on memory and on Redis.

`stores(n)` gives n handles on one shared truth: the same MemoryStore n times,
or n RedisStores with their own clients on one key prefix (as n replicas or n
bots would have). `Chat` drives one chat with an injected clock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.model import Reason
from gateway.store import (
    AdmitRequest,
    AdmitResult,
    Limits,
    MemoryStore,
    Observed,
    SentRequest,
    SentResult,
    Store,
)
from gateway.store.redis import RedisStore
from gateway.turns import Count

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


@dataclass
class Chat:
    """One chat seen through one store handle, with time in milliseconds."""

    store: Store
    chat: str = "test:c1"
    limits: Limits = field(default_factory=Limits)
    now_ms: int = 1_000_000
    _seq: int = 0

    def tick(self, seconds: float = 1.0) -> None:
        self.now_ms += round(seconds * 1000)

    def next_id(self) -> str:
        self._seq += 1
        return f"{self.chat}/m{self._seq}"

    async def admit(
        self,
        author: str,
        *,
        bot: str = "B",
        count: Count = Count.BOT,
        author_is_bot: bool | None = None,
        local: Reason | None = None,
        mid: str | None = None,
        text: str = "hello",
        context: int = 0,
        tick: float = 1.0,
    ) -> AdmitResult:
        """`bot` admits a message by `author`; own messages are flagged as the pipeline would."""
        self.tick(tick)
        if author == bot and local is None:
            local = Reason.OWN_MESSAGE
        obs = Observed(self.chat, mid or self.next_id(), author, author, count, text)
        return await self.store.admit(
            AdmitRequest(
                msg=obs,
                bot=bot,
                local_reason=local,
                author_is_bot=count is Count.BOT if author_is_bot is None else author_is_bot,
                limits=self.limits,
                context=context,
                now_ms=self.now_ms,
            )
        )

    async def human(self, author: str = "alice", text: str = "hi", **kw: Any) -> AdmitResult:
        count = Count.RESET if text.strip() else Count.NONE
        return await self.admit(author, count=count, author_is_bot=False, text=text, **kw)

    async def sent(self, bot: str, *, mid: str | None = None) -> SentResult:
        self.tick()
        obs = Observed(self.chat, mid or self.next_id(), bot, bot, Count.BOT, "reply")
        return await self.store.record_sent(
            SentRequest(msg=obs, bot=bot, limits=self.limits, now_ms=self.now_ms)
        )
