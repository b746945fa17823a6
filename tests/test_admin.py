"""The admin API (docs/http-api.md) and gateway/admin.py, on an in-process daemon.

Store-touching tests run on the memory store and on Redis. A Redis daemon gets
this test's own key prefix and its keys are deleted afterwards; chat ids are
unique per test as well, so a shared Redis db is left as it was found.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from gateway.admin import (
    Admin,
    AdminError,
    overrides_from,
    parse_limit_args,
    render_why,
)
from gateway.config import parse_config
from gateway.daemon import Daemon
from gateway.http import BadRequest, chat_key
from gateway.store import Overrides
from gateway.store.redis import RedisStore
from tests.conftest import delete_prefix

TOKEN = "sekrit-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BOTS = """
bots:
  - {name: alpha, platform: http, backend: {type: echo}, bot_messages: all, respond_to: all}
  - {name: beta, platform: http, backend: {type: echo}, bot_messages: all, respond_to: all}
  - {name: gamma, platform: http, backend: {type: echo}, turns: {soft_limit: 6, hard_limit: 12}}
defaults:
  turns: {soft_limit: 4, hard_limit: 8}
  rate_cap: {max_replies: 100}
"""
WITH_TOKEN = f"http: {{admin_token: {TOKEN}}}\n" + BOTS
# every admin route as (method, path under /v1/admin/chats/room, body)
ROUTES = [
    ("GET", "", None),
    ("POST", "/reset", None),
    ("POST", "/pause", None),
    ("POST", "/resume", None),
    ("PUT", "/limits", "{}"),
    ("GET", "/decisions", None),
]

WINDOW_RANGE = "rate_window_seconds: must be from 0.001 to 2592000 seconds"


class Api:
    """One running daemon and a client of its HTTP server."""

    def __init__(self, daemon: Daemon, client: TestClient) -> None:  # type: ignore[type-arg]
        self.daemon = daemon
        self.client = client

    def admin_of(self, bot: str = "alpha") -> Admin:
        return self.daemon.server.admins[bot]

    async def ingress(self, to: str = "alpha", /, **fields: Any) -> dict[str, Any]:
        resp = await self.client.post(f"/v1/bots/{to}/messages", data=json.dumps(fields))
        body: dict[str, Any] = await resp.json()
        assert resp.status == 200, body
        return body

    async def peer(self, chat: str, mid: str | None = None) -> dict[str, Any]:
        """A message from a bot that is not behind this gateway, to alpha."""
        fields: dict[str, Any] = {"chat": chat, "author": "peer", "bot": True, "text": "hi"}
        if mid is not None:
            fields["id"] = mid
        return await self.ingress("alpha", **fields)

    async def human(self, chat: str, mid: str | None = None) -> dict[str, Any]:
        fields: dict[str, Any] = {"chat": chat, "author": "alice", "text": "hello"}
        if mid is not None:
            fields["id"] = mid
        return await self.ingress("alpha", **fields)

    async def call(
        self,
        method: str,
        path: str,
        data: str | bytes | None = None,
        headers: dict[str, str] | None = AUTH,
    ) -> tuple[int, Any, aiohttp.ClientResponse]:
        resp = await self.client.request(method, path, data=data, headers=headers)
        return resp.status, await resp.json(), resp

    async def status(self, chat: str, query: str = "") -> dict[str, Any]:
        status, body, _ = await self.call("GET", f"/v1/admin/chats/{chat}{query}")
        assert status == 200, body
        return dict(body)

    async def act(self, chat: str, command: str) -> dict[str, Any]:
        status, body, _ = await self.call("POST", f"/v1/admin/chats/{chat}/{command}")
        assert status == 200, body
        assert body["done"] == command
        return dict(body)

    async def put_limits(self, chat: str, limits: Any) -> tuple[int, Any]:
        status, body, _ = await self.call(
            "PUT", f"/v1/admin/chats/{chat}/limits", data=json.dumps(limits)
        )
        return status, body

    async def decisions(self, chat: str, limit: int | None = None) -> list[dict[str, Any]]:
        query = "" if limit is None else f"?limit={limit}"
        status, body, _ = await self.call("GET", f"/v1/admin/chats/{chat}/decisions{query}")
        assert status == 200, body
        assert body["chat"] == f"http:{chat}"
        return list(body["decisions"])


@asynccontextmanager
async def running(config: str, prefix: str) -> AsyncIterator[Api]:
    daemon = Daemon(parse_config(config))
    primary = getattr(daemon.store, "primary", daemon.store)  # behind the failover
    redis = primary if isinstance(primary, RedisStore) else None
    if redis is not None:
        redis.prefix = prefix  # this test's keys only: deleted below
    try:
        for adapter in daemon.adapters:
            await adapter.start()
        async with TestClient(TestServer(daemon.server.app)) as client:
            yield Api(daemon, client)
    finally:
        if redis is not None:
            await delete_prefix(redis, prefix)
        await daemon.stop()


@pytest.fixture(params=["memory", "redis"])
def store_url(request: pytest.FixtureRequest) -> str:
    if request.param == "memory":
        return "memory://"
    url: str = request.getfixturevalue("redis_url")
    return url


@pytest.fixture
async def api(store_url: str, key_prefix: str) -> AsyncIterator[Api]:
    """A daemon with an admin token, on each store kind."""
    async with running(f"store: {{url: '{store_url}'}}\n" + WITH_TOKEN, key_prefix) as a:
        yield a


@pytest.fixture
async def memory_api(key_prefix: str) -> AsyncIterator[Api]:
    async with running(WITH_TOKEN, key_prefix) as a:
        yield a


@pytest.fixture
def chat() -> str:
    return f"room-{uuid.uuid4().hex[:12]}"


# -- authorization -----------------------------------------------------------


@pytest.mark.parametrize("headers", [None, AUTH, {"Authorization": "Bearer "}])
async def test_without_an_admin_token_every_admin_route_is_403(
    key_prefix: str, chat: str, headers: dict[str, str] | None
) -> None:
    async with running(BOTS, key_prefix) as api:
        for method, suffix, body in ROUTES:
            path = f"/v1/admin/chats/{chat}{suffix}"
            status, answer, resp = await api.call(method, path, data=body, headers=headers)
            assert status == 403, (method, path, answer)
            assert "http.admin_token" in answer["error"]
            assert "WWW-Authenticate" not in resp.headers


async def test_an_empty_admin_token_keeps_the_admin_api_closed(key_prefix: str) -> None:
    async with running('http: {admin_token: ""}\n' + BOTS, key_prefix) as api:
        status, _, _ = await api.call("GET", "/v1/admin/chats/x", headers={"Authorization": ""})
        assert status == 403
        status, _, _ = await api.call("GET", "/v1/admin/chats/x", headers={"Authorization": "x"})
        assert status == 403


async def test_a_missing_token_is_401_with_a_bearer_challenge(memory_api: Api, chat: str) -> None:
    for method, suffix, body in ROUTES:
        path = f"/v1/admin/chats/{chat}{suffix}"
        status, answer, resp = await memory_api.call(method, path, data=body, headers=None)
        assert status == 401, (method, path, answer)
        assert answer == {"error": "missing or wrong bearer token"}
        assert resp.headers["WWW-Authenticate"].startswith("Bearer ")


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer wrong-token",
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN[:-1]}",
        "Bearer",
        "Bearer ",
        TOKEN,  # no scheme
        f"Basic {TOKEN}",
        "Basic c2Vrcml0LXRva2VuOg==",  # base64("sekrit-token:")
        f"Token {TOKEN}",
        f"Bearer{TOKEN}",
    ],
)
async def test_a_wrong_token_or_scheme_is_401(
    memory_api: Api, chat: str, authorization: str
) -> None:
    for method, suffix, body in ROUTES:
        path = f"/v1/admin/chats/{chat}{suffix}"
        status, answer, resp = await memory_api.call(
            method, path, data=body, headers={"Authorization": authorization}
        )
        assert status == 401, (method, path, answer)
        assert resp.headers["WWW-Authenticate"].startswith("Bearer ")


@pytest.mark.parametrize("authorization", [f"Bearer {TOKEN}", f"bearer {TOKEN}", f"BEARER {TOKEN}"])
async def test_the_right_token_is_200_on_every_route(
    memory_api: Api, chat: str, authorization: str
) -> None:
    for method, suffix, body in ROUTES:
        path = f"/v1/admin/chats/{chat}{suffix}"
        status, answer, _ = await memory_api.call(
            method, path, data=body, headers={"Authorization": authorization}
        )
        assert status == 200, (method, path, answer)


@pytest.mark.parametrize(
    ("config", "headers", "refused"),
    [
        (WITH_TOKEN, None, 401),
        (WITH_TOKEN, {"Authorization": "Bearer wrong"}, 401),
        (WITH_TOKEN, {"Authorization": f"Basic {TOKEN}"}, 401),
        (BOTS, AUTH, 403),
    ],
)
async def test_a_refused_command_changes_nothing(
    store_url: str,
    key_prefix: str,
    chat: str,
    config: str,
    headers: dict[str, str] | None,
    refused: int,
) -> None:
    async with running(f"store: {{url: '{store_url}'}}\n" + config, key_prefix) as api:
        await api.peer(chat)
        await api.peer(chat)  # soft 4: the soft limit
        base = f"/v1/admin/chats/{chat}"
        for method, path, body in [
            ("POST", f"{base}/pause", None),
            ("POST", f"{base}/reset", None),
            ("PUT", f"{base}/limits", '{"soft_limit": 1, "hard_limit": 2}'),
        ]:
            status, _, _ = await api.call(method, path, data=body, headers=headers)
            assert status == refused
        state = await api.admin_of().status(f"http:{chat}")
        assert (state.soft, state.paused, state.overrides) == (4, False, Overrides())
        assert (await api.human(chat))["action"] == "reply"  # not paused


@pytest.mark.parametrize("raw", [b"Bearer \xff", b"Bearer \xe9t\xe9", b"bearer sekrit\x80"])
async def test_a_token_header_with_non_utf8_bytes_is_401_not_500(
    memory_api: Api, raw: bytes
) -> None:
    """Anyone can send these bytes: it must be a refusal, not a server error."""
    server = memory_api.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(b"GET /v1/admin/chats/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                 b"Authorization: " + raw + b"\r\n\r\n")  # fmt: skip
    await writer.drain()
    answer = await reader.read()
    writer.close()
    await writer.wait_closed()
    assert answer.split(b"\r\n", 1)[0] == b"HTTP/1.1 401 Unauthorized"


@pytest.mark.parametrize(
    ("method", "suffix", "allowed"),
    [("GET", "/pause", "POST"), ("DELETE", "/limits", "PUT"), ("POST", "", "GET")],
)
async def test_a_wrong_method_is_405_naming_the_allowed_ones(
    memory_api: Api, chat: str, method: str, suffix: str, allowed: str
) -> None:
    """RFC 9110: a 405 carries `Allow`; the JSON error answer once dropped it."""
    status, answer, resp = await memory_api.call(method, f"/v1/admin/chats/{chat}{suffix}")
    assert status == 405 and "error" in answer
    assert allowed in resp.headers.get("Allow", "").split(","), dict(resp.headers)
    resp = await memory_api.client.get("/v1/bots/alpha/messages")
    assert resp.status == 405 and resp.headers.get("Allow") == "POST"


# -- status ------------------------------------------------------------------


async def test_status_of_an_unknown_chat_is_all_zeros(api: Api, chat: str) -> None:
    assert await api.status(chat) == {
        "bot": "alpha",
        "chat": f"http:{chat}",
        "soft": 0,
        "hard": 0,
        "turn": "ok",
        "soft_limit": 4,
        "hard_limit": 8,
        "paused": False,
        "overrides": {},
        "pair_cooldowns": {},
        "rate": {"used": 0, "max": 100, "window_seconds": 120.0},
    }


async def test_status_counts_ingress_traffic(api: Api, chat: str) -> None:
    assert (await api.peer(chat))["action"] == "reply"  # peer: 1, alpha's reply: 2
    got = await api.status(chat)
    assert (got["soft"], got["hard"], got["turn"], got["rate"]["used"]) == (2, 2, "ok", 1)
    assert (await api.peer(chat))["action"] == "reply"  # 3, 4
    got = await api.status(chat)
    assert (got["soft"], got["hard"], got["turn"], got["rate"]["used"]) == (4, 4, "soft_limit", 2)
    assert (await api.peer(chat))["reason"] == "turn_throttled"  # 5: no reply
    got = await api.status(chat)
    assert (got["soft"], got["hard"], got["turn"]) == (5, 5, "throttled")
    await api.human(chat)  # resets; alpha's answer to it is the first bot turn again
    got = await api.status(chat)
    assert (got["soft"], got["hard"], got["turn"], got["rate"]["used"]) == (1, 1, "ok", 3)


async def test_a_bare_chat_id_and_its_http_key_address_the_same_chat(api: Api, chat: str) -> None:
    await api.peer(chat)
    bare, keyed = await api.status(chat), await api.status(f"http:{chat}")
    assert bare == keyed
    assert (bare["chat"], bare["soft"]) == (f"http:{chat}", 2)
    await api.act(f"http:{chat}", "pause")
    assert (await api.status(chat))["paused"] is True
    assert (await api.human(chat))["reason"] == "paused"
    await api.act(chat, "resume")
    assert (await api.status(f"http:{chat}"))["paused"] is False


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ("room1", "http:room1"),
        ("http:room1", "http:room1"),
        ("discord:123", "discord:123"),
        ("telegram:-100:7", "telegram:-100:7"),
        ("http:", "http:http:"),  # no id after the platform: a bare id
        ("slack:C1:1700000000.000100", "slack:C1:1700000000.000100"),  # a Slack thread
        ("irc:x", "http:irc:x"),  # not a platform: a bare id with a colon
        (":x", "http::x"),
        ("a/b", "http:a/b"),
    ],
)
def test_chat_key(raw: str, key: str) -> None:
    assert chat_key(raw) == key


def test_an_empty_chat_key_is_a_bad_request() -> None:
    with pytest.raises(BadRequest, match="chat: must not be empty"):
        chat_key("")


async def test_a_chat_id_with_an_encoded_slash_is_one_chat(api: Api, chat: str) -> None:
    await api.ingress("alpha", chat=f"{chat}/x", author="peer", bot=True, text="hi")
    got = await api.status(f"{chat}%2Fx")
    assert (got["chat"], got["soft"]) == (f"http:{chat}/x", 2)


async def test_the_bot_query_selects_whose_limits_a_status_shows(api: Api, chat: str) -> None:
    assert (await api.status(chat))["bot"] == "alpha"  # the chat's platform's first bot
    got = await api.status(chat, "?bot=gamma")
    assert (got["bot"], got["soft_limit"], got["hard_limit"]) == ("gamma", 6, 12)
    status, body, _ = await api.call("GET", f"/v1/admin/chats/{chat}?bot=delta")
    assert status == 404
    assert body == {"error": "no bot named 'delta' (bots: alpha, beta, gamma)"}
    # the bot query works on every admin route, and an unknown bot acts on nothing
    status, body, _ = await api.call("POST", f"/v1/admin/chats/{chat}/pause?bot=delta")
    assert status == 404
    assert (await api.status(chat))["paused"] is False
    status, body, _ = await api.call("POST", f"/v1/admin/chats/{chat}/pause?bot=gamma")
    assert (status, body["bot"], body["paused"]) == (200, "gamma", True)


# -- pause, resume, reset, decisions -------------------------------------------


async def test_pause_drops_the_next_message_and_resume_answers_again(api: Api, chat: str) -> None:
    assert (await api.human(chat))["action"] == "reply"
    paused = await api.act(chat, "pause")
    assert (paused["paused"], paused["chat"]) == (True, f"http:{chat}")
    assert (await api.status(chat))["paused"] is True
    dropped = await api.human(chat)
    assert (dropped["action"], dropped["reason"]) == ("drop", "paused")
    assert "reply" not in dropped
    assert (await api.peer(chat))["reason"] == "paused"
    assert (await api.act(chat, "pause"))["paused"] is True  # idempotent
    resumed = await api.act(chat, "resume")
    assert resumed["paused"] is False
    answered = await api.human(chat)
    assert (answered["action"], answered["reason"], answered["reply"]) == ("reply", None, "hello")


async def test_pause_and_resume_touch_only_their_chat(api: Api, chat: str) -> None:
    await api.act(chat, "pause")
    assert (await api.human(f"{chat}-other"))["action"] == "reply"
    assert (await api.status(f"{chat}-other"))["paused"] is False


async def test_reset_zeroes_the_counters_and_bots_are_answered_again(api: Api, chat: str) -> None:
    actions = [(await api.peer(chat))["reason"] for _ in range(4)]
    assert actions == [None, None, "turn_throttled", "turn_throttled"]
    assert (await api.status(chat))["soft"] == 6
    done = await api.act(chat, "reset")
    assert (done["soft"], done["hard"], done["turn"]) == (0, 0, "ok")
    answered = await api.peer(chat)
    assert (answered["action"], answered["soft"], answered["turn"]) == ("reply", 1, "ok")
    assert (await api.status(chat))["soft"] == 2


async def test_decisions_are_newest_first_with_their_reasons(api: Api, chat: str) -> None:
    await api.human(chat, "m1")
    await api.act(chat, "pause")
    await api.human(chat, "m2")
    await api.act(chat, "resume")
    await api.peer(chat, "m3")
    await api.peer(chat, "m4")
    await api.peer(chat, "m5")
    got = [(d["id"], d["action"], d["reason"], d["bot"]) for d in await api.decisions(chat)]
    assert got == [
        ("m5", "drop", "turn_throttled", "alpha"),
        ("m4", "reply", None, "alpha"),
        ("m3", "reply", None, "alpha"),
        ("m2", "drop", "paused", "alpha"),
        ("m1", "reply", None, "alpha"),
    ]
    assert [d["id"] for d in await api.decisions(chat, 2)] == ["m5", "m4"]
    assert [d["id"] for d in await api.decisions(chat, 1)] == ["m5"]
    assert len(await api.decisions(chat, 50)) == 5
    assert await api.decisions(f"{chat}-never") == []


async def test_decisions_keep_the_newest_fifty(api: Api, chat: str) -> None:
    for i in range(60):
        await api.ingress("alpha", chat=chat, author="alice", text="", id=f"e{i}")
    got = [d["id"] for d in await api.decisions(chat)]
    assert got == [f"e{i}" for i in range(59, 9, -1)]


@pytest.mark.parametrize("limit", ["abc", "0", "51", "-1", "", "1.5", "ten"])
async def test_a_bad_decisions_limit_is_400_naming_limit(
    memory_api: Api, chat: str, limit: str
) -> None:
    status, body, _ = await memory_api.call(
        "GET", f"/v1/admin/chats/{chat}/decisions?limit={limit}"
    )
    assert status == 400
    assert body["error"].startswith("limit: ")


# -- limits --------------------------------------------------------------------


async def loop_until_warning(api: Api, chat: str) -> dict[str, Any]:
    """A person starts alpha and beta talking; each reply is shown to the other
    bot under its counted id, until one bot posts a warning (returned)."""
    body = await api.ingress("alpha", chat=chat, author="alice", text="go")
    speaker, other = "alpha", "beta"
    for _ in range(30):
        assert body["action"] in ("reply", "warn"), body
        if body["action"] == "warn":
            return body
        relay = {"chat": chat, "author": speaker, "bot": True, "text": body["reply"],
                 "id": body["reply_id"]}  # fmt: skip
        body = await api.ingress(other, **relay)
        speaker, other = other, speaker
    raise AssertionError("the bots looped 30 times without a warning")


async def test_the_configured_soft_limit_warns_at_4(api: Api, chat: str) -> None:
    warned = await loop_until_warning(api, chat)
    assert (warned["soft"], warned["reason"], warned["turn"]) == (
        4,
        "turn_soft_limit",
        "soft_limit",
    )
    assert "(4/4)" in warned["warning"]


async def test_a_soft_limit_override_makes_the_loop_warn_at_2(api: Api, chat: str) -> None:
    status, body = await api.put_limits(chat, {"soft_limit": 2})
    assert status == 200, body
    assert (body["done"], body["overrides"], body["soft_limit"]) == ("limits", {"soft_limit": 2}, 2)
    assert body["hard_limit"] == 8
    warned = await loop_until_warning(api, chat)
    assert (warned["soft"], warned["reason"]) == (2, "turn_soft_limit")
    assert "(2/2)" in warned["warning"]
    # the override is the chat's, not one bot's: both bots read it
    assert (await api.status(chat, "?bot=beta"))["soft_limit"] == 2


async def test_an_empty_object_clears_the_overrides(api: Api, chat: str) -> None:
    status, _ = await api.put_limits(chat, {"soft_limit": 2, "hard_limit": 3, "max_replies": 9})
    assert status == 200
    status, body = await api.put_limits(chat, {})
    assert status == 200
    assert (body["overrides"], body["soft_limit"], body["hard_limit"]) == ({}, 4, 8)
    assert body["rate"]["max"] == 100
    assert (await loop_until_warning(api, chat))["soft"] == 4


async def test_a_put_replaces_all_overrides(api: Api, chat: str) -> None:
    await api.put_limits(chat, {"soft_limit": 2, "hard_limit": 30})
    status, body = await api.put_limits(chat, {"hard_limit": 20, "soft_limit": None})
    assert status == 200, body
    assert (body["overrides"], body["soft_limit"], body["hard_limit"]) == (
        {"hard_limit": 20},
        4,
        20,
    )


async def test_a_hard_limit_override_stops_the_loop_there(api: Api, chat: str) -> None:
    status, _ = await api.put_limits(chat, {"soft_limit": 1, "hard_limit": 2})
    assert status == 200
    actions = [(await api.peer(chat))["reason"] for _ in range(3)]
    # peer 1 (soft limit, alpha has not spoken: no warning, no reply), peer 2 (hard
    # limit, alpha has not spoken), then stopped
    assert actions == ["turn_soft_limit", "turn_hard_limit", "turn_stopped"]
    assert (await api.status(chat))["turn"] == "stopped"


async def test_a_max_replies_override_caps_the_replies(api: Api, chat: str) -> None:
    status, body = await api.put_limits(chat, {"max_replies": 1})
    assert (status, body["rate"]["max"]) == (200, 1)
    assert (await api.human(chat))["action"] == "reply"
    capped = await api.human(chat)
    assert (capped["action"], capped["reason"]) == ("drop", "rate_capped")
    got = await api.status(chat)
    assert (got["rate"]["used"], got["rate"]["max"]) == (1, 1)


@pytest.mark.parametrize(
    ("seconds", "ms"), [(1.5, 1500), (90, 90_000), (0.25, 250), (0.0015, 2), (86400.5, 86_400_500)]
)
async def test_rate_window_seconds_may_be_a_float(
    api: Api, chat: str, seconds: float, ms: int
) -> None:
    status, body = await api.put_limits(chat, {"rate_window_seconds": seconds})
    assert status == 200, body
    assert body["overrides"] == {"rate_window_ms": ms}
    assert body["rate"]["window_seconds"] == ms / 1000
    assert (await api.human(chat))["action"] == "reply"


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (
            '{"bogus": 1}',
            "bogus: unknown limit (known: soft_limit, hard_limit, max_replies, "
            "rate_window_seconds)",
        ),
        ('{"soft_limit": 2, "zeta": 1, "alpha": 2}', "alpha: unknown limit"),
        ('{"rate_window_ms": 1000}', "rate_window_ms: unknown limit"),
        ('{"soft": 2}', "soft: unknown limit"),
        ('{"soft_limit": 0}', "soft_limit: must be a whole number from 1 to 1000000, not 0"),
        ('{"soft_limit": -3}', "soft_limit: must be a whole number from 1 to 1000000, not -3"),
        ('{"soft_limit": "3"}', "soft_limit: must be a whole number from 1 to 1000000, not '3'"),
        ('{"soft_limit": true}', "soft_limit: must be a whole number from 1 to 1000000, not True"),
        ('{"soft_limit": 2.5}', "soft_limit: must be a whole number from 1 to 1000000, not 2.5"),
        ('{"soft_limit": 2.0}', "soft_limit: must be a whole number from 1 to 1000000, not 2.0"),
        ('{"soft_limit": [2]}', "soft_limit: must be a whole number from 1 to 1000000"),
        ('{"hard_limit": {}}', "hard_limit: must be a whole number from 1 to 1000000"),
        ('{"max_replies": 0}', "max_replies: must be a whole number from 1 to 1000000"),
        ('{"rate_window_seconds": 0}', WINDOW_RANGE),
        ('{"rate_window_seconds": 0.0001}', WINDOW_RANGE),
        ('{"rate_window_seconds": -5}', WINDOW_RANGE),
        ('{"rate_window_seconds": "60"}', "rate_window_seconds: must be a number of seconds"),
        ('{"rate_window_seconds": false}', "rate_window_seconds: must be a number of seconds"),
        ('{"rate_window_seconds": NaN}', "rate_window_seconds: must be a number of seconds"),
        ('{"rate_window_seconds": Infinity}', "rate_window_seconds: must be a number of seconds"),
        ("[]", 'body: must be a JSON object such as {"soft_limit": 10}'),
        ('[{"soft_limit": 2}]', "body: must be a JSON object"),
        ("3", "body: must be a JSON object"),
        ('"x"', "body: must be a JSON object"),
        ("null", "body: must be a JSON object"),
        ("true", "body: must be a JSON object"),
        ("{nope", "invalid JSON body"),
        ('{"soft_limit": 2', "invalid JSON body"),
        ('{"soft_limit": 2} x', "invalid JSON body"),
        ("", "empty body: send a JSON object"),
        ("  \n ", "empty body: send a JSON object"),
    ],
)
async def test_bad_limits_are_400_and_change_nothing(
    api: Api, chat: str, data: str, needle: str
) -> None:
    status, _ = await api.put_limits(chat, {"hard_limit": 50})
    assert status == 200
    status, body, resp = await api.call("PUT", f"/v1/admin/chats/{chat}/limits", data=data)
    assert (status, resp.content_type) == (400, "application/json")
    assert needle in body["error"]
    assert (await api.status(chat))["overrides"] == {"hard_limit": 50}


async def test_invalid_utf8_in_a_limits_body_is_400(memory_api: Api, chat: str) -> None:
    status, body, _ = await memory_api.call(
        "PUT", f"/v1/admin/chats/{chat}/limits", data=b'{"soft_limit": "\xff"}'
    )
    assert status == 400
    assert "invalid JSON body" in body["error"]


async def test_a_limits_body_over_64_kib_is_413(memory_api: Api, chat: str) -> None:
    padded = json.dumps({"soft_limit": 2, "pad": "x" * (64 * 1024)})
    status, body, _ = await memory_api.call("PUT", f"/v1/admin/chats/{chat}/limits", data=padded)
    assert (status, body) == (413, {"error": "request body larger than 65536 bytes"})
    assert (await memory_api.status(chat))["overrides"] == {}
    # just under the limit is read (and refused for its unknown key, not its size)
    fits = json.dumps({"pad": "x" * (64 * 1024 - 20)})
    assert len(fits) <= 64 * 1024
    status, body, _ = await memory_api.call("PUT", f"/v1/admin/chats/{chat}/limits", data=fits)
    assert (status, body["error"][:4]) == (400, "pad:")


async def test_a_soft_limit_at_or_above_the_hard_one_is_taken(api: Api, chat: str) -> None:
    """soft >= hard is a valid choice (only a hard stop; the hard limit fires
    first), for every bot of the chat: the override is stored as given."""
    for data, soft, hard in (
        ('{"soft_limit": 10}', 10, 8),
        ('{"soft_limit": 12, "hard_limit": 12}', 12, 12),
    ):
        status, body, _ = await api.call("PUT", f"/v1/admin/chats/{chat}/limits", data=data)
        assert (status, body["soft_limit"], body["hard_limit"]) == (200, soft, hard)


# -- Admin.run: the chat-command path ------------------------------------------


async def test_run_status_pause_resume_reset(api: Api, chat: str) -> None:
    admin, key = api.admin_of(), f"http:{chat}"
    assert await admin.run(key, "status", "tester") == (
        f"Chat {key}: active, turn verdict ok\n"
        "Bot turns: 0/4 soft, 0/8 hard\n"
        "Replies: 0/100 in the last 120s\n"
        "Overrides: none"
    )
    assert (await admin.run(key, "pause", "tester")).startswith("Paused")
    assert (await api.human(chat))["reason"] == "paused"
    assert f"Chat {key}: PAUSED" in await admin.run(key, "  STATUS  ", "tester")
    assert (await admin.run(key, "Resume", "tester")).startswith("Resumed")
    assert (await api.human(chat))["action"] == "reply"
    for _ in range(3):
        await api.peer(chat)
    assert "Bot turns: 6/4 soft, 6/8 hard" in await admin.run(key, "status", "tester")
    assert (await admin.run(key, "reset", "tester")).startswith("Reset")
    assert "Bot turns: 0/4 soft, 0/8 hard" in await admin.run(key, "status", "tester")
    assert (await api.peer(chat))["action"] == "reply"


async def test_run_limits_sets_and_clears(api: Api, chat: str) -> None:
    admin, key = api.admin_of(), f"http:{chat}"
    shown = await admin.run(key, "limits soft=3 hard=9", "tester")
    assert "Bot turns: 0/3 soft, 0/9 hard" in shown
    assert shown.endswith("Overrides: soft=3 hard=9")
    assert (await api.status(chat))["overrides"] == {"soft_limit": 3, "hard_limit": 9}
    assert await admin.run(key, "limits", "tester") == shown  # no args: shows them
    shown = await admin.run(key, "limits rate=2 window=1.5", "tester")
    assert shown.endswith("Overrides: soft=3 hard=9 rate=2 window=1.5s")
    assert "Replies: 0/2 in the last 1.5s" in shown
    shown = await admin.run(key, "limits CLEAR", "tester")
    assert shown.endswith("Overrides: none")
    assert "Bot turns: 0/4 soft, 0/8 hard" in shown
    assert (await api.status(chat))["overrides"] == {}


async def test_run_limits_merges_with_the_existing_overrides(api: Api, chat: str) -> None:
    admin, key = api.admin_of(), f"http:{chat}"
    await admin.run(key, "limits hard=20", "tester")
    # soft 10 would be refused against the configured hard limit (8): the merge
    # checks it against the hard override that stays
    shown = await admin.run(key, "limits soft=10", "tester")
    assert shown.endswith("Overrides: soft=10 hard=20")
    shown = await admin.run(key, "limits soft=3", "tester")
    assert shown.endswith("Overrides: soft=3 hard=20")
    assert (await api.status(chat))["overrides"] == {"soft_limit": 3, "hard_limit": 20}
    # ...while the HTTP PUT replaces: the hard override goes
    status, body = await api.put_limits(chat, {"soft_limit": 3})
    assert (status, body["overrides"]) == (200, {"soft_limit": 3})


async def test_run_why_lists_the_newest_decisions(api: Api, chat: str) -> None:
    admin, key = api.admin_of(), f"http:{chat}"
    assert await admin.run(key, "why", "tester") == "No decisions recorded for this chat."
    await api.human(chat, "w1")
    await api.act(chat, "pause")
    await api.human(chat, "w2")
    await api.act(chat, "resume")
    await api.peer(chat, "w3")
    await api.peer(chat, "w4")
    lines = (await admin.run(key, "why 3", "tester")).splitlines()
    assert lines == [
        "alpha: reply (-) msg w4 from peer, turn ok 3/3",
        "alpha: reply (-) msg w3 from peer, turn ok 1/1",
        "alpha: drop (paused) msg w2 from alice, turn reset 0/0",
    ]
    assert len((await admin.run(key, "why", "tester")).splitlines()) == 4


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("limits soft=x", "soft: 'x' is not a number"),
        ("limits soft=", "soft: '' is not a number"),
        ("limits hard=2.5", "hard: '2.5' is not a number"),
        ("limits window=soon", "window: 'soon' is not a number"),
        ("limits bogus=1", "bogus=1: expected soft=N, hard=N, rate=N or window=SECONDS"),
        ("limits soft 3", "soft: expected soft=N"),
        ("limits clear soft=3", "clear: expected soft=N"),
        ("limits soft=0", "soft_limit: must be a whole number from 1 to 1000000, not 0"),
        ("limits rate=-1", "max_replies: must be a whole number from 1 to 1000000, not -1"),
        ("limits window=0", WINDOW_RANGE),
        ("limits window=nan", "rate_window_seconds: must be a number of seconds"),
        ("limits window=inf", "rate_window_seconds: must be a number of seconds"),
        ("frobnicate", "unknown command 'frobnicate'; commands: status | reset | pause"),
        ("frobnicate now", "unknown command 'frobnicate now'"),
        ("", "unknown command ''"),
        ("   ", "unknown command ''"),
        ("/status", "unknown command '/status'"),
        ("why abc", "why: 'abc' is not a number of decisions"),
        ("why 0", "limit: must be between 1 and 50, not 0"),
        ("why 51", "limit: must be between 1 and 50, not 51"),
        ("why -2", "limit: must be between 1 and 50, not -2"),
    ],
)
async def test_run_errors_say_what_to_change_and_change_nothing(
    api: Api, chat: str, text: str, needle: str
) -> None:
    admin, key = api.admin_of(), f"http:{chat}"
    await admin.run(key, "limits hard=7", "tester")
    with pytest.raises(AdminError) as caught:
        await admin.run(key, text, "tester")
    assert needle in str(caught.value)
    state = await admin.status(key)
    assert (state.overrides, state.paused) == (Overrides(hard_limit=7), False)


# -- the parsing helpers ---------------------------------------------------------


def test_parse_limit_args_reads_short_and_long_names() -> None:
    assert parse_limit_args(["soft=10", "HARD=50", "rate=4", "window=60"]) == {
        "soft_limit": 10,
        "hard_limit": 50,
        "max_replies": 4,
        "rate_window_seconds": 60.0,
    }
    got = parse_limit_args(["soft_limit=2", "max_replies=3", "rate_window_seconds=0.5"])
    assert got == {"soft_limit": 2, "max_replies": 3, "rate_window_seconds": 0.5}
    assert parse_limit_args([]) == {}


def test_overrides_from_skips_nulls_and_converts_the_window() -> None:
    got = overrides_from({"soft_limit": 3, "hard_limit": None, "rate_window_seconds": 2.5})
    assert got == Overrides(soft_limit=3, rate_window_ms=2500)
    assert overrides_from({}) == Overrides()


def test_render_why_shows_missing_fields_as_none() -> None:
    assert render_why([{"bot": "a", "action": "drop"}]) == (
        "a: drop (-) msg None from None, turn None None/None"
    )


# -- regressions: inputs that once gave a 500 -------------------------------------


@pytest.mark.parametrize("seconds", ["1e308", "1" + "0" * 400])
async def test_a_huge_rate_window_is_refused_not_a_500(
    memory_api: Api, chat: str, seconds: str
) -> None:
    status, _, _ = await memory_api.call(
        "PUT", f"/v1/admin/chats/{chat}/limits", data=f'{{"rate_window_seconds": {seconds}}}'
    )
    assert status in (200, 400)
    status, _, _ = await memory_api.call("GET", f"/v1/admin/chats/{chat}")
    assert status == 200


async def test_run_limits_with_a_huge_window_is_an_admin_error(memory_api: Api, chat: str) -> None:
    with pytest.raises(AdminError):
        await memory_api.admin_of().run(f"http:{chat}", "limits window=1e308", "tester")


async def test_a_long_rate_window_on_redis_keeps_the_chat_working(
    redis_url: str, key_prefix: str, chat: str
) -> None:
    """Windows past 30 days are refused: Redis Lua prints 1e14 ms as 1e+14,
    which PEXPIRE rejects, so such a window once made every message a 503."""
    async with running(f"store: {{url: '{redis_url}'}}\n" + WITH_TOKEN, key_prefix) as api:
        status, body = await api.put_limits(chat, {"rate_window_seconds": 1e14})
        assert status == 400 and "rate_window_seconds" in body["error"]
        status, _ = await api.put_limits(chat, {"rate_window_seconds": 30 * 86400})
        assert status == 200  # the longest window allowed works end to end
        resp = await api.client.post(
            "/v1/bots/alpha/messages",
            json={"chat": chat, "author": "alice", "text": "hi @alpha", "mentions": ["alpha"]},
        )
        assert resp.status == 200 and (await resp.json())["action"] == "reply"
