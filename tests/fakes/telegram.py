"""A fake Telegram Bot API server that the real python-telegram-bot (v22) can talk to.

Start it, point PTB's `base_url` at it, drive the world from tests:

    async with FakeTelegram() as fake:
        fake.add_bot("111:alpha", 111, "alpha_bot")
        fake.add_user(7, "Alice", "alice")
        fake.add_chat(-1001, "supergroup", "the group")
        fake.add_member(-1001, 7)
        fake.add_member(-1001, 111)
        bot = telegram.Bot("111:alpha", base_url=f"{fake.api_base}/bot",
                           request=fast_request(), get_updates_request=fast_request())
        async with bot:
            await fake.user_says(-1001, 7, "/start@alpha_bot")
            updates = await bot.get_updates(timeout=1)
            await bot.send_message(-1001, "hi", reply_to_message_id=1)
            sent = await fake.wait_sent(1, chat_id=-1001)

A `telegram.ext.Application` is pointed at it the same way:
`ApplicationBuilder().token(tok).base_url(f"{fake.api_base}/bot")
.base_file_url(f"{fake.api_base}/file/bot")`. Application.initialize calls getMe;
Updater.start_polling calls deleteWebhook, then getUpdates (offset 0 first, timeout 10 by
default) in a loop; Updater.stop abandons the running long poll (the fake sees the client
hang up) and calls getUpdates once more with timeout 0 and the next offset to confirm
what it fetched; Application.stop/shutdown call nothing.

What PTB 22.8 sends: every method is a POST to `{base_url}{token}/{method}`, its
parameters form-encoded (`application/x-www-form-urlencoded`; multipart only when a
file is uploaded) with every non-string value JSON-encoded (ints as "5", booleans as
"true", objects and lists as JSON text) and None values left out. The fake also takes
JSON bodies and GET query strings, as Telegram does. PTB maps the HTTP status, not
`error_code`: 400 BadRequest, 401/404 InvalidToken, 403 Forbidden, 409 Conflict,
`parameters.retry_after` RetryAfter; it strips a leading "Bad Request: " (and
capitalises the rest) from the description.

Delivery (who gets an update for a message) follows Telegram's privacy mode and its
bot-to-bot rules; see `FakeTelegram.receives`. Updates are queued per bot and fetched
with getUpdates (long polling) or pushed to a webhook by a delivery task.

Known simplifications: only "message" updates exist; webhooks may be plain http on any
port (Telegram wants https on 443/80/88/8443); message text is not trimmed; only
`mention` and `bot_command` entities are detected in plain text (no urls, hashtags);
a private chat's message ids are one counter for both sides; a person who posts in a
group is made a member if they were not; replies in non-forum supergroups carry no
message_thread_id.

Everything is recorded (`calls`, `sent`, `chat_actions`, `commands`,
`webhook_attempts`, `updates_for(token)`) and every change notifies one
asyncio.Condition, so tests wait with deadlines (`wait_until`, `wait_sent`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import html
import json
import logging
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from yarl import URL

from tests.fakes.recording import Recording

if TYPE_CHECKING:
    from telegram.request import HTTPXRequest

Json = dict[str, Any]

log = logging.getLogger("tests.fakes.telegram")

GROUP_ANONYMOUS_BOT_ID = 1087968824  # "from" of messages an anonymous admin sends
CHANNEL_BOT_ID = 136817688  # "from" of messages sent on behalf of a channel
TOPIC_ICON_COLOR = 7322096  # 0x6FB9F0, the default forum topic colour
MAX_TEXT_LENGTH = 4096  # UTF-16 code units
CLIENT_CLOSED = 499  # ApiCall.status of a request the client abandoned (nginx's code)
MEMBER_STATUSES = frozenset({"member", "administrator", "creator", "restricted"})
ADMIN_STATUSES = frozenset({"administrator", "creator"})
CHAT_STATUSES = frozenset({"member", "administrator", "creator", "left", "kicked"})
CHAT_TYPES = frozenset({"group", "supergroup", "channel"})
CHAT_ACTIONS = frozenset(
    {
        "typing",
        "upload_photo",
        "record_video",
        "upload_video",
        "record_voice",
        "upload_voice",
        "upload_document",
        "choose_sticker",
        "find_location",
        "record_video_note",
        "upload_video_note",
    }
)
UPDATE_TYPES = frozenset(
    {
        "message",
        "edited_message",
        "channel_post",
        "edited_channel_post",
        "business_connection",
        "business_message",
        "edited_business_message",
        "deleted_business_messages",
        "message_reaction",
        "message_reaction_count",
        "inline_query",
        "chosen_inline_result",
        "callback_query",
        "shipping_query",
        "pre_checkout_query",
        "purchased_paid_media",
        "poll",
        "poll_answer",
        "my_chat_member",
        "chat_member",
        "chat_join_request",
        "chat_boost",
        "removed_chat_boost",
    }
)
DEFAULT_UPDATE_TYPES = UPDATE_TYPES - {"chat_member", "message_reaction", "message_reaction_count"}
SCOPE_TYPES = frozenset(
    {
        "default",
        "all_private_chats",
        "all_group_chats",
        "all_chat_administrators",
        "chat",
        "chat_administrators",
        "chat_member",
    }
)
WEBHOOK_CONFLICT = (
    "Conflict: can't use getUpdates method while webhook is active; "
    "use deleteWebhook to delete the webhook first"
)
POLL_CONFLICT = (
    "Conflict: terminated by other getUpdates request; "
    "make sure that only one bot instance is running"
)
_SECRET_TOKEN = re.compile(r"[A-Za-z0-9_-]+")
_COMMAND_NAME = re.compile(r"[a-z0-9_]{1,32}")
_LANGUAGE_CODE = re.compile(r"[a-z]{2}")

# Telegram (tdlib's match_mentions / match_bot_commands) for plain text: a mention is
# "@" and 4-32 of [A-Za-z0-9_] between non-word characters; a command is "/" and 1-64
# of them, optionally "@" and a 3-32 character bot username, not glued to a word, "/",
# "<" or ">".
_MENTION = re.compile(r"(?<!\w)@[A-Za-z0-9_]{4,32}(?!\w)")
_BOT_COMMAND = re.compile(r"(?<![\w/<>])/[A-Za-z0-9_]{1,64}(?:@[A-Za-z0-9_]{3,32})?(?![\w/<>])")


# -- text helpers -----------------------------------------------------------------------


def utf16_len(text: str) -> int:
    """Length of `text` in UTF-16 code units (Telegram's unit for lengths and offsets)."""
    return len(text.encode("utf-16-le")) // 2


def entity_text(text: str, entity: Json) -> str:
    """The part of `text` an entity covers (its offset/length are UTF-16 code units)."""
    raw = text.encode("utf-16-le")
    start = int(entity["offset"]) * 2
    return raw[start : start + int(entity["length"]) * 2].decode("utf-16-le")


def find_entities(text: str) -> list[Json]:
    """The entities Telegram detects in plain text: `mention` and `bot_command`."""
    found: list[Json] = []
    for kind, pattern in (("mention", _MENTION), ("bot_command", _BOT_COMMAND)):
        for m in pattern.finditer(text):
            found.append(
                {
                    "offset": utf16_len(text[: m.start()]),
                    "length": utf16_len(m.group()),
                    "type": kind,
                }
            )
    return _sorted_entities(found)


def _sorted_entities(entities: Iterable[Json]) -> list[Json]:
    return sorted(entities, key=lambda e: (e["offset"], -e["length"]))


def _overlaps(a: Json, b: Json) -> bool:
    return bool(a["offset"] < b["offset"] + b["length"] and b["offset"] < a["offset"] + a["length"])


_AUTO_BLOCKERS = frozenset(
    {"code", "pre", "text_link", "text_mention", "mention", "bot_command", "custom_emoji"}
)


def _merge_entities(given: list[Json], detected: list[Json]) -> list[Json]:
    """Formatting entities plus the detected ones that do not collide with them."""
    blockers = [e for e in given if e["type"] in _AUTO_BLOCKERS]
    extra = [d for d in detected if not any(_overlaps(d, b) for b in blockers)]
    return _sorted_entities([*given, *extra])


class _ParseError(Exception):
    """A parse_mode error; the description follows "can't parse entities: "."""


class _Builder:
    """Plain text plus entities with offsets counted in UTF-16 code units."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.pos = 0  # UTF-16 length so far
        self.entities: list[Json] = []

    def add(self, text: str) -> None:
        self.parts.append(text)
        self.pos += utf16_len(text)

    def entity(self, start: int, kind: str, **extra: Any) -> None:
        if self.pos > start:
            self.entities.append(
                {"offset": start, "length": self.pos - start, "type": kind, **extra}
            )

    def result(self) -> tuple[str, list[Json]]:
        return "".join(self.parts), _sorted_entities(self.entities)


def _byte_offset(source: str, index: int) -> int:
    return len(source[:index].encode("utf-8"))


def _link_entity(url: str) -> tuple[str, Json]:
    m = re.fullmatch(r"tg://user\?id=(\d+)", url)
    if m:
        return "text_mention", {"user": {"id": int(m.group(1)), "is_bot": False, "first_name": ""}}
    return "text_link", {"url": url}


_HTML_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9-]*)((?:\s+[^>]*)?)\s*/?>")
_HTML_ATTR = re.compile(
    r"""([A-Za-z_:][-A-Za-z0-9_:.]*)(?:\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+)))?"""
)
_HTML_ENTITY = re.compile(r"&(#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z]+);")
_HTML_SIMPLE = {
    "b": "bold",
    "strong": "bold",
    "i": "italic",
    "em": "italic",
    "u": "underline",
    "ins": "underline",
    "s": "strikethrough",
    "strike": "strikethrough",
    "del": "strikethrough",
    "tg-spoiler": "spoiler",
    "code": "code",
    "pre": "pre",
}
_HTML_TAGS = frozenset({*_HTML_SIMPLE, "span", "a", "blockquote", "tg-emoji"})


def parse_html(source: str) -> tuple[str, list[Json]]:
    """Telegram's parse_mode=HTML: the plain text and its entities."""
    out = _Builder()
    stack: list[tuple[str, int, str | None, Json]] = []  # tag, start, entity type, extra
    i = 0
    while i < len(source):
        c = source[i]
        if c == "<":
            m = _HTML_TAG.match(source, i)
            if m is None:
                raise _ParseError(
                    f'Unsupported start tag "" at byte offset {_byte_offset(source, i)}'
                )
            closing, name = m.group(1) == "/", m.group(2).lower()
            if not closing:
                if name not in _HTML_TAGS:
                    raise _ParseError(
                        f'Unsupported start tag "{name}" at byte offset {_byte_offset(source, i)}'
                    )
                attrs = {
                    a.group(1).lower(): a.group(2) or a.group(3) or a.group(4) or ""
                    for a in _HTML_ATTR.finditer(m.group(3))
                }
                kind: str | None = _HTML_SIMPLE.get(name)
                extra: Json = {}
                if name == "span":
                    if attrs.get("class") != "tg-spoiler":
                        raise _ParseError(
                            'Tag "span" must have class "tg-spoiler" at byte offset '
                            f"{_byte_offset(source, i)}"
                        )
                    kind = "spoiler"
                elif name == "a":
                    href = attrs.get("href")
                    kind, extra = _link_entity(href) if href else (None, {})
                elif name == "blockquote":
                    kind = "expandable_blockquote" if "expandable" in attrs else "blockquote"
                elif name == "tg-emoji":
                    if not attrs.get("emoji-id"):
                        raise _ParseError(
                            f'Custom emoji entity must have "emoji-id" attribute at byte offset '
                            f"{_byte_offset(source, i)}"
                        )
                    kind, extra = "custom_emoji", {"custom_emoji_id": attrs["emoji-id"]}
                elif name == "code" and stack and stack[-1][0] == "pre":
                    language = attrs.get("class", "")
                    if language.startswith("language-"):
                        stack[-1][3]["language"] = language.removeprefix("language-")
                        kind = None
                stack.append((name, out.pos, kind, extra))
            else:
                if not stack:
                    raise _ParseError(
                        f"Unexpected end tag at byte offset {_byte_offset(source, i)}"
                    )
                tag, start, kind, extra = stack.pop()
                if tag != name:
                    raise _ParseError(
                        f"Unmatched end tag at byte offset {_byte_offset(source, i)}, "
                        f'expected "</{tag}>", found "</{name}>"'
                    )
                if kind is not None:
                    out.entity(start, kind, **extra)
            i = m.end()
        elif c == "&":
            m = _HTML_ENTITY.match(source, i)
            if m is None:
                out.add("&")
                i += 1
                continue
            name = m.group(1)
            if name.startswith("#") or name in ("lt", "gt", "amp", "quot"):
                out.add(html.unescape(m.group()))
            else:  # Telegram only knows lt, gt, amp, quot by name
                out.add(m.group())
            i = m.end()
        else:
            out.add(c)
            i += 1
    if stack:
        raise _ParseError(f'Can\'t find end tag corresponding to start tag "{stack[-1][0]}"')
    return out.result()


