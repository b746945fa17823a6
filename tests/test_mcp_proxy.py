"""`botbouncer mcp-proxy` (docs/mcp-proxy.md) end to end: the proxy is always
the real command (`python -m gateway mcp-proxy`, a process of its own), the
clients are the official MCP Python SDK's (`mcp.client.stdio.stdio_client`,
`mcp.client.streamable_http.streamable_http_client`, `ClientSession`) or raw
JSON-RPC lines written here, and the servers are real ones:
tests/mcp_servers/counter.py (an SDK MCPServer that counts the calls it really
ran), the published `mcp-server-time`, and, where a server must misbehave in
a way the SDK's never does (answer a call after its cancellation), a few
lines of raw JSON-RPC (LATE_SERVER below).

What is proven:
- a client looping on one call is warned at the 3rd identical call (a text
  block added to the result) and blocked from the 4th on (`isError`, the
  guard's message), and the server runs it 3 times only; a profile named by
  `--profile` in a `-c` file changes that (its `identical` limits, its
  `exempt_tools`, its `polling.tools`);
- a server behind the proxy answers byte for byte what it answers directly
  (raw lines), and the SDK reads the same tools and results; lines in JSON
  the SDK would not write (spaces, key order, escapes) pass as they came;
- progress notifications and log messages reach the client in order, as
  they are sent (not held back until the call's answer), then the result;
- an answer no warning waits for is relayed before the proxy reads it and
  still recorded before the next step is judged; one a warning waits for
  is read first and relayed with it (in process, on `ToolCalls`);
- a call the SDK cancels is cancelled on the server; it keeps its step and
  never gets a result, even from an answer the server sends after the
  cancellation; later calls are guarded and recorded as before;
- the process: the child's stderr is the proxy's, the child's exit status is
  the proxy's, SIGTERM stops both (143), closing stdin ends both, and bad
  command lines exit 2 with a message;
- two proxies with one `--session` on Redis are one guard session;
- over streamable HTTP: the same block at the 4th call, progress through the
  proxy's SSE relay, the same tools/list, one guard session per MCP session.
- the client configuration in docs/mcp-proxy.md starts every proxy it
  lists, with the proxy file the docs show, whose profile lets an editor's
  long session call a tool more than the default step ceilings allow;
- a proxy whose Redis is killed or frozen mid-session goes on answering
  (a frozen one costs one timeout) and guarding from its own memory.

Guard state is read with `Guard.state` on the Redis the proxy uses (db from
REDIS_URL; keys `bb:guard:{<session>}`, the store's default prefix, deleted
after each test). Everything listens on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, TextContent

from gateway.config import parse_config
from gateway.guard.engine import RedisEngine, engine_for
from gateway.guard.profiles import GuardConfig
from gateway.guard.service import Guard
from gateway.mcpproxy.calls import ToolCalls, parse
from gateway.store import open_store
from gateway.store.redis import RedisStore
from tests.redis_server import RedisServer, delete_matching, free_port

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
PROXY = [PY, "-m", "gateway", "mcp-proxy"]
COUNTER = [PY, "-m", "tests.mcp_servers.counter"]
TIME_SERVER = [PY, "-m", "mcp_server_time"]
NOTE = "botbouncer (loop guard): "
WARNED = NOTE + "You called search with the same arguments 2 times in a row and got nothing new."
BLOCKED = NOTE + "You called search with the same arguments 3 times in a row and got nothing new."
CALL_TIMEOUT = 20.0  # seconds: a hung relay fails the test instead of hanging it
PAUSE = 0.25  # seconds slow_job waits after each step

# A stdio MCP server in raw JSON-RPC that the SDK could not be made to be:
# it holds every call of `hold` and answers it only once the client has
# cancelled it (a late answer, which a server may send: the cancellation
# races the answer). Every other call is answered at once.
LATE_SERVER = """
import json, sys
held = None
def send(message):
    sys.stdout.write(json.dumps(message) + "\\n")
    sys.stdout.flush()
for line in sys.stdin:
    m = json.loads(line)
    method, rid = m.get("method"), m.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": "2025-06-18",
              "capabilities": {"tools": {}}, "serverInfo": {"name": "late", "version": "1"}}})
    elif method == "tools/call" and m["params"]["name"] == "hold":
        held = rid
    elif method == "tools/call":
        send({"jsonrpc": "2.0", "id": rid,
              "result": {"content": [{"type": "text", "text": "answer " + str(rid)}]}})
    elif method == "notifications/cancelled" and m["params"]["requestId"] == held:
        send({"jsonrpc": "2.0", "id": held,
              "result": {"content": [{"type": "text", "text": "late answer"}]}})
"""

# A server on the protocol's 2025-03-26 revision, which has JSON-RPC batches
# (servers on it must take them): a batch is answered with the batch of its
# requests' answers. search(query) counts its runs in COUNTER_FILE.
BATCH_SERVER = """
import json, os, sys
runs = 0
def answer(m):
    global runs
    method, rid = m.get("method"), m.get("id")
    if method == "initialize":
        return {"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": "2025-03-26",
                "capabilities": {"tools": {}}, "serverInfo": {"name": "batch", "version": "1"}}}
    if method == "tools/call":
        runs += 1
        with open(os.environ["COUNTER_FILE"], "w") as f:
            f.write(str(runs))
        text = "no results for " + m["params"]["arguments"]["query"]
        content = [{"type": "text", "text": text}]
        return {"jsonrpc": "2.0", "id": rid, "result": {"content": content}}
    return None
for line in sys.stdin:
    m = json.loads(line)
    out = [a for a in map(answer, m) if a] if isinstance(m, list) else answer(m)
    if out:
        sys.stdout.write(json.dumps(out) + "\\n")
        sys.stdout.flush()
"""

# A stdio child for the lifecycle tests: says its pid on stderr, then echoes
# every line it reads until its stdin closes. Python starts in milliseconds
# without the MCP SDK, so these tests pay for the proxy's start only.
ECHO_CHILD = """
import os, sys
sys.stderr.write(f"echo-child pid={os.getpid()}\\n")
sys.stderr.flush()
while line := sys.stdin.readline():
    sys.stdout.write(line)
    sys.stdout.flush()
