"""What every chat adapter does the same way: cut a reply to the platform's
message size, and send the pieces so that each one is counted as this bot's
turn under the id the platform gave it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager

from gateway.errors import BotbouncerError
from gateway.inflight import ShuttingDown
from gateway.model import Decision, Turn
from gateway.pipeline import Gateway
from gateway.store import StoreError

# the one cleaning of text, platforms' and backends' alike
from gateway.wire import clean as clean

log = logging.getLogger("botbouncer.adapters")


class SendFailed(BotbouncerError):
    """The platform refused a message; the text says what it answered."""


async def handle_event(gateway: Gateway, what: str, work: Callable[[], Awaitable[None]]) -> None:
    """Handle one platform event as in-flight work (a stopping daemon lets it
    finish). What arrives while stopping, or while the store is unreachable,
    is logged; nothing is raised into the platform library's event loop."""
    try:
        with gateway.inflight.track():
            await work()
    except ShuttingDown:
        log.info("bot %s: %s arrived while stopping; not handled", gateway.bot.name, what)
    except StoreError as exc:
        log.error("bot %s: %s not handled: %s", gateway.bot.name, what, exc)


# A backend that answers within this many seconds shows no typing indicator:
# it would cost a request per message and say nothing a reply does not.
TYPING_AFTER = 0.3


class typing_beside:
    """Show `indicate()` (a platform's typing indicator) while the body runs,
    beside it: only once the body took TYPING_AFTER seconds, never delaying
    it, and a failing indicator fails nothing (logged at debug). A body done
    sooner (every quick answer) costs one timer, no task."""

    def __init__(
        self, indicate: Callable[[], AbstractAsyncContextManager[object]], where: str
    ) -> None:
        self._indicate = indicate
        self._where = where
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(TYPING_AFTER, self._start)

    async def __aexit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._task is not None:
            self._task.cancel()

    def _start(self) -> None:
        self._task = asyncio.ensure_future(self._show())

    async def _show(self) -> None:
        try:
            async with self._indicate():
                await asyncio.Event().wait()  # until cancelled: the body is done
        except Exception as exc:  # (cancelling, the body done, is no Exception)
            log.debug("typing indicator in %s failed: %s", self._where, exc)


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units, as Telegram counts (an emoji is two)."""
    return len(text.encode("utf-16-le")) // 2


def _fitting(text: str, limit: int, size: Callable[[str], int]) -> int:
    """How many characters of `text` fit in `limit` units of `size`."""
    if size is len or size(text) <= limit:
        return min(len(text), limit)
    lo, hi = 0, min(len(text), limit)  # a character is at least one unit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if size(text[:mid]) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return lo


def split_message(text: str, limit: int, size: Callable[[str], int] = len) -> list[str]:
    """Pieces of at most `limit` units (`size`: characters unless told), cut
    at a line break or a space when one is in the second half of the piece,
    else hard. Blank pieces are dropped."""
    pieces: list[str] = []
    while size(text) > limit:
        fit = max(1, _fitting(text, limit, size))
        cut = text.rfind("\n", fit // 2, fit + 1)
        if cut < 0:
            cut = text.rfind(" ", fit // 2, fit + 1)
        if cut <= 0:
            piece, text = text[:fit], text[fit:]
        else:
            piece, text = text[:cut], text[cut + 1 :]
        if piece.strip():  # a platform refuses a blank message, and the rest with it
            pieces.append(piece)
    if text.strip():
        pieces.append(text)
    return pieces


async def deliver(
    gateway: Gateway,
    d: Decision,
    pieces: Iterable[str],
    send: Callable[[str, int], Awaitable[str]],
    *,
    warning: bool = False,
) -> int:
    """Send `pieces` in order with `send(text, index) -> platform message id`
    and count each as this bot's turn under that id. Returns how many went.

    A reply that fails (or is cancelled at shutdown) before its first piece
    went gives its rate-cap slot back; a later failure stops the rest, since
    what was sent is already counted. Nothing is retried here: a platform
    library that retries does so only where nothing was delivered. An
    answer goes out in `max_reply_messages` messages at most, and a piece
    that brings the chat to its hard limit is the last: the rest of a reply
    that long would flood the chat.
    """
    with gateway.sending(d.chat):
        return await _deliver(gateway, d, pieces, send, warning)


async def _deliver(
    gateway: Gateway,
    d: Decision,
    pieces: Iterable[str],
    send: Callable[[str, int], Awaitable[str]],
    warning: bool,
) -> int:
    first, sent, stopped = not warning, 0, False
    pieces = list(pieces)
    most = gateway.bot.max_reply_messages
    if len(pieces) > most:
        log.warning("bot %s: a reply in %s takes %d messages; the first %d are sent "
                    "(max_reply_messages)", gateway.bot.name, d.chat, len(pieces),
                    most)  # fmt: skip
        pieces = pieces[:most]
    for piece in pieces:
        if stopped:
            log.warning("bot %s: a reply in %s stopped after %d of its %d messages: the chat "
                        "reached its hard limit", gateway.bot.name, d.chat, sent,
                        len(pieces))  # fmt: skip
            return sent
        try:
            message_id = await send(piece, sent)
        except SendFailed as exc:
            if sent == 0 and not warning:
                await gateway.unsent(d, str(exc))
            else:
                log.warning("bot %s: sending in %s failed after %d message(s): %s",
                            gateway.bot.name, d.chat, sent, exc)  # fmt: skip
            return sent
        except asyncio.CancelledError:
            if sent == 0 and not warning:
                await asyncio.shield(gateway.unsent(d, "cancelled at shutdown"))
            raise
        counted = await gateway.sent(d, message_id, piece, first=first)
        stopped = counted.turn in (Turn.HARD_LIMIT, Turn.STOPPED)
        first, sent = False, sent + 1
    return sent
