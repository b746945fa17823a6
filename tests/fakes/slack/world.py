"""The workspace: people, apps (each with a bot user) and channels with their members."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

Json = dict[str, Any]


@dataclass
class FakeUser:
    """A member of the workspace; a bot user has `bot_id` and `app_id`."""

    id: str  # U...
    name: str
    real_name: str = ""
    bot_id: str | None = None
    app_id: str | None = None
    is_admin: bool = False  # a workspace admin
    is_owner: bool = False  # a workspace owner

    @property
    def is_bot(self) -> bool:
        return self.bot_id is not None


@dataclass
class FakeApp:
    """A Slack app installed in the workspace: its bot user, bot and app-level tokens."""

    id: str  # A...
    name: str
    bot_id: str  # B...
    bot_user_id: str  # U...
    bot_token: str  # xoxb-...
    app_token: str  # xapp-...
    signing_secret: str = "fake-signing-secret"
    verification_token: str = "fake-verification-token"


@dataclass
class FakeChannel:
    """A public channel (`C...`) or a direct message (`D...`, is_im)."""

    id: str
    name: str
    is_im: bool = False
    members: set[str] = field(default_factory=set)  # user ids
    creator: str = ""  # who made the channel (conversations.info `creator`)
    messages: list[Json] = field(default_factory=list)  # oldest first, threads included
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def channel_type(self) -> str:
        return "im" if self.is_im else "channel"


class World:
    """Set-up and lookups of the workspace. Lookups of missing ids raise KeyError."""

    def __init__(self, team_id: str = "T0FAKE", team_name: str = "fake-team") -> None:
        self.team_id = team_id
        self.team_name = team_name
        self.users: dict[str, FakeUser] = {}
        self.apps: dict[str, FakeApp] = {}
        self.channels: dict[str, FakeChannel] = {}
        self._last_ts = 0.0

    def add_user(
        self,
        user_id: str,
        name: str,
        real_name: str = "",
        *,
        is_admin: bool = False,
        is_owner: bool = False,
    ) -> FakeUser:
        user = FakeUser(
            user_id, name, real_name or name.title(), is_admin=is_admin, is_owner=is_owner
        )
        self.users[user_id] = user
        return user

    def add_app(
        self,
        app_id: str,
        name: str,
        *,
        bot_id: str,
        bot_user_id: str,
        bot_token: str | None = None,
        app_token: str | None = None,
        signing_secret: str = "fake-signing-secret",
    ) -> FakeApp:
        """An app and its bot user (named `name`); tokens default to xoxb-/xapp- + app id."""
        app = FakeApp(
            app_id,
            name,
            bot_id,
            bot_user_id,
            bot_token or f"xoxb-{app_id}",
            app_token or f"xapp-1-{app_id}",
            signing_secret,
        )
        self.apps[app_id] = app
        self.users[bot_user_id] = FakeUser(bot_user_id, name, name, bot_id, app_id)
        return app

    def add_channel(
        self, channel_id: str, name: str, *members: str, creator: str = ""
    ) -> FakeChannel:
        """A public channel; its creator is `creator`, else its first member."""
        channel = FakeChannel(
            channel_id, name, members=set(members), creator=creator or next(iter(members), "")
        )
        self.channels[channel_id] = channel
        return channel

    def add_dm(self, channel_id: str, user_id: str, bot_user_id: str) -> FakeChannel:
        """The direct message of a person with an app's bot user."""
        channel = FakeChannel(channel_id, user_id, is_im=True, members={user_id, bot_user_id})
        self.channels[channel_id] = channel
        return channel

    def add_member(self, channel_id: str, user_id: str) -> None:
        self.channels[channel_id].members.add(user_id)

    # -- lookups -----------------------------------------------------------------------

    def app_by_token(self, token: str) -> tuple[FakeApp, str] | None:
        """The app owning `token` and the token's kind ("bot" or "app")."""
        for app in self.apps.values():
            if token == app.bot_token:
                return app, "bot"
            if token == app.app_token:
                return app, "app"
        return None

    def member_apps(self, channel: FakeChannel) -> list[FakeApp]:
        """The apps whose bot user is in the channel."""
        return [app for app in self.apps.values() if app.bot_user_id in channel.members]

    def new_ts(self) -> str:
        """A fresh message ts ("seconds.micros"), strictly increasing."""
        self._last_ts = max(time.time(), self._last_ts + 0.000001)
        return f"{self._last_ts:.6f}"
