"""`botbouncer run`: every configured bot's adapter and the HTTP server in one
asyncio process.

Adapters are found by platform name at run time (`adapters.<platform>`, or an
installed `botbouncer.adapters` entry point), so the core never imports one.
An adapter module offers `create(bot, gateway, server) -> Adapter`.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import ipaddress
import logging
import signal
from collections.abc import Callable
from importlib.metadata import entry_points
from types import ModuleType
from typing import Protocol

from aiohttp import web

from gateway.admin import Admin
from gateway.alerts import Alerts
from gateway.backends import Backend, make_backend
from gateway.backends.python import PythonBackendError
from gateway.classifier import Classifier
from gateway.config import BotConfig, Config, ConfigError, Policy, load_config, mask_password
from gateway.decide import Decider
from gateway.errors import StartupError, StartupUnreachable
from gateway.guard.engine import engine_for
from gateway.guard.service import Guard
from gateway.http import HttpServer
from gateway.httpserve import BACKLOG, Runner, fit_open_files
from gateway.inflight import InFlight
from gateway.llmproxy.proxy import LlmProxy
from gateway.metrics import Metrics
from gateway.outbound import Outbound
from gateway.pipeline import Gateway, context_for
from gateway.store import Store, open_store
from gateway.store.failover import FailoverStore

log = logging.getLogger("botbouncer")


class Adapter(Protocol):
    async def start(self) -> None: ...

    async def stop_intake(self) -> None:
        """Take no more messages from the platform (the first step of a stop)."""

    async def stop(self) -> None: ...


class AdapterFactory(Protocol):
    def __call__(self, bot: BotConfig, gateway: Gateway, server: HttpServer) -> Adapter: ...


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
                raise StartupError(f"the {platform} adapter needs {exc.name!r}, which is "
                                   f"not installed: pip install 'botbouncer[{platform}]' "
                                   "(or botbouncer[all])") from None  # fmt: skip
            raise StartupError(f"no adapter for platform {platform!r} in this version") from None
    factory: AdapterFactory = getattr(module, "create")  # noqa: B009 - a module's API
    return factory


def build_parts(
    bot: BotConfig, outbound: Outbound, *, dry_run: bool = False
) -> tuple[Backend | None, Classifier | None]:
    """A bot's guarded backend (none when dry_run) and its classifier (when enabled)."""
    backend = None
    if not dry_run and bot.backend is not None:
        try:
            backend = make_backend(bot.backend, bot.name, outbound)
        except PythonBackendError as exc:
            raise StartupError(f"bot {bot.name}: backend: {exc}") from None
    rd = bot.reply_decision
    classifier = Classifier(rd, bot.name, outbound) if rd.enabled else None
    return backend, classifier


def build_gateway(
    bot: BotConfig,
    store: Store,
    outbound: Outbound,
    *,
    dry_run: bool = False,
    clock: Callable[[], float] | None = None,
    inflight: InFlight | None = None,
    metrics: Metrics | None = None,
    alerts: Alerts | None = None,
) -> Gateway:
    """A bot's gateway with its classifier and (unless dry_run) its guarded backend."""
    backend, classifier = build_parts(bot, outbound, dry_run=dry_run)
    return Gateway(
        bot, store, backend, classifier=classifier, dry_run=dry_run, clock=clock,
        inflight=inflight, metrics=metrics, alerts=alerts,
    )  # fmt: skip


def context_size(config: Config) -> int:
    """How much recent context the store keeps: as much as any bot asks for."""
    return max((context_for(b) for b in config.bots), default=0)


# Bot keys a reload can apply; the rest (platform, token, api_base, ...) shape a
# connection made at start and need a restart.
_RELOADABLE_BOT_KEYS = frozenset(Policy.model_fields) | {
    "name",
    "backend",
    "admins",
    "ticket_seconds",
}


def restart_needed(running: Config, new: Config) -> list[str]:
    """What in `new` differs from the running config but only applies on restart."""
    out = []
    if new.store != running.store:
        out.append("store")
    if new.http.listen != running.http.listen:
        out.append("http.listen")
    if new.alerts != running.alerts:
        out.append("alerts")
    old_paths = running.llm_proxy.apis() if running.llm_proxy is not None else []
    new_paths = new.llm_proxy.apis() if new.llm_proxy is not None else []
    if [(n, a.path) for n, a in old_paths] != [(n, a.path) for n, a in new_paths]:
        out.append("llm_proxy: which APIs are served, and their paths")
    old_bots = {b.name: b for b in running.bots}
    new_bots = {b.name: b for b in new.bots}
    for name in new_bots.keys() - old_bots.keys():
        out.append(f"bots: new bot {name!r}")
    for name in old_bots.keys() - new_bots.keys():
        out.append(f"bots: removed bot {name!r} (it keeps running)")
    for name in new_bots.keys() & old_bots.keys():
        for key in sorted(set(BotConfig.model_fields) - _RELOADABLE_BOT_KEYS):
            if getattr(new_bots[name], key) != getattr(old_bots[name], key):
                out.append(f"bots[{name}].{key}")
    if context_size(new) > context_size(running):
        out.append("context_messages (more recent context than the store keeps)")
    return sorted(out)


