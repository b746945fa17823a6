"""What one client may hold of the daemon's HTTP server, and how a bad
connection is answered and logged (docs/operations.md, docs/security.md).

aiohttp bounds the size of a request head and body but not the time a client
takes to send them: a connection that sends half a head, or a head and half
its body, and then nothing, was held for ever, with its buffers. It also
answers a malformed request with a text/plain 400 and logs it, and a client
that goes away mid-body, as an ERROR with a traceback.

The bounds live in the connection's protocol, a `RequestHandler` subclass
that aiohttp's own `Server` instantiates (`Runner` below wires it in), because
only the protocol sees where a request is: it parses every byte, so it knows
when a head is complete (a parsed message), when a body is (its payload at
EOF) and when a connection is idle (its reader waits for a message), and it
owns `handle_error` and `log_exception`, where aiohttp answers and logs what
goes wrong below the application. A middleware sees none of that; a proxy
protocol in front would re-parse HTTP. The cost on the hot path is a few
attribute reads per read; a timer is armed only while a head or a body is
incomplete at the end of a read (and once at a connection's start, cancelled
when its first head is in), none for a request that arrives in one read. The
idle keep-alive timeout is aiohttp's own (`keepalive_timeout`), which
reschedules one timer per connection lazily.

This couples to aiohttp 3.14's internals (RequestHandler's `_request_count`,
`_messages`, `_waiter`, `_close`, `_force_close`; Server's `_kwargs`,
`_loop`; AppRunner's `_make_server`); tests/test_http_conn.py causes every
fault for real, so an aiohttp upgrade that moves them fails there.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import resource
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler, RequestPayloadError
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse
from aiohttp.web_server import Server

from gateway.config import HttpConfig

log = logging.getLogger("botbouncer.http")

# While connections are refused, one WARNING says how many per this many seconds.
REFUSAL_LOG_INTERVAL = 60.0
# Open files kept besides the HTTP connections: the store's pool, outbound
# clients, adapters' gateways, logs.
FD_HEADROOM = 256
# Connections the kernel queues for accept(). aiohttp's 128 drops the
# handshakes of a burst while the loop is busy (3,000 connections at once
# lost a third); Linux caps it at net.core.somaxconn (4096 by default).
BACKLOG = 1024
# Memory is given back (malloc_trim) this long after this many connections
# closed since the most open at once (see _Census).
TRIM_AFTER = 256
TRIM_DELAY = 1.0
# A client's own bytes quoted back in an error message are cut to this.
MAX_QUOTED = 200


def _raw_response(status: int, reason: str, message: str) -> bytes:
    """A whole response, written straight to a transport that has no request
    object to answer with (a refused connection, a head never completed)."""
    body = json.dumps({"error": message}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Content-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


BUSY = _raw_response(503, "Service Unavailable", "too many open connections; try again later")


# A body's deadline grows with the length its head declares: a second more
# for every BODY_RATE bytes (a model request carrying images, tens of
# megabytes, from a slow uplink; a chunked body has the base deadline).
BODY_RATE = 100_000


class BodyTimeout(Exception):
    """Set on a request's payload when its body is late: the handler reading
    it is woken and the request answered 408. Not a BotbouncerError on
    purpose: the error middleware lets it through to handle_error below,
    which answers it and closes the connection (nothing more is read from it)."""


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim


_TRIM = _malloc_trim()


class _Census:
    """The connections one server holds, the refusals not yet logged, and
    when to give the memory of a burst of connections back.

    A connection holds its partial body (up to 64 KB) on the C heap. Once a
    burst of them has closed and Python has freed it all (see
    Connection._report for what kept it), glibc still returns heap memory
    to the system only from the top of the heap, and what Python allocated
    while the heap was full stays above it (the loop's and the server's
    tables, grown for the burst, never shrink): after 3,000 partial 60 KB
    bodies the RSS stayed 330 MB above the 59 MB it started at.
    malloc_trim(0) returns the free pages below the top too (back to ~90 MB;
    the rest is CPython's small-object arenas, kept while anything in them
    lives). It took 25 ms on that heap, so it runs once, TRIM_DELAY after
    TRIM_AFTER connections have closed since the most open at once: after a
    burst, never for steady traffic."""

    __slots__ = ("open", "peak", "refused", "telling", "trimming")

    def __init__(self) -> None:
        self.open = 0
        self.peak = 0  # the most open at once since the last trim
        self.refused = 0
        self.telling: asyncio.TimerHandle | None = None  # counting refusals for the log
        self.trimming = False

    def opened(self) -> None:
        self.open += 1
        if self.open > self.peak:
            self.peak = self.open

    def closed(self, loop: asyncio.AbstractEventLoop) -> None:
        self.open -= 1
        if self.peak - self.open >= TRIM_AFTER and not self.trimming and _TRIM is not None:
            self.trimming = True
            loop.call_later(TRIM_DELAY, self._trim)

    def _trim(self) -> None:
        self.trimming = False
        log.debug("%d connection(s) closed since %d were open: trimming the heap",
                  self.peak - self.open, self.peak)  # fmt: skip
        self.peak = self.open
        if _TRIM is not None:
            _TRIM(0)

    def refuse(
        self, transport: asyncio.Transport, limit: int, loop: asyncio.AbstractEventLoop
    ) -> None:
        transport.write(BUSY)
        transport.close()
        self.refused += 1
        if self.telling is None:  # the first of a spell: said at once, counted each minute
            log.warning(
                "http.max_connections (%d) are open: new connections are answered 503 and "
                "closed (how many, every %gs while it lasts)", limit, REFUSAL_LOG_INTERVAL,
            )  # fmt: skip
            self.refused = 0
            self.telling = loop.call_later(REFUSAL_LOG_INTERVAL, self._tell, limit, loop)

    def _tell(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        if not self.refused:
            self.telling = None
            return
        log.warning("refused %d new connection(s) in the last %gs: http.max_connections (%d) "
                    "are open", self.refused, REFUSAL_LOG_INTERVAL, limit)  # fmt: skip
        self.refused = 0
        self.telling = loop.call_later(REFUSAL_LOG_INTERVAL, self._tell, limit, loop)


class Connection(RequestHandler):
    """One client connection with deadlines on what it sends (see the module
    docstring for why they live here)."""

    __slots__ = (
        "_body",
        "_body_timeout",
        "_census",
        "_counted",
        "_deadline",
        "_partial",
        "_reported",
        "_settings",
        "_stall",
    )

    def __init__(self, manager: Server, *, settings: HttpConfig, census: _Census, **kw: Any):
        super().__init__(manager, **kw)
        self._settings = settings
        self._census = census
        self._counted = False  # admitted under max_connections: connection_lost counts it out
        # The one read deadline: the head's (then _body is None) or the body's.
        self._deadline: asyncio.TimerHandle | None = None
        self._body: StreamReader | None = None  # a body not complete at the end of a read
        self._body_timeout = 0.0  # its deadline, seconds after its head
        self._partial = False  # bytes of a head not yet complete have come
        self._stall: asyncio.TimerHandle | None = None  # the client reads none of our answer
        # The client's fault last logged: aiohttp may meet it twice (the handler
        # reading the body, then aiohttp discarding the rest), one line says it.
        self._reported: BaseException | None = None

    # -- connection life ----------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        census = self._census
        limit = self._settings.max_connections
        if census.open >= limit:
            assert isinstance(transport, asyncio.Transport)
            census.refuse(transport, limit, self._loop)
            return
        census.opened()
        self._counted = True
        super().connection_made(transport)
        # A new connection has the head deadline for its first request.
        self._deadline = self._loop.call_later(
            self._settings.header_timeout_seconds, self._head_late
        )

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._counted:  # refused: never started
            return
        self._counted = False
        self._census.closed(self._loop)
        self._disarm()
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        count = self._request_count
        super().data_received(data)
        if self._request_count != count:  # one or more heads (or a parse error) are in
            msg, payload = self._messages[-1]
            body = self._body
            if body is not None and not body.is_eof():
                # A new message while a body is incomplete is the parser's
                # error within that body: its reader gets it, and answers 400.
                err = getattr(msg, "exc", None)
                if isinstance(err, Exception):
                    body.set_exception(err)
            self._disarm()
            self._partial = False
            if not payload.is_eof():
                self._body = payload
                self._body_timeout = (
                    self._settings.body_timeout_seconds + _declared(msg) / BODY_RATE
                )
                self._deadline = self._loop.call_later(self._body_timeout, self._body_late)
        elif self._body is not None:
            if self._body.is_eof():
                self._disarm()
        elif data and not self._partial and not self._close and data.strip(b"\r\n"):
            # The first bytes of a later request (or of the first, whose
            # deadline runs from the connection's start); a blank line some
            # clients send after a body is no request.
            self._partial = True
            if self._deadline is None:
                self._deadline = self._loop.call_later(
                    self._settings.header_timeout_seconds, self._head_late
                )

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._body = None

    def _head_late(self) -> None:
        self._deadline = None
        transport = self.transport
        if transport is None or self._force_close or self._close:
            return
        waiter = self._waiter
        if waiter is None or waiter.done():
            # A request is being handled; the late head is pipelined behind
            # it and gets its time once the handler is done.
            self._deadline = self._loop.call_later(
                self._settings.header_timeout_seconds, self._head_late
            )
            return
        if self._partial:
            timeout = self._settings.header_timeout_seconds
            message = f"request head not complete within {timeout:g}s"
            log.debug("connection from %s: answered 408 and closed: %s", _peer(self), message)
            transport.write(_raw_response(408, "Request Timeout", message))
        # else a connection that never sent a byte: closed without a word, as
        # an idle one (a 408 could be read as the answer to a request sent
        # at that moment)
        self.force_close()

    def _body_late(self) -> None:
        self._deadline = None
        body, self._body = self._body, None
        if body is None or body.is_eof() or self.transport is None:
            return
        message = f"request body not complete within {round(self._body_timeout, 1):g}s"
        log.debug("connection from %s: %s; closing it", _peer(self), message)
        # Its reader (the handler, or aiohttp discarding an unread body) is
        # woken with this; the handler's request is answered 408 (in
        # handle_error), and nothing more is read from this connection.
        self._reported = exc = BodyTimeout(message)
        body.set_exception(exc)
        self.close()

    # A client that reads none of what is written to it would hold its
    # connection (and the answer buffered for it) for ever: the transport
    # asks to pause writing once its buffer is full, and if it is not drained
    # within the idle timeout, the connection is cut.

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall is None:
            self._stall = self._loop.call_later(
                self._settings.idle_timeout_seconds, self._send_late
            )

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def _send_late(self) -> None:
        self._stall = None
        transport = self.transport
        if transport is not None:
            timeout = self._settings.idle_timeout_seconds
            log.debug("connection from %s: cut: it read nothing for %gs", _peer(self), timeout)
            transport.abort()

    # -- errors -------------------------------------------------------------

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> StreamResponse:
        """The JSON answer to what went wrong below the application, and at
        most one short line for it; a traceback only for what is our bug."""
        if isinstance(exc, BodyTimeout):
            status, text = 408, str(exc)
            self._report(exc, f"answered 408: {text}")  # said when the deadline passed
        elif isinstance(exc, HttpProcessingError | RequestPayloadError):
            status, text = _bad_request(exc, self)
            self._report(exc, f"answered {status}: {text}")
        elif isinstance(exc, ConnectionError) and self.transport is None:
            self._report(exc, "the client went away before its request was answered")
            status, text = 400, "connection closed by the client"  # written nowhere
        elif status == 504:  # a handler's TimeoutError
            log.warning("%s %s timed out in its handler", request.method, request.path)
            text = "the request timed out; try again"
        else:
            log.error("error handling %s %s", request.method, request.path, exc_info=exc)
            status, text = 500, "internal error; see the daemon's log"
        if request.writer.output_size > 0:
            # As aiohttp: part of an answer is out, so no other can follow.
            raise ConnectionError("response already started, cannot send an error")
        shape = getattr(self._manager, "shape", None)
        resp = shape(request.path, status, text) if shape is not None else None
        if resp is None:
            resp = web.json_response({"error": text}, status=status)
        resp.force_close()
        return resp

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """aiohttp's ERROR-with-traceback for an exception it caught, kept for
        a bug and made one debug line for what a client caused (a body that
        broke off or came late while aiohttp discarded it unread)."""
        exc = kw.get("exc_info")
        client = (HttpProcessingError, RequestPayloadError, BodyTimeout)
        if isinstance(exc, client) or (isinstance(exc, ConnectionError) and self.transport is None):
            self._report(exc, f"closed: {_short(str(exc)) or type(exc).__name__}")
            return
        super().log_exception(*args, **kw)

    def _report(self, exc: BaseException, what: str) -> None:
        """One debug line per client fault, and its traceback dropped: the
        fault is the payload's exception, raised through frames that hold
        the request that holds the payload. That cycle kept each connection
        and its body (up to 64 KB) alive until a full collection, which in a
        daemon allocating little after a burst (GC_YOUNG, gc.freeze) may not
        come for hours."""
        cause: BaseException | None = exc
        while cause is not None:
            cause.__traceback__ = None
            cause = cause.__context__
        if exc is not self._reported:
            self._reported = exc
            log.debug("connection from %s: %s", _peer(self), what)


def _bad_request(exc: BaseException, conn: Connection) -> tuple[int, str]:
    """The status and message for a request the parser refused."""
    if isinstance(exc, LineTooLong):
        limit = max(conn.max_line_size, conn.max_field_size)
        return 431, f"request line or header field longer than {limit} bytes"
    text = exc.message if isinstance(exc, HttpProcessingError) else str(exc)
    if text == "Too many headers received":
        return 431, f"more than {conn.max_headers} header fields"
    return 400, f"malformed request: {_short(text)}"


def _short(text: str) -> str:
    """One line, not too long: aiohttp's messages span lines (a caret under
    the bad byte) and quote what the client sent."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_QUOTED else line[: MAX_QUOTED - 3] + "..."


