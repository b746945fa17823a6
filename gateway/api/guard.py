"""The agent guard's routes: `/v1/guard/{session}/...` (docs/agent-guard.md)."""

from __future__ import annotations

from aiohttp import web

from gateway.api.common import GUARD_MAX_BODY, error, json_body, reply
from gateway.guard.openapi import OPENAPI
from gateway.guard.service import Answer, Guard
from gateway.metrics import Metrics


class GuardRoutes:
    def __init__(self, guard: Guard, metrics: Metrics) -> None:
        self.guard = guard
        self.metrics = metrics

    def routes(self) -> list[web.RouteDef]:
        session = "/v1/guard/{session:[^/]+}"
        return [
            web.get("/v1/guard/openapi.json", self._guard_openapi),
            web.post(session + "/{op:step|result|retry|handoff|kb-query|usage}", self._guard),
            web.get(session, self._guard_state),
            web.delete(session, self._guard_reset),
        ]

    async def _guard(self, request: web.Request) -> web.Response:
        ops = {
            "step": self.guard.step,
            "result": self.guard.result,
            "retry": self.guard.retry,
            "handoff": self.guard.handoff,
            "kb-query": self.guard.kb_query,
            "usage": self.guard.usage,
        }
        check = ops[request.match_info["op"]]
        answer: Answer = await check(
            request.match_info["session"],
            await json_body(request, GUARD_MAX_BODY),
            request.query.get("profile"),
        )
        self.metrics.guard_checks.labels(answer.decision, answer.reason).inc()
        return reply(answer.as_dict(), answer.status)

    async def _guard_state(self, request: web.Request) -> web.Response:
        session = request.match_info["session"]
        state = await self.guard.state(session)
        if state is None:
            return error(404, f"no guard session {session!r} (or it expired)")
        return reply({"session": session, "state": state})

    async def _guard_reset(self, request: web.Request) -> web.Response:
        session = request.match_info["session"]
        await self.guard.reset(session)
        return reply({"session": session, "done": "reset"})

    async def _guard_openapi(self, request: web.Request) -> web.Response:
        return reply(OPENAPI)
