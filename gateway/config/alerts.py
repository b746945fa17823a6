"""`alerts:` where the daemon says that a loop was stopped or an agent
blocked (docs/operations.md#alerts, gateway/alerts.py)."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, SecretStr, field_validator, model_validator

from gateway.fields import Float, Int, Model, check_http_url

# limit_reached: a chat's soft or hard turn limit (its warning was posted);
# pair_cooldown: two bots put on cooldown in a chat; rate_capped: a chat's
# replies capped (once per rate-cap window); guard_block: an agent's step
# blocked (once per session and reason); budget_warning / budget_exhausted:
# a session past its budget's warn_at / out of budget; store_degraded /
# store_recovered: this replica lost the shared store / has it back.
Event = Literal[
    "limit_reached", "pair_cooldown", "rate_capped", "guard_block", "budget_warning",
    "budget_exhausted", "store_degraded", "store_recovered",
]  # fmt: skip
EVENTS: tuple[Event, ...] = get_args(Event)


class AlertTarget(Model):
    """One place alerts go: `webhook` (the alert as JSON), `slack` (an
    incoming webhook) or `discord` (a channel webhook)."""

    type: Literal["webhook", "slack", "discord"]
    # A secret: Slack's and Discord's webhook URLs are their own credentials.
    url: SecretStr
    events: tuple[Event, ...] = EVENTS
    headers: dict[str, SecretStr] = Field(default_factory=dict)  # webhook only
    timeout_seconds: Float = Field(default=5.0, gt=0, le=60)
    retries: Int = Field(default=3, ge=0, le=10)  # after the first try, with backoff
    queue: Int = Field(default=1000, ge=1, le=100_000)  # alerts waiting; past it, dropped

    @field_validator("url")
    @classmethod
    def _url(cls, value: SecretStr) -> SecretStr:
        check_http_url(value.get_secret_value())
        return value

    @field_validator("events")
    @classmethod
    def _events(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("must name at least one event")
        return value

    @model_validator(mode="after")
    def _headers(self) -> AlertTarget:
        if self.headers and self.type != "webhook":
            raise ValueError("headers are for type: webhook only")
        return self
