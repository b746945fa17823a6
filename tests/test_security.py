"""Secrets and access (issue 8, item 6), each property caused and checked here:

1. Configured secrets (platform tokens, the admin token, API keys, webhook
   headers, the Telegram webhook secret, a Redis password, `${VAR}` values)
   never appear in log output, error messages or HTTP error bodies. Every test
   runs with the daemon's own log handler (`setup_logging`) at DEBUG, every
   library logger included, and scans what it wrote; a raw handler beside it
   shows that the secret really was in the records where a library prints it
   (so the test can fail).
2. The admin API with no token configured is closed (403), whatever is sent;
   with one, a missing or wrong token is 401 and the right one 200.
3. Secrets are compared with `hmac.compare_digest`, on bytes: the comparison
   decides, and odd header bytes are a refusal, never a 500.
4. The HTTP server binds 127.0.0.1 unless `http.listen` says otherwise.
"""

from __future__ import annotations

import ast
import asyncio
import base64
import hmac
import json
import logging
import re
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import aiohttp
import pytest
import yaml
import yarl
from aiohttp import web

import gateway.redact as redact_module
from gateway.cli import main as cli_main
from gateway.config import Config, load_config, parse_config
from gateway.daemon import Daemon, StartupError, reload_file
from gateway.llm import LLMError, chat_completion
from gateway.logs import JsonFormatter, setup_logging
from gateway.redact import MASK, RedactingFilter, Redactor, redact
from tests.fakes.discord import FakeDiscord, populate
from tests.fakes.llm import FakeLLM
from tests.fakes.telegram import FakeTelegram
from tests.fakes.webhook import FakeWebhook
from tests.redis_server import free_port

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]
# Loggers whose level is forced to DEBUG while a test captures (root is too).
LIBRARY_LOGGERS = ("aiohttp", "asyncio", "discord", "telegram", "httpx", "httpcore", "redis",
                   "botbouncer")  # fmt: skip
ADMIN_ROUTES = [  # (method, path under /v1/admin/chats/<chat>, body)
    ("GET", "", None),
    ("POST", "/reset", None),
    ("POST", "/pause", None),
    ("POST", "/resume", None),
    ("PUT", "/limits", '{"soft_limit": 1, "hard_limit": 2}'),
    ("GET", "/decisions", None),
]


# -- secrets and what a test captured ------------------------------------------------


class Secrets:
    """Distinctive secret values, and a scanner for every form they may take."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def new(self, name: str) -> str:
        value = f"sekrit-{name}-{uuid.uuid4().hex}"
        self.values[name] = value
        return value

    @staticmethod
    def forms(secret: str) -> dict[str, str]:
        core = secret.rsplit("-", 1)[-1]  # the uuid: survives any escaping or encoding
        return {
            "its first half": core[:12],  # also a secret cut short
            "its second half": core[-12:],
            "URL-encoded": quote(secret, safe=""),
            "form-encoded": quote_plus(secret),
            "base64": base64.b64encode(secret.encode()).decode().rstrip("="),
        }

    def found(self, text: str) -> list[str]:
        return [
            f"{name} ({form})"
            for name, value in self.values.items()
            for form, shown in self.forms(value).items()
            if shown in text
        ]

    def assert_absent(self, text: str, where: str) -> None:
        found = self.found(text)
        if found:
            needles = [s for v in self.values.values() for s in self.forms(v).values()]
            lines = [line for line in text.splitlines() if any(n in line for n in needles)]
            raise AssertionError(f"{where} shows {found}:\n" + "\n".join(lines[:10]))


class _Raw(logging.Handler):
    """Every record as it was logged, before the daemon's handler masked it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


class Captured:
    """What the daemon's log handler wrote (stderr), what a test saw otherwise
    (exception messages, HTTP bodies), and the unmasked records beside them."""

    def __init__(self, capsys: pytest.CaptureFixture[str], raw: _Raw) -> None:
        self._capsys = capsys
        self._raw = raw
        self._output = ""
        self.seen: list[str] = []

    def note(self, *texts: object) -> None:
        self.seen.extend(str(t) for t in texts)

    @property
    def output(self) -> str:
        out, err = self._capsys.readouterr()
        self._output += out + err
        return self._output

    @property
    def raw(self) -> str:
        return "\n".join(self._raw.lines)

    def assert_clean(self, secrets: Secrets) -> None:
        secrets.assert_absent(self.output, "the log output (stdout/stderr)")
        secrets.assert_absent("\n".join(self.seen), "an error message or HTTP body")


@pytest.fixture
def secrets() -> Secrets:
    return Secrets()


@pytest.fixture
def logs(request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]) -> Iterator[Captured]:
    """The daemon's own log set-up (`botbouncer run --log-level debug`), every
    library logger at DEBUG; param: the log format (default text)."""
    fmt = getattr(request, "param", "text")
    root = logging.getLogger()
    old = {name: logging.getLogger(name).level for name in LIBRARY_LOGGERS}
    old_root = root.level
    raw = _Raw()
    root.addHandler(raw)  # before the daemon's handler: it sees the records unmasked
    handler = setup_logging("debug", fmt)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG)
    try:
        yield Captured(capsys, raw)
    finally:
        root.removeHandler(handler)
        root.removeHandler(raw)
        root.setLevel(old_root)
        for name, level in old.items():
            logging.getLogger(name).setLevel(level)


