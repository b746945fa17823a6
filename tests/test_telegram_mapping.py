"""The Telegram adapter's mapping from python-telegram-bot objects to the
gateway's Message is total: for every update PTB can build - whatever was
missing, null or of another type in it (tests/telegram_shapes.py) - it gives
a Message or says, with Unreadable, why it cannot. No daemon: thousands of
shapes a second (the webhook test in test_adapter_oddities.py posts fewer,
end to end)."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from telegram import Update, User

from adapters import telegram as tg
from gateway.model import Message
from tests import telegram_shapes as shapes

ME = User(7001, "Alpha", True, username="alpha_bot")
ODD_BOT = {"id": "7001", "is_bot": True, "first_name": "A"}  # its id a string
EXAMPLES = int(os.environ.get("BOTBOUNCER_FUZZ_EXAMPLES", "150")) * 10


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(update=shapes.updates)
def test_every_update_ptb_reads_maps_to_a_message_or_a_reason(update: dict[str, Any]) -> None:
    try:
        parsed = Update.de_json({"update_id": 1, **update}, None)
    except Exception:  # refused whole: 400 by webhook, skipped by polling (elsewhere)
        return
    assert tg.update_kinds(parsed)
    m = parsed.message
    if m is None:
        return
    command = tg.admin_command(m, "alpha_bot")
    assert command is None or isinstance(command, str)
    try:
        msg = tg.to_message(parsed, ME)
    except tg.Unreadable as exc:
        assert str(exc).startswith("its "), exc
        return
    assert isinstance(msg, Message)
    assert msg.chat.id.lstrip("-").isdigit() and msg.id.lstrip("-").isdigit()
    assert all(isinstance(x, str) for x in (msg.text, msg.author.id, msg.author.name))
    assert isinstance(msg.author.is_bot, bool)
    msg.text.encode("utf-8")  # what every store and platform can keep


def test_the_fields_of_an_odd_message_are_read_for_what_they_are() -> None:
    """Explicit: a sender whose names are not strings, an is_bot that is not
    a bool, a topic id that is not a number, entities without numbers."""
    update = Update.de_json(
        {
            "update_id": 1,
            "message": {
                "message_id": 5,
                "date": 0,
                "chat": {"id": -100, "type": "supergroup"},
                "from": {"id": 42, "is_bot": "yes", "first_name": 5, "last_name": "Li"},
                "is_topic_message": True,
                "message_thread_id": "9",
                "text": "@alpha_bot hi",
                "entities": [
                    {"type": "mention", "offset": None, "length": 10},
                    {"type": ["mention"], "offset": 0, "length": 10},
                    {"type": "text_mention", "offset": 0, "length": 5, "user": ODD_BOT},
                ],
            },
        },
        None,
    )
    msg = tg.to_message(update, ME)
    assert (msg.chat.key, msg.chat.topic) == ("telegram:-100", None)
    # is_bot "yes": a bot (a person would reset the turn counters: err towards stopping)
    assert (msg.author.id, msg.author.name, msg.author.is_bot) == ("42", "Li", True)
    assert msg.mentions == ()
