"""`botbouncer mcp-proxy --upstream URL`: streamable HTTP in front of a
remote MCP server (docs/mcp-proxy.md).

The proxy serves the upstream URL's path on its own listener, so a client
changes only host and port. Every request is forwarded; a POST holding one
`tools/call` is a guard step first (a block is answered here, as JSON), and
the answers to tool calls - a JSON body, or a message of an SSE stream - are
guard results. SSE streams pass event by event, each as the bytes it came
as unless a warning is added to it. A guard session is one MCP session (the
`Mcp-Session-Id` the server gave), unless --session names one for all.

A call the server refuses (an HTTP error), cannot take (unreachable) or
whose answer it breaks off is a failed result, as a JSON-RPC error is: an
agent repeating it meets the failure rules, not "nothing new".
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from urllib.parse import urlsplit

import aiohttp
import mcp_types as mcp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from gateway.api.common import body_within
from gateway.guard.normalize import loads
from gateway.llmproxy.wire import HOP_BY_HOP, LINE_END, SseReader, digest
from gateway.mcpproxy.calls import ToolCalls, compact, dump, dump_batch, is_batch, parse
from gateway.mcpproxy.stdio import MAX_LINE
from gateway.outbound import client_session

log = logging.getLogger("botbouncer.mcp_proxy")

MAX_BODY = 32 * 1024 * 1024
MAX_SESSIONS = 10_000
MAX_REDIRECTS = 3
# How often a stream's relay looks whether its client is still there: aiohttp
# says so only when the relay next writes to it, and a stream may be quiet
# for hours.
GONE_CHECK = 0.25
SESSION_HEADER = "Mcp-Session-Id"
_HOP = HOP_BY_HOP


class HttpProxy:
    def __init__(self, upstream: str, calls_for: Callable[[str], ToolCalls],
                 session: str | None = None) -> None:  # fmt: skip
        self.upstream = upstream
        self.path = urlsplit(upstream).path or "/"
        self._calls_for = calls_for
        self._session = session
        self._calls: OrderedDict[str, ToolCalls] = OrderedDict()
        self._exchanges = itertools.count()
        self._releasing: set[asyncio.Future[None]] = set()
        self._client: aiohttp.ClientSession | None = None
        self.app = web.Application()
        self.app.router.add_route("*", self.path, self._handle)
        self.app.on_cleanup.append(self._close)

    async def _close(self, app: web.Application) -> None:
        for calls in list(self._calls.values()):  # the last results reach the store
            await calls.settle()
        if self._client is not None:
            await self._client.close()

    def name_of(self, request: web.Request) -> str:
        """The guard session of a request: --session, else its MCP session's."""
        if self._session is not None:
            return self._session
        return "mcp-" + digest(self.upstream, request.headers.get(SESSION_HEADER, ""))[:32]

    def calls(self, request: web.Request) -> ToolCalls:
        """The tool calls of this request's MCP session (one set when there is none)."""
        name = self.name_of(request)
        calls = self._calls.get(name)
        if calls is None:
            calls = self._calls[name] = self._calls_for(name)
            if len(self._calls) > MAX_SESSIONS:
                self._calls.popitem(last=False)
        else:
            self._calls.move_to_end(name)
        return calls

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await body_within(request, MAX_BODY)
        if body is None:
            return web.json_response({"error": f"body over {MAX_BODY} bytes"}, status=413)
        calls = self.calls(request)
        # Whose ids: the MCP session's; without one (a stateless server) this
        # exchange's, whose answers come in its own response.
        scope = request.headers.get(SESSION_HEADER) or f"exchange-{next(self._exchanges)}"
        ended = SESSION_HEADER not in request.headers
        # The server took none of it (an HTTP error, or it was never reached;
        # its calls are recorded as failures by then), or the exchange was cut short.
        refused = True
        try:
            response = await self._exchange(request, body, calls, scope)
            refused = response.status >= 400
            # A session the client ended (or the server no longer knows):
            # its calls, and its guard session's calls held here, go.
            ended = ended or (
                request.method == "DELETE" and response.status in (200, 202, 204, 404)
            )
            return response
        finally:
            if refused and request.method == "POST" and not ended:
                calls.unanswered(body, scope)  # their answers will not come
            if ended:
                calls.forget(scope)
                if self._session is None and SESSION_HEADER in request.headers:
                    self._release(self.name_of(request), calls)

    def _release(self, name: str, calls: ToolCalls) -> None:
        """Forgets a guard session's calls once its records are made."""

        async def release() -> None:
            await calls.settle()
            if self._calls.get(name) is calls:
                del self._calls[name]

        task = asyncio.ensure_future(release())
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _exchange(
        self, request: web.Request, body: bytes, calls: ToolCalls, scope: str
    ) -> web.StreamResponse:
        extra: list[mcp.JSONRPCMessage] = []  # answers given here, for the client
        if request.method == "POST" and is_batch(body):
            batch = await calls.from_client_batch(body, scope)
            if batch.forward is None:  # every message in it answered here
                return web.Response(body=dump_batch(batch.answers), content_type="application/json")
            body, extra = batch.forward, batch.answers
        elif request.method == "POST":
            message = parse(body)
            answer = await calls.from_client(message, scope) if message is not None else None
            if answer is not None:
                return web.Response(body=dump(answer), content_type="application/json")
        if self._client is None:
            self._client = client_session(
                # A connection per open stream, as many as the clients hold: a
                # bound made a call wait for a free one and fail as unreachable.
                connector=aiohttp.TCPConnector(limit=0),
                # No cookies of the proxy's own: each client's go as it sent them.
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=True,
            )
        # Every value of a repeated header (Cookie, X-Forwarded-For).
        headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in _HOP)
        headers["Accept-Encoding"] = "identity"
        query = request.rel_url.raw_query_string
        url = URL(self.upstream)
        try:
            for _ in range(MAX_REDIRECTS + 1):
                upstream = await self._client.request(
                    request.method, _with_query(url, query), data=body, headers=headers,
                    allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=None, connect=10, sock_read=None),
                )  # fmt: skip
                moved = _same_origin_redirect(url, upstream)
                if moved is None:
                    break
                # Followed here, body and all: passed on, it would point the
                # client at the server itself, past the guard.
                upstream.release()
                log.warning("mcp proxy: %s redirects to %s; give that as --upstream", url, moved)
                url = moved
        except aiohttp.ClientError as exc:
            log.warning("mcp proxy: upstream %s unreachable: %s", self.upstream, exc)
            text = f"the MCP server {self.upstream} is unreachable"
            return await _failed(body, text, calls, scope, extra)
        try:
            return await self._relay(request, upstream, body, calls, scope, extra)
        finally:
            upstream.release()

    async def _relay(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        sent: bytes,
        calls: ToolCalls,
        scope: str,
        extra: list[mcp.JSONRPCMessage],
    ) -> web.StreamResponse:
        """The server's answer to `sent`, each message in it as ToolCalls has
        it, with `extra` (the answers to the part of a batch given here) added."""
        headers = CIMultiDict((k, v) for k, v in upstream.headers.items() if k.lower() not in _HOP)
        sse = upstream.content_type == "text/event-stream"
        refused = upstream.status >= 400 and request.method == "POST"
        if upstream.content_type == "application/json":  # one message or a batch: read whole
            try:
                raw = await upstream.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.warning("mcp proxy: the server broke off its answer: %s", type(exc).__name__)
                text = f"the MCP server {self.upstream} broke off its answer"
                return await _failed(sent, text, calls, scope, extra)
            body = await _replaced(raw, calls, scope)
            if refused:  # the calls the body did not answer (its answers are taken first)
                await _refused(sent, upstream, calls, scope)
            return web.Response(
                status=upstream.status, reason=upstream.reason, body=_merged(body, extra),
                headers=headers,
            )  # fmt: skip
        if refused:  # before the client has its answer, and can call again
            await _refused(sent, upstream, calls, scope)
        if extra and not sse:  # nothing of the server's to add them to (a 202)
            return web.Response(body=dump_batch(extra), content_type="application/json")
        out = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
        await out.prepare(request)
        stream = asyncio.ensure_future(_stream(request, out, upstream, sse, calls, scope, extra))
        gone = asyncio.ensure_future(_client_gone(request))
        try:
            await asyncio.wait((stream, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not stream.done():
                # The client went away (or the proxy is stopping): the server's
                # stream is closed now, not when its next event finds nobody to
                # take it. A server keeps one GET stream a session, and refused
                # the client's reconnect while this one was open.
                stream.cancel()
                upstream.close()
        if stream.done():
            stream.result()  # what went wrong other than the client or the server going
        return out


async def _client_gone(request: web.Request) -> None:
    """Returns once the client's connection is lost."""
    # Polled: aiohttp has no event for it that a handler can wait on.
    while request.transport is not None and not request.transport.is_closing():  # noqa: ASYNC110
        await asyncio.sleep(GONE_CHECK)


async def _failed(
    body: bytes, text: str, calls: ToolCalls, scope: str, extra: list[mcp.JSONRPCMessage]
) -> web.Response:
    """A 502 the proxy answers when the server gave no answer: a JSON-RPC
    error saying `text` for each request in `body`, by its id, with the
    answers given here (of a batch). The client's answer to its calls, so a
    guard result like any error's: an agent retrying a server that is down
    is a failure streak."""
    failed = _jsonrpc_errors(body, text)
    await calls.from_server_raw(failed, scope)
    return web.Response(status=502, body=_merged(failed, extra), content_type="application/json")


async def _refused(
    sent: bytes, upstream: aiohttp.ClientResponse, calls: ToolCalls, scope: str
) -> None:
    """The calls of a request the server refused with an HTTP error (a 503
    from a gateway in front of it, a body that is no JSON-RPC answer):
    failed results, so their repeats meet the failure rules. The client
    gets the server's own status and body."""
    status = f"HTTP {upstream.status} {upstream.reason or ''}".rstrip()
    await calls.from_server_raw(_jsonrpc_errors(sent, f"the MCP server answered {status}"), scope)


async def _stream(
    request: web.Request,
    out: web.StreamResponse,
    upstream: aiohttp.ClientResponse,
    sse: bool,
    calls: ToolCalls,
    scope: str,
    extra: list[mcp.JSONRPCMessage],
) -> None:
    """The server's streamed answer to the client, an SSE stream event by event."""
    reader = sse_reader() if sse else None
    try:
        if extra:
            await out.write(b"event: message\ndata: " + dump_batch(extra) + b"\n\n")
        async for chunk in upstream.content.iter_any():
            if reader is None:
                await out.write(chunk)
                continue
            for raw, data in reader.feed(chunk):
                await out.write(await _event(raw, data, calls, scope))
        if reader is not None:
            rest = reader.rest()
            if rest:
                await out.write(rest)
        await out.write_eof()
    except ConnectionResetError:
        pass  # the client went away (aiohttp's ClientConnectionResetError is one too)
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("mcp proxy: the server broke off a stream: %s", type(exc).__name__)
        if request.transport is not None:
            request.transport.abort()


def sse_reader() -> SseReader:
    """An SSE reader for the server's streams: an event may hold a result as
    large as a line over stdio may (a picture, a file); a smaller bound
    would leave every later answer on the stream unread."""
    return SseReader(max_event=MAX_LINE)


def _with_query(url: URL, query: str) -> URL:
    """`url` with the client's query string after its own, as it came (a bare
    `?flag` stays `?flag`): a parameter of the --upstream URL (a key) that
    the client does not send goes on; one it sends is the client's."""
    if not query:
        return url
    sent = URL("/?" + query, encoded=True).query
    kept = url.query.copy()
    for name in sent:
        kept.popall(name, None)
    own = url.with_query(kept).raw_query_string
    base = url.with_query(None).with_fragment(None)
    return URL(f"{base}?{own}&{query}" if own else f"{base}?{query}", encoded=True)


def _same_origin_redirect(url: URL, upstream: aiohttp.ClientResponse) -> URL | None:
    """Where a 307/308 of the upstream's points, when it is on the same
    scheme, host and port (a trailing slash added, say); None otherwise."""
    if upstream.status not in (307, 308):
        return None
    location = upstream.headers.get("Location")
    if not location:
        return None
    target = url.join(URL(location))
    return target if target.origin() == url.origin() else None


async def _replaced(raw: bytes, calls: ToolCalls, scope: str) -> bytes:
    """A message (or a batch) of the server's as it came, or as ToolCalls
    would have it instead."""
    instead = await calls.from_server_raw(raw, scope)
    return instead if instead is not None else raw


def _merged(body: bytes, extra: list[mcp.JSONRPCMessage]) -> bytes:
    """The server's answer to a batch with the answers given here added (as
    it came when it is not JSON: the client's batch failed there as a whole)."""
    if not extra:
        return body
    try:
        got = json.loads(body.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return body
    items = got if isinstance(got, list) else [got]
    added = [m.model_dump(by_alias=True, exclude_none=True, warnings=False) for m in extra]
    return compact([*items, *added])


async def _event(raw: bytes, data: str | None, calls: ToolCalls, scope: str) -> bytes:
    """One SSE event as it came, or with its message (or batch) replaced."""
    if not data:
        return raw
    encoded = data.encode()
    replaced = await _replaced(encoded, calls, scope)
    if replaced is encoded:
        return raw
    # SSE's line ends only: a tool's text may hold U+2028 or U+0085 raw, and
    # split there the rest of its line would become a field of the event.
    lines = [ln for ln in LINE_END.split(raw) if ln and not ln.startswith(b"data:")]
    return b"\n".join([*lines, b"data: " + replaced]) + b"\n\n"


def _jsonrpc_errors(body: bytes, text: str) -> bytes:
    """A JSON-RPC error for the request (its id, null when unknown), or for
    each request of a batch."""
    try:
        got = loads(body)
    except ValueError:
        got = None

    def error(message: object) -> dict[str, object]:
        rid = message.get("id") if isinstance(message, dict) else None
        return {"jsonrpc": "2.0", "id": rid, "error": {"code": -32000, "message": text}}

    if isinstance(got, list):  # no answer to a notification
        return compact([error(m) for m in got if isinstance(m, dict) and "id" in m])
    return compact(error(got))
