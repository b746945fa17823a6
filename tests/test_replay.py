"""`botbouncer replay` (docs/replay.mda contract), read against the rules of docs/architecture.md.

Most cases call `gateway.cli.main()` in-process; a few run the real command
(`python -m gateway replay ...`) as a subprocess. Expected outputs are whole
objects, keys in the contract's order.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main

REPO = Path(__file__).resolve().parent.parent
KEYS = ["i", "id", "chat", "author", "turn", "soft", "hard", "action", "reason", "warning"]
WARN_SOFT = (
    "⚠️ Bot turn limit reached ({n}/{limit}). "
    "A human must reply here to continue the bot-to-bot conversation."
)
WARN_HARD = "🛑 Hard bot turn limit reached ({n}). A human must reply to continue."

Line = dict[str, Any] | str


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def row(
    i: int,
    author: str,
    turn: str,
    soft: int,
    hard: int,
    action: str,
    reason: str | None = None,
    warning: str | None = None,
    *,
    chat: str = "c",
    id: str | None = None,
) -> dict[str, Any]:
    """One expected output object; `id` defaults to m<line number> = m<i + 1>."""
    return {
        "i": i,
        "id": f"m{i + 1}" if id is None else id,
        "chat": chat,
        "author": author,
        "turn": turn,
        "soft": soft,
        "hard": hard,
        "action": action,
        "reason": reason,
        "warning": warning,
    }


def soft_warning(n: int, limit: int) -> str:
    return WARN_SOFT.format(n=n, limit=limit)


def hard_warning(n: int) -> str:
    return WARN_HARD.format(n=n)


def human(text: str = "hello", chat: str = "c", **extra: Any) -> dict[str, Any]:
    return {"chat": chat, "author": "alice", "text": text, **extra}


def peer(chat: str = "c", author: str = "peer", **extra: Any) -> dict[str, Any]:
    """Another bot, talking to the gateway's bot `bot`."""
    return {"chat": chat, "author": author, "bot": True, "text": "hi bot", "mentions": ["bot"],
            **extra}  # fmt: skip


def own(chat: str = "c", **extra: Any) -> dict[str, Any]:
    """A message of the bot the gateway plays (`bot`)."""
    return {"chat": chat, "author": "bot", "bot": True, "text": "hi peer", **extra}


def transcript_text(lines: Iterable[Line]) -> str:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)


def config_text(bots: Iterable[str] = ("bot",), **defaults: Any) -> str:
    """A config (JSON is YAML) with `defaults` and http/echo bots."""
    return json.dumps(
        {
            "defaults": defaults,
            "bots": [{"name": n, "platform": "http", "backend": {"type": "echo"}} for n in bots],
        }
    )


def parse_rows(out: str) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in out.splitlines()]
    for r in rows:
        assert list(r) == KEYS, r
    return rows


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def rows(self) -> list[dict[str, Any]]:
        return parse_rows(self.out)


Replay = Callable[..., Result]


@pytest.fixture
def replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Replay:
    """replay(lines, *args, config=None) -> Result, through gateway.cli.main()."""

    def run(lines: Iterable[Line], *args: str, config: str | None = None) -> Result:
        path = tmp_path / "t.jsonl"
        path.write_text(transcript_text(lines), encoding="utf-8")
        argv = ["replay", str(path), *args]
        if config is not None:
            cfg = tmp_path / "config.yml"
            cfg.write_text(config, encoding="utf-8")
            argv += ["-c", str(cfg)]
        capsys.readouterr()
        code = main(argv)
        cap = capsys.readouterr()
        assert "Traceback" not in cap.err
        return Result(code, cap.out, cap.err)

    return run


def run_cli(*args: str, stdin: str | None = None) -> Result:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=60,
    )
    assert "Traceback" not in proc.stderr
    return Result(proc.returncode, proc.stdout, proc.stderr)


# Turn limits small enough to walk through by hand; bots answer bots; no rate cap in the way.
SMALL = config_text(
    turns={"soft_limit": 3, "hard_limit": 5},
    bot_messages="all",
    rate_cap={"max_replies": 1000},
)


# --------------------------------------------------------------------------
# defaults of the input fields
# --------------------------------------------------------------------------


def test_ids_default_to_line_number_and_blank_lines_count(replay: Replay) -> None:
    res = replay(
        [
            human("hi"),
            "",
            "   \t",
            human("hey bot", mentions=["bot"]),
            human("again", id="custom"),
            "",
        ]
    )
    assert res.code == 0
    assert res.err == ""
    assert res.rows == [
        row(0, "alice", "reset", 0, 0, "drop", "not_addressed"),
        row(3, "alice", "reset", 0, 0, "reply"),
        row(4, "alice", "reset", 0, 0, "drop", "not_addressed", id="custom"),
    ]


