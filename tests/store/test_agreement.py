"""The chat rules agree in Python and in Lua: a property on random sequences.

The rules are written twice, in MemoryStore (gateway/store/memory.py) and in
RedisStore's scripts (gateway/store/lua/*.lua). test_contract.py holds both to
hand-picked examples; this file drives one of each through the same random
sequence of calls - several bots and replicas on one truth (one MemoryStore
object shared, several RedisStore handles with their own clients on one key
prefix), several chats, one injected clock - and requires the same answer to
every call, field for field, and the same status and decision log.

Time: every admit and record_sent carries the one clock (`now_ms`), and
status is asked at it, so pair windows, cooldowns, rate windows and turn holds
lapse at the same instant in both stores; admin calls (reset, pause,
overrides, release) take no time in either. Nothing needs normalising: at_ms
is the injected clock in both, and so is a decision's `at`. What stays out of
reach is only the TTLs. The memory store runs its state and settings TTLs on
the injected clock, while Redis expires keys on its own real clock (it also
PEXPIREs the rate, hold and pair keys for their window, in real time); so the
clock never comes near a state TTL here (a run spans hours, the TTL is days),
and every window and hold is kept far above the real time an example takes.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from gateway.model import Action, Decision, Reason, Turn
from gateway.store import (
    AdmitRequest,
    Limits,
    MemoryStore,
    Observed,
    Overrides,
    SentRequest,
    Store,
)
from gateway.store.redis import RedisStore
from gateway.turns import Count

T = TypeVar("T")

EXAMPLES = int(os.environ.get("BOTBOUNCER_AGREEMENT_EXAMPLES", "300"))
STEPS = int(os.environ.get("BOTBOUNCER_AGREEMENT_STEPS", "30"))
AGREEMENT = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    database=None,  # nothing carried between runs: CI sees what a laptop sees
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

REPLICAS = 3  # RedisStore handles, each with its own client, on one key prefix
# A brace and a percent sign exercise RedisStore's hash-tag escaping.
CHATS = ("t:{1}", "t:2%", "t:3")
BUSY = st.sampled_from([CHATS[0], CHATS[0], CHATS[0], CHATS[1], CHATS[2]])  # one chat busier
# Mixed case orders differently from lowercase; '|' and '%' are what the
# Lua handled-by marks escape, and '|' is the pair-name separator.
BOTS = ("A", "B", "c", "Z|%")
PEOPLE = ("alice", "Bob")
# A and B talk most, so one pair exchanges often enough to cool down.
TALKERS = st.sampled_from(["A", "B", "A", "B", "c", "Z|%"])
CONTEXT_SIZE = 3
DEDUPE = 6  # small, so that ids are evicted and a redelivery counts again
START_MS = 1_000_000

# Windows, cooldowns and holds: at least 10 s, as Redis also expires their keys
# after that long in real time (an example takes well under a second).
WINDOWS = (10_000, 20_000, 30_000)
LIMITS = st.builds(
    Limits,
    # small, so thresholds are hit often (a roomy run lifts them: see `initialise`)
    soft_limit=st.integers(1, 8),
    hard_limit=st.integers(1, 10),  # either order: soft >= hard is valid
    max_replies=st.integers(1, 3),
    rate_window_ms=st.sampled_from(WINDOWS),
    rate_applies=st.just(True),  # per chat, see `initialise`
    pair_max_events=st.integers(1, 3),
    pair_window_ms=st.sampled_from(WINDOWS),
    pair_cooldown_ms=st.sampled_from(WINDOWS),
    # the machine-pace backstop: off, or a window people answer inside
    pace_ms=st.sampled_from([0, *WINDOWS]),
    pace_max=st.integers(1, 3),
)
OVERRIDES = st.builds(
    Overrides,
    soft_limit=st.none() | st.integers(1, 5),
    hard_limit=st.none() | st.integers(1, 7),
    max_replies=st.none() | st.integers(1, 3),
    rate_window_ms=st.none() | st.sampled_from((10_000, 60_000)),
)
TEXTS = st.sampled_from(["hi", "", "  ", 'a "quote" \\ /x', "émoji 🙂", "long " * 120])
NAMES = st.sampled_from(["", "Ñame"])
# small steps, the same millisecond, and jumps onto and past every window, cooldown
# and hold (an hour: everything lapsed; still far below the state TTL)
ADVANCES = st.integers(0, 2_000) | st.sampled_from(
    [0, 1, 9_999, 10_000, 10_001, 20_000, 30_000, 30_001, 60_000, 3_600_000]
)
# Every window, cooldown and hold any run can have (overrides add 60 s): an
# event at t has edges at t + each, where a rule changes its answer.
DURATIONS = (10_000, 20_000, 30_000, 60_000)
LOCALS = st.sampled_from(
    [
        None,
        None,
        None,
        None,
        None,
        Reason.BOT_IGNORED,
        Reason.NOT_ADDRESSED,
        Reason.SYSTEM_MESSAGE,
        Reason.OWN_MESSAGE,
    ]
)


@dataclass(frozen=True)
class Msg:
    """A message as the platform knows it: every delivery has these fields."""

    chat: str
    id: str
    author: str
    count: Count
    name: str = ""
    text: str = ""
    system: bool = False

    def observed(self) -> Observed:
        return Observed(self.chat, self.id, self.author, self.name, self.count, self.text)


@dataclass(frozen=True)
class View:
    """One bot's delivery of a message: what its pipeline would ask the store."""

    bot: str
    replica: int
    local: Reason | None
    flip_is_bot: bool  # author_is_bot the other way round (a pipeline's own view)
    hold_ms: int
    context: int
    tick: int  # ms the clock moves first
    # or first to the chat's next known deadline (-1, 0, +1 ms from it), if any
    edge: int | None = None


