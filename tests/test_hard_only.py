"""A soft limit at or above the hard one: only a hard stop (OpenAB's default
has its turn cap equal to its hard cap). The verdict order - hard before
soft - says what happens: the hard limit fires at exactly hard_limit, warns
once, and the soft limit never warns. Replayed through the real pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main

HARD_WARNING = "🛑 Hard bot turn limit reached (100). A human must reply to continue."


def transcript(bot_turns: int) -> list[dict[str, object]]:
    """A person starts it; then `bot` (the gateway's own) and `other` take turns."""
    lines: list[dict[str, object]] = [{"chat": "c", "author": "ann", "text": "go"}]
    for k in range(1, bot_turns + 1):
        lines.append({"chat": "c", "author": "bot" if k % 2 else "other", "bot": True,
                      "text": f"turn {k}"})  # fmt: skip
    return lines


@pytest.mark.parametrize(("soft", "hard"), [(100, 100), (101, 100)])
def test_only_the_hard_limit_fires(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], soft: int, hard: int
) -> None:
    config = tmp_path / "c.yml"
    config.write_text(
        "bots:\n  - {name: bot, platform: http, backend: {type: echo}, bot_messages: all,\n"
        f"     respond_to: all, turns: {{soft_limit: {soft}, hard_limit: {hard}}},\n"
        "     rate_cap: {max_replies: 1000}}\n"
    )
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in transcript(102)))
    assert main(["replay", str(path), "-c", str(config)]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    by_turn = {r["soft"]: r for r in rows[1:]}
    assert [r["turn"] for r in rows[1:100]] == ["ok"] * 99  # no soft warning on the way
    assert all(r["warning"] is None for r in rows[1:100])
    at = by_turn[100]  # other's 100th turn: the hard limit, warned once by this bot
    assert (at["turn"], at["action"], at["reason"]) == ("hard_limit", "warn", "turn_hard_limit")
    assert at["warning"] == HARD_WARNING
    assert (by_turn[101]["turn"], by_turn[101]["reason"]) == ("stopped", "own_message")
    assert (by_turn[102]["turn"], by_turn[102]["action"], by_turn[102]["reason"]) == (
        "stopped", "drop", "turn_stopped")  # fmt: skip
    assert sum(r["action"] == "warn" for r in rows) == 1
