"""An HTTP forward proxy (what HTTP_PROXY names): takes requests in absolute
form and sends them on, recording each URL. Only plain http upstreams (no
CONNECT): enough to show a client honours the proxy settings of its
environment."""

from __future__ import annotations

from types import TracebackType

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

_HOP = {"connection", "keep-alive", "proxy-authorization", "proxy-connection", "te",
        "trailer", "transfer-encoding", "upgrade", "host", "content-length"}  # fmt: skip


class ForwardProxy:
    def __init__(self) -> None:
        self.seen: list[str] = []
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._server = TestServer(app, host="127.0.0.1")
        self._client: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.port}"

    async def __aenter__(self) -> ForwardProxy:
        self._client = aiohttp.ClientSession(trust_env=False, auto_decompress=False)
        await self._server.start_server()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._server.close()
        if self._client is not None:
            await self._client.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._client is not None
        self.seen.append(str(request.url))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self._client.request(
            request.method, request.url, headers=headers, data=await request.read(),
            allow_redirects=False,
        ) as upstream:  # fmt: skip
            out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in _HOP:
                    out.headers.add(name, value)
            await out.prepare(request)
            async for chunk in upstream.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out
