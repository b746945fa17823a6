"""The shared store: several replicas and bots, one truth in Redis.

Every decision is one script call (gateway/store/lua/*.lua, registered with
redis-py's `register_script`, which reloads the script after a SCRIPT FLUSH).
All keys of a chat share one hash tag, so a script's keys live on one Redis
Cluster node; time comes from the Redis server unless a test injects a clock.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, unquote

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError
from redis.typing import EncodableT

from gateway import defaults
from gateway.errors import BotbouncerError
from gateway.model import Action, Reason, Turn
from gateway.store.base import (
    CONTEXT_TEXT_CHARS,
    COUNT_CODES,
    DECISION_LOG_SIZE,
    DEDUPE_ENTRIES,
    AdmitRequest,
    AdmitResult,
    ChatStatus,
    ContextEntry,
    Limits,
    Overrides,
    SentRequest,
    SentResult,
    StoreError,
    hold_name,
)
from gateway.store.batching import AutoPipeline
from gateway.store.tickets import ISSUED, split, ticket_key
from gateway.turns import Count, verdict

_OVERRIDE_FIELDS = ("soft_limit", "hard_limit", "max_replies", "rate_window_ms")

# A decision log entry is kept in Redis as a JSON array of these, in this
# order (`at` in integer milliseconds): about half the bytes of the object
# with its key names. admit.lua writes the same array.
LOG_FIELDS = ("at", "bot", "id", "author", "action", "reason", "turn", "soft", "hard")


# What the scripts answer, read by a dict lookup (calling an Enum class looks
# the value up through its metaclass: a microsecond per field per call).
_TURNS = {t.value: t for t in Turn}
_ACTIONS = {a.value: a for a in Action}
_REASONS = {r.value: r for r in Reason}

# How long the key RedisStore.ping writes lives (it holds nothing).
PROBE_TTL_MS = 60_000

# The write check (ping): declared like every script, so Redis refuses it
# when it would refuse them.
_PROBE = """redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
local t = redis.call('TIME')
return {t[1], t[2]}"""

# The policy argument of admit.lua and sent.lua (common.lua unpacks it).
POLICY = struct.Struct("<15d")


_LOG_KEYS = frozenset(LOG_FIELDS)
# one encoder for every entry (json.dumps with options makes one per call)
_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def pack_log(entry: dict[str, Any]) -> str:
    if entry.keys() != _LOG_KEYS:  # not a Decision's entry: kept as given
        return _compact(entry)
    values = [entry[f] for f in LOG_FIELDS]
    values[0] = round(values[0] * 1000)
    return _compact(values)


def unpack_log(raw: str | bytes) -> dict[str, Any]:
    value = json.loads(raw)
    if isinstance(value, dict):  # not a Decision's, or written before LOG_FIELDS
        return value
    entry = dict(zip(LOG_FIELDS, value, strict=True))
    entry["at"] = entry["at"] / 1000
    return entry


def unpack_context(raw: str | bytes) -> ContextEntry:
    v = json.loads(raw)
    if isinstance(v, dict):  # written by a version before the positional form
        v = [v["id"], v["author"], v["name"], v["bot"], v["text"]]
    return ContextEntry(str(v[0]), str(v[1]), str(v[2]), bool(v[3]), str(v[4]))


def _lua(name: str) -> str:
    return (resources.files("gateway.store") / "lua" / name).read_text(encoding="utf-8")


# Every script is declared (Redis 7's shebang, no flags): Redis then decides
# before it runs whether it may write, and a Redis out of memory (`maxmemory`
# with `noeviction`) refuses the whole call up front. A script without it is
# stopped at its first write past the limit, after the writes before it: half
# a decision (an id marked counted, no count) left behind.
SHEBANG = "#!lua\n"


def register(client: aioredis.Redis | RedisCluster, *parts: str) -> AsyncScript:
    """One script from Lua source parts, declared (SHEBANG)."""
    return client.register_script(SHEBANG + "".join(parts))


def _tag(chat: str) -> str:
    """The chat key made safe to sit between the braces of a hash tag."""
    return chat.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


class ChatKeys:
    """Every Redis key of one chat; the `{…}` hash tag keeps them on one slot."""

    __slots__ = ("base", "cfg", "ctx", "holds", "idq", "ids", "log", "pace", "pairs", "state")

    def __init__(self, prefix: str, chat: str) -> None:
        self.base = f"{prefix}:{{{_tag(chat)}}}"
        self.state = f"{self.base}:st"
        self.cfg = f"{self.base}:cfg"
        self.ids = f"{self.base}:ids"
        self.idq = f"{self.base}:idq"
        self.pairs = f"{self.base}:pr"
        self.ctx = f"{self.base}:ctx"
        self.log = f"{self.base}:log"
        self.holds = f"{self.base}:ho"
        self.pace = f"{self.base}:pc"

    def rate(self, bot: str) -> str:
        return f"{self.base}:r:{bot}"

    def common(self, bot: str) -> list[str]:
        """KEYS of admit.lua and sent.lua for `bot`."""
        return [self.state, self.cfg, self.ids, self.idq, self.pairs, self.ctx, self.log,
                self.rate(bot), self.holds, self.pace]  # fmt: skip


class failing:  # lower case: read as `with failing("admit"):`
    """A Redis error, as the one StoreError every store raises: wrapped here,
    once, for every call (a class, not a generator: the admit path pays no
    more than a try would)."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, RedisError):
            raise StoreError(f"redis {self.what} failed: {exc}") from exc


