"""`adapters.matrix`'s pure functions: `from_event`, `names_bot`,
`admin_command`, `allowed_inviter`, `reply_target`, over room events shaped
as Synapse's /sync timeline gives them (no room_id: the room is the key the
timeline sits under), odd ones included. No homeserver: the end-to-end side
is tests/test_matrix.py."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.matrix import (
    PayloadError,
    admin_command,
    allowed_inviter,
    from_event,
    names_bot,
    reply_fallback,
    reply_target,
)
from gateway.model import Author, ChatKind, ChatRef, Message

ROOM = "!kq7H67hV60YSxMe6pYwRhr6CG6Qyn3IUklXiM38Sv4Y"
ALICE, ALPHA, BOB = "@alice:example.org", "@alpha:example.org", "@bob:example.org"
EVENT = "$8rUo_m-CnE69UIgU002yeUMhirpe9iyrj4EnObuoJ-8"
ROOT = "$FARdcz8MmgQUqfva1BK9m4coMnjixEEBtAWV_8BA0Nc"
EARLIER = "$3LPtSWkw2fOMyoT71HxSMce9HwWvQRglB23AFZnN4YM"

DROP: Any = object()  # an `event` change that leaves the key out


def event(content: Any = DROP, **changes: Any) -> dict[str, Any]:
    """Alice's m.text "hello" as /sync gives it, with `changes` (DROP: no such key)."""
    data: dict[str, Any] = {
        "type": "m.room.message",
        "sender": ALICE,
        "event_id": EVENT,
        "origin_server_ts": 1795713606444,
        "unsigned": {"age": 1144},
        "content": {"msgtype": "m.text", "body": "hello"} if content is DROP else content,
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v is not DROP}


def state(kind: str, content: Any, key: str = "", sender: str = ALICE) -> dict[str, Any]:
    return event(content, type=kind, state_key=key, sender=sender)


def read(e: Any, dm: bool = False) -> Message:
    msg = from_event(ROOM, e, dm=dm)
    assert msg is not None
    return msg


def thread(root: Any, reply_to: str = ROOT, falling_back: bool = True) -> dict[str, Any]:
    return {
        "rel_type": "m.thread",
        "event_id": root,
        "is_falling_back": falling_back,
        "m.in_reply_to": {"event_id": reply_to},
    }


# -- from_event: people, bots, chats ---------------------------------------------------


def test_a_persons_message_in_a_room() -> None:
    content = {"msgtype": "m.text", "body": "alpha: hi", "m.mentions": {"user_ids": [ALPHA]}}
    assert read(event(content)) == Message(
        id=EVENT,
        chat=ChatRef("matrix", ROOM, None, ChatKind.GROUP),
        author=Author(ALICE, "", False),
        text="alpha: hi",
        mentions=(ALPHA,),
        reply_to=None,
        system=False,
    )


@pytest.mark.parametrize("msgtype", ["m.text", "m.emote", "m.image", "m.file", None, 7])
def test_only_a_notice_is_a_bots(msgtype: Any) -> None:
    content = {"msgtype": msgtype, "body": "x"}
    assert read(event(content)).author.is_bot is False
    assert read(event({"msgtype": "m.notice", "body": "x"})).author.is_bot is True


def test_a_dm_is_what_the_adapter_says() -> None:
    assert read(event(), dm=True).chat == ChatRef("matrix", ROOM, None, ChatKind.DM)
    assert read(event(), dm=True).chat.key == f"matrix:{ROOM}"


def test_a_thread_is_its_own_chat() -> None:
    content = {"msgtype": "m.text", "body": "in here", "m.relates_to": thread(ROOT)}
    msg = read(event(content))
    assert msg.chat == ChatRef("matrix", ROOM, ROOT, ChatKind.GROUP)
    assert msg.chat.key == f"matrix:{ROOM}:{ROOT}"
    assert read(event(content), dm=True).chat.kind is ChatKind.DM  # a thread in a DM


@pytest.mark.parametrize(
    "rel",
    [
        {"rel_type": "m.thread", "event_id": 7},
        {"rel_type": "m.thread"},
        {"rel_type": "m.annotation", "event_id": ROOT, "key": "👍"},
        {"m.in_reply_to": {"event_id": ROOT}},  # a plain reply
        "m.thread",
        None,
    ],
)
def test_anything_but_a_readable_thread_relation_is_the_room(rel: Any) -> None:
    msg = read(event({"msgtype": "m.text", "body": "x", "m.relates_to": rel}))
    assert msg.chat == ChatRef("matrix", ROOM)


