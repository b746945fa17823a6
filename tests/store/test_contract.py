"""The Store contract (docs/architecture.md), on memory and on Redis alike."""

from __future__ import annotations

import asyncio

from gateway.model import Action, Reason, Turn
from gateway.store import Limits, Overrides, Store
from gateway.turns import Count
from tests.conftest import StoreFactory
from tests.store.harness import Chat

SMALL = Limits(soft_limit=3, hard_limit=5)


async def ping_pong(chat: Chat, n: int, *, bot: str = "B", peer: str = "A") -> list[Turn]:
    """n alternating bot messages (peer first) as `bot` observes them; their turns."""
    turns = []
    for i in range(n):
        res = await chat.admit(peer if i % 2 == 0 else bot, bot=bot)
        turns.append(res.turn)
    return turns


# -- turn tracking ------------------------------------------------------


async def test_twentieth_bot_message_is_soft_limit_and_later_ones_throttled(store: Store) -> None:
    chat = Chat(store)
    turns = await ping_pong(chat, 23)
    assert turns[:19] == [Turn.OK] * 19
    assert turns[19] is Turn.SOFT_LIMIT
    assert turns[20:] == [Turn.THROTTLED] * 3


async def test_hard_limit_fires_at_exactly_the_limit_then_stopped(store: Store) -> None:
    chat = Chat(store, limits=SMALL)
    turns = await ping_pong(chat, 7)
    assert turns == [Turn.OK, Turn.OK, Turn.SOFT_LIMIT, Turn.THROTTLED, Turn.HARD_LIMIT,
                     Turn.STOPPED, Turn.STOPPED]  # fmt: skip


async def test_verdict_other_than_ok_forbids_answering_a_bot(store: Store) -> None:
    chat = Chat(store, limits=SMALL)
    await ping_pong(chat, 2)
    # third bot message, from A to B: B would answer, but the soft limit is hit;
    # B has spoken, so B warns instead of answering.
    res = await chat.admit("A")
    assert (res.turn, res.action, res.reason, res.warn) == (
        Turn.SOFT_LIMIT, Action.WARN, Reason.TURN_SOFT_LIMIT, "soft")  # fmt: skip
    res = await chat.admit("A")
    assert (res.turn, res.action, res.reason) == (Turn.THROTTLED, Action.DROP,
                                                  Reason.TURN_THROTTLED)  # fmt: skip
    await chat.admit("A")  # hard limit: B warns (hard)
    res = await chat.admit("A")
    assert (res.turn, res.reason) == (Turn.STOPPED, Reason.TURN_STOPPED)


async def test_a_late_bot_message_is_not_answered_once_the_chat_is_past_a_limit(
    stores: StoreFactory,
) -> None:
    """Two conversations at once: a message counted while the chat was ok, seen
    by a bot only after other messages pushed the chat to the limit, is not
    answered - the chat's verdict now is what forbids answering a bot."""
    store_a, store_b = await stores(2)
    by_a, by_b = Chat(store_a, limits=SMALL), Chat(store_b, limits=SMALL)
    await by_a.sent("A", mid="a1")  # A's message counted when sent: 1
    await by_b.sent("B", mid="b1")  # 2
    await by_a.sent("A", mid="a2")  # 3: the chat reaches the soft limit
    late = await by_b.admit("A", bot="B", mid="a1")  # B sees a1 only now
    assert (late.turn, late.soft) == (Turn.OK, 1)  # the message's own count
    assert (late.action, late.reason) == (Action.DROP, Reason.TURN_THROTTLED)
    for _ in range(2):
        await by_a.sent("A")  # 5: past the hard limit
    late = await by_a.admit("B", bot="A", mid="b1")
    assert (late.action, late.reason) == (Action.DROP, Reason.TURN_STOPPED)
    await by_a.human()  # a person speaks: counters back to zero
    early = await by_b.admit("A", bot="C", mid="a2")  # counted at 3, seen after the reset
    assert early.reason is Reason.TURN_SOFT_LIMIT  # its own verdict still holds
    fresh = await by_b.admit("A", bot="B", mid="a9")
    assert (fresh.turn, fresh.action) == (Turn.OK, None)


