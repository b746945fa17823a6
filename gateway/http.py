"""The daemon's aiohttp server (docs/http-api.md): ingress routing, admin API,
health and metrics.

Adapters that take messages over HTTP register a handler per bot; the server
owns the routes, body limits, authentication and error shapes, so every error
is JSON with a message and bad input is never a 5xx.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.admin import Admin, AdminError, overrides_from
from gateway.guard.normalize import MAX_JSON_DEPTH, depth_over, text_depth_over
from gateway.guard.openapi import OPENAPI
from gateway.guard.service import Answer, Guard, GuardInputError, ProfileConflict
from gateway.health import Health
from gateway.inflight import ShuttingDown
from gateway.metrics import CONTENT_TYPE, Metrics
from gateway.openapi import OPENAPI as FULL_OPENAPI
from gateway.store import Store, StoreError
from gateway.store.base import DECISION_LOG_SIZE

log = logging.getLogger("botbouncer.http")

MAX_BODY = 64 * 1024
PLATFORMS = ("http", "discord", "telegram")

# An ingress handler gets the decoded JSON body and answers (status, JSON body).
IngressHandler = Callable[[Any], Awaitable[tuple[int, dict[str, Any]]]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# A platform webhook (Telegram's setWebhook) gets the request itself: it checks
# the platform's own authentication before reading the body.
WebhookHandler = Callable[[web.Request], Awaitable[web.Response]]


class BadRequest(Exception):
    """Raised by handlers for input the client must fix (answered 400)."""


def error(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers or None)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def reply(payload: Any, status: int = 200) -> web.Response:
    # backslashreplace turns a lone surrogate into its JSON escape (\\ud800), so
    # any string that reached us can be answered; nothing else is affected.
    body = _dumps(payload).encode("utf-8", "backslashreplace")
    return web.Response(body=body, status=status, content_type="application/json")


class HttpServer:
    def __init__(
        self,
        store: Store,
        metrics: Metrics | None = None,
        admin_token: str | None = None,
        guard: Guard | None = None,
    ) -> None:
        self.store = store
        self.guard = guard
        self.metrics = metrics if metrics is not None else Metrics()
        self.admin_token = admin_token
        self.ingress: dict[str, IngressHandler] = {}
        self.webhooks: dict[str, WebhookHandler] = {}
        # Every configured bot, in config order: whose limits an admin command reads.
        self.admins: dict[str, Admin] = {}
        self.health = Health(store)
        self.stopping = False  # set by the daemon's stop: a cancelled request is then a 503
        self.app = web.Application(client_max_size=MAX_BODY, middlewares=[self._errors])
        r = self.app.router
        r.add_get("/healthz", self._healthz)
        r.add_get("/metrics", self._metrics)
        r.add_get("/openapi.json", self._openapi)
        r.add_post("/v1/bots/{bot}/messages", self._message)
        r.add_post("/v1/webhooks/{bot}", self._webhook)
        # `[^/]+`: a chat id may hold braces, which aiohttp's default pattern refuses.
        chat = "/v1/admin/chats/{chat:[^/]+}"
        r.add_get(chat, self._admin_status)
        r.add_post(chat + "/{command:reset|pause|resume}", self._admin_action)
        r.add_put(chat + "/limits", self._admin_limits)
        r.add_get(chat + "/decisions", self._admin_decisions)
        if guard is not None:
            r.add_get("/v1/guard/openapi.json", self._guard_openapi)
            session = "/v1/guard/{session:[^/]+}"
            r.add_post(session + "/{op:step|result|retry|handoff|kb-query|usage}", self._guard)
            r.add_get(session, self._guard_state)
            r.add_delete(session, self._guard_reset)

    def add_ingress(self, bot: str, handler: IngressHandler) -> None:
        self.ingress[bot] = handler

    def remove_ingress(self, bot: str) -> None:
        self.ingress.pop(bot, None)

    def add_webhook(self, bot: str, handler: WebhookHandler) -> None:
        self.webhooks[bot] = handler

    def remove_webhook(self, bot: str) -> None:
        self.webhooks.pop(bot, None)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:
            return error(413, f"request body larger than {MAX_BODY} bytes")
        except web.HTTPException as exc:
            if exc.status >= 400:
                return error(exc.status, exc.reason)
            raise
        except (BadRequest, AdminError, GuardInputError) as exc:
            return error(400, str(exc))
        except ProfileConflict as exc:
            return error(409, str(exc))
        except _Refused as exc:
            if exc.status == 401:
                return error(401, str(exc), **{"WWW-Authenticate": 'Bearer realm="botbouncer"'})
            return error(exc.status, str(exc))
        except ShuttingDown:
            return error(503, "botbouncer is shutting down; send this to another replica")
        except asyncio.CancelledError:
            if not self.stopping:
                raise  # the client went away: nothing to answer
            # Cancelled at the end of the shutdown grace period: its slot was
            # given back and nothing was sent. Say so rather than drop the
            # connection (the task goes on only to write this answer).
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            return error(503, "botbouncer stopped before this message was answered; nothing "
                         "was sent for it: send it again, to another replica")  # fmt: skip
        except StoreError as exc:
            # The gauge is the failover's to set (Daemon wires it): one
            # refused call is no switch to local memory.
            log.error("store error on %s: %s", request.path, exc)
            return error(503, "the state store is unavailable; try again")

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response(await self.health.report())

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def _message(self, request: web.Request) -> web.Response:
        bot = request.match_info["bot"]
        handler = self.ingress.get(bot)
        if handler is None:
            known = ", ".join(sorted(self.ingress)) or "none"
            return error(404, f"no http bot named {bot!r} (http bots: {known})")
        status, payload = await handler(await json_body(request))
        return reply(payload, status)

    async def _webhook(self, request: web.Request) -> web.Response:
        handler = self.webhooks.get(request.match_info["bot"])
        if handler is None:
            return error(404, "no bot here takes webhooks under that name")
        return await handler(request)

    # -- agent guard API ------------------------------------------------------

    async def _guard(self, request: web.Request) -> web.Response:
        assert self.guard is not None  # routed only with a guard
        ops = {
            "step": self.guard.step,
            "result": self.guard.result,
            "retry": self.guard.retry,
            "handoff": self.guard.handoff,
            "kb-query": self.guard.kb_query,
            "usage": self.guard.usage,
        }
        check = ops[request.match_info["op"]]
        answer: Answer = await check(
            request.match_info["session"], await json_body(request), request.query.get("profile")
        )
        self.metrics.guard_checks.labels(answer.decision, answer.reason).inc()
        return reply(answer.as_dict(), answer.status)

    async def _guard_state(self, request: web.Request) -> web.Response:
        assert self.guard is not None
        session = request.match_info["session"]
        state = await self.guard.state(session)
        if state is None:
            return error(404, f"no guard session {session!r} (or it expired)")
        return reply({"session": session, "state": state})

    async def _guard_reset(self, request: web.Request) -> web.Response:
        assert self.guard is not None
        session = request.match_info["session"]
        await self.guard.reset(session)
        return reply({"session": session, "done": "reset"})

    async def _guard_openapi(self, request: web.Request) -> web.Response:
        return reply(OPENAPI)

    async def _openapi(self, request: web.Request) -> web.Response:
        """The whole API (gateway/openapi.py); the guard's part alone is above."""
        return reply(FULL_OPENAPI)

    # -- admin API ---------------------------------------------------------

    def _authorize(self, request: web.Request) -> None:
        """403 when no token is configured, 401 when it is missing or wrong."""
        if not self.admin_token:
            raise _Refused(403, "the admin API is closed: set http.admin_token to open it")
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        expected = self.admin_token.encode()
        # Header bytes that are not UTF-8 arrive surrogate-escaped: encode them
        # back rather than fail, and let them be just a wrong token.
        token = given.strip().encode("utf-8", "backslashreplace")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token, expected):
            raise _Refused(401, "missing or wrong bearer token")

    def _target(self, request: web.Request) -> tuple[Admin, str]:
        """The admin for the request's `bot` (default: the first bot of the
        chat's platform) and the chat's store key."""
        self._authorize(request)
        chat = chat_key(request.match_info["chat"])
        name = request.query.get("bot")
        if name is not None:
            admin = self.admins.get(name)
            if admin is None:
                known = ", ".join(self.admins) or "none"
                raise _Refused(404, f"no bot named {name!r} (bots: {known})")
            return admin, chat
        platform = chat.partition(":")[0]
        for admin in self.admins.values():
            if admin.bot.platform == platform:
                return admin, chat
        if not self.admins:
            raise _Refused(404, "no bots are configured")
        return next(iter(self.admins.values())), chat

    async def _status_reply(self, admin: Admin, chat: str, **extra: Any) -> web.Response:
        status = await admin.status(chat)
        return reply({"bot": admin.bot.name, **extra, **status.as_dict()})

    async def _admin_status(self, request: web.Request) -> web.Response:
        admin, chat = self._target(request)
        return await self._status_reply(admin, chat)

    async def _admin_action(self, request: web.Request) -> web.Response:
        admin, chat = self._target(request)
        command = request.match_info["command"]
        actor = _actor(request)
        if command == "reset":
            await admin.reset(chat, actor)
        else:
            await admin.pause(chat, actor, paused=command == "pause")
        return await self._status_reply(admin, chat, done=command)

    async def _admin_limits(self, request: web.Request) -> web.Response:
        admin, chat = self._target(request)
        body = await json_body(request)
        if not isinstance(body, dict):
            raise BadRequest('body: must be a JSON object such as {"soft_limit": 10}')
        await admin.set_limits(chat, _actor(request), overrides_from(body))
        return await self._status_reply(admin, chat, done="limits")

    async def _admin_decisions(self, request: web.Request) -> web.Response:
        admin, chat = self._target(request)
        raw = request.query.get("limit", str(DECISION_LOG_SIZE))
        try:
            limit = int(raw)
        except ValueError:
            raise BadRequest(f"limit: must be a whole number, not {raw!r}") from None
        return reply({"chat": chat, "decisions": await admin.why(chat, limit)})


