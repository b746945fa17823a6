"""Server-sent events for both APIs, and how a reply is cut into deltas."""

from __future__ import annotations

import re

from aiohttp import web


async def open_sse(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(
        status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    return resp


def pieces(text: str) -> list[str]:
    """`text` as streamed: a word (with the spaces after it) a delta."""
    return re.findall(r"\S+\s*|\s+", text)


def fragments(arguments: str, size: int = 7) -> list[str]:
    """A tool call's JSON arguments text in `size`-character fragments, cut
    anywhere (mid-string, mid-key): the client must join them before parsing."""
    return [arguments[i : i + size] for i in range(0, len(arguments), size)]
