"""The OpenAPI document (gateway/openapi.py) against the server it describes:
every route is in it, the committed copy is current, and real answers of an
in-process daemon match the schema of their route and status."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.admin import AdminError, overrides_from
from gateway.config import parse_config
from gateway.daemon import Daemon
from gateway.fields import MAX_COUNT, MAX_WINDOW_SECONDS, MIN_WINDOW_SECONDS
from gateway.guard.openapi import OPENAPI as GUARD_OPENAPI
from gateway.openapi import OPENAPI, render
from gateway.store.base import DECISION_LOG_SIZE
from gateway.wire import FIELDS
from tests.redis_server import free_port

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "s3cret"
CONFIG = """
http: {admin_token: s3cret}
guard: {profiles: {strict: {identical: {warn_at: 1, block_at: 2}}}}
bots:
  - {name: alpha, platform: http, backend: {type: echo}, bot_messages: all}
  - {name: beta, platform: http, backend: {type: python, callable: "tests.sample_backends:two"}}
  - {name: side, platform: http, mode: decide}
llm_proxy:
  openai: {upstream: "http://127.0.0.1:9"}
  anthropic: {upstream: "http://127.0.0.1:9"}
"""
LAST = "<the last ticket answered>"


# -- a validator for the subset of JSON Schema the document uses -----------


_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "null": lambda v: v is None,
}
_IGNORED = {"description", "title", "default", "examples", "format", "discriminator"}


def problems(value: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """What is wrong with `value` under `schema` (empty: it validates)."""
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/components/schemas/")
        return problems(value, OPENAPI["components"]["schemas"][name], where)
    out: list[str] = []
    for key, rule in schema.items():
        if key in _IGNORED:
            continue
        if key == "type":
            kinds = rule if isinstance(rule, list) else [rule]
            if not any(_TYPES[k](value) for k in kinds):
                out.append(f"{where}: {value!r} is not {rule}")
        elif key == "enum":
            if not any(value == e and type(value) is type(e) for e in rule):
                out.append(f"{where}: {value!r} not in {rule}")
        elif key == "const":
            if value != rule:
                out.append(f"{where}: {value!r} != {rule!r}")
        elif key == "anyOf":
            if all(problems(value, s, where) for s in rule):
                out.append(f"{where}: {value!r} matches none of anyOf")
        elif key == "allOf":
            for s in rule:
                out += problems(value, s, where)
        elif key == "required":
            if isinstance(value, dict):
                out += [f"{where}: {k} is missing" for k in rule if k not in value]
        elif key == "properties":
            if isinstance(value, dict):
                for k, s in rule.items():
                    if k in value:
                        out += problems(value[k], s, f"{where}.{k}")
        elif key == "additionalProperties":
            if isinstance(value, dict):
                extra = [k for k in value if k not in schema.get("properties", {})]
                if rule is False:
                    out += [f"{where}: unexpected {k}" for k in extra]
                elif isinstance(rule, dict):
                    for k in extra:
                        out += problems(value[k], rule, f"{where}.{k}")
        elif key == "items":
            if isinstance(value, list):
                for i, item in enumerate(value):
                    out += problems(item, rule, f"{where}[{i}]")
        elif key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if _TYPES["number"](value):
                ok = {
                    "minimum": value >= rule,
                    "maximum": value <= rule,
                    "exclusiveMinimum": value > rule,
                    "exclusiveMaximum": value < rule,
                }[key]
                if not ok:
                    out.append(f"{where}: {value!r} breaks {key} {rule}")
        elif key in ("minLength", "maxLength", "minItems", "maxItems", "maxProperties"):
            if isinstance(value, str | list | dict):
                n = len(value)
                if (key.startswith("min") and n < rule) or (key.startswith("max") and n > rule):
                    out.append(f"{where}: length {n} breaks {key} {rule}")
        elif key == "pattern":
            if isinstance(value, str) and not re.search(rule, value):
                out.append(f"{where}: {value!r} does not match {rule}")
        else:
            raise AssertionError(f"the test's validator does not know {key!r} ({where})")
    return out


def test_the_validator_refuses_what_it_should() -> None:
    assert problems(True, {"type": "integer"})
    assert problems({"a": 1}, {"type": "object", "additionalProperties": False})
    assert problems({}, {"required": ["x"]})
    assert not problems(None, {"anyOf": [{"type": "string"}, {"type": "null"}]})
    assert problems("x", {"$ref": "#/components/schemas/Health"})


# -- the document itself -----------------------------------------------------


def test_the_committed_copy_is_current() -> None:
    committed = (ROOT / "docs" / "openapi.json").read_text(encoding="utf-8")
    assert committed == render(), "regenerate: python -m gateway.openapi > docs/openapi.json"


def test_every_schema_is_readable_by_the_validator() -> None:
    for name, schema in OPENAPI["components"]["schemas"].items():
        problems({}, schema, name)  # raises on a keyword the validator does not know


def test_the_message_schema_has_every_field_the_ingress_accepts() -> None:
    message = OPENAPI["components"]["schemas"]["Message"]
    assert tuple(message["properties"]) == FIELDS


@pytest.mark.parametrize(
    "body",
    [
        {"soft_limit": MAX_COUNT + 1},
        {"hard_limit": MAX_COUNT + 1},
        {"max_replies": MAX_COUNT + 1},
        {"rate_window_seconds": MAX_WINDOW_SECONDS + 1},
        {"rate_window_seconds": MIN_WINDOW_SECONDS / 2},
        {"soft_limit": 0},
    ],
)
def test_limits_the_server_refuses_the_document_refuses_too(body: dict[str, Any]) -> None:
    """A client that validates against the document (a generated client,
    schemathesis) must not send what is then a 400."""
    with pytest.raises(AdminError):
        overrides_from(body)
    assert problems(body, OPENAPI["components"]["schemas"]["Limits"])
    at_the_bound = {k: MAX_COUNT if k != "rate_window_seconds" else MAX_WINDOW_SECONDS
                    for k in body}  # fmt: skip
    overrides_from(at_the_bound)
    assert not problems(at_the_bound, OPENAPI["components"]["schemas"]["Limits"])


@pytest.mark.parametrize("limit", [0, -1, DECISION_LOG_SIZE + 1])
def test_a_decisions_limit_the_server_refuses_the_document_refuses_too(limit: int) -> None:
    operation = OPENAPI["paths"]["/v1/admin/chats/{chat}/decisions"]["get"]
    schema = next(p["schema"] for p in operation["parameters"] if p["name"] == "limit")
    assert problems(limit, schema)
    assert not problems(1, schema) and not problems(DECISION_LOG_SIZE, schema)


def _documented() -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, item in OPENAPI["paths"].items()
        for method in item
        if method in ("get", "post", "put", "delete")
    }


def _routes(app_routes: Any) -> set[tuple[str, str]]:
    """The server's routes with their alternations expanded, `{x:re}` as `{x}`."""
    out = set()
    for route in app_routes:
        if route.method == "HEAD":
            continue
        info = route.resource.get_info()
        if route.method == "*":  # the LLM proxy's routes: any method under its paths
            tail = info["pattern"].pattern.replace("\\", "").replace("(?P<tail>.*)", "{tail}")
            out.update({("GET", tail), ("POST", tail)})
            continue
        if "path" in info:
            out.add((route.method, info["path"]))
            continue
        # a dynamic route: its regex, with each (?P<name>a|b) expanded, others as {name}
        variants = [info["pattern"].pattern.replace("\\", "")]
        for name, alts in re.findall(r"\(\?P<(\w+)>([^)]*)\)", variants[0]):
            group = f"(?P<{name}>{alts})"
            if re.fullmatch(r"[\w-]+(\|[\w-]+)+", alts):
                variants = [v.replace(group, alt) for v in variants for alt in alts.split("|")]
            else:
                variants = [v.replace(group, f"{{{name}}}") for v in variants]
        out.update((route.method, v) for v in variants)
    return out


