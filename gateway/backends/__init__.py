"""Where replies come from (DESIGN §3.6).

A backend turns one admitted message (plus the chat's recent context) into the
texts to send; an empty list means stay silent. Backends raise on failure; the
pipeline turns that into `backend_error` and releases the rate-cap slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gateway.model import Message
from gateway.store import ContextEntry


class Backend(Protocol):
    name: str

    async def reply(self, msg: Message, context: Sequence[ContextEntry]) -> list[str]: ...


class EchoBackend:
    """Repeats the text: for demos and tests."""

    name = "echo"

    async def reply(self, msg: Message, context: Sequence[ContextEntry]) -> list[str]:
        return [msg.text] if msg.text.strip() else []
