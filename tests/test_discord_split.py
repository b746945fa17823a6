"""Splitting replies at Discord's 2,000-character limit (pure; the adapter
end to end is in test_discord.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from adapters.discord import MESSAGE_LIMIT, split_message


def test_a_short_reply_is_one_piece() -> None:
    assert split_message("hello") == ["hello"]
    assert split_message("x" * MESSAGE_LIMIT) == ["x" * MESSAGE_LIMIT]


def test_a_long_reply_is_cut_at_a_line_break_then_a_space_then_hard() -> None:
    text = "a" * 1500 + "\n" + "b" * 1000
    assert split_message(text) == ["a" * 1500, "b" * 1000]
    words = ("word " * 500).strip()  # 2,499 characters
    pieces = split_message(words)
    assert [len(p) for p in pieces] == [1999, 499]
    assert " ".join(pieces) == words
    assert split_message("z" * 2500) == ["z" * 2000, "z" * 500]


@given(st.text(alphabet=st.sampled_from("ab \n"), max_size=7000))
def test_pieces_fit_and_lose_only_the_separators_they_were_cut_at(text: str) -> None:
    pieces = split_message(text)
    assert all(0 < len(p) <= MESSAGE_LIMIT for p in pieces)
    joined = "".join(pieces)
    assert len(text) - len(joined) <= len(pieces) + (len(text) if not text.strip() else 0)
    assert joined.replace(" ", "").replace("\n", "") == text.replace(" ", "").replace("\n", "")
