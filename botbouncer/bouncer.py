"""`Bouncer`: botbouncer's gateway in your bot's own process.

A bot that keeps its platform token asks the Bouncer about each message it
sees and says what it did with the answer, exactly as the daemon's decide API
does (the same `gateway.decide.Decider` behind both): same rules, same store,
same reason codes. On `memory://` the state is this process's; on Redis it is
shared with every daemon and every other Bouncer on that Redis, so a wrapped
bot and a fronted bot in one chat keep one count.

    async with Bouncer("botbouncer.yml", bot="helper") as bouncer:
        d = await bouncer.decide(message)          # a gateway.model.Message
        if d.action is Action.REPLY:
            async with bouncer.answering(d) as answer:
                sent = await channel.send("hi")
                await answer.sent(str(sent.id), "hi")
        elif d.action is Action.WARN:
            ...post d.warning, then bouncer.sent(d, [its id])

The middlewares in botbouncer.discord, botbouncer.telegram,
botbouncer.aiogram and botbouncer.slack do this for you.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, suppress
from dataclasses import replace
from types import TracebackType
from typing import Any

from gateway.classifier import Classifier
from gateway.config import (
    BotConfig,
    Config,
    ConfigError,
    UnknownBotError,
    load_config,
    parse_config,
)
from gateway.decide import Decider
from gateway.model import Action, Decision, Message, Reason, Turn
from gateway.outbound import Outbound
from gateway.pipeline import Gateway, context_for
from gateway.store import SentResult, Store, open_store
from gateway.store.tickets import ProcessTickets

# The ticket of a decision filed in the store under a key (`Bouncer.decide`
# with `shared`): this prefix, then the key. A process ticket
# (secrets.token_urlsafe) never holds a ':'.
SHARED = "shared:"

ConfigSource = str | os.PathLike[str] | Config | Mapping[str, Any] | None


def _config(source: ConfigSource, bot: str | None, platform: str | None) -> Config:
    if isinstance(source, Config):
        return source
    if source is None:  # built-in defaults: one decide bot on the memory store
        one = {"name": bot or "bot", "platform": platform or "http", "mode": "decide"}
        return parse_config(json.dumps({"bots": [one]}))
    if isinstance(source, Mapping):
        return parse_config(json.dumps(source), source="<mapping>")
    return load_config(source)


def _pick(config: Config, name: str | None, platform: str | None) -> BotConfig:
    if name is not None:
        try:
            bot = config.bot(name)
        except UnknownBotError as exc:  # a KeyError elsewhere; here, a config problem
            raise ConfigError(str(exc)) from None
    else:
        deciders = [b for b in config.bots if b.mode == "decide"]
        if not deciders:
            raise ConfigError("no bot has mode: decide; a bot that keeps its own token needs it")
        bot = deciders[0]
    if bot.mode != "decide":
        raise ConfigError(f"bot {bot.name!r} has mode: proxy (the daemon runs it); a bot that "
                          "keeps its own token needs mode: decide")  # fmt: skip
    if platform is not None and bot.platform != platform:
        raise ConfigError(f"bot {bot.name!r} is configured for platform {bot.platform}, "
                          f"not {platform}: chats are counted per platform")  # fmt: skip
    return bot


class Answer:
    """One reply being sent under a ticket (Bouncer.answering)."""

    def __init__(self, bouncer: Bouncer, decision: Decision) -> None:
        self._bouncer = bouncer
        self.decision = decision
        self.ids: list[str] = []
        self.tried = False  # a sent call spends the ticket, even one that then fails

    async def sent(self, message_id: str, text: str = "") -> SentResult:
        """Count one message sent for this reply (call it once per message)."""
        self.tried = True
        (counted,) = await self._bouncer.sent(self.decision, [message_id], [text])
        self.ids.append(message_id)
        return counted


class Bouncer:
    """botbouncer in process for one bot with `mode: decide`.

    `config`: a config file's path, a Config, a mapping of the same keys, or
    None for the built-in defaults (one decide bot on `memory://`). `bot`
    picks the bot by name (default: the first with mode: decide); `platform`,
    when given, must be that bot's (a middleware passes its own). `store`
    replaces the configured one (tests; several Bouncers on one MemoryStore).
    """

    def __init__(
        self,
        config: ConfigSource = None,
        *,
        bot: str | None = None,
        platform: str | None = None,
        store: Store | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.config = _config(config, bot, platform)
        self.bot = _pick(self.config, bot, platform)
        s = self.config.store
        self._own_store = store is None
        self.store: Store = store if store is not None else open_store(
            s.url, timeout=s.timeout_seconds, state_ttl_seconds=s.state_ttl_seconds,
            settings_ttl_seconds=s.settings_ttl_seconds, context_size=context_for(self.bot),
            max_chats=s.max_chats,
        )  # fmt: skip
        self._outbound = Outbound()
        rd = self.bot.reply_decision
        classifier = Classifier(rd, self.bot.name, self._outbound) if rd.enabled else None
        self.gateway = Gateway(self.bot, self.store, None, classifier=classifier, clock=clock)
        # Its tickets never leave this process: kept here, not filed in the store
        self._decider = Decider(self.gateway, ProcessTickets())
        # ... but for a decision shared with other processes: filed in the store
        self._shared = Decider(self.gateway)  # its tickets filed in the store

    @property
    def bot_id(self) -> str:
        """This bot's id on its platform: its messages' author id, what a
        mention of it carries. A middleware sets it once the bot logged in."""
        return self.gateway.bot_id

    @bot_id.setter
    def bot_id(self, value: str) -> None:
        self.gateway.bot_id = value

    async def decide(self, message: Message, *, shared: str | None = None) -> Decision:
        """May the bot answer `message`? `reply` and `warn` carry a ticket.

        `shared`, a key naming the message (its chat key and id, say): the
        decision is filed in the store under it for the bot's
        `ticket_seconds`, whatever it is, so that another process of the bot
        on the same store that is handed the same message (Slack sends a
        mention as two events) finds it with `shared(key)`, and its ticket
        is good in every such process. A `duplicate` is not filed: the
        decision filed first stands. Should filing fail, a `reply`'s slot is
        given back before the error is raised."""
        if shared is None:
            return await self._decider.decide(message)
        d = await self.gateway.handle(message)
        if d.reason is Reason.DUPLICATE:
            return d
        try:
            await self._shared.file(d, shared)
        except BaseException:
            # No ticket reached the caller: the slot the admit reserved goes
            # back now (shielded, also when cancelled), not when it lapses.
            if d.action is Action.REPLY:
                with suppress(Exception):
                    await asyncio.shield(self.gateway.withdraw(d, Reason.BACKEND_ERROR))
            raise
        return d if d.action is Action.DROP else replace(d, ticket=SHARED + shared)

    async def shared(self, key: str) -> Decision | None:
        """The decision `decide(..., shared=key)` filed (in any process on
        the store), with its ticket; None when there is none: not filed
        yet, or lapsed. Its ticket may have been sent on or released since."""
        d = await self._shared.filed(key)
        if d is None:
            return None
        return d if d.action is Action.DROP else replace(d, ticket=SHARED + key)

    async def sent(
        self, ticket: str | Decision, ids: Sequence[str], texts: Sequence[str] | None = None
    ) -> list[SentResult]:
        """The bot sent these messages for a `reply` or `warn` decision."""
        decider, name = self._ticket(ticket)
        return await decider.sent(name, ids, texts)

    async def release(self, ticket: str | Decision) -> Decision:
        """The bot sent nothing for a `reply` decision: its slot goes back."""
        decider, name = self._ticket(ticket)
        return await decider.release(name)

    def _ticket(self, ticket: str | Decision) -> tuple[Decider, str]:
        """Who keeps the ticket (this process, or the store), and its name there."""
        name = _ticket(ticket)
        if name.startswith(SHARED):
            return self._shared, name[len(SHARED) :]
        return self._decider, name

    async def posted(self, chat: str, message_id: str, text: str = "") -> SentResult:
        """Count a message the bot sent on its own (not for a decided message:
        a scheduled post, a command's answer) as its turn in `chat` (the
        chat key, `ChatRef.key`). Counted once per id, like every turn."""
        own = Decision(self.gateway.bot_id, "", chat, "", Action.DROP, None, Turn.NONE, 0, 0)
        return await self.gateway.sent(own, message_id, text, first=False)

    @asynccontextmanager
    async def answering(self, decision: Decision) -> AsyncIterator[Answer]:
        """Around sending a reply: report each message with `answer.sent`; if
        none was reported when the block ends (or it raised before one was),
        the ticket is released. A report that failed (the store) spent the
        ticket already: its error goes on, and nothing is released."""
        answer = Answer(self, decision)
        try:
            yield answer
        finally:
            if not answer.tried and decision.ticket is not None:
                await self.release(decision)

    def echo(self, message: Message) -> bool:
        """Whether `message` is this bot's own, already counted when it was
        reported sent (a platform that shows a bot its messages: Discord).
        Such a message is decided without a store call."""
        return self.gateway.echo(message)

    def sending(self, chat: str) -> AbstractContextManager[None]:
        """Around a send in `chat` (the chat key): an own message seen before
        the send reported its id waits for it instead of counting twice."""
        return self.gateway.sending(chat)

    async def close(self) -> None:
        await self._outbound.close()
        if self._own_store:
            await self.store.close()

    async def __aenter__(self) -> Bouncer:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _ticket(ticket: str | Decision) -> str:
    if isinstance(ticket, Decision):
        if ticket.ticket is None:
            raise ValueError(f"the decision for {ticket.message_id} is {ticket.action.value}: "
                             "it has no ticket")  # fmt: skip
        return ticket.ticket
    return ticket