def test_every_route_of_the_server_is_documented_and_nothing_else() -> None:
    daemon = Daemon(parse_config(CONFIG))
    # The proxy's guarded routes are served by its catch-all ones.
    guarded = {("POST", "/llm/openai/v1/chat/completions"), ("POST", "/llm/openai/v1/responses"),
               ("POST", "/llm/anthropic/v1/messages")}  # fmt: skip
    assert guarded <= _documented()
    assert _routes(daemon.server.app.router.routes()) == _documented() - guarded


# -- real answers against the document ----------------------------------------


@pytest.fixture
async def url() -> AsyncIterator[str]:
    config = parse_config(CONFIG)
    config = config.model_copy(
        update={"http": config.http.model_copy(update={"listen": f"127.0.0.1:{free_port()}"})}
    )
    daemon = Daemon(config)
    base = await daemon.start()
    try:
        yield base
    finally:
        await daemon.stop()


def _template(path: str) -> str:
    for template in OPENAPI["paths"]:
        pattern = re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(template))
        if re.fullmatch(pattern, path) and "{" not in path:
            # the most specific: a literal segment beats a parameter
            exact = [str(t) for t in OPENAPI["paths"] if t == path]
            return exact[0] if exact else str(template)
    raise AssertionError(f"{path}: no documented path")


