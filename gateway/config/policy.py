"""The chat rules a bot is held to: `defaults:` is one `Policy`, and each bot one."""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

from pydantic import Field, ValidationInfo, field_validator, model_validator

from gateway import defaults
from gateway.fields import (
    MAX_COUNT,
    MAX_WINDOW_SECONDS,
    PROMPT_FIELDS,
    Float,
    Ids,
    Int,
    Model,
    OptionalSecret,
    OptionalStr,
    Window,
    check_http_url,
    check_template,
)

DEFAULT_WARN_SOFT = (
    "⚠️ Bot turn limit reached ({n}/{limit}). "
    "A human must reply here to continue the bot-to-bot conversation."
)
DEFAULT_WARN_HARD = "🛑 Hard bot turn limit reached ({n}). A human must reply to continue."


class TurnsPolicy(Model):
    """Consecutive bot-turn limits (docs/architecture.md)."""

    soft_limit: Int = Field(default=defaults.SOFT_LIMIT, ge=1, le=MAX_COUNT)
    hard_limit: Int = Field(default=defaults.HARD_LIMIT, ge=1, le=MAX_COUNT)
    warn_soft: str = DEFAULT_WARN_SOFT
    warn_hard: str = DEFAULT_WARN_HARD

    @field_validator("warn_soft", "warn_hard")
    @classmethod
    def _template(cls, value: str) -> str:
        return check_template(value)

    # soft_limit >= hard_limit is valid: the hard limit fires first and the
    # soft one never warns (only a hard stop). check-config notes it.


class PairsPolicy(Model):
    """Sliding-window loop detection per pair of bots (docs/architecture.md)."""

    max_events: Int = Field(default=defaults.PAIR_MAX_EVENTS, ge=1, le=MAX_COUNT)
    window_seconds: Window = defaults.PAIR_WINDOW_SECONDS
    cooldown_seconds: Float = Field(
        default=defaults.PAIR_COOLDOWN_SECONDS, ge=0, le=MAX_WINDOW_SECONDS
    )


class RateCapPolicy(Model):
    """Replies per (chat, bot) in a rolling window (docs/architecture.md)."""

    max_replies: Int = Field(default=defaults.MAX_REPLIES, ge=1, le=MAX_COUNT)
    window_seconds: Window = defaults.RATE_WINDOW_SECONDS
    scope: Literal["groups", "all"] = "groups"


class ReplyDecisionPolicy(Model):
    """The optional REPLY/SKIP classifier (docs/backends.md)."""

    enabled: bool = False
    endpoint: OptionalStr = Field(default=None, validate_default=True)
    api_key: OptionalSecret = None
    model: OptionalStr = Field(default=None, validate_default=True)
    timeout_seconds: Float = Field(default=5.0, gt=0)
    # A ceiling, not a target: a plain model stops after its one word, a
    # reasoning model spends hundreds of tokens before it (cut off first, it
    # answers nothing and every decision fails open).
    max_tokens: Int = Field(default=1024, ge=1)
    context_messages: Int = Field(default=defaults.CONTEXT_MESSAGES, ge=0, le=50)
    scope: Literal["groups", "all"] = "groups"
    identity: OptionalStr = None  # None: the bot's name, filled in by the classifier
    prompt: OptionalStr = None  # None: the classifier's built-in prompt

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: str | None) -> str | None:
        return None if value is None else check_template(value, PROMPT_FIELDS)

    @field_validator("endpoint", "model")
    @classmethod
    def _required_when_enabled(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None and info.data.get("enabled") is True:
            raise ValueError("is required when enabled")
        if info.field_name == "endpoint":
            return check_http_url(value)
        return value


class MachinePacePolicy(Model):
    """The backstop for bots no platform marks as bots (an auto-responder, a
    bridged bot, a user-bot): a "person" whose message comes within
    `within_seconds` of this bot's reply to them, more than `max_exchanges`
    times in a row, is not answered (`machine_pace`) until they write at a
    human pace again. 0 seconds turns it off (docs/architecture.md)."""

    within_seconds: Float = Field(default=defaults.PACE_SECONDS, ge=0, le=3600)
    max_exchanges: Int = Field(default=defaults.PACE_EXCHANGES, ge=1, le=MAX_COUNT)


BotMessages: TypeAlias = Literal["off", "mentions", "all"]


class Policy(Model):
    """Every rule a bot is held to; `defaults:` is one, and each bot is one."""

    turns: TurnsPolicy = TurnsPolicy()
    pairs: PairsPolicy = PairsPolicy()
    bot_messages: BotMessages = "off"
    trusted_bots: Ids = ()
    # ids treated as bots on every platform, whatever the platform says
    known_bots: Ids = ()
    # ids treated as people, whatever the platform says: a bridge or a proxy
    # (PluralKit) posting people's messages through a webhook or a bot account
    known_people: Ids = ()
    machine_pace: MachinePacePolicy = MachinePacePolicy()
    respond_to: Literal["mentions", "all"] = "mentions"
    rate_cap: RateCapPolicy = RateCapPolicy()
    # An answer cut into more messages than this (the platform's size) is
    # sent up to it, the rest dropped with a WARNING: one runaway answer is
    # not a flood.
    max_reply_messages: Int = Field(default=defaults.MAX_REPLY_MESSAGES, ge=1, le=1000)
    reply_decision: ReplyDecisionPolicy = ReplyDecisionPolicy()

    @field_validator("bot_messages", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        # YAML 1.1 reads an unquoted `off` as false (and `on`/`yes` as true).
        if value is False:
            return "off"
        if value is True:
            raise ValueError(
                "must be one of: off, mentions, all (an unquoted on/yes/true reads as a "
                'boolean: write all or mentions, or quote the value: "all")'
            )
        return value

    @model_validator(mode="after")
    def _bots_or_people(self) -> Policy:
        both = sorted(set(self.known_bots) & set(self.known_people))
        if both:
            raise ValueError(
                f"known_people: {both[0]!r} is in known_bots too; an author is one or the other"
            )
        return self


POLICY_KEYS = frozenset(Policy.model_fields)
