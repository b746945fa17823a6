"""The guard's masking of volatile text (clock times, durations, UUIDs) is
written for speed (gateway/guard/normalize.py): it must mask exactly what the
obvious spelling of the same four patterns masks, on any text."""

from __future__ import annotations

import os
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.guard import normalize

# The obvious spelling: tried at every character.
OBVIOUS = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
    r"|\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b"
    r"|\b\d+(?:[.,]\d+)?\s?(?:ms|s|sec|secs|seconds?|milliseconds?|us|µs|ns)\b"
    r"|\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b",
)
EXAMPLES = int(os.environ.get("BOTBOUNCER_FUZZ_EXAMPLES", "150"))

# Pieces that match, nearly match or sit across a boundary, and the
# characters around them: ASCII and other digits (Arabic-Indic), hex letters,
# the separators the patterns use, and word characters that move `\b`.
PIECES = [
    "2024-01-02T03:04:05.123Z", "2024-01-02 03:04", "2024-01-02T03:04:05+01:00", "12:34:56",
    "1:02:03,5", "5 ms", "3.5s", "12 seconds", "7µs", "10ns", "1,5 sec",
    "123e4567-e89b-12d3-a456-426614174000", "deadbeef-dead-beef-dead-beefdeadbeef",
    "٣٣:٤٤:٥٥", "٢٠٢٤-٠١-٠٢ ١٠:٣٠", "x=1", "pid: 42", "a-b",
]  # fmt: skip
TEXT = st.lists(
    st.one_of(st.sampled_from(PIECES), st.text("0123456789abcdefABCDEFxyzT :-.,+Z_sunmµ٣é\n=;")),
    max_size=12,
).map("".join)


def test_the_cases_that_matter_are_masked() -> None:
    for text, masked in [
        ("done in 12 ms at 2024-01-02T03:04:05Z", "done in ~ at ~"),
        ("job 123e4567-e89b-12d3-a456-426614174000 took 3.5s", "job ~ took ~"),
        ("up 10:20:30, load 0.5", "up ~, load 0.5"),
        ("file_12ms.txt and 7 mss", "file_12ms.txt and 7 mss"),  # not at a word's edges
        ("٣٣:٤٤:٥٥", "~"),  # \d is any digit, as in the obvious spelling
    ]:
        assert normalize._VOLATILE_TEXT.sub("~", text) == masked
        assert OBVIOUS.sub("~", text) == masked


@settings(max_examples=EXAMPLES * 20, deadline=None, suppress_health_check=list(HealthCheck))
@given(TEXT)
def test_the_fast_spelling_masks_what_the_obvious_one_masks(text: str) -> None:
    assert normalize._VOLATILE_TEXT.sub("~", text) == OBVIOUS.sub("~", text)


@settings(max_examples=EXAMPLES * 5, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.text())
def test_on_any_text_too(text: str) -> None:
    assert normalize._VOLATILE_TEXT.sub("~", text) == OBVIOUS.sub("~", text)


def test_key_values_are_masked_only_where_a_separator_is() -> None:
    keys = normalize._keys(normalize.VOLATILE_KEYS)
    assert normalize.volatile_text("pid=42 ok", keys) == "pid=~ ok"
    assert normalize.volatile_text("Elapsed: 3 ok", keys) == "Elapsed: ~ ok"
    assert normalize.volatile_text("pid 42 ok", keys) == "pid 42 ok"  # no separator
