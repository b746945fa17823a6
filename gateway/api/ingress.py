"""The ingress routes: messages posted to a bot (`POST /v1/bots/{bot}/messages`)
and platform webhooks (`POST /v1/webhooks/{bot}`). Adapters register a
handler per bot; the routes find it (docs/http-api.md)."""

from __future__ import annotations

from aiohttp import web

from gateway.api.common import IngressHandler, WebhookHandler, error, json_body, reply


class IngressRoutes:
    def __init__(self) -> None:
        self.ingress: dict[str, IngressHandler] = {}
        self.webhooks: dict[str, WebhookHandler] = {}

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/bots/{bot}/messages", self._message),
            web.post("/v1/webhooks/{bot}", self._webhook),
        ]

    async def _message(self, request: web.Request) -> web.Response:
        bot = request.match_info["bot"]
        handler = self.ingress.get(bot)
        if handler is None:
            known = ", ".join(sorted(self.ingress)) or "none"
            return error(404, f"no http bot named {bot!r} (http bots: {known})")
        status, payload = await handler(await json_body(request))
        return reply(payload, status)

    async def _webhook(self, request: web.Request) -> web.Response:
        handler = self.webhooks.get(request.match_info["bot"])
        if handler is None:
            return error(404, "no bot here takes webhooks under that name")
        return await handler(request)
