"""Socket Mode: envelopes for each app, its websockets, acks and redelivery.

What slack_sdk 3.48's aiohttp SocketModeClient does: it calls apps.connections.open
with the app token, opens the returned URL (pinging every `ping_interval` s), and
hands each TEXT frame that is an envelope to its listeners (Bolt acks with
`{"envelope_id", "payload"?}`). A CLOSE frame from the server makes it fetch a new URL
and reconnect at once; so does a `{"type": "disconnect"}` message.

Every envelope stays pending for its app until acked; a new connection gets `hello`,
then every pending envelope again (`retry_attempt` counts the deliveries before).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
from dataclasses import dataclass

from aiohttp import WSMsgType, web

from tests.fakes.recording import Recording
from tests.fakes.slack.payloads import event_callback
from tests.fakes.slack.world import FakeApp, Json, World

log = logging.getLogger(__name__)


@dataclass
class Envelope:
    """One Socket Mode request to an app."""

    envelope_id: str
    app_id: str
    type: str  # "events_api" | "slash_commands"
    payload: Json
    accepts_response_payload: bool
    deliveries: int = 0  # how often it was sent on a socket
    acked: bool = False
    response: Json | None = None  # the payload of the (first) ack

    def frame(self) -> str:
        retry = self.deliveries  # the sends before this one
        return json.dumps(
            {
                "envelope_id": self.envelope_id,
                "type": self.type,
                "payload": self.payload,
                "accepts_response_payload": self.accepts_response_payload,
                "retry_attempt": retry,
                "retry_reason": "timeout" if retry else "",
            }
        )


@dataclass(frozen=True)
class Ack:
    """A message an app sent on its socket naming an envelope."""

    app_id: str
    envelope_id: str
    payload: Json | None
    duplicate: bool  # the envelope was acked before (or is unknown)


class SocketMode(Recording):
    """The Socket Mode side of the fake (the base of the Web API)."""

    label = "fake slack"

    def __init__(self, world: World) -> None:
        super().__init__()
        self.world = world
        self.envelopes: list[Envelope] = []  # every envelope, in creation order
        self.acks: list[Ack] = []
        self.connections: list[str] = []  # the app id of each socket opened (hello sent)
        self.ws_base = ""  # once started: ws://127.0.0.1:<port>/socket/
        self._pending: dict[str, dict[str, Envelope]] = {}  # app id -> id -> envelope
        self._sockets: dict[str, list[web.WebSocketResponse]] = {}  # app id -> open sockets
        self._urls: dict[str, str] = {}  # connection id -> app id
        self._ids = itertools.count(1)
        self._acks_to_lose = 0
        self.lost_acks: list[str] = []  # envelope ids whose ack was lost (still pending)

    # -- what tests look at ------------------------------------------------------------

    def pending(self, app_id: str) -> list[Envelope]:
        """The envelopes of `app_id` not acked yet, oldest first."""
        return list(self._pending.get(app_id, {}).values())

    def lose_next_acks(self, n: int = 1) -> None:
        """The next `n` acks are lost on the way: recorded in `lost_acks`, their
        envelopes stay pending (sent again on the next connection)."""
        self._acks_to_lose = n

    def connected(self, app_id: str) -> int:
        """How many sockets of `app_id` are open."""
        return len(self._sockets.get(app_id, []))

    def event_envelopes(self, app_id: str) -> list[Envelope]:
        return [e for e in self.envelopes if e.app_id == app_id and e.type == "events_api"]

    # -- delivering --------------------------------------------------------------------

    def connection_url(self, app: FakeApp) -> str:
        conn_id = f"{app.id}-{next(self._ids)}"
        self._urls[conn_id] = app.id
        return self.ws_base + conn_id

    async def deliver(
        self,
        app: FakeApp,
        type_: str,
        payload: Json,
        *,
        accepts_response_payload: bool = False,
        socket: int = -1,
    ) -> Envelope:
        """A new envelope for `app`: pending, and sent on one of its open
        sockets if any (Slack picks one per envelope): the `socket`th in the
        order they connected, the newest by default."""
        env = Envelope(f"env-{next(self._ids)}", app.id, type_, payload, accepts_response_payload)
        self.envelopes.append(env)
        self._pending.setdefault(app.id, {})[env.envelope_id] = env
        sockets = [ws for ws in self._sockets.get(app.id, []) if not ws.closed]
        if sockets:
            await self._send(sockets[socket], env)
        await self.changed()
        return env

    async def deliver_event(self, app: FakeApp, event: Json, *, socket: int = -1) -> Envelope:
        """`event` in an envelope, on the app's `socket`th socket (see `deliver`)."""
        payload = event_callback(self.world, app, event)
        return await self.deliver(app, "events_api", payload, socket=socket)

    async def _send(self, ws: web.WebSocketResponse, env: Envelope) -> None:
        try:
            await ws.send_str(env.frame())
        except (ConnectionError, RuntimeError):  # the socket went away: it stays pending
            log.debug("fake slack: could not send %s", env.envelope_id)
        else:
            env.deliveries += 1

    async def close_sockets(self) -> None:
        """Drop every socket (a CLOSE frame); clients must reconnect via
        apps.connections.open. Pending envelopes wait for the next connection."""
        for ws in [ws for sockets in self._sockets.values() for ws in sockets]:
            await ws.close(code=1001, message=b"fake slack: going away")
        await self.changed()

    async def send_disconnect(self, app_id: str, reason: str = "refresh_requested") -> None:
        """Slack's polite `disconnect` message on each socket of the app."""
        for ws in list(self._sockets.get(app_id, [])):
            with contextlib.suppress(ConnectionError):
                await ws.send_str(json.dumps({"type": "disconnect", "reason": reason}))

    # -- the websocket endpoint --------------------------------------------------------

    async def _handle_socket(self, request: web.Request) -> web.StreamResponse:
        app_id = self._urls.get(request.match_info["conn_id"])
        if app_id is None:
            raise web.HTTPNotFound(text="fake slack: unknown socket mode url")
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        hello = {
            "type": "hello",
            "num_connections": self.connected(app_id) + 1,
            "debug_info": {"host": "fake-slack", "approximate_connection_time": 3600},
            "connection_info": {"app_id": app_id},
        }
        await ws.send_str(json.dumps(hello))
        sockets = self._sockets.setdefault(app_id, [])
        sockets.append(ws)
        self.connections.append(app_id)
        try:
            for env in self.pending(app_id):  # taken together with registering the socket
                await self._send(ws, env)
            await self.changed()
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    await self._on_text(app_id, msg.data)
        finally:
            sockets.remove(ws)
            await self.changed()
        return ws

    async def _on_text(self, app_id: str, data: str) -> None:
        try:
            message = json.loads(data)
            envelope_id = str(message["envelope_id"])
        except (ValueError, KeyError, TypeError):
            log.warning("fake slack: ignored socket message %r", data)
            return
        if self._acks_to_lose:
            self._acks_to_lose -= 1
            self.lost_acks.append(envelope_id)
            await self.changed()
            return
        env = self._pending.get(app_id, {}).pop(envelope_id, None)
        payload = message.get("payload")
        self.acks.append(Ack(app_id, envelope_id, payload, duplicate=env is None))
        if env is not None:
            env.acked, env.response = True, payload
        await self.changed()
