"""Log set-up for the daemon: readable lines by default, JSON lines for machines.

Decision lines carry their fields in `extra={"decision": ...}`; the JSON
format puts them under "decision" so a log shipper can index every field of
every decision without parsing the text.

A record is one line in either format, whatever its fields hold: an author,
chat or message id comes from whoever posts to the ingress, and a newline in
one would otherwise start a line that reads as a record of its own (a forged
decision). Text lines have their control characters escaped the way Python's
repr writes them (`\n`, `\x00`, `\u2028`); JSON lines are escaped by the
JSON encoder, and here also the characters it leaves alone that some line
readers split at (NEL, U+2028, U+2029) or that reorder what a terminal shows.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import traceback
from collections.abc import Iterator
from datetime import UTC, datetime
from types import TracebackType

from gateway.redact import SECRETS, RedactingFilter

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"

# What a text line must not carry raw: C0 (newline, carriage return, tab, NUL,
# the escape of terminal sequences ...), DEL, C1 (NEL among them), the line and
# paragraph separators, and the bidi controls that make a terminal show a line
# in another order than it was written.
_SEPARATORS = (0x2028, 0x2029)
_BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}
_ESCAPES.update({0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"})
_ESCAPES.update({c: f"\\u{c:04x}" for c in (*_SEPARATORS, *_BIDI)})
_CONTROL = re.compile("[" + "".join(f"\\u{c:04x}" for c in _ESCAPES) + "]")
# A traceback's lines stay lines.
_CONTROL_IN_LINES = re.compile("[" + "".join(f"\\u{c:04x}" for c in _ESCAPES if c != 0x0A) + "]")
# What json.dumps leaves raw of those (it escapes C0 itself), as JSON escapes.
_JSON_ESCAPES = {c: f"\\u{c:04x}" for c in (*range(0x7F, 0xA0), *_SEPARATORS, *_BIDI)}
_JSON_CONTROL = re.compile("[" + "".join(f"\\u{c:04x}" for c in _JSON_ESCAPES) + "]")
# The bytes of ASCII's control characters made non-ASCII, the others kept.
_ASCII_MARKED = bytes(0x80 if b < 0x20 or b == 0x7F else b for b in range(256))


def _escape_match(match: re.Match[str]) -> str:
    return _ESCAPES[ord(match.group())]


def escape(text: str) -> str:
    """`text` as one line. A line without a character to escape, the usual
    case, is looked through as cheaply as it can be: str.isascii() reads a
    flag, and for an ASCII line a table lookup per byte then bytes.isascii()
    (8 bytes at a time) took 160 ns for a 190-character decision line, where
    str.isprintable() took 390 and a regex search 650 (formatting the line
    takes 750)."""
    if text.isascii():
        if text.encode("ascii").translate(_ASCII_MARKED).isascii():
            return text
    elif text.isprintable():  # false for every character escaped, and a few more
        return text
    return _CONTROL.sub(_escape_match, text)


def _escape_lines(text: str) -> str:
    return _CONTROL_IN_LINES.sub(_escape_match, text)


_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]


def _exception_texts(exc: BaseException) -> Iterator[str]:
    """The "Type: message" part of each exception a traceback shows, where it
    runs over more than one line (its message, or a note, came with newlines).
    A SyntaxError's lines are its source line and caret, not its message."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        todo += (e.__cause__, e.__context__)
        if isinstance(e, SyntaxError):
            continue
        shown = "".join(traceback.format_exception_only(type(e), e)).rstrip("\n")
        if "\n" in shown:
            yield shown


def _traceback(text: str, exc_info: _ExcInfo | None) -> str:
    """A traceback keeps its own line breaks; those inside an exception's message
    are escaped, so a message cannot start a line that reads as a record. The
    message is found as the traceback shows it, or as RedactingFilter masked
    it; an exception group shows its members' messages indented, where a line
    reads as no record anyway."""
    if exc_info is not None and exc_info[1] is not None:
        for shown in _exception_texts(exc_info[1]):
            for form in (shown, SECRETS(shown)):
                if form in text:
                    text = text.replace(form, escape(form))
                    break
    return _escape_lines(text)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        decision = getattr(record, "decision", None)
        if decision is not None:
            out["decision"] = decision
        if record.exc_info:
            # exc_text: the traceback as RedactingFilter left it, secrets masked
            out["exception"] = record.exc_text or self.formatException(record.exc_info)
        line = json.dumps(out, ensure_ascii=False, default=str)
        if line.isascii() and "\x7f" not in line:
            return line
        return _JSON_CONTROL.sub(lambda m: _JSON_ESCAPES[ord(m.group())], line)


class TextFormatter(logging.Formatter):
    """TEXT_FORMAT, written as an f-string for a line without a traceback or
    a stack (logging's Formatter looks for `%(asctime)` in the format and
    fills it from the record's dict for every line), its time's date part
    made once a second (time.strftime for every line was a tenth of what a
    decision line costs). Lines read exactly as logging.Formatter(TEXT_FORMAT)
    writes them, but for control characters, escaped (see the module's
    docstring): the record's own fields are never changed, other handlers see
    them as they were logged."""

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        record.asctime = self.formatTime(record)
        line = escape(f"{record.asctime} {record.levelname:<7} {record.name}: {record.message}")
        if not (record.exc_info or record.exc_text or record.stack_info):
            return line
        # as logging.Formatter.format goes on, each part escaped
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line = f"{line}\n{_traceback(record.exc_text, record.exc_info)}"
        if record.stack_info:
            if line[-1:] != "\n":
                line += "\n"
            line += _escape_lines(self.formatStack(record.stack_info))
        return line

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)
        self._stamp = (-1, "")  # (second, its strftime): one attribute, so threads agree

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        second = int(record.created)
        stamp = self._stamp
        if stamp[0] != second:
            stamp = (second, time.strftime(self.default_time_format, self.converter(second)))
            self._stamp = stamp
        return f"{stamp[1]},{int(record.msecs):03d}"  # logging's default_msec_format


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is at the time (a test may swap it)."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def setup_logging(level: str, fmt: str) -> logging.Handler:
    """`fmt` is "text" or "json"; everything goes to stderr. Calling it again
    replaces its own handler, not ones others installed. Returns the handler,
    for a caller that runs in-process (tests) to remove when done. Every line
    has the configured secrets masked (gateway/redact.py)."""
    # No format here shows the thread or process: the logging HOWTO's
    # "Optimization" flags spare each record (a decision line per message)
    # looking them up.
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = _Stderr()
    handler.addFilter(RedactingFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, _Stderr)] + [handler]
    root.setLevel(level.upper())
    # httpx logs every request at INFO: with Telegram polling, a line per long
    # poll. Its requests show at debug level, like every other library's.
    logging.getLogger("httpx").setLevel(
        logging.DEBUG if root.level <= logging.DEBUG else logging.WARNING
    )
    return handler
