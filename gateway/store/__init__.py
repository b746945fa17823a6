"""Where the gateway keeps its state: `memory://` or Redis (`redis://`,
`rediss://`, `redis+cluster://`)."""

from __future__ import annotations

from typing import Any

from gateway import defaults
from gateway.store.base import (
    AdmitRequest,
    AdmitResult,
    ChatStatus,
    ContextEntry,
    Limits,
    Observed,
    Overrides,
    SentRequest,
    SentResult,
    Store,
    StoreError,
)
from gateway.store.memory import MemoryStore

__all__ = [
    "AdmitRequest",
    "AdmitResult",
    "ChatStatus",
    "ContextEntry",
    "Limits",
    "MemoryStore",
    "Observed",
    "Overrides",
    "SentRequest",
    "SentResult",
    "Store",
    "StoreError",
    "open_store",
]


def open_store(
    url: str, *, timeout: float = 0.5, max_chats: int = defaults.MAX_CHATS, **kwargs: Any
) -> Store:
    """The store a `store.url` names (the URL was validated with the config).

    Redis comes with this process's memory behind it: a call that fails or
    takes longer than `timeout` seconds is answered locally (FailoverStore).
    `max_chats` bounds that memory, whichever it is (Redis has its maxmemory).
    """
    if url.startswith("memory://"):
        return MemoryStore(max_chats=max_chats, **kwargs)
    # only daemons on Redis pay for these imports
    from gateway.store.failover import FailoverStore
    from gateway.store.redis import RedisStore

    primary = RedisStore.from_url(url, call_timeout=timeout, **kwargs)
    return FailoverStore(primary, MemoryStore(max_chats=max_chats, **kwargs), timeout=timeout)
