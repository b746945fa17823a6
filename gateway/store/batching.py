"""Automatic pipelining of script calls (as ioredis' enableAutoPipelining).

Calls made in the same event-loop iteration - many messages in flight at once -
go to Redis in one write, and every write goes down one connection without
waiting for the answers to the writes before it: Redis answers in order, so
each answer resolves the oldest call still waiting. Each call is still its own
atomic script; only the trip is shared. With one call in flight nothing waits
for company, so latency at low load is unchanged.

The connection is opened, authenticated and selected by redis-py (its pool,
its URL options, TLS and all); then this module reads its answers itself, as
they arrive (`_Link`: hiredis parses them in C, each resolves its caller's
future in the same callback), without redis-py's per-reply coroutine and a
task per trip (bench/README.md, "Third pass", measures the difference).

With a `timeout` (else the client's `socket_timeout`, if any), a call not
answered within that many seconds of its batch being flushed fails with
TimeoutError, and the connection is closed: the answers Redis still owes on it
would otherwise reach later callers. Every call still waiting on it then
fails at once with ConnectionError, and the next batch connects afresh. A call
whose caller gave up (timed out or cancelled) before its batch could be
written - Redis not reachable yet - is not sent at all.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Sequence
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis._parsers import BaseParser
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, NoScriptError

# One call: its arguments and the future its caller awaits.
Call = tuple[tuple[Any, ...], "asyncio.Future[Any]"]


class _Link(asyncio.Protocol):
    """One connection redis-py opened, read by this protocol from then on:
    every answer goes to the oldest future still owed one.

    Deadlines: each write's calls must be answered by its deadline. Answers
    come in order, so one timer, set for the oldest write still owed answers,
    watches them all; when it finds that write late, its callers (and those of
    every write due by then) hear TimeoutError and the connection closes."""

    def __init__(self, pipeline: AutoPipeline, conn: Any) -> None:
        self.pipeline = pipeline
        self.conn = conn
        # redis-py's StreamWriter on the connected socket (_usable checked it)
        self.transport: asyncio.WriteTransport = conn._writer.transport
        # redis-py's protocol still hears of the connection's end, so its
        # disconnect() (which waits for that) returns at once.
        self._streams: asyncio.BaseProtocol = self.transport.get_protocol()
        reader_args: dict[str, Any] = {
            "protocolError": InvalidResponse,
            "replyError": BaseParser.parse_error,
        }
        if conn.encoder.decode_responses:
            reader_args["encoding"] = conn.encoder.encoding
            reader_args["errors"] = conn.encoder.encoding_errors
        self._reader = hiredis.Reader(**reader_args)
        self._loop = asyncio.get_running_loop()
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.written = 0  # calls written so far; those answered: written - len(waiting)
        # (calls written once that write was, its deadline), oldest first
        self._due: deque[tuple[int, float]] = deque()
        self._watch: asyncio.TimerHandle | None = None
        self.lost = False
        self.transport.set_protocol(self)

    def send(self, calls: list[Call], deadline: float | None) -> None:
        self.transport.write(b"".join([hiredis.pack_command(args) for args, _ in calls]))
        self.waiting.extend([fut for _, fut in calls])
        self.written += len(calls)
        if deadline is not None:
            due, answered = self._due, self.written - len(self.waiting)
            while due and due[0][0] <= answered:  # writes answered in full
                due.popleft()
            due.append((self.written, deadline))
            if self._watch is None:
                self._watch = self._loop.call_at(deadline, self._check)

    def _check(self) -> None:
        """The oldest write's deadline: late, or the next write's to watch."""
        self._watch = None
        due, answered = self._due, self.written - len(self.waiting)
        while due and due[0][0] <= answered:
            due.popleft()
        if not due or self.lost:
            return
        now = self._loop.time()
        if due[0][1] > now:
            self._watch = self._loop.call_at(due[0][1], self._check)
            return
        late = 0
        for written, deadline in due:
            if deadline > now:
                break
            late = written - answered
        for fut in itertools.islice(self.waiting, late):
            if not fut.done():
                fut.set_exception(TimeoutError("redis did not answer in time"))
        # the answers still owed must reach nobody: everyone else hears it closed
        self.abort(RedisConnectionError("redis: connection closed after a call timed out"))

    def data_received(self, data: bytes) -> None:
        reader, waiting = self._reader, self.waiting
        reader.feed(data)
        try:
            while (reply := reader.gets()) is not False:
                fut = waiting.popleft()
                if fut.done():  # its caller gave up; the call ran anyway
                    continue
                if isinstance(reply, Exception):
                    fut.set_exception(reply)
                else:
                    fut.set_result(reply)
        except (InvalidResponse, IndexError) as exc:  # not RESP, or an answer nobody asked
            self.abort(RedisConnectionError(f"redis: unreadable answer ({exc!r})"))

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        why = exc or "closed by the server"
        self._fail(RedisConnectionError(f"redis: connection lost ({why})"))
        self.lost = True
        self._streams.connection_lost(exc)
        self.pipeline._lost(self)

    def abort(self, exc: Exception) -> None:
        """Close at once; every caller still waiting hears `exc`."""
        if not self.lost:
            self._fail(exc)
            self.transport.abort()

    def _fail(self, exc: Exception) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        self._due.clear()
        while self.waiting:
            fut = self.waiting.popleft()
            if not fut.done():
                fut.set_exception(exc)


def _usable(conn: Any) -> bool:
    """Whether a pooled connection's socket is still open both ways. One whose
    end of stream redis-py's protocol already took is no longer read at all
    (asyncio stops reading a half-closed stream), so nothing sent on it would
    ever be answered."""
    reader, writer = conn._reader, conn._writer
    if reader is None or writer is None or reader.at_eof() or writer.transport.is_closing():
        return False
    is_reading = getattr(writer.transport, "is_reading", None)
    return is_reading is None or bool(is_reading())


class AutoPipeline:
    def __init__(
        self, client: aioredis.Redis, max_batch: int = 64, timeout: float | None = None
    ) -> None:
        self._client = client
        self.timeout = timeout
        self._deadline = (
            timeout if timeout is not None
            else client.connection_pool.connection_kwargs.get("socket_timeout")
        )  # fmt: skip
        self._max_batch = max_batch  # flushed at once when this many wait for the next write
        self._queue: list[Call] = []
        self._link: _Link | None = None
        # While there is no link: batches waiting for the connection being
        # opened, each with its deadline and the timer that enforces it.
        self._unsent: list[tuple[list[Call], float | None, asyncio.TimerHandle | None]] = []
        self._connecting: asyncio.Task[None] | None = None
        self._retiring: set[asyncio.Task[None]] = set()

    async def call(self, *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        queue = self._queue
        queue.append((args, fut))
        if len(queue) == 1:
            loop.call_soon(self._flush)
        elif len(queue) >= self._max_batch:
            self._flush()
        return await fut

    async def script(self, script: AsyncScript, keys: Sequence[str], args: list[Any]) -> Any:
        """EVALSHA, loading the script once if Redis lost it (restart, SCRIPT FLUSH)."""
        try:
            return await self.call("EVALSHA", script.sha, len(keys), *keys, *args)
        except NoScriptError:
            async with asyncio.timeout(self._deadline):  # a rare trip, bounded like the rest
                await self._client.script_load(script.script)
            return await self.call("EVALSHA", script.sha, len(keys), *keys, *args)

    def _flush(self) -> None:
        if not self._queue:  # already sent when it filled up
            return
        batch, self._queue = self._queue, []
        loop = asyncio.get_running_loop()
        deadline = None if self._deadline is None else loop.time() + self._deadline
        link = self._link
        if link is not None and not link.lost and not link.transport.is_closing():
            try:
                link.send(batch, deadline)
            except Exception as exc:  # a call Redis cannot be sent (an argument of no RESP type)
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
            return
        timer = None
        if deadline is not None:  # bounded while it waits for a connection too
            timer = loop.call_at(deadline, _expire, batch)
        self._unsent.append((batch, deadline, timer))
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())

    async def _connect(self) -> None:
        """Open a connection for the batches waiting, then write them (less
        the calls whose callers gave up meanwhile)."""
        pool = self._client.connection_pool
        try:
            conn = await pool.get_connection()  # type: ignore[no-untyped-call]
            try:
                if not _usable(conn):  # the server closed it while it sat in the pool
                    await conn.disconnect()
                    await conn.connect()
                link = _Link(self, conn)
            except BaseException:
                await self._retire(conn)
                raise
        except BaseException as exc:  # no connection (Redis down): every caller hears it
            self._connecting = None
            unsent, self._unsent = self._unsent, []
            error = exc if isinstance(exc, Exception) else RedisConnectionError(repr(exc))
            for batch, _, timer in unsent:
                if timer is not None:
                    timer.cancel()
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(error)
            if not isinstance(exc, Exception):
                raise
            return
        self._connecting = None
        self._link = link
        unsent, self._unsent = self._unsent, []
        for batch, deadline, timer in unsent:
            if timer is not None:
                timer.cancel()
            live = [call for call in batch if not call[1].done()]
            if live:
                try:
                    link.send(live, deadline)
                except Exception as exc:
                    for _, fut in live:
                        fut.set_exception(exc)

    def _lost(self, link: _Link) -> None:
        """The link's connection ended: redis-py's pool gets it back closed."""
        if self._link is link:
            self._link = None
        task = asyncio.ensure_future(self._retire(link.conn))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _retire(self, conn: Any) -> None:
        try:
            await conn.disconnect()
        finally:
            await self._client.connection_pool.release(conn)


def _expire(batch: list[Call]) -> None:
    """A batch still waiting for a connection at its deadline: its callers
    hear TimeoutError (and their calls will not be sent)."""
    for _, fut in batch:
        if not fut.done():
            fut.set_exception(TimeoutError("redis did not answer in time"))
