"""JSON nested too deep is a 400 on every POST route, never a 500 (a body 977
deep once passed json.loads and overflowed the guard's normaliser): json_body
refuses more than MAX_JSON_DEPTH levels before anything walks the body, and
the normaliser walks without recursion for callers in this process."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.api.common import GUARD_MAX_BODY
from gateway.config import parse_config
from gateway.guard import normalize
from gateway.guard.engine import MemoryEngine
from gateway.guard.normalize import MAX_JSON_DEPTH, depth_over, text_depth_over
from gateway.guard.service import Guard, GuardInputError
from gateway.http import MAX_BODY
from tests.daemons import served

TOKEN = "depth-token"
CONFIG = f"""
http: {{admin_token: {TOKEN}}}
bots: [{{name: alpha, platform: http, backend: {{type: echo}}}}]
"""
TOO_DEEP = f"invalid JSON body: nested deeper than {MAX_JSON_DEPTH} levels"

# (method, path, the body with the nested value at "{}"): the nesting goes
# where each route takes a value of its own.
ROUTES = [
    ("POST", "/v1/bots/alpha/messages", '{"chat": "c", "author": "a", "text": {}}'),
    ("PUT", "/v1/admin/chats/c/limits", '{"soft_limit": {}}'),
    ("POST", "/v1/guard/s/step", '{"tool": "t", "args": {}}'),
    ("POST", "/v1/guard/s/result", '{"tool": "t", "output": {}}'),
    ("POST", "/v1/guard/s/retry", '{"task": "t", "error": {}}'),
    ("POST", "/v1/guard/s/handoff", '{"source": "a", "target": {}}'),
    ("POST", "/v1/guard/s/kb-query", '{"question": {}}'),
    ("POST", "/v1/guard/s/usage", '{"cost_usd": {}}'),
]


def arrays(depth: int) -> str:
    return "[" * depth + "]" * depth


def objects(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def body(template: str, inner: str) -> bytes:
    return template.replace("{}", inner, 1).replace("{}", inner).encode()


@pytest.fixture
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    async with served(CONFIG) as c:
        yield c


async def send(client: TestClient[Any, Any], method: str, path: str, raw: bytes) -> Any:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    async with client.request(method, path, data=raw, headers=headers) as resp:
        return resp.status, await resp.json()


@pytest.mark.parametrize(("method", "path", "template"), ROUTES)
@pytest.mark.parametrize("depth", [976, 977, 978, 5000, 100_000])
async def test_deep_json_is_refused_on_every_route(
    client: TestClient[Any, Any], method: str, path: str, template: str, depth: int
) -> None:
    raw = body(template, arrays(depth))
    status, answer = await send(client, method, path, raw)
    limit = GUARD_MAX_BODY if path.startswith("/v1/guard/") else MAX_BODY
    if len(raw) > limit:  # 100,000 levels take 200 KB: over the 64 KiB limit first
        assert (status, answer) == (413, {"error": f"request body larger than {limit} bytes"})
    else:
        assert (status, answer) == (400, {"error": TOO_DEEP})


async def test_no_depth_near_the_recursion_limit_is_a_500(client: TestClient[Any, Any]) -> None:
    """Where json.loads just succeeds depends on the stack the handler runs
    on (977 for the review's daemon, elsewhere under pytest): every depth
    around Python's recursion limit, on the routes that walk their value."""
    for depth in range(900, 1000):
        for _, path, template in ROUTES[2:4]:
            status, answer = await send(client, "POST", path, body(template, arrays(depth)))
            assert (status, answer) == (400, {"error": TOO_DEEP}), (path, depth)


@pytest.mark.parametrize(("method", "path", "template"), ROUTES)
@pytest.mark.parametrize("nest", [arrays, objects])
async def test_the_bound_itself_is_accepted_one_more_is_not(
    client: TestClient[Any, Any], method: str, path: str, template: str, nest: Any
) -> None:
    inner = MAX_JSON_DEPTH - 1  # the body's own object is the first level
    status, answer = await send(client, method, path, body(template, nest(inner)))
    assert answer != {"error": TOO_DEEP}
    if path.endswith(("/step", "/result", "/retry")):  # these take any JSON value there
        assert status == 200, answer
    else:  # the field is refused for what it is, not for its depth
        assert status == 400 and answer["error"] != TOO_DEEP
    status, answer = await send(client, method, path, body(template, nest(inner + 1)))
    assert (status, answer) == (400, {"error": TOO_DEEP})


async def test_a_deep_utf16_body_is_refused_too(client: TestClient[Any, Any]) -> None:
    """Bytes in UTF-16 cannot be scanned for brackets: the parsed value is."""
    for depth, want in ((MAX_JSON_DEPTH - 1, 200), (MAX_JSON_DEPTH, 400), (900, 400)):
        raw = ('{"tool": "t", "args": ' + arrays(depth) + "}").encode("utf-16")
        status, _ = await send(client, "POST", "/v1/guard/s/step", raw)
        assert status == want, depth


# -- the checks themselves ----------------------------------------------------------


def value_of_depth(depth: int) -> Any:
    value: Any = "leaf"
    for i in range(depth):
        value = [value, 1] if i % 2 else {"k": value, "s": "[{"}
    return value


def test_both_checks_agree_with_the_depth_on_tricky_texts() -> None:
    rng = random.Random(7)
    strings = ['"[[[[{{{{"', '"\\\\"', '"\\"[\\""', '"a\\\\\\"[b"', '"\\u005b"', '"é€[😀"']
    for _ in range(400):
        depth = rng.randint(0, 2 * MAX_JSON_DEPTH)
        text = '"x"'
        for _ in range(depth):
            filler = rng.choice(strings)
            text = rng.choice([f"[{filler},{text}]", f'{{"k{filler[1:]}:{text}}}', f"[{text}]"])
        value = json.loads(text)
        raw = text.encode()
        want = depth > MAX_JSON_DEPTH
        assert depth_over(value) is want
        assert text_depth_over(raw) is want, text
        assert text_depth_over(json.dumps(value, indent=2).encode()) is want


def test_the_checks_answer_any_depth_without_recursion() -> None:
    deep = value_of_depth(200_000)
    assert depth_over(deep)
    assert not depth_over(value_of_depth(MAX_JSON_DEPTH))
    assert depth_over(value_of_depth(MAX_JSON_DEPTH + 1))
    assert text_depth_over(("[" * 1_000_000 + "]" * 1_000_000).encode())
    assert text_depth_over(("[" * 1_000_000).encode())  # not even JSON: still an answer


async def test_the_guard_refuses_deep_values_from_callers_in_process() -> None:
    """Not behind json_body: the guard checks before it walks (on 5,000
    levels, today's json.dumps and yesterday's word walk would recurse)."""
    guard = Guard(parse_config(CONFIG).guard, MemoryEngine())
    deep = value_of_depth(5000)
    problem = f"body: nested deeper than {MAX_JSON_DEPTH} levels"
    with pytest.raises(GuardInputError, match=problem):
        await guard.step("s", {"tool": "t", "args": deep})
    with pytest.raises(GuardInputError, match=problem):
        await guard.result("s", {"tool": "t", "output": deep})
    at_bound = value_of_depth(MAX_JSON_DEPTH - 1)
    assert (await guard.step("s", {"tool": "t", "args": at_bound})).decision == "allow"
    # and the normaliser itself never recurses, whatever it is given
    assert normalize.words(deep) == {"leaf", "1"}
    assert len(normalize.tokens(deep)) == 2 * normalize.TOKEN_WIDTH
