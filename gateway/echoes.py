"""A gateway's own messages shown back to it (echoes), decided without a store call.

A platform that shows a bot its own messages (Discord) would otherwise cost a
store call per reply that learns nothing: the gateway counted the message when
it sent it (`Gateway.sent`). `Echoes` remembers what was counted and routes
each echo to one of three fates:

- counted already: decided at once as `own_message`, as the count answered;
- being counted (`record_sent` under way): decided when that count answers;
- seen while a send in its chat is under way but before the platform answered
  its id (Discord's gateway event races the REST answer): parked until a count
  claims it, or, if none does by the time the chat's last send ends, decided
  by the store after all (in a task, like any message).

Anything else from the bot (another replica's message, one sent before a
restart or by hand) is not an echo: the store decides it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

from gateway.inflight import ShuttingDown
from gateway.model import Decision, Message
from gateway.store import SentResult

log = logging.getLogger("botbouncer.decision")

# Messages a gateway remembers having sent (their echoes skip the store).
SENT_REMEMBERED = 1024

Key = tuple[str, str]  # (chat, message id)
Seen = tuple[Message, float]  # an echo and when it arrived (perf_counter)


class Echoes:
    """One gateway's sends and the echoes waiting for them.

    `own(msg, counted, started)` decides an echo as its count answered;
    `decide(msg)` has the store decide one no count claimed; `name` is the
    bot's name for log lines.
    """

    def __init__(
        self,
        own: Callable[[Message, SentResult, float], object],
        decide: Callable[[Message], Awaitable[Decision]],
        name: Callable[[], str],
    ) -> None:
        self._own = own
        self._decide = decide
        self._name = name
        self._sent: OrderedDict[Key, SentResult] = OrderedDict()  # counted, newest last
        self._sending: dict[str, int] = {}  # chat -> sends under way
        self._parked: dict[str, list[Seen]] = {}  # chat -> echoes whose id no send knows yet
        self._counting: dict[Key, list[Seen]] = {}  # `record_sent` under way -> its echoes
        self._counts: dict[Key, int] = {}  # how many `record_sent` of the key are under way
        self._later: set[asyncio.Task[Decision]] = set()

    def counted(self, chat: str, message_id: str) -> SentResult | None:
        return self._sent.get((chat, message_id))

    def catch(self, msg: Message, started: float) -> bool:
        """Whether `msg` (from this bot) is an echo, now decided or waiting."""
        key = (msg.chat.key, msg.id)
        if (mine := self._sent.get(key)) is not None:
            self._own(msg, mine, started)
        elif (waiting := self._counting.get(key)) is not None:
            waiting.append((msg, started))
        elif msg.chat.key in self._sending:
            self._parked.setdefault(msg.chat.key, []).append((msg, started))
        else:
            return False
        return True

    @contextmanager
    def sending(self, chat: str) -> Iterator[None]:
        """A send (and its counts) under way in `chat`: an echo parked
        meanwhile that no count claims is decided by the store when the last
        send in the chat ends."""
        self._sending[chat] = self._sending.get(chat, 0) + 1
        try:
            yield
        finally:
            left = self._sending.pop(chat) - 1
            if left:
                self._sending[chat] = left
            else:
                for msg, _ in self._parked.pop(chat, ()):
                    self._decide_later(msg)

    @contextmanager
    def counting(self, chat: str, message_id: str) -> Iterator[Callable[[SentResult], None]]:
        """Around the `record_sent` of one sent message: its echo, parked or
        yet to come, waits for the count; call the yielded function with the
        count's answer. A count that fails (or is never given) leaves its
        echoes to the store."""
        key = (chat, message_id)
        # One id may be counted twice at once (a decide-mode bot retrying
        # `sent`): the counts share its waiting echoes.
        waiting = self._counting.get(key)
        if waiting is None:
            waiting = self._counting[key] = []
            if parked := self._parked.get(chat):
                waiting += [e for e in parked if e[0].id == message_id]
                parked[:] = [e for e in parked if e[0].id != message_id]
        self._counts[key] = self._counts.get(key, 0) + 1
        answer: list[SentResult] = []
        try:
            yield answer.append
        finally:
            left = self._counts.pop(key) - 1
            if left:
                self._counts[key] = left
            else:
                del self._counting[key]
            if answer:
                self._sent[key] = answer[0]
                if len(self._sent) > SENT_REMEMBERED:
                    self._sent.popitem(last=False)
                for msg, started in waiting:
                    self._own(msg, answer[0], started)
                waiting.clear()
            elif not left:  # no count will come: the store decides them
                for msg, _ in waiting:
                    self._decide_later(msg)
                waiting.clear()

    def _decide_later(self, msg: Message) -> None:
        """An own message no count claimed: the store decides, in a task."""
        task = asyncio.ensure_future(self._decide(msg))
        self._later.add(task)
        task.add_done_callback(self._decided_later)

    def _decided_later(self, task: asyncio.Task[Decision]) -> None:
        self._later.discard(task)
        if task.cancelled() or (exc := task.exception()) is None:
            return
        if isinstance(exc, ShuttingDown):  # its sender counts it (when it is another replica)
            log.info("bot %s: its own message came while stopping; not counted", self._name())
        else:
            log.error("bot %s: deciding on its own message failed: %s", self._name(), exc)
