"""What every middleware does with a ticket once its bot has acted: count a
message sent under it (or as the bot's own turn), give it back when nothing
was sent. One place for the three middlewares; none of it raises into the
platform library, whose update loop must go on: failures are logged."""

from __future__ import annotations

import logging
from typing import Any

from botbouncer.bouncer import Bouncer
from gateway.decide import SpentTicket, UnknownTicket
from gateway.model import ChatRef, Decision
from gateway.store import StoreError


async def count_sent(
    bouncer: Bouncer,
    decision: Decision | None,
    chat: str,
    message_id: str,
    text: str,
    log: logging.Logger,
) -> None:
    """Count one message the bot sent in `chat` (a chat key): under
    `decision`'s ticket (the message being handled, in this chat), else, or
    if that ticket lapsed meanwhile, as the bot's own turn. StoreError is
    the caller's to log: the message was sent either way."""
    if decision is not None:
        try:
            await bouncer.sent(decision, [message_id], [text])
            return
        except (UnknownTicket, SpentTicket) as exc:  # lapsed (ticket_seconds): still a turn
            log.warning("bot %s: ticket of %s: %s; message %s counted on its own",
                        bouncer.bot.name, decision.message_id, exc, message_id)  # fmt: skip
    await bouncer.posted(chat, message_id, text)


async def release(
    bouncer: Bouncer, decision: Decision, log: logging.Logger, *, shared: bool = False
) -> None:
    """Give back a ticket the bot sent nothing on (its rate slot and hold).
    `shared`: a ticket other processes hold too (`Bouncer.decide` with
    `shared`), which one of them may have sent on or released: no failure."""
    name = bouncer.bot.name
    try:
        await bouncer.release(decision)
    except (UnknownTicket, SpentTicket) as exc:  # lapsed (ticket_seconds) meanwhile
        if not (shared and isinstance(exc, SpentTicket)):
            log.warning("bot %s: releasing the ticket of %s failed: %s", name,
                        decision.message_id, exc)  # fmt: skip
    except StoreError as exc:
        log.error("bot %s: releasing the ticket of %s failed: %s; its slot comes back when "
                  "the ticket lapses", name, decision.message_id, exc)  # fmt: skip
    except Exception:  # never into the platform library's update loop
        log.exception("bot %s: releasing the ticket of %s failed", name, decision.message_id)


def telegram_chat(chat_id: Any, thread: Any) -> str | None:
    """The chat key of a Bot API call's chat_id and message_thread_id, for a
    copy or forward whose answer (MessageId) names no chat: only a numeric
    chat id is a chat the gateway knows (an @channelname is a channel's, no
    conversation)."""
    if isinstance(chat_id, str) and chat_id.lstrip("-").isdigit():
        chat_id = int(chat_id)
    if type(chat_id) is not int:
        return None
    topic = str(thread) if type(thread) is int and thread else None
    return ChatRef("telegram", str(chat_id), topic=topic).key