def _declared(message: Any) -> int:
    """The body length a request's head declares (0: none, or not a number)."""
    length = getattr(message, "headers", {}).get("Content-Length", "")
    return int(length) if length.isdigit() and len(length) < 19 else 0


def _peer(conn: RequestHandler) -> str:
    peer = conn.peername
    if isinstance(peer, tuple):
        return str(peer[0])
    return str(peer or "?")


# The answer to an error of the HTTP layer on a route that speaks another
# error shape (the LLM proxy's: the API's own), from (path, status, message);
# None: the default {"error": message}.
ErrorShape = Callable[[str, int, str], web.Response | None]


class _Server(Server):
    """aiohttp's Server as the application runner built it, making a
    `Connection` per client instead of a plain `RequestHandler`."""

    def __init__(
        self, built: Server, settings: Callable[[], HttpConfig], shape: ErrorShape | None
    ) -> None:
        vars(self).update(vars(built))
        self._settings = settings
        self._census = _Census()
        self.shape = shape

    def __call__(self) -> RequestHandler:
        settings = self._settings()  # read per connection: a reload applies to the next
        kwargs = {**self._kwargs, "keepalive_timeout": settings.idle_timeout_seconds}
        return Connection(self, loop=self._loop, settings=settings, census=self._census, **kwargs)


class Runner(web.AppRunner):
    """`web.AppRunner` serving through `Connection`. `settings` is read for
    every new connection, so a reloaded `http` section applies from the
    next one."""

    __slots__ = ("_settings", "_shape")

    def __init__(
        self,
        app: web.Application,
        settings: Callable[[], HttpConfig],
        shape: ErrorShape | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, **kwargs)
        self._settings = settings
        self._shape = shape

    async def _make_server(self) -> Server:
        return _Server(await super()._make_server(), self._settings, self._shape)


def fit_open_files(max_connections: int) -> None:
    """Raise this process's soft limit on open files to hold max_connections
    and what else the daemon opens: past the limit accept() fails before the
    cap is reached, and asyncio logs each failure as an ERROR and stops
    accepting for a second. Only the soft limit moves, within the hard one."""
    want = max_connections + FD_HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    new = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if new > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        except (ValueError, OSError):
            new = soft
    if new < want:
        log.warning(
            "open-file limit %d is below http.max_connections (%d) + %d for the rest: raise "
            "it (ulimit -n, systemd LimitNOFILE) or lower http.max_connections",
            new, max_connections, FD_HEADROOM,
        )  # fmt: skip
