"""The latency `botbouncer mcp-proxy` adds to one tool call over stdio, as an
MCP client sees it: the official SDK's client (`stdio_client` +
`ClientSession`, what users' clients run) calling a trivial tool
(tests/mcp_servers/counter.py's `echo`) on

- direct: the server itself, `python -m tests.mcp_servers.counter`;
- memory: the same server behind `python -m gateway mcp-proxy -c <file> --
  python -m tests.mcp_servers.counter`, the guard on the memory store (the
  proxy's default);
- redis: the same on a Redis store (a private redis-server when the binary is
  there, else REDIS_URL, default db 14, the session's key deleted after).

Every call is one the guard lets through unchanged: each has arguments of its
own (`echo(text="<contestant>-<n>")`), and the profile is the default one with
only its step ceilings raised (50 steps, 25 per tool, would block a long run):
every detector runs on every call, none is exempted. Each answer is checked
(not `isError`, exactly the text sent, no warning added), and at the end the
same call is repeated on each session until the guard blocks it, to show the
guard was on all along.

All sessions are started and initialised before anything is timed, then
WARMUP calls each. A round is CALLS sequential calls per contestant, in
chunks of CHUNK that alternate the contestants, so a slow spell of the
machine touches all of them: one pass of chunks goes forward, the next back,
and every other pass starts one contestant further on (`turn`), so each runs
in every place of a pass as often as the others. (Forward and back alone
kept the same contestants in the middle, where they measured 0.05-0.10 of a
direct call faster than at the ends.) This process's garbage collector runs
between passes, not in them. Per round: p50
and p99 per contestant and their ratios to direct; then the CPU each process
spent per call (from /proc/<pid>/task/*/schedstat: this client, the server,
the proxy, a private Redis). The verdict is the median over rounds of the p50
ratio memory/direct (target <= 1.2).

BENCH_FLOORS=1 adds contestants that split the proxy's cost: the proxy's
own stdio relay (gateway/mcpproxy/stdio.py, run by this file with
`--relay`) passing every line untouched without parsing it (`relay`), and
the same reading every line with the SDK's types as the proxy does (a call
before it is forwarded, an answer after it is relayed), still without the
guard (`parse`); `botbouncer mcp-proxy` itself (run by this file
with `--proxy`) with every guard check answered allow for free (`noguard`),
and with only the steps answered so, the results checked as usual
(`results`); a relay of two threads blocking in os.read, no event loop
(`threads`), and the proxy's own ToolCalls and guard (memory) behind it,
checked synchronously (`threaded`, which blocks like the proxies); and a
control: the direct server started a second time (`again`), which measures
about 1.0 when the rounds are fair.

BENCH_TOOL_MS=<ms> calls `work` instead of `echo`: the same answer after
that many milliseconds, a tool that takes time as real ones do (the target
is for the trivial tool).

BENCH_BASELINE=<dir> adds `baseline`: the proxy (and the server) run from
another checkout of botbouncer, on memory, in the same rounds as `memory`,
to judge a change side by side with the code before it.

Knobs: BENCH_ROUNDS (5), BENCH_CALLS (500 per contestant per round),
BENCH_CHUNK (50), BENCH_WARMUP (200), BENCH_STORES (memory,redis),
BENCH_FLOORS (0), BENCH_TOOL_MS (0), BENCH_BASELINE (none), REDIS_URL (when
no redis-server binary can be started).
Last line: `p50_ratio=<x> p99_ratio=<x> redis_p50_ratio=<x> redis_p99_ratio=<x>`
(memory's, then Redis's). Exit 0 when it measured (PASS or MISS), 2 when it
could not.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from _e2e import process_cpu
from _redis import ROOT, delete_matching, redis_server_class

sys.path.insert(0, str(ROOT))  # the repo root is not on sys.path for bench/

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp_types import CallToolResult, TextContent

from tests.redis_server import answers

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
CALLS = int(os.environ.get("BENCH_CALLS", "500"))
CHUNK = int(os.environ.get("BENCH_CHUNK", "50"))
WARMUP = int(os.environ.get("BENCH_WARMUP", "200"))
STORES = [s for s in os.environ.get("BENCH_STORES", "memory,redis").split(",") if s]
FLOORS = os.environ.get("BENCH_FLOORS", "0") not in ("", "0")
# 0: the trivial `echo`; else `work`, which answers after this many milliseconds
TOOL_MS = float(os.environ.get("BENCH_TOOL_MS", "0"))
# A checkout of botbouncer whose proxy runs beside memory as `baseline`
BASELINE = Path(os.environ["BENCH_BASELINE"]).resolve() if os.getenv("BENCH_BASELINE") else None
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/14"
TARGET = 1.2  # p50 memory/direct, at most
FAIR = 0.05  # how far the control (the direct server again) may land from 1.0
SERVER = [sys.executable, "-m", "tests.mcp_servers.counter"]
PROXY = [sys.executable, "-m", "gateway", "mcp-proxy"]
CALL_TIMEOUT = 30.0
# The default profile, every detector on, only the step ceilings out of reach.
PROFILE = (
    "mcp_proxy: {profile: default}\n"
    "guard: {profiles: {default: {steps: {max_steps: 1000000, max_per_tool: 1000000}}}}\n"
)
ROLES = ["client", "server", "proxy", "redis"]


class Unmeasurable(Exception):
    """Something the benchmark cannot measure around: exit 2."""


@dataclass
class Contestant:
    name: str
    params: StdioServerParameters
    marker: str | None = None  # in the proxy's command line: which process is whose
    guarded: bool = False
    client: ClientSession | None = None
    pids: dict[str, list[int]] = field(default_factory=dict)  # role -> pids
    sent: int = 0


@dataclass
class Round:
    samples: dict[str, list[float]] = field(default_factory=dict)  # name -> seconds per call
    cpu: dict[str, dict[str, float]] = field(default_factory=dict)  # name -> role -> seconds


def texts(result: CallToolResult) -> list[str]:
    return [b.text for b in result.content if isinstance(b, TextContent)]


def pctl(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# --- the floors: the proxy's relay without the guard ------------------------


class Untouched:
    """In place of ToolCalls: every message is left alone; an answer is read
    after it is relayed, as ToolCalls reads it while no warning waits."""

    def __init__(self, read: Callable[[bytes], Any]) -> None:
        self.read = read

    async def from_client(self, message: Any) -> None:
        return None

    async def from_server_raw(self, raw: bytes) -> None:
        asyncio.get_running_loop().call_soon(self.read, raw)

    async def settle(self) -> None:
        return None


def unread(raw: bytes | str) -> Any:
    """In place of gateway/mcpproxy/calls.py's parse: no line is read."""
    return None


