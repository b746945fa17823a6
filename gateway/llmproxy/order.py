"""Guard checks one at a time, in the order their requests arrived.

Agents that share one model answer at about the same moment, so their next
requests reach the proxy together. A check is CPU (reading the history,
preparing each event for the guard) between waits on the store (on Redis,
a round trip or two). Left to the event loop, every check that arrived
together runs a piece, waits, then queues behind all the others' next
pieces: they all finish at about the time the last one does. One at a
time, the first is forwarded after its own check, the second after two,
and so on (bench/README.md measures it: with 8 agents at once on Redis the
latency the proxy adds at p50 fell from a fifth or a quarter of a 20 ms
model call to a twentieth or less).

A check that waits on its store longer than `hold` seconds lets the next
one start and finishes on its own: a distant or struggling store costs
each check its own wait, not everyone's in turn. A store that does not
answer at all is bounded by its own timeout (`store.timeout_seconds`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

# Longer than nine checks in ten take with Redis beside the daemon under load
# (measured on two busy cores: p50 0.7 ms, p90 1.6 ms, p99 3.2 ms), shorter
# than two round trips to a Redis across a network.
HOLD_S = 0.002


class OneAtATime:
    def __init__(self, hold: float = HOLD_S) -> None:
        self.hold = hold
        self._lock = asyncio.Lock()  # its waiters are served first come, first served

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """This check's turn: the next starts when it ends, or after `hold` seconds."""
        lock = self._lock
        await lock.acquire()
        held = True

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
