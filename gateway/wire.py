"""The JSON message format shared by `botbouncer replay` lines and the HTTP
ingress body (DESIGN §5.2, §5.3): one parser, one set of error messages."""

from __future__ import annotations

import json
import math
from typing import Any

from gateway.model import Author, ChatKind, ChatRef, Decision, Message

FIELDS = ("chat", "author", "bot", "text", "id", "at", "kind", "mentions", "reply_to", "system")


class FieldError(ValueError):
    """A message field is missing or wrong; the text starts with the field name."""


def _show(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)[:60]


def _unicode(key: str, value: str) -> str:
    """JSON may spell a lone surrogate (\\ud800); no store or platform can keep one."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise FieldError(f"{key}: is not valid Unicode (a lone surrogate)") from None
    return value


def _string(obj: dict[str, Any], key: str, default: str | None = None) -> str:
    value = obj.get(key, default)
    if value is None:
        raise FieldError(f"{key}: is required")
    if not isinstance(value, str):
        raise FieldError(f"{key}: must be a string, not {_show(value)}")
    return _unicode(key, value)


def _bool(obj: dict[str, Any], key: str) -> bool:
    value = obj.get(key, False)
    if not isinstance(value, bool):
        raise FieldError(f"{key}: must be true or false, not {_show(value)}")
    return value


def parse_at(obj: dict[str, Any], default: float) -> float:
    at = obj.get("at", default)
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
        raise FieldError(f"at: must be a number of seconds, not {_show(at)}")
    return float(at)


def parse_message(obj: Any, *, platform: str, default_id: str, bot_id: str) -> Message:
    """A decoded JSON object as a Message; FieldError names the first thing wrong.

    Messages authored by `bot_id` are that bot's own, whatever their `bot` flag.
    """
    if not isinstance(obj, dict):
        raise FieldError("must be a JSON object")
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        raise FieldError(f"{unknown[0]}: unknown field (known: {', '.join(FIELDS)})")
    chat = _string(obj, "chat")
    author = _string(obj, "author")
    msg_id = _string(obj, "id", default_id)
    for key, value in (("chat", chat), ("author", author), ("id", msg_id)):
        if not value:
            raise FieldError(f"{key}: must not be empty")
    kind = obj.get("kind", "group")
    if kind not in ("group", "dm"):
        raise FieldError(f'kind: must be "group" or "dm", not {_show(kind)}')
    mentions = obj.get("mentions", [])
    if not isinstance(mentions, list) or not all(isinstance(m, str) for m in mentions):
        raise FieldError("mentions: must be a list of author ids (strings)")
    for m in mentions:
        _unicode("mentions", m)
    reply_to = obj.get("reply_to")
    if reply_to is not None and not isinstance(reply_to, str):
        raise FieldError(f"reply_to: must be an author id or null, not {_show(reply_to)}")
    if reply_to is not None:
        _unicode("reply_to", reply_to)
    return Message(
        id=msg_id,
        chat=ChatRef(platform=platform, id=chat, kind=ChatKind(kind)),
        author=Author(id=author, name=author, is_bot=_bool(obj, "bot") or author == bot_id),
        text=_string(obj, "text", ""),
        mentions=tuple(mentions),
        reply_to=reply_to,
        system=_bool(obj, "system"),
    )


def decision_fields(d: Decision, chat: str) -> dict[str, Any]:
    """A decision as replay prints it and the ingress answers it (DESIGN §5.2)."""
    return {
        "id": d.message_id,
        "chat": chat,
        "author": d.author,
        "turn": d.turn.value,
        "soft": d.soft,
        "hard": d.hard,
        "action": d.action.value,
        "reason": None if d.reason is None else d.reason.value,
        "warning": d.warning,
    }
