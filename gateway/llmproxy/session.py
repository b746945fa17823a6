"""Which guard session a model request belongs to, and which of its tool
events the guard has not been fed yet.

A session is the `X-Botbouncer-Session` header when the agent sends one.
Otherwise it is a fingerprint of the conversation: the API, a digest of the
credential, the opening (system prompt and first user turn) and the first
answer (its tool calls' ids, unique to that answer, else its text). Two
conversations that open alike part at their first answer, so they are never
one session; the first request, before any answer, has no session yet (it has
no tool events either), and its answer's usage goes to the session its
history will name from then on.

An agent sends its whole history on every request. The events the guard has
been fed are kept per session in the store (one value, the keys of the
events in the last history, with the state TTL), so any replica feeds each
tool call and result once. A Responses request that continues a stored
response sends only its new items; `Chains` keeps each stored answer's
session and tool calls, so the request is read as if it carried them.
"""

from __future__ import annotations

import json

from gateway.guard.requests import check_session
from gateway.llmproxy.wire import Dialect, Json, ToolEvent, digest
from gateway.store import Store

HEADER = "X-Botbouncer-Session"
PREFIX = "llm-"


def given(value: str | None) -> str | None:
    """The header's session, checked (a GuardInputError names what is wrong)."""
    if value is None:
        return None
    try:
        return check_session(value)
    except ValueError as exc:
        raise type(exc)(f"{HEADER} header: {str(exc).partition(': ')[2]}") from None


def fingerprint(dialect: Dialect, body: Json, credential: str, anchor: str | None) -> str | None:
    if anchor is None:
        return None
    key = digest(credential)  # never kept or sent: only its digest enters the fingerprint
    return PREFIX + digest(dialect.name, key, dialect.opening(body), anchor)[:40]


class Seen:
    """The tool events of a session the guard has been fed."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @staticmethod
    def _name(session: str) -> str:
        return f"llm:{session}"

    async def new(self, session: str, events: list[ToolEvent]) -> list[ToolEvent]:
        raw = await self.store.get_cursor(self._name(session))
        try:
            seen = set(json.loads(raw)) if raw else set()
        except (ValueError, TypeError):
            seen = set()
        return [e for e in events if e.key not in seen]

    async def remember(self, session: str, events: list[ToolEvent]) -> None:
        """The events of this history (not every one ever seen: a history the
        agent trims forgets what it dropped, so the value stays its size)."""
        await self.store.set_cursor(self._name(session), json.dumps([e.key for e in events]))


class Chains:
    """Answers a later request may continue on the server (Responses'
    `previous_response_id`, or the last answer of a `conversation`), by the
    dialect's key: the session it belongs to and its tool calls, which the
    continuing request does not carry. Kept in the store with the state TTL,
    so any replica can read them."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @staticmethod
    def _name(key: str) -> str:
        return "llm-chain:" + digest(key)[:40]

    async def recall(self, key: str) -> tuple[str, list[list[str]]] | None:
        """(session, calls) of the answer kept under `key`, None when unknown."""
        raw = await self.store.get_cursor(self._name(key))
        try:
            session, calls = json.loads(raw) if raw else (None, None)
        except (ValueError, TypeError):
            return None
        if not isinstance(session, str) or not isinstance(calls, list):
            return None
        kept = [c for c in calls if isinstance(c, list) and len(c) == 4]
        return session, [c for c in kept if all(isinstance(x, str) for x in c)]

    async def remember(self, key: str, session: str, calls: list[list[str]]) -> None:
        await self.store.set_cursor(self._name(key), json.dumps([session, calls]))
