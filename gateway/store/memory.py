"""The embedded store: one process, no I/O, atomic because nothing in it awaits.

It mirrors gateway/store/lua/*.lua step for step; tests/store/ runs the same
contract suite against both.

Unlike Redis it has no maxmemory, and the ingress that feeds it takes no
token: past `max_chats` (store.max_chats) the least recently used chat is
forgotten, as a Redis under `volatile-lru` would, and a warning says how many,
at most once a minute. A chat is kept compact for the same reason: measured
with tracemalloc over 50,000 chats of four messages, 6.3 KB a chat with a
deque per log and context, a set per dedupe record, a dict per log entry and
per chat; 3.1 KB with lists, flat tuples and slots (at its bounds - 50
decisions, 128 dedupe ids, full context - 105 KB then, 53 KB now).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from time import monotonic
from typing import Any

from gateway import defaults
from gateway.model import LATE_TURN_REASONS, TURN_REASONS, Action, Decision, Reason, Turn
from gateway.store.base import (
    CONTEXT_TEXT_CHARS,
    COUNT_CODES,
    DECISION_LOG_SIZE,
    DEDUPE_ENTRIES,
    PACE_SWEEP_AT,
    AdmitRequest,
    AdmitResult,
    ChatStatus,
    ContextEntry,
    Limits,
    Observed,
    Overrides,
    SentRequest,
    SentResult,
    hold_name,
    pace_name,
    pair_name,
)
from gateway.store.tickets import MemoryTickets
from gateway.turns import Count, verdict

log = logging.getLogger("botbouncer.store")

WARN_EVERY = 60.0  # seconds between warnings that chats were forgotten
SWEEP_EVERY = 4096  # store calls between sweeps for chats that hold nothing live
# Chats one store call looks at while a sweep is under way: a sweep of the
# whole store in one call held the event loop 0.3 s at 100,000 chats.
SWEEP_STEP = 64
MAX_CLAIMS = 100_000  # alert claims held (gateway/alerts.py): ~10 MB at most

_NO_OVERRIDES = Overrides()  # frozen: one for every chat that has none
# A decision log entry is kept as the tuple of its values when it has these
# keys in this order (every entry the pipeline writes): a dict of nine costs
# 2.5 times as much.
_LOG_KEYS = tuple(Decision("", "", "", "", Action.DROP, None, Turn.NONE, 0, 0).log_entry())
_LogEntry = tuple[Any, ...] | dict[str, Any]
# A dedupe record, one flat tuple: (kind, soft, hard) as counted, then the bots
# that handled the message (nearly always one; a set would cost 216 bytes, a
# record of three objects 100 more than one).
_Record = tuple[Any, ...]


def _pack(entry: dict[str, Any]) -> _LogEntry:
    return tuple(entry.values()) if tuple(entry) == _LOG_KEYS else entry


def _unpack(entry: _LogEntry) -> dict[str, Any]:
    return dict(zip(_LOG_KEYS, entry, strict=True)) if isinstance(entry, tuple) else entry


@dataclass(slots=True, eq=False)
class _Chat:
    exists: bool = False  # turn state exists (a human in an unknown chat creates none)
    soft: int = 0
    hard: int = 0
    epoch: int = 0  # bumped by every reset: voids spoke marks and warn claims
    last: str | None = None  # author of the previous bot turn
    spoke: dict[str, int] = field(default_factory=dict)
    claims: dict[str, int] = field(default_factory=dict)
    # message id -> its dedupe record, oldest first (dicts keep insertion order)
    ids: dict[str, _Record] = field(default_factory=dict)
    windows: dict[str, list[int]] = field(default_factory=dict)
    cooldowns: dict[str, int] = field(default_factory=dict)
    rate: dict[str, dict[str, int]] = field(default_factory=dict)
    holds: dict[str, int] = field(default_factory=dict)  # hold_name -> when it lapses
    # machine pace, per (bot, person): "s:" when the bot last answered them,
    # "f:" their answers in a row that came faster than limits.pace_ms
    pace: dict[str, int] = field(default_factory=dict)
    # Lists, oldest first: a deque costs 600 bytes before its first entry.
    context: list[ContextEntry] = field(default_factory=list)
    log: list[_LogEntry] = field(default_factory=list)
    state_expires: int = 0
    paused: bool = False
    overrides: Overrides = _NO_OVERRIDES
    settings_expires: int = 0

    def forget_state(self) -> None:
        """What the state TTL covers; settings, rate, pair windows and holds have their own."""
        self.exists, self.soft, self.hard, self.epoch, self.last = False, 0, 0, 0, None
        self.spoke, self.claims, self.ids = {}, {}, {}
        self.context, self.log = [], []
        self.state_expires = 0


class MemoryStore:
    kind = "memory"

    def __init__(
        self,
        *,
        state_ttl_seconds: float = defaults.STATE_TTL_SECONDS,
        settings_ttl_seconds: float = defaults.SETTINGS_TTL_SECONDS,
        context_size: int = defaults.CONTEXT_MESSAGES,
        dedupe_entries: int = DEDUPE_ENTRIES,
        max_chats: int = defaults.MAX_CHATS,
    ) -> None:
        # least recently used first
        self._chats: OrderedDict[str, _Chat] = OrderedDict()
        self._state_ttl = int(state_ttl_seconds * 1000)
        self._settings_ttl = int(settings_ttl_seconds * 1000)
        self._context_size = context_size
        self._dedupe = dedupe_entries
        self.max_chats = max_chats
        self._ops = 0
        self._unswept: list[str] = []  # chats the sweep under way has yet to look at
        self._evicted = 0  # forgotten before they expired, since the last warning
        self._warned_at = -float("inf")
        self._tickets: MemoryTickets[str] = MemoryTickets()
        # name -> (value, lapses at ms), least recently set first: a
        # platform's read position, and the LLM proxy's per session and per
        # answer, so bounded like the chats and lapsing with the state TTL.
        self._cursors: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._claims: OrderedDict[str, int] = OrderedDict()  # name -> until (ms)

    # -- plumbing ---------------------------------------------------------

    def _now(self, now_ms: int | None) -> int:
        return int(time.time() * 1000) if now_ms is None else now_ms

    def _chat(self, key: str, now: int | None) -> _Chat:
        """The chat's state; with `now`, first drop what a TTL would have dropped.

        Admin calls pass no time: they must not expire state that admits wrote
        under an injected clock.
        """
        chats = self._chats
        if now is not None:
            self._ops += 1
            # before the lookup: the chat about to be used is never swept away
            if self._unswept or self._ops % SWEEP_EVERY == 0:
                self._sweep(now)
        chat = chats.get(key)
        if chat is None:
            chat = chats[key] = _Chat()
            if len(chats) > self.max_chats:
                self._evict(self._now(now))
        else:
            chats.move_to_end(key)
            if now is not None:
                self._expire(chat, now)
        return chat

    def _expire(self, chat: _Chat, now: int) -> None:
        """What a Redis TTL would have removed by now."""
        if chat.state_expires and chat.state_expires <= now:
            chat.forget_state()
        if chat.settings_expires and chat.settings_expires <= now:
            chat.paused, chat.overrides, chat.settings_expires = False, _NO_OVERRIDES, 0

    def _sweep(self, now: int) -> None:
        """Forget chats that hold nothing live any more, so memory stays flat:
        SWEEP_STEP of them a call, until the sweep has looked at every chat."""
        unswept, chats = self._unswept, self._chats
        if not unswept:
            unswept.extend(chats)
        for _ in range(min(SWEEP_STEP, len(unswept))):
            key = unswept.pop()
            chat = chats.get(key)
            if chat is not None and self._idle(chat, now):
                del chats[key]
        if not unswept:
            self._warn()  # evictions since the last warning are told here

    def _evict(self, now: int) -> None:
        """Past max_chats: the least recently used chats go."""
        while len(self._chats) > self.max_chats:
            _, chat = self._chats.popitem(last=False)
            if not self._idle(chat, now):  # an idle one was as good as gone
                self._evicted += 1
        self._warn()

    def _warn(self) -> None:
        now = monotonic()
        if self._evicted and now - self._warned_at >= WARN_EVERY:
            n = self._evicted
            log.warning(
                "memory store: forgot %d chat%s (the least recently used, before their TTL) "
                "to stay within store.max_chats=%d; raise it or use a Redis store",
                n, "" if n == 1 else "s", self.max_chats,
            )  # fmt: skip
            self._evicted, self._warned_at = 0, now

    def _idle(self, chat: _Chat, now: int) -> bool:
        state_gone = not chat.state_expires or chat.state_expires <= now
        settings_gone = not chat.settings_expires or chat.settings_expires <= now
        rate_gone = all(not w or max(w.values()) <= now - 3_600_000 for w in chat.rate.values())
        pairs_gone = all(t <= now for t in chat.cooldowns.values()) and all(
            not w or w[-1] <= now - 3_600_000 for w in chat.windows.values()
        )
        holds_gone = all(t <= now for t in chat.holds.values())
        return state_gone and settings_gone and rate_gone and pairs_gone and holds_gone

    def _remember(
        self, chat: _Chat, msg_id: str, rec: tuple[str, int, int], bot: str | None
    ) -> None:
        ids = chat.ids
        ids[msg_id] = rec if bot is None else (*rec, bot)
        while len(ids) > self._dedupe:
            del ids[next(iter(ids))]

    def _touch_state(self, chat: _Chat, now: int) -> None:
        chat.state_expires = now + self._state_ttl

    def _touch_settings(self, chat: _Chat, now: int) -> None:
        if chat.paused or chat.overrides.as_dict():
            chat.settings_expires = now + self._settings_ttl

    # -- the counting half, shared by admit and record_sent ---------------

    def _count(
        self,
        chat: _Chat,
        obs: Observed,
        limits: Limits,
        now: int,
        bot: str | None,
        answered: str | None,
    ) -> _Record:
        """Count once per id; `bot` (if any) is marked as having handled it.
        A new bot turn fills a hold: `answered` ("" unknown, None none)."""
        seen = chat.ids.get(obs.message_id)
        if seen is not None:
            if bot is not None and bot not in seen[3:]:
                chat.ids[obs.message_id] = (*seen, bot)  # keeps its place
            return seen
        if obs.count is Count.BOT:
            if answered is not None:
                self._fill_hold(chat, obs.author, answered)
            chat.exists = True
            chat.soft += 1
            chat.hard += 1
            chat.spoke[obs.author] = chat.epoch
            if chat.last is not None and chat.last != obs.author:
                self._exchange(chat, pair_name(obs.author, chat.last), limits, now)
            chat.last = obs.author
        elif obs.count is Count.RESET and chat.exists:
            chat.soft = chat.hard = 0
            chat.epoch += 1
        rec = (COUNT_CODES[obs.count], chat.soft, chat.hard)
        self._remember(chat, obs.message_id, rec, bot)
        if obs.count is not Count.NONE and self._context_size > 0:
            chat.context.append(
                ContextEntry(
                    obs.message_id,
                    obs.author,
                    obs.name or obs.author,
                    obs.count is Count.BOT,
                    obs.text[:CONTEXT_TEXT_CHARS],
                )
            )
            if len(chat.context) > self._context_size + 1:
                del chat.context[: len(chat.context) - self._context_size - 1]
        self._touch_state(chat, now)
        return rec

    @staticmethod
    def _fill_hold(chat: _Chat, author: str, answered: str) -> None:
        """The hold for the answered message, else the author's oldest (its
        reply was observed by another bot before it was reported sent)."""
        if answered and chat.holds.pop(answered, None) is not None:
            return
        prefix = hold_name(author)
        mine = [(t, h) for h, t in chat.holds.items() if h.startswith(prefix)]
        if mine:
            del chat.holds[min(mine)[1]]

    @staticmethod
    def _holds_ahead(chat: _Chat, now: int) -> int:
        return sum(1 for t in chat.holds.values() if t > now)

    def _exchange(self, chat: _Chat, pair: str, limits: Limits, now: int) -> None:
        window = [t for t in chat.windows.get(pair, ()) if t > now - limits.pair_window_ms]
        window.append(now)
        chat.windows[pair] = window[-(limits.pair_max_events + 1) :]
        if len(window) > limits.pair_max_events:
            chat.cooldowns[pair] = now + limits.pair_cooldown_ms

    @staticmethod
    def _turn(rec: _Record, limits: Limits) -> Turn:
        kind, soft, hard = rec[0], rec[1], rec[2]
        if kind == "b":
            return verdict(soft, hard, limits.soft_limit, limits.hard_limit)
        return Turn.RESET if kind == "r" else Turn.NONE

    # -- the Store protocol -----------------------------------------------

    async def admit(self, req: AdmitRequest) -> AdmitResult:
        now = self._now(req.now_ms)
        obs = req.msg
        chat = self._chat(obs.chat, now)
        limits = chat.overrides.apply(req.limits)

        def result(
            action: Action | None,
            reason: Reason | None,
            turn: Turn,
            soft: int,
            hard: int,
            warn: str | None = None,
            reserved: bool = False,
            context: list[ContextEntry] | None = None,
        ) -> AdmitResult:
            if action is not None:
                entry = Decision(req.bot, obs.message_id, obs.chat, obs.author, action, reason,
                                 turn, soft, hard, at=now / 1000)  # fmt: skip
                _log(chat, entry.log_entry())
            return AdmitResult(
                turn, soft, hard, action, reason, warn, limits, reserved, now, context or []
            )

        seen = chat.ids.get(obs.message_id)
        if seen is not None and req.bot in seen[3:]:
            # counted nothing now: the chat's counters as they are
            return result(Action.DROP, Reason.DUPLICATE, Turn.NONE, chat.soft, chat.hard)
        rec = self._count(chat, obs, limits, now, req.bot, "")
        soft: int = rec[1]
        hard: int = rec[2]
        turn = self._turn(rec, limits)
        self._touch_settings(chat, now)

        local = req.local_reason
        if local in (Reason.OWN_MESSAGE, Reason.SYSTEM_MESSAGE):
            return result(Action.DROP, local, turn, soft, hard)
        if not chat.paused and turn in (Turn.SOFT_LIMIT, Turn.HARD_LIMIT):
            threshold = "soft" if turn is Turn.SOFT_LIMIT else "hard"
            claim = f"{threshold}:{limits.soft_limit if threshold == 'soft' else limits.hard_limit}"
            if chat.spoke.get(req.bot) == chat.epoch and chat.claims.get(claim) != chat.epoch:
                chat.claims[claim] = chat.epoch
                return result(Action.WARN, TURN_REASONS[turn], turn, soft, hard, warn=threshold)
        if local is not None:
            return result(Action.DROP, local, turn, soft, hard)
        if chat.paused:
            return result(Action.DROP, Reason.PAUSED, turn, soft, hard)
        if not req.author_is_bot and rec[0] == "r" and limits.pace_ms > 0:
            who = pace_name(req.bot, obs.author)
            last = chat.pace.get("s:" + who)
            if last is not None and now - last < limits.pace_ms:
                fast = chat.pace["f:" + who] = chat.pace.get("f:" + who, 0) + 1
                if fast > limits.pace_max:
                    return result(Action.DROP, Reason.MACHINE_PACE, turn, soft, hard)
            else:
                chat.pace.pop("f:" + who, None)
        if rec[0] == "b" and turn is not Turn.OK:
            return result(Action.DROP, TURN_REASONS[turn], turn, soft, hard)
        if rec[0] == "b" and seen is not None:  # counted earlier: where is the chat now?
            now_turn = verdict(chat.soft, chat.hard, limits.soft_limit, limits.hard_limit)
            if now_turn is not Turn.OK:
                return result(Action.DROP, LATE_TURN_REASONS[now_turn], turn, soft, hard)
        if req.author_is_bot and chat.cooldowns.get(pair_name(obs.author, req.bot), 0) > now:
            return result(Action.DROP, Reason.PAIR_COOLDOWN, turn, soft, hard)
        if rec[0] == "b":  # answers other bots are writing come first
            ahead = self._holds_ahead(chat, now)
            then_turn = verdict(chat.soft + ahead, chat.hard + ahead, limits.soft_limit,
                                limits.hard_limit)  # fmt: skip
            if then_turn is not Turn.OK:
                return result(Action.DROP, LATE_TURN_REASONS[then_turn], turn, soft, hard)
        reserved = False
        if limits.rate_applies:
            window = chat.rate.setdefault(req.bot, {})
            _prune_window(window, now - limits.rate_window_ms)
            if len(window) >= limits.max_replies:
                return result(Action.DROP, Reason.RATE_CAPPED, turn, soft, hard)
            _reserve(window, obs.message_id, now)
            reserved = True
        if req.hold_ms > 0:
            chat.holds = {h: t for h, t in chat.holds.items() if t > now}
            chat.holds[hold_name(req.bot, obs.message_id)] = now + req.hold_ms
        context = [e for e in chat.context if e.id != obs.message_id][-req.context :]
        return result(
            None,
            None,
            turn,
            soft,
            hard,
            reserved=reserved,
            context=context if req.context > 0 else [],
        )

    async def record_sent(self, req: SentRequest) -> SentResult:
        now = self._now(req.now_ms)
        chat = self._chat(req.msg.chat, now)
        limits = chat.overrides.apply(req.limits)
        answered = hold_name(req.bot, req.answered) if req.answered else None
        rec = self._count(chat, req.msg, limits, now, None, answered)
        if answered and req.answered_author and limits.pace_ms > 0:
            field = "s:" + pace_name(req.bot, req.answered_author)
            new = field not in chat.pace
            chat.pace[field] = now
            if new and len(chat.pace) > PACE_SWEEP_AT:
                _sweep_pace(chat, now, limits.pace_ms)
        if req.log is not None:
            _log(chat, req.log)
        return SentResult(self._turn(rec, limits), rec[1], rec[2])

    async def release(
        self, chat: str, bot: str, message_id: str, log: dict[str, Any] | None
    ) -> None:
        state = self._chat(chat, None)
        state.rate.get(bot, {}).pop(message_id, None)
        state.holds.pop(hold_name(bot, message_id), None)
        if log is not None:
            _log(state, log)

    async def issue_ticket(
        self, ticket: str, record: str, ttl_ms: int, now_ms: int | None = None
    ) -> None:
        self._tickets.issue(ticket, record, ttl_ms, now_ms)

    async def spend_ticket(
        self, ticket: str, how: str, now_ms: int | None = None
    ) -> tuple[str, str] | None:
        return self._tickets.spend(ticket, how, now_ms)

    async def status(
        self, chat: str, bot: str, limits: Limits, now_ms: int | None = None
    ) -> ChatStatus:
        now = self._now(now_ms)
        state = self._chat(chat, now)
        eff = state.overrides.apply(limits)
        window = state.rate.get(bot, {})
        return ChatStatus(
            chat=chat,
            soft=state.soft,
            hard=state.hard,
            turn=verdict(state.soft, state.hard, eff.soft_limit, eff.hard_limit),
            paused=state.paused,
            overrides=state.overrides,
            limits=eff,
            pair_cooldowns={
                p: (t - now) / 1000 for p, t in sorted(state.cooldowns.items()) if t > now
            },
            rate_used=sum(1 for t in window.values() if t > now - eff.rate_window_ms),
            rate_max=eff.max_replies,
        )

    async def reset(self, chat: str) -> None:
        state = self._chat(chat, None)
        if state.exists:
            state.soft = state.hard = 0
            state.epoch += 1
        state.windows.clear()
        state.cooldowns.clear()
        state.pace.clear()

    async def set_paused(self, chat: str, paused: bool) -> None:
        now = self._now(None)
        state = self._chat(chat, None)
        state.paused = paused
        self._touch_settings(state, now)

    async def set_overrides(self, chat: str, overrides: Overrides, merge: bool = False) -> None:
        now = self._now(None)
        state = self._chat(chat, None)
        state.overrides = replace(state.overrides, **overrides.as_dict()) if merge else overrides
        self._touch_settings(state, now)

    async def decisions(self, chat: str, limit: int = DECISION_LOG_SIZE) -> list[dict[str, Any]]:
        state = self._chats.get(chat)
        if state is None:
            return []
        return [_unpack(entry) for entry in state.log[::-1][:limit]]

    async def get_cursor(self, name: str) -> str | None:
        held = self._cursors.get(name)
        if held is None:
            return None
        if held[1] <= self._now(None):
            del self._cursors[name]
            return None
        return held[0]

    async def set_cursor(self, name: str, value: str) -> None:
        now = self._now(None)
        self._cursors[name] = (value, now + self._state_ttl)
        self._cursors.move_to_end(name)
        while len(self._cursors) > self.max_chats:  # the least recently set first
            self._cursors.popitem(last=False)

    async def claim(self, name: str, ttl_ms: int) -> bool:
        now = self._now(None)
        until = self._claims.get(name)
        if until is not None and until > now:
            return False
        self._claims[name] = now + ttl_ms
        self._claims.move_to_end(name)
        while len(self._claims) > MAX_CLAIMS:  # the oldest first: most have lapsed
            self._claims.popitem(last=False)
        return True

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def chats(self) -> int:
        """How many chats hold state (for memory benchmarks)."""
        return len(self._chats)


def _log(chat: _Chat, entry: dict[str, Any]) -> None:
    """Keep the newest DECISION_LOG_SIZE entries, oldest first."""
    chat.log.append(_pack(entry))
    if len(chat.log) > DECISION_LOG_SIZE:
        del chat.log[0]


def _sweep_pace(chat: _Chat, now: int, pace_ms: int) -> None:
    """Keep the pace entries that still decide something, as sent.lua does:
    "s:" newer than the pace and the "f:" of the same person (an older "s:"
    times nothing, and the next message of its person resets their "f:")."""
    fresh = {k[2:] for k, v in chat.pace.items() if k[:2] == "s:" and now - v < pace_ms}
    chat.pace = {k: v for k, v in chat.pace.items() if k[2:] in fresh}


def _prune_window(window: dict[str, int], cutoff: int) -> None:
    """Forget the rate slots taken at or before `cutoff`. A window is kept
    oldest first (`_reserve`), so the scan stops at the first slot still in
    it: an admit costs what expired, not the whole window (a cap of thousands
    made every admit scan thousands)."""
    stale = []
    for message_id, taken in window.items():
        if taken > cutoff:
            break
        stale.append(message_id)
    for message_id in stale:
        del window[message_id]


def _reserve(window: dict[str, int], message_id: str, now: int) -> None:
    """Take a slot at `now`, keeping the window oldest first even if the
    clock went back (then, rarely, by sorting it)."""
    newest = next(reversed(window.values()), None)
    window.pop(message_id, None)
    window[message_id] = now
    if newest is not None and now < newest:
        ordered = sorted(window.items(), key=lambda slot: slot[1])
        window.clear()
        window.update(ordered)