class _Refused(Exception):
    """An admin request refused before it acts (401, 403, 404)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def json_body(request: web.Request) -> Any:
    """The body's JSON, nested at most MAX_JSON_DEPTH deep: what handlers and
    the guard's normaliser walk (some recursively) can then never run out of
    stack, whatever the route. Checked on the bytes before json.loads (which
    recurses too), at a cost under a microsecond for a typical body."""
    raw = await request.read()
    if not raw.strip():
        raise BadRequest("empty body: send a JSON object")
    too_deep = f"invalid JSON body: nested deeper than {MAX_JSON_DEPTH} levels"
    deep = text_depth_over(raw)
    if deep:
        raise BadRequest(too_deep)
    try:
        value = json.loads(raw)
    except ValueError as exc:  # bad JSON or encoding, or an int beyond Python's digit limit
        raise BadRequest(f"invalid JSON body: {exc}") from None
    except RecursionError:
        raise BadRequest(too_deep) from None
    if deep is None and depth_over(value):  # a UTF-16/32 body: its bytes could not tell
        raise BadRequest(too_deep)
    return value


def _actor(request: web.Request) -> str:
    return f"http({request.remote or '?'})"


def chat_key(raw: str) -> str:
    """A chat as the store keys it. `http:room1`, `discord:123`, `telegram:-100:7`
    as decisions show them; a bare id is an http chat (`room1` -> `http:room1`)."""
    if not raw:
        raise BadRequest("chat: must not be empty")
    platform, sep, rest = raw.partition(":")
    if sep and platform in PLATFORMS and rest:
        return raw
    return f"http:{raw}"
