"""`botbouncer mcp-proxy --upstream URL`: streamable HTTP in front of a
remote MCP server (docs/mcp-proxy.md).

The proxy serves the upstream URL's path on its own listener, so a client
changes only host and port. Every request is forwarded; a POST holding one
`tools/call` is a guard step first (a block is answered here, as JSON), and
the answers to tool calls - a JSON body, or a message of an SSE stream - are
guard results. SSE streams pass event by event, each as the bytes it came
as unless a warning is added to it. A guard session is one MCP session (the
`Mcp-Session-Id` the server gave), unless --session names one for all.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from gateway.llmproxy.wire import HOP_BY_HOP, SseReader, digest
from gateway.mcpproxy.calls import ToolCalls, dump, parse

log = logging.getLogger("botbouncer.mcp_proxy")

MAX_BODY = 32 * 1024 * 1024
MAX_SESSIONS = 10_000
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
        self._client: aiohttp.ClientSession | None = None
        self.app = web.Application()
        self.app.router.add_route("*", self.path, self._handle)
        self.app.on_cleanup.append(self._close)

    async def _close(self, app: web.Application) -> None:
        for calls in list(self._calls.values()):  # the last results reach the store
            await calls.settle()
        if self._client is not None:
            await self._client.close()

    def calls(self, request: web.Request) -> ToolCalls:
        """The tool calls of this request's MCP session (one set when there is none)."""
        name = self._session
        if name is None:
            mcp_session = request.headers.get(SESSION_HEADER, "")
            name = "mcp-" + digest(self.upstream, mcp_session)[:32]
        calls = self._calls.get(name)
        if calls is None:
            calls = self._calls[name] = self._calls_for(name)
            if len(self._calls) > MAX_SESSIONS:
                self._calls.popitem(last=False)
        else:
            self._calls.move_to_end(name)
        return calls

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.content.read(MAX_BODY + 1)
        if len(body) > MAX_BODY:
            return web.json_response({"error": f"body over {MAX_BODY} bytes"}, status=413)
        calls = self.calls(request)
        if request.method == "POST":
            message = parse(body)
            answer = await calls.from_client(message) if message is not None else None
            if answer is not None:
                return web.Response(body=dump(answer), content_type="application/json")
        if self._client is None:
            self._client = aiohttp.ClientSession(auto_decompress=True, trust_env=False)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        headers["Accept-Encoding"] = "identity"
        try:
            upstream = await self._client.request(
                request.method, self.upstream, params=request.rel_url.query, data=body,
                headers=headers, allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=None, connect=10, sock_read=None),
            )  # fmt: skip
        except aiohttp.ClientError as exc:
            log.warning("mcp proxy: upstream %s unreachable: %s", self.upstream, exc)
            return _jsonrpc_error(body, f"the MCP server {self.upstream} is unreachable")
        try:
            return await self._relay(request, upstream, calls)
        finally:
            upstream.release()

    async def _relay(
        self, request: web.Request, upstream: aiohttp.ClientResponse, calls: ToolCalls
    ) -> web.StreamResponse:
        headers = CIMultiDict((k, v) for k, v in upstream.headers.items() if k.lower() not in _HOP)
        if upstream.content_type == "application/json":  # one message: read whole
            raw = await upstream.read()
            message = parse(raw)
            instead = await calls.from_server(message) if message is not None else None
            body = dump(instead) if instead is not None else raw
            return web.Response(
                status=upstream.status, reason=upstream.reason, body=body, headers=headers
            )
        out = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
        await out.prepare(request)
        sse = SseReader() if upstream.content_type == "text/event-stream" else None
        try:
            async for chunk in upstream.content.iter_any():
                if sse is None:
                    await out.write(chunk)
                    continue
                for raw, data in sse.feed(chunk):
                    await out.write(await _event(raw, data, calls))
            if sse is not None:
                rest = sse.rest()
                if rest:
                    await out.write(rest)
            await out.write_eof()
        except ConnectionResetError:
            pass  # the client went away (aiohttp's ClientConnectionResetError is one too)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("mcp proxy: the server broke off a stream: %s", type(exc).__name__)
            if request.transport is not None:
                request.transport.abort()
        return out


async def _event(raw: bytes, data: str | None, calls: ToolCalls) -> bytes:
    """One SSE event as it came, or with its message replaced."""
    message = parse(data) if data else None
    instead = await calls.from_server(message) if message is not None else None
    if instead is None:
        return raw
    text = raw.decode("utf-8", "replace")
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("data:")]
    lines.append("data: " + dump(instead).decode())
    return ("\n".join(lines) + "\n\n").encode()


def _jsonrpc_error(body: bytes, text: str) -> web.Response:
    """502 with a JSON-RPC error for the request's id (null when unknown)."""
    try:
        request_id = json.loads(body).get("id")
    except (ValueError, AttributeError):
        request_id = None
    error = {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32000, "message": text}}
    return web.json_response(error, status=502)
