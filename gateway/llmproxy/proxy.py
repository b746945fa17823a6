"""The proxy's routes on the daemon's HTTP server (docs/llm-proxy.md).

`{path}/v1/chat/completions` and `{path}/v1/responses` (OpenAI) and
`{path}/v1/messages` (Anthropic) are watched; every other request under
`{path}` (`/v1/models`, files, embeddings...) is forwarded as it came. A
watched request:

1. names its session (gateway/llmproxy/session.py) and feeds the tool calls
   and results the guard has not seen, oldest first, as `step` and `result`
   checks (stopping at the first block: the rest did not count); with no new
   event, a zero `usage` check asks whether the budget is spent;
2. is forwarded untouched, or, on a decision:
   - `block` for the budget: answered 429 in the API's error shape;
   - `block` for a loop: with `block_mode: answer`, forwarded with tools
     disabled and the guard's message as a system note, so the model writes
     a final answer; with `block_mode: stop`, answered with a final message
     the proxy writes, the model not called;
   - `warn` (with `warn_note`): forwarded with the note, tools still on;
3. streams the upstream's answer back as it arrives, reading its usage on
   the way, which then goes to the session's budget.

Credentials pass through to the upstream and are never logged or kept (a
digest of the key enters the session's fingerprint). A store that fails
answers nothing wrong: the request is forwarded unguarded and the failure
logged (an agent is never stopped by the guard's own trouble).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote

import aiohttp
from aiohttp import web
from yarl import URL

from gateway.api.common import body_within
from gateway.config.llmproxy import ApiConfig, LlmProxyConfig
from gateway.errors import BotbouncerError
from gateway.guard.normalize import loads
from gateway.guard.requests import GuardInputError
from gateway.guard.service import Answer, Guard, Prepared
from gateway.inflight import InFlight, ShuttingDown
from gateway.llmproxy import session as sessions
from gateway.llmproxy.anthropic import Anthropic
from gateway.llmproxy.openai import OpenAI
from gateway.llmproxy.order import Turns
from gateway.llmproxy.responses import Responses
from gateway.llmproxy.wire import (
    HOP_BY_HOP,
    Dialect,
    Json,
    Tap,
    ToolEvent,
    Usage,
    WholeTap,
    digest,
    in_call_order,
)
from gateway.metrics import Metrics
from gateway.outbound import client_session
from gateway.store import Store, StoreError

log = logging.getLogger("botbouncer.llm_proxy")
# The code of an error the HTTP layer answers, by its status (error_for).
_LAYER_CODES = {408: "request_timeout", 413: "request_too_large", 431: "request_too_large",
                500: "internal_error", 504: "timeout"}  # fmt: skip

# Never forwarded either way: hop-by-hop headers and the proxy's own session header.
_HOP = HOP_BY_HOP | {sessions.HEADER.lower()}
_KEYS = frozenset({"authorization", "x-api-key", "api-key"})
GUARD_HEADER = "X-Botbouncer-Guard"
ERROR_HEADER = "X-Botbouncer-Error"  # on an error the proxy answers itself: its code
NOTE = "botbouncer (loop guard): "
TOOLS_OFF = " Tools are disabled for this answer: answer the user now with what you have."
# On an answer the same request cannot change: the SDKs retry 408, 409, 429
# and 5xx unless told not to.
NO_RETRY = {"x-should-retry": "false"}


class TooLarge(BotbouncerError):
    status = 413


@dataclass
class Verdict:
    answer: Answer | None  # the decisive guard answer, None when nothing was checked
    action: str  # forwarded | noted | tools_disabled | stopped | budget_exhausted | fail_open
    # The events fed, being saved while the request goes on (awaited before
    # the answer ends: the session's next request finds them saved).
    saving: asyncio.Task[None] | None = None


# What may follow a priced model's name in a dated one: -2025-09-29, -20250929, -latest.
_DATED = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8}|latest)")


def _tails(raw_path: str, prefix: str) -> tuple[str, str] | None:
    """The request's path under the API's `prefix`: (decoded, for telling
    the routes apart; as it came, for the upstream), without `.` segments;
    None when it holds a `..` segment. The upstream gets the path's
    escapes as sent (an escaped `?`, `#` or `/` in a file id is part of the
    id), and a route is told by what the upstream will make of it, so
    `/v1/./chat/completions` is the guarded route and `%2E%2E` climbs out
    of nothing."""
    path = raw_path.partition("?")[0]
    if not path.startswith(prefix + "/"):  # the prefix itself escaped: read it as decoded
        path = URL(path).path
        if not path.startswith(prefix + "/"):
            return None
    kept = []
    for segment in path[len(prefix) + 1 :].split("/"):
        plain = unquote(segment)
        if plain == "..":
            return None
        if plain != ".":
            kept.append(segment)
    decoded = "/" + "/".join(unquote(s) for s in kept if s)
    return decoded, "/" + "/".join(kept)


HELD_AT_MOST = 1 << 20  # a background request's whole answer, held until it is kept


class _Opened:
    """Called once with a background response's id, as soon as it is read."""

    def __init__(self, keep: Callable[[str], Awaitable[None]]) -> None:
        self._keep = keep
        self.done = False

    async def __call__(self, response_id: str) -> None:
        if not self.done:
            self.done = True
            await self._keep(response_id)


