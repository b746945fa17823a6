"""`botbouncer run`: every configured bot's adapter and the HTTP server in one
asyncio process.

Adapters are found by platform name at run time (`adapters.<platform>`, or an
installed `botbouncer.adapters` entry point), so the core never imports one.
An adapter module offers `create(bot, gateway, server) -> Adapter`.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
from collections.abc import Callable
from importlib.metadata import entry_points
from types import ModuleType
from typing import Protocol

from aiohttp import web

from gateway.backends import context_wanted, make_backend
from gateway.backends.python import PythonBackendError
from gateway.classifier import Classifier
from gateway.config import BotConfig, Config
from gateway.http import HttpServer
from gateway.outbound import Outbound
from gateway.pipeline import Gateway
from gateway.store import Store, open_store

log = logging.getLogger("botbouncer")


class Adapter(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class AdapterFactory(Protocol):
    def __call__(self, bot: BotConfig, gateway: Gateway, server: HttpServer) -> Adapter: ...


class StartupError(Exception):
    """The daemon cannot start; the message says why and what to change."""


def find_adapter(platform: str) -> AdapterFactory:
    module: ModuleType | None = None
    for ep in entry_points(group="botbouncer.adapters"):
        if ep.name == platform:
            module = ep.load()
    if module is None:
        try:
            module = importlib.import_module(f"adapters.{platform}")
        except ModuleNotFoundError as exc:
            if exc.name not in (f"adapters.{platform}", "adapters"):
                raise StartupError(f"the {platform} adapter needs {exc.name!r}: "
                                   f"pip install {exc.name}") from None  # fmt: skip
            raise StartupError(f"no adapter for platform {platform!r} in this version") from None
    factory: AdapterFactory = getattr(module, "create")  # noqa: B009 - a module's API
    return factory


def build_gateway(
    bot: BotConfig,
    store: Store,
    outbound: Outbound,
    *,
    dry_run: bool = False,
    clock: Callable[[], float] | None = None,
) -> Gateway:
    """A bot's gateway with its classifier and (unless dry_run) its guarded backend."""
    backend = None
    if not dry_run:
        try:
            backend = make_backend(bot.backend, bot.name, outbound)
        except PythonBackendError as exc:
            raise StartupError(f"bot {bot.name}: backend: {exc}") from None
    rd = bot.reply_decision
    classifier = Classifier(rd, bot.name, outbound) if rd.enabled else None
    return Gateway(bot, store, backend, classifier=classifier, dry_run=dry_run, clock=clock)


def context_size(config: Config) -> int:
    """How much recent context the store keeps: as much as any bot asks for."""
    sizes = [context_wanted(b.backend) for b in config.bots]
    sizes += [b.reply_decision.context_messages for b in config.bots if b.reply_decision.enabled]
    return max(sizes, default=0)


class Daemon:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.store: Store = open_store(
            config.store.url,
            state_ttl_seconds=config.store.state_ttl_seconds,
            settings_ttl_seconds=config.store.settings_ttl_seconds,
            context_size=context_size(config),
        )
        self.server = HttpServer(self.store)
        self.outbound = Outbound()
        self.gateways: dict[str, Gateway] = {}
        self.adapters: list[Adapter] = []
        for bot in config.bots:
            gateway = build_gateway(bot, self.store, self.outbound)
            self.gateways[bot.name] = gateway
            self.adapters.append(find_adapter(bot.platform)(bot, gateway, self.server))
        self._runner: web.AppRunner | None = None
        self.stopping = asyncio.Event()

    async def start(self) -> str:
        """Start the HTTP server and every adapter; return the URL listened on."""
        http = self.config.http
        self._runner = web.AppRunner(self.server.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, http.host, http.port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise StartupError(f"cannot listen on {http.listen}: {exc.strerror}") from None
        for adapter in self.adapters:
            await adapter.start()
        host = f"[{http.host}]" if ":" in http.host else http.host
        port = self._runner.addresses[0][1] if http.port == 0 else http.port
        return f"http://{host}:{port}"

    async def stop(self) -> None:
        for adapter in reversed(self.adapters):
            await adapter.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        await self.outbound.close()
        await self.store.close()


async def serve(config: Config, on_ready: Callable[[str], None] | None = None) -> None:
    """Run until SIGINT or SIGTERM, then stop cleanly."""
    daemon = Daemon(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, daemon.stopping.set)
    url = await daemon.start()
    bots = ", ".join(f"{b.name} ({b.platform})" for b in config.bots)
    log.info("botbouncer listening on %s - store %s - bots: %s", url, daemon.store.kind, bots)
    if on_ready is not None:
        on_ready(url)
    try:
        await daemon.stopping.wait()
    finally:
        log.info("stopping")
        await daemon.stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
