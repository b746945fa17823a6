"""Callables for the `python` backend tests (referenced as tests.sample_backends:name)."""

from __future__ import annotations

import argparse
import asyncio
import re
import threading
import time

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


def sync_with_context(msg: Message, context: list[ContextEntry]) -> str:
    return f"sync, {len(context)} before"


# Set by `blocking` while it sleeps (in whatever thread it was called in)
BLOCKING_IN: list[str] = []


def blocking(msg: Message) -> str:
    """A sync function doing blocking I/O (here a sleep) for 1 s."""
    BLOCKING_IN.append(threading.current_thread().name)
    time.sleep(1.0)
    return "too late"


def _roll_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="/roll", exit_on_error=False)
    parser.add_argument("sides", type=int)
    return parser


async def roll(msg: Message) -> str:
    """Reads a command with argparse, which calls sys.exit on input it cannot
    parse (exit_on_error=False does not cover a missing argument)."""
    args = _roll_parser().parse_args(msg.text.split()[1:])
    return f"rolled a d{args.sides}"


def sync_roll(msg: Message) -> str:
    args = _roll_parser().parse_args(msg.text.split()[1:])
    return f"rolled a d{args.sides}"


NOT_CALLABLE = 3


async def polite(msg: Message) -> str:
    """For the Discord tests: greet the user a person names by bare id, thank a bot
    by mention - so two bots running it answer each other forever."""
    if msg.author.is_bot:
        return f"<@{msg.author.id}> thank you!"
    named = re.search(r"(?<![@\d])(\d{17,20})\b", msg.text)
    return f"<@{named.group(1)}> hello!" if named else "hello!"


async def greeter(msg: Message) -> str:
    """For the Telegram tests: greet whom a person names with "greet NAME";
    thank a bot (a Telegram reply addresses it) - two bots running it never stop."""
    if msg.author.is_bot:
        return "thank you!"
    named = re.search(r"\bgreet (\w+)", msg.text)
    return f"hello @{named.group(1)}!" if named else "hello!"


async def slack_greeter(msg: Message) -> str:
    """greeter for Slack, where a name is a mention: "greet U2" -> "hello <@U2>!"."""
    if msg.author.is_bot:
        return "thank you!"
    named = re.search(r"\bgreet ([UW][A-Z0-9]+)", msg.text)
    return f"hello <@{named.group(1)}>!" if named else "hello!"


async def long_reply(msg: Message) -> str:
    """5,000 characters: more than one Telegram message (4,096)."""
    return ("lorem ipsum " * 417)[:5000]


GATE: asyncio.Event | None = None
# The messages `gated` is working on, in the order they reached it
ENTERED: asyncio.Queue[Message] | None = None


def new_gate() -> asyncio.Event:
    """A fresh gate for `gated` in this test's event loop (and a fresh ENTERED)."""
    global GATE, ENTERED
    GATE = asyncio.Event()
    ENTERED = asyncio.Queue()
    return GATE


def entered() -> asyncio.Queue[Message]:
    assert ENTERED is not None, "call new_gate() first"
    return ENTERED


async def gated(msg: Message) -> str:
    """Answers once the test opens the gate: a backend that is still working."""
    assert GATE is not None, "call new_gate() first"
    entered().put_nowait(msg)
    await GATE.wait()
    return "worked on it"


async def matrix_greeter(msg: Message) -> str:
    """greeter for Matrix, where a user id in the text names its owner: "greet
    beta:example.org" -> "hello @beta:example.org!" (the request itself, with
    no "@", names nobody); thank a bot - two bots running it never stop."""
    if msg.author.is_bot:
        return "thank you!"
    named = re.search(r"\bgreet ([\w.=/-]+:[\w.:-]+)", msg.text)
    return f"hello @{named.group(1)}!" if named else "hello!"
