"""What every fake platform server shares: each recorded change notifies one
asyncio.Condition, so tests wait for what they expect, with a deadline,
instead of sleeping."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Recording:
    """Base of the fakes: `await changed()` after recording, `wait_until` in tests."""

    label = "fake"  # named in timeout messages

    def __init__(self) -> None:
        self._cond = asyncio.Condition()

    async def changed(self) -> None:
        """Wake every waiter (called on each recorded change)."""
        async with self._cond:
            self._cond.notify_all()

    async def wait_until(
        self,
        predicate: Callable[[], T],
        timeout: float = 5.0,  # noqa: ASYNC109 - a deadline, not a cancel scope
        what: str = "condition",
    ) -> T:
        """Wait until predicate() is truthy (rechecked on every change); return its value."""
        try:
            async with asyncio.timeout(timeout), self._cond:
                return await self._cond.wait_for(predicate)
        except TimeoutError:
            raise TimeoutError(
                f"{self.label}: timed out after {timeout}s waiting for {what}"
            ) from None
