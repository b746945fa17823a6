"""The Matrix adapter end to end: mautrix's client API inside the real daemon,
against a real Synapse (tests/synapse.py), on Redis.

Decisions are awaited through the decision log lines the pipeline writes; the
room side through the homeserver's own history: nothing sleeps.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote

import pytest
from mautrix.errors import MLimitExceeded

from adapters import matrix
from adapters.matrix import ENCRYPTED_NOTICE, MatrixAdapter
from gateway.daemon import Daemon
from gateway.errors import StartupError
from gateway.model import Author, ChatRef, Message, Turn
from gateway.pipeline import Gateway
from tests import sample_backends
from tests.daemons import admitted_ids, build, forget
from tests.decisions import Decisions
from tests.redis_server import free_port
from tests.synapse import Synapse, User

pytestmark = pytest.mark.timeout(60)

Event = dict[str, Any]
MEGOLM = {"algorithm": "m.megolm.v1.aes-sha2"}
GREETER = {"type": "python", "callable": "tests.sample_backends:matrix_greeter"}


def fresh(name: str) -> str:
    """A localpart no other test of this run uses (the server is shared)."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def bot(name: str, user: User, synapse: Synapse, **policy: Any) -> dict[str, Any]:
    matrix = {"homeserver": synapse.base_url, "user_id": user.user_id, **policy.pop("matrix", {})}
    return {
        "name": name,
        "platform": "matrix",
        "token": user.access_token,
        "matrix": matrix,
        "backend": {"type": "echo"},
        "turns": {"soft_limit": 4, "hard_limit": 10},
        **policy,
    }


def chat(room: str, thread: str | None = None) -> str:
    return f"matrix:{room}" if thread is None else f"matrix:{room}:{thread}"


async def soft_of(d: Daemon, chat_key: str, name: str = "alpha") -> int:
    """The chat's soft counter once the daemon has finished what it was handling."""
    await d.inflight.idle()
    return (await d.server.admins[name].status(chat_key)).soft


async def joined_room(synapse: Synapse, owner: User, *members: User, **options: Any) -> str:
    """A room `owner` made, every member joined."""
    room = await synapse.create_room(owner, invite=members, **options)
    for member in members:
        await synapse.join(member, room)
    return room


async def history(
    synapse: Synapse,
    reader: User,
    room: str,
    found: Callable[[list[Event]], Any],
    what: str,
    timeout: float = 10,  # noqa: ASYNC109
) -> Any:
    """Poll the room's last 100 events (as `reader`) until `found(events)` is truthy."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                got = found(await synapse.messages(reader, room, limit=100))
                if got:
                    return got
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def is_notice(e: Event) -> bool:
    return bool(e.get("content", {}).get("msgtype") == "m.notice")


def relates(e: Event) -> dict[str, Any]:
    rel = e.get("content", {}).get("m.relates_to")
    return rel if isinstance(rel, dict) else {}


def in_thread(e: Event, root: str) -> bool:
    rel = relates(e)
    return rel.get("rel_type") == "m.thread" and rel.get("event_id") == root


async def notices(
    synapse: Synapse,
    user: User,
    room: str,
    n: int,
    timeout: float = 10,  # noqa: ASYNC109
) -> list[Event]:
    """The room's m.notice events once there are at least `n`."""

    def found(events: list[Event]) -> list[Event] | None:
        got = [e for e in events if is_notice(e)]
        return got if len(got) >= n else None

    result: list[Event] = await history(synapse, user, room, found, f"{n} notice(s)", timeout)
    return result


async def answer_to(synapse: Synapse, reader: User, room: str, event_id: str) -> Event:
    """The notice replying to `event_id` (a thread's fallback reply is none)."""

    def found(events: list[Event]) -> Event | None:
        for e in events:
            rel = relates(e)
            replied = rel.get("m.in_reply_to", {}).get("event_id")
            if is_notice(e) and replied == event_id and not rel.get("is_falling_back"):
                return e
        return None

    result: Event = await history(synapse, reader, room, found, f"the answer to {event_id}")
    return result


def decided(decisions: Decisions, event_id: str, user: User) -> list[dict[str, Any]]:
    return [x for x in decisions.seen if x["id"] == event_id and x["bot"] == user.user_id]


async def redact(synapse: Synapse, user: User, room: str, event_id: str) -> str:
    path = f"/_matrix/client/v3/rooms/{quote(room, safe='')}/redact/{quote(event_id, safe='')}"
    got = await synapse.call("PUT", f"{path}/{uuid.uuid4().hex}", user, json={})
    return str(got["event_id"])


async def edit(
    synapse: Synapse, user: User, room: str, event_id: str, body: str, msgtype: str = "m.text"
) -> str:
    return await synapse.send(
        user,
        room,
        "m.room.message",
        {
            "msgtype": msgtype,
            "body": f"* {body}",
            "m.new_content": {"msgtype": msgtype, "body": body},
            "m.relates_to": {"rel_type": "m.replace", "event_id": event_id},
        },
    )


# -- the first answer ------------------------------------------------------------------


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


# -- two fronted bots ------------------------------------------------------------------


