"""Alerts (docs/operations.md#alerts): a webhook, Slack or Discord told when a
chat's loop was stopped, an agent blocked, or the store lost.

Off the decision path: a decision or a guard answer only puts an alert on
each target's bounded queue (`put_nowait`; a full queue drops it and counts
the drop), and one task per target sends them, so a slow or dead target
delays nothing but its own alerts. Each is sent once per threshold: a limit
warning is posted once per chat by the store already; the others are
claimed in the store first (gateway/store: `claim`), per target, for as long
as the threshold holds (the pair cooldown, the rate-cap window, the guard
session), so three replicas seeing the same cooldown send one alert. A send
that fails is tried again with backoff (1, 2, 4 ... s, at most 30 s, or the
target's Retry-After); a 4xx other than 429 is not retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp

from gateway.config.alerts import AlertTarget
from gateway.errors import BotbouncerError
from gateway.model import Action, Decision, Reason
from gateway.outbound import client_session

if TYPE_CHECKING:
    from gateway.config import BotConfig
    from gateway.guard.service import Answer
    from gateway.metrics import Metrics
    from gateway.store import Store

log = logging.getLogger("botbouncer.alerts")
BACKOFF = 1.0  # the first retry's wait, doubled each time
MAX_BACKOFF = 30.0
MAX_RECENT = 10_000  # claims this process remembers having queued
DRAIN_SECONDS = 2.0  # at stop: how long queued alerts may still go out


@dataclass(frozen=True)
class Alert:
    event: str
    subject: str  # the chat key or the guard session
    reason: str
    text: str  # for a person: what happened and what to do
    fields: dict[str, Any] = field(default_factory=dict)
    claim: tuple[str, int] | None = None  # (name, ttl in ms): sent once while it holds
    at: float = field(default_factory=time.time)

    def payload(self) -> dict[str, Any]:
        return {
            "event": self.event,
            "subject": self.subject,
            "reason": self.reason,
            "text": self.text,
            "at": self.at,
            **self.fields,
        }


# The chat command that resets a chat, for a bot the daemon runs on that
# platform (docs/platforms.md); an `http` bot, or one in decide mode, has none.
_RESET_COMMAND = {
    "discord": "/bouncer reset",
    "slack": "/bouncer reset",
    "telegram": "/bouncer_reset",
    "matrix": "!bouncer reset",
}


def _reset_hint(chat: str, bot: BotConfig, *, person: bool) -> str:
    """What resets `chat`: a person's message when `person` (it zeroes the turn
    counters, not a pair cooldown), the chat command where `bot`'s chat has
    one, and the admin API's reset."""
    command = _RESET_COMMAND.get(bot.platform) if bot.mode == "proxy" else None
    ways = [
        *(["a person's message"] if person else []),
        *([f"`{command}` in the chat"] if command else []),
        f"the admin API's reset (POST /v1/admin/chats/{chat}/reset)",
    ]
    if len(ways) == 1:
        return ways[0]
    return ", ".join(ways[:-1]) + (", or " if len(ways) > 2 else " or ") + ways[-1]


def _chat_alert(d: Decision, bot: BotConfig) -> Alert | None:
    """The alert a chat decision raises, if any."""
    chat, fields = d.chat, {"bot": d.bot, "author": d.author, "soft": d.soft, "hard": d.hard}
    if d.action is Action.WARN and d.reason in (Reason.TURN_SOFT_LIMIT, Reason.TURN_HARD_LIMIT):
        hard = d.reason is Reason.TURN_HARD_LIMIT
        limit = bot.turns.hard_limit if hard else bot.turns.soft_limit
        # Past either limit every bot message in the chat is dropped
        # (turn_throttled, turn_stopped), addressed or not.
        return Alert(
            "limit_reached", chat, d.reason.value,
            f"botbouncer: bot loop in {chat}: {'hard' if hard else 'soft'} limit of {limit} bot "
            f"turns reached (last bot: {d.author}; warned by {d.bot}). No bot answers a bot there "
            "until a person writes. To let them go on: "
            f"{_reset_hint(chat, bot, person=True)}.",
            {**fields, "limit": limit},
        )  # fmt: skip
    if d.reason is Reason.PAIR_COOLDOWN:
        pair = "|".join(sorted((d.bot, d.author)))
        p = bot.pairs
        return Alert(
            "pair_cooldown", chat, d.reason.value,
            f"botbouncer: {d.bot} and {d.author} answered each other {p.max_events} times "
            f"within {p.window_seconds:g} s in {chat}; they are on cooldown for "
            f"{p.cooldown_seconds:g} s. To end it now: {_reset_hint(chat, bot, person=False)}.",
            fields, (f"pair:{chat}:{pair}", max(1, round(p.cooldown_seconds * 1000))),
        )  # fmt: skip
    if d.reason is Reason.RATE_CAPPED:
        r = bot.rate_cap
        return Alert(
            "rate_capped", chat, d.reason.value,
            f"botbouncer: {d.bot} reached its rate cap in {chat} ({r.max_replies} replies in "
            f"{r.window_seconds:g} s); it answers nothing more there until the window moves. "
            "If this is a loop, see the chat's decisions (GET /v1/admin/chats/"
            f"{chat}/decisions); if it is legitimate traffic, raise rate_cap.",
            fields, (f"rate:{chat}:{d.bot}", max(1, round(r.window_seconds * 1000))),
        )  # fmt: skip
    return None


