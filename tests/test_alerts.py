"""Alerts (gateway/alerts.py) from real daemons on one Redis to local HTTP
receivers: once per threshold across replicas, off the decision path,
retried, bounded, in each target's shape."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import pytest
import yaml

import gateway.alerts
from gateway.config import ConfigError, parse_config
from gateway.daemon import Daemon
from tests.daemons import forget, pingpong, redis_of
from tests.fakes.forward_proxy import ForwardProxy
from tests.fakes.webhook import FakeWebhook, hang, reply_json
from tests.redis_server import free_port

LOOPING = {"bot_messages": "all", "respond_to": "all", "turns": {"soft_limit": 6},
           "rate_cap": {"max_replies": 100}}  # fmt: skip


def bot(name: str, **policy: Any) -> dict[str, Any]:
    return {"name": name, "platform": "http", "backend": {"type": "echo"}, **LOOPING, **policy}


@asynccontextmanager
async def replicas(
    n: int, redis_url: str, prefix: str, alerts: list[dict[str, Any]], *bots: dict[str, Any]
) -> AsyncIterator[list[Daemon]]:
    """`n` daemons with the same config (the same bots) on one Redis prefix."""
    async with AsyncExitStack() as stack:
        daemons = []
        for _ in range(n):
            config = {"store": {"url": redis_url},
                      "http": {"listen": f"127.0.0.1:{free_port()}"},
                      "alerts": alerts, "bots": list(bots)}  # fmt: skip
            d = Daemon(parse_config(yaml.safe_dump(config)))
            redis_of(d).prefix = prefix
            await d.start()
            stack.push_async_callback(d.stop)
            daemons.append(d)
        try:
            yield daemons
        finally:
            await stack.aclose()
            await forget(redis_url, prefix)


async def settle(d: Daemon) -> None:
    """Until every queued alert has been handled (sent, failed or a duplicate)."""
    assert d.alerts is not None
    for q in d.alerts._queues:
        await asyncio.wait_for(q.join(), 10)


def counted(d: Daemon) -> dict[tuple[str, ...], float]:
    out = {}
    for family in d.metrics.alerts.collect():
        for s in family.samples:
            if s.name.endswith("_total") and s.value:
                out[tuple(s.labels.values())] = s.value
    return out


def poster(http: aiohttp.ClientSession, daemons: list[Daemon], latencies: list[float]) -> Any:
    turn = iter(range(10**6))

    async def post(name: str, body: dict[str, Any]) -> dict[str, Any]:
        d = daemons[next(turn) % len(daemons)]  # each message to the next replica
        start = time.monotonic()
        async with http.post(f"http://{d.config.http.listen}/v1/bots/{name}/messages",
                             json=body) as resp:  # fmt: skip
            payload: dict[str, Any] = await resp.json()
        latencies.append(time.monotonic() - start)
        assert resp.status == 200, payload
        return payload

    return post


async def test_a_loop_across_three_replicas_is_one_alert(redis_url: str, key_prefix: str) -> None:
    async with FakeWebhook() as hook, aiohttp.ClientSession() as http:
        hook.default = reply_json({})
        alerts = [{"type": "webhook", "url": hook.url, "headers": {"X-Token": "t0k3n-secret"}}]
        async with replicas(3, redis_url, key_prefix, alerts, bot("alpha"), bot("beta")) as ds:
            relay = await pingpong(poster(http, ds, []), "room-1", "alpha", "beta")
            for d in ds:
                await settle(d)
    assert len(relay.warnings) == 1
    assert [r["event"] for r in hook.requests] == ["limit_reached"]
    alert = hook.requests[0]
    assert (alert["subject"], alert["reason"], alert["limit"]) == (
        "http:room-1",
        "turn_soft_limit",
        6,
    )
    assert "No bot answers a bot there until a person writes." in alert["text"]
    assert "POST /v1/admin/chats/http:room-1/reset" in alert["text"]
    assert "/bouncer" not in alert["text"]  # an http chat has no chat commands
    assert hook.headers[0]["X-Token"] == "t0k3n-secret"


async def test_a_pair_cooldown_seen_by_every_replica_is_one_alert(
    redis_url: str, key_prefix: str
) -> None:
    pairs = {
        "pairs": {"max_events": 4, "window_seconds": 60, "cooldown_seconds": 60},
        "turns": {"soft_limit": 50},
    }
    async with FakeWebhook() as hook, aiohttp.ClientSession() as http:
        hook.default = reply_json({})
        alerts = [{"type": "webhook", "url": hook.url}]
        bots = (bot("alpha", **pairs), bot("beta", **pairs))
        async with replicas(3, redis_url, key_prefix, alerts, *bots) as ds:
            post = poster(http, ds, [])
            relay = await pingpong(post, "room-2", "alpha", "beta")
            assert relay.last["reason"] == "pair_cooldown"
            for i in range(6):  # the bots keep trying, through every replica
                late = await post("alpha", {"chat": "room-2", "author": "beta", "bot": True,
                                            "text": "again", "id": f"late-{i}"})  # fmt: skip
                assert late["reason"] == "pair_cooldown"
            for d in ds:
                await settle(d)
            duplicates = sum(n for d in ds for k, n in counted(d).items() if k[2] == "duplicate")
    assert [r["event"] for r in hook.requests] == ["pair_cooldown"]
    assert duplicates >= 2  # the other replicas found it claimed


async def test_guard_blocks_and_budgets_alert_once_per_session_and_reason(
    redis_url: str, key_prefix: str
) -> None:
    async with FakeWebhook() as hook, aiohttp.ClientSession() as http:
        hook.default = reply_json({})
        alerts = [{"type": "webhook", "url": hook.url}]
        async with replicas(3, redis_url, key_prefix, alerts, bot("alpha")) as ds:
            for i in range(8):  # the same search through each replica in turn
                url = f"http://{ds[i % 3].config.http.listen}/v1/guard/run-7/step"
                async with http.post(url, json={"tool": "search", "args": {"q": "x"}}):
                    pass
            url = f"http://{ds[0].config.http.listen}/v1/guard/run-8/usage"
            for _ in range(3):
                async with http.post(url, json={"tokens": 500, "budget_tokens": 1000}):
                    pass
            for d in ds:
                await settle(d)
    events = sorted((r["event"], r["subject"], r["reason"]) for r in hook.requests)
    assert events == [
        ("budget_exhausted", "run-8", "budget_exhausted"),
        ("guard_block", "run-7", "identical_call"),
    ]


async def test_a_hanging_target_delays_no_decision_and_its_queue_stays_bounded(
    redis_url: str, key_prefix: str
) -> None:
    async with FakeWebhook() as hook, aiohttp.ClientSession() as http:
        hook.default = hang()
        alerts = [{"type": "webhook", "url": hook.url, "timeout_seconds": 3, "retries": 0,
                   "queue": 3}]  # fmt: skip
        async with replicas(1, redis_url, key_prefix, alerts, bot("alpha"), bot("beta")) as ds:
            latencies: list[float] = []
            relay = await pingpong(poster(http, ds, latencies), "room-3", "alpha", "beta")
            # Had the warning's alert been sent inline, its decision would have
            # waited the target's 3 s.
            assert len(relay.warnings) == 1 and max(latencies) < 1.5
            # A flood: 50 sessions blocked twice each (one alert each: the second is
            # seen as queued already), at a target that hangs.
            for i in range(50):
                for _ in range(4):
                    await ds[0].guard.step(f"flood-{i}", {"tool": "t", "args": {}})
            dropped = sum(n for k, n in counted(ds[0]).items() if k[2] == "dropped")
            queued = ds[0].alerts._queues[0].qsize()  # type: ignore[union-attr]
    # One alert held by the sender (the limit warning), three queued, the rest dropped.
    assert queued == 3
    assert dropped == 50 - 3
    assert hook.peak == 1


async def test_a_failing_target_is_retried_with_backoff(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    monkeypatch.setattr(gateway.alerts, "BACKOFF", 0.05)
    secret_url_part = "T0KEN-in-the-url"
    async with FakeWebhook() as hook, FakeWebhook() as dead:
        hook.then(reply_json({}, 500), reply_json({}, 503)).default = reply_json({})
        dead.default = reply_json({}, 500)
        alerts = [
            {"type": "slack", "url": hook.url + "?k=" + secret_url_part, "events": ["guard_block"]},
            {"type": "discord", "url": dead.url, "events": ["guard_block"], "retries": 2},
        ]
        async with replicas(1, redis_url, key_prefix, alerts, bot("alpha")) as ds:
            for _ in range(4):
                await ds[0].guard.step("run-9", {"tool": "t", "args": {}})
            await settle(ds[0])
            outcomes = counted(ds[0])
    assert len(hook.requests) == 3  # two failures, then delivered
    assert hook.requests[-1] == {"text": hook.requests[-1]["text"], "mrkdwn": False}
    assert "agent session run-9 blocked (identical_call)" in hook.requests[-1]["text"]
    assert len(dead.requests) == 3  # the first try and two retries
    assert set(dead.requests[0]) == {"content", "allowed_mentions"}
    assert outcomes == {("0:slack", "guard_block", "sent"): 1,
                        ("1:discord", "guard_block", "failed"): 1}  # fmt: skip
    assert "not delivered to target 1 (discord): HTTP 500" in caplog.text
    assert secret_url_part not in caplog.text and dead.url not in caplog.text


@pytest.mark.parametrize(
    ("bot_config", "command"),
    [
        ({"platform": "discord", "token": "x", "backend": {"type": "echo"}}, "`/bouncer reset`"),
        ({"platform": "telegram", "token": "1:x", "backend": {"type": "echo"}},
         "`/bouncer_reset`"),
        ({"platform": "http", "backend": {"type": "echo"}}, None),
        ({"platform": "discord", "mode": "decide"}, None),  # its own code reads the chat
    ],
)  # fmt: skip
def test_a_chat_alert_says_how_to_reset_with_what_the_chat_has(
    bot_config: dict[str, Any], command: str | None
) -> None:
    # Breaks if an alert tells the admin of an http chat, or of a bot in
    # decide mode, to type a chat command that nothing there answers; or says
    # a person's message ends a pair cooldown (it zeroes the turn counters only).
    from gateway.model import Action, Decision, Reason, Turn

    config = parse_config(yaml.safe_dump({"bots": [{"name": "b1", **bot_config}]}), env={})
    bot_cfg = config.bots[0]
    chat = f"{bot_cfg.platform}:c1"
    api = f"the admin API's reset (POST /v1/admin/chats/{chat}/reset)"

    def text(reason: Reason, action: Action) -> str:
        d = Decision("b1", "m1", chat, "b2", action, reason, Turn.SOFT_LIMIT, 20, 20)
        alert = gateway.alerts._chat_alert(d, bot_cfg)
        assert alert is not None
        return alert.text

    limit = text(Reason.TURN_SOFT_LIMIT, Action.WARN)
    cooldown = text(Reason.PAIR_COOLDOWN, Action.DROP)
    assert "No bot answers a bot there until a person writes." in limit
    if command is None:
        assert limit.endswith(f"To let them go on: a person's message or {api}.")
        assert cooldown.endswith(f"To end it now: {api}.")
    else:
        assert limit.endswith(f"To let them go on: a person's message, {command} in the chat, "
                              f"or {api}.")  # fmt: skip
        assert cooldown.endswith(f"To end it now: {command} in the chat or {api}.")


def test_a_slack_alert_pings_no_one_whatever_the_chat_is_named() -> None:
    # Breaks if the text goes to Slack unescaped: a chat (or agent session)
    # named `<!channel>` through the HTTP ingress pinged the whole ops channel.
    text = "the chat http:<!channel> & <@U0OPS> reached its limit"
    alert = gateway.alerts.Alert("limit_reached", "http:<!channel>", "turn_soft_limit", text)
    body = gateway.alerts.render("slack", alert)
    assert body["text"] == ("the chat http:&lt;!channel&gt; &amp; &lt;@U0OPS&gt; reached its limit")
    assert "<" not in body["text"] and body["mrkdwn"] is False


async def test_the_store_lost_and_back_is_said_by_the_replica(
    redis_url: str, key_prefix: str
) -> None:
    async with FakeWebhook() as hook:
        hook.default = reply_json({})
        alerts = [{"type": "webhook", "url": hook.url, "events": ["store_degraded",
                                                                   "store_recovered"]}]  # fmt: skip
        async with replicas(1, redis_url, key_prefix, alerts, bot("alpha")) as ds:
            store = ds[0].store
            store.on_change(True)  # type: ignore[attr-defined]  # as the failover store calls it
            store.on_change(False)  # type: ignore[attr-defined]
            await settle(ds[0])
            degraded = ds[0].metrics.store_degraded._value.get()
    assert [r["event"] for r in hook.requests] == ["store_degraded", "store_recovered"]
    assert degraded == 0


@pytest.mark.parametrize(
    ("target", "problem"),
    [
        ({"type": "pager", "url": "http://x"}, "alerts[0].type: must be one of: webhook, slack"),
        ({"type": "slack", "url": "hooks.slack.com/x"}, "alerts[0].url: must be an http://"),
        ({"type": "slack", "url": "http://x", "headers": {"A": "b"}},
         "alerts[0]: headers are for type: webhook only"),
        ({"type": "webhook", "url": "http://x", "events": ["loop"]}, "alerts[0].events[0]: "),
        ({"type": "webhook", "url": "http://x", "events": []}, "alerts[0].events: must name"),
    ],
)  # fmt: skip
def test_alert_config_errors_name_the_key(target: dict[str, Any], problem: str) -> None:
    text = yaml.safe_dump({"alerts": [target], "bots": [bot("alpha")]})
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={})
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems


def test_alert_urls_are_masked_in_the_config() -> None:
    text = yaml.safe_dump({"alerts": [{"type": "slack", "url": "https://hooks.slack.com/T/B/x"}],
                           "bots": [bot("alpha")]})  # fmt: skip
    assert "hooks.slack.com" not in repr(parse_config(text, env={}))


async def test_alerts_go_through_the_proxy_the_environment_names(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Breaks if the alert client ignores HTTP(S)_PROXY: on a host whose only
    # way out is a proxy, every alert failed to be sent.
    async with FakeWebhook() as hook, ForwardProxy() as proxy, aiohttp.ClientSession() as http:
        hook.default = reply_json({})
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        alerts = [{"type": "webhook", "url": hook.url}]
        async with replicas(1, redis_url, key_prefix, alerts, bot("alpha"), bot("beta")) as ds:
            await pingpong(poster(http, ds, []), "room-1", "alpha", "beta")
            await settle(ds[0])
    assert [r["event"] for r in hook.requests] == ["limit_reached"]
    assert proxy.seen == [hook.url]


async def test_a_daemon_that_cannot_listen_leaves_no_alert_sender_behind() -> None:
    """`botbouncer run` on a port in use is a startup error (exit 2): the
    alert senders must not have been started, or left running (their client
    printed "Unclosed client session" as the command exited)."""
    import socket

    from gateway.errors import StartupError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        alerts = [{"type": "webhook", "url": "http://127.0.0.1:9/"}]
        listen = {"listen": f"127.0.0.1:{port}"}
        text = yaml.safe_dump({"http": listen, "bots": [bot("alpha")], "alerts": alerts})
        d = Daemon(parse_config(text, env={}))
        with pytest.raises(StartupError, match="cannot listen on"):
            await d.start()
    assert d.alerts is not None
    assert d.alerts._client is None or d.alerts._client.closed
    assert all(t.done() for t in d.alerts._tasks)
