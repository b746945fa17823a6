"""OpenAI's Responses API (`POST /v1/responses`, under the `openai` section's
path) as the proxy reads and writes it: what the OpenAI Agents SDK and
OpenAI's own guides send by default.

The history is the body's `input` list: the model's tool calls are
`function_call` items (`arguments` a JSON text) and `custom_tool_call` items
(`input` a text); the agent's results are `function_call_output` and
`custom_tool_call_output` items naming the `call_id` (no failure flag: every
result is ok). A request that continues a stored response
(`previous_response_id`, `conversation`) carries only its new items: the
calls it answers are not in it, so only what it carries is fed
(docs/llm-proxy.md). Usage comes in the answer's `usage`, streamed in the
`response.completed` event.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from gateway.llmproxy.openai import error as openai_error
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
    objects,
    parse_arguments,
    text_of,
    uncached,
)

# The calls a model makes that the agent runs, by item type: the tool's name
# (None: the item's `name`) and the field holding its input. Each has its
# `<type>_output` item.
_CALLS: dict[str, tuple[str | None, str]] = {
    "function_call": (None, "arguments"),
    "custom_tool_call": (None, "input"),
    "computer_call": ("computer", "action"),
    "shell_call": ("shell", "action"),
    "local_shell_call": ("local_shell", "action"),
    "apply_patch_call": ("apply_patch", "operation"),
}
_OUTPUTS = frozenset(kind + "_output" for kind in _CALLS)


def _call(item: Json, kind: str) -> tuple[str, Any] | None:
    """A call item's tool name and input (as written); None without a name."""
    fixed, field = _CALLS[kind]
    name: Any = fixed or item.get("name")
    return (name, item.get(field)) if isinstance(name, str) and name else None


def _output_text(output: Any) -> str:
    """What a call's output item says: text, or a screenshot's digest (text_of)."""
    if isinstance(output, str):
        return output
    return text_of([output] if isinstance(output, dict) else output)


# The items a model writes (the rest of an input list is the agent's).
_MODEL_ITEMS = frozenset({*_CALLS, "reasoning"})
# Events whose `response` is the whole answer, usage included.
_FINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
# Events that open an answer: its id, before anything is written.
_OPENING_EVENTS = frozenset({"response.created", "response.queued", "response.in_progress"})


def items(body: Json) -> list[Json]:
    """The body's input items (a plain string input is one user message)."""
    value = body.get("input")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return objects(value)


def _type(obj: Json) -> str:
    """An item's or an event's `type`, "" when it is not a string."""
    kind = obj.get("type")
    return kind if isinstance(kind, str) else ""


def _conversation(body: Json) -> str | None:
    """The id of the conversation the request adds to (an id, or {"id": ...})."""
    value = body.get("conversation")
    if isinstance(value, dict):
        value = value.get("id")
    return value if isinstance(value, str) and value else None


def _by_model(item: Json) -> bool:
    return _type(item) in _MODEL_ITEMS or item.get("role") == "assistant"


def _anchor_of(output: list[Json]) -> str | None:
    """The anchor of the first model turn of `output` (a run of model items)
    that has one: the first that called tools."""
    found = _anchors_of(output)
    return found[0] if found else None


def _anchors_of(items: list[Json]) -> list[str]:
    """The anchor of every model turn (a run of model items) that called tools."""
    found = []
    anchor = Anchor()
    for item in items:
        if not _by_model(item):
            if (value := anchor.value()) is not None:
                found.append(value)  # the end of a turn that called tools
            anchor = Anchor()
            continue
        kind = _type(item)
        if kind in _CALLS:
            call_id = item.get("call_id")
            if isinstance(call_id, str) and call_id:
                anchor.ids.append(call_id)
            name, arguments = _call(item, kind) or ("", "")
            anchor.calls.append((name, arguments if isinstance(arguments, str) else ""))
    if (value := anchor.value()) is not None:
        found.append(value)
    return found


