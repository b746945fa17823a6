"""What every route of the HTTP API shares: JSON in and out, the body limit,
the 400 every handler raises for input the client must fix."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from gateway.errors import InputError
from gateway.guard.normalize import MAX_JSON_DEPTH, depth_over, loads

MAX_BODY = 64 * 1024
# The platform webhooks (`/v1/webhooks/<bot>`): one event as the platform
# sends it, which is not the daemon's to trim. Slack sends a message's text
# twice (`text` and its `blocks`), up to 40,000 characters each, escaped
# (`\uXXXX`, six bytes a character) when not ASCII: some 500 KB at most.
WEBHOOK_MAX_BODY = 1024 * 1024
# The agent guard's routes: a step's arguments and a result's output are what
# a tool took and gave (a file's text), often past 64 KiB; the guard masks and
# hashes them, reading at most its first MiB closely (docs/agent-guard.md).
GUARD_MAX_BODY = 8 * 1024 * 1024

# An ingress handler gets the decoded JSON body and answers (status, JSON body).
IngressHandler = Callable[[Any], Awaitable[tuple[int, dict[str, Any]]]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# A platform webhook (Telegram's setWebhook) gets the request itself: it checks
# the platform's own authentication before reading the body.
WebhookHandler = Callable[[web.Request], Awaitable[web.Response]]


class BadRequest(InputError):
    """Raised by handlers for input the client must fix (answered 400)."""


class BodyTooLarge(InputError):
    """A body over the route's limit (answered 413)."""

    status = 413


def error(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers or None)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def reply(payload: Any, status: int = 200) -> web.Response:
    # backslashreplace turns a lone surrogate into its JSON escape (\\ud800), so
    # any string that reached us can be answered; nothing else is affected.
    body = _dumps(payload).encode("utf-8", "backslashreplace")
    return web.Response(body=body, status=status, content_type="application/json")


async def body_within(request: web.Request | aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The whole body of a request (or of an answer the daemon got), however
    many reads it arrives in (one read gives only what is buffered); None past
    `limit` bytes, as its Content-Length says or as counted, never read
    further than that."""
    if request.content_length is not None and request.content_length > limit:
        return None
    parts, size = [], 0
    async for chunk in request.content.iter_chunked(256 * 1024):
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


async def json_body(request: web.Request, limit: int | None = None) -> Any:
    """The body's JSON (at most `limit` bytes, by default the request's
    `client_max_size`: MAX_BODY, WEBHOOK_MAX_BODY on a webhook route),
    nested at most MAX_JSON_DEPTH deep: what handlers and the guard's
    normaliser walk (some recursively) can then never run out of stack,
    whatever the route. Checked on the bytes before json.loads (which
    recurses too), at a cost under a microsecond for a typical body."""
    if limit is None:
        limit = request.client_max_size
    raw = await body_within(request, limit)
    if raw is None:
        raise BodyTooLarge(f"request body larger than {limit} bytes")
    if not raw.strip():
        raise BadRequest("empty body: send a JSON object")
    try:
        value = loads(raw)
    except ValueError as exc:  # bad JSON or encoding, too deep, an int past the digit limit
        raise BadRequest(f"invalid JSON body: {exc}") from None
    if depth_over(value):  # a UTF-16/32 body: its bytes could not tell
        raise BadRequest(f"invalid JSON body: nested deeper than {MAX_JSON_DEPTH} levels")
    return value
