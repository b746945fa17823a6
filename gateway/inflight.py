"""The work a stopping daemon lets finish: tracked tasks, drained with a deadline.

A message being handled holds a rate-cap slot and maybe a backend call; on
SIGTERM the daemon refuses new work, waits up to the grace period for these
tasks, then cancels the rest - and a cancelled message gives its slot back
(Gateway.handle), so a shutdown never leaves a chat's budget spent.
"""

from __future__ import annotations

import asyncio

from gateway.errors import Unavailable


class ShuttingDown(Unavailable):
    """New work refused: the daemon is stopping."""

    def public(self) -> str:
        return "botbouncer is shutting down; send this to another replica"


class _Tracked:
    """`with inflight.track():` - a class, not a generator: it runs twice per message."""

    __slots__ = ("_inflight", "_task")

    def __init__(self, inflight: InFlight) -> None:
        self._inflight = inflight
        self._task: asyncio.Task[object] | None = None

    def __enter__(self) -> None:
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - always called from a task
            return
        tasks = self._inflight._tasks
        if self._inflight.closed and task not in tasks:
            raise ShuttingDown("the daemon is shutting down")
        tasks[task] = tasks.get(task, 0) + 1
        self._inflight._idle.clear()
        self._task = task

    def __exit__(self, *exc: object) -> None:
        task = self._task
        if task is None:  # pragma: no cover
            return
        tasks = self._inflight._tasks
        depth = tasks.pop(task) - 1
        if depth:
            tasks[task] = depth
        elif not tasks:
            self._inflight._idle.set()


class InFlight:
    def __init__(self) -> None:
        self._tasks: dict[asyncio.Task[object], int] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self.closed = False

    def __len__(self) -> int:
        return len(self._tasks)

    def track(self) -> _Tracked:
        """Mark the current task as in flight (re-entrant: an adapter may wrap handle())."""
        return _Tracked(self)

    async def idle(self) -> None:
        """Until nothing is in flight (what was being handled is done)."""
        await self._idle.wait()

    def close(self) -> None:
        """Refuse new work from now on; work already tracked may go on."""
        self.closed = True

    async def drain(self, grace: float, hurry: asyncio.Event | None = None) -> int:
        """Wait up to `grace` seconds for tracked work (or until `hurry` is
        set: a second SIGTERM); cancel what is left.

        Returns how many tasks had to be cancelled.
        """
        self.close()
        waits = [asyncio.ensure_future(self._idle.wait())]
        if hurry is not None:
            waits.append(asyncio.ensure_future(hurry.wait()))
        try:
            await asyncio.wait(waits, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if self._idle.is_set():
            return 0
        left = list(self._tasks)
        for task in left:
            task.cancel()
        await asyncio.wait(left, timeout=5)  # their slot releases, bounded
        return len(left)
