"""The latency botbouncer adds around a reply-decision (classifier) call.

With `reply_decision` enabled, a group message that passes every rule and
that nobody addressed to the bot (here a person talking in a group the bot
answers under `respond_to: all`) costs one chat-completions POST to a cheap
model before the backend runs; a person who addresses the bot is never
classified.
The model's own time is not ours; what surrounds it is: the pipeline, the
store, the prompt, chat_completion() on the shared session, the echo backend.
This benchmark times, sequentially (concurrency 1), in one run, interleaved:

  (a) bare        a plain aiohttp.ClientSession POST of the same chat-completions
                  body the classifier sends, reading and parsing the JSON answer
  (b) botbouncer  `await gw.handle(msg)` for such a message, classifier on, echo
                  backend, memory store: the classifier's POST is its only I/O

against the test suite's fake LLM server (tests/fakes/llm/), run in this
process, which waits a fixed "model time" before answering REPLY. That delay
is subtracted from every sample of both sides, so the ratio b/a of the p50s
(and of the p99s) compares what surrounds the model call. Target: <= 1.10.

Run from the repo root:  .venv/bin/python bench/classifier.py
The last line is machine-readable: p50_ratio=<x> p99_ratio=<x>
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for `tests` and `gateway`

import aiohttp

from gateway.config import parse_config
from gateway.daemon import build_gateway
from gateway.logs import TextFormatter
from gateway.model import Action, Author, ChatRef, Message
from gateway.outbound import Outbound
from gateway.pipeline import Gateway
from gateway.store import ContextEntry, MemoryStore
from tests.fakes.llm import FakeLLM, answer, slow

MODEL_S = 0.005  # the fake's fixed model time, subtracted from every sample
WARMUP = 200  # per side, before anything is recorded
CHUNK = 50  # samples in a row of one side; chunks alternate A B / B A
PER_ROUND = 400  # samples per side per round
LOGGED_EVERY = 8  # one chunk with INFO decision logging after every 8th A/B pair
# More rounds while the time budget allows.
MIN_ROUNDS, MAX_ROUNDS, ROUNDS_BUDGET_S = 3, 5, 32.0
# Each addressed message reserves a rate-cap slot that the benchmark never
# gives back, and MemoryStore.admit() scans the chat's whole window on every
# message. One chat taking thousands of messages would grow that scan
# (~40 us per 1,000 slots on the machine this was written on) and make the
# later rounds slower than the first. Spread over CHATS chats, a window holds
# a few dozen slots, as a real chat's (at most max_replies) does.
CHATS = 64
CONTEXT = 8  # recent messages per chat; primed before timing so every prompt carries all 8
TARGET = 1.10

BOT = "helper"

SIDES = ("bare", "classifier", "botbouncer", "logged")
LABELS = {
    "bare": "bare aiohttp POST",
    "classifier": "botbouncer classifier call",
    "botbouncer": "whole handle()",
    "logged": "handle(), INFO log on",
}


class CannotMeasure(Exception):
    """Something other than latency went wrong: the numbers would mean nothing."""


def config_yaml(url: str) -> str:
    return f"""
bots:
  - name: {BOT}
    platform: http
    backend: {{type: echo}}
    respond_to: all  # the classifier gates what nobody addressed to the bot
    rate_cap: {{max_replies: 1000000}}
    # alice writes in each chat again within seconds of its answer: a
    # machine's pace, which is not what this measures
    machine_pace: {{within_seconds: 0}}
    reply_decision: {{enabled: true, endpoint: '{url}', model: gate, timeout_seconds: 5}}
"""


class Warnings(logging.Handler):
    """Counts WARNING+ records from botbouncer: a failed-open classifier call
    (timeout, HTTP error, unclear answer) still returns REPLY, so the decision
    alone would not show it."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.name}: {record.getMessage()}")


