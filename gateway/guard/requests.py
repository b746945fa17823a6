"""What an agent sends the guard: each request body's model, checked strictly,
and a bad one said as `<field>: <problem>` (a 400)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, ValidationError

from gateway.config.errors import format_path, translate
from gateway.errors import InputError
from gateway.guard import normalize
from gateway.guard.profiles import BUDGET_TOO_SMALL, MIN_BUDGET_USD

SESSION = re.compile(r"[A-Za-z0-9._:@-]{1,128}")
# Names a path would not reach as a session: the guard's own document's route,
# and the path segments `.` and `..`, which clients resolve away.
RESERVED = frozenset({"openapi.json", ".", ".."})


class GuardInputError(InputError):
    """A request the agent must fix (answered 400)."""


def _whole(value: Any) -> Any:
    """A count written as a whole float (`1.0`, as a language without
    integers, or a float sum, writes it) is that count; 1.5 is still refused."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Name = Annotated[str, Field(min_length=1, max_length=200)]
Tokens = Annotated[int, Field(ge=0, le=10**12), BeforeValidator(_whole)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StepBody(_Body):
    tool: Name
    args: Any = Field(default_factory=dict)
    input_tokens: Tokens | None = None


class ResultBody(_Body):
    tool: Name
    ok: StrictBool = True
    output: Any = None
    # The call's arguments, as its step gave them: which call this answers
    # when calls of one tool overlap (else the newest one without a result).
    args: Any = None


class RetryBody(_Body):
    task: Name
    input: str = ""
    error: Any = None


class HandoffBody(_Body):
    source: Name
    target: Name


class KbQueryBody(_Body):
    question: Annotated[str, Field(min_length=1, max_length=10_000)]
    confidence: Annotated[float, Field(ge=0, le=1)] | None = None


class UsageBody(_Body):
    cost_usd: Annotated[float, Field(ge=0, le=10**7)] = 0.0
    tokens: Tokens = 0
    # Money travels in micro-dollars: a smaller budget would round to 0, which
    # the script reads as "no budget" - the opposite of what was asked.
    budget_usd: Annotated[float, Field(ge=MIN_BUDGET_USD, le=10**7)] | None = None
    budget_tokens: Annotated[int, Field(ge=1, le=10**13), BeforeValidator(_whole)] | None = None


def parse_body(model: type[_Body], body: Any) -> Any:
    if not isinstance(body, dict):
        raise GuardInputError("body: must be a JSON object")
    # Before anything walks it (json.dumps recurses): json_body has refused a
    # deeper HTTP body already, but a caller in this process may pass anything.
    if normalize.depth_over(body):
        raise GuardInputError(f"body: nested deeper than {normalize.MAX_JSON_DEPTH} levels")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        # Said as the config says it (one translator), in an API's words.
        err = exc.errors(include_url=False)[0]
        loc, msg = translate(err)
        where = format_path(loc) if loc else "body"
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        elif err["type"] == "int_type" and isinstance(err.get("input"), float):
            msg = "must be a whole number"
        elif where == "budget_usd" and err["type"] == "greater_than_equal":
            msg = BUDGET_TOO_SMALL
        raise GuardInputError(f"{where}: {msg}") from None


def check_session(session: str) -> str:
    if not SESSION.fullmatch(session):  # fullmatch: `$` would let a final newline by
        raise GuardInputError("session: use 1-128 of A-Z a-z 0-9 . _ : @ -")
    if session in RESERVED:
        raise GuardInputError(f"session: {session!r} is reserved; use another name")
    return session
