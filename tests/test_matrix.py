"""The Matrix adapter end to end: mautrix's client API inside the real daemon,
against a real Synapse (tests/synapse.py), on Redis.

Decisions are awaited through the decision log lines the pipeline writes; the
room side through the homeserver's own history: nothing sleeps.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests.daemons import running
from tests.decisions import Decisions
from tests.synapse import Synapse, User

pytestmark = pytest.mark.timeout(60)


def fresh(name: str) -> str:
    """A localpart no other test of this run uses (the server is shared)."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def bot(name: str, user: User, synapse: Synapse, **policy: Any) -> dict[str, Any]:
    return {
        "name": name,
        "platform": "matrix",
        "token": user.access_token,
        "matrix": {"homeserver": synapse.base_url, "user_id": user.user_id},
        "backend": {"type": "echo"},
        "turns": {"soft_limit": 4, "hard_limit": 10},
        **policy,
    }


@pytest.fixture
def run(redis_url: str, key_prefix: str) -> Callable[..., Any]:
    def start(*bots: dict[str, Any], port: int | None = None) -> Any:
        return running(redis_url, key_prefix, *bots, port=port)

    return start


async def notices(
    synapse: Synapse,
    user: User,
    room: str,
    n: int,
    timeout: float = 10,  # noqa: ASYNC109
) -> list[dict[str, Any]]:
    """The room's m.notice events once there are at least `n`."""
    async with asyncio.timeout(timeout):
        while True:
            events = await synapse.messages(user, room, limit=100)
            found = [e for e in events if e.get("content", {}).get("msgtype") == "m.notice"]
            if len(found) >= n:
                return found
            await asyncio.sleep(0.05)


async def test_a_mention_is_answered_with_a_notice_reply(
    synapse: Synapse, run: Callable[..., Any], decisions: Decisions
) -> None:
    alice = await synapse.register(fresh("alice"))
    alpha = await synapse.register(fresh("alpha"), displayname="Alpha")
    room = await synapse.create_room(alice, invite=[alpha])
    await synapse.join(alpha, room)
    await synapse.send_text(alice, room, "a third person", mentions=[])
    async with run(bot("alpha", alpha, synapse)):
        asked = await synapse.send_text(alice, room, "alpha: hello", mentions=[alpha])
        seen = await decisions.wait(asked, alpha.user_id)
        assert (seen["action"], seen["reason"]) == ("reply", None)
        [answer] = await notices(synapse, alice, room, 1)
        assert answer["content"]["body"] == "alpha: hello"
        assert answer["content"]["m.relates_to"]["m.in_reply_to"]["event_id"] == asked