def _lines(fd: int) -> Iterator[bytes]:
    """Whole lines from `fd`, read blocking, to its end."""
    buffer = bytearray()
    while chunk := os.read(fd, 1 << 16):
        buffer += chunk
        while cut := buffer.find(b"\n") + 1:
            yield bytes(buffer[:cut])
            del buffer[:cut]


def _now(coro: Coroutine[Any, Any, Any]) -> Any:
    """A coroutine that never waits (a check on the memory store) run to its end."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a check waited: the threaded floor runs on memory only")


def threaded(command: list[str], calls: Any = None) -> int:
    """A stdio relay of two threads blocking in os.read and writing with
    os.write, no event loop: the client's lines to the server in one, the
    server's to the client in the other. With `calls` (the proxy's own
    ToolCalls, on memory) a tools/call is its step before it is forwarded and
    its answer a result after it is relayed, checked synchronously under one
    lock, so a step waits for the result before it, as in the proxy."""
    from gateway.mcpproxy.calls import dump, parse

    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    assert child.stdin is not None and child.stdout is not None
    to_child, from_child = child.stdin.fileno(), child.stdout.fileno()
    checks = threading.Lock()
    if calls is not None:
        calls._track = _now  # a result is recorded where it is read, not in a task

    def client_side() -> None:
        for line in _lines(0):
            if calls is not None and b"tools/call" in line:
                with checks:
                    message = parse(line)
                    answer = _now(calls.from_client(message)) if message is not None else None
                if answer is not None:
                    os.write(1, dump(answer) + b"\n")
                    continue
            os.write(to_child, line)
        os.close(to_child)

    threading.Thread(target=client_side, daemon=True).start()
    for line in _lines(from_child):
        if calls is None:
            os.write(1, line)
            continue
        with checks:
            instead = _now(calls.from_server_raw(line))
            os.write(1, instead + b"\n" if instead is not None else line)
    return child.wait()


def relay_main(args: list[str]) -> int:
    """`--relay relay|parse|threads MARKER -- CMD...`: gateway/mcpproxy/stdio.py's
    relay with no guard; `relay` does not even parse the lines; `threads`
    is `threaded` without the guard."""
    from gateway.mcpproxy import calls, stdio

    read = calls.parse
    if args[0] == "threads":
        return threaded(args[args.index("--") + 1 :])
    if args[0] == "relay":
        read = stdio.parse = unread  # type: ignore[attr-defined]  # what stdio.run reads lines with
    command = args[args.index("--") + 1 :]
    return asyncio.run(stdio.run(command, cast(Any, Untouched(read))))


def proxy_main(args: list[str]) -> int:
    """`--proxy noguard|results|threaded -- MCP-PROXY ARGS...`: `botbouncer
    mcp-proxy` itself with some of its guard's checks answered for free
    (allow, no work): `noguard` every step and every result, `results` every
    step only, the results checked as usual (after the answer is relayed);
    or, `threaded`, every check made, its stdio relay `threaded`'s."""
    from gateway.cli import main as cli
    from gateway.guard.service import Answer, Guard
    from gateway.mcpproxy import stdio

    if args[0] == "threaded":

        async def run(command: list[str], calls: Any, *_: Any) -> int:
            return threaded(command, calls)

        stdio.run = run  # type: ignore[assignment]  # what gateway/mcpproxy/main.py relays with
        return cli(args[args.index("--") + 1 :])

    async def allow(self: Guard, session: str, body: Any, profile: str | None = None) -> Answer:
        return Answer(session, "allow", "ok", "Go ahead.", {})

    Guard.step = allow  # type: ignore[method-assign]
    if args[0] == "noguard":
        Guard.result = allow  # type: ignore[method-assign]
    return cli(args[args.index("--") + 1 :])


