"""Guard checks take turns, in the order their requests arrived.

Agents that share one model answer at about the same moment, so their next
requests reach the proxy together. A check is CPU (reading the history,
preparing each event for the guard) between waits on the store (on Redis,
a round trip or two). Left to the event loop, every check that arrived
together runs a piece, waits, then queues behind all the others' next
pieces: they all finish at about the time the last one does. Taking turns,
the first is forwarded after its own check, the second after two, and so
on (bench/README.md measures it: with 8 agents at once on Redis the latency
the proxy adds at p50 fell from a fifth or a quarter of a 20 ms model call
to a twentieth or less).

Two bounds keep turns from costing more than they save:
- a check waits for its turn at most `wait` seconds, then goes on beside
  the others. A queue that long means requests arrive faster than checks
  one at a time get through; checks side by side then share their store
  round trips (one write for many, gateway/store/batching.py) and serve
  more a second, where strict turns served a quarter fewer;
- a check still waiting on its store after `hold` seconds lets the next
  one start: a distant or struggling store costs each check its own wait,
  not everyone's in turn. A store that does not answer at all is bounded
  by its own timeout (`store.timeout_seconds`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

# Measured with Redis beside the daemon on two busy cores: a check takes p50
# 0.7 ms, p90 1.6 ms. HOLD_S is longer than nine checks in ten and shorter
# than two round trips to a Redis across a network; WAIT_S lets about four
# checks of a burst go ahead of one (bench/README.md, "Fourth pass").
HOLD_S = 0.002
WAIT_S = 0.003


class Turns:
    def __init__(self, wait: float = WAIT_S, hold: float = HOLD_S) -> None:
        self.wait = wait
        self.hold = hold
        self._lock = asyncio.Lock()  # its waiters are served first come, first served

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """This check's turn (or none, after `wait` seconds): the next
        starts when it ends, or after `hold` seconds."""
        lock = self._lock
        try:
            async with asyncio.timeout(self.wait):
                await lock.acquire()  # a cancelled acquire hands the lock on, never keeps it
        except TimeoutError:
            held = False  # a long queue: beside the others
        else:
            held = True
        if not held:
            yield
            return

        def let_go() -> None:
            nonlocal held
            if held:
                held = False
                lock.release()

        timer = asyncio.get_running_loop().call_later(self.hold, let_go)
        try:
            yield
        finally:
            timer.cancel()
            let_go()
