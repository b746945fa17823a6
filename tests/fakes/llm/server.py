"""The fake LLM server: one aiohttp app on 127.0.0.1 answering its three
APIs (Chat Completions, Anthropic Messages, Responses) from one queue of
behaviours."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from types import TracebackType

from aiohttp import web

from tests.fakes.llm import anthropic_wire, openai_wire
from tests.fakes.llm.behaviours import Behaviour, Exchange, answer, error_response
from tests.fakes.llm.model import Api, Call
from tests.fakes.llm.sse import open_sse


class FakeLLM:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.default: Behaviour = answer("REPLY")
        self.key: str | None = None
        self.models: list[str] = ["fake-model"]  # what GET /v1/models lists
        self._queue: deque[Behaviour] = deque()
        # Responses made with `background: true`, by id: fetched with GET
        # /v1/responses/<id>, "in_progress" the first `background_polls` times.
        self.background: dict[str, dict[str, object]] = {}
        self.background_polls = 0
        self.background_stream_seconds = 0.0
        self.background_ignored = False  # as servers that answer every request at once
        self._polled: dict[str, int] = {}
        self._stopping = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._port = 0

    @property
    def base_url(self) -> str:
        """OpenAI's base URL: openai.AsyncOpenAI(base_url=llm.base_url)."""
        return f"http://127.0.0.1:{self._port}/v1"

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    @property
    def responses_url(self) -> str:
        return f"{self.base_url}/responses"

    @property
    def anthropic_base_url(self) -> str:
        """Anthropic's base URL (no /v1): anthropic.AsyncAnthropic(base_url=...)."""
        return f"http://127.0.0.1:{self._port}"

    @property
    def anthropic_url(self) -> str:
        return f"{self.anthropic_base_url}/v1/messages"

    @property
    def count(self) -> int:
        return len(self.calls)

    @property
    def last(self) -> Call:
        return self.calls[-1]

    def calls_to(self, api: Api) -> list[Call]:
        """The recorded model calls (chat completions / messages / responses) of one API."""
        paths = {
            "openai": "/v1/chat/completions",
            "anthropic": "/v1/messages",
            "responses": "/v1/responses",
        }
        return [c for c in self.calls if c.path == paths[api]]

    def then(self, *behaviours: Behaviour) -> FakeLLM:
        """Queue behaviours, consumed one per (accepted) model call before `default`."""
        self._queue.extend(behaviours)
        return self

    def require_key(self, key: str | None) -> FakeLLM:
        """Answer 401 to requests without the key (None: no check): OpenAI's
        (Chat Completions, Responses) `Authorization: Bearer <key>`;
        Anthropic's `x-api-key: <key>` or the Bearer."""
        self.key = key
        return self

    async def start(self) -> FakeLLM:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._openai)
        app.router.add_post("/v1/messages", self._anthropic)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_get("/v1/responses/{response_id}", self._fetch)
        app.router.add_get("/v1/models", self._models)
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0, access_log=None)
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

    async def _record(self, request: web.Request, api: Api) -> Call:
        headers = {k.lower(): v for k, v in request.headers.items()}
        raw = await request.read() if request.body_exists else b""  # read() keeps what it read
        try:
            body = json.loads(raw) if raw else None
        except (ValueError, RecursionError):  # not JSON, or nested past Python's stack
            body = None
        call = Call(body if isinstance(body, dict) else None, headers, "", raw=raw)
        call.path, call.api, call.method = request.path, api, request.method
        call.query = request.query_string
        self.calls.append(call)
        return call

    def _authorized(self, call: Call) -> bool:
        if self.key is None:
            return True
        bearer = call.headers.get("authorization") == f"Bearer {self.key}"
        if call.api == "anthropic":
            return bearer or call.headers.get("x-api-key") == self.key
        return bearer

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        return await self._model_call(request, "openai")

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        return await self._model_call(request, "anthropic")

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        try:
            body = json.loads(await request.read())  # read again by _record, kept by aiohttp
        except ValueError:
            body = None
        if not isinstance(body, dict) or body.get("background") is not True:
            return await self._model_call(request, "responses")
        if self.background_ignored:
            return await self._model_call(request, "responses")
        # Background: the answer written at once, kept to be fetched
        # (GET /v1/responses/<id>); answered queued, or streamed: created at
        # once, completed `background_stream_seconds` later (a client that
        # drops the stream meanwhile resumes it with ?stream=true).
        answer = await self._model_call(request, "responses", stream=False)
        if not isinstance(answer, web.Response) or answer.status != 200 or answer.text is None:
            return answer
        done = json.loads(answer.text)
        self.background[done["id"]] = done
        queued = {**done, "status": "queued", "output": [], "usage": None, "completed_at": None}
        if not body.get("stream"):
            return web.json_response(queued)
        resp = await open_sse(request)
        try:
            await resp.write(_event("response.created", 0, queued))
            for _ in range(round(self.background_stream_seconds / 0.05)):
                await asyncio.sleep(0.05)
                await resp.write(b": writing\n\n")  # an SSE comment, as a keep-alive
            await resp.write(_event("response.completed", 1, done))
            await resp.write_eof()
        except ConnectionResetError:  # the client left: the response is written all the same
            pass
        return resp

    async def _fetch(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/responses/<id>: a background response, in progress the first
        `background_polls` times, then as it was written; with `?stream=true`,
        its stream resumed at its end (a response.completed event)."""
        call = await self._record(request, "responses")
        response_id = request.match_info["response_id"]
        done = self.background.get(response_id)
        if not self._authorized(call) or done is None:
            call.behaviour = "not_found"
            return error_response("responses", 404, f"No response found with id '{response_id}'.")
        call.behaviour = "fetch"
        if request.query.get("stream") == "true":
            resp = await open_sse(request)
            await resp.write(_event("response.completed", 1, done))
            await resp.write_eof()
            return resp
        polled = self._polled[response_id] = self._polled.get(response_id, 0) + 1
        if polled <= self.background_polls:
            return web.json_response({**done, "status": "in_progress", "output": [],
                                      "usage": None, "completed_at": None})  # fmt: skip
        return web.json_response(done)

    async def _model_call(
        self, request: web.Request, api: Api, stream: bool | None = None
    ) -> web.StreamResponse:
        call = await self._record(request, api)
        if not self._authorized(call):
            call.behaviour = "unauthorized"
            message = "invalid x-api-key" if api == "anthropic" else "Incorrect API key provided."
            return error_response(api, 401, message)
        if call.body is None:
            call.behaviour = "bad_request"
            return error_response(api, 400, "We could not parse the JSON body of your request.")
        if api == "anthropic" and "anthropic-version" not in call.headers:
            call.behaviour = "bad_request"
            return error_response(api, 400, "anthropic-version: header is required")
        behaviour = self._queue.popleft() if self._queue else self.default
        call.behaviour = behaviour.name
        body = call.body if stream is None else {**call.body, "stream": stream}
        return await behaviour.run(Exchange(request, call, body, self._stopping))

    @staticmethod
    def _api_of(request: web.Request) -> Api:
        anthropic = "anthropic-version" in request.headers or "x-api-key" in request.headers
        return "anthropic" if anthropic else "openai"

    async def _models(self, request: web.Request) -> web.Response:
        call = await self._record(request, self._api_of(request))
        if not self._authorized(call):
            call.behaviour = "unauthorized"
            return error_response(call.api, 401, "Incorrect API key provided.")
        call.behaviour = "models"
        if call.api == "anthropic":
            return anthropic_wire.models(self.models)
        return openai_wire.models(self.models)

    async def _unknown(self, request: web.Request) -> web.Response:
        call = await self._record(request, self._api_of(request))
        call.behaviour = "not_found"
        message = f"Unknown request URL: {request.method} {request.path}"
        return error_response(call.api, 404, message)


def _event(kind: str, sequence: int, response: object) -> bytes:
    data = json.dumps({"type": kind, "sequence_number": sequence, "response": response})
    return f"event: {kind}\ndata: {data}\n\n".encode()