def test_the_replied_to_author_is_not_in_the_event() -> None:
    content = {
        "msgtype": "m.text",
        "body": "yes",
        "m.relates_to": {"m.in_reply_to": {"event_id": EARLIER}},
    }
    assert read(event(content)).reply_to is None  # the adapter fills it for its own events


@pytest.mark.parametrize(
    ("mentions", "expected"),
    [
        ({"user_ids": [ALPHA, BOB]}, (ALPHA, BOB)),
        ({"user_ids": [ALPHA, 7, None, {"id": BOB}]}, (ALPHA,)),
        ({"user_ids": ALPHA}, ()),  # a string is no list of ids
        ({"room": True}, ()),  # @room names nobody in particular
        ({}, ()),
        ([ALPHA], ()),
        (None, ()),
    ],
)
def test_mentions_are_the_listed_user_ids(mentions: Any, expected: tuple[str, ...]) -> None:
    content = {"msgtype": "m.text", "body": "x", "m.mentions": mentions}
    assert read(event(content)).mentions == expected


# -- from_event: what is no turn, and system messages ----------------------------------


@pytest.mark.parametrize(
    ("kind", "content", "key"),
    [
        ("m.room.member", {"membership": "join", "displayname": "Ada"}, "@ada:example.org"),
        ("m.room.member", {"membership": "leave"}, "@ada:example.org"),
        ("m.room.member", {"membership": "invite"}, ALPHA),
        ("m.room.name", {"name": "bots"}, ""),
        ("m.room.topic", {"topic": "no loops"}, ""),
        ("m.room.power_levels", {"users": {ALICE: 100}, "users_default": 0}, ""),
        ("m.room.encryption", {"algorithm": "m.megolm.v1.aes-sha2"}, ""),
        ("m.room.message", {"msgtype": "m.text", "body": "a state message"}, ""),  # odd, still
        ("m.room.topic", "not an object", ""),
    ],
)
def test_state_events_are_system_messages(kind: str, content: Any, key: str) -> None:
    msg = read(state(kind, content, key))
    assert msg.system and msg.text == "" and msg.mentions == ()
    assert (msg.id, msg.chat, msg.author) == (EVENT, ChatRef("matrix", ROOM), Author(ALICE))
    assert not msg.is_plain_human


@pytest.mark.parametrize(
    "e",
    [
        event(
            {
                "msgtype": "m.text",
                "body": "* hello, edited",
                "m.new_content": {"msgtype": "m.text", "body": "hello, edited"},
                "m.relates_to": {"rel_type": "m.replace", "event_id": EARLIER},
            }
        ),
        event(
            {
                "msgtype": "m.notice",
                "body": "* edited",
                "m.relates_to": {"rel_type": "m.replace", "event_id": EARLIER},
            }
        ),  # a bot's edit
        event({"redacts": EARLIER}, type="m.room.redaction", redacts=EARLIER),
        event(
            {"m.relates_to": {"rel_type": "m.annotation", "event_id": EARLIER, "key": "👍"}},
            type="m.reaction",
        ),
        event(
            {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "AwgAEnB4om"},
            type="m.room.encrypted",
        ),
        event({"body": "x"}, type="m.sticker"),
        event({}, type="org.example.custom"),
    ],
)
def test_edits_redactions_reactions_and_other_types_are_no_turn(e: dict[str, Any]) -> None:
    assert from_event(ROOM, e, dm=False) is None


def test_a_redacted_message_has_empty_content_and_is_no_plain_message() -> None:
    msg = read(event({}, unsigned={"redacted_because": {"type": "m.room.redaction"}}))
    assert (msg.text, msg.system, msg.is_plain_human) == ("", False, False)


@pytest.mark.parametrize("content", [None, "hello", ["hello"], 7])
def test_content_that_is_no_object_is_empty(content: Any) -> None:
    msg = read(event(content))
    assert (msg.text, msg.mentions, msg.author.is_bot) == ("", (), False)
    assert not msg.is_plain_human  # nothing said: no reset


def test_no_body_is_empty_text_and_a_lone_surrogate_is_replaced() -> None:
    assert read(event({"msgtype": "m.text"})).text == ""
    assert read(event({"msgtype": "m.text", "body": "a\ud800b"})).text == "a\ufffdb"


