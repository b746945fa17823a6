"""What `GET /healthz` answers, at no cost to the store it reports on.

A health check is polled by load balancers, orchestrators and, in the worst
case, by anyone who can reach the port, hundreds at once. Each check that
went to Redis by itself took a connection of its own: 300 concurrent checks
emptied redis-py's pool, failed as "Too many connections" and took a healthy
store down. So one check runs at a time and every request that comes while it
runs shares its answer; an answer younger than `fresh` seconds is reused. A
failed check is reported, never acted on: only the store's own calls move it
to local memory and back (FailoverStore), so a health check is never a reason
to degrade.

The check is `Store.ping`, which for Redis is a write (a store that answers
PING but refuses writes, out of memory, cannot decide anything either). While
the store is answering from local memory the answer says so at once, without
touching Redis: the failover's own probe is already asking.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.redact import redact
from gateway.store import Store, StoreError

PING_TIMEOUT = 2.0
FRESH_SECONDS = 1.0


class Health:
    def __init__(
        self, store: Store, *, timeout: float = PING_TIMEOUT, fresh: float = FRESH_SECONDS
    ) -> None:
        self.store = store
        self.timeout = timeout
        self.fresh = fresh
        self.checks = 0  # how many times the store was asked (for tests and metrics)
        self._last: tuple[float, dict[str, Any]] | None = None
        self._running: asyncio.Future[dict[str, Any]] | None = None

    async def report(self) -> dict[str, Any]:
        """`{"status": "ok" | "degraded", "store": kind[, "error": why]}`."""
        if getattr(self.store, "degraded", False):
            # answering from local memory: the store's ping says why and since when
            return await self._check()
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and loop.time() - last[0] < self.fresh:
            return last[1]
        if self._running is None:
            self._running = asyncio.ensure_future(self._check_and_keep())
        # shielded: one caller going away does not cancel the others' answer
        return await asyncio.shield(self._running)

    async def _check_and_keep(self) -> dict[str, Any]:
        try:
            body = await self._check()
            self._last = (asyncio.get_running_loop().time(), body)
            return body
        finally:
            self._running = None

    async def _check(self) -> dict[str, Any]:
        body: dict[str, Any] = {"status": "ok", "store": self.store.kind}
        self.checks += 1
        try:
            async with asyncio.timeout(self.timeout):
                await self.store.ping()
        except StoreError as exc:
            body.update(status="degraded", error=redact(str(exc)))
        except TimeoutError:
            body.update(status="degraded", error=f"store check took over {self.timeout:g} s")
        return body
