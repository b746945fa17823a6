"""`botbouncer replay`: a transcript through the real pipeline (DESIGN §5.2).

No platform, no backend: `action: reply` means the message would go to the
backend, and it keeps its rate-cap slot as if the backend answered. The bot's
own messages appear only as transcript lines authored by it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TextIO

from gateway.model import Author, ChatKind, ChatRef, Message
from gateway.pipeline import Gateway

FIELDS = ("chat", "author", "bot", "text", "id", "at", "kind", "mentions", "reply_to", "system")


class ReplayError(Exception):
    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line}: {problem}")
        self.line = line


@dataclass
class _Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


def _string(obj: dict[str, Any], key: str, line: int, default: str | None = None) -> str:
    value = obj.get(key, default)
    if value is None:
        raise ReplayError(line, f"{key}: is required")
    if not isinstance(value, str):
        raise ReplayError(line, f"{key}: must be a string, not {json.dumps(value)}")
    return value


def _bool(obj: dict[str, Any], key: str, line: int) -> bool:
    value = obj.get(key, False)
    if not isinstance(value, bool):
        raise ReplayError(line, f"{key}: must be true or false, not {json.dumps(value)}")
    return value


def parse_line(raw: str, line: int, prev_at: float | None, bot_id: str) -> tuple[Message, float]:
    """One transcript line as a Message and its time; ReplayError names what is wrong."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ReplayError(line, f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise ReplayError(line, "must be a JSON object")
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        raise ReplayError(line, f"{unknown[0]}: unknown field (known: {', '.join(FIELDS)})")
    chat = _string(obj, "chat", line)
    author = _string(obj, "author", line)
    for key, value in (("chat", chat), ("author", author)):
        if not value:
            raise ReplayError(line, f"{key}: must not be empty")
    msg_id = _string(obj, "id", line, f"m{line}")
    if not msg_id:
        raise ReplayError(line, "id: must not be empty")
    at = obj.get("at", 0.0 if prev_at is None else prev_at + 1.0)
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
        raise ReplayError(line, f"at: must be a number of seconds, not {json.dumps(at)}")
    if prev_at is not None and at < prev_at:
        raise ReplayError(line, f"at: goes back in time ({at} after {prev_at})")
    kind = obj.get("kind", "group")
    if kind not in ("group", "dm"):
        raise ReplayError(line, f'kind: must be "group" or "dm", not {json.dumps(kind)}')
    mentions = obj.get("mentions", [])
    if not isinstance(mentions, list) or not all(isinstance(m, str) for m in mentions):
        raise ReplayError(line, "mentions: must be a list of author ids (strings)")
    reply_to = obj.get("reply_to")
    if reply_to is not None and not isinstance(reply_to, str):
        raise ReplayError(
            line, f"reply_to: must be an author id or null, not {json.dumps(reply_to)}"
        )
    msg = Message(
        id=msg_id,
        chat=ChatRef(platform="replay", id=chat, kind=ChatKind(kind)),
        author=Author(id=author, name=author, is_bot=_bool(obj, "bot", line) or author == bot_id),
        text=_string(obj, "text", line, ""),
        mentions=tuple(mentions),
        reply_to=reply_to,
        system=_bool(obj, "system", line),
    )
    return msg, float(at)


def replay_clock() -> _Clock:
    """A clock for a replay gateway; `replay` moves it to each line's `at`."""
    return _Clock()


async def replay(lines: Iterable[str], gateway: Gateway, clock: _Clock, out: TextIO) -> None:
    """Print one decision per line, in order; raise ReplayError at the first bad line
    (the lines before it have been printed)."""
    prev_at: float | None = None
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        msg, at = parse_line(raw, number, prev_at, gateway.bot_id)
        prev_at = clock.now = at
        d = await gateway.handle(msg)
        row = {
            "i": number - 1,
            "id": d.message_id,
            "chat": msg.chat.id,
            "author": d.author,
            "turn": d.turn.value,
            "soft": d.soft,
            "hard": d.hard,
            "action": d.action.value,
            "reason": None if d.reason is None else d.reason.value,
            "warning": d.warning,
        }
        out.write(json.dumps(row, ensure_ascii=False) + "\n")
        out.flush()
