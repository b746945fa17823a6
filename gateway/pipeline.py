"""Gateway.handle(): the one chokepoint every message passes (docs/architecture.md).

Local facts first (no I/O), then one atomic store call that counts, gates and
reserves; only a message that survives it reaches the backend. The slot is
taken before the first slow await and given back when nothing is sent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Any

from gateway.alerts import Alerts
from gateway.backends import Backend, context_wanted, deadline
from gateway.classifier import Classifier
from gateway.config import BotConfig
from gateway.echoes import Echoes
from gateway.inflight import InFlight
from gateway.metrics import Metrics
from gateway.model import Action, ChatKind, Decision, Message, Reason
from gateway.store import (
    AdmitRequest,
    ContextEntry,
    Limits,
    Observed,
    SentRequest,
    SentResult,
    Store,
)
from gateway.turns import Count, count_kind, format_warning, local_reason

log = logging.getLogger("botbouncer.decision")

# Something to show while the backend works, e.g. a platform's typing indicator.
Busy = Callable[[], AbstractAsyncContextManager[object]]


def log_value(text: str) -> str:
    """A field of a decision line, quoted (as a JSON string) when it holds what
    would let it read as more than one field: a space, `=`, a quote. Chats,
    ids and authors come from whoever posts to the ingress; `author=x
    action=reply` must not read as an action. (Control characters are the
    text formatter's to escape.)"""
    if text and " " not in text and "=" not in text and '"' not in text:
        return text
    return json.dumps(text, ensure_ascii=False)


def decision_line(d: Decision) -> str:
    """The text of a decision's log line (its fields also go with the record)."""
    return (f"decision bot={d.bot} chat={log_value(d.chat)} id={log_value(d.message_id)} "
            f"author={log_value(d.author)} "
            f"action={d.action._value_} reason={d.reason._value_ if d.reason else '-'} "
            f"turn={d.turn._value_} soft={d.soft} hard={d.hard}")  # fmt: skip


# How long sending a reply may take on top of the classifier's and the
# backend's deadlines (a platform's rate limiter may queue it): a turn hold
# lapses after that, so a replica that died mid-answer holds no turn for ever.
SEND_SECONDS = 60.0


def limits_for(bot: BotConfig, kind: ChatKind) -> Limits:
    """The store-side limits of a bot's policy for one kind of chat."""
    return Limits(
        soft_limit=bot.turns.soft_limit,
        hard_limit=bot.turns.hard_limit,
        max_replies=bot.rate_cap.max_replies,
        rate_window_ms=round(bot.rate_cap.window_seconds * 1000),
        rate_applies=bot.rate_cap.scope == "all" or kind is ChatKind.GROUP,
        pair_max_events=bot.pairs.max_events,
        pair_window_ms=round(bot.pairs.window_seconds * 1000),
        pair_cooldown_ms=round(bot.pairs.cooldown_seconds * 1000),
        pace_ms=round(bot.machine_pace.within_seconds * 1000),
        pace_max=bot.machine_pace.max_exchanges,
    )


def observed(msg: Message, count: Count) -> Observed:
    return Observed(msg.chat.key, msg.id, msg.author.id, msg.author.display, count, msg.text)


@dataclass(frozen=True, slots=True)
class _Setup:
    """A bot's policy and its callees, swapped as one reference on reload, so a
    message is handled start to end under one configuration."""

    bot: BotConfig
    backend: Backend | None
    classifier: Classifier | None
    trusted: frozenset[str]
    known_bots: frozenset[str]  # authors treated as bots whatever the platform says
    known_people: frozenset[str]  # and as people
    context: int  # recent messages the classifier and the backend look at
    limits: dict[ChatKind, Limits]
    hold_ms: int  # how long an answer being written holds its turn


def context_for(bot: BotConfig) -> int:
    """How many recent messages a bot's backend and reply decision look at:
    what the store must return to it (and, over every bot, keep)."""
    wanted = context_wanted(bot.backend)
    if bot.reply_decision.enabled:
        wanted = max(wanted, bot.reply_decision.context_messages)
    return wanted


def _setup(bot: BotConfig, backend: Backend | None, classifier: Classifier | None) -> _Setup:
    # a decide bot's own code answers: its ticket says how long that may take
    seconds = bot.ticket_seconds if bot.mode == "decide" else deadline(bot.backend) + SEND_SECONDS
    if classifier is not None:
        seconds += bot.reply_decision.timeout_seconds
    return _Setup(
        bot=bot,
        backend=backend,
        classifier=classifier,
        trusted=frozenset(bot.trusted_bots),
        known_bots=frozenset(bot.known_bots),
        known_people=frozenset(bot.known_people),
        context=context_for(bot),
        limits={kind: limits_for(bot, kind) for kind in ChatKind},
        hold_ms=round(seconds * 1000),
    )


class Gateway:
    """One bot's gate. Several gateways (bots, replicas) may share one store.

    `bot_id` is the author id this bot has on its platform (for HTTP and
    replay, its configured name). `dry_run` stops before the backend and keeps
    the slot as if it answered (replay). `clock` injects time in seconds.
    `inflight` tracks messages being handled so a stopping daemon can let
    them finish; `metrics` counts decisions and times the slow calls.
    """

    def __init__(
        self,
        bot: BotConfig,
        store: Store,
        backend: Backend | None = None,
        *,
        classifier: Classifier | None = None,
        bot_id: str | None = None,
        dry_run: bool = False,
        clock: Callable[[], float] | None = None,
        inflight: InFlight | None = None,
        metrics: Metrics | None = None,
        alerts: Alerts | None = None,
    ) -> None:
        self.store = store
        self.alerts = alerts
        self.bot_id = bot_id or bot.user_id or bot.name
        self.dry_run = dry_run
        self.clock = clock
        self.inflight = inflight if inflight is not None else InFlight()
        self.metrics = metrics
        self._s = _setup(bot, backend, classifier)
        # what this gateway sent, so that the platform showing it back costs no store call
        self._echoes = Echoes(self._own, self.handle, lambda: self.bot.name)

    @property
    def bot(self) -> BotConfig:
        return self._s.bot

    @property
    def backend(self) -> Backend | None:
        return self._s.backend

    @property
    def classifier(self) -> Classifier | None:
        return self._s.classifier

    def configure(
        self, bot: BotConfig, backend: Backend | None, classifier: Classifier | None
    ) -> None:
        """A reloaded policy: applies from the next message; messages being
        handled finish under the setup they started with."""
        self._s = _setup(bot, backend, classifier)

    def limits(self, kind: ChatKind) -> Limits:
        return self._s.limits[kind]

    def now_ms(self) -> int | None:
        return None if self.clock is None else round(self.clock() * 1000)

    async def handle(self, msg: Message, *, busy: Busy | None = None) -> Decision:
        """Decide on `msg`; `busy()` (e.g. a typing indicator) is entered only
        while the backend works on an answer."""
        with self.inflight.track():
            return await self._handle(msg, self._s, busy)

    def echo(self, msg: Message) -> bool:
        """Whether `msg` is this gateway's own message, which it then decides
        itself (own_message, as `sent` counted it; logged), now or once the
        send it came from is counted; False for any other message, which
        `handle` decides. The store would answer just this and learn nothing
        from the call, so none is made: a platform that shows a bot its own
        messages (Discord) costs no store call per reply."""
        return msg.author.id == self.bot_id and self._echoes.catch(msg, time.perf_counter())

    def sending(self, chat: str) -> AbstractContextManager[None]:
        """The adapter sends in `chat` (and reports each message to `sent`)
        inside this block. An own message seen meanwhile that none of these
        sends turns out to be is decided by the store when the last send in
        the chat ends."""
        return self._echoes.sending(chat)

    def _own(self, msg: Message, mine: SentResult, started: float) -> Decision:
        at = time.time() if self.clock is None else self.clock()
        own = Decision(self.bot_id, msg.id, msg.chat.key, msg.author.id, Action.DROP,
                       Reason.OWN_MESSAGE, mine.turn, mine.soft, mine.hard, at=at)  # fmt: skip
        return self._logged(own, started)

    async def _handle(self, msg: Message, s: _Setup, busy: Busy | None) -> Decision:
        started = time.perf_counter()
        mine = self._echoes.counted(msg.chat.key, msg.id) if msg.author.id == self.bot_id else None
        if mine is not None:
            return self._own(msg, mine, started)
        if s.known_bots and not msg.author.is_bot and msg.author.id in s.known_bots:
            msg = replace(msg, author=replace(msg.author, is_bot=True))
        elif s.known_people and msg.author.is_bot and msg.author.id in s.known_people:
            msg = replace(msg, author=replace(msg.author, is_bot=False))
        count = count_kind(msg, self.bot_id)
        local = local_reason(
            msg,
            self.bot_id,
            bot_messages=s.bot.bot_messages,
            trusted_bots=s.trusted,
            respond_to=s.bot.respond_to,
        )
        res = await self.store.admit(
            AdmitRequest(
                msg=observed(msg, count),
                bot=self.bot_id,
                local_reason=local,
                author_is_bot=msg.author.is_bot or msg.author.id == self.bot_id,
                limits=s.limits[msg.chat.kind],
                context=s.context,
                now_ms=self.now_ms(),
                # a dry run sends nothing, so it holds no turn
                hold_ms=0 if self.dry_run else s.hold_ms,
            )
        )
        base = Decision(
            bot=self.bot_id,
            message_id=msg.id,
            chat=msg.chat.key,
            author=msg.author.id,
            action=res.action or Action.REPLY,
            reason=res.reason,
            turn=res.turn,
            soft=res.soft,
            hard=res.hard,
            at=res.at_ms / 1000,
        )
        if res.action is Action.WARN:
            turns = s.bot.turns
            if res.warn == "soft":
                text = format_warning(turns.warn_soft, res.soft, res.limits.soft_limit)
            else:
                text = format_warning(turns.warn_hard, res.hard, res.limits.hard_limit)
            return self._logged(replace(base, warning=text), started)
        if res.action is not None:
            return self._logged(base, started)
        try:
            return await self._answer(msg, s, res.context, base, started, busy)
        except asyncio.CancelledError:
            # Stopped mid-answer (shutdown past its grace): nothing will be
            # sent, so the slot goes back, even while this task is cancelled.
            log.warning("handling %s was cancelled; its slot is released", msg.id)
            await asyncio.shield(self._silent(base, Reason.BACKEND_ERROR, started))
            raise

    async def _answer(
        self,
        msg: Message,
        s: _Setup,
        context: list[ContextEntry],
        base: Decision,
        started: float,
        busy: Busy | None,
    ) -> Decision:
        """Every deterministic rule passed and the slot is held: now the
        expensive steps, at most one classifier call, then the backend."""
        if s.classifier is not None and s.classifier.applies(msg, self.bot_id):
            t0 = time.perf_counter()
            verdict = await s.classifier.decide(msg, context)
            if self.metrics is not None:
                self.metrics.classifier_calls.labels(verdict.result).inc()
                self.metrics.classifier_seconds.observe(time.perf_counter() - t0)
            if not verdict.reply:
                return await self._silent(base, Reason.CLASSIFIER_SKIP, started)
        if self.dry_run or s.backend is None:
            return self._logged(base, started)
        t0 = time.perf_counter()
        try:
            async with busy() if busy is not None else nullcontext():
                replies = [r for r in await s.backend.reply(msg, context) if r.strip()]
        except Exception as exc:  # any backend failure: silence, not a crash
            log.warning("backend %s failed for %s: %s", s.backend.name, msg.id, exc)
            return await self._silent(base, Reason.BACKEND_ERROR, started)
        finally:
            if self.metrics is not None:
                self.metrics.backend_seconds.observe(time.perf_counter() - t0)
        if not replies:
            return await self._silent(base, Reason.BACKEND_EMPTY, started)
        return self._logged(base.with_replies(tuple(replies)), started)

    async def withdraw(self, decision: Decision, reason: Reason) -> Decision:
        """A reply decided earlier will not be sent after all (a decide-mode
        bot released its ticket): the slot and the hold go back, logged."""
        return await self._silent(replace(decision, ticket=None), reason, time.perf_counter())

    async def _silent(self, base: Decision, reason: Reason, started: float) -> Decision:
        """Nothing will be sent: give the slot back and say why."""
        decision = replace(base, action=Action.DROP, reason=reason)
        # Also without a slot (a DM under scope `groups`) the call files the log entry.
        await self.store.release(
            decision.chat, self.bot_id, decision.message_id, decision.log_entry()
        )
        return self._logged(decision, started)

    async def sent(
        self, decision: Decision, message_id: str, text: str, *, first: bool = True
    ) -> SentResult:
        """The adapter sent `text` as `message_id`: count it as this bot's turn.

        The first message sent for a decision also files the decision in the
        chat's log, so an answered message costs two store calls in all.
        """
        own = Observed(decision.chat, message_id, self.bot_id, self.bot.name, Count.BOT, text)
        # the first message of an answer fills the turn its admit held
        answered = decision.message_id if first and decision.action is Action.REPLY else ""
        # its echo, if it came already or comes meanwhile, waits for this count
        with self._echoes.counting(decision.chat, message_id) as answer:
            counted = await self.store.record_sent(
                SentRequest(
                    msg=own,
                    bot=self.bot_id,
                    limits=self.limits(ChatKind.GROUP),
                    log=decision.log_entry() if first else None,
                    now_ms=self.now_ms(),
                    answered=answered,
                    answered_author=decision.author if answered else "",
                )
            )
            answer(counted)
        return counted

    async def note(self, chat: str, message_id: str, text: str) -> None:
        """The adapter posted `text` outside the conversation (an admin
        command's answer): file its id so that no gateway on this store counts
        it as a turn or answers it, however it is observed later."""
        aside = Observed(chat, message_id, self.bot_id, self.bot.name, Count.NONE, text)
        await self.store.record_sent(
            SentRequest(
                msg=aside,
                bot=self.bot_id,
                limits=self.limits(ChatKind.GROUP),
                log=None,
                now_ms=self.now_ms(),
            )
        )

    async def unsent(self, decision: Decision, error: str) -> None:
        """The adapter could not send the reply: release the slot, log it."""
        log.warning("sending the reply to %s failed: %s", decision.message_id, error)
        failed = replace(decision, action=Action.DROP, reason=Reason.BACKEND_ERROR, replies=())
        await self.store.release(
            decision.chat, self.bot_id, decision.message_id, failed.log_entry()
        )

    def _logged(self, decision: Decision, started: float) -> Decision:
        """Count the decision and log its line: at INFO, except the echo of a
        bot's own reply (own_message), which is at DEBUG: the reply was
        logged when it was decided, and its echo would double the log."""
        seconds = time.perf_counter() - started
        if self.metrics is not None:
            self.metrics.decision(decision, self._s.bot.platform, seconds)
        if self.alerts is not None and decision.reason is not None:
            self.alerts.decision(decision, self._s.bot)  # queued, never awaited
        level = logging.DEBUG if decision.reason is Reason.OWN_MESSAGE else logging.INFO
        if not log.isEnabledFor(level):
            return decision
        fields: dict[str, Any] = decision.as_dict()
        fields["ms"] = round(seconds * 1000, 3)
        # makeRecord + handle: Logger.info would walk the stack for a caller
        # no format shows, a tenth of the line's cost; the text is made here,
        # once (no arguments for each handler's filter and formatter to apply)
        log.handle(log.makeRecord(log.name, level, __file__, 0, decision_line(decision), (),
                                  None, extra={"decision": fields}))  # fmt: skip
        return decision