async def test_two_fronted_bots_stop_at_the_soft_limit_and_a_person_resumes_them(
    synapse: Synapse, run: Callable[..., Any], decisions: Decisions
) -> None:
    """alpha and beta, each behind its own daemon on one Redis, thank each
    other's replies for ever: 4 replies (the soft limit), one warning,
    silence. Joins, leaves and a topic change neither count nor reset; a
    thread is a chat of its own, with its own loop and warning; a person
    at top level resumes the room and only the room."""
    alice = await synapse.register(fresh("alice"))
    ada = await synapse.register(fresh("ada"))
    alpha = await synapse.register(fresh("alpha"), displayname="Alpha")
    beta = await synapse.register(fresh("beta"), displayname="Beta Bot")
    room = await joined_room(synapse, alice, alpha, beta)
    root = await synapse.send_text(alice, room, "a thread for later")
    target = beta.user_id[1:]  # "beta-…:localhost": names nobody; the greeting adds the "@"
    policy = {"bot_messages": "mentions", "backend": GREETER}

    async def loop_ends(n: int) -> list[Event]:
        """The room's notices once there are `n`, the n-th (a warning) seen by beta."""
        sent = await notices(synapse, alice, room, n)
        await decisions.wait(sent[n - 1]["event_id"], beta.user_id)
        await da.inflight.idle()
        await db.inflight.idle()
        return [e for e in await synapse.messages(alice, room, limit=100) if is_notice(e)]

    async with (
        run(bot("alpha", alpha, synapse, **policy)) as da,
        run(bot("beta", beta, synapse, **policy)) as db,
    ):
        asked = await synapse.send_text(
            alice, room, f"Alpha, please greet {target}", mentions=[alpha]
        )
        sent = await loop_ends(5)
        assert len(sent) == 5
        assert [e["sender"] for e in sent] == [alpha.user_id, beta.user_id] * 2 + [alpha.user_id]
        assert [e["content"]["body"] for e in sent[:4]] == [
            f"hello {beta.user_id}!",
            "thank you!",
            "thank you!",
            "thank you!",
        ]
        # each reply answers the message before it, mentioning its author only
        for e, answered, author in zip(
            sent[:4],
            [asked] + [e["event_id"] for e in sent[:3]],
            [alice, alpha, beta, alpha],
            strict=True,
        ):
            assert relates(e) == {"m.in_reply_to": {"event_id": answered}}
            assert e["content"]["m.mentions"] == {"user_ids": [author.user_id]}
        warning = sent[4]["content"]
        assert "Bot turn limit reached (4/4)" in warning["body"]
        assert "m.relates_to" not in warning and warning["m.mentions"] == {}
        # each bot counted the other's replies once: beta's 4th was the 4th turn
        seen = await decisions.wait(sent[3]["event_id"], alpha.user_id)
        assert (seen["action"], seen["reason"], seen["soft"]) == ("warn", "turn_soft_limit", 4)
        assert (await decisions.wait(sent[4]["event_id"], beta.user_id))["soft"] == 5
        assert await soft_of(da, chat(room)) == 5

        # someone joins and leaves, the topic changes: no count, no reset
        await synapse.invite(alice, room, ada)
        await synapse.join(ada, room)
        await synapse.leave(ada, room)
        topic = await synapse.set_state(alice, room, "m.room.topic", {"topic": "bots"})
        changes = [
            e["event_id"]
            for e in await synapse.messages(alice, room, limit=100)
            if e["type"] == "m.room.member" and e["state_key"] == ada.user_id
        ]
        assert len(changes) == 3  # invited, joined, left
        for event_id in (*changes, topic):
            for b in (alpha, beta):
                seen = await decisions.wait(event_id, b.user_id)
                assert (seen["reason"], seen["turn"], seen["soft"]) == ("system_message", "none", 5)
        assert await soft_of(da, chat(room)) == 5

        # a thread is its own chat: its own loop, its own warning; the room stays stopped
        thread = chat(room, root)
        started = await synapse.send_text(
            alice, room, f"Alpha, greet {target} in here", mentions=[alpha], thread_root=root
        )
        seen = await decisions.wait(started, alpha.user_id)
        assert (seen["chat"], seen["turn"], seen["action"]) == (thread, "reset", "reply")
        everything = await loop_ends(10)
        threaded = [e for e in everything if in_thread(e, root)]
        assert len(everything) == 10 and len(threaded) == 5
        assert "Bot turn limit reached (4/4)" in threaded[4]["content"]["body"]
        assert [e["sender"] for e in threaded] == [e["sender"] for e in sent]
        assert (await soft_of(da, chat(room)), await soft_of(da, thread)) == (5, 5)

        # a person at top level resumes the room; the thread stays where it was
        again = await synapse.send_text(
            alice, room, f"Alpha, carry on: greet {target}", mentions=[alpha]
        )
        resumed = await decisions.wait(again, alpha.user_id)
        assert (resumed["chat"], resumed["turn"], resumed["action"]) == (
            chat(room),
            "reset",
            "reply",
        )
        everything = await loop_ends(15)
        assert len(everything) == 15
        top = [e for e in everything if not in_thread(e, root)]
        assert "Bot turn limit reached (4/4)" in top[-1]["content"]["body"]
        assert (await soft_of(da, chat(room)), await soft_of(da, thread)) == (5, 5)


# -- bots Matrix does not flag ---------------------------------------------------------


async def test_a_known_bot_posting_text_is_stopped_at_the_soft_limit_with_one_warning(
    synapse: Synapse, run: Callable[..., Any], decisions: Decisions
) -> None:
    """chatty is an ordinary account posting m.text, listed in known_bots:
    its messages are bot turns, and its loop with alpha stops at the soft
    limit with one warning, as two fronted bots' does."""
    alice = await synapse.register(fresh("alice"))
    chatty = await synapse.register(fresh("chatty"), displayname="Chatty")
    alpha = await synapse.register(fresh("alpha"), displayname="Alpha")
    room = await joined_room(synapse, alice, alpha, chatty)
    config = bot("alpha", alpha, synapse, bot_messages="mentions", known_bots=[chatty.user_id])
    async with run(config) as d:
        said = await synapse.send_text(alice, room, "Alpha, talk to chatty", mentions=[alpha])
        seen = await decisions.wait(said, alpha.user_id)
        assert (seen["turn"], seen["action"]) == ("reset", "reply")
        got = []
        for n in range(1, 4):  # chatty answers alpha's every message, at once
            mine = [
                e for e in await notices(synapse, alice, room, n) if e["sender"] == alpha.user_id
            ]
            said = await synapse.send_text(
                chatty, room, f"chatty says {n}", reply_to=mine[-1]["event_id"]
            )
            seen = await decisions.wait(said, alpha.user_id)
            got.append((seen["turn"], seen["soft"], seen["action"], seen["reason"]))
        assert got == [
            ("ok", 2, "reply", None),
            ("soft_limit", 4, "warn", "turn_soft_limit"),
            ("throttled", 6, "drop", "turn_throttled"),
        ]
        assert await soft_of(d, chat(room)) == 6
        mine = [
            e
            for e in await synapse.messages(alice, room, limit=100)
            if e["sender"] == alpha.user_id and is_notice(e)
        ]
        assert len(mine) == 3
        assert "Bot turn limit reached (4/4)" in mine[2]["content"]["body"]


