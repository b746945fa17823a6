"""The guard's masking of volatile text (clock times, durations, UUIDs) is
written for speed (gateway/guard/normalize.py): it must mask exactly what the
obvious spelling of the same four patterns masks, on any text. So must its
hashes, made two from one text: the same as made one by one, and the same as
the releases before made them (a session kept in Redis outlives a release)."""

from __future__ import annotations

import os
import re

import pytest
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


CALL_OBVIOUS = re.compile(
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b|\d+"
)


@settings(max_examples=EXAMPLES * 4, deadline=None, suppress_health_check=list(HealthCheck))
@given(TEXT)
def test_a_calls_shape_masks_what_the_obvious_spelling_masks(text: str) -> None:
    assert normalize._CALL_MASK.sub("#", text) == CALL_OBVIOUS.sub("#", text)


def test_key_values_are_masked_only_where_a_separator_is() -> None:
    keys = normalize._keys(normalize.VOLATILE_KEYS)
    assert normalize.volatile_text("pid=42 ok", keys) == "pid=~ ok"
    assert normalize.volatile_text("Elapsed: 3 ok", keys) == "Elapsed: ~ ok"
    assert normalize.volatile_text("pid 42 ok", keys) == "pid 42 ok"  # no separator


def _every_pair(text: str, keys: frozenset[str]) -> str:
    """volatile_text as it was before it looked for a volatile key first:
    the pairs' pattern and its call on every text with a separator."""
    text = normalize._VOLATILE_TEXT.sub("~", text)
    if keys and ("=" in text or ":" in text):
        text = normalize._KEY_VALUE.sub(
            lambda m: m[1] + "~" if normalize._key(m[2]) in keys else m[0], text
        )
    return text


# Keys as agents spell them (case, `_`, `-`), near misses, and characters
# whose lower case is longer (İ) or that are word characters elsewhere.
KEY_PIECES = [
    "pid", "PID", "Pid", "p_i-d", "duration_ms", "Duration-MS", "durationMs", "elapsed",
    "elapsed_seconds", "ts", "t_s", "trace_id", "traceId", "x-pid", "1-pid", "_pid", "pidx",
    "runtime_ms", "İ", "é", "ß", "xΣ", "xς", "xσ", "Σ",
]  # fmt: skip
KEY_TEXT = st.lists(
    st.one_of(st.sampled_from(KEY_PIECES), st.text("=: ,;-_\n0123456789abcxyzİéΣ", max_size=4)),
    max_size=10,
).map("".join)


def test_a_key_with_a_final_sigma_is_still_found() -> None:
    # "Σ" lowers to "ς" at a word's end but to "σ" before ":a" in the whole text
    keys = normalize._keys(("xς",))
    assert normalize.volatile_text("xΣ:a", keys) == "xΣ:~" == _every_pair("xΣ:a", keys)


@settings(max_examples=EXAMPLES * 20, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    KEY_TEXT,
    st.sampled_from([normalize.VOLATILE_KEYS, ("pid",), ("Trace-ID", "ts"), ("xς",), ("xσ",), ()]),
)
def test_looking_for_a_key_first_masks_the_same_pairs(text: str, names: tuple[str, ...]) -> None:
    keys = normalize._keys(names)
    assert normalize.volatile_text(text, keys) == _every_pair(text, keys)


@settings(max_examples=EXAMPLES * 5, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.text())
def test_looking_for_a_key_first_on_any_text(text: str) -> None:
    keys = normalize._keys(normalize.VOLATILE_KEYS)
    assert normalize.volatile_text(text, keys) == _every_pair(text, keys)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.text(min_size=1, max_size=8), JSON)
def test_hashes_made_two_from_one_text_are_the_hashes_made_one_by_one(
    tool: str, value: object
) -> None:
    assert normalize.call_hashes(tool, value) == (
        normalize.signature(tool, value),
        normalize.shape(value),
    )
    assert normalize.value_hashes(value) == (
        normalize.digest(normalize.canonical(value)),
        normalize.shape(value),
    )


def test_the_hashes_are_those_sessions_already_hold() -> None:
    args = {"path": "src/mod3.py", "start": 10, "count": 40}
    assert normalize.call_hashes("read_file", args) == ("7b427237a2eafa27", "68fbabac113cddf1")
    output = {"lines": ["001: took 12 ms", "pid=42"], "ok": True}
    steady = normalize.steady(output)
    assert steady == {"lines": ["001: took ~", "pid=~"], "ok": True}
    assert normalize.value_hashes(steady) == (
        normalize.digest('{"lines":["001: took ~","pid=~"],"ok":true}'),
        normalize.digest('{"lines":["#: took ~","pid=~"],"ok":true}'),
    )


def test_volatile_text_is_masked_in_a_value_s_first_mask_chars_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The proxies take results of many megabytes; masking all of one held the
    # daemon's event loop for about a second a 10 MB result. Past MASK_CHARS a
    # value is compared as it is: a difference there is a difference.
    monkeypatch.setattr(normalize, "MASK_CHARS", 64)
    filler = "x" * 100
    first = f"took 12ms {filler} took 5ms"
    assert normalize.result_hash(first) == normalize.result_hash(f"took 99ms {filler} took 5ms")
    assert normalize.result_hash(first) != normalize.result_hash(f"took 12ms {filler} took 6ms")
    assert normalize.volatile_text(first, frozenset()) == f"took ~ {filler} took 5ms"
    # One budget for every string of a value, however it is split up
    masked = normalize.steady(["took 1ms"] * 20)
    assert sum(s == "took ~" for s in masked) == 8  # 64 characters, 8 each
    assert sum(s == "took 1ms" for s in masked) == 12
    # A shape masks the numbers of the same first characters only
    assert normalize.shape(f"error 3 {filler} at 9") == normalize.shape(f"error 4 {filler} at 9")
    assert normalize.shape(f"error 3 {filler} at 9") != normalize.shape(f"error 3 {filler} at 8")


def test_a_long_value_s_words_are_its_distinct_words() -> None:
    text = "Alpha beta ALPHA gamma_1 " * 10_000
    assert normalize.words({"a": text, "b": ["Beta", 3, True]}) == {
        "alpha", "beta", "gamma_1", "3", "true"
    }  # fmt: skip