def test_at_defaults_to_previous_plus_one(replay: Replay) -> None:
    # One reply per 1.5 s: a reply is possible only if at least 1.5 s passed
    # since the last one, so the outcome shows where each line is in time.
    config = config_text(respond_to="all", rate_cap={"max_replies": 1, "window_seconds": 1.5})
    res = replay(
        [
            human("a", at=100.0),
            human("b"),  # 101: 1 s after the reply -> capped
            human("c"),  # 102: 2 s after it -> reply
            human("d"),  # 103: 1 s after the last reply -> capped
        ],
        config=config,
    )
    assert res.code == 0
    assert res.rows == [
        row(0, "alice", "reset", 0, 0, "reply"),
        row(1, "alice", "reset", 0, 0, "drop", "rate_capped"),
        row(2, "alice", "reset", 0, 0, "reply"),
        row(3, "alice", "reset", 0, 0, "drop", "rate_capped"),
    ]


def test_first_at_defaults_to_zero(replay: Replay) -> None:
    config = config_text(respond_to="all", rate_cap={"max_replies": 1, "window_seconds": 1.5})
    res = replay(
        [
            human("a"),  # at 0.0
            human("b", at=0.0),  # not back in time
            human("c", at=1.4),  # the slot of line 1 is still in the window
            human("d", at=1.6),  # now it is not
        ],
        config=config,
    )
    assert res.code == 0, res.err
    assert [r["reason"] for r in res.rows] == [None, "rate_capped", "rate_capped", None]


def test_kind_defaults_to_group(replay: Replay) -> None:
    res = replay([human("x"), human("x", kind="group"), human("x", kind="dm")])
    assert res.rows == [
        row(0, "alice", "reset", 0, 0, "drop", "not_addressed"),
        row(1, "alice", "reset", 0, 0, "drop", "not_addressed"),
        row(2, "alice", "reset", 0, 0, "reply"),
    ]


# --------------------------------------------------------------------------
# which bot the gateway plays
# --------------------------------------------------------------------------


def test_without_config_the_bot_is_named_bot(replay: Replay) -> None:
    res = replay(
        [
            {"chat": "c", "author": "bot", "text": "hi"},  # own even without bot: true
            {"chat": "c", "author": "helper", "bot": True, "text": "hi", "mentions": ["bot"]},
            human("hey", mentions=["bot"]),
            human("hey", mentions=["helper"]),
        ]
    )
    assert res.code == 0
    assert res.rows == [
        row(0, "bot", "ok", 1, 1, "drop", "own_message"),
        row(1, "helper", "ok", 2, 2, "drop", "bot_ignored"),  # bot_messages: off
        row(2, "alice", "reset", 0, 0, "reply"),
        row(3, "alice", "reset", 0, 0, "drop", "not_addressed"),
    ]


def test_with_config_the_first_bot_is_played(replay: Replay) -> None:
    res = replay(
        [
            {"chat": "c", "author": "alpha", "text": "hi"},
            {"chat": "c", "author": "beta", "bot": True, "text": "hi", "mentions": ["alpha"]},
            human("hey", mentions=["alpha"]),
            human("hey", mentions=["beta"]),
            {"chat": "c", "author": "bot", "text": "just a person named bot"},
        ],
        config=config_text(bots=("alpha", "beta")),
    )
    assert res.code == 0
    assert res.rows == [
        row(0, "alpha", "ok", 1, 1, "drop", "own_message"),
        row(1, "beta", "ok", 2, 2, "drop", "bot_ignored"),
        row(2, "alice", "reset", 0, 0, "reply"),
        row(3, "alice", "reset", 0, 0, "drop", "not_addressed"),
        row(4, "bot", "reset", 0, 0, "drop", "not_addressed"),
    ]


def test_as_picks_another_configured_bot(replay: Replay) -> None:
    res = replay(
        [
            {"chat": "c", "author": "alpha", "bot": True, "text": "hi"},
            {"chat": "c", "author": "beta", "bot": True, "text": "hi"},
            human("hey", mentions=["alpha"]),
            human("hey", mentions=["beta"]),
        ],
        "--as",
        "beta",
        config=config_text(bots=("alpha", "beta")),
    )
    assert res.code == 0
    assert res.rows == [
        row(0, "alpha", "ok", 1, 1, "drop", "bot_ignored"),
        row(1, "beta", "ok", 2, 2, "drop", "own_message"),
        row(2, "alice", "reset", 0, 0, "drop", "not_addressed"),
        row(3, "alice", "reset", 0, 0, "reply"),
    ]


