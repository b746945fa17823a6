"""OpenAI's Responses API on the wire (POST /v1/responses): a response, its
SSE events, errors (Chat Completions' shape)."""

from __future__ import annotations

import itertools
import json
import time

from aiohttp import web

from tests.fakes.llm import openai_wire
from tests.fakes.llm.model import Json, Reply
from tests.fakes.llm.sse import fragments, open_sse, pieces

_ids = itertools.count(1)

# Reply.finish -> incomplete_details.reason; any other finish is "completed"
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def error(code: int, message: str, kind: str | None = None) -> web.Response:
    """Chat Completions' error body, as the Responses API answers one:
    `{"error": {"message", "type", "param", "code"}}` with HTTP status `code`."""
    return openai_wire.error(code, message, kind)


def _status(reply: Reply) -> tuple[str, Json | None]:
    reason = _INCOMPLETE.get(reply.finish)
    return ("incomplete", {"reason": reason}) if reason else ("completed", None)


def _items(reply: Reply, status: str) -> list[Json]:
    """The output items, finished: the text as one message (if any, or if
    there is nothing else), then each tool call as a function_call."""
    items: list[Json] = []
    if reply.text or not reply.tool_calls:
        text = {"type": "output_text", "text": reply.text, "annotations": []}
        items.append(
            {
                "type": "message",
                "id": f"msg_fake_{next(_ids)}",
                "status": status,
                "role": "assistant",
                "content": [text],
            }
        )
    for t in reply.tool_calls:
        n = next(_ids)
        items.append(
            {
                "type": "function_call",
                "id": f"fc_fake_{n}",
                "call_id": t.id or f"call_fake_{n}",
                "name": t.name,
                "arguments": t.arguments_json,
                "status": "completed",
            }
        )
    return items


def usage_json(input_tokens: int, output_tokens: int, cached: int = 0) -> Json:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def response_json(
    body: Json,
    output: list[Json],
    status: str = "completed",
    usage: Json | None = None,
    incomplete_details: Json | None = None,
    id: str | None = None,
    created_at: int | None = None,
) -> Json:
    """A Response object: `output` and `usage` as given, the request's
    settings (model, instructions, tools, tool_choice, temperature, ...)
    echoed as the API does, its defaults where the body left them out."""
    now = int(time.time())
    return {
        "id": id or f"resp_fake_{next(_ids)}",
        "object": "response",
        "created_at": now if created_at is None else created_at,
        "status": status,
        "background": bool(body.get("background", False)),
        "completed_at": now if status == "completed" else None,
        "error": None,
        "incomplete_details": incomplete_details,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"),
        "model": body.get("model", "fake-model"),
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
        "service_tier": "default",
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_logprobs": body.get("top_logprobs", 0),
        "top_p": body.get("top_p", 1.0),
        "truncation": body.get("truncation", "disabled"),
        "usage": usage,
        "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }


def response(body: Json, reply: Reply) -> web.Response:
    """The whole Response: status "completed" (Reply.finish "length":
    "incomplete", incomplete_details.reason "max_output_tokens"), output a
    message (output_text) and/or function_call items, usage."""
    status, incomplete = _status(reply)
    usage = usage_json(*reply.tokens(body), reply.cached)
    return web.json_response(response_json(body, _items(reply, status), status, usage, incomplete))


def _opened(item: Json) -> Json:
    """An output item as response.output_item.added shows it: in progress, empty."""
    if item["type"] == "message":
        return {**item, "status": "in_progress", "content": []}
    return {**item, "status": "in_progress", "arguments": ""}


async def stream(request: web.Request, body: Json, reply: Reply) -> web.StreamResponse:
    """Named events, each data naming its type and a sequence_number from 0:
    response.created and response.in_progress (status "in_progress", no
    output, no usage); per output item response.output_item.added, then for
    a message content_part.added, output_text.delta by word, output_text.done,
    content_part.done, for a function_call function_call_arguments.delta in
    fragments and .done; response.output_item.done with the finished item;
    last response.completed with the whole response and its usage
    (response.incomplete when the reply was cut off). No [DONE]."""
    resp = await open_sse(request)
    status, incomplete = _status(reply)
    items = _items(reply, status)
    started = response_json(body, [], "in_progress")
    seq = itertools.count()

    async def event(kind: str, **data: object) -> None:
        payload = json.dumps({"type": kind, "sequence_number": next(seq), **data})
        await resp.write(f"event: {kind}\ndata: {payload}\n\n".encode())

    await event("response.created", response=started)
    await event("response.in_progress", response=started)
    for index, item in enumerate(items):
        await event("response.output_item.added", output_index=index, item=_opened(item))
        at: Json = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            part = item["content"][0]
            opened = {**part, "text": ""}
            await event("response.content_part.added", **at, content_index=0, part=opened)
            for piece in pieces(part["text"]):
                await event(
                    "response.output_text.delta", **at, content_index=0, delta=piece, logprobs=[]
                )
            await event(
                "response.output_text.done", **at, content_index=0, text=part["text"], logprobs=[]
            )
            await event("response.content_part.done", **at, content_index=0, part=part)
        else:
            for frag in fragments(item["arguments"]):
                await event("response.function_call_arguments.delta", **at, delta=frag)
            await event("response.function_call_arguments.done", **at, arguments=item["arguments"])
        await event("response.output_item.done", output_index=index, item=item)
    usage = usage_json(*reply.tokens(body), reply.cached)
    final = response_json(
        body, items, status, usage, incomplete, started["id"], started["created_at"]
    )
    await event(f"response.{status}", response=final)
    await resp.write_eof()
    return resp
