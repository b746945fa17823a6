"""The Web API: `/api/<method>`, each call recorded (`calls`), answered by its method.

What slack_sdk 3.48's AsyncWebClient sends: POST (GET for conversations.info and
users.info) to `{base_url}{method}`, the token as `Authorization: Bearer ...`;
chat.* methods send a JSON body, the others their arguments as query parameters.
Both, and form bodies, are read here. Answers are Slack's: HTTP 200 with
`{"ok": true, ...}` or `{"ok": false, "error": ...}`; a rate limit (`rate_limit_next`)
is HTTP 429 with `Retry-After` and `{"ok": false, "error": "ratelimited"}`; an
outage in front of the API (`fail_next`) answers what an edge proxy does, e.g. a
503 in plain text, and does nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from tests.fakes.slack.payloads import channel_info, message_event, new_message, user_info
from tests.fakes.slack.socket import SocketMode
from tests.fakes.slack.world import FakeApp, FakeChannel, Json, World

Method = Callable[[FakeApp, Json], Awaitable[Json]]


class ApiError(Exception):
    """An `{"ok": false, "error": error}` answer."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


@dataclass
class WebCall:
    """One request to `/api/<method>`; `params` as received (query, form or JSON)."""

    method: str
    token: str | None
    params: Json
    status: int
    response: Json


@dataclass(frozen=True)
class Ephemeral:
    """A chat.postEphemeral: only `user` sees it."""

    app_id: str
    channel: str
    user: str
    text: str
    message_ts: str


