"""One bot: its identity, platform, backend and platform settings (docs/configuration.md)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, TypeAlias
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gateway import defaults
from gateway.config.policy import Policy
from gateway.config.process import mask_password
from gateway.fields import (
    MAX_COUNT,
    Float,
    Ids,
    Int,
    Model,
    NonEmptyStr,
    OptionalSecret,
    OptionalStr,
    check_http_url,
    check_template,
)


def _required_http_url(value: str) -> str:
    check_http_url(value)
    return value


HttpUrl = Annotated[str, AfterValidator(_required_http_url)]


class BreakerConfig(Model):
    """After `failures` consecutive failures, stop calling the backend for
    `cooldown_seconds` (each message is `backend_error` at once), then let one
    trial call through: success closes the breaker, failure reopens it."""

    failures: Int = Field(default=5, ge=1)
    cooldown_seconds: Float = Field(default=30.0, gt=0)


class EchoBackend(Model):
    """Replies with the message's own text: for demos and tests."""

    type: Literal["echo"]


class _CalledBackend(Model):
    """What every backend that is called out to has: a deadline, the recent
    context it is given, a circuit breaker and a bound on calls in flight."""

    timeout_seconds: Float = Field(default=10.0, gt=0)
    context_messages: Int = Field(default=defaults.CONTEXT_MESSAGES, ge=0, le=50)
    breaker: BreakerConfig = BreakerConfig()
    # Calls in flight at once, per bot; more wait for a place, and the wait
    # counts against timeout_seconds. Bounds what a slow backend can pile up.
    max_concurrent: Int = Field(default=32, ge=1, le=10_000)


class WebhookBackend(_CalledBackend):
    """POSTs the message and recent context as JSON; the answer is the reply."""

    type: Literal["webhook"]
    url: HttpUrl
    # e.g. Authorization: "Bearer ${WEBHOOK_TOKEN}"
    headers: dict[str, SecretStr] = Field(default_factory=dict)


class OpenAIBackend(_CalledBackend):
    """The bot is an LLM on an OpenAI-compatible chat-completions endpoint."""

    type: Literal["openai"]
    endpoint: HttpUrl  # the completions URL, or a base URL ending in /v1
    api_key: OptionalSecret = None
    model: NonEmptyStr
    system_prompt: str = "You are {name}, a bot in a group chat. Answer briefly and helpfully."
    max_tokens: Int = Field(default=512, ge=1)
    temperature: Float | None = Field(default=None, ge=0, le=2)
    timeout_seconds: Float = Field(default=30.0, gt=0)  # a model takes longer

    @field_validator("system_prompt")
    @classmethod
    def _system_prompt(cls, value: str) -> str:
        return check_template(value, ("name",))


class PythonBackend(_CalledBackend):
    """An async callable `module:function` taking the message (and the context)."""

    type: Literal["python"]
    callable: str

    @field_validator("callable")
    @classmethod
    def _callable(cls, value: str) -> str:
        module, _, name = value.partition(":")
        if not (module and name and all(p.isidentifier() for p in module.split("."))
                and all(p.isidentifier() for p in name.split("."))):  # fmt: skip
            raise ValueError("must be 'package.module:function'")
        return value


# A discriminated union on `type`: each new backend is one more member here.
BackendConfig: TypeAlias = Annotated[
    EchoBackend | WebhookBackend | OpenAIBackend | PythonBackend, Field(discriminator="type")
]
BACKEND_TYPES: tuple[str, ...] = ("echo", "webhook", "openai", "python")
# Field names holding a discriminated union, with their tags: pydantic puts the
# tag into an error's location (`backend.echo.url`), the user never wrote it.
TAGGED_FIELDS: dict[str, tuple[str, ...]] = {"backend": BACKEND_TYPES}


class AdminsConfig(Model):
    """Who may run admin commands besides the platform's own administrators."""

    user_ids: Ids = ()
    role_ids: Ids = ()


Platform: TypeAlias = Literal["discord", "telegram", "slack", "matrix", "http"]
# proxy: the daemon connects to the platform with the bot's token and its
# backend answers; decide: the bot keeps its token and its code, and asks
# (POST /v1/bots/<name>/decide, or the botbouncer package in process).
Mode: TypeAlias = Literal["proxy", "decide"]

_SECRET_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,256}$")


class TelegramRateLimit(Model):
    """How fast the bot sends, kept under Telegram's flood limits by PTB's
    AIORateLimiter; 0 lifts a limit (for a Bot API server without them)."""

    overall_per_second: Float = Field(default=30.0, ge=0, le=MAX_COUNT)
    group_per_minute: Float = Field(default=20.0, ge=0, le=MAX_COUNT)


