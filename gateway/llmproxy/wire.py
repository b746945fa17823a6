"""What the APIs' mappings share: the tool events a history holds, the usage
an answer reports, Server-Sent Events read as they pass, and the interface
each API's mapping (gateway/llmproxy/openai.py, responses.py, anthropic.py)
fills. JSON from outside is read with normalize.loads: nested too deep is
unreadable, never a RecursionError."""

from __future__ import annotations

import hashlib
import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.guard.normalize import loads

Json = dict[str, Any]

# Never relayed either way by a proxy: hop-by-hop headers (RFC 9110 7.6.1)
# and what the proxy sets itself (it asks for an unencoded body: it reads it).
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length",
    "accept-encoding", "content-encoding",
})  # fmt: skip

# Where one event ends: a blank line, in any of the line endings SSE allows.
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
LINE_END = re.compile(rb"\r\n|\n|\r")  # SSE's, and only those (not U+2028, nor U+0085)
# An event longer than this without its end is not SSE: it is no longer read
# (its bytes still pass through untouched).
MAX_EVENT = 16 * 1024 * 1024


@dataclass(frozen=True)
class ToolEvent:
    """A tool call the model made (`step`) or its result the agent sent back
    (`result`), with the key that tells it from every other in the session."""

    key: str
    kind: Literal["step", "result"]
    tool: str
    args: Any = None
    ok: bool = True
    output: Any = None
    call: str | None = None  # the call's id, which its result names too


def in_call_order(events: list[ToolEvent]) -> list[ToolEvent]:
    """Each result right after its own call. A history lists parallel calls
    first and their results after (A B, then A's result and B's); the guard
    gives a result to the newest call of its tool still without one, so fed
    in that order two calls of one tool would swap results (A's answer
    taken for B's). A result whose call is not among `events` keeps its
    place."""
    called = {e.call for e in events if e.kind == "step" and e.call is not None}
    if not called:
        return events
    results: dict[str, list[ToolEvent]] = {}
    for e in events:
        if e.kind == "result" and e.call in called:
            results.setdefault(e.call, []).append(e)
    out: list[ToolEvent] = []
    for e in events:
        if e.kind == "step":
            out.append(e)
            if e.call is not None:
                out.extend(results.pop(e.call, []))
        elif e.call not in called:
            out.append(e)
    return out


@dataclass
class Usage:
    input_tokens: int = 0  # every input token, those of the prompt cache included
    output_tokens: int = 0
    seen: bool = False
    cached_tokens: int = 0  # of the input, read from the provider's prompt cache
    cache_write_tokens: int = 0  # of the input, written to it (Anthropic's)

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def objects(value: Any) -> list[Json]:
    """The JSON objects of a list (a body's messages, a message's blocks or
    tool calls); anything else there is not ours to read."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def messages(body: Json) -> list[Json]:
    """A request body's messages (both APIs call them so)."""
    return objects(body.get("messages"))


def count(value: Any) -> int:
    """A token count from an answer: a whole non-negative number, else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def digest(*parts: Any) -> str:
    text = json.dumps(parts, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "backslashreplace")).hexdigest()


# A part's prompt-cache marker (Anthropic's, OpenAI's), which an agent moves
# from request to request: not what the part holds.
_CACHE_MARKERS = frozenset({"cache_control", "prompt_cache_breakpoint"})


def uncached(content: Any) -> Any:
    """Content without its parts' prompt-cache marks: prompt caching moves
    them from turn to turn (the newest turn holds one), and the opening of
    one conversation must read the same on every request."""
    if not isinstance(content, list):
        return content
    return [_unmarked(b) if isinstance(b, dict) else b for b in content]


def _unmarked(part: Json) -> Json:
    return {k: v for k, v in part.items() if k not in _CACHE_MARKERS}


def text_of(content: Any) -> str:
    """A tool result's content as the guard compares it: a string, or the
    text of its parts with `[<type> <digest>]` in place of each part that has
    no text (an image, a document, a file), its digest taken over the part's
    JSON without its cache marker. Two results that differ only in a picture
    differ; a result of text parts alone is their text joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    out = []
    for p in content:
        if not isinstance(p, dict):
            continue
        if isinstance(p.get("text"), str):
            out.append(p["text"])
            continue
        kind = p.get("type") if isinstance(p.get("type"), str) else "part"
        out.append(f"[{kind} {digest(_unmarked(p))[:16]}]")
    return "".join(out)


