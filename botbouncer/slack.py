"""botbouncer for a Slack Bolt app (slack_bolt's asyncio `AsyncApp`) that keeps
its tokens.

    app = AsyncApp(token=os.environ["SLACK_BOT_TOKEN"])
    guard(app, Bouncer("botbouncer.yml", bot="helper"))

`guard` wires a `Bouncer` into the app at four places, all on the instance:

- a global middleware (`app.middleware`, Bolt's documented hook), which runs
  after Bolt's own: the request is verified and authorised, and Bolt has
  dropped the app's own events (IgnoringSelfEvents, on by default; they were
  counted when sent). Each new message (a `message` event, or an
  `app_mention`) is mapped by the Slack adapter's own `from_event` (a thread
  is its own chat, an `im` a DM, bots, mentions, system subtypes) and
  `Threads.address` (a message in a thread the bot posted in addresses it),
  then decided. On `reply` the middleware calls `next()` and the app's
  listeners run; on `drop` and `warn` they do not (the event is still
  acknowledged), and on `warn` the guard posts the warning in the chat (in
  the thread for a thread; escaped, `parse: none`, `link_names: false`),
  unless `warnings=False`. The bot's user id is Bolt's `context.bot_user_id`
  (auth.test, which Bolt calls on the first event), else auth.test.
- `app.async_dispatch`, wrapped: every adapter (Socket Mode, the HTTP
  server, a web framework's) hands each request to it. The wrapper marks
  the request as being handled (a context variable, which Bolt's listener
  tasks and the tasks they start copy) and, once Bolt returned, ends the
  handling unless a listener still runs.
- `app.listener_runner`: its `run`, wrapped (Bolt runs each listener it
  matched through it; the wrapper counts them), and its
  `listener_completion_handler`, replaced by one that calls Bolt's and then
  ends the handling when its last listener ended. With Bolt's default
  (`process_before_response=False`) a listener runs in a task of its own
  after the event was acknowledged; with `True` it runs before. Either way
  the handling ends when the listener returned or raised: a ticket under
  which nothing was sent is then released (a mention's: see below).
- `api_call` of the app's `AsyncWebClient` (`app.client`) and of the client
  Bolt makes for each request (`context.client`, `client`, what `say` posts
  with), wrapped: every slack_sdk Web API method goes through `api_call`, so
  each message posted with `chat.postMessage` (also `chat.meMessage` and
  `chat.startStream`, which post one too) is counted once Slack answered
  with its `ts`: under the ticket of the message being handled when it goes
  to that message's chat (its channel, or its thread), else as the bot's own
  turn in its chat (`Bouncer.posted`: a scheduled post, a slash command's
  answer, a post in another channel or thread; an answer posted in a new
  thread under the message, `say(..., thread_ts=message["ts"])`, is the
  thread's turn: counted there, and the message's ticket is released, so
  the channel's rate cap does not see answers given in threads, while the
  turn limits hold in the thread). A post in a thread, once Slack took it,
  also marks the thread as one the bot is in (`Threads`). A failure to count is
  logged: the message was posted, and the app's code is told so. `api_call`
  rather than `say` (listeners post with `client` too) or the HTTP session
  (shared with every other call, and below slack_sdk's retries of a 429,
  which post once): one place that sees each post once, with its answer.

Slack delivers a message that mentions the app twice when the app subscribes
to both `message` and `app_mention` events: the first event to arrive is
decided and the other gets the same decision and ticket, in this process
(no store call more). With `replicas=True`, replicas of the app (processes
whose Bouncers share one Redis) may get one each: the decision is filed in
the store (`Bouncer.decide` with `shared`) and the other event gets it from
there, in whichever replica, and runs its listeners under it. A claim in the
store per kind of event lets each run once. The ticket is released once both
events' listeners ended with nothing posted; when the first one's ended before
the other event came, and a listener of the app would take that event, the
ticket waits for it, up to `other_event_seconds` (10 s), after which the other
event is taken as a repeat. A delivery Slack repeats (a retry, a redelivered
envelope) carries the same `ts` and is decided `duplicate` by the store: its
listeners do not run again (the claims of a mention's events outlast
Slack's retries, and its decision is filed under the kind of event that
made it, so that a retry is told from the other event in every replica). A
message in a DM is one event (Slack sends no app_mention there). When the
replica that decided a mention is slower than `FILED_WITHIN` (plus the
reply decision's timeout) to file it, the other replica runs no listener
for its event and leaves, or takes over, the release of the ticket: the
mention is not answered by that event's listeners, and no slot stays held.
A message the guard cannot read (no channel, ts or author) passes through
undecided, with an INFO line, as Bolt would hand it on; edits, deletions
and every other event pass through untouched. When the store is
unreachable (`StoreError`) the message is acknowledged, no listener runs,
and an ERROR line says so (a chat where bots loop is exactly where failing
open would hurt; a person can ask again).

Not covered: messages posted by other means than the app's clients (an
`AsyncWebClient` of your own, `respond()` and response URLs, incoming
webhooks, `chat.scheduleMessage`, file uploads) are not counted when sent;
lazy listeners (`lazy=[...]`) and tasks a listener starts count what they
post under the ticket only while a listener of the message still runs, and as
the bot's own turns afterwards. A global middleware added before `guard` runs
before the guard decides. One guard guards one bot user: an app installed in
several workspaces (OAuth) is guarded in the workspace whose bot user it saw
first; messages for another bot user pass through undecided, with a WARNING.
System messages (a `message` event of subtype `channel_join`, a topic
change) are decided like any message and, as botbouncer never answers them,
dropped: a listener for them does not run (`member_joined_channel` events,
which are no messages, pass through). Apps with
`ignoring_self_events_enabled=False` see their own messages; these
are recognised as counted already (`Bouncer.echo`) and handed to the
listeners, or counted then when they were posted another way.

The Bouncer is the caller's to close (`async with Bouncer(...)`), after the
Socket Mode handler closed and then `SlackGuard.close()`, which waits for
the requests being handled and settles at once the tickets waiting for a
mention's other event (else their slots stay held in the store until the
tickets lapse); `SlackGuard.idle()` waits until the requests received so far
are handled (`held=True`: also until the tickets waiting for a mention's
other event are settled).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from contextlib import nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from slack_bolt.async_app import AsyncApp
from slack_bolt.context.async_context import AsyncBoltContext
from slack_bolt.listener.async_listener import AsyncListener
from slack_bolt.listener.async_listener_completion_handler import (
    AsyncListenerCompletionHandler,
)
from slack_bolt.middleware.async_middleware import AsyncMiddleware
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.errors import SlackClientError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from adapters.common import clean
from adapters.slack import PayloadError, People, Threads, escape, from_event
from botbouncer._middleware import count_sent, release
from botbouncer.bouncer import SHARED, Bouncer
from gateway.config import ConfigError
from gateway.decide import SpentTicket, UnknownTicket
from gateway.model import Action, ChatKind, ChatRef, Decision, Message, Reason
from gateway.store import StoreError

__all__ = ["SlackGuard", "guard"]

log = logging.getLogger(__name__)

# Web API methods that post a new message and answer with its channel and ts.
POSTING = frozenset({"chat.postMessage", "chat.meMessage", "chat.startStream"})
# The events that carry a new message (app_mention: one that mentions the app).
MESSAGE_EVENTS = frozenset({"message", "app_mention"})
# Messages whose decision is remembered for their other event (message and
# app_mention of one message arrive together).
DECIDED_REMEMBERED = 1024
# How long a mention's ticket nothing was sent on waits for the mention's other
# event (Slack sends both at once) when a listener of the app would take it.
OTHER_EVENT_SECONDS = 10.0
# How long the other event of a mention decided in another process waits for
# that decision to be filed in the store (one store call away, plus the reply
# decision's classifier when the bot has one).
FILED_WITHIN = 2.0
# How long the claim of a mention's event kind lasts at least: Slack retries
# a delivery three times, the last about 5 minutes after the event; a retry
# within this finds its kind claimed and is a repeat at once.
RETRIED_WITHIN = 600.0


# AsyncWebClient.api_call(api_method, *, http_verb=..., params=..., data=..., json=..., ...)
_ApiCall = Callable[..., Awaitable[AsyncSlackResponse]]


@dataclass(eq=False)
class _Ticket:
    """A `reply` or `warn` decision and what was sent on it; one per
    message, shared by its events (message and app_mention) handled here."""

    decision: Decision
    kinds: set[str]  # the message's events handled here under it
    shared: str | None = None  # a mention's: its key in the store (its claims, filings)
    body: dict[str, Any] | None = None  # a mention's first request: its other event's listeners
    first: bool = True  # decided here, not for the other event in another process
    handlings: int = 0  # requests of the message still being handled
    sent: int = 0  # messages counted under it
    settled: bool = False  # released, or left to another process: later posts are own turns
    wait: asyncio.TimerHandle | None = None  # waiting for the other event (a mention's)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # the store calls that settle it

    def settle(self) -> None:
        """Released, or left to another process: nothing more to do here."""
        self.settled = True
        self.body = None


@dataclass(eq=False)
class _Handling:
    """One request being handled by one guarded app."""

    guard: SlackGuard
    ticket: _Ticket | None = None
    listeners: int = 0  # listeners Bolt started for it
    ended: int = 0  # ... and of these, the ones that returned or raised
    dispatching: bool = True  # until async_dispatch returned
    open: bool = True  # until it and its listeners are done

    def check(self) -> None:
        if self.open and not self.dispatching and self.ended >= self.listeners:
            self.open = False
            self.guard._handled(self)


@dataclass(eq=False)
class _Seen:
    """A message decided by one of its events; the others await its decision."""

    events: set[str]
    decided: asyncio.Future[tuple[Decision, _Ticket | None] | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


# The request the current task handles (None: outside any, e.g. a scheduled
# post). Bolt starts a listener with asyncio.ensure_future during dispatch,
# which copies the context: the listener, and the tasks it starts, see it.
_current: ContextVar[_Handling | None] = ContextVar("botbouncer_slack", default=None)


def _message_event(body: object) -> dict[str, Any] | None:
    if not isinstance(body, dict) or body.get("type") != "event_callback":
        return None
    event = body.get("event")
    if isinstance(event, dict) and event.get("type") in MESSAGE_EVENTS:
        return event
    return None


def _params(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A Web API call's arguments, wherever slack_sdk was given them."""
    out: dict[str, Any] = {}
    for name in ("params", "data", "json"):
        part = kwargs.get(name)
        if isinstance(part, Mapping):
            out.update(part)
    return out


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _other(kind: str) -> str:
    """The other event kind of a mention: app_mention for message, and back."""
    (other,) = MESSAGE_EVENTS - {kind}
    return other