async def test_plain_human_message_resets_and_the_next_twentieth_warns_again(store: Store) -> None:
    chat = Chat(store)
    for _ in range(2):
        # B speaks first, so A writes every 20th bot turn and B (not its author) warns.
        results = [await chat.admit("B" if i % 2 == 0 else "A") for i in range(20)]
        assert [r.action for r in results[:19] if r.action is Action.WARN] == []
        last = results[19]
        assert (last.turn, last.soft, last.action, last.reason, last.warn) == (
            Turn.SOFT_LIMIT, 20, Action.WARN, Reason.TURN_SOFT_LIMIT, "soft")  # fmt: skip
        res = await chat.human()
        assert (res.turn, res.soft, res.hard) == (Turn.RESET, 0, 0)


async def test_warn_once_per_threshold_per_reset(store: Store) -> None:
    chat = Chat(store, limits=SMALL)
    await chat.admit("B")  # B has spoken
    await chat.admit("A")
    res = await chat.admit("A", mid="threshold")
    assert res.action is Action.WARN
    # the same threshold message seen again by B is a duplicate, not a second warning
    again = await chat.admit("A", mid="threshold")
    assert (again.action, again.reason) == (Action.DROP, Reason.DUPLICATE)
    await chat.human()
    await chat.admit("B")
    await chat.admit("A")
    res = await chat.admit("A")
    assert (res.turn, res.action) == (Turn.SOFT_LIMIT, Action.WARN)


async def test_only_a_bot_that_spoke_since_the_reset_warns(store: Store) -> None:
    chat = Chat(store, limits=SMALL)
    await chat.admit("B")
    await chat.human()  # B's speaking is before the reset: it no longer counts
    await chat.admit("A")
    await chat.admit("C")
    res = await chat.admit("A")
    assert (res.turn, res.action, res.reason, res.warn) == (
        Turn.SOFT_LIMIT, Action.DROP, Reason.TURN_SOFT_LIMIT, None)  # fmt: skip


async def test_the_author_of_the_threshold_message_does_not_warn(store: Store) -> None:
    chat = Chat(store, limits=SMALL)
    await ping_pong(chat, 2)
    res = await chat.admit("B")  # B's own third message
    assert (res.turn, res.action, res.reason) == (Turn.SOFT_LIMIT, Action.DROP,
                                                  Reason.OWN_MESSAGE)  # fmt: skip


async def test_warning_is_claimed_by_exactly_one_of_three_bots(stores: StoreFactory) -> None:
    handles = await stores(3)
    bots = ["X", "Y", "Z"]
    chats = [Chat(h, limits=SMALL) for h in handles]
    for author in bots:  # each bot has spoken since the (implicit) start
        await chats[0].admit(author, bot="X", local=Reason.BOT_IGNORED)
    # the 4th bot turn would be past soft 3; use soft 4 for a clean threshold
    limits = Limits(soft_limit=4, hard_limit=10)
    for c in chats:
        c.limits = limits
        c.now_ms = chats[0].now_ms + 1000
    results = await asyncio.gather(
        *(c.admit("W", bot=b, mid="t4", tick=0, local=Reason.BOT_IGNORED)
          for c, b in zip(chats, bots, strict=True))
    )  # fmt: skip
    assert [r.turn for r in results] == [Turn.SOFT_LIMIT] * 3
    assert sorted(r.action.value for r in results if r.action) == ["drop", "drop", "warn"]
    assert all(r.soft == 4 for r in results)


async def test_system_and_empty_messages_never_reset(store: Store) -> None:
    chat = Chat(store)
    await ping_pong(chat, 5)
    pin = await chat.admit("alice", count=Count.NONE, author_is_bot=False,
                           local=Reason.SYSTEM_MESSAGE)  # fmt: skip
    assert (pin.turn, pin.soft, pin.reason) == (Turn.NONE, 5, Reason.SYSTEM_MESSAGE)
    empty = await chat.human(text="   ")
    assert (empty.turn, empty.soft, empty.hard) == (Turn.NONE, 5, 5)
    res = await chat.admit("A")
    assert res.soft == 6


async def test_two_chats_are_independent(store: Store) -> None:
    one, two = Chat(store, chat="test:one"), Chat(store, chat="test:two")
    await ping_pong(one, 20)
    res = await two.admit("A")
    assert (res.turn, res.soft) == (Turn.OK, 1)
    await two.human()
    res = await one.admit("A")
    assert (res.turn, res.soft) == (Turn.THROTTLED, 21)