class LateCall(BotbouncerError, TimeoutError):
    """Redis reached an admit after its deadline and refused it unrun: the
    call was late (this process or Redis was held up), so it is decided
    without Redis, as if it had timed out, while Redis itself answers."""


class ServerClock:
    """Redis's clock as this process sees it: the offset of the server's time
    (ms) from `time.time()`, so a call can carry a deadline in the server's time.

    Each sample is a server time read by a script and the local time its
    answer arrived, which is later: a sample is never above the true offset,
    and the largest is the nearest. The largest of the last two windows is
    kept: a local clock stepped back raises the samples and is followed at
    once; one stepped forward leaves deadlines later than meant (never
    earlier) for two windows at most.
    """

    WINDOW_MS = 30_000.0

    __slots__ = ("_best", "_prev", "_since")

    def __init__(self) -> None:
        self._best: float | None = None
        self._prev: float | None = None
        self._since = 0.0

    def sample(self, server_ms: int, local_ms: float) -> None:
        offset = server_ms - local_ms
        if local_ms - self._since > self.WINDOW_MS:
            self._prev, self._best, self._since = self._best, offset, local_ms
        elif self._best is None or offset > self._best:
            self._best = offset

    def deadline(self, local_ms: float, within_ms: float) -> int | None:
        """The server time `within_ms` from now; None before any sample."""
        best, prev = self._best, self._prev
        if best is None:
            return None
        return int(local_ms + (best if prev is None or best >= prev else prev) + within_ms)


class _Cluster(RedisCluster):
    """redis-py's cluster client, made to route from its first command.

    redis-py (8.1) picks a command's node before it first loads the cluster's
    topology: commands issued at once on a fresh client go to an arbitrary
    node, come back MOVED, and the reconnects that follow break connections
    still in their handshake (an AttributeError from inside the library).
    Loading the topology first, once, routes every command by its keys. And
    "cannot be connected" or "slot not covered" is a RedisClusterException,
    which is no RedisError: raised as one, it becomes a StoreError like any
    other Redis failure instead of escaping the store.
    """

    async def execute_command(self, *args: EncodableT, **kwargs: Any) -> Any:
        try:
            await self.initialize()
            return await super().execute_command(*args, **kwargs)
        except RedisClusterException as exc:
            raise RedisConnectionError(f"redis cluster: {exc}") from exc