@pytest.mark.parametrize("with_config", [True, False], ids=["config", "no-config"])
def test_unknown_as_is_an_error(replay: Replay, with_config: bool) -> None:
    config = config_text(bots=("alpha", "beta")) if with_config else None
    res = replay([human("hey")], "--as", "gamma", config=config)
    assert res.code == 2
    assert res.out == ""
    assert "gamma" in res.err


def test_invalid_config_is_an_error_naming_the_key(replay: Replay) -> None:
    res = replay([human("hey")], config=config_text(rate_cap={"max_replies": 0}))
    assert res.code == 2
    assert res.out == ""
    assert "defaults.rate_cap.max_replies: must be >= 1" in res.err


# --------------------------------------------------------------------------
# turn tracking and warnings
# --------------------------------------------------------------------------


def test_ping_pong_small_limits(replay: Replay) -> None:
    res = replay(
        [
            peer(),  # 1
            own(),  # 2
            peer(),  # 3: soft limit, `bot` has spoken and is not the author -> warns
            own(),  # 4
            peer(),  # 5: hard limit -> warns
            own(),  # 6
            peer(),  # 7
            human("enough, you two"),  # reset
            peer(),  # 1
            own(),  # 2
            peer(),  # 3: soft limit again, a new reset -> warns again
            peer(),  # 4
            peer(),  # 5: hard limit again -> warns again
            peer(),  # 6
        ],
        config=SMALL,
    )
    assert res.code == 0, res.err
    assert res.rows == [
        row(0, "peer", "ok", 1, 1, "reply"),
        row(1, "bot", "ok", 2, 2, "drop", "own_message"),
        row(2, "peer", "soft_limit", 3, 3, "warn", "turn_soft_limit", soft_warning(3, 3)),
        row(3, "bot", "throttled", 4, 4, "drop", "own_message"),
        row(4, "peer", "hard_limit", 5, 5, "warn", "turn_hard_limit", hard_warning(5)),
        row(5, "bot", "stopped", 6, 6, "drop", "own_message"),
        row(6, "peer", "stopped", 7, 7, "drop", "turn_stopped"),
        row(7, "alice", "reset", 0, 0, "drop", "not_addressed"),
        row(8, "peer", "ok", 1, 1, "reply"),
        row(9, "bot", "ok", 2, 2, "drop", "own_message"),
        row(10, "peer", "soft_limit", 3, 3, "warn", "turn_soft_limit", soft_warning(3, 3)),
        row(11, "peer", "throttled", 4, 4, "drop", "turn_throttled"),
        row(12, "peer", "hard_limit", 5, 5, "warn", "turn_hard_limit", hard_warning(5)),
        row(13, "peer", "stopped", 6, 6, "drop", "turn_stopped"),
    ]


def _expected_ping_pong(first: int, count: int, offset: int) -> list[dict[str, Any]]:
    """Lines first..first+count-1 of a bot/peer ping-pong under default limits
    (20/100), where `bot` wrote bot turn 1 and `bot` has spoken since the reset."""
    rows = []
    for k in range(count):
        n = k + 1  # bot turn number since the reset
        author = "bot" if n % 2 else "peer"
        turn = (
            "ok" if n < 20 else "soft_limit" if n == 20 else "throttled" if n < 100
            else "hard_limit" if n == 100 else "stopped"
        )  # fmt: skip
        if author == "bot":
            action, reason, warning = "drop", "own_message", None
        elif turn == "ok":
            action, reason, warning = "reply", None, None
        elif turn == "soft_limit":
            action, reason, warning = "warn", "turn_soft_limit", soft_warning(20, 20)
        elif turn == "hard_limit":
            action, reason, warning = "warn", "turn_hard_limit", hard_warning(100)
        else:
            action, reason, warning = "drop", f"turn_{turn}", None
        rows.append(
            row(first + k, author, turn, n, n, action, reason, warning, id=f"m{offset + k}")
        )
    return rows