def write_config(tmp_path: Path, data: dict[str, Any], name: str = "bb.yml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def listen() -> dict[str, str]:
    return {"listen": f"127.0.0.1:{free_port()}"}


@asynccontextmanager
async def started(config: Config) -> AsyncIterator[tuple[Daemon, str]]:
    daemon = Daemon(config)
    url = await daemon.start()
    try:
        yield daemon, url
    finally:
        await daemon.stop()


async def fetch(
    http: aiohttp.ClientSession, method: str, url: str, **kwargs: Any
) -> tuple[int, str]:
    async with http.request(method, url, **kwargs) as resp:
        return resp.status, await resp.text()


# -- 1. secrets never in logs or error messages ----------------------------------------

ALICE, GROUP, TG_BOT = 1001, -1001500, 7001


@pytest.mark.parametrize("logs", ["text", "json"], indirect=True)
async def test_telegram_tokens_and_the_webhook_secret_never_reach_the_logs(
    tmp_path: Path, logs: Captured, secrets: Secrets
) -> None:
    token = f"{TG_BOT}:{secrets.new('tg-token')}"
    hook_secret = secrets.new("tg-hook")
    admin = secrets.new("admin")
    wrong = secrets.new("wrong-bearer")  # what an attacker sends: never echoed either
    env = {"BB_TG_TOKEN": token, "BB_TG_HOOK": hook_secret, "BB_ADMIN": admin,
           "BB_REFUSED": f"{TG_BOT}:{secrets.new('tg-refused')}"}  # fmt: skip
    async with FakeTelegram() as fake:
        fake.add_bot(token, TG_BOT, "alpha_bot", "Alpha")
        fake.add_user(ALICE, "Alice", "alice")
        fake.add_chat(GROUP, "supergroup", "the group")
        fake.add_member(GROUP, ALICE)
        fake.add_member(GROUP, TG_BOT)

        def config(token_ref: str, api_base: str, port: int = 0, **extra: Any) -> Config:
            bot = {"name": "alpha", "platform": "telegram", "token": token_ref,
                   "api_base": api_base, "backend": {"type": "echo"}, **extra}  # fmt: skip
            http = {"listen": f"127.0.0.1:{port or free_port()}", "admin_token": "${BB_ADMIN}"}
            return load_config(write_config(tmp_path, {"http": http, "bots": [bot]}), env=env)

        # A token the Bot API refuses: it is in the URL of the getMe call.
        with pytest.raises(StartupError, match="Telegram refused the token") as refused:
            async with started(config("${BB_REFUSED}", fake.api_base)):
                pass
        # An api_base nothing listens on.
        dead = f"http://127.0.0.1:{free_port()}"
        with pytest.raises(StartupError, match="cannot reach the Bot API") as unreachable:
            async with started(config("${BB_TG_TOKEN}", dead)):
                pass
        logs.note(refused.value, unreachable.value)

        # Webhook mode, and a reply Telegram refuses with a text quoting the token.
        port = free_port()
        hook = f"http://127.0.0.1:{port}/v1/webhooks/alpha"
        tg = {"webhook_url": hook, "secret_token": "${BB_TG_HOOK}"}
        cfg = config("${BB_TG_TOKEN}", fake.api_base, port, telegram=tg)
        fake.fail_next("sendMessage", 400, f"Bad Request: no chat for bot{token}")
        async with started(cfg) as (d, url), aiohttp.ClientSession() as http:
            await fake.user_says(GROUP, ALICE, "@alpha_bot hello")
            # handled before Telegram's POST was answered, the failed send included
            await fake.wait_until(lambda: fake.webhook_attempts, what="the webhook delivery")
            await d.inflight.idle()
            assert fake.calls_of("sendMessage", token)[0].status == 400
            forged = {"update_id": 1, "message": {"message_id": 9, "date": 0,
                      "chat": {"id": GROUP, "type": "supergroup"}, "text": "hi"}}  # fmt: skip
            guess = {"X-Telegram-Bot-Api-Secret-Token": wrong}
            status, body = await fetch(http, "POST", hook, json=forged, headers=guess)
            assert status == 403
            logs.note(body)
            status, body = await fetch(http, "GET", f"{url}/v1/admin/chats/x",
                                       headers={"Authorization": f"Bearer {wrong}"})  # fmt: skip
            assert status == 401
            logs.note(body)

    # The situations happened: libraries did log the token and the hook secret
    # (httpx logs every Bot API URL at INFO; PTB logs setWebhook's parameters).
    assert secrets.values["tg-token"] in logs.raw
    assert secrets.values["tg-refused"] in logs.raw
    assert hook_secret in logs.raw
    assert "Telegram refused the message" in logs.output
    assert "/bot***/getMe" in logs.output  # the URL line, masked
    logs.assert_clean(secrets)


async def test_a_refused_discord_token_is_not_in_the_error_or_the_logs(
    tmp_path: Path, logs: Captured, secrets: Secrets
) -> None:
    env = {"BB_DC": secrets.new("discord")}
    async with FakeDiscord() as fake:
        populate(fake)
        for api_base, error in [
            (fake.api_base, "Discord refused the token"),
            (f"http://127.0.0.1:{free_port()}/api/v10", "cannot reach Discord"),
        ]:
            bot = {"name": "d", "platform": "discord", "token": "${BB_DC}",
                   "api_base": api_base, "backend": {"type": "echo"}}  # fmt: skip
            cfg = load_config(write_config(tmp_path, {"http": listen(), "bots": [bot]}), env=env)
            with pytest.raises(StartupError, match=error) as info:
                async with started(cfg):
                    pass
            logs.note(info.value)
    assert any(r.path == "/users/@me" and r.status == 401 for r in fake.requests)  # tried
    logs.assert_clean(secrets)


class EchoingServer:
    """An LLM endpoint and a webhook that fail and quote the request's headers
    back in their error bodies, as some proxies and debug endpoints do."""

    def __init__(self) -> None:
        self.authorization: list[str] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        headers = dict(request.headers)
        self.authorization.append(headers.get("Authorization", ""))
        kind = request.match_info["kind"]
        if kind == "padded":  # the key straddles the 200 characters an error quotes
            auth = headers.get("Authorization", "")
            return web.Response(text="x" * (200 - len(auth) // 2) + auth, status=500)
        if kind == "malformed":  # 200 but not JSON: "malformed response ..."
            return web.Response(text=f"<html>{json.dumps(headers)}</html>", status=200)
        body = {"error": {"message": "Incorrect API key provided", "request_headers": headers}}
        return web.json_response(body, status=502 if kind == "hook" else 401)

    async def __aenter__(self) -> EchoingServer:
        app = web.Application()
        app.router.add_post("/{kind}/v1/chat/completions", self._handle)
        app.router.add_post("/{kind}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def test_llm_and_webhook_errors_never_quote_a_configured_secret(
    tmp_path: Path, logs: Captured, secrets: Secrets
) -> None:
    names = ("wh", "wh-key", "oa", "oa-padded", "oa-malformed", "cl", "fake-oa", "fake-cl")
    env = {f"BB_{n.upper().replace('-', '_')}": secrets.new(n) for n in names}
    async with EchoingServer() as echo, FakeLLM() as llm:
        llm.require_key("not-the-configured-key")  # 401 to every call
        base = echo.url

        def bot(name: str, **settings: Any) -> dict[str, Any]:
            return {"name": name, "platform": "http", "respond_to": "all",
                    "backend": {"type": "echo"}, **settings}  # fmt: skip

        def openai(endpoint: str, key: str) -> dict[str, Any]:
            return {"type": "openai", "endpoint": endpoint, "api_key": key, "model": "m"}

        def classifier(endpoint: str, key: str) -> dict[str, Any]:
            return {"enabled": True, "endpoint": endpoint, "api_key": key, "model": "m"}

        bots = [
            bot("wh", backend={"type": "webhook", "url": f"{base}/hook", "headers": {
                "Authorization": "Bearer ${BB_WH}", "X-Api-Key": "${BB_WH_KEY}"}}),
            bot("oa", backend=openai(f"{base}/echo/v1", "${BB_OA}")),
            bot("oa-padded", backend=openai(f"{base}/padded/v1", "${BB_OA_PADDED}")),
            bot("oa-malformed", backend=openai(f"{base}/malformed/v1", "${BB_OA_MALFORMED}")),
            bot("cl", reply_decision=classifier(f"{base}/echo/v1", "${BB_CL}")),
            bot("fake-oa", backend=openai(llm.base_url, "${BB_FAKE_OA}")),
            bot("fake-cl", reply_decision=classifier(llm.base_url, "${BB_FAKE_CL}")),
        ]  # fmt: skip
        cfg = load_config(write_config(tmp_path, {"http": listen(), "bots": bots}), env=env)
        async with started(cfg) as (_, url), aiohttp.ClientSession() as http:
            for b in bots:
                msg = {"chat": "room", "author": "alice", "text": f"hello {b['name']}"}
                status, body = await fetch(http, "POST", f"{url}/v1/bots/{b['name']}/messages",
                                           json=msg)  # fmt: skip
                assert status == 200, body
                logs.note(body)
                answer = json.loads(body)
                if b["name"] in ("cl", "fake-cl"):  # the reply decision failed open
                    assert answer["action"] == "reply", answer
                else:
                    assert answer["reason"] == "backend_error", answer

    # Every key went out, and the echoing endpoints sent it back.
    sent = "\n".join(echo.authorization + [c.headers.get("authorization", "") for c in llm.calls])
    for name in names:
        if name != "wh-key":
            assert secrets.values[name] in sent, name
    assert "failed open (REPLY): HTTP 401" in logs.output
    assert "webhook answered HTTP 502" in logs.output
    assert "malformed response" in logs.output
    # Masked where the error message is built: not even the raw records hold them.
    secrets.assert_absent(logs.raw, "the log records (before the log filter)")
    logs.assert_clean(secrets)


def derived_forms(secret: str, user: str) -> dict[str, str]:
    """What a request made of `secret` carries: a Basic header of `user:secret`
    (aiohttp's, for a password in a URL's user info), its credential alone in
    either base64 alphabet, padded or not, and a Bearer header."""
    forms = {"Bearer": f"Bearer {secret}"}
    for alphabet, encode in (("standard", base64.b64encode),
                             ("urlsafe", base64.urlsafe_b64encode)):  # fmt: skip
        for what, raw in (("user:secret", f"{user}:{secret}"), ("secret", secret)):
            encoded = encode(raw.encode()).decode()
            forms[f"base64 {alphabet} of {what}"] = encoded
            forms[f"base64 {alphabet} of {what}, unpadded"] = encoded.rstrip("=")
    return forms


@pytest.mark.parametrize("logs", ["text", "json"], indirect=True)
async def test_a_webhook_url_password_and_the_basic_header_made_of_it_never_reach_the_logs(
    tmp_path: Path, logs: Captured, secrets: Secrets, hook: FakeWebhook
) -> None:
    """Finding 6: `url: http://user:${SECRET}@host/hook`, a plain str field, and a
    webhook that answers 401 quoting the Authorization header aiohttp made of
    the URL's user info. The password has characters a URL must encode (so it
    is written encoded, and aiohttp decodes it) and ones yarl leaves as they
    are."""
    user = "bb-user"
    password = f"p@ss:w/rd+$ !-{uuid.uuid4().hex}"
    secrets.values["webhook-url-password"] = password
    env = {"BB_WH_PASS": quote(password, safe="")}

    async def echo_authorization(_: asyncio.Event) -> web.StreamResponse:
        return web.Response(text=f"bad key: {hook.headers[-1].get('Authorization')}", status=401)

    hook.default = echo_authorization
    url = hook.url.replace("http://", f"http://{user}:${{BB_WH_PASS}}@")
    bot = {"name": "wh", "platform": "http", "respond_to": "all",
           "backend": {"type": "webhook", "url": url}}  # fmt: skip
    cfg = load_config(write_config(tmp_path, {"http": listen(), "bots": [bot]}), env=env)
    async with started(cfg) as (_, base), aiohttp.ClientSession() as http:
        msg = {"chat": "room", "author": "alice", "text": "hello"}
        status, body = await fetch(http, "POST", f"{base}/v1/bots/wh/messages", json=msg)
        assert status == 200 and json.loads(body)["reason"] == "backend_error", body
        logs.note(body)

    basic = base64.b64encode(f"{user}:{password}".encode()).decode()
    assert [h.get("Authorization") for h in hook.headers] == [f"Basic {basic}"]
    # Masked where the error message was built: not even the records before the
    # log filter hold it ...
    for where, text in (("log output", logs.output), ("log records", logs.raw)):
        for line in text.splitlines():
            for form, shown in derived_forms(password, user).items():
                assert shown not in line, f"the {where} shows the {form}: {line}"
    logs.assert_clean(secrets)
    secrets.assert_absent(logs.raw, "the log records (before the log filter)")
    # ... and the echo did reach the log (so the test can fail).
    assert "webhook answered HTTP 401: 'bad key: Basic ***'" in logs.output


def test_the_password_of_every_configured_url_is_a_secret_as_written_and_decoded() -> None:
    """Plain str fields too: a webhook `url`, an OpenAI `endpoint`, the store
    `url`, Telegram's `webhook_url`, `api_base`; the password as the URL spells
    it (percent-encoded) and as a client sends it (decoded)."""
    words = {n: f"{n}-p@ss:{uuid.uuid4().hex}" for n in
             ("webhook", "openai", "store", "tg-hook", "api-base", "query")}  # fmt: skip
    enc = {n: quote(w, safe="") for n, w in words.items()}
    bots = [
        {"name": "w", "platform": "http",
         "backend": {"type": "webhook", "url": f"http://u:{enc['webhook']}@h.example/hook"}},
        {"name": "o", "platform": "http",
         "backend": {"type": "openai", "endpoint": f"https://u:{enc['openai']}@h.example/v1",
                     "model": "m"}},
        {"name": "t", "platform": "telegram", "token": "1:abcd",
         "api_base": f"https://:{enc['api-base']}@h.example",
         "backend": {"type": "webhook", "url": f"http://h.example/?password={enc['query']}"},
         "telegram": {"webhook_url": f"https://bot:{enc['tg-hook']}@h.example/v1/webhooks/t",
                      "secret_token": "hook-secret"}},
    ]  # fmt: skip
    store = {"url": f"redis://:{enc['store']}@127.0.0.1:6379/0"}
    found = redact_module.secret_values(parse_config(yaml.safe_dump({"store": store,
                                                                     "bots": bots})))  # fmt: skip
    for name, word in words.items():
        assert {word, enc[name]} <= found, name


def test_the_redactor_masks_the_forms_a_request_makes_of_a_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(redact_module, "SECRETS", Redactor())
    secret = f"p@ss w!rd$+é/.-{uuid.uuid4().hex}"
    core = secret.rsplit("-", 1)[1]
    redactor = Redactor([secret])
    texts = {
        f"Basic with user {user!r}: {form}": f"Authorization: Basic {shown}, next"
        for user in ("", "u", "us", "use", "bb-user")
        for form, shown in derived_forms(secret, user).items()
        if form != "Bearer"
    }
    texts.update({
        "Bearer": f"Authorization: Bearer {secret}",
        "base64 with more after it": base64.b64encode(f"u:{secret}:more".encode()).decode(),
        "yarl's user info (keeps !$+, encodes @ space é /)":
            str(yarl.URL.build(scheme="http", host="h", user="u", password=secret)),
        "yarl's query": str(yarl.URL("http://h/").with_query(password=secret)),
        "lower-case percent": quote(secret, safe="").lower(),
        "mixed percent": quote(secret, safe="").replace("%40", "@").replace("%21", "!"),
    })  # fmt: skip
    for what, text in texts.items():
        masked = redactor(text)
        assert MASK in masked, what
        assert core[:8] not in masked and core[-8:] not in masked, (what, masked)
        for form, shown in derived_forms(secret, "u").items():
            assert shown.rstrip("=")[-12:] not in masked, (what, form, masked)
    assert redactor(texts["Basic with user 'bb-user': base64 standard of user:secret"]) == (
        f"Authorization: Basic {MASK}, next"
    )
    plain = "decision bot=b chat=http:room id=m1 author=alice action=reply reason=- turn=human"
    assert redactor(plain) == plain


async def test_an_llm_error_masks_the_key_before_it_is_cut_short(secrets: Secrets) -> None:
    key = secrets.new("key")
    async with EchoingServer() as echo, aiohttp.ClientSession() as http:
        for kind in ("echo", "padded", "malformed"):
            with pytest.raises(LLMError) as info:
                await chat_completion(
                    http, f"{echo.url}/{kind}/v1/chat/completions", model="m",
                    messages=[], max_tokens=1, timeout_seconds=5, api_key=key,
                )  # fmt: skip
            assert MASK in str(info.value), (kind, str(info.value))
            secrets.assert_absent(str(info.value), f"the LLMError of {kind}")
    assert echo.authorization == [f"Bearer {key}"] * 3


@pytest.mark.parametrize(
    "url",
    [
        "redis://:${BB_REDIS}@127.0.0.1:{port}/0",
        "redis://botbouncer:${BB_REDIS}@127.0.0.1:{port}/0",
        "redis://127.0.0.1:{port}/0?password=${BB_REDIS}",
        # the sentinels' own password (docs/operations.md, Sentinel)
        "redis+sentinel://127.0.0.1:{port}/mymaster?sentinel_password=${BB_REDIS}",
    ],
)
async def test_an_unreachable_redis_never_shows_its_password(
    tmp_path: Path, logs: Captured, secrets: Secrets, url: str
) -> None:
    env = {"BB_REDIS": secrets.new("redis"), "BB_ADMIN": secrets.new("admin")}
    store = {"url": url.replace("{port}", str(free_port()))}  # nothing listens there
    bot = {"name": "h", "platform": "http", "backend": {"type": "echo"}, "respond_to": "all"}
    http_cfg = {**listen(), "admin_token": "${BB_ADMIN}"}
    cfg = load_config(write_config(tmp_path, {"store": store, "http": http_cfg, "bots": [bot]}),
                      env=env)  # fmt: skip
    auth = {"Authorization": f"Bearer {env['BB_ADMIN']}"}
    async with started(cfg) as (d, url_), aiohttp.ClientSession() as http:
        msg = {"chat": "room", "author": "alice", "text": "hello"}
        status, body = await fetch(http, "POST", f"{url_}/v1/bots/h/messages", json=msg)
        assert status == 200, body  # answered from memory while Redis is away
        logs.note(body)
        status, body = await fetch(http, "GET", f"{url_}/healthz")
        assert status == 200 and json.loads(body)["status"] == "degraded", body
        logs.note(body)
        status, body = await fetch(http, "POST", f"{url_}/v1/admin/chats/room/pause", headers=auth)
        logs.note(status, body)
        logs.note(repr(d.config), repr(d.config.store))
    assert "store degraded" in logs.output
    logs.assert_clean(secrets)


def test_check_config_errors_never_echo_a_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], secrets: Secrets
) -> None:
    token, admin = secrets.new("token"), secrets.new("admin")
    env_secret = secrets.new("env")
    bad_hook = secrets.new("hook")
    proxy_pw = secrets.new("proxy")

    def bot(**extra: Any) -> dict[str, Any]:
        return {"name": "t", "platform": "telegram", "token": token,
                "backend": {"type": "echo"}, **extra}  # fmt: skip

    configs = {
        # a secret beside a wrong value elsewhere
        "wrong-type": {"http": {"admin_token": admin}, "bots": [bot(turns=0)]},
        # a secret that is itself invalid (not Telegram's secret_token alphabet)
        "bad-secret-token": {"bots": [bot(telegram={"webhook_url": "https://x.example/h",
                                                    "secret_token": f"{bad_hook}!"})]},
        # a secret where a different type is expected
        "secret-as-number": {"bots": [bot(shard_count="${BB_ENV}")]},
        "secret-in-a-list": {"bots": [bot(token=[token])]},
        # a proxy URL with a password, in the wrong scheme
        "gateway-url": {"bots": [{**bot(platform="discord"),
                                  "gateway_url": f"https://u:{proxy_pw}@proxy.example/"}]},
        # a Redis URL with a password and a bad port
        "redis-port": {"store": {"url": f"redis://:{admin}@localhost:notaport/0"},
                       "bots": [bot()]},
    }  # fmt: skip
    for name, data in configs.items():
        path = write_config(tmp_path, data, f"{name}.yml")
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("BB_ENV", env_secret)
            assert cli_main(["check-config", "-c", str(path)]) == 2, name
        out, err = capsys.readouterr()
        assert "invalid configuration" in err, (name, err)
        secrets.assert_absent(out + err, f"check-config of {name}")
    # A YAML error on the line that holds the secret.
    path = tmp_path / "yaml.yml"
    path.write_text(f'bots:\n  - {{name: t, token: "{token}\n')
    assert cli_main(["check-config", "-c", str(path)]) == 2
    out, err = capsys.readouterr()
    assert "line" in err
    secrets.assert_absent(out + err, "check-config of broken YAML")


async def run_command(*args: str, env: dict[str, str]) -> tuple[int, str]:
    """`python -m gateway ARGS` as a process; its exit status and all it printed."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", *args,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=ROOT, env={**env, "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    async with asyncio.timeout(30):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, (out + err).decode("utf-8", "replace")


async def test_the_real_command_masks_secrets_in_every_line_it_prints(
    tmp_path: Path, secrets: Secrets
) -> None:
    """`botbouncer run --log-level debug` as a process: its own log set-up,
    `${VAR}` from its environment, and the StartupError it prints."""
    env = {"BB_TG_TOKEN": f"{TG_BOT}:{secrets.new('tg-token')}",
           "BB_PROXY_PW": secrets.new("proxy-password")}  # fmt: skip
    async with FakeTelegram() as fake:  # knows no bot: every token is refused
        bot = {"name": "alpha", "platform": "telegram", "token": "${BB_TG_TOKEN}",
               "api_base": fake.api_base, "backend": {"type": "echo"}}  # fmt: skip
        path = write_config(tmp_path, {"http": listen(), "bots": [bot]})
        code, text = await run_command("run", "-c", str(path), "--log-level", "debug", env=env)
        assert fake.calls_of("getMe")  # the token was really sent
    assert code == 2, text
    assert "botbouncer: bot alpha: Telegram refused the token" in text
    assert "/bot***/getMe" in text, text  # httpx's URL line, masked
    secrets.assert_absent(text, "`botbouncer run` output (refused token)")

    # An API proxy with a password in its URL, unreachable: the error names the URL.
    bot["api_base"] = f"http://bb:${{BB_PROXY_PW}}@127.0.0.1:{free_port()}"
    path = write_config(tmp_path, {"http": listen(), "bots": [bot]})
    code, text = await run_command("run", "-c", str(path), "--log-level", "debug", env=env)
    assert code == 1, text  # unreachable: a supervisor tries again
    assert "botbouncer: bot alpha: cannot reach the Bot API at http://bb:***@127.0.0.1" in text
    secrets.assert_absent(text, "`botbouncer run` output (unreachable proxy)")


def test_the_log_filter_masks_every_form_in_messages_and_tracebacks(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # none of the secrets earlier tests' configs left in the process-wide set
    monkeypatch.setattr(redact_module, "SECRETS", Redactor())
    secret = 'p@ss/w:rd+"é-' + uuid.uuid4().hex
    redactor = Redactor([secret, "abc"])  # 3 characters: too short to mask
    forms = [secret, quote(secret, safe=""), quote(secret).lower(), quote_plus(secret),
             json.dumps(secret)[1:-1], repr(secret.encode())[2:-1],
             base64.b64encode(secret.encode()).decode()]  # fmt: skip
    for form in forms:
        assert redactor(f"<{form}>") == f"<{MASK}>", form
    assert redactor("abc") == "abc"
    assert redact("Bearer xyz1234 and xyz1234", ["Bearer xyz1234"]) == f"{MASK} and {MASK}"

    for formatter in (logging.Formatter("%(message)s"), JsonFormatter()):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(formatter)
        handler.addFilter(RedactingFilter(redactor))
        log = logging.getLogger(f"tests.security.{uuid.uuid4().hex}")
        log.propagate = False
        log.addHandler(handler)
        log.setLevel(logging.DEBUG)
        try:
            raise RuntimeError(f"failed with {secret}")
        except RuntimeError:
            log.exception("calling %s", quote(secret, safe=""))
        log.warning("bad call %s %s", secret)  # a malformed call: its arguments too
        log.removeHandler(handler)
    err = capsys.readouterr().err
    assert MASK in err and "RuntimeError" in err and "bad call" in err
    assert secret not in err and secret.rsplit("-", 1)[1] not in err
    assert quote(secret, safe="") not in err


async def test_a_secret_that_arrives_with_a_reload_is_masked_from_then_on(
    tmp_path: Path, logs: Captured, secrets: Secrets
) -> None:
    bot = {"name": "h", "platform": "http", "backend": {"type": "echo"}}
    path = write_config(tmp_path, {"http": listen(), "bots": [bot]})
    daemon = Daemon(load_config(path))
    try:
        hook = {"type": "webhook", "url": "http://127.0.0.1:9/hook",
                "headers": {"Authorization": f"Bearer {secrets.new('new-hook')}"}}  # fmt: skip
        write_config(tmp_path, {"http": daemon.config.http.model_dump(mode="json"),
                                "bots": [{**bot, "backend": hook}]})  # fmt: skip
        reload_file(daemon, str(path))  # what SIGHUP runs
        assert daemon.config.bots[0].backend.type == "webhook"
        logging.getLogger("botbouncer.test").warning("sent %s", secrets.values["new-hook"])
    finally:
        await daemon.stop()
    assert f"sent {MASK}\n" in logs.output
    logs.assert_clean(secrets)


# -- 2. the admin API is closed without a token ---------------------------------------


async def test_without_an_admin_token_the_admin_api_is_closed_and_changes_nothing(
    tmp_path: Path,
) -> None:
    bot = {"name": "h", "platform": "http", "backend": {"type": "echo"}, "respond_to": "all"}
    # `${VAR:-}` of an unset variable: the example config's way of leaving it closed
    http_cfg = {**listen(), "admin_token": "${BB_UNSET_ADMIN_TOKEN:-}"}
    cfg = load_config(write_config(tmp_path, {"http": http_cfg, "bots": [bot]}), env={})
    assert cfg.http.admin_token is None
    async with started(cfg) as (d, url), aiohttp.ClientSession() as http:
        chat = "room"
        msg = {"chat": chat, "author": "alice", "text": "hello"}
        status, text = await fetch(http, "POST", f"{url}/v1/bots/h/messages", json=msg)
        assert json.loads(text)["action"] == "reply"
        before = await d.server.admins["h"].status(f"http:{chat}")
        for authorization in (None, "", "Bearer ", "Bearer x", "Bearer " + "é" * 100, "Basic a"):
            headers = {} if authorization is None else {"Authorization": authorization}
            for method, path, body in ADMIN_ROUTES:
                status, text = await fetch(http, method, f"{url}/v1/admin/chats/{chat}{path}",
                                           data=body, headers=headers)  # fmt: skip
                assert status == 403, (authorization, method, path, text)
                assert "http.admin_token" in json.loads(text)["error"]
        after = await d.server.admins["h"].status(f"http:{chat}")
        assert after == before and not after.paused
        status, text = await fetch(http, "POST", f"{url}/v1/bots/h/messages", json=msg)
        assert json.loads(text)["action"] == "reply"  # not paused


async def test_with_an_admin_token_missing_and_wrong_are_401_and_right_is_200(
    tmp_path: Path, secrets: Secrets
) -> None:
    admin = secrets.new("admin")
    bot = {"name": "h", "platform": "http", "backend": {"type": "echo"}}
    http_cfg = {**listen(), "admin_token": "${BB_ADMIN}"}
    cfg = load_config(write_config(tmp_path, {"http": http_cfg, "bots": [bot]}),
                      env={"BB_ADMIN": admin})  # fmt: skip
    async with started(cfg) as (d, url), aiohttp.ClientSession() as http:
        pause = f"{url}/v1/admin/chats/room/pause"
        for headers in ({}, {"Authorization": f"Bearer {admin[:-1]}"},
                        {"Authorization": f"Bearer {admin}x"}, {"Authorization": f"Basic {admin}"},
                        {"Authorization": admin}):  # fmt: skip
            async with http.post(pause, headers=headers) as resp:
                assert resp.status == 401, headers
                assert resp.headers["WWW-Authenticate"].startswith("Bearer")
                secrets.assert_absent(await resp.text(), "a 401 body")
        assert not (await d.server.admins["h"].status("http:room")).paused
        right = {"Authorization": f"Bearer {admin}"}
        status, text = await fetch(http, "POST", pause, headers=right)
        assert status == 200, text
        assert (await d.server.admins["h"].status("http:room")).paused


# -- 3. constant-time comparisons ------------------------------------------------------


class Recorder:
    """Stands in for hmac.compare_digest: records each call; answers as the
    real one would, or as forced."""

    def __init__(self, forced: bool | None = None) -> None:
        self.calls: list[tuple[object, object]] = []
        self.forced = forced
        self.real = hmac.compare_digest

    def __call__(self, a: Any, b: Any) -> bool:
        self.calls.append((a, b))
        return self.real(a, b) if self.forced is None else self.forced


async def test_the_admin_token_is_checked_by_compare_digest_on_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = "admin-" + uuid.uuid4().hex
    bot = {"name": "h", "platform": "http", "backend": {"type": "echo"}}
    cfg = parse_config(yaml.safe_dump({"http": {**listen(), "admin_token": token},
                                       "bots": [bot]}))  # fmt: skip
    status_url = "/v1/admin/chats/room"
    async with started(cfg) as (_, url), aiohttp.ClientSession() as http:
        recorder = Recorder()
        monkeypatch.setattr(hmac, "compare_digest", recorder)
        status, _ = await fetch(http, "GET", url + status_url,
                                headers={"Authorization": "Bearer wrong"})  # fmt: skip
        assert status == 401
        assert recorder.calls == [(b"wrong", token.encode())]
        # It alone decides: forced, it refuses the right token and admits a wrong one.
        monkeypatch.setattr(hmac, "compare_digest", Recorder(forced=False))
        right = {"Authorization": f"Bearer {token}"}
        assert (await fetch(http, "GET", url + status_url, headers=right))[0] == 401
        monkeypatch.setattr(hmac, "compare_digest", Recorder(forced=True))
        wrong = {"Authorization": "Bearer wrong"}
        assert (await fetch(http, "GET", url + status_url, headers=wrong))[0] == 200
        monkeypatch.undo()
        # Odd bytes, non-ASCII and huge values are a refusal, never a 500.
        for value in (b"Bearer \xff\xfe", "Bearer é€😀".encode(), b"Bearer " + b"\x80" * 7000,
                      b"Bearer " + b"a" * 8000, b"\xff", b""):  # fmt: skip
            assert await raw_status(url, status_url, b"Authorization", value) == 401, value
        # Longer than aiohttp takes in one header: refused by the parser, still no 5xx.
        too_long = await raw_status(url, status_url, b"Authorization", b"Bearer " + b"a" * 9000)
        assert 400 <= too_long < 500


async def raw_status(url: str, path: str, name: bytes, value: bytes, body: bytes = b"") -> int:
    """The status of a request whose header bytes are sent as they are."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    method = b"POST" if body else b"GET"
    writer.write(method + b" " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                 + name + b": " + value + b"\r\nContent-Type: application/json\r\n"
                 + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)  # fmt: skip
    await writer.drain()
    answer = await reader.read()
    writer.close()
    await writer.wait_closed()
    return int(answer.split(b" ", 2)[1])


async def test_the_telegram_webhook_secret_is_checked_by_compare_digest_on_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    token, secret = f"{TG_BOT}:tok", "hook_" + uuid.uuid4().hex
    async with FakeTelegram() as fake:
        fake.add_bot(token, TG_BOT, "alpha_bot", "Alpha")
        port = free_port()
        hook = "/v1/webhooks/alpha"
        bot = {"name": "alpha", "platform": "telegram", "token": token,
               "api_base": fake.api_base, "backend": {"type": "echo"},
               "telegram": {"webhook_url": f"http://127.0.0.1:{port}{hook}",
                            "secret_token": secret}}  # fmt: skip
        cfg = parse_config(yaml.safe_dump({"http": {"listen": f"127.0.0.1:{port}"},
                                           "bots": [bot]}))  # fmt: skip
        update = json.dumps({"update_id": 5}).encode()  # no message: handled as nothing
        async with started(cfg) as (_, url):
            recorder = Recorder()
            monkeypatch.setattr(hmac, "compare_digest", recorder)
            name = b"X-Telegram-Bot-Api-Secret-Token"
            assert await raw_status(url, hook, name, b"guess", update) == 403
            assert recorder.calls == [(b"guess", secret.encode())]
            monkeypatch.setattr(hmac, "compare_digest", Recorder(forced=False))
            assert await raw_status(url, hook, name, secret.encode(), update) == 403
            monkeypatch.setattr(hmac, "compare_digest", Recorder(forced=True))
            assert await raw_status(url, hook, name, b"guess", update) == 200
            monkeypatch.undo()
            assert await raw_status(url, hook, name, secret.encode(), update) == 200
            for value in (b"\xff\xfe", "é€😀".encode(), b"\x80" * 7000, b"a" * 8000, b""):
                assert await raw_status(url, hook, name, value, update) == 403, value


def test_no_secret_is_compared_with_equality_operators() -> None:
    """Every comparison in gateway/ and adapters/ whose operand names a token,
    secret, password, API key or authorization header; hmac.compare_digest is
    the only way such a value may be checked."""
    suspicious = re.compile(r"token|secret|passw|api_?key|authoriz|bearer", re.IGNORECASE)
    found = []
    for path in sorted([*ROOT.glob("gateway/**/*.py"), *ROOT.glob("adapters/**/*.py")]):
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Compare):
                continue
            if not any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops):
                continue
            operands = [node.left, *node.comparators]
            named = [ast.unparse(o) for o in operands if not isinstance(o, ast.Constant)]
            if any(suspicious.search(n) for n in named):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []
    uses = {p.relative_to(ROOT).as_posix() for p in [*ROOT.glob("gateway/**/*.py"),
            *ROOT.glob("adapters/**/*.py")] if "hmac.compare_digest(" in p.read_text()}  # fmt: skip
    assert uses == {"gateway/api/admin.py", "adapters/telegram.py"}


