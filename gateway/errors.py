"""The one error base: every error botbouncer raises on purpose derives from it.

An error carries the HTTP answer it stands for (`status`, and what is said:
`public()`, `headers()`), so the server's error middleware maps the base once
instead of each class (gateway/http.py). An error that should never reach a
client (a config or startup error) keeps the default 500, which the
middleware answers without detail, as for any bug.

Where each lives: next to what raises it (`StoreError` in store/base.py,
`ConfigError` in config/errors.py, ...). `StartupError` lives here because
adapters raise it and must not import the daemon.

Left out on purpose: the guard's client (gateway/guard/client.py) keeps its own
`GuardError`/`GuardBlocked`: it is the standard-library-only file an agent
copies into its own code, and imports nothing of the daemon.
"""

from __future__ import annotations

from typing import ClassVar


class BotbouncerError(Exception):
    """Something botbouncer refuses or cannot do; the text says what to change."""

    status: ClassVar[int] = 500
    # Logged when it reaches the HTTP server: None for what the client caused.
    log_level: ClassVar[int | None] = None

    def public(self) -> str:
        """What the HTTP answer says."""
        return str(self) if self.status < 500 else "internal error"

    def headers(self) -> dict[str, str]:
        return {}


class InputError(BotbouncerError, ValueError):
    """Input the client must fix: answered 400."""

    status = 400


class StartupError(BotbouncerError):
    """The daemon cannot start; the message says why and what to change.
    Exit status 2: started again as it is, it would fail again."""

    exit_status = 2


class StartupUnreachable(StartupError):
    """The daemon cannot start because something it needs did not answer (a
    platform, the store, a port still held): exit status 1, which a
    supervisor restarts (deploy/systemd), since it may answer in a moment."""

    exit_status = 1


class Unavailable(BotbouncerError):
    """Something the request needs is down or going away: answered 503."""

    status = 503

    def public(self) -> str:
        return str(self)
