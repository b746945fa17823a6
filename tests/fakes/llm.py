"""A scriptable OpenAI-compatible chat-completions server for tests.

    async with FakeLLM() as llm:
        llm.then(answer("SKIP"), status(500), hang())   # one behaviour per request
        llm.default = answer("REPLY")                    # once the queue is empty
        ... point the client at llm.base_url (it POSTs {base_url}/chat/completions) ...
        assert llm.count == 4 and llm.calls[0].body["model"] == "..."

Every request is recorded in `llm.calls`, including refused ones: a request
without the key set by `require_key` gets 401 and one whose body is not JSON
gets 400; neither consumes a queued behaviour.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from aiohttp import web

Json = dict[str, Any]
Handler = Callable[[web.Request, Json, asyncio.Event], Awaitable[web.StreamResponse]]

_ids = itertools.count(1)


@dataclass(frozen=True)
class Behaviour:
    """What the fake does with one request; build these with the functions below."""

    name: str
    run: Handler = field(repr=False)


@dataclass
class Call:
    body: Json | None  # the parsed JSON request body, None if it was not JSON
    headers: dict[str, str]  # keys lower-cased: headers["authorization"]
    behaviour: str  # Behaviour.name of what was answered, or "unauthorized" / "bad_request"


def _error(code: int, message: str) -> web.Response:
    kind = "server_error" if code >= 500 else "invalid_request_error"
    error = {"message": message, "type": kind, "param": None, "code": None}
    return web.json_response({"error": error}, status=code)


def answer(text: str, finish_reason: str = "stop") -> Behaviour:
    """200 with an ordinary chat.completion whose message content is `text`."""

    async def run(request: web.Request, body: Json, stopping: asyncio.Event) -> web.Response:
        return _completion(body, text, finish_reason)

    return Behaviour(f"answer({text!r})", run)


def reasoning(word: str, thinking_tokens: int = 300) -> Behaviour:
    """A reasoning model: it spends `thinking_tokens` before its word. Under
    a smaller max_tokens it is cut off with nothing said (content "" and
    finish_reason "length", as OpenAI's reasoning models answer); else its
    thinking comes inline before the word, as some open models return it."""

    async def run(request: web.Request, body: Json, stopping: asyncio.Event) -> web.Response:
        budget = body.get("max_tokens") or body.get("max_completion_tokens") or 0
        if budget < thinking_tokens + 1:
            return _completion(body, "", "length")
        thought = "<think>The user asks whether to REPLY. " + "hmm " * 20 + "</think>"
        return _completion(body, f"{thought}\n{word}", "stop")

    return Behaviour(f"reasoning({word!r}, {thinking_tokens})", run)


def _completion(body: Json, text: str, finish_reason: str) -> web.Response:
    return web.json_response(
        {
            "id": f"chatcmpl-fake-{next(_ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "fake-model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": finish_reason,
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
        }
    )


def slow(seconds: float, then: Behaviour | None = None) -> Behaviour:
    """Wait `seconds` (cut short if the server stops), then behave as `then` (answer REPLY)."""
    after = then or answer("REPLY")

    async def run(request: web.Request, body: Json, stopping: asyncio.Event) -> web.StreamResponse:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), seconds)
        return await after.run(request, body, stopping)

    return Behaviour(f"slow({seconds!r}, {after.name})", run)


def hang() -> Behaviour:
    """Never answer while the server runs (the client times out); 503 once it stops."""

    async def run(request: web.Request, body: Json, stopping: asyncio.Event) -> web.Response:
        await stopping.wait()
        return _error(503, "fake LLM stopped")

    return Behaviour("hang()", run)


def status(code: int, body: str = "fake error") -> Behaviour:
    """HTTP `code` with an OpenAI-style error body whose message is `body`."""

    async def run(request: web.Request, _: Json, stopping: asyncio.Event) -> web.Response:
        return _error(code, body)

    return Behaviour(f"status({code})", run)


def malformed() -> Behaviour:
    """200, Content-Type application/json, but a truncated body that does not parse."""

    async def run(request: web.Request, body: Json, stopping: asyncio.Event) -> web.Response:
        return web.Response(text='{"choices": [', content_type="application/json")

    return Behaviour("malformed()", run)


def no_choices() -> Behaviour:
    """200 with a well-formed chat.completion whose `choices` is empty."""

    async def run(request: web.Request, body: Json, stopping: asyncio.Event) -> web.Response:
        return web.json_response(
            {"id": "chatcmpl-fake-empty", "object": "chat.completion", "choices": []}
        )

    return Behaviour("no_choices()", run)


def close() -> Behaviour:
    """Drop the connection without any HTTP response."""

    async def run(request: web.Request, body: Json, stopping: asyncio.Event) -> web.Response:
        assert request.transport is not None
        request.transport.abort()  # aiohttp then finds nothing to write the response to
        return web.Response()

    return Behaviour("close()", run)


class FakeLLM:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.default: Behaviour = answer("REPLY")
        self.key: str | None = None
        self._queue: deque[Behaviour] = deque()
        self._stopping = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._port}/v1"

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    @property
    def count(self) -> int:
        return len(self.calls)

    def then(self, *behaviours: Behaviour) -> FakeLLM:
        """Queue behaviours, consumed one per (accepted) request before `default`."""
        self._queue.extend(behaviours)
        return self

    def require_key(self, key: str | None) -> FakeLLM:
        """Answer 401 to requests without `Authorization: Bearer <key>` (None: no check)."""
        self.key = key
        return self

    async def start(self) -> FakeLLM:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        self._stopping.set()  # release hang() and slow() first, so cleanup has nothing to wait on
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeLLM:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            body = json.loads(await request.read())
        except ValueError:
            body = None
        call = Call(body if isinstance(body, dict) else None, headers, "")
        self.calls.append(call)
        if self.key is not None and headers.get("authorization") != f"Bearer {self.key}":
            call.behaviour = "unauthorized"
            return _error(401, "Incorrect API key provided.")
        if call.body is None:
            call.behaviour = "bad_request"
            return _error(400, "We could not parse the JSON body of your request.")
        behaviour = self._queue.popleft() if self._queue else self.default
        call.behaviour = behaviour.name
        return await behaviour.run(request, call.body, self._stopping)