async def test_a_message_id_seen_twice_counts_once(stores: StoreFactory) -> None:
    b_store, c_store = await stores(2)
    by_b, by_c = Chat(b_store), Chat(c_store)
    first = await by_b.admit("A", mid="dup")
    # another bot (another replica, another client) sees the same message
    other = await by_c.admit("A", bot="C", mid="dup", local=Reason.BOT_IGNORED)
    assert (first.soft, other.soft, other.turn) == (1, 1, Turn.OK)
    # the same bot sees it again: a duplicate, counted nothing
    again = await by_b.admit("A", mid="dup")
    assert (again.action, again.reason, again.turn, again.soft) == (
        Action.DROP, Reason.DUPLICATE, Turn.NONE, 1)  # fmt: skip
    res = await by_b.admit("A")
    assert res.soft == 2
    late = await by_b.admit("A", mid="dup")  # a late redelivery reports the counters as they are
    assert (late.reason, late.soft, late.hard) == (Reason.DUPLICATE, 2, 2)


async def test_own_and_ignored_bot_messages_both_advance_the_counters(store: Store) -> None:
    chat = Chat(store)
    own = await chat.admit("B")
    ignored = await chat.admit("A", local=Reason.BOT_IGNORED)
    assert (own.reason, own.soft) == (Reason.OWN_MESSAGE, 1)
    assert (ignored.reason, ignored.soft, ignored.hard) == (Reason.BOT_IGNORED, 2, 2)


async def test_a_sent_reply_counts_once_when_observed_again(stores: StoreFactory) -> None:
    b_store, c_store = await stores(2)
    by_b, by_c = Chat(b_store), Chat(c_store)
    sent = await by_b.sent("B", mid="r1")
    assert (sent.turn, sent.soft) == (Turn.OK, 1)
    echo = await by_b.admit("B", mid="r1")  # the platform echoes B's message back to B
    assert (echo.reason, echo.soft) == (Reason.OWN_MESSAGE, 1)
    seen = await by_c.admit("B", bot="C", mid="r1", local=Reason.BOT_IGNORED)
    assert seen.soft == 1
    assert (await by_b.sent("B", mid="r1")).soft == 1  # a second record of the same send


async def test_a_message_sent_as_an_aside_is_never_a_turn(stores: StoreFactory) -> None:
    """An admin command's answer is filed with Count.NONE: neither the bot
    that sent it nor another that observes it later counts it."""
    b_store, c_store = await stores(2)
    by_b, by_c = Chat(b_store), Chat(c_store)
    await by_b.admit("A")
    aside = await by_b.sent("B", mid="note1", count=Count.NONE)
    assert aside.soft == 1
    seen = await by_c.admit("B", bot="C", mid="note1", local=Reason.BOT_IGNORED)
    assert (seen.soft, seen.hard) == (1, 1)
    assert (await by_b.sent("B")).soft == 2  # a real reply still counts


async def test_a_human_message_in_an_unknown_chat_creates_no_counters(store: Store) -> None:
    chat = Chat(store, chat="test:fresh")
    res = await chat.human()
    assert (res.turn, res.soft, res.hard) == (Turn.RESET, 0, 0)
    status = await store.status("test:fresh", "B", Limits(), now_ms=chat.now_ms)
    assert (status.soft, status.hard, status.turn) == (0, 0, Turn.OK)


# -- turn holds: an answer being written already counts for bot messages ----------

HOLD = 30_000


async def test_two_bots_answering_one_bot_message_at_once_give_one_answer_at_the_limit(
    stores: StoreFactory,
) -> None:
    """A's message is the chat's 2nd bot turn (soft limit 3): one answer may
    follow it, the 3rd. B and C both admit it while neither has sent yet: the
    first holds that turn, so the second would be the 4th and is dropped."""
    by_b, by_c = (Chat(h, limits=SMALL) for h in await stores(2))
    await by_b.sent("A")  # 1
    first = await by_b.admit("A", bot="B", mid="a2", hold_ms=HOLD)  # 2
    assert (first.turn, first.soft, first.action) == (Turn.OK, 2, None)
    by_c.now_ms = by_b.now_ms
    second = await by_c.admit("A", bot="C", mid="a2", hold_ms=HOLD)
    assert (second.turn, second.soft) == (Turn.OK, 2)  # the message's own count
    assert (second.action, second.reason) == (Action.DROP, Reason.TURN_THROTTLED)
    assert not second.reserved  # and it keeps no rate slot either
    answer = await by_b.sent("B", answered="a2")  # B's answer fills its hold
    assert (answer.turn, answer.soft) == (Turn.SOFT_LIMIT, 3)
    log = await by_b.store.decisions(by_b.chat)
    assert (log[0]["id"], log[0]["reason"]) == ("a2", "turn_throttled")


