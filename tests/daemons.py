"""A real Daemon in this test's process, on Redis under the test's key
prefix (deleted afterwards): what the adapter end-to-end tests run."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.config import parse_config
from gateway.daemon import Daemon
from gateway.store import AdmitRequest, AdmitResult
from gateway.store.redis import RedisStore
from tests.conftest import delete_prefix
from tests.redis_server import free_port


def build(
    redis_url: str,
    prefix: str,
    *bots: dict[str, Any],
    port: int | None = None,
    store: dict[str, Any] | None = None,
) -> Daemon:
    config = {
        "store": {"url": redis_url, **(store or {})},
        "http": {"listen": f"127.0.0.1:{port or free_port()}"},
        "bots": list(bots),
    }
    d = Daemon(parse_config(yaml.safe_dump(config)))
    redis_of(d).prefix = prefix  # this test's keys only
    return d


def admitted_ids(d: Daemon) -> list[str]:
    """From now on, the id of every message the daemon's Redis store admits
    (a message decided without a store call never shows here)."""
    store, admitted = redis_of(d), []
    admit = store.admit

    async def counted(req: AdmitRequest) -> AdmitResult:
        admitted.append(req.msg.message_id)
        return await admit(req)

    store.admit = counted  # type: ignore[method-assign]
    return admitted


def redis_of(d: Daemon) -> RedisStore:
    """The daemon's Redis store (behind its failover wrapper, if any)."""
    store = getattr(d.store, "primary", d.store)
    assert isinstance(store, RedisStore)
    return store


async def forget(redis_url: str, prefix: str) -> None:
    """Delete every key under `prefix`."""
    store = RedisStore.from_url(redis_url, prefix=prefix)
    try:
        await delete_prefix(store, prefix)
    finally:
        await store.close()


@asynccontextmanager
async def running(
    redis_url: str, prefix: str, *bots: dict[str, Any], port: int | None = None
) -> AsyncIterator[Daemon]:
    """Started, yielded, stopped; the keys it wrote are deleted."""
    d = build(redis_url, prefix, *bots, port=port)
    await d.start()
    try:
        yield d
    finally:
        await d.stop()
        await forget(redis_url, prefix)


Post = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


async def pingpong(post: Post, chat: str, first: str, second: str, *, limit: int = 40) -> Relay:
    """Two bots answering each other through the ingress, as a platform relays
    each posted message to the other bot: `post(bot, body)` sends one message
    to `bot` and returns the decision. A human asks `first` to start; the loop
    ends when a bot posts nothing. Returns what was posted, in order."""
    relay = Relay()
    last = await post(first, {"chat": chat, "author": "human", "text": f"{first}, start",
                              "id": f"{chat}-start"})  # fmt: skip
    relay.decisions.append(last)
    speaker, other = first, second
    for _ in range(limit):
        if last["action"] == "reply":
            kind, text, msg_id = "reply", last["reply"], last["reply_id"]
        elif last["action"] == "warn":
            kind, text, msg_id = "warning", last["warning"], last["warning_id"]
        else:
            return relay
        relay.posted.append((kind, speaker))
        body = {"chat": chat, "author": speaker, "bot": True, "text": text, "id": msg_id}
        last = await post(other, body)
        relay.decisions.append(last)
        speaker, other = other, speaker
    raise AssertionError(f"the bots never stopped: {relay.posted}")


@dataclass
class Relay:
    posted: list[tuple[str, str]] = field(default_factory=list)  # (reply|warning, bot)
    decisions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def replies(self) -> list[str]:
        return [bot for kind, bot in self.posted if kind == "reply"]

    @property
    def warnings(self) -> list[str]:
        return [bot for kind, bot in self.posted if kind == "warning"]

    @property
    def last(self) -> dict[str, Any]:
        return self.decisions[-1]


@asynccontextmanager
async def served(config_text: str) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    """A Daemon from `config_text` with its adapters started, served by
    aiohttp's test server (no listener of its own), stopped afterwards."""
    daemon = Daemon(parse_config(config_text))
    for adapter in daemon.adapters:
        await adapter.start()
    try:
        async with TestClient(TestServer(daemon.server.app)) as client:
            yield client
    finally:
        await daemon.stop()
