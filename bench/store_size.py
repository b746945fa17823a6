"""Redis bytes per active chat: what one more busy chat costs the shared store.

Every key of a chat carries its hash tag (`bb:{discord:<channel>}:…`) and a TTL,
so an idle chat costs nothing once it expires; an active one costs the sum of
its keys. This benchmark drives realistic traffic through the real pipeline
(`Gateway.handle()`, then `Gateway.sent()` for each answer, as an adapter does)
on a real `RedisStore` with the daemon's defaults (limits, TTLs, and the
context size `gateway.daemon.context_size()` gives the config), then asks Redis
`MEMORY USAGE <key> SAMPLES 0` for every key of every chat and reports the
averages per key type.

Traffic: CHATS Discord-shaped group chats (19-digit snowflake ids for the
channel, the messages and the authors), PER_CHAT inbound messages each, in
random order per chat: people addressing the bot (answered by the echo backend
until the rate cap of 6 per 120 s stops it), people talking among themselves,
another bot (ignored under the default `bot_messages: off`, but counted) and
an occasional system message. Chats are interleaved, WORKERS at a time.

Scenarios:
- echo: the default bot (echo backend): the store keeps no context (context 0).
- ctx8: a bot whose backend gets 8 messages of context (webhook/openai default,
  or `reply_decision` on): the store keeps the last 8 (+1) messages' text.
- full (information, no target): a few chats with SATURATED_PER_CHAT messages,
  where the dedupe memory (128 ids) and the decision log (50 entries) are full:
  the most one chat can cost.

The total per chat is the sum of MEMORY USAGE over its keys (the value, the
key's name and its main-dictionary entry); Redis also keeps an entry per key in
its expires dictionary, which MEMORY USAGE leaves out, so the INFO
`used_memory` growth per chat is shown beside it on a private server.

Run from the repo root:  .venv/bin/python bench/store_size.py
The last line is machine-readable: bytes_per_chat=<n> bytes_per_chat_ctx8=<n>
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass

import redis.asyncio as aioredis
from _redis import main_on_redis, redis_version, verdict

from gateway.backends import EchoBackend
from gateway.config import Config, parse_config
from gateway.daemon import context_size
from gateway.model import Action, Author, ChatKind, ChatRef, Message
from gateway.pipeline import Gateway
from gateway.store.redis import RedisStore

CHATS = 1000
PER_CHAT = 30
SATURATED_CHATS = 20
SATURATED_PER_CHAT = 300
WORKERS = 16
TARGET_BYTES = 1024
SEED = 7

# The bot's config as a deployment would write it; only the backend differs.
ECHO_CONFIG = """
bots:
  - name: helper
    platform: http
    backend: {type: echo}
"""
CTX_CONFIG = """
bots:
  - name: helper
    platform: http
    backend: {type: webhook, url: "http://127.0.0.1:9/reply"}   # context_messages: 8