async def test_a_filled_or_released_hold_no_longer_counts(stores: StoreFactory) -> None:
    by_b, by_c = (Chat(h, limits=SMALL) for h in await stores(2))
    await by_b.admit("A", bot="B", mid="a1", hold_ms=HOLD)  # 1, B holds the 2nd
    await by_b.sent("B", mid="r1", answered="a1")  # 2: the hold is filled
    by_c.now_ms = by_b.now_ms
    res = await by_c.admit("B", bot="C", mid="r1", hold_ms=HOLD)  # 2, nothing ahead
    assert (res.soft, res.action) == (2, None)
    await by_c.human()  # 0; C's hold on r1 stands
    await by_c.store.release(by_c.chat, "C", "r1", None)  # C sent nothing after all
    by_b.now_ms = by_c.now_ms
    await by_b.admit("A", bot="B", mid="a3", hold_ms=HOLD)  # 1, B holds
    by_c.now_ms = by_b.now_ms
    both = await by_c.admit("A", bot="C", mid="a3", hold_ms=HOLD)  # 1 + 1 ahead: ok
    assert (both.soft, both.action) == (1, None)
    third = await by_c.admit("A", bot="D", mid="a3", hold_ms=HOLD)  # 1 + 2 ahead: 3
    assert (third.action, third.reason) == (Action.DROP, Reason.TURN_THROTTLED)
    await by_b.store.release(by_b.chat, "B", "a3", None)  # B's backend failed
    fourth = await by_c.admit("A", bot="E", mid="a3", hold_ms=HOLD)  # 1 + 1 ahead: ok
    assert (fourth.soft, fourth.action) == (1, None)


async def test_an_answer_fills_the_hold_of_the_message_it_answers(store: Store) -> None:
    chat = Chat(store, limits=Limits(soft_limit=5, hard_limit=9))
    await chat.admit("A", bot="B", mid="a1", hold_ms=HOLD)  # 1, B holds (the older)
    await chat.admit("A", bot="B", mid="a2", hold_ms=HOLD)  # 2, B holds again
    await chat.sent("B", answered="a2")  # 3: fills a2's hold, not a1's
    await store.release(chat.chat, "B", "a1", None)  # a1 got no answer: nothing held
    res = await chat.admit("A", bot="C", hold_ms=HOLD)  # 4, and 5 with a hold left
    assert (res.soft, res.turn, res.action) == (4, Turn.OK, None)


async def test_a_person_is_answered_whatever_is_held(store: Store) -> None:
    chat = Chat(store, limits=SMALL)
    for bot in ("B", "C", "D", "E"):
        held = await chat.human(bot=bot, mid="h1", hold_ms=HOLD)
        assert (held.action, held.reason) == (None, None), bot
    assert (await chat.human(bot="F", hold_ms=HOLD)).action is None
    bot_msg = await chat.admit("A", bot="B", hold_ms=HOLD)  # 1 + 5 answers ahead
    assert (bot_msg.action, bot_msg.reason) == (Action.DROP, Reason.TURN_STOPPED)


async def test_a_hold_lapses_after_its_time(store: Store) -> None:
    chat = Chat(store, limits=SMALL)
    await chat.admit("A", bot="B", mid="a1", hold_ms=HOLD)  # 1, B holds
    await chat.human()  # 0; B's hold stands
    await chat.admit("A", bot="C", mid="a2", hold_ms=HOLD)  # 1 + 1 ahead, C holds
    held = await chat.admit("A", bot="D", mid="a3", hold_ms=HOLD)  # 2 + 2 ahead
    assert (held.soft, held.turn, held.reason) == (2, Turn.OK, Reason.TURN_THROTTLED)
    await chat.human()
    chat.tick(HOLD / 1000)  # B's and C's answers never came: their holds lapse
    await chat.admit("A", bot="C", mid="a4")  # 1, nothing held now
    res = await chat.admit("A", bot="D", mid="a5", hold_ms=HOLD)  # 2 + nothing ahead
    assert (res.soft, res.action, res.reason) == (2, None, None)


