"""A per-backend circuit breaker.

After `failures` consecutive failures the breaker opens: calls fail at once for
`cooldown` seconds instead of each waiting out a timeout. Then one trial call
goes through (half-open): success closes the breaker, failure reopens it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.errors import BotbouncerError


class CircuitOpen(BotbouncerError):
    """The backend is not being called right now."""


class CircuitBreaker:
    def __init__(
        self, failures: int = 5, cooldown: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.threshold = failures
        self.cooldown = cooldown
        self.clock = clock
        self.failures = 0
        self.opened_at: float | None = None
        self._trial = False

    @property
    def state(self) -> str:
        if self.opened_at is None:
            return "closed"
        return "half-open" if self._trial else "open"

    def before_call(self) -> None:
        """Raise CircuitOpen unless this call may go through."""
        if self.opened_at is None:
            return
        if self._trial:
            raise CircuitOpen("circuit half-open: a trial call is under way")
        left = self.opened_at + self.cooldown - self.clock()
        if left > 0:
            raise CircuitOpen(f"circuit open after {self.failures} failures; "
                              f"next trial in {left:.1f} s")  # fmt: skip
        self._trial = True

    def succeeded(self) -> None:
        self.failures = 0
        self.opened_at = None
        self._trial = False

    def failed(self) -> None:
        self.failures += 1
        if self._trial or self.failures >= self.threshold:
            self.opened_at = self.clock()
        self._trial = False

    def abandoned(self) -> None:
        """The call was cancelled (shutdown): neither success nor failure."""
        self._trial = False