"""


# -- helpers ------------------------------------------------------------------


def count(path: Path) -> int:
    """How many times the counter server really ran `search`."""
    text = path.read_text() if path.exists() else ""
    return int(text or 0)


def texts(result: CallToolResult) -> list[str]:
    return [b.text for b in result.content if isinstance(b, TextContent)]


def proxied(
    *proxy_args: str, server: list[str] = COUNTER, counter: Path | None = None, **env: str
) -> Any:
    """The SDK's stdio parameters for the proxy in front of `server` (`env`:
    more of the server's environment, which passes through the proxy)."""
    if counter is not None:
        env["COUNTER_FILE"] = str(counter)
    return StdioServerParameters(
        command=PY, args=[*PROXY[1:], *proxy_args, "--", *server], env=env, cwd=ROOT
    )


def direct(server: list[str] = TIME_SERVER) -> Any:
    return StdioServerParameters(command=server[0], args=server[1:], cwd=ROOT)


@contextlib.asynccontextmanager
async def stdio_session(params: Any, **session: Any) -> AsyncIterator[ClientSession]:
    """An initialised SDK client session over stdio (the proxy, or a server)."""
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, read_timeout_seconds=CALL_TIMEOUT, **session) as client,
    ):
        await client.initialize()
        yield client


@contextlib.asynccontextmanager
async def side_by_side(*params: Any) -> AsyncIterator[list[ClientSession]]:
    """SDK stdio sessions started at once (each held open by a task of its own:
    an anyio task group must be left by the task that entered it)."""
    done = asyncio.Event()
    ready = [asyncio.get_running_loop().create_future() for _ in params]

    async def hold(p: Any, future: asyncio.Future[ClientSession]) -> None:
        try:
            async with stdio_session(p) as client:
                future.set_result(client)
                await done.wait()
        except Exception as exc:
            if not future.done():
                future.set_exception(exc)
            raise

    tasks = [asyncio.create_task(hold(p, f)) for p, f in zip(params, ready, strict=True)]
    try:
        yield list(await asyncio.gather(*ready))
    finally:
        done.set()
        await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def http_session(url: str, **session: Any) -> AsyncIterator[ClientSession]:
    async with (
        streamable_http_client(url) as (read, write),
        ClientSession(read, write, read_timeout_seconds=CALL_TIMEOUT, **session) as client,
    ):
        await client.initialize()
        yield client


async def loop_on_search(client: ClientSession, times: int = 10) -> list[CallToolResult]:
    """An agent stuck on one call: the same search, again and again."""
    return [await client.call_tool("search", {"query": "tide tables"}) for _ in range(times)]


def write_config(path: Path, store_url: str = "memory://") -> Path:
    path.write_text(
        f"store: {{url: {json.dumps(store_url)}, timeout_seconds: 5}}\n"
        "mcp_proxy: {}\n"
        "guard:\n"
        "  profiles:\n"
        "    tight:\n"
        "      identical: {warn_at: 2, block_at: 2}\n"
        "    lenient:\n"
        "      exempt_tools: [search]\n"
        "      polling: {tools: [wait]}\n"
    )
    return path


@pytest.fixture
async def session_name(redis_url: str, key_prefix: str) -> AsyncIterator[str]:
    """A guard session for this test; its Redis key is deleted afterwards."""
    yield key_prefix
    await delete_matching(redis_url, f"bb:guard:{{{key_prefix}*")


@pytest.fixture
async def guard_state(redis_url: str) -> AsyncIterator[Callable[[str], Awaitable[Any]]]:
    """`Guard.state` on the Redis (and default key prefix) the proxy's store uses."""
    store = RedisStore.from_url(redis_url)
    guard = Guard(GuardConfig(), RedisEngine(store))
    yield guard.state
    await store.close()


async def start_proxy(*args: str, stderr: Path, **env: str) -> asyncio.subprocess.Process:
    """The proxy as a process of its own, stdin and stdout piped to this test
    (`env`: more of its environment, which its server inherits)."""
    with stderr.open("wb") as err:
        return await asyncio.create_subprocess_exec(
            *PROXY, *args, cwd=ROOT, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=err, env={**os.environ, **env},
        )  # fmt: skip


async def stop(process: asyncio.subprocess.Process) -> None:
    """End a process this test started, if it has not ended."""
    if process.returncode is None:
        process.kill()
        await process.wait()


Send = Callable[[Any], Awaitable[None]]
Receive = Callable[[], Awaitable[bytes]]


@contextlib.asynccontextmanager
async def raw_proxy(
    *args: str, stderr: Path, protocol: str, **env: str
) -> AsyncIterator[tuple[Send, Receive, asyncio.subprocess.Process]]:
    """The proxy spoken to line by line, once initialised on `protocol`:
    send(message), receive() -> the next line, and its process."""
    proxy = await start_proxy(*args, stderr=stderr, **env)
    assert proxy.stdin is not None and proxy.stdout is not None
    stdin, stdout = proxy.stdin, proxy.stdout

    async def send(message: Any) -> None:
        stdin.write(json.dumps(message).encode() + b"\n")
        await stdin.drain()

    async def receive() -> bytes:
        return await asyncio.wait_for(stdout.readline(), CALL_TIMEOUT)

    try:
        await send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": {"protocolVersion": protocol, "capabilities": {},
                               "clientInfo": {"name": "raw", "version": "1"}}})  # fmt: skip
        assert json.loads(await receive())["id"] == 1
        yield send, receive, proxy
    finally:
        await stop(proxy)


async def closed(proxy: asyncio.subprocess.Process) -> int:
    """Its exit status once its client closed stdin."""
    assert proxy.stdin is not None
    proxy.stdin.close()
    return await asyncio.wait_for(proxy.wait(), CALL_TIMEOUT)


def contents(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


async def wait_for_text(path: Path, text: str, within: float = CALL_TIMEOUT) -> str:
    """The file's contents once they hold `text` (a process's stderr, ...)."""
    deadline = time.monotonic() + within
    while text not in (found := await asyncio.to_thread(contents, path)):
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} never appeared in {path.name}:\n{found}")
        await asyncio.sleep(0.02)
    return found


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# -- 1. a loop through the SDK, stopped at the 4th call -------------------------


