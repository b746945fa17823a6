"""The LLM proxy's added latency: an agent's model requests straight to the
upstream (a) against the same requests through botbouncer's proxy (b), for a
model that takes LLM_MODEL_MS (20) ms to answer.

Three processes, so no two of them share an event loop:

- the upstream: the test suite's fake OpenAI server (tests/fakes/llm/),
  started by this file (`llm_proxy.py upstream ...`); every model call waits
  LLM_MODEL_MS, then answers the conversation's next tool call, or its final
  text once LLM_TURNS - 1 tools have run (a word a chunk when streamed);
- b's daemon: `llm_proxy.py daemon ...`, what `python -m gateway run` does
  (INFO log, gc.freeze after start) plus a key prefix of its own on Redis:
  the `llm_proxy` section with `openai.upstream` the fake, nothing else;
- this process: the agents, one HTTP client per contestant kept for all its
  runs. LLM_CLIENT=aiohttp (the default) sends the body the openai SDK sends
  on a plain aiohttp session; LLM_CLIENT=sdk sends it through the SDK itself
  (`AsyncOpenAI`, max_retries=0), which is what agents run, but which costs
  this process 5-9 ms of CPU a request on the 2-core machine this was written
  on (its parameter transform over the history): with 8 agents at once this
  process is then the bottleneck and both sides' latency is its queue. What
  the proxy adds is the same either way; over the leaner client the ratio is
  the stricter one (the SDK adds its time to both sides).

An agent is the SDK docs' tool loop: system prompt and task, then call the
model, append its answer and one tool result per call (about 1 KB each), call
again, until it answers: LLM_TURNS requests whose history grows by a tool
call and its result each time. Tools and arguments differ from turn to turn
(six tools, targets named by the conversation and turn), so the guard allows
every one: the proxy feeds each request's new call and result to the guard
(a step and a result check), then forwards. Even conversations take whole
answers, odd ones stream (`stream: true`; the proxy asks the upstream for
the usage chunk and keeps it from the agent).

A run is LLM_CONVERSATIONS (96) conversations at a concurrency from
LLM_CONCURRENCY (default "8,1": 8 agents at once, then one at a time with a
sixth as many conversations). Per request: the latency of a whole answer; of
a streamed one the time to its first chunk (TTFB: from sending the request
to the first `data:` event, or the SDK's first chunk) and to its end (the
stream read to its end, as the SDK does, so the connection is reused). A
round runs a and b for each concurrency, each side's conversations in
LLM_CHUNKS (4) parts that alternate a b b a ... (b first in odd rounds), so a
slow spell of the machine falls on both; one warm-up run each comes first,
not counted; this process's collector is off while a part is timed (as
bench/_e2e.py's drive). Each round prints a's and b's
p50/p99 (ms), requests/s, CPU ms per request of this process ("agents"), of
the fake and of b's daemon (from /proc), and b/a. The verdicts are on the
medians of the rounds' b/a: LLM_ROUNDS (5) rounds per store (LLM_STORES,
default "redis,memory"; Redis is REDIS_URL, default
redis://127.0.0.1:6379/14, under a key prefix of this run's, deleted at the
end). The daemon's /metrics after each store says what the guard answered
and what the proxy did: anything but `allow` and `forwarded` means b did not
just forward (exit 2). LLM_TURNS (8) and LLM_MODEL_MS (20) shape the agent.

BENCH_FLOORS=1 adds two contestants to every round, in turn with a and b:
`relay`, a bare aiohttp reverse proxy (`llm_proxy.py relay ...`: the hop any
Python proxy pays), and `unguarded`, b's daemon with its guard's calls made
free (`llm_proxy.py unguarded ...`, on memory://: the hop plus the proxy's
own reading and relaying); each is reported over a, beside b.
BENCH_BASELINE=<dir> adds `baseline` the same way: b's daemon on memory://
run from another checkout of botbouncer (its own bench/llm_proxy.py, which
must take the same roles), to judge a change side by side with the code
before it.
Targets (b/a, medians of the rounds): whole p50 and p99 <= 1.10, streamed
TTFB p50 <= 1.05. Exit 0 when measured, whether PASS or MISS; 2 when it could
not measure. Last line: `p50_ratio=<x> p99_ratio=<x> ttfb_ratio=<x>` for
Redis at the first concurrency, `seq_...` at one at a time, then the same
for memory prefixed `memory_`; with the floors, `<floor>_p50_ratio` and
`<floor>_ttfb_ratio` after b's.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _e2e import process_cpu, stop
from _redis import ROOT, check_reachable, delete_matching, verdict, wait_healthy

sys.path.insert(0, str(ROOT))  # for `gateway` and `tests`: bench/ is sys.path[0]

ROUNDS = int(os.environ.get("LLM_ROUNDS", "5"))
STORES = [s for s in os.environ.get("LLM_STORES", "redis,memory").split(",") if s]
CONCURRENCY = [int(c) for c in os.environ.get("LLM_CONCURRENCY", "8,1").split(",") if c]
CONVERSATIONS = int(os.environ.get("LLM_CONVERSATIONS", "96"))  # a run; a sixth one at a time
TURNS = int(os.environ.get("LLM_TURNS", "8"))  # model requests per conversation
MODEL_MS = float(os.environ.get("LLM_MODEL_MS", "20"))
CHUNKS = int(os.environ.get("LLM_CHUNKS", "4"))  # parts of a round, alternating a and b
CLIENT = os.environ.get("LLM_CLIENT", "aiohttp")  # or sdk
FLOORS = os.environ.get("BENCH_FLOORS", "0") not in ("", "0")
# A checkout of botbouncer whose daemon runs in every round as `baseline` (on memory://)
BASELINE = Path(os.environ["BENCH_BASELINE"]).resolve() if os.getenv("BENCH_BASELINE") else None
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/14")
P50_TARGET = 1.10  # whole answers, b/a, at most
P99_TARGET = 1.10
TTFB_TARGET = 1.05  # streamed answers' first chunk, p50, b/a, at most
READY_S = 30.0

TOOLS = [
    ("read_file", "path", "/srv/app/src/module_{c}_{t}.py"),
    ("search_docs", "query", "how does feature {c}.{t} handle retries"),
    ("run_sql", "table", "orders_{c}_{t}"),
    ("fetch_url", "url", "https://docs.example.com/{c}/page-{t}.html"),
    ("list_dir", "path", "/srv/app/data/{c}/{t}"),
    ("get_ticket", "id", "TICKET-{c}-{t}"),
]
SYSTEM = (
    "You are a careful engineering assistant working on a large code base. "
    "Use the tools to look things up before answering; never guess a file's "
    "contents. Keep answers short and cite the files you read. " * 12
)
FINAL = (
    "The retry handling lives in the request module: failed calls are retried "
    "three times with exponential backoff, and the last error is raised to the caller."
)


def tool_schema(name: str, key: str) -> dict[str, Any]:
    params = {"type": "object", "properties": {key: {"type": "string"}}, "required": [key]}
    return {"type": "function", "function": {"name": name, "description": f"{name} tool",
                                             "parameters": params}}  # fmt: skip


SCHEMAS = [tool_schema(name, key) for name, key, _ in TOOLS]


# -- the upstream's process -------------------------------------------------------


def conversation_of(messages: list[Any]) -> int:
    """The conversation's number, from its task (the first user message)."""
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "user":
            found = re.match(r"Task (\d+):", str(m.get("content")))
            return int(found.group(1)) if found else 0
    return 0


