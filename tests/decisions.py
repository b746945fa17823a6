"""The decisions the pipeline logs, awaitable: end-to-end tests wait on the
decision a daemon made for a message instead of sleeping."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any


class Decisions(logging.Handler):
    """Every decision the pipeline logs (own_message ones at DEBUG included),
    awaitable by message id and bot."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[dict[str, Any]] = []
        self.levels: dict[tuple[str, str], int] = {}  # (id, bot) -> level logged at
        self.changed = asyncio.Condition()
        self.loop = asyncio.get_running_loop()
        self._notes: set[asyncio.Task[None]] = set()  # held until done

    def emit(self, record: logging.LogRecord) -> None:
        decision = getattr(record, "decision", None)
        if decision is not None:
            self.seen.append(decision)
            self.levels[(decision["id"], decision["bot"])] = record.levelno
            task = self.loop.create_task(self._notify())
            self._notes.add(task)
            task.add_done_callback(self._notes.discard)

    def logged_at(self, message_id: int | str, bot: int | str) -> int:
        """The level the decision on `message_id` by `bot` was logged at."""
        return self.levels[(str(message_id), str(bot))]

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def wait(
        self,
        message_id: int | str,
        bot: int | str,
        timeout: float = 10,  # noqa: ASYNC109
    ) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            return next(
                (d for d in self.seen if d["id"] == str(message_id) and d["bot"] == str(bot)),
                None,
            )

        async with asyncio.timeout(timeout), self.changed:
            got = await self.changed.wait_for(found)
        assert got is not None
        return got


@asynccontextmanager
async def capture() -> AsyncIterator[Decisions]:
    """Collect the `botbouncer.decision` log lines while the block runs."""
    handler = Decisions()
    logger = logging.getLogger("botbouncer.decision")
    old = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
