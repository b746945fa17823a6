"""Stopping and reloading: in-flight drain, slot release on cancel, reload rules,
JSON logs. The same behaviour through a real process is in test_daemon_e2e.py."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.config import parse_config
from gateway.daemon import GC_YOUNG, Daemon, StartupError, reload_file, restart_needed, serve
from gateway.inflight import InFlight, ShuttingDown
from gateway.logs import TEXT_FORMAT, JsonFormatter, TextFormatter
from gateway.model import Action, Decision, Reason, Turn
from gateway.pipeline import Gateway
from gateway.store import Store
from tests.test_pipeline import ROOM, Held, bot_config, human

BASE = """
bots:
  - {name: helper, platform: http, backend: {type: echo}}
defaults:
  turns: {soft_limit: 5, hard_limit: 10}
"""


async def test_drain_waits_for_tracked_work_and_refuses_new() -> None:
    inflight = InFlight()
    gate = asyncio.Event()
    entered = asyncio.Event()

    async def work() -> str:
        with inflight.track(), inflight.track():  # re-entrant, as adapter + gateway
            entered.set()
            await gate.wait()
            return "done"

    task = asyncio.create_task(work())
    await entered.wait()
    drain = asyncio.create_task(inflight.drain(5))
    await asyncio.sleep(0)
    with pytest.raises(ShuttingDown), inflight.track():  # a new message while stopping
        pass
    assert not drain.done()
    gate.set()
    assert await drain == 0
    assert await task == "done"
    assert len(inflight) == 0


async def test_drain_cancels_what_outlives_the_grace_period() -> None:
    inflight = InFlight()
    entered = asyncio.Event()

    async def stuck() -> None:
        with inflight.track():
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(stuck())
    await entered.wait()
    assert await inflight.drain(0.01) == 1
    assert task.cancelled()


async def test_a_cancelled_message_gives_its_slot_back(store: Store) -> None:
    backend = Held()
    gw = Gateway(bot_config(rate_cap="{max_replies: 1}"), store, backend)
    task = asyncio.create_task(gw.handle(human("hang on", mid="h1")))
    await backend.called.wait()  # the slot is held once the backend is called
    status = await gw.store.status(ROOM.key, "helper", gw.limits(ROOM.kind))
    assert status.rate_used == 1
    assert await gw.inflight.drain(0) == 1
    assert task.cancelled()
    status = await gw.store.status(ROOM.key, "helper", gw.limits(ROOM.kind))
    assert status.rate_used == 0
    newest = (await store.decisions(ROOM.key))[0]
    assert (newest["id"], newest["reason"]) == ("h1", "backend_error")
    # the freed slot answers the next message
    backend.gate.set()
    gw2 = Gateway(gw.bot, store, backend)
    assert (await gw2.handle(human("again", mid="h2"))).action is Action.REPLY


def test_restart_needed_names_what_a_reload_cannot_apply() -> None:
    running = parse_config(BASE)
    policy_only = parse_config(BASE.replace("soft_limit: 5", "soft_limit: 3"))
    assert restart_needed(running, policy_only) == []
    moved = parse_config(
        BASE + 'store: {url: "redis://127.0.0.1:1/0"}\nhttp: {listen: "127.0.0.1:9"}\n'
    )
    assert restart_needed(running, moved) == ["http.listen", "store"]
    more = parse_config(BASE.replace("bots:\n", "bots:\n  - {name: b2, platform: http, "
                                     "backend: {type: echo}}\n"))  # fmt: skip
    assert restart_needed(running, more) == ["bots: new bot 'b2'"]
    assert restart_needed(more, running) == ["bots: removed bot 'b2' (it keeps running)"]
    api = parse_config(BASE.replace("type: echo}", "type: echo}, api_base: http://x"))
    assert restart_needed(running, api) == ["bots[helper].api_base"]


async def test_reload_applies_policy_to_the_next_message() -> None:
    daemon = Daemon(parse_config(BASE))
    gw = daemon.gateways["helper"]
    try:
        assert gw.limits(ROOM.kind).soft_limit == 5
        pending = daemon.reload(
            parse_config(BASE.replace("soft_limit: 5", "soft_limit: 2") + "http: {admin_token: t}")
        )
        assert pending == []
        assert gw.limits(ROOM.kind).soft_limit == 2
        assert daemon.server.admin_token == "t"
        assert daemon.server.admins["helper"].bot.turns.soft_limit == 2
    finally:
        await daemon.stop()


async def test_a_reload_that_raises_max_connections_raises_the_open_file_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """http.max_connections applies from the next connection after a reload,
    but the open-file limit was fitted at start only: a reload from 40 to
    1000 under a soft limit of 300 made accept() fail (EMFILE) from the
    300th connection on, an asyncio ERROR with a traceback for each, some
    200,000 lines a second, and not one connection got the cap's 503."""
    import resource

    limits = {"soft": 300, "hard": 20_000}
    monkeypatch.setattr(resource, "getrlimit", lambda _: (limits["soft"], limits["hard"]))
    monkeypatch.setattr(resource, "setrlimit", lambda _, value: limits.update(soft=value[0]))
    daemon = Daemon(parse_config(BASE + "http: {max_connections: 40}"))
    try:
        daemon.reload(parse_config(BASE + "http: {max_connections: 1000}"))
        assert limits["soft"] == 1000 + 256
    finally:
        await daemon.stop()


