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
  which nothing was sent is then released.
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
  turn limits hold in the thread). A post in a thread also
  marks the thread as one the bot is in (`Threads`). A failure to count is
  logged: the message was posted, and the app's code is told so. `api_call`
  rather than `say` (listeners post with `client` too) or the HTTP session
  (shared with every other call, and below slack_sdk's retries of a 429,
  which post once): one place that sees each post once, with its answer.

Slack delivers a message twice when the app subscribes to both `message`
and `app_mention` events: the first event to arrive is decided, the other one
gets the same decision (the same ticket) without a store call; should the
first one's listeners have ended with nothing posted before the other event
arrived, the ticket was released, and what the other's listeners post is
counted as the bot's own turn. A delivery
Slack repeats (a retry, a redelivered envelope) carries the same `ts` and is
decided `duplicate` by the store: its listeners do not run again. A message
the guard cannot read (no channel, ts or author) passes through undecided,
with an INFO line, as Bolt would hand it on; edits, deletions and every other
event pass through untouched. When the store is unreachable (`StoreError`)
the message is acknowledged, no listener runs, and an ERROR line says so (a
chat where bots loop is exactly where failing open would hurt; a person can
ask again).

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

The Bouncer is the caller's to close (`async with Bouncer(...)`, after the
Socket Mode handler closed); `SlackGuard.idle()` waits until the requests
received so far are handled.
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
from botbouncer.bouncer import Bouncer
from gateway.config import ConfigError
from gateway.model import Action, ChatRef, Decision, Message
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


# AsyncWebClient.api_call(api_method, *, http_verb=..., params=..., data=..., json=..., ...)
_ApiCall = Callable[..., Awaitable[AsyncSlackResponse]]


@dataclass(eq=False)
class _Ticket:
    """A `reply` or `warn` decision and what was sent on it; one per
    message, shared by its events (message and app_mention)."""

    decision: Decision
    handlings: int = 0  # requests of the message still being handled
    sent: int = 0  # messages counted under it
    settled: bool = False  # released: later posts are the bot's own turns


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

    def __init__(self, app: AsyncApp, bouncer: Bouncer, *, warnings: bool) -> None:
        self.app = app
        self.bouncer = bouncer
        self.warnings = warnings
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

    async def idle(self) -> None:
        """Until every request received so far is handled: its listeners
        ended, its ticket sent on or released (tests; before closing the
        Bouncer)."""
        while self._open or self._tasks:
            self._quiet.clear()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            else:
                await self._quiet.wait()

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
        on (by any event of its message) is released."""
        self._open.discard(handling)
        ticket = handling.ticket
        if ticket is not None:
            ticket.handlings -= 1
            if ticket.handlings == 0 and ticket.sent == 0 and not ticket.settled:
                ticket.settled = True
                task = asyncio.ensure_future(release(self.bouncer, ticket.decision, log))
                self._tasks.add(task)
                task.add_done_callback(self._released)
        self._maybe_quiet()

    def _released(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._maybe_quiet()

    def _maybe_quiet(self) -> None:
        if not self._open and not self._tasks:
            self._quiet.set()

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
        decided = await self._decided(msg, str(event["type"]))
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
        self, msg: Message, event_type: str
    ) -> tuple[Decision, _Ticket | None, bool] | None:
        """The message's decision and ticket, and whether this event made it;
        None when it could not be decided (logged). The other event of a
        message decided already gets its decision; a repeated delivery is
        the store's to decide (duplicate)."""
        key = (msg.chat.key, msg.id)
        seen = self._seen.get(key)
        if seen is not None and event_type not in seen.events:
            seen.events.add(event_type)
            earlier = await asyncio.shield(seen.decided)
            if earlier is not None:
                return earlier[0], earlier[1], False
            seen = None  # its decision failed: this event tries again
        mine = _Seen({event_type})
        if seen is None:
            self._seen[key] = mine
            while len(self._seen) > DECIDED_REMEMBERED:
                self._seen.popitem(last=False)
        outcome: tuple[Decision, _Ticket | None] | None = None
        try:
            d = await self._decide(msg)
            if d is not None:
                outcome = (d, None if d.ticket is None else _Ticket(d))
        finally:  # cancelled too: the other event then decides on its own
            if not mine.decided.done():
                mine.decided.set_result(outcome)
        if outcome is None:
            if self._seen.get(key) is mine:
                del self._seen[key]
            return None
        return outcome[0], outcome[1], True

    async def _decide(self, msg: Message) -> Decision | None:
        try:
            return await self.bouncer.decide(msg)
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
        if where is not None:
            self.threads.posted(where)  # a reply there addresses the bot at once
        with self.bouncer.sending(where.key) if where is not None else nullcontext():
            answer = await call(api_method, **kwargs)
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
        await count_sent(self.bouncer, d, chat.key, ts, text, log)


def guard(app: AsyncApp, bouncer: Bouncer, *, warnings: bool = True) -> SlackGuard:
    """Put `bouncer` in front of `app`'s listeners and count every message its
    clients post (see the module docstring). Call it once, right after
    creating the app: before middleware of your own, before the app runs.
    The Bouncer learns the bot user's id (`bot_id`) from Bolt's authorisation
    at the first event, or from auth.test at the first post before that.
    `warnings=False`: on `warn` nothing is posted (the listeners still do not
    see the message; its ticket is released)."""
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
    g = SlackGuard(app, bouncer, warnings=warnings)
    g._install()
    return g
