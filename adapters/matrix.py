"""The Matrix adapter (mautrix-python's client API): follow /sync, translate
room messages, send replies as `m.notice`, take `!bouncer …` admin commands.
It knows nothing about limits; Gateway.handle decides.

mautrix is used for its HTTP API (requests, errors, typed answers), not for
its syncer: the adapter runs its own /sync loop so that the position it saves
(in the store, `matrix:<user id>`) is always one whose events were all
handled. On a restart the daemon syncs from there: nothing is skipped, and an
event seen twice is the same event id, decided `duplicate` by the store.

Matrix does not mark bots. A sender is a bot when listed in `known_bots`, and
a message is a bot's when it is an `m.notice` (the Matrix convention: bots
post notices and do not answer them); the adapter's own replies are notices.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
from mautrix.api import HTTPAPI, Method, Path
from mautrix.client import ClientAPI
from mautrix.errors import MatrixConnectionError, MatrixError, MatrixRequestError, MLimitExceeded
from mautrix.types import EventType, RoomID, SyncToken, UserID

from adapters.common import SendFailed, clean, deliver, split_message
from gateway.admin import Admin, AdminError
from gateway.config import BotConfig
from gateway.errors import BotbouncerError, StartupError, StartupUnreachable
from gateway.http import HttpServer
from gateway.inflight import ShuttingDown
from gateway.model import Action, Author, ChatKind, ChatRef, Decision, Message
from gateway.outbound import client_session
from gateway.pipeline import Gateway
from gateway.store import StoreError

log = logging.getLogger("botbouncer.matrix")

# A Matrix event may be 64 KiB in all; 8,000 characters stay under it with
# room for the envelope and JSON's escapes.
MESSAGE_LIMIT = 8000
# A send is tried again under the same transaction id (the homeserver posts
# it once), SEND_FIRST_WAIT seconds after the first try, the wait doubling up
# to SEND_MAX_WAIT: after a lost connection SEND_RETRIES times; while the
# homeserver's rate limit holds (M_LIMIT_EXCEEDED), for SEND_LIMIT_SECONDS in
# all (Synapse's default lets a user post a message every 5 s once a burst of
# 10 is spent: the replies to a restart's backlog wait their turn).
SEND_RETRIES = 3
SEND_FIRST_WAIT, SEND_MAX_WAIT = 1.0, 8.0
SEND_LIMIT_SECONDS = 60.0
SYNC_TIMEOUT_MS = 30_000
# A room's /sync timeline cut short (`limited`: more came than the homeserver
# shows at once) is completed from /messages, this many events a request, up
# to GAP_MAX events a room (the newest kept, the skipped ones logged), in
# GAP_PAGES requests at most (a page the homeserver filtered empty, events of
# a user the bot ignores, still leads on: the spec says to page until no end).
GAP_PAGE, GAP_MAX, GAP_PAGES = 100, 1000, 20
# After a failed /sync: wait this long, doubling up to the maximum.
SYNC_RETRY_MIN, SYNC_RETRY_MAX = 1.0, 60.0
# The sync position is saved at most this often (seconds), and at the stop.
CURSOR_EVERY = 1.0
ADMIN_PREFIX = "!bouncer"
ADMIN_POWER = 50
# Events of its own a gateway remembers (a reply to one addresses the bot).
OWN_REMEMBERED = 4096
ENCRYPTED_NOTICE = (
    "This room is end-to-end encrypted, and botbouncer cannot read encrypted "
    "messages: this bot does not take part here."
)


class PayloadError(BotbouncerError, ValueError):
    """A room event the adapter cannot read; the text says why."""


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise PayloadError(f"no {what}" if value is None else f"{what} {value!r} is not text")
    return value


def relation(content: dict[str, Any]) -> dict[str, Any]:
    rel = content.get("m.relates_to")
    return rel if isinstance(rel, dict) else {}


def reply_target(content: dict[str, Any]) -> str | None:
    """The event a message replies to (a thread's fallback reply included)."""
    reply = relation(content).get("m.in_reply_to")
    target = reply.get("event_id") if isinstance(reply, dict) else None
    return target if isinstance(target, str) and target else None


# The first line of a reply fallback: "> <@alice:example.org> what she said"
# ("> * <@alice…> …" for an emote).
_FALLBACK = re.compile(r"> (?:\* )?<(@[^>\s]+)>")


def reply_fallback(content: dict[str, Any], body: str) -> tuple[str | None, str]:
    """A reply's quoted fallback taken off its body: (the quoted sender, what
    the replier wrote); (None, body) when the body opens with no fallback."""
    if reply_target(content) is None:
        return None, body
    lines = body.split("\n")
    quoted = _FALLBACK.match(lines[0])
    if quoted is None:
        return None, body
    n = 1
    while n < len(lines) and (lines[n].startswith("> ") or lines[n] == ">"):
        n += 1
    if n < len(lines) and lines[n] == "":
        n += 1
    return quoted.group(1), "\n".join(lines[n:])


def from_event(room_id: str, event: Any, *, dm: bool) -> Message | None:
    """A room timeline event as the gateway sees it, or None for what is no
    conversation turn at all (an edit, a redaction, a reaction, an encrypted
    event, an unknown type).

    A room is a chat; a thread (`m.thread` relation) is its own chat
    (`matrix:<room>:<thread root>`); a room of two members is a DM. An
    `m.notice` is a bot's. State events (membership, name, topic, power
    levels) are system messages: never counted, never a reset. A reply's text
    is without its quoted fallback (`reply_fallback`). The author of a
    replied-to event is not in the event: `reply_to` is left to the adapter,
    which knows its own events.

    Raises PayloadError naming the field when the event id, sender or type is
    missing or unreadable.
    """
    if not isinstance(event, dict):
        raise PayloadError(f"the event is {type(event).__name__}, not an object")
    event_id = _text(event.get("event_id"), "event_id")
    sender = _text(event.get("sender"), "sender")
    kind = _text(event.get("type"), "type")
    content = event.get("content")
    if not isinstance(content, dict):
        content = {}
    chat_kind = ChatKind.DM if dm else ChatKind.GROUP
    if "state_key" in event:
        return Message(event_id, ChatRef("matrix", room_id, kind=chat_kind), Author(sender),
                       system=True)  # fmt: skip
    if kind != "m.room.message":
        return None
    rel = relation(content)
    if rel.get("rel_type") == "m.replace":  # an edit: not a new turn
        return None
    root = rel.get("event_id") if rel.get("rel_type") == "m.thread" else None
    thread = root if isinstance(root, str) else None
    body = content.get("body")
    if body is not None and not isinstance(body, str):
        raise PayloadError(f"body is {type(body).__name__}, not text")
    if body:
        body = reply_fallback(content, body)[1]
    mentions = content.get("m.mentions")
    users = mentions.get("user_ids") if isinstance(mentions, dict) else None
    return Message(
        id=event_id,
        chat=ChatRef("matrix", room_id, topic=thread or None, kind=chat_kind),
        author=Author(sender, "", content.get("msgtype") == "m.notice"),
        text=clean(body),
        mentions=tuple(u for u in (users if isinstance(users, list) else ()) if isinstance(u, str)),
    )


def names_bot(text: str, user_id: str, display_name: str) -> bool:
    """Whether a message's text names the bot as clients without mention
    metadata do: its user id, or its display name as a word."""
    low = text.casefold()
    if user_id.casefold() in low:
        return True
    name = display_name.strip().casefold()
    return bool(name) and re.search(rf"(?<!\w){re.escape(name)}(?!\w)", low) is not None


def admin_command(text: str) -> str | None:
    """`!bouncer status` -> "status"; a bare `!bouncer` is status; None when
    the text is no admin command."""
    words = text.strip().split(maxsplit=1)
    if not words or words[0].casefold() != ADMIN_PREFIX:
        return None
    return words[1].strip() if len(words) > 1 else "status"


def allowed_inviter(inviter: str, allowed: tuple[str, ...]) -> bool:
    """An inviter listed by user id, or whose server is listed."""
    server = inviter.partition(":")[2]
    return any(inviter == a or (not a.startswith("@") and server == a) for a in allowed)


@dataclass
class _Room:
    members: set[str] = field(default_factory=set)  # joined
    encrypted: bool = False
    warned: bool = False  # the encrypted-room notice went out


@dataclass
class _Batch:
    """A /sync answer being handled: its position is saved once all its
    events (and every earlier batch's) were handled."""

    next_batch: str
    pending: int = 0


class MatrixAdapter:
    def __init__(self, bot: BotConfig, gateway: Gateway, server: HttpServer) -> None:
        if bot.token is None or bot.matrix is None:  # the config refuses this
            raise StartupError(f"bot {bot.name}: a Matrix bot needs a token and a matrix section")
        self.bot = bot
        self.gateway = gateway
        self.admin = server.admins.get(bot.name) or Admin(gateway)
        self.settings = bot.matrix
        self.user_id = bot.matrix.user_id
        self.display_name = ""
        self.cursor = f"matrix:{self.user_id}"
        self._http: aiohttp.ClientSession | None = None
        self.api: ClientAPI | None = None
        self.rooms: dict[str, _Room] = {}
        # own event ids, newest last; True: an aside (an admin command's answer)
        self._own: OrderedDict[str, bool] = OrderedDict()
        self._batches: deque[_Batch] = deque()
        self._saving = asyncio.Lock()
        self._saved = ""
        self._saved_at = -float("inf")  # monotonic time of the last save
        self._pending_save: asyncio.TimerHandle | None = None
        self._loop: asyncio.Task[None] | None = None
        self._stopping = False
        self._handling: set[asyncio.Task[None]] = set()

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        """whoami (a bad token, or a token of another account, stops the
        daemon), the display name, then the sync loop from the saved position."""
        assert self.bot.token is not None
        self._http = client_session()
        http = HTTPAPI(self.settings.homeserver, self.bot.token.get_secret_value(),
                       client_session=self._http, default_retry_count=0)  # fmt: skip
        self.api = ClientAPI(UserID(self.user_id), api=http)
        try:
            me = await self.api.whoami()
        except MatrixRequestError as exc:
            await self.stop()
            raise StartupError(f"bot {self.bot.name}: the homeserver refused the access token: "
                               f"{exc.errcode or exc.http_status}") from None  # fmt: skip
        except (MatrixError, aiohttp.ClientError, OSError) as exc:
            await self.stop()
            raise StartupUnreachable(f"bot {self.bot.name}: cannot reach the homeserver at "
                               f"{self.settings.homeserver}: {exc}") from None  # fmt: skip
        if me.user_id != self.user_id:
            await self.stop()
            raise StartupError(f"bot {self.bot.name}: the access token is {me.user_id}'s, "
                               f"not matrix.user_id {self.user_id}")  # fmt: skip
        self.gateway.bot_id = self.user_id
        try:
            self.display_name = await self.api.get_displayname(UserID(self.user_id)) or ""
        except MatrixError:
            self.display_name = ""
        since = await self.gateway.store.get_cursor(self.cursor)
        saved = since is not None
        if since is None:
            since = await self._first_sync()
        self._saved = since
        self._loop = asyncio.create_task(self._sync_loop(since, full_state=saved),
                                         name=f"matrix:{self.bot.name}")  # fmt: skip
        log.info("bot %s is on Matrix as %s (%s) at %s, %d room(s), syncing from %s",
                 self.bot.name, self.user_id, self.display_name or "no display name",
                 self.settings.homeserver, len(self.rooms),
                 "the saved position" if saved else "now")  # fmt: skip

    async def _first_sync(self) -> str:
        """No saved position: learn the rooms and take the invites, but answer
        nothing from before this start (the backlog is not a conversation)."""
        assert self.api is not None
        try:
            data = await self.api.sync(timeout=0)
        except (MatrixError, aiohttp.ClientError, OSError) as exc:
            await self.stop()
            raise StartupUnreachable(
                f"bot {self.bot.name}: the first /sync failed: {exc}"
            ) from None
        await self._rooms_state(data, handle=False)
        position = str(data.get("next_batch") or "")
        await self.gateway.store.set_cursor(self.cursor, position)
        return position

    async def stop_intake(self) -> None:
        """Sync no more: what was synced goes on being handled; the position
        saved is that of the last batch fully handled."""
        self._stopping = True
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)
            self._loop = None

    async def stop(self) -> None:
        await self.stop_intake()
        if self._handling:
            await asyncio.wait(list(self._handling), timeout=5)
        if self._pending_save is not None:
            self._pending_save.cancel()
            self._pending_save = None
        self._advance()
        await self._save()
        if self._http is not None:
            await self._http.close()
            self._http = None

    # -- the sync loop ------------------------------------------------------------

    async def _sync_loop(self, since: str, *, full_state: bool = False) -> None:
        """From a saved position the first /sync asks for the rooms' full state
        too (members: which room is a DM; encryption), which this process
        has not seen; the timeline is still everything since the position."""
        assert self.api is not None
        delay = SYNC_RETRY_MIN
        while not self._stopping:
            try:
                data = await self.api.sync(since=SyncToken(since), timeout=SYNC_TIMEOUT_MS,
                                           full_state=full_state)  # fmt: skip
                gaps = await self._gaps(data, since)
            except asyncio.CancelledError:
                raise
            except (MatrixError, aiohttp.ClientError, OSError, ValueError) as exc:
                log.warning("bot %s: /sync failed (%s); again in %g s", self.bot.name, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, SYNC_RETRY_MAX)
                continue
            delay = SYNC_RETRY_MIN
            position = data.get("next_batch")
            if not isinstance(position, str) or not position:
                log.warning("bot %s: /sync answered without next_batch; ignored", self.bot.name)
                continue
            batch = _Batch(position)
            self._batches.append(batch)
            try:
                await self._rooms_state(data, handle=True, batch=batch, known=full_state,
                                        gaps=gaps)  # fmt: skip
            except StoreError as exc:
                log.error("bot %s: a /sync batch was not handled: %s", self.bot.name, exc)
            full_state = False
            since = position
            await self._settled()

    async def _rooms_state(
        self,
        data: dict[str, Any],
        *,
        handle: bool,
        batch: _Batch | None = None,
        known: bool = False,
        gaps: dict[str, list[dict[str, Any]]] | None = None,
    ) -> None:
        """Invites, leaves, and each joined room's state and timeline. `known`:
        the rooms' full state from before a saved position, where an
        encrypted room was refused by the run that saw it become so. `gaps`:
        the events a room's cut-short timeline left out (`_gaps`), before it."""
        rooms = data.get("rooms")
        if not isinstance(rooms, dict):
            return
        invites = rooms.get("invite")
        if isinstance(invites, dict):
            for room_id, room in invites.items():
                await self._invited(str(room_id), room)
        left = rooms.get("leave")
        if isinstance(left, dict):
            for room_id in left:
                self.rooms.pop(str(room_id), None)
        joined = rooms.get("join")
        if not isinstance(joined, dict):
            return
        for room_id, room in joined.items():
            if not isinstance(room, dict):
                continue
            rid = str(room_id)
            info = self.rooms.setdefault(rid, _Room())
            state = room.get("state")
            for event in _events(state):
                self._learn(rid, info, event)
            if known and info.encrypted:
                info.warned = True
            timeline = (gaps or {}).get(rid, []) + _events(room.get("timeline"))
            for event in timeline:
                if "state_key" in event:
                    self._learn(rid, info, event)
            if info.encrypted and not info.warned:
                await self._refuse_encrypted(rid, info)
            if handle and batch is not None:
                for event in timeline:
                    self._take(rid, info, event, batch)

    async def _gaps(self, data: dict[str, Any], since: str) -> dict[str, list[dict[str, Any]]]:
        """For each joined room whose timeline in this /sync is `limited` (more
        came since `since` than the homeserver shows at once: after a restart,
        a busy room), the events left out, oldest first, read from /messages
        back from the timeline's start to `since`. Without them a message in
        the gap would never be decided: a person not answered, a bot turn not
        counted. A failure raises: the /sync is tried again."""
        assert self.api is not None
        rooms = data.get("rooms")
        joined = rooms.get("join") if isinstance(rooms, dict) else None
        gaps: dict[str, list[dict[str, Any]]] = {}
        for room_id, room in joined.items() if isinstance(joined, dict) else ():
            timeline = room.get("timeline") if isinstance(room, dict) else None
            if not isinstance(timeline, dict) or timeline.get("limited") is not True:
                continue
            position = timeline.get("prev_batch")
            missed: list[dict[str, Any]] = []
            pages = 0
            while (isinstance(position, str) and position and len(missed) < GAP_MAX
                   and pages < GAP_PAGES):  # fmt: skip
                pages += 1
                page = await self.api.api.request(
                    Method.GET, Path.v3.rooms[str(room_id)].messages,
                    query_params={"dir": "b", "from": position, "to": since,
                                  "limit": str(min(GAP_PAGE, GAP_MAX - len(missed)))},
                )  # fmt: skip
                chunk = _events({"events": page.get("chunk")}) if isinstance(page, dict) else []
                missed.extend(chunk)
                end = page.get("end") if isinstance(page, dict) else None
                # an empty chunk with an end is a page filtered empty: page on
                position = end if isinstance(end, str) and end != position else None
            if position is not None:
                log.warning("bot %s: more than %d events (or %d pages of them) came into %s at "
                            "once; the older ones are skipped", self.bot.name, GAP_MAX,
                            GAP_PAGES, room_id)  # fmt: skip
            if missed:
                gaps[str(room_id)] = missed[::-1]
        return gaps

    def _learn(self, room_id: str, info: _Room, event: dict[str, Any]) -> None:
        """Members and encryption from a state event."""
        kind, key = event.get("type"), event.get("state_key")
        content = event.get("content") if isinstance(event.get("content"), dict) else {}
        assert isinstance(content, dict)
        if kind == "m.room.member" and isinstance(key, str):
            if content.get("membership") == "join":
                info.members.add(key)
            else:
                info.members.discard(key)
        elif kind == "m.room.encryption":
            info.encrypted = True

    async def _refuse_encrypted(self, room_id: str, info: _Room) -> None:
        info.warned = True
        log.warning("bot %s: room %s is end-to-end encrypted; botbouncer cannot read it, so "
                    "the bot does not take part there", self.bot.name, room_id)  # fmt: skip
        try:
            await self._send_notice(room_id, ENCRYPTED_NOTICE)
        except SendFailed as exc:
            log.warning("bot %s: could not say so in %s: %s", self.bot.name, room_id, exc)

    async def _invited(self, room_id: str, room: Any) -> None:
        assert self.api is not None
        inviter = None
        events = _events(room.get("invite_state") if isinstance(room, dict) else None)
        for event in events:
            if (event.get("type") == "m.room.member" and event.get("state_key") == self.user_id
                    and isinstance(event.get("sender"), str)):  # fmt: skip
                inviter = str(event["sender"])
        try:
            if inviter is not None and allowed_inviter(inviter, self.settings.auto_join):
                await self.api.join_room_by_id(RoomID(room_id))
                log.info("bot %s: joined %s, invited by %s", self.bot.name, room_id, inviter)
            else:
                await self.api.leave_room(RoomID(room_id))
                log.info("bot %s: declined the invite to %s from %s: not in matrix.auto_join",
                         self.bot.name, room_id, inviter or "?")  # fmt: skip
        except MatrixError as exc:
            log.warning("bot %s: answering the invite to %s failed: %s", self.bot.name,
                        room_id, exc)  # fmt: skip

    # -- events -------------------------------------------------------------------

    def _take(self, room_id: str, info: _Room, event: dict[str, Any], batch: _Batch) -> None:
        """One timeline event: read now (no task for what is not a turn, or an
        echo of the bot's own reply), else handled in a task of its own that
        the batch waits for."""
        if info.encrypted or event.get("type") == "m.room.encrypted":
            return  # the room was refused visibly (_refuse_encrypted): no part in it
        try:
            msg = from_event(room_id, event, dm=len(info.members) == 2)
        except PayloadError as exc:
            log.warning("bot %s: could not read event %s in %s (%s); ignored", self.bot.name,
                        event.get("event_id", "?"), room_id, exc)  # fmt: skip
            return
        if msg is None:
            return
        if msg.author.id == self.user_id:
            if self._own.get(msg.id):
                return  # an admin command's answer, filed as an aside when sent
            self._remember(msg.id)
        msg = self._addressing(msg, event)
        # a command is a person's: not the bot's own message, nor a notice (a bot's)
        person = not (msg.system or msg.author.is_bot or msg.author.id == self.user_id)
        command = admin_command(msg.text) if person else None
        if command is None and self.gateway.echo(msg):
            return
        batch.pending += 1
        if command is not None:
            work: Callable[[], Awaitable[None]] = lambda: self._admin(msg, command)  # noqa: E731
        else:
            work = lambda: self._handle(msg, event)  # noqa: E731
        task = asyncio.ensure_future(self._run(f"event {msg.id}", work))
        self._handling.add(task)
        task.add_done_callback(lambda t: self._done(t, batch))

    def _addressing(self, msg: Message, event: dict[str, Any]) -> Message:
        """A reply to one of the bot's events answers the bot (one this process
        did not send, an earlier run's, known by its fallback quoting the
        bot); naming it in the text (its id, or its display name) mentions it."""
        content = event.get("content")
        target = reply_target(content) if isinstance(content, dict) else None
        changes: dict[str, Any] = {}
        if target is not None and isinstance(content, dict):
            body = content.get("body")
            quoted = reply_fallback(content, body)[0] if isinstance(body, str) else None
            if target in self._own or quoted == self.user_id:
                changes["reply_to"] = self.user_id
        if (self.user_id not in msg.mentions and not msg.system
                and names_bot(msg.text, self.user_id, self.display_name)):  # fmt: skip
            changes["mentions"] = (*msg.mentions, self.user_id)
        return replace(msg, **changes) if changes else msg

    def _remember(self, event_id: str, aside: bool = False) -> None:
        self._own[event_id] = aside or self._own.get(event_id, False)
        if len(self._own) > OWN_REMEMBERED:
            self._own.popitem(last=False)

    async def _run(self, what: str, work: Callable[[], Awaitable[None]]) -> None:
        try:
            with self.gateway.inflight.track():
                await work()
        except ShuttingDown:
            log.info("bot %s: %s arrived while stopping; handled after the restart",
                     self.bot.name, what)  # fmt: skip
            raise
        except StoreError as exc:
            log.error("bot %s: %s not handled: %s", self.bot.name, what, exc)
            raise

    def _done(self, task: asyncio.Task[None], batch: _Batch) -> None:
        self._handling.discard(task)
        failed = task.cancelled() or task.exception() is not None
        exc = None if task.cancelled() else task.exception()
        if exc is not None and not isinstance(exc, (ShuttingDown, StoreError)):
            log.error("bot %s: handling an event failed", self.bot.name, exc_info=exc)
        if self._stopping and failed:
            # Cut short by the stop: the position stays before this batch, so
            # the next start syncs it again (what was handled is `duplicate`).
            return
        batch.pending -= 1  # handled, or failed with a line saying why
        if not self._stopping:
            saver = asyncio.ensure_future(self._settled())
            self._handling.add(saver)
            saver.add_done_callback(self._handling.discard)

    def _advance(self) -> bool:
        """Move the position to the newest batch that, with every batch before
        it, was fully handled; whether it moved."""
        moved = False
        while self._batches and self._batches[0].pending == 0:
            self._saved = self._batches.popleft().next_batch
            moved = True
        return moved

    async def _settled(self) -> None:
        """Save a moved position at most once every CURSOR_EVERY seconds, not
        per /sync batch (at low traffic a batch per message: a store call more
        for each). A crash then re-syncs at most that much; what was handled
        comes again as `duplicate`. The stop saves the last one."""
        if not self._advance():
            return
        wait = self._saved_at + CURSOR_EVERY - time.monotonic()
        if wait <= 0:
            self._saved_at = time.monotonic()
            await self._save()
        elif self._pending_save is None:
            self._pending_save = asyncio.get_running_loop().call_later(wait, self._save_later)

    def _save_later(self) -> None:
        self._pending_save = None
        self._saved_at = time.monotonic()
        saver = asyncio.ensure_future(self._save())
        self._handling.add(saver)
        saver.add_done_callback(self._handling.discard)

    async def _save(self) -> None:
        if not self._saved:  # a start that failed knows no position: keep the saved one
            return
        async with self._saving:
            try:
                await self.gateway.store.set_cursor(self.cursor, self._saved)
            except StoreError as exc:
                log.warning("bot %s: saving the sync position failed: %s", self.bot.name, exc)

    async def _handle(self, msg: Message, event: dict[str, Any]) -> None:
        d = await self.gateway.handle(msg)
        if d.action is Action.REPLY and d.replies:
            await self._post(msg, d, list(d.replies))
        elif d.action is Action.WARN and d.warning:
            await self._post(msg, d, [d.warning], warning=True)

    # -- sending ------------------------------------------------------------------

    def _content(self, msg: Message, text: str, *, reply: bool) -> dict[str, Any]:
        """An m.notice into the message's chat (its thread), the first piece
        of an answer as a reply to it. `m.mentions` is always set, so clients
        notify nobody for `@room` or a name in the text: only the author
        answered, on a reply."""
        content: dict[str, Any] = {"msgtype": "m.notice", "body": text, "m.mentions": {}}
        rel: dict[str, Any] = {}
        if msg.chat.topic is not None:
            rel = {"rel_type": "m.thread", "event_id": msg.chat.topic, "is_falling_back": True,
                   "m.in_reply_to": {"event_id": msg.id}}  # fmt: skip
        if reply:
            rel["m.in_reply_to"] = {"event_id": msg.id}
            rel.pop("is_falling_back", None)
            content["m.mentions"] = {"user_ids": [msg.author.id]}
        if rel:
            content["m.relates_to"] = rel
        return content

    async def _post(self, msg: Message, d: Decision, texts: list[str], *,
                    warning: bool = False) -> None:  # fmt: skip
        async def send(piece: str, index: int) -> str:
            content = self._content(msg, piece, reply=index == 0 and not warning)
            return await self._send(msg.chat.id, content)

        pieces = [p for text in texts for p in split_message(text, MESSAGE_LIMIT)]
        await deliver(self.gateway, d, pieces, send, warning=warning)

    async def _send_notice(self, room_id: str, text: str) -> str:
        return await self._send(room_id, {"msgtype": "m.notice", "body": text, "m.mentions": {}})

    async def _send(self, room_id: str, content: dict[str, Any], txn: str | None = None) -> str:
        """PUT the event under one transaction id, however often it is tried:
        the homeserver posts it once. A rate limit is waited out for up to
        SEND_LIMIT_SECONDS; a connection lost mid-request is tried again
        SEND_RETRIES times (same id)."""
        assert self.api is not None
        txn = txn or self.api.api.get_txn_id()
        limited, lost, waited = 0, 0, 0.0
        while True:
            try:
                event_id = await self.api.send_message_event(
                    RoomID(room_id),
                    EventType.ROOM_MESSAGE,
                    content,  # type: ignore[arg-type]  # raw JSON content: sent as it is
                    txn_id=txn,
                )
            except MLimitExceeded:
                wait = min(SEND_FIRST_WAIT * 2**limited, SEND_MAX_WAIT)
                if waited + wait > SEND_LIMIT_SECONDS:
                    raise SendFailed(f"the homeserver's rate limit held for {waited:g} s") from None
                await asyncio.sleep(wait)
                limited, waited = limited + 1, waited + wait
                continue
            except MatrixConnectionError as exc:
                if lost == SEND_RETRIES:
                    raise SendFailed(f"the homeserver could not be reached: {exc}") from None
                await asyncio.sleep(min(SEND_FIRST_WAIT * 2**lost, SEND_MAX_WAIT))
                lost += 1
                continue
            except MatrixRequestError as exc:
                why = f"{exc.errcode or exc.http_status}: {exc.message}"
                raise SendFailed(f"the homeserver refused the message: {why}") from None
            except (MatrixError, aiohttp.ClientError, OSError) as exc:
                raise SendFailed(f"the homeserver could not be reached: {exc}") from None
            self._remember(str(event_id))
            return str(event_id)

    # -- admin commands -------------------------------------------------------------

    async def power_of(self, room_id: str, user: str) -> float:
        """`user`'s power level in the room; a room creator's is unbounded in
        the room versions that say so (12 on)."""
        assert self.api is not None
        state = await self.api.api.request(Method.GET, Path.v3.rooms[room_id].state)
        levels: dict[str, Any] = {}
        for event in state if isinstance(state, list) else ():
            if not isinstance(event, dict):
                continue
            content = event.get("content")
            if not isinstance(content, dict):
                continue
            if event.get("type") == "m.room.create" and _creators_rule(content):
                extra = content.get("additional_creators")
                creators = {event.get("sender"), *(extra if isinstance(extra, list) else ())}
                if user in creators:
                    return float("inf")
            elif event.get("type") == "m.room.power_levels":
                levels = content
        users = levels.get("users") if isinstance(levels.get("users"), dict) else {}
        assert isinstance(users, dict)
        level = users.get(user, levels.get("users_default", 0))
        return float(level) if isinstance(level, (int, float)) else 0.0

    async def _admin(self, msg: Message, command: str) -> None:
        """Run `!bouncer …` and answer with a notice, filed as an aside: no bot
        counts it or answers it. Every replica of the bot syncs the command
        and runs it (each command does the same when run twice); the answer's
        transaction id comes from the command's event id, so the homeserver
        posts one answer for all of them."""
        actor = f"matrix:{msg.author.id}"
        allowed = msg.author.id in self.bot.admins.user_ids
        if not allowed:
            try:
                allowed = await self.power_of(msg.chat.id, msg.author.id) >= ADMIN_POWER
            except (MatrixError, aiohttp.ClientError, OSError) as exc:
                log.error("bot %s: checking %s's power level failed: %s", self.bot.name, actor,
                          exc)  # fmt: skip
                await self._answer(msg, "Could not check your power level; nothing was changed.")
                return
        if not allowed:
            log.info("bot %s: %s %s refused for %s", self.bot.name, ADMIN_PREFIX, command, actor)
            await self._answer(msg, f"Only room members with power level {ADMIN_POWER} or "
                                    "more and botbouncer admins may do this; nothing was "
                                    "changed.")  # fmt: skip
            return
        try:
            text = await self.admin.run(msg.chat.key, command, actor, msg.chat.kind)
        except AdminError as exc:
            text = f"Not done: {exc}"
        except StoreError as exc:
            log.error("bot %s: %s %s failed: %s", self.bot.name, ADMIN_PREFIX, command, exc)
            text = "The state store is unavailable; nothing was changed. Try again."
        await self._answer(msg, text)

    async def _answer(self, msg: Message, text: str) -> None:
        command = hashlib.sha256(msg.id.encode()).hexdigest()[:32]
        for i, piece in enumerate(split_message(text, MESSAGE_LIMIT)):
            content = self._content(msg, piece, reply=i == 0)
            try:
                sent = await self._send(msg.chat.id, content, txn=f"botbouncer-{command}-{i}")
            except SendFailed as exc:
                log.warning("bot %s: answering an admin command failed: %s", self.bot.name, exc)
                return
            self._remember(sent, aside=True)
            await self.gateway.note(msg.chat.key, sent, piece)


def _events(section: Any) -> list[dict[str, Any]]:
    events = section.get("events") if isinstance(section, dict) else None
    return [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []


def _creators_rule(create: dict[str, Any]) -> bool:
    """Room versions 1-11 give the creator power through power_levels only."""
    version = create.get("room_version", "1")
    return not (isinstance(version, str) and version.isdigit() and int(version) <= 11)


def create(bot: BotConfig, gateway: Gateway, server: HttpServer) -> MatrixAdapter:
    return MatrixAdapter(bot, gateway, server)
