"""Where the guard's detectors run: one script, gateway/guard/lua/guard.lua,
on Redis (one atomic call per check, register_script) or in this process
(the same file in Lua 5.1 through lupa's LuaJIT, over tables the process
holds). One
implementation of every rule, so the two stores cannot disagree."""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from importlib import resources
from typing import Any, Protocol

from redis.exceptions import RedisError

from gateway.store import Store, StoreError
from gateway.store.failover import FailoverStore
from gateway.store.redis import RedisStore, register

log = logging.getLogger("botbouncer.guard")


def _lua(name: str) -> str:
    return (resources.files("gateway.guard") / "lua" / name).read_text(encoding="utf-8")


def _runtime() -> Any:
    """lupa's LuaJIT with its compiler off, else its Lua 5.1.

    LuaJIT's interpreter runs guard.lua in two thirds of Lua 5.1's time (a
    step with a full history: 32 us against 48, bench/README.md); both speak
    Lua 5.1, which is Redis's Lua, and the suite holds the two stores to the
    same answers. The compiler stays off: it writes machine code, and a
    process that may not map memory writable and executable (systemd's
    MemoryDenyWriteExecute, deploy/) would abort on the first hot loop.
    """
    try:
        from lupa import luajit21  # compiled extensions: loaded only when used

        return luajit21
    except ImportError:  # a lupa built without LuaJIT
        from lupa import lua51

        return lua51


def _script(prelude: str) -> str:
    return _lua(prelude) + _lua("enc.lua") + _lua("guard.lua")


class Engine(Protocol):
    async def run(
        self,
        session: str,
        op: str,
        limits: str,
        payload: dict[str, Any] | list[Any],
        profile: str,
        now_ms: int | None,
    ) -> list[str]:
        """The script's answer: decision, reason, evidence, meta, also (JSON
        texts), five for each check of a batch. `payload` holds strings,
        numbers and booleans (a batch: a list of [op, payload]); each engine
        hands it to the script as it takes it (JSON for Redis, a table here)."""
        ...

    def limit_sessions(self, max_sessions: int) -> None:
        """guard.max_sessions: a bound for sessions held in this process."""
        ...


class RedisEngine:
    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self._script = register(store.client, _script("redis_prelude.lua"))

    def key(self, session: str) -> str:
        return f"{self.store.prefix}:guard:{{{session}}}"

    async def run(
        self,
        session: str,
        op: str,
        limits: str,
        payload: dict[str, Any] | list[Any],
        profile: str,
        now_ms: int | None,
    ) -> list[str]:
        args = [op, limits, json.dumps(payload), profile, "" if now_ms is None else now_ms]
        try:
            out = await self.store.call(self._script, [self.key(session)], args)
        except RedisError as exc:
            raise StoreError(f"redis guard {op} failed: {exc}") from exc
        return [str(x) for x in out]

    def limit_sessions(self, max_sessions: int) -> None:
        """Redis holds the sessions, each with its TTL, within its own maxmemory."""


