"""`adapters.slack.from_event`, `escape` and `Threads` as pure functions: Slack
message events as the Events API and Socket Mode deliver them (the `event` of
an event_callback) in, a gateway Message, None (not a new message) or a
PayloadError naming the field out. No daemon, no fake: the end-to-end side is
tests/test_slack.py. (And one check of the adapter's Web API client.)"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters import slack
from adapters.slack import PayloadError, Threads, escape, from_event, web_client
from gateway.model import Author, ChatKind, ChatRef, Message

CHANNEL, PRIVATE, MPIM, DM = "C0GENERAL", "G0PRIVATE", "G0MPIM", "D0ALICE"
ALICE, BOB, ALPHA, BETA = "U0ALICE", "U0BOB", "U0ALPHA", "U0BETA"
TS, PARENT = "1700000100.000200", "1700000000.000100"

DROP: Any = object()  # an `event` change that leaves the key out


def event(**changes: Any) -> dict[str, Any]:
    """Alice's message in #general as Slack sends it, with `changes` (DROP: no such key)."""
    data: dict[str, Any] = {
        "type": "message", "user": ALICE, "text": "hello", "ts": TS, "team": "T0FAKE",
        "client_msg_id": "5f1c3c39-6d4e-4a43-9a55-3f7cf39bb5a2",
        "blocks": [{"type": "rich_text", "block_id": "x1", "elements": []}],
        "channel": CHANNEL, "event_ts": TS, "channel_type": "channel",
    }  # fmt: skip
    data.update(changes)
    return {k: v for k, v in data.items() if v is not DROP}


def bot_profile(bot_id: str = "B0BETA", name: str = "beta") -> dict[str, Any]:
    return {"id": bot_id, "app_id": "A0BETA", "name": name, "deleted": False,
            "updated": 1700000000, "team_id": "T0FAKE",
            "icons": {"image_48": "https://a.slack-edge.com/x_48.png"}}  # fmt: skip


def read(e: Any) -> Message:
    msg = from_event(e)
    assert msg is not None
    return msg


# -- people, bots, chats -----------------------------------------------------------------


def test_a_persons_message_in_a_channel() -> None:
    assert read(event(text=f"<@{ALPHA}> hi")) == Message(
        id=TS,
        chat=ChatRef("slack", CHANNEL, None, ChatKind.GROUP),
        author=Author(ALICE, "", False),
        text=f"<@{ALPHA}> hi",
        mentions=(ALPHA,),
        reply_to=None,
        system=False,
    )


def test_an_apps_post_is_a_bot_under_its_bot_user() -> None:
    """What chat.postMessage with a bot token makes: user, bot_id, app_id and
    bot_profile; the author is the bot user (what `<@...>` mentions)."""
    msg = read(event(user=BETA, bot_id="B0BETA", app_id="A0BETA", bot_profile=bot_profile(),
                     client_msg_id=DROP))  # fmt: skip
    assert msg.author == Author(BETA, "beta", True)
    assert msg.system is False


def test_a_workflow_or_legacy_integration_is_a_bot_under_its_bot_id() -> None:
    """subtype bot_message: no user, a bot_id and a username (and no bot_profile)."""
    legacy = event(subtype="bot_message", user=DROP, bot_id="B0WORKFLOW",
                   username="Standup workflow", icons={"emoji": ":robot_face:"},
                   client_msg_id=DROP)  # fmt: skip
    msg = read(legacy)
    assert msg.author == Author("B0WORKFLOW", "Standup workflow", True)
    assert (msg.system, msg.chat.key) == (False, f"slack:{CHANNEL}")
    # a bot_message with only a profile name, or naming a user it posts for: still a bot
    profiled = event(subtype="bot_message", user=DROP, bot_id="B0WORKFLOW",
                     bot_profile=bot_profile("B0WORKFLOW", "wf"), client_msg_id=DROP)  # fmt: skip
    assert read(profiled).author == Author("B0WORKFLOW", "wf", True)
    assert read({**legacy, "user": BOB}).author == Author(BOB, "Standup workflow", True)


@pytest.mark.parametrize(
    "changes",
    [
        {"bot_id": "B0BETA"},  # a bot_id alone
        {"bot_profile": bot_profile()},  # a profile alone
        {"subtype": "bot_message"},  # the subtype alone
    ],
)
def test_any_sign_of_a_bot_makes_a_bot(changes: dict[str, Any]) -> None:
    assert read(event(**changes)).author.is_bot is True


