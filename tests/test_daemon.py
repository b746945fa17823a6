"""`botbouncer run` and the HTTP ingress (README.md, docs/http-api.md)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from gateway.cli import main
from gateway.config import Config, parse_config
from gateway.daemon import Daemon, StartupError, find_adapter
from tests.daemons import served
from tests.redis_server import free_port

ROOT = Path(__file__).resolve().parents[1]
TWO_BOTS = """
bots:
  - {name: alpha, platform: http, backend: {type: echo}, bot_messages: mentions}
  - {name: beta, platform: http, backend: {type: echo}, bot_messages: mentions}
defaults:
  turns: {soft_limit: 4, hard_limit: 8}
"""


@pytest.fixture
async def client() -> AsyncIterator[TestClient[aiohttp.web.Request, aiohttp.web.Application]]:
    async with served(TWO_BOTS) as c:
        yield c


async def post(c: TestClient, bot: str, body: object) -> tuple[int, dict]:  # type: ignore[type-arg]
    resp = await c.post(f"/v1/bots/{bot}/messages", data=json.dumps(body))
    return resp.status, await resp.json()


async def test_healthz(client: TestClient) -> None:  # type: ignore[type-arg]
    resp = await client.get("/healthz")
    assert (resp.status, await resp.json()) == (200, {"status": "ok", "store": "memory"})


async def test_an_answered_message_carries_the_reply_and_its_counted_id(
    client: TestClient,  # type: ignore[type-arg]
) -> None:
    status, body = await post(client, "alpha", {"chat": "r", "author": "al", "text": "hi",
                                                "mentions": ["alpha"], "id": "h1"})  # fmt: skip
    assert status == 200
    reply_id = body.pop("reply_id")
    assert body == {"id": "h1", "chat": "r", "author": "al", "turn": "reset", "soft": 0,
                    "hard": 0, "action": "reply", "reason": None, "warning": None,
                    "reply": "hi"}  # fmt: skip
    # the client shows alpha's reply to beta under reply_id: it was counted already
    status, seen = await post(client, "beta", {"chat": "r", "author": "alpha", "bot": True,
                                               "text": "hi", "id": reply_id})  # fmt: skip
    assert (seen["soft"], seen["reason"]) == (1, "bot_ignored")


async def test_two_http_bots_loop_until_the_soft_limit_and_one_warns(
    client: TestClient,  # type: ignore[type-arg]
) -> None:
    msg = {"chat": "loop", "author": "al", "text": "go", "mentions": ["alpha"]}
    speaker, other = "alpha", "beta"
    _, body = await post(client, speaker, msg)
    posted = [body["reply"]]
    warnings = []
    for _ in range(10):
        relay = {"chat": "loop", "author": speaker, "bot": True, "text": posted[-1],
                 "mentions": [other], "id": body.get("reply_id") or body["warning_id"]}  # fmt: skip
        _, body = await post(client, other, relay)
        if body["action"] == "warn":
            warnings.append(body["warning"])
        if body["action"] not in ("reply", "warn"):
            break
        posted.append(body.get("reply") or body["warning"])
        speaker, other = other, speaker
    assert warnings == ["⚠️ Bot turn limit reached (4/4). A human must reply here to continue "
                        "the bot-to-bot conversation."]  # fmt: skip
    assert (body["action"], body["reason"]) == ("drop", "turn_throttled")


@pytest.mark.parametrize(
    ("path", "data", "status", "needle"),
    [
        ("/v1/bots/alpha/messages", "{nope", 400, "invalid JSON"),
        ("/v1/bots/alpha/messages", "[1]", 400, "must be a JSON object"),
        ("/v1/bots/alpha/messages", '{"chat": "r"}', 400, "author: is required"),
        ("/v1/bots/alpha/messages", '{"chat": "r", "author": "a", "x": 1}', 400, "x: unknown"),
        ("/v1/bots/gamma/messages", "{}", 404, "no http bot named 'gamma'"),
        ("/v1/bots/alpha/messages", "x" * 70_000, 413, "larger than 65536"),
        ("/nowhere", "{}", 404, "Not Found"),
    ],
)
async def test_bad_requests_get_a_json_error_never_a_500(
    client: TestClient,  # type: ignore[type-arg]
    path: str, data: str, status: int, needle: str,
) -> None:  # fmt: skip
    resp = await client.post(path, data=data)
    assert resp.status == status
    assert needle in (await resp.json())["error"]


def test_a_platform_without_an_adapter_is_a_clear_startup_error() -> None:
    with pytest.raises(StartupError, match="no adapter for platform 'irc' in this version"):
        find_adapter("irc")


def test_an_unreachable_discord_is_a_clear_startup_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "c.yml"
    api = f"http://127.0.0.1:{free_port()}/api/v10"  # nothing listens there
    cfg.write_text(
        f"http: {{listen: '127.0.0.1:{free_port()}'}}\n"
        f"bots:\n  - {{name: d, platform: discord, token: t, api_base: '{api}',"
        " backend: {type: echo}}\n"
    )
    # 1, not 2 (a config error): a supervisor starts it again, Discord may answer then
    assert main(["run", "-c", str(cfg)]) == 1
    err = capsys.readouterr().err
    assert "bot d: cannot reach Discord" in err and "Traceback" not in err
    assert "voice will NOT be supported" not in err  # discord.py's, of no use to the daemon


def test_a_failed_start_before_a_discord_bot_is_a_clear_startup_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Breaks if the daemon, closing what it made after a bot failed to start,
    # closes a Discord client that never logged in: discord.py raised
    # AttributeError, and the user saw a traceback instead of the reason.
    cfg = tmp_path / "c.yml"
    nowhere = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    cfg.write_text(
        f"http: {{listen: '127.0.0.1:{free_port()}'}}\n"
        f"bots:\n  - {{name: t, platform: telegram, token: '1:x', api_base: '{nowhere}',"
        " backend: {type: echo}}\n"
        f"  - {{name: d, platform: discord, token: x, api_base: '{nowhere}/api/v10',"
        " backend: {type: echo}}\n"
    )
    assert main(["run", "-c", str(cfg)]) == 1
    err = capsys.readouterr().err
    assert "bot t: cannot reach the Bot API" in err and "Traceback" not in err


def test_a_port_in_use_exits_1_for_a_supervisor_to_start_it_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Breaks if a port still held (the process before, stopping) exits 2, the
    # status of a config error, which the systemd unit does not restart.
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        cfg = tmp_path / "c.yml"
        cfg.write_text(
            f"http: {{listen: '127.0.0.1:{port}'}}\n"
            "bots:\n  - {name: h, platform: http, backend: {type: echo}}\n"
        )
        assert main(["run", "-c", str(cfg)]) == 1
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_two_discord_api_bases_in_one_config_are_a_config_error() -> None:
    # Breaks if check-config passes two Discord bots on different API bases,
    # which discord.py cannot serve from one process (the daemon refused them
    # only at start, after the first had logged in).
    from discord.http import Route

    from gateway.config import parse_config
    from gateway.config.errors import ConfigError
    from gateway.config.schema import DISCORD_API

    assert DISCORD_API == Route.BASE  # the default base the rule compares with
    bots = (
        "bots:\n  - {name: a, platform: discord, token: x, backend: {type: echo}}\n"
        "  - {name: b, platform: discord, token: y, api_base: 'http://127.0.0.1:9/api/v10',"
        " backend: {type: echo}}\n"
    )
    with pytest.raises(ConfigError, match=r"bots\[1\]\.api_base: http://127.0.0.1:9/api/v10 "
                       r"differs from bot a's https://discord.com/api/v10"):  # fmt: skip
        parse_config(bots)
    parse_config(bots.replace("'http://127.0.0.1:9/api/v10'", "'https://discord.com/api/v10/'"))


async def test_run_serves_until_sigterm_then_exits_0(tmp_path: Path) -> None:
    port = free_port()
    example = (ROOT / "config.example.yml").read_text()
    cfg = tmp_path / "c.yml"
    cfg.write_text(example.replace('listen: "127.0.0.1:8080"', f'listen: "127.0.0.1:{port}"'))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "run", "-c", str(cfg),
        stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    assert proc.stderr is not None
    line = await asyncio.wait_for(proc.stderr.readline(), 30)
    assert f"listening on http://127.0.0.1:{port}" in line.decode()
    async with aiohttp.ClientSession() as http:
        body = {"chat": "c", "author": "alice", "text": "ping", "mentions": ["helper"]}
        async with http.post(f"http://127.0.0.1:{port}/v1/bots/helper/messages",
                             json=body) as resp:  # fmt: skip
            assert (resp.status, (await resp.json())["reply"]) == (200, "ping")
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 30) == 0


async def test_a_second_sigterm_or_a_sighup_while_draining_ends_the_drain_cleanly(
    tmp_path: Path,
) -> None:
    """SIGTERM drains for shutdown.grace_seconds. A SIGHUP meanwhile (a reload
    racing the stop) used to kill the process (SIGHUP's default), and so did
    a second SIGTERM: exit 143, the client's connection cut, no 503, nothing
    logged. Now SIGHUP is ignored and a second SIGTERM cancels what is in
    flight at once: its slot released, a 503 to its client, exit 0."""
    from tests.fakes.webhook import FakeWebhook, hang

    port = free_port()
    async with FakeWebhook() as hook:
        hook.default = hang()
        cfg = tmp_path / "c.yml"
        cfg.write_text(
            f"http: {{listen: '127.0.0.1:{port}'}}\nshutdown: {{grace_seconds: 60}}\n"
            "bots:\n  - {name: a, platform: http, respond_to: all,\n"
            f"     backend: {{type: webhook, url: '{hook.url}', timeout_seconds: 60}}}}\n"
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "run", "-c", str(cfg),
            stderr=asyncio.subprocess.PIPE, cwd=ROOT,
        )  # fmt: skip
        assert proc.stderr is not None

        async def line_with(text: str) -> str:
            while True:
                line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()  # type: ignore[union-attr]
                assert line, f"the daemon ended before saying {text!r}"
                if text in line:
                    return line

        try:
            await line_with("listening on")
            async with aiohttp.ClientSession() as http:
                body = {"chat": "c", "author": "alice", "text": "hi"}
                url = f"http://127.0.0.1:{port}/v1/bots/a/messages"
                answer = asyncio.ensure_future(http.post(url, json=body))
                while not hook.requests:  # noqa: ASYNC110 - the fake has no event for it
                    await asyncio.sleep(0.02)  # the message is at its backend
                proc.send_signal(signal.SIGTERM)
                await line_with("in flight")
                proc.send_signal(signal.SIGHUP)
                await line_with("SIGHUP while stopping")
                proc.send_signal(signal.SIGTERM)
                resp = await asyncio.wait_for(answer, 10)
                assert resp.status == 503
                assert "stopped before this message was answered" in (await resp.json())["error"]
            assert await asyncio.wait_for(proc.wait(), 10) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


@pytest.mark.parametrize(
    ("url", "kind"),
    [("MEMORY://", "memory"), ("Redis+Cluster://127.0.0.1:1", "redis"),
     ("REDIS+SENTINEL://127.0.0.1:1/m", "redis"), ("Redis://127.0.0.1:1/0", "redis")],
)  # fmt: skip
async def test_a_store_scheme_in_capitals_is_the_store_it_names(url: str, kind: str) -> None:
    """check-config took a scheme in any case (`MEMORY://`: "ok - store
    memory"), but the daemon chose the store by the lowercase prefix and gave
    the URL to redis-py, which refused it: a traceback at start."""
    config = parse_config(f"store: {{url: '{url}'}}\n" + TWO_BOTS)
    daemon = Daemon(config)
    try:
        assert daemon.store.kind == kind
    finally:
        await daemon.store.close()


def test_the_default_config_has_one_http_echo_bot() -> None:
    bot = Config.default().bots[0]
    assert (bot.name, bot.platform, bot.backend.type) == ("bot", "http", "echo")


def test_a_platform_sdk_not_installed_names_the_extra_to_install(tmp_path: Path) -> None:
    """`pip install botbouncer` brings no platform SDK: a Discord bot in the
    config, with discord.py not importable, is a startup error naming the
    extra, while HTTP bots run on the core alone."""
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text(
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('discord', 'telegram'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
    )
    config = tmp_path / "d.yml"
    config.write_text("bots:\n  - {name: d, platform: discord, token: x, backend: {type: echo}}\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    res = subprocess.run([sys.executable, "-m", "gateway", "run", "-c", str(config)], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 2
    assert "pip install 'botbouncer[discord]'" in res.stderr
    assert "Traceback" not in res.stderr
    probe = (
        "import gateway.daemon, sys; "
        "print(any(m.split('.')[0] in ('discord', 'telegram') for m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert res.stdout.strip() == "False", res.stderr


async def test_a_store_that_does_not_answer_at_start_is_said_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A mistyped store.url used to start in silence, each replica on its own
    memory: now an ERROR names the URL (password masked) and the store starts
    degraded; with store.require_at_start the daemon refuses to start."""
    from gateway.store.failover import FailoverStore

    url = f"redis://:hunter22@127.0.0.1:{free_port()}/0"
    bots = "bots: [{name: a, platform: http, backend: {type: echo}}]\n"
    listen = f"http: {{listen: '127.0.0.1:{free_port()}'}}\n"
    daemon = Daemon(parse_config(f"store: {{url: '{url}'}}\n" + listen + bots))
    with caplog.at_level(logging.ERROR, logger="botbouncer"):
        await daemon.start()
    try:
        assert isinstance(daemon.store, FailoverStore) and daemon.store.degraded
        [line] = [
            r.getMessage() for r in caplog.records if "unreachable at start" in r.getMessage()
        ]
        assert "redis://:***@127.0.0.1" in line and "hunter22" not in line
        assert "store.require_at_start" in line
    finally:
        await daemon.stop()

    strict = f"store: {{url: '{url}', require_at_start: true}}\n" + listen + bots
    daemon = Daemon(parse_config(strict))
    with pytest.raises(StartupError, match=r"store redis://:\*\*\*@127.0.0.1:\d+/0 is unreachable"):
        await daemon.start()