def parse_arguments(arguments: Any) -> Any:
    """A tool call's arguments: OpenAI sends them as JSON text, which is
    compared as the value it holds (key order and spacing do not count)."""
    if isinstance(arguments, str):
        try:
            return loads(arguments)
        except ValueError:
            return arguments
    return arguments


def id_of(call_id: Any) -> str | None:
    """A call's id as the API gave it, None when it gave none."""
    return call_id if isinstance(call_id, str) and call_id else None


def key_of(kind: str, call_id: Any, position: int, *what: Any) -> str:
    """An event's key: its call id, which every API gives; without one, its
    position and content (a history is sent whole each time)."""
    if isinstance(call_id, str) and call_id:
        return f"{kind}:{call_id}"
    return f"{kind}:#{position}:{digest(*what)[:16]}"


class SseReader:
    """Splits a stream of bytes into SSE events as they complete, keeping each
    event's raw bytes (with its end) and its `data` joined. An event that
    arrives in many pieces costs time in proportion to its size: each piece
    is appended to the unfinished event, and only the bytes not yet searched
    are searched for its end."""

    def __init__(self, max_event: int = MAX_EVENT) -> None:
        self._max = max_event  # past it, the stream is taken for no SSE
        self._buf = bytearray()  # the unfinished event
        # Where the search for the event's end resumes. The bytes before it
        # hold no end; the last 3 bytes searched are searched again, since an
        # end (at most 4 bytes, \r\n\r\n) may be split across pieces.
        self._from = 0
        self.broken = False

    def feed(self, chunk: bytes) -> list[tuple[bytes, str | None]]:
        if self.broken:
            return [(chunk, None)]
        buf = self._buf
        buf += chunk
        start = 0
        events = []
        m = _EVENT_END.search(buf, self._from)
        while m is not None:
            raw = bytes(buf[start : m.end()])
            events.append((raw, _data(raw[: m.start() - start])))
            start = m.end()
            m = _EVENT_END.search(buf, start)
        del buf[:start]
        self._from = max(0, len(buf) - 3)
        if len(buf) > self._max:  # not SSE: passed on as raw bytes from here
            events.append((bytes(buf), None))
            self.broken = True
            buf.clear()
            self._from = 0
        return events

    def rest(self) -> bytes:
        rest = bytes(self._buf)
        self._buf.clear()
        self._from = 0
        return rest


