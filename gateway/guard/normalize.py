"""What the guard compares, computed once per call in Python: a call's
signature (tool + canonical arguments), its input tokens, a result's hash and
a question's topic. The detectors (guard.lua) only compare these strings.

Nothing here recurses: a value nested deeper than MAX_JSON_DEPTH is refused
before it is walked (every HTTP body already is, by gateway/http.py's
json_body), so no input can exhaust Python's stack."""

from __future__ import annotations

import base64
import functools
import hashlib
import heapq
import json
import re
import zlib
from typing import Any

# Containers (arrays and objects) nested in one JSON value, the outermost
# counting 1. Agent arguments and chat payloads nest a handful deep; 64 leaves
# room for any real one, and keeps every walk, json.dumps included, far from
# Python's recursion limit (about 1,000 frames).
MAX_JSON_DEPTH = 64
MAX_TOKENS = 64  # per call: the default of a profile's session.max_tokens
# Characters of one value (a result's output, a call's arguments) whose
# volatile text is masked and whose numbers a shape masks; the rest is
# compared as it is. Masking took up to 90 ms of CPU a megabyte here, and
# the proxies take results of many megabytes (a file read whole), which
# would hold the daemon's event loop for seconds; a text this long would not
# fit a model's context anyway. Past it, a difference only in volatile text
# is a difference: fewer repeats seen, never one more.
MASK_CHARS = 1 << 20
TOKEN_WIDTH = 4  # characters per token in tokens(): 24 bits, base64
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