async def test_a_dry_run_holds_nothing(store: Store) -> None:
    chat = Chat(store, limits=SMALL)
    await chat.admit("A", bot="B", mid="a1")  # 1, no hold
    await chat.admit("A", bot="C", mid="a2")  # 2, no hold
    res = await chat.admit("A", bot="D", mid="a2")  # as counted: 2, nothing ahead
    assert (res.soft, res.action) == (2, None)


async def test_an_answer_seen_before_it_is_reported_sent_fills_its_hold_once(
    stores: StoreFactory,
) -> None:
    """On Discord another bot may see B's answer before B's daemon records it
    as sent: counting it then fills B's hold, so it is not counted twice."""
    limits = Limits(soft_limit=5, hard_limit=9)
    by_b, by_c = (Chat(h, limits=limits) for h in await stores(2))
    await by_b.admit("A", bot="B", mid="a1", hold_ms=HOLD)  # 1, B holds
    by_c.now_ms = by_b.now_ms
    seen = await by_c.admit("B", bot="C", mid="r1", hold_ms=HOLD)  # B's answer: 2
    assert (seen.soft, seen.action) == (2, None)  # B's hold filled; C holds now
    again = await by_b.sent("B", mid="r1", answered="a1")  # reported sent only now
    assert again.soft == 2
    by_c.now_ms = by_b.now_ms
    res = await by_c.admit("A", bot="D", mid="a3", hold_ms=HOLD)  # 3 + C's 1 ahead = 4
    assert (res.soft, res.action) == (3, None)  # B's answer is not ahead a second time
    res = await by_c.admit("A", bot="E", mid="a3", hold_ms=HOLD)  # 3 + C's, D's = 5
    assert (res.action, res.reason) == (Action.DROP, Reason.TURN_THROTTLED)


# -- pair loop protection -------------------------------------------------

PAIRS = Limits(soft_limit=1000, hard_limit=2000, max_replies=1000, pair_max_events=3,
               pair_window_ms=60_000, pair_cooldown_ms=30_000)  # fmt: skip


async def test_more_than_max_exchanges_cool_the_pair_down_both_ways(store: Store) -> None:
    chat = Chat(store, limits=PAIRS)
    reasons = []
    for i in range(6):  # A B A B A B: exchanges at messages 2..6
        author = "A" if i % 2 == 0 else "B"
        res = await chat.admit(author, bot="B" if author == "A" else "A")
        reasons.append(res.reason)
    # exchanges 1-3 fine (messages 2-4); the 4th exchange (message 5) exceeds 3
    assert reasons[:4] == [None, None, None, None]
    assert reasons[4:] == [Reason.PAIR_COOLDOWN, Reason.PAIR_COOLDOWN]
    status = await store.status(chat.chat, "B", PAIRS, now_ms=chat.now_ms)
    assert list(status.pair_cooldowns) == ["A|B"]


async def test_humans_do_not_end_a_pair_cooldown_but_time_does(store: Store) -> None:
    chat = Chat(store, limits=PAIRS)
    for i in range(5):
        await chat.admit("A" if i % 2 == 0 else "B", bot="C", local=Reason.BOT_IGNORED)
    await chat.human()
    res = await chat.admit("A")
    assert res.reason is Reason.PAIR_COOLDOWN
    chat.tick(31)
    res = await chat.admit("A", tick=0)
    assert (res.reason, res.action) == (None, None)


async def test_a_bot_repeating_itself_is_no_exchange(store: Store) -> None:
    chat = Chat(store, limits=PAIRS)
    for _ in range(10):
        res = await chat.admit("A")
    assert res.reason is None
    assert (await store.status(chat.chat, "B", PAIRS, now_ms=chat.now_ms)).pair_cooldowns == {}


async def test_pair_cooldown_is_only_for_the_pair(store: Store) -> None:
    chat = Chat(store, limits=PAIRS)
    for i in range(5):
        await chat.admit("A" if i % 2 == 0 else "B", bot="C", local=Reason.BOT_IGNORED)
    res = await chat.admit("A", bot="C")  # C answers A: C is not in the cooled pair
    assert res.reason is None


async def test_exchanges_outside_the_window_do_not_add_up(store: Store) -> None:
    chat = Chat(store, limits=PAIRS)
    for i in range(8):
        res = await chat.admit("A" if i % 2 == 0 else "B", bot="C", tick=25,
                               local=Reason.BOT_IGNORED)  # fmt: skip
    status = await store.status(chat.chat, "C", PAIRS, now_ms=chat.now_ms)
    assert status.pair_cooldowns == {}  # at most 3 exchanges in any 60 s
    assert res.soft == 8