def serving() -> asyncio.Event:
    """An event SIGINT or SIGTERM sets; what is alive so far frozen out of the
    collector's way (as the daemon does after its start)."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    gc.collect()
    gc.freeze()
    return stopping


async def serve_upstream(turns: int, model_ms: float) -> None:
    from tests.fakes.llm import FakeLLM, Reply, ToolCall, respond, slow
    from tests.fakes.llm.model import Call

    def model(call: Call) -> Reply:
        done = len(call.tool_results)
        if done >= turns - 1:
            return Reply(FINAL)
        c = conversation_of(call.messages)
        name, key, target = TOOLS[(c + done) % len(TOOLS)]
        return Reply("", (ToolCall(name, {key: target.format(c=c, t=done)}),))

    llm = FakeLLM()
    llm.default = slow(model_ms / 1000, respond(model, "agent model"))
    await llm.start()
    stopping = serving()
    print(llm.anthropic_base_url, flush=True)  # the root: /v1/chat/completions under it
    while not stopping.is_set():
        llm.calls.clear()  # the fake records every call: not kept here
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), 1.0)
    await llm.stop()


# -- b's daemon ---------------------------------------------------------------------


async def serve_daemon(config_path: str, prefix: str, guarded: bool = True) -> None:
    """gateway.daemon.serve, with the Redis store's keys under `prefix`;
    `guarded` False: the floor `unguarded`, the same proxy with its guard's
    calls made free (every request forwarded as read, no usage counted)."""
    from gateway.config import load_config
    from gateway.daemon import GC_YOUNG, Daemon

    if not guarded:
        from gateway.llmproxy import proxy

        async def check(*_: Any) -> proxy.Verdict:
            return proxy.Verdict(None, "forwarded")

        async def account(*_: Any) -> None:
            return None

        proxy.LlmProxy._check = check  # type: ignore[method-assign]
        proxy.LlmProxy._account = account  # type: ignore[method-assign]

    daemon = Daemon(load_config(config_path))
    store = getattr(daemon.store, "primary", daemon.store)
    if hasattr(store, "prefix"):
        store.prefix = prefix
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, daemon.stopping.set)
    await daemon.start()
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG, *gc.get_threshold()[1:])
    try:
        await daemon.stopping.wait()
    finally:
        await daemon.stop()


def run_daemon(config_path: str, prefix: str, guarded: bool = True) -> int:
    from gateway.logs import setup_logging

    setup_logging("info", "text")
    asyncio.run(serve_daemon(config_path, prefix, guarded))
    return 0


# -- the floor `relay`: a reverse proxy with nothing of botbouncer's ------------------

# Hop-by-hop headers (RFC 9110 7.6.1), and what aiohttp sets itself.
HOP = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer",
                 "transfer-encoding", "upgrade", "host", "content-length"})  # fmt: skip


async def serve_relay(upstream_root: str) -> None:
    """The least an HTTP proxy on aiohttp does: read the request, send it on
    with one kept-alive client session, pass the answer back chunk by chunk.
    Prints its root URL once it listens."""
    import aiohttp
    from aiohttp import web

    session = aiohttp.ClientSession()

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        async with session.request(request.method, upstream_root + request.path_qs,
                                   data=body, headers=headers) as upstream:  # fmt: skip
            out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in HOP:
                    out.headers.add(k, v)
            await out.prepare(request)
            async for chunk in upstream.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", relay)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    stopping = serving()
    port = runner.addresses[0][1]
    print(f"http://127.0.0.1:{port}", flush=True)
    await stopping.wait()
    await runner.cleanup()
    await session.close()


# -- the agents (this process) ----------------------------------------------------------


def tool_output(name: str, args: dict[str, Any]) -> str:
    target = next(iter(args.values()), "")
    lines = [f"{k:03d}: {name} -> {target}: value {zlib.crc32(f'{target}{k}'.encode())}"
             for k in range(16)]  # fmt: skip
    return json.dumps({"tool": name, "target": target, "lines": lines})


@dataclass
class Samples:
    whole: list[float] = field(default_factory=list)  # seconds, whole answers
    ttfb: list[float] = field(default_factory=list)  # streamed: to the first chunk
    streamed: list[float] = field(default_factory=list)  # streamed: to the end


class SdkAgent:
    """The openai SDK, as agents run it."""

    def __init__(self, base_url: str) -> None:
        import openai

        self.client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-bench", max_retries=0)

    async def whole(self, messages: list[Any]) -> dict[str, Any]:
        completion = await self.client.chat.completions.create(
            model="gpt-bench", messages=messages, tools=SCHEMAS
        )
        message: dict[str, Any] = completion.choices[0].message.model_dump(exclude_none=True)
        return message

    async def streamed(self, messages: list[Any]) -> tuple[dict[str, Any], float]:
        """A streamed answer put back together from its deltas, and when its first chunk came."""
        first = 0.0
        joined = Joined()
        stream = await self.client.chat.completions.create(
            model="gpt-bench", messages=messages, tools=SCHEMAS, stream=True
        )
        async for chunk in stream:
            if not first:
                first = time.perf_counter()
            if chunk.choices:
                d = chunk.choices[0].delta
                calls = [{"index": tc.index, "id": tc.id, "function": tc.function and {
                    "name": tc.function.name, "arguments": tc.function.arguments}}
                    for tc in d.tool_calls or []]  # fmt: skip
                joined.add({"content": d.content, "tool_calls": calls})
        return joined.message(), first

    async def close(self) -> None:
        await self.client.close()


class HttpAgent:
    """The same requests on a plain aiohttp session (LLM_CLIENT=aiohttp): the
    body the SDK sends, the answer read with json.loads."""

    def __init__(self, base_url: str) -> None:
        import aiohttp

        self.url = base_url + "/chat/completions"
        self.http = aiohttp.ClientSession(headers={"Authorization": "Bearer sk-bench"})

    async def whole(self, messages: list[Any]) -> dict[str, Any]:
        body = {"messages": messages, "model": "gpt-bench", "tools": SCHEMAS}
        async with self.http.post(self.url, json=body) as resp:
            resp.raise_for_status()
            answer = await resp.json()
        message = answer["choices"][0]["message"]
        return {k: v for k, v in message.items() if v is not None}

    async def streamed(self, messages: list[Any]) -> tuple[dict[str, Any], float]:
        first = 0.0
        joined = Joined()
        body = {"messages": messages, "model": "gpt-bench", "tools": SCHEMAS, "stream": True}
        async with self.http.post(self.url, json=body) as resp:
            resp.raise_for_status()
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                if not first:
                    first = time.perf_counter()
                if line.startswith(b"data: [DONE]"):
                    continue  # read to the end, as the SDK does: the connection is reused
                chunk = json.loads(line[6:])
                if chunk["choices"]:
                    joined.add(chunk["choices"][0]["delta"])
        return joined.message(), first

    async def close(self) -> None:
        await self.http.close()


class Joined:
    """A streamed answer's deltas put back together, as the SDK's docs do."""

    def __init__(self) -> None:
        self.content = ""
        self.calls: dict[int, dict[str, Any]] = {}

    def add(self, delta: dict[str, Any]) -> None:
        self.content += delta.get("content") or ""
        for tc in delta.get("tool_calls") or []:
            empty = {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
            call = self.calls.setdefault(tc["index"], empty)
            call["id"] = tc.get("id") or call["id"]
            fn = tc.get("function") or {}
            call["function"]["name"] += fn.get("name") or ""
            call["function"]["arguments"] += fn.get("arguments") or ""

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.calls:
            msg["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        return msg


Agent = SdkAgent | HttpAgent


async def conversation(agent: Agent, n: int, stream: bool, out: Samples) -> None:
    """One agent's tool loop: call the model, run the tools it asks for, until it answers."""
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Task {n}: find how our code handles retries."},
    ]
    for _ in range(TURNS + 1):
        started = time.perf_counter()
        if stream:
            msg, first = await agent.streamed(messages)
            ended = time.perf_counter()
            out.ttfb.append(first - started)
            out.streamed.append(ended - started)
        else:
            msg = await agent.whole(messages)
            out.whole.append(time.perf_counter() - started)
        messages.append(msg)
        calls = msg.get("tool_calls") or []
        if not calls:
            return
        for call in calls:
            args = json.loads(call["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": tool_output(call["function"]["name"], args)})  # fmt: skip
    raise Unmeasurable(f"conversation {n} never ended in {TURNS} turns")