async def test_an_unflagged_bot_in_a_dm_is_stopped_by_the_machine_pace_backstop(
    synapse: Synapse, run: Callable[..., Any], decisions: Decisions
) -> None:
    """Without known_bots, chatty's m.text is a person's: each message resets
    the counters, so the soft limit never comes, and in a DM no rate cap
    applies. What stops it is machine pace: alpha answered it 11 times (its
    first message and 10 answers back, each within 2 s of alpha's reply);
    the 12th is not answered."""
    chatty = await synapse.register(fresh("chatty"))
    alpha = await synapse.register(fresh("alpha"), displayname="Alpha")
    dm = await joined_room(synapse, chatty, alpha, is_direct=True)
    async with run(bot("alpha", alpha, synapse)):
        said = await synapse.send_text(chatty, dm, "hi")
        got = []
        for n in range(12):
            seen = await decisions.wait(said, alpha.user_id)
            got.append((seen["turn"], seen["action"], seen["reason"]))
            if seen["action"] != "reply":
                break
            answer = await answer_to(synapse, chatty, dm, said)
            said = await synapse.send_text(
                chatty, dm, f"and then? {n}", reply_to=answer["event_id"]
            )
        assert got == [("reset", "reply", None)] * 11 + [("reset", "drop", "machine_pace")]
        assert len(decided(decisions, said, alpha)) == 1
        mine = [e for e in await synapse.messages(chatty, dm, limit=100) if is_notice(e)]
        assert len(mine) == 11


# -- restarts --------------------------------------------------------------------------


async def test_a_restart_answers_what_came_while_down_and_nothing_twice(
    synapse: Synapse, redis_url: str, key_prefix: str, decisions: Decisions
) -> None:
    """The daemon stops mid-conversation; messages come while it is down (in
    a room and in a DM); a new daemon on the same store answers each of them
    once, from the saved sync position, and none of those answered before.
    It knows the rooms as the first did: the DM is a DM, and the encrypted
    room, refused once, is not refused again."""
    alice = await synapse.register(fresh("alice"))
    bob = await synapse.register(fresh("bob"))
    alpha = await synapse.register(fresh("alpha"), displayname="Alpha")
    room = await joined_room(synapse, alice, alpha, bob)
    dm = await joined_room(synapse, alice, alpha, is_direct=True)
    sealed = await joined_room(synapse, alice, alpha, bob)
    await synapse.set_state(alice, sealed, "m.room.encryption", MEGOLM)
    config = bot("alpha", alpha, synapse)
    first = build(redis_url, key_prefix, config)
    started: list[Daemon] = []  # what the finally stops
    try:
        await first.start()
        started.append(first)
        await notices(synapse, alice, sealed, 1)  # refused, once
        before = [
            (room, await synapse.send_text(alice, room, "Alpha: before", mentions=[alpha])),
            (dm, await synapse.send_text(alice, dm, "before, in the DM")),
        ]
        for where, asked in before:
            answer = await answer_to(synapse, alice, where, asked)
            echo = await decisions.wait(answer["event_id"], alpha.user_id)
            assert echo["reason"] == "own_message"
        await first.inflight.idle()
        started.remove(first)
        await first.stop()

        away = [
            (room, await synapse.send_text(alice, room, "Alpha: while away 1", mentions=[alpha])),
            (room, await synapse.send_text(bob, room, "just chatter")),
            (dm, await synapse.send_text(alice, dm, "while away, in the DM")),
            (room, await synapse.send_text(bob, room, "Alpha: while away 2", mentions=[alpha])),
        ]
        second = build(redis_url, key_prefix, config)
        await second.start()
        started.append(second)
        for where, asked in away:
            seen = await decisions.wait(asked, alpha.user_id)
            want = "not_addressed" if asked == away[1][1] else None
            assert seen["reason"] == want, seen
            if want is None:
                await answer_to(synapse, alice, where, asked)
        # once the new daemon has handled alpha's latest reply, all before it is done
        last = await answer_to(synapse, alice, room, away[3][1])
        await decisions.wait(last["event_id"], alpha.user_id)
        await second.inflight.idle()
        for _, asked in before + away:
            assert len(decided(decisions, asked, alpha)) == 1, asked
        for where, n in ((room, 3), (dm, 2)):
            answers = [e for e in await synapse.messages(alice, where, limit=100) if is_notice(e)]
            replied = [relates(e)["m.in_reply_to"]["event_id"] for e in answers]
            assert len(answers) == n and len(set(replied)) == n
        # the encrypted room was refused before: not again
        assert len([e for e in await synapse.messages(alice, sealed) if is_notice(e)]) == 1
    finally:
        for d in started:
            await d.stop()
        await forget(redis_url, key_prefix)


async def test_a_failed_start_does_not_make_the_next_one_answer_the_backlog(
    synapse: Synapse, redis_url: str, key_prefix: str, decisions: Decisions
) -> None:
    """A start that fails (the homeserver unreachable) saves no sync
    position: the next start, on the same store, begins from now."""
    alice = await synapse.register(fresh("alice"))
    alpha = await synapse.register(fresh("alpha"), displayname="Alpha")
    room = await joined_room(synapse, alice, alpha)
    old = await synapse.send_text(alice, room, "Alpha: an old question", mentions=[alpha])
    unreachable = bot(
        "alpha", alpha, synapse, matrix={"homeserver": f"http://127.0.0.1:{free_port()}"}
    )
    config = bot("alpha", alpha, synapse)
    d = build(redis_url, key_prefix, config)
    try:
        with pytest.raises(StartupError, match="cannot reach the homeserver"):
            await build(redis_url, key_prefix, unreachable).start()
        await d.start()
        new = await synapse.send_text(alice, room, "Alpha: a new one", mentions=[alpha])
        await answer_to(synapse, alice, room, new)
        await d.inflight.idle()
        assert decided(decisions, old, alpha) == []
        assert len([e for e in await synapse.messages(alice, room) if is_notice(e)]) == 1
    finally:
        await d.stop()
        await forget(redis_url, key_prefix)


# -- admin commands --------------------------------------------------------------------


