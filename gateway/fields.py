"""The field types and checks every validated setting is built from.

The config (gateway/config/), the guard's profiles (gateway/guard/profiles.py)
and the admin API's per-chat limits (gateway/admin.py) share them, so a count,
a window or a template is checked, bounded and explained the same way
wherever it is written.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    model_validator,
)
from pydantic_core import PydanticCustomError

# Upper bounds keep every count and millisecond an exact integer inside Redis
# Lua (whose numbers print as 1e+14 past 14 digits, which PEXPIRE refuses).
MAX_COUNT = 1_000_000
MAX_WINDOW_SECONDS = 30 * 86400
MAX_TTL_SECONDS = 10 * 365 * 86400
# The stores count time in whole milliseconds: a shorter window would be 0.
MIN_WINDOW_SECONDS = 0.001
TEMPLATE_FIELDS = ("n", "limit")
# What a reply_decision.prompt may use (gateway/classifier.py fills them in).
PROMPT_FIELDS = ("identity", "context", "author", "author_kind", "message")


def int_not_bool(value: Any) -> Any:
    # pydantic's lax mode reads `true` as 1; in a config that is always a typo.
    if isinstance(value, bool):
        raise PydanticCustomError("int_type", "must be an integer")
    return value


def float_not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise PydanticCustomError("float_type", "must be a number")
    return value


def ids(value: Any) -> Any:
    # Platform ids are strings in the core; YAML reads unquoted ids as ints.
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return [str(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
    return value


def empty_to_none(value: Any) -> Any:
    # `${VAR:-}` of an unset variable yields "", which means "not configured".
    return None if value == "" else value


def none_to_empty(value: Any) -> Any:
    # A section whose keys are all commented out (`turns:`) parses as null.
    return {} if value is None else value


Int = Annotated[int, BeforeValidator(int_not_bool)]
Float = Annotated[float, BeforeValidator(float_not_bool)]
NonEmptyStr = Annotated[str, StringConstraints(min_length=1)]
Ids = Annotated[tuple[NonEmptyStr, ...], BeforeValidator(ids)]
OptionalStr = Annotated[str | None, BeforeValidator(empty_to_none)]
OptionalSecret = Annotated[SecretStr | None, BeforeValidator(empty_to_none)]


def _a_millisecond_or_more(value: float) -> float:
    if value < MIN_WINDOW_SECONDS:
        raise ValueError(
            f"must be at least {MIN_WINDOW_SECONDS} (one millisecond, the unit the store counts in)"
        )
    return value


# A window of time a rule counts over, in seconds: past 0, at most 30 days.
Window = Annotated[
    float,
    BeforeValidator(float_not_bool),
    Field(gt=0, le=MAX_WINDOW_SECONDS),
    AfterValidator(_a_millisecond_or_more),
]


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_section_is_empty(cls, data: Any) -> Any:
        return none_to_empty(data)


def check_http_url(value: str | None) -> str | None:
    if value is not None:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("must be an http:// or https:// URL")
    return value


def check_template(template: str, fields: tuple[str, ...] = TEMPLATE_FIELDS) -> str:
    """A template may use only its known placeholders: anything else would fail
    at the worst moment (a warning while a loop is being stopped, a classifier
    call that then fails open on every message)."""
    names = [f"{{{f}}}" for f in fields]
    allowed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"malformed template: {exc}") from None
    for _, name, spec, _ in parsed:
        if name is not None and name not in fields:
            shown = f"{{{name}}}" if name else "{}"
            raise ValueError(f"unknown placeholder {shown}; only {allowed} may be used")
        if spec and "{" in spec:
            raise ValueError(f"malformed template: nested placeholder in {{{name}:{spec}}}")
    try:
        template.format(**{f: 1 for f in fields})
    except (ValueError, IndexError, KeyError, AttributeError) as exc:
        raise ValueError(f"malformed template: {exc}") from None
    return template


def deep_merge(base: Mapping[Any, Any], override: Mapping[Any, Any]) -> dict[Any, Any]:
    """`override` wins leaf by leaf; a null section in it does not erase `base`."""
    merged = dict(base)
    for key, value in override.items():
        old = merged.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping):
            merged[key] = deep_merge(old, value)
        elif isinstance(old, Mapping) and value is None:
            continue
        else:
            merged[key] = value
    return merged
