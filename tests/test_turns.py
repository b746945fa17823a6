"""The pure rules of docs/architecture.mdone assertion per sentence."""

from __future__ import annotations

import pytest

from gateway.model import Author, ChatKind, ChatRef, Message, Reason, Turn
from gateway.turns import Count, count_kind, local_reason, verdict

GROUP = ChatRef("http", "g")
DM = ChatRef("http", "d", kind=ChatKind.DM)


@pytest.mark.parametrize(
    ("soft", "hard", "expected"),
    [
        (1, 1, Turn.OK),
        (19, 19, Turn.OK),
        (20, 20, Turn.SOFT_LIMIT),
        (21, 21, Turn.THROTTLED),
        (99, 99, Turn.THROTTLED),
        (100, 100, Turn.HARD_LIMIT),
        (101, 101, Turn.STOPPED),
        # hard is checked before soft
        (20, 100, Turn.HARD_LIMIT),
        (20, 101, Turn.STOPPED),
    ],
)
def test_verdicts_in_their_order(soft: int, hard: int, expected: Turn) -> None:
    assert verdict(soft, hard, 20, 100) is expected


def msg(author: str = "alice", *, bot: bool = False, text: str = "hi", chat: ChatRef = GROUP,
        mentions: tuple[str, ...] = (), reply_to: str | None = None,
        system: bool = False) -> Message:  # fmt: skip
    return Message("m", chat, Author(author, is_bot=bot), text, mentions, reply_to, system)


def test_what_counts() -> None:
    assert count_kind(msg("other", bot=True), "me") is Count.BOT
    assert count_kind(msg("me"), "me") is Count.BOT  # own messages count, flag or not
    assert count_kind(msg(), "me") is Count.RESET
    assert count_kind(msg(text="  "), "me") is Count.NONE
    assert count_kind(msg(system=True), "me") is Count.NONE
    assert count_kind(msg("other", bot=True, system=True), "me") is Count.NONE


def reason(m: Message, bot_messages: str = "off", trusted: frozenset[str] = frozenset(),
           respond_to: str = "mentions") -> Reason | None:  # fmt: skip
    return local_reason(m, "me", bot_messages=bot_messages, trusted_bots=trusted,
                        respond_to=respond_to)  # fmt: skip


def test_gating() -> None:
    assert reason(msg("me")) is Reason.OWN_MESSAGE
    assert reason(msg(system=True, mentions=("me",))) is Reason.SYSTEM_MESSAGE
    assert reason(msg("b", bot=True, mentions=("me",))) is Reason.BOT_IGNORED
    assert reason(msg("b", bot=True), "mentions") is Reason.BOT_IGNORED
    assert reason(msg("b", bot=True, mentions=("me",)), "mentions") is None
    assert reason(msg("b", bot=True, reply_to="me"), "mentions") is None
    assert reason(msg("b", bot=True, mentions=("me",)), "all", frozenset({"c"})) is (
        Reason.BOT_IGNORED)  # fmt: skip
    assert reason(msg("c", bot=True, mentions=("me",)), "all", frozenset({"c"})) is None
    assert reason(msg("b", bot=True), "all") is Reason.NOT_ADDRESSED
    assert reason(msg("b", bot=True), "all", respond_to="all") is None


def test_addressing() -> None:
    assert reason(msg()) is Reason.NOT_ADDRESSED
    assert reason(msg(mentions=("someone",))) is Reason.NOT_ADDRESSED
    assert reason(msg(mentions=("me",))) is None
    assert reason(msg(reply_to="me")) is None
    assert reason(msg(chat=DM)) is None
    assert reason(msg(), respond_to="all") is None