async def test_bouncer_for_power_level_50_the_creator_and_configured_ids_only(
    synapse: Synapse, run: Callable[..., Any], decisions: Decisions
) -> None:
    owner = await synapse.register(fresh("owner"))  # the creator (room version 12)
    mod = await synapse.register(fresh("mod"))
    alice = await synapse.register(fresh("alice"))
    ada = await synapse.register(fresh("ada"))
    chatty = await synapse.register(fresh("chatty"))
    alpha = await synapse.register(fresh("alpha"), displayname="Alpha")
    room = await joined_room(synapse, owner, alpha, mod, alice, ada, chatty)
    await synapse.set_power_level(owner, room, mod, 50)
    await synapse.set_power_level(owner, room, ada, 49)
    create = await synapse.state(owner, room, "m.room.create")
    levels = await synapse.power_levels(owner, room)
    # room version 12: the creator's power is not in power_levels, and is unbounded
    assert create.get("room_version") == "12" and owner.user_id not in levels["users"]
    key = chat(room)

    async def bouncer(user: User, text: str) -> str:
        said = await synapse.send_text(user, room, text)
        answer = await answer_to(synapse, owner, room, said)
        assert answer["sender"] == alpha.user_id
        assert answer["content"]["m.mentions"] == {"user_ids": [user.user_id]}
        body: str = answer["content"]["body"]
        return body

    refusal = "Only room members with power level 50 or more and botbouncer admins"
    async with run(bot("alpha", alpha, synapse, admins={"user_ids": [ada.user_id]})) as d:
        admin = d.server.admins["alpha"]
        for i in range(3):
            said = await synapse.send_text(chatty, room, f"bot chatter {i}", msgtype="m.notice")
            await decisions.wait(said, alpha.user_id)
        # a member (power level 0): refused, nothing changed, no reset either
        for text in ("!bouncer reset", "!bouncer pause", "!bouncer limits soft=2", "!bouncer"):
            assert (await bouncer(alice, text)).startswith(refusal)
        status = await admin.status(key)
        assert (status.soft, status.paused, status.overrides.soft_limit) == (3, False, None)
        # power level 50
        assert (await bouncer(mod, "!bouncer reset")).startswith("Reset")
        assert await soft_of(d, key) == 0
        # the creator, at no power level in power_levels
        shown = await bouncer(owner, "!bouncer limits soft=5 hard=7")
        assert "0/5 soft, 0/7 hard" in shown
        assert (await admin.status(key)).limits.soft_limit == 5
        # a configured id (at power level 49)
        assert (await bouncer(ada, "!bouncer pause")).startswith("Paused")
        assert (await admin.status(key)).paused
        assert (await bouncer(ada, "!BOUNCER resume")).startswith("Resumed")
        assert (await bouncer(mod, "!bouncer")).startswith(f"Chat {key}: active")
        why = await bouncer(mod, "!bouncer why 3")
        assert why.count("\n") == 2 and "bot_ignored" in why
        assert (await bouncer(mod, "!bouncer limits soft=zero")).startswith("Not done:")
        # every answer was filed as an aside: no turn, no reset, nothing answered
        assert await soft_of(d, key) == 0
        for i in range(2):
            said = await synapse.send_text(chatty, room, f"more chatter {i}", msgtype="m.notice")
            seen = await decisions.wait(said, alpha.user_id)
            assert (seen["soft"], seen["reason"]) == (i + 1, "bot_ignored")
        mine = [
            e
            for e in await synapse.messages(owner, room, limit=100)
            if e["sender"] == alpha.user_id and is_notice(e)
        ]
        assert len(mine) == 11
        # another bot on this store that sees an answer finds it filed: no turn
        gateway = d.gateways["alpha"]
        other = Gateway(gateway.bot, gateway.store, bot_id=fresh("@other") + ":localhost")
        for e in mine:
            msg = Message(
                e["event_id"],
                ChatRef("matrix", room),
                Author(alpha.user_id, "", True),
                e["content"]["body"],
            )
            assert (await other.handle(msg)).turn is Turn.NONE, e
        assert await soft_of(d, key) == 2


# -- invites ---------------------------------------------------------------------------


async def test_a_command_is_run_and_answered_once_by_replicas_of_one_bot(
    synapse: Synapse, run: Callable[..., Any], decisions: Decisions
) -> None:
    """Two daemons for one account (replicas) both sync `!bouncer pause` and
    run it (pausing twice is pausing): the homeserver posts one answer, as
    both send it under one transaction id."""
    owner = await synapse.register(fresh("owner"))
    alpha = await synapse.register(fresh("alpha"), displayname="Alpha")
    room = await joined_room(synapse, owner, alpha)
    config = bot("alpha", alpha, synapse)
    async with run(config) as one, run(config) as two:
        said = await synapse.send_text(owner, room, "!bouncer pause")
        await answer_to(synapse, owner, room, said)
        await one.inflight.idle()
        await two.inflight.idle()
        assert decided(decisions, said, alpha) == []  # a command is no conversation message
        answers = [e for e in await synapse.messages(owner, room, limit=100) if is_notice(e)]
        assert len(answers) == 1 and answers[0]["content"]["body"].startswith("Paused")
        assert (await one.server.admins["alpha"].status(chat(room))).paused


async def test_invites_are_taken_from_auto_join_only(
    synapse: Synapse, run: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="botbouncer.matrix")
    ada = await synapse.register(fresh("ada"))
    bob = await synapse.register(fresh("bob"))
    alpha = await synapse.register(fresh("alpha"))
    beta = await synapse.register(fresh("beta"))
    early = await synapse.create_room(ada, invite=[alpha])  # before the daemon starts

    async def membership(inviter: User, room: str, user: User, want: str) -> None:
        async def now() -> str:
            got = await synapse.state(inviter, room, "m.room.member", user.user_id)
            return str(got["membership"])

        async with asyncio.timeout(10):
            while (seen := await now()) != want:
                assert seen == "invite", seen
                await asyncio.sleep(0.05)

    alpha_cfg = bot("alpha", alpha, synapse, matrix={"auto_join": [ada.user_id]})
    beta_cfg = bot("beta", beta, synapse, matrix={"auto_join": ["localhost"]})  # a server
    async with run(alpha_cfg, beta_cfg):
        await membership(ada, early, alpha, "join")
        by_ada = await synapse.create_room(ada, invite=[alpha])
        by_bob = await synapse.create_room(bob, invite=[alpha, beta])
        await membership(ada, by_ada, alpha, "join")
        await membership(bob, by_bob, alpha, "leave")  # declined
        await membership(bob, by_bob, beta, "join")  # bob is on localhost
    lines = [r.getMessage() for r in caplog.records]
    assert (
        f"bot alpha: declined the invite to {by_bob} from {bob.user_id}: not in "
        "matrix.auto_join" in lines
    )
    assert f"bot alpha: joined {by_ada}, invited by {ada.user_id}" in lines


