"""The reply decision through the real pipeline, against a fake LLM (docs/backends.md)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.backends import EchoBackend
from gateway.classifier import Classifier
from gateway.cli import main
from gateway.config import BotConfig, parse_config
from gateway.metrics import Metrics
from gateway.model import Action, Author, ChatKind, ChatRef, Message, Reason
from gateway.outbound import Outbound
from gateway.pipeline import Gateway
from gateway.store import Store
from tests.fakes.llm import (
    FakeLLM,
    answer,
    close,
    hang,
    malformed,
    no_choices,
    reasoning,
    slow,
    status,
)
from tests.redis_server import free_port

ROOM = ChatRef("http", "room")


def bot_config(endpoint: str, **extra: str) -> BotConfig:
    rd = {
        "enabled": "true",
        "endpoint": f"'{endpoint}'",
        "model": "gate-mini",
        "api_key": "sk-test",
        "timeout_seconds": "0.5",
    }
    rd.update({k[3:]: v for k, v in extra.items() if k.startswith("rd_")})
    # people who address the bot are never classified: the tests ask it
    # things nobody addressed to it, which it answers under respond_to: all
    extra = {"respond_to": "all", **extra}
    policy = "".join(f"    {k}: {v}\n" for k, v in extra.items() if not k.startswith("rd_"))
    text = (
        "bots:\n  - name: helper\n    platform: http\n    backend: {type: echo}\n"
        "    reply_decision: {" + ", ".join(f"{k}: {v}" for k, v in rd.items()) + "}\n" + policy
    )
    return parse_config(text).bots[0]


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as fake:
        yield fake


def gateway(cfg: BotConfig, store: Store, outbound: Outbound) -> Gateway:
    classifier = Classifier(cfg.reply_decision, cfg.name, outbound)
    return Gateway(cfg, store, EchoBackend(), classifier=classifier)


def ask(i: int, text: str = "what time is it?", chat: ChatRef = ROOM) -> Message:
    """A person's message to the room, addressed to no one."""
    return Message(f"h{i}", chat, Author("alice", "Alice"), text)


async def test_a_person_who_addresses_the_bot_is_never_classified(
    llm: FakeLLM, store: Store, outbound: Outbound
) -> None:
    """A SKIP must never silence a person who asked: a mention or a reply to
    the bot goes straight to the backend. A bot's mention is still gated."""
    llm.default = answer("SKIP")
    cfg = bot_config(llm.url, bot_messages="all")
    gw = gateway(cfg, store, outbound)
    mention = Message("p1", ROOM, Author("alice", "Alice"), "helper, time?", mentions=("helper",))
    replied = Message("p2", ROOM, Author("alice", "Alice"), "and now?", reply_to="helper")
    for msg in (mention, replied):
        d = await gw.handle(msg)
        assert (d.action, d.reason) == (Action.REPLY, None)
    assert llm.count == 0
    bot = Message("b1", ROOM, Author("other", "Other", is_bot=True), "helper?",
                  mentions=("helper",))  # fmt: skip
    d = await gw.handle(bot)
    assert (d.action, d.reason) == (Action.DROP, Reason.CLASSIFIER_SKIP)
    d = await gw.handle(ask(3))  # unaddressed, under respond_to: all: gated
    assert (d.action, d.reason) == (Action.DROP, Reason.CLASSIFIER_SKIP)
    assert llm.count == 2


async def test_skip_drops_and_releases_the_slot(
    llm: FakeLLM, store: Store, outbound: Outbound
) -> None:
    gw = gateway(bot_config(llm.url, rate_cap="{max_replies: 1}"), store, outbound)
    llm.then(answer("SKIP"))
    d = await gw.handle(ask(1))
    assert (d.action, d.reason) == (Action.DROP, Reason.CLASSIFIER_SKIP)
    d = await gw.handle(ask(2))  # the slot SKIP gave back
    assert (d.action, d.replies) == (Action.REPLY, ("what time is it?",))
    d = await gw.handle(ask(3))  # REPLY kept its slot: now capped, and not classified
    assert d.reason is Reason.RATE_CAPPED
    assert llm.count == 2
    assert [e["reason"] for e in await store.decisions(ROOM.key)][-1] == "classifier_skip"


@pytest.mark.parametrize(
    ("behaviour", "cause"),
    [
        (answer("banana"), "unclear answer 'banana'"),
        (answer(""), "unclear answer ''"),
        (hang(), "no answer within 0.5 s"),
        (status(500), "HTTP 500"),
        (malformed(), "malformed response"),
        (no_choices(), "malformed response"),
        (close(), "ServerDisconnectedError"),
    ],
    ids=["junk", "empty", "timeout", "http500", "malformed", "no-choices", "disconnect"],
)
async def test_every_failure_fails_open_and_is_logged_with_its_cause(
    llm: FakeLLM,
    store: Store,
    outbound: Outbound,
    caplog: pytest.LogCaptureFixture,
    behaviour: object,
    cause: str,
) -> None:
    gw = gateway(bot_config(llm.url), store, outbound)
    llm.then(behaviour)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="botbouncer.classifier"):
        d = await gw.handle(ask(1))
    assert d.action is Action.REPLY
    assert (cause in caplog.text and "failing open" in caplog.text) or "failed open" in caplog.text
    assert cause in caplog.text