_FETCH = re.compile(r"/v1/responses/([^/]+)")


def _fetched(method: str, tail: str) -> str | None:
    """The id of a Responses answer fetched by `GET /v1/responses/<id>`."""
    found = _FETCH.fullmatch(tail) if method == "GET" else None
    return found.group(1) if found is not None else None


def _request_digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()[:32]


def _worst(answers: list[Answer]) -> Answer | None:
    rank = {"allow": 0, "warn": 1, "block": 2}
    best: Answer | None = None
    for a in answers:
        if best is None or rank[a.decision] > rank[best.decision]:
            best = a
    return best


class LlmProxy:
    def __init__(
        self,
        config: LlmProxyConfig,
        guard: Guard,
        store: Store,
        metrics: Metrics,
        inflight: InFlight | None = None,
    ) -> None:
        self.config = config
        self.inflight = inflight if inflight is not None else InFlight()
        self.guard = guard
        self.seen = sessions.Seen(store)
        self.anchors = sessions.Anchors(store)
        self.order = Turns()
        self.chains = sessions.Chains(store)
        self.background = sessions.Background(store)
        self.metrics = metrics
        self.paths = {name: api.path for name, api in config.apis()}  # fixed until restart
        self._client: aiohttp.ClientSession | None = None
        self._unpriced: set[str] = set()  # models warned of once

    def configure(self, config: LlmProxyConfig) -> None:
        """A reload: everything but the paths (and which APIs are served) applies."""
        self.config = config

    def routes(self) -> list[web.RouteDef]:
        out = []
        for name, path in self.paths.items():

            async def handle(request: web.Request, name: str = name) -> web.StreamResponse:
                return await self._handle(request, name)

            out.append(web.route("*", path + "/{tail:.*}", handle))
        return out

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def _session(self) -> aiohttp.ClientSession:
        if self._client is None or self._client.closed:
            self._client = client_session(
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300), auto_decompress=True
            )
        return self._client

    def _api(self, name: str, tail: str = "") -> tuple[ApiConfig | None, Dialect]:
        """The API's configuration, and the dialect of the route `tail` under it."""
        if name == "openai":
            oa = self.config.openai
            if tail == Responses.model_path:
                return oa, Responses()
            return oa, OpenAI(stream_usage=oa.stream_usage if oa is not None else True)
        return self.config.anthropic, Anthropic()

    # -- the request ------------------------------------------------------------

    async def _handle(self, request: web.Request, name: str) -> web.StreamResponse:
        try:
            with self.inflight.track():  # a stop lets it finish within the grace period
                return await self._proxy(request, name)
        except ShuttingDown as exc:
            self._count(name, "shutting_down")
            return self._error(self._api(name)[1], 503, exc.public(), "shutting_down")

    async def _proxy(self, request: web.Request, name: str) -> web.StreamResponse:
        tails = _tails(request.raw_path, self.paths[name])
        api, dialect = self._api(name, tails[0] if tails is not None else "")
        if tails is None:
            self._count(name, "bad_path")
            why = "a path with a `..` segment is not forwarded"
            return self._error(dialect, 400, why, "invalid_path", NO_RETRY)
        tail, wire = tails
        if api is None:  # removed by a reload: the route stays until restart
            return self._error(dialect, 404, f"the {name} API is no longer configured", "not_found")
        try:
            raw = await self._read(request)
        except TooLarge as exc:
            self._count(name, "too_large")
            return self._error(dialect, 413, str(exc), "request_too_large")
        body: Any = None
        if request.method == "POST" and tail == dialect.model_path:
            try:
                body = loads(raw)
            except ValueError:  # bad JSON, or nested past what the guard reads
                body = None  # the upstream says what is wrong with it
        if not isinstance(body, dict):
            self._count(name, "passthrough")
            fetched = _fetched(request.method, tail) if name == "openai" else None
            if fetched is not None:
                return await self._fetch(request, api, wire, raw, fetched)
            return await self._forward(request, api, dialect, wire, raw)
        return await self._model_call(request, api, dialect, wire, raw, body)

    async def _read(self, request: web.Request) -> bytes:
        limit = self.config.max_body_bytes
        body = await body_within(request, limit)
        if body is None:
            raise TooLarge(f"request body larger than llm_proxy.max_body_bytes ({limit} bytes)")
        return body

    async def _model_call(
        self,
        request: web.Request,
        api: ApiConfig,
        dialect: Dialect,
        tail: str,
        raw: bytes,
        body: Json,
    ) -> web.StreamResponse:
        credential = request.headers.get("Authorization") or request.headers.get("x-api-key") or ""
        try:
            session = sessions.given(request.headers.get(sessions.HEADER))
        except ValueError as exc:
            self._count(dialect.name, "invalid_session")
            log.info("llm proxy %s: %s", dialect.name, exc)
            return self._error(dialect, 400, str(exc), "invalid_session")
        read = body  # as its tool events are read
        previous = dialect.continues(body)
        held = False  # it continues an answer written under a block
        if previous is not None:
            chain = await self._recall(previous)
            if chain is not None:
                session = session or chain.session
                read = dialect.continued(body, chain.calls)
                held = chain.held
        # Whether the session is the conversation's own: the header's, a
        # chain's, or one an answer relayed here named (_named).
        named = session is not None
        if session is None:
            session, named = await self._named(dialect, body, credential)
        try:
            verdict = await self._check(session, dialect, read, raw, held)
        except StoreError as exc:
            log.warning("llm proxy: the guard's store failed (%s); %s request forwarded "
                        "unguarded", exc, dialect.name)  # fmt: skip
            verdict = Verdict(None, "fail_open")
        except BotbouncerError as exc:  # a session under another profile: 409
            self._count(dialect.name, "guard_conflict")
            log.info("llm proxy %s session=%s: %s", dialect.name, session, exc.public())
            why = (f"session {session!r} runs under another guard profile than this proxy's "
                   f"({self.config.profile!r}): send another {sessions.HEADER}, or DELETE "
                   f"/v1/guard/{session} to start it over")  # fmt: skip
            return self._error(dialect, exc.status, why, "guard_conflict", NO_RETRY)
        if verdict.action == "stopped" and previous is not None:
            # A conversation the upstream keeps (previous_response_id, a
            # conversation): an answer written here is none it holds, and
            # its next request would be refused there (an unknown response,
            # calls without outputs). The model writes the final answer
            # instead, tools off.
            verdict.action = "tools_disabled"
        try:
            self._count(dialect.name, verdict.action)
            headers = {}
            if session is not None:
                headers[sessions.HEADER] = session
            a = verdict.answer
            if a is not None and a.decision != "allow":
                headers[GUARD_HEADER] = f"{a.decision} {a.reason}"
                log.info("llm proxy %s session=%s %s %s: %s", dialect.name, session, a.decision,
                         a.reason, verdict.action)  # fmt: skip
            if verdict.action == "budget_exhausted" and a is not None:
                headers.update(NO_RETRY)  # the SDKs' own retries would ask again
                return self._error(dialect, 429, a.message, "budget_exhausted", headers)
            if verdict.action == "stopped" and a is not None:
                text, kind = dialect.final_answer(body, f"[{NOTE}{a.reason}] {a.message}")
                return web.Response(body=text, content_type=kind, headers=headers)
            send: Json | None = None
            if verdict.action in ("noted", "tools_disabled") and a is not None:
                off = verdict.action == "tools_disabled"
                send = dialect.with_note(body, NOTE + a.message + (TOOLS_OFF if off else ""), off)
            spliced = dialect.prepared(raw, body) if send is None else None
            if spliced is not None:
                data = spliced
            else:
                prepared = dialect.prepare(send if send is not None else body)
                if prepared is not None:
                    send = prepared
                data = raw if send is None else json.dumps(send).encode()
            tap = dialect.stream_tap(body) if dialect.streams(body) else WholeTap(dialect)
            pending: sessions.Pending | None = None
            if body.get("background") is True:
                # Kept as soon as its id is read (a stream that drops is resumed
                # by a fetch that may come before this request's end), counted
                # once whether this answer or a fetch brings it finished.
                opening = "" if named else digest(dialect.opening(body))
                pending = sessions.Pending(session if named else None, dialect.model(body),
                                           digest(credential), opening, [])  # fmt: skip
            opened = self._opened(dialect, body, pending) if pending is not None else None
            done = await self._forward(request, api, dialect, tail, data, tap, headers, opened)
            made = tap.continuable[0] if tap.continuable is not None else tap.opened
            if 200 <= done.status < 300 and pending is not None and made is not None:
                if opened is not None:
                    await opened(made)  # (once: the relay may have kept it already)
                chains = dialect.continued_as(body, made)
                await self._finished(made, replace(pending, chains=chains), dialect, tap)
                return done
            if 200 <= done.status < 300:
                if not named:  # its first answer here that calls tools names it from now on
                    session = sessions.fingerprint(dialect, body, credential, tap.anchor)
                    await self._keep(session)
                await self._account(session, dialect, body, tap.usage)
                if tap.continuable is not None and session is not None:
                    keys = dialect.continued_as(body, tap.continuable[0])
                    blocked = verdict.action == "tools_disabled"
                    await self._remember(session, keys, *tap.continuable, held=blocked)
            return done
        finally:
            if verdict.saving is not None:
                try:
                    await verdict.saving
                except BotbouncerError as exc:
                    log.warning("llm proxy: session %s: the events fed were not saved (%s); "
                                "they may be fed again", session, exc)  # fmt: skip

    async def _check(
        self, session: str | None, dialect: Dialect, body: Json, raw: bytes, chained: bool = False
    ) -> Verdict:
        """`chained`: the request continues an answer a block held (Chain.held)."""
        if session is None:
            return Verdict(None, "forwarded")  # a conversation's first request
        profile = self.config.profile
        answers: list[Answer] = []
        checked = False  # whether any event was checked
        saving = None
        async with self.order.turn():  # in turns: gateway/llmproxy/order.py
            events = dialect.tool_events(body)
            replay = None
            if events:
                fed = await self.seen.new(session, events)
                # In one call to the store, in order, each result after its
                # own call, until one is blocked.
                checks = [
                    c
                    for c in (self._prepare(session, e, profile) for e in in_call_order(fed.new))
                    if c
                ]
                answers = await self.guard.feed(session, checks, profile)
                checked = bool(answers)
                for answer in answers:
                    self.metrics.guard_checks.labels(answer.decision, answer.reason).inc()
                if fed.new:
                    held = self._held(_worst(answers), raw, [e.key for e in fed.new])
                    saving = asyncio.create_task(self.seen.remember(session, events, fed, held))
                else:
                    replay = fed.held
            elif chained:  # no history to hold it: the answer it continues says so
                replay = (await self.seen.new(session, [])).held
            if not checked:  # nothing new to feed: is the budget spent?
                usage = await self.guard.usage(session, self._usage(0, 0), profile)
                answers.append(usage)
                self.metrics.guard_checks.labels(usage.decision, usage.reason).inc()
                used = usage.steps.get("used") or 0
                if replay is not None and replay.applies_to(
                    _request_digest(raw), used, {e.key for e in events}, chained
                ):
                    # The request the guard decided on, sent again (an SDK's
                    # retry), or the conversation it blocked nudged on: the
                    # same verdict, not a fresh start.
                    answers.append(
                        Answer(session, replay.decision, replay.reason, replay.message, {})
                    )
        a = _worst(answers)
        if a is None or a.decision == "allow":
            action = "forwarded"
        elif a.decision == "warn":
            action = "noted" if self.config.warn_note else "forwarded"
        elif a.reason == "budget_exhausted":
            action = "budget_exhausted"
        else:
            action = "tools_disabled" if self.config.block_mode == "answer" else "stopped"
        return Verdict(a, action, saving)

    @staticmethod
    def _held(decided: Answer | None, raw: bytes, keys: list[str]) -> sessions.Held | None:
        """What a retry of this request is to get again (and, for a block,
        the requests that go on from it: Held.applies_to): a warning or a
        block for a loop (a spent budget is asked afresh: it may have been
        raised). `keys`: the events this request fed."""
        if decided is None or decided.decision == "allow" or decided.reason == "budget_exhausted":
            return None
        steps = decided.steps.get("used") or 0
        return sessions.Held(_request_digest(raw), decided.decision, decided.reason,
                             decided.message, steps, tuple(keys))  # fmt: skip

    def _prepare(self, session: str, event: ToolEvent, profile: str) -> Prepared | None:
        """The event as the guard takes it, or None for one it cannot take (a
        tool name over 200 characters, arguments nested too deep): the
        agent's own input is the upstream's to judge, never a reason to
        refuse it."""
        try:
            if event.kind == "step":
                args = event.args if event.args is not None else {}
                return self.guard.prepare("step", {"tool": event.tool, "args": args}, profile)
            body = {"tool": event.tool, "ok": event.ok, "output": event.output}
            return self.guard.prepare("result", body, profile)
        except GuardInputError as exc:
            log.info("llm proxy session=%s: a %s of %.60r not fed to the guard: %s", session,
                     event.kind, event.tool, exc)  # fmt: skip
            return None

    async def _named(
        self, dialect: Dialect, body: Json, credential: str
    ) -> tuple[str | None, bool]:
        """The session of a conversation that names none (session.Anchors),
        and whether it is its own. None before any answer called tools. A
        history none of whose answers was relayed here as a conversation's
        first (begun before the proxy was in place, or examples of tool
        calls in the prompt, the same in every conversation that uses it)
        is checked under its first answer's session, which it may share:
        no usage is counted there, and its next answer that calls tools
        names its own."""
        anchors = dialect.anchors(body)
        if not anchors:
            return None, False
        key, opening = digest(credential), digest(dialect.opening(body))
        # Made one by one: an answer this replica relayed is most often the first.
        names = (sessions.name_of(dialect.name, key, opening, a) for a in anchors)
        try:
            known = await self.anchors.known(names)
        except StoreError as exc:
            log.warning("llm proxy: which session a %s request belongs to could not be read "
                        "(%s)", dialect.name, exc)  # fmt: skip
            known = None
        if known is not None:
            return known, True
        return sessions.name_of(dialect.name, key, opening, anchors[0]), False

    async def _keep(self, session: str | None) -> None:
        """A conversation's first answer with tool calls, which names its
        session from now on; known here before anything is awaited, so the
        agent's next request, however soon, finds it."""
        if session is None:
            return
        self.anchors.hold(session)
        try:
            await self.anchors.keep(session)
        except StoreError as exc:
            log.warning("llm proxy: session %s was not kept for the other replicas (%s)",
                        session, exc)  # fmt: skip

    async def _recall(self, previous: str) -> sessions.Chain | None:
        try:
            return await self.chains.recall(previous)
        except StoreError as exc:
            log.warning("llm proxy: what %.60r continues could not be read (%s); its calls "
                        "are not fed", previous, exc)  # fmt: skip
            return None

    async def _remember(
        self,
        session: str,
        keys: list[str],
        answer_id: str,
        calls: list[list[str]],
        held: bool = False,
    ) -> None:
        """An answer the upstream keeps, for the requests that continue it
        (under `keys`: Dialect.continued_as); `held`: written under a block."""
        try:
            for key in keys:
                await self.chains.remember(key, session, calls, held)
        except StoreError as exc:
            log.warning("llm proxy: answer %.60r of session %s not kept for the requests "
                        "that continue it (%s)", answer_id, session, exc)  # fmt: skip

    def _opened(self, dialect: Dialect, body: Json, pending: sessions.Pending) -> _Opened:
        """What keeps a background response once its id is read: `pending`,
        with the keys requests continuing it will name it by."""

        async def keep(response_id: str) -> None:
            kept = replace(pending, chains=dialect.continued_as(body, response_id))
            try:
                await self.background.mark(response_id, kept)
            except StoreError as exc:
                log.warning("llm proxy: background response %.60r not kept (%s): its usage "
                            "will not be counted", response_id, exc)  # fmt: skip

        return _Opened(keep)

    async def _fetch(
        self, request: web.Request, api: ApiConfig, tail: str, raw: bytes, response_id: str
    ) -> web.StreamResponse:
        """`GET /v1/responses/<id>`, relayed. When it is a background response
        of ours fetched finished, its usage goes to its session's budget and
        its tool calls to the requests that continue it, once (Background)."""
        dialect = Responses()
        try:
            pending = await self.background.pending(response_id)
        except StoreError as exc:
            log.warning("llm proxy: whether %.60r is a background response could not be read "
                        "(%s): its usage is not counted", response_id, exc)  # fmt: skip
            pending = None
        if pending is None:
            return await self._forward(request, api, dialect, tail, raw)
        streams = request.query.get("stream") == "true"
        tap = dialect.stream_tap({}) if streams else WholeTap(dialect)
        done = await self._forward(request, api, dialect, tail, raw, tap)
        if 200 <= done.status < 300:
            await self._finished(response_id, pending, dialect, tap)
        return done

    async def _finished(
        self, response_id: str, pending: sessions.Pending, dialect: Dialect, tap: Tap
    ) -> None:
        """A background response seen finished (its usage read), by the
        request that made it or by a fetch: its usage to its session's budget
        and its tool calls to the requests that continue it, the first time
        only (Background.take)."""
        if not tap.usage.seen:
            return  # not finished yet: a later fetch counts it
        ttl_ms = self.guard.config.session_ttl_seconds * 1000
        try:
            first = await self.background.take(response_id, ttl_ms)
        except StoreError as exc:
            log.warning("llm proxy: background response %.60r not counted (%s)", response_id,
                        exc)  # fmt: skip
            return
        if not first:
            return
        session = pending.session
        if session is None:
            session = sessions.fingerprint_of(dialect.name, pending.key, pending.opening,
                                              tap.anchor)  # fmt: skip
            await self._keep(session)
        # No tool calls and no header: its tokens in the metrics, in no budget (_account).
        await self._account(session, dialect, {"model": pending.model}, tap.usage)
        if tap.continuable is not None and session is not None:
            await self._remember(session, pending.chains, *tap.continuable)

    def _usage(self, cost_usd: float, tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {"cost_usd": cost_usd, "tokens": tokens}
        budget = self.config.budget
        if budget.usd is not None:
            body["budget_usd"] = budget.usd
        if budget.tokens is not None:
            body["budget_tokens"] = budget.tokens
        return body

    def _cost(self, model: str, usage: Usage) -> float:
        prices = self.config.prices
        price = prices.get(model)
        if price is None:  # a dated model name takes its family's price, and only that
            family = [
                m for m in prices if model.startswith(m) and _DATED.fullmatch(model[len(m) :])
            ]
            price = prices[max(family, key=len)] if family else None
        if price is None:
            if model not in self._unpriced and self._budgets_dollars():
                if len(self._unpriced) >= 1024:  # model names are the agents' to choose
                    self._unpriced.clear()
                self._unpriced.add(model)
                log.warning("llm proxy: no price for model %.80r in llm_proxy.prices: its "
                            "answers cost 0 against budget.usd", model)  # fmt: skip
            return 0.0
        return price.cost(usage.input_tokens, usage.cached_tokens, usage.cache_write_tokens,
                          usage.output_tokens)  # fmt: skip

    def _budgets_dollars(self) -> bool:
        """Whether a dollar budget applies to the proxy's sessions."""
        _, profile = self.guard.profile(self.config.profile)
        return self.config.budget.usd is not None or profile.budget.usd is not None

    async def _account(
        self, session: str | None, dialect: Dialect, body: Json, usage: Usage
    ) -> None:
        """The answer's usage to the session's budget (after the agent has it)."""
        m = self.metrics
        m.llm_tokens.labels(dialect.name, "input").inc(usage.input_tokens)
        m.llm_tokens.labels(dialect.name, "output").inc(usage.output_tokens)
        if session is None or not usage.seen:
            return
        cost = self._cost(dialect.model(body), usage)
        try:
            answer = await self.guard.usage(
                session, self._usage(cost, usage.tokens), self.config.profile
            )
        except BotbouncerError as exc:
            log.warning("llm proxy: usage of session %s not counted: %s", session, exc)
            return
        m.guard_checks.labels(answer.decision, answer.reason).inc()

    # -- the upstream ------------------------------------------------------------

    def _headers(self, request: web.Request, api: ApiConfig, dialect: Dialect) -> dict[str, str]:
        key = api.api_key.get_secret_value() if api.api_key is not None else None
        out = {}
        for name, value in request.headers.items():
            low = name.lower()
            if low in _HOP or (key is not None and low in _KEYS):
                continue
            out[name] = value
        out["Accept-Encoding"] = "identity"  # the answer is read on its way (usage)
        if key is not None:
            out[dialect.key_header] = (
                f"Bearer {key}" if dialect.key_header == "Authorization" else key
            )
        return out

    async def _forward(
        self,
        request: web.Request,
        api: ApiConfig,
        dialect: Dialect,
        tail: str,
        data: bytes,
        tap: Tap | None = None,
        headers: dict[str, str] | None = None,
        opened: _Opened | None = None,
    ) -> web.StreamResponse:
        # `tail` and the query as they came (_tails): `?flag` stays `?flag`
        query = request.rel_url.raw_query_string
        url = URL(api.upstream + tail + ("?" + query if query else ""), encoded=True)
        t = self.config.timeouts
        timeout = aiohttp.ClientTimeout(
            total=None, connect=t.connect_seconds, sock_read=t.read_seconds
        )
        try:
            upstream = await self._session().request(
                request.method,
                url,
                data=data,
                headers=self._headers(request, api, dialect),
                timeout=timeout,
                allow_redirects=False,
            )
        except TimeoutError:
            self._failed(dialect.name, "timeout")
            log.warning("llm proxy: %s upstream %s did not answer within %gs", dialect.name,
                        api.upstream, t.read_seconds)  # fmt: skip
            return self._error(dialect, 504, f"the upstream {api.upstream} did not answer in "
                               f"time", "upstream_timeout", headers)  # fmt: skip
        except aiohttp.ClientError as exc:
            self._failed(dialect.name, "unreachable")
            log.warning("llm proxy: %s upstream %s unreachable: %s", dialect.name, api.upstream,
                        exc)  # fmt: skip
            why = f"the upstream {api.upstream} is unreachable: {type(exc).__name__}"
            return self._error(dialect, 502, why, "upstream_unreachable", headers)
        try:
            return await self._relay(request, upstream, dialect, tap, headers or {}, opened)
        finally:
            upstream.release()

    async def _relay(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        dialect: Dialect,
        tap: Tap | None,
        headers: dict[str, str],
        opened: _Opened | None = None,
    ) -> web.StreamResponse:
        out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for name, value in upstream.headers.items():
            if name.lower() not in _HOP:
                out.headers.add(name, value)
        length = upstream.headers.get("Content-Length")
        streamed = tap is not None and not isinstance(tap, WholeTap)
        if length is not None and "Content-Encoding" not in upstream.headers and not streamed:
            out.headers["Content-Length"] = length
        out.headers.update(headers)
        if not 200 <= upstream.status < 300:
            tap = None  # an error passes through as it is
        await out.prepare(request)
        # A background response is kept before the agent has its id (it may
        # fetch it through another replica at once): a stream's events once
        # its first is read; a whole answer (small: queued) is held until it
        # is read whole. Past HELD_AT_MOST it is no queued answer (an upstream
        # that ignored `background`): it goes on, kept after (_model_call).
        held: list[bytes] | None = [] if opened is not None and isinstance(tap, WholeTap) else None
        size = 0
        try:
            async for chunk in upstream.content.iter_any():
                passed = tap.feed(chunk) if tap is not None else chunk
                if opened is not None and tap is not None and tap.opened is not None:
                    await opened(tap.opened)  # a stream's first event: the id, read
                    opened = None
                if held is not None:
                    held.append(passed)
                    size += len(passed)
                    if size <= HELD_AT_MOST:
                        continue
                    passed, held = b"".join(held), None
                if passed:
                    await out.write(passed)
            if tap is not None:
                rest = tap.done()
                if held is not None:
                    if opened is not None and tap.continuable is not None:
                        await opened(tap.continuable[0])
                    rest = b"".join(held) + rest
                if rest:
                    await out.write(rest)
            await out.write_eof()
        except ConnectionResetError:  # before ClientError: aiohttp's is both
            self._failed(dialect.name, "agent_left")  # the agent went away mid-answer
        except (aiohttp.ClientError, TimeoutError) as exc:
            # Mid-answer: the status is sent, so the agent learns of it by the
            # connection dropping before the answer's end.
            self._failed(dialect.name, "upstream_broke")
            log.warning("llm proxy: %s upstream broke off its answer: %s", dialect.name,
                        type(exc).__name__)  # fmt: skip
            if request.transport is not None:
                request.transport.abort()  # not a clean end: aiohttp would end the chunks
        return out

    def _error(
        self,
        dialect: Dialect,
        status: int,
        message: str,
        code: str,
        headers: dict[str, str] | None = None,
    ) -> web.Response:
        # The code in a header too: Anthropic's error shape has no field for it.
        return web.Response(
            status=status,
            body=dialect.error(status, message, code),
            content_type="application/json",
            headers={**(headers or {}), ERROR_HEADER: code},
        )

    def error_for(self, path: str, status: int, message: str) -> web.Response | None:
        """An error the daemon's HTTP layer answers on this proxy's routes (a
        body that is no gzip it says it is, one that came late, a head too
        large), in the API's own shape, which the SDKs read; None elsewhere."""
        for name, prefix in self.paths.items():
            if path == prefix or path.startswith(prefix + "/"):
                code = _LAYER_CODES.get(status, "invalid_request")
                return self._error(self._api(name)[1], status, message, code)
        return None

    def _count(self, api: str, action: str) -> None:
        self.metrics.llm_requests.labels(api, action).inc()

    def _failed(self, api: str, how: str) -> None:
        """A request sent on that went wrong: counted by how, beside what was
        done with it (its one count in llm_requests)."""
        self.metrics.llm_failed.labels(api, how).inc()
