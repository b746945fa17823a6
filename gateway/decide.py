"""Decide mode: the gateway for a bot that keeps its own token and its code.

The bot asks about each message it sees (`decide`), and says what it did with
a `reply` or `warn` answer's ticket: the ids it sent (`sent`, each counted as
this bot's turn once) or that it sent nothing (`release`, the rate-cap slot and
the turn hold given back). The HTTP routes (`POST /v1/bots/<bot>/decide`,
`/sent`, `/release`) and the in-process `botbouncer.Bouncer` both call this
one class; the rules are the gateway's own (Gateway.handle decides, stopping
before any backend: the bot's code is the backend).

A ticket lives in the store for the bot's `ticket_seconds` (the turn hold of
its reply lasts as long), so any process on the same store can redeem it.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

from gateway.errors import BotbouncerError, InputError
from gateway.model import Action, Decision, Message, Reason, Turn
from gateway.pipeline import Gateway
from gateway.store import SentResult, Store
from gateway.store.tickets import ISSUED, RELEASED, SENT, STATE_NAMES

# Ids one `sent` call may report: a reply cut into pieces is a handful.
MAX_IDS = 100


class UnknownTicket(BotbouncerError):
    """No such ticket for this bot: never issued, or lapsed."""

    status = 404


class SpentTicket(BotbouncerError):
    """The ticket was used in a way that forbids this call."""

    status = 409


def _record(d: Decision) -> str:
    return json.dumps(d.as_dict(), separators=(",", ":"))


def _decision(record: str) -> Decision:
    """A ticket's record: the decision it was issued for."""
    d: dict[str, Any] = json.loads(record)
    return Decision(
        bot=d["bot"],
        message_id=d["id"],
        chat=d["chat"],
        author=d["author"],
        action=Action(d["action"]),
        reason=None if d["reason"] is None else Reason(d["reason"]),
        turn=Turn(d["turn"]),
        soft=d["soft"],
        hard=d["hard"],
        warning=d["warning"],
        at=d["at"],
    )


def check_ticket(value: object) -> str:
    """A ticket as a client sent it: a non-empty string of at most 64 characters."""
    if not isinstance(value, str) or not value or len(value) > 64 or not value.isascii():
        raise InputError("ticket: must be the ticket string a decide answer gave")
    return value


def check_ids(ids: object, texts: object) -> tuple[list[str], list[str]]:
    """`ids` (the platform's message ids, 1 to MAX_IDS) and `texts` (what was
    sent under each, optional, for the chat's recent context)."""
    if not isinstance(ids, list) or not ids:
        raise InputError("ids: must be a non-empty list of the sent messages' ids")
    if len(ids) > MAX_IDS:
        raise InputError(f"ids: at most {MAX_IDS} at a time, not {len(ids)}")
    for i, one in enumerate(ids):
        if not isinstance(one, str) or not one or len(one) > 256:
            raise InputError(f"ids[{i}]: must be a message id (1-256 characters)")
    if texts is None:
        return ids, [""] * len(ids)
    if not isinstance(texts, list) or len(texts) != len(ids):
        raise InputError("texts: must be a list as long as ids (or left out)")
    for i, one in enumerate(texts):
        if not isinstance(one, str):
            raise InputError(f"texts[{i}]: must be a string")
    return ids, texts


class Tickets(Protocol):
    """Where a Decider files its tickets: `StoreTickets` (the store: any
    process on it may redeem them) or `gateway.store.tickets.ProcessTickets`
    (this process only)."""

    async def issue(self, ticket: str, d: Decision, ttl_ms: int, now_ms: int | None) -> None: ...

    async def spend(
        self, ticket: str, how: str, now_ms: int | None
    ) -> tuple[str, Decision] | None: ...


class StoreTickets:
    """Tickets filed in the store, each with its decision as JSON."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def issue(self, ticket: str, d: Decision, ttl_ms: int, now_ms: int | None) -> None:
        await self.store.issue_ticket(ticket, _record(d), ttl_ms, now_ms)

    async def spend(self, ticket: str, how: str, now_ms: int | None) -> tuple[str, Decision] | None:
        found = await self.store.spend_ticket(ticket, how, now_ms)
        return None if found is None else (found[0], _decision(found[1]))


class Decider:
    """One decide-mode bot: `decide`, `sent` and `release` over its gateway;
    its tickets are filed in the gateway's store unless `tickets` says where."""

    def __init__(self, gateway: Gateway, tickets: Tickets | None = None) -> None:
        self.gateway = gateway
        self.tickets: Tickets = StoreTickets(gateway.store) if tickets is None else tickets

    @property
    def name(self) -> str:
        return self.gateway.bot.name

    def ttl_ms(self) -> int:
        return round(self.gateway.bot.ticket_seconds * 1000)

    async def decide(self, msg: Message) -> Decision:
        """The gateway's decision; a `reply` or `warn` one carries a ticket."""
        d = await self.gateway.handle(msg)
        if d.action is Action.DROP:
            return d
        ticket = secrets.token_urlsafe(18)
        await self.file(d, ticket)
        return replace(d, ticket=ticket)

    async def file(self, d: Decision, ticket: str) -> None:
        """`d` filed under a ticket the caller names (Bouncer.decide with
        `shared`), whatever its action."""
        await self.tickets.issue(self._filed(ticket), d, self.ttl_ms(), self.gateway.now_ms())

    async def filed(self, ticket: str) -> Decision | None:
        """The decision filed under `ticket`, unspent, or None (a read:
        spending it as `issued` leaves it as it is)."""
        found = await self.tickets.spend(self._filed(ticket), ISSUED, self.gateway.now_ms())
        return None if found is None else found[1]

    def _filed(self, ticket: str) -> str:
        """The ticket as filed: under its bot, so no bot can spend another's."""
        return f"{self.name}/{ticket}"

    async def _spend(self, ticket: str, how: str) -> tuple[str, Decision]:
        found = await self.tickets.spend(self._filed(ticket), how, self.gateway.now_ms())
        if found is not None:
            return found
        raise UnknownTicket(
            f"no ticket {ticket!r} for bot {self.name!r}: never issued, or it lapsed "
            f"(tickets last ticket_seconds, {self.gateway.bot.ticket_seconds:g} s)"
        )

    async def sent(
        self, ticket: str, ids: Sequence[str], texts: Sequence[str] | None = None
    ) -> list[SentResult]:
        """The bot sent these messages for the ticket's decision: each id is
        counted as its turn, once (a repeated id is not counted again)."""
        before, d = await self._spend(ticket, SENT)
        if before == RELEASED:
            raise SpentTicket(f"ticket {ticket!r} was released: its slot was given back, "
                              "so nothing can be sent on it")  # fmt: skip
        texts = texts if texts is not None else [""] * len(ids)
        first = before == ISSUED and d.action is Action.REPLY
        out = []
        for message_id, text in zip(ids, texts, strict=True):
            if d.action is Action.WARN:
                text = text or d.warning or ""
            out.append(await self.gateway.sent(d, message_id, text, first=first))
            first = False
        return out

    async def release(self, ticket: str) -> Decision:
        """The bot sent nothing for the ticket: its slot and hold go back."""
        before, d = await self._spend(ticket, RELEASED)
        if before != ISSUED:
            raise SpentTicket(f"ticket {ticket!r} was {STATE_NAMES[before]} already"
                              + (": its slot stays spent" if before == SENT else ""))  # fmt: skip
        if d.action is not Action.REPLY:  # a warning holds no slot
            return replace(d, action=Action.DROP)
        return await self.gateway.withdraw(d, Reason.BACKEND_EMPTY)
