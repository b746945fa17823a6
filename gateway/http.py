"""The daemon's aiohttp server (docs/http-api.md): health, metrics and the
OpenAPI document here, and the route tables of gateway/api/ (ingress, decide,
admin, guard) mounted beside them.

The server owns the body limit and the error shapes: every error is JSON with
a message (each error class says its own status, gateway/errors.py), and bad
input is never a 5xx.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from gateway.admin import Admin
from gateway.api.admin import AdminRoutes, chat_key
from gateway.api.common import (
    MAX_BODY,
    BadRequest,
    Handler,
    IngressHandler,
    WebhookHandler,
    error,
    json_body,
    reply,
)
from gateway.api.decide import DecideRoutes
from gateway.api.guard import GuardRoutes
from gateway.api.ingress import IngressRoutes
from gateway.decide import Decider
from gateway.errors import BotbouncerError
from gateway.guard.service import Guard
from gateway.health import Health
from gateway.metrics import CONTENT_TYPE, Metrics
from gateway.openapi import OPENAPI as FULL_OPENAPI
from gateway.store import Store

log = logging.getLogger("botbouncer.http")


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
        self._ingress = IngressRoutes()
        self._admin = AdminRoutes(admin_token)
        self._decide = DecideRoutes()
        self.health = Health(store)
        self.stopping = False  # set by the daemon's stop: a cancelled request is then a 503
        self.app = web.Application(client_max_size=MAX_BODY, middlewares=[self._errors])
        r = self.app.router
        r.add_get("/healthz", self._healthz)
        r.add_get("/metrics", self._metrics)
        r.add_get("/openapi.json", self._openapi)
        self.app.add_routes(self._ingress.routes())
        self.app.add_routes(self._decide.routes())
        self.app.add_routes(self._admin.routes())
        if guard is not None:
            self.app.add_routes(GuardRoutes(guard, self.metrics).routes())

    @property
    def ingress(self) -> dict[str, IngressHandler]:
        return self._ingress.ingress

    @property
    def webhooks(self) -> dict[str, WebhookHandler]:
        return self._ingress.webhooks

    @property
    def deciders(self) -> dict[str, Decider]:
        """Decide-mode bots by name (the daemon fills it)."""
        return self._decide.deciders

    @property
    def admins(self) -> dict[str, Admin]:
        """Every configured bot's admin, in config order (the daemon fills it)."""
        return self._admin.admins

    @property
    def admin_token(self) -> str | None:
        return self._admin.admin_token

    @admin_token.setter
    def admin_token(self, token: str | None) -> None:
        self._admin.admin_token = token

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
                # A 405 names the allowed methods (RFC 9110): keep its Allow.
                allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else {}
                return error(exc.status, exc.reason, **allow)
            raise
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
        except BotbouncerError as exc:
            # Each error says its own answer (gateway/errors.py). A store
            # error is logged, not acted on: the degraded gauge is the
            # failover's to set, and one refused call is no switch.
            if exc.log_level is not None:
                log.log(exc.log_level, "%s on %s: %s", type(exc).__name__, request.path, exc)
            elif exc.status == 500:  # not meant to reach a client: a bug
                log.exception("unexpected %s on %s", type(exc).__name__, request.path)
            return error(exc.status, exc.public(), **exc.headers())

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response(await self.health.report())

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def _openapi(self, request: web.Request) -> web.Response:
        """The whole API (gateway/openapi.py); the guard's part alone is above."""
        return reply(FULL_OPENAPI)


__all__ = [
    "MAX_BODY",
    "BadRequest",
    "HttpServer",
    "IngressHandler",
    "WebhookHandler",
    "chat_key",
    "error",
    "json_body",
    "reply",
]
