"""Backends through the real pipeline (docs/backends.md): answers, failures, slots, breaker."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from aiohttp import web

from gateway.backends import Guarded, make_backend
from gateway.backends.breaker import CircuitBreaker, CircuitOpen
from gateway.cli import main
from gateway.config import BotConfig, parse_config
from gateway.model import Action, Author, ChatRef, Message, Reason
from gateway.outbound import Outbound
from gateway.pipeline import Gateway
from gateway.store import Store
from tests import sample_backends
from tests.fakes.llm import FakeLLM, answer, reasoning, status
from tests.fakes.webhook import FakeWebhook, hang, no_content, raw, reply_json

ROOM = ChatRef("http", "room")


def bot(backend: str, **policy: str) -> BotConfig:
    extra = "".join(f"    {k}: {v}\n" for k, v in policy.items())
    text = f"bots:\n  - name: helper\n    platform: http\n    backend: {backend}\n{extra}"
    return parse_config(text).bots[0]


def gw(cfg: BotConfig, store: Store, outbound: Outbound) -> Gateway:
    return Gateway(cfg, store, make_backend(cfg.backend, cfg.name, outbound))


def ask(i: int, text: str = "hello") -> Message:
    return Message(f"h{i}", ROOM, Author("alice", "Alice"), text, mentions=("helper",))


def webhook(url: str, timeout: float = 2, **more: str) -> str:
    extra = "".join(f", {k}: {v}" for k, v in more.items())
    return f"{{type: webhook, url: '{url}', timeout_seconds: {timeout}{extra}}}"


@pytest.mark.parametrize(
    ("answer_", "action", "reason", "replies"),
    [
        (reply_json({"reply": "hi there"}), Action.REPLY, None, ("hi there",)),
        (reply_json({"replies": ["one", "two"]}), Action.REPLY, None, ("one", "two")),
        (no_content(), Action.DROP, Reason.BACKEND_EMPTY, ()),
        (reply_json({"reply": ""}), Action.DROP, Reason.BACKEND_EMPTY, ()),
        (reply_json({"reply": None}), Action.DROP, Reason.BACKEND_EMPTY, ()),
        (raw(""), Action.DROP, Reason.BACKEND_EMPTY, ()),
        (reply_json({"error": "boom"}, 500), Action.DROP, Reason.BACKEND_ERROR, ()),
        (raw("{not json"), Action.DROP, Reason.BACKEND_ERROR, ()),
        (reply_json({"reply": 7}), Action.DROP, Reason.BACKEND_ERROR, ()),
        (reply_json(["reply"]), Action.DROP, Reason.BACKEND_ERROR, ()),
        # read whole however many reads it takes; past MAX_ANSWER, not read at all
        (reply_json({"reply": "w" * 300_000}), Action.REPLY, None, ("w" * 300_000,)),
        (reply_json({"reply": "w" * (5 << 20)}), Action.DROP, Reason.BACKEND_ERROR, ()),
    ],
    ids=[
        "reply",
        "replies",
        "204",
        "empty-reply",
        "null-reply",
        "empty-body",
        "500",
        "invalid-json",
        "reply-not-string",
        "not-object",
        "300-kb",
        "over-4-mib",
    ],
)
async def test_webhook_answers(
    hook: FakeWebhook,
    store: Store,
    outbound: Outbound,
    answer_: object,
    action: Action,
    reason: Reason | None,
    replies: tuple[str, ...],
) -> None:
    g = gw(bot(webhook(hook.url), rate_cap="{max_replies: 1}"), store, outbound)
    hook.then(answer_)  # type: ignore[arg-type]
    d = await g.handle(ask(1))
    assert (d.action, d.reason, d.replies) == (action, reason, replies)
    # a message that sent nothing gave its slot back; one that replied kept it
    second = await g.handle(ask(2))
    assert second.reason is (Reason.RATE_CAPPED if action is Action.REPLY else None)


async def test_a_reply_with_a_lone_surrogate_is_sent_and_counted(
    hook: FakeWebhook, store: Store, outbound: Outbound
) -> None:
    """JSON may spell half an emoji ("\\ud83d", a model cut off mid-pair):
    no store or platform can encode it, so the reply, once sent, could not be
    counted as the bot's turn. It goes out with U+FFFD in its place."""
    g = gw(bot(webhook(hook.url)), store, outbound)
    hook.then(reply_json({"reply": "done \ud83d"}))
    d = await g.handle(ask(1))
    assert d.replies == ("done \ufffd",)
    counted = await g.sent(d, "r1", d.replies[0])
    assert counted.soft == 1  # the bot's turn, counted


