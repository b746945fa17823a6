"""The generic HTTP ingress adapter: `POST /v1/bots/{bot}/messages`.

Any platform that can call a webhook posts the replay fields (docs/replay.md) and
gets the decision back, with `reply`/`reply_id` when the bot answered and
`warning`/`warning_id` when it posts a limit warning. Both were counted as this
bot's turns under those ids: a client that shows them to other bots passes the
id along, so they are counted once.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from gateway.config import BotConfig
from gateway.http import BadRequest, HttpServer
from gateway.model import Action, Decision
from gateway.pipeline import Gateway
from gateway.wire import FieldError, decision_fields, parse_input


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


class HttpAdapter:
    def __init__(self, bot: BotConfig, gateway: Gateway, server: HttpServer) -> None:
        self.bot = bot
        self.gateway = gateway
        self.server = server

    async def start(self) -> None:
        self.server.add_ingress(self.bot.name, self.handle)

    async def stop_intake(self) -> None:
        """Nothing to do: the daemon's listener closes."""

    async def stop(self) -> None:
        self.server.remove_ingress(self.bot.name)

    async def handle(self, body: Any) -> tuple[int, dict[str, Any]]:
        # `at` is checked like every field, but the store's clock decides.
        try:
            msg = parse_input(body, platform="http", default_id=_new_id("in"),
                              bot_id=self.gateway.bot_id).message  # fmt: skip
        except FieldError as exc:
            raise BadRequest(str(exc)) from None
        # Tracked from decision to counted reply: a stopping daemon lets both finish.
        with self.gateway.inflight.track():
            d = await self.gateway.handle(msg)
            out = decision_fields(d, msg.chat.id)
            if d.action is Action.REPLY and d.replies:
                try:
                    out.update(await self._send(d))
                except asyncio.CancelledError:
                    await asyncio.shield(self.gateway.unsent(d, "cancelled at shutdown"))
                    raise
            elif d.action is Action.WARN and d.warning:
                warning_id = _new_id(self.bot.name)
                await self.gateway.sent(d, warning_id, d.warning, first=False)
                out["warning_id"] = warning_id
        return 200, out

    async def _send(self, d: Decision) -> dict[str, Any]:
        """Count each reply under a fresh id: the client shows it under that id."""
        sent = []
        for i, text in enumerate(d.replies):
            reply_id = _new_id(self.bot.name)
            await self.gateway.sent(d, reply_id, text, first=i == 0)
            sent.append({"id": reply_id, "text": text})
        out: dict[str, Any] = {"reply": sent[0]["text"], "reply_id": sent[0]["id"]}
        if len(sent) > 1:
            out["replies"] = sent
        return out


def create(bot: BotConfig, gateway: Gateway, server: HttpServer) -> HttpAdapter:
    return HttpAdapter(bot, gateway, server)