# --- processes and their CPU ------------------------------------------------


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().rstrip("\0").split("\0")
    except OSError:
        return []


def find_pids(contestants: list[Contestant], redis_pid: int | None) -> None:
    """Which process is whose: the direct server, each proxy and its server."""
    mine = children(os.getpid())
    for c in contestants:
        if c.marker is None:
            command = [c.params.command, *c.params.args]
            c.pids = {"server": [p for p in mine if cmdline(p) == command]}
        else:
            proxies = [p for p in mine if c.marker in cmdline(p)]
            c.pids = {"proxy": proxies, "server": [q for p in proxies for q in children(p)]}
            if c.name == "redis" and redis_pid is not None:
                c.pids["redis"] = [redis_pid]
        if any(len(v) != 1 for v in c.pids.values()):
            raise Unmeasurable(f"{c.name}: cannot tell its processes apart: {c.pids}")


def snapshot(c: Contestant) -> dict[str, float]:
    out = {role: sum(process_cpu(p) or 0.0 for p in pids) for role, pids in c.pids.items()}
    out["client"] = time.process_time()
    return out


# --- the calls --------------------------------------------------------------


async def call(c: Contestant) -> float:
    """One timed call with a text never sent before; its answer checked."""
    assert c.client is not None
    text = f"{c.name}-{c.sent}"
    c.sent += 1
    started = time.perf_counter()
    if TOOL_MS:
        result = await c.client.call_tool("work", {"text": text, "ms": TOOL_MS})
    else:
        result = await c.client.call_tool("echo", {"text": text})
    took = time.perf_counter() - started
    if result.is_error or texts(result) != [text]:
        raise Unmeasurable(
            f"{c.name}: {'work' if TOOL_MS else 'echo'}({text!r}) answered {texts(result)!r} "
            f"(isError {result.is_error}): the guard stepped in"
        )
    return took