class Unmeasurable(Exception):
    """The benchmark could not measure: it says why and exits 2."""


def pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile, as bench/_e2e.py's Run.percentile."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s)) - 1))]


@dataclass
class Run:
    who: str
    samples: Samples
    seconds: float
    cpu_ms: dict[str, float]  # CPU ms per request by process: daemon (b), fake, agents

    @property
    def requests(self) -> int:
        return len(self.samples.whole) + len(self.samples.ttfb)

    def figures(self) -> dict[str, float]:
        s = self.samples
        return {
            "p50": pct(s.whole, 50), "p99": pct(s.whole, 99),
            "ttfb": pct(s.ttfb, 50), "ttfb_p99": pct(s.ttfb, 99),
            "stream": pct(s.streamed, 50), "stream_p99": pct(s.streamed, 99),
        }  # fmt: skip


CPU = ("agents", "fake", "daemon")
COLUMNS = [("p50", "whole p50"), ("p99", "p99"), ("ttfb", "TTFB p50"), ("ttfb_p99", "p99"),
           ("stream", "stream p50"), ("stream_p99", "p99")]  # fmt: skip


class Contestant:
    def __init__(self, who: str, base_url: str, pids: dict[str, int]) -> None:
        self.who = who
        self.pids = pids  # the processes whose CPU is counted, by name
        self.agent: Agent = HttpAgent(base_url) if CLIENT == "aiohttp" else SdkAgent(base_url)
        self.next = 0  # conversation numbers, never reused

    def cpu(self) -> dict[str, float]:
        out = {"agents": time.process_time()}
        for name, pid in self.pids.items():
            used = process_cpu(pid)
            if used is not None:
                out[name] = used
        return out

    async def run(self, concurrency: int, conversations: int) -> Run:
        out = Samples()
        numbers = iter(range(self.next, self.next + conversations))
        self.next += conversations

        async def agent() -> None:
            for n in numbers:
                await conversation(self.agent, n, n % 2 == 1, out)

        # As bench/_e2e.py's drive: no collection in this process while a run is timed.
        gc.collect()
        gc.disable()
        try:
            cpu = self.cpu()
            started = time.perf_counter()
            await asyncio.gather(*(agent() for _ in range(concurrency)))
            seconds = time.perf_counter() - started
            after = self.cpu()
        finally:
            gc.enable()
        run = Run(self.who, out, seconds, {})
        run.cpu_ms = {k: (after[k] - cpu[k]) * 1000 / run.requests for k in cpu if k in after}
        return run

    async def close(self) -> None:
        await self.agent.close()