_MDV2_RESERVED = frozenset("_*[]()~`>#+-=|{}.!")
_MDV2_NAMES = {
    "bold": "Bold",
    "italic": "Italic",
    "underline": "Underline",
    "strikethrough": "Strikethrough",
    "spoiler": "Spoiler",
    "text_link": "TextUrl",
    "custom_emoji": "CustomEmoji",
    "code": "Code",
    "pre": "Pre",
}


def _read_url(source: str, i: int, start_byte: int) -> tuple[str, int]:
    """An MarkdownV2 link's "(url)" starting at source[i] == "("; returns (url, next index)."""
    url: list[str] = []
    j = i + 1
    while j < len(source) and source[j] != ")":
        if source[j] == "\\" and j + 1 < len(source):
            j += 1
        url.append(source[j])
        j += 1
    if j >= len(source):
        raise _ParseError(f"Can't find end of a URL at byte offset {start_byte}")
    return "".join(url), j + 1


def parse_markdown_v2(source: str) -> tuple[str, list[Json]]:
    """Telegram's parse_mode=MarkdownV2: the plain text and its entities."""
    out = _Builder()
    stack: list[tuple[str, int, int, Json]] = []  # type, start, source byte offset, extra
    quote_start: int | None = None
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        nxt = source[i + 1] if i + 1 < n else ""
        top = stack[-1][0] if stack else None
        if c == "\\" and nxt and 0 < ord(nxt) <= 126:
            out.add(nxt)
            i += 2
            continue
        if top in ("code", "pre"):
            if (top == "code" and c == "`") or (top == "pre" and source.startswith("```", i)):
                kind, start, _, extra = stack.pop()
                out.entity(start, kind, **extra)
                i += 1 if kind == "code" else 3
            else:
                out.add(c)
                i += 1
            continue
        if c == "\n":
            out.add(c)
            i += 1
            if quote_start is not None and not source.startswith(">", i):
                out.pos -= 1  # the quote ends before the line break
                out.entity(quote_start, "blockquote")
                out.pos += 1
                quote_start = None
            continue
        if c == ">" and (i == 0 or source[i - 1] == "\n"):
            if quote_start is None:
                quote_start = out.pos
            i += 1
            continue
        if c not in _MDV2_RESERVED:
            out.add(c)
            i += 1
            continue
        # the end of the innermost entity?
        ends = {
            "bold": c == "*",
            "italic": c == "_" and not (nxt == "_" and any(s[0] == "underline" for s in stack)),
            "underline": c == "_" and nxt == "_",
            "strikethrough": c == "~",
            "spoiler": c == "|" and nxt == "|",
            "text_link": c == "]",
            "custom_emoji": c == "]",
        }
        if top is not None and ends.get(top, False):
            kind, start, start_byte, extra = stack.pop()
            i += 2 if kind in ("underline", "spoiler") else 1
            if kind in ("text_link", "custom_emoji"):
                if i < n and source[i] == "(":
                    url, i = _read_url(source, i, start_byte)
                elif kind == "custom_emoji":
                    raise _ParseError("Custom emoji entity must contain a tg://emoji URL")
                else:
                    url = ""
                if kind == "custom_emoji":
                    m = re.fullmatch(r"tg://emoji\?id=(\d+)", url)
                    if m is None:
                        raise _ParseError("Custom emoji URL must have an emoji identifier")
                    extra = {"custom_emoji_id": m.group(1)}
                elif url:
                    kind, extra = _link_entity(url)
                else:
                    continue  # "[text]" without a URL is plain text
            out.entity(start, kind, **extra)
            continue
        start_byte = _byte_offset(source, i)
        if c == "_" and nxt == "_":
            stack.append(("underline", out.pos, start_byte, {}))
            i += 2
        elif c == "_":
            stack.append(("italic", out.pos, start_byte, {}))
            i += 1
        elif c == "*":
            stack.append(("bold", out.pos, start_byte, {}))
            i += 1
        elif c == "~":
            stack.append(("strikethrough", out.pos, start_byte, {}))
            i += 1
        elif c == "|" and nxt == "|":
            stack.append(("spoiler", out.pos, start_byte, {}))
            i += 2
        elif c == "[":
            stack.append(("text_link", out.pos, start_byte, {}))
            i += 1
        elif c == "!" and nxt == "[":
            stack.append(("custom_emoji", out.pos, start_byte, {}))
            i += 2
        elif source.startswith("```", i):
            i += 3
            extra = {}
            line_end = source.find("\n", i)
            if line_end != -1 and line_end > i and not re.search(r"\s", source[i:line_end]):
                extra["language"] = source[i:line_end]
                i = line_end + 1
            elif line_end == i:
                i += 1
            stack.append(("pre", out.pos, start_byte, extra))
        elif c == "`":
            stack.append(("code", out.pos, start_byte, {}))
            i += 1
        else:
            raise _ParseError(
                f"Character '{c}' is reserved and must be escaped with the preceding '\\'"
            )
    if stack:
        kind, _, start_byte, _ = stack[-1]
        raise _ParseError(
            f"Can't find end of {_MDV2_NAMES[kind]} entity at byte offset {start_byte}"
        )
    if quote_start is not None:
        out.entity(quote_start, "blockquote")
    return out.result()