class DecisionLogging:
    """Off: logging.disable(INFO), as the headline numbers are measured. On: the
    pipeline's INFO line per decision, formatted as the daemon formats it and
    written to os.devnull (the 'logged' side)."""

    def __init__(self) -> None:
        self.devnull = open(os.devnull, "w")  # noqa: SIM115 - closed in close()
        out = logging.StreamHandler(self.devnull)
        out.setFormatter(TextFormatter())  # the daemon's (gateway/logs.py)
        self.warnings = Warnings()
        logger = logging.getLogger("botbouncer")
        logger.setLevel(logging.INFO)
        logger.propagate = False
        logger.addHandler(out)
        logger.addHandler(self.warnings)
        self.off()

    def off(self) -> None:
        logging.disable(logging.INFO)

    def on(self) -> None:
        logging.disable(logging.NOTSET)

    def close(self) -> None:
        self.off()
        self.devnull.close()


@dataclass
class Side:
    us: list[float] = field(default_factory=list)  # per call, model time subtracted
    cpu_s: float = 0.0  # this process's CPU time (client + the in-process fake)
    rounds: list[list[float]] = field(default_factory=list)

    def add(self, samples: Sequence[float], cpu_s: float) -> None:
        self.us.extend(samples)
        self.rounds[-1].extend(samples)
        self.cpu_s += cpu_s

    @property
    def cpu_us(self) -> float:
        return self.cpu_s / len(self.us) * 1e6