def _read_response(response: Json, tap: Tap) -> None:
    usage = response.get("usage")
    if isinstance(usage, dict):
        tap.usage.input_tokens = count(usage.get("input_tokens"))
        tap.usage.output_tokens = count(usage.get("output_tokens"))
        details = usage.get("input_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        tap.usage.cached_tokens = count(cached)
        tap.usage.seen = True
    output = objects(response.get("output"))
    tap.anchor = _anchor_of(output)
    ident = response.get("id")
    if isinstance(ident, str) and ident:
        calls: list[list[str]] = []
        for item in output:
            kind = _type(item)
            call = _call(item, kind) if kind in _CALLS else None
            call_id = item.get("call_id")
            if call is not None and isinstance(call_id, str):
                name, value = call
                text = value if isinstance(value, str) else json.dumps(value)
                calls.append([kind, call_id, name, text])
        tap.continuable = (ident, calls)


class ResponsesStreamTap(EventTap):
    """Typed SSE events, passed on as they came; usage and the anchor read
    from the event that ends the answer."""

    def read(self, event: Json) -> None:
        response = event.get("response")
        if not isinstance(response, dict):
            return
        kind = _type(event)
        if kind in _FINAL_EVENTS:
            _read_response(response, self)
        elif kind in _OPENING_EVENTS and self.opened is None:
            # The id, should the stream end before the answer does: a
            # background response the agent resumes later (GET ...?stream=true).
            ident = response.get("id")
            if isinstance(ident, str) and ident:
                self.opened = ident


def _json_answer(body: Json) -> bool:
    """Whether the body asks for an answer in JSON (`text.format` of type
    json_schema, as the SDK's parse() and the Agents SDK's output_type send
    it, or json_object)."""
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    return isinstance(fmt, dict) and fmt.get("type") in ("json_schema", "json_object")


class Responses(Dialect):
    name = "openai"
    model_path = "/v1/responses"
    key_header = "Authorization"

    def tool_events(self, body: Json) -> list[ToolEvent]:
        events: list[ToolEvent] = []
        names: dict[str, str] = {}
        for i, item in enumerate(items(body)):
            kind = _type(item)
            call_id = item.get("call_id")
            if kind in _CALLS:
                call = _call(item, kind)
                if call is None:
                    continue
                name, args = call[0], parse_arguments(call[1])
                for ident in (call_id, item.get("id")):  # a local shell's output names either
                    if isinstance(ident, str):
                        names[ident] = name
                events.append(ToolEvent(key_of("step", call_id, i, name, args), "step", name,
                                        args=args, call=id_of(call_id)))  # fmt: skip
            elif kind in _OUTPUTS:
                if not isinstance(call_id, str):
                    call_id = item.get("id")
                called = names.get(call_id) if isinstance(call_id, str) else None
                if called is None:
                    continue  # a result of no call in this request: nothing to pair it with
                text = _output_text(item.get("output"))
                key = key_of("result", call_id, i, called, text)
                events.append(ToolEvent(key, "result", called, output=text, call=call_id))
        return events

    def opening(self, body: Json) -> Any:
        opening: list[Any] = [body.get("instructions")]
        for item in items(body):
            if _by_model(item):
                break
            opening.append([item.get("role"), uncached(item.get("content"))])
        return opening

    def anchors(self, body: Json) -> list[str]:
        return _anchors_of(items(body))

    def with_note(self, body: Json, note: str, disable_tools: bool) -> Json:
        out = dict(body)
        instructions = body.get("instructions")
        if self.continues(body) is not None and isinstance(instructions, str | None):
            # A conversation the upstream keeps keeps a request's input items
            # too: as one, the note would stay in its context for every turn
            # after. A request's instructions are its own.
            out["instructions"] = f"{instructions}\n\n{note}" if instructions else note
        else:
            out["input"] = [*items(body), {"role": "system", "content": note}]
        # A stored prompt (`prompt: {id}`) may carry the tools on the server.
        if disable_tools and ("tools" in body or "prompt" in body):
            out["tool_choice"] = "none"
            out.pop("parallel_tool_calls", None)
        return out

    def continues(self, body: Json) -> str | None:
        previous = body.get("previous_response_id")
        if isinstance(previous, str) and previous:
            return "response:" + previous
        conversation = _conversation(body)
        return "conversation:" + conversation if conversation else None

    def continued_as(self, body: Json, answer_id: str) -> list[str]:
        # A response is kept unless `store: false`; a conversation keeps its items.
        keys = [] if body.get("store") is False else ["response:" + answer_id]
        conversation = _conversation(body)
        return [*keys, "conversation:" + conversation] if conversation else keys

    def continued(self, body: Json, calls: list[list[str]]) -> Json:
        made = [{"type": kind, "call_id": call_id, "name": name, _CALLS[kind][1]: value}
                for kind, call_id, name, value in calls if kind in _CALLS]  # fmt: skip
        return {**body, "input": [*made, *items(body)]}

    def stream_tap(self, body: Json) -> Tap:
        return ResponsesStreamTap()

    def read_answer(self, answer: Json, tap: Tap) -> None:
        _read_response(answer, tap)

    def final_answer(self, body: Json, text: str) -> tuple[bytes, str]:
        message_id = "msg_botbouncer_" + secrets.token_hex(12)
        # Asked for JSON, the answer is a refusal part: the SDK's parse()
        # keeps a refusal as it is, and would reject the text.
        refuses = _json_answer(body)
        part: Json = {"type": "output_text", "text": text, "annotations": []}
        if refuses:
            part = {"type": "refusal", "refusal": text}
        message = {"type": "message", "id": message_id, "status": "completed",
                   "role": "assistant", "content": [part]}  # fmt: skip
        usage = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0,
                 "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                 "output_tokens_details": {"reasoning_tokens": 0}}  # fmt: skip
        response = {
            "id": "resp_botbouncer_" + secrets.token_hex(12),
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": self.model(body),
            "output": [message],
            "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
            "tool_choice": "none",
            "tools": body.get("tools") if isinstance(body.get("tools"), list) else [],
            "usage": usage,
        }
        if not self.streams(body):
            return json.dumps(response).encode(), "application/json"
        started = {**response, "status": "in_progress", "output": [], "usage": None}
        opened = {**message, "status": "in_progress", "content": []}
        at = {"item_id": message_id, "output_index": 0, "content_index": 0}
        written: list[Json] = [
            {"type": "response.output_text.delta", **at, "delta": text, "logprobs": []},
            {"type": "response.output_text.done", **at, "text": text, "logprobs": []},
        ]
        if refuses:
            written = [
                {"type": "response.refusal.delta", **at, "delta": text},
                {"type": "response.refusal.done", **at, "refusal": text},
            ]
        empty = {**part, "refusal" if refuses else "text": ""}
        events: list[Json] = [
            {"type": "response.created", "response": started},
            {"type": "response.output_item.added", "output_index": 0, "item": opened},
            {"type": "response.content_part.added", **at, "part": empty},
            *written,
            {"type": "response.content_part.done", **at, "part": part},
            {"type": "response.output_item.done", "output_index": 0, "item": message},
            {"type": "response.completed", "response": response},
        ]
        out = b"".join(
            f"event: {e['type']}\ndata: {json.dumps({**e, 'sequence_number': n})}\n\n".encode()
            for n, e in enumerate(events)
        )
        return out, "text/event-stream"

    def error(self, status: int, message: str, code: str) -> bytes:
        return openai_error(status, message, code)
