"""Automatic pipelining of script calls (as ioredis' enableAutoPipelining).

Calls made in the same event-loop iteration - many messages in flight at once -
go to Redis as one non-transactional pipeline: one write, one read, one pool
checkout for the lot. Each call is still its own atomic script; only the trip
is shared. With one call in flight nothing waits for company, so latency at
low load is unchanged.

With a `timeout`, a call not answered within that many seconds of its batch
being flushed fails with TimeoutError, and the batch's trip is cancelled (its
connection, with answers still owed, is closed, not reused). One timer per
batch bounds every call in it and its write and reads: a client made for this
(`socket_timeout=None`) then has no timer per write, per read or per call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError

# Calls sent in one write: each call's arguments and the future its caller awaits.
Batch = list[tuple[tuple[Any, ...], "asyncio.Future[Any]"]]


class AutoPipeline:
    def __init__(
        self, client: aioredis.Redis, max_batch: int = 8, timeout: float | None = None
    ) -> None:
        self._client = client
        self.timeout = timeout
        # Small batches keep several in flight, so Redis works on one while this
        # process handles the answers to another (one big batch alternates).
        self._max_batch = max_batch
        self._queue: Batch = []
        self._sending: set[asyncio.Task[None]] = set()
        # Connections kept between trips: taken from the client's pool once and
        # reused, not checked out and back per trip (redis-py's pool locks,
        # re-checks the socket and reports the move each time). A connection
        # that failed goes back to the pool, disconnected.
        self._idle: list[Any] = []

    async def call(self, *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._queue.append((args, fut))
        if len(self._queue) >= self._max_batch:
            self._flush()
        elif len(self._queue) == 1:
            loop.call_soon(self._flush)
        return await fut

    async def script(self, script: AsyncScript, keys: Sequence[str], args: list[Any]) -> Any:
        """EVALSHA, loading the script once if Redis lost it (restart, SCRIPT FLUSH)."""
        try:
            return await self.call("EVALSHA", script.sha, len(keys), *keys, *args)
        except NoScriptError:
            async with asyncio.timeout(self.timeout):  # a rare trip, bounded like the rest
                await self._client.script_load(script.script)
            return await self.call("EVALSHA", script.sha, len(keys), *keys, *args)

    def _flush(self) -> None:
        if not self._queue:  # already sent when it filled up
            return
        batch, self._queue = self._queue, []
        task = asyncio.ensure_future(self._send(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)
        if self.timeout is not None:
            expiry = asyncio.get_running_loop().call_later(self.timeout, _expire, batch, task)
            task.add_done_callback(lambda _: expiry.cancel())

    async def _send(self, batch: Batch) -> None:
        """One write, then one reply per call, on one pooled connection.

        Not retried on a connection error: a call that did run would come back
        as a duplicate. The caller hears the error and decides.
        """
        pool = self._client.connection_pool
        try:
            conn = self._idle.pop() if self._idle else await pool.get_connection()  # type: ignore[no-untyped-call]
        except BaseException as exc:  # no connection at all (Redis down): every caller hears it
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc if isinstance(exc, Exception) else ConnectionError())
            if not isinstance(exc, Exception):
                raise
            return
        try:
            await conn.send_packed_command(b"".join(_pack(args) for args, _ in batch))
            for _, fut in batch:
                try:
                    result = await conn.read_response()
                except ResponseError as exc:  # a script error is that call's alone
                    result = exc
                if fut.done():  # the caller was cancelled; the call ran anyway
                    continue
                if isinstance(result, Exception):
                    fut.set_exception(result)
                else:
                    fut.set_result(result)
        except BaseException as exc:  # the connection failed: every caller still waiting hears it
            try:
                await conn.disconnect()
            finally:
                await pool.release(conn)
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc if isinstance(exc, Exception) else ConnectionError())
            if not isinstance(exc, Exception):
                raise
        else:
            self._idle.append(conn)


def _expire(batch: Batch, trip: asyncio.Task[None]) -> None:
    """The batch's time is up: whoever still waits hears TimeoutError, and
    the trip stops (closing its connection, answers still owed on it). A trip
    whose answers all came is left to give its connection back."""
    waiting = [(args, fut) for args, fut in batch if not fut.done()]
    for args, fut in waiting:
        fut.set_exception(TimeoutError(f"redis did not answer {args[0]} in time"))
    if waiting:
        trip.cancel()


def _pack(args: tuple[Any, ...]) -> bytes:
    """RESP for one command, packed in C by hiredis (redis-py packs in Python)."""
    packed: bytes = hiredis.pack_command(args)
    return packed
