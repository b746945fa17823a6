"""Who and what exists on the fake Telegram: people, bots, chats and their members.

Only set-up and lookups live here; what happens in the world (messages, updates,
API calls) is built on top of it in the other modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.fakes.recording import Recording

Json = dict[str, Any]  # a JSON object as the Bot API reads and writes it

GROUP_ANONYMOUS_BOT_ID = 1087968824  # "from" of messages an anonymous admin sends
MEMBER_STATUSES = frozenset({"member", "administrator", "creator"})
ADMIN_STATUSES = frozenset({"administrator", "creator"})
CHAT_STATUSES = frozenset({"member", "administrator", "creator", "left", "kicked"})
CHAT_TYPES = frozenset({"group", "supergroup"})


@dataclass
class FakeUser:
    id: int
    first_name: str
    username: str | None = None
    is_bot: bool = False

    def payload(self) -> Json:
        """The User object."""
        data: Json = {"id": self.id, "is_bot": self.is_bot, "first_name": self.first_name}
        if self.username:
            data["username"] = self.username
        return data


@dataclass
class Webhook:
    """A bot's webhook, as set by setWebhook."""

    url: str
    secret_token: str | None = None
    allowed_updates: list[str] | None = None


@dataclass
class FakeBot:
    """A bot account. `privacy`: Group Privacy Mode (on by default in BotFather);
    `bot_to_bot`: BotFather's Bot-to-Bot Communication Mode."""

    token: str
    user: FakeUser
    privacy: bool = True
    bot_to_bot: bool = False
    pending: list[Json] = field(default_factory=list)  # not yet confirmed / delivered
    next_update_id: int = 1
    allowed_updates: list[str] | None = None  # as the last getUpdates set it; None: default
    webhook: Webhook | None = None
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
    type: str  # private | group | supergroup
    title: str = ""
    is_forum: bool = False
    members: dict[int, str] = field(default_factory=dict)  # user id -> status
    messages: dict[int, Json] = field(default_factory=dict)  # message id -> message
    last_message_id: int = 0
    topics: set[int] = field(default_factory=set)  # message_thread_ids of forum topics
    user: FakeUser | None = None  # private chats: the person
    bot_id: int | None = None  # private chats: the bot

    def payload(self) -> Json:
        """The Chat object."""
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


class World(Recording):
    """The accounts and chats of one fake Telegram, and how to find them."""

    label = "fake telegram"

    def __init__(self) -> None:
        super().__init__()
        self.bots: dict[str, FakeBot] = {}  # by token
        self.users: dict[int, FakeUser] = {}  # people and bots
        self.chats: dict[int, FakeChat] = {}  # groups and supergroups
        self.privates: dict[tuple[int, int], FakeChat] = {}  # (user id, bot user id)
        self.add_user(GROUP_ANONYMOUS_BOT_ID, "Group", "GroupAnonymousBot", is_bot=True)

    # -- set-up ------------------------------------------------------------------------

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
        user = self.add_user(user_id, first_name, username, is_bot=True)
        bot = FakeBot(token, user, privacy=privacy, bot_to_bot=bot_to_bot)
        self.bots[token] = bot
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
        user = self.user(user_id)
        bot = self.bot(bot_user_id)
        chat = FakeChat(user_id, "private", user=user, bot_id=bot.id)
        chat.members = {user_id: "member", bot.id: "member"}
        self.privates[(user_id, bot.id)] = chat
        return chat

    def add_member(self, chat_id: int, user_id: int, status: str = "member") -> None:
        """Make a person or bot a member (administrator, creator, or left/kicked) of a chat."""
        if status not in CHAT_STATUSES:
            raise ValueError(f"fake telegram: status must be one of {sorted(CHAT_STATUSES)}")
        self.user(user_id)
        self.group(chat_id).members[user_id] = status

    # -- lookups -----------------------------------------------------------------------

    def bot(self, user_id: int) -> FakeBot:
        for bot in self.bots.values():
            if bot.id == user_id:
                return bot
        raise KeyError(f"fake telegram: no bot with user id {user_id}")

    def user(self, user_id: int) -> FakeUser:
        try:
            return self.users[user_id]
        except KeyError:
            raise KeyError(f"fake telegram: unknown user {user_id} (add_user first)") from None

    def group(self, chat_id: int) -> FakeChat:
        try:
            return self.chats[chat_id]
        except KeyError:
            raise KeyError(f"fake telegram: unknown chat {chat_id} (add_chat first)") from None

    def chat_for_user(self, chat_id: int, user_id: int, to_bot: int | None) -> FakeChat:
        """The group `chat_id`, or the person's private chat (with bot `to_bot` when
        they have several)."""
        if chat_id in self.chats:
            return self.chats[chat_id]
        if chat_id != user_id:
            raise KeyError(f"fake telegram: unknown chat {chat_id}")
        found = [
            chat
            for (uid, bid), chat in self.privates.items()
            if uid == user_id and to_bot in (None, bid)
        ]
        if len(found) != 1:
            raise KeyError(
                f"fake telegram: {len(found)} private chats of user {user_id} "
                "(add_private first; pass to_bot= to choose)"
            )
        return found[0]

    def messages(self, chat_id: int) -> list[Json]:
        """Every message in a group, in order."""
        chat = self.group(chat_id)
        return [chat.messages[k] for k in sorted(chat.messages)]
