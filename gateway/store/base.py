"""The Store protocol: every stateful rule is one atomic call on it.

Two implementations pass one contract suite (tests/store/): `memory` for a
single process and `redis` for replicas and bots sharing one truth. Times are
integer milliseconds inside the stores so Lua and Python agree to the unit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from gateway import defaults
from gateway.errors import Unavailable
from gateway.model import Action, Reason, Turn
from gateway.turns import Count

DECISION_LOG_SIZE = 50
# Dedupe memory per chat: the last message ids with the bots that handled them,
# oldest evicted first. Long enough for every bot behind the store to observe a
# message and for a platform to redeliver it; small enough to stay cheap.
DEDUPE_ENTRIES = 128
# How a message's counting is written in a dedupe record (Lua writes the same).
COUNT_CODES = {Count.BOT: "b", Count.RESET: "r", Count.NONE: "n"}
CONTEXT_TEXT_CHARS = 500
# Machine-pace entries per chat before the stale ones are swept (sent.lua
# sweeps at the same size): an entry older than the pace decides nothing, and
# in a chat busy enough never to lapse, one per person ever answered was kept.
PACE_SWEEP_AT = 64


class StoreError(Unavailable):
    """The one error type a store raises for a backend failure."""

    log_level = logging.ERROR  # an operator must know; the client is told to retry

    def public(self) -> str:
        return "the state store is unavailable; try again"


@dataclass(frozen=True, slots=True)
class Limits:
    """The effective policy for one admit, before per-chat overrides."""

    soft_limit: int = defaults.SOFT_LIMIT
    hard_limit: int = defaults.HARD_LIMIT
    max_replies: int = defaults.MAX_REPLIES
    rate_window_ms: int = round(defaults.RATE_WINDOW_SECONDS * 1000)
    rate_applies: bool = True  # rate_cap.scope admits this chat kind
    pair_max_events: int = defaults.PAIR_MAX_EVENTS
    pair_window_ms: int = round(defaults.PAIR_WINDOW_SECONDS * 1000)
    pair_cooldown_ms: int = round(defaults.PAIR_COOLDOWN_SECONDS * 1000)
    pace_ms: int = round(defaults.PACE_SECONDS * 1000)  # 0: no machine-pace backstop
    pace_max: int = defaults.PACE_EXCHANGES


@dataclass(frozen=True, slots=True)
class Overrides:
    """Per-chat limits set by an admin; None keeps the bot's configured value."""

    soft_limit: int | None = None
    hard_limit: int | None = None
    max_replies: int | None = None
    rate_window_ms: int | None = None

    def apply(self, limits: Limits) -> Limits:
        if not self.as_dict():  # most chats have none: no new object per admit
            return limits
        return replace(
            limits,
            soft_limit=self.soft_limit or limits.soft_limit,
            hard_limit=self.hard_limit or limits.hard_limit,
            max_replies=self.max_replies or limits.max_replies,
            rate_window_ms=self.rate_window_ms or limits.rate_window_ms,
        )

    def as_dict(self) -> dict[str, int]:
        return {
            k: v
            for k, v in (
                ("soft_limit", self.soft_limit),
                ("hard_limit", self.hard_limit),
                ("max_replies", self.max_replies),
                ("rate_window_ms", self.rate_window_ms),
            )
            if v is not None
        }


@dataclass(frozen=True, slots=True)
class ContextEntry:
    """One line of a chat's recent context, as the classifier and backends see it."""

    id: str
    author: str
    name: str
    bot: bool
    text: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "author": self.author,
            "name": self.name,
            "bot": self.bot,
            "text": self.text,
        }


# The records a store call takes and gives back (Observed, AdmitRequest,
# AdmitResult, SentRequest, SentResult) are made for one call and never
# changed after; they are not frozen because a frozen dataclass sets each
# field through object.__setattr__, which a message's six records felt
# (measured in bench/README.md, "Second pass").
@dataclass(slots=True)
class Observed:
    """A message as the store records it once per id (the counting half of admit)."""

    chat: str
    message_id: str
    author: str
    name: str
    count: Count
    text: str = ""


@dataclass(slots=True)
class AdmitRequest:
    """Everything the one atomic admit call needs; built without I/O by the pipeline."""

    msg: Observed
    bot: str
    # Why this bot would not answer regardless of limits (own, system, ignored
    # bot, not addressed), or None when only the store's rules can say.
    local_reason: Reason | None
    author_is_bot: bool
    limits: Limits
    context: int = 0  # recent messages to return when a reply is possible
    now_ms: int | None = None  # injected clock; None = the store's own time
    # How long a message that goes on may hold its answer's turn (ms): the
    # slowest the answer can take to be sent. 0 holds none (a dry run).
    hold_ms: int = 0


@dataclass(slots=True)
class AdmitResult:
    turn: Turn
    soft: int
    hard: int
    action: Action | None  # None: go on to the classifier/backend
    reason: Reason | None
    warn: str | None  # "soft" or "hard" when this bot won the warning claim
    limits: Limits  # after per-chat overrides
    reserved: bool  # a rate-cap slot is held under the message id
    at_ms: int
    context: list[ContextEntry] = field(default_factory=list)