class Daemon:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.started = config  # what the store, listener and adapters were built from
        self.store: Store = open_store(
            config.store.url,
            timeout=config.store.timeout_seconds,
            state_ttl_seconds=config.store.state_ttl_seconds,
            settings_ttl_seconds=config.store.settings_ttl_seconds,
            context_size=context_size(config),
            max_chats=config.store.max_chats,
        )
        self.metrics = Metrics()
        self.alerts: Alerts | None = None
        if config.alerts:
            self.alerts = Alerts(
                list(config.alerts), self.store, self.metrics, config.guard.session_ttl_seconds
            )
        if isinstance(self.store, FailoverStore):
            self.store.on_change = self._store_changed
        self.inflight = InFlight()
        token = config.http.admin_token
        self.guard = Guard(config.guard, engine_for(self.store))
        if self.alerts is not None:
            self.guard.observer = self.alerts.guard
        self.server = HttpServer(
            self.store, self.metrics, token.get_secret_value() if token else None, self.guard
        )
        self.llm_proxy: LlmProxy | None = None
        if config.llm_proxy is not None:
            self.llm_proxy = LlmProxy(
                config.llm_proxy, self.guard, self.store, self.metrics, self.inflight
            )
            self.server.app.add_routes(self.llm_proxy.routes())
        self.outbound = Outbound()
        self.gateways: dict[str, Gateway] = {}
        self.adapters: list[Adapter] = []
        for bot in config.bots:
            gateway = build_gateway(
                bot, self.store, self.outbound, inflight=self.inflight, metrics=self.metrics,
                alerts=self.alerts,
            )  # fmt: skip
            self.gateways[bot.name] = gateway
        peers = list(self.gateways.values())
        for name, gateway in self.gateways.items():
            self.server.admins[name] = Admin(gateway, [p for p in peers if p is not gateway])
        for bot in config.bots:
            gateway = self.gateways[bot.name]
            if bot.mode == "decide":  # the bot connects itself; it asks over HTTP
                self.server.deciders[bot.name] = Decider(gateway)
            else:
                self.adapters.append(find_adapter(bot.platform)(bot, gateway, self.server))
        self._runner: web.AppRunner | None = None
        self.stopping = asyncio.Event()
        self.hurry = asyncio.Event()  # a second SIGTERM: cancel what is in flight now

    def _store_changed(self, degraded: bool) -> None:
        self.metrics.store_degraded.set(int(degraded))
        if self.alerts is not None:
            self.alerts.store_changed(degraded)

    async def start(self) -> str:
        """Start the HTTP server and every adapter; return the URL listened on."""
        http = self.config.http
        fit_open_files(http.max_connections)
        # The http section is read per connection: a reload's deadlines and
        # cap apply from the next one (gateway/httpserve.py).
        shape = self.llm_proxy.error_for if self.llm_proxy is not None else None
        self._runner = Runner(
            self.server.app, lambda: self.config.http, shape, access_log=None, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, http.host, http.port, backlog=BACKLOG)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise StartupUnreachable(f"cannot listen on {http.listen}: {exc.strerror}") from None
        if self.alerts is not None:  # once listening: a port in use leaves no sender running
            self.alerts.start()
        await self._check_store()
        try:
            for adapter in self.adapters:
                await adapter.start()
        except BaseException:
            await self.stop()  # what did start (listener, clients) is closed again
            raise
        if not _loopback(http.host):
            log.warning("listening on %s beyond this machine: the ingress and the guard "
                        "API take no token, so let only trusted callers reach it (firewall, "
                        "authenticating proxy); see docs/security.md", http.listen)  # fmt: skip
        host = f"[{http.host}]" if ":" in http.host else http.host
        port = self._runner.addresses[0][1] if http.port == 0 else http.port
        return f"http://{host}:{port}"

    async def _check_store(self) -> None:
        """A store that does not answer at start is said at once, naming its
        URL (password masked): a mistyped url would otherwise run each replica
        on its own memory in silence. Fatal with store.require_at_start."""
        if not isinstance(self.store, FailoverStore):
            return
        why = await self.store.check_at_start()
        if why is None:
            return
        url = mask_password(self.config.store.url)
        if self.config.store.require_at_start:
            await self.stop()
            raise StartupUnreachable(f"store {url} is unreachable ({why}) and "
                               "store.require_at_start is true")  # fmt: skip
        log.error("store %s is unreachable at start (%s): deciding on this process's memory "
                  "until it answers (store.require_at_start: true makes this fatal)",
                  url, why)  # fmt: skip

    def reload(self, new: Config) -> list[str]:
        """Apply a new config's policies from the next message on.

        Everything is built before anything is swapped, so a reload that fails
        (a python backend that no longer imports) changes nothing. Returns the
        changes that were not applied because they need a restart.
        """
        parts = {
            bot.name: build_parts(bot, self.outbound)
            for bot in new.bots
            if bot.name in self.gateways
        }
        for name, (backend, classifier) in parts.items():
            self.gateways[name].configure(new.bot(name), backend, classifier)
        token = new.http.admin_token
        self.server.admin_token = token.get_secret_value() if token else None
        self.guard.configure(new.guard)
        if self.llm_proxy is not None and new.llm_proxy is not None:
            self.llm_proxy.configure(new.llm_proxy)
        if new.http.max_connections != self.config.http.max_connections:
            # the cap applies from the next connection: so must the files it needs
            fit_open_files(new.http.max_connections)
        pending = restart_needed(self.started, new)
        self.config = new
        return pending

    async def stop(self) -> None:
        """Take no new messages, let those in flight finish within the grace
        period (cancelling the rest releases their slots), then close."""
        for adapter in self.adapters:
            await adapter.stop_intake()
        self.inflight.close()
        self.server.stopping = True
        if self._runner is not None:
            for site in list(self._runner.sites):
                await site.stop()  # no new connections
        grace = self.config.shutdown.grace_seconds
        if len(self.inflight):
            log.info("waiting up to %gs for %d message(s) in flight", grace, len(self.inflight))
        cancelled = await self.inflight.drain(grace, self.hurry)
        if cancelled:
            log.warning("cancelled %d message(s) still in flight after %gs; their reply "
                        "slots were released", cancelled, grace)  # fmt: skip
        for adapter in reversed(self.adapters):
            await adapter.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        await self.outbound.close()
        if self.alerts is not None:
            await self.alerts.stop()
        if self.llm_proxy is not None:
            await self.llm_proxy.close()
        await self.store.close()


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def reload_file(daemon: Daemon, path: str) -> None:
    """SIGHUP: reload `path`; an invalid file is refused and the running config stays."""
    try:
        new = load_config(path)
        pending = daemon.reload(new)
    except (ConfigError, StartupError) as exc:
        log.error("reload of %s refused, the running configuration stays:\n%s", path, exc)
        return
    log.info("reloaded %s: policies apply from the next message", path)
    if pending:
        log.warning("not applied until restart: %s", "; ".join(pending))


