"""The Synapse harness (tests/synapse.py) on a real homeserver: users, rooms,
invites, messages seen through mautrix's own sync loop, power levels."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from mautrix.client import Client
from mautrix.client.syncer import InternalEventType
from mautrix.types import EventType, MessageEvent, PowerLevelStateEventContent, RoomID, UserID

from tests.synapse import MatrixError, Synapse, User


def fresh(name: str) -> str:
    """A localpart no other test of this run uses (the server is shared)."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


@asynccontextmanager
async def mautrix_client(synapse: Synapse, user: User) -> AsyncIterator[Client]:
    """mautrix's async client on `user`'s access token, closed afterwards."""
    async with aiohttp.ClientSession() as http:
        client = Client(
            mxid=user.user_id,
            device_id=user.device_id,
            base_url=synapse.base_url,
            token=user.access_token,
            client_session=http,
        )
        try:
            yield client
        finally:
            client.stop()


async def test_invite_join_and_read(synapse: Synapse) -> None:
    alice = await synapse.register(fresh("alice"), displayname="Alice")
    bob = await synapse.register(fresh("bob"))
    assert alice.user_id == synapse.user_id(alice.localpart)
    room = await synapse.create_room(alice, invite=[bob], name="harness")

    with pytest.raises(MatrixError) as denied:  # not joined yet: no history
        await synapse.messages(bob, room)
    assert denied.value.status == 403

    await synapse.join(bob, room)
    sent = await synapse.send_text(alice, room, "hello bob", mentions=[bob])
    events = await synapse.messages(bob, room)
    members = {
        e["state_key"]: e["content"]["membership"] for e in events if e["type"] == "m.room.member"
    }
    assert members == {alice.user_id: "join", bob.user_id: "join"}
    last = events[-1]
    assert last["event_id"] == sent
    assert last["sender"] == alice.user_id
    assert last["content"] == {
        "msgtype": "m.text",
        "body": "hello bob",
        "m.mentions": {"user_ids": [bob.user_id]},
    }


async def test_message_seen_through_mautrix_sync(synapse: Synapse) -> None:
    alice = await synapse.register(fresh("alice"))
    bob = await synapse.register(fresh("bob"))
    room = await synapse.create_room(alice, invite=[bob])
    await synapse.join(bob, room)

    async with mautrix_client(synapse, bob) as client:
        assert (await client.whoami()).user_id == bob.user_id
        synced = asyncio.Event()
        seen: asyncio.Queue[MessageEvent] = asyncio.Queue()

        async def on_sync(data: object) -> None:
            synced.set()

        async def on_message(evt: MessageEvent) -> None:
            await seen.put(evt)

        client.ignore_initial_sync = True  # only what is sent from now on
        client.add_event_handler(InternalEventType.SYNC_SUCCESSFUL, on_sync)
        client.add_event_handler(EventType.ROOM_MESSAGE, on_message)
        client.start(None)
        await asyncio.wait_for(synced.wait(), 10)

        sent = await synapse.send_text(alice, room, "ping", mentions=[bob])
        evt = await asyncio.wait_for(seen.get(), 10)
        assert evt.event_id == sent
        assert evt.room_id == room
        assert evt.sender == alice.user_id
        assert evt.content.body == "ping"
        assert evt.content.msgtype.value == "m.text"

        # and bob answers with mautrix, which alice reads through the harness
        answer = await client.send_text(RoomID(room), "pong")
        sync = await synapse.sync_once(alice)
        timeline = sync["rooms"]["join"][room]["timeline"]["events"]
        assert [e["event_id"] for e in timeline][-2:] == [sent, answer]


async def test_power_levels(synapse: Synapse) -> None:
    alice = await synapse.register(fresh("alice"), admin=True)
    bob = await synapse.register(fresh("bob"))
    carol = await synapse.register(fresh("carol"))
    room = await synapse.create_room(
        alice, invite=[bob, carol], power_levels={"users": {carol.user_id: 50}}
    )
    for user in (bob, carol):
        await synapse.join(user, room)

    levels = await synapse.power_levels(bob, room)
    assert levels["users"][carol.user_id] == 50
    assert levels.get("users_default", 0) == 0
    await synapse.set_power_level(alice, room, bob, 75)

    async with mautrix_client(synapse, carol) as client:
        content = await client.get_state_event(RoomID(room), EventType.ROOM_POWER_LEVELS)
        assert isinstance(content, PowerLevelStateEventContent)
        assert content.get_user_level(UserID(bob.user_id)) == 75
        assert content.get_user_level(UserID(carol.user_id)) == 50

    with pytest.raises(MatrixError) as denied:  # carol (50) may not change power levels
        await synapse.set_power_level(carol, room, carol, 100)
    assert denied.value.status == 403


async def test_threads_and_replies_keep_their_relations(synapse: Synapse) -> None:
    alice = await synapse.register(fresh("alice"))
    room = await synapse.create_room(alice, is_direct=True)
    root = await synapse.send_text(alice, room, "root")
    in_thread = await synapse.send_text(alice, room, "in thread", thread_root=root)
    reply = await synapse.send_text(alice, room, "reply", reply_to=root, mention_room=True)
    notice = await synapse.send_text(alice, room, "beep", msgtype="m.notice")

    by_id = {e["event_id"]: e["content"] for e in await synapse.messages(alice, room)}
    assert by_id[in_thread]["m.relates_to"] == {
        "rel_type": "m.thread",
        "event_id": root,
        "is_falling_back": True,
        "m.in_reply_to": {"event_id": root},
    }
    assert by_id[reply]["m.relates_to"] == {"m.in_reply_to": {"event_id": root}}
    assert by_id[reply]["m.mentions"] == {"user_ids": [], "room": True}
    assert by_id[notice]["msgtype"] == "m.notice"


def test_a_failed_start_says_why() -> None:
    broken = Synapse(database={"name": "no-such-engine"})
    with pytest.raises(RuntimeError, match="Synapse exited") as failed:
        broken.start()
    assert "no-such-engine" in str(failed.value)  # the log's tail is quoted
    assert broken.proc is None and not broken.dir.exists()