def test_ping_pong_default_limits(replay: Replay) -> None:
    # Default turn limits; the pair window and rate cap are kept out of the way
    # (humans do not end a pair cooldown, so it would still hold after the reset).
    config = config_text(
        bot_messages="all", rate_cap={"max_replies": 1000}, pairs={"max_events": 1000}
    )
    lines = [own() if n % 2 else peer() for n in range(1, 103)]
    lines.append(human("stop"))
    lines += [own() if n % 2 else peer() for n in range(1, 23)]
    res = replay(lines, config=config)
    assert res.code == 0, res.err
    rows = res.rows
    # the 20th bot message, by the peer: soft limit and the one warning
    assert rows[19] == row(
        19, "peer", "soft_limit", 20, 20, "warn", "turn_soft_limit",
        "⚠️ Bot turn limit reached (20/20). A human must reply here to continue the "
        "bot-to-bot conversation.",
    )  # fmt: skip
    assert rows[20] == row(20, "bot", "throttled", 21, 21, "drop", "own_message")
    assert rows[21] == row(21, "peer", "throttled", 22, 22, "drop", "turn_throttled")
    assert rows[99] == row(
        99, "peer", "hard_limit", 100, 100, "warn", "turn_hard_limit",
        "🛑 Hard bot turn limit reached (100). A human must reply to continue.",
    )  # fmt: skip
    assert rows[101] == row(101, "peer", "stopped", 102, 102, "drop", "turn_stopped")
    assert rows[102] == row(102, "alice", "reset", 0, 0, "drop", "not_addressed")
    assert rows[122] == row(
        122, "peer", "soft_limit", 20, 20, "warn", "turn_soft_limit", soft_warning(20, 20)
    )
    assert rows == [
        *_expected_ping_pong(0, 102, 1),
        row(102, "alice", "reset", 0, 0, "drop", "not_addressed"),
        *_expected_ping_pong(103, 22, 104),
    ]
    assert sum(r["action"] == "warn" for r in rows) == 3


def test_bot_that_has_not_spoken_since_the_reset_does_not_warn(replay: Replay) -> None:
    res = replay(
        [
            own(),  # spoke - but before the reset
            human("hi all"),
            peer(),
            peer(),
            peer(),  # soft limit
            peer(),
            peer(),  # hard limit
        ],
        config=SMALL,
    )
    assert res.code == 0, res.err
    assert res.rows == [
        row(0, "bot", "ok", 1, 1, "drop", "own_message"),
        row(1, "alice", "reset", 0, 0, "drop", "not_addressed"),
        row(2, "peer", "ok", 1, 1, "reply"),
        row(3, "peer", "ok", 2, 2, "reply"),
        row(4, "peer", "soft_limit", 3, 3, "drop", "turn_soft_limit"),
        row(5, "peer", "throttled", 4, 4, "drop", "turn_throttled"),
        row(6, "peer", "hard_limit", 5, 5, "drop", "turn_hard_limit"),
    ]


def test_the_author_of_the_threshold_message_does_not_warn(replay: Replay) -> None:
    res = replay([peer(), peer(), own(), peer(), own()], config=SMALL)
    assert res.code == 0, res.err
    assert res.rows == [
        row(0, "peer", "ok", 1, 1, "reply"),
        row(1, "peer", "ok", 2, 2, "reply"),
        row(2, "bot", "soft_limit", 3, 3, "drop", "own_message"),
        row(3, "peer", "throttled", 4, 4, "drop", "turn_throttled"),  # past it: silent
        row(4, "bot", "hard_limit", 5, 5, "drop", "own_message"),
    ]


def test_one_warning_per_threshold_also_for_a_redelivered_message(replay: Replay) -> None:
    res = replay([own(), peer(), peer(id="p3"), peer(id="p3"), peer()], config=SMALL)
    assert res.code == 0, res.err
    assert res.rows == [
        row(0, "bot", "ok", 1, 1, "drop", "own_message"),
        row(1, "peer", "ok", 2, 2, "reply"),
        row(2, "peer", "soft_limit", 3, 3, "warn", "turn_soft_limit", soft_warning(3, 3),
            id="p3"),
        row(3, "peer", "none", 3, 3, "drop", "duplicate", id="p3"),
        row(4, "peer", "throttled", 4, 4, "drop", "turn_throttled"),
    ]  # fmt: skip


def test_warning_texts_are_configurable(replay: Replay) -> None:
    config = config_text(
        turns={"soft_limit": 2, "hard_limit": 3, "warn_soft": "soft {n} of {limit}",
               "warn_hard": "hard at {n}"},
        bot_messages="all",
    )  # fmt: skip
    res = replay([own(), peer(), peer()], config=config)
    assert res.code == 0, res.err
    assert res.rows == [
        row(0, "bot", "ok", 1, 1, "drop", "own_message"),
        row(1, "peer", "soft_limit", 2, 2, "warn", "turn_soft_limit", "soft 2 of 2"),
        row(2, "peer", "hard_limit", 3, 3, "warn", "turn_hard_limit", "hard at 3"),
    ]


def test_system_and_empty_messages_do_not_reset(replay: Replay) -> None:
    res = replay(
        [
            peer(),
            peer(),
            human("alice pinned a message", system=True),
            human("alice pinned a message", system=True, mentions=["bot"]),
            human(""),
            human("   "),
            peer(),  # soft limit 3: nothing above reset
        ],
        config=SMALL,
    )
    assert res.code == 0, res.err
    assert res.rows == [
        row(0, "peer", "ok", 1, 1, "reply"),
        row(1, "peer", "ok", 2, 2, "reply"),
        row(2, "alice", "none", 2, 2, "drop", "system_message"),
        row(3, "alice", "none", 2, 2, "drop", "system_message"),
        row(4, "alice", "none", 2, 2, "drop", "not_addressed"),
        row(5, "alice", "none", 2, 2, "drop", "not_addressed"),
        row(6, "peer", "soft_limit", 3, 3, "drop", "turn_soft_limit"),
    ]


