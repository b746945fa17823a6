"""OpenAI Chat Completions (`POST /v1/chat/completions`) as the proxy reads
and writes it. Tool calls are the assistant messages' `tool_calls` (their
`function.arguments` a JSON text); results are `role: tool` messages naming
the `tool_call_id` (the API has no failure flag: every result is ok).
OpenAI-compatible servers (vLLM, Ollama, LiteLLM, OpenRouter) speak the same."""

from __future__ import annotations

import json
import re
import secrets
import time
from typing import Any

from gateway.guard.normalize import loads
from gateway.llmproxy.wire import (
    Anchor,
    Dialect,
    Json,
    SseReader,
    Tap,
    ToolEvent,
    Usage,
    count,
    id_of,
    key_of,
    messages,
    objects,
    parse_arguments,
    text_of,
    uncached,
    with_key,
)

# The error `type` of a status, beside the API's own fallbacks (server_error
# for 5xx, invalid_request_error for the rest).
_ERROR_TYPES = {429: "insufficient_quota"}


def _calls(message: Json) -> list[Json]:
    return objects(message.get("tool_calls"))


def _function(call: Json) -> Json:
    """A tool call's name and arguments: a function's, or a custom tool's
    (`{"type": "custom", "custom": {"name", "input"}}`, its input free text)."""
    fn = call.get("function")
    if isinstance(fn, dict):
        return fn
    custom = call.get("custom")
    if call.get("type") == "custom" and isinstance(custom, dict):
        return {"name": custom.get("name"), "arguments": custom.get("input")}
    return {}


# A chunk's `"usage":null` as its last member, on its data line.
_USAGE_NULL = re.compile(rb',[ \t]*"usage"[ \t]*:[ \t]*null([ \t]*\}[ \t]*\r?)$', re.MULTILINE)


class OpenAIStreamTap(Tap):
    """`data: {chunk}` events: usage from the chunk that carries it, the
    anchor from the first choice's tool calls. With `hide_usage`
    (the proxy asked for the usage the agent did not) the usage-only chunk is
    kept back, so the agent gets the stream it asked for."""

    def __init__(self, hide_usage: bool) -> None:
        super().__init__()
        self._sse = SseReader()
        self._hide = hide_usage
        self._anchor = Anchor()
        self._calls: dict[Any, list[str]] = {}  # index -> [name, arguments] so far

    def feed(self, chunk: bytes) -> bytes:
        events = self._sse.feed(chunk)
        out = []
        for raw, data in events:
            if data is None or data == "[DONE]":
                out.append(raw)
                continue
            try:
                obj = loads(data)
            except ValueError:
                out.append(raw)
                continue
            if isinstance(obj, dict) and self._read(obj):
                continue  # the usage chunk the agent did not ask for
            if self._hide and isinstance(obj, dict) and "usage" in obj and obj["usage"] is None:
                # Asked for usage, the upstream writes `"usage":null` in every
                # chunk before the last: not in the stream the agent asked for.
                raw = _USAGE_NULL.sub(rb"\1", raw, count=1)
            out.append(raw)
        if not self._hide:
            return chunk  # passes through as it came
        return b"".join(out)  # whole events only (one may wait for its end)

    def done(self) -> bytes:
        self._anchor.calls = [(n, a) for n, a in self._calls.values()]
        self.anchor = self._anchor.value()
        return self._sse.rest() if self._hide else b""

    def _read(self, obj: Json) -> bool:
        """Reads one chunk; True when it is a usage-only chunk to keep back."""
        usage = obj.get("usage")
        choices = obj.get("choices")
        if isinstance(usage, dict):
            read_usage(usage, self.usage)
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict) and choice.get("index", 0) == 0:
                    delta = choice.get("delta")
                    if isinstance(delta, dict):
                        _anchor_delta(self._anchor, delta, self._calls)
        return self._hide and isinstance(usage, dict) and choices == []


def read_usage(usage: Json, into: Usage) -> None:
    """A Chat Completions `usage`: its prompt tokens, the cached among them."""
    into.input_tokens = count(usage.get("prompt_tokens"))
    into.output_tokens = count(usage.get("completion_tokens"))
    details = usage.get("prompt_tokens_details")
    into.cached_tokens = count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    into.seen = True


def _anchor_delta(anchor: Anchor, delta: Json, calls: dict[Any, list[str]]) -> None:
    for call in _calls(delta):
        if isinstance(call.get("id"), str) and call["id"]:
            anchor.ids.append(call["id"])
        fn = _function(call)
        parts = calls.setdefault(call.get("index"), ["", ""])
        for i, key in enumerate(("name", "arguments")):
            if isinstance(fn.get(key), str):
                parts[i] += fn[key]


def _anchor_message(message: Json) -> str | None:
    anchor = Anchor()
    for call in _calls(message):
        if isinstance(call.get("id"), str) and call["id"]:
            anchor.ids.append(call["id"])
        fn = _function(call)
        name, arguments = fn.get("name"), fn.get("arguments")
        anchor.calls.append((name if isinstance(name, str) else "",
                             arguments if isinstance(arguments, str) else ""))  # fmt: skip
    return anchor.value()


