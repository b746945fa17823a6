"""Telegram updates as the Bot API shapes them, with any field missing, null or
of another type (hypothesis strategies).

python-telegram-bot's de_json refuses an update only when a field its
constructors require is missing; anything else it passes along as given - a
chat id that is a string, a text that is a list, an entity whose offset is
null - and a message without `chat` becomes a Message whose chat is None.
These updates are what reaches an adapter.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

GROUP = -1001500
_MISSING = object()

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def odd(good: st.SearchStrategy[Any], *, missing: bool = False) -> st.SearchStrategy[Any]:
    """Mostly `good` (so that most updates get past PTB's parser); else null,
    any JSON value, or - for a field PTB requires - absent."""
    others: list[st.SearchStrategy[Any]] = [st.none(), json_values, json_values]
    others.append(st.just(_MISSING) if missing else st.none())

    def pick(i: int) -> st.SearchStrategy[Any]:
        return good if i < 16 else others[i - 16]

    return st.integers(0, 19).flatmap(pick)


def shaped(
    required: dict[str, st.SearchStrategy[Any]], optional: dict[str, st.SearchStrategy[Any]]
) -> st.SearchStrategy[dict[str, Any]]:
    """A Bot API object: its required fields mostly there, any optional one
    maybe, each of them maybe null or of another type."""
    return st.fixed_dictionaries(
        {k: odd(v, missing=True) for k, v in required.items()},
        optional={k: odd(v) for k, v in optional.items()},
    ).map(lambda d: {k: v for k, v in d.items() if v is not _MISSING})


ids = st.one_of(st.integers(-(10**13), 10**13), st.sampled_from([GROUP, 1001, 7001, 7002, 0]))
SAMPLE_TEXTS = ["@alpha_bot hi", "/bouncer_status", "/bouncer_why@alpha_bot 3", "/start@alpha_bot",
                "hi \ud800 there", ""]  # fmt: skip
texts = st.one_of(st.text(max_size=30), st.sampled_from(SAMPLE_TEXTS))
users = shaped(
    {"id": ids, "is_bot": st.booleans(), "first_name": st.text(max_size=8)},
    {"last_name": st.text(max_size=8), "username": st.sampled_from(["alpha_bot", "alice", ""])},
)
chats = shaped(
    {"id": ids, "type": st.sampled_from(["private", "group", "supergroup", "channel", "new"])},
    {"title": st.text(max_size=8), "username": st.text(max_size=8), "is_forum": st.booleans()},
)
entities = shaped(
    {
        "type": st.sampled_from(["mention", "text_mention", "bot_command", "bold", "new_kind"]),
        "offset": st.integers(-3, 40),
        "length": st.integers(-3, 40),
    },
    {"user": users},
)


def messages(depth: int = 2) -> st.SearchStrategy[dict[str, Any]]:
    """A Message; `depth` levels of replied-to and pinned messages in it."""
    optional: dict[str, st.SearchStrategy[Any]] = {
        "from": users,
        "sender_chat": chats,
        "text": texts,
        "entities": st.lists(entities, max_size=3),
        "caption": texts,
        "caption_entities": st.lists(entities, max_size=2),
        "message_thread_id": ids,
        "is_topic_message": st.booleans(),
        "new_chat_members": st.lists(users, max_size=2),
        "left_chat_member": users,
        "forum_topic_created": st.fixed_dictionaries(
            {"name": st.text(max_size=5), "icon_color": st.just(7322096)}
        ),
        "edit_date": st.integers(0, 10**9),
    }
    if depth > 0:
        optional["reply_to_message"] = st.deferred(lambda: messages(depth - 1))
        optional["pinned_message"] = st.deferred(lambda: messages(depth - 1))
    required = {"message_id": st.integers(1, 10**9), "date": st.integers(0, 2**31), "chat": chats}
    return shaped(required, optional)


callback_queries = shaped(
    {"id": st.text(max_size=5), "from": users, "chat_instance": st.text(max_size=5)},
    {"message": messages(1), "data": st.text(max_size=8)},
)
MESSAGE_KINDS = [
    "message",
    "edited_message",
    "channel_post",
    "edited_channel_post",
    "business_message",
]
# An update without its update_id (the caller numbers them).
updates = st.one_of(
    st.builds(lambda m: {"message": m}, messages()),
    st.builds(lambda m: {"message": m}, messages()),  # the kind the adapter reads, twice as often
    st.builds(lambda k, m: {k: m}, st.sampled_from(MESSAGE_KINDS), messages()),
    st.builds(lambda q: {"callback_query": q}, callback_queries),
    st.dictionaries(
        st.sampled_from([*MESSAGE_KINDS, "callback_query", "my_chat_member", "brand_new"]),
        json_values,
        max_size=2,
    ),
)