async def chunk(c: Contestant, n: int, rnd: Round) -> None:
    before = snapshot(c)
    samples = rnd.samples.setdefault(c.name, [])
    for _ in range(n):
        samples.append(await call(c))
    after = snapshot(c)
    cpu = rnd.cpu.setdefault(c.name, {})
    for role, value in after.items():
        cpu[role] = cpu.get(role, 0.0) + value - before[role]


def turn(contestants: list[Contestant], k: int) -> list[Contestant]:
    """Pass k's order: each contestant starts one pass in n, in turn, and
    passes go forward and back, so over the passes every contestant runs in
    every place, after every other, as often."""
    i = (k // 2) % len(contestants)
    order = contestants[i:] + contestants[:i]
    return order if k % 2 == 0 else order[::-1]


async def one_round(contestants: list[Contestant], r: int) -> Round:
    rnd = Round()
    done = 0
    k = r * len(contestants)  # rounds start where the one before left off
    while done < CALLS:
        n = min(CHUNK, CALLS - done)
        gc.disable()
        try:
            for c in turn(contestants, k):
                await chunk(c, n, rnd)
        finally:
            gc.enable()
        gc.collect()
        done += n
        k += 1
    return rnd


async def blocked_after(c: Contestant, limit: int = 6) -> int | None:
    """How many identical calls until one is blocked (None: none was)."""
    assert c.client is not None
    for i in range(1, limit + 1):
        result = await c.client.call_tool("echo", {"text": "the same again"})
        if result.is_error:
            return i
    return None


# --- setup and report -------------------------------------------------------


def proxied(name: str, config: Path, checkout: Path = ROOT) -> Contestant:
    """`botbouncer mcp-proxy` in front of the server, both run from `checkout`
    (`-m`: its own packages first on sys.path)."""
    marker = f"bench-mcp-{name}-{uuid.uuid4().hex[:12]}"  # also its guard session
    args = [*PROXY[1:], "-c", str(config), "--session", marker, "--", *SERVER]
    params = StdioServerParameters(command=PROXY[0], args=args, cwd=checkout)
    return Contestant(name, params, marker, guarded=True)


def floor(mode: str, config: Path | None = None) -> Contestant:
    """A floor this file runs: `relay`, `parse` or `threads` (relay_main), or
    with the proxy's `config`, `noguard`, `results` or `threaded` (proxy_main)."""
    marker = f"bench-mcp-{mode}-{uuid.uuid4().hex[:12]}"
    if config is None:
        args = [__file__, "--relay", mode, marker, "--", *SERVER]
    else:
        args = [__file__, "--proxy", mode, "--", "mcp-proxy", "-c", str(config), "--session",
                marker, "--", *SERVER]  # fmt: skip
    return Contestant(
        mode, StdioServerParameters(command=sys.executable, args=args, cwd=ROOT), marker
    )


def redis_url() -> tuple[str | None, Any, str]:
    """(url, private server or None, what it is); url None: no Redis to use."""
    if shutil.which("redis-server"):
        try:
            server = redis_server_class()().start()
        except RuntimeError as exc:
            return None, None, f"cannot start a private redis-server: {exc}"
        return server.url, server, f"a private redis-server ({server.url})"
    url = os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)
    rest = url.split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]
    host, _, port = rest.partition(":")
    if not answers(host or "127.0.0.1", int(port or 6379)):
        return None, None, f"no redis-server binary and nothing answers at {url}: skipped"
    return url, None, f"REDIS_URL {url} (shared: Redis's CPU not counted)"


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f}"