async def test_sdk_client_looping_is_warned_then_blocked_and_server_runs_three_times(
    tmp_path: Path,
) -> None:
    # Breaks if: the proxy forwards a blocked call (the count passes 3), answers
    # a block as anything but an isError CallToolResult with the guard's text,
    # drops or misplaces the warning block, or records a blocked step (the
    # message would then count up: "4 times", "5 times").
    counter = tmp_path / "count"
    async with stdio_session(proxied(counter=counter)) as client:
        results = await loop_on_search(client)
        made = await client.call_tool("calls_made", {})  # another tool: not blocked
    ok = [r for r in results if not r.is_error]
    assert [texts(r) for r in ok[:2]] == [["no results for tide tables"]] * 2
    assert texts(results[2])[0] == "no results for tide tables"
    assert len(results[2].content) == 2 and texts(results[2])[1].startswith(WARNED)
    assert len(ok) == 3
    for blocked in results[3:]:
        assert blocked.is_error
        assert len(blocked.content) == 1 and texts(blocked)[0].startswith(BLOCKED)
        assert "Do not call it again with these arguments" in texts(blocked)[0]
    assert count(counter) == 3
    assert not made.is_error and made.structured_content == {"result": 3}


async def test_a_warning_only_a_result_raises_comes_with_the_next_result(
    tmp_path: Path,
) -> None:
    # Breaks if a warning raised by recording a result (no_progress here) is
    # lost, added to a result it was not raised for before its turn, or added
    # more than once. A result is recorded after its answer is relayed, so
    # the warning rides on the next result, a failure too: a model whose
    # calls fail needs it most.
    async with stdio_session(proxied(counter=tmp_path / "count")) as client:
        waits = [await client.call_tool("wait", {"seconds": s}) for s in (0, 0.001, 0.002)]
        failed = await client.call_tool("fail", {"reason": "disk full"})
        plain = await client.call_tool("search", {"query": "tide tables"})
    assert [texts(w) for w in waits] == [["waited"]] * 3
    assert failed.is_error and texts(failed)[1:] == [
        NOTE + "wait returned the same result 3 times in a row. Calling it again will not "
        "change it: act on the result or move on."
    ]
    assert texts(plain) == ["no results for tide tables"]


def call_line(rid: int, query: str) -> bytes:
    return json.dumps(search_call(rid, query)).encode() + b"\n"


def answer_line(rid: int, text: str) -> bytes:
    result = {"content": [{"type": "text", "text": text}], "isError": False}
    return json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}).encode() + b"\n"


def at_once(step: Awaitable[bytes | None]) -> bytes | None:
    """What a coroutine returns when it returns without waiting for anything."""
    coroutine: Any = step
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coroutine.close()
    raise AssertionError("it waited before it answered")


async def test_an_answer_no_warning_waits_for_is_relayed_before_it_is_read() -> None:
    # Breaks if the proxy reads an answer (the SDK's types, the result's
    # text) before relaying it while nothing can be added to it, so that the
    # agent waits for that work; if an answer relayed unread is never
    # recorded, or recorded after the next step is judged; or if an answer a
    # warning waits for is relayed without it. In process, on the transports'
    # own entry points (ToolCalls, the real guard on memory): what the SDK
    # sees of the same is the tests above.
    store = open_store("memory://")
    guard = Guard(GuardConfig(), engine_for(store))
    calls = ToolCalls(guard, "relayed", "default")
    try:
        for rid in (2, 3):
            request = parse(call_line(rid, "tide tables"))
            assert request is not None and await calls.from_client(request) is None
            assert at_once(calls.from_server_raw(answer_line(rid, "no results"))) is None
            assert (None, rid) in calls.pending  # relayed unread: read after
            # The next step waits for the record: judged on every result before it.
        third = parse(call_line(4, "tide tables"))
        assert third is not None and await calls.from_client(third) is None
        assert not calls.recording and list(calls.pending) == [(None, 4)]
        assert (
            calls.pending[None, 4].step is not None
            and calls.pending[None, 4].step.decision == "warn"
        )
        # An answer a warning waits for is read first and relayed with it.
        warned = await calls.from_server_raw(answer_line(4, "no results"))
        assert warned is not None
        note = [c["text"] for c in json.loads(warned)["result"]["content"]]
        assert note[0] == "no results" and note[1].startswith(WARNED), note
        await calls.settle()
        state = await guard.state("relayed")
        assert state["tools"]["search"]["same_result_streak"] == 3, state
        assert all("result" in c for c in state["recent_calls"]), state
    finally:
        await store.close()