class WebApi(SocketMode):
    """The Web API methods on top of Socket Mode delivery."""

    def __init__(self, world: World) -> None:
        super().__init__(world)
        self.calls: list[WebCall] = []
        self.unknown_methods: list[str] = []
        self.ephemeral: list[Ephemeral] = []
        # method -> the Retry-After of each of its next calls (one 429 each)
        self._rate_limits: dict[str, list[str]] = {}
        self._disconnects: set[str] = set()  # methods whose next call is cut off
        # method -> (status, content type, body) of its next call, which is not done
        self._failures: dict[str, tuple[int, str, str]] = {}
        self.methods: dict[str, Method] = {
            "auth.test": self._auth_test,
            "apps.connections.open": self._connections_open,
            "chat.postMessage": self._post_message,
            "chat.postEphemeral": self._post_ephemeral,
            "conversations.info": self._conversations_info,
            "users.info": self._users_info,
        }

    def rate_limit_next(self, method: str, retry_after: int | str = 1, times: int = 1) -> None:
        """The next `times` calls of `method` are answered 429 with this Retry-After
        (a string is sent as it is: "soon", "1.5")."""
        self._rate_limits[method] = [str(retry_after)] * times

    def fail_next(
        self,
        method: str,
        status: int = 503,
        body: str = "upstream connect error or disconnect/reset before headers",
        content_type: str = "text/plain",
    ) -> None:
        """The next call of `method` is not done and is answered `status` with
        `body` as `content_type` (recorded with `{"error": body}`), as a proxy
        or load balancer in front of the API answers when the API is away."""
        self._failures[method] = (status, content_type, body)

    def disconnect_next(self, method: str) -> None:
        """The next call of `method` is carried out, then its connection is closed
        before any answer (recorded with status 0): the client cannot tell whether
        it was done."""
        self._disconnects.add(method)

    def messages(self, channel_id: str) -> list[Json]:
        return self.world.channels[channel_id].messages

    def calls_of(self, method: str) -> list[WebCall]:
        return [c for c in self.calls if c.method == method]

    @staticmethod
    def mark_thread_reply(channel: FakeChannel, message: Json) -> None:
        """A reply in a thread names the author of the thread's parent
        (`parent_user_id`), as Slack's message events do."""
        thread_ts = message.get("thread_ts")
        if thread_ts is None or thread_ts == message["ts"]:
            return
        parent = next((m for m in channel.messages if m["ts"] == thread_ts), None)
        author = None if parent is None else parent.get("user") or parent.get("bot_id")
        if author is not None:
            message["parent_user_id"] = author

    async def deliver_message(self, channel: FakeChannel, message: Json) -> None:
        """A message event to every app whose bot user is in the channel."""
        for app in self.world.member_apps(channel):
            await self.deliver_event(app, message_event(channel, message))

    # -- the endpoint ------------------------------------------------------------------

    async def _handle_api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params: Json = dict(request.query)
        if request.body_exists:
            if request.content_type == "application/json":
                params.update(await request.json())
            else:
                params.update(await request.post())
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        token = token or params.pop("token", None)
        headers: dict[str, str] = {}
        status = 200
        if (failure := self._failures.pop(method, None)) is not None:
            status, content_type, text = failure
            self.calls.append(WebCall(method, token, params, status, {"error": text}))
            await self.changed()
            return web.Response(status=status, text=text, content_type=content_type)
        if self._rate_limits.get(method):
            status, headers["Retry-After"] = 429, self._rate_limits[method].pop(0)
            body: Json = {"ok": False, "error": "ratelimited"}
        else:
            body = await self._answer(method, token, params)
        if method in self._disconnects:
            self._disconnects.discard(method)
            assert request.transport is not None
            request.transport.close()  # the answer is never written: the client sees a
            status = 0  # server disconnect
        self.calls.append(WebCall(method, token, params, status, body))
        await self.changed()
        return web.json_response(body, status=status or 200, headers=headers)

    async def _answer(self, method: str, token: str | None, params: Json) -> Json:
        handler = self.methods.get(method)
        if handler is None:
            self.unknown_methods.append(method)
            return {"ok": False, "error": "unknown_method"}
        try:
            if not token:
                raise ApiError("not_authed")
            found = self.world.app_by_token(token)
            if found is None:
                raise ApiError("invalid_auth")
            app, kind = found
            if kind != ("app" if method == "apps.connections.open" else "bot"):
                raise ApiError("not_allowed_token_type")
            return {"ok": True, **await handler(app, params)}
        except ApiError as e:
            return {"ok": False, "error": e.error}

    # -- lookups for the methods ---------------------------------------------------------

    def _channel(self, params: Json, app: FakeApp, *, member: bool) -> FakeChannel:
        channel = self.world.channels.get(str(params.get("channel", "")))
        if channel is None or (channel.is_im and app.bot_user_id not in channel.members):
            raise ApiError("channel_not_found")
        if member and app.bot_user_id not in channel.members:
            raise ApiError("not_in_channel")
        return channel

    @staticmethod
    def _text(params: Json) -> str:
        text = params.get("text")
        if not text and not params.get("blocks"):
            raise ApiError("no_text")
        return str(text or "")

    # -- the methods -------------------------------------------------------------------

    async def _auth_test(self, app: FakeApp, params: Json) -> Json:
        return {
            "url": f"https://{self.world.team_name}.fake.slack/",
            "team": self.world.team_name,
            "user": app.name,
            "team_id": self.world.team_id,
            "user_id": app.bot_user_id,
            "bot_id": app.bot_id,
            "is_enterprise_install": False,
        }

    async def _connections_open(self, app: FakeApp, params: Json) -> Json:
        return {"url": self.connection_url(app)}

    async def _post_message(self, app: FakeApp, params: Json) -> Json:
        channel = self._channel(params, app, member=True)
        thread_ts = params.get("thread_ts") or None
        user = self.world.users[app.bot_user_id]
        message = new_message(self.world, user, self._text(params), thread_ts=thread_ts)
        self.mark_thread_reply(channel, message)
        channel.messages.append(message)
        await self.deliver_message(channel, message)
        return {"channel": channel.id, "ts": message["ts"], "message": message}

    async def _post_ephemeral(self, app: FakeApp, params: Json) -> Json:
        channel = self._channel(params, app, member=True)
        user = str(params.get("user", ""))
        if user not in self.world.users:
            raise ApiError("user_not_found")
        if user not in channel.members:
            raise ApiError("user_not_in_channel")
        ts = self.world.new_ts()
        self.ephemeral.append(Ephemeral(app.id, channel.id, user, self._text(params), ts))
        return {"message_ts": ts}

    async def _conversations_info(self, app: FakeApp, params: Json) -> Json:
        channel = self._channel(params, app, member=False)
        return {"channel": channel_info(channel, app.bot_user_id)}

    async def _users_info(self, app: FakeApp, params: Json) -> Json:
        user = self.world.users.get(str(params.get("user", "")))
        if user is None:
            raise ApiError("user_not_found")
        return {"user": user_info(self.world, user)}
