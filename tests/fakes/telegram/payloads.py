"""The JSON the fake hands out: messages with the entities Telegram detects in plain
text, and the objects getMe and getChatMember answer with."""

from __future__ import annotations

import copy
import re
import time

from tests.fakes.telegram.world import FakeBot, FakeChat, FakeUser, Json

MAX_TEXT_LENGTH = 4096  # UTF-16 code units

# Telegram (tdlib's match_mentions / match_bot_commands) for plain text: a mention is
# "@" and 4-32 of [A-Za-z0-9_] between non-word characters; a command is "/" and 1-64
# of them, optionally "@" and a 3-32 character bot username, not glued to a word, "/",
# "<" or ">".
_MENTION = re.compile(r"(?<!\w)@[A-Za-z0-9_]{4,32}(?!\w)")
_BOT_COMMAND = re.compile(r"(?<![\w/<>])/[A-Za-z0-9_]{1,64}(?:@[A-Za-z0-9_]{3,32})?(?![\w/<>])")


# -- entities ------------------------------------------------------------------------


def utf16_len(text: str) -> int:
    """Length of `text` in UTF-16 code units (Telegram's unit for lengths and offsets)."""
    return len(text.encode("utf-16-le")) // 2


def entity_text(text: str, entity: Json) -> str:
    """The part of `text` an entity covers (its offset/length are UTF-16 code units)."""
    raw = text.encode("utf-16-le")
    start = int(entity["offset"]) * 2
    return raw[start : start + int(entity["length"]) * 2].decode("utf-16-le")


def sorted_entities(entities: list[Json]) -> list[Json]:
    return sorted(entities, key=lambda e: (e["offset"], -e["length"]))


def find_entities(text: str) -> list[Json]:
    """The entities Telegram detects in plain text: `mention` and `bot_command` (no
    urls, hashtags and the like)."""
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
    return sorted_entities(found)


# -- messages ------------------------------------------------------------------------


def nested(message: Json) -> Json:
    """A copy of a message as it appears inside another (no reply_to_message of its own)."""
    inner = copy.deepcopy(message)
    inner.pop("reply_to_message", None)
    return inner


def new_message(
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
    """A new Message from `sender`, stored in `chat` under the chat's next message id.
    In a forum topic a message that replies to nothing replies to the topic's first
    message, as in Telegram."""
    chat.last_message_id += 1
    msg: Json = {"message_id": chat.last_message_id}
    if thread_id is not None:
        msg["message_thread_id"] = thread_id
    msg["from"] = sender.payload()
    if sender_chat is not None:
        msg["sender_chat"] = sender_chat
    msg["chat"] = chat.payload()
    msg["date"] = int(time.time())
    if thread_id is not None:
        msg["is_topic_message"] = True
    if reply_to is not None:
        msg["reply_to_message"] = nested(reply_to)
    elif thread_id is not None and thread_id != chat.last_message_id:
        msg["reply_to_message"] = nested(chat.messages[thread_id])
    if text is not None:
        msg["text"] = text
        if entities:
            msg["entities"] = entities
    msg.update(fields or {})
    chat.messages[msg["message_id"]] = msg
    return msg


# -- answers of getMe and getChatMember ----------------------------------------------


def me_payload(bot: FakeBot) -> Json:
    return {
        **bot.user.payload(),
        "can_join_groups": True,
        "can_read_all_group_messages": not bot.privacy,
        "supports_inline_queries": False,
    }


_ADMIN_RIGHTS = (
    "can_manage_chat",
    "can_delete_messages",
    "can_manage_video_chats",
    "can_restrict_members",
    "can_change_info",
    "can_invite_users",
    "can_pin_messages",
)
_NO_ADMIN_RIGHTS = (
    "can_be_edited",
    "is_anonymous",
    "can_promote_members",
    "can_post_stories",
    "can_edit_stories",
    "can_delete_stories",
)


def member_payload(chat: FakeChat, user: FakeUser) -> Json:
    """The ChatMember object of `user` in `chat`, by its status there."""
    status = chat.members.get(user.id, "left")
    data: Json = {"user": user.payload(), "status": status}
    if status == "creator":
        data["is_anonymous"] = False
    elif status == "administrator":
        data |= dict.fromkeys(_ADMIN_RIGHTS, True) | dict.fromkeys(_NO_ADMIN_RIGHTS, False)
    elif status == "kicked":
        data["until_date"] = 0
    elif status != "member":
        data["status"] = "left"
    return data
