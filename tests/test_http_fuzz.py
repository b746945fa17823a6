"""Fuzzing the HTTP server (docs/http-api.md): whatever a client sends, the answer is
never a 5xx, every 4xx is JSON with an "error" string, and the server keeps
serving afterwards.

Each test starts one daemon (memory store, an http echo bot, an admin token) on
an event loop it owns, and a synchronous hypothesis test drives it example after
example on that loop; the server lives for the whole test function.

Inputs that once broke it (lone surrogates, integers past Python's digit
limit, huge windows, braces in chat ids) are pinned as regression tests at the
end of this file.
More examples: BOTBOUNCER_FUZZ_EXAMPLES=2000 pytest tests/test_http_fuzz.py
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gateway.admin import JSON_LIMIT_KEYS, LIMIT_KEYS, AdminError
from gateway.config import parse_config
from gateway.daemon import Daemon
from gateway.fields import MAX_COUNT
from gateway.guard.openapi import OPENAPI
from gateway.replay import ReplayError, parse_line
from gateway.wire import FIELDS
from tests.conftest import delete_prefix
from tests.daemons import redis_of

TOKEN = "fuzz-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CONFIG = f"""
http: {{admin_token: {TOKEN}}}
bots:
  - {{name: alpha, platform: http, backend: {{type: echo}}, bot_messages: all, respond_to: all}}
