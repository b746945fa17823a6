"""Every default the chat rules and stores run on, named once.

The config's fields take these as their defaults (docs/configuration.md), and
`Limits`, `MemoryStore` and `RedisStore` take them when they are built without
a config (tests, benches, `botbouncer replay`), so the two can never disagree.
"""

from __future__ import annotations

# turns:
SOFT_LIMIT = 20
HARD_LIMIT = 100
# pairs:
PAIR_MAX_EVENTS = 20
PAIR_WINDOW_SECONDS = 60.0
PAIR_COOLDOWN_SECONDS = 60.0
# rate_cap:
MAX_REPLIES = 6
MAX_REPLY_MESSAGES = 10  # messages one answer may take (the rest dropped)
RATE_WINDOW_SECONDS = 120.0
# machine_pace: a person answering this bot within this many seconds of its
# reply to them, this many times in a row, is answering at machine pace
PACE_SECONDS = 2.0
PACE_EXCHANGES = 10
# reply_decision and the backends: recent messages given as context
CONTEXT_MESSAGES = 8
# decide mode: how long a ticket holds its reply's turn and rate slot (seconds)
TICKET_SECONDS = 120.0
# store:
STATE_TTL_SECONDS = 7 * 86400
SETTINGS_TTL_SECONDS = 90 * 86400
# Chats one process's memory holds (memory://, and Redis's local fallback).
MAX_CHATS = 100_000
