"""`botbouncer demo` (README.md): the first thing a newcomer sees.

A claim like "the loop stops at the limit" is only worth showing if it is the
real thing doing it, so every message goes through `Gateway.handle` with one
MemoryStore shared by both bots, and the reply decision makes real HTTP calls.
Only the bots' brains and the model are stand-ins, and the clock is virtual,
so the story (and every number in the summary) is the same on every machine.

The bots answer when @-mentioned or replied to (`respond_to: mentions`), and
they always mention each other. Were both to answer every message, each human
message would start two conversations at once; with one, the limits the
summary reports are the ones a reader can count on the screen.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from aiohttp import web

from gateway.classifier import Classifier
from gateway.config import BotConfig, Config
from gateway.errors import BotbouncerError
from gateway.model import Action, Author, ChatRef, Decision, Message, Reason, Turn
from gateway.outbound import Outbound
from gateway.pipeline import Gateway
from gateway.store import ContextEntry, MemoryStore

SOFT_LIMIT = 6  # small, so the loop is stopped within one screen
HARD_LIMIT = 20
STEP_SECONDS = 2.0  # virtual time between two posts
LATER_SECONDS = 60.0  # ana comes back a minute later
TTY_DELAY = 0.35

HUMAN, PING, PONG = "ana", "ping-bot", "pong-bot"
CHAT = ChatRef(platform="demo", id="lounge")

# Drops that exist only because of a botbouncer limit: without them the bot
# would have answered, so each one is a backend call and a classifier call saved.
LIMIT_REASONS = frozenset(
    {
        Reason.TURN_SOFT_LIMIT,
        Reason.TURN_THROTTLED,
        Reason.TURN_HARD_LIMIT,
        Reason.TURN_STOPPED,
        Reason.PAIR_COOLDOWN,
        Reason.RATE_CAPPED,
        Reason.PAUSED,
    }
)

# What each bot says to a human, and then (in turn, forever) to the other bot.
TO_HUMAN = {
    PING: "Of course, {human}! Hello @{other}, lovely to meet you 👋",
    PONG: "Gladly, {human}! @{other}: why did the bot need a holiday? Too many loops 🔁",
}
TO_BOT = {
    PING: (
        "Splendid, thanks for asking, @{other}! And how are you?",
        "No, thank *you*, @{other}. After you, please.",
        "Ha! Brilliant one, @{other}. Thank you for sharing!",
        "Thank you for thanking me, @{other}!",
        "You are too kind, @{other}. Truly. After you.",
    ),
    PONG: (
        "The pleasure is mine, @{other}! How are you today?",
        "Never better, @{other}. Thank you so much for asking!",
        "Oh no, @{other}, after *you*. I insist!",
        "You're most welcome, @{other}! Thanks for laughing.",
        "And thank you for thanking me for thanking you, @{other}!",
    ),
}

ANA_FIRST = "@ping-bot could you say hello to pong-bot for me?"
ANA_AGAIN = "You two! @pong-bot, your turn: tell ping-bot a joke?"


class PoliteBot:
    """A bot's brain that never runs out of courtesy: the loop botbouncer must stop.

    `calls` is what the summary reports, so "backend calls made" is counted,
    not inferred.
    """

    def __init__(self, name: str, other: str) -> None:
        self.name = name
        self.other = other
        self.calls = 0
        self._lines = itertools.cycle(TO_BOT[name])

    async def reply(self, msg: Message, context: Sequence[ContextEntry]) -> list[str]:
        self.calls += 1
        if msg.author.is_bot:
            return [next(self._lines).format(other=self.other)]
        return [TO_HUMAN[self.name].format(human=msg.author.display, other=self.other)]


class StandInModel:
    """An OpenAI-compatible endpoint on 127.0.0.1 that always says REPLY.

    It is a real server so that the classifier calls in the summary are real
    HTTP requests, counted where they arrive.
    """

    def __init__(self) -> None:
        self.requests = 0
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._complete)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _complete(self, request: web.Request) -> web.Response:
        self.requests += 1
        choice = {"index": 0, "message": {"role": "assistant", "content": "REPLY"}}
        return web.json_response({"object": "chat.completion", "choices": [choice]})


@dataclass
class VirtualClock:
    """Time moved by hand: windows and cooldowns never depend on this machine's speed."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now


# --------------------------------------------------------------------------
# Presentation
# --------------------------------------------------------------------------

STYLES = {
    HUMAN: "1;32",
    PING: "1;36",
    PONG: "1;35",
    "warn": "33",
    "dim": "2",
    "quiet": "3",
    "bold": "1",
}


