"""A scripted webhook backend server: records requests, answers as told."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

Answer = Callable[[asyncio.Event], Awaitable[web.StreamResponse]]


def reply_json(obj: Any, code: int = 200) -> Answer:
    async def run(_: asyncio.Event) -> web.StreamResponse:
        return web.Response(text=json.dumps(obj), status=code, content_type="application/json")

    return run


def raw(body: str, code: int = 200) -> Answer:
    async def run(_: asyncio.Event) -> web.StreamResponse:
        return web.Response(text=body, status=code, content_type="application/json")

    return run


def no_content() -> Answer:
    async def run(_: asyncio.Event) -> web.StreamResponse:
        return web.Response(status=204)

    return run


def hang() -> Answer:
    async def run(stopping: asyncio.Event) -> web.StreamResponse:
        await stopping.wait()
        return web.Response(status=503)

    return run


class Drop(Exception):
    """Raised by an answer: the server closes the connection without a response."""


def drop() -> Answer:
    async def run(_: asyncio.Event) -> web.StreamResponse:
        raise Drop

    return run


class FakeWebhook:
    def __init__(self) -> None:
        self.default: Answer = reply_json({"reply": "ok"})
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []  # each request's, as sent (an answer may echo them)
        self.active = 0  # requests being answered now
        self.peak = 0  # the most at once
        self.queue: deque[Answer] = deque()
        self._stopping = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.url = ""

    def then(self, *answers: Answer) -> FakeWebhook:
        self.queue.extend(answers)
        return self

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.headers.append(dict(request.headers))
        self.requests.append(await request.json())
        answer = self.queue.popleft() if self.queue else self.default
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            return await answer(self._stopping)
        except Drop:
            assert request.transport is not None
            request.transport.abort()  # mid-request, no status line: the peer sees a reset
            raise web.HTTPInternalServerError from None  # never written: the socket is gone
        finally:
            self.active -= 1

    async def __aenter__(self) -> FakeWebhook:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=1, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/hook"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stopping.set()
        if self._runner is not None:
            await self._runner.cleanup()
