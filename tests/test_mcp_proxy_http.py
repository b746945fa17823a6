"""The MCP proxy's streamable-HTTP relay (gateway/mcpproxy/http.py) as a
client and a server see it: the streams it holds open for its clients, the
headers and query string it passes on. The upstreams are aiohttp servers in
the test, the proxy runs in process. Each test here was a client refused, a
call failed or a header lost, before the fix it names."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from multidict import CIMultiDict

from gateway.mcpproxy.http import HttpProxy
from tests.test_mcp_proxy_answers import request
from tests.test_mcp_proxy_oddities import guarded

SSE = {"Accept": "text/event-stream"}


class Served(TestServer):
    """The proxy served as `botbouncer mcp-proxy` serves it (an AppRunner as
    aiohttp makes it): a handler whose client goes away is not cancelled,
    where TestServer's is. A relay still running at the end (the bug) is
    waited for 2 s, not a minute."""

    async def _make_runner(self, **kwargs: Any) -> web.AppRunner:
        kwargs.pop("handler_cancellation", None)
        return web.AppRunner(self.app, shutdown_timeout=2, **kwargs)


async def answer(req: web.Request) -> web.Response:
    got = await req.json()
    return web.json_response({"jsonrpc": "2.0", "id": got["id"], "result": {"content": []}})


async def until(check: Any, within: float = 3.0) -> bool:
    """Whether check() comes true within `within` seconds."""
    for _ in range(int(within / 0.02)):
        if check():
            return True
        await asyncio.sleep(0.02)
    return bool(check())


async def test_a_dropped_stream_is_closed_at_the_server_so_the_client_can_reconnect() -> None:
    # Breaks if the proxy keeps the server's GET stream open after its
    # client dropped it, until it next has something to write to it: the
    # server (one GET stream a session, as the spec and the SDK's server
    # have it) answered the client's reconnect 409, and the notifications
    # it sent meanwhile were lost.
    open_streams: dict[str, int] = {}

    async def mcp(req: web.Request) -> web.StreamResponse:
        if req.method == "POST":
            return await answer(req)
        session = req.headers["Mcp-Session-Id"]
        if open_streams.get(session):
            return web.Response(status=409, text="Conflict: only one SSE stream per session")
        open_streams[session] = 1
        try:
            out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await out.prepare(req)
            await out.write(b": open\n\n")
            await asyncio.sleep(3600)  # nothing to say: until the connection is closed
            return out
        finally:
            open_streams[session] = 0

    app = web.Application()
    app.router.add_route("*", "/mcp", mcp)
    # A TestServer cancels the handler of a client that went away, as real servers end its stream.
    async with TestServer(app) as upstream:
        proxy = HttpProxy(str(upstream.make_url("/mcp")), guarded)
        async with TestClient(Served(proxy.app)) as client:
            headers = {**SSE, "Mcp-Session-Id": "abc"}
            resp = await client.get("/mcp", headers=headers)
            assert resp.status == 200 and await resp.content.readline() == b": open\n"
            resp.close()  # the client drops it (a network change, a crash)
            assert await until(lambda: not open_streams["abc"])
            async with client.get("/mcp", headers=headers) as again:
                assert again.status == 200


async def test_open_streams_do_not_hold_up_the_next_session_s_calls() -> None:
    # Breaks if the proxy's connections to the server are pooled with a
    # bound (aiohttp's 100): with 100 sessions' GET streams open, the next
    # session's calls waited 10 s, came back 502 "unreachable", and were
    # recorded as failures the server never saw.
    async def mcp(req: web.Request) -> web.StreamResponse:
        if req.method == "POST":
            return await answer(req)
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(req)
        await out.write(b": open\n\n")
        await asyncio.sleep(3600)
        return out

    app = web.Application()
    app.router.add_route("*", "/mcp", mcp)
    async with TestServer(app) as upstream:
        proxy = HttpProxy(str(upstream.make_url("/mcp")), guarded)
        server = Served(proxy.app)
        async with TestClient(server, connector=aiohttp.TCPConnector(limit=0)) as client:
            streams = []
            for i in range(100):
                stream = await client.get("/mcp", headers={**SSE, "Mcp-Session-Id": f"s{i}"})
                assert stream.status == 200 and await stream.content.readline() == b": open\n"
                streams.append(stream)
            posted = client.post("/mcp", data=request(1, "search", {"q": "x"}),
                                 headers={"Mcp-Session-Id": "next"})  # fmt: skip
            async with await asyncio.wait_for(posted, 5) as resp:
                assert resp.status == 200 and (await resp.json())["id"] == 1
            for stream in streams:
                stream.close()


async def test_repeated_request_headers_reach_the_server_with_every_value() -> None:
    # Breaks if the proxy keeps one value of a repeated header (the last
    # Cookie, the last X-Forwarded-For), or holds cookies of its own: a
    # server behind a load balancer got half a client's cookies, and one
    # client's sticky cookie went out with every other client's calls.
    seen: list[CIMultiDict[str]] = []

    async def mcp(req: web.Request) -> web.Response:
        seen.append(CIMultiDict(req.headers))
        got = await req.json()
        result = {"jsonrpc": "2.0", "id": got["id"], "result": {"content": []}}
        return web.json_response(result, headers={"Set-Cookie": "lb=node1; Path=/"})

    app = web.Application()
    app.router.add_route("*", "/mcp", mcp)
    async with TestServer(app) as upstream:
        # By name: a cookie jar takes no cookie from an IP address.
        where = str(upstream.make_url("/mcp")).replace("127.0.0.1", "localhost")
        proxy = HttpProxy(where, guarded)
        server = Served(proxy.app)
        async with TestClient(server, cookie_jar=aiohttp.DummyCookieJar()) as client:
            headers: CIMultiDict[str] = CIMultiDict()
            for name, value in (
                ("Cookie", "a=1"), ("Cookie", "b=2"),
                ("X-Forwarded-For", "10.0.0.1"), ("X-Forwarded-For", "10.0.0.2"),
                ("Accept-Encoding", "gzip"), ("Proxy-Authorization", "x"),
            ):  # fmt: skip
                headers.add(name, value)
            for rid, sent in ((1, CIMultiDict[str]()), (2, headers), (3, CIMultiDict[str]())):
                async with client.post("/mcp", data=request(rid, "a"), headers=sent) as resp:
                    assert resp.status == 200 and resp.headers["Set-Cookie"].startswith("lb=")
    first, second, third = seen
    assert "Cookie" not in first and "Cookie" not in third  # no cookie of the proxy's own
    assert second.getall("Cookie") == ["a=1", "b=2"]
    assert second.getall("X-Forwarded-For") == ["10.0.0.1", "10.0.0.2"]
    assert second.getall("Accept-Encoding") == ["identity"]
    assert "Proxy-Authorization" not in second


async def test_the_query_string_reaches_the_server_once_as_the_client_sent_it() -> None:
    # Breaks if the client's query string is added to the --upstream URL's
    # whole (a hosted server's ?key=abc, sent back by a client that changed
    # only host and port, went as ?key=abc&key=abc), takes its place (the
    # key was lost when the client sent ?debug=1) or is re-encoded (a bare
    # ?flag went as ?flag=), here or through a redirect of the server's.
    seen: list[str] = []

    async def moved(req: web.Request) -> web.Response:
        seen.append(req.raw_path)
        query = req.rel_url.raw_query_string
        raise web.HTTPTemporaryRedirect("/new" + (f"?{query}" if query else ""))

    async def mcp(req: web.Request) -> web.Response:
        seen.append(req.raw_path)
        return await answer(req)

    app = web.Application()
    app.router.add_post("/mcp", mcp)
    app.router.add_post("/old", moved)
    app.router.add_post("/new", mcp)
    async with TestServer(app) as upstream:
        for path, sent, expected in (
            ("/mcp", "", ["/mcp?key=abc"]),
            ("/mcp", "?key=abc", ["/mcp?key=abc"]),
            ("/mcp", "?key=xyz", ["/mcp?key=xyz"]),
            ("/mcp", "?flag", ["/mcp?key=abc&flag"]),
            ("/mcp", "?a=%20b&a=c", ["/mcp?key=abc&a=%20b&a=c"]),
            ("/old", "", ["/old?key=abc", "/new?key=abc"]),
            ("/old", "?flag", ["/old?key=abc&flag", "/new?key=abc&flag"]),
        ):
            proxy = HttpProxy(str(upstream.make_url(path)) + "?key=abc", guarded)
            async with TestClient(Served(proxy.app)) as client:
                seen.clear()
                async with client.post(path + sent, data=request(1, "a")) as resp:
                    assert resp.status == 200
                assert seen == expected, (path, sent)
