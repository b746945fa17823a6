"""`botbouncer mcp-proxy`: the guard and its store from the configuration (or
the built-in defaults: memory, the default profile), then one transport.

    botbouncer mcp-proxy [-c FILE] [--session S] [--profile P] [--log-level L] -- CMD ARGS...
    botbouncer mcp-proxy [-c FILE] [--session S] [--profile P] [--log-level L]
                         --upstream URL [--listen H:P]

Over stdio the proxy's stdout is the protocol: logs go to stderr, as the
child's stderr does.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import uuid

from aiohttp import web

from gateway.config import Config
from gateway.config.mcpproxy import McpProxyConfig
from gateway.errors import StartupUnreachable
from gateway.guard.engine import engine_for
from gateway.guard.service import Guard
from gateway.mcpproxy import stdio
from gateway.mcpproxy.calls import ToolCalls
from gateway.mcpproxy.http import HttpProxy
from gateway.store import open_store

log = logging.getLogger("botbouncer.mcp_proxy")


async def serve(
    config: Config,
    command: list[str],
    *,
    session: str | None = None,
    profile: str | None = None,
    upstream: str | None = None,
    listen: tuple[str, int] = ("127.0.0.1", 8090),
) -> int:
    """Relay until the end; the exit status (the child's, over stdio)."""
    settings = config.mcp_proxy or McpProxyConfig()
    profile = profile or settings.profile
    store = open_store(
        config.store.url,
        timeout=config.store.timeout_seconds,
        state_ttl_seconds=config.store.state_ttl_seconds,
        settings_ttl_seconds=config.store.settings_ttl_seconds,
    )
    guard = Guard(config.guard, engine_for(store))
    guard.profile(profile)  # an unknown profile is said now, not at the first call

    def calls_for(name: str) -> ToolCalls:
        return ToolCalls(guard, name, profile, settings.warn_note)

    try:
        if upstream is None:
            name = session or f"mcp-{uuid.uuid4().hex}"
            log.info("mcp proxy: guard session %s, profile %s, store %s", name, profile,
                     store.kind)  # fmt: skip
            return await stdio.run(command, calls_for(name))
        return await _serve_http(HttpProxy(upstream, calls_for, session), listen)
    finally:
        await store.close()


async def _serve_http(proxy: HttpProxy, listen: tuple[str, int]) -> int:
    runner = web.AppRunner(proxy.app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, *listen)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise StartupUnreachable(
            f"cannot listen on {listen[0]}:{listen[1]}: {exc.strerror}"
        ) from None
    host, port = runner.addresses[0][:2]
    log.info("mcp proxy: serving http://%s:%d%s for %s", host, port, proxy.path, proxy.upstream)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
    return 0