def _schema(method: str, path: str, status: int) -> tuple[str, dict[str, Any] | None]:
    operation = OPENAPI["paths"][_template(path)][method.lower()]
    response = operation["responses"].get(str(status))
    assert response is not None, f"{method} {path}: status {status} is not documented"
    content = response.get("content", {})
    if "application/json" in content:
        return "application/json", content["application/json"]["schema"]
    return next(iter(content), ""), None


CASES: list[tuple[str, str, dict[str, str], Any]] = [
    ("GET", "/healthz", {}, None),
    ("GET", "/metrics", {}, None),
    ("GET", "/openapi.json", {}, None),
    ("GET", "/v1/guard/openapi.json", {}, None),
    # the ingress: a reply, several replies, a warning-free drop, errors
    ("POST", "/v1/bots/alpha/messages", {}, {"chat": "c", "author": "al", "text": "hi @alpha",
                                             "mentions": ["alpha"], "id": "h1"}),
    ("POST", "/v1/bots/beta/messages", {}, {"chat": "c", "author": "al", "text": "hi @beta",
                                            "mentions": ["beta"], "kind": "dm"}),
    ("POST", "/v1/bots/alpha/messages", {}, {"chat": "c", "author": "al", "text": "chat"}),
    ("POST", "/v1/bots/alpha/messages", {}, {"chat": "c", "author": "al", "text": "hi @alpha",
                                             "mentions": ["alpha"], "id": "h1"}),
    ("POST", "/v1/bots/alpha/messages", {}, {"chat": "c"}),
    ("POST", "/v1/bots/alpha/messages", {}, "[[[["),
    ("POST", "/v1/bots/nobody/messages", {}, {"chat": "c", "author": "al"}),
    ("POST", "/v1/bots/alpha/messages", {}, {"chat": "c", "author": "al", "text": "x" * 70000}),
    ("POST", "/v1/webhooks/alpha", {}, {}),
    # decide: a ticket sent, one released, each spent one refused, errors
    ("POST", "/v1/bots/side/decide", {}, {"chat": "c", "author": "al", "text": "hi",
                                          "mentions": ["side"]}),
    ("POST", "/v1/bots/side/sent", {}, {"ticket": LAST, "ids": ["s1"], "texts": ["hello"]}),
    ("POST", "/v1/bots/side/release", {}, {"ticket": LAST}),
    ("POST", "/v1/bots/side/decide", {}, {"chat": "c", "author": "al", "kind": "dm"}),
    ("POST", "/v1/bots/side/release", {}, {"ticket": LAST}),
    ("POST", "/v1/bots/side/sent", {}, {"ticket": LAST, "ids": ["s2"]}),
    ("POST", "/v1/bots/side/sent", {}, {"ticket": "nope", "ids": ["s2"]}),
    ("POST", "/v1/bots/side/release", {}, {}),
    ("POST", "/v1/bots/side/decide", {}, "[[[["),
    ("POST", "/v1/bots/alpha/decide", {}, {"chat": "c", "author": "al"}),
    ("POST", "/v1/bots/side/sent", {}, {"ticket": "t", "ids": ["x" * 70000]}),
    ("POST", "/v1/bots/side/release", {}, {"ticket": "x" * 70000}),
    ("POST", "/v1/bots/side/decide", {}, {"chat": "c", "author": "al", "text": "x" * 70000}),
    # admin
    ("GET", "/v1/admin/chats/c", {}, None),
    ("GET", "/v1/admin/chats/c", {"Authorization": "Bearer nope"}, None),
    ("GET", "/v1/admin/chats/c?bot=nobody", {"Authorization": f"Bearer {TOKEN}"}, None),
    ("GET", "/v1/admin/chats/c", {"Authorization": f"Bearer {TOKEN}"}, None),
    ("PUT", "/v1/admin/chats/c/limits", {"Authorization": f"Bearer {TOKEN}"},
     {"soft_limit": 3, "rate_window_seconds": 30}),
    ("PUT", "/v1/admin/chats/c/limits", {"Authorization": f"Bearer {TOKEN}"}, {"soft": 3}),
    ("POST", "/v1/admin/chats/c/pause", {"Authorization": f"Bearer {TOKEN}"}, None),
    ("POST", "/v1/admin/chats/c/resume", {"Authorization": f"Bearer {TOKEN}"}, None),
    ("POST", "/v1/admin/chats/c/reset", {"Authorization": f"Bearer {TOKEN}"}, None),
    ("GET", "/v1/admin/chats/c/decisions?limit=3", {"Authorization": f"Bearer {TOKEN}"}, None),
    ("GET", "/v1/admin/chats/c/decisions?limit=x", {"Authorization": f"Bearer {TOKEN}"}, None),
    # the guard: allow, warn, block, its session, errors
    *[("POST", "/v1/guard/s1/step", {}, {"tool": "search", "args": {"q": "tides"}})] * 3,
    ("POST", "/v1/guard/s1/result", {}, {"tool": "search", "ok": True, "output": "none"}),
    ("POST", "/v1/guard/s1/retry", {}, {"task": "t", "input": "i", "error": "e"}),
    ("POST", "/v1/guard/s1/handoff", {}, {"source": "a", "target": "b"}),
    ("POST", "/v1/guard/s1/kb-query", {}, {"question": "when are the tides"}),
    ("POST", "/v1/guard/s1/usage", {}, {"cost_usd": 0.01, "tokens": 100}),
    ("POST", "/v1/guard/s1/step?profile=strict", {}, {"tool": "search", "args": {}}),
    ("POST", "/v1/guard/s1/step", {}, {"tool": 3}),
    ("GET", "/v1/guard/s1", {}, None),
    ("DELETE", "/v1/guard/s1", {}, None),
    ("GET", "/v1/guard/s1", {}, None),
    # the LLM proxy, its upstream (port 9) unreachable
    ("POST", "/llm/openai/v1/chat/completions", {}, {"model": "m", "messages": []}),
    ("POST", "/llm/openai/v1/chat/completions", {"X-Botbouncer-Session": "a b"}, {"model": "m"}),
    ("POST", "/llm/openai/v1/responses", {}, {"model": "m", "input": "hi"}),
    ("POST", "/llm/openai/v1/responses", {"X-Botbouncer-Session": "a b"}, {"model": "m"}),
    ("POST", "/llm/anthropic/v1/messages", {}, {"model": "m", "messages": []}),
    ("POST", "/llm/anthropic/v1/messages", {"X-Botbouncer-Session": "a b"}, {"model": "m"}),
    ("GET", "/llm/openai/models", {}, None),
    ("POST", "/llm/openai/files", {}, "x"),
    ("GET", "/llm/anthropic/models", {}, None),
    ("POST", "/llm/anthropic/files", {}, "x"),
]  # fmt: skip