def report_round(r: int, rnd: Round, names: list[str]) -> dict[str, tuple[float, float]]:
    """One round's line; each other contestant's (p50, p99) ratio to direct."""
    stats = {n: (pctl(rnd.samples[n], 0.5), pctl(rnd.samples[n], 0.99)) for n in names}
    base = stats["direct"]
    ratios = {n: (stats[n][0] / base[0], stats[n][1] / base[1]) for n in names[1:]}
    cells = [f"{us(stats[n][0]) + '/' + us(stats[n][1]):>14}" for n in names]
    cells += [f"{ratios[n][0]:>8.2f}/{ratios[n][1]:<6.2f}" for n in names[1:]]
    print(f"{r + 1:<6}" + "".join(cells), flush=True)
    return ratios


def report_cpu(rounds: list[Round], names: list[str]) -> None:
    print("\nCPU per call, µs (median of the rounds; client: this process, the SDK's client)")
    print(f"{'':<8}" + "".join(f"{role:>9}" for role in ROLES) + f"{'all':>9}")
    for n in names:
        row = ""
        for role in ROLES:
            per = [r.cpu[n][role] / CALLS for r in rounds if role in r.cpu[n]]
            row += f"{us(statistics.median(per)):>9}" if per else f"{'-':>9}"
        every = statistics.median(sum(r.cpu[n].values()) / CALLS for r in rounds)
        print(f"{n:<8}{row}{us(every):>9}")


def report(rounds: list[Round], names: list[str], guarded: list[str]) -> str:
    """The medians over rounds, the verdicts; the last line."""
    print(
        f"\n{'':<8}{'p50 µs':>8}{'+µs':>7}{'p50 ratio':>11}{'range':>12}"
        f"{'p99 ratio':>11}{'range':>12}"
    )
    last = []
    for n in names:
        p50s = [pctl(r.samples[n], 0.5) for r in rounds]
        line = f"{n:<8}{us(statistics.median(p50s)):>8}"
        if n == "direct":
            print(line)
            continue
        base = [pctl(r.samples["direct"], 0.5) for r in rounds]
        added = statistics.median(a - b for a, b in zip(p50s, base, strict=True))
        r50 = [pctl(r.samples[n], 0.5) / pctl(r.samples["direct"], 0.5) for r in rounds]
        r99 = [pctl(r.samples[n], 0.99) / pctl(r.samples["direct"], 0.99) for r in rounds]
        p50, p99 = statistics.median(r50), statistics.median(r99)
        line += f"{us(added):>7}{p50:>11.2f}{f'{min(r50):.2f}-{max(r50):.2f}':>12}"
        line += f"{p99:>11.2f}{f'{min(r99):.2f}-{max(r99):.2f}':>12}"
        if n == "again" and abs(p50 - 1) > FAIR:
            line += f"   the control is off by more than {FAIR:g}: these rounds say little"
        if n in guarded:
            verdict = "PASS" if p50 <= TARGET else "MISS"
            line += f"   p50 <= {TARGET:g}: {verdict}"
            prefix = "" if n == "memory" else f"{n}_"
            last.append(f"{prefix}p50_ratio={p50:.2f} {prefix}p99_ratio={p99:.2f}")
        print(line)
    return " ".join(last)


