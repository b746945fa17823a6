"""Gateway.handle(): the one chokepoint every message passes (DESIGN §2).

Local facts first (no I/O), then one atomic store call that counts, gates and
reserves; only a message that survives it reaches the backend. The slot is
taken before the first slow await and given back when nothing is sent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gateway.backends import Backend, context_wanted
from gateway.classifier import Classifier
from gateway.config import BotConfig
from gateway.model import Action, ChatKind, Decision, Message, Reason
from gateway.store import AdmitRequest, Limits, Observed, SentRequest, SentResult, Store
from gateway.turns import Count, count_kind, format_warning, local_reason

log = logging.getLogger("botbouncer.decision")


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
    )


def observed(msg: Message, count: Count) -> Observed:
    return Observed(msg.chat.key, msg.id, msg.author.id, msg.author.display, count, msg.text)


class Gateway:
    """One bot's gate. Several gateways (bots, replicas) may share one store.

    `bot_id` is the author id this bot has on its platform (for HTTP and
    replay, its configured name). `dry_run` stops before the backend and keeps
    the slot as if it answered (replay). `clock` injects time in seconds.
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
    ) -> None:
        self.bot = bot
        self.store = store
        self.backend = backend
        self.classifier = classifier
        self.bot_id = bot_id or bot.name
        self.dry_run = dry_run
        self.clock = clock
        self._trusted = frozenset(bot.trusted_bots)
        # Recent context the store returns with an admitted message: what the
        # classifier and the backend will look at.
        wanted = [context_wanted(bot.backend)]
        if classifier is not None:
            wanted.append(bot.reply_decision.context_messages)
        self._context = max(wanted)
        self._limits = {kind: limits_for(bot, kind) for kind in ChatKind}

    def _now_ms(self) -> int | None:
        return None if self.clock is None else round(self.clock() * 1000)

    async def handle(self, msg: Message) -> Decision:
        started = time.perf_counter()
        count = count_kind(msg, self.bot_id)
        local = local_reason(
            msg,
            self.bot_id,
            bot_messages=self.bot.bot_messages,
            trusted_bots=self._trusted,
            respond_to=self.bot.respond_to,
        )
        res = await self.store.admit(
            AdmitRequest(
                msg=observed(msg, count),
                bot=self.bot_id,
                local_reason=local,
                author_is_bot=msg.author.is_bot or msg.author.id == self.bot_id,
                limits=self._limits[msg.chat.kind],
                context=self._context,
                now_ms=self._now_ms(),
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
            turns = self.bot.turns
            if res.warn == "soft":
                text = format_warning(turns.warn_soft, res.soft, res.limits.soft_limit)
            else:
                text = format_warning(turns.warn_hard, res.hard, res.limits.hard_limit)
            return self._logged(replace(base, warning=text), started)
        if res.action is not None:
            return self._logged(base, started)
        # Only now, with every deterministic rule passed and the slot held, the
        # expensive steps: at most one classifier call, then the backend.
        if self.classifier is not None and self.classifier.applies(msg):
            verdict = await self.classifier.decide(msg, res.context)
            if not verdict.reply:
                return await self._silent(base, Reason.CLASSIFIER_SKIP, started)
        if self.dry_run or self.backend is None:
            return self._logged(base, started)

        try:
            replies = [r for r in await self.backend.reply(msg, res.context) if r.strip()]
        except Exception as exc:  # any backend failure: silence, not a crash
            log.warning("backend %s failed for %s: %s", self.backend.name, msg.id, exc)
            return await self._silent(base, Reason.BACKEND_ERROR, started)
        if not replies:
            return await self._silent(base, Reason.BACKEND_EMPTY, started)
        return self._logged(replace(base, replies=tuple(replies)), started)

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
        return await self.store.record_sent(
            SentRequest(
                msg=own,
                bot=self.bot_id,
                limits=self._limits[ChatKind.GROUP],
                log=decision.log_entry() if first else None,
                now_ms=self._now_ms(),
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
        if not log.isEnabledFor(logging.INFO):
            return decision
        fields: dict[str, Any] = decision.as_dict()
        fields["ms"] = round((time.perf_counter() - started) * 1000, 3)
        log.info(
            "decision bot=%s chat=%s id=%s author=%s action=%s reason=%s turn=%s soft=%d "
            "hard=%d",
            decision.bot, decision.chat, decision.message_id, decision.author,
            decision.action.value, decision.reason.value if decision.reason else "-",
            decision.turn.value, decision.soft, decision.hard,
            extra={"decision": fields},
        )  # fmt: skip
        return decision
