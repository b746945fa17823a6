"""`botbouncer mcp-proxy -- CMD ARGS...`: an MCP server over stdio that starts
the real one as its child and relays every line between them.

MCP over stdio is one JSON-RPC message a line. Each line is relayed as the
bytes it came as unless gateway/mcpproxy/calls.py acts on it, so a server
behind the proxy answers byte for byte what it answers directly. The SDK's
own stdio transports are not used: they re-serialise every message, and the
client one keeps the child's exit status to itself, which the proxy exits
with.

The child's stderr is the proxy's. The proxy ends when the child exits (with
its exit status), or when its client closes stdin (the child's stdin is
closed then, as MCP's shutdown says, and the child given GRACE seconds
before SIGTERM, then as long again before SIGKILL), or on SIGTERM or SIGINT
(the child gets a SIGTERM for either).

Only a pipe or a socket is handed to the event loop; a stdin that is a
terminal, /dev/null or a regular file is read in a thread, and such a stdout
written synchronously.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import signal
import stat
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import BinaryIO

from gateway.mcpproxy.calls import ToolCalls, dump, dump_batch, is_batch, parse

log = logging.getLogger("botbouncer.mcp_proxy")

# The longest line (one message) relayed; a tool result may be large.
MAX_LINE = 128 * 1024 * 1024
GRACE = 2.0


class Output:
    """The client's side of stdout: whole lines, in order."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        if not _pipe_or_socket(self._stream):  # a terminal, /dev/null, a file: synchronously
            return
        loop = asyncio.get_running_loop()
        try:
            transport, protocol = await loop.connect_write_pipe(
                asyncio.streams.FlowControlMixin, self._stream
            )
        except (ValueError, OSError):  # a regular file: written synchronously
            return
        self._writer = asyncio.StreamWriter(transport, protocol, None, loop)

    async def write(self, line: bytes) -> None:
        if self._writer is None:
            self._stream.write(line)
            self._stream.flush()
            return
        self._writer.write(line)
        await self._writer.drain()


def _pipe_or_socket(stream: BinaryIO) -> bool:
    """Whether the event loop can watch `stream`: a pipe or a socket. epoll
    refuses /dev/null and regular files, and a terminal the loop made
    non-blocking would be non-blocking for every process sharing it."""
    try:
        mode = os.fstat(stream.fileno()).st_mode
    except (OSError, ValueError):  # no file descriptor at all
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


# The next line, or of a line longer than MAX_LINE the next piece: (bytes,
# whether they end a line); b"" at the end.
Read = Callable[[], Awaitable[tuple[bytes, bool]]]


async def _piece(reader: asyncio.StreamReader) -> tuple[bytes, bool]:
    try:
        return await reader.readuntil(b"\n"), True
    except asyncio.IncompleteReadError as exc:  # the end: what is left, if anything
        return exc.partial, True
    except asyncio.LimitOverrunError as exc:  # too long to hold: as much as is there
        return await reader.read(max(exc.consumed, 1)), False


def _judged(read: Read, whose: str) -> Read:
    """`read` telling what to do with each piece: (bytes, True) a whole line
    to read, (bytes, False) a piece of a line too long to read, to pass on
    unread (a WARNING says so once a line); b"" at the end."""
    passing = False  # inside a line too long to read

    async def judged() -> tuple[bytes, bool]:
        nonlocal passing
        piece, whole = await read()
        if not piece or not (passing or not whole):
            return piece, True
        if not passing:
            log.warning("mcp proxy: a message of the %s's over %d bytes is passed on unread",
                        whose, MAX_LINE)  # fmt: skip
        passing = not whole
        return piece, False

    return judged


async def _input(stream: BinaryIO) -> Read:
    """A reader of the client's side of stdin."""
    if not _pipe_or_socket(stream):  # a terminal, /dev/null, a file
        return _ThreadReader(stream).read
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_LINE)
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), stream)
    except (ValueError, OSError):
        return _ThreadReader(stream).read
    return lambda: _piece(reader)