@pytest.mark.parametrize(
    ("channel", "channel_type", "kind"),
    [
        (CHANNEL, "channel", ChatKind.GROUP),
        (PRIVATE, "group", ChatKind.GROUP),  # a private channel
        (MPIM, "mpim", ChatKind.GROUP),  # a group DM: several people, a group
        (DM, "im", ChatKind.DM),
    ],
)
def test_the_kind_of_chat_comes_from_channel_type(
    channel: str, channel_type: Any, kind: ChatKind
) -> None:
    msg = read(event(channel=channel, channel_type=channel_type))
    assert msg.chat == ChatRef("slack", channel, None, kind)


# -- threads -----------------------------------------------------------------------------


def test_a_reply_in_a_thread_is_its_own_chat_and_answers_the_threads_starter() -> None:
    msg = read(event(thread_ts=PARENT, parent_user_id=ALPHA))
    assert msg.chat == ChatRef("slack", CHANNEL, PARENT, ChatKind.GROUP)
    assert msg.chat.key == f"slack:{CHANNEL}:{PARENT}"
    assert msg.reply_to == ALPHA


def test_a_thread_parent_is_a_message_of_the_channel() -> None:
    """A parent carries thread_ts == ts once it has replies (and reply_count)."""
    parent = read(event(ts=PARENT, event_ts=PARENT, thread_ts=PARENT, reply_count=2,
                        reply_users=[BOB], latest_reply=TS))  # fmt: skip
    assert (parent.chat.topic, parent.chat.key) == (None, f"slack:{CHANNEL}")
    # a parent_user_id at top level (odd) answers nobody
    assert read(event(parent_user_id=ALPHA)).reply_to is None


@pytest.mark.parametrize("thread_ts", ["", None, 1700000000.0001, ["x"]])
def test_an_unreadable_thread_ts_is_the_channel(thread_ts: Any) -> None:
    msg = read(event(thread_ts=thread_ts, parent_user_id=ALPHA))
    assert (msg.chat.topic, msg.reply_to) == (None, None)


def test_a_thread_broadcast_is_written_in_the_thread() -> None:
    """A reply also sent to the channel: a person's words, kept in the thread."""
    root = {"type": "message", "user": ALPHA, "text": "root", "ts": PARENT, "thread_ts": PARENT}
    msg = read(event(subtype="thread_broadcast", thread_ts=PARENT, root=root,
                     parent_user_id=DROP))  # fmt: skip
    assert (msg.system, msg.chat.topic, msg.author.is_bot) == (False, PARENT, False)
    assert msg.is_plain_human  # it resets, as any person's message


def test_a_non_string_parent_user_id_answers_nobody() -> None:
    assert read(event(thread_ts=PARENT, parent_user_id=5)).reply_to is None
    assert read(event(thread_ts=PARENT, parent_user_id="")).reply_to is None


# -- subtypes ------------------------------------------------------------------------------


def test_file_shares_and_me_messages_are_written() -> None:
    share = event(subtype="file_share", text="", upload=False, display_as_bot=False,
                  files=[{"id": "F0PIC", "name": "loop.png", "mimetype": "image/png"}])  # fmt: skip
    msg = read(share)
    assert (msg.system, msg.text, msg.author.is_bot) == (False, "", False)
    assert not msg.is_plain_human  # a file alone neither counts nor resets
    assert read({**share, "text": "look at this"}).is_plain_human
    me = read(event(subtype="me_message", text="waves"))
    assert (me.system, me.is_plain_human) == (False, True)


@pytest.mark.parametrize(
    ("subtype", "extra"),
    [
        ("channel_join", {"text": f"<@{BOB}> has joined the channel", "inviter": ALICE}),
        ("channel_leave", {"text": f"<@{BOB}> has left the channel"}),
        ("channel_topic", {"text": "set the channel topic: loops", "topic": "loops"}),
        ("channel_purpose", {"text": "set the channel purpose: talk", "purpose": "talk"}),
        ("channel_name", {"text": "renamed the channel", "old_name": "a", "name": "b"}),
        ("pinned_item", {"text": "pinned a message", "item_type": "C", "item": {}}),
        ("channel_archive", {"text": "archived the channel"}),
        ("bot_add", {"text": "added an integration", "bot_id": "B0NEW"}),
        ("some_future_subtype", {"text": "whatever Slack adds next"}),
    ],
)
def test_messages_slack_makes_are_system_messages(subtype: str, extra: dict[str, Any]) -> None:
    msg = read(event(subtype=subtype, client_msg_id=DROP, **extra))
    assert msg.system is True
    assert not msg.is_plain_human


