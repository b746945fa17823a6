"""A log record is one line of the log, whatever a client puts in the fields
it is made of (finding 7).

The author, chat and id of `POST /v1/bots/{bot}/messages` go into the decision
line as they came. A newline in one would let a client write a line of its
own, e.g. a whole decision that never happened; NUL, a carriage return, NEL,
the Unicode line separator, an ANSI escape or a bidi override would garble or
split the line for some reader. The daemon runs here as `botbouncer run` does
(its own process and log set-up, on the memory store) and is fed such fields
through the real ingress; every line it writes is checked, in both formats.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from gateway.logs import TEXT_FORMAT, JsonFormatter, TextFormatter, escape
from gateway.pipeline import log_value
from tests.redis_server import free_port

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]
# What a decision line of the text format looks like, whole.
FORGED = (
    "2026-01-01 00:00:00,000 INFO    botbouncer.decision: decision bot=b chat=http:room "
    "id=forged author=admin action=reply reason=- turn=human soft=1 hard=1"
)
# Field values a client may post, each with what the text log must show for it.
HOSTILE = {
    "newline\n" + FORGED: "newline\\n" + FORGED,
    "carriage\r" + FORGED: "carriage\\r" + FORGED,
    "crlf\r\n" + FORGED: "crlf\\r\\n" + FORGED,
    "nul\x00byte": "nul\\x00byte",
    "line\u2028separator": "line\\u2028separator",
    "paragraph\u2029separator": "paragraph\\u2029separator",
    "nel\x85control": "nel\\x85control",
    "tab\tvt\x0bff\x0cfs\x1cdel\x7f": "tab\\tvt\\x0bff\\x0cfs\\x1cdel\\x7f",
    "ansi \x1b[31mred\x1b[0m": "ansi \\x1b[31mred\\x1b[0m",
    "bidi \u202eevil\u202c": "bidi \\u202eevil\\u202c",
}
# The start of every line the text format writes for a record.
RECORD_HEAD = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) +[\w.]+: "
)
# Characters no log line may hold raw (its own "\n" ends it).
RAW_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


@asynccontextmanager
async def daemon(tmp_path: Path, log_format: str) -> AsyncIterator[tuple[str, list[bytes]]]:
    """`python -m gateway run` with one http bot; its URL, and every line it
    writes to stderr, as bytes, complete once the block is left (it stops)."""
    port = free_port()
    bot = {"name": "b", "platform": "http", "backend": {"type": "echo"}, "respond_to": "all",
           "bot_messages": "all"}  # fmt: skip
    path = tmp_path / "bb.yml"
    path.write_text(yaml.safe_dump({"http": {"listen": f"127.0.0.1:{port}"}, "bots": [bot]}))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "run", "-c", str(path), "--log-format", log_format,
        "--log-level", "debug", stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    assert proc.stderr is not None
    lines: list[bytes] = []
    try:
        async with asyncio.timeout(20):
            while b"listening on" not in (line := await proc.stderr.readline()):
                assert line, b"the daemon exited before listening:\n" + b"".join(lines)
                lines.append(line)
            lines.append(line)
        yield f"http://127.0.0.1:{port}", lines
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            lines.extend((await proc.stderr.read()).splitlines(keepends=True))
            assert await proc.wait() == 0, b"".join(lines)
    finally:
        if proc.returncode is None:
            proc.kill()
            with suppress(ProcessLookupError):
                await proc.wait()


async def post_hostile_fields(url: str) -> list[dict[str, Any]]:
    """Each hostile value as author, as chat and as id; the bodies posted."""
    bodies = []
    async with aiohttp.ClientSession() as http:
        for i, value in enumerate(HOSTILE):
            for field in ("author", "chat", "id"):
                body = {"chat": f"room{i}", "author": "alice", "id": f"m{i}-{field}",
                        "text": "hi", field: value}  # fmt: skip
                async with http.post(f"{url}/v1/bots/b/messages", json=body) as resp:
                    assert resp.status == 200, await resp.text()
                    assert (await resp.json())["action"] == "reply"
                bodies.append(body)
    return bodies


async def test_text_log_fields_from_the_ingress_cannot_forge_or_split_a_line(
    tmp_path: Path,
) -> None:
    async with daemon(tmp_path, "text") as (url, raw_lines):
        bodies = await post_hostile_fields(url)
    out = b"".join(raw_lines).decode("utf-8")
    lines = out.splitlines()  # breaks at \r, NEL, U+2028 ... too, not only at \n
    assert lines == out.split("\n")[:-1] and out.endswith("\n"), "a record spans lines"
    for line in lines:
        assert RECORD_HEAD.match(line), f"a line that is no record of its own: {line!r}"
        assert not RAW_CONTROL.search(line), f"a raw control character: {line!r}"
    decisions = [line for line in lines if "botbouncer.decision: decision " in line]
    assert len(decisions) == len(bodies)  # one line per decision, the forged ones none
    # the forged decision is in the log only inside the line of the one it came with
    assert not [line for line in lines if line.startswith(FORGED)]
    assert out.count(FORGED) == 3 * 3  # three values hold it, each posted in three fields
    assert out.count(FORGED) == sum(out.count(f"{esc}{FORGED}") for esc in ("\\n", "\\r"))
    for value in HOSTILE:
        for field in ("author", "chat", "id"):
            raw = f"http:{value}" if field == "chat" else value
            # quoted when it holds a space, = or a quote; escaped by the formatter
            shown = f"{field}={escape(log_value(raw))} "
            assert sum(shown in line for line in decisions) == 1, (field, shown)


async def test_json_log_lines_escape_every_control_character(tmp_path: Path) -> None:
    async with daemon(tmp_path, "json") as (url, raw_lines):
        bodies = await post_hostile_fields(url)
    out = b"".join(raw_lines).decode("utf-8")
    assert out.splitlines() == out.split("\n")[:-1], "a record spans lines"
    records = []
    for line in out.splitlines():
        assert not RAW_CONTROL.search(line), f"a raw control character: {line!r}"
        records.append(json.loads(line))
    decisions = [r["decision"] for r in records if "decision" in r]
    # what the client sent, unchanged once the JSON is read
    assert [(d["id"], d["chat"], d["author"]) for d in decisions] == [
        (b["id"], f"http:{b['chat']}", b["author"]) for b in bodies
    ]


def record(msg: str, *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    info = None if exc is None else (type(exc), exc, exc.__traceback__)
    return logging.LogRecord("botbouncer.decision", logging.ERROR, __file__, 1, msg, args, info)


def test_a_traceback_keeps_its_lines_and_escapes_what_its_messages_hold() -> None:
    """A traceback is several lines by nature; those are kept. The log message
    above it and each exception's message in it are escaped whole: a client's
    text in an exception cannot start a line either."""
    try:
        try:
            raise KeyError("inner\nkey")
        except KeyError as inner:
            raise ValueError(f"bad author x\n{FORGED}\r\x00\u2028") from inner
    except ValueError as exc:
        failure = exc
    text = TextFormatter().format(record("failed for %s", "a\nb\x00", exc=failure))
    lines = text.split("\n")
    assert text.splitlines() == lines
    assert lines[0].endswith(": failed for a\\nb\\x00")
    assert "Traceback (most recent call last):" in lines
    assert any(line.startswith('  File "') for line in lines)
    assert "The above exception was the direct cause of the following exception:" in lines
    assert f"ValueError: bad author x\\n{FORGED}\\r\\x00\\u2028" in lines
    assert "KeyError: 'inner\\nkey'" in lines
    assert [line for line in lines if RECORD_HEAD.match(line)] == [lines[0]]
    assert not RAW_CONTROL.search(text.replace("\n", ""))
    # A stack keeps its lines too.
    stacked = record("where %s", "x\ny")
    stacked.stack_info = "Stack (most recent call last):\n  File x\r\x00"
    assert TextFormatter().format(stacked).split("\n")[1:] == [
        "Stack (most recent call last):",
        "  File x\\r\\x00",
    ]


def test_lines_without_a_control_character_are_written_as_logging_writes_them() -> None:
    for msg in ("plain ascii", "Zoë, 😀, 日本語, \u00a0, 👩\u200d💻 (a joiner, no control)", ""):
        made = record(msg)
        plain = logging.Formatter(TEXT_FORMAT).format(logging.makeLogRecord(made.__dict__))
        assert TextFormatter().format(made) == plain
        assert json.loads(JsonFormatter().format(made))["message"] == msg


def test_a_decision_line_quotes_fields_that_would_read_as_more_fields() -> None:
    """Spaces, `=` and quotes in a chat, id or author posted to the ingress
    cannot make the line read as another decision: the field is quoted."""
    from gateway.model import Action, Decision, Turn
    from gateway.pipeline import decision_line

    def decision(chat: str, msg_id: str, author: str) -> Decision:
        return Decision(bot="b", chat=chat, message_id=msg_id, author=author,
                        action=Action.DROP, reason=None, turn=Turn.OK, soft=1, hard=1,
                        at=0.0)  # fmt: skip

    line = decision_line(decision("http:x action=reply", 'm" 1', "x author=admin"))
    assert line == (
        'decision bot=b chat="http:x action=reply" id="m\\" 1" '
        'author="x author=admin" action=drop reason=- turn=ok soft=1 hard=1'
    )
    plain = decision("http:room", "m1", "alice")
    assert "chat=http:room id=m1 author=alice action=drop" in decision_line(plain)
