"""Decisions per second through Gateway.handle(), against bare Redis round trips.

Every inbound message costs one admit script call and an answered one a second
(count-the-sent-reply), so the gateway on Redis can be no faster than a bare
round trip. The number that matters is how close it gets: the ratio of
pipeline decisions/s to a bare PING loop, both at the same concurrency, on the
same client settings, on the same machine, measured interleaved in one run.
Absolute rates say more about the machine than about the gateway.

Round trips per message are counted on a private redis-server with MONITOR:
every command a client sent, minus the commands Lua scripts ran inside the
server and minus this benchmark's own control connection. (INFO commandstats
cannot tell them apart: it also counts every redis.call() made inside a script,
so its totals are shown beside the round trips as a measure of script work.)

Run from the repo root:  .venv/bin/python bench/decisions.py
The last line is machine-readable: ratio_redis_vs_ping=<x> rtt_drop=<x> rtt_reply=<x>
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis.asyncio as aioredis
from _redis import main_on_redis, verdict
from redis.asyncio.client import Monitor
from redis.exceptions import RedisError

from gateway.backends import EchoBackend
from gateway.config import BotConfig, parse_config
from gateway.model import Action, Author, ChatKind, ChatRef, Message
from gateway.pipeline import Gateway
from gateway.store import MemoryStore
from gateway.store.redis import RedisStore

CONCURRENCY = 16
CHATS = 1000
PER_CHAT = 5  # messages per ordinary chat per run
BUSY_SHARE = 0.1  # chats whose people mention the bot often enough to hit the rate cap
BUSY_PER_CHAT = 9  # all addressed: 6 answered, 3 rate-capped
# Rounds run the four measurements in alternating order (ABBA, against drift);
# more rounds while the time budget allows.
MIN_ROUNDS, MAX_ROUNDS, ROUNDS_BUDGET_S = 3, 5, 40.0
RTT_CHATS = 250  # chats in each round-trip counting phase
BOT = "bench"
OTHER_BOTS = ("alpha-bot", "beta-bot")

TARGET_RATIO = 0.6
TARGET_RTT_DROP = 1.0
TARGET_RTT_REPLY = 2.0

MIXED_CONFIG = f"""
bots:
  - name: {BOT}
    platform: http
    backend: {{type: echo}}
"""
# Every addressed message answered: the round-trip phase must never hit the cap.
UNCAPPED_CONFIG = f"""
bots:
  - name: {BOT}
    platform: http
    backend: {{type: echo}}
    rate_cap: {{max_replies: 1000000}}
