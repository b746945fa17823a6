"""Turn rules as pure functions (docs/architecture.md).

The stores apply these inside their one atomic admit call; the Redis store
mirrors `verdict` in Lua (gateway/store/lua/common.lua) and the shared contract
suite holds the two to the same answers.
"""

from __future__ import annotations

from enum import StrEnum

from gateway.model import ChatKind, Message, Reason, Turn


class Count(StrEnum):
    """What a message does to its chat's turn counters."""

    BOT = "bot"  # a bot turn: soft and hard +1
    RESET = "reset"  # a plain human message: both counters to 0
    NONE = "none"  # system or empty human message: nothing


def verdict(soft: int, hard: int, soft_limit: int, hard_limit: int) -> Turn:
    """The verdict of one bot turn, checked in the contract's order."""
    if hard > hard_limit:
        return Turn.STOPPED
    if hard == hard_limit:
        return Turn.HARD_LIMIT
    if soft > soft_limit:
        return Turn.THROTTLED
    if soft == soft_limit:
        return Turn.SOFT_LIMIT
    return Turn.OK


def count_kind(msg: Message, bot_id: str) -> Count:
    """Bot-authored messages count whoever wrote them; only plain human text resets."""
    if msg.system:
        return Count.NONE
    if msg.author.is_bot or msg.author.id == bot_id:
        return Count.BOT
    return Count.RESET if msg.is_plain_human else Count.NONE


def is_addressed(msg: Message, bot_id: str) -> bool:
    """Mentioned, replied to, or in a DM (DMs are always addressed)."""
    return msg.chat.kind is ChatKind.DM or bot_id in msg.mentions or msg.reply_to == bot_id


def local_reason(
    msg: Message,
    bot_id: str,
    *,
    bot_messages: str,
    trusted_bots: frozenset[str],
    respond_to: str,
) -> Reason | None:
    """Why this bot would not answer even if no limit applied, or None.

    Decided from the message alone (no I/O), before the store is asked.
    """
    if msg.author.id == bot_id:
        return Reason.OWN_MESSAGE
    if msg.system:
        return Reason.SYSTEM_MESSAGE
    addressed = is_addressed(msg, bot_id)
    if msg.author.is_bot:
        if bot_messages == "off":
            return Reason.BOT_IGNORED
        if trusted_bots and msg.author.id not in trusted_bots:
            return Reason.BOT_IGNORED
        if bot_messages == "mentions" and not addressed:
            return Reason.BOT_IGNORED
    if respond_to == "mentions" and not addressed:
        return Reason.NOT_ADDRESSED
    return None


def format_warning(template: str, n: int, limit: int) -> str:
    return template.format(n=n, limit=limit)