"""

KEY_ROLES = {
    "st": "counters, reset epoch, spoke marks, warn claims",
    "cfg": "pause and limit overrides (admins only)",
    "ids": "dedupe: message id -> counted kind and counters, bots that handled it",
    "idq": "dedupe: ids in arrival order (evicts the oldest past 128)",
    "pr": "pair windows and cooldowns",
    "ctx": "recent messages for the classifier/backend",
    "log": "decision log (`why`), newest 50",
    "r": "rate-cap slots of one bot (120 s window)",
    "pc": "machine pace: when each person was last answered, fast answers back",
}

_CHATTER = (
    "the deploy is green again but the cache looks cold can someone check why "
    "lunch meeting tomorrow at noon please bring the numbers for the quarter "
    "I think the bot misread that thanks for the link works for me"
)
WORDS = _CHATTER.split()


def snowflake(rng: random.Random) -> str:
    """A Discord id of today: 19 digits."""
    return str(1_300_000_000_000_000_000 + rng.randrange(10**17))


def sentence(rng: random.Random) -> str:
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < rng.randrange(30, 140):
        words.append(rng.choice(WORDS))
    return " ".join(words)


@dataclass(frozen=True, slots=True)
class Traffic:
    bot_id: str
    chats: list[str]  # store keys, e.g. "discord:1300…"
    rounds: list[list[Message]]  # message i of every chat, then i + 1, …


def traffic(rng: random.Random, chats: int, per_chat: int) -> Traffic:
    bot_id = snowflake(rng)
    rows: list[list[Message]] = []
    keys = []
    for _ in range(chats):
        chat = ChatRef(platform="discord", id=snowflake(rng), kind=ChatKind.GROUP)
        keys.append(chat.key)
        people = [Author(snowflake(rng), rng.choice(("Ana", "Bo", "Chen", "Dee")))
                  for _ in range(4)]  # fmt: skip
        other_bot = Author(snowflake(rng), "Weatherbot", is_bot=True)
        row = []
        for _ in range(per_chat):
            r = rng.random()
            author, system = rng.choice(people), False
            mentions: tuple[str, ...] = ()
            text = sentence(rng)
            if r < 0.25:  # addressed: answered until the rate cap
                text, mentions = f"<@{bot_id}> {text}", (bot_id,)
            elif r < 0.65:  # people among themselves
                pass
            elif r < 0.93:  # another bot: counted, ignored (bot_messages: off)
                author = other_bot
            else:  # a pin, a join
                text, system = f"{author.name} pinned a message.", True
            row.append(Message(id=snowflake(rng), chat=chat, author=author, text=text,
                               mentions=mentions, system=system))  # fmt: skip
        rows.append(row)
    rounds = [[row[i] for row in rows] for i in range(per_chat)]
    return Traffic(bot_id, keys, rounds)


async def drive(gw: Gateway, t: Traffic, rng: random.Random) -> Counter[str]:
    """Each round's messages WORKERS at a time; an answer is sent and counted
    under a fresh platform id, as the Discord adapter does."""
    tally: Counter[str] = Counter()

    async def one(msg: Message) -> None:
        d = await gw.handle(msg)
        if d.action is Action.REPLY:
            await gw.sent(d, snowflake(rng), d.replies[0])
        tally[f"{d.action.value}:{d.reason.value if d.reason else '-'}"] += 1

    async def worker(queue: list[Message]) -> None:
        while queue:
            await one(queue.pop())

    for msgs in t.rounds:
        queue = list(reversed(msgs))
        await asyncio.gather(*(worker(queue) for _ in range(WORKERS)))
    return tally


def key_type(key: str) -> str:
    """`bb:{discord:1}:st` -> `st`; `bb:{discord:1}:r:<bot>` -> `r`."""
    return key.rsplit("}:", 1)[1].split(":", 1)[0]


@dataclass
class Sizes:
    label: str
    chats: int
    messages: int
    per_type: dict[str, list[int]]  # bytes of each chat's key of that type
    encodings: dict[str, Counter[str]]
    totals: list[int]  # per chat
    used_memory_delta: int | None  # INFO used_memory growth, private server only
    tally: Counter[str]

    @property
    def per_chat(self) -> float:
        return statistics.fmean(self.totals)


async def measure(
    url: str, private: bool, label: str, config: Config, chats: int, per_chat: int, seed: int
) -> Sizes:
    bot = config.bots[0]
    ctx = context_size(config)
    client = aioredis.from_url(url, decode_responses=True)
    store = RedisStore(client, state_ttl_seconds=config.store.state_ttl_seconds,
                       settings_ttl_seconds=config.store.settings_ttl_seconds,
                       context_size=ctx)  # fmt: skip
    rng = random.Random(seed)
    t = traffic(rng, chats, per_chat)
    gw = Gateway(bot, store, EchoBackend(), bot_id=t.bot_id)
    keys: list[str] = []
    try:
        if private:
            await client.flushdb()  # our own server: nothing else lives there
        await client.ping()
        before = int((await client.info("memory"))["used_memory"])
        tally = await drive(gw, t, rng)
        after = int((await client.info("memory"))["used_memory"])
        for chat in t.chats:
            base = store.keys(chat).base
            keys += [k async for k in client.scan_iter(match=f"{_glob(base)}:*", count=1000)]
        pipe = client.pipeline(transaction=False)
        for k in keys:
            pipe.memory_usage(k, samples=0)
            pipe.object("encoding", k)
        out = await pipe.execute()
    finally:
        if not private and keys:
            await client.delete(*keys)
        await store.close()
    per_type: dict[str, list[int]] = defaultdict(list)
    encodings: dict[str, Counter[str]] = defaultdict(Counter)
    totals: dict[str, int] = dict.fromkeys(t.chats, 0)
    for k, size, enc in zip(keys, out[::2], out[1::2], strict=True):
        kind = key_type(k)
        per_type[kind].append(int(size))
        encodings[kind][str(enc)] += 1
        totals[k.split("{", 1)[1].rsplit("}:", 1)[0]] += int(size)  # KeyError: not our chat
    assert all(totals.values()), "a chat has no keys: the traffic did not reach Redis"
    delta = (after - before) if private else None
    return Sizes(label, chats, chats * per_chat, per_type, encodings, list(totals.values()),
                 delta, tally)  # fmt: skip


def _glob(s: str) -> str:
    """Escape a key for SCAN MATCH (the hash tag's braces are literal)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in s)


def report(s: Sizes, config: Config) -> None:
    print()
    print(f"{s.label}: {s.chats} chats x {s.messages // s.chats} inbound messages, "
          f"context_size {context_size(config)}; decisions: "
          + ", ".join(f"{k} {v}" for k, v in s.tally.most_common()))  # fmt: skip
    print(f"{'key':<5}{'chats':>7}{'avg bytes':>11}{'per chat':>10}{'share':>7}  "
          f"{'encoding':<22}what")  # fmt: skip
    per_chat = s.per_chat
    rows = sorted(s.per_type.items(), key=lambda kv: -sum(kv[1]))
    for kind, sizes in rows:
        share_of_chat = sum(sizes) / s.chats
        enc = ", ".join(f"{e} {n}" for e, n in s.encodings[kind].most_common(2))
        print(f"{kind:<5}{len(sizes):>7}{statistics.fmean(sizes):>11.0f}{share_of_chat:>10.0f}"
              f"{share_of_chat / per_chat:>7.0%}  {enc:<22}{KEY_ROLES.get(kind, '?')}")  # fmt: skip
    print(
        f"{'total':<5}{s.chats:>7}{'':>11}{per_chat:>10.0f}{'':>7}  "
        f"min {min(s.totals)}, median {statistics.median(s.totals):.0f}, max {max(s.totals)}"
    )
    if s.used_memory_delta is not None:
        print(
            f"INFO used_memory grew {s.used_memory_delta / s.chats:.0f} bytes per chat "
            "(also counts expires entries and the key dictionaries' tables)"
        )


async def run(url: str, private: bool) -> str:
    echo, ctx8 = parse_config(ECHO_CONFIG), parse_config(CTX_CONFIG)
    assert (context_size(echo), context_size(ctx8)) == (0, 8)
    version = await redis_version(url)
    where = "a private redis-server" if private else f"REDIS_URL {url} (keys deleted after)"
    print(f"store_size: Redis {version} ({where}); MEMORY USAGE SAMPLES 0 of every key of "
          f"every chat, after traffic through Gateway.handle()/sent() on RedisStore")  # fmt: skip
    a = await measure(url, private, "echo", echo, CHATS, PER_CHAT, SEED)
    report(a, echo)
    b = await measure(url, private, "ctx8", ctx8, CHATS, PER_CHAT, SEED)
    report(b, ctx8)
    full = await measure(url, private, "full (information)", ctx8, SATURATED_CHATS,
                         SATURATED_PER_CHAT, SEED)  # fmt: skip
    report(full, ctx8)
    print()
    print(f"{'target':<40}{'measured':>10}{'wanted':>10}  result")
    for name, value in (("bytes per active chat (echo)", a.per_chat),
                        ("bytes per active chat (context 8)", b.per_chat)):  # fmt: skip
        ok = value <= TARGET_BYTES
        print(f"{name:<40}{value:>10.0f}{f'<= {TARGET_BYTES}':>10}  {verdict(ok)}")
    print(f"{'a full chat (no target)':<40}{full.per_chat:>10.0f}")
    return f"bytes_per_chat={a.per_chat:.0f} bytes_per_chat_ctx8={b.per_chat:.0f}"


def main() -> int:
    return main_on_redis("store_size", run)


if __name__ == "__main__":
    sys.exit(main())