async def test_calls_of_one_tool_answered_out_of_turn_each_get_their_own_result() -> None:
    # Breaks if a result is recorded without the arguments of the call it
    # answers: two jobs polled side by side by one client (A queued, the same
    # answer every time; B progressing), both calls forwarded before either
    # is answered, had A's answer taken for B's call and B's dropped, and the
    # wait blocked as a tool_cycle at the third turn.
    store = open_store("memory://")
    guard = Guard(GuardConfig(), engine_for(store))
    calls = ToolCalls(guard, "jobs", "default")
    try:
        for turn in range(1, 7):
            ids = {"A": 2 * turn, "B": 2 * turn + 1}
            for job, rid in ids.items():
                line = {"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                        "params": {"name": "job_status", "arguments": {"job": job}}}  # fmt: skip
                request = parse(json.dumps(line).encode())
                assert request is not None
                blocked = await calls.from_client(request)  # None: forwarded
                assert blocked is None, f"turn {turn}, job {job}: {blocked}"
            for job, rid in ids.items():  # (a tool_cycle warning may ride on them)
                await calls.from_server_raw(answer_line(rid, f"{job}: {7 * turn * (job == 'B')}%"))
        await calls.settle()
        state = await guard.state("jobs")
    finally:
        await store.close()
    results = [c["result"] for c in state["recent_calls"]]
    assert None not in results
    assert len(set(results[0::2])) == 1  # job A: the same answer every time
    assert len(set(results[1::2])) == 6  # job B: a new one every time


async def test_profile_from_config_sets_the_limits_exemptions_and_polls(tmp_path: Path) -> None:
    # Breaks if --profile or the -c file's guard profiles are not what the
    # proxy's guard runs: with the default profile the tight run would get 3
    # calls through (not 2) and the lenient one would be blocked at the 4th
    # search and the 4th wait(0) (neither exempt nor polling).
    config = write_config(tmp_path / "bb.yml")
    tight, lenient = tmp_path / "tight", tmp_path / "lenient"

    async def tight_run() -> list[CallToolResult]:
        params = proxied("-c", str(config), "--profile", "tight", counter=tight)
        async with stdio_session(params) as client:
            return await loop_on_search(client)

    async def lenient_run() -> tuple[list[CallToolResult], list[CallToolResult]]:
        params = proxied("-c", str(config), "--profile", "lenient", counter=lenient)
        async with stdio_session(params) as client:
            searches = await loop_on_search(client)
            polls = [await client.call_tool("wait", {"seconds": 0}) for _ in range(10)]
            return searches, polls

    tight_results, (searches, polls) = await asyncio.gather(tight_run(), lenient_run())
    # identical: {warn_at: 2, block_at: 2}: the 3rd identical call (the 2nd
    # repeat after the baseline result) is blocked, with no warning before it.
    assert [r.is_error for r in tight_results] == [False] * 2 + [True] * 8
    assert [len(r.content) for r in tight_results[:2]] == [1, 1]
    assert texts(tight_results[2])[0].startswith(
        NOTE + "You called search with the same arguments 2 times in a row"
    )
    assert count(tight) == 2
    # exempt_tools: [search]: never counted, never warned; all 10 ran.
    assert [texts(r) for r in searches] == [["no results for tide tables"]] * 10
    assert count(lenient) == 10
    # polling.tools: [wait]: an unchanged poll is waiting, not a loop.
    assert [(r.is_error, texts(r)) for r in polls] == [(False, ["waited"])] * 10


# -- 2. a published server, unchanged ------------------------------------------

TIME_EXCHANGE = [
    {"jsonrpc": "2.0", "id": 1, "method": "initialize",
     "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "raw-test", "version": "1"}}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
     "params": {"name": "convert_time",
                "arguments": {"source_timezone": "Europe/Paris", "time": "14:30",
                              "target_timezone": "Asia/Tokyo"}}},
]  # fmt: skip


async def raw_exchange(command: list[str], messages: list[dict[str, Any]]) -> list[bytes]:
    """Every line the server (or the proxy) writes until each request is answered."""
    process = await asyncio.create_subprocess_exec(
        *command, cwd=ROOT, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert process.stdin is not None and process.stdout is not None
    lines: list[bytes] = []
    try:
        for message in messages:
            process.stdin.write(json.dumps(message).encode() + b"\n")
            await process.stdin.drain()
            while "id" in message:
                line = await asyncio.wait_for(process.stdout.readline(), CALL_TIMEOUT)
                assert line, f"{command}: stdout closed; got {lines}"
                lines.append(line)
                if json.loads(line).get("id") == message["id"]:
                    break
        process.stdin.close()
        assert await asyncio.wait_for(process.wait(), CALL_TIMEOUT) == 0
    finally:
        await stop(process)
    return lines


async def test_mcp_server_time_answers_byte_for_byte_through_the_proxy() -> None:
    # Breaks if the proxy drops, adds, splits or alters a line, or the
    # convert_time result (a tool call it allows must pass untouched). The
    # server writes the compact JSON the SDK's models dump, so a relay that
    # re-serialised would pass here: lines the SDK would write otherwise are
    # relayed by the late-answer and lifecycle tests below (LATE_SERVER,
    # echo_proxy), which compare them byte for byte too.
    # Both run at once: convert_time uses today's date.
    alone, behind = await asyncio.gather(
        raw_exchange(TIME_SERVER, TIME_EXCHANGE),
        raw_exchange([*PROXY, "--", *TIME_SERVER], TIME_EXCHANGE),
    )
    assert len(alone) == 3
    assert b'"Asia/Tokyo"' in alone[2] and b'"isError":false' in alone[2]
    assert behind == alone


async def test_mcp_server_time_reads_the_same_through_the_sdk() -> None:
    # Breaks if the SDK reads different tools or results through the proxy.
    async def tools_and_result(params: Any) -> tuple[Any, Any]:
        async with stdio_session(params) as client:
            tools = await client.list_tools()
            result = await client.call_tool("convert_time", TIME_EXCHANGE[3]["params"]["arguments"])
            return tools.model_dump(), result.model_dump()

    alone, behind = await asyncio.gather(
        tools_and_result(direct()), tools_and_result(proxied(server=TIME_SERVER))
    )
    names = sorted(t["name"] for t in alone[0]["tools"])
    assert names == ["convert_time", "get_current_time"]
    assert not alone[1]["is_error"]
    assert behind == alone


# -- 3. server-initiated messages ------------------------------------------------


async def test_progress_and_log_messages_reach_the_client_in_order_then_the_result() -> None:
    # Breaks if the proxy holds back, reorders or drops a server-initiated
    # notification, or lets the result overtake them: the job pauses PAUSE s
    # after each step, so a relay that buffered a call's messages until its
    # answer would hand them over together with it.
    events: list[tuple[float, str, Any]] = []

    async def on_log(params: Any) -> None:
        events.append((time.monotonic(), "log", params.data))

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        events.append((time.monotonic(), "progress", (progress, total, message)))

    async with stdio_session(proxied(), logging_callback=on_log) as client:
        result = await client.call_tool(
            "slow_job", {"steps": 3, "pause": PAUSE}, progress_callback=on_progress
        )
        events.append((time.monotonic(), "result", texts(result)))
    progress = [e for _, kind, e in events if kind == "progress"]
    logs = [e for _, kind, e in events if kind == "log"]
    assert progress == [(i, 3, f"step {i}") for i in range(1, 4)]
    assert logs == [f"step {i} of 3" for i in range(1, 4)]
    assert events[-1][1:] == ("result", ["done"])  # after every notification
    first_log = next(at for at, kind, _ in events if kind == "log")
    assert events[-1][0] - events[0][0] > PAUSE  # step 1's progress: as it happened
    assert events[-1][0] - first_log > PAUSE


# -- 4. cancellation ----------------------------------------------------------------
#
# What "no guard state half-recorded" can honestly mean: the step of a
# cancelled call was taken when the call was forwarded (the server began to
# run it, and that cannot be undone), so the session keeps it: `steps` counts
# it and `recent_calls` holds it. Its result is never recorded, not even from
# an answer the server sends after the cancellation, and the proxy keeps
# nothing pending for it, so that no later answer is taken for its result.
# Later calls are guarded and their results recorded as before.


async def wait_for_steps(
    state: Callable[[str], Awaitable[Any]], session: str, n: int, results: bool = False
) -> Any:
    """The session once it has `n` steps (and, with `results`, the newest
    one's result: a result is recorded just after its answer is relayed)."""
    deadline = time.monotonic() + CALL_TIMEOUT
    while (
        (now := await state(session)) is None
        or now["steps"] < n
        or (results and now["recent_calls"][-1]["result"] is None)
    ):
        assert time.monotonic() < deadline, f"session {session}: {now}"
        await asyncio.sleep(0.02)
    return now


async def test_a_call_cancelled_by_the_sdk_keeps_its_step_and_gets_no_result(
    tmp_path: Path, redis_url: str, session_name: str, guard_state: Any
) -> None:
    # Breaks if the proxy does not relay the SDK's notifications/cancelled (the
    # server would not stop the call: no CANCELLED_FILE), records a result for
    # the cancelled call, or stops guarding or recording after a cancellation.
    config = write_config(tmp_path / "bb.yml", redis_url)
    cancelled_file = tmp_path / "cancelled"
    params = proxied(
        "-c", str(config), "--session", session_name, CANCELLED_FILE=str(cancelled_file)
    )
    async with stdio_session(params) as client:
        call = asyncio.create_task(client.call_tool("wait", {"seconds": 5}))
        before = await wait_for_steps(guard_state, session_name, 1)  # forwarded
        call.cancel()  # the SDK sends notifications/cancelled for it
        with contextlib.suppress(asyncio.CancelledError):
            await call
        search = await client.call_tool("search", {"query": "tide tables"})
        again = await client.call_tool("wait", {"seconds": 0.01})
        after = await wait_for_steps(guard_state, session_name, 3, results=True)
        # The server heard of it and stopped the call (well before its 5 s).
        assert await wait_for_text(cancelled_file, "wait(5) cancelled", within=3)
    assert [(c["tool"], c["result"]) for c in before["recent_calls"]] == [("wait", None)]
    assert texts(search) == ["no results for tide tables"] and texts(again) == ["waited"]
    assert after["steps"] == 3 and after["blocked"] == 0
    cancelled, searched, waited = after["recent_calls"]
    assert cancelled == before["recent_calls"][0]  # its step, still without a result
    assert searched["tool"] == "search" and searched["result"] is not None
    assert waited["tool"] == "wait" and waited["result"] is not None


async def test_an_answer_sent_after_the_cancellation_is_relayed_but_not_recorded(
    tmp_path: Path, redis_url: str, session_name: str, guard_state: Any
) -> None:
    # Breaks if the proxy keeps the cancelled call pending (the late answer
    # would become its result: `result` not None), or swallows or rewrites the
    # late answer instead of relaying it.
    config = write_config(tmp_path / "bb.yml", redis_url)
    async with raw_proxy(
        "-c", str(config), "--session", session_name, "--", PY, "-c", LATE_SERVER,
        stderr=tmp_path / "stderr", protocol="2025-06-18",
    ) as (send, receive, proxy):  # fmt: skip
        await send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        await send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                    "params": {"name": "hold", "arguments": {"seconds": 5}}})  # fmt: skip
        # The proxy handles the client's lines in order: the step is taken
        # (and the call forwarded) before it reads the cancellation.
        await send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                    "params": {"requestId": 2, "reason": "the user pressed stop"}})  # fmt: skip
        late = await receive()
        # The late answer's fate in the guard is settled before it is written.
        held = await guard_state(session_name)
        await send({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                    "params": {"name": "lookup", "arguments": {"key": "k"}}})  # fmt: skip
        answered = await receive()
        after = await wait_for_steps(guard_state, session_name, 2, results=True)
        assert await closed(proxy) == 0
    late_line = {"jsonrpc": "2.0", "id": 2,
                 "result": {"content": [{"type": "text", "text": "late answer"}]}}  # fmt: skip
    assert late == json.dumps(late_line).encode() + b"\n"  # relayed as it came
    assert held["steps"] == 1
    assert [(c["tool"], c["result"]) for c in held["recent_calls"]] == [("hold", None)]
    assert held["tools"]["hold"]["same_result_streak"] == 0  # no result seen at all
    # The control: an answer to a call that was not cancelled is recorded.
    answer_line = {"jsonrpc": "2.0", "id": 3,
                   "result": {"content": [{"type": "text", "text": "answer 3"}]}}  # fmt: skip
    assert answered == json.dumps(answer_line).encode() + b"\n"
    assert after["steps"] == 2
    hold, lookup = after["recent_calls"]
    assert hold == held["recent_calls"][0]
    assert lookup["tool"] == "lookup" and lookup["result"] is not None


