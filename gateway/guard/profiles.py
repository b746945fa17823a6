"""The agent guard's profiles: the limits one agent session is held to (docs/agent-guard.md).

`guard:` in the config is a `GuardConfig`; the engine (gateway/guard/engine.py)
reads a profile as JSON, so every limit here is what guard.lua compares.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, field_validator, model_validator

from gateway.fields import (
    MAX_COUNT,
    MAX_TTL_SECONDS,
    Float,
    Int,
    Model,
    NonEmptyStr,
    Window,
    deep_merge,
    float_not_bool,
    int_not_bool,
)
from gateway.guard import normalize

Ratio = Annotated[float, BeforeValidator(float_not_bool), Field(gt=0, le=1)]
Times = Annotated[int, BeforeValidator(int_not_bool), Field(ge=1, le=MAX_COUNT)]


def _regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"is not a valid regular expression: {exc}") from None
    return value


class WarnBlock(Model):
    """Warn at the `warn_at`-th occurrence, block at the `block_at`-th."""

    warn_at: Times
    block_at: Times

    @model_validator(mode="after")
    def _order(self) -> WarnBlock:
        if self.warn_at > self.block_at:
            raise ValueError("warn_at must not be greater than block_at")
        return self


class CycleGuard(WarnBlock):
    warn_at: Times = 2  # full repetitions of the pattern
    block_at: Times = 3
    min_period: Int = Field(default=2, ge=2, le=32)
    max_period: Int = Field(default=8, ge=2, le=32)
    history: Int = Field(default=64, ge=4, le=256)

    @model_validator(mode="after")
    def _periods(self) -> CycleGuard:
        if self.min_period > self.max_period:
            raise ValueError("min_period must not be greater than max_period")
        return self


class FixationGuard(Model):
    window: Int = Field(default=4, ge=2, le=16)  # the tool's last calls compared
    similarity: Ratio = 0.70  # pairwise Jaccard of their input tokens
    # arguments naming what a call acts on: calls that all act on different
    # targets are not fixation, however alike the rest of their arguments
    target_keys: tuple[NonEmptyStr, ...] = normalize.TARGET_KEYS


class ResultsGuard(Model):
    """How results are compared: these keys (without case, `_` or `-`) are
    dropped from JSON results at any depth and masked in text, with clock
    times, durations and UUIDs, so a loop whose output differs only in its
    timing, pid or run counter is seen as one."""

    volatile_keys: tuple[NonEmptyStr, ...] = normalize.VOLATILE_KEYS


class PollingGuard(Model):
    """Tools that poll (a job's status, a queue): an unchanged answer is what
    waiting looks like, so identical calls, same results, cycles and low
    exploration do not count them. They are stopped (`poll_limit`) after
    `max_unchanged` same answers in a row or `max_seconds` of them, and
    still count against the step ceilings and the budget."""

    tools: tuple[NonEmptyStr, ...] = ()
    max_unchanged: Times = 100
    max_seconds: Window = 1800.0


class NarrowRunGuard(Model):
    """A long run that uses only a few distinct calls, though each answers
    something new (a log tailed, two agents passing a message back and
    forth): warned (`narrow_run`), never blocked."""

    calls: Int = Field(default=30, ge=4, le=256)
    max_distinct: Int = Field(default=2, ge=1, le=16)


class ExplorationGuard(Model):
    min_calls: Times = 8
    min_ratio: Ratio = 0.40  # unique (tool, input) pairs / calls


class SubagentGuard(Model):
    tools: tuple[NonEmptyStr, ...] = ()  # tools that delegate to a sub-agent
    max_calls: Times = 3
    similarity: Ratio = 0.65  # two responses this alike in a row: no progress


class RetryGuard(Model):
    max_retries: Times = 2  # per session, per task, per window
    window_seconds: Window = 3600.0
    # task -> a regex the input must match for a retry to make sense
    prechecks: dict[NonEmptyStr, Annotated[str, AfterValidator(_regex)]] = Field(
        default_factory=dict
    )


class HandoffGuard(Model):
    max_handoffs: Times = 6
    max_visits: Times = 2


class KnowledgeGuard(Model):
    max_queries: Times = 2  # per session, per topic, per window
    window_seconds: Window = 900.0


class ContextGuard(Model):
    growth: Float = Field(default=1.35, gt=1, le=100)  # step-to-step growth factor
    growth_steps: Times = 3  # consecutive growths before the warning
    max_total_tokens: Int | None = Field(default=None, ge=1, le=10**13)


# The guard counts dollars in millionths (integers inside Redis Lua): a
# smaller budget would round to 0, which is "no budget".
MIN_BUDGET_USD = 0.000001
BUDGET_TOO_SMALL = "must be at least 0.000001 (one micro-dollar, the unit the guard counts in)"


def _budget_usd(value: float | None) -> float | None:
    if value is not None and value < MIN_BUDGET_USD:
        raise ValueError(BUDGET_TOO_SMALL)
    return value


class BudgetGuard(Model):
    usd: Annotated[Float | None, AfterValidator(_budget_usd)] = Field(default=None, gt=0, le=10**7)
    tokens: Int | None = Field(default=None, ge=1, le=10**13)
    warn_at: Ratio = 0.8


class StepGuard(Model):
    max_steps: Times = 50
    max_per_tool: Times = 25


class SessionBounds(Model):
    """What one session keeps, so that its stored value and the cost of a
    check stay flat however long it runs and however many names the agent
    invents (docs/operations.md). Past a bound the least recently used tool,
    task or topic is forgotten (its counts start over if it comes back); the
    one an agent loops on is in use, so it stays."""

    max_tools: Int = Field(default=32, ge=1, le=1024)  # counts, streaks, fixation windows
    max_tasks: Int = Field(default=32, ge=1, le=1024)  # retried tasks and their windows
    max_topics: Int = Field(default=64, ge=1, le=1024)  # knowledge-base topics
    max_chain: Int = Field(default=64, ge=2, le=1024)  # newest agents of the hand-off chain
    max_tokens: Int = Field(default=64, ge=8, le=256)  # token hashes kept per call


class GuardProfile(Model):
    """The limits one agent session is held to."""

    identical: WarnBlock = WarnBlock(warn_at=2, block_at=3)
    exempt_tools: tuple[NonEmptyStr, ...] = ()
    cycle: CycleGuard = CycleGuard()
    fixation: FixationGuard = FixationGuard()
    exploration: ExplorationGuard = ExplorationGuard()
    failures: WarnBlock = WarnBlock(warn_at=3, block_at=5)
    # the same call failing the same way again, whatever came between
    repeated_failure: WarnBlock = WarnBlock(warn_at=2, block_at=3)
    results: ResultsGuard = ResultsGuard()
    polling: PollingGuard = PollingGuard()
    narrow_run: NarrowRunGuard = NarrowRunGuard()
    no_progress_at: Times = 3  # the same result from one tool this many times in a row
    subagents: SubagentGuard = SubagentGuard()
    retry: RetryGuard = RetryGuard()
    handoff: HandoffGuard = HandoffGuard()
    knowledge: KnowledgeGuard = KnowledgeGuard()
    context: ContextGuard = ContextGuard()
    budget: BudgetGuard = BudgetGuard()
    steps: StepGuard = StepGuard()
    session: SessionBounds = SessionBounds()

    @model_validator(mode="after")
    def _chain(self) -> GuardProfile:
        # Revisits are counted in the chain kept: a shorter one hides them.
        if self.session.max_chain < 2 * self.handoff.max_visits:
            raise ValueError("session.max_chain must be at least 2 * handoff.max_visits")
        # both look back over the calls the session keeps
        if self.narrow_run.calls > self.cycle.history:
            raise ValueError("narrow_run.calls must not be greater than cycle.history")
        return self


_PROFILE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class GuardConfig(Model):
    """`guard:`: a `default` profile and named ones; a named profile states
    only what differs from `default`."""

    session_ttl_seconds: Int = Field(default=86400, ge=60, le=MAX_TTL_SECONDS)
    # Sessions this process keeps when it runs the guard itself (memory store,
    # or Redis unreachable); past it the least recently used is forgotten.
    max_sessions: Int = Field(default=10_000, ge=1, le=MAX_COUNT)
    profiles: dict[str, GuardProfile] = Field(default_factory=lambda: {"default": GuardProfile()})

    @field_validator("profiles", mode="before")
    @classmethod
    def _inherit(cls, value: Any) -> Any:
        if value is None:
            return {"default": {}}
        if not isinstance(value, Mapping):
            return value
        base = value.get("default") or {}
        out: dict[Any, Any] = {"default": base}
        for name, profile in value.items():
            if name != "default":
                merged = deep_merge(base, profile) if isinstance(profile, Mapping) else profile
                out[name] = {} if profile is None else merged
        return out

    @field_validator("profiles")
    @classmethod
    def _names(cls, value: dict[str, GuardProfile]) -> dict[str, GuardProfile]:
        for name in value:
            if not _PROFILE_NAME.match(name):
                raise ValueError(f"profile name {name!r}: use 1-64 of A-Z a-z 0-9 _ . -")
        return value
