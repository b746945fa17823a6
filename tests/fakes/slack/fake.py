"""FakeSlack: the server's lifecycle, what people do, and Events API requests to apps."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import web

from tests.fakes.slack.api import WebApi
from tests.fakes.slack.payloads import (
    command_payload,
    event_callback,
    message_event,
    new_message,
    signature,
)
from tests.fakes.slack.socket import Envelope
from tests.fakes.slack.world import Json, World

if TYPE_CHECKING:
    from slack_sdk.web.async_client import AsyncWebClient


@dataclass(frozen=True)
class HttpResult:
    """What an app's Events API endpoint answered."""

    status: int
    body: str
    headers: dict[str, str]


class FakeSlack(WebApi):
    """An aiohttp fake of Slack's Web API and Socket Mode, plus an Events API sender."""

    def __init__(self, team_id: str = "T0FAKE", team_name: str = "fake-team") -> None:
        super().__init__(World(team_id, team_name))
        self.api_base = ""  # once started: http://127.0.0.1:<port>/api/
        self.http_posts: list[HttpResult] = []  # every post_event / url_verification
        self._runner: web.AppRunner | None = None

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> FakeSlack:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._handle_api)
        app.router.add_get("/socket/{conn_id}", self._handle_socket)
        self._runner = web.AppRunner(app, shutdown_timeout=1, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        port = self._runner.addresses[0][1]
        self.api_base = f"http://127.0.0.1:{port}/api/"
        self.ws_base = f"ws://127.0.0.1:{port}/socket/"
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self.close_sockets()
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeSlack:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def web_client(self, app_id: str, **kwargs: Any) -> AsyncWebClient:
        """slack_sdk's AsyncWebClient with the app's bot token, pointed at the fake."""
        from slack_sdk.web.async_client import AsyncWebClient

        return AsyncWebClient(self.world.apps[app_id].bot_token, base_url=self.api_base, **kwargs)

    # -- what people do ----------------------------------------------------------------

    async def user_says(
        self,
        channel_id: str,
        user_id: str,
        text: str,
        *,
        thread_ts: str | None = None,
        subtype: str | None = None,
        via_app: str | None = None,
    ) -> Json:
        """A person posts `text` (a mention looks like `<@U123>`); the message event
        goes to every app in the channel. `subtype` makes a system message, e.g.
        `channel_join` (which also makes the person a member). `via_app`: posted
        through that app with the person's user token (the message carries the
        app's `bot_id` and `bot_profile`, as Slack stamps it). Returns the message."""
        channel = self.world.channels[channel_id]
        if subtype == "channel_join":
            channel.members.add(user_id)
        via = self.world.apps[via_app] if via_app is not None else None
        msg = new_message(
            self.world, self.world.users[user_id], text, thread_ts=thread_ts, subtype=subtype,
            via=via,
        )  # fmt: skip
        self.mark_thread_reply(channel, msg)
        channel.messages.append(msg)
        await self.deliver_message(channel, msg)
        return msg

    async def integration_says(
        self,
        channel_id: str,
        bot_id: str,
        text: str,
        *,
        username: str = "Standup workflow",
        thread_ts: str | None = None,
    ) -> Json:
        """A workflow or legacy integration posts: subtype `bot_message`, a
        `bot_id` and a `username`, no `user`, no `bot_profile`. Returns the message."""
        channel = self.world.channels[channel_id]
        msg: Json = {
            "type": "message",
            "subtype": "bot_message",
            "text": text,
            "ts": self.world.new_ts(),
            "bot_id": bot_id,
            "username": username,
            "icons": {"emoji": ":robot_face:"},
        }
        if thread_ts is not None:
            msg["thread_ts"] = thread_ts
        self.mark_thread_reply(channel, msg)
        channel.messages.append(msg)
        await self.deliver_message(channel, msg)
        return msg

    async def edit(self, channel_id: str, ts: str, text: str) -> Json:
        """Someone edits message `ts`: a hidden `message_changed` event (a ts of
        its own) to every app in the channel. Returns the event."""
        channel = self.world.channels[channel_id]
        old = next(m for m in channel.messages if m["ts"] == ts)
        new = {**old, "text": text, "edited": {"user": old.get("user"), "ts": self.world.new_ts()}}
        channel.messages[channel.messages.index(old)] = new
        event = {
            "type": "message",
            "subtype": "message_changed",
            "hidden": True,
            "message": new,
            "previous_message": old,
            "ts": self.world.new_ts(),
        }
        await self.deliver_message(channel, event)
        return event

    async def delete(self, channel_id: str, ts: str) -> Json:
        """Someone deletes message `ts`: a hidden `message_deleted` event. Returns it."""
        channel = self.world.channels[channel_id]
        old = next(m for m in channel.messages if m["ts"] == ts)
        channel.messages.remove(old)
        event = {
            "type": "message",
            "subtype": "message_deleted",
            "hidden": True,
            "deleted_ts": ts,
            "previous_message": old,
            "ts": self.world.new_ts(),
        }
        await self.deliver_message(channel, event)
        return event

    async def invoke_command(
        self, app_id: str, channel_id: str, user_id: str, command: str, text: str = ""
    ) -> Envelope:
        """A person runs `/command text`: a slash_commands envelope to the app; its
        ack's payload becomes the envelope's `response`."""
        app = self.world.apps[app_id]
        payload = command_payload(
            self.world,
            app,
            self.world.channels[channel_id],
            self.world.users[user_id],
            command,
            text,
        )
        return await self.deliver(app, "slash_commands", payload, accepts_response_payload=True)

    async def wait_for_messages(self, channel_id: str, n: int, timeout: float = 5.0) -> list[Json]:  # noqa: ASYNC109
        """The channel's messages once there are at least `n`."""
        msgs = self.messages(channel_id)
        await self.wait_until(lambda: len(msgs) >= n, timeout, f"{n} messages in {channel_id}")
        return list(msgs)

    def message_event(self, channel_id: str, message: Json) -> Json:
        """The message event of a message of the channel (for `post_event`)."""
        return message_event(self.world.channels[channel_id], message)

    # -- the Events API over HTTP --------------------------------------------------------

    async def post_event(
        self,
        url: str,
        event: Json,
        *,
        signing_secret: str,
        app_id: str | None = None,
        retry_num: int | None = None,
        retry_reason: str = "http_timeout",
        timestamp: int | None = None,
        signature: str | None = None,
        session: aiohttp.ClientSession | None = None,
    ) -> HttpResult:
        """POST `event` wrapped in an event_callback for the app (the only one, if
        `app_id` is None) to `url`, signed with `signing_secret` at `timestamp` (now)
        unless `signature` is given; on `session` (a kept-alive connection) if given."""
        app = self.world.apps[app_id] if app_id else next(iter(self.world.apps.values()))
        body = event_callback(self.world, app, event)
        headers = {}
        if retry_num is not None:
            headers = {"X-Slack-Retry-Num": str(retry_num), "X-Slack-Retry-Reason": retry_reason}
        return await self.post_signed(
            url,
            body,
            signing_secret,
            timestamp=timestamp,
            sig=signature,
            headers=headers,
            session=session,
        )

    async def post_command(
        self,
        url: str,
        app_id: str,
        channel_id: str,
        user_id: str,
        command: str,
        text: str = "",
        *,
        signing_secret: str,
    ) -> HttpResult:
        """A person runs `/command text` for an Events API app: Slack POSTs the
        command's fields as a signed form to the app's Request URL."""
        w = self.world
        fields = command_payload(
            w, w.apps[app_id], w.channels[channel_id], w.users[user_id], command, text
        )
        raw = urlencode(fields).encode()
        return await self.post_raw(
            url, raw, signing_secret, content_type="application/x-www-form-urlencoded"
        )

    async def url_verification(
        self,
        url: str,
        *,
        signing_secret: str,
        challenge: str = "fake-challenge",
        timestamp: int | None = None,
        signature: str | None = None,
    ) -> HttpResult:
        """Slack's check of a new Request URL; the app must answer the challenge."""
        body = {
            "token": "fake-verification-token",
            "challenge": challenge,
            "type": "url_verification",
        }
        return await self.post_signed(url, body, signing_secret, timestamp=timestamp, sig=signature)

    async def post_signed(
        self,
        url: str,
        body: Json,
        signing_secret: str,
        *,
        timestamp: int | None = None,
        sig: str | None = None,
        headers: dict[str, str] | None = None,
        session: aiohttp.ClientSession | None = None,
    ) -> HttpResult:
        """POST a JSON body as Slack does, with X-Slack-Request-Timestamp and -Signature."""
        raw = json.dumps(body).encode()
        return await self.post_raw(
            url,
            raw,
            signing_secret,
            timestamp=timestamp,
            sig=sig,
            headers=headers,
            session=session,
        )

    async def post_raw(
        self,
        url: str,
        raw: bytes,
        signing_secret: str,
        *,
        content_type: str = "application/json",
        timestamp: int | None = None,
        sig: str | None = None,
        headers: dict[str, str] | None = None,
        session: aiohttp.ClientSession | None = None,
    ) -> HttpResult:
        """POST `raw` signed (at `timestamp`, now unless given) as Slack does, on
        `session` if given (else a session of its own)."""
        ts = str(int(time.time()) if timestamp is None else timestamp)
        all_headers = {
            "Content-Type": content_type,
            "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
            "X-Slack-Request-Timestamp": ts,
            "X-Slack-Signature": sig or signature(signing_secret, ts, raw),
            **(headers or {}),
        }
        async with contextlib.AsyncExitStack() as stack:
            if session is None:
                session = await stack.enter_async_context(aiohttp.ClientSession())
            resp = await stack.enter_async_context(session.post(url, data=raw, headers=all_headers))
            result = HttpResult(resp.status, await resp.text(), dict(resp.headers))
        self.http_posts.append(result)
        await self.changed()
        return result