async def test_a_refused_connection_fails_open(
    store: Store, outbound: Outbound, caplog: pytest.LogCaptureFixture
) -> None:
    gw = gateway(bot_config(f"http://127.0.0.1:{free_port()}/v1"), store, outbound)
    with caplog.at_level(logging.WARNING, logger="botbouncer.classifier"):
        d = await gw.handle(ask(1))
    assert d.action is Action.REPLY
    assert "ClientConnectorError" in caplog.text


async def test_a_call_that_cannot_even_be_made_fails_open(
    llm: FakeLLM, store: Store, outbound: Outbound, caplog: pytest.LogCaptureFixture
) -> None:
    """An api key read from a file with its newline (`${KEY}` of a mounted
    secret) makes aiohttp refuse the header with a ValueError, no LLMError:
    the message was neither answered nor decided (no log entry), and its rate
    slot and turn hold were never given back."""
    llm.default = answer("SKIP")
    gw = gateway(bot_config(llm.url, rd_api_key='"sk-test\\n"'), store, outbound)
    with caplog.at_level(logging.WARNING, logger="botbouncer.classifier"):
        d = await gw.handle(ask(1))
    assert (d.action, d.replies) == (Action.REPLY, ("what time is it?",))
    assert "failed open" in caplog.text and "ValueError" in caplog.text
    assert "sk-test" not in caplog.text and llm.count == 0


async def test_dms_empty_and_system_messages_are_not_classified(
    llm: FakeLLM, store: Store, outbound: Outbound
) -> None:
    llm.default = answer("SKIP")
    gw = gateway(bot_config(llm.url), store, outbound)
    dm = ChatRef("http", "dm", kind=ChatKind.DM)
    assert (await gw.handle(ask(1, chat=dm))).action is Action.REPLY
    assert (await gw.handle(ask(2, text="   "))).reason is Reason.BACKEND_EMPTY  # echo of nothing
    pin = Message("p", ROOM, Author("alice"), "pinned", mentions=("helper",), system=True)
    assert (await gw.handle(pin)).reason is Reason.SYSTEM_MESSAGE
    assert llm.count == 0
    # scope all: DMs are classified too, but a person's DM is addressed to the bot
    gw_all = gateway(bot_config(llm.url, rd_scope="all", bot_messages="all"), store, outbound)
    assert (await gw_all.handle(ask(3, chat=dm))).action is Action.REPLY
    assert llm.count == 0
    bot_dm = Message("b3", dm, Author("other", "Other", is_bot=True), "hi")
    assert (await gw_all.handle(bot_dm)).reason is Reason.CLASSIFIER_SKIP
    assert llm.count == 1


async def test_one_call_per_surviving_message_and_none_otherwise(
    llm: FakeLLM, store: Store, outbound: Outbound
) -> None:
    gw = gateway(bot_config(llm.url, rate_cap="{max_replies: 3}"), store, outbound)
    survivors = 0
    for i in range(12):
        kind = i % 3
        if kind == 0:  # addressed human: survives until the cap
            msg = ask(i)
        elif kind == 1:  # unaddressed human
            msg = Message(f"u{i}", ROOM, Author("bob"), "chatting")
        else:  # another bot: bot_messages off
            msg = Message(f"b{i}", ROOM, Author("otherbot", is_bot=True), "hey", ("helper",))
        before = llm.count
        d = await gw.handle(msg)
        survivors += d.action is Action.REPLY
        assert llm.count - before == (1 if d.action is Action.REPLY else 0), (i, d.reason)
    assert (survivors, llm.count) == (3, 3)


async def test_fifty_concurrent_with_a_slow_classifier_give_exactly_six_replies(
    llm: FakeLLM, stores: object, outbound: Outbound
) -> None:
    handles = await stores(3)  # type: ignore[operator]
    llm.default = slow(0.2, answer("REPLY"))
    cfg = bot_config(llm.url, rd_timeout_seconds="5")
    gws = [gateway(cfg, h, outbound) for h in handles]
    results = await asyncio.gather(*(gws[i % 3].handle(ask(i)) for i in range(50)))
    assert sum(d.action is Action.REPLY for d in results) == 6
    assert sum(d.reason is Reason.RATE_CAPPED for d in results) == 44
    assert llm.count == 6  # capped messages never reached the classifier