# -- 5. the process --------------------------------------------------------------


async def test_child_stderr_and_exit_status_are_the_proxys(tmp_path: Path) -> None:
    # Breaks if the proxy swallows or redirects the child's stderr, or exits
    # with another status than the child's (while its own stdin is still open).
    child = "import sys; sys.stderr.write('child: giving up\\n'); sys.exit(3)"
    proxy = await start_proxy("--", PY, "-c", child, stderr=tmp_path / "stderr")
    try:
        assert await asyncio.wait_for(proxy.wait(), CALL_TIMEOUT) == 3
    finally:
        await stop(proxy)
    assert "child: giving up\n" in (tmp_path / "stderr").read_text()


async def echo_proxy(tmp_path: Path) -> tuple[asyncio.subprocess.Process, int]:
    """The proxy in front of ECHO_CHILD, once a line has gone there and back
    (so the relay, and its signal handlers, are running); and the child's pid."""
    stderr = tmp_path / "stderr"
    proxy = await start_proxy("--", PY, "-c", ECHO_CHILD, stderr=stderr)
    assert proxy.stdin is not None and proxy.stdout is not None
    # Not as the SDK would write it (key order, spaces, a non-ASCII escape):
    # a relay that re-serialised it, either way, would change it.
    ping = b'{"method": "notifications/ping-test", "jsonrpc": "2.0", "params": {"w": "\\u00e9"}}\n'
    proxy.stdin.write(ping)
    await proxy.stdin.drain()
    assert await asyncio.wait_for(proxy.stdout.readline(), CALL_TIMEOUT) == ping
    found = await wait_for_text(stderr, "echo-child pid=")
    pid = int(found.split("echo-child pid=")[1].split()[0])
    assert not gone(pid)
    return proxy, pid


async def test_lines_nested_too_deep_to_read_pass_as_they_came(tmp_path: Path) -> None:
    # Breaks if a line the proxy cannot read (json recurses: 20,000 nested
    # arrays, as a batch or as one message) crashes the relay instead of
    # passing both ways untouched.
    proxy, _ = await echo_proxy(tmp_path)
    assert proxy.stdin is not None and proxy.stdout is not None
    try:
        for line in (b"[" * 20_000 + b"]" * 20_000 + b"\n",
                     b'{"a":' + b"[" * 20_000 + b"]" * 20_000 + b"}\n"):  # fmt: skip
            proxy.stdin.write(line)
            await proxy.stdin.drain()
            assert await asyncio.wait_for(proxy.stdout.readline(), CALL_TIMEOUT) == line
        assert await closed(proxy) == 0
    finally:
        await stop(proxy)
    assert "Traceback" not in contents(tmp_path / "stderr")


