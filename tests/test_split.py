"""Cutting replies to a platform's message size (pure; the adapters end to
end are in test_discord.py and test_telegram.py): Discord counts characters
(2,000), Telegram UTF-16 code units (4,096)."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.common import split_message, utf16_len

LIMIT = 2000


def test_a_short_reply_is_one_piece() -> None:
    assert split_message("hello", LIMIT) == ["hello"]
    assert split_message("x" * LIMIT, LIMIT) == ["x" * LIMIT]
    assert split_message("  \n ", LIMIT) == []


def test_a_long_reply_is_cut_at_a_line_break_then_a_space_then_hard() -> None:
    text = "a" * 1500 + "\n" + "b" * 1000
    assert split_message(text, LIMIT) == ["a" * 1500, "b" * 1000]
    words = ("word " * 500).strip()  # 2,499 characters
    pieces = split_message(words, LIMIT)
    assert [len(p) for p in pieces] == [1999, 499]
    assert " ".join(pieces) == words
    assert split_message("z" * 2500, LIMIT) == ["z" * 2000, "z" * 500]


def test_utf16_counts_an_emoji_as_two() -> None:
    assert utf16_len("a😀é") == 4
    # 3,000 emoji are 6,000 units: two pieces for Telegram, however the characters fall.
    pieces = split_message("😀" * 3000, 4096, utf16_len)
    assert [utf16_len(p) for p in pieces] == [4096, 1904]
    assert "".join(pieces) == "😀" * 3000


def test_a_telegram_cut_falls_at_a_space_inside_the_unit_limit() -> None:
    text = "😀" * 2000 + " " + "b" * 3000  # 4,000 + 1 + 3,000 units
    assert split_message(text, 4096, utf16_len) == ["😀" * 2000, "b" * 3000]


@pytest.mark.parametrize(("limit", "size"), [(LIMIT, len), (4096, utf16_len)])
def test_no_piece_is_blank(limit: int, size: Callable[[str], int]) -> None:
    """A platform refuses a blank message (Telegram: "message text is empty"),
    which would lose the whole reply: a stretch of blank lines longer than a
    piece is dropped, not sent."""
    text = "first" + "\n" * (2 * limit) + "last"
    assert [p.strip() for p in split_message(text, limit, size)] == ["first", "last"]
    assert [p.strip() for p in split_message(" " * (limit + 1) + "x", limit, size)] == ["x"]


@pytest.mark.parametrize(("limit", "size"), [(LIMIT, len), (4096, utf16_len)])
@given(text=st.text(alphabet=st.sampled_from("ab \n😀"), max_size=9000))
def test_pieces_fit_and_lose_only_the_separators_they_were_cut_at(
    limit: int, size: Callable[[str], int], text: str
) -> None:
    pieces = split_message(text, limit, size)
    assert all(0 < size(p) <= limit and p.strip() for p in pieces)
    joined = "".join(pieces)
    # a cut loses its separator; a blank stretch (a quarter of a piece or more) may go whole
    blank = not text.strip() or re.search(rf"[ \n]{{{limit // 4}}}", text) is not None
    assert len(text) - len(joined) <= len(pieces) + (len(text) if blank else 0)
    assert joined.replace(" ", "").replace("\n", "") == text.replace(" ", "").replace("\n", "")