def parse_markdown(source: str) -> tuple[str, list[Json]]:
    """Telegram's legacy parse_mode=Markdown: the plain text and its entities."""
    out = _Builder()
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if c == "\\" and i + 1 < n and source[i + 1] in "_*`[":
            out.add(source[i + 1])
            i += 2
            continue
        if c not in "_*`[":
            out.add(c)
            i += 1
            continue
        start_byte, start = _byte_offset(source, i), out.pos
        if source.startswith("```", i):
            end = source.find("```", i + 3)
            if end == -1:
                raise _ParseError(
                    f"Can't find end of the entity starting at byte offset {start_byte}"
                )
            body, extra = source[i + 3 : end], {}
            first, sep, rest = body.partition("\n")
            if sep and first and not re.search(r"\s", first):
                body, extra = rest, {"language": first}
            out.add(body)
            out.entity(start, "pre", **extra)
            i = end + 3
            continue
        close = "]" if c == "[" else c
        end = source.find(close, i + 1)
        if end == -1:
            raise _ParseError(f"Can't find end of the entity starting at byte offset {start_byte}")
        out.add(source[i + 1 : end])
        i = end + 1
        if c == "[":
            if i < n and source[i] == "(" and (url_end := source.find(")", i)) != -1:
                kind, extra = _link_entity(source[i + 1 : url_end])
                out.entity(start, kind, **extra)
                i = url_end + 1
            continue
        out.entity(start, {"_": "italic", "*": "bold", "`": "code"}[c])
    return out.result()


_PARSERS: dict[str, Callable[[str], tuple[str, list[Json]]]] = {
    "html": parse_html,
    "markdownv2": parse_markdown_v2,
    "markdown": parse_markdown,
}


# -- the world ----------------------------------------------------------------------------


@dataclass
class FakeUser:
    id: int
    first_name: str
    username: str | None = None
    is_bot: bool = False

    def payload(self) -> Json:
        data: Json = {"id": self.id, "is_bot": self.is_bot, "first_name": self.first_name}
        if self.username:
            data["username"] = self.username
        return data


@dataclass
class Webhook:
    """A bot's webhook, as set by setWebhook."""

    url: str
    secret_token: str | None = None
    max_connections: int = 40
    allowed_updates: list[str] | None = None
    ip_address: str | None = None
    last_error_date: int | None = None
    last_error_message: str | None = None


@dataclass
class FakeBot:
    """A bot account. `privacy`: Group Privacy Mode (on by default in BotFather);
    `bot_to_bot`: BotFather's Bot-to-Bot Communication Mode."""

    token: str
    user: FakeUser
    privacy: bool = True
    bot_to_bot: bool = False
    updates: list[Json] = field(default_factory=list)  # every update ever queued
    pending: list[Json] = field(default_factory=list)  # not yet confirmed / delivered
    next_update_id: int = 1
    allowed_updates: list[str] | None = None  # None: the default set
    webhook: Webhook | None = None
    poll_generation: int = 0  # bumped by each getUpdates; an older poll is terminated
    polling: int = 0  # getUpdates requests waiting in a long poll right now

    @property
    def id(self) -> int:
        return self.user.id

    @property
    def username(self) -> str:
        return self.user.username or ""


@dataclass
class FakeChat:
    id: int
    type: str  # private | group | supergroup | channel
    title: str = ""
    is_forum: bool = False
    members: dict[int, str] = field(default_factory=dict)  # user id -> status
    messages: dict[int, Json] = field(default_factory=dict)  # message id -> message
    last_message_id: int = 0
    topics: dict[int, str] = field(default_factory=dict)  # message_thread_id -> name
    user: FakeUser | None = None  # private chats: the person
    bot_id: int | None = None  # private chats: the bot

    def payload(self) -> Json:
        if self.type == "private":
            assert self.user is not None
            data: Json = {"id": self.id, "first_name": self.user.first_name}
            if self.user.username:
                data["username"] = self.user.username
            data["type"] = "private"
            return data
        data = {"id": self.id, "title": self.title, "type": self.type}
        if self.is_forum:
            data["is_forum"] = True
        return data


# -- records -----------------------------------------------------------------------------


@dataclass
class ApiCall:
    """One HTTP request to the API; `params` exactly as received (form values are str)."""

    token: str
    method: str
    params: Json
    status: int = 0  # the HTTP status answered; 0 while running, 499 if the client hung up


@dataclass
class SentMessage:
    """A message a bot sent with sendMessage."""

    token: str
    bot_user_id: int
    chat_id: int
    thread_id: int | None
    text: str
    message: Json  # the Message as returned to the bot
    reply_to: int | None  # the explicitly replied-to message id
    params: Json = field(default_factory=dict)  # the request parameters as received


@dataclass(frozen=True)
class ChatAction:
    token: str
    bot_user_id: int
    chat_id: int
    action: str
    thread_id: int | None


@dataclass
class WebhookAttempt:
    """One POST of an update to a webhook; `status` None for a connection error."""

    token: str
    update: Json
    status: int | None
    url: str = ""
    attempt: int = 1
    error: str | None = None
    secret_token: str | None = None  # the header value sent, if any


class ApiError(Exception):
    """Answered as {"ok": false, "error_code": status, "description": ...}."""

    def __init__(self, status: int, description: str, *, retry_after: int | None = None) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.retry_after = retry_after

    def body(self) -> Json:
        data: Json = {"ok": False, "error_code": self.status, "description": self.description}
        if self.retry_after is not None:
            data["parameters"] = {"retry_after": self.retry_after}
        return data


_DEFAULT_DESCRIPTIONS = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    409: "Conflict",
    500: "Internal Server Error",
    502: "Bad Gateway",
}


# -- parameter parsing (form values are strings; JSON bodies carry native values) -------


def _opt_str(params: Json, name: str) -> str | None:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    raise ApiError(400, f'Bad Request: parameter "{name}" must be a string')


def _opt_int(params: Json, name: str, error: str | None = None) -> int | None:
    value = params.get(name)
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return int(value.strip())
    raise ApiError(400, error or f"Bad Request: invalid {name} specified")