class Screen:
    """Writes the story; colour and pauses only for a person at a terminal."""

    def __init__(self, out: TextIO, *, color: bool, delay: float) -> None:
        self.out = out
        self.color = color
        self.delay = max(0.0, delay)
        self.width = max(len(n) for n in (HUMAN, PING, PONG))

    def paint(self, text: str, style: str) -> str:
        return f"\x1b[{STYLES[style]}m{text}\x1b[0m" if self.color else text

    def write(self, line: str) -> None:
        try:
            self.out.write(line + "\n")
        except UnicodeEncodeError:  # a terminal that cannot show emoji: still no traceback
            encoding = getattr(self.out, "encoding", None) or "ascii"
            self.out.write(line.encode(encoding, "replace").decode(encoding) + "\n")
        self.out.flush()

    async def show(self, line: str, pause: float = 1.0) -> None:
        self.write(line)
        if self.delay:
            await asyncio.sleep(self.delay * pause)

    async def message(self, msg: Message, warning: bool = False) -> None:
        name = self.paint(f"{msg.author.id:>{self.width}}", msg.author.id)
        text = self.paint(msg.text, "warn") if warning else msg.text
        await self.show(f"{name} │ {text}")

    async def note(self, text: str) -> None:
        await self.show(self.paint(f"{'':>{self.width}} · {text}", "dim"), pause=0.5)

    async def skipped(self, d: Decision, reason: Reason, what: str) -> None:
        note = f"{d.bot} skipped {d.author}'s {what}: {reason.value}"
        if d.action is Action.WARN:
            note += " (posts the warning instead)"
        await self.note(note)


# --------------------------------------------------------------------------
# The chat
# --------------------------------------------------------------------------


@dataclass
class Tally:
    replies: int = 0
    warnings: int = 0
    avoided: int = 0
    first_stop: int | None = None  # bot replies before the chat first went quiet


class Chat:
    """The platform: every post goes to every bot, in order, until nobody answers.

    A bot's post is counted with `Gateway.sent` under a fresh id before anyone
    sees it, exactly as adapters/http.py does, so each message is one turn.
    """

    def __init__(self, gateways: Sequence[Gateway], clock: VirtualClock, screen: Screen) -> None:
        self.gateways = gateways
        self.clock = clock
        self.screen = screen
        self.tally = Tally()
        self._queue: deque[Message] = deque()
        self._warnings: set[str] = set()
        self._ids: Iterator[int] = itertools.count(1)
        self._soft = 0  # the chat's bot-turn counter as the last send reported it
        self._before: dict[str, int] = {}  # human message id -> the counter it found

    def _message(self, author: Author, text: str, reply_to: str | None = None) -> Message:
        mentions = tuple(g.bot_id for g in self.gateways if f"@{g.bot_id}" in text)
        msg_id = f"{author.id}-{next(self._ids)}"
        return Message(msg_id, CHAT, author, text, mentions=mentions, reply_to=reply_to)

    async def human_says(self, text: str) -> None:
        msg = self._message(Author(HUMAN, HUMAN), text)
        self._before[msg.id] = self._soft
        await self._post(msg)
        await self._until_quiet()

    async def _post(self, msg: Message, warning: bool = False) -> None:
        self.clock.now += STEP_SECONDS
        if warning:
            self._warnings.add(msg.id)
        self._queue.append(msg)
        await self.screen.message(msg, warning)

    async def _until_quiet(self) -> None:
        while self._queue:
            msg = self._queue.popleft()
            for gateway in self.gateways:
                await self._deliver(gateway, msg)

    async def _deliver(self, gateway: Gateway, msg: Message) -> None:
        d = await gateway.handle(msg)
        await self._explain(d, msg)
        if d.action is Action.REPLY:
            for i, text in enumerate(d.replies):
                await self._send(gateway, d, msg, text, first=i == 0)
                self.tally.replies += 1
        elif d.action is Action.WARN and d.warning:
            await self._send(gateway, d, msg, d.warning, first=False, warning=True)
            self.tally.warnings += 1

    async def _explain(self, d: Decision, msg: Message) -> None:
        """Say why a bot stays silent: the reasons, not the silence, are the point."""
        before = self._before.pop(msg.id, 0)  # once per message, by the first bot to see it
        if d.turn is Turn.RESET and before > 0:
            note = f"a human spoke: bot turns {before} → {d.soft}, bots may answer bots again"
            await self.screen.note(note)
        if d.reason is None or d.reason is Reason.OWN_MESSAGE:
            return  # an answer, or a bot seeing its own post: nothing declined
        if d.reason in LIMIT_REASONS:
            self.tally.avoided += 1
        what = "warning" if msg.id in self._warnings else "message"
        await self.screen.skipped(d, d.reason, what)

    async def _send(
        self,
        gateway: Gateway,
        d: Decision,
        answered: Message,
        text: str,
        *,
        first: bool,
        warning: bool = False,
    ) -> None:
        """Post as a reply to the message answered: a platform shows it so, and it
        addresses the author, who would answer it if no limit applied."""
        author = Author(gateway.bot_id, gateway.bot_id, is_bot=True)
        msg = self._message(author, text, reply_to=answered.author.id)
        self._soft = (await gateway.sent(d, msg.id, text, first=first)).soft
        await self._post(msg, warning)


# --------------------------------------------------------------------------
# The show
# --------------------------------------------------------------------------