@pytest.mark.parametrize(
    ("body", "kind"),
    [(7, "int"), (["x"], "list"), ({"x": 1}, "dict"), (True, "bool"), (1.5, "float")],
)
def test_a_body_that_is_not_text_is_a_payload_error(body: Any, kind: str) -> None:
    with pytest.raises(PayloadError, match=f"^body is {kind}, not text$"):
        from_event(ROOM, event({"msgtype": "m.text", "body": body}), dm=False)


@pytest.mark.parametrize("field", ["event_id", "sender", "type"])
def test_a_missing_id_sender_or_type_is_a_payload_error_naming_it(field: str) -> None:
    with pytest.raises(PayloadError, match=f"^no {field}$"):
        from_event(ROOM, event(**{field: DROP}), dm=False)
    with pytest.raises(PayloadError, match=f"^no {field}$"):
        from_event(ROOM, event(**{field: None}), dm=False)


@pytest.mark.parametrize("field", ["event_id", "sender", "type"])
@pytest.mark.parametrize("value", [7, "", ["$x"], {"id": "$x"}])
def test_an_unreadable_id_sender_or_type_is_a_payload_error_naming_it(
    field: str, value: Any
) -> None:
    with pytest.raises(PayloadError, match=f"^{field} .* is not text$"):
        from_event(ROOM, event(**{field: value}), dm=False)


@pytest.mark.parametrize("e", [None, "event", [event()], 7])
def test_an_event_that_is_no_object_is_a_payload_error(e: Any) -> None:
    with pytest.raises(PayloadError, match="not an object"):
        from_event(ROOM, e, dm=False)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
KEYS = st.sampled_from(
    [
        "type",
        "sender",
        "event_id",
        "content",
        "state_key",
        "m.relates_to",
        "m.mentions",
        "body",
        "msgtype",
        "rel_type",
        "user_ids",
    ]
)


@given(st.dictionaries(KEYS, JSON | st.dictionaries(KEYS, JSON, max_size=4), max_size=6))
def test_any_json_is_a_message_none_or_a_payload_error(e: dict[str, Any]) -> None:
    try:
        msg = from_event(ROOM, e, dm=False)
    except PayloadError:
        return
    assert msg is None or isinstance(msg, Message)


# -- names_bot ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (f"{ALPHA}: hi", True),
        ("@ALPHA:EXAMPLE.ORG hi", True),  # user ids are matched without case
        ("hi alpha", True),
        ("Alpha, hi", True),
        ("ALPHA!", True),
        ("(alpha)", True),
        ("alpha-bot, hi", True),  # "-" is no word character
        ("alphabet soup", False),
        ("betalpha", False),
        ("alpha_2", False),
        ("@alpha:example.com", True),  # another server's alpha: the display name is named
        ("", False),
    ],
)
def test_names_bot_by_user_id_or_display_name_as_a_word(text: str, named: bool) -> None:
    assert names_bot(text, ALPHA, "Alpha") is named


def test_names_bot_without_a_display_name_only_by_user_id() -> None:
    assert names_bot("alpha, hi", ALPHA, "") is False
    assert names_bot("alpha, hi", ALPHA, "   ") is False
    assert names_bot(f"hi {ALPHA}", ALPHA, "") is True


def test_a_display_name_is_text_not_a_pattern() -> None:
    name = "A.I. (helper)+"
    assert names_bot("ask a.i. (helper)+ now", ALPHA, name) is True
    assert names_bot("ask aXIX (helper)+ now", ALPHA, name) is False
    assert names_bot("ask a.i. helper now", ALPHA, name) is False
    assert names_bot("hi Straße bot", ALPHA, "STRASSE BOT") is True  # casefolded
    assert names_bot("hi Ölbot!", ALPHA, "ölbot") is True
    assert names_bot("hi Ölbots", ALPHA, "ölbot") is False


# -- admin_command -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "command"),
    [
        ("!bouncer status", "status"),
        ("!bouncer", "status"),
        ("  !bouncer  ", "status"),
        ("!BOUNCER reset", "reset"),
        ("!bouncer why 3", "why 3"),
        ("!bouncer   limits soft=5 hard=7  ", "limits soft=5 hard=7"),
        ("!bouncer\nreset", "reset"),
        ("!bouncer\tpause", "pause"),
        ("!bouncer bogus", "bogus"),  # Admin.run says what is wrong with it
        ("!bouncerx status", None),
        ("! bouncer status", None),
        ("please !bouncer reset", None),
        ("bouncer reset", None),
        ("/bouncer reset", None),
        ("", None),
        ("   ", None),
    ],
)
def test_admin_command(text: str, command: str | None) -> None:
    assert admin_command(text) == command