# -- pause, overrides (stored, shared by replicas) -----------------------


async def test_pause_is_shared_and_answers_nothing_until_resumed(stores: StoreFactory) -> None:
    admin, replica = await stores(2)
    chat = Chat(replica, limits=SMALL)
    await admin.set_paused(chat.chat, True)
    res = await chat.human()
    assert (res.action, res.reason) == (Action.DROP, Reason.PAUSED)
    await chat.admit("B")
    await chat.admit("A")
    res = await chat.admit("A")  # soft limit while paused: no warning either
    assert (res.turn, res.action, res.reason) == (Turn.SOFT_LIMIT, Action.DROP, Reason.PAUSED)
    assert (await replica.status(chat.chat, "B", SMALL, now_ms=chat.now_ms)).paused
    await admin.set_paused(chat.chat, False)
    res = await chat.human()
    assert (res.action, res.reason) == (None, None)


async def test_a_rate_slot_taken_after_the_clock_went_back_expires_on_time(store: Store) -> None:
    """The memory store keeps a window oldest first and stops pruning at the
    first slot still in it; a slot taken after the clock stepped back must
    still expire when its time comes (Redis's sorted set does this anyway)."""
    chat = Chat(store, limits=Limits(max_replies=2, rate_window_ms=1000))
    start = chat.now_ms
    assert (await chat.human(tick=0)).reserved  # a slot at start
    chat.now_ms = start - 900  # the clock steps back
    assert (await chat.human(tick=0)).reserved  # a slot at start - 900
    assert (await chat.human(tick=0)).reason is Reason.RATE_CAPPED
    chat.now_ms = start + 100  # start - 900 has left the window, start has not
    assert (await chat.human(tick=0)).reserved
    assert (await chat.human(tick=0)).reason is Reason.RATE_CAPPED


async def test_overrides_replace_the_configured_limits_for_every_replica(
    stores: StoreFactory,
) -> None:
    admin, replica = await stores(2)
    chat = Chat(replica)
    await admin.set_overrides(chat.chat, Overrides(soft_limit=2, max_replies=1))
    turns = await ping_pong(chat, 3)
    assert turns == [Turn.OK, Turn.SOFT_LIMIT, Turn.THROTTLED]
    await chat.human(local=Reason.NOT_ADDRESSED)
    chat.tick(121)  # A's first ping took the only slot; let the window pass
    first, second = await chat.human(), await chat.human()
    assert (first.reserved, second.reason) == (True, Reason.RATE_CAPPED)
    status = await replica.status(chat.chat, "B", Limits(), now_ms=chat.now_ms)
    assert (status.limits.soft_limit, status.rate_max) == (2, 1)
    assert status.overrides.as_dict() == {"soft_limit": 2, "max_replies": 1}
    await admin.set_overrides(chat.chat, Overrides())
    assert (await replica.status(chat.chat, "B", Limits())).overrides.as_dict() == {}


async def test_merged_overrides_keep_each_others_fields(stores: StoreFactory) -> None:
    """Two admins changing different limits at once both keep their change."""
    a, b = await stores(2)
    chat = "test:merge"
    await asyncio.gather(
        a.set_overrides(chat, Overrides(soft_limit=3), merge=True),
        b.set_overrides(chat, Overrides(hard_limit=50), merge=True),
    )
    assert (await b.status(chat, "B", Limits())).overrides == Overrides(soft_limit=3, hard_limit=50)
    await a.set_overrides(chat, Overrides(max_replies=2))  # without merge: replaces
    assert (await b.status(chat, "B", Limits())).overrides == Overrides(max_replies=2)


async def test_admin_reset_zeroes_counters_and_cooldowns(store: Store) -> None:
    chat = Chat(store, limits=PAIRS)
    for i in range(6):
        await chat.admit("A" if i % 2 == 0 else "B", bot="C", local=Reason.BOT_IGNORED)
    await store.reset(chat.chat)
    status = await store.status(chat.chat, "B", PAIRS, now_ms=chat.now_ms)
    assert (status.soft, status.hard, status.pair_cooldowns) == (0, 0, {})
    res = await chat.admit("A")
    assert (res.soft, res.reason) == (1, None)


# -- the reply rate cap ----------------------------------------------------------