async def run(contestants: list[Contestant], redis_pid: int | None) -> str:
    """Start every session, measure, report; the last line."""
    names = [c.name for c in contestants]
    guarded = [c.name for c in contestants if c.guarded]
    if not guarded:
        raise Unmeasurable("no proxy to measure (BENCH_STORES: memory, redis)")
    async with contextlib.AsyncExitStack() as stack:
        for c in contestants:
            read, write = await stack.enter_async_context(stdio_client(c.params))
            c.client = await stack.enter_async_context(
                ClientSession(read, write, read_timeout_seconds=CALL_TIMEOUT)
            )
            await c.client.initialize()
        find_pids(contestants, redis_pid)
        for c in contestants:
            for _ in range(WARMUP):
                await call(c)
        tool = f"work(ms={TOOL_MS:g})" if TOOL_MS else "echo"
        print(
            f"{len(contestants)} sessions initialised, calling {tool}, "
            f"{WARMUP} warm-up calls each; "
            f"{ROUNDS} rounds of {CALLS} calls each, in alternating chunks of {CHUNK}\n"
            "p50/p99 µs per call, then the ratios to direct"
        )
        head = "".join(f"{n:>14}" for n in names)
        head += "".join(f"  {n + '/direct':<13}" for n in names[1:])
        print(f"{'round':<6}{head}")
        rounds = []
        for r in range(ROUNDS):
            rounds.append(await one_round(contestants, r))
            report_round(r, rounds[-1], names)
        report_cpu(rounds, names)
        blocked = {c.name: await blocked_after(c) for c in contestants}
    print(
        "\nthe same echo() again and again, blocked at call: "
        + ", ".join(f"{n} {b or 'never'}" for n, b in blocked.items())
    )
    if any(blocked[n] is None for n in guarded):
        raise Unmeasurable("a proxy never blocked a repeated call: its guard was not measured")
    return report(rounds, names, guarded)


async def measure() -> str:
    workdir = Path(tempfile.mkdtemp(prefix="bb-bench-mcp-"))
    server = None
    url = None
    direct = StdioServerParameters(command=SERVER[0], args=SERVER[1:], cwd=ROOT)
    contestants = [Contestant("direct", direct)]
    try:
        if FLOORS:
            contestants += [floor("relay"), floor("parse"), floor("threads")]
            # The same server once more, its command line told apart by an
            # argument it takes anyway: what the benchmark's own placement of
            # a contestant costs (about 1.0 when the rounds are fair).
            again = StdioServerParameters(command=SERVER[0], args=[*SERVER[1:], "stdio"], cwd=ROOT)
            contestants.append(Contestant("again", again))
        config = workdir / "memory.yml"
        config.write_text("store: {url: 'memory://'}\n" + PROFILE, encoding="utf-8")
        if FLOORS:
            contestants += [floor(m, config) for m in ("noguard", "results", "threaded")]
        if "memory" in STORES:
            contestants.append(proxied("memory", config))
        if BASELINE is not None:
            print(f"baseline: botbouncer mcp-proxy from {BASELINE} (BENCH_BASELINE), on memory")
            contestants.append(proxied("baseline", config, BASELINE))
        if "redis" in STORES:
            url, server, what = redis_url()
            print(f"redis: {what}")
            if url is not None:
                config = workdir / "redis.yml"
                config.write_text(f"store: {{url: '{url}'}}\n" + PROFILE, encoding="utf-8")
                contestants.append(proxied("redis", config))
        return await run(contestants, server.proc.pid if server is not None else None)
    finally:
        if url is not None and server is None:
            keys = [f"*{{{c.marker}}}*" for c in contestants if c.name == "redis"]
            await delete_matching(url, *keys)
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    if sys.argv[1:2] == ["--relay"]:
        return relay_main(sys.argv[2:])
    if sys.argv[1:2] == ["--proxy"]:
        return proxy_main(sys.argv[2:])
    started = time.perf_counter()
    try:
        last = asyncio.run(measure())
    except Unmeasurable as exc:
        print(f"mcp_proxy: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a session broke: the SDK raises it in task groups
        leaves: tuple[BaseException, ...] = (exc,)
        while any(isinstance(e, BaseExceptionGroup) for e in leaves):
            leaves = tuple(x for e in leaves for x in getattr(e, "exceptions", (e,)))
        for e in leaves:
            print(f"mcp_proxy: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(f"({time.perf_counter() - started:.1f} s)")
    print(last)
    return 0


if __name__ == "__main__":
    sys.exit(main())
