"""The daemon's aiohttp server: ingress routing, health (DESIGN §5.3).

Adapters that take messages over HTTP register a handler per bot; the server
owns the routes, body limits and error shapes, so every error is JSON with a
message and bad input is never a 5xx.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.store import Store, StoreError

log = logging.getLogger("botbouncer.http")

MAX_BODY = 64 * 1024

# An ingress handler gets the decoded JSON body and answers (status, JSON body).
IngressHandler = Callable[[Any], Awaitable[tuple[int, dict[str, Any]]]]


class BadRequest(Exception):
    """Raised by handlers for input the client must fix (answered 400)."""


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge:
        return error(413, f"request body larger than {MAX_BODY} bytes")
    except web.HTTPException as exc:
        if exc.status >= 400:
            return error(exc.status, exc.reason)
        raise
    except BadRequest as exc:
        return error(400, str(exc))
    except StoreError as exc:
        log.error("store error on %s: %s", request.path, exc)
        return error(503, "the state store is unavailable; try again")


class HttpServer:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.ingress: dict[str, IngressHandler] = {}
        self.app = web.Application(client_max_size=MAX_BODY, middlewares=[_errors])
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_post("/v1/bots/{bot}/messages", self._message)

    def add_ingress(self, bot: str, handler: IngressHandler) -> None:
        self.ingress[bot] = handler

    def remove_ingress(self, bot: str) -> None:
        self.ingress.pop(bot, None)

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "store": self.store.kind})

    async def _message(self, request: web.Request) -> web.Response:
        bot = request.match_info["bot"]
        handler = self.ingress.get(bot)
        if handler is None:
            known = ", ".join(sorted(self.ingress)) or "none"
            return error(404, f"no http bot named {bot!r} (http bots: {known})")
        raw = await request.read()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return error(400, f"invalid JSON body: {exc}")
        status, payload = await handler(body)
        return web.json_response(payload, status=status, dumps=_dumps)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)
