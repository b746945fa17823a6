"""Redis with this process's memory behind it (docs/operations.md: outages).

While Redis answers, every call goes to it. A call that fails, or takes
longer than `timeout` while no other call was answered either, marks the store
degraded and is answered from a local MemoryStore instead; from then on calls
go straight to memory, so no message waits on a dead Redis, while one
background task probes Redis with backoff (`retry_min` doubling up to
`retry_max`) and switches back as soon as it takes a write, which is what
decisions need (a Redis out of memory answers PING and refuses every write).
A store that fails again soon after it came back - Redis at the edge of its
memory, say - is probed from the delay it had reached, doubled, not from
`retry_min`: it moves at most once per probe interval, and that interval
grows while it keeps failing. (A slow call while
others are answered - this process too busy, not Redis gone - is answered
locally alone, and the store stays on Redis. On one Redis the script calls
share a connection answered in order, so there one cannot be late alone: a
timed-out call closes it and the calls behind it fail too.)

What local state can and cannot do, by design:
- Bot loops are still stopped: each replica counts the turns it sees (the
  messages delivered to it and the replies it sends), so a loop through it
  stops at the soft limit as it would on one process.
- People are answered: a human message is admitted as always.
- Redis's state is not copied into memory or back: on return the chat's
  counters are Redis's (those it had, or none if Redis lost its keys), and
  what was counted locally stays here for the next outage, expiring with its
  TTL. A rate slot held on Redis when it went away expires with its window.
- Pause and limit overrides live on Redis for every replica, so changing
  them while degraded is refused (StoreError) rather than kept here and lost
  on return; `reset` applies to the local state, which is what then decides.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from gateway.store.base import (
    DECISION_LOG_SIZE,
    AdmitRequest,
    AdmitResult,
    ChatStatus,
    Limits,
    Overrides,
    SentRequest,
    SentResult,
    StoreError,
)
from gateway.store.memory import MemoryStore
from gateway.store.redis import LateCall, RedisStore

log = logging.getLogger("botbouncer.store")

T = TypeVar("T")

# How long the check at start waits for Redis (a connect takes up to 2 s).
START_CHECK_SECONDS = 3.0

# Back on Redis for this many retry_max intervals, the store is trusted again:
# its next outage is probed from retry_min.
STABLE = 10


class FailoverStore:
    kind = "redis"

    def __init__(
        self,
        primary: RedisStore,
        fallback: MemoryStore,
        *,
        timeout: float = 0.5,
        retry_min: float = 0.1,
        retry_max: float = 1.0,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.primary = primary
        self.fallback = fallback
        self.timeout = timeout
        self.retry_min = retry_min
        self.retry_max = retry_max
        self.on_change = on_change
        self.error: str | None = None  # why Redis was left, while degraded
        self.since: float | None = None  # time.time() it was left
        self.outages = 0
        self.slow = 0  # calls answered locally only because they were slow
        self._answered = 0.0  # time.monotonic() of the last answer from Redis
        self._probe: asyncio.Task[None] | None = None
        self._delay = retry_min  # the next outage's first wait before a probe
        self._back_at: float | None = None  # time.monotonic() it last came back
        self._closed = False

    @property
    def degraded(self) -> bool:
        return self.error is not None

    async def run(
        self,
        on_redis: Callable[[], Awaitable[T]],
        local: Callable[[], Awaitable[T]],
        *,
        scripted: bool = False,
    ) -> T:
        """`on_redis()` within the timeout, or `local()` when Redis is away or
        fails now. Other parts on the same Redis (the agent guard) use this.

        `scripted`: on_redis() is one script call (RedisStore's admit,
        record_sent, release, call) or one command through the same pipeline
        (its cursors), which a RedisStore whose calls are
        `bounded` times out by itself: no timer of its own then, on the path
        every message takes."""
        if self.error is None:
            started = time.monotonic()
            try:
                if scripted and self.primary.bounded:
                    out = await on_redis()
                else:
                    async with asyncio.timeout(self.timeout):
                        out = await on_redis()
            except StoreError as exc:
                self._degrade(str(exc))
            except LateCall:
                # Redis answered: it refused a call that came after its
                # deadline, which this process or Redis held up. Decided
                # here; Redis stays, as for any call late alone.
                self.slow += 1
                log.warning("a redis call reached Redis after its deadline and was not "
                            "run; this one is decided locally")  # fmt: skip
            except TimeoutError:
                # A busy process (its event loop late) times out a healthy Redis
                # too: only when nothing at all came back from Redis meanwhile
                # is Redis the one not answering.
                if self._answered <= started:
                    self._degrade(f"redis did not answer within {self.timeout:g} s")
                else:
                    self.slow += 1
                    log.warning("a redis call took over %g s while others were answered; "
                                "this one is decided locally", self.timeout)  # fmt: skip
            else:
                self._answered = time.monotonic()
                return out
        return await local()

    def _degrade(self, why: str) -> None:
        if self.error is not None or self._closed:
            return
        self.error = why
        self.since = time.time()
        self.outages += 1
        log.error("store degraded: %s; answering from this process's memory until Redis "
                  "is back (retrying every %g-%g s)", why, self.retry_min,
                  self.retry_max)  # fmt: skip
        if self.on_change is not None:
            self.on_change(True)
        stable = self._back_at is None or time.monotonic() - self._back_at > STABLE * self.retry_max
        if stable:
            self._delay = self.retry_min
        self._probe = asyncio.ensure_future(self._reconnect())

    async def _reconnect(self) -> None:
        delay = self._delay
        while not self._closed:
            await asyncio.sleep(delay)  # backoff between probes: nothing to await instead
            try:
                async with asyncio.timeout(self.timeout):
                    await self.primary.drop_connections()  # the pooled ones died with it
                    # a write, as decisions need: a Redis that answers PING but
                    # refuses writes (out of memory) is not back
                    await self.primary.ping()
            except Exception as exc:  # whatever it is, Redis is not back yet
                log.debug("redis still unreachable: %s", exc)
                delay = min(delay * 2, self.retry_max)
                continue
            away = time.time() - (self.since or time.time())
            self.error = self.since = None
            self._back_at = time.monotonic()
            self._delay = min(delay * 2, self.retry_max)  # if it fails again soon
            log.warning("store back on Redis after %.1f s", away)
            if self.on_change is not None:
                self.on_change(False)
            return

    async def check_at_start(self) -> str | None:
        """Redis as the daemon starts: None when it takes the write check,
        else why not - and the store is then degraded, so the first message
        does not wait on it and the probe starts at once."""
        try:
            async with asyncio.timeout(max(self.timeout, START_CHECK_SECONDS)):
                await self.primary.ping()
        except (StoreError, TimeoutError) as exc:
            why = str(exc) or f"no answer within {max(self.timeout, START_CHECK_SECONDS):g} s"
            self._degrade(why)
            return why
        return None

    async def wait_recovered(self) -> None:
        """Return once Redis answers again (at once when not degraded)."""
        if self._probe is not None:
            await asyncio.shield(self._probe)

    # -- the Store protocol ----------------------------------------------

    async def admit(self, req: AdmitRequest) -> AdmitResult:
        return await self.run(
            lambda: self.primary.admit(req), lambda: self.fallback.admit(req), scripted=True
        )

    async def record_sent(self, req: SentRequest) -> SentResult:
        return await self.run(
            lambda: self.primary.record_sent(req),
            lambda: self.fallback.record_sent(req),
            scripted=True,
        )

    async def release(
        self, chat: str, bot: str, message_id: str, log: dict[str, Any] | None
    ) -> None:
        await self.run(
            lambda: self.primary.release(chat, bot, message_id, log),
            lambda: self.fallback.release(chat, bot, message_id, log),
            scripted=True,
        )

    async def status(
        self, chat: str, bot: str, limits: Limits, now_ms: int | None = None
    ) -> ChatStatus:
        return await self.run(
            lambda: self.primary.status(chat, bot, limits, now_ms),
            lambda: self.fallback.status(chat, bot, limits, now_ms),
        )

    async def issue_ticket(
        self, ticket: str, record: str, ttl_ms: int, now_ms: int | None = None
    ) -> None:
        await self.run(
            lambda: self.primary.issue_ticket(ticket, record, ttl_ms, now_ms),
            lambda: self.fallback.issue_ticket(ticket, record, ttl_ms, now_ms),
        )

    async def spend_ticket(
        self, ticket: str, how: str, now_ms: int | None = None
    ) -> tuple[str, str] | None:
        """On Redis, else here (a ticket issued during an outage lives here).
        A ticket this process does not know while Redis is away may be on
        Redis: that is a StoreError (try again), not "no such ticket"."""

        async def local() -> tuple[str, str] | None:
            found = await self.fallback.spend_ticket(ticket, how, now_ms)
            if found is None:
                raise StoreError(f"Redis is unreachable ({self.error or 'too slow'}) and the "
                                 "ticket may be filed there; try again")  # fmt: skip
            return found

        async def on_redis() -> tuple[str, str] | None:
            found = await self.primary.spend_ticket(ticket, how, now_ms)
            if found is None:  # issued here during an outage?
                found = await self.fallback.spend_ticket(ticket, how, now_ms)
            return found

        return await self.run(on_redis, local)

    async def reset(self, chat: str) -> None:
        await self.run(lambda: self.primary.reset(chat), lambda: self.fallback.reset(chat))

    def _refuse(self, what: str) -> Callable[[], Awaitable[None]]:
        async def refuse() -> None:
            raise StoreError(
                f"Redis is unreachable ({self.error or 'too slow'}); {what} is refused until "
                "it is back, because every replica reads it from Redis"
            )

        return refuse

    async def set_paused(self, chat: str, paused: bool) -> None:
        what = "pause" if paused else "resume"
        await self.run(lambda: self.primary.set_paused(chat, paused), self._refuse(what))

    async def set_overrides(self, chat: str, overrides: Overrides, merge: bool = False) -> None:
        await self.run(
            lambda: self.primary.set_overrides(chat, overrides, merge),
            self._refuse("changing limits"),
        )

    async def decisions(self, chat: str, limit: int = DECISION_LOG_SIZE) -> list[dict[str, Any]]:
        return await self.run(
            lambda: self.primary.decisions(chat, limit),
            lambda: self.fallback.decisions(chat, limit),
        )

    async def get_cursor(self, name: str) -> str | None:
        # one call through RedisStore's pipeline, as a script call
        return await self.run(
            lambda: self.primary.get_cursor(name),
            lambda: self.fallback.get_cursor(name),
            scripted=True,
        )

    async def set_cursor(self, name: str, value: str) -> None:
        # Saved in both: a position taken while Redis was away is not lost
        # when it comes back (an older one there is only repeats, deduplicated).
        await self.fallback.set_cursor(name, value)
        await self.run(lambda: self.primary.set_cursor(name, value), _nothing, scripted=True)

    async def claim(self, name: str, ttl_ms: int) -> bool:
        return await self.run(
            lambda: self.primary.claim(name, ttl_ms), lambda: self.fallback.claim(name, ttl_ms)
        )

    async def ping(self) -> None:
        """Raise StoreError while degraded, naming why and since when, or when
        Redis refuses the write check (for /healthz). Never a reason to leave
        Redis or come back: only decisions' own calls and the probe move the
        store, so a flood of health checks cannot (gateway/health.py)."""
        if self.error is not None:
            away = time.time() - (self.since or time.time())
            raise StoreError(f"Redis unreachable for {away:.1f} s ({self.error}); "
                             "answering from this process's memory")  # fmt: skip
        async with asyncio.timeout(self.timeout):
            await self.primary.ping()

    async def close(self) -> None:
        self._closed = True
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
        await self.primary.close()
        await self.fallback.close()


async def _nothing() -> None:
    return None