async def test_sigterm_stops_the_proxy_and_its_child(tmp_path: Path) -> None:
    # Breaks if SIGTERM kills the proxy without passing it on (its status would
    # be -15, and the child would be left running) or the proxy does not exit
    # with the child's status (128 + 15).
    proxy, child = await echo_proxy(tmp_path)
    try:
        proxy.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proxy.wait(), CALL_TIMEOUT) == 143
    finally:
        await stop(proxy)
    assert gone(child)


async def test_closing_stdin_ends_the_child_then_the_proxy(tmp_path: Path) -> None:
    # Breaks if the proxy does not close the child's stdin when its own closes
    # (it would wait, SIGTERM after 2 s: status 143, or hang), or does not end
    # with the child.
    proxy, child = await echo_proxy(tmp_path)
    assert proxy.stdin is not None
    started = time.monotonic()
    try:
        proxy.stdin.close()
        assert await asyncio.wait_for(proxy.wait(), CALL_TIMEOUT) == 0
    finally:
        await stop(proxy)
    assert time.monotonic() - started < 1.5  # the child left by itself, before any SIGTERM
    assert gone(child)


async def test_bad_command_lines_exit_2_with_a_message(tmp_path: Path) -> None:
    # Breaks if a usage error exits otherwise than 2, or its message does not
    # say what is wrong (the argument, or the command that cannot start).
    async def run(*args: str) -> tuple[int, str]:
        process = await asyncio.create_subprocess_exec(
            *PROXY, *args, cwd=ROOT, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), CALL_TIMEOUT)
        assert out == b""  # stdout is the protocol: never a word of the proxy's own
        return process.returncode or 0, err.decode()

    nothing, missing, session = await asyncio.gather(
        run(),
        run("--", str(tmp_path / "no-such-server")),
        run("--session", "two words", "--", *COUNTER),
    )
    assert nothing[0] == 2 and "-- CMD ARGS" in nothing[1] and "--upstream" in nothing[1]
    assert missing[0] == 2 and "cannot start" in missing[1] and "no-such-server" in missing[1]
    assert session[0] == 2 and "--session" in session[1]


def doc_blocks(lang: str) -> list[str]:
    """The fenced blocks of docs/mcp-proxy.md in `lang`, in order."""
    text = (ROOT / "docs" / "mcp-proxy.md").read_text(encoding="utf-8")
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, flags=re.M | re.S)


async def test_the_client_configuration_in_the_docs_starts_every_proxy(tmp_path: Path) -> None:
    # Breaks if the docs' client entries hold arguments the proxy refuses (a
    # profile no file of theirs defines, a flag it does not take): each entry
    # is started as written, with the docs' proxy file where it names one and
    # a line-echoing child in place of the real server (no network here).
    entries = next(json.loads(b)["mcpServers"] for b in doc_blocks("json") if "mcpServers" in b)
    config = tmp_path / "mcp.yml"
    config.write_text(next(b for b in doc_blocks("yaml") if "mcp_proxy:" in b))
    assert len(entries) >= 2
    for name, entry in entries.items():
        assert entry["command"] == "botbouncer", name
        args = entry["args"]
        assert args[0] == "mcp-proxy", name
        mine = [str(config) if a.endswith("/mcp.yml") else a for a in args[1 : args.index("--")]]
        err = tmp_path / f"{name}.err"
        proxy = await start_proxy(*mine, "--", PY, "-c", ECHO_CHILD, stderr=err)
        try:
            assert proxy.stdin is not None and proxy.stdout is not None
            line = b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
            proxy.stdin.write(line)
            await proxy.stdin.drain()
            got = await asyncio.wait_for(proxy.stdout.readline(), CALL_TIMEOUT)
            assert got == line, (name, contents(err))
            assert await closed(proxy) == 0, (name, contents(err))
        finally:
            await stop(proxy)
    # and what they say happens without the file
    alone = await start_proxy("--profile", "coding", "--", PY, "-c", ECHO_CHILD,
                              stderr=tmp_path / "alone.err")  # fmt: skip
    assert await asyncio.wait_for(alone.wait(), CALL_TIMEOUT) == 2
    assert "no profile named 'coding' (profiles: default)" in contents(tmp_path / "alone.err")


async def test_the_docs_proxy_file_lets_a_long_editor_session_run() -> None:
    # Breaks if the docs' proxy file (the one their client configuration
    # gives with -c) keeps the default step ceilings: its profile applies as
    # written, and an editor's 26th call of one tool was blocked.
    config = parse_config(next(b for b in doc_blocks("yaml") if "mcp_proxy:" in b), env={})
    assert config.mcp_proxy is not None
    guard = Guard(config.guard, engine_for(open_store("memory://")))
    calls = ToolCalls(guard, "editor", config.mcp_proxy.profile)
    for rid in range(60):
        message = parse(call_line(rid, f"where is function number {rid} defined"))
        assert message is not None
        assert await calls.from_client(message) is None, rid
        await calls.from_server_raw(answer_line(rid, f"in module {rid}"))
        await calls.settle()


# -- 6. one session across proxies --------------------------------------------------


def search_call(rid: int, query: str = "tide tables") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call",
            "params": {"name": "search", "arguments": {"query": query}}}  # fmt: skip


def batch_answers(line: bytes) -> dict[Any, Any]:
    """A batch the client received, by id: each result's isError and texts."""
    got = json.loads(line)
    assert isinstance(got, list), got
    return {
        m["id"]: (m["result"].get("isError", False), [c["text"] for c in m["result"]["content"]])
        for m in got
    }


