"""The guard's Python clients against a real guard server: the sync client
(stdlib HTTP, so the server runs on its own thread and loop) and the async
one, their tool decorators, failing open, and errors that name the problem."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gateway.config import parse_config
from gateway.guard import client as client_module
from gateway.guard.client import (
    AsyncGuardClient,
    GuardBlocked,
    GuardClient,
    GuardError,
)
from gateway.guard.engine import MemoryEngine
from gateway.guard.service import Guard
from gateway.http import HttpServer
from gateway.store import MemoryStore
from tests.redis_server import free_port

CONFIG = """
guard: {profiles: {default: {}, strict: {identical: {warn_at: 1, block_at: 2}}}}
bots: [{name: a, platform: http, backend: {type: echo}}]
"""


def app() -> web.Application:
    guard = Guard(parse_config(CONFIG).guard, MemoryEngine())
    return HttpServer(MemoryStore(), guard=guard).app


@pytest.fixture
def threaded_url() -> Iterator[str]:
    """A guard server on its own thread and event loop (the sync client blocks)."""
    loop = asyncio.new_event_loop()
    port = free_port()
    runner = web.AppRunner(app())
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    yield f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


@pytest.fixture
async def async_url() -> AsyncIterator[str]:
    runner = web.AppRunner(app())
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


def test_the_sync_decorator_blocks_a_repeated_call_before_it_runs(threaded_url: str) -> None:
    guard = GuardClient(threaded_url, session="sync-1")
    ran: list[str] = []

    @guard.tool()
    def search(query: str, page: int = 1) -> list[str]:
        ran.append(query)
        return []

    # the decorator reports results: the first is the baseline, the same call
    # after the same result warns at the 3rd call and is blocked at the 4th
    for _ in range(3):
        search("tides")
    with pytest.raises(GuardBlocked) as err:
        search("tides")
    assert err.value.answer.reason == "identical_call"
    assert "search" in str(err.value)
    assert ran == ["tides"] * 3  # the blocked call never ran
    state = guard.state()
    assert state is not None and state["steps"] == 3
    guard.reset()
    assert guard.state() is None


def test_the_sync_client_calls_the_daemon_directly_whatever_proxy_is_named(
    threaded_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Breaks if GuardClient follows HTTP_PROXY as plain urllib does: with a
    # proxy named for the agent's other calls, its calls to the daemon went
    # there, failed, and every step was let through (the client fails open).
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")  # nobody there
    guard = GuardClient(threaded_url, session="sync-proxy")
    answers = [guard.step("search", {"q": "tides"}) for _ in range(3)]
    assert [a.decision for a in answers] == ["allow", "warn", "block"]


def test_polling_through_the_sync_decorator_is_never_blocked(threaded_url: str) -> None:
    guard = GuardClient(threaded_url, session="sync-2")
    progress = iter(range(0, 101, 10))

    @guard.tool("job_status")
    def status(job: str) -> dict[str, int]:
        return {"done": next(progress)}

    assert [status("j-1")["done"] for _ in range(11)][-1] == 100


def test_a_failing_tool_is_reported_and_then_blocked(threaded_url: str) -> None:
    guard = GuardClient(threaded_url, session="sync-3")

    @guard.tool()
    def deploy(attempt: int) -> None:
        raise RuntimeError(f"boom {attempt}")

    for i in range(5):
        with pytest.raises(RuntimeError):
            deploy(i)
    with pytest.raises(GuardBlocked) as err:
        deploy(99)
    assert (err.value.answer.reason, err.value.answer.evidence["failures"]) == (
        "failure_streak", 5)  # fmt: skip


def test_sync_calls_for_every_endpoint(threaded_url: str) -> None:
    guard = GuardClient(threaded_url, session="sync-4", profile="strict")
    assert guard.step("x", {"a": 1}).decision == "warn"  # strict: warn at the first
    assert guard.result("x", True, {"r": 1}).decision == "allow"
    assert guard.retry("task", "input").decision == "allow"
    assert guard.handoff("a", "b").decision == "allow"
    assert guard.kb_query("what is x?", 0.5).decision == "allow"
    spent = guard.usage(0.5, 10, budget_usd=1.0)
    assert spent.budget["usd_remaining"] == 0.5
    with pytest.raises(GuardError, match="runs under profile 'strict'"):
        GuardClient(threaded_url, session="sync-4").step("y")
    with pytest.raises(GuardError, match="tool: must not be empty"):
        guard.step("")


def test_an_unreachable_guard_fails_open_unless_told_not_to() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    answer = GuardClient(url, session="s", timeout=2).step("x")
    assert (answer.decision, answer.reachable) == ("allow", False)
    with pytest.raises(GuardError, match="unreachable"):
        GuardClient(url, session="s", timeout=2, fail_open=False).step("x")


def test_decorators_refuse_the_wrong_kind_of_function() -> None:
    with pytest.raises(TypeError, match="use AsyncGuardClient"):

        @GuardClient().tool()
        async def a() -> None: ...

    with pytest.raises(TypeError, match="use GuardClient"):

        @AsyncGuardClient().tool()  # type: ignore[arg-type]
        def b() -> None: ...


async def test_the_async_decorator_and_calls(async_url: str) -> None:
    async with AsyncGuardClient(async_url, session="async-1") as guard:
        ran: list[Any] = []

        @guard.tool("fetch")
        async def fetch(url: str) -> str:
            ran.append(url)
            return "same page"

        for _ in range(3):
            await fetch("https://example.invalid/a")
        with pytest.raises(GuardBlocked) as err:
            await fetch("https://example.invalid/a")
        assert err.value.answer.blocked and len(ran) == 3
        assert (await guard.handoff("triage", "billing")).decision == "allow"
        assert (await guard.kb_query("refund policy")).decision == "allow"
        assert (await guard.usage(tokens=5)).budget["tokens_spent"] == 5
        assert (await guard.retry("t")).decision == "allow"
        state = await guard.state()
        assert state is not None and state["steps"] == 3
        await guard.reset()
        assert await guard.state() is None
    unreachable = AsyncGuardClient(f"http://127.0.0.1:{free_port()}", session="s", timeout=2)
    async with unreachable:
        assert (await unreachable.step("x")).reachable is False


async def test_calls_of_one_tool_run_side_by_side_are_each_answered_as_their_own(
    async_url: str,
) -> None:
    # Breaks if the decorator reports a result without the call's arguments:
    # two jobs polled with asyncio.gather (A queued, the same answer every
    # time; B progressing, and slower), A's answer was taken for the other
    # call and the wait blocked as a tool_cycle at the third turn.
    async with AsyncGuardClient(async_url, session="gather-1") as guard:
        progress = iter(range(7, 100, 7))

        @guard.tool()
        async def job_status(job: str) -> dict[str, Any]:
            if job == "A":
                return {"job": "A", "progress": 0}
            await asyncio.sleep(0.03)  # B answers after A
            return {"job": "B", "progress": next(progress)}

        for _ in range(6):
            await asyncio.gather(job_status("A"), job_status("B"))  # raises when blocked
        state = await guard.state()
    assert state is not None and state["steps"] == 12
    results = {c["result"] for c in state["recent_calls"]}
    assert None not in results and len(results) == 7  # A's one answer and B's six


async def test_a_result_too_large_with_its_arguments_is_sent_without_them(
    async_url: str,
) -> None:
    # Breaks if a result names its call whatever its size: a tool whose
    # arguments and output each fit the guard's 8 MiB, but not together,
    # lost its result (a 413, raised with fail_open=False after the tool ran).
    async with AsyncGuardClient(async_url, session="big", fail_open=False, timeout=30) as guard:
        sent: list[tuple[str, dict[str, Any]]] = []
        check = guard._check

        async def spy(op: str, body: dict[str, Any]) -> Any:
            sent.append((op, body))
            return await check(op, body)

        guard._check = spy  # type: ignore[method-assign]

        @guard.tool()
        async def translate(text: str) -> str:
            return text.upper()

        assert len(await translate("a" * 4_500_000)) == 4_500_000  # 4.5 MB in, 4.5 MB out
        assert await translate("b") == "B"
        state = await guard.state()
    results = [body for op, body in sent if op == "result"]
    assert ["args" in r for r in results] == [True, False, True]  # the large one sent again
    assert state is not None and None not in {c["result"] for c in state["recent_calls"]}


async def test_a_call_begun_while_the_result_before_it_is_on_its_way_gets_its_own(
    async_url: str,
) -> None:
    # Breaks if a result is sent without its call's arguments while another
    # call of its tool may step before it reaches the guard: the result went
    # to that newer call, and the newer call's own result to nothing.
    async with AsyncGuardClient(async_url, session="late", fail_open=False, timeout=30) as guard:
        may_start = asyncio.Event()
        send = guard.result

        async def late(tool: str, ok: bool = True, output: Any = None, args: Any = None) -> Any:
            if output == "summary of A":
                may_start.set()  # the next call begins now...
                await asyncio.sleep(0.3)  # ...while this result is on its way
            return await send(tool, ok, output, args)

        guard.result = late  # type: ignore[method-assign]

        @guard.tool()
        async def summarize(text: str) -> str:
            await asyncio.sleep(0.05 if text[0] == "A" else 0.5)
            return f"summary of {text[0]}"

        async def second() -> str:
            await may_start.wait()
            return await summarize("B" * 100_000)

        await asyncio.gather(summarize("A" * 100_000), second())
        state = await guard.state()
    assert state is not None
    assert len({c["result"] for c in state["recent_calls"]} - {None}) == 2


def test_what_json_cannot_hold_never_stops_a_tool(threaded_url: str) -> None:
    # Breaks if the decorator raises on arguments or outputs json cannot
    # write (a tuple key, a value that holds itself, a 5,000-digit integer):
    # the tool never ran, or its caller lost what it returned after it ran.
    guard = GuardClient(threaded_url, session="odd-values")
    looped: list[Any] = []
    looped.append(looped)

    @guard.tool()
    def grid(cells: dict[Any, str], odd: Any) -> dict[tuple[int, int], int]:
        return {(0, 0): len(cells)}

    assert grid({(0, 0): "red", (0, 1): "blue"}, looped) == {(0, 0): 2}
    assert grid({}, 10**5000) == {(0, 0): 0}
    state = guard.state()
    assert state is not None and state["steps"] == 2


async def test_two_clients_of_one_session_each_get_their_own_results(async_url: str) -> None:
    # Breaks if a result names its call only when this client saw another
    # call of its tool at the same time: one client per worker, one session,
    # had A's result given to B's call and B's dropped.
    one = AsyncGuardClient(async_url, session="workers", fail_open=False)
    two = AsyncGuardClient(async_url, session="workers", fail_open=False)
    async with one, two:

        async def fetch(url: str) -> str:
            await asyncio.sleep(0.05 if url == "A" else 0.2)
            return f"page {url}"

        await asyncio.gather(one.tool("fetch")(fetch)("A"), two.tool("fetch")(fetch)("B"))
        state = await one.state()
    assert state is not None
    assert len({c["result"] for c in state["recent_calls"]} - {None}) == 2


class RaisingStr:
    def __str__(self) -> str:
        raise RuntimeError("no str for me")


def test_what_the_guard_cannot_read_never_costs_a_tools_answer(threaded_url: str) -> None:
    # Breaks if a value whose __str__ raises, an output nested deeper than
    # the guard reads (a parse tree), or a NaN makes the decorator raise: the
    # tool never ran, or ran and its caller lost what it returned.
    guard = GuardClient(threaded_url, session="unreadable")
    deep: Any = "leaf"
    for _ in range(70):
        deep = [deep]

    @guard.tool()
    def tool(given: Any, out: Any) -> Any:
        return out

    for given, out in ((RaisingStr(), "ok"), ("x", deep), ("y", float("nan"))):
        assert tool(given, out) is out
    odd = RaisingStr()
    assert tool("z", odd) is odd
    state = guard.state()
    assert state is not None and state["steps"] == 4


@pytest.mark.timeout(20)
def test_values_that_hold_themselves_are_written_at_once() -> None:
    # Breaks if a value that holds itself is walked to a fixed depth without
    # noting where it has been: holding itself twice, or a tree whose
    # children point to their parent, took hours.
    twice: list[Any] = []
    twice += [twice, twice]
    root: dict[str, Any] = {"name": "root", "children": []}
    root["children"] += [{"name": f"c{i}", "parent": root} for i in range(10)]
    assert client_module._jsonable(twice) == ["...", "..."]
    written = client_module._jsonable({"node": root})
    assert [c["parent"] for c in written["node"]["children"]] == ["..."] * 10


def test_values_json_cannot_write_keep_what_tells_them_apart(threaded_url: str) -> None:
    # Breaks if a key is walked as if it sat deep (segments keyed by pairs
    # of points all became one key, and three different calls one identical
    # call, blocked), if a value nested too deep loses its wide siblings, or
    # if one unwritable item costs the rest of a long list.
    segments = {((0, 0), (1, 1)): 5, ((2, 2), (3, 3)): 7}
    assert len(client_module._jsonable(segments)) == 2
    guard = GuardClient(threaded_url, session="segments", profile="strict")  # blocks the 2nd

    @guard.tool()
    def route(costs: dict[Any, int]) -> str:
        return "ok"

    for trip in ((("paris", "lyon"), ("rome", "milan")), (("oslo", "bergen"), ("lima", "cusco"))):
        assert route({trip: 1}) == "ok"
    deep: Any = "leaf"
    for _ in range(60):
        deep = [deep]
    doc = {"rows": list(range(150_000)), "tree": deep}
    assert client_module._jsonable(doc)["rows"] == doc["rows"]
    rows: list[Any] = [*range(150_000), {(1, 2): 3}]
    assert client_module._jsonable(rows)[:150_000] == rows[:150_000]


def test_a_value_written_by_hand_is_what_json_writes_but_for_what_it_cuts() -> None:
    # Breaks if the hand-written JSON (a tuple key, or a deep sibling, sends
    # the whole value there) differs from json's where nothing needs
    # cutting: the leaves of the 48th level, an integer of 5,000 bits (and
    # two such keys then one), a set. The same arguments then had another
    # signature for an unrelated reason.
    def nest(levels: int, leaf: Any) -> Any:
        for _ in range(levels):
            leaf = [leaf]
        return leaf

    def plain(value: Any) -> Any:
        return json.loads(json.dumps(value, default=str))

    ok = {
        "ok": nest(47, 7),
        "big": 2**5000,
        "set": {1, 2},
        "keys": {2**5000: "a", 2**5000 + 1: "b"},
    }
    for beside in ({"deep": nest(60, 0)}, {"odd": {(1,): "c"}}):
        written = client_module._jsonable({**ok, **beside})
        assert {k: written[k] for k in ok} == plain(ok), beside


async def test_a_guard_older_than_named_results_takes_them_unnamed() -> None:
    # Breaks if a result a 0.1.0 guard refuses for its `args` (400 "args:
    # unknown field") is not sent again without them: a client copied into
    # an agent beside an older daemon lost every tool's output to a
    # GuardError after the tool ran.
    bodies: list[dict[str, Any]] = []

    async def old_guard(request: web.Request) -> web.Response:
        body = await request.json()
        bodies.append(body)
        if request.match_info["op"] == "result" and "args" in body:
            return web.json_response({"error": "args: unknown field"}, status=400)
        return web.json_response({"session": "old", "decision": "allow", "reason": "ok",
                                  "message": "Go ahead.", "evidence": {}, "also": [],
                                  "budget": {}, "steps": {"used": 1, "max": 50}})  # fmt: skip

    app = web.Application()
    app.router.add_post("/v1/guard/{session}/{op}", old_guard)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with AsyncGuardClient(f"http://127.0.0.1:{port}", session="old",
                                    fail_open=False) as guard:  # fmt: skip

            @guard.tool()
            async def search(q: str) -> str:
                return f"found {q}"

            assert await search("tides") == "found tides"
    finally:
        await runner.cleanup()
    assert ["args" in b for b in bodies] == [True, True, False]  # step, result, result again


def test_the_client_file_alone_runs_on_a_bare_python(threaded_url: str, tmp_path: Path) -> None:
    """gateway/guard/client.py copied alone next to an agent, run by a Python
    with no site packages at all (-S -E -s: no aiohttp, no botbouncer): the sync
    client imports, and blocks the fourth identical call."""
    shutil.copy(Path(client_module.__file__), tmp_path / "guard_client.py")
    agent = (
        "from guard_client import GuardBlocked, GuardClient\n"
        f"guard = GuardClient({threaded_url!r}, session='bare-1')\n"
        "@guard.tool()\n"
        "def search(q):\n"
        "    return [q]\n"
        "for _ in range(3):\n"
        "    search('tides')\n"
        "try:\n"
        "    search('tides')\n"
        "except GuardBlocked as exc:\n"
        "    print('blocked', exc.answer.reason)\n"
        "import sys\n"
        "print('aiohttp' in sys.modules)\n"
    )
    (tmp_path / "agent.py").write_text(agent)
    res = subprocess.run([sys.executable, "-S", "-E", "-s", "agent.py"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["blocked", "identical_call", "False"]