class _ThreadReader:
    """Lines read in a daemon thread of their own, one line ahead at most: a
    read blocked on a terminal must not keep the proxy from ending once its
    server has (the default executor's threads are waited for), and the
    thread reads the file descriptor itself, since a daemon thread holding
    the lock of sys.stdin's buffer at exit is a fatal error."""

    def __init__(self, stream: BinaryIO) -> None:
        self._fd = stream.fileno()
        self._loop = asyncio.get_running_loop()
        self._asks: queue.SimpleQueue[asyncio.Future[tuple[bytes, bool]]] = queue.SimpleQueue()
        self._ended = False
        threading.Thread(target=self._read, name="mcp-proxy-stdin", daemon=True).start()

    async def read(self) -> tuple[bytes, bool]:
        if self._ended:
            return b"", True
        future: asyncio.Future[tuple[bytes, bool]] = self._loop.create_future()
        self._asks.put(future)
        line, whole = await future
        self._ended = not line
        return line, whole

    def _read(self) -> None:
        buffer = bytearray()
        end = False
        while True:
            future = self._asks.get()
            searched = 0  # the bytes before it hold no line end
            try:
                while (cut := buffer.find(b"\n", searched) + 1) == 0 and not end:
                    if len(buffer) > MAX_LINE:  # too long to hold: passed on as it is
                        break
                    searched = len(buffer)
                    chunk = os.read(self._fd, 1 << 16)
                    end = not chunk
                    buffer += chunk
            except OSError as exc:
                self._answer(future, None, exc)
                return
            whole = cut > 0 or end
            cut = cut or len(buffer)
            line = bytes(buffer[:cut])
            del buffer[:cut]
            self._answer(future, (line, whole), None)
            if not line:
                return

    def _answer(
        self,
        future: asyncio.Future[tuple[bytes, bool]],
        line: tuple[bytes, bool] | None,
        error: BaseException | None,
    ) -> None:
        def settle() -> None:
            if future.done():  # cancelled: the proxy is ending
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(line or (b"", True))

        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self._loop.call_soon_threadsafe(settle)


async def run(
    command: list[str],
    calls: ToolCalls,
    stdin: BinaryIO | None = None,
    stdout: BinaryIO | None = None,
) -> int:
    """Relay until the end; the child's exit status (128 + N for a signal N)."""
    try:
        child = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            limit=MAX_LINE,
        )  # fmt: skip
    except OSError as exc:
        raise FileNotFoundError(f"cannot start {command[0]!r}: {exc.strerror or exc}") from None
    assert child.stdin is not None and child.stdout is not None
    to_child, from_child = child.stdin, child.stdout
    out = Output(stdout or sys.stdout.buffer)
    await out.open()
    from_client = _judged(await _input(stdin or sys.stdin.buffer), "client")
    from_server = _judged(lambda: _piece(from_child), "server")

    async def client_side() -> None:
        while True:
            line, readable = await from_client()
            if not line:
                break
            if readable and is_batch(line):
                batch = await calls.from_client_batch(line)
                if batch.answers:
                    await out.write(dump_batch(batch.answers) + b"\n")
                if batch.forward is None:
                    continue
                line = batch.forward if batch.forward.endswith(b"\n") else batch.forward + b"\n"
            elif readable:  # (a piece of a line too long to read goes on unread)
                message = parse(line)
                answer = await calls.from_client(message) if message is not None else None
                if answer is not None:
                    await out.write(dump(answer) + b"\n")
                    continue
            to_child.write(line)
            try:
                await to_child.drain()
            except ConnectionError:
                return  # the child is gone; its end is told below
        to_child.close()  # the client is done: MCP's shutdown starts here

    async def server_side() -> bool:
        """Relays the child's lines; True when it stopped because the client left."""
        while True:
            line, readable = await from_server()
            if not line:
                break
            instead = await calls.from_server_raw(line) if readable else None
            try:
                await out.write(instead + b"\n" if instead is not None else line)
            except (ConnectionError, BrokenPipeError):
                # The client closed its end: nothing can reach it any more;
                # end as if it had closed stdin (the child gets its grace).
                to_child.close()
                return True
        return False

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    client = asyncio.create_task(client_side())
    server = asyncio.create_task(server_side())
    stopping = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait(
            {client, server, stopping}, return_when=asyncio.FIRST_COMPLETED
        )
        if stopping in done:
            _signal(child, signal.SIGTERM)
            await _await_exit(child, (signal.SIGKILL,))
        elif client in done:
            client.result()
            await _await_exit(child, (signal.SIGTERM, signal.SIGKILL))
        elif server.result():  # the client stopped reading: the same end as above
            await _await_exit(child, (signal.SIGTERM, signal.SIGKILL))
        with contextlib.suppress(ConnectionError):
            await server  # the child's last words reach the client
        code = await child.wait()
        await calls.settle()  # the last results reach the store before the proxy ends
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        for task in (client, server, stopping):
            task.cancel()
        if child.returncode is None:
            _signal(child, signal.SIGKILL)
            await child.wait()
    return 128 - code if code < 0 else code


async def _await_exit(
    child: asyncio.subprocess.Process, escalation: tuple[signal.Signals, ...]
) -> None:
    """GRACE seconds for the child to exit, then each signal in turn, GRACE apart."""
    for then in escalation:
        try:
            await asyncio.wait_for(child.wait(), GRACE)
            return
        except TimeoutError:
            log.warning("mcp proxy: the server did not exit within %gs; sending %s", GRACE,
                        then.name)  # fmt: skip
            _signal(child, then)
    await child.wait()


def _signal(child: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.send_signal(sig)