def _guard_alerts(session: str, answer: Answer, ttl_ms: int) -> list[Alert]:
    found = {answer.reason, *answer.also}
    fields = {"decision": answer.decision, "evidence": answer.evidence, "budget": answer.budget}
    out = []
    start_over = f"DELETE /v1/guard/{session} starts it over; GET shows what it holds"
    if "budget_exhausted" in found:
        out.append(Alert(
            "budget_exhausted", session, "budget_exhausted",
            f"botbouncer: agent session {session} spent its budget; every step is blocked "
            f"from here. {start_over}.", fields, (f"budget:{session}:spent", ttl_ms),
        ))  # fmt: skip
    elif "budget_warning" in found:
        out.append(Alert(
            "budget_warning", session, "budget_warning",
            f"botbouncer: agent session {session} is past its budget's warning level "
            f"({_spent(answer.budget)}). {start_over}.",
            fields, (f"budget:{session}:warn", ttl_ms),
        ))  # fmt: skip
    if answer.decision == "block" and answer.reason != "budget_exhausted":
        out.append(Alert(
            "guard_block", session, answer.reason,
            f"botbouncer: agent session {session} blocked ({answer.reason}): "
            f"{answer.message} {start_over}.",
            fields, (f"guard:{session}:{answer.reason}", ttl_ms),
        ))  # fmt: skip
    return out


def _spent(budget: dict[str, Any]) -> str:
    parts = []
    if budget.get("usd_limit") is not None:
        parts.append(f"${budget['usd_spent']:.4f} of ${budget['usd_limit']:.4f}")
    if budget.get("tokens_limit") is not None:
        parts.append(f"{budget['tokens_spent']} of {budget['tokens_limit']} tokens")
    return ", ".join(parts) + " spent" if parts else "spent"


def render(kind: str, alert: Alert) -> dict[str, Any]:
    """The body each kind of target takes."""
    if kind == "slack":  # an incoming webhook; mrkdwn off: chat names stay as they are
        # & < > escaped as Slack asks: a chat or session name is anyone's to
        # choose (the HTTP ingress), and `<!channel>` in it would ping everyone
        text = alert.text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        return {"text": text, "mrkdwn": False}
    if kind == "discord":  # a channel webhook: at most 2,000 characters, no pings
        return {"content": alert.text[:2000], "allowed_mentions": {"parse": []}}
    return alert.payload()