class TelegramConfig(Model):
    """Telegram only: long polling unless `webhook_url` is set. In webhook mode
    Telegram POSTs updates to `webhook_url`, which must reach the daemon's
    `POST /v1/webhooks/<bot name>`, and every update must carry `secret_token`."""

    webhook_url: OptionalStr = None
    secret_token: OptionalSecret = None
    rate_limit: TelegramRateLimit = TelegramRateLimit()

    @field_validator("webhook_url")
    @classmethod
    def _webhook_url(cls, value: str | None) -> str | None:
        return check_http_url(value)

    @field_validator("secret_token")
    @classmethod
    def _secret(cls, value: SecretStr | None) -> SecretStr | None:
        # Telegram's own rule; never echo the value.
        if value is not None and not _SECRET_TOKEN.match(value.get_secret_value()):
            raise ValueError("must be 1-256 characters of A-Z, a-z, 0-9, _ and -")
        return value

    @model_validator(mode="after")
    def _pair(self) -> TelegramConfig:
        if self.webhook_url is not None and self.secret_token is None:
            raise ValueError(
                "webhook_url needs secret_token: without it anyone who finds the URL "
                "can post updates"
            )
        if self.secret_token is not None and self.webhook_url is None:
            raise ValueError("secret_token is only used with webhook_url")
        return self


class SlackConfig(Model):
    """Slack only: Socket Mode (`app_token`, an xapp- app-level token with
    connections:write; no public URL) unless `mode: events`, where Slack POSTs
    events and the slash command to the daemon's `POST /v1/webhooks/<bot name>`,
    each signed with `signing_secret`."""

    mode: Literal["socket", "events"] = "socket"
    app_token: OptionalSecret = None
    signing_secret: OptionalSecret = None

    @field_validator("app_token")
    @classmethod
    def _app_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().startswith("xapp-"):
            # never echo the value: it may be the bot token pasted in the wrong place
            raise ValueError("must be an app-level token (xapp-...), made under Basic Information")
        return value

    @model_validator(mode="after")
    def _pair(self) -> SlackConfig:
        if self.mode == "socket" and self.app_token is None:
            raise ValueError(
                "app_token: is required for Socket Mode (or mode: events with signing_secret)"
            )
        if self.mode == "events" and self.signing_secret is None:
            raise ValueError(
                "signing_secret: is required for mode: events: without it anyone who finds "
                "the URL can post events"
            )
        if self.mode == "socket" and self.signing_secret is not None:
            raise ValueError("signing_secret: is only used with mode: events")
        if self.mode == "events" and self.app_token is not None:
            raise ValueError("app_token: is only used with mode: socket")
        return self


_MXID = re.compile(r"^@[^:\s]+:[^\s]+$")
_SERVER = re.compile(r"^[A-Za-z0-9.\-]+(:[0-9]{1,5})?$|^\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?$")