async def test_the_prompt_carries_identity_context_and_the_new_message(
    llm: FakeLLM, store: Store, outbound: Outbound
) -> None:
    gw = gateway(bot_config(llm.url, rd_identity="Helpy", rd_context_messages="2"), store, outbound)
    chatter = [("bob", False, "old news"), ("otherbot", True, "beep"), ("carol", False, "hi all")]
    for i, (who, bot, text) in enumerate(chatter):
        await gw.handle(Message(f"c{i}", ROOM, Author(who, who.title(), is_bot=bot), text))
    await gw.handle(ask(9, "Helpy, what's the plan?"))
    body = llm.calls[-1].body
    assert body is not None and body["model"] == "gate-mini" and body["max_tokens"] == 1024
    prompt = body["messages"][-1]["content"]
    assert 'the bot "Helpy"' in prompt
    assert "- Otherbot (bot): beep\n- Carol (human): hi all" in prompt
    assert "old news" not in prompt  # only context_messages=2
    assert "New message from Alice (human):\nHelpy, what's the plan?" in prompt
    assert llm.calls[-1].headers["authorization"] == "Bearer sk-test"


async def test_replay_calls_the_classifier_never_a_backend(
    llm: FakeLLM, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text(
        "bots:\n  - name: helper\n    platform: http\n"
        f"    backend: {{type: webhook, url: 'http://127.0.0.1:{free_port()}/never'}}\n"
        f"    reply_decision: {{enabled: true, endpoint: '{llm.url}', model: m}}\n"
        "    respond_to: all\n"
    )
    transcript = tmp_path / "t.jsonl"
    lines = [  # to the room, not to the bot: the gate decides
        {"chat": "c", "author": "alice", "text": "q1"},
        {"chat": "c", "author": "alice", "text": "q2"},
    ]
    transcript.write_text("".join(json.dumps(x) + "\n" for x in lines))
    llm.then(answer("SKIP"), answer("REPLY"))
    code = await asyncio.to_thread(main, ["replay", str(transcript), "-c", str(cfg)])
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert code == 0
    assert [(o["action"], o["reason"]) for o in out] == [
        ("drop", "classifier_skip"),
        ("reply", None),
    ]
    assert llm.count == 2


async def test_a_reasoning_model_gets_room_for_its_word_by_default(
    llm: FakeLLM, store: Store, outbound: Outbound, caplog: pytest.LogCaptureFixture
) -> None:
    """A reasoning model spends tokens before it answers: with the default
    budget its SKIP arrives (its thinking, which mentions REPLY, left out)."""
    gw = gateway(bot_config(llm.url), store, outbound)
    llm.then(reasoning("SKIP"), reasoning("REPLY"))
    d = await gw.handle(ask(1))
    assert (d.action, d.reason) == (Action.DROP, Reason.CLASSIFIER_SKIP)
    assert (await gw.handle(ask(2))).action is Action.REPLY
    assert [c.body["max_tokens"] for c in llm.calls] == [1024, 1024]
    assert "max_tokens" not in caplog.text


async def test_an_answer_cut_off_before_the_word_is_a_configuration_error(
    llm: FakeLLM, store: Store, outbound: Outbound, caplog: pytest.LogCaptureFixture
) -> None:
    """Cut off at max_tokens with nothing said, the gate fails open - and would
    for every message until the config changes: said as an error, counted."""
    metrics = Metrics()
    cfg = bot_config(llm.url, rd_max_tokens="16")
    classifier = Classifier(cfg.reply_decision, cfg.name, outbound)
    gw = Gateway(cfg, store, EchoBackend(), classifier=classifier, metrics=metrics)
    llm.default = reasoning("SKIP")
    with caplog.at_level(logging.WARNING, logger="botbouncer.classifier"):
        d = await gw.handle(ask(1))
    assert d.action is Action.REPLY
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "max_tokens (16)" in record.getMessage()
    assert "raise reply_decision.max_tokens" in record.getMessage()
    assert metrics.classifier_calls.labels("truncated")._value.get() == 1


@pytest.mark.parametrize(
    ("said", "reply"),
    [("SKIP", False), ("skip.", False), ("Answer: SKIP", False), ("REPLY - then SKIP", True),
     ("<think>should I SKIP?</think>REPLY", True), ("I'd say: reply", True),
     ("SKIPPING", True), ("", True)],
)  # fmt: skip
async def test_the_first_reply_or_skip_word_decides(
    llm: FakeLLM, store: Store, outbound: Outbound, said: str, reply: bool
) -> None:
    gw = gateway(bot_config(llm.url), store, outbound)
    llm.then(answer(said))
    assert ((await gw.handle(ask(1))).action is Action.REPLY) == reply
