"""Slash commands: a person invokes one the bot synced (`invoke` dispatches an
INTERACTION_CREATE to the bot's sessions), and the bot answers through the callback
route, POST /interactions/{id}/{token}/callback (discord.py 2.7 always asks
`with_response`). A type 4 answer is a message in the channel, recorded and
dispatched unless it is ephemeral.

Only chat-input commands with plain options (string, integer, boolean, number, and
subcommands and groups) can be invoked; followups, edits of the original response
and other webhook routes are not implemented (they are unknown routes).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.fakes.discord.payloads import channel_payload, member_payload, new_message
from tests.fakes.discord.rest import PREFIX, HttpError, Rest, json_response, read_json
from tests.fakes.discord.world import EPHEMERAL, Json, MessageType

SUB_COMMAND, SUB_COMMAND_GROUP = 1, 2
PLAIN_OPTIONS = {3: "string", 4: "integer", 5: "boolean", 10: "number"}  # option types


@dataclass
class RecordedCallback:
    """The bot's answer to an interaction."""

    interaction_id: int
    type: int  # 4 message, 5 deferred message, ...
    data: Json

    @property
    def flags(self) -> int:
        return int(self.data.get("flags") or 0)

    @property
    def ephemeral(self) -> bool:
        return bool(self.flags & EPHEMERAL)

    @property
    def content(self) -> str | None:
        content = self.data.get("content")
        return None if content is None else str(content)


class PendingInteraction:
    """An INTERACTION_CREATE sent by `invoke`; `await response()` for its callback."""

    def __init__(self, payload: Json, bot_user_id: int) -> None:
        self.payload = payload
        self.bot_user_id = bot_user_id
        self.id = int(payload["id"])
        self.token = str(payload["token"])
        self.callback: asyncio.Future[RecordedCallback] = asyncio.get_running_loop().create_future()

    async def response(self, timeout: float = 5.0) -> RecordedCallback:  # noqa: ASYNC109
        try:
            return await asyncio.wait_for(asyncio.shield(self.callback), timeout)
        except TimeoutError:
            raise TimeoutError(
                f"fake discord: no callback for interaction {self.id} within {timeout}s"
            ) from None