def test_chats_are_independent(replay: Replay) -> None:
    res = replay(
        [
            peer(chat="a"),
            peer(chat="b"),
            peer(chat="a"),
            human("hi", chat="b"),
            peer(chat="a"),  # b's reset does not touch a
            peer(chat="b"),
        ],
        config=SMALL,
    )
    assert res.code == 0, res.err
    assert res.rows == [
        row(0, "peer", "ok", 1, 1, "reply", chat="a"),
        row(1, "peer", "ok", 1, 1, "reply", chat="b"),
        row(2, "peer", "ok", 2, 2, "reply", chat="a"),
        row(3, "alice", "reset", 0, 0, "drop", "not_addressed", chat="b"),
        row(4, "peer", "soft_limit", 3, 3, "drop", "turn_soft_limit", chat="a"),
        row(5, "peer", "ok", 1, 1, "reply", chat="b"),
    ]


def test_a_duplicate_id_counts_once(replay: Replay) -> None:
    res = replay(
        [
            peer(id="p1"),
            peer(id="p1"),
            peer(id="p2"),
            own(id="o1"),
            own(id="o1"),
            peer(id="p3"),  # 3 distinct bot turns before it: soft limit
        ],
        config=config_text(turns={"soft_limit": 4, "hard_limit": 10}, bot_messages="all"),
    )
    assert res.code == 0, res.err
    assert res.rows == [
        row(0, "peer", "ok", 1, 1, "reply", id="p1"),
        row(1, "peer", "none", 1, 1, "drop", "duplicate", id="p1"),
        row(2, "peer", "ok", 2, 2, "reply", id="p2"),
        row(3, "bot", "ok", 3, 3, "drop", "own_message", id="o1"),
        row(4, "bot", "none", 3, 3, "drop", "duplicate", id="o1"),
        row(5, "peer", "soft_limit", 4, 4, "warn", "turn_soft_limit", soft_warning(4, 4),
            id="p3"),
    ]  # fmt: skip


def test_a_duplicate_human_message_does_not_reset_again(replay: Replay) -> None:
    res = replay([human("hi", id="h1"), peer(), peer(), human("hi", id="h1"), peer()], config=SMALL)
    assert res.code == 0, res.err
    rows = res.rows
    assert rows[3]["turn"] == "none"
    assert (rows[3]["action"], rows[3]["reason"]) == ("drop", "duplicate")
    assert rows[4] == row(4, "peer", "soft_limit", 3, 3, "drop", "turn_soft_limit")


# --------------------------------------------------------------------------
# addressing
# --------------------------------------------------------------------------


def test_respond_to_mentions(replay: Replay) -> None:
    res = replay(
        [
            human("hello"),
            human("hello", mentions=["bot"]),
            human("hello", mentions=["someone", "else"]),
            human("hello", reply_to="bot"),
            human("hello", reply_to="someone"),
            human("hello", kind="dm"),
        ]
    )
    assert res.code == 0, res.err
    assert res.rows == [
        row(0, "alice", "reset", 0, 0, "drop", "not_addressed"),
        row(1, "alice", "reset", 0, 0, "reply"),
        row(2, "alice", "reset", 0, 0, "drop", "not_addressed"),
        row(3, "alice", "reset", 0, 0, "reply"),
        row(4, "alice", "reset", 0, 0, "drop", "not_addressed"),
        row(5, "alice", "reset", 0, 0, "reply"),
    ]


def test_respond_to_all(replay: Replay) -> None:
    res = replay(
        [human("hello"), human("hello", mentions=["someone"]), human("hi", kind="dm")],
        config=config_text(respond_to="all"),
    )
    assert res.code == 0, res.err
    assert res.rows == [
        row(0, "alice", "reset", 0, 0, "reply"),
        row(1, "alice", "reset", 0, 0, "reply"),
        row(2, "alice", "reset", 0, 0, "reply"),
    ]


def test_bot_messages_mentions(replay: Replay) -> None:
    res = replay(
        [peer(mentions=[]), peer(), peer(mentions=[], reply_to="bot")],
        config=config_text(bot_messages="mentions"),
    )
    assert res.code == 0, res.err
    assert res.rows == [
        row(0, "peer", "ok", 1, 1, "drop", "bot_ignored"),
        row(1, "peer", "ok", 2, 2, "reply"),
        row(2, "peer", "ok", 3, 3, "reply"),
    ]