VIEWS = st.builds(
    View,
    bot=TALKERS,
    replica=st.integers(0, REPLICAS - 1),
    local=LOCALS,
    flip_is_bot=st.sampled_from([False, False, False, True]),
    hold_ms=st.sampled_from([0, 10_000, 30_000, 30_000]),
    context=st.sampled_from([0, 0, 1, 2, 5]),
    tick=st.sampled_from([0, 0, 1, 250, 1_000]),
    edge=st.sampled_from([None, None, None, None, 0, 0, -1, 1]),
)


@dataclass
class Env:
    """What outlives one example: the loop and the Redis handles (one connection each)."""

    loop: asyncio.AbstractEventLoop | None = None
    redis: list[RedisStore] = field(default_factory=list)
    prefix: str = ""
    examples: int = 0

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        assert self.loop is not None
        return self.loop.run_until_complete(coro)

    async def clear(self) -> None:
        client = self.redis[0].client
        keys = [k async for k in client.scan_iter(match=f"{self.prefix}:*", count=1000)]
        if keys:
            await client.delete(*keys)


ENV = Env()


class Agreement(RuleBasedStateMachine):
    """Every call goes to the memory store and to one Redis replica; answers must match."""

    messages = Bundle("messages")

    def __init__(self) -> None:
        super().__init__()
        ENV.examples += 1
        ENV.run(ENV.clear())
        self.memory = MemoryStore(context_size=CONTEXT_SIZE, dedupe_entries=DEDUPE)
        self.now = START_MS
        self.seq = 0
        self.steps = 0
        self.delivered: list[tuple[Msg, View]] = []  # every admit so far, newest last
        self.times: set[int] = set()  # when admits and sends were
        # when a rate slot, a turn hold or a pair cooldown seen so far ends
        self.deadlines: dict[str, set[int]] = {c: set() for c in CHATS}
        # the same, for the bot whose slot or hold it is: an admit for that bot
        # at that instant is where an off-by-one in its own window shows
        self.own_deadlines: dict[tuple[str, str], set[int]] = {}
        self.limits: dict[str, Limits] = {b: Limits() for b in BOTS}
        self.rate_applies: dict[str, bool] = {c: True for c in CHATS}

    # -- plumbing ---------------------------------------------------------

    def limits_for(self, bot: str, chat: str) -> Limits:
        """Each bot has its own configured limits; the chat kind decides rate_applies."""
        return replace(self.limits[bot], rate_applies=self.rate_applies[chat])

    def both(self, replica: int, call: Any) -> tuple[Any, Any]:
        """`call(store)` on the memory store and on one Redis replica."""
        mem = ENV.run(call(self.memory))
        red = ENV.run(call(ENV.redis[replica]))
        return mem, red

    def agree(self, what: str, replica: int, call: Any) -> Any:
        mem, red = self.both(replica, call)
        assert mem == red, f"{what}:\n  memory {mem!r}\n  redis  {red!r}"
        return mem

    def fresh_id(self, chat: str) -> str:
        self.seq += 1
        return f"{chat}/m{self.seq}"

    def decision_log(self, bot: str, msg: Msg, reason: Reason) -> dict[str, Any]:
        """A decision entry as the pipeline files it (`at` from the injected clock)."""
        return Decision(
            bot,
            msg.id,
            msg.chat,
            msg.author,
            Action.DROP,
            reason,
            Turn.OK,
            1,
            1,
            at=self.now / 1000,
        ).log_entry()

    def admit(self, msg: Msg, view: View) -> None:
        own = self.own_deadlines.get((msg.chat, view.bot), set())
        ahead = sorted(t for t in own if t > self.now) or sorted(
            t for t in self.deadlines[msg.chat] if t > self.now
        )
        if view.edge is not None and ahead:
            self.now = max(self.now, ahead[0] + view.edge)
        else:
            self.now += view.tick
        bot = view.bot
        local = view.local
        if msg.author == bot:  # the pipeline's first rule
            local = Reason.OWN_MESSAGE
        elif msg.system:
            local = Reason.SYSTEM_MESSAGE
        is_bot = (msg.author in BOTS) != view.flip_is_bot
        limits, now = self.limits_for(bot, msg.chat), self.now
        self.times.add(now)

        def call(store: Store) -> Coroutine[Any, Any, Any]:
            return store.admit(
                AdmitRequest(
                    msg=msg.observed(),
                    bot=bot,
                    local_reason=local,
                    author_is_bot=is_bot,
                    limits=limits,
                    context=view.context,
                    now_ms=now,
                    hold_ms=view.hold_ms,
                )
            )

        res = self.agree(f"admit {msg.id} by {msg.author} for {bot} at {now}", view.replica, call)
        self.delivered.append((msg, view))
        ends = self.own_deadlines.setdefault((msg.chat, bot), set())
        if res.reserved:  # its rate slot lapses
            self.deadlines[msg.chat].add(now + res.limits.rate_window_ms)
            ends.add(now + res.limits.rate_window_ms)
        if view.hold_ms and res.action is None:  # its turn hold lapses
            self.deadlines[msg.chat].add(now + view.hold_ms)
            ends.add(now + view.hold_ms)
        self.note_cooldowns(msg.chat)

    def sent(
        self, msg: Msg, bot: str, replica: int, answered: str, log: str | None, author: str = ""
    ) -> None:
        limits, now = self.limits_for(bot, msg.chat), self.now
        self.times.add(now)
        entry: dict[str, Any] | None = None
        if log == "decision":
            entry = self.decision_log(bot, msg, Reason.BACKEND_EMPTY)
        elif log == "other":
            entry = {"id": answered or msg.id, "note": "not a decision's entry"}

        def call(store: Store) -> Coroutine[Any, Any, Any]:
            return store.record_sent(
                SentRequest(
                    msg=msg.observed(),
                    bot=bot,
                    limits=limits,
                    log=entry,
                    now_ms=now,
                    answered=answered,
                    answered_author=author,
                )
            )

        self.agree(f"record_sent {msg.id} by {bot} answering {answered!r}", replica, call)
        self.note_cooldowns(msg.chat)

    def note_cooldowns(self, chat: str) -> None:
        """When the chat's pair cooldowns end, as its status tells (asked of the
        memory store only: the answers are compared elsewhere)."""
        status = ENV.run(self.memory.status(chat, BOTS[0], Limits(), now_ms=self.now))
        for pair, left in status.pair_cooldowns.items():
            end = self.now + round(left * 1000)
            self.deadlines[chat].add(end)
            for bot in BOTS:  # a deadline of each bot of the pair (a name may hold '|')
                if pair.startswith(bot + "|") or pair.endswith("|" + bot):
                    self.own_deadlines.setdefault((chat, bot), set()).add(end)

    def compare_chat(self, chat: str, bot: str, replica: int) -> None:
        limits, now = self.limits_for(bot, chat), self.now
        self.agree(
            f"status of {chat} for {bot} at {now}",
            replica,
            lambda s: s.status(chat, bot, limits, now_ms=now),
        )
        self.agree(f"decisions of {chat}", replica, lambda s: s.decisions(chat))

    # -- the run's policy -------------------------------------------------

    @initialize(
        per_bot=st.lists(LIMITS, min_size=len(BOTS), max_size=len(BOTS)),
        applies=st.lists(st.booleans(), min_size=len(CHATS), max_size=len(CHATS)),
        roomy=st.sampled_from([False, False, True]),
    )
    def initialise(self, per_bot: list[Limits], applies: list[bool], roomy: bool) -> None:
        """Limits per bot, as each bot has its own config; rate_applies per chat (its
        kind). In a roomy run the turn limits are out of sight, so that the pair
        cooldown and the rate cap, checked after the turn verdict, are reached."""
        if roomy:
            per_bot = [replace(lim, soft_limit=40, hard_limit=50) for lim in per_bot]
        self.limits = dict(zip(BOTS, per_bot, strict=True))
        self.rate_applies = dict(zip(CHATS, applies, strict=True))

    # -- messages ----------------------------------------------------------

    @rule(
        target=messages,
        chat=st.sampled_from(CHATS),
        author=st.sampled_from(BOTS + PEOPLE),
        text=TEXTS,
        name=NAMES,
        system=st.sampled_from([False, False, False, True]),
        view=VIEWS,
    )
    def new_message(
        self, chat: str, author: str, text: str, name: str, system: bool, view: View
    ) -> Msg:
        """A message first delivered to one bot (a bot's, a person's, or a system one)."""
        if author in BOTS and not system:
            count = Count.BOT
        else:  # only plain human text resets; system and blank messages count nothing
            count = Count.RESET if text.strip() and not system else Count.NONE
        msg = Msg(chat, self.fresh_id(chat), author, count, name, text, system)
        self.admit(msg, view)
        return msg

    @rule(target=messages, chat=BUSY, author=TALKERS, text=TEXTS, view=VIEWS)
    def new_bot_message(self, chat: str, author: str, text: str, view: View) -> Msg:
        """Bot messages are most of what the rules are about: they come twice as often."""
        msg = Msg(chat, self.fresh_id(chat), author, Count.BOT, author, text)
        self.admit(msg, view)
        return msg

    @rule(
        target=messages,
        chat=BUSY,
        pair=st.sampled_from([("A", "B"), ("B", "c"), ("Z|%", "A")]),
        n=st.integers(2, 5),
        view=VIEWS,
    )
    def exchange(self, chat: str, pair: tuple[str, str], n: int, view: View) -> Msg:
        """Two bots answering each other n times, each message admitted by the
        other: how a pair loop starts (and its cooldown fires). Only the first
        may wait for a deadline (`view.edge`): say, the pair's cooldown end."""
        msg = None
        for i in range(n):
            author, other = pair if i % 2 == 0 else pair[::-1]
            msg = Msg(chat, self.fresh_id(chat), author, Count.BOT, author, "ping")
            self.admit(
                msg,
                replace(
                    view,
                    bot=other,
                    local=None,
                    flip_is_bot=False,
                    replica=(view.replica + i) % REPLICAS,
                    edge=view.edge if i == 0 else None,
                ),
            )
        assert msg is not None
        return msg

    @rule(
        target=messages,
        chat=BUSY,
        bot=TALKERS,
        person=st.sampled_from(PEOPLE),
        rounds=st.integers(1, 5),
        gap=st.sampled_from([0, 1, 500, 9_999, 10_000, 10_001, 20_000]),
        replica=st.integers(0, REPLICAS - 1),
    )
    def person_answers_back(
        self, chat: str, bot: str, person: str, rounds: int, gap: int, replica: int
    ) -> Msg:
        """A "person" and a bot in a quick back-and-forth: the person writes,
        the bot answers, the person answers back `gap` ms later, `rounds`
        times: the machine-pace backstop's counter, and its window's edge."""
        msg = None
        for _ in range(rounds):
            msg = Msg(chat, self.fresh_id(chat), person, Count.RESET, person, "again?")
            self.admit(msg, View(bot, replica, None, False, 0, 0, 0))
            reply = Msg(chat, self.fresh_id(chat), bot, Count.BOT, bot, "sure")
            self.sent(reply, bot, replica, msg.id, None, person)
            self.now += gap
        assert msg is not None
        return msg

    @precondition(lambda self: any(t > self.now for e in self.own_deadlines.values() for t in e))
    @rule(
        target=messages,
        pick=st.integers(0, 7),
        delta=st.sampled_from([0, 0, -1, 1]),
        author=st.sampled_from([*PEOPLE, "A", "B"]),
        replica=st.integers(0, REPLICAS - 1),
        hold_ms=st.sampled_from([0, 30_000]),
    )
    def ask_at_a_deadline(
        self, pick: int, delta: int, author: str, replica: int, hold_ms: int
    ) -> Msg:
        """A message for a bot at the instant one of its own rate slots, turn
        holds or pair cooldowns in the chat ends, or a millisecond either
        side: where `<` and `<=` part. Random steps rarely land there for the
        right bot with its window full; this rule does (a person's message
        passes the turn gates, so the rate cap decides; a bot's meets the
        holds and the cooldowns)."""
        ahead = sorted((t, chat, bot) for (chat, bot), ends in self.own_deadlines.items()
                       for t in ends if t > self.now)  # fmt: skip
        end, chat, bot = ahead[min(pick, len(ahead) - 1)]
        self.now = max(self.now, end + delta)
        count = Count.RESET if author in PEOPLE else Count.BOT
        msg = Msg(chat, self.fresh_id(chat), author, count, author, "at the edge")
        view = View(bot, replica, None, False, hold_ms, 0, 0)
        self.admit(msg, view)
        return msg

    @precondition(lambda self: self.delivered)
    @rule(
        back=st.sampled_from([0, 0, 0, 1, 2, 3, 7]),  # mostly the latest
        replica=st.integers(0, REPLICAS - 1),
        tick=st.sampled_from([0, 1, 1_000]),
    )
    def redeliver(self, back: int, replica: int, tick: int) -> None:
        """A platform redelivers a recent message to the same bot, maybe to another
        replica of it (`back`: how many admits ago): a duplicate unless evicted."""
        msg, view = self.delivered[-1 - back % len(self.delivered)]
        self.admit(msg, replace(view, replica=replica, tick=tick))

    @rule(msg=messages, view=VIEWS)
    def deliver_again(self, msg: Msg, view: View) -> None:
        """The same message to another bot, or again to the same one (a redelivery)."""
        self.admit(msg, view)

    @rule(
        target=messages,
        answered=messages,
        bot=st.sampled_from(BOTS),
        replica=st.integers(0, REPLICAS - 1),
        fills=st.booleans(),
        log=st.sampled_from([None, "decision", "other"]),
        aside=st.sampled_from([False, False, False, True]),
        tick=st.sampled_from([0, 1, 700]),
        text=TEXTS,
    )
    def reply(
        self,
        answered: Msg,
        bot: str,
        replica: int,
        fills: bool,
        log: str | None,
        aside: bool,
        tick: int,
        text: str,
    ) -> Msg:
        """`bot` sent a message in the answered one's chat: its answer (filling
        that turn hold or, as a later piece, none), or an aside (Count.NONE)."""
        self.now += tick
        count = Count.NONE if aside else Count.BOT
        msg = Msg(answered.chat, self.fresh_id(answered.chat), bot, count, bot, text)
        fill = fills and not aside
        self.sent(msg, bot, replica, answered.id if fill else "", log,
                  answered.author if fill else "")  # fmt: skip
        return msg

    @rule(
        msg=messages,
        bot=st.sampled_from(BOTS),
        replica=st.integers(0, REPLICAS - 1),
        answered=messages,
    )
    def record_again(self, msg: Msg, bot: str, replica: int, answered: Msg) -> None:
        """A send recorded twice, or a message already observed reported sent."""
        sender = msg.author if msg.author in BOTS else bot
        self.sent(msg, sender, replica, answered.id, None)

    @rule(
        msg=messages,
        bot=st.sampled_from(BOTS),
        replica=st.integers(0, REPLICAS - 1),
        log=st.sampled_from([None, "decision", "other"]),
    )
    def release(self, msg: Msg, bot: str, replica: int, log: str | None) -> None:
        """`bot` sends nothing for `msg` after all: its slot and hold go back."""
        entry: dict[str, Any] | None = None
        if log == "decision":
            entry = self.decision_log(bot, msg, Reason.BACKEND_ERROR)
        elif log == "other":
            entry = {"id": msg.id, "reason": "classifier_skip"}
        self.agree(
            f"release {msg.id} for {bot}",
            replica,
            lambda s: s.release(msg.chat, bot, msg.id, entry),
        )

    # -- admin and time ----------------------------------------------------

    @rule(
        chat=st.sampled_from(CHATS),
        replica=st.integers(0, REPLICAS - 1),
        op=st.sampled_from(["reset", "reset", "pause", "resume", "resume", "overrides"]),
        overrides=OVERRIDES,
        merge=st.booleans(),
    )
    def admin(self, chat: str, replica: int, op: str, overrides: Overrides, merge: bool) -> None:
        """An admin command (one rule for all four, so they come as often as one message kind)."""
        if op == "reset":
            self.agree(f"reset {chat}", replica, lambda s: s.reset(chat))
        elif op in ("pause", "resume"):
            paused = op == "pause"
            self.agree(f"pause {chat} {paused}", replica, lambda s: s.set_paused(chat, paused))
        else:
            self.agree(
                f"overrides {chat} {overrides} merge={merge}",
                replica,
                lambda s: s.set_overrides(chat, overrides, merge=merge),
            )

    @rule(ms=ADVANCES)
    def advance(self, ms: int) -> None:
        self.now += ms

    def edges(self, known: bool) -> list[int]:
        if known:
            return sorted(t for d in self.deadlines.values() for t in d if t >= self.now)
        return sorted({t + d for t in self.times for d in DURATIONS if t + d > self.now})

    @precondition(lambda self: self.edges(False))
    @rule(
        known=st.booleans(),
        pick=st.sampled_from([0, 0, 1, 2, 5]),
        delta=st.sampled_from([0, 0, -1, 1]),
    )
    def advance_to_edge(self, known: bool, pick: int, delta: int) -> None:
        """The clock to the instant something ends - a known rate slot, hold or
        cooldown, or any window of an earlier event (`pick`: the how-manieth
        ahead) - or a millisecond either side: where `>` and `>=` part."""
        edges = self.edges(known) or self.edges(False)
        self.now = max(self.now, edges[min(pick, len(edges) - 1)] + delta)

    # -- reading back --------------------------------------------------------

    @rule(
        chat=st.sampled_from(CHATS), bot=st.sampled_from(BOTS), replica=st.integers(0, REPLICAS - 1)
    )
    def check_chat(self, chat: str, bot: str, replica: int) -> None:
        self.compare_chat(chat, bot, replica)

    @invariant()
    def every_few_steps_every_chat_agrees(self) -> None:
        self.steps += 1
        if self.steps % 10 == 0:
            bot = BOTS[self.steps // 10 % len(BOTS)]
            for i, chat in enumerate(CHATS):
                self.compare_chat(chat, bot, i % REPLICAS)

    def teardown(self) -> None:
        for i, chat in enumerate(CHATS):
            for bot in BOTS:
                self.compare_chat(chat, bot, i % REPLICAS)


def test_memory_and_redis_agree_on_random_multi_replica_sequences(
    redis_url: str, key_prefix: str
) -> None:
    loop = asyncio.new_event_loop()
    ENV.loop, ENV.prefix, ENV.examples = loop, key_prefix, 0

    async def open_handles() -> list[RedisStore]:
        return [
            RedisStore.from_url(
                redis_url, prefix=key_prefix, context_size=CONTEXT_SIZE, dedupe_entries=DEDUPE
            )
            for _ in range(REPLICAS)
        ]

    ENV.redis = loop.run_until_complete(open_handles())
    try:
        run_state_machine_as_test(Agreement, settings=AGREEMENT)
    finally:
        ENV.run(ENV.clear())
        for handle in ENV.redis:
            ENV.run(handle.close())
        ENV.redis, ENV.loop = [], None
        loop.close()
