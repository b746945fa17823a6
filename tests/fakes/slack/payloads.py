"""The JSON Slack hands out: messages, message events wrapped in event_callback,
users.info / conversations.info objects, slash-command fields, and request signing."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import time
import uuid

from tests.fakes.slack.world import FakeApp, FakeChannel, FakeUser, Json, World

_event_ids = itertools.count(1)


def bot_profile(world: World, app: FakeApp) -> Json:
    return {
        "id": app.bot_id,
        "app_id": app.id,
        "name": app.name,
        "deleted": False,
        "team_id": world.team_id,
        "updated": 1700000000,
        "icons": {"image_48": "https://fake.slack/icon_48.png"},
    }


def new_message(
    world: World,
    user: FakeUser,
    text: str,
    *,
    thread_ts: str | None = None,
    subtype: str | None = None,
    via: FakeApp | None = None,
) -> Json:
    """A message as stored and returned by chat.postMessage (no channel field
    there). `via`: the app a person posted through with their own user token,
    which Slack stamps on the message as it does a bot's post."""
    msg: Json = {"type": "message", "user": user.id, "text": text, "ts": world.new_ts()}
    if subtype is not None:
        msg["subtype"] = subtype
    if user.bot_id is not None or via is not None:  # posted through the API: no subtype,
        app = via or world.apps[str(user.app_id)]  # the posting app's bot_id and profile
        msg.update(bot_id=app.bot_id, app_id=app.id, bot_profile=bot_profile(world, app))
    elif subtype is None:
        msg["client_msg_id"] = str(uuid.uuid4())
    msg["team"] = world.team_id
    if thread_ts is not None:
        msg["thread_ts"] = thread_ts
    return msg


def message_event(channel: FakeChannel, message: Json) -> Json:
    """The `event` of a message event: the message plus channel, channel_type, event_ts."""
    return {
        **message,
        "channel": channel.id,
        "event_ts": message["ts"],
        "channel_type": channel.channel_type,
    }


def event_callback(world: World, app: FakeApp, event: Json) -> Json:
    """The Events API body delivering `event` to `app` (over HTTP or in an envelope)."""
    return {
        "token": app.verification_token,
        "team_id": world.team_id,
        "context_team_id": world.team_id,
        "context_enterprise_id": None,
        "api_app_id": app.id,
        "event": event,
        "type": "event_callback",
        "event_id": f"Ev{next(_event_ids):08d}",
        "event_time": int(time.time()),
        "authorizations": [
            {
                "enterprise_id": None,
                "team_id": world.team_id,
                "user_id": app.bot_user_id,
                "is_bot": True,
                "is_enterprise_install": False,
            }
        ],
        "is_ext_shared_channel": False,
    }


def command_payload(
    world: World, app: FakeApp, channel: FakeChannel, user: FakeUser, command: str, text: str
) -> Json:
    """A slash command's form fields (all strings), as Socket Mode's payload."""
    return {
        "token": app.verification_token,
        "team_id": world.team_id,
        "team_domain": world.team_name,
        "channel_id": channel.id,
        "channel_name": "directmessage" if channel.is_im else channel.name,
        "user_id": user.id,
        "user_name": user.name,
        "command": command,
        "text": text,
        "api_app_id": app.id,
        "is_enterprise_install": "false",
        "response_url": f"https://hooks.fake.slack/commands/{world.team_id}/{uuid.uuid4().hex}",
        "trigger_id": f"{int(time.time())}.{uuid.uuid4().hex}",
    }


def user_info(world: World, user: FakeUser) -> Json:
    profile: Json = {"real_name": user.real_name, "display_name": user.name}
    if user.bot_id is not None:
        profile.update(bot_id=user.bot_id, api_app_id=user.app_id)
    return {
        "id": user.id,
        "team_id": world.team_id,
        "name": user.name,
        "real_name": user.real_name,
        "deleted": False,
        "is_bot": user.is_bot,
        "is_app_user": False,
        "is_admin": user.is_admin,
        "is_owner": user.is_owner,
        "is_primary_owner": False,
        "profile": profile,
    }


def channel_info(channel: FakeChannel, viewer: str) -> Json:
    """A conversation object as conversations.info shows it to the user `viewer`."""
    if channel.is_im:
        other = next((m for m in sorted(channel.members) if m != viewer), viewer)
        return {"id": channel.id, "created": channel.created, "is_im": True, "user": other}
    return {
        "id": channel.id,
        "name": channel.name,
        "created": channel.created,
        "creator": channel.creator,
        "is_channel": True,
        "is_group": False,
        "is_im": False,
        "is_private": False,
        "is_archived": False,
        "is_member": viewer in channel.members,
    }


def signature(signing_secret: str, timestamp: str, body: bytes) -> str:
    """Slack's v0 request signature."""
    base = f"v0:{timestamp}:".encode() + body
    return "v0=" + hmac.new(signing_secret.encode(), base, hashlib.sha256).hexdigest()