def _opt_float(params: Json, name: str) -> float | None:
    value = params.get(name)
    if value is None or value == "":
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return float(value)
    raise ApiError(400, f"Bad Request: invalid {name} specified")


def _opt_bool(params: Json, name: str) -> bool | None:
    value = params.get(name)
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value != 0
    if isinstance(value, str) and value.lower() in ("true", "1", "false", "0"):
        return value.lower() in ("true", "1")
    raise ApiError(400, f"Bad Request: invalid {name} specified")


def _opt_json(params: Json, name: str, what: str) -> Any:
    value = params.get(name)
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            raise ApiError(400, f"Bad Request: can't parse {what} JSON object") from None
    return value


def _opt_update_types(params: Json, name: str) -> list[str] | None:
    value = _opt_json(params, name, "allowed updates")
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ApiError(400, "Bad Request: can't parse allowed updates JSON object")
    return [v for v in value if v in UPDATE_TYPES]


def _allowed(types: list[str] | None) -> frozenset[str]:
    return frozenset(types) if types else DEFAULT_UPDATE_TYPES


def _strip_reply(message: Json) -> Json:
    """A copy of a message as it appears nested in another (no nested reply_to_message)."""
    nested = copy.deepcopy(message)
    nested.pop("reply_to_message", None)
    return nested


def _json_response(body: Json, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(body).encode(), status=status, content_type="application/json"
    )


Handler = Callable[[FakeBot, Json], Awaitable[Any]]


def fast_request(**kwargs: Any) -> HTTPXRequest:
    """A PTB HTTPXRequest for the fake's plain-http server that skips loading the CA
    bundle (which costs ~0.1 s per client; a Bot has two). Pass it as
    `telegram.Bot(..., request=fast_request(), get_updates_request=fast_request())` or to
    `ApplicationBuilder().request(...).get_updates_request(...)`."""
    from telegram.request import HTTPXRequest

    return HTTPXRequest(httpx_kwargs={"verify": False}, **kwargs)


