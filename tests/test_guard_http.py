"""The agent guard over HTTP: one script of agent sessions gives byte-identical
answers on memory and on Redis; status codes and the OpenAPI document. (The
fuzzer is in test_http_fuzz.py.)"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from gateway.config import parse_config
from gateway.guard.engine import MemoryEngine, RedisEngine
from gateway.guard.openapi import OPENAPI
from gateway.guard.service import REASONS, Guard
from gateway.http import HttpServer
from gateway.store import MemoryStore
from gateway.store.redis import RedisStore
from tests.conftest import delete_prefix
from tests.redis_server import free_port

GUARD = """
guard:
  profiles:
    default:
      subagents: {tools: [researcher]}
      retry: {prechecks: {invoice: "INV-\\\\d+"}}
      budget: {usd: 2.0}
    strict: {identical: {warn_at: 1, block_at: 2}}
bots: [{name: a, platform: http, backend: {type: echo}}]
"""


@asynccontextmanager
async def served(kind: str, redis_url: str, prefix: str) -> AsyncIterator[TestClient[Any, Any]]:
    config = parse_config(GUARD).guard
    if kind == "memory":
        store: Any = MemoryStore()
        guard = Guard(config, MemoryEngine())
    else:
        store = RedisStore.from_url(redis_url, prefix=prefix)
        guard = Guard(config, RedisEngine(store))
    server = HttpServer(store, guard=guard)
    async with TestClient(TestServer(server.app)) as client:
        yield client
    if kind == "redis":
        await delete_prefix(store, prefix)
        await store.close()


# One script: (method, path, body), covering every endpoint and detector.
def script() -> list[tuple[str, str, Any]]:
    calls: list[tuple[str, str, Any]] = []

    def post(session: str, op: str, body: Any, query: str = "") -> None:
        calls.append(("POST", f"/v1/guard/{session}/{op}{query}", body))

    for _ in range(4):
        post("loop", "step", {"tool": "search", "args": {"q": "same"}})
    for t in ["open", "search"] * 3:
        post("cycle", "step", {"tool": t, "args": {}})
    for pct in (10, 60, 100):
        post("poll", "step", {"tool": "status", "args": {"job": 1}, "input_tokens": 900})
        post("poll", "result", {"tool": "status", "ok": True, "output": {"pct": pct}})
    for i in range(5):
        post("fail", "step", {"tool": "deploy", "args": {"n": i}})
        post("fail", "result", {"tool": "deploy", "ok": False, "output": "boom"})
    for i in range(4):
        post("sub", "step", {"tool": "researcher", "args": {"task": i}})
        post("sub", "result", {"tool": "researcher", "output": f"report {i}"})
    post("retry", "retry", {"task": "invoice", "input": "no number", "error": "x"})
    for _ in range(3):
        post("retry", "retry", {"task": "summary", "input": "text"})
    for s, t in [
        ("billing", "subs"),
        ("subs", "billing"),
        ("billing", "subs"),
        ("subs", "billing"),
    ]:
        post("hand", "handoff", {"source": s, "target": t})
    for q in ("refund policy?", "What is the refund policy", "the refund policy please"):
        post("kb", "kb-query", {"question": q, "confidence": 0.3})
    for cost in (1.0, 0.7, 0.5):
        post("money", "usage", {"cost_usd": cost, "tokens": 1000})
    post("money", "step", {"tool": "search", "args": {}})
    for size in (100, 200, 400, 800):
        post("ctx", "step", {"tool": f"t{size}", "args": {}, "input_tokens": size})
    post("strict", "step", {"tool": "x", "args": {}}, "?profile=strict")
    post("strict", "step", {"tool": "x", "args": {}})  # another profile: 409
    post("bad", "step", {"tool": ""})
    post("bad", "step", {"tool": "x"}, "?profile=nope")
    post("bad", "usage", {"cost_usd": -1})
    calls.append(("GET", "/v1/guard/loop", None))
    calls.append(("GET", "/v1/guard/never", None))
    calls.append(("DELETE", "/v1/guard/loop", None))
    calls.append(("GET", "/v1/guard/loop", None))
    return calls


async def run_script(client: TestClient[Any, Any]) -> list[tuple[int, Any]]:
    out = []
    for method, path, body in script():
        async with client.request(method, path, json=body) as resp:
            payload = await resp.json()
            if isinstance(payload.get("state"), dict):  # timestamps differ between runs
                payload["state"].pop("created_at", None)
                payload["state"].pop("updated_at", None)
            out.append((resp.status, payload))
    return out


async def test_the_same_sessions_answer_identically_on_memory_and_redis(
    redis_url: str, key_prefix: str
) -> None:
    async with served("memory", redis_url, key_prefix) as mem:
        on_memory = await run_script(mem)
    async with served("redis", redis_url, key_prefix) as red:
        on_redis = await run_script(red)
    assert json.dumps(on_memory, sort_keys=True) == json.dumps(on_redis, sort_keys=True)
    # and the script says what it should
    statuses = [s for s, _ in on_memory]
    reasons = [b.get("reason") for _, b in on_memory]
    assert statuses[:4] == [200, 200, 429, 429] and reasons[2] == "identical_call"
    assert "tool_cycle" in reasons and "failure_streak" in reasons
    assert "subagent_call_limit" in reasons and "input_missing_prerequisite_signal" in reasons
    assert "retry_limit" in reasons and "handoff_revisit" in reasons
    assert "kb_requery" in reasons and "budget_exhausted" in reasons
    assert "context_growth" in reasons
    assert statuses[-9:-4] == [200, 409, 400, 400, 400]
    assert statuses[-4:] == [200, 404, 200, 404]
    for status, body in on_memory:
        if status in (200, 429) and "decision" in body:
            assert set(body) == {"session", "decision", "reason", "message", "evidence", "also",
                                 "budget", "steps"}  # fmt: skip
            assert body["reason"] in REASONS and body["message"]
        elif status >= 400:
            assert set(body) == {"error"}


async def test_the_openapi_document_describes_every_route(redis_url: str, key_prefix: str) -> None:
    async with (
        served("memory", redis_url, key_prefix) as client,
        client.get("/v1/guard/openapi.json") as resp,
    ):
        assert resp.status == 200
        doc = await resp.json()
    assert doc == json.loads(json.dumps(OPENAPI))
    assert doc["openapi"].startswith("3.")
    ops = {path.rsplit("/", 1)[-1] for path in doc["paths"] if path.count("/") == 4}
    assert ops == {"step", "result", "retry", "handoff", "kb-query", "usage"}
    step = doc["components"]["schemas"]["StepBody"]
    assert step["required"] == ["tool"] and step["additionalProperties"] is False
    answer = doc["components"]["schemas"]["Answer"]
    assert set(answer["properties"]["reason"]["enum"]) == set(REASONS)


async def test_a_store_that_is_down_is_a_503_not_a_500() -> None:
    dead = RedisStore.from_url(f"redis://127.0.0.1:{free_port()}/0", prefix="x")
    server = HttpServer(dead, guard=Guard(parse_config(GUARD).guard, RedisEngine(dead)))
    async with (
        TestClient(TestServer(server.app)) as client,
        client.post("/v1/guard/s/step", json={"tool": "x"}) as resp,
    ):
        assert resp.status == 503
        assert "unavailable" in (await resp.json())["error"]
    await dead.close()


async def test_guard_answers_are_counted_in_metrics(redis_url: str, key_prefix: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    async with served("memory", redis_url, key_prefix) as client:
        for _ in range(3):
            await client.post("/v1/guard/m/step", json={"tool": "x"})
        async with client.get("/metrics") as resp:
            text = await resp.text()
    counts = {
        (s.labels["decision"], s.labels["reason"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "botbouncer_guard_checks"
        for s in family.samples
        if s.name.endswith("_total")
    }
    assert counts == {("allow", "ok"): 1, ("warn", "identical_call"): 1,
                      ("block", "identical_call"): 1}  # fmt: skip


def test_sighup_applies_new_guard_profiles() -> None:
    from gateway.daemon import Daemon

    daemon = Daemon(parse_config(GUARD))
    assert "strict" in daemon.guard.config.profiles
    new = parse_config(GUARD.replace("strict:", "careful:"))
    assert daemon.reload(new) == []  # no restart needed
    assert set(daemon.guard.config.profiles) == {"default", "careful"}


async def test_a_session_read_over_http_matches_its_documented_schema(
    redis_url: str, key_prefix: str
) -> None:
    """The answer of GET /v1/guard/{session} has exactly the fields the
    OpenAPI document's SessionView names."""
    async with served("memory", redis_url, key_prefix) as client:
        async with client.post("/v1/guard/s1/step", json={"tool": "t", "args": {"a": 1}}) as r:
            assert r.status == 200
        async with client.get("/v1/guard/s1") as resp:
            body = await resp.json()
    schema = OPENAPI["components"]["schemas"]["SessionView"]
    assert body["session"] == "s1"
    assert set(body["state"]) == set(schema["properties"]) == set(schema["required"])
    call = OPENAPI["components"]["schemas"]["CallView"]
    assert set(body["state"]["recent_calls"][0]) == set(call["properties"])
