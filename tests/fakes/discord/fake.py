"""FakeDiscord: the fake Discord server (its lifecycle), what people do on Discord in
tests (`user_says`), and `pointed_at`, which sends discord.py there."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

from aiohttp import web

from tests.fakes.discord.interactions import Interactions
from tests.fakes.discord.payloads import RecordedMessage, new_message
from tests.fakes.discord.world import API_VERSION, Json, MessageType


class FakeDiscord(Interactions):
    """An aiohttp fake of Discord's REST API (v10) and gateway for discord.py clients."""

    def __init__(self) -> None:
        super().__init__()
        self._runner: web.AppRunner | None = None

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> FakeDiscord:
        self._runner = web.AppRunner(self._app(), shutdown_timeout=1, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        self.gateway_url = f"ws://127.0.0.1:{port}/gateway"
        return self

    @property
    def api_base(self) -> str:
        return f"{self.url}/api/v{API_VERSION}"

    async def close(self) -> None:
        await self._close_connections()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeDiscord:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- what people do ------------------------------------------------------------------

    async def user_says(
        self,
        channel_id: int,
        author_id: int,
        content: str,
        *,
        message_type: int = MessageType.DEFAULT,
    ) -> Json:
        """A message by any known user (human or bot), as if typed in a Discord client:
        <@id>, <@&id>, @everyone and @here in the content ping (as Discord decides
        without allowed_mentions). Returns the MESSAGE_CREATE payload."""
        rec = self._new(channel_id, author_id, content, "user_says", message_type)
        await self._store_and_fanout(rec)
        return rec.payload

    async def webhook_says(
        self, channel_id: int, webhook_id: int, name: str, content: str, *, by: int
    ) -> Json:
        """A message posted through a channel webhook (a bridge, PluralKit), as
        Discord sends it: the author is the webhook (its id, the name the post
        gave, `bot: true`, no member), with `webhook_id` and, for a webhook an
        application made, `application_id`. `by`: the user whose pings it may
        make (the webhook's owner). Returns the MESSAGE_CREATE payload."""
        rec = self._new(channel_id, by, content, "webhook_says")
        rec.payload.pop("member", None)
        rec.payload["author"] = {"id": str(webhook_id), "username": name, "avatar": None,
                                 "discriminator": "0000", "bot": True}  # fmt: skip
        rec.payload["webhook_id"] = str(webhook_id)
        rec.payload["application_id"] = str(by)
        rec.author_id = webhook_id
        await self._store_and_fanout(rec)
        return rec.payload

    def message_payload(self, channel_id: int, author_id: int, content: str) -> Json:
        """A MESSAGE_CREATE payload as `user_says` would build it (fresh id, pings
        resolved), neither recorded nor dispatched: a starting point for
        `dispatch_raw` payloads that Discord should never send."""
        return copy.deepcopy(self._new(channel_id, author_id, content, "raw").payload)

    def _new(
        self,
        channel_id: int,
        author_id: int,
        content: str,
        via: str,
        message_type: int = MessageType.DEFAULT,
    ) -> RecordedMessage:
        return new_message(
            self,
            channel_id=channel_id,
            author_id=author_id,
            content=content,
            message_type=message_type,
            via=via,
        )


@contextlib.contextmanager
def pointed_at(fake: FakeDiscord) -> Iterator[None]:
    """Point discord.py (REST base and default gateway) at `fake`; restore on exit."""
    import yarl
    from discord.gateway import DiscordWebSocket
    from discord.http import Route

    old_base, old_gateway = Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY
    Route.BASE = fake.api_base
    DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(fake.gateway_url)
    try:
        yield
    finally:
        Route.BASE = old_base
        DiscordWebSocket.DEFAULT_GATEWAY = old_gateway
