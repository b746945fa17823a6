"""The REST API (v10) below `/api/v10`: authentication, rate-limit headers and 429s
on demand (`rate_limit_next`), the records of calls (`requests`), and the routes that
botbouncer's adapter, the benchmark's bare bot and discord.py's start-up use:

    GET  /gateway/bot                             (AutoShardedClient, the adapter)
    GET  /users/@me, /oauth2/applications/@me     (Client.login)
    POST /channels/{id}/messages                  (JSON only: no files, embeds...)
    POST /channels/{id}/typing
    PUT  /applications/{id}/commands, /applications/{id}/guilds/{id}/commands

The interaction callback is in interactions.py. Any other request is answered with
a 404 JSON body and recorded in `unknown_routes`, so a client that starts to use
something the fake lacks fails with a message that names it.
"""

from __future__ import annotations

import copy
import json
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.fakes.discord.gateway import Gateway, log
from tests.fakes.discord.payloads import application_payload, me_payload, new_message
from tests.fakes.discord.world import API_VERSION, FakeBot, FakeChannel, Json, MessageType, Perm

PREFIX = f"/api/v{API_VERSION}"
# what a message may carry that the fake does not implement (a 400 names it)
UNSUPPORTED = ("embeds", "components", "sticker_ids", "attachments", "poll")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str  # below /api/v10, e.g. "/channels/123/messages"
    status: int


@dataclass(frozen=True)
class TypingEvent:
    channel_id: int
    user_id: int


