"""One OpenAI-compatible chat-completions call, shared by the reply decision
(gateway/classifier.py) and the `openai` backend. Plain aiohttp: the request is
one small JSON POST, and it rides the daemon's one shared session (the official
SDK would bring its own httpx client, retries we must not have - a retried
backend call can double-reply - and a second HTTP stack to configure)."""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from gateway.errors import BotbouncerError
from gateway.redact import redact


class LLMError(BotbouncerError):
    """The call failed; the message says how (status, timeout, bad JSON...)."""


class Completion(NamedTuple):
    text: str
    # why the model stopped: "stop", or "length" when max_tokens cut it off
    # (None when the endpoint does not say)
    finish_reason: str | None


# What a reasoning model thinks aloud before its answer, when the endpoint
# returns it inline in the content (unclosed: cut off while thinking).
_LEADING_THOUGHT = re.compile(r"\A\s*<think(?:ing)?>.*?(?:</think(?:ing)?>|\Z)", re.S | re.I)


def without_thinking(text: str) -> str:
    """The answer without the `<think>…</think>` block it starts with, if any."""
    return _LEADING_THOUGHT.sub("", text, count=1)


def completions_url(endpoint: str) -> str:
    """Accept the full completions URL or a base URL such as https://host/v1;
    a query (`?api-version=...`, as Azure's endpoints take) stays the query."""
    parts = urlsplit(endpoint)
    path = parts.path.rstrip("/")
    if not path.endswith("/chat/completions"):
        path += "/chat/completions"
    return urlunsplit(parts._replace(path=path))


async def chat_completion(
    session: aiohttp.ClientSession,
    url: str,
    *,
    model: str,
    messages: list[dict[str, str]],
    max_tokens: int,
    timeout_seconds: float,
    api_key: str | None = None,
    temperature: float | None = None,
) -> Completion:
    """The first choice's text and why it ended. Raises LLMError for anything else."""
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens}
    if temperature is not None:
        body["temperature"] = temperature
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def shown(raw: bytes, limit: int) -> str:
        # The endpoint may echo the request's headers: mask the key, then cut.
        return redact(raw.decode("utf-8", "replace"), [api_key])[:limit]

    try:
        deadline = aiohttp.ClientTimeout(total=timeout_seconds)
        async with session.post(url, json=body, headers=headers, timeout=deadline) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise LLMError(f"HTTP {resp.status}: {shown(raw, 200)}")
    except TimeoutError:
        raise LLMError(f"no answer within {timeout_seconds:g} s") from None
    except aiohttp.ClientError as exc:
        raise LLMError(redact(f"{type(exc).__name__}: {exc}", [api_key])) from None
    try:
        data = json.loads(raw)
        choice = data["choices"][0]
        content = choice["message"]["content"]
        finish = choice.get("finish_reason")
    except (ValueError, LookupError, TypeError, AttributeError) as exc:
        raise LLMError(f"malformed response ({type(exc).__name__}): {shown(raw, 120)!r}") from None
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise LLMError(f"malformed response: content is {type(content).__name__}")
    return Completion(content, finish if isinstance(finish, str) else None)