# --------------------------------------------------------------------------
# rate cap
# --------------------------------------------------------------------------


def test_rate_cap_default_six_per_120_seconds(replay: Replay) -> None:
    ask = {"mentions": ["bot"]}
    res = replay(
        [human(f"q{n}", **ask) for n in range(7)]  # at 0..6
        + [
            human("late", at=120.5, **ask),  # the slot taken at 0 has left the window
            human("late", at=120.6, **ask),  # the slots of 1..5 have not
            human("much later", at=127.0, **ask),  # all gone
        ]
    )
    assert res.code == 0, res.err
    assert res.rows == [row(n, "alice", "reset", 0, 0, "reply") for n in range(6)] + [
        row(6, "alice", "reset", 0, 0, "drop", "rate_capped"),
        row(7, "alice", "reset", 0, 0, "reply"),
        row(8, "alice", "reset", 0, 0, "drop", "rate_capped"),
        row(9, "alice", "reset", 0, 0, "reply"),
    ]


def test_rate_cap_does_not_apply_to_dms_under_scope_groups(replay: Replay) -> None:
    res = replay([human(f"q{n}", kind="dm") for n in range(10)])
    assert res.code == 0, res.err
    assert res.rows == [row(n, "alice", "reset", 0, 0, "reply") for n in range(10)]


def test_rate_cap_applies_to_dms_under_scope_all(replay: Replay) -> None:
    res = replay(
        [human(f"q{n}", kind="dm") for n in range(7)],
        config=config_text(rate_cap={"scope": "all"}),
    )
    assert res.code == 0, res.err
    assert [r["reason"] for r in res.rows] == [None] * 6 + ["rate_capped"]


def test_rate_cap_is_per_chat(replay: Replay) -> None:
    ask = {"mentions": ["bot"]}
    res = replay([human("q", chat="a", **ask) for _ in range(7)] + [human("q", chat="b", **ask)])
    assert res.code == 0, res.err
    assert [r["reason"] for r in res.rows] == [None] * 6 + ["rate_capped", None]


# --------------------------------------------------------------------------
# pair loop protection
# --------------------------------------------------------------------------


def test_pair_cooldown(replay: Replay) -> None:
    config = config_text(
        turns={"soft_limit": 50, "hard_limit": 100},
        pairs={"max_events": 3, "window_seconds": 60, "cooldown_seconds": 30},
        bot_messages="all",
        rate_cap={"max_replies": 1000},
    )
    res = replay(
        [
            peer(at=0.0),  # no previous bot message: not an exchange
            own(at=1.0),  # exchange 1
            peer(at=2.0),  # exchange 2
            own(at=3.0),  # exchange 3
            peer(at=4.0),  # exchange 4 > max_events -> cooldown
            own(at=5.0),
            peer(at=6.0),
            human("keep going", at=7.0),  # resets the turns, not the cooldown
            peer(at=8.0),
            peer(author="other", at=9.0),  # another pair: not in cooldown
            peer(at=33.0),  # still within 30 s of every exchange that triggered it
            peer(at=37.0),  # 31 s after the last exchange: over
        ],
        config=config,
    )
    assert res.code == 0, res.err
    assert res.rows == [
        row(0, "peer", "ok", 1, 1, "reply"),
        row(1, "bot", "ok", 2, 2, "drop", "own_message"),
        row(2, "peer", "ok", 3, 3, "reply"),
        row(3, "bot", "ok", 4, 4, "drop", "own_message"),
        row(4, "peer", "ok", 5, 5, "drop", "pair_cooldown"),
        row(5, "bot", "ok", 6, 6, "drop", "own_message"),
        row(6, "peer", "ok", 7, 7, "drop", "pair_cooldown"),
        row(7, "alice", "reset", 0, 0, "drop", "not_addressed"),
        row(8, "peer", "ok", 1, 1, "drop", "pair_cooldown"),
        row(9, "other", "ok", 2, 2, "reply"),
        row(10, "peer", "ok", 3, 3, "drop", "pair_cooldown"),
        row(11, "peer", "ok", 4, 4, "reply"),
    ]


