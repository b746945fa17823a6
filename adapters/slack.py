"""The Slack adapter (slack_sdk, async): translate message events, send replies,
offer the admin commands as the `/bouncer` slash command. It knows nothing
about limits; Gateway.handle decides.

Events come over Socket Mode (slack_sdk's aiohttp SocketModeClient: an app-level
token, no public URL; its reconnects are its own) or, with `slack.mode: events`,
as signed POSTs to the daemon's own server (`/v1/webhooks/<bot name>`, the Events
API and the slash command both). A request whose v0 signature is wrong or whose
timestamp is over 5 minutes off is answered 401 before its body is parsed.

An event is acknowledged (the envelope acked, the POST answered 200) once its
handling has started as in-flight work, so a stopping daemon acknowledges
nothing it will not finish: Slack delivers it again, elsewhere or later. A
delivery Slack repeats (a retry, a redelivered envelope) carries the same message
`ts` and is decided `duplicate` by the store: counted once.

Slack's Bolt is not used here: the adapter takes one event type and one command,
and Bolt's per-event middleware (authorisation, listener matching, dropping the
bot's own messages, which the gateway must see to count them once) would be
most of its CPU. Existing Bolt apps are guarded by `botbouncer.slack`, which
reads events with this module's `from_event`: one mapping.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qsl

import aiohttp
from aiohttp import web
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.async_handler import AsyncRetryHandler
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from adapters.common import SendFailed, clean, deliver, split_message
from gateway.admin import Admin, AdminError
from gateway.api.common import error
from gateway.config import BotConfig
from gateway.errors import BotbouncerError, StartupError, StartupUnreachable
from gateway.http import HttpServer
from gateway.inflight import ShuttingDown
from gateway.model import Action, Author, ChatKind, ChatRef, Decision, Message
from gateway.outbound import client_session
from gateway.pipeline import Gateway
from gateway.store import StoreError

log = logging.getLogger("botbouncer.slack")

API_BASE = "https://slack.com/api/"
# Slack truncates a message's text past 40,000 characters and asks apps to keep
# it under 4,000 ("best results"): longer answers go as several messages.
MESSAGE_LIMIT = 4000
# A rate-limited reply (429) is waited out this many times, each wait at most
# MAX_RETRY_AFTER seconds; a 429 delivered nothing, so a retry never doubles it.
SEND_RETRIES = 3
MAX_RETRY_AFTER = 30.0
SEND_TIMEOUT = 30  # seconds, a Web API call
# Slack waits 3 s for a slash command's answer; one that takes longer is
# acknowledged with a note and answered with chat.postEphemeral.
ANSWER_WITHIN = 2.5
COMMAND = "/bouncer"
# Message subtypes people and bots write; any other subtype is a message Slack
# made (a join, a topic or purpose change, a pin) and never counts or resets.
WRITTEN_SUBTYPES = frozenset({"bot_message", "thread_broadcast", "file_share", "me_message"})
# Not new messages: an edit, a deletion, the old thread-parent update.
NOT_NEW = frozenset({"message_changed", "message_deleted", "message_replied"})
# A label (`<@U1|name>`) never holds `<` or `>` (Slack escapes them): reading
# one stops at the next `<`, so an unclosed `<@U1|` costs no scan to the end.
_MENTION = re.compile(r"<@([UW][A-Z0-9]+)(?:\|[^<>]*)?>")
# <!channel>, <!here>, <!everyone>, <!subteam^S123>: what notifies many people
_BROADCAST = re.compile(r"<!")
# Threads the bot posted in that a gateway remembers (one entry each).
THREADS_REMEMBERED = 10_000
# Users whose kind (person or bot) users.info told, one entry each.
PEOPLE_REMEMBERED = 10_000
# users.info errors that asking again would repeat (a user of another
# workspace, a token without users:read): the user is remembered as a bot.
_FOR_GOOD = frozenset({"user_not_found", "missing_scope", "not_allowed_token_type"})


class PayloadError(BotbouncerError, ValueError):
    """A message event the adapter cannot read; the text says why."""


def _field(event: dict[str, Any], name: str) -> str:
    value = event.get(name)
    if not isinstance(value, str) or not value:
        raise PayloadError(f"no {name}" if value is None else f"{name} {value!r} is not text")
    return value


def from_event(event: Any) -> Message | None:
    """A Slack message event as the gateway sees it, or None for what is not a
    new message (an edit, a deletion, a hidden event).

    A channel is a chat; a thread (`thread_ts`) is its own chat
    (`slack:<channel>:<thread_ts>`); an `im` is a DM. A bot is anything with
    `bot_id`, `bot_profile` or subtype `bot_message` (other apps, workflows,
    legacy integrations; a person posting through an app with their own
    token looks the same: `People` tells them apart). A subtype people do not
    write (a join, a topic change, a pin) is a system message. A reply in a
    thread names the thread's starter as the author it answers
    (`parent_user_id`).

    Raises PayloadError naming the field when the channel, ts or author is
    missing or unreadable.
    """
    if not isinstance(event, dict):
        raise PayloadError(f"the event is {type(event).__name__}, not an object")
    subtype = event.get("subtype")
    if subtype in NOT_NEW or event.get("hidden") is True:
        return None
    channel = _field(event, "channel")
    ts = _field(event, "ts")
    bot_id = event.get("bot_id")
    user = event.get("user")
    author_id = user if isinstance(user, str) and user else bot_id
    if not isinstance(author_id, str) or not author_id:
        raise PayloadError("no user or bot_id")
    profile = event.get("bot_profile")
    is_bot = bool(bot_id) or subtype == "bot_message" or isinstance(profile, dict)
    name = event.get("username") or (profile.get("name") if isinstance(profile, dict) else None)
    text = event.get("text")
    if text is not None and not isinstance(text, str):
        raise PayloadError(f"text is {type(text).__name__}, not text")
    thread = event.get("thread_ts")
    topic = thread if isinstance(thread, str) and thread and thread != ts else None
    parent = event.get("parent_user_id")
    kind = ChatKind.DM if event.get("channel_type") == "im" else ChatKind.GROUP
    return Message(
        id=ts,
        chat=ChatRef(platform="slack", id=channel, topic=topic, kind=kind),
        author=Author(author_id, clean(name if isinstance(name, str) else ""), is_bot),
        text=clean(text),
        mentions=tuple(_MENTION.findall(text or "")),
        reply_to=parent if topic is not None and isinstance(parent, str) and parent else None,
        system=subtype is not None and subtype not in WRITTEN_SUBTYPES,
    )


def escape(text: str) -> str:
    """Backend text as Slack shows it without notifying a channel or a user
    group: `<!here>`, `<!channel>`, `<!everyone>`, `<!subteam^…>` become text.
    A person mentioned by id (`<@U…>`) is still mentioned."""
    return _BROADCAST.sub("&lt;!", text)


class People:
    """Which authors stamped with an app's `bot_id` are people. Slack stamps
    every message an app posts through the API with the app's `bot_id` and
    `bot_profile`, a person's too when the app posts with that person's user
    token (a voice front desk, an IRC bridge): `user` is then the person.
    users.info tells (`is_bot`), once a user, at most PEOPLE_REMEMBERED of
    them; when it cannot, the author stays a bot, as the event says."""

    def __init__(self) -> None:
        self._bots: OrderedDict[str, bool] = OrderedDict()  # user -> is a bot

    async def unmask(self, msg: Message, event: dict[str, Any], web: AsyncWebClient) -> Message:
        """`msg`, its author a person when users.info says the `user` of an
        event stamped with an app's `bot_id` is one."""
        user = event.get("user")
        if (not msg.author.is_bot or not event.get("bot_id") or not isinstance(user, str)
                or not user or event.get("subtype") == "bot_message"):  # fmt: skip
            return msg
        bot = self._bots.get(user)
        if bot is None:
            try:
                found = (await web.users_info(user=user)).get("user")
            except (SlackClientError, aiohttp.ClientError, OSError) as exc:
                why = _api_error(exc) if isinstance(exc, SlackClientError) else str(exc)
                log.warning("could not tell whether Slack user %s, posting through an app, is a "
                            "person (%s): taken as a bot", user, why)  # fmt: skip
                if why in _FOR_GOOD:  # asking again would say the same: remembered
                    self._remember(user, True)
                return msg
            bot = not isinstance(found, dict) or found.get("is_bot") is not False
            self._remember(user, bot)
        return msg if bot else replace(msg, author=replace(msg.author, is_bot=False))

    def _remember(self, user: str, bot: bool) -> None:
        self._bots[user] = bot
        while len(self._bots) > PEOPLE_REMEMBERED:
            self._bots.popitem(last=False)