class MemoryEngine:
    """The script in an embedded Lua (_runtime). Calls are synchronous, hence atomic.

    A session in use is a Lua table; one idle while HOT others were used is
    kept as the JSON text Redis would hold (enc.lua), a sixth of the memory
    (measured over 50,000 sessions of two checks on Lua 5.1: 6.3 KB a session
    as tables, a third of it Lua's collector slack, against 1.0 KB as text,
    Python's bookkeeping included; LuaJIT's tables take about three quarters
    of Lua 5.1's heap, 2.75 against 3.73 KB a session after a full
    collection), and made a table again by its next check (about
    20 us for a small session; turning one into text, 35 us). Nothing but
    the TTL would ever forget a session, so past `max_sessions` the least
    recently used one is forgotten, and a warning says how many, at most once
    a minute.
    """

    SWEEP_EVERY = 1024  # saves between sweeps of expired sessions
    WARN_EVERY = 60.0  # seconds between warnings that sessions were forgotten
    HOT = 1024  # sessions kept as tables; the others as text

    def __init__(self, clock: Callable[[], float] = time.time, max_sessions: int = 10_000) -> None:
        runtime = _runtime()
        self.clock = clock
        self.max_sessions = max_sessions
        # key -> (Lua table or JSON text, expiry), least recently used first
        self._sessions: OrderedDict[str, tuple[Any, float]] = OrderedDict()
        self._hot: OrderedDict[str, None] = OrderedDict()  # the tables, same order
        self._saves = 0
        self._evicted = 0  # forgotten before they expired, since the last warning
        self._warned_at = -float("inf")
        # A profile's limits, decoded once: the script only reads them, and a
        # fresh table per check was most of the garbage Lua had to collect.
        self._limits: dict[str, Any] = {}
        self._lua = runtime.LuaRuntime(unpack_returned_tuples=False)
        if runtime.__name__.endswith("luajit21"):
            self._lua.execute("jit.off()")  # its interpreter only: no machine code made
        host = self._lua.table_from(
            {
                "load": self._load,
                "save": self._save,
                "drop": self._drop,
                "decode": self._decode,
                "limits": self._decode_limits,
                "now": lambda: int(self.clock() * 1000),
            }
        )
        self._lua.globals().HOST = host
        # KEYS and ARGV made in Lua: two tables fewer to build from Python per check
        self._fn = self._lua.execute(
            "return function(key, op, limits, payload, profile, now)\n"
            "local KEYS, ARGV = {key}, {op, limits, payload, profile, now}\n"
            + _script("memory_prelude.lua")
            + "\nend"
        )
        self._enc = self._lua.execute(_lua("enc.lua") + "\nreturn enc")

    def limit_sessions(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self._evict(self.clock())

    def __len__(self) -> int:
        return len(self._sessions)

    def _load(self, key: str) -> Any:
        held = self._sessions.get(key)
        if held is None:
            return None
        state, expires = held
        if expires <= self.clock():
            self._drop(key)
            return None
        self._sessions.move_to_end(key)
        if isinstance(state, str):
            state = self._decode(state)
            self._sessions[key] = (state, expires)
        self._hot[key] = None
        self._hot.move_to_end(key)
        return state

    def _save(self, key: str, state: Any, ttl_ms: float) -> None:
        now = self.clock()
        self._sessions[key] = (state, now + ttl_ms / 1000)
        self._sessions.move_to_end(key)
        self._hot[key] = None
        self._hot.move_to_end(key)
        if len(self._sessions) > self.max_sessions:
            self._evict(now)
        self._saves += 1
        if self._saves % self.SWEEP_EVERY == 0:
            for k in [k for k, (_, exp) in self._sessions.items() if exp <= now]:
                self._drop(k)
            self._warn(now)  # evictions since the last warning are told here

    def _drop(self, key: str) -> None:
        self._sessions.pop(key, None)
        self._hot.pop(key, None)

    def _evict(self, now: float) -> None:
        while len(self._sessions) > self.max_sessions:
            key, (_, expires) = self._sessions.popitem(last=False)
            self._hot.pop(key, None)
            if expires > now:  # an expired one was forgotten anyway
                self._evicted += 1
        self._warn(now)

    def _warn(self, now: float) -> None:
        if self._evicted and now - self._warned_at >= self.WARN_EVERY:
            log.warning(
                "guard: forgot %d sessions (the least recently used, before their TTL) to "
                "stay within guard.max_sessions=%d; raise it or use a Redis store",
                self._evicted,
                self.max_sessions,
            )
            self._evicted, self._warned_at = 0, now

    def _cool(self) -> None:
        """Turns the tables of sessions idle longest into text, past HOT; after
        a call, not during one (enc runs in the same Lua)."""
        while len(self._hot) > self.HOT:
            key, _ = self._hot.popitem(last=False)
            state, expires = self._sessions[key]
            self._sessions[key] = (str(self._enc(state)), expires)  # keeps its place

    def _decode(self, text: str) -> Any:
        return self._lua.table_from(json.loads(text), recursive=True)

    def _decode_limits(self, text: str) -> Any:
        table = self._limits.get(text)
        if table is None:
            if len(self._limits) >= 64:  # profiles change only on SIGHUP: old ones go
                self._limits.clear()
            table = self._limits[text] = self._decode(text)
        return table

    async def run(
        self,
        session: str,
        op: str,
        limits: str,
        payload: dict[str, Any] | list[Any],
        profile: str,
        now_ms: int | None,
    ) -> list[str]:
        # The payload as a table: no JSON text made here and parsed in Lua.
        table = self._lua.table_from(payload, recursive=True)
        out = self._fn(session, op, limits, table, profile, "" if now_ms is None else now_ms)
        if len(self._hot) > self.HOT:
            self._cool()
        return [str(out[i]) for i in range(1, len(out) + 1)]


class FailoverEngine:
    """Redis while it answers, this process's engine while the store is
    degraded (the same switch, timeout and probe as the chat rules)."""

    def __init__(self, store: FailoverStore) -> None:
        self.store = store
        self.redis = RedisEngine(store.primary)
        self.local = MemoryEngine()

    async def run(
        self,
        session: str,
        op: str,
        limits: str,
        payload: dict[str, Any] | list[Any],
        profile: str,
        now_ms: int | None,
    ) -> list[str]:
        args = (session, op, limits, payload, profile, now_ms)
        return await self.store.run(
            lambda: self.redis.run(*args), lambda: self.local.run(*args), scripted=True
        )

    def limit_sessions(self, max_sessions: int) -> None:
        self.local.limit_sessions(max_sessions)


def engine_for(store: Store) -> Engine:
    """The guard's engine on the daemon's store."""
    if isinstance(store, FailoverStore):
        return FailoverEngine(store)
    if isinstance(store, RedisStore):
        return RedisEngine(store)
    return MemoryEngine()
