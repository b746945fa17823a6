"""Which guard session a model request belongs to, and which of its tool
events the guard has not been fed yet.

A session is the `X-Botbouncer-Session` header when the agent sends one.
Otherwise it is a fingerprint of the conversation: the API, a digest of the
credential, the opening (system prompt and first user turn, without prompt
caching's marks) and the first answer that called tools that this proxy
relayed (those calls' ids, unique to that answer; `Anchors`). Two
conversations that open alike part at their first tool call, so they are
never one session, even when their prompt holds the same example of a tool
call (few-shot examples: an answer no model gave in that conversation).
Until then a conversation has no session: it has no tool events to feed,
and the usage of its answers of text alone counts toward no budget (send
the header to count it); the answer that first calls tools has its usage go
to the session it names from then on.

An agent sends its whole history on every request. The events the guard has
been fed are kept per session in the store (one value, the keys of the
events in the last history and some of the histories before it, with the
state TTL), so any replica feeds each tool call and result once. With them
is the guard's verdict on the request that fed them when it was not
`allow`, under a digest of that request's body: the same request sent again
(an SDK retries a 5xx, a 429 or a time-out with the very same body) finds
nothing new to feed, and gets that verdict again instead of going out as if
nothing had been decided.

A Responses request that continues a stored response sends only its new
items; `Chains` keeps each stored answer's session and tool calls, so the
request is read as if it carried them. A response made in the background is
answered before it is written; `Background` keeps whose it is until it is
fetched finished.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gateway.guard.requests import check_session
from gateway.llmproxy.wire import Dialect, Json, ToolEvent, digest
from gateway.store import Store, StoreError

log = logging.getLogger("botbouncer.llm_proxy")

HEADER = "X-Botbouncer-Session"
PREFIX = "llm-"


def given(value: str | None) -> str | None:
    """The header's session, checked (a GuardInputError names what is wrong)."""
    if value is None:
        return None
    try:
        return check_session(value)
    except ValueError as exc:
        raise type(exc)(f"{HEADER} header: {str(exc).partition(': ')[2]}") from None


def fingerprint(dialect: Dialect, body: Json, credential: str, anchor: str | None) -> str | None:
    # Neither the credential nor the opening is kept: only their digests,
    # which is all the fingerprint takes (Background keeps them for a while).
    return fingerprint_of(dialect.name, digest(credential), digest(dialect.opening(body)), anchor)


def fingerprint_of(api: str, key: str, opening: str, anchor: str | None) -> str | None:
    """From the digests of the credential (`key`) and of the opening."""
    return None if anchor is None else name_of(api, key, opening, anchor)


def name_of(api: str, key: str, opening: str, anchor: str) -> str:
    return PREFIX + digest(api, key, opening, anchor)[:40]