class HttpError(Exception):
    """Answered as Discord answers errors: {"message", "code", ...} with `status`."""

    def __init__(self, status: int, message: str, code: int = 0, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body: Json = {"message": message, "code": code, **extra}


def json_response(
    body: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    # discord.py only parses a body as JSON when content-type is exactly application/json
    # (no "; charset=utf-8"), so set the header by hand.
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    return web.Response(body=json.dumps(body).encode(), status=status, headers=hdrs)


async def read_json(request: web.Request) -> Json:
    """A JSON object body ({} when there is none); multipart (files) is refused."""
    if request.content_type.startswith("multipart/"):
        raise HttpError(400, "fake discord: file uploads are not implemented", 50035)
    if not request.can_read_body:
        return {}
    body = await request.json()
    if not isinstance(body, dict):
        raise HttpError(400, "Invalid Form Body", 50035)
    return body


def _route_bucket(method: str, path: str) -> str:
    return uuid.uuid5(uuid.NAMESPACE_URL, method + re.sub(r"\d{5,}", "{id}", path)).hex[:16]


class Rest(Gateway):
    """The world and its gateway, with the REST API beside them."""

    recommended_shards = 1  # what GET /gateway/bot recommends

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[RecordedRequest] = []
        self.typing: list[TypingEvent] = []
        self.commands: dict[tuple[int, int | None], list[Json]] = {}  # (app, guild or None)
        self.rate_limited: list[tuple[str, str]] = []
        self._rate_limit_next: dict[tuple[str, str], list[float]] = {}

    def rate_limit_next(self, method: str, path: str, retry_after: float = 0.05) -> None:
        """Answer the next `method path` (below /api/v10, e.g. "/channels/1/messages") with 429."""
        self._rate_limit_next.setdefault((method.upper(), path), []).append(retry_after)

    def _app(self) -> web.Application:
        """Every route of every layer (`_add_routes`), then the catch-all for the rest."""
        app = web.Application(middlewares=[self._middleware])
        self._add_routes(app.router)
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        return app

    def _add_routes(self, router: web.UrlDispatcher) -> None:
        super()._add_routes(router)
        channel = f"{PREFIX}/channels/{{channel_id:\\d+}}"
        app = f"{PREFIX}/applications/{{app_id:\\d+}}"
        router.add_get(f"{PREFIX}/gateway/bot", self._get_gateway_bot)
        router.add_get(f"{PREFIX}/users/@me", self._get_me)
        router.add_get(f"{PREFIX}/oauth2/applications/@me", self._get_application)
        router.add_post(f"{channel}/messages", self._post_message)
        router.add_post(f"{channel}/typing", self._post_typing)
        router.add_put(f"{app}/commands", self._put_commands)
        router.add_put(f"{app}/guilds/{{guild_id:\\d+}}/commands", self._put_commands)

    # -- every request -------------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith(PREFIX + "/"):
            return await handler(request)
        path = request.path[len(PREFIX) :]
        headers = {
            "X-RateLimit-Limit": "50",
            "X-RateLimit-Remaining": "49",
            "X-RateLimit-Reset": f"{time.time() + 1:.3f}",
            "X-RateLimit-Reset-After": "1.000",
            "X-RateLimit-Bucket": _route_bucket(request.method, path),
        }
        queued = self._rate_limit_next.get((request.method, path))
        response: web.StreamResponse
        if queued:
            retry_after = queued.pop(0)
            self.rate_limited.append((request.method, path))
            body = {"message": "You are being rate limited.", "retry_after": retry_after}
            headers.update(
                {
                    "Retry-After": f"{retry_after}",
                    "X-RateLimit-Scope": "user",
                    "X-RateLimit-Remaining": "0",
                    "Via": "1.1 google",  # discord.py treats a 429 without Via as a Cloudflare ban
                }
            )
            response = json_response({**body, "global": False}, 429, headers)
        elif self._auth(request) is None and not path.startswith("/interactions/"):
            response = json_response({"message": "401: Unauthorized", "code": 0}, 401, headers)
        else:
            try:
                response = await handler(request)
            except HttpError as exc:
                response = json_response(exc.body, exc.status)
            response.headers.update(headers)
        self.requests.append(RecordedRequest(request.method, path, response.status))
        await self.changed()
        return response

    async def _unknown(self, request: web.Request) -> web.StreamResponse:
        self.unknown_routes.append((request.method, request.path))
        log.warning("fake discord: unknown route %s %s", request.method, request.path)
        await self.changed()
        return json_response({"message": "404: Not Found", "code": 0}, 404)

    def _auth(self, request: web.Request) -> FakeBot | None:
        header = request.headers.get("Authorization", "")
        return self.bots.get(header[4:]) if header.startswith("Bot ") else None

    def _bot(self, request: web.Request) -> FakeBot:
        bot = self._auth(request)
        assert bot is not None  # the middleware answered 401 already
        return bot

    # -- the bot -----------------------------------------------------------------------

    async def _get_gateway_bot(self, request: web.Request) -> web.StreamResponse:
        limit = {"total": 1000, "remaining": 1000, "reset_after": 0, "max_concurrency": 1}
        return json_response(
            {
                "url": self.gateway_url,
                "shards": self.recommended_shards,
                "session_start_limit": limit,
            }
        )

    async def _get_me(self, request: web.Request) -> web.StreamResponse:
        return json_response(me_payload(self._bot(request)))

    async def _get_application(self, request: web.Request) -> web.StreamResponse:
        return json_response(application_payload(self._bot(request), len(self.guilds)))

    # -- channels ------------------------------------------------------------------------

    def _channel_for(self, request: web.Request) -> FakeChannel:
        channel = self.channels.get(int(request.match_info["channel_id"]))
        if channel is None:
            raise HttpError(404, "Unknown Channel", 10003)
        return channel

    async def _post_message(self, request: web.Request) -> web.StreamResponse:
        bot = self._bot(request)
        channel = self._channel_for(request)
        payload = await read_json(request)
        guild = self.guild_of(channel.id)
        if guild is not None:
            needed = Perm.SEND_MESSAGES_IN_THREADS if channel.is_thread else Perm.SEND_MESSAGES
            if not self.permissions(guild.id, bot.user.id) & needed:
                raise HttpError(403, "Missing Permissions", 50013)
        elif channel.dm_bot_id not in (None, bot.user.id):
            raise HttpError(403, "Missing Access", 50001)
        for key in UNSUPPORTED:
            if payload.get(key):
                raise HttpError(400, f"fake discord: messages with {key} are not implemented")
        content = payload.get("content") or ""
        if not content:
            raise HttpError(400, "Cannot send an empty message", 50006)
        reference = payload.get("message_reference")
        referenced = None
        if reference and reference.get("message_id") is not None:
            referenced = self._by_id.get(int(reference["message_id"]))
            if referenced is None and reference.get("fail_if_not_exists", True):
                errors = {"code": "MESSAGE_REFERENCE_UNKNOWN_MESSAGE", "message": "Unknown message"}
                raise HttpError(
                    400,
                    "Invalid Form Body",
                    50035,
                    errors={"message_reference": {"_errors": [errors]}},
                )
        rec = new_message(
            self,
            channel_id=channel.id,
            author_id=bot.user.id,
            content=content,
            message_type=MessageType.REPLY if referenced else MessageType.DEFAULT,
            via="rest",
            allowed_mentions=payload.get("allowed_mentions"),
            message_reference=reference,
            referenced=referenced,
            flags=int(payload.get("flags") or 0),
            nonce=payload.get("nonce"),
        )
        await self._store_and_fanout(rec)
        response = dict(rec.payload)
        response.pop("member", None)
        return json_response(response)

    async def _post_typing(self, request: web.Request) -> web.StreamResponse:
        bot = self._bot(request)
        channel = self._channel_for(request)
        self.typing.append(TypingEvent(channel.id, bot.user.id))
        await self.changed()
        return web.Response(status=204)

    # -- application commands ------------------------------------------------------------

    async def _put_commands(self, request: web.Request) -> web.StreamResponse:
        """Overwrite the application's global or guild commands (every id is new)."""
        bot = self._bot(request)
        app_id = int(request.match_info["app_id"])
        gid = request.match_info.get("guild_id")
        guild_id = None if gid is None else int(gid)
        if app_id != bot.application_id or (guild_id is not None and guild_id not in self.guilds):
            raise HttpError(403, "Missing Access", 50001)
        body = await request.json()
        if not isinstance(body, list) or not all(isinstance(c, dict) and "name" in c for c in body):
            raise HttpError(400, "Invalid Form Body", 50035)
        stored: list[Json] = []
        for cmd in body:
            data: Json = {
                "default_member_permissions": None,
                "dm_permission": True,
                "nsfw": False,
                "description": "",
                "options": [],
                **copy.deepcopy(cmd),
                "id": str(self.next_id()),
                "application_id": str(app_id),
                "type": cmd.get("type", 1),
                "version": str(self.next_id()),
            }
            if guild_id is not None:
                data["guild_id"] = str(guild_id)
            stored.append(data)
        self.commands[(app_id, guild_id)] = stored
        await self.changed()
        return json_response(stored)
