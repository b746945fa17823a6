"""`adapters.discord.from_payload` as a pure function: a raw MESSAGE_CREATE
payload (shaped as FakeDiscord builds them) in, a gateway Message or a
PayloadError naming the field out. The end-to-end oddities are in
test_adapter_oddities.py."""

from __future__ import annotations

from typing import Any

import pytest

from adapters.discord import WRITTEN_TYPES, PayloadError, from_payload
from gateway.model import Author, ChatKind, ChatRef, Message

MSG = "1300000000000000123"
CHANNEL = "1200000000000000042"
GUILD = "1100000000000000007"
ALICE = "1000000000000000001"
BOT = "1000000000000000099"
CAROL = "1000000000000000003"


DROP: Any = object()  # a `payload` change that leaves the key out


def payload(**changes: Any) -> dict[str, Any]:
    """A guild message from Alice as Discord sends it, with `changes` (DROP: no such key)."""
    data: dict[str, Any] = {
        "id": MSG, "channel_id": CHANNEL, "guild_id": GUILD,
        "author": {"id": ALICE, "username": "alice", "discriminator": "0",
                   "global_name": "Alice A.", "avatar": None, "public_flags": 0},
        "member": {"roles": [], "nick": None, "joined_at": "2024-01-01T00:00:00+00:00"},
        "content": "hello", "timestamp": "2024-05-01T12:00:00.000000+00:00",
        "edited_timestamp": None, "tts": False, "mention_everyone": False, "mentions": [],
        "mention_roles": [], "attachments": [], "embeds": [], "pinned": False, "type": 0,
        "flags": 0, "components": [],
    }  # fmt: skip
    data.update(changes)
    return {k: v for k, v in data.items() if v is not DROP}


def user(uid: Any, **more: Any) -> dict[str, Any]:
    return {"id": uid, "username": "u", "discriminator": "0", "global_name": None, **more}


def test_a_guild_message_in_full() -> None:
    assert from_payload(payload()) == Message(
        id=MSG,
        chat=ChatRef("discord", CHANNEL, kind=ChatKind.GROUP),
        author=Author(ALICE, "Alice A.", False),
        text="hello",
        mentions=(),
        reply_to=None,
        system=False,
    )


@pytest.mark.parametrize(
    ("guild", "member", "kind"),
    [
        (GUILD, DROP, ChatKind.GROUP),  # a webhook's message has no member
        (DROP, DROP, ChatKind.DM),
        (None, DROP, ChatKind.DM),
        (None, {"nick": "Ali"}, ChatKind.DM),
    ],
)
def test_the_guild_makes_a_group_and_none_a_dm(guild: Any, member: Any, kind: ChatKind) -> None:
    got = from_payload(payload(guild_id=guild, member=member)).chat
    assert got == ChatRef("discord", CHANNEL, kind=kind)


@pytest.mark.parametrize(
    ("nick", "global_name", "username", "want"),
    [
        ("Ali", "Alice A.", "alice", "Ali"),
        (None, "Alice A.", "alice", "Alice A."),
        ("", "Alice A.", "alice", "Alice A."),
        (None, None, "alice", "alice"),
        (None, None, None, ALICE),
        (None, "bad \ud800 name", "alice", "bad \ufffd name"),
    ],
)
def test_display_name_precedence(
    nick: str | None, global_name: str | None, username: str | None, want: str
) -> None:
    data = payload(author={"id": ALICE, "global_name": global_name, "username": username})
    data["member"]["nick"] = nick  # a fresh dict per payload()
    assert from_payload(data).author.name == want


def test_a_member_that_is_not_an_object_is_left_unread() -> None:
    assert from_payload(payload(member=["Ali"])).author.name == "Alice A."


BOT_FLAGS = {"true": ({"bot": True}, True), "absent": ({}, False), "false": ({"bot": False}, False),
             "text": ({"bot": "true"}, False), "one": ({"bot": 1}, False)}  # fmt: skip


@pytest.mark.parametrize(("flag", "want"), BOT_FLAGS.values(), ids=BOT_FLAGS)
def test_author_bot_flag(flag: dict[str, object], want: bool) -> None:
    assert from_payload(payload(author=user(BOT, **flag))).author.is_bot is want


