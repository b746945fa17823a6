"""The vocabulary shared by the core and the adapters.

Adapters build `Message` objects from platform events; the gateway answers with
a `Decision`. Nothing here knows about a platform SDK.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Reason(StrEnum):
    """Why a message was not answered (docs/architecture.md: a contract)."""

    OWN_MESSAGE = "own_message"
    BOT_IGNORED = "bot_ignored"
    NOT_ADDRESSED = "not_addressed"
    PAUSED = "paused"
    SYSTEM_MESSAGE = "system_message"
    TURN_SOFT_LIMIT = "turn_soft_limit"
    TURN_THROTTLED = "turn_throttled"
    TURN_HARD_LIMIT = "turn_hard_limit"
    TURN_STOPPED = "turn_stopped"
    PAIR_COOLDOWN = "pair_cooldown"
    RATE_CAPPED = "rate_capped"
    CLASSIFIER_SKIP = "classifier_skip"
    BACKEND_EMPTY = "backend_empty"
    BACKEND_ERROR = "backend_error"
    DUPLICATE = "duplicate"
    MACHINE_PACE = "machine_pace"


class Action(StrEnum):
    REPLY = "reply"
    WARN = "warn"
    DROP = "drop"


class Turn(StrEnum):
    """What a message did to the chat's turn counters.

    The first five are the verdicts of a bot turn (docs/architecture.md); `reset` is a
    plain human message; `none` is anything that neither counted nor reset
    (system and empty messages, duplicates).
    """

    OK = "ok"
    SOFT_LIMIT = "soft_limit"
    THROTTLED = "throttled"
    HARD_LIMIT = "hard_limit"
    STOPPED = "stopped"
    RESET = "reset"
    NONE = "none"


# A verdict other than `ok` forbids answering a bot; each maps to its reason.
TURN_REASONS: dict[Turn, Reason] = {
    Turn.SOFT_LIMIT: Reason.TURN_SOFT_LIMIT,
    Turn.THROTTLED: Reason.TURN_THROTTLED,
    Turn.HARD_LIMIT: Reason.TURN_HARD_LIMIT,
    Turn.STOPPED: Reason.TURN_STOPPED,
}
# A bot message counted while the chat was ok but decided on after the chat
# passed a limit: the chat is now past it, whatever the message's own count.
LATE_TURN_REASONS: dict[Turn, Reason] = {
    Turn.SOFT_LIMIT: Reason.TURN_THROTTLED,
    Turn.THROTTLED: Reason.TURN_THROTTLED,
    Turn.HARD_LIMIT: Reason.TURN_STOPPED,
    Turn.STOPPED: Reason.TURN_STOPPED,
}


class ChatKind(StrEnum):
    GROUP = "group"
    DM = "dm"


@dataclass(frozen=True, slots=True)
class ChatRef:
    """One conversation: the unit that turn counters, caps and logs belong to.

    `key` is what the store uses. A Telegram forum topic is its own chat
    (`topic`); a Discord thread is a channel and needs nothing extra.
    """

    platform: str
    id: str
    topic: str | None = None
    kind: ChatKind = ChatKind.GROUP

    @property
    def key(self) -> str:
        base = f"{self.platform}:{self.id}"
        return base if self.topic is None else f"{base}:{self.topic}"


@dataclass(frozen=True, slots=True)
class Author:
    id: str
    name: str = ""
    is_bot: bool = False

    @property
    def display(self) -> str:
        return self.name or self.id


@dataclass(frozen=True, slots=True)
class Message:
    """A message as every platform looks to the gateway.

    `reply_to` is the author id of the message this one replies to (enough to
    tell whether it addresses this bot). `system` marks platform events such as
    pins, joins and thread creation: they never reset and are never answered.
    """

    id: str
    chat: ChatRef
    author: Author
    text: str = ""
    mentions: tuple[str, ...] = ()
    reply_to: str | None = None
    system: bool = False
    # Platform-specific extras an adapter wants back with the decision
    # (e.g. the platform message object to reply to). Never read by the core.
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_plain_human(self) -> bool:
        """A message that resets the turn counters (docs/architecture.md)."""
        return not self.author.is_bot and not self.system and bool(self.text.strip())


@dataclass(frozen=True, slots=True)
class Decision:
    """What the gateway decided for one message, and why.

    `action` is `reply` when the message goes (or went) to the backend; `warn`
    when this bot posts a limit warning instead; `drop` otherwise. `reason` is
    None only for a reply. `soft`/`hard` are the chat's counters after the
    message.
    """

    bot: str
    message_id: str
    chat: str
    author: str
    action: Action
    reason: Reason | None
    turn: Turn
    soft: int
    hard: int
    warning: str | None = None
    replies: tuple[str, ...] = ()
    at: float = 0.0
    # decide mode: what the bot reports back with (gateway/decide.py)
    ticket: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "bot": self.bot,
            "id": self.message_id,
            "chat": self.chat,
            "author": self.author,
            "turn": self.turn.value,
            "soft": self.soft,
            "hard": self.hard,
            "action": self.action.value,
            "reason": None if self.reason is None else self.reason.value,
            "warning": self.warning,
            "at": self.at,
        }

    def with_replies(self, replies: tuple[str, ...]) -> Decision:
        """This decision with the backend's replies: every answered message
        makes one, built directly (dataclasses.replace costs twice as much)."""
        return Decision(self.bot, self.message_id, self.chat, self.author, self.action,
                        self.reason, self.turn, self.soft, self.hard, self.warning, replies,
                        self.at)  # fmt: skip

    def log_entry(self) -> dict[str, Any]:
        """The entry kept in the chat's decision log (the `why` command)."""
        return {
            "at": self.at,
            "bot": self.bot,
            "id": self.message_id,
            "author": self.author,
            "action": self.action.value,
            "reason": None if self.reason is None else self.reason.value,
            "turn": self.turn.value,
            "soft": self.soft,
            "hard": self.hard,
        }
