"""The Slack adapter end to end: slack_sdk's Socket Mode and Web API clients,
inside the real daemon, against the fake Slack of tests/fakes/slack/, on Redis.

The daemon reaches the fake only through `api_base`. Decisions are awaited
through the decision log lines the pipeline writes, the platform side through
the fake's recorded messages: nothing sleeps.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gateway.daemon import Daemon
from tests.daemons import running
from tests.decisions import Decisions
from tests.fakes.slack import FakeSlack

pytestmark = pytest.mark.timeout(60)

ALICE, MOD, OWNER = "U0ALICE", "U0MOD", "U0OWNER"
A_USER, B_USER = "U0ALPHA", "U0BETA"
CHANNEL = "C0GENERAL"


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as f:
        w = f.world
        w.add_user(ALICE, "alice")
        w.add_user(MOD, "mo", is_admin=True)
        w.add_user(OWNER, "olga")
        w.add_app("A0ALPHA", "alpha", bot_id="B0ALPHA", bot_user_id=A_USER)
        w.add_app("A0BETA", "beta", bot_id="B0BETA", bot_user_id=B_USER)
        w.add_channel(CHANNEL, "general", OWNER, ALICE, MOD, A_USER, B_USER)
        yield f


def bot(name: str, fake: FakeSlack, **policy: Any) -> dict[str, Any]:
    app = next(a for a in fake.world.apps.values() if a.name == name)
    return {
        "name": name,
        "platform": "slack",
        "token": app.bot_token,
        "api_base": fake.api_base,
        "slack": {"app_token": app.app_token},
        "backend": {"type": "echo"},
        "turns": {"soft_limit": 4, "hard_limit": 10},
        **policy,
    }


@pytest.fixture
def run(redis_url: str, key_prefix: str) -> Callable[..., Any]:
    def start(*bots: dict[str, Any], port: int | None = None) -> Any:
        return running(redis_url, key_prefix, *bots, port=port)

    return start


async def soft_of(d: Daemon, chat_key: str, name: str = "alpha") -> int:
    await d.inflight.idle()
    return (await d.server.admins[name].status(chat_key)).soft


async def test_two_bots_in_a_thread_stop_at_the_soft_limit_with_one_warning(
    fake: FakeSlack, run: Callable[..., Any], decisions: Decisions
) -> None:
    """alpha and beta, each behind its own daemon on one Redis, answer each
    other in a thread both posted in: 4 replies (the soft limit), one
    warning, silence. A person in the thread resumes them."""
    policy = {
        "bot_messages": "mentions",
        "backend": {"type": "python", "callable": "tests.sample_backends:slack_greeter"},
    }
    async with run(bot("alpha", fake, **policy)) as da, run(bot("beta", fake, **policy)):
        parent = await fake.user_says(CHANNEL, ALICE, "a thread")
        thread = f"slack:{CHANNEL}:{parent['ts']}"
        await fake.user_says(
            CHANNEL, ALICE, f"<@{A_USER}> please greet {B_USER}", thread_ts=parent["ts"]
        )
        msgs = await fake.wait_for_messages(CHANNEL, 2 + 5)
        bots = msgs[2:]
        assert [m["user"] for m in bots[:4]] == [A_USER, B_USER, A_USER, B_USER]
        assert all(m.get("thread_ts") == parent["ts"] for m in bots)
        assert bots[0]["text"] == f"hello <@{B_USER}>!"
        assert "Bot turn limit reached (4/4)" in bots[4]["text"]
        assert await soft_of(da, thread) == 5
        await da.inflight.idle()
        assert len(fake.messages(CHANNEL)) == 7
        again = await fake.user_says(
            CHANNEL, ALICE, f"<@{A_USER}> carry on, greet {B_USER}", thread_ts=parent["ts"]
        )
        resumed = await decisions.wait(again["ts"], A_USER)
        assert (resumed["turn"], resumed["action"]) == ("reset", "reply")
        await fake.wait_for_messages(CHANNEL, 10)