class MatrixConfig(Model):
    """Matrix only: the homeserver (its client-server API URL), the bot's
    account (`token` is its access token), and whose invites it accepts:
    user ids (`@alice:example.org`) or server names (`example.org`: anyone
    on it). Invites from anyone else are declined."""

    homeserver: HttpUrl
    user_id: NonEmptyStr
    auto_join: tuple[NonEmptyStr, ...] = ()

    @field_validator("user_id")
    @classmethod
    def _user_id(cls, value: str) -> str:
        if not _MXID.match(value):
            raise ValueError(f"must be a Matrix user id like @bot:example.org, not {value!r}")
        return value

    @field_validator("auto_join")
    @classmethod
    def _auto_join(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for entry in value:
            if not (_MXID.match(entry) or _SERVER.match(entry)):
                raise ValueError(
                    f"{entry!r} is neither a user id (@alice:example.org) nor a server name "
                    "(example.org)"
                )
        return value


class BotConfig(Policy):
    """One bot behind the gateway: its identity, platform, backend and policy.

    The policy fields are already merged: `defaults` with this bot's overrides.
    """

    name: NonEmptyStr
    platform: Platform
    mode: Mode = "proxy"
    token: OptionalSecret = Field(default=None, validate_default=True)
    api_base: OptionalStr = None
    backend: BackendConfig | None = Field(default=None, validate_default=True)
    # decide mode: the bot's own id on its platform (the author id of its
    # messages, what a mention of it carries); its name unless given
    user_id: OptionalStr = None
    # decide mode: how long a ticket holds its reply's turn and rate slot
    ticket_seconds: Float = Field(default=defaults.TICKET_SECONDS, gt=0, le=86_400)
    admins: AdminsConfig = AdminsConfig()
    # Discord only: where the gateway websocket is when api_base points at a
    # proxy (default: what GET {api_base}/gateway/bot answers), sharding for
    # bots in many guilds, and guilds to register slash commands in at once.
    gateway_url: OptionalStr = None
    shard_count: Int | None = Field(default=None, ge=1, le=MAX_COUNT)
    shard_ids: tuple[Annotated[Int, Field(ge=0)], ...] | None = None
    guild_ids: Ids = ()
    telegram: TelegramConfig = TelegramConfig()
    # Slack only (validated after `token`: unset, it is checked by _slack)
    slack: SlackConfig | None = None
    # Matrix only (required there, checked by _slack)
    matrix: MatrixConfig | None = None

    @field_validator(
        "gateway_url", "shard_count", "shard_ids", "guild_ids", "telegram", "slack", "matrix"
    )
    @classmethod
    def _platform_only(cls, value: Any, info: ValidationInfo) -> Any:
        owners = {"telegram": "Telegram", "slack": "Slack", "matrix": "Matrix"}
        owner = owners.get(info.field_name or "", "Discord")
        platform = info.data.get("platform")
        unset = value in (None, ()) or value == TelegramConfig()
        if not unset and platform is not None and platform != owner.lower():
            raise ValueError(f"is a {owner} setting; this bot's platform is {platform}")
        return value

    @field_validator("admins")
    @classmethod
    def _admins(cls, value: AdminsConfig, info: ValidationInfo) -> AdminsConfig:
        platform = info.data.get("platform")
        if value.role_ids and platform is not None and platform != "discord":
            raise ValueError(f"role_ids: {platform} has no roles; list people under user_ids")
        return value

    @field_validator("gateway_url")
    @classmethod
    def _gateway_url(cls, value: str | None) -> str | None:
        if value is not None:
            parts = urlsplit(value)
            if parts.scheme not in ("ws", "wss") or not parts.netloc:
                raise ValueError(f"must be a ws:// or wss:// URL, not {mask_password(value)!r}")
        return value

    @model_validator(mode="after")
    def _shards(self) -> BotConfig:
        if self.shard_ids is not None:
            if self.shard_count is None:
                raise ValueError("shard_ids needs shard_count")
            bad = [i for i in self.shard_ids if i >= self.shard_count]
            if bad:
                raise ValueError(
                    f"shard_ids: {bad[0]} is not below shard_count ({self.shard_count})"
                )
        return self

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        # The name is a path segment of the ingress URL and an author id.
        if value != value.strip() or "/" in value:
            raise ValueError("must not contain '/' or start or end with whitespace")
        return value

    @field_validator("token")
    @classmethod
    def _token(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        platform = info.data.get("platform")
        if info.data.get("mode") == "decide":
            if value is not None:
                raise ValueError("a decide bot keeps its token: botbouncer never connects for it")
            return value
        if value is None and platform in ("discord", "telegram", "slack", "matrix"):
            raise ValueError(f"is required for platform {platform}")
        if platform == "slack" and value and not value.get_secret_value().startswith("xoxb-"):
            raise ValueError("a Slack bot's token is its bot token (xoxb-...), under "
                                 "OAuth & Permissions")  # fmt: skip
        return value

    @model_validator(mode="after")
    def _slack(self) -> BotConfig:
        if self.platform == "slack" and self.mode == "proxy" and self.slack is None:
            raise ValueError(
                "slack: is required for platform slack: app_token (Socket Mode) or "
                "mode: events with signing_secret"
            )
        if self.mode == "decide" and self.slack is not None:
            raise ValueError("slack: a decide bot keeps its own connection")
        if self.platform == "matrix" and self.mode == "proxy":
            if self.matrix is None:
                raise ValueError("matrix: is required for platform matrix: homeserver and user_id")
            if self.api_base is not None:
                raise ValueError("api_base: a Matrix bot's server is matrix.homeserver")
        if self.mode == "decide" and self.matrix is not None:
            raise ValueError("matrix: a decide bot keeps its own connection")
        return self

    @field_validator("backend")
    @classmethod
    def _backend(cls, value: Any, info: ValidationInfo) -> Any:
        decide = info.data.get("mode") == "decide"
        if decide and value is not None:
            raise ValueError("a decide bot has no backend: its own code answers")
        if not decide and value is None and "mode" in info.data:
            raise ValueError("is required (or mode: decide, for a bot that answers by itself)")
        return value

    @model_validator(mode="after")
    def _decide_only(self) -> BotConfig:
        if self.mode == "proxy":
            for key in ("user_id", "ticket_seconds"):
                if key in self.model_fields_set:
                    raise ValueError(f"{key}: is a setting of mode: decide")
        elif self.api_base is not None:
            raise ValueError("api_base: a decide bot keeps its own connection")
        return self

    @field_validator("api_base")
    @classmethod
    def _api_base(cls, value: str | None) -> str | None:
        return check_http_url(value)
