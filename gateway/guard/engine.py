"""Where the guard's detectors run: one script, gateway/guard/lua/guard.lua,
on Redis (one atomic call per check, register_script) or in this process
(the same file in Lua 5.1 through lupa, over tables the process holds). One
implementation of every rule, so the two stores cannot disagree."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from importlib import resources
from typing import Any, Protocol

from redis.exceptions import RedisError

from gateway.store import Store, StoreError
from gateway.store.failover import FailoverStore
from gateway.store.redis import RedisStore


def _lua(name: str) -> str:
    return (resources.files("gateway.guard") / "lua" / name).read_text(encoding="utf-8")


class Engine(Protocol):
    async def run(
        self, session: str, op: str, limits: str, payload: str, profile: str, now_ms: int | None
    ) -> list[str]:
        """The script's answer: decision, reason, evidence, meta, also (JSON texts)."""
        ...


class RedisEngine:
    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self._script = store.client.register_script(_lua("redis_prelude.lua") + _lua("guard.lua"))

    def key(self, session: str) -> str:
        return f"{self.store.prefix}:guard:{{{session}}}"

    async def run(
        self, session: str, op: str, limits: str, payload: str, profile: str, now_ms: int | None
    ) -> list[str]:
        args = [op, limits, payload, profile, "" if now_ms is None else now_ms]
        try:
            out = await self.store.call(self._script, [self.key(session)], args)
        except RedisError as exc:
            raise StoreError(f"redis guard {op} failed: {exc}") from exc
        return [str(x) for x in out]


class MemoryEngine:
    """The script in an embedded Lua 5.1; each session's state is a Lua table
    kept here with its expiry. Calls are synchronous, hence atomic."""

    SWEEP_EVERY = 1024  # saves between sweeps of expired sessions

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        from lupa import lua51  # a compiled extension: loaded only when used

        self.clock = clock
        self._sessions: dict[str, tuple[Any, float]] = {}
        self._saves = 0
        self._lua = lua51.LuaRuntime(unpack_returned_tuples=False)
        host = self._lua.table_from(
            {
                "load": self._load,
                "save": self._save,
                "drop": self._drop,
                "decode": self._decode,
                "now": lambda: int(self.clock() * 1000),
            }
        )
        self._lua.globals().HOST = host
        source = _lua("memory_prelude.lua") + _lua("guard.lua")
        self._fn = self._lua.execute("return function(KEYS, ARGV)\n" + source + "\nend")

    def _load(self, key: str) -> Any:
        held = self._sessions.get(key)
        if held is None:
            return None
        state, expires = held
        if expires <= self.clock():
            del self._sessions[key]
            return None
        return state

    def _save(self, key: str, state: Any, ttl_ms: float) -> None:
        self._sessions[key] = (state, self.clock() + ttl_ms / 1000)
        self._saves += 1
        if self._saves % self.SWEEP_EVERY == 0:
            now = self.clock()
            for k in [k for k, (_, exp) in self._sessions.items() if exp <= now]:
                del self._sessions[k]

    def _drop(self, key: str) -> None:
        self._sessions.pop(key, None)

    def _decode(self, text: str) -> Any:
        return self._lua.table_from(json.loads(text), recursive=True)

    async def run(
        self, session: str, op: str, limits: str, payload: str, profile: str, now_ms: int | None
    ) -> list[str]:
        keys = self._lua.table_from([session])
        args = self._lua.table_from(
            [op, limits, payload, profile, "" if now_ms is None else now_ms]
        )
        out = self._fn(keys, args)
        return [str(out[i]) for i in range(1, len(out) + 1)]


class FailoverEngine:
    """Redis while it answers, this process's engine while the store is
    degraded (the same switch, timeout and probe as the chat rules)."""

    def __init__(self, store: FailoverStore) -> None:
        self.store = store
        self.redis = RedisEngine(store.primary)
        self.local = MemoryEngine()

    async def run(
        self, session: str, op: str, limits: str, payload: str, profile: str, now_ms: int | None
    ) -> list[str]:
        args = (session, op, limits, payload, profile, now_ms)
        return await self.store.run(
            lambda: self.redis.run(*args), lambda: self.local.run(*args), scripted=True
        )


def engine_for(store: Store) -> Engine:
    """The guard's engine on the daemon's store."""
    if isinstance(store, FailoverStore):
        return FailoverEngine(store)
    if isinstance(store, RedisStore):
        return RedisEngine(store)
    return MemoryEngine()
