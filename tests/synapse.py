"""A private Synapse homeserver for a test run, and helpers on its APIs.

`Synapse().start()` writes a minimal homeserver.yaml into a temp dir (server
name `localhost`, SQLite, one client listener on a free 127.0.0.1 port, no
federation listener, rate limits lifted, open registration off), starts
`python -m synapse.app.homeserver` with this interpreter and waits until
`/_matrix/client/versions` answers. `stop()` ends that process (SIGTERM, then
SIGKILL) and deletes the dir. Start and stop are synchronous, so a
session-scoped fixture can hold one server while each test runs on its own
event loop; the helpers are async and open an aiohttp session per call.

Users are made with the shared-secret admin registration API; everything else
goes through the client-server API as the user it is given.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib.util
import itertools
import json as json_module
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import yaml

from tests.redis_server import free_port

SERVER_NAME = "localhost"
# Rate limits no test should meet (Synapse's defaults allow e.g. 0.2 msg/s).
UNLIMITED = {"per_second": 10_000, "burst_count": 100_000}
INSTALL_HINT = (
    "Synapse is not installed in this interpreter's environment ({exe}); "
    "it comes with the dev extra:  pip install -e '.[dev]'"
)


@dataclass(frozen=True)
class User:
    user_id: str
    access_token: str
    device_id: str
    password: str

    @property
    def localpart(self) -> str:
        return self.user_id[1:].split(":", 1)[0]


class MatrixError(Exception):
    """A non-2xx answer from the homeserver."""

    def __init__(self, status: int, body: dict[str, Any], what: str) -> None:
        self.status = status
        self.errcode = str(body.get("errcode", ""))
        self.body = body
        super().__init__(f"{what}: HTTP {status} {self.errcode} {body.get('error', body)}")


class Synapse:
    """One Synapse process on a free 127.0.0.1 port, its state in a temp dir."""

    def __init__(self, *, server_name: str = SERVER_NAME, **overrides: Any) -> None:
        self.server_name = server_name
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.shared_secret = secrets.token_hex(16)
        self.dir = Path(tempfile.mkdtemp(prefix="bb-synapse-"))
        self.config_path = self.dir / "homeserver.yaml"
        self.log_path = self.dir / "homeserver.log"
        self.console_path = self.dir / "console.log"  # the process's stdout and stderr
        self.overrides = overrides  # top-level homeserver.yaml keys, e.g. for one test module
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_seconds: float | None = None
        self._txn = itertools.count()

    # -- the process ---------------------------------------------------------

    def config(self) -> dict[str, Any]:
        d = self.dir
        return {
            "server_name": self.server_name,
            "public_baseurl": self.base_url + "/",
            "pid_file": str(d / "homeserver.pid"),
            "listeners": [
                {
                    "port": self.port,
                    "bind_addresses": ["127.0.0.1"],
                    "type": "http",
                    "tls": False,
                    "x_forwarded": False,
                    "resources": [{"names": ["client"], "compress": False}],
                }
            ],
            "database": {"name": "sqlite3", "args": {"database": str(d / "homeserver.db")}},
            "log_config": str(d / "log.yaml"),
            "media_store_path": str(d / "media_store"),
            "signing_key_path": str(d / "signing.key"),
            "registration_shared_secret": self.shared_secret,
            "macaroon_secret_key": secrets.token_hex(16),
            "form_secret": secrets.token_hex(16),
            "enable_registration": False,
            "bcrypt_rounds": 4,  # password hashing at test speed
            "report_stats": False,
            "enable_metrics": False,
            "url_preview_enabled": False,
            "presence": {"enabled": False},
            # Never ask matrix.org (or anyone) for keys: no test reaches out.
            "trusted_key_servers": [],
            "suppress_key_server_warning": True,
            "federation_domain_whitelist": [],
            "rc_message": UNLIMITED,
            "rc_registration": UNLIMITED,
            "rc_login": {"address": UNLIMITED, "account": UNLIMITED, "failed_attempts": UNLIMITED},
            "rc_joins": {"local": UNLIMITED, "remote": UNLIMITED},
            "rc_joins_per_room": UNLIMITED,
            "rc_invites": {"per_room": UNLIMITED, "per_user": UNLIMITED, "per_issuer": UNLIMITED},
            "rc_room_creation": UNLIMITED,
            "rc_admin_redaction": UNLIMITED,
            "rc_presence": {"per_user": UNLIMITED},
            "rc_profile": UNLIMITED,
            "rc_user_directory": UNLIMITED,
            "rc_delayed_event_mgmt": UNLIMITED,
            "rc_reports": UNLIMITED,
            "rc_media_create": UNLIMITED,
            **self.overrides,
        }

    def _log_config(self) -> dict[str, Any]:
        return {
            "version": 1,
            "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
            "handlers": {
                "file": {
                    "class": "logging.FileHandler",
                    "filename": str(self.log_path),
                    "formatter": "plain",
                }
            },
            "root": {"level": "WARNING", "handlers": ["file"]},
            "disable_existing_loggers": False,
        }

    def _write_files(self) -> None:
        if importlib.util.find_spec("synapse") is None:
            raise RuntimeError(INSTALL_HINT.format(exe=sys.executable))
        from signedjson.key import generate_signing_key, write_signing_keys  # Synapse's own

        (self.dir / "media_store").mkdir()
        with open(self.dir / "signing.key", "w") as f:
            write_signing_keys(f, [generate_signing_key("a_" + secrets.token_hex(2))])
        (self.dir / "log.yaml").write_text(yaml.safe_dump(self._log_config()))
        self.config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))

    def start(self, timeout: float = 60.0) -> Synapse:
        """Start the homeserver and wait until its client API answers; on
        failure, RuntimeError quoting the log's tail (and nothing left over)."""
        begun = time.monotonic()
        try:
            self._write_files()
            with open(self.console_path, "wb") as console:  # the child keeps its own copy
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "synapse.app.homeserver", "-c", str(self.config_path)],
                    cwd=self.dir,
                    stdin=subprocess.DEVNULL,
                    stdout=console,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_die_with_parent if sys.platform == "linux" else None,
                )
            deadline = begun + timeout
            while not self._answers():
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"Synapse exited with {self.proc.returncode} while starting\n"
                        + self.log_tail()
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Synapse did not answer on {self.base_url} within {timeout:.0f} s\n"
                        + self.log_tail()
                    )
                time.sleep(0.05)  # polling a child process: nothing to await
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - begun
        return self

    def _answers(self) -> bool:
        # no proxies from the environment: this is 127.0.0.1
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(self.base_url + "/_matrix/client/versions", timeout=1) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def log_tail(self, lines: int = 30) -> str:
        out = []
        for path in (self.console_path, self.log_path):
            try:
                text = path.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            if text:
                out.append(f"--- {path.name} (last {len(text)} lines) ---\n" + "\n".join(text))
        return "\n".join(out) or "(Synapse wrote no log)"

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`; only the process this started."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Synapse:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- HTTP ----------------------------------------------------------------

    async def call(
        self,
        method: str,
        path: str,
        user: User | None = None,
        *,
        json: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """One request to the homeserver (`path` from /_matrix/... or
        /_synapse/...) as `user`; the JSON answer, or MatrixError."""
        headers = {"Authorization": f"Bearer {user.access_token}"} if user else {}
        async with (
            aiohttp.ClientSession() as http,
            http.request(
                method, self.base_url + path, json=json, params=params, headers=headers
            ) as resp,
        ):
            text = await resp.text()
        try:
            body = json_module.loads(text)
        except ValueError:
            body = {"error": text[:500]}
        if resp.status >= 300 or not isinstance(body, dict):
            what = f"{method} {path}"
            raise MatrixError(resp.status, body if isinstance(body, dict) else {}, what)
        return body

    def user_id(self, localpart: str) -> str:
        return f"@{localpart}:{self.server_name}"

    # -- users ---------------------------------------------------------------

    async def register(
        self, localpart: str, *, admin: bool = False, displayname: str | None = None
    ) -> User:
        """A new user through the shared-secret admin registration API."""
        path = "/_synapse/admin/v1/register"
        nonce = str((await self.call("GET", path))["nonce"])
        password = secrets.token_urlsafe(12)
        mac = hmac.new(self.shared_secret.encode(), digestmod=hashlib.sha1)
        for part in (nonce, localpart, password):
            mac.update(part.encode() + b"\x00")
        mac.update(b"admin" if admin else b"notadmin")
        body: dict[str, Any] = {
            "nonce": nonce,
            "username": localpart,
            "password": password,
            "admin": admin,
            "mac": mac.hexdigest(),
        }
        if displayname is not None:
            body["displayname"] = displayname
        got = await self.call("POST", path, json=body)
        return User(got["user_id"], got["access_token"], got["device_id"], password)

    # -- rooms ---------------------------------------------------------------

    async def create_room(
        self,
        user: User,
        *,
        invite: Sequence[User | str] = (),
        name: str | None = None,
        is_direct: bool = False,
        power_levels: dict[str, Any] | None = None,
        preset: str = "private_chat",
    ) -> str:
        """A new room made by `user`; `power_levels` overrides parts of the
        m.room.power_levels content (e.g. {"users": {...}})."""
        body: dict[str, Any] = {
            "preset": preset,
            "invite": [_uid(u) for u in invite],
            "is_direct": is_direct,
        }
        if name is not None:
            body["name"] = name
        if power_levels is not None:
            body["power_level_content_override"] = power_levels
        got = await self.call("POST", "/_matrix/client/v3/createRoom", user, json=body)
        return str(got["room_id"])

    async def invite(self, user: User, room_id: str, invitee: User | str) -> None:
        await self.call("POST", f"{_room(room_id)}/invite", user, json={"user_id": _uid(invitee)})

    async def join(self, user: User, room_id: str) -> None:
        await self.call("POST", f"/_matrix/client/v3/join/{quote(room_id, safe='')}", user, json={})

    async def leave(self, user: User, room_id: str) -> None:
        await self.call("POST", f"{_room(room_id)}/leave", user, json={})

    async def state(
        self, user: User, room_id: str, event_type: str, key: str = ""
    ) -> dict[str, Any]:
        return await self.call("GET", f"{_room(room_id)}/state/{event_type}/{key}", user)

    async def set_state(
        self, user: User, room_id: str, event_type: str, content: dict[str, Any], key: str = ""
    ) -> str:
        got = await self.call(
            "PUT", f"{_room(room_id)}/state/{event_type}/{key}", user, json=content
        )
        return str(got["event_id"])

    async def power_levels(self, user: User, room_id: str) -> dict[str, Any]:
        return await self.state(user, room_id, "m.room.power_levels")

    async def set_power_level(
        self, user: User, room_id: str, target: User | str, level: int
    ) -> str:
        """`user` sets `target`'s power level in the room; the event id."""
        content = await self.power_levels(user, room_id)
        content.setdefault("users", {})[_uid(target)] = level
        return await self.set_state(user, room_id, "m.room.power_levels", content)

    # -- events --------------------------------------------------------------

    async def send(self, user: User, room_id: str, event_type: str, content: dict[str, Any]) -> str:
        txn = f"bb{os.getpid()}-{next(self._txn)}"
        got = await self.call(
            "PUT", f"{_room(room_id)}/send/{event_type}/{txn}", user, json=content
        )
        return str(got["event_id"])

    async def send_text(
        self,
        user: User,
        room_id: str,
        body: str,
        *,
        msgtype: str = "m.text",
        mentions: Sequence[User | str] | None = None,
        mention_room: bool = False,
        thread_root: str | None = None,
        reply_to: str | None = None,
    ) -> str:
        """An m.room.message; `mentions` (users) and `mention_room` fill
        m.mentions, `thread_root` puts it in that thread (replying to
        `reply_to` if given), `reply_to` alone makes a plain reply."""
        content: dict[str, Any] = {"msgtype": msgtype, "body": body}
        if mentions is not None or mention_room:
            content["m.mentions"] = {"user_ids": [_uid(u) for u in mentions or ()]}
            if mention_room:
                content["m.mentions"]["room"] = True
        if thread_root is not None:
            content["m.relates_to"] = {
                "rel_type": "m.thread",
                "event_id": thread_root,
                "is_falling_back": reply_to is None,
                "m.in_reply_to": {"event_id": reply_to or thread_root},
            }
        elif reply_to is not None:
            content["m.relates_to"] = {"m.in_reply_to": {"event_id": reply_to}}
        return await self.send(user, room_id, "m.room.message", content)

    async def messages(self, user: User, room_id: str, limit: int = 20) -> list[dict[str, Any]]:
        """The room's last `limit` events as `user` sees them, oldest first."""
        got = await self.call(
            "GET", f"{_room(room_id)}/messages", user, params={"dir": "b", "limit": str(limit)}
        )
        return list(reversed(got["chunk"]))

    async def sync_once(
        self, user: User, since: str | None = None, timeout_ms: int = 0
    ) -> dict[str, Any]:
        """One /sync as `user` (long-polls up to `timeout_ms` when `since` is given)."""
        params = {"timeout": str(timeout_ms)}
        if since is not None:
            params["since"] = since
        return await self.call("GET", "/_matrix/client/v3/sync", user, params=params)


def _uid(user: User | str) -> str:
    return user.user_id if isinstance(user, User) else user


def _room(room_id: str) -> str:
    return f"/_matrix/client/v3/rooms/{quote(room_id, safe='')}"


def _die_with_parent() -> None:
    """In the child: SIGTERM when the test process dies, so a killed pytest
    leaves no homeserver behind (Linux prctl PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)
