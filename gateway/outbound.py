"""One aiohttp client session for every outgoing call (classifier, backends).

Created lazily inside the running loop, closed by whoever owns it (the daemon,
replay, a test): connection pooling is shared, nothing leaks.
"""

from __future__ import annotations

import aiohttp


class Outbound:
    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers={"User-Agent": "botbouncer"},
                # Each call sets its own total timeout; this only bounds a stuck connect.
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None
