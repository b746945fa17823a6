"""The admin routes: `/v1/admin/chats/{chat}/...`, behind a bearer token
(docs/http-api.md). The commands themselves are gateway/admin.py's, shared
with the platforms' chat commands."""

from __future__ import annotations

import hmac
from typing import Any

from aiohttp import web

from gateway.admin import Admin, overrides_from
from gateway.api.common import BadRequest, json_body, reply
from gateway.errors import BotbouncerError
from gateway.store.base import DECISION_LOG_SIZE

PLATFORMS = ("http", "discord", "telegram", "slack", "matrix")


class AdminRoutes:
    def __init__(self, admin_token: str | None = None) -> None:
        self.admin_token = admin_token
        # Every configured bot, in config order: whose limits an admin command reads.
        self.admins: dict[str, Admin] = {}

    def routes(self) -> list[web.RouteDef]:
        # `[^/]+`: a chat id may hold braces, which aiohttp's default pattern refuses.
        chat = "/v1/admin/chats/{chat:[^/]+}"
        return [
            web.get(chat, self._admin_status),
            web.post(chat + "/{command:reset|pause|resume}", self._admin_action),
            web.put(chat + "/limits", self._admin_limits),
            web.get(chat + "/decisions", self._admin_decisions),
        ]

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


class _Refused(BotbouncerError):
    """An admin request refused before it acts (401, 403, 404)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status  # type: ignore[misc]  # per refusal, not per class

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": 'Bearer realm="botbouncer"'} if self.status == 401 else {}


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
