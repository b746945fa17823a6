"""The ingress routes: messages posted to a bot (`POST /v1/bots/{bot}/messages`)
and platform webhooks (`POST /v1/webhooks/{bot}`). Adapters register a
handler per bot; the routes find it (docs/http-api.md)."""

from __future__ import annotations

import logging

from aiohttp import web

from gateway.api.common import (
    WEBHOOK_MAX_BODY,
    BodyTooLarge,
    IngressHandler,
    WebhookHandler,
    error,
    json_body,
    reply,
)

log = logging.getLogger("botbouncer.http")


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
        bot = request.match_info["bot"]
        handler = self.webhooks.get(bot)
        if handler is None:
            return error(404, "no bot here takes webhooks under that name")
        # One event as the platform sends it: what request.read() and
        # json_body take here is WEBHOOK_MAX_BODY, not MAX_BODY.
        request = request.clone(client_max_size=WEBHOOK_MAX_BODY)
        try:
            return await handler(request)
        except (web.HTTPRequestEntityTooLarge, BodyTooLarge):
            # the platform's retries are as large: the event is lost, say so
            size = request.content_length
            log.warning("webhook of bot %s: a request of %s bytes refused, over the limit of %d: "
                        "the event it carried is lost", bot,
                        f"more than {WEBHOOK_MAX_BODY}" if size is None else size,
                        WEBHOOK_MAX_BODY)  # fmt: skip
            return error(413, f"request body larger than {WEBHOOK_MAX_BODY} bytes")