def test_pair_cooldown_needs_more_than_max_events_within_the_window(replay: Replay) -> None:
    config = config_text(
        turns={"soft_limit": 50, "hard_limit": 100},
        pairs={"max_events": 3, "window_seconds": 10, "cooldown_seconds": 30},
        bot_messages="all",
        rate_cap={"max_replies": 1000},
    )
    res = replay(
        [
            own(at=0.0),
            peer(at=1.0),  # exchange 1
            own(at=2.0),  # exchange 2
            peer(at=3.0),  # exchange 3: max_events, not more
            own(at=20.0),  # exchange 4, but 1..3 have left the 10 s window
            peer(at=21.0),  # 2 in the window
            own(at=22.0),  # 3
            peer(at=23.0),  # 4 > 3: cooldown
        ],
        config=config,
    )
    assert res.code == 0, res.err
    assert res.rows == [
        row(0, "bot", "ok", 1, 1, "drop", "own_message"),
        row(1, "peer", "ok", 2, 2, "reply"),
        row(2, "bot", "ok", 3, 3, "drop", "own_message"),
        row(3, "peer", "ok", 4, 4, "reply"),
        row(4, "bot", "ok", 5, 5, "drop", "own_message"),
        row(5, "peer", "ok", 6, 6, "reply"),
        row(6, "bot", "ok", 7, 7, "drop", "own_message"),
        row(7, "peer", "ok", 8, 8, "drop", "pair_cooldown"),
    ]


# --------------------------------------------------------------------------
# invalid input
# --------------------------------------------------------------------------

GOOD = [human("one", mentions=["bot"]), peer()]
GOOD_ROWS = [
    row(0, "alice", "reset", 0, 0, "reply"),
    row(1, "peer", "ok", 1, 1, "drop", "bot_ignored"),
]

BAD_LINES = {
    "bad-json": ('{"chat": "c", "author": ', r"line 3: .*JSON"),
    "not-an-object": ('["c", "alice"]', r"line 3: .*object"),
    "missing-chat": ({"author": "alice", "text": "x"}, r"line 3: chat\b"),
    "missing-author": ({"chat": "c", "text": "x"}, r"line 3: author\b"),
    "unknown-field": ({"chat": "c", "author": "a", "colour": "red"}, r"line 3: colour\b"),
    "bot-not-bool": ({"chat": "c", "author": "a", "bot": "yes"}, r"line 3: bot\b"),
    "at-not-number": ({"chat": "c", "author": "a", "at": "x"}, r"line 3: at\b"),
    "mentions-not-list": ({"chat": "c", "author": "a", "mentions": "a"}, r"line 3: mentions\b"),
    "kind-unknown": ({"chat": "c", "author": "a", "kind": "room"}, r"line 3: kind\b"),
    "at-back-in-time": ({"chat": "c", "author": "a", "at": 0.5}, r"line 3: at\b"),
    "chat-not-string": ({"chat": 5, "author": "a"}, r"line 3: chat\b"),
    "text-not-string": ({"chat": "c", "author": "a", "text": 5}, r"line 3: text\b"),
    "id-not-string": ({"chat": "c", "author": "a", "id": 7}, r"line 3: id\b"),
    "system-not-bool": ({"chat": "c", "author": "a", "system": "no"}, r"line 3: system\b"),
    "reply-to-not-string": ({"chat": "c", "author": "a", "reply_to": 1}, r"line 3: reply_to\b"),
}


@pytest.mark.parametrize(("bad", "pattern"), list(BAD_LINES.values()), ids=list(BAD_LINES))
def test_invalid_line(replay: Replay, bad: Line, pattern: str) -> None:
    # lines 1 and 2 at 0.0 and 1.0; the bad line is line 3; a valid line follows
    res = replay([*GOOD, bad, human("after", mentions=["bot"])])
    assert res.code == 2
    assert res.rows == GOOD_ROWS
    assert re.search(pattern, res.err), res.err
    assert res.err.count("line ") == 1


def test_invalid_line_number_counts_blank_lines(replay: Replay) -> None:
    res = replay(["", human("one"), "", {"chat": "c", "author": "a", "kind": "room"}])
    assert res.code == 2
    assert res.rows == [row(1, "alice", "reset", 0, 0, "drop", "not_addressed")]
    assert re.search(r"line 4: kind\b", res.err), res.err


def test_invalid_first_line_prints_nothing(replay: Replay) -> None:
    res = replay([{"chat": "c"}, human("one")])
    assert res.code == 2
    assert res.out == ""
    assert re.search(r"line 1: author\b", res.err), res.err


