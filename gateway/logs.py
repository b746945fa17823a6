"""Log set-up for the daemon: readable lines by default, JSON lines for machines.

Decision lines carry their fields in `extra={"decision": ...}`; the JSON
format puts them under "decision" so a log shipper can index every field of
every decision without parsing the text.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import UTC, datetime

from gateway.redact import RedactingFilter

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


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
        return json.dumps(out, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """TEXT_FORMAT, written as an f-string for a line without a traceback or
    a stack (logging's Formatter looks for `%(asctime)` in the format and
    fills it from the record's dict for every line), its time's date part
    made once a second (time.strftime for every line was a tenth of what a
    decision line costs). Lines read exactly as logging.Formatter(TEXT_FORMAT)
    writes them."""

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info or record.exc_text or record.stack_info:
            return super().format(record)
        record.message = record.getMessage()
        record.asctime = self.formatTime(record)
        return f"{record.asctime} {record.levelname:<7} {record.name}: {record.message}"

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
