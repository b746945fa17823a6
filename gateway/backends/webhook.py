"""`webhook`: POST the message and recent context as JSON; the answer is the reply.

Request:  {"bot": ..., "message": {...}, "context": [{...}, ...]}
Response: 200 {"reply": "text"} or {"replies": ["a", "b"]}; 204, an empty body,
or an empty/null reply = stay silent. Anything else is a backend error.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import aiohttp

from gateway import config
from gateway.api.common import body_within
from gateway.errors import BotbouncerError
from gateway.model import Message
from gateway.outbound import Outbound
from gateway.redact import redact
from gateway.store import ContextEntry


def message_json(msg: Message) -> dict[str, Any]:
    return {
        "id": msg.id,
        "chat": msg.chat.id,
        "platform": msg.chat.platform,
        "topic": msg.chat.topic,
        "kind": msg.chat.kind.value,
        "author": {"id": msg.author.id, "name": msg.author.display, "bot": msg.author.is_bot},
        "text": msg.text,
        "mentions": list(msg.mentions),
        "reply_to": msg.reply_to,
    }


def parse_replies(data: Any) -> list[str]:
    """The texts in a webhook answer; ValueError says what is wrong with it."""
    if data is None:
        return []
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    if "replies" in data:
        replies = data["replies"]
        if not isinstance(replies, list) or not all(isinstance(r, str) for r in replies):
            raise ValueError('"replies" must be a list of strings')
        return [r for r in replies if r.strip()]
    reply = data.get("reply")
    if reply is None:
        return []
    if not isinstance(reply, str):
        raise ValueError('"reply" must be a string')
    return [reply] if reply.strip() else []


class WebhookBackend:
    name = "webhook"

    def __init__(self, cfg: config.WebhookBackend, bot: str, outbound: Outbound) -> None:
        self.cfg = cfg
        self.bot = bot
        self.outbound = outbound
        self.headers = {k: v.get_secret_value() for k, v in cfg.headers.items()}

    def _error(self, text: str) -> WebhookError:
        # The answer may echo the request's headers (a proxy's error page).
        return WebhookError(redact(text, self.headers.values()))

    async def reply(self, msg: Message, context: Sequence[ContextEntry]) -> list[str]:
        body = {"bot": self.bot, "message": message_json(msg),
                "context": [e.as_dict() for e in context]}  # fmt: skip
        try:
            # A redirect is not followed: aiohttp would turn a 301/302 into a GET
            # without the body (the webhook then answers 405 or a page), and take
            # the headers, secrets too, to wherever it points.
            async with self.outbound.session.post(self.cfg.url, json=body, headers=self.headers,
                                                  allow_redirects=False) as resp:  # fmt: skip
                read = await body_within(resp, MAX_ANSWER)
                status = resp.status
                moved = resp.headers.get("Location")
            if read is None:
                raise self._error(f"webhook answered HTTP {status} with over {MAX_ANSWER} "
                                  "bytes: not read")  # fmt: skip
            raw = read
        except aiohttp.ClientError as exc:
            raise self._error(f"webhook unreachable: {type(exc).__name__}: {exc}") from None
        if status == 204:
            return []
        if 300 <= status < 400 and moved:
            raise self._error(f"webhook answered HTTP {status}, a redirect to {moved[:200]!r} "
                              "(not followed: set the backend's url to it)")  # fmt: skip
        if not 200 <= status < 300:
            # Masked before it is cut short: a cut secret would not be recognised.
            shown = redact(raw.decode("utf-8", "replace"), self.headers.values())
            raise self._error(f"webhook answered HTTP {status}: {shown[:200]!r}")
        if not raw.strip():
            return []
        try:
            return parse_replies(json.loads(raw))
        except ValueError as exc:  # JSONDecodeError is a ValueError too
            raise self._error(f"webhook answered invalid JSON: {exc}") from None


# The most of an answer read: the replies one message takes fit many times
# over (max_reply_messages of a platform's largest message); a backend gone
# wrong (a log, a file) must not be read whole into the daemon's memory.
MAX_ANSWER = 4 * 1024 * 1024


class WebhookError(BotbouncerError):
    pass
