"""What the fake does with one request. Every behaviour answers in the shape
of the API the request came in on (OpenAI Chat Completions, Anthropic
Messages or OpenAI Responses), and streams when the body asks `stream: true`."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.llm import anthropic_wire, openai_wire, responses_wire
from tests.fakes.llm.model import Api, Call, Json, Reply, ToolCall


@dataclass
class Exchange:
    """One accepted request, as a behaviour sees it."""

    request: web.Request
    call: Call
    body: Json
    stopping: asyncio.Event  # set when the server stops

    @property
    def api(self) -> Api:
        return self.call.api


Handler = Callable[[Exchange], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Behaviour:
    """What the fake does with one request; build these with the functions below."""

    name: str
    run: Handler = field(repr=False)


def error_response(api: Api, code: int, message: str, kind: str | None = None) -> web.Response:
    if api == "anthropic":
        return anthropic_wire.error(code, message, kind)
    if api == "responses":
        return responses_wire.error(code, message, kind)
    return openai_wire.error(code, message, kind)


async def render(ex: Exchange, reply: Reply) -> web.StreamResponse:
    """`reply` in the request's API, whole or streamed as the request asked."""
    stream = bool(ex.body.get("stream"))
    if ex.api == "anthropic":
        if stream:
            return await anthropic_wire.stream(ex.request, ex.body, reply)
        return anthropic_wire.message(ex.body, reply)
    if ex.api == "responses":
        if stream:
            return await responses_wire.stream(ex.request, ex.body, reply)
        return responses_wire.response(ex.body, reply)
    if stream:
        return await openai_wire.stream(ex.request, ex.body, reply)
    return openai_wire.completion(ex.body, reply)


def say(reply: Reply, name: str | None = None) -> Behaviour:
    """200 with `reply` (text and/or tool calls), whole or streamed."""

    async def run(ex: Exchange) -> web.StreamResponse:
        return await render(ex, reply)

    return Behaviour(name or f"say({reply!r})", run)


def answer(
    text: str, finish_reason: str = "stop", usage: tuple[int, int] | None = None, cached: int = 0
) -> Behaviour:
    """200 with an assistant message whose content is `text` (Anthropic: one
    text block, finish_reason "stop" is stop_reason "end_turn"; Responses: one
    message item with one output_text, "length" is status "incomplete");
    `cached` of its input tokens read from the prompt cache (Reply)."""
    reply = Reply(text, finish_reason=finish_reason, usage=usage, cached=cached)
    return say(reply, f"answer({text!r})")


def tool_call(
    name: str,
    arguments: Json | str | None = None,
    *,
    text: str = "",
    id: str | None = None,
    usage: tuple[int, int] | None = None,
) -> Behaviour:
    """200 asking for one tool call (OpenAI: message.tool_calls, finish_reason
    "tool_calls"; Anthropic: a tool_use block, stop_reason "tool_use";
    Responses: a function_call item, `id` its call_id), after `text` if
    given. Whatever the request offered: see repeat_tool_call for a model
    that heeds tool_choice none."""
    call = ToolCall(name, {} if arguments is None else arguments, id)
    return say(Reply(text, (call,), usage=usage), f"tool_call({name!r}, {call.arguments!r})")


def tool_calls(*calls: ToolCall, text: str = "") -> Behaviour:
    """200 asking for several tool calls at once (parallel tool calls)."""
    names = ", ".join(c.name for c in calls)
    return say(Reply(text, tuple(calls)), f"tool_calls({names})")


def repeat_tool_call(
    name: str,
    arguments: Json | str | None = None,
    *,
    obey: bool = True,
    otherwise: str = "I will stop calling tools now.",
) -> Behaviour:
    """The looping agent's upstream, for `llm.default`: the same tool call,
    with the same arguments (a fresh id each time), on every request. With
    `obey` a request that offers no tools or says tool_choice none
    ("none" / {"type": "none"}, any API) is answered with the text `otherwise` instead,
    as a real model does; `obey=False` asks for the tool regardless."""
    call = ToolCall(name, {} if arguments is None else arguments)
    asking = Reply("", (call,))

    async def run(ex: Exchange) -> web.StreamResponse:
        if obey and ex.call.forbids_tools:
            return await render(ex, Reply(otherwise))
        return await render(ex, asking)

    return Behaviour(f"repeat_tool_call({name!r}, {call.arguments!r})", run)