class Alerts:
    def __init__(
        self,
        targets: list[AlertTarget],
        store: Store,
        metrics: Metrics,
        session_ttl_seconds: int = 86400,
    ) -> None:
        self.targets = targets
        self.store = store
        self.metrics = metrics
        self.session_ttl_ms = session_ttl_seconds * 1000
        self.host = socket.gethostname()
        self._queues = [asyncio.Queue[Alert](maxsize=t.queue) for t in targets]
        self._tasks: list[asyncio.Task[None]] = []
        self._recent: OrderedDict[str, float] = OrderedDict()  # claim -> until (monotonic)
        self._client: aiohttp.ClientSession | None = None

    def start(self) -> None:
        self._client = client_session()
        self._tasks = [
            asyncio.create_task(self._run(i, t, q), name=f"alerts-{i}")
            for i, (t, q) in enumerate(zip(self.targets, self._queues, strict=True))
        ]

    async def stop(self) -> None:
        """What is queued may go out for DRAIN_SECONDS; then the rest is dropped."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(q.join() for q in self._queues)), DRAIN_SECONDS)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.close()

    # -- what raises alerts (called on the decision path: never awaits) -----------

    def decision(self, d: Decision, bot: BotConfig) -> None:
        if d.reason is None or not self.targets:
            return
        alert = _chat_alert(d, bot)
        if alert is not None:
            self.put(alert)

    def guard(self, session: str, answer: Answer) -> None:
        if answer.decision == "allow" or not self.targets:
            return
        for alert in _guard_alerts(session, answer, self.session_ttl_ms):
            self.put(alert)

    def store_changed(self, degraded: bool, why: str = "") -> None:
        if degraded:
            self.put(Alert("store_degraded", self.host, "store_degraded",
                           f"botbouncer on {self.host}: the shared store is unreachable"
                           f"{f' ({why})' if why else ''}; this replica decides on its own "
                           "memory until it is back (limits are then per replica).",
                           {"host": self.host}))  # fmt: skip
        else:
            self.put(Alert("store_recovered", self.host, "store_recovered",
                           f"botbouncer on {self.host}: the shared store is back.",
                           {"host": self.host}))  # fmt: skip

    def put(self, alert: Alert) -> None:
        if alert.claim is not None and self._seen(alert.claim):
            return  # this replica queued it already: a blocked agent asking again, a flood
        for i, (target, queue) in enumerate(zip(self.targets, self._queues, strict=True)):
            if alert.event not in target.events:
                continue
            try:
                queue.put_nowait(alert)
            except asyncio.QueueFull:
                self._count(i, target, alert, "dropped")

    def _seen(self, claim: tuple[str, int]) -> bool:
        """Whether this process queued the claim within its TTL (the store's
        claim is then certain to refuse it: no need to queue it again)."""
        name, ttl_ms = claim
        now = time.monotonic()
        until = self._recent.get(name)
        if until is not None and until > now:
            return True
        self._recent[name] = now + ttl_ms / 1000
        self._recent.move_to_end(name)
        while len(self._recent) > MAX_RECENT:
            self._recent.popitem(last=False)
        return False

    # -- sending ------------------------------------------------------------------

    def _count(self, i: int, target: AlertTarget, alert: Alert, outcome: str) -> None:
        self.metrics.alerts.labels(f"{i}:{target.type}", alert.event, outcome).inc()

    async def _run(self, i: int, target: AlertTarget, queue: asyncio.Queue[Alert]) -> None:
        while True:
            alert = await queue.get()
            try:
                if alert.claim is not None and not await self._claim(i, alert.claim):
                    self._count(i, target, alert, "duplicate")
                    continue
                sent = await self._send(i, target, alert)
                self._count(i, target, alert, "sent" if sent else "failed")
            except Exception:  # a bug: logged, and the next alert still goes
                log.exception("alert to target %d (%s) failed", i, target.type)
            finally:
                queue.task_done()

    async def _claim(self, i: int, claim: tuple[str, int]) -> bool:
        name, ttl_ms = claim
        try:
            return await self.store.claim(f"alert:{i}:{name}", ttl_ms)
        except BotbouncerError:  # better twice than never
            return True

    async def _send(self, i: int, target: AlertTarget, alert: Alert) -> bool:
        assert self._client is not None
        body = json.dumps(render(target.type, alert)).encode()
        headers = {"Content-Type": "application/json"}
        headers.update({k: v.get_secret_value() for k, v in target.headers.items()})
        timeout = aiohttp.ClientTimeout(total=target.timeout_seconds)
        why, wait = "", 1.0
        for attempt in range(target.retries + 1):
            if attempt:
                await asyncio.sleep(wait)
            wait = min(MAX_BACKOFF, BACKOFF * 2**attempt)
            try:
                async with self._client.post(
                    target.url.get_secret_value(), data=body, headers=headers, timeout=timeout
                ) as resp:
                    if resp.status < 300:
                        return True
                    why = f"HTTP {resp.status}"
                    if 400 <= resp.status < 500 and resp.status != 429:
                        break  # the target refuses this alert: asking again will not help
                    after = resp.headers.get("Retry-After", "")
                    if after.isdigit():
                        wait = min(MAX_BACKOFF, float(after))
            except (aiohttp.ClientError, TimeoutError) as exc:
                why = type(exc).__name__
        log.warning("alert %s for %s not delivered to target %d (%s): %s", alert.event,
                    alert.subject, i, target.type, why)  # fmt: skip
        return False