async def test_a_batch_of_tool_calls_is_guarded_call_by_call_over_stdio(
    tmp_path: Path, redis_url: str, session_name: str, guard_state: Any
) -> None:
    # Breaks if a JSON-RPC batch passes the guard unread (the server would run
    # search three times), if the calls blocked in it reach the server or get
    # no answer, or if the results of the server's batch are not recorded.
    config = write_config(tmp_path / "bb.yml", redis_url)
    counter = tmp_path / "count"
    async with raw_proxy(
        "-c", str(config), "--profile", "tight", "--session", session_name,
        "--", PY, "-c", BATCH_SERVER, stderr=tmp_path / "stderr", protocol="2025-03-26",
        COUNTER_FILE=str(counter),
    ) as (send, receive, proxy):  # fmt: skip
        # identical: block_at 2: the first search runs, the two after it do not.
        await send([search_call(2), search_call(3), search_call(4)])
        blocked, answered = batch_answers(await receive()), batch_answers(await receive())
        state = await wait_for_steps(guard_state, session_name, 1, results=True)
        # Nothing to block: the server runs it, its answer comes as it was sent.
        await send([search_call(5, "moon"), {"jsonrpc": "2.0", "method": "notifications/x"}])
        unblocked = await receive()
        assert await closed(proxy) == 0
    moon = [{"jsonrpc": "2.0", "id": 5,
             "result": {"content": [{"type": "text", "text": "no results for moon"}]}}]  # fmt: skip
    assert unblocked == json.dumps(moon).encode() + b"\n"
    assert sorted(blocked) == [3, 4]
    for is_error, said in blocked.values():
        assert is_error and len(said) == 1 and said[0].startswith(NOTE + "You called search")
    assert answered == {2: (False, ["no results for tide tables"])}
    assert count(counter) == 2  # the first search, and the moon
    assert state["steps"] == 1 and state["blocked"] == 2
    assert state["recent_calls"][0]["result"] is not None  # from the server's batch


async def test_two_proxies_with_one_session_on_redis_block_together(
    tmp_path: Path, redis_url: str, session_name: str, guard_state: Any
) -> None:
    # Breaks if the proxies keep the session in their own memory (each would
    # allow 3 identical calls: the 4th call, B's second, would run) or ignore
    # --session (each connection would be a session of its own).
    config = write_config(tmp_path / "bb.yml", redis_url)
    counter = tmp_path / "count"
    params = proxied("-c", str(config), "--session", session_name, counter=counter)
    async with side_by_side(params, params) as (a, b):
        order = [a, b, a, b, a]
        results = [await c.call_tool("search", {"query": "tide tables"}) for c in order]
    assert [r.is_error for r in results] == [False, False, False, True, True]
    assert texts(results[2])[1].startswith(WARNED)
    assert texts(results[3])[0].startswith(BLOCKED)
    assert count(counter) == 3
    state = await guard_state(session_name)
    assert state["steps"] == 3 and state["blocked"] == 2


# -- 7. streamable HTTP ---------------------------------------------------------------


async def wait_for_port(port: int, process: asyncio.subprocess.Process, log: Path) -> None:
    deadline = time.monotonic() + CALL_TIMEOUT
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if process.returncode is not None or time.monotonic() > deadline:
                said = await asyncio.to_thread(log.read_text, errors="replace")
                raise AssertionError(f"nothing on port {port}:\n{said}") from None
            await asyncio.sleep(0.05)
            continue
        writer.close()
        await writer.wait_closed()
        return


@contextlib.asynccontextmanager
async def http_servers(tmp_path: Path, counter: Path) -> AsyncIterator[tuple[str, str]]:
    """The counter server over streamable HTTP and the proxy in front of it:
    (the server's URL, the proxy's URL)."""
    server_port, proxy_port = free_port(), free_port()
    server_log, proxy_log = tmp_path / "server.log", tmp_path / "proxy.log"
    with server_log.open("wb") as s_err, proxy_log.open("wb") as p_err:
        server = await asyncio.create_subprocess_exec(
            *COUNTER, "http", str(server_port), cwd=ROOT, stdin=asyncio.subprocess.DEVNULL,
            stdout=s_err, stderr=s_err, env={**os.environ, "COUNTER_FILE": str(counter)},
        )  # fmt: skip
        proxy = await asyncio.create_subprocess_exec(
            *PROXY, "--upstream", f"http://127.0.0.1:{server_port}/mcp",
            "--listen", f"127.0.0.1:{proxy_port}", cwd=ROOT,
            stdin=asyncio.subprocess.DEVNULL, stdout=p_err, stderr=p_err,
        )  # fmt: skip
    try:
        await wait_for_port(server_port, server, server_log)
        await wait_for_port(proxy_port, proxy, proxy_log)
        yield f"http://127.0.0.1:{server_port}/mcp", f"http://127.0.0.1:{proxy_port}/mcp"
        proxy.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proxy.wait(), CALL_TIMEOUT) == 0
    finally:
        await stop(proxy)
        await stop(server)


async def test_streamable_http_blocks_relays_progress_and_lists_the_same_tools(
    tmp_path: Path,
) -> None:
    # Breaks if the HTTP relay forwards a blocked call (count over 3), does not
    # add the warning to an SSE-borne result, drops the progress events of an
    # SSE stream or holds them back until the stream ends, alters tools/list,
    # or keys guard sessions on anything but the MCP session (the second
    # client's search would be blocked).
    counter = tmp_path / "count"
    progress: list[tuple[float, float | None, str | None]] = []
    arrived: list[float] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total, message))
        arrived.append(time.monotonic())

    async with http_servers(tmp_path, counter) as (server_url, proxy_url):
        async with http_session(proxy_url) as client:
            job = await client.call_tool(
                "slow_job", {"steps": 3, "pause": PAUSE}, progress_callback=on_progress
            )
            answered = time.monotonic()
            results = await loop_on_search(client, 6)  # the session's last calls
            behind = (await client.list_tools()).model_dump()
        async with http_session(server_url) as client:
            alone = (await client.list_tools()).model_dump()
        ran_first = count(counter)
        # Another MCP session, its own guard session: its first search is not
        # the 7th of a run (one guard session for all would block it).
        async with http_session(proxy_url) as other:
            fresh = await other.call_tool("search", {"query": "tide tables"})
    assert [r.is_error for r in results] == [False] * 3 + [True] * 3
    assert texts(results[2])[1].startswith(WARNED)
    assert all(texts(r)[0].startswith(BLOCKED) for r in results[3:])
    assert ran_first == 3
    assert texts(job) == ["done"]
    assert progress == [(i, 3, f"step {i}") for i in range(1, 4)]
    assert answered - arrived[0] > PAUSE  # event by event, not the stream at its end
    assert behind == alone and len(alone["tools"]) == 7
    assert not fresh.is_error and count(counter) == 4


STUBBORN_CHILD = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print(f'stubborn pid={os.getpid()}', file=sys.stderr, flush=True)\n"
    "time.sleep(60)\n"
)


