"""Callables for the `python` backend tests (referenced as tests.sample_backends:name)."""

from __future__ import annotations

import re

from gateway.model import Message
from gateway.store import ContextEntry


async def shout(msg: Message) -> str:
    return msg.text.upper()


async def two(msg: Message) -> list[str]:
    return ["first", "second"]


async def silent(msg: Message) -> None:
    return None


async def with_context(msg: Message, context: list[ContextEntry]) -> str:
    return f"{len(context)} before: " + ", ".join(e.text for e in context)


async def broken(msg: Message) -> str:
    raise RuntimeError("kaboom")


async def wrong_type(msg: Message) -> int:
    return 42


def sync_reply(msg: Message) -> str:
    return "sync ok"


NOT_CALLABLE = 3


async def polite(msg: Message) -> str:
    """For the Discord tests: greet the user a person names by bare id, thank a bot
    by mention - so two bots running it answer each other forever."""
    if msg.author.is_bot:
        return f"<@{msg.author.id}> thank you!"
    named = re.search(r"(?<![@\d])(\d{17,20})\b", msg.text)
    return f"<@{named.group(1)}> hello!" if named else "hello!"