def test_missing_transcript_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "nowhere.jsonl"
    assert main(["replay", str(path)]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert "nowhere.jsonl" in cap.err
    assert "no such file" in cap.err.lower()
    assert "Traceback" not in cap.err


def test_stdin_in_process(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = transcript_text([own(), human("hey", mentions=["bot"])])
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    assert main(["replay", "-"]) == 0
    assert parse_rows(capsys.readouterr().out) == [
        row(0, "bot", "ok", 1, 1, "drop", "own_message"),
        row(1, "alice", "reset", 0, 0, "reply"),
    ]


# --------------------------------------------------------------------------
# the real command, as a subprocess
# --------------------------------------------------------------------------


def test_subprocess_replay_with_config_and_as(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yml"
    cfg.write_text(config_text(bots=("alpha", "beta")), encoding="utf-8")
    path = tmp_path / "t.jsonl"
    path.write_text(
        transcript_text(
            [
                {"chat": "c", "author": "beta", "bot": True, "text": "hi"},
                "",
                human("hey beta", mentions=["beta"]),
            ]
        ),
        encoding="utf-8",
    )
    res = run_cli("replay", str(path), "-c", str(cfg), "--as", "beta")
    assert res.code == 0, res.err
    assert res.err == ""
    assert res.rows == [
        row(0, "beta", "ok", 1, 1, "drop", "own_message"),
        row(2, "alice", "reset", 0, 0, "reply", id="m3"),
    ]


def test_subprocess_default_limits_without_config(tmp_path: Path) -> None:
    # bot_messages defaults to off, but turns count before any gating and the
    # warnings are posted by the bot that has spoken since the reset.
    path = tmp_path / "t.jsonl"
    lines = [own() if n % 2 else peer() for n in range(1, 103)]
    path.write_text(transcript_text(lines), encoding="utf-8")
    res = run_cli("replay", str(path))
    assert res.code == 0, res.err
    rows = res.rows
    expected = _expected_ping_pong(0, 102, 1)
    assert [(r["turn"], r["soft"], r["hard"], r["warning"]) for r in rows] == [
        (r["turn"], r["soft"], r["hard"], r["warning"]) for r in expected
    ]
    assert [r["i"] for r in rows if r["action"] == "warn"] == [19, 99]
    assert all(r["reason"] == "own_message" for r in rows if r["author"] == "bot")
    assert all(r["action"] == "drop" for r in rows if r["author"] == "peer" and r["turn"] == "ok")


def test_subprocess_invalid_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        transcript_text([*GOOD, {"chat": "c", "author": "a", "bot": "yes"}, human("after")]),
        encoding="utf-8",
    )
    res = run_cli("replay", str(path))
    assert res.code == 2
    assert res.rows == GOOD_ROWS
    assert re.search(r"line 3: bot\b", res.err), res.err


def test_subprocess_stdin(tmp_path: Path) -> None:
    res = run_cli("replay", "-", stdin=transcript_text([human("hey", kind="dm"), peer()]))
    assert res.code == 0, res.err
    assert res.rows == [
        row(0, "alice", "reset", 0, 0, "reply"),
        row(1, "peer", "ok", 1, 1, "drop", "bot_ignored"),
    ]


def test_subprocess_missing_file(tmp_path: Path) -> None:
    res = run_cli("replay", str(tmp_path / "nowhere.jsonl"))
    assert res.code == 2
    assert res.out == ""
    assert "nowhere.jsonl" in res.err


# --------------------------------------------------------------------------
# bytes that are not UTF-8, a byte order mark, a reader that stops reading
# --------------------------------------------------------------------------


def test_a_line_that_is_not_utf8_is_named_after_the_lines_before_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Like any malformed line: named, the lines before it printed, exit 2
    (not one error for the whole file with nothing printed)."""
    path = tmp_path / "t.jsonl"
    good = transcript_text(GOOD).encode()
    path.write_bytes(good + b'{"chat": "c", "author": "al", "text": "caf\xe9"}\n' + good)
    code = main(["replay", str(path)])
    cap = capsys.readouterr()
    assert code == 2
    assert parse_rows(cap.out) == GOOD_ROWS
    assert re.search(r"t\.jsonl: line 3: not UTF-8 text", cap.err), cap.err
    assert "Traceback" not in cap.err


def test_stdin_that_is_not_utf8_names_the_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "replay", "-"],
        cwd=REPO,
        input=transcript_text(GOOD).encode() + b"\xff\xfe\n",
        capture_output=True,
        timeout=60,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert parse_rows(proc.stdout.decode()) == GOOD_ROWS
    assert "-: line 3: not UTF-8 text" in err and "Traceback" not in err


def test_a_byte_order_mark_before_the_first_line_is_not_an_error(replay: Replay) -> None:
    """Editors on Windows save UTF-8 with a BOM; the config loader reads it too."""
    res = replay(["\ufeff" + json.dumps(human("one", mentions=["bot"])), peer()])
    assert res.code == 0, res.err
    assert res.rows == GOOD_ROWS


def test_a_reader_that_stops_reading_is_not_a_transcript_error(tmp_path: Path) -> None:
    """`replay big.jsonl | head -1`: no message blaming the transcript, no
    traceback, and the exit status of a writer whose reader went away (141,
    as a shell shows SIGPIPE), not 2, which says the transcript is bad."""
    path = tmp_path / "t.jsonl"
    path.write_text(transcript_text([peer()] * 5000), encoding="utf-8")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "replay", str(path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert json.loads(proc.stdout.readline())["i"] == 0
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert err == ""
