"""Anthropic Messages (`POST /v1/messages`) as the proxy reads and writes it.
Tool calls are the assistant's `tool_use` blocks (`input` an object); results
are the user's `tool_result` blocks naming the `tool_use_id`, `is_error`
marking a failure. The system prompt is the body's `system`, not a message."""

from __future__ import annotations

import json
import secrets
from typing import Any

from gateway.llmproxy.wire import (
    Anchor,
    Dialect,
    EventTap,
    Json,
    Tap,
    ToolEvent,
    count,
    id_of,
    key_of,
    messages,
    objects,
    text_of,
    uncached,
)

# The error `type` of a status, beside the API's own fallbacks (api_error for
# 5xx, invalid_request_error for the rest).
_ERROR_TYPES = {413: "request_too_large", 429: "rate_limit_error"}


def _blocks(message: Json) -> list[Json]:
    return objects(message.get("content"))


def _usage(tap: Tap, usage: Json) -> None:
    if "input_tokens" in usage:  # every input token counts, cached or not
        written = count(usage.get("cache_creation_input_tokens"))
        read = count(usage.get("cache_read_input_tokens"))
        total = count(usage.get("input_tokens")) + written + read
        # The largest said: a stream's message_delta may repeat the input
        # count, and a compatible server may send 0 or null there.
        if total > tap.usage.input_tokens:
            tap.usage.input_tokens = total
            tap.usage.cached_tokens, tap.usage.cache_write_tokens = read, written
    if "output_tokens" in usage:
        tap.usage.output_tokens = count(usage.get("output_tokens"))  # cumulative in a stream
    tap.usage.seen = True


def _anchor_blocks(anchor: Anchor, blocks: list[Json]) -> None:
    for b in blocks:
        if b.get("type") == "tool_use" and isinstance(b.get("id"), str) and b["id"]:
            anchor.ids.append(b["id"])


class AnthropicStreamTap(EventTap):
    """`event: <type>` / `data: {...}` events, passed through as they come:
    usage from message_start (input) and message_delta (output so far), the
    anchor from the tool_use blocks' ids."""

    def __init__(self) -> None:
        super().__init__()
        self._anchor = Anchor()

    def read(self, event: Json) -> None:
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), dict):
            usage = event["message"].get("usage")
            if isinstance(usage, dict):
                _usage(self, usage)
        elif kind == "message_delta" and isinstance(event.get("usage"), dict):
            _usage(self, event["usage"])
        elif kind == "content_block_start" and isinstance(event.get("content_block"), dict):
            _anchor_blocks(self._anchor, [event["content_block"]])

    def done(self) -> bytes:
        self.anchor = self._anchor.value()
        return b""


def _sse(kind: str, data: Json) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def _json_answer(body: Json) -> bool:
    """Whether the body asks for an answer in JSON: a json_schema format, in
    `output_config` (as the SDK's parse() sends it) or the beta's `output_format`."""
    config = body.get("output_config")
    config = config if isinstance(config, dict) else {}
    formats = [config.get("format"), body.get("output_format")]
    return any(isinstance(f, dict) and f.get("type") == "json_schema" for f in formats)


class Anthropic(Dialect):
    name = "anthropic"
    model_path = "/v1/messages"
    key_header = "x-api-key"

    def tool_events(self, body: Json) -> list[ToolEvent]:
        events: list[ToolEvent] = []
        names: dict[str, str] = {}
        for i, m in enumerate(messages(body)):
            role = m.get("role")
            for j, b in enumerate(_blocks(m)):
                kind = b.get("type")
                if role == "assistant" and kind == "tool_use":
                    name = b.get("name")
                    if not isinstance(name, str) or not name:
                        continue
                    call_id = b.get("id")
                    if isinstance(call_id, str):
                        names[call_id] = name
                    args = b.get("input")
                    key = key_of("step", call_id, i * 1000 + j, name, args)
                    events.append(ToolEvent(key, "step", name, args=args, call=id_of(call_id)))
                elif role == "user" and kind == "tool_result":
                    call_id = b.get("tool_use_id")
                    name = names.get(call_id) if isinstance(call_id, str) else None
                    if name is None:
                        continue
                    output = text_of(b.get("content"))
                    ok = b.get("is_error") is not True
                    key = key_of("result", call_id, i * 1000 + j, name, output)
                    events.append(ToolEvent(key, "result", name, ok=ok, output=output,
                                            call=call_id))  # fmt: skip
        return events

    def opening(self, body: Json) -> Any:
        opening: list[Any] = [["system", uncached(body.get("system"))]]
        for m in messages(body):
            if m.get("role") == "assistant":
                break
            opening.append([m.get("role"), uncached(m.get("content"))])
        return opening

    def anchors(self, body: Json) -> list[str]:
        found = []
        for m in messages(body):
            if m.get("role") == "assistant":
                anchor = Anchor()
                _anchor_blocks(anchor, _blocks(m))
                if (value := anchor.value()) is not None:
                    found.append(value)
        return found

    def with_note(self, body: Json, note: str, disable_tools: bool) -> Json:
        out = dict(body)
        system = body.get("system")
        if isinstance(system, list):
            out["system"] = [*system, {"type": "text", "text": note}]
        elif isinstance(system, str) and system:
            out["system"] = f"{system}\n\n{note}"
        else:
            out["system"] = note
        if disable_tools and "tools" in body:
            out["tool_choice"] = {"type": "none"}
        return out

    def stream_tap(self, body: Json) -> Tap:
        return AnthropicStreamTap()

    def read_answer(self, answer: Json, tap: Tap) -> None:
        usage = answer.get("usage")
        if isinstance(usage, dict):
            _usage(tap, usage)
        anchor = Anchor()
        _anchor_blocks(anchor, _blocks(answer))
        tap.anchor = anchor.value()

    def final_answer(self, body: Json, text: str) -> tuple[bytes, str]:
        ident = "msg_botbouncer_" + secrets.token_hex(12)
        # Asked for JSON, the answer is a refusal with no text block, the text
        # its explanation: the SDK's parse() would reject the text.
        refuses = _json_answer(body)
        stop: Json = {"stop_reason": "end_turn", "stop_sequence": None}
        if refuses:
            details = {"type": "refusal", "category": None, "explanation": text}
            stop = {"stop_reason": "refusal", "stop_sequence": None, "stop_details": details}
        message: Json = {
            "id": ident,
            "type": "message",
            "role": "assistant",
            "model": self.model(body),
            "content": [] if refuses else [{"type": "text", "text": text}],
            **stop,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        if not self.streams(body):
            return json.dumps(message).encode(), "application/json"
        start = {**message, "content": [], **dict.fromkeys(stop)}  # stop_reason null
        block = [
            _sse(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
            ),
            _sse(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": text},
                },
            ),
            _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ]
        events = [
            _sse("message_start", {"type": "message_start", "message": start}),
            *([] if refuses else block),
            _sse(
                "message_delta",
                {"type": "message_delta", "delta": stop, "usage": {"output_tokens": 0}},
            ),
            _sse("message_stop", {"type": "message_stop"}),
        ]
        return b"".join(events), "text/event-stream"

    def error(self, status: int, message: str, code: str) -> bytes:
        kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()
