"""OpenAI Chat Completions on the wire: chat.completion, its SSE chunks, errors, models."""

from __future__ import annotations

import itertools
import json
import time

from aiohttp import web

from tests.fakes.llm.model import Json, Reply
from tests.fakes.llm.sse import fragments, open_sse, pieces

_ids = itertools.count(1)


def error(code: int, message: str, kind: str | None = None) -> web.Response:
    """`{"error": {"message", "type", "param", "code"}}` with HTTP status `code`."""
    if kind is None:
        kind = "server_error" if code >= 500 else "invalid_request_error"
    err = {"message": message, "type": kind, "param": None, "code": None}
    return web.json_response({"error": err}, status=code)


def _tool_call(call_id: str, name: str, arguments: str) -> Json:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def completion(body: Json, reply: Reply) -> web.Response:
    message: Json = {"role": "assistant", "content": reply.text}
    if reply.tool_calls:
        message["content"] = reply.text or None
        message["tool_calls"] = [
            _tool_call(t.id or f"call_fake_{next(_ids)}", t.name, t.arguments_json)
            for i, t in enumerate(reply.tool_calls)
        ]
    prompt, completion_tokens = reply.tokens(body)
    return web.json_response(
        {
            "id": f"chatcmpl-fake-{next(_ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "fake-model"),
            "choices": [{"index": 0, "message": message, "finish_reason": reply.finish}],
            "usage": _usage(prompt, completion_tokens, reply.cached),
        }
    )


def _usage(prompt: int, completion_tokens: int, cached: int = 0) -> Json:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
    }


async def stream(request: web.Request, body: Json, reply: Reply) -> web.StreamResponse:
    """`data: {chunk}` lines: the role, the text in pieces, each tool call
    (index, id, name, then its arguments in fragments), the finish_reason;
    with stream_options.include_usage a last chunk with no choices and the
    usage (earlier chunks carry "usage": null); then `data: [DONE]`."""
    resp = await open_sse(request)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    base: Json = {
        "id": f"chatcmpl-fake-{next(_ids)}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": body.get("model", "fake-model"),
    }

    async def send(choices: list[Json], **extra: object) -> None:
        chunk = {**base, "choices": choices, **extra}
        if include_usage:
            chunk.setdefault("usage", None)
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())

    async def delta(d: Json, finish: str | None = None) -> None:
        await send([{"index": 0, "delta": d, "finish_reason": finish}])

    await delta({"role": "assistant", "content": ""})
    for piece in pieces(reply.text):
        await delta({"content": piece})
    for i, t in enumerate(reply.tool_calls):
        call_id = t.id or f"call_fake_{next(_ids)}"
        await delta({"tool_calls": [{"index": i, **_tool_call(call_id, t.name, "")}]})
        for frag in fragments(t.arguments_json):
            await delta({"tool_calls": [{"index": i, "function": {"arguments": frag}}]})
    await delta({}, reply.finish)
    if include_usage:
        await send([], usage=_usage(*reply.tokens(body), reply.cached))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def models(names: list[str]) -> web.Response:
    data = [{"id": n, "object": "model", "created": 0, "owned_by": "fake"} for n in names]
    return web.json_response({"object": "list", "data": data})