"""

T = TypeVar("T")


# --------------------------------------------------------------------------
# Traffic
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Spec:
    """One message of the traffic, before it gets a per-run id."""

    chat: int
    kind: str  # "addressed" | "unaddressed" | "bot"
    author: str


def mixed_traffic(chats: int, seed: int = 1) -> list[Spec]:
    """Per chat a third each of people mentioning the bot, people talking among
    themselves and two other bots; in busy chats every message mentions the bot,
    so the rate cap (6 per 120 s) bites. Interleaved across chats (message 1 of
    every chat, then message 2, ...), as concurrent chats would arrive."""
    rng = random.Random(seed)
    per: list[list[Spec]] = []
    for c in range(chats):
        busy = rng.random() < BUSY_SHARE
        row: list[Spec] = []
        for _ in range(BUSY_PER_CHAT if busy else PER_CHAT):
            kind = "addressed" if busy else rng.choice(("addressed", "unaddressed", "bot"))
            author = rng.choice(OTHER_BOTS) if kind == "bot" else f"user-{rng.randrange(5)}"
            row.append(Spec(c, kind, author))
        per.append(row)
    return [row[i] for i in range(BUSY_PER_CHAT) for row in per if i < len(row)]


def dropped_traffic(chats: int) -> list[Spec]:
    """Only messages this bot never answers: other bots and unaddressed people."""
    pattern = (("bot", "alpha-bot"), ("unaddressed", "user-1"), ("bot", "beta-bot"),
               ("bot", "alpha-bot"))  # fmt: skip
    return [Spec(c, kind, author) for kind, author in pattern for c in range(chats)]


def answered_traffic(chats: int) -> list[Spec]:
    return [Spec(c, "addressed", f"user-{i}") for i in range(2) for c in range(chats)]


def messages(specs: Sequence[Spec], run: str) -> list[Message]:
    """Real Message objects with ids unique to this run (the store de-duplicates by id)."""
    out = []
    for i, s in enumerate(specs):
        is_bot = s.kind == "bot"
        addressed = s.kind == "addressed"
        out.append(
            Message(
                id=f"{run}-{i}",
                chat=ChatRef(platform="http", id=f"chat-{s.chat}", kind=ChatKind.GROUP),
                author=Author(id=s.author, name=s.author.title(), is_bot=is_bot),
                text=f"hi @{BOT}, message {i}" if addressed else f"just chatting, message {i}",
                mentions=(BOT,) if addressed else (),
            )
        )
    return out


# --------------------------------------------------------------------------
# The harness: 16 workers pulling from one queue
# --------------------------------------------------------------------------


async def drive(items: Sequence[T], op: Callable[[T], Awaitable[object]]) -> tuple[float, float]:
    """Run `op` over every item with CONCURRENCY workers; wall and CPU seconds."""
    queue: asyncio.Queue[T] = asyncio.Queue()
    for item in items:
        queue.put_nowait(item)

    async def worker() -> None:
        while True:
            try:
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await op(item)

    gc.collect()
    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return time.perf_counter() - started, time.process_time() - cpu


async def warm_pool(client: aioredis.Redis) -> None:
    """Open CONCURRENCY connections up front, so no timed or counted phase pays
    for (or sends the commands of) a connection handshake."""
    await asyncio.gather(*(client.ping() for _ in range(CONCURRENCY)))


def decide_op(gw: Gateway, tally: Counter[str]) -> Callable[[Message], Awaitable[None]]:
    """What an adapter does with one inbound message."""

    async def op(msg: Message) -> None:
        d = await gw.handle(msg)
        if d.action is Action.REPLY:
            await gw.sent(d, "r-" + msg.id, d.replies[0])
            tally["reply"] += 1
        else:
            tally[f"{d.action.value}:{d.reason.value if d.reason else '-'}"] += 1

    return op


# Top-level commands whose commandstats time is the time Redis spent on a call
# (a script's own time includes the redis.call()s it made).
SCRIPT_CALLS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")
TOP_LEVEL = ("ping", *SCRIPT_CALLS)


@dataclass
class Run:
    seconds: float
    cpu: float  # this process's CPU seconds: the gateway and redis-py
    ops: int
    tally: Counter[str] = field(default_factory=Counter)
    server_usec: int | None = None  # Redis's time in the calls (commandstats)

    @property
    def rate(self) -> float:
        return self.ops / self.seconds

    @property
    def cpu_us(self) -> float:
        return self.cpu * 1e6 / self.ops

    @property
    def server_us(self) -> float | None:
        return None if self.server_usec is None else self.server_usec / self.ops


class Bench:
    def __init__(self, url: str, ctl: aioredis.Redis, bare: aioredis.Redis) -> None:
        self.url = url
        self.ctl = ctl  # control connection: INFO, SCAN/UNLINK, the MONITOR sentinel
        self.bare = bare  # the PING / trivial EVALSHA baseline client
        self.trivial = bare.register_script("return 1")
        self.mixed = parse_config(MIXED_CONFIG).bots[0]
        self.uncapped = parse_config(UNCAPPED_CONFIG).bots[0]
        self.runs = 0
        self.prefix_base = f"bbbench-{os.getpid()}-{int(time.time())}"

    def run_id(self) -> str:
        self.runs += 1
        return f"r{self.runs}"

    async def on_redis(
        self, items: Sequence[T], op: Callable[[T], Awaitable[object]], tally: Counter[str]
    ) -> Run:
        """A timed run, with Redis's own time for it read from commandstats."""
        before = await self.ctl.info("commandstats")
        wall, cpu = await drive(items, op)
        after = await self.ctl.info("commandstats")
        return Run(wall, cpu, len(items), tally, usec_delta(before, after, TOP_LEVEL))

    async def ping(self, n: int) -> Run:
        async def op(_: int) -> None:
            await self.bare.ping()

        return await self.on_redis(range(n), op, Counter())

    async def evalsha(self, n: int) -> Run:
        async def op(_: int) -> None:
            await self.trivial()

        return await self.on_redis(range(n), op, Counter())

    async def memory_pipeline(self, specs: Sequence[Spec]) -> Run:
        msgs = messages(specs, self.run_id())
        tally: Counter[str] = Counter()
        gw = Gateway(self.mixed, MemoryStore(), EchoBackend())
        wall, cpu = await drive(msgs, decide_op(gw, tally))
        return Run(wall, cpu, len(msgs), tally)

    async def open_store(self, run: str) -> RedisStore:
        store = RedisStore.from_url(self.url, prefix=f"{self.prefix_base}-{run}")
        assert isinstance(store.client, aioredis.Redis)
        await warm_pool(store.client)
        return store

    async def drop_keys(self, prefix: str) -> None:
        batch: list[str] = []
        async for key in self.ctl.scan_iter(match=f"{prefix}:*", count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                await self.ctl.unlink(*batch)
                batch.clear()
        if batch:
            await self.ctl.unlink(*batch)

    async def redis_pipeline(self, specs: Sequence[Spec]) -> Run:
        run = self.run_id()
        msgs = messages(specs, run)
        tally: Counter[str] = Counter()
        store = await self.open_store(run)
        try:
            gw = Gateway(self.mixed, store, EchoBackend())
            return await self.on_redis(msgs, decide_op(gw, tally), tally)
        finally:
            await store.close()
            await self.drop_keys(store.prefix)

    async def count_round_trips(self, specs: Sequence[Spec], bot: BotConfig) -> Trips:
        """Run `specs` through the gateway on Redis under MONITOR and count what
        clients sent, apart from this benchmark's control connection."""
        run = self.run_id()
        msgs = messages(specs, run)
        trips = Trips(len(msgs), Counter())
        sentinel = f"bbbench-end-{run}"
        async with AsyncExitStack() as stack:
            store = await self.open_store(run)
            stack.push_async_callback(self.drop_keys, store.prefix)
            stack.push_async_callback(store.close)
            mon = aioredis.from_url(self.url, decode_responses=True)
            stack.push_async_callback(mon.aclose)
            listener: asyncio.Task[None] | None = None
            try:
                monitor = await stack.enter_async_context(mon.monitor())
            except RedisError as exc:  # refused, e.g. on a managed Redis
                trips.note = f"MONITOR unavailable ({exc}); counted script calls only"
            else:
                me = str((await self.ctl.client_info())["addr"])
                listener = asyncio.create_task(listen(monitor, me, f"ECHO {sentinel}", trips))
                stack.callback(listener.cancel)
            gw = Gateway(bot, store, EchoBackend())
            before = await self.ctl.info("commandstats")
            await drive(msgs, decide_op(gw, trips.tally))
            after = await self.ctl.info("commandstats")
            trips.server = commandstats_delta(before, after)
            if listener is not None:
                await self.ctl.echo(sentinel)
                await asyncio.wait_for(listener, 60)
                trips.monitored = True
        return trips


async def listen(monitor: Monitor, me: str, sentinel: str, trips: Trips) -> None:
    """Tally MONITOR's feed until the control connection sends `sentinel`."""
    async for cmd in monitor.listen():
        if cmd["client_type"] == "lua":
            trips.lua += 1
        elif f"{cmd['client_address']}:{cmd['client_port']}" == me:
            if cmd["command"] == sentinel:
                return
        else:
            trips.client[cmd["command"].split(" ", 1)[0].upper()] += 1


@dataclass
class Trips:
    messages: int
    tally: Counter[str]
    client: Counter[str] = field(default_factory=Counter)  # commands sent by clients
    lua: int = 0  # commands run by scripts inside the server
    server: Counter[str] = field(default_factory=Counter)  # commandstats deltas
    monitored: bool = False
    note: str = ""

    @property
    def round_trips(self) -> int:
        if self.monitored:
            return sum(self.client.values())
        return sum(self.server[c] for c in SCRIPT_CALLS)

    @property
    def per_message(self) -> float:
        return self.round_trips / self.messages


def usec_delta(before: dict[str, Any], after: dict[str, Any], commands: Sequence[str]) -> int:
    return sum(
        int(after.get(f"cmdstat_{c}", {}).get("usec", 0))
        - int(before.get(f"cmdstat_{c}", {}).get("usec", 0))
        for c in commands
    )


def commandstats_delta(before: dict[str, Any], after: dict[str, Any]) -> Counter[str]:
    """Calls (including rejected ones, which were round trips too) per command,
    minus this benchmark's own INFO calls."""
    out: Counter[str] = Counter()
    for key, stats in after.items():
        old = before.get(key, {})
        n = sum(int(stats.get(f, 0)) - int(old.get(f, 0)) for f in ("calls", "rejected_calls"))
        name = key.removeprefix("cmdstat_")
        if n and name != "info":
            out[name] = n
    return out


# --------------------------------------------------------------------------
# Redis to measure against
# --------------------------------------------------------------------------


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------


def median(runs: Sequence[Run]) -> float:
    return statistics.median(r.rate for r in runs)


def mix(tally: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(tally.items(), key=lambda kv: -kv[1]))


@dataclass
class Results:
    version: str
    private: bool
    runs: dict[str, list[Run]]
    drop: Trips
    reply: Trips


async def measure(url: str, private: bool) -> Results:
    ctl = aioredis.Redis.from_url(url, decode_responses=True, single_connection_client=True)
    bare = aioredis.from_url(url, decode_responses=True)  # RedisStore's client settings
    bench = Bench(url, ctl, bare)
    try:
        version = (await ctl.info("server"))["redis_version"]
        where = "a private redis-server" if private else f"REDIS_URL {url}"
        print(
            f"decisions: concurrency {CONCURRENCY}, {CHATS} chats of mixed traffic, "
            f"{MIN_ROUNDS}-{MAX_ROUNDS} rounds interleaved; Redis {version} on {where}",
            flush=True,
        )
        if not private:
            print("NOTE: shared Redis: commandstats and MONITOR may include foreign traffic")
        traffic = mixed_traffic(CHATS)
        n = len(traffic)
        # PING runs right next to the Redis pipeline, in both orders (ABBA).
        kinds: dict[str, Callable[[], Awaitable[Run]]] = {
            "ping": lambda: bench.ping(n),
            "redis": lambda: bench.redis_pipeline(traffic),
            "evalsha": lambda: bench.evalsha(n),
            "memory": lambda: bench.memory_pipeline(traffic),
        }

        # Warm-up: fill the connection pools, load the scripts (NOSCRIPT -> SCRIPT LOAD).
        await warm_pool(bare)
        await bench.ping(CONCURRENCY * 20)
        await bench.evalsha(CONCURRENCY * 20)
        await bench.redis_pipeline(traffic[: n // 10])
        await bench.memory_pipeline(traffic[: n // 10])

        runs: dict[str, list[Run]] = {k: [] for k in kinds}
        started = time.perf_counter()
        for r in range(MAX_ROUNDS):
            round_started = time.perf_counter()
            order = list(kinds) if r % 2 == 0 else list(reversed(kinds))
            for key in order:
                runs[key].append(await kinds[key]())
            rates = "  ".join(f"{k} {v[-1].rate:,.0f}/s" for k, v in runs.items())
            print(f"  round {r + 1}: {rates}", flush=True)
            now = time.perf_counter()
            if r + 1 >= MIN_ROUNDS and now - started + (now - round_started) > ROUNDS_BUDGET_S:
                break

        drop = await bench.count_round_trips(dropped_traffic(RTT_CHATS), bench.mixed)
        reply = await bench.count_round_trips(answered_traffic(RTT_CHATS), bench.uncapped)
    finally:
        await bare.aclose()
        await ctl.aclose()
    return Results(version, private, runs, drop, reply)


LABELS = {
    "ping": "bare PING",
    "redis": "pipeline on Redis",
    "evalsha": "bare EVALSHA 'return 1'",
    "memory": "pipeline on memory",
}


def median_of(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def report(res: Results) -> str:
    """The human-readable table; returns the machine-readable last line."""
    runs = res.runs
    # Each round measures PING right next to the Redis pipeline: the median of
    # these paired ratios resists a noisy machine better than a ratio of medians.
    paired = [a.rate / b.rate for a, b in zip(runs["redis"], runs["ping"], strict=True)]
    ratio = statistics.median(paired)
    print()
    head = "".join(f"{'round ' + str(i + 1):>9}" for i in range(len(paired)))
    print(f"{'ops/s, 16 workers':<25}{head}{'median':>9}{'CPU us':>8}{'Redis us':>9}")
    for key, rs in runs.items():
        cpu = median_of([r.cpu_us for r in rs])
        server = median_of([r.server_us for r in rs])
        shown = "-" if server is None else f"{server:.1f}"
        print(f"{LABELS[key]:<25}" + "".join(f"{r.rate:>9,.0f}" for r in rs)
              + f"{median(rs):>9,.0f}{cpu:>8.0f}{shown:>9}")  # fmt: skip
    print(f"{'Redis pipeline / PING':<25}" + "".join(f"{x:>9.2f}" for x in paired)
          + f"{ratio:>9.2f}")  # fmt: skip
    ping, evalsha = median(runs["ping"]), median(runs["evalsha"])
    red, mem = median(runs["redis"]), median(runs["memory"])
    cpu_ping = median_of([r.cpu_us for r in runs["ping"]]) or 0.0
    cpu_red = median_of([r.cpu_us for r in runs["redis"]]) or 1.0
    print(
        "CPU us: this process's CPU per operation (gateway + redis-py); Redis us: Redis's own\n"
        "time per operation (commandstats). Ratios of the medians: pipeline/PING "
        f"{red / ping:.2f},\nEVALSHA/PING {evalsha / ping:.2f}, memory/Redis {mem / red:.1f}x; "
        f"by CPU per operation, PING/pipeline {cpu_ping / cpu_red:.2f}\n(CPU time is robust "
        "to a busy machine; it bounds the ratio while this process is the bottleneck)"
    )

    tally = runs["redis"][-1].tally
    n = runs["redis"][-1].ops
    print(f"mix per run ({n} messages): {mix(tally)}")
    if tally != runs["memory"][-1].tally:
        print(f"  WARNING: the memory store decided differently: {mix(runs['memory'][-1].tally)}")
    # Answered messages cost a second script call. Unbatched, that would bound the
    # ratio at 1/trips; the store's automatic pipelining shares trips between
    # messages in flight, so it can do better than that.
    trips = (n + tally["reply"]) / n
    print(
        f"  {trips:.2f} script calls per decision (1 per drop, 2 per reply): one call per\n"
        f"  trip would cap the ratio at ~{1 / trips:.2f}; this run made {ratio * trips:.2f}\n"
        f"  script calls per bare PING (calls in flight share trips)"
    )

    for label, t in (("dropped", res.drop), ("answered", res.reply)):
        sent = ", ".join(f"{k} {v}" for k, v in t.client.most_common()) or "-"
        server = sum(t.server.values())
        print(f"{label} phase: {t.messages} messages ({mix(t.tally)})")
        inside = t.lua / t.messages
        print(
            f"  sent to Redis: {sent}; scripts ran {inside:.1f} commands/message inside;\n"
            f"  commandstats: {server / t.messages:.2f} calls/message (it counts those too)"
        )
        if t.note:
            print(f"  NOTE: {t.note}")
    drop, reply = res.drop, res.reply
    if not drop.tally or not all(k.startswith("drop:") for k in drop.tally):
        print("  WARNING: the dropped phase had messages that were not dropped")
    if reply.tally != Counter({"reply": reply.messages}):
        print("  WARNING: the answered phase had messages that were not answered")

    rtt_drop, rtt_reply = drop.per_message, reply.per_message
    print()
    print(f"{'target':<36}{'measured':>10}{'wanted':>10}  result")
    rows = (
        ("Redis pipeline / bare PING", ratio, f">= {TARGET_RATIO:.2f}", ratio >= TARGET_RATIO),
        ("round trips per dropped message", rtt_drop, f"= {TARGET_RTT_DROP:.2f}",
         drop.round_trips == TARGET_RTT_DROP * drop.messages),
        ("round trips per answered message", rtt_reply, f"<= {TARGET_RTT_REPLY:.2f}",
         reply.round_trips <= TARGET_RTT_REPLY * reply.messages),
    )  # fmt: skip
    for name, value, target, ok in rows:
        print(f"{name:<36}{value:>10.2f}{target:>10}  {verdict(ok)}")
    return f"ratio_redis_vs_ping={ratio:.2f} rtt_drop={rtt_drop:.2f} rtt_reply={rtt_reply:.2f}"


async def run(url: str, private: bool) -> str:
    return report(await measure(url, private))


def main() -> int:
    return main_on_redis("decisions", run)


if __name__ == "__main__":
    sys.exit(main())
