"""What is wrong with a config, said as `<key path>: <problem>` lines."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from gateway.config.bots import TAGGED_FIELDS
from gateway.errors import BotbouncerError

KeyPath: TypeAlias = tuple[str | int, ...]

# A custom pydantic error type: "this message belongs at <loc> + ctx['at']".
# Validators that look at several fields use it to blame the one key to change.
LOCATED = "located"


class ConfigError(BotbouncerError):
    """Everything that is wrong with a config, one `<path>: <problem>` per line."""

    def __init__(self, problems: str | Iterable[str]) -> None:
        self.problems: list[str] = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))

    def __str__(self) -> str:
        return "\n".join(self.problems)


class UnknownBotError(BotbouncerError, KeyError):
    """`Config.bot()` was asked for a name no bot has."""

    def __str__(self) -> str:
        # KeyError would show the repr of its argument, quotes and all.
        return str(self.args[0]) if self.args else ""


def format_path(path: Iterable[str | int]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            # A key that is empty, blank or holds a line break or a control
            # character is quoted: one problem stays one readable line.
            shown = part if part.isprintable() and part.strip() else repr(part)
            out += f".{shown}" if out else shown
    return out or "(top level)"


def _choices(expected: str) -> str:
    return ", ".join(re.findall(r"'([^']*)'", expected))


_SIMPLE_MESSAGES = {
    "extra_forbidden": "unknown key",
    "missing": "is required",
    "int_parsing": "must be an integer",
    "int_type": "must be an integer",
    "int_from_float": "must be an integer",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "string_too_short": "must not be empty",
    "list_type": "must be a list",
    "tuple_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
}


def translate(err: ErrorDetails) -> tuple[KeyPath, str]:
    kind = err["type"]
    ctx: dict[str, Any] = dict(err.get("ctx") or {})
    # pydantic names the union member after a tagged field (`backend.openai.url`):
    # that one part goes. Only that one: a key after it may be spelt like a tag.
    raw = list(err["loc"])
    loc: list[str | int] = []
    for i, part in enumerate(raw):
        prev = raw[i - 1] if i else None
        if isinstance(prev, str) and prev in TAGGED_FIELDS and part in TAGGED_FIELDS[prev]:
            continue
        loc.append(part)

    if kind == LOCATED:
        return (*loc, *ctx["at"]), str(ctx["message"])
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        field = loc[-1] if loc else None
        tags = TAGGED_FIELDS.get(field, ()) if isinstance(field, str) else ()
        discriminator = str(ctx.get("discriminator", "'type'")).strip("'")
        choices = ", ".join(tags) or _choices(str(ctx.get("expected_tags", "")))
        return (*loc, discriminator), f"must be one of: {choices}"
    if kind in _SIMPLE_MESSAGES:
        return tuple(loc), _SIMPLE_MESSAGES[kind]
    bounds = {
        "greater_than_equal": (">=", "ge"),
        "greater_than": (">", "gt"),
        "less_than_equal": ("<=", "le"),
        "less_than": ("<", "lt"),
    }
    if kind in bounds:
        op, key = bounds[kind]
        bound = ctx.get(key)
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)  # "must be > 0", not "> 0.0"
        return tuple(loc), f"must be {op} {bound}"
    if kind == "literal_error":
        return tuple(loc), f"must be one of: {_choices(str(ctx.get('expected', '')))}"
    if kind == "too_short":
        return tuple(loc), f"must have at least {ctx.get('min_length')} item(s)"
    msg = err["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    return tuple(loc), msg


def _resolves(node: Any, path: KeyPath) -> bool:
    for part in path:
        if isinstance(part, str):
            found = isinstance(node, Mapping) and part in node
        else:
            found = isinstance(node, list) and 0 <= part < len(node)
        if not found:
            return False
        node = node[part]
    return True


def describe(exc: ValidationError, raw: Any) -> list[str]:
    """pydantic's errors as `<path>: <message>` lines, inherited ones dropped.

    A bad value in `defaults` is merged into every bot; it is reported at
    `defaults.<path>` and not again at `bots[i].<path>` unless that bot set the
    same key itself.
    """
    items = [translate(err) for err in exc.errors(include_url=False, include_input=False)]
    from_defaults = {(loc[1:], msg) for loc, msg in items if loc[:1] == ("defaults",)}
    bots = raw.get("bots") if isinstance(raw, Mapping) else None
    problems: dict[str, None] = {}  # ordered, and a set: a huge list of bad items stays fast
    for loc, msg in items:
        if len(loc) >= 2 and loc[0] == "bots" and isinstance(loc[1], int):
            own = bots[loc[1]] if isinstance(bots, list) and loc[1] < len(bots) else None
            if (loc[2:], msg) in from_defaults and not _resolves(own, loc[2:]):
                continue
        problems[f"{format_path(loc)}: {msg}"] = None
    return list(problems)
