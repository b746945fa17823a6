"""The decide API (POST /v1/bots/<bot>/decide, /sent, /release): a bot that
keeps its own token asks, then reports what it sent or that it sent nothing.
On the memory store in process, and with three daemons ("sidecars") on one
Redis."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from gateway.config import ConfigError, parse_config
from tests.daemons import running, served

CONFIG = """
bots:
  - name: side
    platform: discord
    mode: decide
    user_id: "900"
    rate_cap: {max_replies: 2}
    turns: {soft_limit: 3, hard_limit: 5}
    bot_messages: all
  - name: fronted
    platform: http
    backend: {type: echo}
"""


def person(i: int | str, **extra: Any) -> dict[str, Any]:
    return {"chat": "c1", "author": "7", "id": f"m{i}", "text": "hi <@900>",
            "mentions": ["900"], **extra}  # fmt: skip


Client = TestClient[Any, Any]


async def post(client: Client, path: str, body: Any) -> tuple[int, dict[str, Any]]:
    resp = await client.post(path, data=json.dumps(body))
    return resp.status, await resp.json()


async def test_reply_ticket_sent_and_its_echo() -> None:
    async with served(CONFIG) as client:
        status, d = await post(client, "/v1/bots/side/decide", person(1))
        assert status == 200
        assert (d["action"], d["reason"], d["chat"]) == ("reply", None, "c1")
        assert isinstance(d["ticket"], str)
        sent = {"ticket": d["ticket"], "ids": ["r1"], "texts": ["hello"]}
        status, out = await post(client, "/v1/bots/side/sent", sent)
        assert status == 200
        assert out == {"counted": [{"id": "r1", "turn": "ok", "soft": 1, "hard": 1}]}
        # the platform shows the reply back: its own message, not a second turn
        own = {"chat": "c1", "author": "900", "bot": True, "id": "r1"}
        status, echo = await post(client, "/v1/bots/side/decide", own)
        assert (echo["action"], echo["reason"], echo["hard"]) == ("drop", "own_message", 1)
        assert "ticket" not in echo
        # a longer answer: more pieces on the same ticket, each counted once
        status, out = await post(client, "/v1/bots/side/sent",
                                 {"ticket": d["ticket"], "ids": ["r2", "r1"]})  # fmt: skip
        assert [c["hard"] for c in out["counted"]] == [2, 1]
        status, err = await post(client, "/v1/bots/side/release", {"ticket": d["ticket"]})
        assert status == 409
        assert "sent already: its slot stays spent" in err["error"]


async def test_released_tickets_give_their_slots_back() -> None:
    async with served(CONFIG) as client:
        tickets = []
        for i in range(3):
            _, d = await post(client, "/v1/bots/side/decide", person(i))
            tickets.append(d.get("ticket"))
        assert tickets[2] is None  # rate cap 2
        status, out = await post(client, "/v1/bots/side/release", {"ticket": tickets[0]})
        assert (status, out) == (200, {"released": True, "id": "m0", "reason": "backend_empty"})
        _, d = await post(client, "/v1/bots/side/decide", person(3))
        assert d["action"] == "reply"
        status, err = await post(client, "/v1/bots/side/sent",
                                 {"ticket": tickets[0], "ids": ["x"]})  # fmt: skip
        assert status == 409
        assert "was released" in err["error"]
        status, err = await post(client, "/v1/bots/side/release", {"ticket": tickets[0]})
        assert (status, err["error"]) == (409, f"ticket {tickets[0]!r} was released already")


async def test_a_warning_ticket_counts_the_warning() -> None:
    async with served(CONFIG) as client:
        _, human = await post(client, "/v1/bots/side/decide", person("h"))
        await post(client, "/v1/bots/side/release", {"ticket": human["ticket"]})
        actions = []
        for i in range(2):  # another bot and this one answer each other: b0 r0 b1
            _, d = await post(client, "/v1/bots/side/decide",
                              {"chat": "c1", "author": "55", "bot": True, "id": f"b{i}",
                               "text": "<@900>", "mentions": ["900"]})  # fmt: skip
            actions.append(d["action"])
            if d["action"] == "reply":
                await post(client, "/v1/bots/side/sent", {"ticket": d["ticket"], "ids": [f"r{i}"]})
        assert actions == ["reply", "warn"]
        assert (d["reason"], d["soft"]) == ("turn_soft_limit", 3)
        assert d["warning"] and d["ticket"]
        warning = {"ticket": d["ticket"], "ids": ["w1"]}
        status, out = await post(client, "/v1/bots/side/sent", warning)
        assert (status, out["counted"][0]["soft"]) == (200, 4)  # the warning is a turn too


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/v1/bots/side/decide", {"author": "7"}, 400, "chat: is required"),
        ("/v1/bots/side/decide", [1], 400, "must be a JSON object"),
        ("/v1/bots/side/sent", {"ticket": "t"}, 400, "ids: must be a non-empty list"),
        ("/v1/bots/side/sent", {"ticket": "t", "ids": [1]}, 400, "ids[0]: must be a message id"),
        (
            "/v1/bots/side/sent",
            {"ticket": "t", "ids": ["a"], "texts": []},
            400,
            "texts: must be a list as long as ids",
        ),
        ("/v1/bots/side/sent", {"ids": ["a"]}, 400, "ticket: must be the ticket string"),
        ("/v1/bots/side/sent", {"ticket": "t", "ids": ["a"], "x": 1}, 400, "x: unknown field"),
        ("/v1/bots/side/release", {"ticket": 5}, 400, "ticket: must be the ticket string"),
        ("/v1/bots/side/release", {"ticket": "nope"}, 404, "no ticket 'nope' for bot 'side'"),
        ("/v1/bots/side/sent", {"ticket": "nope", "ids": ["a"]}, 404, "never issued, or it lapsed"),
        ("/v1/bots/fronted/decide", person(1), 404, "no bot named 'fronted' in mode: decide"),
        ("/v1/bots/ghost/release", {"ticket": "t"}, 404, "(decide bots: side)"),
    ],
)
async def test_bad_calls_are_named(path: str, body: Any, status: int, message: str) -> None:
    async with served(CONFIG) as client:
        got, out = await post(client, path, body)
        assert got == status
        assert message in out["error"]


async def test_a_decide_bot_is_not_an_ingress_bot() -> None:
    async with served(CONFIG) as client:
        got, out = await post(client, "/v1/bots/side/messages", person(1))
        assert got == 404
        got, out = await post(client, "/v1/bots/fronted/messages", person(1))
        assert (got, out["action"]) == (200, "drop")  # not addressed to it


@pytest.mark.parametrize(
    ("bot", "message"),
    [
        ({"mode": "decide", "token": "x", "platform": "discord"}, "a decide bot keeps its token"),
        ({"mode": "decide", "backend": {"type": "echo"}}, "a decide bot has no backend"),
        ({"platform": "http"}, "backend: is required (or mode: decide"),
        ({"backend": {"type": "echo"}, "user_id": "5"}, "user_id: is a setting of mode: decide"),
        ({"backend": {"type": "echo"}, "ticket_seconds": 5}, "ticket_seconds: is a setting of"),
        ({"mode": "decide", "api_base": "http://x"}, "api_base: a decide bot keeps its own"),
        ({"mode": "decide", "ticket_seconds": 0}, "ticket_seconds"),
        ({"mode": "sidecar"}, "mode"),
    ],
)
def test_decide_settings_are_checked(bot: dict[str, Any], message: str) -> None:
    body = {"name": "b", "platform": "http", **bot}
    with pytest.raises(ConfigError, match=None) as err:
        parse_config(json.dumps({"bots": [body]}))
    assert message in str(err.value)


def test_a_decide_bot_needs_no_token_even_on_discord() -> None:
    config = parse_config(json.dumps({"bots": [{"name": "b", "platform": "discord",
                                                 "mode": "decide"}]}))  # fmt: skip
    bot = config.bots[0]
    assert (bot.mode, bot.token, bot.backend, bot.ticket_seconds) == ("decide", None, None, 120)


# -- three sidecars on one Redis ----------------------------------------------

SIDE = {"name": "side", "platform": "discord", "mode": "decide", "user_id": "900",
        "rate_cap": {"max_replies": 6}, "ticket_seconds": 1.0}  # fmt: skip


async def test_three_sidecars_on_one_redis_share_one_cap(redis_url: str, key_prefix: str) -> None:
    """50 concurrent addressed messages through three daemons, cap 6: exactly
    6 tickets; released ones give their slots back; one never reported
    lapses with its slot spent; a repeated id is a duplicate."""
    async with (
        running(redis_url, key_prefix, SIDE) as a,
        running(redis_url, key_prefix, SIDE) as b,
        running(redis_url, key_prefix, SIDE) as c,
        aiohttp.ClientSession() as http,
    ):
        urls = [f"http://{d.config.http.listen}/v1/bots/side" for d in (a, b, c)]

        async def call(i: int, what: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
            async with http.post(f"{urls[i % 3]}/{what}", json=body) as resp:
                return resp.status, await resp.json()

        answers = await asyncio.gather(*(call(i, "decide", person(i)) for i in range(50)))
        assert all(status == 200 for status, _ in answers)
        tickets = [(i, d["ticket"]) for i, (_, d) in enumerate(answers) if "ticket" in d]
        assert len(tickets) == 6
        assert {d["reason"] for _, d in answers if "ticket" not in d} == {"rate_capped"}
        # two are released (through another daemon than the one that issued them)
        for i, t in tickets[:2]:
            assert (await call(i + 1, "release", {"ticket": t}))[0] == 200
        again = await asyncio.gather(*(call(i, "decide", person(100 + i)) for i in range(10)))
        assert sum("ticket" in d for _, d in again) == 2
        # three are sent; one never reported: it lapses, and its slot stays spent
        for i, t in tickets[2:5]:
            assert (await call(i, "sent", {"ticket": t, "ids": [f"r{i}"]}))[0] == 200
        lapsing = tickets[5][1]
        await asyncio.sleep(1.2)  # ticket_seconds 1.0: a lapse cannot be awaited
        status, err = await call(0, "sent", {"ticket": lapsing, "ids": ["late"]})
        assert status == 404 and "lapsed" in err["error"]
        _, capped = await call(1, "decide", person("after"))
        assert capped["reason"] == "rate_capped"
        # the same message id through another sidecar: a duplicate
        _, dup = await call(2, "decide", person(0))
        assert (dup["action"], dup["reason"]) == ("drop", "duplicate")
