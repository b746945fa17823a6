"""YAML -> validated, typed settings (docs/configuration.md).

A config file is read in four steps (`loading.py`), each of which can only
fail with a `ConfigError` whose problems read `<key path>: <what is wrong>`:

1. YAML is parsed (duplicate keys are rejected: a silently ignored key is the
   kind of surprise docs/configuration.md rules out).
2. `${VAR}` / `${VAR:-default}` are interpolated in string values, so tokens
   never live in the file.
3. `defaults` is deep-merged under every bot, so a bot states only what differs.
4. pydantic validates; its errors are translated into short messages
   (`errors.py`), and an error that a bot merely inherited from `defaults` is
   reported once, there.

The schema: `policy.py` (the chat rules, `defaults:`), `bots.py` (a bot and its
backend), `process.py` (store, http, shutdown), `schema.py` (the whole file);
the guard's profiles live beside the guard (gateway/guard/profiles.py), the
field types and bounds in gateway/fields.py, the defaults in gateway/defaults.py.
"""

from __future__ import annotations

from gateway.config.bots import (
    BACKEND_TYPES,
    AdminsConfig,
    BackendConfig,
    BotConfig,
    BreakerConfig,
    EchoBackend,
    MatrixConfig,
    OpenAIBackend,
    PythonBackend,
    SlackConfig,
    TelegramConfig,
    WebhookBackend,
)
from gateway.config.errors import ConfigError, UnknownBotError
from gateway.config.loading import load_config, parse_config
from gateway.config.policy import (
    DEFAULT_WARN_HARD,
    DEFAULT_WARN_SOFT,
    PairsPolicy,
    Policy,
    RateCapPolicy,
    ReplyDecisionPolicy,
    TurnsPolicy,
)
from gateway.config.process import HttpConfig, ShutdownConfig, StoreConfig, mask_password
from gateway.config.schema import Config
from gateway.fields import MAX_COUNT, MAX_WINDOW_SECONDS
from gateway.guard.profiles import BUDGET_TOO_SMALL, MIN_BUDGET_USD, GuardConfig, GuardProfile

__all__ = [
    "BACKEND_TYPES",
    "BUDGET_TOO_SMALL",
    "DEFAULT_WARN_HARD",
    "DEFAULT_WARN_SOFT",
    "MAX_COUNT",
    "MAX_WINDOW_SECONDS",
    "MIN_BUDGET_USD",
    "AdminsConfig",
    "BackendConfig",
    "BotConfig",
    "BreakerConfig",
    "Config",
    "ConfigError",
    "EchoBackend",
    "GuardConfig",
    "GuardProfile",
    "HttpConfig",
    "MatrixConfig",
    "OpenAIBackend",
    "PairsPolicy",
    "Policy",
    "PythonBackend",
    "RateCapPolicy",
    "ReplyDecisionPolicy",
    "ShutdownConfig",
    "SlackConfig",
    "StoreConfig",
    "TelegramConfig",
    "TurnsPolicy",
    "UnknownBotError",
    "WebhookBackend",
    "load_config",
    "mask_password",
    "parse_config",
]