@pytest.mark.parametrize(
    "e",
    [
        event(subtype="message_changed", hidden=True, user=DROP, text=DROP,
              message={"type": "message", "user": ALICE, "text": "hello, edited", "ts": PARENT,
                       "edited": {"user": ALICE, "ts": TS}},
              previous_message={"type": "message", "user": ALICE, "text": "hello",
                                "ts": PARENT}),
        event(subtype="message_deleted", hidden=True, user=DROP, text=DROP,
              deleted_ts=PARENT, previous_message={"type": "message", "user": ALICE,
                                                   "text": "hello", "ts": PARENT}),
        event(subtype="message_replied", hidden=True, user=DROP, text=DROP,
              message={"type": "message", "user": ALICE, "text": "parent", "ts": PARENT,
                       "thread_ts": PARENT, "reply_count": 1}),
        # not marked hidden: still no new message
        event(subtype="message_changed", user=DROP, message={"text": "x"}),
        event(subtype="message_deleted", user=DROP, channel=DROP, deleted_ts=PARENT),
        # a hidden event of any other subtype
        event(subtype="channel_unarchive", hidden=True),
        event(hidden=True),
    ],
    ids=["changed", "deleted", "replied", "changed-not-hidden", "deleted-no-channel",
         "hidden-subtype", "hidden"],
)  # fmt: skip
def test_edits_deletions_and_hidden_events_are_no_new_messages(e: dict[str, Any]) -> None:
    assert from_event(e) is None


# -- text and mentions ------------------------------------------------------------------


def test_mentions_are_user_ids_in_the_text() -> None:
    text = f"<@{ALPHA}> and <@W0ENTERPRISE|ent> and <@{ALPHA}>, not <!here> <#C0X|x> <@b0t> @{BETA}"
    assert read(event(text=text)).mentions == (ALPHA, "W0ENTERPRISE", ALPHA)


def test_an_unclosed_mention_ends_at_the_next_one() -> None:
    """A mention's label (`<@U1|name>`) never holds `<` (Slack escapes it).
    Read up to the next `>` instead, an unclosed `<@U1|` swallowed the real
    mention after it, and 8,000 of them (another app may post them: Slack
    keeps 40,000 characters) took the event loop 5 s, each one read to the
    end of the text."""
    assert read(event(text=f"<@U1| hi <@{ALPHA}>")).mentions == (ALPHA,)
    assert read(event(text="<@U1|" * 8000 + f"<@{ALPHA}>")).mentions == (ALPHA,)


@pytest.mark.parametrize(
    ("text", "seen"),
    [(None, ""), (DROP, ""), ("", ""), ("a\ud800b", "a\ufffdb"), ("ok ✓", "ok ✓")],
)
def test_text_is_cleaned(text: Any, seen: str) -> None:
    assert read(event(text=text)).text == seen


def test_an_author_name_that_is_not_text_is_no_name() -> None:
    odd = read(event(user=DROP, bot_id="B0X", username=5, bot_profile={"name": ["x"]}))
    assert odd.author == Author("B0X", "", True)


# -- what cannot be read -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"channel": DROP}, "no channel"),
        ({"channel": None}, "no channel"),
        ({"channel": ""}, "channel '' is not text"),
        ({"channel": 42}, "channel 42 is not text"),
        ({"ts": DROP}, "no ts"),
        ({"ts": 1700000100.0002}, "ts 1700000100.0002 is not text"),
        ({"ts": ""}, "ts '' is not text"),
        ({"user": DROP}, "no user or bot_id"),
        ({"user": ""}, "no user or bot_id"),
        ({"user": {"id": ALICE}}, "no user or bot_id"),
        ({"user": DROP, "bot_id": ""}, "no user or bot_id"),
        ({"user": DROP, "subtype": "bot_message", "username": "wf"}, "no user or bot_id"),
        ({"text": ["hello"]}, "text is list, not text"),
        ({"text": 5}, "text is int, not text"),
        ({"text": {"t": 1}}, "text is dict, not text"),
    ],
)
def test_a_missing_or_unreadable_field_is_named(changes: dict[str, Any], problem: str) -> None:
    with pytest.raises(PayloadError) as err:
        from_event(event(**changes))
    assert str(err.value) == problem