def row(label: str, r: Run) -> str:
    f = r.figures()
    cells = "".join(f"{f[k] * 1000:>{max(8, len(h) + 1)}.1f}" for k, h in COLUMNS)
    cpu = "".join(f"{r.cpu_ms[k]:>8.2f}" if k in r.cpu_ms else f"{'-':>8}" for k in CPU)
    return f"{label:<9}{cells}{r.requests / r.seconds:>8.0f}{cpu}"


def ratio_row(label: str, ratios: dict[str, float]) -> str:
    return f"{label:<9}" + "".join(f"{ratios[k]:>{max(8, len(h) + 1)}.3f}" for k, h in COLUMNS)


def header() -> str:
    cells = "".join(f"{h:>{max(8, len(h) + 1)}}" for _, h in COLUMNS)
    cpu = "".join(f"{k:>8}" for k in CPU)
    return f"{'':<9}{cells}{'req/s':>8}{cpu}   (ms; then CPU ms per request, by process)"


async def alternate(contestants: list[Contestant], c: int, n: int, first: int) -> dict[str, Run]:
    """One round: `n` conversations each, in CHUNKS parts, the contestants
    in turn from `first` and back again (a b b a ..., or a b f u u f b a ...
    with the floors), each contestant's parts as one run. A slow spell of the
    machine (seconds, on the machine this was written on) then falls on every
    side, not on whichever ran while it lasted."""
    order = contestants[first:] + contestants[:first]
    parts: dict[str, list[Run]] = {x.who: [] for x in contestants}
    sizes = [n // CHUNKS + (1 if i < n % CHUNKS else 0) for i in range(CHUNKS)]
    for i, size in enumerate(sizes):
        for x in order if i % 2 == 0 else order[::-1]:
            if size:
                parts[x.who].append(await x.run(c, size))
    return {who: joined(runs) for who, runs in parts.items()}


def joined(runs: list[Run]) -> Run:
    samples = Samples()
    for r in runs:
        samples.whole += r.samples.whole
        samples.ttfb += r.samples.ttfb
        samples.streamed += r.samples.streamed
    out = Run(runs[0].who, samples, sum(r.seconds for r in runs), {})
    for k in runs[0].cpu_ms:
        out.cpu_ms[k] = sum(r.cpu_ms[k] * r.requests for r in runs) / out.requests
    return out


Figures = dict[str, dict[str, float]]  # one round's figures by contestant (a, b, floors)


@dataclass
class Floor:
    """A floor's process: `who` its contestant's name, `base` its OpenAI root."""

    who: str
    base: str
    proc: subprocess.Popen[bytes]


async def measure_store(
    store: str,
    upstream_root: str,
    upstream_pid: int,
    workdir: Path,
    logs: list[Path],
    floors: list[Floor],
) -> tuple[dict[int, list[Figures]], dict[str, float]]:
    """Rounds of a, b (and the floors) at each concurrency, b on a daemon
    with `store`: each round's figures per concurrency, and what the daemon's
    metrics counted."""
    prefix = f"bench-llm-proxy-{os.getpid()}-{store}"
    url = REDIS_URL if store == "redis" else "memory://"
    proc, daemon = await start_daemon("daemon", url, upstream_root, workdir, logs, prefix)
    sides: list[Contestant] = []
    rounds: dict[int, list[Figures]] = {c: [] for c in CONCURRENCY}
    try:
        sides.append(Contestant("a", f"{upstream_root}/v1", {"fake": upstream_pid}))
        pids = {"fake": upstream_pid, "daemon": proc.pid}
        sides.append(Contestant("b", f"{daemon}/llm/openai/v1", pids))
        for f in floors:
            pids = {"fake": upstream_pid, "daemon": f.proc.pid}
            sides.append(Contestant(f.who, f.base, pids))
        plans = [(c, CONVERSATIONS if c > 1 else max(2, CONVERSATIONS // 6)) for c in CONCURRENCY]
        for c, n in plans:  # warm-up: connections, caches, the script cache
            for x in sides:
                await x.run(c, n)
        before = await metrics(daemon)
        for r in range(ROUNDS):
            for c, n in plans:
                runs = await alternate(sides, c, n, first=r % len(sides))
                figures = {who: run.figures() for who, run in runs.items()}
                rounds[c].append(figures)
                if r == 0:
                    print(f"-- {store}, {c} at once, {n} conversations of {TURNS} "
                          f"requests a side a round, in {CHUNKS} parts a side; "
                          f"round 1 --\n{header()}")  # fmt: skip
                else:
                    print(f"-- {store}, {c} at once, round {r + 1} --")
                for x in sides:
                    print(row(x.who, runs[x.who]))
                fa = figures["a"]
                for x in sides[1:]:
                    fx = figures[x.who]
                    print(ratio_row(f"{x.who}/a", {k: fx[k] / fa[k] for k in fa}), flush=True)
        after = await metrics(daemon)
        if store == "redis" and not await count_keys(f"{prefix}:*"):
            raise Unmeasurable(f"no keys under {prefix}: the daemon did not use {REDIS_URL}")
    finally:
        for x in sides:
            await x.close()
        stop([proc], f"daemon on {store}")
        if store == "redis":
            await delete_matching(REDIS_URL, f"{prefix}:*")
    return rounds, {k: after.get(k, 0) - before.get(k, 0) for k in after}


async def start_daemon(
    role: str,
    url: str,
    upstream_root: str,
    workdir: Path,
    logs: list[Path],
    prefix: str,
    checkout: Path = ROOT,
) -> tuple[subprocess.Popen[bytes], str]:
    """This file's `role` (daemon, unguarded) on the store at `url`, healthy:
    its process and root URL (`checkout`: that copy of this file, in its repo)."""
    from tests.redis_server import free_port

    port = free_port()
    name = f"{role}-{prefix.rsplit('-', 1)[-1]}"
    config = workdir / f"{name}.yml"
    section = {"openai": {"upstream": upstream_root}}
    listen = {"listen": f"127.0.0.1:{port}"}
    doc = {"store": {"url": url}, "http": listen, "llm_proxy": section, "bots": []}
    config.write_text(json.dumps(doc), encoding="utf-8")
    log = workdir / f"{name}.log"
    logs.append(log)
    proc = spawn([role, str(config), prefix], log, checkout=checkout)
    daemon = f"http://127.0.0.1:{port}"
    try:
        await wait_healthy(daemon, proc, f"the {role} on {url}")
    except BaseException:
        stop([proc], f"{role} on {url}")
        raise
    return proc, daemon


async def count_keys(pattern: str) -> int:
    """How many keys match (a failover daemon whose Redis failed would have written none)."""
    import redis.asyncio as aioredis

    client = aioredis.from_url(REDIS_URL)
    try:
        return len([k async for k in client.scan_iter(match=pattern, count=1000)])
    finally:
        await client.aclose()


async def metrics(daemon: str) -> dict[str, float]:
    """The proxy's and the guard's counters from the daemon's /metrics."""
    import aiohttp

    async with aiohttp.ClientSession() as http, http.get(f"{daemon}/metrics") as resp:
        text = await resp.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("botbouncer_guard_checks", "botbouncer_llm_proxy_requests")):
            name, _, value = line.rpartition(" ")
            if "_created" not in name:
                out[name] = out.get(name, 0) + float(value)
    return out


def spawn(
    args: list[str], log: Path, stdout: int | None = None, checkout: Path = ROOT
) -> subprocess.Popen[bytes]:
    """This file (the copy in `checkout`) in a process of its own, in one of
    its roles; stderr (and stdout, unless piped) to `log`."""
    script = str(checkout / "bench" / "llm_proxy.py")
    with log.open("wb") as sink:
        return subprocess.Popen([sys.executable, script, *args], cwd=checkout,
                                stdout=sink if stdout is None else stdout, stderr=sink)  # fmt: skip


async def start_printing(
    args: list[str], what: str, workdir: Path, logs: list[Path]
) -> tuple[subprocess.Popen[bytes], str]:
    """This file in the role `args` names, which prints its root URL when it listens."""
    log = workdir / f"{args[0]}.log"
    logs.append(log)
    proc = spawn(args, log, subprocess.PIPE)
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), READY_S)
    except TimeoutError:
        line = b""
    if not line.startswith(b"http://"):
        stop([proc], args[0])
        raise Unmeasurable(f"{what} did not start: {log.read_text()[-2000:]}")
    return proc, line.decode().strip()


async def start_floors(upstream_root: str, workdir: Path, logs: list[Path]) -> list[Floor]:
    """BENCH_FLOORS: `relay` (a bare aiohttp reverse proxy) and `unguarded`
    (b's daemon with its guard's calls made free, on memory://);
    BENCH_BASELINE: `baseline` (b's daemon from that checkout, on memory://)."""
    floors: list[Floor] = []
    try:
        if FLOORS:
            proc, root = await start_printing(["relay", upstream_root], "the relay", workdir,
                                              logs)  # fmt: skip
            floors.append(Floor("relay", f"{root}/v1", proc))
            prefix = f"bench-llm-proxy-{os.getpid()}-unguarded"
            proc, daemon = await start_daemon("unguarded", "memory://", upstream_root, workdir,
                                              logs, prefix)  # fmt: skip
            floors.append(Floor("unguarded", f"{daemon}/llm/openai/v1", proc))
        if BASELINE is not None:
            print(f"baseline: the daemon from {BASELINE} (BENCH_BASELINE), on memory://")
            prefix = f"bench-llm-proxy-{os.getpid()}-baseline"
            proc, daemon = await start_daemon("daemon", "memory://", upstream_root, workdir,
                                              logs, prefix, BASELINE)  # fmt: skip
            floors.append(Floor("baseline", f"{daemon}/llm/openai/v1", proc))
    except BaseException:
        stop([f.proc for f in floors], "floors")
        raise
    return floors


async def measure() -> str:
    if "redis" in STORES:
        await check_reachable(REDIS_URL)
    with tempfile.TemporaryDirectory(prefix="bench-llm-proxy-") as tmp:
        workdir, logs = Path(tmp), []
        upstream, root = await start_printing(
            ["upstream", str(TURNS), str(MODEL_MS)], "the fake upstream", workdir, logs
        )
        results = {}
        floors: list[Floor] = []
        try:
            if FLOORS or BASELINE is not None:
                floors = await start_floors(root, workdir, logs)
            for store in STORES:
                print(f"== b's store: {store} ==", flush=True)
                rounds, counted = await measure_store(
                    store, root, upstream.pid, workdir, logs, floors
                )
                results[store] = rounds
                say_metrics(store, counted)
                print(flush=True)
        except Exception:
            for log in logs:
                if log.exists():
                    tail = log.read_text(errors="replace").splitlines()[-20:]
                    print(f"--- {log.name} ---\n" + "\n".join(tail), file=sys.stderr)
            raise
        finally:
            stop([f.proc for f in floors] + [upstream], "upstream and floors")
    return report(results)


def say_metrics(store: str, counted: dict[str, float]) -> None:
    """What the guard answered during the measured rounds; b must have only forwarded."""
    checks = {k: v for k, v in counted.items() if k.startswith("botbouncer_guard_checks") and v}
    actions = {k: v for k, v in counted.items() if k.startswith("botbouncer_llm_proxy_req") and v}
    said = ", ".join(f"{re.sub(r'^[^{]*', '', k)} {v:.0f}" for k, v in sorted(checks.items()))
    print(f"{store}: guard checks during the rounds: {said or 'none'}")
    said = ", ".join(f"{re.sub(r'^[^{]*', '', k)} {v:.0f}" for k, v in sorted(actions.items()))
    print(f"{store}: proxy requests during the rounds: {said or 'none'}")
    odd = [k for k in checks if 'decision="allow"' not in k]
    odd += [k for k in actions if 'action="forwarded"' not in k]
    if odd or not checks:
        raise Unmeasurable(f"b did not just forward every request ({odd or 'no guard checks'})")


def report(results: dict[str, dict[int, list[Figures]]]) -> str:
    """Per store and concurrency: the medians of the rounds' b/a with their
    range, b - a in ms, the verdicts, and each floor's own over a; the last
    line's keys."""
    print("medians of the rounds' b/a [lowest-highest round]; b - a in ms, median [range]:")
    last = []
    for store, by_c in results.items():
        for c, rounds in by_c.items():
            mode = "" if c == CONCURRENCY[0] else "seq_" if c == 1 else f"c{c}_"
            pre = ("" if store == "redis" else f"{store}_") + mode
            for who in rounds[0]:
                if who == "a":
                    continue
                pairs = [(figures["a"], figures[who]) for figures in rounds]
                med = said_over_a(f"{store}, {c} at once", who, pairs)
                if who == "b":
                    for k, target, what in (("p50", P50_TARGET, "whole p50"),
                                            ("p99", P99_TARGET, "whole p99"),
                                            ("ttfb", TTFB_TARGET, "TTFB p50")):  # fmt: skip
                        print(f"  {what} b/a {med[k]:.3f} (target <= {target:.2f}): "
                              f"{verdict(med[k] <= target)}")  # fmt: skip
                    last += [f"{pre}{k}_ratio={med[k]:.3f}" for k in ("p50", "p99", "ttfb")]
                else:
                    last += [f"{pre}{who}_{k}_ratio={med[k]:.3f}" for k in ("p50", "ttfb")]
    return " ".join(last)


def said_over_a(
    where: str, who: str, pairs: list[tuple[dict[str, float], dict[str, float]]]
) -> dict[str, float]:
    """Prints `who`'s figures over a's (the medians of the rounds' ratios,
    with their range, and `who` - a in ms); returns the medians."""
    ratios = [{k: fx[k] / fa[k] for k in fa} for fa, fx in pairs]
    added = [{k: (fx[k] - fa[k]) * 1000 for k in fa} for fa, fx in pairs]

    def said(k: str) -> str:
        xs = [r[k] for r in ratios]
        return f"{statistics.median(xs):.3f} [{min(xs):.3f}-{max(xs):.3f}]"

    def ms(k: str) -> str:
        xs = [r[k] for r in added]
        return f"{statistics.median(xs):+.1f} [{min(xs):+.1f}..{max(xs):+.1f}]"

    floor = {"b": "", "baseline": " (baseline)"}.get(who, f" (floor {who})")
    print(f"{where}{floor}: {who}/a whole p50 {said('p50')}, p99 {said('p99')}; "
          f"TTFB p50 {said('ttfb')}, p99 {said('ttfb_p99')}; "
          f"stream p50 {said('stream')}, p99 {said('stream_p99')}")  # fmt: skip
    print(f"  {who} - a: whole p50 {ms('p50')} ms, p99 {ms('p99')} ms; "
          f"TTFB p50 {ms('ttfb')} ms")  # fmt: skip
    return {k: statistics.median(r[k] for r in ratios) for k in ratios[0]}


def main() -> int:
    if sys.argv[1:2] == ["upstream"]:
        asyncio.run(serve_upstream(int(sys.argv[2]), float(sys.argv[3])))
        return 0
    if sys.argv[1:2] == ["daemon"]:
        return run_daemon(sys.argv[2], sys.argv[3])
    if sys.argv[1:2] == ["unguarded"]:
        return run_daemon(sys.argv[2], sys.argv[3], guarded=False)
    if sys.argv[1:2] == ["relay"]:
        asyncio.run(serve_relay(sys.argv[2]))
        return 0
    started = time.perf_counter()
    print(f"{ROUNDS} rounds per store; model time {MODEL_MS:g} ms; {TURNS} requests a "
          f"conversation; concurrency {', '.join(map(str, CONCURRENCY))}", flush=True)  # fmt: skip
    try:
        last = asyncio.run(measure())
    except Exception as exc:  # unmeasurable, whatever the reason
        print(f"llm_proxy: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(f"({time.perf_counter() - started:.1f} s)")
    print(last)
    return 0


if __name__ == "__main__":
    sys.exit(main())