Responder = Callable[[Call], "Reply | str | Behaviour | Awaitable[Reply | str | Behaviour]"]


def respond(fn: Responder, name: str | None = None) -> Behaviour:
    """An answer that depends on the request: `fn(call)` (sync or async) gets
    the recorded Call (body, headers, path, api, tool_results, ...) and
    returns a Reply, a text, or another Behaviour to run."""

    async def run(ex: Exchange) -> web.StreamResponse:
        out: Any = fn(ex.call)
        if inspect.isawaitable(out):
            out = await out
        if isinstance(out, Behaviour):
            return await out.run(ex)
        return await render(ex, Reply(out) if isinstance(out, str) else out)

    return Behaviour(name or f"respond({getattr(fn, '__name__', 'fn')})", run)


def reasoning(word: str, thinking_tokens: int = 300) -> Behaviour:
    """A reasoning model: it spends `thinking_tokens` before its word. Under
    a smaller max_tokens (max_completion_tokens, Responses' max_output_tokens)
    it is cut off with nothing said (content "" and finish_reason "length", as
    OpenAI's reasoning models answer; Responses: status "incomplete",
    incomplete_details.reason "max_output_tokens", an empty output_text);
    else its thinking comes inline before the word, as some open models return it."""

    async def run(ex: Exchange) -> web.StreamResponse:
        budget = (
            ex.body.get("max_tokens")
            or ex.body.get("max_completion_tokens")
            or ex.body.get("max_output_tokens")
            or 0
        )
        if budget < thinking_tokens + 1:
            return await render(ex, Reply("", finish_reason="length"))
        thought = "<think>The user asks whether to REPLY. " + "hmm " * 20 + "</think>"
        return await render(ex, Reply(f"{thought}\n{word}"))

    return Behaviour(f"reasoning({word!r}, {thinking_tokens})", run)


def slow(seconds: float, then: Behaviour | None = None) -> Behaviour:
    """Wait `seconds` (cut short if the server stops), then behave as `then` (answer REPLY)."""
    after = then or answer("REPLY")

    async def run(ex: Exchange) -> web.StreamResponse:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ex.stopping.wait(), seconds)
        return await after.run(ex)

    return Behaviour(f"slow({seconds!r}, {after.name})", run)


def hang() -> Behaviour:
    """Never answer while the server runs (the client times out); 503 once it stops."""

    async def run(ex: Exchange) -> web.Response:
        await ex.stopping.wait()
        return error_response(ex.api, 503, "fake LLM stopped")

    return Behaviour("hang()", run)


def status(code: int, body: str = "fake error", kind: str | None = None) -> Behaviour:
    """HTTP `code` with the API's error body (OpenAI {"error": {"message",
    "type", "param", "code"}}, Anthropic {"type": "error", "error": {"type",
    "message"}}) whose message is `body`; `kind` overrides the error type."""

    async def run(ex: Exchange) -> web.Response:
        return error_response(ex.api, code, body, kind)

    return Behaviour(f"status({code})", run)


def malformed() -> Behaviour:
    """200, Content-Type application/json, but a truncated body that does not parse."""

    async def run(ex: Exchange) -> web.Response:
        return web.Response(text='{"choices": [', content_type="application/json")

    return Behaviour("malformed()", run)


def no_choices() -> Behaviour:
    """200 with a well-formed answer that says nothing: a chat.completion
    whose `choices` is empty (Anthropic: a message whose `content` is empty;
    Responses: a completed response whose `output` is empty)."""

    async def run(ex: Exchange) -> web.Response:
        if ex.api == "responses":
            usage = responses_wire.usage_json(1, 0)
            return web.json_response(responses_wire.response_json(ex.body, [], usage=usage))
        if ex.api == "anthropic":
            usage = {"input_tokens": 1, "output_tokens": 0}
            return web.json_response(anthropic_wire.message_json(ex.body, [], "end_turn", usage))
        return web.json_response(
            {"id": "chatcmpl-fake-empty", "object": "chat.completion", "choices": []}
        )

    return Behaviour("no_choices()", run)


def close() -> Behaviour:
    """Drop the connection without any HTTP response."""

    async def run(ex: Exchange) -> web.Response:
        assert ex.request.transport is not None
        ex.request.transport.abort()  # aiohttp then finds nothing to write the response to
        return web.Response()

    return Behaviour("close()", run)
