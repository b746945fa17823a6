"""Drive one chat through one store handle, with an injected clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.model import Reason
from gateway.store import (
    AdmitRequest,
    AdmitResult,
    Limits,
    Observed,
    SentRequest,
    SentResult,
    Store,
)
from gateway.turns import Count


@dataclass
class Chat:
    """One chat seen through one store handle, with time in milliseconds."""

    store: Store
    chat: str = "test:c1"
    limits: Limits = field(default_factory=Limits)
    now_ms: int = 1_000_000
    _seq: int = 0

    def tick(self, seconds: float = 1.0) -> None:
        self.now_ms += round(seconds * 1000)

    def next_id(self) -> str:
        self._seq += 1
        return f"{self.chat}/m{self._seq}"

    async def admit(
        self,
        author: str,
        *,
        bot: str = "B",
        count: Count = Count.BOT,
        author_is_bot: bool | None = None,
        local: Reason | None = None,
        mid: str | None = None,
        text: str = "hello",
        context: int = 0,
        tick: float = 1.0,
        hold_ms: int = 0,
    ) -> AdmitResult:
        """`bot` admits a message by `author`; own messages are flagged as the pipeline would."""
        self.tick(tick)
        if author == bot and local is None:
            local = Reason.OWN_MESSAGE
        obs = Observed(self.chat, mid or self.next_id(), author, author, count, text)
        return await self.store.admit(
            AdmitRequest(
                msg=obs,
                bot=bot,
                local_reason=local,
                author_is_bot=count is Count.BOT if author_is_bot is None else author_is_bot,
                limits=self.limits,
                context=context,
                now_ms=self.now_ms,
                hold_ms=hold_ms,
            )
        )

    async def human(self, author: str = "alice", text: str = "hi", **kw: Any) -> AdmitResult:
        count = Count.RESET if text.strip() else Count.NONE
        return await self.admit(author, count=count, author_is_bot=False, text=text, **kw)

    async def sent(
        self, bot: str, *, mid: str | None = None, count: Count = Count.BOT, answered: str = ""
    ) -> SentResult:
        """`bot` sent a message; as the answer to `answered` it fills that turn hold."""
        self.tick()
        obs = Observed(self.chat, mid or self.next_id(), bot, bot, count, "reply")
        req = SentRequest(obs, bot, self.limits, now_ms=self.now_ms, answered=answered)
        return await self.store.record_sent(req)