class Interactions(Rest):
    """The REST API, with slash commands invoked and answered."""

    def __init__(self) -> None:
        super().__init__()
        self.interactions: dict[int, PendingInteraction] = {}

    def _add_routes(self, router: web.UrlDispatcher) -> None:
        super()._add_routes(router)
        callback = f"{PREFIX}/interactions/{{interaction_id:\\d+}}/{{token}}/callback"
        router.add_post(callback, self._post_callback)

    async def invoke(
        self,
        bot_user_id: int,
        guild_id: int,
        channel_id: int,
        user_id: int,
        command_path: Sequence[str],
        options: Mapping[str, Any] | None = None,
    ) -> PendingInteraction:
        """Dispatch an APPLICATION_COMMAND interaction to `bot_user_id`'s session(s).

        The command must have been synced by the bot (guild commands first, then global
        ones); its option types come from there. `command_path` is ["cmd"], ["cmd",
        "sub"] or ["cmd", "group", "sub"]. The member's `permissions` come from their
        roles (owner and administrators: all). `await result.response()` gives the
        callback.
        """
        bot = self.bot(bot_user_id)
        guild = self.guilds[guild_id]
        invoker = self.member_of(guild, user_id)
        if invoker is None:
            raise KeyError(f"fake discord: user {user_id} is not a member of guild {guild_id}")
        data = self._command_data(bot.application_id, guild_id, list(command_path), options or {})
        interaction_id = self.next_id()
        member_data = member_payload(guild, invoker)
        member_data["permissions"] = str(self.permissions(guild_id, user_id))
        channel_data = channel_payload(guild, self.channels[channel_id])
        channel_data["permissions"] = member_data["permissions"]
        payload: Json = {
            "id": str(interaction_id),
            "application_id": str(bot.application_id),
            "type": 2,
            "data": data,
            "guild_id": str(guild_id),
            "guild": {"id": str(guild_id), "locale": "en-US", "features": []},
            "channel_id": str(channel_id),
            "channel": channel_data,
            "member": member_data,
            "token": f"fake-interaction-token-{interaction_id}-{uuid.uuid4().hex}",
            "version": 1,
            "app_permissions": str(self.permissions(guild_id, bot_user_id)),
            "locale": "en-US",
            "guild_locale": "en-US",
            "entitlements": [],
            "authorizing_integration_owners": {"0": str(guild_id)},
            "context": 0,
            "attachment_size_limit": 10 * 1024 * 1024,
        }
        pending = PendingInteraction(payload, bot_user_id)
        self.interactions[interaction_id] = pending
        await self._fanout("INTERACTION_CREATE", payload, guild_id, only_user=bot_user_id)
        await self.changed()
        return pending

    def _command_data(
        self, application_id: int, guild_id: int, path: list[str], options: Mapping[str, Any]
    ) -> Json:
        if not path:
            raise ValueError("fake discord: command_path must name a command")
        found = [
            cmd
            for key in ((application_id, guild_id), (application_id, None))
            for cmd in self.commands.get(key, [])
            if cmd["name"] == path[0] and cmd.get("type", 1) == 1
        ]
        if not found:
            raise LookupError(f"fake discord: bot {application_id} synced no command /{path[0]}")
        cmd = found[0]
        level: list[Json] = cmd.get("options", [])
        for name in path[1:]:
            match = [o for o in level if o["name"] == name and o["type"] in (1, 2)]
            if not match:
                raise LookupError(f"fake discord: /{' '.join(path)}: no subcommand {name!r}")
            level = match[0].get("options", [])
        nested: list[Json] = [_option(level, name, value) for name, value in options.items()]
        for depth in range(len(path) - 1, 0, -1):  # the nesting, from the inside out
            kind = SUB_COMMAND if depth == len(path) - 1 else SUB_COMMAND_GROUP
            nested = [{"type": kind, "name": path[depth], "options": nested}]
        data: Json = {"id": cmd["id"], "name": path[0], "type": 1, "options": nested}
        if cmd.get("guild_id"):
            data["guild_id"] = cmd["guild_id"]
        return data

    # -- the callback --------------------------------------------------------------------

    async def _post_callback(self, request: web.Request) -> web.StreamResponse:
        pending = self.interactions.get(int(request.match_info["interaction_id"]))
        if pending is None or pending.token != request.match_info["token"]:
            raise HttpError(404, "Unknown interaction", 10062)
        if pending.callback.done():
            raise HttpError(400, "Interaction has already been acknowledged.", 40060)
        body = await read_json(request)
        kind = int(body.get("type", 0))
        data: Json = body.get("data") or {}
        recorded = RecordedCallback(pending.id, kind, data)
        message = None
        if kind == 4:
            message = new_message(
                self,
                channel_id=int(pending.payload["channel_id"]),
                author_id=pending.bot_user_id,
                content=data.get("content") or "",
                message_type=MessageType.CHAT_INPUT_COMMAND,
                via="interaction",
                allowed_mentions=data.get("allowed_mentions"),
                flags=recorded.flags,
                extra=_interaction_fields(pending),
            )
            ephemeral_to = pending.bot_user_id if recorded.ephemeral else None
            await self._store_and_fanout(message, ephemeral_to=ephemeral_to)
        pending.callback.set_result(recorded)
        await self.changed()
        interaction: Json = {
            "id": str(pending.id),
            "type": 2,
            "activity_instance_id": None,
            "response_message_id": str(message.id) if message else None,
            "response_message_loading": kind == 5,
            "response_message_ephemeral": recorded.ephemeral,
        }
        answer: Json = {"interaction": interaction}
        if message is not None:
            answer["resource"] = {"type": kind, "message": message.payload}
        return json_response(answer)


def _option(schema: list[Json], name: str, value: Any) -> Json:
    """An option as Discord sends it, its type from the synced command."""
    found = [o for o in schema if o.get("name") == name and o.get("type") not in (1, 2)]
    if not found:
        raise LookupError(f"fake discord: the synced command has no option {name!r}")
    kind = int(found[0]["type"])
    if kind not in PLAIN_OPTIONS:
        raise NotImplementedError(f"fake discord: option type {kind} ({name!r}) is not implemented")
    return {"name": name, "type": kind, "value": value}


def _interaction_fields(pending: PendingInteraction) -> Json:
    """What a message answering an interaction carries about it."""
    app_id = pending.payload["application_id"]
    return {
        "application_id": app_id,
        "webhook_id": app_id,
        "interaction_metadata": {
            "id": str(pending.id),
            "type": pending.payload["type"],
            "user": pending.payload["member"]["user"],
            "authorizing_integration_owners": pending.payload["authorizing_integration_owners"],
            "name": pending.payload["data"].get("name", ""),
            "command_type": 1,
        },
    }