# -- allowed_inviter ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inviter", "allowed", "ok"),
    [
        (ALICE, (ALICE,), True),
        (ALICE, ("example.org",), True),
        (ALICE, (BOB,), False),  # a user id allows that user, not the server
        (ALICE, ("@alice:example.com",), False),
        (ALICE, ("example.com", "@bob:example.org"), False),
        (ALICE, ("org",), False),
        (ALICE, ("ample.org",), False),
        ("@alice:example.org.evil", ("example.org",), False),
        ("@alice:evil-example.org", ("example.org",), False),
        ("@alice:localhost:8448", ("localhost:8448",), True),
        ("@alice:localhost:8448", ("localhost",), False),
        ("@alice:[::1]:8448", ("[::1]:8448",), True),
        (ALICE, ("EXAMPLE.ORG",), False),  # server names are compared as they are
        (ALICE, (), False),
        ("@alice", ("localhost", "@alice"), True),  # listed as it is
        ("@alice", ("localhost",), False),  # no server at all
        ("", ("example.org",), False),
    ],
)
def test_allowed_inviter(inviter: str, allowed: tuple[str, ...], ok: bool) -> None:
    assert allowed_inviter(inviter, allowed) is ok


# -- reply_target ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rel", "target"),
    [
        ({"m.in_reply_to": {"event_id": EARLIER}}, EARLIER),
        (thread(ROOT, reply_to=EARLIER), EARLIER),  # a thread's fallback reply counts
        (thread(ROOT, reply_to=EARLIER, falling_back=False), EARLIER),
        ({"rel_type": "m.thread", "event_id": ROOT}, None),
        ({"rel_type": "m.replace", "event_id": EARLIER}, None),
        ({"m.in_reply_to": {"event_id": ""}}, None),
        ({"m.in_reply_to": {"event_id": 7}}, None),
        ({"m.in_reply_to": {}}, None),
        ({"m.in_reply_to": EARLIER}, None),
        ({"m.in_reply_to": [EARLIER]}, None),
        ("m.in_reply_to", None),
        (None, None),
    ],
)
def test_reply_target(rel: Any, target: str | None) -> None:
    assert reply_target({"msgtype": "m.text", "body": "x", "m.relates_to": rel}) == target
    assert reply_target({"msgtype": "m.text", "body": "x"}) is None


REPLY = {"m.in_reply_to": {"event_id": EARLIER}}


@pytest.mark.parametrize(
    ("body", "rel", "quoted", "text"),
    [
        (f"> <{BOB}> Alpha, hi\n\nnice weather", REPLY, BOB, "nice weather"),
        (f"> <{BOB}> one\n> two\n>\n> three\n\nso?\n\nand", REPLY, BOB, "so?\n\nand"),
        (f"> * <{ALPHA}> waves\n\nhi", REPLY, ALPHA, "hi"),
        (f"> <{BOB}> only a quote", REPLY, BOB, ""),
        (f"> <{BOB}> hi\nno blank line", REPLY, BOB, "no blank line"),
        # a quote that is no fallback, or no reply: the body as it is
        ("> a quote\n\nmy answer", REPLY, None, "> a quote\n\nmy answer"),
        (f"> <{BOB}> hi\n\nthere", None, None, f"> <{BOB}> hi\n\nthere"),
        (f"> <{BOB}> hi\n\nthere", {"m.in_reply_to": {}}, None, f"> <{BOB}> hi\n\nthere"),
        (f"x\n> <{BOB}> hi", REPLY, None, f"x\n> <{BOB}> hi"),
    ],
)
def test_reply_fallback(body: str, rel: Any, quoted: str | None, text: str) -> None:
    content = {"msgtype": "m.text", "body": body, "m.relates_to": rel}
    assert reply_fallback(content, body) == (quoted, text)
    assert read(event(content)).text == text


def test_a_reply_fallback_naming_the_bot_is_not_the_message() -> None:
    body = f"> <{BOB}> Alpha, are you there?\n\nit is raining"
    msg = read(event({"msgtype": "m.text", "body": body, "m.relates_to": REPLY}))
    assert msg.text == "it is raining"
    assert not names_bot(msg.text, ALPHA, "Alpha")
