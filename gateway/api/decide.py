"""The decide routes, for bots with `mode: decide` (docs/guard-an-existing-bot.md):
`POST /v1/bots/{bot}/decide`, `/sent` and `/release`. The daemon registers a
Decider per such bot; gateway/decide.py holds the rules."""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp import web

from gateway.api.common import BadRequest, json_body, reply
from gateway.decide import Decider, check_ids, check_ticket
from gateway.wire import FieldError, decision_fields, parse_input


def _object(body: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("must be a JSON object")
    unknown = sorted(k for k in body if k not in keys)
    if unknown:
        raise BadRequest(f"{unknown[0]}: unknown field (known: {', '.join(keys)})")
    return body


class DecideRoutes:
    def __init__(self) -> None:
        self.deciders: dict[str, Decider] = {}

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/bots/{bot}/decide", self._decide),
            web.post("/v1/bots/{bot}/sent", self._sent),
            web.post("/v1/bots/{bot}/release", self._release),
        ]

    def _decider(self, request: web.Request) -> Decider:
        bot = request.match_info["bot"]
        decider = self.deciders.get(bot)
        if decider is None:
            known = ", ".join(sorted(self.deciders)) or "none"
            raise web.HTTPNotFound(reason=f"no bot named {bot!r} in mode: decide "
                                          f"(decide bots: {known})")  # fmt: skip
        return decider

    async def _decide(self, request: web.Request) -> web.Response:
        decider = self._decider(request)
        gateway = decider.gateway
        try:
            msg = parse_input(await json_body(request), platform=gateway.bot.platform,
                              default_id=f"in-{uuid.uuid4().hex[:16]}",
                              bot_id=gateway.bot_id).message  # fmt: skip
        except FieldError as exc:
            raise BadRequest(str(exc)) from None
        d = await decider.decide(msg)
        out = decision_fields(d, msg.chat.id)
        if d.ticket is not None:
            out["ticket"] = d.ticket
        return reply(out)

    async def _sent(self, request: web.Request) -> web.Response:
        decider = self._decider(request)
        body = _object(await json_body(request), ("ticket", "ids", "texts"))
        ticket = check_ticket(body.get("ticket"))
        ids, texts = check_ids(body.get("ids"), body.get("texts"))
        counted = await decider.sent(ticket, ids, texts)
        rows = zip(ids, counted, strict=True)
        return reply({"counted": [{"id": i, "turn": c.turn.value, "soft": c.soft, "hard": c.hard}
                                  for i, c in rows]})  # fmt: skip

    async def _release(self, request: web.Request) -> web.Response:
        decider = self._decider(request)
        body = _object(await json_body(request), ("ticket",))
        d = await decider.release(check_ticket(body.get("ticket")))
        return reply({"released": True, "id": d.message_id,
                      "reason": None if d.reason is None else d.reason.value})  # fmt: skip