async def test_a_reload_that_cannot_build_a_backend_changes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    daemon = Daemon(parse_config(BASE))
    gw = daemon.gateways["helper"]
    before = gw.backend
    bad = BASE.replace("soft_limit: 5", "soft_limit: 2").replace(
        "{type: echo}", "{type: python, callable: 'tests.no_such_module:f'}"
    )
    try:
        with pytest.raises(StartupError, match="no_such_module"):
            daemon.reload(parse_config(bad))
        assert (gw.backend, gw.limits(ROOM.kind).soft_limit) == (before, 5)
        path = tmp_path / "c.yml"
        for text in (bad, "bots: [", "bots:\n  - {name: helper, platform: http}\n"):
            path.write_text(text)
            with caplog.at_level(logging.INFO, "botbouncer"):
                reload_file(daemon, str(path))
            assert "refused, the running configuration stays" in caplog.text
            assert (gw.backend, gw.limits(ROOM.kind).soft_limit) == (before, 5)
            caplog.clear()
        path.write_text(BASE.replace("soft_limit: 5", "soft_limit: 4") + 'store: {url: "x"}')
        with caplog.at_level(logging.INFO, "botbouncer"):
            reload_file(daemon, str(path))
        assert "refused" in caplog.text and "store.url" in caplog.text
        listen = "http: {listen: '127.0.0.1:1'}"
        path.write_text(BASE.replace("soft_limit: 5", "soft_limit: 4") + listen)
        with caplog.at_level(logging.INFO, "botbouncer"):
            reload_file(daemon, str(path))
        assert "not applied until restart: http.listen" in caplog.text
        assert gw.limits(ROOM.kind).soft_limit == 4
    finally:
        await daemon.stop()


async def test_json_log_lines_carry_the_decision() -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    logger = logging.getLogger("botbouncer.decision")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        daemon = Daemon(parse_config(BASE))
        d = await daemon.gateways["helper"].handle(human("hi", mid="j1", mentions=()))
        await daemon.stop()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    assert d.reason is Reason.NOT_ADDRESSED
    line = json.loads(JsonFormatter().format(records[-1]))
    assert line["level"] == "info" and line["logger"] == "botbouncer.decision"
    assert line["decision"]["id"] == "j1"
    assert line["decision"]["reason"] == "not_addressed"
    assert "ms" in line["decision"]


def test_text_log_lines_read_as_the_plain_formatter_writes_them() -> None:
    """TextFormatter makes the date once a second: each line still says its
    own time, across second and minute boundaries, as logging's Formatter."""
    try:
        raise ValueError("boom")
    except ValueError:
        failure = sys.exc_info()
    levels = (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)
    for i, created in enumerate((1_790_000_000.001, 1_790_000_000.999, 1_790_000_001.0,
                                 1_790_000_059.5, 1_790_000_060.25, 1_790_000_000.5)):  # fmt: skip
        for exc, stack in ((None, None), (failure, None), (None, "Stack (most recent call last)")):
            record = logging.LogRecord("botbouncer.decision", levels[i % 5], __file__, 1,
                                       "decision %s at 100%%", ("x",), exc)  # fmt: skip
            record.created, record.msecs = created, (created - int(created)) * 1000 // 1
            record.stack_info = stack
            # each formatter on its own copy: formatting caches the traceback's text
            plain = logging.Formatter(TEXT_FORMAT).format(logging.makeLogRecord(record.__dict__))
            assert TextFormatter().format(record) == plain


def test_a_decision_with_replies_keeps_every_other_field() -> None:
    d = Decision("b", "m1", "http:room", "alice", Action.WARN, Reason.TURN_SOFT_LIMIT,
                 Turn.SOFT_LIMIT, 3, 4, warning="slow down", replies=("old",), at=12.5)  # fmt: skip
    assert d.with_replies(("a", "b")) == replace(d, replies=("a", "b"))


async def test_serve_freezes_what_starting_made_out_of_the_collectors_way() -> None:
    """A full collection walks only what messages make, not the modules,
    config and clients the start made (its pause was a busy daemon's p99);
    the young generation is collected every GC_YOUNG allocations."""
    from tests.redis_server import free_port

    config = parse_config(BASE + f"http: {{listen: '127.0.0.1:{free_port()}'}}\n")
    gc.unfreeze()
    thresholds = gc.get_threshold()
    ready = asyncio.Event()
    task = asyncio.create_task(serve(config, on_ready=lambda _: ready.set()))
    started = asyncio.create_task(ready.wait())
    await asyncio.wait([task, started], return_when=asyncio.FIRST_COMPLETED)
    if task.done():  # serve failed to start: say why instead of waiting for ever
        started.cancel()
        await task
    try:
        assert gc.get_freeze_count() > 10_000  # the interpreter, the libraries, the daemon
        assert gc.get_threshold() == (GC_YOUNG, *thresholds[1:])
    finally:
        os.kill(os.getpid(), signal.SIGTERM)  # serve's own handler: a clean stop
        await task
        gc.unfreeze()
        gc.set_threshold(*thresholds)