def p50(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def p99(xs: Sequence[float]) -> float:
    return statistics.quantiles(xs, n=100)[98]


class Bench:
    def __init__(self, llm: FakeLLM, logs: DecisionLogging) -> None:
        self.llm = llm
        self.logs = logs
        self.outbound = Outbound()
        cfg = parse_config(config_yaml(llm.url))
        self.gw: Gateway = build_gateway(
            cfg.bots[0], MemoryStore(context_size=CONTEXT), self.outbound
        )
        self.bare = aiohttp.ClientSession()
        self.body: dict[str, Any] = {}
        self.context = [
            ContextEntry(f"c{i}", "bob", "Bob", False, "did anyone see the match last night?")
            for i in range(CONTEXT)
        ]
        self.n = 0  # message ids are unique: the store de-duplicates

    async def close(self) -> None:
        await self.bare.close()
        await self.outbound.close()

    def message(self, text: str = "what time is it?") -> Message:
        """A person talking in a group, addressing nobody: classified."""
        self.n += 1
        return Message(
            id=f"m{self.n}",
            chat=ChatRef("http", f"room-{self.n % CHATS}"),
            author=Author("alice", "Alice"),
            text=text,
        )

    async def prime(self) -> None:
        """Fill every chat's context with people talking among themselves (the
        model answering SKIP: nothing answered), so every timed prompt is full
        size; then the model answers REPLY."""
        self.llm.default = slow(MODEL_S, answer("SKIP"))
        for _ in range(CHATS * (CONTEXT + 1)):
            msg = self.message("did anyone see the match last night?")
            d = await self.gw.handle(msg)
            if d.action is not Action.DROP:
                raise CannotMeasure(f"priming message was not dropped: {d}")
        if self.llm.count != CHATS * (CONTEXT + 1):
            raise CannotMeasure(f"priming made {self.llm.count} model calls")
        self.llm.default = slow(MODEL_S, answer("REPLY"))

    async def bare_call(self) -> float:
        started = time.perf_counter()
        async with self.bare.post(self.llm.url, json=self.body) as resp:
            raw = await resp.read()
            data = json.loads(raw) if resp.status == 200 else None
        elapsed = time.perf_counter() - started
        try:
            ok = data["choices"][0]["message"]["content"] == "REPLY"
        except (LookupError, TypeError):
            ok = False
        if not ok:
            raise CannotMeasure(f"bare call: HTTP {resp.status}: {raw[:200]!r}")
        return elapsed

    async def gateway_call(self) -> float:
        msg = self.message()
        started = time.perf_counter()
        d = await self.gw.handle(msg)
        elapsed = time.perf_counter() - started
        if self.logs.warnings.records:
            raise CannotMeasure(f"botbouncer warned: {self.logs.warnings.records[0]}")
        if d.action is not Action.REPLY or not d.replies:
            raise CannotMeasure(f"the message was not answered: {d}")
        return elapsed

    async def classifier_call(self) -> float:
        """What botbouncer wraps around the model call: prompt from the recent
        context, the shared session, parsing, the fail-open verdict."""
        classifier = self.gw.classifier
        assert classifier is not None
        msg = self.message()
        started = time.perf_counter()
        verdict = await classifier.decide(msg, self.context)
        elapsed = time.perf_counter() - started
        if verdict.result != "reply":
            raise CannotMeasure(f"the classifier did not answer REPLY: {verdict}")
        return elapsed

    async def run(self, side: str, n: int) -> tuple[list[float], float]:
        """n sequential calls of one side: (µs per call minus model time, CPU s)."""
        calls = {"bare": self.bare_call, "classifier": self.classifier_call}
        call: Callable[[], Awaitable[float]] = calls.get(side, self.gateway_call)
        calls_before = self.llm.count
        if side == "logged":
            self.logs.on()
        try:
            cpu = time.process_time()
            samples = [await call() for _ in range(n)]
            cpu = time.process_time() - cpu
        finally:
            self.logs.off()
        if self.llm.count - calls_before != n:
            raise CannotMeasure(f"{side}: {n} calls made {self.llm.count - calls_before} requests")
        return [(s - MODEL_S) * 1e6 for s in samples], cpu


@dataclass
class Results:
    sides: dict[str, Side]
    body_bytes: int
    seconds: float


def schedule(round_no: int) -> list[str]:
    """One round's chunks: A/B pairs in alternating order, a logged chunk now and then."""
    order: list[str] = []
    for j in range(PER_ROUND // CHUNK):
        trio = ["bare", "classifier", "botbouncer"]
        order += trio if (round_no + j) % 2 == 0 else trio[::-1]
        if j % LOGGED_EVERY == LOGGED_EVERY - 1:
            order.append("logged")
    return order


async def measure() -> Results:
    logs = DecisionLogging()
    try:
        async with FakeLLM() as llm:
            llm.default = slow(MODEL_S, answer("REPLY"))
            bench = Bench(llm, logs)
            try:
                return await rounds(bench)
            finally:
                await bench.close()
    finally:
        logs.close()


async def rounds(bench: Bench) -> Results:
    print(
        f"classifier: sequential calls (concurrency 1) to the in-process fake LLM, "
        f"model time {MODEL_S * 1000:g} ms\nsubtracted from every sample; chunks of {CHUNK} "
        f"alternating A/B, {PER_ROUND} per side per round, {MIN_ROUNDS}-{MAX_ROUNDS} rounds; "
        f"{CHATS} chats\nwith {CONTEXT} messages of context each; decision logging OFF "
        "(logging disabled below WARNING)",
        flush=True,
    )
    await bench.prime()
    await bench.gateway_call()
    body = bench.llm.calls[-1].body
    if body is None:
        raise CannotMeasure("the classifier's request body was not JSON")
    bench.body = body  # the bare side sends exactly what the classifier sent
    # Warm-up: connections open on both sessions, code paths and caches hot.
    for side in SIDES:
        await bench.run(side, WARMUP if side != "logged" else CHUNK)

    sides = {s: Side() for s in SIDES}
    started = time.perf_counter()
    for r in range(MAX_ROUNDS):
        round_started = time.perf_counter()
        for s in sides.values():
            s.rounds.append([])
        gc.collect()
        for side in schedule(r):
            samples, cpu = await bench.run(side, CHUNK)
            sides[side].add(samples, cpu)
        a, b = p50(sides["bare"].rounds[-1]), p50(sides["classifier"].rounds[-1])
        w = p50(sides["botbouncer"].rounds[-1])
        print(
            f"  round {r + 1}: p50 bare {a:,.0f} us, classifier {b:,.0f} us ({b / a:.2f}), "
            f"handle() {w:,.0f} us ({w / a:.2f}) ({time.perf_counter() - round_started:.1f} s)",
            flush=True,
        )
        now = time.perf_counter()
        if r + 1 >= MIN_ROUNDS and now - started + (now - round_started) > ROUNDS_BUDGET_S:
            break
    body_bytes = len(json.dumps(bench.body).encode())
    return Results(sides, body_bytes, time.perf_counter() - started)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def report(res: Results) -> str:
    """The human-readable table; returns the machine-readable last line."""
    sides = res.sides
    bare, bb, whole = sides["bare"], sides["classifier"], sides["botbouncer"]
    print()
    print(f"request body {res.body_bytes} bytes (the classifier's own, replayed by the bare side)")
    print(f"{'us per call, minus model time':<30}{'calls':>7}{'p50':>8}{'p99':>8}{'mean':>8}"
          f"{'CPU us':>8}")  # fmt: skip
    for key, s in sides.items():
        print(f"{LABELS[key]:<30}{len(s.us):>7}{p50(s.us):>8,.0f}{p99(s.us):>8,.0f}"
              f"{statistics.fmean(s.us):>8,.0f}{s.cpu_us:>8,.0f}")  # fmt: skip
    added50, added99 = p50(bb.us) - p50(bare.us), p99(bb.us) - p99(bare.us)
    print(f"{'botbouncer - bare':<30}{'':>7}{added50:>8,.0f}{added99:>8,.0f}"
          f"{statistics.fmean(bb.us) - statistics.fmean(bare.us):>8,.0f}"
          f"{bb.cpu_us - bare.cpu_us:>8,.0f}")  # fmt: skip
    per_round = [p50(b) / p50(a) for a, b in zip(bare.rounds, bb.rounds, strict=True)]
    logged = sides["logged"]
    print(
        "CPU us: this process's CPU per call, the in-process fake server's included (the same\n"
        "on both sides). Per-round p50 ratios: "
        + " ".join(f"{x:.2f}" for x in per_round)
        + f" (median {statistics.median(per_round):.2f}).\n"
        f"Decision logging OFF for the headline rows; with INFO logging formatted as the\n"
        f"daemon does and written to /dev/null, p50 {p50(logged.us):,.0f} us = "
        f"{p50(logged.us) / p50(bare.us):.2f}x bare "
        f"(p99 {p99(logged.us) / p99(bare.us):.2f}x, {len(logged.us)} calls)"
    )
    r50, r99 = p50(bb.us) / p50(bare.us), p99(bb.us) / p99(bare.us)
    print(
        f"Whole handle() (store admit, gating, decision, classifier, echo backend) is "
        f"{p50(whole.us) / p50(bare.us):.2f}x bare at p50,\n"
        f"{p99(whole.us) / p99(bare.us):.2f}x at p99: the pipeline's own cost is "
        "bench/decisions.py's subject."
    )
    print()
    print(f"{'target':<36}{'measured':>10}{'wanted':>10}  result")
    for name, value in (("p50 classifier call / bare", r50), ("p99 classifier call / bare", r99)):
        print(f"{name:<36}{value:>10.2f}{'<= ' + f'{TARGET:.2f}':>10}  {verdict(value <= TARGET)}")
    return f"p50_ratio={r50:.2f} p99_ratio={r99:.2f}"


def main() -> int:
    started = time.perf_counter()
    try:
        results = asyncio.run(measure())
    except (CannotMeasure, OSError, ValueError, aiohttp.ClientError) as exc:
        print(f"classifier: cannot measure: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    last = report(results)
    print(f"({time.perf_counter() - started:.1f} s)")
    print(last)
    return 0


if __name__ == "__main__":
    sys.exit(main())