GC_YOUNG = 20_000


async def serve(
    config: Config,
    on_ready: Callable[[str], None] | None = None,
    *,
    path: str | None = None,
) -> None:
    """Run until SIGINT or SIGTERM, then stop cleanly; SIGHUP reloads `path`."""
    daemon = Daemon(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, daemon.stopping.set)
    if path is not None:
        loop.add_signal_handler(signal.SIGHUP, reload_file, daemon, path)
    url = await daemon.start()
    # What starting made (modules, config, clients) lives as long as the
    # process: frozen out of the collector's way, a full collection walks
    # only what messages make, not every object start-up made (bench/README.md).
    gc.collect()
    gc.freeze()
    # The young generation is collected every GC_YOUNG allocations, not
    # Python's 700: a message allocates a few hundred objects and frees
    # nearly all by reference counting, so at 700 the collector ran every
    # message or two; the few cycles (tracebacks, futures) wait a little
    # longer (measured in bench/README.md, "Third pass").
    gc.set_threshold(GC_YOUNG, *gc.get_threshold()[1:])
    log.info("botbouncer listening on %s - store %s - %s", url, daemon.store.kind, config.served())
    if on_ready is not None:
        on_ready(url)
    try:
        await daemon.stopping.wait()
    finally:
        log.info("stopping")
        # Handled while stopping too, or a second signal would end the
        # process mid-drain (SIGTERM, SIGHUP: their default) and take the
        # answers in flight and their slots with it: a second SIGTERM or
        # SIGINT cancels what is in flight at once (a third is the default
        # again), SIGHUP is ignored.
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, _hurry, daemon, loop)
        loop.add_signal_handler(signal.SIGHUP, log.warning, "SIGHUP while stopping: not reloaded")
        try:
            await daemon.stop()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                loop.remove_signal_handler(sig)
        log.info("stopped")


def _hurry(daemon: Daemon, loop: asyncio.AbstractEventLoop) -> None:
    """A second SIGTERM or SIGINT while stopping: the grace period ends now."""
    log.warning("stop requested again: cancelling what is still in flight")
    daemon.hurry.set()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(sig)