class _Completion(AsyncListenerCompletionHandler):
    """Bolt's listener completion handler, then the guard hears of it."""

    def __init__(self, guard: SlackGuard, inner: AsyncListenerCompletionHandler) -> None:
        self.guard = guard
        self.inner = inner

    async def handle(self, request: AsyncBoltRequest, response: BoltResponse | None) -> None:
        try:
            await self.inner.handle(request=request, response=response)
        finally:
            self.guard._listener_ended(request)


class SlackGuard(AsyncMiddleware):
    """What `guard` installed on one AsyncApp (see the module docstring)."""

    def __init__(
        self, app: AsyncApp, bouncer: Bouncer, *, warnings: bool, replicas: bool = False
    ) -> None:
        self.app = app
        self.bouncer = bouncer
        self.warnings = warnings
        self.replicas = replicas  # a mention's decision shared through the store
        self.threads = Threads()
        self.people = People()
        self.known = False  # bouncer.bot_id is the bot user's
        self._strangers: set[str] = set()  # other bot users, warned about once
        self._dispatch = app.async_dispatch
        runner = app.listener_runner
        self._run = runner.run
        self._completion = _Completion(self, runner.listener_completion_handler)
        self._seen: OrderedDict[tuple[str, str], _Seen] = OrderedDict()
        self._open: set[_Handling] = set()
        self._tasks: set[asyncio.Task[Any]] = set()  # releases
        self._waiting: set[_Ticket] = set()  # tickets waiting for a mention's other event
        self.other_event_seconds = OTHER_EVENT_SECONDS
        self._closing = False  # close() was called: tickets no longer wait
        self._quiet = asyncio.Event()
        self._quiet.set()

    @property
    def name(self) -> str:  # AsyncMiddleware's, as Bolt's debug lines show it
        return "botbouncer.slack"

    @property
    def bot(self) -> str:
        return self.bouncer.bot.name

    def _install(self) -> None:
        runner = self.app.listener_runner
        self.app.async_dispatch = self._dispatching  # type: ignore[method-assign]
        runner.run = self._running  # type: ignore[method-assign]
        runner.listener_completion_handler = self._completion
        self._wrap(self.app.client)
        self.app.middleware(self)

    async def idle(self, *, held: bool = False) -> None:
        """Until every request received so far is handled: its listeners
        ended, its ticket sent on or released (tests; before closing the
        Bouncer). A mention's ticket that waits for the mention's other event
        is waited for only with `held` (at most `other_event_seconds`)."""
        while self._open or self._tasks or (held and self._waiting):
            self._quiet.clear()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            else:
                await self._quiet.wait()

    async def close(self) -> None:
        """Before closing the Bouncer, once the app stopped taking requests
        (its Socket Mode handler closed): waits until the requests received
        are handled, and settles at once every mention's ticket that waits
        for the mention's other event (released, unless that event was
        handled in another process, which then releases it), so that no rate
        slot stays held in the store until the ticket lapses. The guard
        still works afterwards, without such waits."""
        self._closing = True
        await self.idle()
        for ticket in list(self._waiting):
            self._unwait(ticket)
            self._start(self._shut_out(ticket))
        await self.idle(held=True)

    # -- the bot user ----------------------------------------------------------------

    def _learn(self, user_id: str) -> None:
        if not self.known:
            self.bouncer.bot_id = user_id
            self.known = True
            log.info("bot %s is on Slack as user %s", self.bot, user_id)

    async def _auth_test(self, call: _ApiCall) -> str | None:
        """The bot user's id from auth.test (with `call`, an api_call)."""
        try:
            me = await call("auth.test")
        except (SlackClientError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning("bot %s: auth.test failed: %s", self.bot, exc)
            return None
        user_id = me.get("user_id")
        if not isinstance(user_id, str) or not user_id:
            log.warning("bot %s: auth.test named no bot user: is the token a bot token "
                        "(xoxb-)?", self.bot)  # fmt: skip
            return None
        self._learn(user_id)
        return user_id

    async def _me(self, context: AsyncBoltContext) -> str | None:
        """The bot user the request is for (Bolt's authorisation found it)."""
        user_id = context.bot_user_id
        if not user_id:
            if self.known:
                return self.bouncer.bot_id
            return await self._auth_test(context.client.api_call)
        self._learn(user_id)
        return user_id

    # -- each request ------------------------------------------------------------------

    async def _dispatching(self, req: AsyncBoltRequest) -> BoltResponse:
        """`AsyncApp.async_dispatch`: the request is handled in its context."""
        handling = _Handling(self)
        self._open.add(handling)
        token = _current.set(handling)
        try:
            return await self._dispatch(req)
        finally:
            _current.reset(token)
            handling.dispatching = False
            handling.check()

    async def _running(
        self,
        request: AsyncBoltRequest,
        response: BoltResponse,
        listener_name: str,
        listener: AsyncListener,
        starting_time: float | None = None,
    ) -> BoltResponse | None:
        """`AsyncioListenerRunner.run`: Bolt runs a listener it matched (now,
        or in a task); `_Completion` hears when it ended."""
        handling = _current.get()
        if (
            handling is not None
            and handling.guard is self
            and handling.open
            and not request.lazy_only
        ):
            handling.listeners += 1
        return await self._run(request, response, listener_name, listener, starting_time)

    def _listener_ended(self, request: AsyncBoltRequest) -> None:
        handling = _current.get()
        if handling is not None and handling.guard is self and not request.lazy_only:
            handling.ended += 1
            handling.check()

    def _handled(self, handling: _Handling) -> None:
        """The request and its listeners are done: a ticket nothing was sent
        on (by any event of its message) is released; a mention's, whose
        other event may run listeners elsewhere or still come, is settled by
        `_alone`."""
        self._open.discard(handling)
        ticket = handling.ticket
        if ticket is not None:
            ticket.handlings -= 1
            if ticket.handlings == 0 and ticket.sent == 0 and not ticket.settled:
                if (
                    (ticket.shared is not None or ticket.body is not None)  # a mention's
                    and ticket.decision.action is Action.REPLY
                    and len(ticket.kinds) < len(MESSAGE_EVENTS)
                ):
                    self._start(self._alone(ticket))
                else:
                    self._release(ticket)
        self._maybe_quiet()

    def _release(self, ticket: _Ticket) -> None:
        ticket.settle()
        shared = ticket.shared is not None
        self._start(release(self.bouncer, ticket.decision, log, shared=shared))

    def _start(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._released)

    def _released(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._maybe_quiet()

    def _maybe_quiet(self) -> None:
        if not self._open and not self._tasks:
            self._quiet.set()

    # -- a mention: two events, maybe in two processes -----------------------------------
    #
    # Slack sends a message that mentions the app as a `message` event and an
    # `app_mention` event, which replicas of the app may get one each. The
    # first event decides (its decision is filed in the store under the
    # message); the other gets that decision and ticket (here, or from the
    # store), once a claim in the store says this kind of event was not
    # handled already (else it is a repeat: duplicate). A ticket nothing was
    # sent on is released when the last of the two handlings ends: the one
    # that finds the `ended` claim taken. The first event's, when its other
    # event has not come, waits for it (other_event_seconds), then claims that
    # kind itself: it came elsewhere (which releases), or it is shut out.

    def _claim_name(self, key: str, what: str) -> str:
        return f"{self.bot}/{key}/{what}"

    async def _claim(self, key: str, what: str) -> bool:
        """Whether this is the first claim of `what` (an event kind, `ended`)
        for the mention filed under `key`, by any process on the store. An
        event kind's claim outlasts Slack's retries of the event."""
        seconds = self.bouncer.bot.ticket_seconds
        if what in MESSAGE_EVENTS:
            seconds = max(seconds, RETRIED_WITHIN)
        return await self.bouncer.store.claim(self._claim_name(key, what), round(seconds * 1000))

    @staticmethod
    def _filing(key: str, kind: str) -> str:
        """Where a mention's decision made by its `kind` event is filed."""
        return f"{key}/{kind}"

    def _unsettled(self, ticket: _Ticket, exc: StoreError) -> None:
        ticket.settle()
        log.error("bot %s: settling the ticket of %s failed: %s; its slot comes back when the "
                  "ticket lapses", self.bot, ticket.decision.message_id, exc)  # fmt: skip

    async def _listens(self, body: Mapping[str, Any], kind: str) -> bool:
        """Whether a listener of the app would run for the message's `kind`
        event (Bolt's matchers, on a copy of the request made that kind);
        True when that cannot be told."""
        listeners = getattr(self.app, "_async_listeners", None)
        event = body.get("event")
        if not isinstance(listeners, list) or not isinstance(event, dict):
            return True
        other = AsyncBoltRequest(body={**body, "event": {**event, "type": kind}},
                                 mode="socket_mode")  # fmt: skip
        resp = BoltResponse(status=200, body="")
        for listener in listeners:
            try:
                if await listener.async_matches(req=other, resp=resp):
                    return True
            except Exception:  # a matcher of the app's that needs more: it may run
                return True
        return False

    def _settling(self, ticket: _Ticket) -> bool:
        """Whether the ticket is still one to release here: nothing sent on
        it, no handling of it open, not settled."""
        return not (ticket.handlings or ticket.sent or ticket.settled)

    async def _alone(self, ticket: _Ticket) -> None:
        """A mention's ticket nothing was sent on, whose handling here ended
        and whose other event was not handled here (in this process only,
        without `replicas`: no store call)."""
        async with ticket.lock:
            if not self._settling(ticket) or len(ticket.kinds) > 1:
                return  # the other event came here meanwhile: its handling settles it
            other = _other(next(iter(ticket.kinds)))
            if ticket.first and not await self._listens(ticket.body or {}, other):
                self._release(ticket)  # no listener takes the other event: nothing to wait for
                return
            if ticket.shared is not None:
                try:
                    last = not await self._claim(ticket.shared, "ended")
                except StoreError as exc:
                    return self._unsettled(ticket, exc)
                if not self._settling(ticket):
                    return
                if last:  # the other event's handling (elsewhere) ended first
                    return self._release(ticket)
                if not ticket.first:  # the first event's, elsewhere, still runs: it releases
                    return ticket.settle()
            self._waiting.add(ticket)  # it waits for its other event
            wait = 0.0 if self._closing else self.other_event_seconds
            ticket.wait = asyncio.get_running_loop().call_later(wait, self._waited, ticket)

    def _unwait(self, ticket: _Ticket) -> None:
        """The ticket no longer waits for its other event (it came)."""
        if ticket.wait is not None:
            ticket.wait.cancel()
            ticket.wait = None
        self._waiting.discard(ticket)

    def _waited(self, ticket: _Ticket) -> None:
        ticket.wait = None
        self._waiting.discard(ticket)
        self._start(self._shut_out(ticket))

    async def _shut_out(self, ticket: _Ticket) -> None:
        """The mention's other event did not come here in time: claimed, it
        will be a repeat wherever it comes; if it came elsewhere, that
        handling releases the ticket when it ends (in one process: released)."""
        async with ticket.lock:
            if not self._settling(ticket) or len(ticket.kinds) > 1:
                return
            if ticket.shared is None:
                return self._release(ticket)
            try:
                shut = await self._claim(ticket.shared, _other(next(iter(ticket.kinds))))
            except StoreError as exc:
                return self._unsettled(ticket, exc)
            if shut:
                self._release(ticket)
            else:
                ticket.settle()

    async def _joins(self, ticket: _Ticket, kind: str) -> bool:
        """The other event of a mention decided here: whether it runs the
        listeners under its ticket (False: it was handled elsewhere, a
        repeat)."""
        assert ticket.shared is not None
        async with ticket.lock:
            waited = ticket.wait is not None  # `ended` was claimed here
            try:
                claimed = await self._claim(ticket.shared, kind)
            except StoreError:
                # decided anew (the store's error is logged then); the ticket
                # still waits for this event, and is settled when it waited
                return False
            self._unwait(ticket)
            if not claimed:
                # handled by another process; after `ended` was claimed here, it releases
                if waited and self._settling(ticket):
                    ticket.settle()
                return False
            ticket.kinds.add(kind)
            return True

    async def _filed(self, msg: Message, key: str, kind: str) -> Decision | bool:
        """The decision another process filed for the message's other event
        (it may still be deciding); True when the decision was filed for this
        kind of event (a repeat of it, decided elsewhere); False when there is
        none in time."""
        loop = asyncio.get_running_loop()
        rd = self.bouncer.bot.reply_decision
        until = loop.time() + FILED_WITHIN + (rd.timeout_seconds if rd.enabled else 0.0)
        pause = 0.01
        while True:
            try:
                other, mine = await asyncio.gather(
                    self.bouncer.shared(self._filing(key, _other(kind))),
                    self.bouncer.shared(self._filing(key, kind)),
                )
            except StoreError as exc:
                log.error("bot %s: message %s not handled: %s", self.bot, msg.id, exc)
                return False
            if mine is not None:
                return True
            if other is not None:
                return other
            if loop.time() >= until:
                log.info("bot %s: message %s was decided for its other event, but no decision "
                         "was filed in time; taken as a duplicate", self.bot, msg.id)  # fmt: skip
                return False
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.2)

    async def _give_up(self, msg: Message, key: str, kind: str) -> None:
        """This event (its kind claimed here) found no decision filed in time:
        its handling, which runs no listener, has ended all the same. Should
        the deciding process's handling have ended first (`ended` claimed),
        it left the release to this one: the ticket is released here."""
        try:
            if await self._claim(key, "ended"):
                return  # the decider's handling, when it ends, finds `ended` taken: it releases
            await self.bouncer.release(SHARED + self._filing(key, _other(kind)))
        except (UnknownTicket, SpentTicket):
            pass  # never filed (its filing failed), lapsed, sent on, or released already
        except StoreError as exc:
            log.error("bot %s: settling the ticket of %s failed: %s; its slot comes back when "
                      "the ticket lapses", self.bot, msg.id, exc)  # fmt: skip

    # -- deciding ----------------------------------------------------------------------

    async def async_process(
        self,
        *,
        req: AsyncBoltRequest,
        resp: BoltResponse,
        next: Callable[[], Awaitable[BoltResponse]],  # Bolt passes it by this name
    ) -> BoltResponse | None:
        """The middleware: a new message is decided; anything else goes on."""
        self._wrap(req.context.client)
        event = _message_event(req.body)
        if event is None:
            return await next()
        try:
            msg = from_event(event)
        except PayloadError as exc:
            log.info("bot %s: message %s passed through undecided: %s", self.bot,
                     event.get("ts", "?"), exc)  # fmt: skip
            return await next()
        if msg is None:  # an edit, a deletion: not a turn
            return await next()
        me = await self._me(req.context)
        if me is None:
            log.info("bot %s: message %s passed through undecided: the bot user is not "
                     "known", self.bot, msg.id)  # fmt: skip
            return await next()
        if me != self.bouncer.bot_id:
            if me not in self._strangers:
                self._strangers.add(me)
                log.warning("bot %s guards Slack user %s; messages for user %s pass through "
                            "undecided (one guard per bot user)", self.bot,
                            self.bouncer.bot_id, me)  # fmt: skip
            return await next()
        msg = self.threads.address(msg, me)
        if msg.author.id == me:  # its own (Bolt's IgnoringSelfEvents is off)
            if not self.bouncer.echo(msg):  # posted another way: counted now
                await self._count_own(msg)
            return await next()
        msg = await self.people.unmask(msg, event, req.context.client)
        # a mention in a channel comes as two events, which replicas of the app
        # may get one each (Slack sends no app_mention for a message in a DM)
        two = me in msg.mentions and msg.chat.kind is not ChatKind.DM
        shared = f"slack/{msg.chat.key}/{msg.id}" if two else None
        decided = await self._decided(msg, str(event["type"]), shared, req.body)
        if decided is None:
            return await req.context.ack()
        d, ticket, first = decided
        if ticket is None:  # drop
            return await req.context.ack()
        handling = _current.get()
        if handling is not None and handling.guard is self and handling.open:
            handling.ticket = ticket
            ticket.handlings += 1
        else:  # async_dispatch was replaced after guard(): nothing can release it
            log.warning("bot %s: message %s is handled outside AsyncApp.async_dispatch; its "
                        "ticket lapses unless sent on", self.bot, msg.id)  # fmt: skip
        if d.action is Action.REPLY:
            return await next()
        if first and self.warnings and d.warning:
            await self._warn(req.context.client, msg.chat, d.warning)
        return await req.context.ack()

    async def _decided(
        self, msg: Message, kind: str, shared: str | None, body: dict[str, Any]
    ) -> tuple[Decision, _Ticket | None, bool] | None:
        """The message's decision and ticket, and whether this event made it;
        None when it could not be decided (logged). The other event of a
        message decided already gets its decision (a mention's: unless that
        kind of event was handled by another process already); a repeated
        delivery is the store's to decide (duplicate). `shared`: a mention's
        key in the store, where its decision is filed for its other event."""
        key = (msg.chat.key, msg.id)
        seen = self._seen.get(key)
        if seen is not None and kind not in seen.events:
            seen.events.add(kind)
            earlier = await asyncio.shield(seen.decided)
            if earlier is None:
                seen = None  # its decision failed: this event tries again
            else:
                d, ticket = earlier
                if ticket is not None and ticket.shared is None:  # decided here, in memory
                    if ticket.settled:  # released, its wait over: a repeat (the store says so)
                        return await self._decided_anew(msg)
                    ticket.kinds.add(kind)
                    self._unwait(ticket)
                    return d, ticket, False
                if (
                    ticket is None
                    or d.action is not Action.REPLY
                    or await self._joins(ticket, kind)
                ):
                    return d, ticket, False
        mine = _Seen({kind})
        if seen is None:
            self._seen[key] = mine
            while len(self._seen) > DECIDED_REMEMBERED:
                self._seen.popitem(last=False)
        outcome: tuple[Decision, _Ticket | None, bool] | None = None
        try:
            if shared is None or not self.replicas:
                made = await self._decide(msg)
                if made is not None:
                    mention = body if shared is not None else None  # its other event may come
                    ticket = None if made.ticket is None else _Ticket(made, {kind}, body=mention)
                    outcome = (made, ticket, True)
            else:
                outcome = await self._decide_mention(msg, kind, shared, body)
        finally:
            # None: the other event decides on its own (this one was cancelled,
            # failed, or was a repeat, which says nothing of the other event)
            shown = None if outcome is None or outcome[0].reason is Reason.DUPLICATE else outcome
            if not mine.decided.done():
                mine.decided.set_result(None if shown is None else shown[:2])
        if shown is None and self._seen.get(key) is mine:
            del self._seen[key]
        return outcome

    async def _decided_anew(self, msg: Message) -> tuple[Decision, _Ticket | None, bool] | None:
        d = await self._decide(msg)
        return None if d is None else (d, None, True)

    async def _decide_mention(
        self, msg: Message, kind: str, key: str, body: dict[str, Any]
    ) -> tuple[Decision, _Ticket | None, bool] | None:
        """A mention's event: its kind claimed (or it is a repeat), then
        decided, the decision filed under `key`; should the store have
        decided the message already, this is its other event, and the
        decision another process filed is its own (without a ticket when it
        is not `reply`: the warning is the first event's to post)."""
        try:
            claimed = await self._claim(key, kind)
        except StoreError as exc:
            log.error("bot %s: message %s not handled: %s", self.bot, msg.id, exc)
            return None
        d = await self._decide(msg, self._filing(key, kind))
        if d is None:
            return None
        if d.reason is not Reason.DUPLICATE:
            ticket = None if d.ticket is None else _Ticket(d, {kind}, shared=key, body=body)
            return d, ticket, True
        if not claimed:  # this kind of event was handled before: a repeat
            return d, None, True
        earlier = await self._filed(msg, key, kind)
        if earlier is True:  # decided for this kind elsewhere: a repeat (a retry)
            return d, None, True
        if earlier is False:
            await self._give_up(msg, key, kind)
            return d, None, True
        if earlier.action is not Action.REPLY:
            return earlier, None, False
        return earlier, _Ticket(earlier, {kind}, shared=key, first=False), False

    async def _decide(self, msg: Message, shared: str | None = None) -> Decision | None:
        try:
            return await self.bouncer.decide(msg, shared=shared)
        except StoreError as exc:
            log.error("bot %s: message %s not handled: %s", self.bot, msg.id, exc)
        except Exception:
            log.exception("bot %s: deciding on message %s failed; not handled", self.bot, msg.id)
        return None

    async def _count_own(self, msg: Message) -> None:
        """Its own message, which it did not post through a guarded client:
        the store decides it (own_message) and counts it as its turn."""
        try:
            await self.bouncer.decide(msg)
        except StoreError as exc:
            log.error("bot %s: its own message %s was not counted: %s", self.bot, msg.id, exc)
        except Exception:
            log.exception("bot %s: counting its own message %s failed", self.bot, msg.id)

    async def _warn(self, client: AsyncWebClient, chat: ChatRef, text: str) -> None:
        """Post the warning in the chat (its thread for a thread), notifying
        no one; counted under the ticket by the client's api_call, like any
        message posted while handling."""
        try:
            await client.chat_postMessage(channel=chat.id, text=escape(text), thread_ts=chat.topic,
                                          parse="none", link_names=False)  # fmt: skip
        except Exception as exc:  # SlackApiError mostly; never into Bolt
            log.warning("bot %s: posting the warning in %s failed: %s", self.bot, chat.key, exc)

    # -- counting what the app posts ---------------------------------------------------

    def _wrap(self, client: AsyncWebClient) -> None:
        """Count what `client` posts: its `api_call`, through which every
        slack_sdk method goes, wrapped on the instance (once)."""
        call: _ApiCall = client.api_call
        if getattr(call, "__botbouncer__", None) is self:
            return

        async def api_call(api_method: str, **kwargs: Any) -> AsyncSlackResponse:
            if api_method not in POSTING:
                return await call(api_method, **kwargs)
            return await self._posting(call, api_method, kwargs)

        api_call.__botbouncer__ = self  # type: ignore[attr-defined]
        client.api_call = api_call  # type: ignore[method-assign]

    async def _posting(
        self, call: _ApiCall, api_method: str, kwargs: dict[str, Any]
    ) -> AsyncSlackResponse:
        """One call that posts a message. An echo of it (when the app sees
        its own messages) that arrives before Slack's answer waits for the
        count instead of being counted twice."""
        params = _params(kwargs)
        channel, thread = _text(params.get("channel")), _text(params.get("thread_ts"))
        where = None if channel is None else ChatRef("slack", channel, topic=thread)
        with self.bouncer.sending(where.key) if where is not None else nullcontext():
            answer = await call(api_method, **kwargs)
            if where is not None:  # posted: a reply there addresses the bot (not before)
                self.threads.posted(where)
            try:
                await self._count(call, api_method, answer, params)
            except StoreError as exc:
                log.error("bot %s: a message posted with %s was not counted: %s", self.bot,
                          api_method, exc)  # fmt: skip
            except Exception:
                log.exception("bot %s: counting a message posted with %s failed", self.bot,
                              api_method)  # fmt: skip
        return answer

    async def _count(
        self, call: _ApiCall, api_method: str, answer: AsyncSlackResponse, params: dict[str, Any]
    ) -> None:
        data = answer.data if isinstance(answer.data, dict) else {}
        ts, channel = _text(data.get("ts")), _text(data.get("channel"))
        if ts is None or channel is None:
            log.info("bot %s: Slack answered %s without a channel and ts; not counted",
                     self.bot, api_method)  # fmt: skip
            return
        found = data.get("message")
        message: dict[str, Any] = found if isinstance(found, dict) else {}
        thread = _text(message.get("thread_ts")) or _text(params.get("thread_ts"))
        chat = ChatRef("slack", channel, topic=thread if thread != ts else None)
        self.threads.posted(chat)
        if not self.known and await self._auth_test(call) is None:
            log.info("bot %s: message %s in %s not counted: the bot user is not known",
                     self.bot, ts, chat.key)  # fmt: skip
            return
        text = clean(_text(message.get("text")) or _text(params.get("text")))
        handling, d = _current.get(), None
        ticket = None if handling is None else handling.ticket
        if (
            handling is not None
            and handling.guard is self
            and handling.open
            and ticket is not None
            and not ticket.settled
            and ticket.decision.chat == chat.key
        ):
            d = ticket.decision
            ticket.sent += 1  # before any await: the release at the end sees it
            ticket.body = None  # nothing to release: its other event's listeners do not matter
        await count_sent(self.bouncer, d, chat.key, ts, text, log)


def guard(
    app: AsyncApp, bouncer: Bouncer, *, warnings: bool = True, replicas: bool = False
) -> SlackGuard:
    """Put `bouncer` in front of `app`'s listeners and count every message its
    clients post (see the module docstring). Call it once, right after
    creating the app: before middleware of your own, before the app runs.
    The Bouncer learns the bot user's id (`bot_id`) from Bolt's authorisation
    at the first event, or from auth.test at the first post before that.
    `warnings=False`: on `warn` nothing is posted (the listeners still do not
    see the message; its ticket is released). `replicas=True`: the app runs
    as several processes on one store, which may get a mention's two events
    one each; its decision is then shared through the store (claims, a
    filed decision: three or four more store calls a mention in a channel),
    where one process needs none (admit and sent: two)."""
    if bouncer.bot.platform != "slack":
        raise ConfigError(f"bot {bouncer.bot.name!r} is configured for platform "
                          f"{bouncer.bot.platform}, not slack: chats are counted per "
                          "platform")  # fmt: skip
    if not isinstance(app, AsyncApp):
        raise TypeError(f"botbouncer.slack guards slack_bolt's AsyncApp, not "
                        f"{type(app).__name__}")  # fmt: skip
    runner = app.listener_runner
    if not callable(getattr(runner, "run", None)) or not hasattr(
        runner, "listener_completion_handler"
    ):
        raise RuntimeError("botbouncer.slack needs slack_bolt 1.30 (its AsyncioListenerRunner)")
    if isinstance(getattr(app.async_dispatch, "__self__", None), SlackGuard):
        raise ValueError("this app is guarded already")
    g = SlackGuard(app, bouncer, warnings=warnings, replicas=replicas)
    g._install()
    return g
