"""Anthropic Messages on the wire: message, its SSE events, errors, models."""

from __future__ import annotations

import itertools
import json

from aiohttp import web

from tests.fakes.llm.model import Json, Reply
from tests.fakes.llm.sse import fragments, open_sse, pieces

_ids = itertools.count(1)

_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def error(code: int, message: str, kind: str | None = None) -> web.Response:
    """`{"type": "error", "error": {"type", "message"}}` with HTTP status `code`."""
    if kind is None:
        kind = _KINDS.get(code, "api_error" if code >= 500 else "invalid_request_error")
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return web.json_response(body, status=code, headers={"request-id": f"req_fake_{next(_ids)}"})


def _blocks(reply: Reply) -> list[Json]:
    """The content blocks: the text (if any, or if there is nothing else), then each tool_use."""
    blocks: list[Json] = []
    if reply.text or not reply.tool_calls:
        blocks.append({"type": "text", "text": reply.text})
    for t in reply.tool_calls:
        tool_id = t.id or f"toolu_fake_{next(_ids)}"
        blocks.append({"type": "tool_use", "id": tool_id, "name": t.name, "input": t.input})
    return blocks


def message_json(body: Json, content: list[Json], stop_reason: str | None, usage: Json) -> Json:
    return {
        "id": f"msg_fake_{next(_ids)}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "fake-model"),
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage,
    }


def _input(tokens: int, cached: int) -> Json:
    """Anthropic's input counts: those read from the cache apart, not in
    `input_tokens`."""
    return {"input_tokens": tokens - cached, "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0}  # fmt: skip


def message(body: Json, reply: Reply) -> web.Response:
    inp, out = reply.tokens(body)
    usage = {"output_tokens": out, **_input(inp, reply.cached)}
    return web.json_response(message_json(body, _blocks(reply), reply.stop_reason, usage))


async def stream(request: web.Request, body: Json, reply: Reply) -> web.StreamResponse:
    """message_start, ping, then per block content_block_start / _delta
    (text_delta by word, input_json_delta in fragments) / _stop, then
    message_delta (stop_reason, usage.output_tokens) and message_stop."""
    resp = await open_sse(request)
    inp, out = reply.tokens(body)

    async def event(kind: str, data: Json) -> None:
        await resp.write(f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode())

    start = message_json(body, [], None, {"output_tokens": 1, **_input(inp, reply.cached)})
    await event("message_start", {"message": start})
    await event("ping", {})
    for index, block in enumerate(_blocks(reply)):
        if block["type"] == "text":
            opened = {**block, "text": ""}
            await event("content_block_start", {"index": index, "content_block": opened})
            for piece in pieces(block["text"]):
                delta = {"type": "text_delta", "text": piece}
                await event("content_block_delta", {"index": index, "delta": delta})
        else:
            opened = {**block, "input": {}}
            await event("content_block_start", {"index": index, "content_block": opened})
            for frag in fragments(json.dumps(block["input"], separators=(",", ":"))):
                delta = {"type": "input_json_delta", "partial_json": frag}
                await event("content_block_delta", {"index": index, "delta": delta})
        await event("content_block_stop", {"index": index})
    finish = {"stop_reason": reply.stop_reason, "stop_sequence": None}
    await event("message_delta", {"delta": finish, "usage": {"output_tokens": out}})
    await event("message_stop", {})
    await resp.write_eof()
    return resp


def models(names: list[str]) -> web.Response:
    data = [
        {"type": "model", "id": n, "display_name": n, "created_at": "2025-01-01T00:00:00Z"}
        for n in names
    ]
    first, last = (names[0], names[-1]) if names else (None, None)
    return web.json_response({"data": data, "has_more": False, "first_id": first, "last_id": last})