class Threads:
    """The threads (chat keys) a bot has posted in, newest last, at most
    THREADS_REMEMBERED: a message there addresses the bot as a reply to it
    would. Kept per process: another replica knows a thread once the bot's
    post there reached it, or once the bot started the thread."""

    def __init__(self) -> None:
        self._keys: OrderedDict[str, None] = OrderedDict()

    def posted(self, chat: ChatRef) -> None:
        if chat.topic is None:
            return
        self._keys[chat.key] = None
        self._keys.move_to_end(chat.key)
        if len(self._keys) > THREADS_REMEMBERED:
            self._keys.popitem(last=False)

    def address(self, msg: Message, bot_id: str) -> Message:
        """`msg` as the gateway should see it from `bot_id`'s side: a message
        in a thread the bot posted in answers the bot; the bot's own post in a
        thread marks the thread."""
        if msg.chat.topic is None:
            return msg
        if msg.author.id == bot_id:
            self.posted(msg.chat)
            return msg
        if msg.reply_to != bot_id and msg.chat.key in self._keys:
            return replace(msg, reply_to=bot_id)
        return msg


class _BoundedRateLimitRetry(AsyncRateLimitErrorRetryHandler):
    """slack_sdk's 429 retry, refusing a Retry-After that is not a number or is
    over MAX_RETRY_AFTER: the reply then fails and its slot is given back,
    rather than a chat's answer waiting for minutes."""

    async def _can_retry_async(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        if response is None or response.status_code != 429:
            return False
        wait = next((v for k, v in response.headers.items() if k.lower() == "retry-after"), None)
        try:
            # whole seconds, as slack_sdk's wait reads it (int()); anything else
            # ("1.5", an HTTP date) would raise ValueError from inside the request
            seconds = int(wait[0]) if wait else 1
        except ValueError:
            return False
        return 0 <= seconds <= MAX_RETRY_AFTER


def web_client(token: str, api_base: str | None, session: aiohttp.ClientSession) -> AsyncWebClient:
    """slack_sdk's client on one shared session; it retries only 429s (which
    delivered nothing), never a connection that broke mid-request."""
    retry: list[AsyncRetryHandler] = [_BoundedRateLimitRetry(max_retry_count=SEND_RETRIES)]
    # slack_sdk builds its debug lines (the request's arguments, the whole
    # answer) whenever its logger's *own* level is DEBUG or unset, which its
    # default logger's is: 3-4 % of the daemon's CPU for lines logging drops.
    # Its logger here has a level: DEBUG only when debug lines are shown.
    web_log = logging.getLogger("botbouncer.slack.web")
    debug = log.getEffectiveLevel() <= logging.DEBUG  # botbouncer.slack's own is unset
    web_log.setLevel(logging.DEBUG if debug else logging.INFO)
    return AsyncWebClient(token, base_url=api_base or API_BASE, session=session,
                          timeout=SEND_TIMEOUT, retry_handlers=retry, logger=web_log)  # fmt: skip


def _api_error(exc: SlackClientError) -> str:
    if isinstance(exc, SlackApiError):
        # a body that was not JSON (a proxy's plain-text 503) is kept as a string
        data = exc.response.data
        found = data.get("error") if isinstance(data, dict) else None
        return str(found or f"HTTP {exc.response.status_code}")
    return f"{type(exc).__name__}: {exc}"


class SlackAdapter:
    def __init__(self, bot: BotConfig, gateway: Gateway, server: HttpServer) -> None:
        if bot.token is None or bot.slack is None:  # the config refuses this
            raise StartupError(f"bot {bot.name}: a Slack bot needs a token and a slack section")
        self.bot = bot
        self.gateway = gateway
        self.server = server
        self.admin = server.admins.get(bot.name) or Admin(gateway)
        self.mode = bot.slack.mode
        secret = bot.slack.signing_secret
        self.verifier = SignatureVerifier(secret.get_secret_value()) if secret else None
        self.threads = Threads()
        self.people = People()
        self.team = ""
        self._http: aiohttp.ClientSession | None = None
        self.web: AsyncWebClient | None = None
        self.socket: SocketModeClient | None = None
        self._handling: set[asyncio.Task[None]] = set()
        self._late: set[asyncio.Task[None]] = set()  # slash-command answers sent late

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        """auth.test (a bad bot token stops the daemon), then Socket Mode
        (apps.connections.open: a bad app token stops it too) or the webhook."""
        assert self.bot.token is not None and self.bot.slack is not None  # checked in __init__
        self._http = client_session()
        self.web = web_client(self.bot.token.get_secret_value(), self.bot.api_base, self._http)
        try:
            me = await self.web.auth_test()
        except SlackApiError as exc:
            await self.stop()
            # Slack refuses a token with 200 {"ok": false}; any other status is
            # Slack (or what is in front of it) failing, not the token
            what = "refused the bot token" if exc.response.status_code == 200 else "answered"
            kind = StartupError if exc.response.status_code == 200 else StartupUnreachable
            raise kind(f"bot {self.bot.name}: Slack {what}: "
                               f"{_api_error(exc)}") from None  # fmt: skip
        except (SlackClientError, aiohttp.ClientError, OSError) as exc:
            await self.stop()
            raise StartupUnreachable(f"bot {self.bot.name}: cannot reach Slack at "
                               f"{self.web.base_url}: {exc}") from None  # fmt: skip
        user_id, self.team = me.get("user_id"), str(me.get("team") or me.get("team_id") or "")
        if not isinstance(user_id, str) or not user_id:
            await self.stop()
            raise StartupError(f"bot {self.bot.name}: auth.test named no bot user: is the "
                               "token a bot token (xoxb-)?")  # fmt: skip
        self.gateway.bot_id = user_id  # own messages and mentions carry the bot user's id
        if self.mode == "events":
            self.server.add_webhook(self.bot.name, self._on_webhook)
            how = f"by the Events API: Slack POSTs to this daemon's /v1/webhooks/{self.bot.name}"
        else:
            await self._connect()
            how = "by Socket Mode"
        log.info("bot %s is on Slack as %s (user %s) in %s, %s", self.bot.name, me.get("user"),
                 user_id, self.team or "?", how)  # fmt: skip

    async def _connect(self) -> None:
        assert self.web is not None and self.bot.slack is not None
        app_token = self.bot.slack.app_token
        assert app_token is not None  # the config requires it for Socket Mode
        # slack_sdk's connect() retries forever on any failure, a refused app
        # token included: the URL is asked for here, once, to fail clearly.
        try:
            opened = await self.web.apps_connections_open(app_token=app_token.get_secret_value())
        except SlackApiError as exc:
            await self.stop()
            raise StartupError(f"bot {self.bot.name}: Slack refused the app token for Socket "
                               f"Mode: {_api_error(exc)}") from None  # fmt: skip
        except (SlackClientError, aiohttp.ClientError, OSError) as exc:
            await self.stop()
            raise StartupUnreachable(
                f"bot {self.bot.name}: cannot open Socket Mode: {exc}"
            ) from None
        socket_log = logging.getLogger("botbouncer.slack.socket")
        self.socket = SocketModeClient(
            app_token.get_secret_value(), web_client=self.web, logger=socket_log
        )
        self.socket.socket_mode_request_listeners.append(self._on_envelope)  # type: ignore[arg-type]
        self.socket.wss_uri = opened["url"]
        await self.socket.connect()  # type: ignore[no-untyped-call]

    async def stop_intake(self) -> None:
        """Take no more events: the socket closes (what was not acknowledged
        Slack delivers again); a POST while stopping is answered 503."""
        if self.socket is not None:
            await self.socket.close()  # type: ignore[no-untyped-call]

    async def stop(self) -> None:
        self.server.remove_webhook(self.bot.name)
        if self.socket is not None:
            await self.socket.close()  # type: ignore[no-untyped-call]
            self.socket = None
        if self._http is not None:
            await self._http.close()
            self._http = None

    # -- taking events --------------------------------------------------------

    async def _take(self, what: str, work: Callable[[], Awaitable[None]]) -> bool:
        """Start `work` as tracked in-flight work in a task of its own; True
        once it is tracked (acknowledge the event then), False when the daemon
        is stopping (acknowledge nothing: Slack delivers it again)."""
        started: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        async def run() -> None:
            try:
                with self.gateway.inflight.track():
                    started.set_result(True)
                    await work()
            except ShuttingDown:
                if not started.done():
                    started.set_result(False)
                    log.info("bot %s: %s arrived while stopping; left for Slack to deliver "
                             "again", self.bot.name, what)  # fmt: skip
            except StoreError as exc:
                log.error("bot %s: %s not handled: %s", self.bot.name, what, exc)

        task = asyncio.ensure_future(run())
        self._handling.add(task)
        task.add_done_callback(self._handled)
        return await started

    def _handled(self, task: asyncio.Task[None]) -> None:
        self._handling.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("bot %s: handling a message failed", self.bot.name, exc_info=exc)

    async def on_event(self, body: Any) -> bool:
        """One event_callback body. False only when the daemon is stopping and
        the event must not be acknowledged."""
        event = body.get("event") if isinstance(body, dict) else None
        if not isinstance(event, dict) or event.get("type") != "message":
            kind = event.get("type") if isinstance(event, dict) else None
            log.debug("bot %s: event %r ignored: not a message", self.bot.name, kind)
            return True
        try:
            msg = from_event(event)
        except PayloadError as exc:
            log.warning("bot %s: could not read message %s from Slack (%s); ignored",
                        self.bot.name, event.get("ts", "?"), exc)  # fmt: skip
            return True
        if msg is None:  # an edit or a deletion: not a turn
            return True
        msg = self.threads.address(msg, self.gateway.bot_id)
        if self.gateway.echo(msg):
            return True
        return await self._take(f"message {msg.chat.key}/{msg.id}",
                                lambda: self._handle(msg, event))  # fmt: skip

    async def _handle(self, msg: Message, event: dict[str, Any]) -> None:
        assert self.web is not None
        msg = await self.people.unmask(msg, event, self.web)
        d = await self.gateway.handle(msg)
        if d.action is Action.REPLY and d.replies:
            await self._post(msg.chat, d, [escape(r) for r in d.replies])
        elif d.action is Action.WARN and d.warning:
            await self._post(msg.chat, d, [escape(d.warning)], warning=True)

    # -- sending ------------------------------------------------------------------

    async def _post(
        self, chat: ChatRef, d: Decision, texts: list[str], *, warning: bool = False
    ) -> None:
        """Each piece into the chat: a thread's reply into the thread. Links
        and names are not expanded (`parse: none`, `link_names: false`).
        Once a piece is posted in a thread, the thread addresses the bot (a
        reply that failed leaves it as it was)."""

        async def send(piece: str, index: int) -> str:
            ts = await self._send(chat, piece)
            self.threads.posted(chat)
            return ts

        pieces = [p for text in texts for p in split_message(text, MESSAGE_LIMIT)]
        await deliver(self.gateway, d, pieces, send, warning=warning)

    async def _send(self, chat: ChatRef, text: str) -> str:
        assert self.web is not None  # made by start
        try:
            sent = await self.web.chat_postMessage(channel=chat.id, text=text,
                                                   thread_ts=chat.topic, parse="none",
                                                   link_names=False)  # fmt: skip
        except SlackApiError as exc:
            raise SendFailed(f"Slack refused the message: {_api_error(exc)}") from None
        except (SlackClientError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise SendFailed(f"Slack could not be reached ({type(exc).__name__})") from None
        ts = sent.get("ts")
        if not isinstance(ts, str) or not ts:
            raise SendFailed(f"Slack answered without a message ts: {str(sent.data)[:200]}")
        return ts

    # -- Socket Mode --------------------------------------------------------------

    async def _on_envelope(self, client: SocketModeClient, req: SocketModeRequest) -> None:
        if req.type == "events_api":
            if await self.on_event(req.payload):
                await self._ack(client, req.envelope_id)
        elif req.type == "slash_commands":
            answer = await self.command(req.payload)
            await self._ack(client, req.envelope_id, answer)
        else:  # interactive, hello...: nothing of ours; acknowledged so it is not resent
            await self._ack(client, req.envelope_id)

    async def _ack(
        self, client: SocketModeClient, envelope_id: str, payload: dict[str, Any] | None = None
    ) -> None:
        try:
            await client.send_socket_mode_response(SocketModeResponse(envelope_id, payload))
        except (ConnectionError, aiohttp.ClientError) as exc:
            # Slack delivers it again, on the next socket; it then counts once
            log.info("bot %s: acknowledging envelope %s failed (%s); Slack will deliver it "
                     "again", self.bot.name, envelope_id, exc)  # fmt: skip

    # -- the Events API -----------------------------------------------------------

    async def _on_webhook(self, request: web.Request) -> web.Response:
        """One signed POST: an event, Slack's URL check, or the slash command
        (a form). The signature is checked before the body is parsed."""
        raw = await request.read()
        if not self._signed(raw, request.headers):
            log.warning("bot %s: Events API request from %s with a bad or stale signature; "
                        "refused", self.bot.name, request.remote)  # fmt: skip
            return error(401, "bad or stale Slack signature")
        if request.content_type == "application/x-www-form-urlencoded":
            fields = dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True))
            return web.json_response(await self.command(fields))
        try:
            body = json.loads(raw)
        except ValueError:
            return error(400, "body: not JSON")
        if not isinstance(body, dict):
            return error(400, "body: must be a JSON object")
        if body.get("type") == "url_verification":
            challenge = body.get("challenge")
            if not isinstance(challenge, str):
                return error(400, "challenge: must be text")
            return web.json_response({"challenge": challenge})
        if body.get("type") != "event_callback":
            log.debug("bot %s: Events API request of type %r ignored", self.bot.name,
                      body.get("type"))  # fmt: skip
            return web.json_response({})
        if not await self.on_event(body):
            return error(503, "botbouncer is shutting down; Slack delivers this again")
        return web.json_response({})

    def _signed(self, raw: bytes, headers: Any) -> bool:
        """Slack's v0 signature over the raw body, within 5 minutes, compared
        in constant time (slack_sdk's SignatureVerifier)."""
        assert self.verifier is not None  # the config requires it for events
        timestamp = headers.get("X-Slack-Request-Timestamp")
        signature = headers.get("X-Slack-Signature")
        if not timestamp or not signature or not timestamp.isascii() or not timestamp.isdigit():
            return False
        try:
            return self.verifier.is_valid(raw, timestamp, signature)
        except (TypeError, ValueError):  # a signature that is not ASCII
            return False

    # -- the /bouncer command -----------------------------------------------------

    async def command(self, fields: dict[str, Any]) -> dict[str, Any]:
        """A slash command's answer (`response_type: ephemeral`: only the
        person who asked sees it). An answer that takes longer than Slack
        waits goes by chat.postEphemeral when ready."""
        name = str(fields.get("command") or "")
        if name != COMMAND:
            return _ephemeral(f"botbouncer answers {COMMAND} only, not {name or 'this'}.")
        run = asyncio.ensure_future(self._command(fields))
        done, _ = await asyncio.wait([run], timeout=ANSWER_WITHIN)
        if run in done:
            return _ephemeral(run.result())
        run.add_done_callback(lambda task: self._late_answer(task, fields))
        return _ephemeral("Working on it; the answer follows here.")

    def _late_answer(self, task: asyncio.Task[str], fields: dict[str, Any]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        later = asyncio.ensure_future(self._ephemeral(fields, task.result()))
        self._late.add(later)
        later.add_done_callback(self._late.discard)

    async def _ephemeral(self, fields: dict[str, Any], text: str) -> None:
        assert self.web is not None
        try:
            channel, user = str(fields.get("channel_id")), str(fields.get("user_id"))
            await self.web.chat_postEphemeral(channel=channel, user=user, text=text)
        except (SlackClientError, aiohttp.ClientError, OSError) as exc:
            log.warning("bot %s: answering %s late failed: %s", self.bot.name, COMMAND, exc)

    async def _command(self, fields: dict[str, Any]) -> str:
        user, channel = str(fields.get("user_id") or ""), str(fields.get("channel_id") or "")
        text = str(fields.get("text") or "").strip() or "status"
        dm = channel.startswith("D") or fields.get("channel_name") == "directmessage"
        chat = ChatRef("slack", channel, kind=ChatKind.DM if dm else ChatKind.GROUP)
        actor = f"slack:{user}"
        try:
            allowed = await self.is_admin(user, channel, dm=dm)
        except (SlackClientError, aiohttp.ClientError, OSError) as exc:
            log.error("bot %s: checking %s's rights failed: %s", self.bot.name, actor, exc)
            return "Could not check your admin rights; nothing was changed."
        if not allowed:
            log.info("bot %s: %s %s refused for %s", self.bot.name, COMMAND, text, actor)
            return ("Only workspace admins and owners, the channel's creator and botbouncer "
                    "admins may do this; nothing was changed.")  # fmt: skip
        try:
            return await self.admin.run(chat.key, text, actor, chat.kind)
        except AdminError as exc:
            return f"Not done: {exc}"
        except StoreError as exc:
            log.error("bot %s: %s %s failed: %s", self.bot.name, COMMAND, text, exc)
            return "The state store is unavailable; nothing was changed. Try again."

    async def is_admin(self, user: str, channel: str, *, dm: bool) -> bool:
        """Configured user ids, a workspace admin or owner (users.info), or in
        a channel its creator (conversations.info: the one channel role the
        Web API tells a bot)."""
        if user in self.bot.admins.user_ids:
            return True
        assert self.web is not None
        person = (await self.web.users_info(user=user)).get("user") or {}
        if any(person.get(k) is True for k in ("is_admin", "is_owner", "is_primary_owner")):
            return True
        if dm:
            return False
        info = (await self.web.conversations_info(channel=channel)).get("channel") or {}
        return bool(user) and info.get("creator") == user


def _ephemeral(text: str) -> dict[str, Any]:
    return {"response_type": "ephemeral", "text": text}


def create(bot: BotConfig, gateway: Gateway, server: HttpServer) -> SlackAdapter:
    return SlackAdapter(bot, gateway, server)