def _data(raw: bytes) -> str | None:
    lines = []
    for line in LINE_END.split(raw):
        if line.startswith(b"data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(b" ") else value)
    if not lines:
        return None
    return b"\n".join(lines).decode("utf-8", "replace")


class Tap(ABC):
    """Watches an answer pass: `feed` gets each chunk of the upstream's body
    and returns what goes on to the agent (the chunk itself, unless the
    mapping keeps something back); `done` is called at its end."""

    def __init__(self) -> None:
        self.usage = Usage()
        self.anchor: str | None = None  # what the session's fingerprint is anchored on
        # An answer a later request may continue on the server (Responses'
        # previous_response_id): its id and its tool calls (id, name, arguments).
        self.continuable: tuple[str, list[list[str]]] | None = None
        # The answer's id as soon as it is read (a stream's first event): a
        # background response is kept from then on, though its stream may end
        # before the answer does.
        self.opened: str | None = None

    @abstractmethod
    def feed(self, chunk: bytes) -> bytes: ...

    def done(self) -> bytes:
        return b""


class EventTap(Tap):
    """A stream of SSE events whose data are JSON objects, passed on as they
    came; `read` sees each object."""

    def __init__(self) -> None:
        super().__init__()
        self._sse = SseReader()

    def feed(self, chunk: bytes) -> bytes:
        for _raw, data in self._sse.feed(chunk):
            if data is None:
                continue
            try:
                event = loads(data)
            except ValueError:
                continue
            if isinstance(event, dict):
                self.read(event)
        return chunk

    @abstractmethod
    def read(self, event: Json) -> None: ...


class WholeTap(Tap):
    """A JSON answer: read once it is whole (it passes on as it arrives)."""

    def __init__(self, dialect: Dialect) -> None:
        super().__init__()
        self._dialect = dialect
        self._parts: list[bytes] = []
        self._size = 0

    def feed(self, chunk: bytes) -> bytes:
        self._size += len(chunk)
        if self._size <= MAX_EVENT:
            self._parts.append(chunk)
        return chunk

    def done(self) -> bytes:
        if self._size > MAX_EVENT:
            return b""
        try:
            answer = loads(b"".join(self._parts))
        except ValueError:
            return b""
        if isinstance(answer, dict):
            self._dialect.read_answer(answer, self)
        return b""


@dataclass
class Anchor:
    """What the conversation's first answer with tool calls asked for, as the
    fingerprint takes it: its first call's id (unique to that answer), else
    (a server that gives no ids) a digest of its first call. The first only:
    a history may list an answer's calls each with its result after it,
    which reads as an answer a call (Responses' items). An answer of text
    alone anchors nothing: two conversations that open alike are often
    answered alike word for word ("Hi" has a stock greeting), and would be
    one session."""

    ids: list[str] = field(default_factory=list)
    # (name, arguments) of tool calls without ids, as a last resort
    calls: list[tuple[str, str]] = field(default_factory=list)

    def value(self) -> str | None:
        if self.ids:
            return "ids:" + self.ids[0]
        return "calls:" + digest(self.calls[:1]) if self.calls else None


class Dialect(ABC):
    """One API's shapes. Every method takes the request body as the agent
    sent it (a JSON object) and never fails on a shape it does not know:
    what it cannot read is forwarded untouched for the upstream to judge."""

    name: str
    model_path: str  # the route the guard watches, under the API's path
    key_header: str  # where a configured upstream key goes

    @abstractmethod
    def tool_events(self, body: Json) -> list[ToolEvent]:
        """Every tool call and result in the history, oldest first."""

    @abstractmethod
    def opening(self, body: Json) -> Any:
        """The conversation's opening (system prompt and first user turn)."""

    @abstractmethod
    def anchors(self, body: Json) -> list[str]:
        """Every answer of the history that called tools, oldest first, as
        Anchor.value() says it (the conversation's session is named by the
        first the proxy relayed: session.Anchors)."""

    @abstractmethod
    def with_note(self, body: Json, note: str, disable_tools: bool) -> Json:
        """The body with the guard's message as a system note, and tools off."""

    @abstractmethod
    def final_answer(self, body: Json, text: str) -> tuple[bytes, str]:
        """A well-formed final answer saying `text`, streamed when the body
        asks for a stream: (bytes, content type)."""

    @abstractmethod
    def error(self, status: int, message: str, code: str) -> bytes:
        """An error in the API's own shape."""

    @abstractmethod
    def read_answer(self, answer: Json, tap: Tap) -> None:
        """Usage and anchor of a whole (non-streamed) answer."""

    @abstractmethod
    def stream_tap(self, body: Json) -> Tap:
        """A tap for a streamed answer to this body."""

    def prepare(self, body: Json) -> Json | None:
        """A changed body to send instead, or None to send it as it came."""
        return None

    def prepared(self, raw: bytes, body: Json) -> bytes | None:
        """`prepare`'s change made on the request's own bytes (`body` is
        `raw` parsed), when it can be, or None: then the proxy serialises
        `prepare(body)` again, which costs a JSON encoding of the whole
        history on the way to the first byte."""
        return None

    def continues(self, body: Json) -> str | None:
        """The key of what this request continues on the server, whose items
        it does not carry (Responses' previous_response_id, or conversation),
        or None."""
        return None

    def continued_as(self, body: Json, answer_id: str) -> list[str]:
        """The keys under which a later request may continue the answer
        `answer_id` to this body (none where the API keeps nothing)."""
        return []

    def continued(self, body: Json, calls: list[list[str]]) -> Json:
        """The body as read for its tool events, with the tool calls of the
        answer it continues in front of its own items (never forwarded)."""
        return body

    @staticmethod
    def streams(body: Json) -> bool:
        return body.get("stream") is True

    @staticmethod
    def model(body: Json) -> str:
        model = body.get("model")
        return model if isinstance(model, str) else ""


def with_key(raw: bytes, key: str, value: Json) -> bytes | None:
    """`raw`, the UTF-8 text of a JSON object without `key`, with `key: value`
    added at its end; None for a text in another encoding (UTF-16 and 32 are
    JSON too) or one that is not an object."""
    if json.detect_encoding(raw) != "utf-8":
        return None
    text = raw.rstrip(b" \t\r\n")
    if not text.endswith(b"}"):
        return None
    text = text[:-1].rstrip(b" \t\r\n")
    comma = b"" if text.endswith(b"{") else b","  # only the object's own brace ends so
    pair = json.dumps({key: value}, separators=(",", ":")).encode()
    return text + comma + pair[1:]
