"""botbouncer for a bot that keeps its own token: the gateway in your process.

    from botbouncer import Bouncer

`Bouncer` decides, on the configured store, whether your bot may answer a
message (docs/guard-an-existing-bot.md). The middlewares wire it into a bot
in a few lines: `botbouncer.discord` (discord.py), `botbouncer.telegram`
(python-telegram-bot), `botbouncer.aiogram` (aiogram 3), `botbouncer.slack`
(Slack Bolt's AsyncApp). The agent guard's clients are here too:
`GuardClient`, `AsyncGuardClient`.

`gateway` and `adapters` are the implementation; this package is the API.
"""

from __future__ import annotations

from botbouncer.bouncer import Answer, Bouncer
from gateway.config import ConfigError
from gateway.decide import SpentTicket, UnknownTicket
from gateway.guard.client import AsyncGuardClient, GuardBlocked, GuardClient, GuardError
from gateway.model import Action, Author, ChatKind, ChatRef, Decision, Message, Reason, Turn
from gateway.store import SentResult, StoreError

__all__ = [
    "Action",
    "Answer",
    "AsyncGuardClient",
    "Author",
    "Bouncer",
    "ChatKind",
    "ChatRef",
    "ConfigError",
    "Decision",
    "GuardBlocked",
    "GuardClient",
    "GuardError",
    "Message",
    "Reason",
    "SentResult",
    "SpentTicket",
    "StoreError",
    "Turn",
    "UnknownTicket",
]
