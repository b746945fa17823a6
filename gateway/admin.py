"""Admin commands, platform-neutral (docs/http-api.md).

`status`, `reset`, `pause`, `resume`, `limits`, `why`: the HTTP admin API and
every platform adapter call these, so a command means the same everywhere and
its effect lives in the shared store (a pause set through one replica holds on
all). Who may run them is the caller's business - a bearer token, a Discord
permission, a Telegram chat admin - checked before anything here runs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from gateway.config import BotConfig
from gateway.errors import InputError
from gateway.fields import MAX_COUNT, MAX_WINDOW_SECONDS, MIN_WINDOW_SECONDS
from gateway.model import ChatKind
from gateway.pipeline import Gateway
from gateway.store import ChatStatus, Limits, Overrides
from gateway.store.base import DECISION_LOG_SIZE

log = logging.getLogger("botbouncer.admin")

COMMANDS = ("status", "reset", "pause", "resume", "limits", "why")

# Override names as admins write them: JSON keys, and short forms for chat commands.
LIMIT_KEYS = {
    "soft_limit": "soft_limit",
    "soft": "soft_limit",
    "hard_limit": "hard_limit",
    "hard": "hard_limit",
    "max_replies": "max_replies",
    "rate": "max_replies",
    "rate_window_seconds": "rate_window_seconds",
    "window": "rate_window_seconds",
}
JSON_LIMIT_KEYS = ("soft_limit", "hard_limit", "max_replies", "rate_window_seconds")
USAGE = (
    "commands: status | reset | pause | resume | why [n] | "
    "limits [soft=N] [hard=N] [rate=N] [window=SECONDS] | limits clear"
)


class AdminError(InputError):
    """The command or its arguments are wrong; the text says what to change."""


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
        raise AdminError(f"{key}: must be a whole number from 1 to {MAX_COUNT}, not {_show(value)}")
    return value


def _window_ms(key: str, value: Any) -> int:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or (isinstance(value, float) and not math.isfinite(value)):
        raise AdminError(f"{key}: must be a number of seconds, not {_show(value)}")
    if not MIN_WINDOW_SECONDS <= value <= MAX_WINDOW_SECONDS:  # before any float overflow
        raise AdminError(
            f"{key}: must be from {MIN_WINDOW_SECONDS} to {MAX_WINDOW_SECONDS} seconds,"
            f" not {_show(value)}"
        )
    ms: int = round(float(value) * 1000)
    return ms


def overrides_from(values: Mapping[str, Any]) -> Overrides:
    """Overrides from JSON-like values; a key that is absent or null is not overridden."""
    unknown = sorted(set(values) - set(JSON_LIMIT_KEYS))
    if unknown:
        raise AdminError(f"{unknown[0]}: unknown limit (known: {', '.join(JSON_LIMIT_KEYS)})")
    got = {k: v for k, v in values.items() if v is not None}
    return Overrides(
        soft_limit=_positive_int("soft_limit", got["soft_limit"]) if "soft_limit" in got else None,
        hard_limit=_positive_int("hard_limit", got["hard_limit"]) if "hard_limit" in got else None,
        max_replies=(
            _positive_int("max_replies", got["max_replies"]) if "max_replies" in got else None
        ),
        rate_window_ms=(
            _window_ms("rate_window_seconds", got["rate_window_seconds"])
            if "rate_window_seconds" in got
            else None
        ),
    )


def parse_limit_args(args: list[str]) -> dict[str, Any]:
    """`soft=10 hard=50 rate=4 window=60` (chat command syntax) as JSON-like values."""
    values: dict[str, Any] = {}
    for arg in args:
        key, sep, raw = arg.partition("=")
        name = LIMIT_KEYS.get(key.strip().lower())
        if not sep or name is None:
            raise AdminError(f"{arg}: expected soft=N, hard=N, rate=N or window=SECONDS")
        try:
            number: float = float(raw) if name == "rate_window_seconds" else int(raw)
        except ValueError:
            raise AdminError(f"{key}: {_show(raw)} is not a number") from None
        values[name] = number
    return values


class Admin:
    """The admin commands for chats, answered with one bot's limits.

    The store state they touch is per chat and shared by every bot; the bot
    only decides which configured limits a status shows and whose rate window
    is counted. Reads the gateway's current policy, so a reload shows at once.
    `peers` are the other bots of this process: overrides belong to the chat,
    so they are checked against every bot's configured limits.
    """

    def __init__(self, gateway: Gateway, peers: Sequence[Gateway] = ()) -> None:
        self.gateway = gateway
        self.peers = peers

    @property
    def bot(self) -> BotConfig:
        return self.gateway.bot

    def _configured(self, kind: ChatKind) -> Limits:
        return self.gateway.limits(kind)

    async def status(self, chat: str, kind: ChatKind = ChatKind.GROUP) -> ChatStatus:
        gw = self.gateway
        return await gw.store.status(chat, gw.bot_id, self._configured(kind), gw.now_ms())

    async def reset(self, chat: str, actor: str) -> None:
        await self.gateway.store.reset(chat)
        log.info("admin %s: reset %s (counters, pair windows and cooldowns)", actor, chat)

    async def pause(self, chat: str, actor: str, paused: bool = True) -> None:
        await self.gateway.store.set_paused(chat, paused)
        log.info("admin %s: %s %s", actor, "paused" if paused else "resumed", chat)

    async def set_limits(
        self,
        chat: str,
        actor: str,
        overrides: Overrides,
        *,
        merge: bool = False,
        kind: ChatKind = ChatKind.GROUP,
    ) -> None:
        """Replace the chat's overrides, or with `merge` change only the given ones
        (written field by field, so two admins changing different limits at
        once both keep their change)."""
        result = overrides
        if merge:
            current = (await self.status(chat, kind)).overrides
            result = replace(current, **overrides.as_dict())
        await self.gateway.store.set_overrides(chat, overrides, merge=merge)
        shown = _limits_text(result) or "none (the configured limits apply)"
        log.info("admin %s: limits for %s: %s", actor, chat, shown)

    async def why(self, chat: str, limit: int = 10) -> list[dict[str, Any]]:
        if limit < 1 or limit > DECISION_LOG_SIZE:
            raise AdminError(f"limit: must be between 1 and {DECISION_LOG_SIZE}, not {limit}")
        return await self.gateway.store.decisions(chat, limit)

    async def run(self, chat: str, text: str, actor: str, kind: ChatKind = ChatKind.GROUP) -> str:
        """A chat command (`status`, `limits soft=5`, ...) answered as a short text."""
        words = text.split()
        if not words or words[0].lower() not in COMMANDS:
            raise AdminError(f"unknown command {text.strip()!r}; {USAGE}")
        command, args = words[0].lower(), words[1:]
        if command == "status":
            return render_status(await self.status(chat, kind))
        if command == "reset":
            await self.reset(chat, actor)
            return "Reset: turn counters, pair windows and cooldowns are zero; bots may answer."
        if command in ("pause", "resume"):
            await self.pause(chat, actor, paused=command == "pause")
            return (
                "Paused: no bot answers here until resumed."
                if command == "pause"
                else ("Resumed: bots answer here again.")
            )
        if command == "limits":
            if not args:
                return render_status(await self.status(chat, kind))
            if [a.lower() for a in args] == ["clear"]:
                await self.set_limits(chat, actor, Overrides(), kind=kind)
            else:
                wanted = overrides_from(parse_limit_args(args))
                await self.set_limits(chat, actor, wanted, merge=True, kind=kind)
            return render_status(await self.status(chat, kind))
        n = 10
        if args:
            try:
                n = int(args[0])
            except ValueError:
                raise AdminError(f"why: {args[0]!r} is not a number of decisions") from None
        return render_why(await self.why(chat, n))


def _limits_text(overrides: Overrides) -> str:
    parts = []
    if overrides.soft_limit is not None:
        parts.append(f"soft={overrides.soft_limit}")
    if overrides.hard_limit is not None:
        parts.append(f"hard={overrides.hard_limit}")
    if overrides.max_replies is not None:
        parts.append(f"rate={overrides.max_replies}")
    if overrides.rate_window_ms is not None:
        parts.append(f"window={overrides.rate_window_ms / 1000:g}s")
    return " ".join(parts)


def render_status(st: ChatStatus) -> str:
    lim = st.limits
    lines = [
        f"Chat {st.chat}: {'PAUSED' if st.paused else 'active'}, turn verdict {st.turn.value}",
        f"Bot turns: {st.soft}/{lim.soft_limit} soft, {st.hard}/{lim.hard_limit} hard",
        f"Replies: {st.rate_used}/{st.rate_max} in the last {lim.rate_window_ms / 1000:g}s",
    ]
    overrides = _limits_text(st.overrides)
    lines.append(f"Overrides: {overrides}" if overrides else "Overrides: none")
    for pair, left in st.pair_cooldowns.items():
        lines.append(f"Pair cooldown {pair.replace('|', ' <-> ')}: {left:.0f}s left")
    return "\n".join(lines)


def render_why(entries: list[dict[str, Any]]) -> str:
    if not entries:
        return "No decisions recorded for this chat."
    lines = []
    for e in entries:
        reason = e.get("reason") or "-"
        lines.append(
            f"{e.get('bot')}: {e.get('action')} ({reason}) msg {e.get('id')} "
            f"from {e.get('author')}, turn {e.get('turn')} {e.get('soft')}/{e.get('hard')}"
        )
    return "\n".join(lines)
