"""One aiohttp client session for every outgoing call (classifier, backends).

Created lazily inside the running loop, closed by whoever owns it (the daemon,
replay, a test): connection pooling is shared, nothing leaks.

Every client session botbouncer makes for calls leaving the host (this one,
the platform adapters', the LLM and MCP proxies', the alerts') comes from
`client_session`, which honours HTTP_PROXY, HTTPS_PROXY and NO_PROXY as
httpx and the platform SDKs do.
"""

from __future__ import annotations

import os
from typing import Any

import aiohttp

# What names a proxy for aiohttp (any case; NO_PROXY only makes exceptions).
_PROXY_VARIABLES = frozenset({"http_proxy", "https_proxy", "ws_proxy", "wss_proxy"})


def client_session(**kwargs: Any) -> aiohttp.ClientSession:
    """An aiohttp client session that takes its proxy from the environment
    (HTTP_PROXY, HTTPS_PROXY, NO_PROXY): on a host whose only way out is a
    proxy, as the other clients on it do.

    Only when the environment names a proxy: aiohttp then reads the
    environment again on every request (about 0.2 ms) and looks for ~/.netrc
    credentials in a thread, which a proxy on every model request or tool
    call would pay for nothing."""
    return aiohttp.ClientSession(trust_env=proxied(), **kwargs)


def proxied() -> bool:
    """Whether the environment names a proxy for aiohttp."""
    return any(name.lower() in _PROXY_VARIABLES and value for name, value in os.environ.items())


class Outbound:
    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = client_session(
                headers={"User-Agent": "botbouncer"},
                # Each call sets its own total timeout; this only bounds a stuck connect.
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None
