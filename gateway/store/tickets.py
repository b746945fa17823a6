"""Decide-mode tickets: what a bot that keeps its own token holds between
asking (`decide`) and saying what it did (`sent` or `release`).

A ticket is a random id filed in the store with the decision it was issued
for and a state: issued, sent or released. It lives as long as its reply's
turn hold (the bot's `ticket_seconds`), so any process on the same store can
redeem it, and a spent one is remembered until then, so that a release after
a send (which would give back a slot that was used) is refused, not obeyed.

One transition rule for both stores (`next_state`): an issued ticket may be
sent or released; a sent one may be sent again (a long answer in several
messages); nothing else changes a ticket. The caller reads the state before
the call to know what happened.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any, Generic, TypeVar

from gateway.model import Action, Decision, Reason, Turn

R = TypeVar("R")

ISSUED, SENT, RELEASED = "i", "s", "r"
STATE_NAMES = {ISSUED: "issued", SENT: "sent", RELEASED: "released"}
# Tickets the memory store keeps at most (the oldest forgotten first): a
# bound on what a flood of decide calls that never report back can cost.
MAX_TICKETS = 100_000


def next_state(before: str, how: str) -> str:
    """The state a ticket in `before` is in after `how` (SENT or RELEASED)."""
    if before == ISSUED or (before == SENT and how == SENT):
        return how
    return before


class MemoryTickets(Generic[R]):
    """Tickets in this process: id -> (state, record, lapses at in ms). The
    memory store's records are the JSON text Redis would keep;
    ProcessTickets' are the decisions themselves."""

    def __init__(self, max_tickets: int = MAX_TICKETS) -> None:
        self._tickets: OrderedDict[str, tuple[str, R, int]] = OrderedDict()
        self.max_tickets = max_tickets

    def issue(self, ticket: str, record: R, ttl_ms: int, now_ms: int | None) -> None:
        now = _now(now_ms)
        self._prune(now)
        self._tickets[ticket] = (ISSUED, record, now + ttl_ms)
        while len(self._tickets) > self.max_tickets:
            self._tickets.popitem(last=False)

    def spend(self, ticket: str, how: str, now_ms: int | None) -> tuple[str, R] | None:
        entry = self._tickets.get(ticket)
        if entry is None:
            return None
        state, record, lapses = entry
        if lapses <= _now(now_ms):
            del self._tickets[ticket]
            return None
        self._tickets[ticket] = (next_state(state, how), record, lapses)
        return state, record

    def _prune(self, now: int) -> None:
        """Forget lapsed tickets from the oldest on (issue order is nearly lapse order)."""
        tickets = self._tickets
        while tickets:
            oldest = next(iter(tickets.values()))
            if oldest[2] > now:
                return
            tickets.popitem(last=False)


# A decision as ProcessTickets keeps it: strings and numbers only, a tuple the
# garbage collector stops tracking. A Decision object per ticket (100,000 at
# most, held for ticket_seconds) made each full collection of a busy bot
# a pause of tens of milliseconds.
Packed = tuple[str, str, str, str, str, "str | None", str, int, int, "str | None", float]


def pack(d: Decision) -> Packed:
    reason = None if d.reason is None else d.reason.value
    return (d.bot, d.message_id, d.chat, d.author, d.action.value, reason, d.turn.value,
            d.soft, d.hard, d.warning, d.at)  # fmt: skip


def unpack(p: Packed) -> Decision:
    reason = None if p[5] is None else Reason(p[5])
    return Decision(p[0], p[1], p[2], p[3], Action(p[4]), reason, Turn(p[6]), p[7], p[8],
                    warning=p[9], at=p[10])  # fmt: skip


class ProcessTickets:
    """Tickets kept in this process only, for a caller that never hands one
    to another process (botbouncer.Bouncer): two store calls a message fewer
    than filing them in Redis. The rules are MemoryTickets'; the hold and the
    rate slot a ticket stands for stay in the store and lapse there on their
    own if this process dies."""

    def __init__(self) -> None:
        self._tickets: MemoryTickets[Packed] = MemoryTickets()

    async def issue(self, ticket: str, d: Decision, ttl_ms: int, now_ms: int | None) -> None:
        self._tickets.issue(ticket, pack(d), ttl_ms, now_ms)

    async def spend(self, ticket: str, how: str, now_ms: int | None) -> tuple[str, Decision] | None:
        found = self._tickets.spend(ticket, how, now_ms)
        return None if found is None else (found[0], unpack(found[1]))


def _now(now_ms: int | None) -> int:
    return int(time.time() * 1000) if now_ms is None else now_ms


def ticket_key(prefix: str, ticket: str) -> str:
    return f"{prefix}:t:{ticket}"


def split(value: Any) -> tuple[str, str] | None:
    """ticket.lua's answer (state letter, then the record) as (state, record)."""
    if value is None:
        return None
    text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
    return text[:1], text[1:]