async def test_real_answers_match_the_document(url: str) -> None:
    seen: set[tuple[str, str, int]] = set()
    ticket = None
    async with aiohttp.ClientSession() as session:
        for method, path, headers, body in CASES:
            if isinstance(body, dict) and body.get("ticket") == LAST:
                body = {**body, "ticket": ticket}
            data = None if body is None else body if isinstance(body, str) else json.dumps(body)
            async with session.request(method, url + path, data=data, headers=headers) as resp:
                text = await resp.text()
                status, ctype = resp.status, resp.content_type
            if status == 200 and ctype == "application/json":
                ticket = json.loads(text).get("ticket", ticket)
            bare = path.partition("?")[0]
            kind, schema = _schema(method, bare, status)
            assert ctype == kind, f"{method} {path}: {status} {ctype}, documented {kind}"
            if schema is not None:
                found = problems(json.loads(text), schema)
                assert not found, f"{method} {path} -> {status}: {found}\n{text[:500]}"
            seen.add((method, _template(bare), status))
    # every documented operation was asked at least once
    asked = {(m, p) for m, p, _ in seen}
    assert asked == _documented()
    # and the answers the examples rely on came with the statuses they show
    assert ("POST", "/v1/guard/{session}/step", 429) in seen
    assert ("POST", "/v1/guard/{session}/step", 409) in seen
    assert ("POST", "/v1/bots/{bot}/messages", 413) in seen
    for route in ("sent", "release"):
        assert ("POST", f"/v1/bots/{{bot}}/{route}", 409) in seen


async def test_both_documents_are_served(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/openapi.json") as resp:
            assert await resp.json() == OPENAPI
        async with session.get(url + "/v1/guard/openapi.json") as resp:
            assert await resp.json() == GUARD_OPENAPI