@pytest.mark.parametrize(("e", "kind"), [([], "list"), (None, "NoneType"), ("message", "str")])
def test_an_event_that_is_not_an_object_is_refused(e: Any, kind: str) -> None:
    with pytest.raises(PayloadError, match=f"the event is {kind}, not an object"):
        from_event(e)


# -- escape ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("<!channel> look", "&lt;!channel> look"),
        ("<!here>", "&lt;!here>"),
        ("<!here|here>", "&lt;!here|here>"),
        ("<!everyone>", "&lt;!everyone>"),
        ("<!subteam^S0DEVS|@devs> please", "&lt;!subteam^S0DEVS|@devs> please"),
        ("<!subteam^S0DEVS>", "&lt;!subteam^S0DEVS>"),
        ("<!channel><!here>", "&lt;!channel>&lt;!here>"),
        (f"ask <@{ALICE}> in <#{CHANNEL}|general>", f"ask <@{ALICE}> in <#{CHANNEL}|general>"),
        ("plain text, a < b, c! <https://x.example|x>", "plain text, a < b, c! <https://x.example|x>"),
        ("", ""),
    ],
)  # fmt: skip
def test_escape_defuses_broadcasts_and_keeps_the_rest(text: str, shown: str) -> None:
    assert escape(text) == shown
    assert escape(shown) == shown  # escaping again changes nothing


@given(st.text(alphabet=st.sampled_from(list("<!@&;lt>^ hx")), max_size=40))
def test_nothing_escaped_can_notify_a_channel(text: str) -> None:
    out = escape(text)
    assert "<!" not in out
    assert out.replace("&lt;!", "<!") == text.replace("&lt;!", "<!")


# -- Threads ---------------------------------------------------------------------------------


def in_thread(author: str, thread: str = PARENT, ts: str = TS, **changes: Any) -> Message:
    return read(event(user=author, ts=ts, thread_ts=thread, **changes))


def test_a_thread_the_bot_posted_in_addresses_it() -> None:
    threads = Threads()
    before = in_thread(BOB)
    assert threads.address(before, ALPHA) is before  # alpha has not posted there
    own = in_thread(ALPHA, bot_id="B0ALPHA")
    assert threads.address(own, ALPHA) is own
    after = threads.address(in_thread(BOB, parent_user_id=ALICE), ALPHA)
    assert after.reply_to == ALPHA  # alice started it; alpha is in it
    elsewhere = in_thread(BOB, thread="1700000050.000000")
    assert threads.address(elsewhere, ALPHA).reply_to is None
    top = read(event(user=BOB))
    assert threads.address(top, ALPHA) is top  # the channel is not the thread


def test_posting_marks_a_thread_and_a_channel_is_never_marked() -> None:
    threads = Threads()
    threads.posted(ChatRef("slack", CHANNEL))
    threads.posted(ChatRef("slack", CHANNEL, PARENT))
    assert threads.address(in_thread(BOB), ALPHA).reply_to == ALPHA
    assert threads.address(read(event(user=BOB)), ALPHA).reply_to is None


def test_the_threads_remembered_are_bounded_oldest_first_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(slack, "THREADS_REMEMBERED", 3)
    threads = Threads()
    keys = [f"17000000{i}0.000000" for i in range(5)]
    for key in keys[:3]:
        threads.posted(ChatRef("slack", CHANNEL, key))
    threads.posted(ChatRef("slack", CHANNEL, keys[0]))  # posted again: the newest now
    threads.posted(ChatRef("slack", CHANNEL, keys[3]))  # the oldest (keys[1]) goes

    def addressed(key: str) -> bool:
        return threads.address(in_thread(BOB, thread=key), ALPHA).reply_to == ALPHA

    assert [addressed(k) for k in keys] == [True, False, True, True, False]


async def test_slack_sdk_builds_its_debug_lines_only_when_debug_lines_are_shown() -> None:
    """slack_sdk formats a request's arguments and its whole answer for a debug
    line whenever its logger's own level is DEBUG or unset: the adapter's
    client has a logger whose level follows the daemon's."""
    root = logging.getLogger()
    before = root.level
    try:
        async with aiohttp.ClientSession() as session:
            root.setLevel(logging.INFO)
            quiet = web_client("xoxb-1", None, session)
            assert quiet._logger.level > logging.DEBUG  # what slack_sdk checks
            root.setLevel(logging.DEBUG)
            loud = web_client("xoxb-1", None, session)
            assert loud._logger.level <= logging.DEBUG
    finally:
        root.setLevel(before)
