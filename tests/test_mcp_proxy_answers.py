"""What the MCP proxy reads of a call and its answers beyond the plain
request and CallToolResult: the protocol's multi-round tool calls, failures,
results the SDK's types refuse, and over HTTP redirects, ended sessions, SSE
events and answers refused or broken off. Each test here was a legitimate
call stopped, a warning lost or a call let past the guard, before the fix it
names."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.llmproxy.wire import SseReader
from gateway.mcpproxy import stdio
from gateway.mcpproxy.calls import NOTE, ToolCalls, parse
from gateway.mcpproxy.http import HttpProxy, _event, sse_reader
from tests.fakes.forward_proxy import ForwardProxy
from tests.redis_server import free_port
from tests.test_mcp_proxy_oddities import guarded


def request(rid: int, tool: str, args: Any = None, **params: Any) -> bytes:
    body = {"name": tool, **({} if args is None else {"arguments": args}), **params}
    return json.dumps(
        {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": body}
    ).encode()


def reply(rid: int, result: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}).encode()


async def call(calls: ToolCalls, line: bytes, answer: dict[str, Any]) -> bytes | None:
    """One call through `calls`: b"blocked" when the proxy answered it,
    else what it relays of `answer` (None: as it came)."""
    message = parse(line)
    assert message is not None
    blocked = await calls.from_client(message)
    if blocked is not None:
        return b"blocked"
    rid = json.loads(line)["id"]
    instead = await calls.from_server_raw(reply(rid, answer))
    await calls.settle()
    return instead


async def test_the_rounds_of_one_multi_round_call_are_one_step() -> None:
    # Breaks if each round of a multi-round tool call (the server answers
    # input_required, the client sends the same call again with the user's
    # answers and the server's requestState) is a step of its own: a tool
    # that asks two questions was blocked at its last round, after the user
    # answered both, and stayed blocked. A client that sends a requestState
    # nobody asked for is stepped as any call.
    calls = guarded()
    asking = {"resultType": "input_required", "inputRequests": {"ok": {}}, "requestState": "s1"}
    again = {"resultType": "input_required", "inputRequests": {"region": {}}, "requestState": "s2"}
    args = {"target": "prod"}
    rid = 0
    for _ in range(2):  # deployed twice in one session
        answers = []
        for state, answer in ((None, asking), ("s1", again), ("s2", {"content": []})):
            rid += 1
            more = {} if state is None else {"requestState": state, "inputResponses": {"ok": {}}}
            answers.append(await call(calls, request(rid, "deploy", args, **more), answer))
        assert b"blocked" not in answers
    state = await calls.guard.state("odd")
    assert state is not None and state["steps"] == 2
    # Bogus rounds (no input was asked for) are calls like any other.
    none = {"content": [{"type": "text", "text": "none"}]}
    bogus = [
        await call(calls, request(10 + i, "s", {"q": "x"}, requestState=5), none) for i in range(4)
    ]
    assert bogus[-1] == b"blocked"


async def test_a_failing_call_s_warning_reaches_the_model() -> None:
    # Breaks if a warning is added only to successful results: a call that
    # keeps failing got three plain errors, then a block, the one warning
    # meant to change its course never shown. After a JSON-RPC error, which
    # has no content to join, the warning comes with the next result.
    calls = guarded()
    failed = {"content": [{"type": "text", "text": "disk full"}], "isError": True}
    out = [await call(calls, request(i, "fail", {"reason": "x"}), failed) for i in range(1, 5)]
    warned = [o for o in out if o not in (None, b"blocked")]
    assert len(warned) == 1 and out[-1] == b"blocked"
    assert json.loads(warned[0])["result"]["content"][-1]["text"].startswith(NOTE + "This call")
    # A JSON-RPC error with a warning: carried to the next result.
    calls = guarded("odd2")
    error = {"jsonrpc": "2.0", "id": 0, "error": {"code": -32000, "message": "disk full"}}
    for rid in (1, 2, 3):
        message = parse(request(rid, "fail", {"reason": "x"}))
        assert message is not None and await calls.from_client(message) is None
        error["id"] = rid
        assert await calls.from_server_raw(json.dumps(error).encode()) is None
        await calls.settle()
    fine = await call(calls, request(4, "search", {"q": "y"}), {"content": []})
    assert fine is not None and NOTE in fine.decode()


async def test_a_result_of_structured_content_alone_is_a_result() -> None:
    # Breaks if an answer the SDK's types refuse (no `content`, which the
    # TypeScript client takes as []) is not recorded: a status tool whose
    # structured answer changed every time was blocked as if nothing changed.
    calls = guarded()
    out = [await call(calls, request(i, "job", {"id": 7}), {"structuredContent": {"n": i}})
           for i in range(1, 5)]  # fmt: skip
    assert b"blocked" not in out
    state = await calls.guard.state("odd")
    assert state is not None and None not in [c["result"] for c in state["recent_calls"]]


async def test_a_same_origin_redirect_is_followed_not_passed_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Breaks if the HTTP proxy passes a 307 of its upstream on (a trailing
    # slash the server wants): the client, following it, talked to the
    # server itself, past the guard.
    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(str(request.url.with_path("/mcp/")))

    async def served(request: web.Request) -> web.Response:
        got = await request.json()
        return web.json_response({"jsonrpc": "2.0", "id": got["id"], "result": {"content": []}})

    app = web.Application()
    app.router.add_post("/mcp", moved)
    app.router.add_post("/mcp/", served)
    async with TestServer(app) as upstream:
        proxy = HttpProxy(str(upstream.make_url("/mcp")), guarded)
        async with TestClient(TestServer(proxy.app)) as client:
            with caplog.at_level(logging.WARNING, "botbouncer.mcp_proxy"):
                async with client.post("/mcp", data=request(1, "search", {"q": "x"})) as resp:
                    assert resp.status == 200
                    assert (await resp.json())["id"] == 1
    assert "give that as --upstream" in caplog.text


async def test_a_deleted_session_leaves_nothing_held() -> None:
    # Breaks if the HTTP proxy keeps a session's calls after the client
    # ended it (DELETE): they were held until 10,000 other sessions pushed
    # them out.
    async def mcp(request: web.Request) -> web.Response:
        if request.method == "DELETE":
            return web.Response(status=200)
        got = await request.json()
        answer = {"jsonrpc": "2.0", "id": got["id"], "result": {"content": []}}
        return web.json_response(answer, headers={"Mcp-Session-Id": "abc"})

    app = web.Application()
    app.router.add_route("*", "/mcp", mcp)
    async with TestServer(app) as upstream:
        proxy = HttpProxy(str(upstream.make_url("/mcp")), guarded)
        async with TestClient(TestServer(proxy.app)) as client:
            headers = {"Mcp-Session-Id": "abc"}
            async with client.post("/mcp", data=request(1, "a"), headers=headers) as resp:
                assert resp.status == 200
            assert len(proxy._calls) == 1
            async with client.delete("/mcp", headers=headers) as resp:
                assert resp.status == 200
            for _ in range(20):
                if not proxy._calls:
                    break
                await asyncio.sleep(0.01)
    assert not proxy._calls


async def test_a_warning_added_to_an_sse_event_changes_only_its_data() -> None:
    # Breaks if the event is split at every Unicode line end (U+2028, U+0085,
    # which a tool's text may hold raw): the rest of such a line became a
    # field of the event (`event: ...`), and the client dropped the answer.
    calls = guarded()
    for rid in (1, 2):
        await call(calls, request(rid, "s", {"q": 1}), {"content": [{"type": "text", "text": "a"}]})
    warned = parse(request(3, "s", {"q": 1}))
    assert warned is not None and await calls.from_client(warned, "x") is None
    content = [{"type": "text", "text": "line one\u2028event: oops"}]
    message = {"jsonrpc": "2.0", "id": 3, "result": {"content": content}}
    data = json.dumps(message, ensure_ascii=False).encode()  # U+2028 raw, as servers may write it
    raw = b"event: message\ndata: " + data + b"\n\n"
    [(event, text)] = SseReader().feed(raw)
    rewritten = await _event(event, text, calls, "x")
    lines = rewritten.decode().split("\n")
    assert lines[0] == "event: message" and lines[1].startswith("data: {")
    assert lines[2:] == ["", ""]
    assert json.loads(lines[1][6:])["result"]["content"][-1]["text"].startswith(NOTE)


def test_an_sse_event_as_large_as_a_stdio_line_is_read() -> None:
    # Breaks if the HTTP proxy reads a server's stream with the LLM proxy's
    # 16 MiB bound: a larger result (a picture) made the stream count as no
    # SSE, and every later answer on it went unrecorded.
    reader = sse_reader()
    big = b"event: message\ndata: " + b"x" * (17 << 20) + b"\n\n"
    events = [e for i in range(0, len(big), 1 << 16) for e in reader.feed(big[i : i + (1 << 16)])]
    events += reader.feed(b"event: message\ndata: {}\n\n")
    assert [len(text or "") for _, text in events] == [17 << 20, 2]
    assert not reader.broken


ECHO = (
    "import sys\n"
    "for line in sys.stdin.buffer:\n"
    "    sys.stdout.buffer.write(line)\n"
    "    sys.stdout.flush()"
)


async def test_a_message_too_long_to_read_is_passed_on_unread(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Breaks if a line over the proxy's bound (128 MiB; 4 KiB here) ends the
    # relay with a traceback, or loses the lines after it: it is a relay's
    # to pass on, whole and in order, the guard not reading it (a WARNING
    # says so).
    monkeypatch.setattr(stdio, "MAX_LINE", 4096)
    client_r, proxy_w = os.pipe()
    proxy_r, client_w = os.pipe()
    long = b'{"jsonrpc":"2.0","method":"notifications/x","params":{"a":"' + b"x" * 10_000 + b'"}}\n'
    short = b'{"jsonrpc":"2.0","method":"notifications/y"}\n'
    stdin, stdout = os.fdopen(proxy_r, "rb", buffering=0), os.fdopen(proxy_w, "wb", buffering=0)
    with stdin, stdout, caplog.at_level(logging.WARNING, "botbouncer.mcp_proxy"):
        relay = asyncio.ensure_future(
            stdio.run([sys.executable, "-c", ECHO], guarded(), stdin=stdin, stdout=stdout)
        )
        await asyncio.to_thread(os.write, client_w, long + short + long + short)
        os.close(client_w)
        code = await asyncio.wait_for(relay, 20)
    got = b""
    while chunk := os.read(client_r, 1 << 16):
        got += chunk
    os.close(client_r)
    assert got == long + short + long + short
    assert code == 0
    assert caplog.text.count("over 4096 bytes is passed on unread") == 4  # each way, each time


async def test_a_server_that_is_down_is_a_failure_not_a_call_held_forever() -> None:
    # Breaks if a call the proxy could not forward (a 502 it answers itself)
    # stays pending in a stateful session and goes unrecorded: the calls were
    # held until the session ended, and an agent retrying a server that is
    # down, a different query each time, was never stopped.
    proxy = HttpProxy(f"http://127.0.0.1:{free_port()}/mcp", guarded)  # nobody there
    headers = {"Mcp-Session-Id": "abc"}
    statuses = []
    async with TestClient(TestServer(proxy.app)) as client:
        for i in range(1, 9):
            line = request(i, "search", {"q": i})
            async with client.post("/mcp", data=line, headers=headers) as r:
                got = await r.json()
                statuses.append(r.status)
                assert got["id"] == i
            if r.status == 200:
                assert got["result"]["isError"] and NOTE in got["result"]["content"][0]["text"]
                break
            assert "unreachable" in got["error"]["message"]
        [calls] = proxy._calls.values()
        await calls.settle()
        assert not calls.pending
    assert statuses[0] == 502 and statuses[-1] == 200  # blocked once failures ran on


async def test_a_call_the_server_refused_with_an_http_error_is_not_held() -> None:
    # Breaks if a call refused with an HTTP error (a body that is no
    # JSON-RPC answer, as a gateway in front of the server writes) stays
    # pending until its session ends.
    async def refuse(request: web.Request) -> web.Response:
        return web.Response(status=503, text="upstream overloaded")

    app = web.Application()
    app.router.add_post("/mcp", refuse)
    async with TestServer(app) as upstream:
        proxy = HttpProxy(str(upstream.make_url("/mcp")), guarded)
        async with TestClient(TestServer(proxy.app)) as client:
            headers = {"Mcp-Session-Id": "abc"}
            async with client.post("/mcp", data=request(1, "a"), headers=headers) as resp:
                assert resp.status == 503 and await resp.text() == "upstream overloaded"
            [calls] = proxy._calls.values()
            await calls.settle()
            assert not calls.pending


async def test_a_call_the_server_refuses_with_an_http_error_is_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Breaks if a call refused with an HTTP error is forgotten: it had no
    # result, so the guard took its repeats for identical calls that "got
    # nothing new" and blocked the third with that message, no warning
    # first, for an agent retrying a server that answered 503. Each is a
    # failed result naming the status (the failure rules stop the fourth);
    # the client still gets the server's own status and body, and a
    # JSON-RPC error the server did give is the result, not the status.
    calls = guarded()
    recorded: list[dict[str, Any]] = []
    result = calls.guard.result

    async def spy(session: str, body: dict[str, Any], profile: str | None = None) -> Any:
        recorded.append(body)
        return await result(session, body, profile)

    monkeypatch.setattr(calls.guard, "result", spy)

    async def refuse(request: web.Request) -> web.Response:
        got = await request.json()
        if got["params"]["name"] == "strict":
            error = {"jsonrpc": "2.0", "id": got["id"], "error": {"code": -32602, "message": "no"}}
            return web.json_response(error, status=400)
        return web.Response(status=503, text="upstream overloaded")

    app = web.Application()
    app.router.add_post("/mcp", refuse)
    out = []
    async with TestServer(app) as upstream:
        proxy = HttpProxy(str(upstream.make_url("/mcp")), lambda _: calls)
        async with TestClient(TestServer(proxy.app)) as client:
            headers = {"Mcp-Session-Id": "abc"}
            for rid in (1, 2, 3, 4):
                async with client.post("/mcp", data=request(rid, "search", {"q": "x"}),
                                       headers=headers) as resp:  # fmt: skip
                    out.append((resp.status, await resp.text()))
            async with client.post("/mcp", data=request(5, "strict"), headers=headers) as resp:
                assert resp.status == 400 and (await resp.json())["error"]["message"] == "no"
            await calls.settle()
            assert not calls.pending
    assert out[:3] == [(503, "upstream overloaded")] * 3
    assert out[3][0] == 200 and "has failed the same way 3 times" in out[3][1]
    refused = (False, "the MCP server answered HTTP 503 Service Unavailable")
    assert [(r["ok"], r["output"]) for r in recorded] == [refused] * 3 + [(False, "no")]


async def test_an_answer_the_server_breaks_off_is_a_502_and_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Breaks if a JSON answer the server breaks off mid-body is read
    # unguarded: the client got a 500 and the log a traceback. It is
    # answered as a server that is down is (a 502, a JSON-RPC error by id,
    # a failed result), with a WARNING line.
    async def broken(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?i)content-length: *(\d+)", head)
        await reader.readexactly(int(length[1]) if length else 0)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b'Content-Length: 1000\r\n\r\n{"jsonrpc": "2.0", ')  # fmt: skip
        await writer.drain()
        writer.close()  # 19 bytes of 1000

    upstream = await asyncio.start_server(broken, "127.0.0.1", 0)
    port = upstream.sockets[0].getsockname()[1]
    calls = guarded()
    proxy = HttpProxy(f"http://127.0.0.1:{port}/mcp", lambda _: calls)
    async with upstream, TestClient(TestServer(proxy.app)) as client:
        with caplog.at_level(logging.WARNING):
            line = request(1, "search", {"q": "x"})
            async with client.post("/mcp", data=line, headers={"Mcp-Session-Id": "abc"}) as resp:
                assert resp.status == 502
                got = await resp.json()
        await calls.settle()
    assert got["id"] == 1 and "broke off its answer" in got["error"]["message"]
    assert "mcp proxy: the server broke off its answer" in caplog.text
    assert not [r for r in caplog.records if r.exc_info or r.levelno > logging.WARNING]
    state = await calls.guard.state("odd")
    assert state is not None and state["tools"]["search"]["failure_streak"] == 1
    assert not calls.pending


async def test_a_batch_to_a_server_that_is_down_keeps_the_answers_given_here() -> None:
    # Breaks if the 502 for a batch answers one null id: the calls the proxy
    # blocked in it got no answer at all, and the forwarded ones none by id.
    calls = guarded()
    for i in (1, 2, 3):  # a fourth identical call is blocked
        await call(calls, request(i, "same", {"q": 1}), {"content": []})
    proxy = HttpProxy(f"http://127.0.0.1:{free_port()}/mcp", lambda _: calls)
    async with TestClient(TestServer(proxy.app)) as client:
        batch = b"[" + request(10, "same", {"q": 1}) + b"," + request(11, "other") + b"]"
        async with client.post("/mcp", data=batch) as resp:
            assert resp.status == 502
            got = {m["id"]: m for m in await resp.json()}
    assert set(got) == {10, 11}
    assert got[10]["result"]["isError"] and "error" in got[11]


async def test_the_upstream_is_reached_through_the_proxy_the_environment_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Breaks if the HTTP proxy ignores HTTP(S)_PROXY: behind a proxy that is
    # a host's only way out, a remote MCP server was unreachable.
    async def served(request: web.Request) -> web.Response:
        got = await request.json()
        return web.json_response({"jsonrpc": "2.0", "id": got["id"], "result": {"content": []}})

    app = web.Application()
    app.router.add_post("/mcp", served)
    async with TestServer(app) as upstream, ForwardProxy() as forward:
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", forward.url)
        where = str(upstream.make_url("/mcp"))
        proxy = HttpProxy(where, guarded)
        async with (
            TestClient(TestServer(proxy.app)) as client,
            client.post("/mcp", data=request(1, "search", {"q": "x"})) as resp,
        ):
            assert resp.status == 200 and (await resp.json())["id"] == 1
    assert forward.seen == [where]