# -- 4. the HTTP server binds 127.0.0.1 unless told otherwise ---------------------------

MINIMAL = "bots:\n  - {name: h, platform: http, backend: {type: echo}}\n"


def test_the_default_and_the_example_config_listen_on_loopback_only() -> None:
    for cfg in (parse_config(MINIMAL), load_config(ROOT / "config.example.yml", env={}),
                Config.default()):  # fmt: skip
        assert (cfg.http.listen, cfg.http.host) == ("127.0.0.1:8080", "127.0.0.1")
    # `make run` runs the example config unless told otherwise
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^CONFIG \?= config\.example\.yml$", makefile, re.MULTILINE)
    assert re.search(r"^run:.*\n\t\$\(BIN\)/botbouncer run -c \$\(CONFIG\)$", makefile,
                     re.MULTILINE)  # fmt: skip


def bound(d: Daemon) -> list[tuple[str, int]]:
    runner = d._runner
    assert runner is not None
    return [(str(a[0]), int(a[1])) for a in runner.addresses]


async def test_a_daemon_on_the_default_host_is_bound_to_127_0_0_1() -> None:
    default = parse_config(MINIMAL)
    port = free_port()
    cfg = default.model_copy(
        update={"http": default.http.model_copy(update={"listen": f"{default.http.host}:{port}"})}
    )
    async with started(cfg) as (d, url):
        assert bound(d) == [("127.0.0.1", port)]
        assert url == f"http://127.0.0.1:{port}"


async def test_another_listen_address_is_honoured(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # another loopback address, really bound (Linux routes all of 127/8 to lo)
    port = free_port()
    async with started(parse_config(MINIMAL + f'http: {{listen: "127.0.0.2:{port}"}}\n')) as (d, _):
        assert bound(d) == [("127.0.0.2", port)]
    assert "beyond this machine" not in caplog.text  # loopback: nothing to warn about
    # "0.0.0.0": what reaches the socket layer, without opening a port to the network
    asked: list[tuple[object, object]] = []
    real_site = web.TCPSite

    def site(runner: Any, host: str, port: int, **kwargs: Any) -> web.TCPSite:
        asked.append((host, port))
        return real_site(runner, "127.0.0.1", port, **kwargs)

    monkeypatch.setattr(web, "TCPSite", site)
    port = free_port()
    async with started(parse_config(MINIMAL + f'http: {{listen: "0.0.0.0:{port}"}}\n')):
        pass
    assert asked == [("0.0.0.0", port)]
    # and the operator is told the ingress and guard API are now open to the network
    assert f"listening on 0.0.0.0:{port} beyond this machine" in caplog.text