async def test_fifty_concurrent_admits_with_cap_six_reserve_exactly_six(store: Store) -> None:
    chat = Chat(store)
    results = await asyncio.gather(*(chat.human(tick=0) for _ in range(50)))
    assert sum(r.reserved for r in results) == 6
    assert sum(r.reason is Reason.RATE_CAPPED for r in results) == 44


async def test_fifty_concurrent_admits_over_three_clients_reserve_exactly_six(
    stores: StoreFactory,
) -> None:
    handles = await stores(3)
    chats = [Chat(h) for h in handles]
    results = await asyncio.gather(*(chats[i % 3].human(mid=f"x{i}", tick=0) for i in range(50)))
    assert sum(r.reserved for r in results) == 6


async def test_a_released_slot_frees_capacity(store: Store) -> None:
    chat = Chat(store, limits=Limits(max_replies=2))
    a, b = await chat.human(mid="a"), await chat.human(mid="b")
    assert (a.reserved, b.reserved) == (True, True)
    assert (await chat.human()).reason is Reason.RATE_CAPPED
    await store.release(chat.chat, "B", "a", {"id": "a", "reason": "classifier_skip"})
    assert (await chat.human()).reserved
    log = await store.decisions(chat.chat)
    assert [e["reason"] for e in log] == ["classifier_skip", "rate_capped"]


async def test_the_window_expires(store: Store) -> None:
    chat = Chat(store, limits=Limits(max_replies=2, rate_window_ms=10_000))
    first = chat.now_ms + 1000
    await chat.human()  # slot at first
    await chat.human()  # slot at first + 1 s
    assert (await chat.human()).reason is Reason.RATE_CAPPED
    chat.now_ms = first + 9_999
    assert (await chat.human(tick=0)).reason is Reason.RATE_CAPPED
    chat.now_ms = first + 10_000  # the first slot is exactly one window old: gone
    assert (await chat.human(tick=0)).reserved
    assert (await chat.human(tick=0)).reason is Reason.RATE_CAPPED


async def test_the_cap_is_per_bot_and_skipped_outside_its_scope(store: Store) -> None:
    chat = Chat(store, limits=Limits(max_replies=1))
    assert (await chat.human()).reserved
    assert (await chat.human()).reason is Reason.RATE_CAPPED
    assert (await chat.human(bot="C")).reserved  # C's window is its own
    chat.limits = Limits(max_replies=1, rate_applies=False)  # e.g. a DM under scope groups
    res = await chat.human()
    assert (res.action, res.reason, res.reserved) == (None, None, False)


async def test_a_dropped_message_reserves_nothing(store: Store) -> None:
    chat = Chat(store, limits=Limits(max_replies=1))
    await chat.human(local=Reason.NOT_ADDRESSED)
    await chat.admit("A", local=Reason.BOT_IGNORED)
    assert (await chat.human()).reserved


# -- context and the decision log -------------------------------------------------------


async def test_context_is_the_recent_messages_before_this_one(store: Store) -> None:
    chat = Chat(store)
    for i in range(10):
        await chat.human(text=f"line {i}", local=Reason.NOT_ADDRESSED)
    res = await chat.human(text="question", context=3)
    assert [e.text for e in res.context] == ["line 7", "line 8", "line 9"]
    assert [e.bot for e in res.context] == [False] * 3


async def test_the_decision_log_keeps_the_newest_fifty(store: Store) -> None:
    chat = Chat(store)
    for _ in range(60):
        await chat.human(local=Reason.NOT_ADDRESSED)
    log = await store.decisions(chat.chat)
    assert len(log) == 50
    assert log[0]["id"] == f"{chat.chat}/m60" and log[-1]["id"] == f"{chat.chat}/m11"
    assert {e["reason"] for e in log} == {"not_addressed"}
    assert set(log[0]) == {"at", "bot", "id", "author", "action", "reason", "turn", "soft",
                           "hard"}  # fmt: skip


# -- cursors (a platform connection's read position) -------------------------


async def test_a_cursor_is_kept_by_name_and_replaced(store: Store) -> None:
    assert await store.get_cursor("matrix:@a:x") is None
    await store.set_cursor("matrix:@a:x", "s1_2")
    await store.set_cursor("matrix:@b:x", "t9")
    await store.set_cursor("matrix:@a:x", "s3_4")
    assert await store.get_cursor("matrix:@a:x") == "s3_4"
    assert await store.get_cursor("matrix:@b:x") == "t9"