async def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    # Breaks if the proxy waits for ever on a child that ignores SIGTERM (it
    # would then only die by SIGKILL itself, leaving the child behind).
    stderr = tmp_path / "stderr"
    proxy = await start_proxy("--", PY, "-c", STUBBORN_CHILD, stderr=stderr)
    try:
        found = await wait_for_text(stderr, "stubborn pid=")
        child = int(found.split("stubborn pid=")[1].split()[0])
        await asyncio.sleep(0.3)  # the proxy's signal handlers are in place
        proxy.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proxy.wait(), CALL_TIMEOUT) == 128 + 9
    finally:
        await stop(proxy)
    assert gone(child)
    assert "sending SIGKILL" in contents(stderr)


async def test_without_a_config_a_long_session_is_not_stopped_by_the_step_ceilings(
    tmp_path: Path,
) -> None:
    # Breaks if the built-in profile keeps its ceilings (25 calls of one tool,
    # 50 steps): an editor keeps its proxy, one session, for days.
    async with stdio_session(proxied(counter=tmp_path / "count")) as client:
        results = [await client.call_tool("search", {"query": f"q{i}"}) for i in range(60)]
    assert not any(r.is_error for r in results)
    assert count(tmp_path / "count") == 60


@pytest.mark.parametrize("answers_as", ["json", "sse"])
async def test_a_batch_of_tool_calls_is_guarded_call_by_call_over_http(
    tmp_path: Path, answers_as: str
) -> None:
    # Breaks if a batch POSTed to the HTTP relay passes the guard unread, if a
    # call blocked in it reaches the server, or if its answer is missing from
    # the response: merged into the server's JSON batch (or sent as an SSE
    # event of its own), in place of the server's empty 202 when only a
    # notification was forwarded, the whole response when nothing was.
    from aiohttp import ClientSession as HttpClient
    from aiohttp import web

    ran: list[int] = []

    async def mcp_endpoint(request: web.Request) -> web.StreamResponse:
        got = await request.json()
        requests = [m for m in got if "id" in m]
        ran.extend(m["id"] for m in requests)
        if not requests:
            return web.Response(status=202)
        answers = [{"jsonrpc": "2.0", "id": m["id"], "result": {"content": [
            {"type": "text", "text": "no results for " + m["params"]["arguments"]["query"]}]}}
            for m in requests]  # fmt: skip
        if answers_as == "json":
            return web.json_response(answers)
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(b"event: message\ndata: " + json.dumps(answers).encode() + b"\n\n")
        return out

    app = web.Application()
    app.router.add_post("/mcp", mcp_endpoint)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", free_port())
    await site.start()
    upstream = f"http://127.0.0.1:{runner.addresses[0][1]}/mcp"
    proxy_port, log = free_port(), tmp_path / "proxy.log"
    config = write_config(tmp_path / "bb.yml")
    with log.open("wb") as err:
        proxy = await asyncio.create_subprocess_exec(
            *PROXY, "-c", str(config), "--profile", "tight", "--upstream", upstream,
            "--listen", f"127.0.0.1:{proxy_port}", cwd=ROOT,
            stdin=asyncio.subprocess.DEVNULL, stdout=err, stderr=err,
        )  # fmt: skip
    notification = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    responses: list[dict[Any, Any]] = []
    try:
        await wait_for_port(proxy_port, proxy, log)
        async with HttpClient() as http:
            for batch in ([search_call(2), search_call(3)], [search_call(4)],
                          [search_call(5), notification], [search_call(6)]):  # fmt: skip
                async with http.post(f"http://127.0.0.1:{proxy_port}/mcp", json=batch) as r:
                    assert r.status == 200, await r.text()
                    raw = await r.read()
                    if r.content_type == "text/event-stream":
                        events = [e for e in raw.split(b"\n\n") if e.strip()]
                        lines = [e.split(b"data: ", 1)[1] for e in events]
                        responses.append(
                            {k: v for ln in lines for k, v in batch_answers(ln).items()}
                        )
                    else:
                        responses.append(batch_answers(raw))
        proxy.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proxy.wait(), CALL_TIMEOUT) == 0
    finally:
        await stop(proxy)
        await runner.cleanup()
    # identical: block_at 2. The 3rd call repeats the 2nd before any result;
    # the 2nd's result is the baseline, so the 4th runs; the 4th's result is
    # unchanged, so the 5th and 6th repeat it and are blocked.
    first, second, with_notification, alone = responses
    searched = (False, ["no results for tide tables"])
    assert first[2] == searched and second == {4: searched}
    for blocked in (first[3], with_notification[5], alone[6]):
        assert blocked[0] and blocked[1][0].startswith(NOTE + "You called search")
    assert set(with_notification) == {5} and set(alone) == {6}
    assert ran == [2, 4]  # the server never saw a blocked call


# -- 8. Redis lost under a proxy ------------------------------------------------------


@pytest.mark.parametrize("outage", ["killed", "frozen"])
async def test_a_proxy_whose_redis_is_lost_goes_on_guarding_from_memory(
    tmp_path: Path, outage: str
) -> None:
    # Breaks if a lost Redis ends the relay, stalls every call on the store's
    # timeout, or lets a loop through unguarded while it is away: the calls
    # are answered at once (a frozen Redis costs one timeout), and the loop is
    # still warned at its 3rd call and blocked at its 4th, by the proxy's own
    # memory, with the server running it 3 times.
    redis = RedisServer().start()
    try:
        config = tmp_path / "bb.yml"
        config.write_text(
            f"store: {{url: {json.dumps(redis.url)}, timeout_seconds: 0.5}}\nmcp_proxy: {{}}\n"
        )
        counter = tmp_path / "count"
        async with stdio_session(proxied("-c", str(config), counter=counter)) as client:
            first = await client.call_tool("search", {"query": "before"})
            assert not first.is_error  # on Redis
            assert redis.proc is not None
            if outage == "killed":
                redis.kill()
            else:
                redis.proc.send_signal(signal.SIGSTOP)
            took = []
            results = []
            for _ in range(5):
                started = time.monotonic()
                results.append(await client.call_tool("search", {"query": "tide tables"}))
                took.append(time.monotonic() - started)
    finally:
        if redis.proc is not None and redis.proc.poll() is None:
            redis.proc.send_signal(signal.SIGCONT)
        redis.stop()
    assert [r.is_error for r in results] == [False, False, False, True, True]
    assert texts(results[2])[1].startswith(WARNED)
    assert texts(results[3])[0].startswith(BLOCKED)
    assert count(counter) == 4  # "before" and the loop's first three
    # killed: refused at once; frozen: the first call waits out one timeout
    # (its step, and its result's record behind it), the rest go local at once
    assert max(took[1:]) < 0.5, took
    assert took[0] < (0.5 if outage == "killed" else 1.5), took