def demo_config(endpoint: str) -> Config:
    """Both bots hear bots and answer mentions; the reply decision is on."""
    policy: dict[str, Any] = {
        "turns": {"soft_limit": SOFT_LIMIT, "hard_limit": HARD_LIMIT},
        "bot_messages": "all",
        "respond_to": "mentions",
        "reply_decision": {"enabled": True, "endpoint": endpoint, "model": "stand-in"},
    }
    # `echo` only satisfies the schema: each gateway is handed a PoliteBot below.
    bots = [{"name": n, "platform": "http", "backend": {"type": "echo"}} for n in (PING, PONG)]
    return Config.model_validate({"defaults": policy, "bots": bots})


def make_gateway(
    bot: BotConfig, other: str, store: MemoryStore, outbound: Outbound, clock: VirtualClock
) -> tuple[Gateway, PoliteBot]:
    brain = PoliteBot(bot.name, other)
    classifier = Classifier(bot.reply_decision, bot.name, outbound)
    return Gateway(bot, store, brain, classifier=classifier, clock=clock), brain


async def intro(screen: Screen) -> None:
    title = screen.paint("botbouncer demo", "bold")
    screen.write(f"{title} · a group chat, one human and two bots too polite to ever stop")
    limits = f"Soft limit {SOFT_LIMIT}, hard {HARD_LIMIT}."
    screen.write(f"Each bot answers whoever @-mentions or replies to it, bots too. {limits}")
    screen.write(
        "Real pipeline, virtual clock. Reply decision: a stand-in model that always says REPLY."
    )
    await screen.show("")


async def quiet(screen: Screen) -> None:
    line = "… the chat is quiet: both bots stopped answering bots until a human speaks."
    await screen.show(screen.paint(line, "quiet"), pause=3.0)


def summary(screen: Screen, tally: Tally, brains: Sequence[PoliteBot], model: StandInModel) -> None:
    backend = sum(b.calls for b in brains)
    rows = [
        ("bot replies before the first stop", f"{tally.first_stop}  (soft limit {SOFT_LIMIT})"),
        ("warnings posted", f"{tally.warnings}"),
        ("backend calls", f"{backend} made, {tally.avoided} avoided"),
        ("classifier calls", f"{model.requests} made, {tally.avoided} avoided"),
    ]
    screen.write("")
    screen.write(screen.paint("Summary", "bold"))
    for label, value in rows:
        screen.write(f"  {label:<34} {value}")
    screen.write("  avoided = a message a bot would have answered had no botbouncer limit applied")
    screen.write("Without botbouncer, ping-bot and pong-bot would have gone on like this forever.")


class DemoError(BotbouncerError):
    """The demo cannot run here; the message says why."""


async def play(screen: Screen) -> None:
    """Own the stand-in model and the HTTP session, whatever happens in the script."""
    model = StandInModel()
    try:
        await model.start()
    except OSError as exc:
        raise DemoError(f"cannot start the stand-in model on 127.0.0.1: {exc}") from None
    outbound = Outbound()
    try:
        await script(screen, model, outbound)
    finally:
        await outbound.close()
        await model.stop()


async def script(screen: Screen, model: StandInModel, outbound: Outbound) -> None:
    """ana starts a loop, it stops; ana speaks again, it resumes and stops again."""
    clock = VirtualClock()
    config = demo_config(model.url)
    store = MemoryStore(context_size=config.defaults.reply_decision.context_messages)
    ping, ping_brain = make_gateway(config.bot(PING), PONG, store, outbound, clock)
    pong, pong_brain = make_gateway(config.bot(PONG), PING, store, outbound, clock)
    chat = Chat([ping, pong], clock, screen)
    await intro(screen)
    await chat.human_says(ANA_FIRST)
    await quiet(screen)
    chat.tally.first_stop = chat.tally.replies
    clock.now += LATER_SECONDS
    await screen.show(screen.paint(f"{'':>{screen.width}}   (a minute later)", "dim"))
    await chat.human_says(ANA_AGAIN)
    await quiet(screen)
    summary(screen, chat.tally, [ping_brain, pong_brain], model)


def wants_color(out: TextIO) -> bool:
    """Colour for a person at a terminal; never in a pipe, a file or under NO_COLOR."""
    return out.isatty() and not os.environ.get("NO_COLOR")


def pause_between_lines(out: TextIO, delay: float | None) -> float:
    """A person watching gets time to read; a pipe or a test gets everything at once."""
    if delay is not None:
        return delay
    return TTY_DELAY if out.isatty() else 0.0


def run_demo(*, delay: float | None = None, color: bool = True, out: TextIO | None = None) -> int:
    stream = out or sys.stdout
    pause = pause_between_lines(stream, delay)
    screen = Screen(stream, color=color and wants_color(stream), delay=pause)
    try:
        asyncio.run(play(screen))
    except DemoError as exc:
        print(f"botbouncer: demo: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # `botbouncer demo | head`: the reader left; say nothing more, and keep
        # Python from complaining when it flushes stdout on the way out.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        return 1
    return 0