"""
EXAMPLES = int(os.environ.get("BOTBOUNCER_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
        HealthCheck.filter_too_much,
    ],
)


# -- the server under test ---------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Server:
    """A daemon and a client on this object's own event loop."""

    def __init__(self, config: str = CONFIG, prefix: str | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.prefix = prefix
        self.daemon, self.client = self.loop.run_until_complete(self._start(config, prefix))

    @staticmethod
    async def _start(config: str, prefix: str | None) -> tuple[Daemon, TestClient]:  # type: ignore[type-arg]
        daemon = Daemon(parse_config(config))
        if prefix is not None:
            redis_of(daemon).prefix = prefix  # this test's keys, deleted at close
        for adapter in daemon.adapters:
            await adapter.start()
        client = TestClient(TestServer(daemon.server.app))
        await client.start_server()
        return daemon, client

    def request(
        self,
        method: str,
        path: str,
        data: str | bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        return self.loop.run_until_complete(self._request(method, path, data, headers))

    async def _request(
        self, method: str, path: str, data: str | bytes | None, headers: dict[str, str] | None
    ) -> Answer:
        resp = await self.client.request(method, path, data=data, headers=headers)
        try:
            return Answer(resp.status, resp.content_type, await resp.read())
        finally:
            resp.release()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def assert_alive(self) -> None:
        health = self.request("GET", "/healthz")
        assert (health.status, health.json()) == (200, {"status": "ok", "store": "memory"})
        hello = json.dumps({"chat": "alive", "author": "zed", "text": "ok?"})
        answer = self.request("POST", "/v1/bots/alpha/messages", hello)
        assert answer.status == 200
        assert answer.json()["action"] in ("reply", "drop")
        assert self.request("GET", "/v1/admin/chats/alive", headers=AUTH).status == 200

    def close(self) -> None:
        async def stop() -> None:
            await self.client.close()
            if self.prefix is not None:
                await delete_prefix(redis_of(self.daemon), self.prefix)
            await self.daemon.stop()

        self.loop.run_until_complete(stop())
        self.loop.close()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    try:
        yield s
    finally:
        s.close()


def check(answer: Answer) -> None:
    """Never a 5xx; a 4xx is {"error": "<message>"}."""
    assert answer.status < 500, answer
    if answer.status >= 400:
        assert answer.content_type == "application/json", answer
        body = answer.json()
        assert isinstance(body, dict), answer
        assert isinstance(body.get("error"), str), answer
        assert body["error"], answer


# -- strategies ---------------------------------------------------------------------

ints = st.one_of(
    st.integers(),
    st.integers(min_value=2**53 - 2, max_value=2**64 + 2),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.sampled_from([0, -1, 2**63, -(2**63), 10**4000]),  # 4001 digits: still parseable
)
floats = st.one_of(
    st.floats(),  # NaN and Infinity too: json.dumps writes them and the server's parser reads them
    st.sampled_from([0.0, -0.0, 1e-300, 5e-324, 1e305, 1.7976931348623157e308]),
)
scalars = st.one_of(st.none(), st.booleans(), ints, floats, st.text(max_size=40))
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(st.text(max_size=12), children, max_size=5),
    ),
    max_leaves=25,
)
names = st.one_of(st.text(max_size=20), st.sampled_from(["alpha", "peer", "alice", ""]))
GOOD_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "chat": names,
    "author": names,
    "bot": st.booleans(),
    "text": st.text(max_size=60),
    "id": names,
    "at": st.one_of(st.integers(min_value=0, max_value=10**12), st.floats(0, 1e12)),
    "kind": st.sampled_from(["group", "dm"]),
    "mentions": st.lists(names, max_size=4),
    "reply_to": st.one_of(st.none(), names),
    "system": st.booleans(),
}
assert set(GOOD_FIELDS) == set(FIELDS)
# message-shaped: every field present or not, each right-typed or any JSON value
messages = st.builds(
    lambda base, extra: {**base, **extra},
    st.fixed_dictionaries(
        {k: st.one_of(GOOD_FIELDS[k], json_values) for k in ("chat", "author")},
        optional={
            k: st.one_of(v, json_values)
            for k, v in GOOD_FIELDS.items()
            if k not in ("chat", "author")
        },
    ),
    st.one_of(st.just({}), st.dictionaries(st.text(max_size=10), json_values, max_size=2)),
)
well_formed = st.fixed_dictionaries(
    {"chat": st.text(min_size=1, max_size=20), "author": st.text(min_size=1, max_size=20)},
    optional={k: v for k, v in GOOD_FIELDS.items() if k not in ("chat", "author", "id")},
)
raw_bodies = st.one_of(
    st.binary(max_size=400),
    st.text(max_size=200).map(str.encode),
    json_values.map(lambda v: json.dumps(v).encode()),
    messages.map(lambda v: json.dumps(v, ensure_ascii=False).encode()),
    # encodings json.loads detects, nesting past its recursion limit, huge numbers
    st.tuples(messages, st.sampled_from(["utf-16", "utf-16-be", "utf-32", "utf-8-sig"])).map(
        lambda m: json.dumps(m[0]).encode(m[1])
    ),
    st.integers(1, 30_000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(1, 30_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.integers(4000, 5000).map(lambda n: b'{"chat": "c", "author": "a", "at": ' + b"7" * n + b"}"),
    st.sampled_from(
        [
            b"",
            b" ",
            b"\x00",
            b"\xef\xbb\xbf",
            b"NaN",
            b"-Infinity",
            b"1e999",
            b'"\\ud800"',
            b'{"chat": "c", "author": "a", "text": "\\udfff"}',
            b'{"chat": "c", "author": "\xed\xa0\x80"}',
        ]
    ),
)
limit_values = st.one_of(
    st.integers(min_value=1, max_value=300),
    st.floats(min_value=0.001, max_value=1e6),
    ints,
    floats,
    scalars,
    json_values,
)
limit_bodies = st.one_of(
    st.dictionaries(st.sampled_from(JSON_LIMIT_KEYS), limit_values, max_size=4),
    st.dictionaries(
        st.one_of(st.sampled_from(JSON_LIMIT_KEYS), st.text(max_size=12)), limit_values, max_size=4
    ),
    json_values,
)


def _expected_overrides(body: dict[str, Any]) -> dict[str, int]:
    got = {k: v for k, v in body.items() if v is not None}
    if "rate_window_seconds" in got:
        got["rate_window_ms"] = round(got.pop("rate_window_seconds") * 1000)
    return got


# -- ingress ----------------------------------------------------------------------


def test_ingress_answers_any_json_without_a_5xx(server: Server) -> None:
    @FUZZ
    @given(body=st.one_of(messages, json_values, well_formed))
    def one(body: Any) -> None:
        answer = server.request("POST", "/v1/bots/alpha/messages", json.dumps(body))
        check(answer)
        assert answer.status in (200, 400), answer
        if answer.status == 200:
            out = answer.json()
            assert out["action"] in ("reply", "warn", "drop"), out
            assert out["chat"] == body["chat"]
            if out["action"] == "reply":
                assert isinstance(out["reply"], str) and out["reply_id"].startswith("alpha-")

    one()
    server.assert_alive()


def test_well_formed_messages_are_always_decided(server: Server) -> None:
    @FUZZ
    @given(body=well_formed)
    def one(body: dict[str, Any]) -> None:
        answer = server.request("POST", "/v1/bots/alpha/messages", json.dumps(body))
        assert answer.status == 200, answer
        out = answer.json()
        assert (out["chat"], out["author"]) == (body["chat"], body["author"])
        assert out["id"].startswith("in-")  # no id given: the adapter made one

    one()
    server.assert_alive()


def test_ingress_and_replay_refuse_the_same_messages_in_the_same_words(server: Server) -> None:
    """One parser (gateway/wire.py) for both: a body the ingress refuses is a
    line replay refuses, with the same error; one it takes, replay takes."""

    # well-formed but for one field, any JSON value there
    one_off = st.builds(
        lambda base, key, value: {**base, key: value},
        well_formed,
        st.sampled_from([k for k in FIELDS if k not in ("chat", "author")]),
        st.one_of(json_values, floats),
    )

    @FUZZ
    @example(body={"chat": "c", "author": "a", "at": "x"})
    @example(body={"chat": "c", "author": "a", "at": float("nan")})
    @given(body=st.one_of(messages, well_formed, one_off))
    def one(body: dict[str, Any]) -> None:
        text = json.dumps(body)
        answer = server.request("POST", "/v1/bots/alpha/messages", text)
        try:
            parse_line(text, 7, None, "alpha")
        except ReplayError as exc:
            assert answer.status == 400, (answer, exc)
            assert str(exc) == "line 7: " + answer.json()["error"]
        else:
            assert answer.status == 200, answer

    one()


def test_ingress_answers_any_bytes_without_a_5xx(server: Server) -> None:
    @FUZZ
    @given(raw=raw_bodies)
    def one(raw: bytes) -> None:
        answer = server.request("POST", "/v1/bots/alpha/messages", raw)
        check(answer)
        if len(raw) > 64 * 1024:
            assert answer.status == 413, answer

    one()
    server.assert_alive()


def test_ingress_answers_any_bot_name_and_chat_id(server: Server) -> None:
    @FUZZ
    @given(bot=st.text(max_size=30), chat=st.text(max_size=30))
    def one(bot: str, chat: str) -> None:
        body = json.dumps({"chat": chat, "author": "peer", "bot": True, "text": "x"})
        answer = server.request("POST", f"/v1/bots/{quote(bot, safe='')}/messages", body)
        check(answer)
        if bot != "alpha":
            assert answer.status == 404, answer
        else:
            assert answer.status == (200 if chat else 400), answer

    one()
    server.assert_alive()


# -- admin API ----------------------------------------------------------------------


def test_put_limits_answers_any_json_and_a_refusal_changes_nothing(server: Server) -> None:
    path = "/v1/admin/chats/fuzz-limits/limits"

    def overrides() -> Any:
        answer = server.request("GET", "/v1/admin/chats/fuzz-limits", headers=AUTH)
        assert answer.status == 200, answer
        return answer.json()["overrides"]

    @FUZZ
    @given(body=limit_bodies)
    def one(body: Any) -> None:
        before = overrides()
        answer = server.request("PUT", path, json.dumps(body), AUTH)
        check(answer)
        assert answer.status in (200, 400), answer
        if answer.status == 400:
            assert overrides() == before
            return
        out = answer.json()
        assert isinstance(body, dict)
        assert set(body) <= set(JSON_LIMIT_KEYS)
        assert out["overrides"] == _expected_overrides(body) == overrides()
        # soft >= hard is valid (a hard stop only), as an override too
        assert out["soft_limit"] >= 1 and out["hard_limit"] >= 1

    one()
    server.assert_alive()


def test_put_limits_answers_any_bytes(server: Server) -> None:
    @FUZZ
    @given(raw=raw_bodies)
    def one(raw: bytes) -> None:
        answer = server.request("PUT", "/v1/admin/chats/fuzz-bytes/limits", raw, AUTH)
        check(answer)
        if answer.status == 200:  # a refusal is the usual answer; a success cleans up
            server.request("PUT", "/v1/admin/chats/fuzz-bytes/limits", "{}", AUTH)

    one()
    server.assert_alive()


ADMIN_ROUTES = [
    ("GET", "", None),
    ("POST", "/pause", None),
    ("POST", "/resume", None),
    ("POST", "/reset", None),
    ("PUT", "/limits", "{}"),
]


def test_admin_routes_answer_any_chat_id_and_query(server: Server) -> None:
    @FUZZ
    @given(
        chat=st.text(max_size=30),
        bot=st.one_of(st.none(), st.just("alpha"), st.text(max_size=20)),
        limit=st.one_of(st.none(), st.integers(-5, 60).map(str), st.text(max_size=12)),
    )
    def one(chat: str, bot: str | None, limit: str | None) -> None:
        base = f"/v1/admin/chats/{quote(chat, safe='')}"
        # `.` and `..` are path dots, not ids
        routable = chat not in ("", ".", "..")
        query = "" if bot is None else f"?bot={quote(bot, safe='')}"
        wanted = 200 if bot in (None, "alpha") else 404
        for method, suffix, data in ADMIN_ROUTES:
            answer = server.request(method, base + suffix + query, data, AUTH)
            check(answer)
            if routable:
                assert answer.status == wanted, (method, suffix, answer)
                if wanted == 200:
                    assert answer.json()["chat"] in (chat, f"http:{chat}")
        params = [] if limit is None else [f"limit={quote(limit, safe='')}"]
        params += [] if bot is None else [f"bot={quote(bot, safe='')}"]
        answer = server.request("GET", f"{base}/decisions?{'&'.join(params)}", headers=AUTH)
        check(answer)
        if routable and answer.status == 200:
            most = 50 if limit is None else int(limit)  # the server read it as a number too
            assert len(answer.json()["decisions"]) <= most

    one()
    server.assert_alive()


def test_admin_routes_answer_any_raw_query_string(server: Server) -> None:
    @FUZZ
    @given(query=st.text(max_size=40), suffix=st.sampled_from(["", "/decisions", "/pause"]))
    def one(query: str, suffix: str) -> None:
        method = "POST" if suffix == "/pause" else "GET"
        raw = quote(query, safe="=&;+%")
        answer = server.request(method, f"/v1/admin/chats/q{suffix}?{raw}", headers=AUTH)
        check(answer)

    one()
    server.assert_alive()


def test_admin_auth_answers_any_authorization_header(server: Server) -> None:
    # what a client can send: no control characters (aiohttp refuses to)
    latin1 = st.text(
        st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_categories=("Cc",)),
        max_size=40,
    )

    headers = st.one_of(
        latin1,
        latin1.map(lambda t: "Bearer " + t),
        st.builds(lambda a, b: f"{a}{TOKEN}{b}", latin1, latin1),
        st.sampled_from([f"Bearer {TOKEN}", f"bearer {TOKEN}", f" Bearer  {TOKEN}\t", TOKEN]),
    )

    @FUZZ
    @given(header=headers)
    def one(header: str) -> None:
        answer = server.request(
            "POST", "/v1/admin/chats/fuzz-auth/pause", headers={"Authorization": header}
        )
        check(answer)
        # the HTTP parser drops blanks around a header value; the server then
        # wants the "bearer" scheme (any case) and the token (blanks around it allowed)
        scheme, _, given_token = header.strip(" \t").partition(" ")
        right = scheme.lower() == "bearer" and given_token.strip() == TOKEN
        assert answer.status == (200 if right else 401), (header, answer)
        if right:
            server.request("POST", "/v1/admin/chats/fuzz-auth/resume", headers=AUTH)

    one()
    paused = server.request("GET", "/v1/admin/chats/fuzz-auth", headers=AUTH).json()["paused"]
    assert paused is False
    server.assert_alive()


# -- chat commands (Admin.run, as platform adapters call it) ---------------------------

command_words = st.one_of(
    st.sampled_from(["status", "reset", "pause", "resume", "limits", "why", "LIMITS", "why"]),
    st.text(max_size=10),
)
limit_args = st.builds(
    lambda key, sep, value: f"{key}{sep}{value}",
    st.one_of(st.sampled_from(sorted(LIMIT_KEYS)), st.text(max_size=6)),
    st.sampled_from(["=", "", "=="]),
    st.one_of(
        st.integers(-3, 200).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.sampled_from(["1e305", "1e-9", "0.0015", "9" * 400, "nan", "-inf", "1_000"]),
        st.text(max_size=8),
    ),
)
commands = st.builds(
    lambda word, args: " ".join([word, *args]),
    command_words,
    st.lists(st.one_of(limit_args, st.sampled_from(["clear", "3", "50", "0"])), max_size=4),
)


def test_chat_commands_answer_text_or_an_admin_error(server: Server) -> None:
    admin = server.daemon.server.admins["alpha"]

    @FUZZ
    @given(text=commands)
    def one(text: str) -> None:
        try:
            answer = server.run(admin.run("http:fuzz-commands", text, "fuzzer"))
        except AdminError as exc:
            assert str(exc)
            return
        assert isinstance(answer, str) and answer
        state = server.run(admin.status("http:fuzz-commands"))
        # soft >= hard is valid (the hard limit fires first); what must hold
        # is that every limit stays a count the stores can keep exactly
        lim = state.limits
        assert all(1 <= n <= MAX_COUNT for n in (lim.soft_limit, lim.hard_limit, lim.max_replies))

    one()
    server.assert_alive()


# -- regressions: inputs that once gave a 500 -------------------------------------


@pytest.mark.parametrize("field", ["chat", "author", "id", "text"])
def test_a_lone_surrogate_in_a_message_is_not_a_500(server: Server, field: str) -> None:
    body = {"chat": "s", "author": "a", "text": "x", field: "x\ud800"}
    answer = server.request("POST", "/v1/bots/alpha/messages", json.dumps(body))
    assert answer.status < 500, answer


def test_a_lone_surrogate_does_not_break_the_chats_decisions(server: Server) -> None:
    server.request("POST", "/v1/bots/alpha/messages",
                   json.dumps({"chat": "s2", "author": "x\udfff", "text": "x"}))  # fmt: skip
    answer = server.request("GET", "/v1/admin/chats/s2/decisions", headers=AUTH)
    assert answer.status == 200, answer


@pytest.mark.parametrize("path", ["/v1/bots/alpha/messages", "/v1/admin/chats/x/limits"])
def test_a_5000_digit_number_in_a_body_is_a_400(server: Server, path: str) -> None:
    method = "POST" if "bots" in path else "PUT"
    answer = server.request(method, path, "[" + "1" * 5000 + "]", AUTH)
    assert answer.status == 400, answer


@pytest.mark.parametrize("chat", ["a{b", "}", "{x}"])
def test_a_chat_id_with_a_brace_can_be_paused(server: Server, chat: str) -> None:
    body = json.dumps({"chat": chat, "author": "a", "text": "x"})
    assert server.request("POST", "/v1/bots/alpha/messages", body).status == 200  # ingress: fine
    answer = server.request("POST", f"/v1/admin/chats/{quote(chat, safe='')}/pause", headers=AUTH)
    assert answer.status == 200, answer


# -- the agent guard API -------------------------------------------------------------

# Field names and operations from the OpenAPI document the server publishes,
# plus one it does not know.
GUARD_FIELDS = sorted(
    {name for schema in OPENAPI["components"]["schemas"].values()
     for name in schema.get("properties", {})} | {"zzz"}
)  # fmt: skip
GUARD_OPS = sorted(path.rsplit("/", 1)[-1] for path in OPENAPI["paths"] if path.count("/") == 4)
GUARD_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
GUARD_CONFIG = """
guard:
  profiles:
    default: {subagents: {tools: [researcher]}, retry: {prechecks: {invoice: "INV"}}}
    strict: {identical: {warn_at: 1, block_at: 2}}
bots: [{name: a, platform: http, backend: {type: echo}}]
"""


@pytest.fixture(params=["memory", "redis"])
def guard_server(request: pytest.FixtureRequest) -> Iterator[Server]:
    if request.param == "memory":
        s = Server(GUARD_CONFIG)
    else:
        url = request.getfixturevalue("redis_url")
        config = f"store: {{url: '{url}'}}\n" + GUARD_CONFIG
        s = Server(config, prefix=request.getfixturevalue("key_prefix"))
    try:
        yield s
    finally:
        s.close()


# One server per test, on purpose: sessions build up across examples.
GUARD_FUZZ = settings(
    FUZZ,
    suppress_health_check=[*FUZZ.suppress_health_check, HealthCheck.function_scoped_fixture],
)


@GUARD_FUZZ
@given(
    op=st.sampled_from(GUARD_OPS),
    session=st.one_of(st.sampled_from(["s1", "s2"]), st.text(min_size=1, max_size=20)),
    body=st.one_of(
        GUARD_VALUES,
        st.dictionaries(st.sampled_from(GUARD_FIELDS), GUARD_VALUES, max_size=6),
        st.fixed_dictionaries(
            {"tool": st.sampled_from(["researcher", "x"])},
            optional={"args": GUARD_VALUES, "output": GUARD_VALUES},
        ),
    ),
    query=st.sampled_from(["", "?profile=strict", "?profile=", "?profile=%00"]),
)
def test_guard_routes_answer_any_json_without_a_5xx(
    guard_server: Server, op: str, session: str, body: Any, query: str
) -> None:
    path = f"/v1/guard/{quote(session, safe='')}/{op}{query}"
    answer = guard_server.request("POST", path, json.dumps(body))
    if answer.status in (200, 429):  # 429 is a block: a decision, not an error
        assert answer.json()["decision"] in (("allow", "warn") if answer.status == 200
                                             else ("block",)), answer  # fmt: skip
    else:
        check(answer)


@GUARD_FUZZ
@given(session=st.text(max_size=40), method=st.sampled_from(["GET", "DELETE"]))
def test_guard_session_routes_answer_any_session(
    guard_server: Server, session: str, method: str
) -> None:
    check(guard_server.request(method, f"/v1/guard/{quote(session, safe='')}"))
