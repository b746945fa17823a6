"""The gateway websocket: sessions (HELLO, IDENTIFY, RESUME, heartbeats), what each
session is dispatched (its shard's guilds, DMs on shard 0, as its intents allow), and
the channel messages, each recorded and then dispatched as MESSAGE_CREATE.

The gateway always answers with uncompressed TEXT frames: discord.py 2.7.1 parses
text frames as JSON directly and only decompresses BINARY frames
(`DiscordWebSocket.received_message`), whatever `compress=` it asked for. Opcodes
other than heartbeat (1), identify (2) and resume (6), such as presence updates or
member requests, are not implemented: the session is closed with 4001 and the op is
recorded in `unknown_routes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import WSMsgType, web

from tests.fakes.discord.payloads import RecordedMessage, guild_create, me_payload
from tests.fakes.discord.world import API_VERSION, FakeBot, Intent, Json, World, shard_of

log = logging.getLogger("tests.fakes.discord")

HEARTBEAT_INTERVAL_MS = 41250


@dataclass
class SessionState:
    """A gateway session (survives its websocket for RESUME)."""

    session_id: str
    bot: FakeBot
    shard_id: int
    shard_count: int
    intents: int
    seq: int = 0
    resumes: int = 0


@dataclass(frozen=True)
class Dispatch:
    """One event sent to one session."""

    user_id: int  # the bot's
    shard_id: int
    event: str
    data: Json


class _Connection:
    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self.state: SessionState | None = None
        self.lock = asyncio.Lock()

    @property
    def live(self) -> SessionState | None:
        """The session, if identified and still open."""
        return None if self.ws.closed else self.state

    async def send(self, op: int, d: Any, t: str | None = None) -> None:
        async with self.lock:
            seq: int | None = None
            if op == 0 and self.state is not None:
                self.state.seq += 1
                seq = self.state.seq
            frame = json.dumps({"op": op, "d": d, "s": seq, "t": t}, separators=(",", ":"))
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self.ws.send_str(frame)


class Gateway(World):
    """The world, with gateway sessions and the messages they are dispatched."""

    def __init__(self) -> None:
        super().__init__()
        self.url = ""  # once started
        self.gateway_url = ""
        self.sessions: dict[str, SessionState] = {}  # every session ever identified
        self._conns: set[_Connection] = set()
        self.dispatches: list[Dispatch] = []
        self.unknown_routes: list[tuple[str, str]] = []  # (method or "WS", path or op)
        self._messages: dict[int, list[RecordedMessage]] = {}  # by channel id
        self._by_id: dict[int, RecordedMessage] = {}

    def _add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_get("/gateway", self._gateway)

    # -- inspection and waiting --------------------------------------------------------

    def messages(self, channel_id: int) -> list[RecordedMessage]:
        return list(self._messages.get(channel_id, []))

    def sent_by(self, user_id: int) -> list[RecordedMessage]:
        return sorted((m for m in self._by_id.values() if m.author_id == user_id), key=_id)

    def connected(self, user_id: int | None = None) -> list[SessionState]:
        """Identified sessions with an open websocket (of one bot user, or all)."""
        states = (c.live for c in self._conns)
        return [s for s in states if s and user_id in (None, s.bot.user.id)]

    def dispatched(self, event: str, user_id: int | None = None) -> list[Dispatch]:
        return [d for d in self.dispatches if d.event == event and user_id in (None, d.user_id)]

    async def wait_for_messages(
        self,
        channel_id: int,
        n: int,
        timeout: float = 5.0,  # noqa: ASYNC109
    ) -> list[RecordedMessage]:
        await self.wait_until(
            lambda: len(self._messages.get(channel_id, [])) >= n,
            timeout,
            f"{n} messages in channel {channel_id} (have {len(self.messages(channel_id))})",
        )
        return self.messages(channel_id)

    async def wait_connected(
        self,
        user_id: int,
        shards: int = 1,
        timeout: float = 5.0,  # noqa: ASYNC109
    ) -> None:
        await self.wait_until(
            lambda: len(self.connected(user_id)) >= shards,
            timeout,
            f"{shards} gateway session(s) of bot {user_id}",
        )

    # -- messages and dispatches ---------------------------------------------------------

    async def _store_and_fanout(
        self, rec: RecordedMessage, *, ephemeral_to: int | None = None
    ) -> None:
        """Record a message and dispatch MESSAGE_CREATE (ephemeral ones, seen only by
        `ephemeral_to`, are neither recorded nor dispatched)."""
        if ephemeral_to is None:
            self._messages.setdefault(rec.channel_id, []).append(rec)
            self._by_id[rec.id] = rec
            await self._fanout("MESSAGE_CREATE", rec.payload, rec.guild_id, message=rec)
        await self.changed()

    async def dispatch_raw(self, event: str, data: Any, *, guild_id: int | None) -> list[Dispatch]:
        """Dispatch `data` exactly as given (no checks, no intent filtering, not
        recorded as a message) to every session that gets events of `guild_id`
        (None: as a DM, to shard 0). Returns the dispatches made."""
        before = len(self.dispatches)
        await self._fanout(event, data, guild_id)
        await self.changed()
        return self.dispatches[before:]

    async def _fanout(
        self,
        event: str,
        data: Json,
        guild_id: int | None,
        *,
        only_user: int | None = None,
        message: RecordedMessage | None = None,
    ) -> None:
        """Send a dispatch to every identified session that should get it."""
        for conn in sorted(self._conns, key=lambda c: c.state.session_id if c.state else ""):
            state = conn.live
            if state is None or only_user not in (None, state.bot.user.id):
                continue
            if guild_id is not None:
                if shard_of(guild_id, state.shard_count) != state.shard_id:
                    continue
            else:
                if state.shard_id != 0:  # DMs go to shard 0
                    continue
                channel = self.channels.get(int(data.get("channel_id", 0)))
                if channel is not None and channel.dm_bot_id not in (None, state.bot.user.id):
                    continue
            payload = data
            if message is not None:
                needed = Intent.GUILD_MESSAGES if guild_id is not None else Intent.DIRECT_MESSAGES
                if not state.intents & needed:
                    continue
                payload = _visible_content(state, message)
            await self._send_dispatch(conn, state, event, payload)

    async def _send_dispatch(
        self, conn: _Connection, state: SessionState, event: str, data: Json
    ) -> None:
        self.dispatches.append(Dispatch(state.bot.user.id, state.shard_id, event, data))
        await conn.send(0, data, event)

    # -- server-side events --------------------------------------------------------------

    async def disconnect(self, user_id: int, code: int = 4000) -> int:
        """Close a bot's websockets from the server side (4000: discord.py will RESUME)."""
        closed = 0
        for conn in list(self._conns):
            if conn.live is not None and conn.live.bot.user.id == user_id:
                await conn.ws.close(code=code, message=b"fake disconnect")
                closed += 1
        return closed

    async def _close_connections(self) -> None:
        for conn in list(self._conns):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.ws.close(code=1001, message=b"fake closing"), 1)

    # -- the websocket -------------------------------------------------------------------

    async def _gateway(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(max_msg_size=0, heartbeat=None)
        await ws.prepare(request)
        conn = _Connection(ws)
        self._conns.add(conn)
        try:
            await conn.send(10, {"heartbeat_interval": HEARTBEAT_INTERVAL_MS, "_trace": ["fake"]})
            async for msg in ws:
                try:
                    frame = json.loads(msg.data) if msg.type is WSMsgType.TEXT else None
                except ValueError:
                    frame = None
                if not isinstance(frame, dict):
                    await ws.close(code=4002, message=b"Error while decoding payload.")
                    break
                await self._gateway_op(conn, frame)
        finally:
            self._conns.discard(conn)
            await self.changed()
        return ws

    async def _gateway_op(self, conn: _Connection, frame: Json) -> None:
        op, d = frame.get("op"), frame.get("d")
        if op == 1:
            await conn.send(11, None)
        elif op == 2:
            await self._identify(conn, d or {})
        elif op == 6:
            await self._resume(conn, d or {})
        elif conn.state is None:
            await conn.ws.close(code=4003, message=b"Not authenticated.")
        else:
            self.unknown_routes.append(("WS", f"op {op}"))
            log.warning("fake discord: gateway op %s is not implemented", op)
            await conn.ws.close(code=4001, message=b"Unknown opcode.")
            await self.changed()

    async def _identify(self, conn: _Connection, d: Json) -> None:
        bot = self.bots.get(str(d.get("token", "")))
        shard_id, shard_count = d.get("shard") or [0, 1]
        if bot is None:
            await conn.ws.close(code=4004, message=b"Authentication failed.")
            return
        if not 0 <= shard_id < shard_count:
            await conn.ws.close(code=4010, message=b"Invalid shard.")
            return
        intents = int(d.get("intents", 0))
        state = SessionState(uuid.uuid4().hex, bot, shard_id, shard_count, intents)
        self.sessions[state.session_id] = state
        conn.state = state
        guilds = [g for g in self.guilds.values() if shard_of(g.id, shard_count) == shard_id]
        ready = {
            "v": API_VERSION,
            "user": me_payload(bot),
            "guilds": [{"id": str(g.id), "unavailable": True} for g in guilds],
            "session_id": state.session_id,
            "session_type": "normal",
            "resume_gateway_url": self.gateway_url,
            "shard": [shard_id, shard_count],
            "application": {"id": str(bot.application_id), "flags": 0},
            "private_channels": [],
            "relationships": [],
            "presences": [],
            "user_settings": {},
            "guild_join_requests": [],
            "geo_ordered_rtc_regions": [],
            "_trace": ["fake-discord"],
        }
        await self._send_dispatch(conn, state, "READY", ready)
        if intents & Intent.GUILDS:
            for g in guilds:
                await self._send_dispatch(conn, state, "GUILD_CREATE", guild_create(self, g))
        await self.changed()

    async def _resume(self, conn: _Connection, d: Json) -> None:
        state = self.sessions.get(str(d.get("session_id")))
        if state is None or state.bot.token != d.get("token") or conn.state is not None:
            await conn.send(9, False)  # INVALID_SESSION, not resumable
            return
        state.resumes += 1
        conn.state = state
        await self._send_dispatch(conn, state, "RESUMED", {"_trace": ["fake-discord"]})
        await self.changed()


def _id(message: RecordedMessage) -> int:
    return message.id


def _visible_content(state: SessionState, message: RecordedMessage) -> Json:
    """Without MESSAGE_CONTENT, a bot sees content only of its own messages, DMs, pings."""
    uid = state.bot.user.id
    if (
        state.intents & Intent.MESSAGE_CONTENT
        or message.guild_id is None
        or message.author_id == uid
        or uid in message.pinged_users
    ):
        return message.payload
    return {**message.payload, "content": "", "embeds": [], "attachments": [], "components": []}