# -- encrypted rooms -------------------------------------------------------------------


async def test_an_encrypted_room_is_refused_visibly_once(
    synapse: Synapse,
    run: Callable[..., Any],
    decisions: Decisions,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A room encrypted before the start and one encrypted while alpha is in
    it: a warning line and one notice each; encrypted events and the rest of
    the room are not taken."""
    caplog.set_level(logging.INFO, logger="botbouncer.matrix")
    alice = await synapse.register(fresh("alice"))
    alpha = await synapse.register(fresh("alpha"), displayname="Alpha")
    before = await joined_room(synapse, alice, alpha)
    await synapse.set_state(alice, before, "m.room.encryption", MEGOLM)
    later = await joined_room(synapse, alice, alpha)
    plain = await joined_room(synapse, alice, alpha)
    async with run(bot("alpha", alpha, synapse)):
        [refused] = await notices(synapse, alice, before, 1)
        await synapse.set_state(alice, later, "m.room.encryption", MEGOLM)
        [refused_later] = await notices(synapse, alice, later, 1)
        for e in (refused, refused_later):
            assert e["sender"] == alpha.user_id
            assert e["content"] == {
                "msgtype": "m.notice",
                "body": ENCRYPTED_NOTICE,
                "m.mentions": {},
            }
        ciphertext = {
            **MEGOLM,
            "ciphertext": "AwgAEnB4om",
            "sender_key": "c2VuZGVy",
            "session_id": "c2Vzc2lvbg",
            "device_id": alice.device_id,
        }
        ignored = [
            await synapse.send(alice, later, "m.room.encrypted", ciphertext),
            await synapse.send_text(alice, later, "Alpha, in plain text?", mentions=[alpha]),
            await synapse.set_state(alice, later, "m.room.topic", {"topic": "secrets"}),
        ]
        # the sync stream is in order: once this is decided, so would those be
        marker = await synapse.send_text(alice, plain, "Alpha: and here?", mentions=[alpha])
        await decisions.wait(marker, alpha.user_id)
        await answer_to(synapse, alice, plain, marker)
        for event_id in ignored:
            assert decided(decisions, event_id, alpha) == []
        for room in (before, later):
            assert (
                len([e for e in await synapse.messages(alice, room, limit=100) if is_notice(e)])
                == 1
            )
    warned = [r for r in caplog.records if "end-to-end encrypted" in r.getMessage()]
    assert [(r.levelno, before in r.getMessage()) for r in warned] == [
        (logging.WARNING, True),
        (logging.WARNING, False),
    ]
    assert later in warned[1].getMessage()


# -- what is a turn, who is addressed, what is sent ------------------------------------


async def test_edits_redactions_and_reactions_are_not_turns(
    synapse: Synapse,
    run: Callable[..., Any],
    decisions: Decisions,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="botbouncer.matrix")
    alice = await synapse.register(fresh("alice"))
    chatty = await synapse.register(fresh("chatty"))
    alpha = await synapse.register(fresh("alpha"), displayname="Alpha")
    room = await joined_room(synapse, alice, alpha, chatty)
    async with run(bot("alpha", alpha, synapse)) as d:
        said = await synapse.send_text(alice, room, "hello")
        assert (await decisions.wait(said, alpha.user_id))["turn"] == "reset"
        chatter = []
        for i in range(2):
            chatter.append(
                await synapse.send_text(chatty, room, f"bot chatter {i}", msgtype="m.notice")
            )
            seen = await decisions.wait(chatter[-1], alpha.user_id)
            assert (seen["turn"], seen["soft"]) == ("ok", i + 1)
        others = [
            await edit(synapse, alice, room, said, "hello, edited"),  # a person's edit
            await edit(synapse, chatty, room, chatter[1], "edited", "m.notice"),  # a bot's
            await redact(synapse, chatty, room, chatter[0]),
            await synapse.send(
                alice,
                room,
                "m.reaction",
                {"m.relates_to": {"rel_type": "m.annotation", "event_id": chatter[1], "key": "👍"}},
            ),
            await edit(synapse, alice, room, said, "Alpha, hello"),  # naming alpha, even
        ]
        last = await synapse.send_text(chatty, room, "bot chatter 3", msgtype="m.notice")
        seen = await decisions.wait(last, alpha.user_id)
        assert (seen["turn"], seen["soft"]) == ("ok", 3)  # nothing reset, nothing counted
        assert await soft_of(d, chat(room)) == 3
        for event_id in others:
            assert decided(decisions, event_id, alpha) == []
        for event_id in (said, *chatter):
            assert len(decided(decisions, event_id, alpha)) == 1
        assert [
            e
            for e in await synapse.messages(alice, room, limit=100)
            if is_notice(e) and e["sender"] == alpha.user_id
        ] == []
    # not "could not read event": an edit is no message at all, not an odd one
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_dm_is_always_addressed_while_it_has_two_members(
    synapse: Synapse, run: Callable[..., Any], decisions: Decisions
) -> None:
    alice = await synapse.register(fresh("alice"))
    bob = await synapse.register(fresh("bob"))
    alpha = await synapse.register(fresh("alpha"), displayname="Alpha")
    dm = await joined_room(synapse, alice, alpha, is_direct=True)
    async with run(bot("alpha", alpha, synapse)):
        said = await synapse.send_text(alice, dm, "hi, no mention")
        seen = await decisions.wait(said, alpha.user_id)
        assert (seen["chat"], seen["action"], seen["turn"]) == (chat(dm), "reply", "reset")
        answer = await answer_to(synapse, alice, dm, said)
        assert answer["content"]["body"] == "hi, no mention"
        # a third member joins: a group now, where a mention is needed
        await synapse.invite(alice, dm, bob)
        await synapse.join(bob, dm)
        quiet = await synapse.send_text(alice, dm, "and now?")
        seen = await decisions.wait(quiet, alpha.user_id)
        assert (seen["action"], seen["reason"]) == ("drop", "not_addressed")


async def test_addressing_the_reply_and_its_echo_counted_once(
    synapse: Synapse, run: Callable[..., Any], decisions: Decisions
) -> None:
    """A mention is answered with an m.notice replying to it that mentions
    its author only; the reply comes back through /sync and is decided
    own_message (at DEBUG) without a store call, counted once. The bot's id
    or display name in the text, or a reply to its message, address it; a
    name inside a word, another's mention, plain chatter do not. In a thread
    the answer is in the thread."""
    alice = await synapse.register(fresh("alice"))
    bob = await synapse.register(fresh("bob"))
    alpha = await synapse.register(fresh("alpha"), displayname="Alpha")
    room = await joined_room(synapse, alice, alpha, bob)
    async with run(bot("alpha", alpha, synapse)) as d:
        admitted = admitted_ids(d)
        asked = await synapse.send_text(
            alice, room, "hello @room, Alpha here?", mentions=[alpha], mention_room=True
        )
        seen = await decisions.wait(asked, alpha.user_id)
        assert (seen["chat"], seen["action"], seen["turn"]) == (chat(room), "reply", "reset")
        reply = await answer_to(synapse, alice, room, asked)
        assert reply["sender"] == alpha.user_id
        assert reply["content"] == {
            "msgtype": "m.notice",
            "body": "hello @room, Alpha here?",
            "m.mentions": {"user_ids": [alice.user_id]},  # not the room: nobody else notified
            "m.relates_to": {"m.in_reply_to": {"event_id": asked}},
        }
        echo = await decisions.wait(reply["event_id"], alpha.user_id)
        assert (echo["action"], echo["reason"], echo["soft"]) == ("drop", "own_message", 1)
        assert decisions.logged_at(reply["event_id"], alpha.user_id) == logging.DEBUG
        assert await soft_of(d, chat(room)) == 1
        assert admitted == [asked]  # the echo cost no store call
        assert len(decided(decisions, reply["event_id"], alpha)) == 1

        async def decision(user: User, text: str, **how: Any) -> tuple[str, str | None]:
            said = await synapse.send_text(user, room, text, **how)
            seen = await decisions.wait(said, alpha.user_id)
            return seen["action"], seen["reason"]

        # no m.mentions at all (an older client): the text names alpha
        assert await decision(bob, f"{alpha.user_id}: are you there?") == ("reply", None)
        assert await decision(bob, "alpha, are you there?") == ("reply", None)
        assert await decision(bob, "thanks", reply_to=reply["event_id"]) == ("reply", None)
        quiet = ("drop", "not_addressed")
        assert await decision(bob, "alphabet soup") == quiet
        assert await decision(bob, "Alpha, you?", mentions=[alice]) == ("reply", None)
        assert await decision(bob, "hey alice", mentions=[alice]) == quiet
        assert await decision(bob, "just chatting", reply_to=asked) == quiet

        # in a thread: the answer goes to the thread, replying to the question
        root = await synapse.send_text(alice, room, "a thread")
        inside = await synapse.send_text(
            bob, room, "Alpha: in here?", mentions=[alpha], thread_root=root
        )
        seen = await decisions.wait(inside, alpha.user_id)
        assert (seen["chat"], seen["action"]) == (chat(room, root), "reply")
        answer = await answer_to(synapse, alice, room, inside)
        assert relates(answer) == {
            "rel_type": "m.thread",
            "event_id": root,
            "m.in_reply_to": {"event_id": inside},
        }
        assert answer["content"]["m.mentions"] == {"user_ids": [bob.user_id]}
        assert await soft_of(d, chat(room, root)) == 1
        # a message in the thread that falls back to alpha's answer replies to it
        follow = await synapse.send_text(
            alice, room, "and?", thread_root=root, reply_to=answer["event_id"]
        )
        assert (await decisions.wait(follow, alpha.user_id))["action"] == "reply"


# -- sending ---------------------------------------------------------------------------


async def test_a_rate_limited_send_is_retried_under_its_transaction_id(
    synapse: Synapse, run: Callable[..., Any], decisions: Decisions
) -> None:
    """alpha may send one event a second (a per-user override, its join
    counted too): the pieces of a two-piece answer meet M_LIMIT_EXCEEDED,
    are tried again a second later under the same transaction id, and each
    is posted once."""
    admin = await synapse.register(fresh("admin"), admin=True)
    alice = await synapse.register(fresh("alice"))
    alpha = await synapse.register(fresh("alpha"), displayname="Alpha")
    room = await joined_room(synapse, alice, alpha)
    await synapse.call(
        "POST",
        f"/_synapse/admin/v1/users/{quote(alpha.user_id)}/override_ratelimit",
        admin,
        json={"messages_per_second": 1, "burst_count": 1},
    )
    backend = {"type": "python", "callable": "tests.sample_backends:two"}
    async with run(bot("alpha", alpha, synapse, backend=backend)) as d:
        (adapter,) = d.adapters
        assert isinstance(adapter, MatrixAdapter) and adapter.api is not None
        tries: list[tuple[str, str]] = []  # (transaction id, what came of it)
        send = adapter.api.send_message_event

        async def spy(*args: Any, **kwargs: Any) -> Any:
            try:
                got = await send(*args, **kwargs)
            except Exception as exc:
                tries.append((kwargs["txn_id"], type(exc).__name__))
                raise
            tries.append((kwargs["txn_id"], "sent"))
            return got

        adapter.api.send_message_event = spy  # type: ignore[method-assign]
        asked = await synapse.send_text(alice, room, "Alpha: two things", mentions=[alpha])
        await decisions.wait(asked, alpha.user_id)
        both = await notices(synapse, alice, room, 2)
        await d.inflight.idle()
        assert [e["content"]["body"] for e in both] == ["first", "second"]
        sent = [txn for txn, what in tries if what == "sent"]
        limited = [txn for txn, what in tries if what != "sent"]
        assert len(sent) == len(set(sent)) == 2
        assert limited and set(limited) <= set(sent)  # tried again under the same id
        assert {what for _, what in tries} == {"sent", "MLimitExceeded"}
        # the homeserver tells the sender which transaction an event came from
        mine = [e for e in await synapse.messages(alpha, room, limit=100) if is_notice(e)]
        assert [e["unsigned"]["transaction_id"] for e in mine] == sent
        assert await soft_of(d, chat(room)) == 2


async def test_a_rate_limit_is_waited_out_for_a_time_not_a_count_of_tries(
    synapse: Synapse,
    run: Callable[..., Any],
    decisions: Decisions,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Breaks if a rate-limited send gives up after three tries: under
    # Synapse's default limit (a message every 5 s past a burst of 10) the
    # replies to a restart's backlog waited 1 + 2 + 4 s and were lost. Here
    # the homeserver refuses the first six tries (M_LIMIT_EXCEEDED, as
    # mautrix raises it), and the waits are scaled down.
    monkeypatch.setattr(matrix, "SEND_FIRST_WAIT", 0.01)
    monkeypatch.setattr(matrix, "SEND_MAX_WAIT", 0.05)
    monkeypatch.setattr(matrix, "SEND_LIMIT_SECONDS", 5.0)
    alice = await synapse.register(fresh("alice"))
    alpha = await synapse.register(fresh("alpha"), displayname="Alpha")
    room = await joined_room(synapse, alice, alpha)
    async with run(bot("alpha", alpha, synapse)) as d:
        (adapter,) = d.adapters
        assert isinstance(adapter, MatrixAdapter) and adapter.api is not None
        send, refusals = adapter.api.send_message_event, iter(range(6))

        async def limited(*args: Any, **kwargs: Any) -> Any:
            if next(refusals, None) is not None:
                raise MLimitExceeded(429, "Too Many Requests")
            return await send(*args, **kwargs)

        adapter.api.send_message_event = limited  # type: ignore[method-assign]
        asked = await synapse.send_text(alice, room, "Alpha: hello", mentions=[alpha])
        assert (await decisions.wait(asked, alpha.user_id))["action"] == "reply"
        [answer] = await notices(synapse, alice, room, 1)
        await d.inflight.idle()
        assert answer["content"]["body"] == "Alpha: hello"
        assert await soft_of(d, chat(room)) == 1


async def test_a_refused_send_gives_the_rate_slot_back(
    synapse: Synapse, run: Callable[..., Any], decisions: Decisions
) -> None:
    """While the backend works, the room is made read-only for alpha: the
    homeserver refuses the answer, and its rate-cap slot comes back."""
    gate = sample_backends.new_gate()
    alice = await synapse.register(fresh("alice"))
    bob = await synapse.register(fresh("bob"))
    alpha = await synapse.register(fresh("alpha"), displayname="Alpha")
    room = await joined_room(synapse, alice, alpha, bob)  # a group: the rate cap applies
    backend = {"type": "python", "callable": "tests.sample_backends:gated"}
    async with run(bot("alpha", alpha, synapse, backend=backend)) as d:
        asked = await synapse.send_text(alice, room, "Alpha: think hard", mentions=[alpha])
        async with asyncio.timeout(10):
            await sample_backends.entered().get()
        assert (await d.server.admins["alpha"].status(chat(room))).rate_used == 1
        levels = await synapse.power_levels(alice, room)
        levels.setdefault("events", {})["m.room.message"] = 50
        await synapse.set_state(alice, room, "m.room.power_levels", levels)
        gate.set()
        await d.inflight.idle()
        status = await d.server.admins["alpha"].status(chat(room))
        assert (status.rate_used, status.soft) == (0, 0)
        [entry] = await d.server.admins["alpha"].why(chat(room), 1)
        assert (entry["id"], entry["reason"]) == (asked, "backend_error")
        assert [e for e in await synapse.messages(alice, room, limit=100) if is_notice(e)] == []


# -- starting --------------------------------------------------------------------------


async def test_startup_errors_say_what_is_wrong(
    synapse: Synapse, run: Callable[..., Any], redis_url: str, key_prefix: str
) -> None:
    try:
        await startup_errors(synapse, run)
    finally:  # a daemon that did not start leaves only its store probe behind
        await forget(redis_url, key_prefix)


async def startup_errors(synapse: Synapse, run: Callable[..., Any]) -> None:
    alice = await synapse.register(fresh("alice"))
    alpha = await synapse.register(fresh("alpha"))
    cases: list[tuple[dict[str, Any], str]] = [
        (
            bot("alpha", alpha, synapse, token="syt_not_a_token"),
            "bot alpha: the homeserver refused the access token: M_UNKNOWN_TOKEN",
        ),
        (
            bot("alpha", alpha, synapse, token=alice.access_token),
            f"bot alpha: the access token is {alice.user_id}'s, not matrix.user_id {alpha.user_id}",
        ),
    ]
    gone = f"http://127.0.0.1:{free_port()}"
    cases.append(
        (
            bot("alpha", alpha, synapse, matrix={"homeserver": gone}),
            f"bot alpha: cannot reach the homeserver at {gone}",
        )
    )
    for config, problem in cases:
        with pytest.raises(StartupError) as info:
            async with run(config):
                pass
        assert str(info.value).startswith(problem), info.value
        assert alice.access_token not in str(info.value)


@asynccontextmanager
async def down_once(
    redis_url: str, key_prefix: str, config: dict[str, Any]
) -> AsyncIterator[Callable[[], Awaitable[Daemon]]]:
    """A daemon started (its sync position saved) and stopped: inside, what
    happens while it is down, then `await again()` starts a new one on the
    same store. Every daemon started is stopped at the end, the keys forgotten."""
    started: list[Daemon] = []

    async def again() -> Daemon:
        d = build(redis_url, key_prefix, config)
        await d.start()
        started.append(d)
        return d

    try:
        first = await again()
        await first.inflight.idle()
        started.remove(first)
        await first.stop()
        yield again
    finally:
        for d in started:
            await d.stop()
        await forget(redis_url, key_prefix)


async def test_a_restart_after_a_busy_while_takes_every_message_of_the_gap(
    synapse: Synapse, redis_url: str, key_prefix: str, decisions: Decisions
) -> None:
    """More came into a room while the daemon was down than one /sync shows
    (the homeserver's timeline limit, 10 by default, `limited: true`): the
    new daemon fetches the gap, so every message is decided once, in order,
    the first ones too."""
    alice = await synapse.register(fresh("alice"))
    alpha = await synapse.register(fresh("alpha"), displayname="Alpha")
    dm = await joined_room(synapse, alice, alpha, is_direct=True)
    async with down_once(redis_url, key_prefix, bot("alpha", alpha, synapse)) as again:
        away = [await synapse.send_text(alice, dm, f"while away {n}") for n in range(25)]
        second = await again()
        for asked in away:
            seen = await decisions.wait(asked, alpha.user_id)
            assert (seen["action"], seen["reason"]) == ("reply", None), seen
        await second.inflight.idle()
        assert [d["id"] for d in decisions.seen if d["id"] in away] == away
        answers = [e for e in await synapse.messages(alice, dm, limit=100) if is_notice(e)]
        assert len(answers) == len(away)


async def test_a_gap_page_the_homeserver_filtered_empty_does_not_end_the_gap(
    synapse: Synapse, redis_url: str, key_prefix: str, decisions: Decisions
) -> None:
    """A /messages page can come back empty with an `end` (every event of it
    filtered out for the reader: here a spammer alpha ignores); the spec says
    to page on until no `end`. A person's message older than such a page,
    in the gap of a restart, is still decided."""
    alice = await synapse.register(fresh("alice"))
    spam = await synapse.register(fresh("spam"))
    alpha = await synapse.register(fresh("alpha"), displayname="Alpha")
    room = await joined_room(synapse, alice, alpha, spam)
    await synapse.call(
        "PUT",
        f"/_matrix/client/v3/user/{quote(alpha.user_id)}/account_data/m.ignored_user_list",
        alpha,
        json={"ignored_users": {spam.user_id: {}}},
    )
    async with down_once(redis_url, key_prefix, bot("alpha", alpha, synapse)) as again:
        asked = await synapse.send_text(alice, room, "Alpha, are you there?", mentions=[alpha])
        for n in range(260):  # past what /sync looks through (100), and pages of /messages
            await synapse.send_text(spam, room, f"buy now {n}")
        await again()
        seen = await decisions.wait(asked, alpha.user_id)
        assert (seen["action"], seen["reason"]) == ("reply", None), seen


async def test_a_reply_fallback_is_not_read_as_the_message(
    synapse: Synapse, run: Callable[..., Any], decisions: Decisions
) -> None:
    """Clients put the replied-to message, quoted, before a reply's text (the
    reply fallback, "> <@sender> text"). The quote is not what the replier
    said: a reply to someone who named alpha does not address alpha, and a
    command after a quote is a command. A reply to alpha's message (one this
    process did not send: an earlier run's) still answers alpha."""
    alice = await synapse.register(fresh("alice"))
    bob = await synapse.register(fresh("bob"))
    alpha = await synapse.register(fresh("alpha"), displayname="Alpha")
    room = await joined_room(synapse, alice, alpha, bob)
    await synapse.set_power_level(alice, room, bob, 50)

    async def reply(user: User, to: str, quoted: Event, text: str) -> str:
        fallback = f"> <{quoted['sender']}> {quoted['content']['body']}"
        content = {
            "msgtype": "m.text",
            "body": f"{fallback}\n\n{text}",
            "m.relates_to": {"m.in_reply_to": {"event_id": to}},
        }
        return await synapse.send(user, room, "m.room.message", content)

    async with run(bot("alpha", alpha, synapse)) as d:
        asked = await synapse.send_text(alice, room, "Alpha, hello", mentions=[alpha])
        answer = await answer_to(synapse, alice, room, asked)
        [question] = [e for e in await synapse.messages(bob, room) if e["event_id"] == asked]
        said = await reply(bob, asked, question, "nice weather today")
        seen = await decisions.wait(said, alpha.user_id)
        assert (seen["action"], seen["reason"]) == ("drop", "not_addressed")
        # a command after a quote is the replier's command
        said = await reply(bob, asked, question, "!bouncer pause")
        paused = await answer_to(synapse, bob, room, said)
        assert paused["content"]["body"].startswith("Paused")
        assert decided(decisions, said, alpha) == []
        said = await reply(bob, asked, question, "!bouncer resume")
        await answer_to(synapse, bob, room, said)
        # a reply to alpha's event that this process does not remember
        (adapter,) = d.adapters
        assert isinstance(adapter, MatrixAdapter)
        adapter._own.clear()
        said = await reply(bob, answer["event_id"], answer, "and tomorrow?")
        seen = await decisions.wait(said, alpha.user_id)
        assert (seen["action"], seen["reason"]) == ("reply", None)
        again = await answer_to(synapse, bob, room, said)
        assert again["content"]["body"] == "and tomorrow?"


async def says_a_command(msg: Message) -> str:
    """A backend whose answer reads as an admin command."""
    return "!bouncer pause"


async def test_the_bots_own_message_is_no_command(
    synapse: Synapse, run: Callable[..., Any], decisions: Decisions
) -> None:
    """alpha (a moderator in the room) answers with text that reads as a
    command: its own message coming back is its echo, not `!bouncer pause`
    run with alpha's power level; nor is a notice another bot posts run."""
    alice = await synapse.register(fresh("alice"))
    helper = await synapse.register(fresh("helper"))
    alpha = await synapse.register(fresh("alpha"), displayname="Alpha")
    room = await joined_room(synapse, alice, alpha, helper)
    await synapse.set_power_level(alice, room, alpha, 50)
    await synapse.set_power_level(alice, room, helper, 50)
    backend = {"type": "python", "callable": "tests.test_matrix:says_a_command"}
    async with run(bot("alpha", alpha, synapse, backend=backend)) as d:
        asked = await synapse.send_text(alice, room, "Alpha, what do admins type?")
        answer = await answer_to(synapse, alice, room, asked)
        assert answer["content"]["body"] == "!bouncer pause"
        echo = await decisions.wait(answer["event_id"], alpha.user_id)
        assert echo["reason"] == "own_message"
        said = await synapse.send_text(helper, room, "!bouncer pause", msgtype="m.notice")
        seen = await decisions.wait(said, alpha.user_id)
        assert seen["reason"] == "bot_ignored"
        await d.inflight.idle()
        assert not (await d.server.admins["alpha"].status(chat(room))).paused
        mine = [e for e in await synapse.messages(alice, room, limit=100) if is_notice(e)]
        assert [e["event_id"] for e in mine if e["sender"] == alpha.user_id] == [answer["event_id"]]
