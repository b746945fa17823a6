"""The MCP proxy against what clients and servers send that the SDK's own
types do not take, and against clients that go away oddly: each test here
was a way past the guard, or a crash of the proxy (and its server), before
the fix it names."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.guard.engine import engine_for
from gateway.guard.profiles import GuardConfig
from gateway.guard.service import Guard
from gateway.mcpproxy.calls import ToolCalls, dump, parse
from gateway.mcpproxy.http import HttpProxy
from gateway.store import open_store
from tests.test_mcp_proxy import (
    BLOCKED,
    CALL_TIMEOUT,
    PY,
    WARNED,
    answer_line,
    gone,
    http_servers,
    http_session,
    stop,
    texts,
    wait_for_text,
)


def guarded(session: str = "odd") -> ToolCalls:
    return ToolCalls(Guard(GuardConfig(), engine_for(open_store("memory://"))), session, "default")


def search_line(rid: bytes, query: bytes = b"tide tables") -> bytes:
    return (b'{"jsonrpc":"2.0","id":' + rid + b',"method":"tools/call","params":{"name":'
            b'"search","arguments":{"query":"' + query + b'"}}}\n')  # fmt: skip


async def verdicts(calls: ToolCalls, lines: list[bytes], ids: list[bytes]) -> list[str]:
    """Each call through `calls` as the stdio relay takes it, answered by a
    server that reads it as json.loads does: ok, warned or blocked."""
    out = []
    for line, rid in zip(lines, ids, strict=True):
        message = parse(line)
        assert message is not None, f"the proxy cannot read {line!r}"
        answer = await calls.from_client(message)
        if answer is not None:
            out.append("blocked" if answer.result["isError"] else "answered?")
            continue
        result = {"content": [{"type": "text", "text": "no results"}]}
        served = (
            b'{"jsonrpc":"2.0","id":' + rid + b',"result":' + json.dumps(result).encode() + b"}"
        )
        instead = await calls.from_server_raw(served)
        out.append("ok" if instead is None else "warned")
        await calls.settle()
    return out


async def test_a_tool_call_only_a_lenient_server_reads_is_still_a_step() -> None:
    # Breaks if a tools/call the SDK's types refuse but a server still runs
    # passes unguarded: a byte that is not UTF-8 (the SDK's stdio server
    # decodes with replacement), a lone surrogate escape (json.loads and
    # JSON.parse take it), an id written 1.0 (JavaScript's 1; the SDK's types
    # read the line as a notification). Each looped six times was run six
    # times by the server.
    ids = [b"%d" % i for i in range(1, 7)]
    floats = [b"%d.0" % i for i in range(1, 7)]
    expected = ["ok", "ok", "warned", "blocked", "blocked", "blocked"]
    for lines, rids in (
        ([search_line(i, b"tide \xff tables") for i in ids], ids),
        ([search_line(i, b"tide tables \\ud83d") for i in ids], ids),
        ([search_line(i) for i in floats], floats),
    ):
        assert await verdicts(guarded(), lines, rids) == expected
    # The block answers the id as the client wrote it.
    calls = guarded()
    await verdicts(calls, [search_line(i) for i in floats[:3]], floats[:3])
    blocked = await calls.from_client(parse(search_line(b"4.0")))  # type: ignore[arg-type]
    assert blocked is not None
    assert dump(blocked).startswith(b'{"jsonrpc":"2.0","id":4.0,"result":{"content":')


async def test_a_cancellation_naming_no_id_leaves_the_proxy_and_its_calls_alone() -> None:
    # Breaks if a notifications/cancelled whose requestId is a list or an
    # object (not even hashable) raises: over stdio that ended the proxy and
    # its server, over HTTP it answered 500.
    calls = guarded()
    pending = parse(search_line(b"1"))
    assert pending is not None and await calls.from_client(pending) is None
    for rid in ([1], {"id": 1}, None, True):
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled",
                  "params": {"requestId": rid}}  # fmt: skip
        message = parse(json.dumps(cancel))
        assert message is not None and await calls.from_client(message) is None
    assert list(calls.pending) == [(None, 1)]
    assert await calls.from_server_raw(answer_line(1, "no results")) is None
    await calls.settle()
    assert not calls.pending


async def test_a_batch_holding_a_lone_surrogate_and_a_blocked_call_is_answered() -> None:
    # Breaks if the rest of a batch is written back as UTF-8 that cannot hold
    # a lone surrogate (a string cut mid-emoji): UnicodeEncodeError, and the
    # proxy and its server were gone.
    calls = guarded()
    await verdicts(calls, [search_line(b"%d" % i) for i in (1, 2, 3)], [b"1", b"2", b"3"])
    note = b'{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"cut \\ud83d"}}'
    batch = b"[" + search_line(b"4").strip() + b"," + note + b"]"
    done = await calls.from_client_batch(batch)
    assert (
        [m.result["content"][0]["text"] for m in done.answers]
        == [  # type: ignore[union-attr]
            BLOCKED + " Do not call it again with these arguments: change the arguments, use "
            "another tool, or answer with what you have."
        ]
    )
    assert done.forward is not None
    assert json.loads(done.forward) == [json.loads(note)]


async def test_one_deep_message_in_a_batch_leaves_the_others_guarded() -> None:
    # Breaks if a message nested deeper than the guard reads makes the whole
    # batch pass unread: the tools/call beside it went to the server however
    # often it looped, with nothing logged.
    calls = guarded()
    await verdicts(calls, [search_line(b"%d" % i) for i in (1, 2, 3)], [b"1", b"2", b"3"])
    deep = b'{"jsonrpc":"2.0","method":"notifications/x","params":{"a":' + b"[" * 100
    deep += b"]" * 100 + b"}}"
    done = await calls.from_client_batch(b"[" + deep + b"," + search_line(b"4").strip() + b"]")
    assert len(done.answers) == 1 and done.answers[0].result["isError"]  # type: ignore[union-attr]
    assert done.forward is not None and json.loads(done.forward) == [json.loads(deep)]


async def test_calls_of_two_clients_with_the_same_ids_keep_their_own_answers() -> None:
    # Breaks if pending calls are keyed by the bare JSON-RPC id: two clients
    # of one guard session (HTTP, --session) both number their requests from
    # 0, and the first's warning went out on the second's result.
    calls = guarded()
    for rid in (1, 2):
        message = parse(search_line(b"%d" % rid))
        assert message is not None and await calls.from_client(message, "a") is None
        assert await calls.from_server_raw(answer_line(rid, "no results"), "a") is None
        await calls.settle()
    warned = parse(search_line(b"3"))
    assert warned is not None and await calls.from_client(warned, "a") is None
    other = parse(b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"calls_made"}}')
    assert other is not None and await calls.from_client(other, "b") is None
    assert await calls.from_server_raw(answer_line(3, "B's own"), "b") is None
    a_answer = await calls.from_server_raw(answer_line(3, "no results"), "a")
    assert a_answer is not None and json.loads(a_answer)["result"]["content"][1]["text"] == (
        WARNED + " Do not call it again with these arguments: change the arguments, use "
        "another tool, or answer with what you have."
    )
    await calls.settle()
    assert not calls.pending
    stale = parse(search_line(b"9", b"moon"))
    assert stale is not None and await calls.from_client(stale, "b") is None
    relayed = parse(search_line(b"10", b"sun"))
    assert relayed is not None and await calls.from_client(relayed, "b") is None
    assert await calls.from_server_raw(answer_line(10, "sunny"), "b") is None
    calls.forget("b")  # an exchange that ended takes its calls with it: after its records
    await calls.settle()
    assert not calls.pending
    state = await calls.guard.state("odd")
    assert state is not None and state["recent_calls"][-1]["result"] is not None


async def test_a_stateless_exchange_leaves_nothing_pending(tmp_path: Path) -> None:
    # Breaks if the HTTP proxy keys a call of a server that gives no
    # Mcp-Session-Id by its bare id (two clients' calls collide), or keeps
    # it pending after its exchange ended without an answer.
    async def upstream(request: web.Request) -> web.Response:
        return web.Response(status=202)  # took it, will answer nowhere

    app = web.Application()
    app.router.add_post("/mcp", upstream)
    async with TestServer(app) as server:
        made: list[ToolCalls] = []

        def calls_for(name: str) -> ToolCalls:
            made.append(guarded(name))
            return made[-1]

        proxy = HttpProxy(str(server.make_url("/mcp")), calls_for)
        async with TestClient(TestServer(proxy.app)) as client:
            for _ in range(2):
                async with client.post("/mcp", data=search_line(b"1")) as resp:
                    assert resp.status == 202
    assert len(made) == 1 and not made[0].pending


async def test_a_large_tool_call_over_http_reaches_the_server_whole(tmp_path: Path) -> None:
    # Breaks if the HTTP proxy reads a request body in one read: a body that
    # arrives in more than one piece was cut short, and the server answered
    # a parse error for any sizeable call.
    text = "x" * 400_000  # the answer repeats it: within the SDK client's 1 MiB event
    async with (
        http_servers(tmp_path, tmp_path / "count") as (_, proxy_url),
        http_session(proxy_url) as client,
    ):
        result = await client.call_tool("echo", {"text": text})
    assert not result.is_error and texts(result) == [text]


TALKER = (
    "import os, sys, time\n"
    "sys.stderr.write(f'talker pid={os.getpid()}\\n'); sys.stderr.flush()\n"
    "while True:\n"
    '    sys.stdout.write(\'{"jsonrpc":"2.0","method":"notifications/message",'
    '"params":{"level":"info","data":"tick"}}\\n\')\n'
    "    sys.stdout.flush()\n"
    "    time.sleep(0.1)\n"
)


async def test_a_client_that_stops_reading_ends_the_proxy_and_its_server(tmp_path: Path) -> None:
    # Breaks if the proxy, finding its client's end of stdout closed, waits
    # for a server that does not exit on end of input: both ran on for ever.
    # The server gets the same grace as on a closed stdin, then SIGTERM.
    stderr = tmp_path / "stderr"
    read, write = os.pipe()
    with stderr.open("wb") as err:
        proxy = await asyncio.create_subprocess_exec(
            PY, "-m", "gateway", "mcp-proxy", "--", PY, "-c", TALKER,
            stdin=asyncio.subprocess.PIPE, stdout=write, stderr=err,
        )  # fmt: skip
    os.close(write)
    try:
        found = await wait_for_text(stderr, "talker pid=")
        child = int(found.split("talker pid=")[1].split()[0])
        assert await asyncio.to_thread(os.read, read, 100)  # it talks
        os.close(read)  # the client stops reading, and keeps stdin open
        started = time.monotonic()
        code = await asyncio.wait_for(proxy.wait(), CALL_TIMEOUT)
        assert code == 128 + signal.SIGTERM
        assert time.monotonic() - started < 2 * 2.0 + 1  # SIGTERM after its grace
        assert gone(child)
    finally:
        await stop(proxy)
