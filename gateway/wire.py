"""The JSON message format shared by `botbouncer replay` lines and the HTTP
ingress body (docs/replay.md, docs/http-api.md): one parser, one set of error messages.

Every field is checked by both, `at` too: the ingress does not use it (the
daemon decides on the store's clock) but refuses what replay would refuse, so
a body that works on one works on the other. A field with a default may be
null, meaning the default (JSON clients often send null for "not given").

Ids (chat, author, id, reply_to and each mention) are at most MAX_ID_CHARS
characters: each is kept by the store - in keys, 128 dedupe ids and 50 log
entries a chat - and written in decision log lines, so one 60 KB id would
cost megabytes. The text has no bound here: the ingress body has one (64 KiB),
only its first CONTEXT_TEXT_CHARS are kept, and a platform sends no more than
a few thousand characters anyway.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from gateway.errors import InputError
from gateway.model import Author, ChatKind, ChatRef, Decision, Message

FIELDS = ("chat", "author", "bot", "text", "id", "at", "kind", "mentions", "reply_to", "system")
# Longer than any platform's ids (a Discord snowflake is 19 digits, a Telegram
# topic key 30 characters) or a UUID, an e-mail address or a Slack thread key.
MAX_ID_CHARS = 256
# Seconds; past this the store's millisecond clock loses precision in a float
# (2**53 ms is 9e12 s). 1e12 s is 31,000 years after 1970: any real time fits.
MAX_AT = 1e12
_AT = "at: must be a finite number of seconds (0 to 1e12)"


class FieldError(InputError):
    """A message field is missing or wrong; the text starts with the field name."""


@dataclass(frozen=True, slots=True)
class Input:
    """One message as posted or read from a transcript line: the Message and
    its `at` (None when not given: replay then counts on from the line before)."""

    message: Message
    at: float | None


def _show(value: Any) -> str:
    """A value as it was written, short: without dumping a huge list or string."""
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, str):
        return json.dumps(value if len(value) <= 40 else value[:40] + "…", ensure_ascii=False)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**40:
        return f"a {len(str(abs(value)))}-digit number"
    return json.dumps(value)  # null, true, numbers (NaN and Infinity as JSON's readers write them)


def _name(key: str) -> str:
    return key if len(key) <= 40 else key[:40] + "…"


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def clean(text: str | None) -> str:
    """Text as the gateway can keep it, a platform's or a backend's: None is
    "", and a lone surrogate (JSON may spell one, "\\ud800"; no store or
    platform can encode it) becomes U+FFFD. Everything else - NULs, zero-width
    and right-to-left characters - is the sender's business and stays as it is."""
    if not text:
        return ""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE_SURROGATE.sub("\ufffd", text)
    return text


def _unicode(key: str, value: str) -> str:
    """JSON may spell a lone surrogate (\\ud800); no store or platform can keep one."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise FieldError(f"{key} is not valid Unicode (a lone surrogate)") from None
    return value


def _id(key: str, value: Any, what: str = "must be a string", *, empty: bool = False) -> str:
    """An id: a string of at most MAX_ID_CHARS characters, not empty unless
    `empty` (a mention or reply of nobody harms nothing; a chat, author or
    message of no name would). `key` is what errors start with ("chat:",
    "mentions: item 2")."""
    if not isinstance(value, str):
        raise FieldError(f"{key} {what}, not {_show(value)}")
    if not value and not empty:
        raise FieldError(f"{key} must not be empty")
    if len(value) > MAX_ID_CHARS:
        raise FieldError(f"{key} must be at most {MAX_ID_CHARS} characters, not {len(value)}")
    return _unicode(key, value)


def _required(obj: dict[str, Any], key: str) -> str:
    value = obj.get(key)
    if value is None:
        raise FieldError(f"{key}: is required")
    return _id(f"{key}:", value)


def _bool(obj: dict[str, Any], key: str) -> bool:
    value = obj.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise FieldError(f"{key}: must be true or false, not {_show(value)}")
    return value


def _at(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FieldError(f"{_AT}, not {_show(value)}")
    try:
        at = float(value)
    except OverflowError:  # an integer past any float
        raise FieldError(f"{_AT}, not {_show(value)}") from None
    if not math.isfinite(at) or not 0 <= at <= MAX_AT:
        raise FieldError(f"{_AT}, not {_show(value)}")
    return at


def _mentions(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise FieldError(f"mentions: must be a list of author ids (strings), not {_show(value)}")
    return tuple(
        _id(f"mentions: item {i}", m, "must be an author id (a string)", empty=True)
        for i, m in enumerate(value, start=1)
    )


def parse_input(obj: Any, *, platform: str, default_id: str, bot_id: str) -> Input:
    """A decoded JSON object as a Message and its `at`; FieldError names the
    first thing wrong, in FIELDS order.

    Messages authored by `bot_id` are that bot's own, whatever their `bot` flag.
    """
    if not isinstance(obj, dict):
        raise FieldError("must be a JSON object")
    unknown = [key for key in obj if key not in FIELDS]
    if unknown:
        raise FieldError(f"{_name(min(unknown))}: unknown field (known: {', '.join(FIELDS)})")
    chat = _required(obj, "chat")
    author = _required(obj, "author")
    is_bot = _bool(obj, "bot")
    text = obj.get("text")
    if text is None:
        text = ""
    elif not isinstance(text, str):
        raise FieldError(f"text: must be a string, not {_show(text)}")
    else:
        _unicode("text:", text)
    msg_id = obj.get("id")
    msg_id = default_id if msg_id is None else _id("id:", msg_id)
    at = _at(obj.get("at"))
    kind = obj.get("kind")
    if kind is None:
        kind = "group"
    elif kind not in ("group", "dm"):
        raise FieldError(f'kind: must be "group" or "dm", not {_show(kind)}')
    mentions = _mentions(obj.get("mentions"))
    reply_to = obj.get("reply_to")
    if reply_to is not None:
        reply_to = _id("reply_to:", reply_to, "must be an author id or null", empty=True)
    message = Message(
        id=msg_id,
        chat=ChatRef(platform=platform, id=chat, kind=ChatKind(kind)),
        author=Author(id=author, name=author, is_bot=is_bot or author == bot_id),
        text=text,
        mentions=mentions,
        reply_to=reply_to,
        system=_bool(obj, "system"),
    )
    return Input(message, at)


def decision_fields(d: Decision, chat: str) -> dict[str, Any]:
    """A decision as replay prints it and the ingress answers it (docs/replay.md)."""
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