def depth_over(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether `value` nests containers deeper than `limit`: one level at a
    time, so any depth is answered without recursion."""
    level = [value] if isinstance(value, dict | list) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        inner: list[Any] = []
        for item in level:
            inner.extend(item.values() if isinstance(item, dict) else item)
        level = [v for v in inner if isinstance(v, dict | list)]
    return False


_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def text_depth_over(raw: bytes, limit: int = MAX_JSON_DEPTH) -> bool | None:
    """depth_over for a JSON text before it is parsed (json.loads recurses):
    exact for valid JSON in UTF-8, None for another encoding. Every step is a
    bytes method, so a typical body (fewer brackets than `limit`) costs under
    a microsecond, far less than walking the parsed value (measured: 0.7 us
    against 13 us for a 700-byte guard step with 46 containers; a 64 KB body
    of 6,000 containers, 0.7 ms against 1.2 ms, and json.loads itself 0.9)."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    if not json.detect_encoding(raw).startswith("utf-8"):
        return None  # UTF-16/32: a bracket's byte can be half of another character
    # Outside strings only: with escaped backslashes and quotes gone, every
    # quote left opens or closes a string.
    text = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    text = b"".join(text.split(b'"')[::2]).translate(_BRACKETS, _NOT_BRACKETS)
    for _ in range(limit):  # each pass removes the innermost level
        if not text:
            return False
        text = text.replace(b"[]", b"")
    return bool(text)


def loads(raw: bytes | str, limit: int = MAX_JSON_DEPTH) -> Any:
    """json.loads for text that came from outside: a value nested deeper than
    `limit` is a ValueError, like bad JSON, where json.loads would recurse
    until a RecursionError (a traceback, and on a server a 500)."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if text_depth_over(data, limit):
        raise ValueError(f"nested deeper than {limit} levels")
    try:
        return json.loads(raw)
    except RecursionError:  # UTF-16/32, which text_depth_over cannot read
        raise ValueError(f"nested deeper than {limit} levels") from None


# What json.dumps(value, sort_keys=True, separators=(",", ":"),
# ensure_ascii=False) builds on every call, built once.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical(value: Any) -> str:
    """JSON with sorted keys and no spaces: equal arguments, equal text."""
    return _CANONICAL.encode(value)


def digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def signature(tool: str, args: Any) -> str:
    return _signature_of(tool, canonical(args))


def _signature_of(tool: str, text: str) -> str:
    return digest(tool + "\x00" + text)


# Keys whose values change on every run of one call: timings, process ids,
# run counters, ids of a run and clocks. Compared without case, `_` and `-`
# (`duration_ms`, `durationMs` and `DURATION-MS` are one key). A profile may
# replace the list (`results.volatile_keys`, docs/agent-guard.md).
VOLATILE_KEYS = (
    "duration", "duration_ms", "duration_seconds", "elapsed", "elapsed_ms",
    "elapsed_seconds", "took", "took_ms", "time_ms", "runtime_ms", "execution_count",
    "exec_count", "pid", "process_id", "session_id", "request_id", "trace_id", "span_id",
    "run_id", "timestamp", "ts", "started_at", "finished_at", "ended_at", "created_at",
    "updated_at",
)  # fmt: skip
# The same in plain text: clock times, durations, process ids, UUIDs. Written
# as one character class and then the four patterns (a date and time; a clock
# time, a duration and a UUID, each at the start of a word), so that Python's
# regex engine can skip, in C, every character that cannot start one: the
# obvious spelling, an alternation of `\d{4}-...`, `\b\d{1,2}:...`,
# `\b\d+...` and `\b[0-9a-fA-F]{8}-...`, matches exactly the same (a test
# compares them) but is tried at every character, 1.4 to 2.7 times slower on
# a kilobyte of tool output. A duration's digits are taken possessively
# (`\d*+`): giving some back would leave a digit before the unit, which no
# unit starts with, so only the backtracking goes (a line with a long number
# masks a fifth faster).
_VOLATILE_TEXT = re.compile(
    r"[\da-fA-F](?:(?<=\d)(?:"
    r"\d{3}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
    r"|(?<!\w\w)(?:\d?:\d{2}:\d{2}(?:[.,]\d+)?\b"
    r"|\d*+(?:[.,]\d++)?+\s?+(?:ms|s|sec|secs|seconds?|milliseconds?|us|µs|ns)\b))"
    r"|(?<=[0-9a-fA-F])(?<!\w\w)"
    r"[0-9a-fA-F]{7}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b)"
)
_DIGITS = re.compile(r"\d+")
# A call's shape masks its UUIDs whole as well (a retry that sends a new
# request id each time is no new call), as `\b<uuid>\b|\d+` would, in one
# character class first for the reason above (a test compares the two).
_CALL_MASK = re.compile(
    r"[\da-fA-F](?:(?<=[0-9a-fA-F])(?<!\w\w)"
    r"[0-9a-fA-F]{7}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
    r"|(?<=\d)\d*+)"
)


def _key(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


@functools.lru_cache(maxsize=64)
def _keys(names: tuple[str, ...]) -> frozenset[str]:
    """A profile's key list as _key forms: made once per list, not per call
    (a profile's lists change only when the configuration is reloaded)."""
    return frozenset(_key(k) for k in names)


@functools.lru_cache(maxsize=64)
def _any_key(keys: frozenset[str]) -> re.Pattern[str] | None:
    """Finds any of `keys` (_key forms) in a text made a _key form itself;
    None when a key holds a final sigma (ς), the one letter whose lower case
    depends on what follows it, so a word's _key form may not be part of its
    text's."""
    if any("ς" in k for k in keys):
        return None
    return re.compile("|".join(re.escape(k) for k in sorted(keys, key=len, reverse=True)))


def volatile_text(text: str, keys: frozenset[str], limit: int | None = None) -> str:
    """`text` with its clock times, durations and UUIDs masked, and the value
    of every `key=value` / `key: value` whose key is volatile; only in its
    first `limit` (MASK_CHARS) characters, the rest as it is."""
    if limit is None:
        limit = MASK_CHARS
    if len(text) > limit:
        return volatile_text(text[:limit], keys, limit) + text[limit:]
    text = _VOLATILE_TEXT.sub("~", text)
    # Scans in C before the regex's and its call per pair: a pair's key, as
    # _key makes it, is part of the whole text made so (_key maps character
    # by character), so a text that holds no volatile key has no such pair.
    if not keys or ("=" not in text and ":" not in text):
        return text
    any_key = _any_key(keys)
    if any_key is None or any_key.search(_key(text)):
        text = _KEY_VALUE.sub(lambda m: m[1] + "~" if _key(m[2]) in keys else m[0], text)
    return text


_KEY_VALUE = re.compile(r"(\b([A-Za-z][\w-]*)\s*[=:]\s*)[^\s,;]+")


def steady(
    output: Any, volatile_keys: tuple[str, ...] = VOLATILE_KEYS, *, json_in_text: int = 2
) -> Any:
    """`output` without what changes on every run of the same call: volatile
    keys dropped from objects at any depth (also from a string holding a JSON
    object or array, at any depth: an MCP result's text; `json_in_text`
    levels of JSON in such strings, so that what is hashed stays far from
    Python's recursion limit), and volatile text masked in its strings' first
    MASK_CHARS characters, all strings counted. Iterative, like words()."""
    keys = _keys(volatile_keys)
    budget = MASK_CHARS  # characters still to mask, over every string of it

    def masked(text: str) -> str:
        nonlocal budget
        if budget <= 0:
            return text
        done = volatile_text(text, keys, budget)
        budget -= len(text)
        return done

    def clean_text(text: str) -> Any:
        nonlocal budget
        # past the budget, or the levels, a string is text: not even stripped
        stripped = text.strip() if json_in_text and budget > 0 else ""
        if stripped[:1] in ("{", "[") and len(stripped) <= 65_536:
            try:  # loads: a text nested too deep is a ValueError, not a RecursionError
                parsed = loads(stripped)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict | list):
                budget -= len(text)
                return steady(parsed, volatile_keys, json_in_text=json_in_text - 1)
        return masked(text)

    if isinstance(output, str):
        return clean_text(output)
    if not isinstance(output, dict | list):
        return output
    root: list[Any] = [output]
    stack: list[tuple[Any, list[Any] | dict[str, Any], Any]] = [(output, root, 0)]
    while stack:
        item, parent, slot = stack.pop()
        if isinstance(item, dict):
            copy: dict[str, Any] = {}
            for k, v in item.items():
                if _key(str(k)) not in keys:
                    copy[k] = None
                    stack.append((v, copy, k))
            parent[slot] = copy
        elif isinstance(item, list):
            items: list[Any] = [None] * len(item)
            for i, v in enumerate(item):
                stack.append((v, items, i))
            parent[slot] = items
        elif isinstance(item, str):
            parent[slot] = clean_text(item)
        else:
            parent[slot] = item
    return root[0]


def result_hash(output: Any, volatile_keys: tuple[str, ...] = VOLATILE_KEYS) -> str:
    """A result's hash, with what changes on every run left out (steady)."""
    return digest(canonical(steady(output, volatile_keys)))


def shape(value: Any) -> str:
    """A hash of `value` with every number masked: `{"try": 3}` and `{"try": 4}`,
    "error 3" and "error 4" are one shape (a retry counter is no new call)."""
    return _shape_of(canonical(value))


def _shape_of(text: str, mask: re.Pattern[str] = _DIGITS) -> str:
    if len(text) > MASK_CHARS:  # numbers past it are part of the shape
        return digest(mask.sub("#", text[:MASK_CHARS]) + text[MASK_CHARS:])
    return digest(mask.sub("#", text))


def call_hashes(tool: str, args: Any) -> tuple[str, str]:
    """signature(tool, args) and the arguments' shape, from one canonical
    text: numbers masked, and UUIDs whole (a result's are masked by steady)."""
    text = canonical(args)
    return _signature_of(tool, text), _shape_of(text, _CALL_MASK)


def value_hashes(value: Any) -> tuple[str, str]:
    """digest(canonical(value)) and shape(value), from one canonical text."""
    text = canonical(value)
    return digest(text), _shape_of(text)


# Argument keys that name what a call acts on. Calls whose targets all differ
# (one template written to thirty files) are not rephrasings of one input,
# however alike the rest of their arguments (`fixation.target_keys`).
TARGET_KEYS = (
    "path", "file", "file_path", "filepath", "filename", "url", "uri", "id", "page",
    "target", "destination", "dest", "key", "name", "table", "channel",
)  # fmt: skip


# A result that only says the call was done: every act answers it alike, so
# its coming again is no sign that nothing changes (no_progress). Compared
# without case, surrounding space and a final period.
# A bare `true` is an answer (a yes/no tool's), not an acknowledgement.
ACKNOWLEDGEMENTS = frozenset({
    "ok", "okay", "done", "success", "successful", "succeeded", "saved",
    "written", "created", "updated", "deleted", "sent", "completed",
})  # fmt: skip
_FLAG_KEYS = frozenset({"ok", "success"})  # {"ok": true}
_WORD_KEYS = frozenset({"status", "result"})  # {"status": "ok"}


def acknowledges(output: Any, _depth: int = 0) -> bool:
    """Whether a result only acknowledges the call: `ok`, `Done.`,
    `{"ok": true}`, `{"status": "success"}` (as an object, or as its JSON
    text, an MCP result's)."""
    if isinstance(output, str):
        if len(output) > 200:  # (a large output is read no further)
            return False
        text = output.strip().rstrip(".!").strip().lower()
        if text in ACKNOWLEDGEMENTS:
            return True
        if _depth == 0 and text[:1] == "{":
            try:
                return acknowledges(json.loads(text), 1)
            except ValueError:
                return False
        return False
    if isinstance(output, dict) and 0 < len(output) <= 2:
        return all(_acknowledging(k, v) for k, v in output.items())
    return False


def _acknowledging(key: Any, value: Any) -> bool:
    if not isinstance(key, str):
        return False
    if key.lower() in _FLAG_KEYS:
        return value is True
    return key.lower() in _WORD_KEYS and isinstance(value, str) and acknowledges(value, 1)


def target(args: Any, target_keys: tuple[str, ...] = TARGET_KEYS) -> str:
    """A hash of the target arguments of a call (top-level keys of an object),
    or "" when it has none."""
    if not isinstance(args, dict):
        return ""
    keys = _keys(target_keys)
    found = {k: v for k, v in args.items() if _key(str(k)) in keys}
    return digest(canonical(found)) if found else ""


def words(value: Any) -> set[str]:
    """Lower-case words of every string, numbers and booleans as they print."""
    out: set[str] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            # each distinct word lowered once: a long text repeats its words
            out.update(w.lower() for w in set(_WORD.findall(item)))
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif item is not None:
            out.add(str(item).lower())
    return out


def tokens(value: Any, limit: int = MAX_TOKENS) -> str:
    """The tokens of a call's input (or a response) that similarities compare,
    as a bounded sketch: each distinct word hashed to 24 bits, the `limit`
    smallest hashes kept (exact for inputs of up to `limit` distinct words, a
    sample chosen by hash of larger ones), sorted, as TOKEN_WIDTH base64 characters
    each in one string. A window of calls is kept per tool in the session, so
    a token's size must not depend on the word: a 60 KB word is 4 characters
    too."""
    hashes = {zlib.crc32(w.encode("utf-8", "surrogatepass")) & 0xFFFFFF for w in words(value)}
    low = heapq.nsmallest(limit, hashes) if len(hashes) > limit else sorted(hashes)
    return base64.urlsafe_b64encode(b"".join(h.to_bytes(3, "big") for h in low)).decode("ascii")


def topic(question: str) -> str:
    """A question's fingerprint: its words minus stop words, as a set, so a
    reordered re-ask or one with other filler words is the same topic. A
    lower-case letter alone is no word ("what's" is "what"), but a digit or a
    capital is ("order 3", "plan B" are not "order 2", "plan A"); a question
    of stop words alone is its own words, not every such question's topic."""
    words = _WORD.findall(question)
    kept = {w.lower() for w in words if len(w) > 1 or not w.islower()} - STOPWORDS
    if not kept:
        kept = {w.lower() for w in words}
    return digest(" ".join(sorted(kept)))
