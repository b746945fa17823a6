"""`botbouncer replay`: a transcript through the real pipeline (docs/replay.md).

No platform, no backend: `action: reply` means the message would go to the
backend, and it keeps its rate-cap slot as if the backend answered. The bot's
own messages appear only as transcript lines authored by it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TextIO

from gateway.errors import BotbouncerError
from gateway.model import Message
from gateway.pipeline import Gateway
from gateway.wire import FieldError, decision_fields, parse_input


class ReplayError(BotbouncerError):
    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line}: {problem}")
        self.line = line


@dataclass
class _Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


def parse_line(raw: str, line: int, prev_at: float | None, bot_id: str) -> tuple[Message, float]:
    """One transcript line as a Message and its time; ReplayError names what is
    wrong, the fields in the words the HTTP ingress uses (gateway/wire.py)."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ReplayError(line, f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    except ValueError as exc:  # an integer past Python's digit limit
        raise ReplayError(line, f"invalid JSON: {exc}") from None
    except RecursionError:
        raise ReplayError(line, "invalid JSON: nested too deeply") from None
    try:
        given = parse_input(obj, platform="replay", default_id=f"m{line}", bot_id=bot_id)
    except FieldError as exc:
        raise ReplayError(line, str(exc)) from None
    msg = given.message
    at = given.at if given.at is not None else 0.0 if prev_at is None else prev_at + 1.0
    if prev_at is not None and at < prev_at:
        raise ReplayError(line, f"at: goes back in time ({at} after {prev_at})")
    return msg, at


def replay_clock() -> _Clock:
    """A clock for a replay gateway; `replay` moves it to each line's `at`."""
    return _Clock()


def _text(raw: str | bytes, line: int) -> str:
    """A line as text: bytes are decoded here, line by line, so that a bad byte
    is a bad line like any other (named, after the lines before it). A byte
    order mark before the first line is no part of it."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ReplayError(line, f"not UTF-8 text (bad byte at offset {exc.start})") from None
    return raw.removeprefix("\ufeff") if line == 1 else raw


async def replay(
    lines: Iterable[str | bytes], gateway: Gateway, clock: _Clock, out: TextIO
) -> None:
    """Print one decision per line, in order; raise ReplayError at the first bad line
    (the lines before it have been printed)."""
    prev_at: float | None = None
    for number, raw in enumerate(lines, start=1):
        text = _text(raw, number)
        if not text.strip():
            continue
        msg, at = parse_line(text, number, prev_at, gateway.bot_id)
        prev_at = clock.now = at
        d = await gateway.handle(msg)
        row = {"i": number - 1, **decision_fields(d, msg.chat.id)}
        out.write(json.dumps(row, ensure_ascii=False) + "\n")
        out.flush()
