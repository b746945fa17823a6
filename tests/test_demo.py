"""`botbouncer demo` (README.md): the story it tells must be the pipeline's truth.

The demo prints a chat and a summary; these tests read the chat lines back and
hold the summary to them, so a number that is assumed instead of counted, or a
loop that stops one message late, fails here.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.demo import LIMIT_REASONS, SOFT_LIMIT, run_demo

REPO = Path(__file__).resolve().parent.parent
ANSI = "\x1b["
SPEAKER = re.compile(r"^\s*(?P<who>ana|ping-bot|pong-bot) │ (?P<text>.*)$")
SKIP = re.compile(r"^\s*· (?P<bot>\S+) skipped (?P<author>\S+)'s (?P<what>\w+): (?P<reason>\w+)")
QUIET = "… the chat is quiet"


@dataclass
class Line:
    kind: str  # human, reply, warning, skip, reset, quiet or other
    who: str = ""
    text: str = ""
    reason: str = ""


def classify(raw: str) -> Line:
    if m := SPEAKER.match(raw):
        who, text = m["who"], m["text"]
        if who == "ana":
            return Line("human", who, text)
        return Line("warning" if "turn limit reached" in text else "reply", who, text)
    if m := SKIP.match(raw):
        return Line("skip", m["bot"], raw.strip(), m["reason"])
    if "a human spoke: bot turns" in raw:
        return Line("reset", text=raw.strip())
    return Line("quiet" if raw.startswith(QUIET) else "other", text=raw)


@dataclass
class Demo:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[Line]:
        return [classify(raw) for raw in self.out.splitlines()]

    def rounds(self) -> list[list[Line]]:
        """The lines from each human message up to the next one, or to the summary."""
        out: list[list[Line]] = []
        for line in self.lines:
            if line.kind == "human":
                out.append([])
            elif line.text == "Summary":
                break
            if out and line.kind != "other":
                out[-1].append(line)
        return out

    def summary(self, label: str) -> str:
        m = re.search(rf"^  {re.escape(label)}\s+(.*)$", self.out, re.MULTILINE)
        assert m, f"no summary line {label!r} in:\n{self.out}"
        return m[1]


def count(lines: list[Line], kind: str) -> int:
    return sum(1 for line in lines if line.kind == kind)


@pytest.fixture
def demo(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Demo:
    """`botbouncer demo` run in-process, as a pipe would see it (not a terminal)."""
    monkeypatch.delenv("NO_COLOR", raising=False)
    capsys.readouterr()
    code = main(["demo"])
    cap = capsys.readouterr()
    return Demo(code, cap.out, cap.err)


def test_the_command_exits_0_with_plain_text_when_not_a_tty(demo: Demo) -> None:
    assert demo.code == 0
    assert demo.err == ""
    assert ANSI not in demo.out
    assert "Summary" in demo.out
    assert len(demo.out.splitlines()) <= 40


def test_exactly_one_warning_before_ana_speaks_again(demo: Demo) -> None:
    first, _ = demo.rounds()
    assert count(first, "warning") == 1
    assert count(first, "reset") == 0  # a new chat: there was nothing to reset
    assert first[-1].kind == "quiet"


def test_the_first_loop_stops_after_exactly_soft_limit_bot_replies(demo: Demo) -> None:
    first, _ = demo.rounds()
    assert count(first, "reply") == SOFT_LIMIT
    assert demo.summary("bot replies before the first stop").startswith(f"{SOFT_LIMIT} ")
    warning = next(line for line in first if line.kind == "warning")
    assert f"({SOFT_LIMIT}/{SOFT_LIMIT})" in warning.text
    # the warning comes after the last reply, and nothing a bot says follows it
    kinds = [line.kind for line in first if line.kind in ("reply", "warning")]
    assert kinds[-1] == "warning"


def test_the_silence_has_visible_limit_reasons(demo: Demo) -> None:
    first, _ = demo.rounds()
    reasons = [line.reason for line in first if line.kind == "skip"]
    assert "turn_soft_limit" in reasons
    assert "turn_throttled" in reasons


def test_ana_speaking_again_resets_and_the_bots_resume_then_stop_again(demo: Demo) -> None:
    _, second = demo.rounds()
    assert "You two!" in second[0].text
    # the human's message zeroes the counters: the six replies and the warning
    assert second[1].kind == "reset" and f"bot turns {SOFT_LIMIT + 1} → 0" in second[1].text
    assert count(second, "reset") == 1
    said = [line for line in second if line.kind in ("reply", "warning")]
    assert said[0].kind == "reply" and "ana" in said[0].text  # a bot answers the human
    assert count(second, "reply") == SOFT_LIMIT
    assert count(second, "warning") == 1
    assert second[-1].kind == "quiet"


def test_the_summary_counts_what_was_printed(demo: Demo) -> None:
    lines = demo.lines
    replies = count(lines, "reply")
    warnings = count(lines, "warning")
    avoided = sum(1 for line in lines if line.kind == "skip" and line.reason in LIMIT_REASONS)
    assert demo.summary("warnings posted") == str(warnings)
    assert demo.summary("backend calls") == f"{replies} made, {avoided} avoided"
    # a person who mentions a bot is answered without asking the model
    to_people = sum(1 for line in lines if line.kind == "reply" and ", ana!" in line.text)
    assert to_people == 2
    assert demo.summary("classifier calls") == f"{replies - to_people} made, {avoided} avoided"
    assert avoided > 0
    assert "forever" in demo.out


def test_skips_that_are_not_limits_are_shown_but_not_counted_as_avoided(demo: Demo) -> None:
    skips = [line for line in demo.lines if line.kind == "skip"]
    assert {"not_addressed"} <= {line.reason for line in skips}
    assert all(line.reason != "own_message" for line in skips)


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_colour_unless_asked_not_to(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    tty = FakeTTY()
    assert run_demo(delay=0, out=tty) == 0
    assert ANSI in tty.getvalue()

    plain = FakeTTY()
    assert run_demo(delay=0, color=False, out=plain) == 0
    assert ANSI not in plain.getvalue()

    monkeypatch.setenv("NO_COLOR", "1")
    no_color = FakeTTY()
    assert run_demo(delay=0, out=no_color) == 0
    assert ANSI not in no_color.getvalue()
    assert no_color.getvalue() == plain.getvalue()


def test_python_m_gateway_demo_runs_end_to_end() -> None:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "demo"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert ANSI not in proc.stdout
    result = Demo(proc.returncode, proc.stdout, proc.stderr)
    assert count(result.lines, "reply") == 2 * SOFT_LIMIT
    assert count(result.lines, "quiet") == 2