def _json_answer(body: Json) -> bool:
    """Whether the body asks for an answer in JSON (`response_format` of type
    json_schema, as the SDK's parse() sends it, or json_object)."""
    fmt = body.get("response_format")
    return isinstance(fmt, dict) and fmt.get("type") in ("json_schema", "json_object")


class OpenAI(Dialect):
    name = "openai"
    model_path = "/v1/chat/completions"
    key_header = "Authorization"

    def __init__(self, stream_usage: bool = True) -> None:
        self.stream_usage = stream_usage

    def tool_events(self, body: Json) -> list[ToolEvent]:
        events: list[ToolEvent] = []
        names: dict[str, str] = {}
        for i, m in enumerate(messages(body)):
            role = m.get("role")
            if role == "assistant":
                for j, call in enumerate(_calls(m)):
                    fn = _function(call)
                    name = fn.get("name")
                    if not isinstance(name, str) or not name:
                        continue
                    args = parse_arguments(fn.get("arguments"))
                    call_id = call.get("id")
                    if isinstance(call_id, str):
                        names[call_id] = name
                    key = key_of("step", call_id, i * 1000 + j, name, args)
                    events.append(ToolEvent(key, "step", name, args=args, call=id_of(call_id)))
            elif role == "tool":
                call_id = m.get("tool_call_id")
                name = names.get(call_id) if isinstance(call_id, str) else None
                if name is None:
                    continue  # a result of no call in this history: nothing to pair it with
                output = text_of(m.get("content"))
                key = key_of("result", call_id, i, name, output)
                events.append(ToolEvent(key, "result", name, output=output, call=call_id))
        return events

    def opening(self, body: Json) -> Any:
        opening = []
        for m in messages(body):
            if m.get("role") == "assistant":
                break
            opening.append([m.get("role"), uncached(m.get("content"))])
        return opening

    def anchors(self, body: Json) -> list[str]:
        return [
            value
            for m in messages(body)
            if m.get("role") == "assistant" and (value := _anchor_message(m)) is not None
        ]

    def with_note(self, body: Json, note: str, disable_tools: bool) -> Json:
        out = dict(body)
        out["messages"] = [*messages(body), {"role": "system", "content": note}]
        if disable_tools:
            if "tools" in body:
                out["tool_choice"] = "none"
                out.pop("parallel_tool_calls", None)
            if "functions" in body:  # the API's older shape
                out["function_call"] = "none"
        return out

    def _adds_usage(self, body: Json) -> bool:
        """Whether the proxy asks this stream for the usage the agent did not."""
        return self.stream_usage and self.streams(body) and not self._asks_usage(body)

    def prepare(self, body: Json) -> Json | None:
        if not self._adds_usage(body):
            return None
        options = body.get("stream_options")
        options = dict(options) if isinstance(options, dict) else {}
        options["include_usage"] = True
        return {**body, "stream_options": options}

    def prepared(self, raw: bytes, body: Json) -> bytes | None:
        if not self._adds_usage(body) or "stream_options" in body:
            return None  # nothing to add, or options of its own (prepare merges them)
        return with_key(raw, "stream_options", {"include_usage": True})

    @staticmethod
    def _asks_usage(body: Json) -> bool:
        options = body.get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True

    def stream_tap(self, body: Json) -> Tap:
        return OpenAIStreamTap(hide_usage=self._adds_usage(body))

    def read_answer(self, answer: Json, tap: Tap) -> None:
        usage = answer.get("usage")
        if isinstance(usage, dict):
            read_usage(usage, tap.usage)
        choices = answer.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            message = choices[0].get("message")
            if isinstance(message, dict):
                tap.anchor = _anchor_message(message)

    def final_answer(self, body: Json, text: str) -> tuple[bytes, str]:
        ident = "chatcmpl-botbouncer-" + secrets.token_hex(12)
        created = int(time.time())
        model = self.model(body)
        # Asked for JSON, the answer is a refusal (`content` null): the SDK's
        # parse() returns a refusal unparsed, and would reject the text.
        field = "refusal" if _json_answer(body) else "content"
        if not self.streams(body):
            message: Json = {"role": "assistant", "content": None, "refusal": None}
            message[field] = text
            answer = {
                "id": ident,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            }
            return json.dumps(answer).encode(), "application/json"
        base = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model}
        usage = self._asks_usage(body)

        def chunk(delta: Json, finish: str | None) -> bytes:
            c: Json = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            if usage:
                c["usage"] = None
            return b"data: " + json.dumps(c).encode() + b"\n\n"

        first: Json = {"role": "assistant", "content": ""}
        if field == "refusal":
            first = {"role": "assistant", "content": None, "refusal": ""}
        parts = [
            chunk(first, None),
            chunk({field: text}, None),
            chunk({}, "stop"),
        ]
        if usage:
            zero = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
            parts.append(b"data: " + json.dumps({**base, "choices": [], "usage": zero}).encode())
            parts.append(b"\n\n")
        parts.append(b"data: [DONE]\n\n")
        return b"".join(parts), "text/event-stream"

    def error(self, status: int, message: str, code: str) -> bytes:
        return error(status, message, code)


def error(status: int, message: str, code: str) -> bytes:
    """An error as OpenAI's APIs write one (Chat Completions and Responses alike)."""
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    err = {"message": message, "type": kind, "param": None, "code": code}
    return json.dumps({"error": err}).encode()
