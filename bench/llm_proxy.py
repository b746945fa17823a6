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

Targets (b/a, medians of the rounds): whole p50 and p99 <= 1.10, streamed
TTFB p50 <= 1.05. Exit 0 when measured, whether PASS or MISS; 2 when it could
not measure. Last line: `p50_ratio=<x> p99_ratio=<x> ttfb_ratio=<x>` for
Redis at the first concurrency, `seq_...` at one at a time, then the same
for memory prefixed `memory_`.
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
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    gc.collect()
    gc.freeze()
    print(llm.anthropic_base_url, flush=True)  # the root: /v1/chat/completions under it
    while not stopping.is_set():
        llm.calls.clear()  # the fake records every call: not kept here
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), 1.0)
    await llm.stop()


# -- b's daemon ---------------------------------------------------------------------


async def serve_daemon(config_path: str, prefix: str) -> None:
    """gateway.daemon.serve, with the Redis store's keys under `prefix`."""
    from gateway.config import load_config
    from gateway.daemon import GC_YOUNG, Daemon

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


def run_daemon(config_path: str, prefix: str) -> int:
    from gateway.logs import setup_logging

    setup_logging("info", "text")
    asyncio.run(serve_daemon(config_path, prefix))
    return 0


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


async def alternate(
    a: Contestant, b: Contestant, c: int, n: int, first: Contestant
) -> dict[str, Run]:
    """One round: `n` conversations each, in CHUNKS parts alternating
    first-second-second-first..., each contestant's parts as one run. A slow
    spell of the machine (seconds, on the machine this was written on) then
    falls on both sides, not on whichever ran while it lasted."""
    second = b if first is a else a
    parts: dict[str, list[Run]] = {"a": [], "b": []}
    sizes = [n // CHUNKS + (1 if i < n % CHUNKS else 0) for i in range(CHUNKS)]
    for i, size in enumerate(sizes):
        for x in (first, second) if i % 2 == 0 else (second, first):
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


Pair = tuple[dict[str, float], dict[str, float]]  # one round's figures: a's, b's


async def measure_store(
    store: str, upstream_root: str, upstream_pid: int, workdir: Path, logs: list[Path]
) -> tuple[dict[int, list[Pair]], dict[str, float]]:
    """Rounds of a and b at each concurrency, b on a daemon with `store`:
    each round's figures per concurrency, and what the daemon's metrics counted."""
    from tests.redis_server import free_port

    prefix = f"bench-llm-proxy-{os.getpid()}-{store}"
    url = REDIS_URL if store == "redis" else "memory://"
    port = free_port()
    config = workdir / f"{store}.yml"
    section = {"openai": {"upstream": upstream_root}}
    listen = {"listen": f"127.0.0.1:{port}"}
    doc = {"store": {"url": url}, "http": listen, "llm_proxy": section, "bots": []}
    config.write_text(json.dumps(doc), encoding="utf-8")
    log = workdir / f"daemon-{store}.log"
    logs.append(log)
    proc = spawn(["daemon", str(config), prefix], log)
    daemon = f"http://127.0.0.1:{port}"
    a = b = None
    rounds: dict[int, list[Pair]] = {c: [] for c in CONCURRENCY}
    try:
        await wait_healthy(daemon, proc, f"the daemon on {store}")
        a = Contestant("a", f"{upstream_root}/v1", {"fake": upstream_pid})
        b = Contestant("b", f"{daemon}/llm/openai/v1", {"fake": upstream_pid, "daemon": proc.pid})
        plans = [(c, CONVERSATIONS if c > 1 else max(2, CONVERSATIONS // 6)) for c in CONCURRENCY]
        for c, n in plans:  # warm-up: connections, caches, the script cache
            await a.run(c, n)
            await b.run(c, n)
        before = await metrics(daemon)
        for r in range(ROUNDS):
            for c, n in plans:
                runs = await alternate(a, b, c, n, first=a if r % 2 == 0 else b)
                fa, fb = runs["a"].figures(), runs["b"].figures()
                rounds[c].append((fa, fb))
                if r == 0:
                    print(f"-- {store}, {c} at once, {n} conversations of {TURNS} "
                          f"requests a side a round, in {CHUNKS} parts a side; "
                          f"round 1 --\n{header()}")  # fmt: skip
                else:
                    print(f"-- {store}, {c} at once, round {r + 1} --")
                print(row("a", runs["a"]))
                print(row("b", runs["b"]))
                print(ratio_row("b/a", {k: fb[k] / fa[k] for k in fa}), flush=True)
        after = await metrics(daemon)
        if store == "redis" and not await count_keys(f"{prefix}:*"):
            raise Unmeasurable(f"no keys under {prefix}: the daemon did not use {REDIS_URL}")
    finally:
        for x in (a, b):
            if x is not None:
                await x.close()
        stop([proc], f"daemon on {store}")
        if store == "redis":
            await delete_matching(REDIS_URL, f"{prefix}:*")
    return rounds, {k: after.get(k, 0) - before.get(k, 0) for k in after}


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


def spawn(args: list[str], log: Path, stdout: int | None = None) -> subprocess.Popen[bytes]:
    """This file in a process of its own, in one of its roles; stderr (and
    stdout, unless piped) to `log`."""
    with log.open("wb") as sink:
        return subprocess.Popen([sys.executable, __file__, *args], cwd=ROOT,
                                stdout=sink if stdout is None else stdout, stderr=sink)  # fmt: skip


async def start_upstream(workdir: Path, logs: list[Path]) -> tuple[subprocess.Popen[bytes], str]:
    log = workdir / "upstream.log"
    logs.append(log)
    proc = spawn(["upstream", str(TURNS), str(MODEL_MS)], log, subprocess.PIPE)
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), READY_S)
    except TimeoutError:
        line = b""
    if not line.startswith(b"http://"):
        stop([proc], "upstream")
        raise Unmeasurable(f"the fake upstream did not start: {log.read_text()[-2000:]}")
    return proc, line.decode().strip()


async def measure() -> str:
    if "redis" in STORES:
        await check_reachable(REDIS_URL)
    with tempfile.TemporaryDirectory(prefix="bench-llm-proxy-") as tmp:
        workdir, logs = Path(tmp), []
        upstream, root = await start_upstream(workdir, logs)
        results = {}
        try:
            for store in STORES:
                print(f"== b's store: {store} ==", flush=True)
                rounds, counted = await measure_store(store, root, upstream.pid, workdir, logs)
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
            stop([upstream], "upstream")
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


def report(results: dict[str, dict[int, list[Pair]]]) -> str:
    """Per store and concurrency: the medians of the rounds' b/a with their
    range, b - a in ms, the verdicts; the last line's keys."""
    print("medians of the rounds' b/a [lowest-highest round]; b - a in ms, median [range]:")
    last = []
    for store, by_c in results.items():
        for c, pairs in by_c.items():
            ratios = [{k: fb[k] / fa[k] for k in fa} for fa, fb in pairs]
            added = [{k: (fb[k] - fa[k]) * 1000 for k in fa} for fa, fb in pairs]
            med = {k: statistics.median(r[k] for r in ratios) for k in ratios[0]}

            def said(k: str, ratios: list[dict[str, float]] = ratios) -> str:
                xs = [r[k] for r in ratios]
                return f"{statistics.median(xs):.3f} [{min(xs):.3f}-{max(xs):.3f}]"

            def ms(k: str, added: list[dict[str, float]] = added) -> str:
                xs = [r[k] for r in added]
                return f"{statistics.median(xs):+.1f} [{min(xs):+.1f}..{max(xs):+.1f}]"

            print(f"{store}, {c} at once: whole p50 {said('p50')}, p99 {said('p99')}; "
                  f"TTFB p50 {said('ttfb')}, p99 {said('ttfb_p99')}; "
                  f"stream p50 {said('stream')}, p99 {said('stream_p99')}")  # fmt: skip
            print(f"  b - a: whole p50 {ms('p50')} ms, p99 {ms('p99')} ms; "
                  f"TTFB p50 {ms('ttfb')} ms")  # fmt: skip
            for k, target, what in (("p50", P50_TARGET, "whole p50"),
                                    ("p99", P99_TARGET, "whole p99"),
                                    ("ttfb", TTFB_TARGET, "TTFB p50")):  # fmt: skip
                print(f"  {what} b/a {med[k]:.3f} (target <= {target:.2f}): "
                      f"{verdict(med[k] <= target)}")  # fmt: skip
            mode = "" if c == CONCURRENCY[0] else "seq_" if c == 1 else f"c{c}_"
            pre = ("" if store == "redis" else f"{store}_") + mode
            last += [f"{pre}{k}_ratio={med[k]:.3f}" for k in ("p50", "p99", "ttfb")]
    return " ".join(last)


def main() -> int:
    if sys.argv[1:2] == ["upstream"]:
        asyncio.run(serve_upstream(int(sys.argv[2]), float(sys.argv[3])))
        return 0
    if sys.argv[1:2] == ["daemon"]:
        return run_daemon(sys.argv[2], sys.argv[3])
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