class FakeTelegram(Recording):
    """An aiohttp fake of the Telegram Bot API for python-telegram-bot clients."""

    label = "fake telegram"

    def __init__(
        self,
        *,
        webhook_tries: int = 3,
        webhook_backoff: float = 0.05,
        webhook_timeout: float = 5.0,
    ) -> None:
        self.webhook_tries = webhook_tries  # attempts per update before it is dropped
        self.webhook_backoff = webhook_backoff  # seconds before the 2nd attempt, then doubled
        self.webhook_timeout = webhook_timeout
        self.url = ""
        self.clock: Callable[[], float] = time.time  # message dates, webhook error dates
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        super().__init__()
        self._closing = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._hooks: dict[str, asyncio.Task[None]] = {}  # token -> webhook delivery task

        self.bots: dict[str, FakeBot] = {}  # by token
        self.users: dict[int, FakeUser] = {}
        self.chats: dict[int, FakeChat] = {}  # groups, supergroups, channels
        self.privates: dict[tuple[int, int], FakeChat] = {}  # (user id, bot user id)

        self.calls: list[ApiCall] = []
        self.sent: list[SentMessage] = []
        self.chat_actions: list[ChatAction] = []
        # (token, scope as canonical JSON, language code) -> commands
        self.commands: dict[tuple[str, str, str], list[Json]] = {}
        self.webhook_attempts: list[WebhookAttempt] = []
        self._faults: dict[str, deque[ApiError]] = {}

        self._methods: dict[str, Handler] = {
            name.lower(): handler
            for name, handler in {
                "getMe": self._get_me,
                "getUpdates": self._get_updates,
                "sendMessage": self._send_message,
                "sendChatAction": self._send_chat_action,
                "setMyCommands": self._set_my_commands,
                "getMyCommands": self._get_my_commands,
                "deleteMyCommands": self._delete_my_commands,
                "getChatMember": self._get_chat_member,
                "getChatAdministrators": self._get_chat_administrators,
                "setWebhook": self._set_webhook,
                "deleteWebhook": self._delete_webhook,
                "getWebhookInfo": self._get_webhook_info,
                "close": self._close,
                "logOut": self._close,
            }.items()
        }
        for special in (
            (GROUP_ANONYMOUS_BOT_ID, "Group", "GroupAnonymousBot"),
            (
                CHANNEL_BOT_ID,
                "Channel",
                "Channel_Bot",
            ),
        ):
            self.add_user(special[0], special[1], special[2], is_bot=True)

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> FakeTelegram:
        app = web.Application()
        app.router.add_route("*", "/bot{token}/{method}", self._handle)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        # handler_cancellation: a long poll PTB abandons (Updater.stop) ends with it
        self._runner = web.AppRunner(app, shutdown_timeout=1, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        self._session = aiohttp.ClientSession()
        return self

    @property
    def api_base(self) -> str:
        """PTB: `base_url=f"{api_base}/bot"`, `base_file_url=f"{api_base}/file/bot"`."""
        return self.url

    async def close(self) -> None:
        self._closing = True
        await self.changed()  # releases long polls
        for task in [*self._hooks.values(), *self._tasks]:
            task.cancel()
        for task in [*self._hooks.values(), *self._tasks]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._hooks.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeTelegram:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- world set-up ------------------------------------------------------------------

    def add_bot(
        self,
        token: str,
        user_id: int,
        username: str,
        first_name: str = "Test Bot",
        *,
        bot_to_bot: bool = False,
        privacy: bool = True,
    ) -> FakeBot:
        """A bot account reachable with `token`; not a member of any chat yet."""
        user = FakeUser(user_id, first_name, username, is_bot=True)
        bot = FakeBot(token, user, privacy=privacy, bot_to_bot=bot_to_bot)
        self.bots[token] = bot
        self.users[user_id] = user
        return bot

    def add_user(
        self, user_id: int, first_name: str, username: str | None = None, *, is_bot: bool = False
    ) -> FakeUser:
        user = FakeUser(user_id, first_name, username, is_bot=is_bot)
        self.users[user_id] = user
        return user

    def add_chat(
        self,
        chat_id: int,
        type: str = "supergroup",
        title: str = "Test group",
        *,
        is_forum: bool = False,
    ) -> FakeChat:
        if type not in CHAT_TYPES:
            raise ValueError(f"fake telegram: chat type must be one of {sorted(CHAT_TYPES)}")
        if is_forum and type != "supergroup":
            raise ValueError("fake telegram: only supergroups can be forums")
        chat = FakeChat(chat_id, type, title, is_forum=is_forum)
        self.chats[chat_id] = chat
        return chat

    def add_private(self, user_id: int, bot_user_id: int) -> FakeChat:
        """The private chat of a person with a bot (the person pressed Start); its id is
        the person's user id, as in Telegram."""
        user = self._user(user_id)
        bot = self.bot(bot_user_id)
        chat = FakeChat(user_id, "private", user=user, bot_id=bot.id)
        chat.members = {user_id: "member", bot.id: "member"}
        self.privates[(user_id, bot.id)] = chat
        return chat

    def add_member(self, chat_id: int, user_id: int, status: str = "member") -> None:
        """Make a person or bot a member (administrator, creator, or left/kicked) of a chat."""
        if status not in CHAT_STATUSES:
            raise ValueError(f"fake telegram: status must be one of {sorted(CHAT_STATUSES)}")
        self._user(user_id)
        self._group(chat_id).members[user_id] = status
        self._notify_soon()

    def create_topic(self, chat_id: int, user_id: int, name: str) -> int:
        """A forum topic created by `user_id`; returns its message_thread_id (the id of
        the `forum_topic_created` service message, which is delivered to member bots)."""
        chat = self._group(chat_id)
        if not chat.is_forum:
            raise ValueError(f"fake telegram: chat {chat_id} is not a forum")
        thread_id = chat.last_message_id + 1
        chat.topics[thread_id] = name
        msg = self._post(
            chat,
            self._user(user_id),
            thread_id=thread_id,
            fields={"forum_topic_created": {"name": name, "icon_color": TOPIC_ICON_COLOR}},
        )
        self._deliver(chat, msg, self._user(user_id), service=True)
        self._notify_soon()
        return thread_id

    def bot(self, user_id: int) -> FakeBot:
        for bot in self.bots.values():
            if bot.id == user_id:
                return bot
        raise KeyError(f"fake telegram: no bot with user id {user_id}")

    def user_payload(self, user_id: int) -> Json:
        """A User object (e.g. for `service(..., new_chat_members=[...])`)."""
        return self._user(user_id).payload()

    def fail_next(
        self,
        method: str,
        status: int,
        description: str | None = None,
        *,
        retry_after: int | None = None,
        times: int = 1,
    ) -> None:
        """Answer the next `times` calls of `method` (by any bot) with this error."""
        if description is None:
            description = (
                f"Too Many Requests: retry after {retry_after or 1}"
                if status == 429
                else _DEFAULT_DESCRIPTIONS.get(status, "Error")
            )
        if status == 429 and retry_after is None:
            retry_after = 1
        queue = self._faults.setdefault(method.lower(), deque())
        queue.extend(ApiError(status, description, retry_after=retry_after) for _ in range(times))

    # -- driving messages -----------------------------------------------------------------

    async def user_says(
        self,
        chat_id: int,
        user_id: int,
        text: str,
        *,
        thread_id: int | None = None,
        reply_to: int | None = None,
        entities: list[Json] | None = None,
        sender_chat_id: int | None = None,
        to_bot: int | None = None,
    ) -> Json:
        """A person posts `text`; returns the Message. `entities` None: detected as
        Telegram does. `sender_chat_id`: sent on behalf of a chat (the group itself: an
        anonymous admin, from GroupAnonymousBot; a channel: from Channel_Bot). `to_bot`
        picks the private chat when the person has one with several bots."""
        chat = self._chat_for_user(chat_id, user_id, to_bot)
        sender = self._user(user_id)
        sender_chat: Json | None = None
        if sender_chat_id is not None:
            owner = self._group(sender_chat_id)
            sender_chat = owner.payload()
            anonymous = GROUP_ANONYMOUS_BOT_ID if owner.id == chat.id else CHANNEL_BOT_ID
            sender = self._user(anonymous)
        elif chat.type != "private" and chat.members.get(user_id) not in MEMBER_STATUSES:
            chat.members[user_id] = "member"  # lenient: a poster is a member
        replied = self._replied(chat, reply_to)
        thread_id = self._thread(chat, thread_id, replied)
        detected = find_entities(text) if entities is None else _sorted_entities(entities)
        msg = self._post(
            chat,
            sender,
            text=text,
            entities=detected,
            thread_id=thread_id,
            reply_to=replied,
            sender_chat=sender_chat,
        )
        self._deliver(chat, msg, sender)
        await self.changed()
        return msg

    async def service(
        self,
        chat_id: int,
        user_id: int,
        *,
        thread_id: int | None = None,
        to_bot: int | None = None,
        **fields: Any,
    ) -> Json:
        """A service message (e.g. `new_chat_title="x"`, `pinned_message=<message>`,
        `new_chat_members=[fake.user_payload(id)]`, `left_chat_member=...`), delivered
        to every member bot. New members join the chat first, left ones leave after."""
        chat = self._chat_for_user(chat_id, user_id, to_bot)
        sender = self._user(user_id)
        thread_id = self._thread(chat, thread_id, None)
        extra = copy.deepcopy(fields)
        if isinstance(extra.get("pinned_message"), dict):
            extra["pinned_message"] = _strip_reply(extra["pinned_message"])
        for joined in extra.get("new_chat_members") or []:
            self.users.setdefault(
                joined["id"],
                FakeUser(
                    joined["id"],
                    joined.get("first_name", ""),
                    joined.get("username"),
                    is_bot=bool(joined.get("is_bot")),
                ),
            )
            chat.members[joined["id"]] = "member"
        msg = self._post(chat, sender, thread_id=thread_id, fields=extra)
        self._deliver(chat, msg, sender, service=True)
        left = extra.get("left_chat_member")
        if isinstance(left, dict):
            chat.members[left["id"]] = "left"
        await self.changed()
        return msg

    def message_payload(
        self, chat_id: int, user_id: int, text: str | None = None, **fields: Any
    ) -> Json:
        """A new Message of `user_id` in `chat_id` (stored in the chat, so replies to
        it resolve) that nobody receives: a starting point for `push_raw`. `fields`
        are merged in as given."""
        chat = self._chat_for_user(chat_id, user_id, None)
        msg = self._post(chat, self._user(user_id), text=text, fields=copy.deepcopy(fields))
        return copy.deepcopy(msg)

    async def push_raw(self, bot_user_id: int, update: Json) -> Json:
        """Queue `update` for one bot exactly as given (its `update_id` is set
        here): any update kind, any message shape, whatever the bot's
        allowed_updates say. Returns the queued update."""
        bot = self.bot(bot_user_id)
        queued = {**copy.deepcopy(update), "update_id": bot.next_update_id}
        bot.next_update_id += 1
        bot.updates.append(queued)
        bot.pending.append(queued)
        await self.changed()
        return queued

    # -- inspection and waiting -----------------------------------------------------------

    def updates_for(self, token: str) -> list[Json]:
        """Every update ever queued for a bot (confirmed or not)."""
        return list(self.bots[token].updates)

    def pending_for(self, token: str) -> list[Json]:
        """Updates queued for a bot and not yet confirmed (getUpdates) or delivered."""
        return list(self.bots[token].pending)

    def messages(self, chat_id: int, *, bot_user_id: int | None = None) -> list[Json]:
        """Every message in a chat, in order (`bot_user_id` picks a private chat)."""
        chat = self.chats.get(chat_id) or self._private(chat_id, bot_user_id)
        return [chat.messages[k] for k in sorted(chat.messages)]

    def commands_for(
        self, token: str, scope: Json | None = None, language_code: str = ""
    ) -> list[Json] | None:
        """The commands set for a bot, scope (default {"type": "default"}) and language."""
        key = json.dumps(scope or {"type": "default"}, sort_keys=True)
        return self.commands.get((token, key, language_code))

    def calls_of(self, method: str, token: str | None = None) -> list[ApiCall]:
        return [
            c
            for c in self.calls
            if c.method.lower() == method.lower() and (token is None or c.token == token)
        ]

    async def wait_sent(
        self,
        count: int,
        *,
        chat_id: int | None = None,
        timeout: float = 5.0,  # noqa: ASYNC109
    ) -> list[SentMessage]:
        """Wait until at least `count` messages were sent (to `chat_id`); return them all."""

        def matching() -> list[SentMessage]:
            return [s for s in self.sent if chat_id is None or s.chat_id == chat_id]

        await self.wait_until(
            lambda: len(matching()) >= count,
            timeout,
            f"{count} sent message(s)" + (f" in chat {chat_id}" if chat_id is not None else ""),
        )
        return matching()

    # -- delivery -------------------------------------------------------------------------

    def receives(self, bot: FakeBot, chat: FakeChat, msg: Json, *, service: bool = False) -> bool:
        """Whether `bot` (R) gets an update for `msg`. Never for its own messages; in a
        private chat only the chat's bot; in groups only member bots, and then:

        - service messages: every member bot;
        - from a person (or an anonymous admin / channel): everything if R has privacy
          off or is an administrator; otherwise only a command for R (`/cmd@R` or a bare
          `/cmd`, anywhere in the text), a reply to one of R's messages, or a mention of R
          (`@R` or a text_mention);
        - from another bot S (https://core.telegram.org/api/bots/bot-to-bot): if S or R
          has bot-to-bot mode and the text has `/cmd@R` or replies to R's message; else
          everything only if R has bot-to-bot mode, is an administrator and has privacy
          off.

        "Reply" includes a forum topic's implicit reply to its creation message, as in
        Telegram: a bot gets every message in a topic it created.
        """
        sender = msg.get("from") or {}
        if sender.get("id") == bot.id:
            return False
        if chat.type == "private":
            return chat.bot_id == bot.id
        if chat.type == "channel":
            return False  # channel posts are channel_post updates, which the fake lacks
        status = chat.members.get(bot.id)
        if status not in MEMBER_STATUSES:
            return False
        if service:
            return True
        is_admin = status in ADMIN_STATUSES
        text = msg.get("text") or ""
        entities = msg.get("entities") or []
        commands = [entity_text(text, e) for e in entities if e["type"] == "bot_command"]
        me = f"@{bot.username}".lower()
        command_for_me = any(c.lower().endswith(me) for c in commands)
        replied = msg.get("reply_to_message") or {}
        reply_to_me = (replied.get("from") or {}).get("id") == bot.id
        anonymous = sender.get("id") in (GROUP_ANONYMOUS_BOT_ID, CHANNEL_BOT_ID)
        if sender.get("is_bot") and not anonymous:
            # https://core.telegram.org/api/bots/bot-to-bot
            other = next((b for b in self.bots.values() if b.id == sender.get("id")), None)
            either_mode = bot.bot_to_bot or (other is not None and other.bot_to_bot)
            if either_mode and (command_for_me or reply_to_me):
                return True
            return bot.bot_to_bot and is_admin and not bot.privacy
        if not bot.privacy or is_admin:
            return True
        bare_command = any("@" not in c for c in commands)
        mentioned = any(
            (e["type"] == "mention" and entity_text(text, e).lower() == me)
            or (e["type"] == "text_mention" and (e.get("user") or {}).get("id") == bot.id)
            for e in entities
        )
        return command_for_me or bare_command or reply_to_me or mentioned

    def _deliver(
        self, chat: FakeChat, msg: Json, sender: FakeUser, *, service: bool = False
    ) -> None:
        for bot in self.bots.values():
            if bot.id != sender.id and self.receives(bot, chat, msg, service=service):
                self._enqueue(bot, "message", msg)

    def _enqueue(self, bot: FakeBot, kind: str, payload: Json) -> None:
        allowed = _allowed(bot.webhook.allowed_updates if bot.webhook else bot.allowed_updates)
        if kind not in allowed:
            return
        update = {"update_id": bot.next_update_id, kind: copy.deepcopy(payload)}
        bot.next_update_id += 1
        bot.updates.append(update)
        bot.pending.append(update)

    # -- HTTP ------------------------------------------------------------------------------

    async def _not_found(self, request: web.Request) -> web.StreamResponse:
        return _json_response(ApiError(404, "Not Found").body(), 404)

    async def _read_params(self, request: web.Request) -> Json:
        params: Json = dict(request.query)
        if not request.body_exists:
            return params
        if request.content_type == "application/json":
            try:
                body = await request.json()
            except ValueError:
                raise ApiError(400, "Bad Request: can't parse JSON encoded request") from None
            if not isinstance(body, dict):
                raise ApiError(400, "Bad Request: can't parse JSON encoded request")
            params.update(body)
        elif request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
            form = await request.post()
            for key, value in form.items():
                if isinstance(value, str):
                    params[key] = value
                else:  # an uploaded file: recorded by name only
                    params[key] = f"<file {getattr(value, 'filename', key)}>"
        return params

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        token, method = request.match_info["token"], request.match_info["method"]
        call = ApiCall(token, method, {})
        self.calls.append(call)
        try:
            call.params = await self._read_params(request)
            bot = self.bots.get(token)
            if bot is None:
                raise ApiError(401, "Unauthorized")
            handler = self._methods.get(method.lower())
            if handler is None:
                raise ApiError(404, "Not Found")
            faults = self._faults.get(method.lower())
            if faults:
                raise faults.popleft()
            result = await handler(bot, call.params)
        except ApiError as exc:
            call.status = exc.status
            await self.changed()
            return _json_response(exc.body(), exc.status)
        except asyncio.CancelledError:
            call.status = CLIENT_CLOSED  # the client hung up (e.g. PTB abandoning a long poll)
            raise
        call.status = 200
        await self.changed()
        body: Json = {"ok": True, "result": result}
        if method.lower() in ("setwebhook", "deletewebhook") and isinstance(result, bool):
            body["description"] = (
                "Webhook was set" if method.lower() == "setwebhook" else "Webhook was deleted"
            )
        return _json_response(body)

    # -- lookups ---------------------------------------------------------------------------

    def _user(self, user_id: int) -> FakeUser:
        try:
            return self.users[user_id]
        except KeyError:
            raise KeyError(f"fake telegram: unknown user {user_id} (add_user first)") from None

    def _group(self, chat_id: int) -> FakeChat:
        try:
            return self.chats[chat_id]
        except KeyError:
            raise KeyError(f"fake telegram: unknown chat {chat_id} (add_chat first)") from None

    def _private(self, user_id: int, bot_user_id: int | None) -> FakeChat:
        found = [
            c
            for (uid, bid), c in self.privates.items()
            if uid == user_id and (bot_user_id is None or bid == bot_user_id)
        ]
        if len(found) != 1:
            raise KeyError(
                f"fake telegram: {len(found)} private chats of user {user_id}"
                + ("" if bot_user_id is None else f" with bot {bot_user_id}")
                + " (add_private first; pass to_bot= to choose)"
            )
        return found[0]

    def _chat_for_user(self, chat_id: int, user_id: int, to_bot: int | None) -> FakeChat:
        if chat_id in self.chats:
            return self.chats[chat_id]
        if chat_id != user_id:
            raise KeyError(f"fake telegram: unknown chat {chat_id}")
        return self._private(user_id, to_bot)

    def _chat_for_bot(self, bot: FakeBot, params: Json, *, sending: bool = False) -> FakeChat:
        raw = params.get("chat_id")
        if raw is None or raw == "":
            raise ApiError(400, "Bad Request: chat_id is empty")
        chat_id = _opt_int(params, "chat_id", "Bad Request: chat not found")
        assert chat_id is not None
        if chat_id in self.chats:
            return self.chats[chat_id]
        private = self.privates.get((chat_id, bot.id))
        if private is not None:
            return private
        user = self.users.get(chat_id)
        if sending and user is not None:
            if user.is_bot:
                raise ApiError(403, "Forbidden: bot can't send messages to bots")
            raise ApiError(403, "Forbidden: bot can't initiate conversation with a user")
        raise ApiError(400, "Bad Request: chat not found")

    def _require_member(self, bot: FakeBot, chat: FakeChat) -> None:
        if chat.type == "private":
            return
        if chat.members.get(bot.id) not in MEMBER_STATUSES:
            raise ApiError(403, f"Forbidden: bot is not a member of the {chat.type} chat")

    def _replied(self, chat: FakeChat, reply_to: int | None) -> Json | None:
        if reply_to is None:
            return None
        if reply_to not in chat.messages:
            raise KeyError(f"fake telegram: no message {reply_to} in chat {chat.id}")
        return chat.messages[reply_to]

    def _thread(self, chat: FakeChat, thread_id: int | None, replied: Json | None) -> int | None:
        if thread_id is not None:
            if thread_id not in chat.topics:
                raise KeyError(f"fake telegram: no topic {thread_id} in chat {chat.id}")
            return thread_id
        if replied is not None and replied.get("is_topic_message"):
            return int(replied["message_thread_id"])
        return None

    # -- posting ---------------------------------------------------------------------------

    def _post(
        self,
        chat: FakeChat,
        sender: FakeUser,
        *,
        text: str | None = None,
        entities: list[Json] | None = None,
        thread_id: int | None = None,
        reply_to: Json | None = None,
        sender_chat: Json | None = None,
        fields: Json | None = None,
    ) -> Json:
        """Store a new message in `chat` and return it."""
        chat.last_message_id += 1
        msg: Json = {"message_id": chat.last_message_id}
        if thread_id is not None:
            msg["message_thread_id"] = thread_id
        msg["from"] = sender.payload()
        if sender_chat is not None:
            msg["sender_chat"] = sender_chat
        msg["chat"] = chat.payload()
        msg["date"] = int(self.clock())
        if thread_id is not None:
            msg["is_topic_message"] = True
        if reply_to is not None:
            msg["reply_to_message"] = _strip_reply(reply_to)
        elif thread_id is not None and thread_id != chat.last_message_id:
            # Telegram: a topic message that is no explicit reply replies to the topic's root
            msg["reply_to_message"] = _strip_reply(chat.messages[thread_id])
        if text is not None:
            msg["text"] = text
            if entities:
                msg["entities"] = entities
        msg.update(fields or {})
        chat.messages[msg["message_id"]] = msg
        return msg

    def _notify_soon(self) -> None:
        """Notify waiters from synchronous code (set-up methods)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop: nobody can be waiting
        task = loop.create_task(self.changed())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- Bot API methods -------------------------------------------------------------------

    async def _get_me(self, bot: FakeBot, params: Json) -> Json:
        return {
            **bot.user.payload(),
            "can_join_groups": True,
            "can_read_all_group_messages": not bot.privacy,
            "supports_inline_queries": False,
            "can_connect_to_business": False,
            "has_main_web_app": False,
        }

    async def _close(self, bot: FakeBot, params: Json) -> bool:
        return True

    async def _get_updates(self, bot: FakeBot, params: Json) -> list[Json]:
        offset = _opt_int(params, "offset")
        limit = _opt_int(params, "limit")
        limit = 100 if limit is None or not 1 <= limit <= 100 else limit
        timeout = max(0.0, _opt_float(params, "timeout") or 0.0)
        allowed = _opt_update_types(params, "allowed_updates")
        if bot.webhook is not None:
            raise ApiError(409, WEBHOOK_CONFLICT)
        if allowed is not None:
            bot.allowed_updates = allowed or None
            kinds = _allowed(bot.allowed_updates)
            bot.pending = [
                u for u in bot.pending if next(k for k in u if k != "update_id") in kinds
            ]
        if offset is not None and offset > 0:
            bot.pending = [u for u in bot.pending if u["update_id"] >= offset]
        elif offset is not None and offset < 0:
            bot.pending = bot.pending[offset:]
        bot.poll_generation += 1
        generation = bot.poll_generation
        await self.changed()  # terminates an older poll of this bot
        if not bot.pending and timeout > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout), self._cond:
                    bot.polling += 1
                    self._cond.notify_all()  # tests can wait for a poll to be waiting
                    try:
                        await self._cond.wait_for(
                            lambda: (
                                bool(bot.pending)
                                or bot.poll_generation != generation
                                or bot.webhook is not None
                                or self._closing
                            )
                        )
                    finally:
                        bot.polling -= 1
        if bot.poll_generation != generation:
            raise ApiError(409, POLL_CONFLICT)
        if bot.webhook is not None:
            raise ApiError(409, WEBHOOK_CONFLICT)
        return copy.deepcopy(bot.pending[:limit])

    def _text_and_entities(self, params: Json) -> tuple[str, list[Json]]:
        text = _opt_str(params, "text") or ""
        given = _opt_json(params, "entities", "message entities")
        parse_mode = (_opt_str(params, "parse_mode") or "").lower()
        if given is not None:
            entities = self._check_entities(text, given)
        elif parse_mode:
            parser = _PARSERS.get(parse_mode)
            if parser is None:
                raise ApiError(400, "Bad Request: unsupported parse_mode")
            try:
                text, entities = parser(text)
            except _ParseError as exc:
                raise ApiError(400, f"Bad Request: can't parse entities: {exc}") from None
        else:
            entities = []
        if not text.strip():
            raise ApiError(400, "Bad Request: message text is empty")
        if utf16_len(text) > MAX_TEXT_LENGTH:
            raise ApiError(400, "Bad Request: message is too long")
        return text, _merge_entities(entities, find_entities(text))

    def _check_entities(self, text: str, given: Any) -> list[Json]:
        if not isinstance(given, list):
            raise ApiError(400, "Bad Request: can't parse message entities JSON object")
        size = utf16_len(text)
        entities: list[Json] = []
        for entity in given:
            if (
                not isinstance(entity, dict)
                or not isinstance(entity.get("type"), str)
                or not isinstance(entity.get("offset"), int)
                or not isinstance(entity.get("length"), int)
            ):
                raise ApiError(400, "Bad Request: can't parse MessageEntity JSON object")
            if entity["type"] == "text_link" and not entity.get("url"):
                raise ApiError(400, "Bad Request: can't parse entities: URL is empty")
            if entity["type"] == "text_mention" and not isinstance(entity.get("user"), dict):
                raise ApiError(400, "Bad Request: can't parse entities: user is not specified")
            if entity["offset"] < 0 or entity["length"] <= 0 or entity["offset"] >= size:
                continue  # Telegram silently drops entities outside the text
            kept = dict(entity)
            kept["length"] = min(kept["length"], size - kept["offset"])
            entities.append(kept)
        return _sorted_entities(entities)

    async def _send_message(self, bot: FakeBot, params: Json) -> Json:
        chat = self._chat_for_bot(bot, params, sending=True)
        self._require_member(bot, chat)
        text, entities = self._text_and_entities(params)
        thread_id = _opt_int(params, "message_thread_id", "Bad Request: message thread not found")
        reply = _opt_json(params, "reply_parameters", "reply parameters")
        if reply is not None and (not isinstance(reply, dict) or "message_id" not in reply):
            raise ApiError(400, "Bad Request: can't parse reply parameters JSON object")
        if reply is not None:
            reply_id = _opt_int(reply, "message_id")
            allow = bool(_opt_bool(reply, "allow_sending_without_reply"))
        else:
            reply_id = _opt_int(params, "reply_to_message_id")
            allow = bool(_opt_bool(params, "allow_sending_without_reply"))
        replied = chat.messages.get(reply_id) if reply_id else None
        if reply_id and replied is None and not allow:
            raise ApiError(400, "Bad Request: message to be replied not found")
        if thread_id is not None:
            if thread_id not in chat.topics:
                raise ApiError(400, "Bad Request: message thread not found")
        elif replied is not None and replied.get("is_topic_message"):
            thread_id = int(replied["message_thread_id"])
        for name, what in (
            ("link_preview_options", "link preview options"),
            ("reply_markup", "reply keyboard"),
        ):
            value = _opt_json(params, name, what)
            if value is not None and not isinstance(value, dict):
                raise ApiError(400, f"Bad Request: can't parse {what} JSON object")
        markup = _opt_json(params, "reply_markup", "reply keyboard")
        fields = {"reply_markup": markup} if markup and "inline_keyboard" in markup else None
        msg = self._post(
            chat,
            bot.user,
            text=text,
            entities=entities,
            thread_id=thread_id,
            reply_to=replied,
            fields=fields,
        )
        self.sent.append(
            SentMessage(
                token=bot.token,
                bot_user_id=bot.id,
                chat_id=chat.id,
                thread_id=thread_id,
                text=text,
                message=copy.deepcopy(msg),
                reply_to=replied["message_id"] if replied else None,
                params=dict(params),
            )
        )
        self._deliver(chat, msg, bot.user)
        await self.changed()
        return copy.deepcopy(msg)

    async def _send_chat_action(self, bot: FakeBot, params: Json) -> bool:
        chat = self._chat_for_bot(bot, params, sending=True)
        self._require_member(bot, chat)
        action = _opt_str(params, "action")
        if not action:
            raise ApiError(400, "Bad Request: action is empty")
        if action not in CHAT_ACTIONS:
            raise ApiError(400, "Bad Request: wrong parameter action in request")
        thread_id = _opt_int(params, "message_thread_id", "Bad Request: message thread not found")
        if thread_id is not None and thread_id not in chat.topics:
            raise ApiError(400, "Bad Request: message thread not found")
        self.chat_actions.append(ChatAction(bot.token, bot.id, chat.id, action, thread_id))
        return True

    def _scope_key(self, bot: FakeBot, params: Json) -> tuple[str, str, str]:
        scope = _opt_json(params, "scope", "BotCommandScope")
        if scope is None:
            scope = {"type": "default"}
        if not isinstance(scope, dict) or scope.get("type") not in SCOPE_TYPES:
            raise ApiError(400, "Bad Request: can't parse BotCommandScope JSON object")
        if scope["type"].startswith("chat"):
            self._chat_for_bot(bot, scope)
            scope["chat_id"] = _opt_int(scope, "chat_id")
        if scope["type"] == "chat_member":
            user_id = _opt_int(scope, "user_id")
            if user_id is None or user_id not in self.users:
                raise ApiError(400, "Bad Request: user not found")
            scope["user_id"] = user_id
        language = _opt_str(params, "language_code") or ""
        if language and not _LANGUAGE_CODE.fullmatch(language):
            raise ApiError(400, "Bad Request: invalid language code specified")
        return bot.token, json.dumps(scope, sort_keys=True), language

    async def _set_my_commands(self, bot: FakeBot, params: Json) -> bool:
        commands = _opt_json(params, "commands", "BotCommand array")
        if commands is None:
            raise ApiError(400, 'Bad Request: parameter "commands" is required')
        if not isinstance(commands, list):
            raise ApiError(400, "Bad Request: can't parse BotCommand array JSON object")
        if len(commands) > 100:
            raise ApiError(400, "Bad Request: too many commands specified")
        for cmd in commands:
            if not isinstance(cmd, dict):
                raise ApiError(400, "Bad Request: can't parse BotCommand JSON object")
            name, description = cmd.get("command"), cmd.get("description")
            if not isinstance(name, str) or not _COMMAND_NAME.fullmatch(name):
                raise ApiError(400, "Bad Request: BOT_COMMAND_INVALID")
            if not isinstance(description, str) or not 1 <= len(description) <= 256:
                raise ApiError(400, "Bad Request: command description is empty")
        key = self._scope_key(bot, params)
        if commands:
            self.commands[key] = [
                {"command": c["command"], "description": c["description"]} for c in commands
            ]
        else:
            self.commands.pop(key, None)
        return True

    async def _get_my_commands(self, bot: FakeBot, params: Json) -> list[Json]:
        return copy.deepcopy(self.commands.get(self._scope_key(bot, params), []))

    async def _delete_my_commands(self, bot: FakeBot, params: Json) -> bool:
        self.commands.pop(self._scope_key(bot, params), None)
        return True

    def _member_payload(self, chat: FakeChat, user: FakeUser) -> Json:
        status = chat.members.get(user.id, "left")
        if status == "creator":
            return {"user": user.payload(), "status": "creator", "is_anonymous": False}
        if status == "administrator":
            data: Json = {
                "user": user.payload(),
                "status": "administrator",
                "can_be_edited": False,
                "is_anonymous": False,
                "can_manage_chat": True,
                "can_delete_messages": True,
                "can_manage_video_chats": True,
                "can_restrict_members": True,
                "can_promote_members": False,
                "can_change_info": True,
                "can_invite_users": True,
                "can_post_stories": False,
                "can_edit_stories": False,
                "can_delete_stories": False,
                "can_pin_messages": True,
            }
            if chat.type == "supergroup":
                data["can_manage_topics"] = True
            return data
        if status == "kicked":
            return {"user": user.payload(), "status": "kicked", "until_date": 0}
        if status not in MEMBER_STATUSES:
            return {"user": user.payload(), "status": "left"}
        return {"user": user.payload(), "status": "member"}

    async def _get_chat_member(self, bot: FakeBot, params: Json) -> Json:
        chat = self._chat_for_bot(bot, params)
        self._require_member(bot, chat)
        user_id = _opt_int(params, "user_id", "Bad Request: invalid user_id specified")
        if user_id is None:
            raise ApiError(400, "Bad Request: invalid user_id specified")
        user = self.users.get(user_id)
        if user is None:
            raise ApiError(400, "Bad Request: user not found")
        return self._member_payload(chat, user)

    async def _get_chat_administrators(self, bot: FakeBot, params: Json) -> list[Json]:
        chat = self._chat_for_bot(bot, params)
        if chat.type == "private":
            raise ApiError(400, "Bad Request: there are no administrators in the private chat")
        self._require_member(bot, chat)
        ranked = sorted(
            (uid for uid, s in chat.members.items() if s in ADMIN_STATUSES),
            key=lambda uid: chat.members[uid] != "creator",
        )
        return [self._member_payload(chat, self._user(uid)) for uid in ranked]

    async def _set_webhook(self, bot: FakeBot, params: Json) -> bool:
        url = _opt_str(params, "url") or ""
        secret = _opt_str(params, "secret_token") or None
        allowed = _opt_update_types(params, "allowed_updates")
        drop = bool(_opt_bool(params, "drop_pending_updates"))
        max_connections = _opt_int(params, "max_connections")
        if not url:
            await self._stop_webhook(bot)
            if drop:
                bot.pending.clear()
            return True
        parsed = URL(url)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ApiError(400, "Bad Request: bad webhook: Failed to resolve host")
        if secret is not None:
            if len(secret) > 256:
                raise ApiError(400, "Bad Request: secret token is too long")
            if not _SECRET_TOKEN.fullmatch(secret):
                raise ApiError(400, "Bad Request: secret token contains unallowed characters")
        await self._stop_webhook(bot)
        if drop:
            bot.pending.clear()
        old = bot.webhook
        bot.webhook = Webhook(
            url=url,
            secret_token=secret,
            max_connections=min(100, max(1, max_connections or 40)),
            allowed_updates=allowed if allowed is not None or old is None else old.allowed_updates,
            ip_address=_opt_str(params, "ip_address"),
        )
        task = asyncio.get_running_loop().create_task(self._webhook_loop(bot))
        self._hooks[bot.token] = task
        return True

    async def _delete_webhook(self, bot: FakeBot, params: Json) -> bool:
        drop = bool(_opt_bool(params, "drop_pending_updates"))
        await self._stop_webhook(bot)
        if drop:
            bot.pending.clear()
        return True

    async def _stop_webhook(self, bot: FakeBot) -> None:
        task = self._hooks.pop(bot.token, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        bot.webhook = None

    async def _get_webhook_info(self, bot: FakeBot, params: Json) -> Json:
        hook = bot.webhook
        info: Json = {
            "url": hook.url if hook else "",
            "has_custom_certificate": False,
            "pending_update_count": len(bot.pending),
        }
        if hook is not None:
            info["max_connections"] = hook.max_connections
            if hook.ip_address:
                info["ip_address"] = hook.ip_address
            if hook.allowed_updates:
                info["allowed_updates"] = hook.allowed_updates
            if hook.last_error_date is not None:
                info["last_error_date"] = hook.last_error_date
                info["last_error_message"] = hook.last_error_message
        return info

    # -- webhook delivery ---------------------------------------------------------------------

    async def _webhook_loop(self, bot: FakeBot) -> None:
        """Push a bot's updates to its webhook one at a time, in order, with retries."""
        while True:
            async with self._cond:
                await self._cond.wait_for(lambda: bool(bot.pending))
            hook = bot.webhook
            if hook is None:
                return
            update = bot.pending[0]
            for attempt in range(1, self.webhook_tries + 1):
                status, error = await self._post_update(hook, update)
                self.webhook_attempts.append(
                    WebhookAttempt(
                        token=bot.token,
                        update=copy.deepcopy(update),
                        status=status,
                        url=hook.url,
                        attempt=attempt,
                        error=error,
                        secret_token=hook.secret_token,
                    )
                )
                if status is not None and 200 <= status < 300:
                    break
                hook.last_error_date = int(self.clock())
                hook.last_error_message = error or f"Wrong response from the webhook: {status}"
                await self.changed()
                if attempt < self.webhook_tries:
                    await asyncio.sleep(self.webhook_backoff * 2 ** (attempt - 1))
            if bot.pending and bot.pending[0] is update:
                bot.pending.pop(0)
            await self.changed()

    async def _post_update(self, hook: Webhook, update: Json) -> tuple[int | None, str | None]:
        assert self._session is not None
        headers = {"Content-Type": "application/json"}
        if hook.secret_token:
            headers["X-Telegram-Bot-Api-Secret-Token"] = hook.secret_token
        try:
            async with self._session.post(
                hook.url,
                data=json.dumps(update).encode(),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.webhook_timeout),
            ) as response:
                await response.read()
                reason = response.reason or ""
                return response.status, (
                    None
                    if response.status < 300
                    else f"Wrong response from the webhook: {response.status} {reason}".rstrip()
                )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return None, f"Connection failed: {exc!r}"
