"""What the guard compares, computed once per call in Python: a call's
signature (tool + canonical arguments), its input tokens, a result's hash and
a question's topic. The detectors (guard.lua) only compare these strings."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

MAX_TOKENS = 256  # per call; more adds nothing to a similarity
_WORD = re.compile(r"\w+", re.UNICODE)
# Words that say nothing about what a question is about (for the KB topic).
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "for",
        "from",
        "had",
        "has",
        "have",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "me",
        "my",
        "of",
        "on",
        "or",
        "our",
        "please",
        "should",
        "so",
        "than",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
    ]
)


def canonical(value: Any) -> str:
    """JSON with sorted keys and no spaces: equal arguments, equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def signature(tool: str, args: Any) -> str:
    return digest(tool + "\x00" + canonical(args))


def result_hash(output: Any) -> str:
    return digest(canonical(output))


def _words(value: Any, out: set[str]) -> None:
    if isinstance(value, str):
        out.update(w.lower() for w in _WORD.findall(value))
    elif isinstance(value, dict):
        for v in value.values():
            _words(v, out)
    elif isinstance(value, list):
        for v in value:
            _words(v, out)
    elif value is not None:
        out.add(str(value).lower())


def tokens(value: Any) -> list[str]:
    """The normalised tokens of a call's input (or a response): lower-case
    words of every string, numbers and booleans as they print; a sorted set."""
    out: set[str] = set()
    _words(value, out)
    return sorted(out)[:MAX_TOKENS]


def topic(question: str) -> str:
    """A question's fingerprint: its words (longer than one letter, so "what's"
    is "what") minus stop words, as a set, so a reordered re-ask or one with
    other filler words is the same topic."""
    words = {w.lower() for w in _WORD.findall(question) if len(w) > 1} - STOPWORDS
    return digest(" ".join(sorted(words)))
