"""Where the gateway keeps its state: `memory://` or Redis (`redis://`,
`rediss://`, `redis+cluster://`)."""

from __future__ import annotations

from typing import Any

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


def open_store(url: str, **kwargs: Any) -> Store:
    """The store a `store.url` names (the URL was validated with the config)."""
    if url.startswith("memory://"):
        return MemoryStore(**kwargs)
    from gateway.store.redis import RedisStore  # only daemons on Redis pay for the import

    return RedisStore.from_url(url, **kwargs)