async def test_webhook_request_carries_the_message_and_recent_context(
    hook: FakeWebhook, store: Store, outbound: Outbound
) -> None:
    g = gw(bot(webhook(hook.url, context_messages=2)), store, outbound)
    for i, text in enumerate(["a", "b", "c"]):
        await g.handle(Message(f"x{i}", ROOM, Author("bob", "Bob"), text))
    await g.handle(ask(1, "question"))
    (req,) = hook.requests
    assert req["bot"] == "helper"
    assert req["message"] == {
        "id": "h1",
        "chat": "room",
        "platform": "http",
        "topic": None,
        "kind": "group",
        "author": {"id": "alice", "name": "Alice", "bot": False},
        "text": "question",
        "mentions": ["helper"],
        "reply_to": None,
    }
    assert [(c["name"], c["text"], c["bot"]) for c in req["context"]] == [
        ("Bob", "b", False),
        ("Bob", "c", False),
    ]


@pytest.mark.parametrize("code", [301, 302, 307, 308])
async def test_a_webhook_redirect_is_not_followed_and_says_where_it_points(
    store: Store, outbound: Outbound, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    """A moved webhook (http to https, a new path): followed, a 301 or 302
    became a GET without the message (the webhook answered 405, or a page),
    and any redirect took the headers, secrets too, to wherever it pointed.
    Not followed, the error names the new place."""
    reached: list[tuple[str, str | None]] = []

    async def moved(_: web.Request) -> web.StreamResponse:
        return web.Response(status=code, headers={"Location": "/new"})

    async def new(request: web.Request) -> web.StreamResponse:
        reached.append((request.method, request.headers.get("X-Hook-Token")))
        return web.json_response({"reply": "followed"})

    app = web.Application()
    app.router.add_post("/hook", moved)
    app.router.add_route("*", "/new", new)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
        g = gw(bot(webhook(url, headers="{X-Hook-Token: s3cret-hook}")), store, outbound)
        d = await g.handle(ask(1))
    finally:
        await runner.cleanup()
    assert (d.action, d.reason, reached) == (Action.DROP, Reason.BACKEND_ERROR, [])
    assert f"webhook answered HTTP {code}, a redirect to '/new'" in caplog.text


async def test_webhook_timeout_is_a_backend_error_and_releases_the_slot(
    hook: FakeWebhook, store: Store, outbound: Outbound, caplog: pytest.LogCaptureFixture
) -> None:
    g = gw(bot(webhook(hook.url, timeout=0.2), rate_cap="{max_replies: 1}"), store, outbound)
    hook.then(hang())
    d = await g.handle(ask(1))
    assert (d.action, d.reason) == (Action.DROP, Reason.BACKEND_ERROR)
    assert "no reply within 0.2 s" in caplog.text
    assert (await g.handle(ask(2))).action is Action.REPLY


async def test_breaker_opens_after_five_failures_and_closes_after_a_good_trial(
    hook: FakeWebhook, store: Store, outbound: Outbound, caplog: pytest.LogCaptureFixture
) -> None:
    g = gw(bot(webhook(hook.url), rate_cap="{max_replies: 100}"), store, outbound)
    assert isinstance(g.backend, Guarded)
    now = [1000.0]
    g.backend.breaker.clock = lambda: now[0]
    hook.default = reply_json({"error": "down"}, 500)
    for i in range(5):
        assert (await g.handle(ask(i))).reason is Reason.BACKEND_ERROR
    assert len(hook.requests) == 5
    # open: failures are immediate, the webhook is not called
    for i in range(5, 8):
        assert (await g.handle(ask(i))).reason is Reason.BACKEND_ERROR
    assert len(hook.requests) == 5
    assert "circuit open after 5 failures" in caplog.text
    now[0] += 30  # the cooldown has passed: one trial call, which fails -> open again
    assert (await g.handle(ask(8))).reason is Reason.BACKEND_ERROR
    assert (await g.handle(ask(9))).reason is Reason.BACKEND_ERROR
    assert len(hook.requests) == 6
    now[0] += 30
    hook.default = reply_json({"reply": "back"})
    assert (await g.handle(ask(10))).replies == ("back",)  # good trial: closed
    assert (await g.handle(ask(11))).replies == ("back",)
    assert len(hook.requests) == 8
    assert g.backend.breaker.state == "closed"


def test_breaker_unit() -> None:
    now = [0.0]
    b = CircuitBreaker(failures=2, cooldown=10, clock=lambda: now[0])
    b.before_call()
    b.failed()
    b.before_call()
    b.failed()
    with pytest.raises(CircuitOpen):
        b.before_call()
    now[0] = 10
    b.before_call()  # the trial
    with pytest.raises(CircuitOpen, match="trial call is under way"):
        b.before_call()
    b.abandoned()  # cancelled: the next call may try again
    b.before_call()
    b.succeeded()
    assert (b.state, b.failures) == ("closed", 0)


async def test_openai_backend(store: Store, outbound: Outbound) -> None:
    async with FakeLLM() as llm:
        llm.default = answer("  Noon, probably.  ")
        cfg = bot(
            f"{{type: openai, endpoint: '{llm.base_url}', model: chat-1, api_key: k1, "
            "context_messages: 3}"
        )
        g = gw(cfg, store, outbound)
        await g.handle(Message("o1", ROOM, Author("helper", is_bot=True), "earlier answer"))
        await g.handle(Message("o2", ROOM, Author("bob", "Bob"), "lunch?"))
        d = await g.handle(ask(1, "what time?"))
        assert d.replies == ("Noon, probably.",)
        body = llm.calls[0].body
        assert body is not None and body["model"] == "chat-1"
        assert [m["role"] for m in body["messages"]] == ["system", "assistant", "user", "user"]
        assert body["messages"][0]["content"].startswith("You are helper")
        assert body["messages"][2]["content"] == "Bob (human): lunch?"
        assert body["messages"][3]["content"] == "Alice (human): what time?"
        assert llm.calls[0].headers["authorization"] == "Bearer k1"
        llm.default = status(500)
        assert (await g.handle(ask(2))).reason is Reason.BACKEND_ERROR


async def test_an_openai_endpoint_with_a_query_keeps_it(store: Store, outbound: Outbound) -> None:
    # Breaks if /chat/completions is added after the query: an endpoint such
    # as Azure's (`...?api-version=2024-06-01`) was called at a path that
    # does not exist, and every message was a backend_error.
    async with FakeLLM() as llm:
        llm.default = answer("Here.")
        for endpoint in (f"{llm.base_url}?api-version=2024-06-01",
                         f"{llm.base_url}/chat/completions/?api-version=2024-06-01"):  # fmt: skip
            g = gw(bot(f"{{type: openai, endpoint: '{endpoint}', model: m}}"), store, outbound)
            assert (await g.handle(ask(len(llm.calls) + 1))).replies == ("Here.",)
            assert (llm.calls[-1].path, llm.calls[-1].query) == (
                "/v1/chat/completions",
                "api-version=2024-06-01",
            )


async def test_openai_backend_and_a_reasoning_model(
    store: Store, outbound: Outbound, caplog: pytest.LogCaptureFixture
) -> None:
    """A reasoning model's inline <think> block never reaches the chat, and one
    cut off at max_tokens while thinking is an error that names the key, not
    a silence that looks chosen."""
    async with FakeLLM() as llm:
        cfg = bot(f"{{type: openai, endpoint: '{llm.base_url}', model: r1, max_tokens: 200}}")
        g = gw(cfg, store, outbound)
        llm.default = reasoning("Hi there!", thinking_tokens=100)
        assert (await g.handle(ask(1))).replies == ("Hi there!",)
        llm.default = reasoning("Hi there!", thinking_tokens=300)
        d = await g.handle(ask(2))
        assert (d.action, d.reason) == (Action.DROP, Reason.BACKEND_ERROR)
        assert "cut off at max_tokens=200 before any answer" in caplog.text
        llm.default = answer("I <think> so, yes.")  # not a block the answer starts with
        assert (await g.handle(ask(3))).replies == ("I <think> so, yes.",)


@pytest.mark.parametrize(
    ("name", "action", "reason", "replies"),
    [
        ("shout", Action.REPLY, None, ("HELLO",)),
        ("two", Action.REPLY, None, ("first", "second")),
        ("silent", Action.DROP, Reason.BACKEND_EMPTY, ()),
        ("sync_reply", Action.REPLY, None, ("sync ok",)),
        ("sync_with_context", Action.REPLY, None, ("sync, 0 before",)),
        ("broken", Action.DROP, Reason.BACKEND_ERROR, ()),
        ("wrong_type", Action.DROP, Reason.BACKEND_ERROR, ()),
        # argparse exits on a command it cannot read: a backend error, not the daemon's end
        ("roll", Action.DROP, Reason.BACKEND_ERROR, ()),
        ("sync_roll", Action.DROP, Reason.BACKEND_ERROR, ()),
    ],
)
async def test_python_backend(
    store: Store,
    outbound: Outbound,
    name: str,
    action: Action,
    reason: Reason | None,
    replies: tuple[str, ...],
) -> None:
    g = gw(bot(f"{{type: python, callable: 'tests.sample_backends:{name}'}}"), store, outbound)
    d = await g.handle(ask(1))
    assert (d.action, d.reason, d.replies) == (action, reason, replies)


async def test_a_sync_python_backend_blocks_no_other_chat_and_keeps_its_deadline(
    store: Store, outbound: Outbound, caplog: pytest.LogCaptureFixture
) -> None:
    """A plain function doing blocking I/O (1 s) runs in a thread: the event
    loop goes on meanwhile, and the 0.3 s deadline ends the wait."""
    cfg = bot("{type: python, callable: 'tests.sample_backends:blocking', timeout_seconds: 0.3}")
    g = gw(cfg, store, outbound)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    ticker = asyncio.create_task(tick())
    t0 = time.perf_counter()
    d = await g.handle(ask(1))
    took = time.perf_counter() - t0
    ticker.cancel()
    assert (d.action, d.reason) == (Action.DROP, Reason.BACKEND_ERROR)
    assert "no reply within 0.3 s" in caplog.text
    assert took < 0.9 and ticks >= 5
    assert sample_backends.BLOCKING_IN[-1] != threading.main_thread().name


async def test_python_backend_gets_the_context_when_it_asks(
    store: Store, outbound: Outbound
) -> None:
    cfg = bot("{type: python, callable: 'tests.sample_backends:with_context'}")
    g = gw(cfg, store, outbound)
    await g.handle(Message("c1", ROOM, Author("bob"), "before"))
    assert (await g.handle(ask(1))).replies == ("1 before: before",)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("tests.no_such_module:f", "cannot import 'tests.no_such_module'"),
        ("tests.sample_backends:nope", "has no 'nope'"),
        ("tests.sample_backends:NOT_CALLABLE", "is not callable"),
    ],
)
def test_a_bad_python_callable_stops_the_daemon_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str, problem: str
) -> None:
    cfg = tmp_path / "c.yml"
    backend = f"{{type: python, callable: '{spec}'}}"
    cfg.write_text(f"bots:\n  - {{name: p, platform: http, backend: {backend}}}\n")
    assert main(["run", "-c", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "bot p: backend:" in err and problem in err and "Traceback" not in err