class Anchors:
    """The sessions that a conversation's first answer with tool calls,
    relayed here, named (fingerprint_of). A request's session is the first
    answer of its history named so; a history that holds none is a
    conversation's first request (an answer in it may be an example in the
    prompt, the same in every conversation that uses that prompt).

    Kept in the store with the state TTL, so every replica finds them (its
    TTL renewed, at most once a REFRESH, while requests name it: a
    conversation in use for longer than the TTL keeps its one session), and
    in this process, so the replica that relayed an answer knows it before
    the agent's next request can be read. The store is asked of the first
    LOOKED_UP answers of a history only: a replica that did not relay it
    finds a conversation's session when fewer answers come before it that
    this proxy did not relay (few-shot examples, or a conversation begun
    before the proxy was in place)."""

    LOOKED_UP = 8
    KNOWN = 65_536  # sessions known to this process, the most recently used
    REFRESH = 60.0  # seconds between renewals of one session's TTL in the store

    def __init__(self, store: Store, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self._known: OrderedDict[str, float] = OrderedDict()  # -> when last stored
        self._renewing: set[asyncio.Task[None]] = set()

    @staticmethod
    def _name(session: str) -> str:
        return "llm-anchor:" + session

    async def known(self, names: Iterable[str]) -> str | None:
        """The first of `names` (a history's answers as sessions, oldest
        first, made as they are asked for) that a relayed answer named;
        None when none did."""
        asked: list[str] = []
        for name in names:
            if len(asked) < self.LOOKED_UP:
                asked.append(name)
            stored = self._known.get(name)
            if stored is not None:
                self._known.move_to_end(name)
                if self.clock() - stored >= self.REFRESH:  # renewed beside the request
                    self._hold(name)
                    task = asyncio.ensure_future(self._renew(name))
                    self._renewing.add(task)
                    task.add_done_callback(self._renewing.discard)
                return name
        for name in asked:
            if await self.store.get_cursor(self._name(name)) is not None:
                self._hold(name)
                await self.keep(name)  # its TTL from now
                return name
        return None

    async def _renew(self, session: str) -> None:
        try:
            await self.keep(session)
        except StoreError as exc:
            log.warning("llm proxy: session %s not renewed in the store (%s)", session, exc)

    def hold(self, session: str) -> None:
        """Known here at once (before anything is awaited); `keep` stores it."""
        self._hold(session)

    async def keep(self, session: str) -> None:
        await self.store.set_cursor(self._name(session), "1")

    def _hold(self, session: str) -> None:
        self._known[session] = self.clock()
        self._known.move_to_end(session)
        if len(self._known) > self.KNOWN:
            self._known.popitem(last=False)


@dataclass(frozen=True)
class Held:
    """The verdict on the request that fed a history, when it was a warning
    or a block for a loop (a spent budget is asked of the guard afresh)."""

    request: str  # digest of the request's body
    decision: str
    reason: str
    message: str
    steps: int  # the session's steps then: a session started over since has fewer
    keys: tuple[str, ...] = ()  # the events that request fed

    def applies_to(
        self, request: str, steps: int, history: set[str], chained: bool = False
    ) -> bool:
        """To a request that feeds nothing new: the same request sent again,
        or, for a block, any whose history (the keys of its events) holds
        what the blocked request fed, or that continues an answer the block
        held (`chained`, Chain.held): the same conversation, its final
        answer nudged on ("please continue" would turn the tools back on,
        and the same call run again each time); not another conversation of
        the session. Not once the session started over (DELETE): fewer steps."""
        if steps < self.steps:
            return False
        if self.request == request:
            return True
        if self.decision != "block":
            return False
        return chained or (bool(self.keys) and history.issuperset(self.keys))


def _held(value: Any) -> Held | None:
    if not isinstance(value, list) or len(value) not in (5, 6):
        return None
    request, decision, reason, message, steps = value[:5]
    if not all(isinstance(v, str) for v in (request, decision, reason, message)):
        return None
    if not isinstance(steps, int):
        return None
    keys = tuple(_keys(value[5])) if len(value) == 6 else ()
    return Held(request, decision, reason, message, steps, keys)


@dataclass
class Fed:
    """What a session's cursor says of a request's history."""

    new: list[ToolEvent]  # its events the guard has not been fed, in history order
    held: Held | None  # the verdict on the request that fed the last ones
    earlier: list[str]  # the keys kept of the histories before, newest first
    last: int = 0  # how many of them are the last history's


class Seen:
    """The tool events of a session the guard has been fed, and its verdict
    on the request that fed them (Held).

    The keys kept are those of the last history, then the newest of the
    histories before it, as many as OTHERS histories of the larger of the
    last two and EARLIER more: one session may carry several histories in
    turn (an agent and its sub-agents under one X-Botbouncer-Session), each
    fed once however long, and a history the agent trims or leaves still
    drops out, so the value stays a few histories' size."""

    OTHERS = 3
    EARLIER = 256

    def __init__(self, store: Store) -> None:
        self.store = store

    @staticmethod
    def _name(session: str) -> str:
        return f"llm:{session}"

    async def new(self, session: str, events: list[ToolEvent]) -> Fed:
        raw = await self.store.get_cursor(self._name(session))
        try:
            value = json.loads(raw) if raw else []
        except (ValueError, TypeError):
            value = []
        # A list of keys, or {"keys": [...], "earlier": [...], "held": [...]}.
        held, earlier = None, []
        if isinstance(value, dict):
            held = _held(value.get("held"))
            earlier = _keys(value.get("earlier"))
            value = value.get("keys")
        keys = _keys(value)
        seen = set(keys).union(earlier)
        # The last history's keys, newest first, before the ones kept of older ones.
        return Fed([e for e in events if e.key not in seen], held, keys[::-1] + earlier, len(keys))

    async def remember(
        self, session: str, events: list[ToolEvent], fed: Fed, held: Held | None = None
    ) -> None:
        """The keys of this history, then the newest earlier ones it does not hold."""
        keys = [e.key for e in events]
        now = set(keys)
        kept = self.OTHERS * max(fed.last, len(keys)) + self.EARLIER
        earlier = [k for k in fed.earlier if k not in now][:kept]
        value: Any = keys
        if earlier or held is not None:
            value = {"keys": keys, "earlier": earlier}
            if held is not None:
                value["held"] = [held.request, held.decision, held.reason, held.message,
                                 held.steps, list(held.keys)]  # fmt: skip
        await self.store.set_cursor(self._name(session), json.dumps(value))


def _keys(value: Any) -> list[str]:
    return [k for k in value if isinstance(k, str)] if isinstance(value, list) else []


@dataclass(frozen=True)
class Chain:
    """An answer a later request may continue on the server: its session,
    its tool calls, and whether it was written under a block (tools off)."""

    session: str
    calls: list[list[str]]
    held: bool = False


class Chains:
    """Answers a later request may continue on the server (Responses'
    `previous_response_id`, or the last answer of a `conversation`), by the
    dialect's key: the session it belongs to and its tool calls, which the
    continuing request does not carry, and whether a block held it (a
    request continuing it, bringing nothing new, is held too: it carries no
    history that would say so). Kept in the store with the state TTL, so any
    replica can read them."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @staticmethod
    def _name(key: str) -> str:
        return "llm-chain:" + digest(key)[:40]

    async def recall(self, key: str) -> Chain | None:
        """The answer kept under `key`, None when unknown."""
        raw = await self.store.get_cursor(self._name(key))
        try:
            value = json.loads(raw) if raw else None
        except (ValueError, TypeError):
            return None
        if not isinstance(value, list) or len(value) not in (2, 3):
            return None
        session, calls = value[:2]
        if not isinstance(session, str) or not isinstance(calls, list):
            return None
        kept = [c for c in calls if isinstance(c, list) and len(c) == 4]
        calls = [c for c in kept if all(isinstance(x, str) for x in c)]
        return Chain(session, calls, len(value) == 3 and value[2] is True)

    async def remember(
        self, key: str, session: str, calls: list[list[str]], held: bool = False
    ) -> None:
        value: list[Any] = [session, calls, True] if held else [session, calls]
        await self.store.set_cursor(self._name(key), json.dumps(value))


@dataclass(frozen=True)
class Pending:
    """A background response not yet fetched finished: its session, or what
    makes one (the credential's digest and the conversation's opening) when
    its request had none, and its model (for its price)."""

    session: str | None
    model: str
    key: str  # digest of the credential, when session is None
    opening: str  # digest of the conversation's opening, when session is None
    chains: list[str]  # the keys requests continuing it name it by (Chains)


class Background:
    """Responses asked for with `background: true`: answered at once (queued,
    no output, no usage), written later and fetched with `GET
    /v1/responses/<id>`. Kept in the store with the state TTL, so the replica
    that relays the finished response, whichever it is, can give its usage
    to the right session's budget and its tool calls to the requests that
    continue it. `take` is true once a response (a claim in the store): an
    agent may fetch a finished response many times."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @staticmethod
    def _name(response_id: str) -> str:
        return "llm-bg:" + digest(response_id)[:40]

    async def mark(self, response_id: str, pending: Pending) -> None:
        p = pending
        value = [p.session, p.model, p.key, p.opening, p.chains]
        await self.store.set_cursor(self._name(response_id), json.dumps(value))

    async def pending(self, response_id: str) -> Pending | None:
        raw = await self.store.get_cursor(self._name(response_id))
        try:
            session, model, key, opening, chains = json.loads(raw) if raw else [None] * 5
        except (ValueError, TypeError):
            return None
        if not isinstance(model, str) or not isinstance(key, str) or not isinstance(opening, str):
            return None
        session = session if isinstance(session, str) else None
        return Pending(session, model, key, opening, _keys(chains))

    async def take(self, response_id: str, ttl_ms: int) -> bool:
        """True for the first fetch that counts it; the record is spent then,
        so no later fetch counts it, however much later."""
        if not await self.store.claim(self._name(response_id), ttl_ms):
            return False
        await self.store.set_cursor(self._name(response_id), "null")
        return True