@dataclass(slots=True)
class SentRequest:
    """A message this bot sent: counted as a bot turn under its platform id."""

    msg: Observed
    bot: str
    limits: Limits
    log: dict[str, Any] | None = None  # decision entry of the message it answered
    now_ms: int | None = None
    answered: str = ""  # the message it answers, whose turn hold it fills ("" none)
    answered_author: str = ""  # who wrote it: the machine-pace backstop times their answer


@dataclass(slots=True)
class SentResult:
    turn: Turn
    soft: int
    hard: int


@dataclass(frozen=True, slots=True)
class ChatStatus:
    chat: str
    soft: int
    hard: int
    turn: Turn  # for the asking bot's limits; `ok` for an unknown chat
    paused: bool
    overrides: Overrides
    limits: Limits  # effective, after overrides
    pair_cooldowns: dict[str, float]  # "a|b" -> seconds left
    rate_used: int
    rate_max: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "chat": self.chat,
            "soft": self.soft,
            "hard": self.hard,
            "turn": self.turn.value,
            "soft_limit": self.limits.soft_limit,
            "hard_limit": self.limits.hard_limit,
            "paused": self.paused,
            "overrides": self.overrides.as_dict(),
            "pair_cooldowns": self.pair_cooldowns,
            "rate": {
                "used": self.rate_used,
                "max": self.rate_max,
                "window_seconds": self.limits.rate_window_ms / 1000,
            },
        }


def pair_name(a: str, b: str) -> str:
    x, y = sorted((a, b))
    return f"{x}|{y}"


def pace_name(bot: str, author: str) -> str:
    """The machine-pace fields of one (bot, person): the bot's handled mark
    (its name with '|' and '%' escaped, then '|'), then the person's id."""
    return mark(bot) + author


def mark(bot: str) -> str:
    """A bot's mark, as common.lua's MARK: '|' and '%' escaped, then '|'."""
    return bot.replace("%", "%25").replace("|", "%7C") + "|"


def hold_name(bot: str, message_id: str = "") -> str:
    """A turn hold: `bot` will answer `message_id`. The bot is length-prefixed,
    so no id can pass for another's; with no message id, the prefix every hold
    of the bot starts with. Both stores file holds under these names."""
    return f"{len(bot)}:{bot}|{message_id}"


class Store(Protocol):
    kind: str

    async def admit(self, req: AdmitRequest) -> AdmitResult:
        """Dedupe, count or reset, verdict, warn claim, pause, overrides, pair
        window and cooldown, rate-slot reservation, context append and - for a
        message that stops here - its decision log entry: one atomic step."""
        ...

    async def record_sent(self, req: SentRequest) -> SentResult:
        """Count a sent message as a bot turn (deduped by id) and log the
        decision of the message it answered."""
        ...

    async def release(
        self, chat: str, bot: str, message_id: str, log: dict[str, Any] | None
    ) -> None:
        """Give back the rate-cap slot held under `message_id`; log why."""
        ...

    async def status(
        self, chat: str, bot: str, limits: Limits, now_ms: int | None = None
    ) -> ChatStatus: ...

    async def issue_ticket(
        self, ticket: str, record: str, ttl_ms: int, now_ms: int | None = None
    ) -> None:
        """File a decide-mode ticket (gateway/store/tickets.py) for `ttl_ms`."""
        ...

    async def spend_ticket(
        self, ticket: str, how: str, now_ms: int | None = None
    ) -> tuple[str, str] | None:
        """Move a ticket on (tickets.next_state); its state before and its
        record, or None when there is no such ticket (never issued, lapsed)."""
        ...

    async def reset(self, chat: str) -> None:
        """Zero the chat's counters, pair windows and cooldowns."""
        ...

    async def set_paused(self, chat: str, paused: bool) -> None: ...

    async def set_overrides(self, chat: str, overrides: Overrides, merge: bool = False) -> None:
        """Replace the chat's overrides (an empty Overrides clears them), or
        with `merge` set only the fields given, keeping the others."""
        ...

    async def decisions(self, chat: str, limit: int = DECISION_LOG_SIZE) -> list[dict[str, Any]]:
        """The chat's newest decisions, newest first."""
        ...

    async def get_cursor(self, name: str) -> str | None:
        """A platform connection's read position (Matrix's sync token) under
        `name`, or None when none was saved (or it lapsed with the state)."""
        ...

    async def set_cursor(self, name: str, value: str) -> None:
        """Save a read position; it lapses after the state TTL unused."""
        ...

    async def claim(self, name: str, ttl_ms: int) -> bool:
        """True for the first claim of `name` within `ttl_ms` by any process on
        this store, False for every other (an alert sent once per threshold)."""
        ...

    async def ping(self) -> None:
        """Raise StoreError when the store cannot be reached (for /healthz)."""
        ...

    async def close(self) -> None: ...