def test_mentions_keep_readable_ids_in_order() -> None:
    mentions = [user(CAROL), "1000000000000000004", user(BOT), {"username": "no id"}, None,
                user("alice"), user(5), user(-1), user(True), user(ALICE)]  # fmt: skip
    assert from_payload(payload(mentions=mentions)).mentions == (CAROL, BOT, "5", ALICE)


@pytest.mark.parametrize("mentions", [{"0": user(CAROL)}, CAROL, 7, None, DROP])
def test_mentions_not_a_list_are_none(mentions: object) -> None:
    assert from_payload(payload(mentions=mentions)).mentions == ()


@pytest.mark.parametrize(
    ("referenced", "want"),
    [
        ({"id": "1300000000000000100", "author": user(BOT, bot=True), "type": 0}, BOT),
        ({"id": "1300000000000000100", "author": user(int(CAROL))}, CAROL),
        ({"id": "1300000000000000100", "content": "?"}, None),
        ({"id": "1300000000000000100", "author": None}, None),
        ({"id": "1300000000000000100", "author": [BOT]}, None),
        ({"id": "1300000000000000100", "author": user("bob")}, None),
        ({"id": "1300000000000000100", "author": {"username": "x"}}, None),
        ("1300000000000000100", None),
        (None, None),  # a deleted message
        (DROP, None),
    ],
)
def test_reply_to(referenced: object, want: str | None) -> None:
    assert from_payload(payload(type=19, referenced_message=referenced)).reply_to == want


def test_written_types_are_the_documented_ones() -> None:
    assert frozenset({0, 19, 20, 21, 23, 46}) == WRITTEN_TYPES


SYSTEM = {0: False, 19: False, 20: False, 21: False, 23: False, 46: False,
          6: True, 7: True, 1: True, 18: True, 9999: True, -1: True}  # fmt: skip


@pytest.mark.parametrize(("kind", "system"), SYSTEM.items())
def test_system_types(kind: int, system: bool) -> None:
    assert from_payload(payload(type=kind)).system is system


CONTENTS = {None: "", "": "", "  ": "  ", "a \u202e\x00 \u200b": "a \u202e\x00 \u200b", "😀": "😀",
            "broken \ud800 half \udfff": "broken \ufffd half \ufffd"}  # fmt: skip


@pytest.mark.parametrize(("content", "text"), CONTENTS.items())
def test_content(content: str | None, text: str) -> None:
    assert from_payload(payload(content=content)).text == text


def test_int_ids_become_decimal_strings() -> None:
    got = from_payload(payload(id=int(MSG), channel_id=0, author=user(int(ALICE))))
    assert (got.id, got.chat.id, got.author.id) == (MSG, "0", ALICE)
    assert got.author.name == "u"


BAD_IDS: list[object] = [-1, True, False, "12a", "", "１２", " 12", "-12", "1.5", 1.0, None, [1]]


@pytest.mark.parametrize("field", ["id", "channel_id", "author id"])
@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
def test_unreadable_ids_are_refused_by_name(field: str, bad: object) -> None:
    data = payload()
    if field == "author id":
        data["author"]["id"] = bad
    else:
        data[field] = bad
    with pytest.raises(PayloadError, match=f"^{field} .* is not a Discord id$"):
        from_payload(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "^the payload is list, not an object$"),
        (None, "^the payload is NoneType, not an object$"),
        ('{"id": "1"}', "^the payload is str, not an object$"),
        (payload(author=DROP), "^no author$"),
        (payload(author=[ALICE]), "^no author$"),
        (payload(author=ALICE), "^no author$"),
        (payload(author=None), "^no author$"),
        (payload(id=DROP), "^id None is not a Discord id$"),
        (payload(channel_id=DROP), "^channel_id None is not a Discord id$"),
        (payload(author={"username": "nobody"}), "^author id None is not a Discord id$"),
        (payload(type=DROP), "^type None is not a message type$"),
        (payload(type="0"), "^type '0' is not a message type$"),
        (payload(type=0.0), "^type 0.0 is not a message type$"),
        (payload(type=True), "^type True is not a message type$"),
        (payload(type=False), "^type False is not a message type$"),
        (payload(content=DROP), "^no content$"),
        (payload(content=b"hi"), "^content is bytes, not text$"),
        (payload(content=["hi"]), "^content is list, not text$"),
        (payload(content=0), "^content is int, not text$"),
    ],
)
def test_refusals_name_the_field(data: object, message: str) -> None:
    with pytest.raises(PayloadError, match=message):
        from_payload(data)