def connect(url: str, *, socket_timeout: float | None = 5.0) -> aioredis.Redis | RedisCluster:
    """A client for `redis://`, `rediss://`, `redis+cluster://` or
    `redis+sentinel://` (`rediss+sentinel://`) URLs.

    `socket_timeout=None`: no timer per write or read, for a caller that
    bounds every call itself (FailoverStore with a bounded RedisStore)."""
    if url.startswith("redis+cluster://"):
        return _Cluster.from_url("redis://" + url[len("redis+cluster://") :], decode_responses=True)
    if url.startswith(("redis+sentinel://", "rediss+sentinel://")):
        return _sentinel_master(SentinelUrl.parse(url), socket_timeout)
    # One immediate retry reconnects a pooled connection Redis dropped (a
    # restart); more would only keep a message waiting on a Redis that is gone,
    # which FailoverStore answers for locally instead.
    return aioredis.from_url(
        url,
        decode_responses=True,
        retry=Retry(NoBackoff(), 1),
        socket_connect_timeout=2,
        socket_timeout=socket_timeout,
    )


@dataclass(frozen=True)
class SentinelUrl:
    """`redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]`
    (`rediss+sentinel://` for TLS to the master); `?sentinel_password=` when
    the sentinels have a password of their own. ValueError says what is wrong."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None
    tls: bool = False

    @classmethod
    def parse(cls, url: str) -> SentinelUrl:
        scheme, _, rest = url.partition("://")
        rest, _, query = rest.partition("?")
        auth, at, located = rest.rpartition("@")
        if not at:
            auth, located = "", rest
        hosts, _, path = located.partition("/")
        sentinels = []
        for node in hosts.split(","):
            host, colon, port = node.rpartition(":")
            if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"sentinel {node!r} is not host:port")
            sentinels.append((host.strip("[]"), int(port)))
        parts = [unquote(p) for p in path.split("/") if p]
        if not parts:
            raise ValueError("names no service: redis+sentinel://host:port,.../<service>[/db]")
        if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
            raise ValueError("the path must be /<service> or /<service>/<db number>")
        user, _, password = auth.partition(":")
        options = dict(parse_qsl(query))
        return cls(
            tuple(sentinels),
            parts[0],
            int(parts[1]) if len(parts) == 2 else 0,
            unquote(user) or None,
            unquote(password) or None,
            options.get("sentinel_password") or None,
            scheme.lower() == "rediss+sentinel",
        )


def _sentinel_master(url: SentinelUrl, socket_timeout: float | None) -> aioredis.Redis:
    """redis-py's Sentinel client for the service's master: each new
    connection asks the sentinels where the master is, so after a failover
    the store's next connection (FailoverStore's probe) reaches the promoted
    replica, and a script it lacks is loaded again on NOSCRIPT."""
    ask = {"socket_connect_timeout": 2, "socket_timeout": 2, "password": url.sentinel_password}
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        list(url.sentinels),
        sentinel_kwargs=ask,
        decode_responses=True,
        retry=Retry(NoBackoff(), 1),
        socket_connect_timeout=2,
        socket_timeout=socket_timeout,
        db=url.db,
        username=url.username,
        password=url.password,
        ssl=url.tls,
    )
    master: aioredis.Redis = sentinel.master_for(url.service)
    return master


class RedisStore:
    kind = "redis"

    def __init__(
        self,
        client: aioredis.Redis | RedisCluster,
        *,
        prefix: str = "bb",
        state_ttl_seconds: float = defaults.STATE_TTL_SECONDS,
        settings_ttl_seconds: float = defaults.SETTINGS_TTL_SECONDS,
        context_size: int = defaults.CONTEXT_MESSAGES,
        dedupe_entries: int = DEDUPE_ENTRIES,
        call_timeout: float | None = None,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self._state_ttl = int(state_ttl_seconds * 1000)
        self._settings_ttl = int(settings_ttl_seconds * 1000)
        self._context_size = context_size
        self._dedupe = dedupe_entries
        self._packed: dict[Limits, bytes] = {}
        self._call_timeout_ms = None if call_timeout is None else call_timeout * 1000
        self.clock = ServerClock()
        common = _lua("common.lua")
        self._admit = register(client, common, _lua("admit.lua"))
        self._sent = register(client, common, _lua("sent.lua"))
        self._release = register(client, _lua("release.lua"))
        # A cluster routes each call by its keys itself; one Redis shares trips.
        self._batch = (
            None if isinstance(client, RedisCluster) else AutoPipeline(client, timeout=call_timeout)
        )
        self._reset = register(client, _lua("reset.lua"))
        self._settings = register(client, _lua("settings.lua"))
        self._ticket = register(client, _lua("ticket.lua"))
        self._probe = register(client, _PROBE)

    @classmethod
    def from_url(cls, url: str, *, call_timeout: float | None = None, **kwargs: Any) -> RedisStore:
        """With `call_timeout`, every script call is bounded by its batch's
        timer, so the client keeps no timer per read; the store's other calls
        (status, overrides, ping) are for the caller to bound (FailoverStore does)."""
        client = connect(url, socket_timeout=None) if call_timeout else connect(url)
        return cls(client, call_timeout=call_timeout, **kwargs)

    @property
    def bounded(self) -> bool:
        """Whether every script call (admit, record_sent, release, call) fails
        with TimeoutError by itself after `call_timeout` seconds."""
        return self._batch is not None and self._batch.timeout is not None

    async def _run(self, script: AsyncScript, keys: Sequence[str], args: list[Any]) -> Any:
        if self._batch is None:
            return await script(keys=keys, args=args)
        return await self._batch.script(script, keys, args)

    async def call(self, script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        """Run a script registered on this store's client, sharing its round
        trips with concurrent calls (the agent guard's scripts use this)."""
        return await self._run(script, keys, args)

    def _deadline(self) -> int | None:
        """When a call made now is given up, in Redis's time (None: no bound,
        or Redis's clock not sampled yet)."""
        if self._call_timeout_ms is None:
            return None
        return self.clock.deadline(time.time() * 1000, self._call_timeout_ms)

    def keys(self, chat: str) -> ChatKeys:
        return ChatKeys(self.prefix, chat)

    def _policy(self, lim: Limits) -> bytes:
        """The constant part of a script call as one argument, built once per
        Limits: 15 little-endian doubles, which Lua's struct.unpack reads in
        C rather than parsing text in Lua (bench/README.md)."""
        packed = self._packed.get(lim)
        if packed is None:
            packed = POLICY.pack(
                lim.soft_limit, lim.hard_limit, lim.max_replies, lim.rate_window_ms,
                1 if lim.rate_applies else 0,
                lim.pair_max_events, lim.pair_window_ms, lim.pair_cooldown_ms,
                self._state_ttl, self._settings_ttl, self._context_size, self._dedupe,
                DECISION_LOG_SIZE, lim.pace_ms, lim.pace_max,
            )  # fmt: skip
            if len(self._packed) > 1024:  # limits come from config: a handful at most
                self._packed.clear()
            self._packed[lim] = packed
        return packed

    def _args(self, req: AdmitRequest | SentRequest, kind: Count, bot: str) -> list[Any]:
        obs = req.msg
        return [
            "" if req.now_ms is None else req.now_ms,
            obs.message_id, obs.author, obs.name or obs.author, COUNT_CODES[kind],
            obs.text[:CONTEXT_TEXT_CHARS], bot, self._policy(req.limits), hold_name(obs.author),
            "",  # deadline: none (admit sets its own)
        ]  # fmt: skip

    async def admit(self, req: AdmitRequest) -> AdmitResult:
        keys = self.keys(req.msg.chat)
        args = self._args(req, req.msg.count, req.bot)
        deadline = self._deadline()  # past it, Redis refuses the call unrun (common.lua)
        if deadline is not None:
            args[9] = deadline
        args += [req.local_reason.value if req.local_reason else "",
                 1 if req.author_is_bot else 0, req.context,
                 hold_name(req.bot, req.msg.message_id), req.hold_ms]  # fmt: skip
        with failing("admit"):
            out = await self._run(self._admit, keys.common(req.bot), args)
        if len(out) == 1:
            raise LateCall("redis reached this admit after its deadline and did not run it")
        if req.now_ms is None:
            self.clock.sample(int(out[11]), time.time() * 1000)
        turn, soft, hard, action, reason, warn = out[:6]
        lim = req.limits
        effective = (int(out[6]), int(out[7]), int(out[8]), int(out[9]))
        limits = (
            lim  # no override in this chat: the request's own (no new object per message)
            if effective == (lim.soft_limit, lim.hard_limit, lim.max_replies, lim.rate_window_ms)
            else replace(lim, soft_limit=effective[0], hard_limit=effective[1],
                         max_replies=effective[2], rate_window_ms=effective[3])
        )  # fmt: skip
        context: list[ContextEntry] = []
        if req.context > 0 and len(out) > 12:
            entries = [unpack_context(raw) for raw in reversed(out[12:])]
            context = [e for e in entries if e.id != req.msg.message_id][-req.context :]
        return AdmitResult(
            turn=_TURNS[turn],
            soft=int(soft),
            hard=int(hard),
            action=_ACTIONS[action] if action else None,
            reason=_REASONS[reason] if reason else None,
            warn=warn or None,
            limits=limits,
            reserved=bool(int(out[10])),
            at_ms=int(out[11]),
            context=context,
        )

    async def record_sent(self, req: SentRequest) -> SentResult:
        keys = self.keys(req.msg.chat)
        args = self._args(req, req.msg.count, req.bot)
        args.append("" if req.log is None else pack_log(req.log))
        args.append(hold_name(req.bot, req.answered) if req.answered else "")
        args.append(req.answered_author if req.answered else "")
        with failing("record_sent"):
            turn, soft, hard = await self._run(self._sent, keys.common(req.bot), args)
        return SentResult(_TURNS[turn], int(soft), int(hard))

    async def release(
        self, chat: str, bot: str, message_id: str, log: dict[str, Any] | None
    ) -> None:
        keys = self.keys(chat)
        args: list[str | int] = [message_id, "" if log is None else pack_log(log),
                                 DECISION_LOG_SIZE, self._state_ttl,
                                 hold_name(bot, message_id)]  # fmt: skip
        with failing("release"):
            await self._run(self._release, [keys.rate(bot), keys.log, keys.holds], args)

    async def issue_ticket(
        self, ticket: str, record: str, ttl_ms: int, now_ms: int | None = None
    ) -> None:
        # Redis's own clock lapses it (an injected clock is the memory store's)
        with failing("ticket"):
            await self.client.set(ticket_key(self.prefix, ticket), ISSUED + record, px=ttl_ms)

    async def spend_ticket(
        self, ticket: str, how: str, now_ms: int | None = None
    ) -> tuple[str, str] | None:
        with failing("ticket"):
            before = await self._run(self._ticket, [ticket_key(self.prefix, ticket)], [how])
        return split(before)

    async def _now_ms(self) -> int:
        sec, usec = await self.client.time()
        return int(sec) * 1000 + int(usec) // 1000

    async def status(
        self, chat: str, bot: str, limits: Limits, now_ms: int | None = None
    ) -> ChatStatus:
        keys = self.keys(chat)
        with failing("status"):
            now = now_ms if now_ms is not None else await self._now_ms()
            state = await self.client.hmget(keys.state, ["soft", "hard"])
            cfg = await self.client.hgetall(keys.cfg)
            pairs = await self.client.hgetall(keys.pairs)
            overrides = Overrides(**{k: int(cfg[k]) for k in _OVERRIDE_FIELDS if k in cfg})
            eff = overrides.apply(limits)
            used = await self.client.zcount(keys.rate(bot), f"({now - eff.rate_window_ms}", "+inf")
        soft, hard = int(state[0] or 0), int(state[1] or 0)
        cooldowns = {
            str(f)[2:]: (int(v) - now) / 1000
            for f, v in sorted(pairs.items())
            if str(f).startswith("c:") and int(v) > now
        }
        return ChatStatus(
            chat=chat,
            soft=soft,
            hard=hard,
            turn=verdict(soft, hard, eff.soft_limit, eff.hard_limit),
            paused=cfg.get("paused") == "1",
            overrides=overrides,
            limits=eff,
            pair_cooldowns=cooldowns,
            rate_used=int(used),
            rate_max=eff.max_replies,
        )

    async def reset(self, chat: str) -> None:
        keys = self.keys(chat)
        with failing("reset"):
            await self._reset(keys=[keys.state, keys.pairs, keys.pace], args=[])

    async def set_paused(self, chat: str, paused: bool) -> None:
        changed = ("paused", "1") if paused else ()
        await self._change(chat, "pause", changed, "" if paused else "paused")

    async def set_overrides(self, chat: str, overrides: Overrides, merge: bool = False) -> None:
        values = [x for kv in overrides.as_dict().items() for x in kv]
        await self._change(chat, "overrides", values, "" if merge else " ".join(_OVERRIDE_FIELDS))

    async def _change(self, chat: str, what: str, values: Sequence[Any], deleted: str) -> None:
        """A chat's settings changed in one script call (settings.lua): all of
        it or nothing, and nothing once its caller has given up on it."""
        deadline = self._deadline()
        args = ["" if deadline is None else deadline, self._settings_ttl, deleted, *values]
        with failing(what):
            out = await self._run(self._settings, [self.keys(chat).cfg], args)
        if out and out[0] in ("late", b"late"):
            raise LateCall(f"redis reached this {what} after its deadline and did not run it")

    async def decisions(self, chat: str, limit: int = DECISION_LOG_SIZE) -> list[dict[str, Any]]:
        with failing("decisions"):
            raw = await self.client.lrange(self.keys(chat).log, 0, limit - 1)
        return [unpack_log(r) for r in raw]

    # Cursors are on the LLM proxy's path (every request reads and keeps one):
    # they share the scripts' round trips and their lean reading of answers,
    # where redis-py's own command path cost that daemon as much CPU as its
    # guard's script calls (bench/README.md, the LLM proxy's third pass).

    async def get_cursor(self, name: str) -> str | None:
        key = f"{self.prefix}:cursor:{name}"
        with failing("reading a cursor"):
            if self._batch is None:
                value = await self.client.get(key)
            else:
                value = await self._batch.call("GET", key)
        return None if value is None else str(value)

    async def set_cursor(self, name: str, value: str) -> None:
        key = f"{self.prefix}:cursor:{name}"
        with failing("saving a cursor"):
            if self._batch is None:
                await self.client.set(key, value, px=self._state_ttl)
            else:
                await self._batch.call("SET", key, value, "PX", self._state_ttl)

    async def claim(self, name: str, ttl_ms: int) -> bool:
        with failing("claiming"):
            return bool(await self.client.set(f"{self.prefix}:claim:{name}", 1, nx=True, px=ttl_ms))

    async def ping(self) -> None:
        """Check what decisions need of Redis: a write. A Redis that answers
        PING but refuses writes (out of memory under `noeviction`, a replica
        made read-only) fails here as every admit would. The probe key is one
        small string per store prefix, expiring by itself; the server time it
        reads is a sample for ServerClock."""
        with failing("write check"):
            sec, usec = await self._probe(keys=[f"{self.prefix}:probe"], args=[PROBE_TTL_MS])
        self.clock.sample(int(sec) * 1000 + int(usec) // 1000, time.time() * 1000)

    async def drop_connections(self) -> None:
        """Close every pooled connection (after an outage they may all be dead
        sockets); the next calls connect afresh. A cluster client re-finds its
        nodes by itself after a connection error."""
        if isinstance(self.client, aioredis.Redis):
            await self.client.connection_pool.disconnect()

    async def close(self) -> None:
        await self.client.aclose()
