"""`botbouncer run` as a real subprocess on a real Redis, driven over HTTP.

Each test starts `python -m gateway run -c FILE --log-format json` (several at
once where it needs replicas), waits for its "listening on" log line, and talks
to it only the way a deployment would: ingress, admin API, /metrics, signals.
Chat ids are unique per test (the Redis db is shared) and their keys are
deleted afterwards; every daemon is killed in teardown if a test left it up.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import parse_config
from gateway.model import ChatKind
from gateway.pipeline import limits_for
from gateway.store.redis import RedisStore
from tests.daemons import pingpong
from tests.fakes.webhook import Answer, FakeWebhook
from tests.redis_server import delete_matching, free_port

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT = 20.0
TOKEN = "e2e-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
HIGH_RATE_CAP = {"max_replies": 100, "window_seconds": 120}


def http_bot(name: str, **policy: Any) -> dict[str, Any]:
    """An http bot answering every bot and every message, with the echo backend."""
    bot: dict[str, Any] = {
        "name": name,
        "platform": "http",
        "backend": {"type": "echo"},
        "bot_messages": "all",
        "respond_to": "all",
        "rate_cap": HIGH_RATE_CAP,
    }
    bot.update(policy)
    return bot


class RunningDaemon:
    """One `botbouncer run` process: its config file, URL and JSON log records."""

    def __init__(self, proc: asyncio.subprocess.Process, config: Path, base: dict[str, Any]):
        self.proc = proc
        self.config = config
        self.base = base  # the store and http sections every rewrite keeps
        self.url = ""
        self.lines: list[str] = []
        self.logs: list[dict[str, Any]] = []
        self._changed = asyncio.Condition()
        self._eof = False
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        async for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            async with self._changed:
                self.lines.append(line)
                self.logs.append(record if isinstance(record, dict) else {"message": line})
                self._changed.notify_all()
        async with self._changed:
            self._eof = True
            self._changed.notify_all()

    def config_text(self, settings: dict[str, Any]) -> str:
        return config_text(settings, self.base)

    def mark(self) -> int:
        """The position in the log from which a later wait_log looks."""
        return len(self.logs)

    async def wait_log(
        self, needle: str, *, since: int = 0, within: float = 10.0
    ) -> dict[str, Any]:
        """The first log record from `since` on whose message contains `needle`."""

        def found() -> dict[str, Any] | None:
            return next((r for r in self.logs[since:] if needle in str(r.get("message"))), None)

        record = None
        with suppress(TimeoutError):
            async with asyncio.timeout(within), self._changed:
                while (record := found()) is None and not self._eof:
                    await self._changed.wait()
        if record is None:
            why = "the daemon exited first" if self._eof else f"nothing within {within}s"
            last = "\n".join(self.lines[-40:])
            raise AssertionError(f"no log line with {needle!r} ({why}); its last lines:\n{last}")
        return record

    def decision_logs(self) -> list[dict[str, Any]]:
        return [r["decision"] for r in self.logs if "decision" in r]

    async def close(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        with suppress(TimeoutError):
            await asyncio.wait_for(self._reader, 5)


def config_text(settings: dict[str, Any], base: dict[str, Any]) -> str:
    return yaml.safe_dump({**settings, **base}, allow_unicode=True, sort_keys=False)


@asynccontextmanager
async def running(
    tmp_path: Path, redis_url: str, *settings: dict[str, Any], log_level: str = "info"
) -> AsyncIterator[list[RunningDaemon]]:
    """Daemons started at once, one per settings dict (store and listen are added;
    `admin_token` in settings goes under http, a `store` dict in settings keeps
    its other keys), ready when each logged where it listens; killed on the way
    out if still running. `log_level="debug"` logs own_message decisions too."""
    daemons: list[RunningDaemon] = []
    try:
        for i, s in enumerate(settings):
            s = dict(s)
            http: dict[str, Any] = {"listen": f"127.0.0.1:{free_port()}"}
            if "admin_token" in s:
                http["admin_token"] = s.pop("admin_token")
            base = {"store": {**s.pop("store", {}), "url": redis_url}, "http": http}
            path = tmp_path / f"daemon{i}.yml"
            path.write_text(config_text(s, base))
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gateway", "run", "-c", str(path), "--log-format", "json",
                "--log-level", log_level, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
            )  # fmt: skip
            daemons.append(RunningDaemon(proc, path, base))
        ready = await asyncio.gather(
            *(d.wait_log("listening on", within=START_TIMEOUT) for d in daemons)
        )
        for d, record in zip(daemons, ready, strict=True):
            match = re.search(r"listening on (http://\S+)", record["message"])
            assert match is not None
            d.url = match.group(1)
            assert d.url == f"http://{d.base['http']['listen']}"
        yield daemons
    finally:
        for d in daemons:
            await d.close()


@pytest.fixture
async def chats(redis_url: str) -> AsyncIterator[Callable[[], str]]:
    """Fresh chat ids for this test; their Redis keys are deleted afterwards."""
    run = f"e2e-{uuid.uuid4().hex[:12]}"
    numbers = itertools.count()
    yield lambda: f"{run}-{next(numbers)}"
    await delete_matching(redis_url, f"bb:{{http:{run}-*")


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


async def ingress(
    http: aiohttp.ClientSession, d: RunningDaemon, bot: str, body: dict[str, Any]
) -> dict[str, Any]:
    async with http.post(f"{d.url}/v1/bots/{bot}/messages", json=body) as resp:
        payload: dict[str, Any] = await resp.json()
        assert resp.status == 200, payload
        return payload


async def post(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    async with http.post(url, json=body) as resp:
        return resp.status, await resp.json()


async def admin(
    http: aiohttp.ClientSession,
    d: RunningDaemon,
    method: str,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    body: Any = None,
) -> tuple[int, dict[str, Any], Mapping[str, str]]:
    url = f"{d.url}/v1/admin/chats/{path}"
    async with http.request(method, url, headers=AUTH if headers is None else headers,
                            json=body) as resp:  # fmt: skip
        return resp.status, await resp.json(), resp.headers


async def soft_at_warning(
    http: aiohttp.ClientSession, d: RunningDaemon, bot: str, chat: str, *, limit: int
) -> int:
    """Feed `bot` messages from another bot until it stops answering; return the
    soft count at which it posted the soft-limit warning.

    Each answer is counted as `bot`'s own turn, so the other bot's messages land
    on odd counts when it opens the chat and on even ones after a human opener:
    the opener is chosen so that `limit` falls on a message `bot` may warn about.
    """
    if limit % 2 == 0:
        opener = await ingress(http, d, bot, {"chat": chat, "author": "human", "text": "hi"})
        assert opener["action"] == "reply", opener
    for i in range(12):
        line = {"chat": chat, "author": "other", "bot": True, "text": f"bot line {i}",
                "id": f"{chat}-o{i}"}  # fmt: skip
        out = await ingress(http, d, bot, line)
        if out["action"] == "warn":
            assert out["reason"] == "turn_soft_limit", out
            assert out["warning"].startswith("⚠️ Bot turn limit reached"), out
            assert out["warning_id"], out
            return int(out["soft"])
        assert (out["action"], out["reason"]) == ("reply", None), out
    raise AssertionError(f"{bot} answered 12 bot messages in a row and never warned")


# -- SIGHUP ------------------------------------------------------------------


async def test_sighup_applies_a_changed_soft_limit_from_the_next_message(
    tmp_path: Path, redis_url: str, chats: Callable[[], str], http: aiohttp.ClientSession
) -> None:
    settings = {"bots": [http_bot("b", turns={"soft_limit": 5})]}
    async with running(tmp_path, redis_url, settings) as (d,):
        assert await soft_at_warning(http, d, "b", chats(), limit=5) == 5

        d.config.write_text(d.config_text({"bots": [http_bot("b", turns={"soft_limit": 3})]}))
        since = d.mark()
        d.proc.send_signal(signal.SIGHUP)
        reloaded = await d.wait_log("reloaded", since=since)
        assert reloaded["level"] == "info"
        assert not [r for r in d.logs[since:] if "not applied until restart" in r["message"]]

        assert await soft_at_warning(http, d, "b", chats(), limit=3) == 3


async def test_sighup_with_a_broken_file_keeps_the_running_config(
    tmp_path: Path, redis_url: str, chats: Callable[[], str], http: aiohttp.ClientSession
) -> None:
    settings = {"bots": [http_bot("b", turns={"soft_limit": 5})]}
    async with running(tmp_path, redis_url, settings) as (d,):
        lower = d.config_text({"bots": [http_bot("b", turns={"soft_limit": 3})]})
        broken = [
            # a lower limit, but the file does not parse
            (lower + "  - {name: [\n", "line "),
            # parses, but a value is out of range
            (d.config_text({"bots": [http_bot("b", turns={"soft_limit": -1})]}),
             "bots[0].turns.soft_limit"),
        ]  # fmt: skip
        for text, problem in broken:
            d.config.write_text(text)
            since = d.mark()
            d.proc.send_signal(signal.SIGHUP)
            refused = await d.wait_log("refused", since=since)
            assert refused["level"] == "error"
            assert problem in refused["message"], refused["message"]
            assert not [r for r in d.logs[since:] if "reloaded" in r["message"]]
            async with http.get(f"{d.url}/healthz") as resp:
                assert (resp.status, (await resp.json())["status"]) == (200, "ok")
            assert d.proc.returncode is None
            assert await soft_at_warning(http, d, "b", chats(), limit=5) == 5


# -- SIGTERM -----------------------------------------------------------------


class Gate:
    """A webhook answer that reports each arrival and answers only when released
    (or when the fake server stops: then the answer no longer matters)."""

    def __init__(self, expected: int, reply: str = "slow reply") -> None:
        self.expected = expected
        self.arrived = 0
        self.all_in = asyncio.Event()
        self.release = asyncio.Event()
        self.reply = reply

    async def __call__(self, stopping: asyncio.Event) -> web.StreamResponse:
        self.arrived += 1
        if self.arrived >= self.expected:
            self.all_in.set()
        release = asyncio.ensure_future(self.release.wait())
        stop = asyncio.ensure_future(stopping.wait())
        await asyncio.wait([release, stop], return_when=asyncio.FIRST_COMPLETED)
        release.cancel()
        stop.cancel()
        return web.json_response({"reply": self.reply})


def webhook_bot(name: str, url: str) -> dict[str, Any]:
    return http_bot(name, backend={"type": "webhook", "url": url, "timeout_seconds": 20})


async def test_sigterm_answers_the_messages_in_flight_refuses_new_ones_and_exits_0(
    tmp_path: Path, redis_url: str, chats: Callable[[], str], http: aiohttp.ClientSession
) -> None:
    gate = Gate(expected=3)
    answer: Answer = gate
    async with FakeWebhook() as hook:
        hook.default = answer
        settings = {"bots": [webhook_bot("slow", hook.url)], "shutdown": {"grace_seconds": 10}}
        async with running(tmp_path, redis_url, settings) as (d,):
            chat = chats()
            sent = [
                asyncio.create_task(ingress(http, d, "slow", {"chat": chat, "author": "human",
                                                              "text": f"q{i}", "id": f"q{i}"}))
                for i in range(3)
            ]  # fmt: skip
            await asyncio.wait_for(gate.all_in.wait(), 10)  # all three at the backend

            since = d.mark()
            signalled = time.monotonic()
            d.proc.send_signal(signal.SIGTERM)
            waiting = await d.wait_log("in flight", since=since)
            assert "3 message(s)" in waiting["message"]

            # the listener is closed: a new connection is refused (or answered 503)
            async with aiohttp.ClientSession() as fresh:
                try:
                    async with fresh.post(f"{d.url}/v1/bots/slow/messages",
                                          json={"chat": chat, "author": "human",
                                                "text": "late"}) as resp:  # fmt: skip
                        assert resp.status == 503, await resp.text()
                except aiohttp.ClientConnectionError:
                    pass
            assert not any(t.done() for t in sent)

            gate.release.set()
            answers = await asyncio.gather(*sent)
            code = await asyncio.wait_for(d.proc.wait(), 15)
            took = time.monotonic() - signalled
            await d.wait_log("stopped", since=since)

    assert code == 0
    assert took < 5, f"exit took {took:.1f}s of the 10s grace"
    assert sorted(a["id"] for a in answers) == ["q0", "q1", "q2"]
    for a in answers:
        assert (a["action"], a["reply"]) == ("reply", "slow reply"), a
        assert a["reply_id"].startswith("slow-")
    assert len(hook.requests) == 3  # the late message never reached the backend
    assert not [r for r in d.logs[since:] if "cancelled" in r["message"]]


async def test_sigterm_with_a_hung_backend_exits_after_the_grace_and_releases_the_slot(
    tmp_path: Path, redis_url: str, chats: Callable[[], str], http: aiohttp.ClientSession
) -> None:
    gate = Gate(expected=1)  # never released: the backend hangs
    answer: Answer = gate
    grace = 0.5
    async with FakeWebhook() as hook:
        hook.default = answer
        settings = {
            "bots": [webhook_bot("stuck", hook.url)],
            "shutdown": {"grace_seconds": grace},
            "admin_token": TOKEN,
        }
        async with running(tmp_path, redis_url, settings) as (d,):
            chat = chats()
            body = {"chat": chat, "author": "human", "text": "hello?", "id": "hung-1"}
            pending = asyncio.create_task(post(http, f"{d.url}/v1/bots/stuck/messages", body))
            await asyncio.wait_for(gate.all_in.wait(), 10)
            status, held, _ = await admin(http, d, "GET", chat)
            assert (status, held["rate"]["used"]) == (200, 1)  # the slot is taken

            since = d.mark()
            signalled = time.monotonic()
            d.proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(d.proc.wait(), 15)
            took = time.monotonic() - signalled
            outcome: object = (await asyncio.gather(pending, return_exceptions=True))[0]
            cancelled = await d.wait_log("cancelled 1 message(s)", since=since)

    assert code == 0
    assert grace <= took < grace + 4, f"exit took {took:.2f}s with a {grace}s grace"
    assert cancelled["level"] == "warning"
    # the cancelled request is told so, as JSON: no reply, no dropped connection
    stopped = (
        "botbouncer stopped before this message was answered; "
        "nothing was sent for it: send it again, to another replica"
    )
    assert outcome == (503, {"error": stopped})

    bot = parse_config(d.config.read_text()).bot("stuck")
    store = RedisStore.from_url(redis_url)
    try:
        after = await store.status(f"http:{chat}", "stuck", limits_for(bot, ChatKind.GROUP))
        logged = await store.decisions(f"http:{chat}")
    finally:
        await store.close()
    assert after.rate_used == 0
    assert [(e["id"], e["action"], e["reason"]) for e in logged] == [
        ("hung-1", "drop", "backend_error")
    ]


# -- replicas sharing one Redis -----------------------------------------------


async def test_two_daemons_ping_pong_until_the_soft_limit_then_a_human_resumes_them(
    tmp_path: Path, redis_url: str, chats: Callable[[], str], http: aiohttp.ClientSession
) -> None:
    soft_limit = 6
    ping_cfg = {"bots": [http_bot("ping", turns={"soft_limit": soft_limit})]}
    pong_cfg = {"bots": [http_bot("pong", turns={"soft_limit": soft_limit})]}
    async with running(tmp_path, redis_url, ping_cfg, pong_cfg) as (ping, pong):
        daemons = {"ping": ping, "pong": pong}
        chat = chats()

        async def post(bot: str, body: dict[str, Any]) -> dict[str, Any]:
            return await ingress(http, daemons[bot], bot, body)

        relay = await pingpong(post, chat, "ping", "pong")
        assert len(relay.replies) == soft_limit  # at most soft_limit, and the loop got that far
        assert set(relay.replies) == {"ping", "pong"}
        assert len(relay.warnings) == 1
        assert relay.posted[-1][0] == "warning"  # nothing after the warning
        assert (relay.last["action"], relay.last["reason"]) == ("drop", "turn_throttled")

        resumed = await ingress(http, pong, "pong", {"chat": chat, "author": "human",
                                                     "text": "carry on", "id": "h2"})  # fmt: skip
        assert (resumed["turn"], resumed["action"], resumed["reply"]) == (
            "reset", "reply", "carry on"
        )  # fmt: skip


async def test_admin_api_acts_across_replicas_and_refuses_without_the_token(
    tmp_path: Path, redis_url: str, chats: Callable[[], str], http: aiohttp.ClientSession
) -> None:
    a_cfg = {"bots": [http_bot("ping")], "admin_token": TOKEN}
    b_cfg = {"bots": [http_bot("pong")], "admin_token": TOKEN}
    closed_cfg = {"bots": [http_bot("quiet")]}
    async with running(tmp_path, redis_url, a_cfg, b_cfg, closed_cfg) as (a, b, closed):
        chat = chats()

        # refused: nothing changes
        wrong = {"Authorization": "Bearer not-the-token"}
        for headers in ({}, wrong, {"Authorization": TOKEN}):
            status, body, resp_headers = await admin(
                http, a, "PUT", f"{chat}/limits", headers=headers, body={"soft_limit": 1}
            )
            assert status == 401, body
            assert body["error"] == "missing or wrong bearer token"
            assert resp_headers["WWW-Authenticate"] == 'Bearer realm="botbouncer"'
        for headers in ({}, AUTH):
            status, body, _ = await admin(http, closed, "GET", chat, headers=headers)
            assert status == 403, body
            assert "admin_token" in body["error"]
        status, body, _ = await admin(http, b, "GET", chat)
        assert (status, body["overrides"], body["soft_limit"]) == (200, {}, 20)

        # limits set through A hold on B
        status, body, _ = await admin(http, a, "PUT", f"{chat}/limits", body={"soft_limit": 2})
        assert (status, body["done"], body["overrides"]) == (200, "limits", {"soft_limit": 2})
        assert await soft_at_warning(http, b, "pong", chat, limit=2) == 2
        status, body, _ = await admin(http, b, "GET", chat)
        assert status == 200
        assert (body["bot"], body["overrides"], body["soft_limit"]) == (
            "pong", {"soft_limit": 2}, 2
        )  # fmt: skip

        # a pause through A holds on B, and B's decision log shows it
        paused_chat = chats()
        status, body, _ = await admin(http, a, "POST", f"{paused_chat}/pause")
        assert (status, body["done"], body["paused"]) == (200, "pause", True)
        out = await ingress(http, b, "pong", {"chat": paused_chat, "author": "human",
                                              "text": "anyone?", "id": "p1"})  # fmt: skip
        assert (out["action"], out["reason"]) == ("drop", "paused")
        status, body, _ = await admin(http, b, "GET", f"{paused_chat}/decisions")
        assert status == 200
        assert [(e["id"], e["bot"], e["reason"]) for e in body["decisions"]] == [
            ("p1", "pong", "paused")
        ]

        status, body, _ = await admin(http, a, "POST", f"{paused_chat}/resume")
        assert (status, body["paused"]) == (200, False)
        out = await ingress(http, b, "pong", {"chat": paused_chat, "author": "human",
                                              "text": "now?", "id": "p2"})  # fmt: skip
        assert (out["action"], out["reason"], out["reply"]) == ("reply", None, "now?")


# -- observability -------------------------------------------------------------


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


async def test_metrics_count_exactly_the_decisions_taken(
    tmp_path: Path, redis_url: str, chats: Callable[[], str], http: aiohttp.ClientSession
) -> None:
    settings = {"bots": [{"name": "m", "platform": "http", "backend": {"type": "echo"}}]}
    async with running(tmp_path, redis_url, settings) as (d,):
        chat = chats()
        sent: list[dict[str, Any]] = [
            {"chat": chat, "author": "al", "text": "hi m", "mentions": ["m"]},
            {"chat": chat, "author": "al", "text": "again", "mentions": ["m"]},
            {"chat": chat, "author": "al", "text": "not for m"},
        ]
        got = [await ingress(http, d, "m", body) for body in sent]
        assert [(g["action"], g["reason"]) for g in got] == [
            ("reply", None), ("reply", None), ("drop", "not_addressed")
        ]  # fmt: skip
        async with http.get(f"{d.url}/healthz") as resp:
            assert (resp.status, await resp.json()) == (200, {"status": "ok", "store": "redis"})
        async with http.get(f"{d.url}/metrics") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            metrics = samples(await resp.text())

    def labels(**kv: str) -> frozenset[tuple[str, str]]:
        return frozenset(kv.items())

    messages = {k: v for k, v in metrics.items() if k[0] == "botbouncer_messages_total"}
    assert messages == {
        ("botbouncer_messages_total",
         labels(bot="m", platform="http", action="reply", reason="none")): 2.0,
        ("botbouncer_messages_total",
         labels(bot="m", platform="http", action="drop", reason="not_addressed")): 1.0,
    }  # fmt: skip
    verdicts = {k: v for k, v in metrics.items() if k[0] == "botbouncer_turn_verdicts_total"}
    assert verdicts == {("botbouncer_turn_verdicts_total", labels(verdict="reset")): 3.0}
    assert metrics[("botbouncer_decision_seconds_count", labels())] == 3.0
    assert metrics[("botbouncer_backend_seconds_count", labels())] == 2.0
    assert metrics[("botbouncer_classifier_seconds_count", labels())] == 0.0
    for result in ("reply", "skip", "error"):
        key = ("botbouncer_classifier_calls_total", labels(result=result))
        assert metrics[key] == 0.0
    assert metrics[("botbouncer_store_degraded", labels())] == 0.0


async def test_json_logs_carry_one_decision_object_per_message(
    tmp_path: Path, redis_url: str, chats: Callable[[], str], http: aiohttp.ClientSession
) -> None:
    settings = {
        "bots": [{"name": "j", "platform": "http", "backend": {"type": "echo"}}],
        "defaults": {"turns": {"soft_limit": 2}},
    }
    async with running(tmp_path, redis_url, settings) as (d,):
        chat = chats()
        sent: list[dict[str, Any]] = [
            {"chat": chat, "author": "al", "text": "hi j", "mentions": ["j"], "id": "l1"},
            {"chat": chat, "author": "other", "bot": True, "text": "beep", "id": "l2"},
            {"chat": chat, "author": "al", "text": "not for j", "id": "l3"},
            {"chat": chat, "author": "al", "text": "hi j", "mentions": ["j"], "id": "l1"},
        ]
        got = [await ingress(http, d, "j", body) for body in sent]
        assert [(g["action"], g["reason"]) for g in got] == [
            ("reply", None), ("warn", "turn_soft_limit"), ("drop", "not_addressed"),
            ("drop", "duplicate"),
        ]  # fmt: skip
        since = d.mark()
        async with http.get(f"{d.url}/healthz") as resp:  # a request that decides nothing
            assert resp.status == 200
        d.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(d.proc.wait(), 15) == 0
        await d.wait_log("stopped", since=since)

    assert d.lines, "the daemon logged nothing"
    for line in d.lines:
        record = json.loads(line)  # every line is one JSON object
        assert {"ts", "level", "logger", "message"} <= record.keys(), record
    decisions = d.decision_logs()
    assert [(x["id"], x["bot"], x["chat"], x["action"], x["reason"]) for x in decisions] == [
        (g["id"], "j", f"http:{chat}", g["action"], g["reason"]) for g in got
    ]
    for record in (r for r in d.logs if "decision" in r):
        assert record["logger"] == "botbouncer.decision"
        assert record["decision"]["id"] in record["message"]
