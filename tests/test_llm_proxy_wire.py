"""The LLM proxy's mappings (gateway/llmproxy/openai.py, anthropic.py, wire.py,
session.py) on bodies as the SDKs send them, and its `llm_proxy:` config."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config import ConfigError, parse_config
from gateway.llmproxy.anthropic import Anthropic
from gateway.llmproxy.openai import OpenAI
from gateway.llmproxy.session import fingerprint
from gateway.llmproxy.wire import SseReader, WholeTap

OPENAI_HISTORY: dict[str, Any] = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Brest and Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Brest"}'}},
            {"id": "call_2", "type": "function",
             "function": {"name": "get_weather", "arguments": '{ "city":"Paris" }'}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "grey"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "sun"}]},
        {"role": "tool", "tool_call_id": "call_unknown", "content": "orphan"},
    ],
}  # fmt: skip

ANTHROPIC_HISTORY: dict[str, Any] = {
    "model": "m",
    "system": [{"type": "text", "text": "You are terse."}],
    "messages": [
        {"role": "user", "content": "Weather in Brest?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Brest"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
             "content": [{"type": "text", "text": "timeout"}]},
        ]},
    ],
}  # fmt: skip


def test_openai_tool_events_pair_results_with_their_calls() -> None:
    events = OpenAI().tool_events(OPENAI_HISTORY)
    assert [(e.key, e.kind, e.tool, e.args, e.output) for e in events] == [
        ("step:call_1", "step", "get_weather", {"city": "Brest"}, None),
        ("step:call_2", "step", "get_weather", {"city": "Paris"}, None),
        ("result:call_1", "result", "get_weather", None, "grey"),
        ("result:call_2", "result", "get_weather", None, "sun"),
    ]  # the orphan result has no call to pair with: not fed


def test_anthropic_tool_events_carry_is_error() -> None:
    events = Anthropic().tool_events(ANTHROPIC_HISTORY)
    assert [(e.key, e.kind, e.ok, e.output) for e in events] == [
        ("step:toolu_1", "step", True, None),
        ("result:toolu_1", "result", False, "timeout"),
    ]


def test_calls_without_ids_are_keyed_by_place_and_content() -> None:
    body = json.loads(json.dumps(OPENAI_HISTORY))
    for call in body["messages"][2]["tool_calls"]:
        del call["id"]
    keys = [e.key for e in OpenAI().tool_events(body)]
    assert len(keys) == 2 and len(set(keys)) == 2 and keys[0].startswith("step:#")
    assert keys == [e.key for e in OpenAI().tool_events(body)]  # stable across requests


def test_the_fingerprint_is_anchored_on_the_first_answer() -> None:
    d = OpenAI()
    anchor = d.anchor(OPENAI_HISTORY)
    assert anchor == "ids:call_1,call_2"
    same = fingerprint(d, OPENAI_HISTORY, "Bearer k", anchor)
    assert same is not None and same.startswith("llm-")
    # The same conversation one turn later: the same session.
    longer = {**OPENAI_HISTORY, "messages": [*OPENAI_HISTORY["messages"],
              {"role": "assistant", "content": "Grey and sunny."}]}  # fmt: skip
    assert fingerprint(d, longer, "Bearer k", d.anchor(longer)) == same
    # Another key, or another first answer: another session.
    assert fingerprint(d, OPENAI_HISTORY, "Bearer other", anchor) != same
    assert fingerprint(d, OPENAI_HISTORY, "Bearer k", "ids:call_9") != same
    # Before any answer there is nothing to anchor on.
    assert fingerprint(d, {"messages": [{"role": "user", "content": "hi"}]}, "k", None) is None


def test_the_anchor_read_from_an_answer_is_the_one_its_history_gives() -> None:
    d = OpenAI()
    tap = WholeTap(d)
    answer = {"choices": [{"index": 0, "message": OPENAI_HISTORY["messages"][2]}],
              "usage": {"prompt_tokens": 7, "completion_tokens": 3}}  # fmt: skip
    tap.feed(json.dumps(answer).encode())
    tap.done()
    assert tap.anchor == d.anchor(OPENAI_HISTORY)
    assert (tap.usage.input_tokens, tap.usage.output_tokens) == (7, 3)
    a = Anthropic()
    atap = WholeTap(a)
    atap.feed(json.dumps({"content": ANTHROPIC_HISTORY["messages"][1]["content"]}).encode())
    atap.done()
    assert atap.anchor == a.anchor(ANTHROPIC_HISTORY) == "ids:toolu_1"


def test_anthropic_stream_usage_counts_cached_input() -> None:
    tap = Anthropic().stream_tap({})
    events = [
        {"type": "message_start", "message": {"usage": {
            "input_tokens": 10, "cache_read_input_tokens": 90, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "tool_use", "id": "toolu_7", "name": "x", "input": {}}},
        {"type": "message_delta", "delta": {}, "usage": {"output_tokens": 25}},
    ]  # fmt: skip
    raw = b"".join(f"event: {e['type']}\r\ndata: {json.dumps(e)}\r\n\r\n".encode() for e in events)
    for i in range(0, len(raw), 5):  # cut anywhere, \r\n endings
        assert tap.feed(raw[i : i + 5]) == raw[i : i + 5]
    tap.done()
    assert (tap.usage.input_tokens, tap.usage.output_tokens) == (100, 25)
    assert tap.anchor == "ids:toolu_7"


def test_sse_reader_splits_events_across_chunks() -> None:
    r = SseReader()
    got = r.feed(b"data: a\n\nda") + r.feed(b"ta: b\ndata: c\n") + r.feed(b"\n: comment\n\n")
    assert [d for _, d in got] == ["a", "b\nc", None]
    assert b"".join(raw for raw, _ in got) == b"data: a\n\ndata: b\ndata: c\n\n: comment\n\n"


def test_notes_and_disabled_tools_in_each_api() -> None:
    o = OpenAI().with_note({**OPENAI_HISTORY, "tools": [], "parallel_tool_calls": True}, "N", True)
    assert o["messages"][-1] == {"role": "system", "content": "N"}
    assert o["tool_choice"] == "none" and "parallel_tool_calls" not in o
    a = Anthropic().with_note({**ANTHROPIC_HISTORY, "tools": []}, "N", True)
    assert a["system"][-1] == {"type": "text", "text": "N"} and a["tool_choice"] == {"type": "none"}
    assert Anthropic().with_note({"system": "S"}, "N", False) == {"system": "S\n\nN"}
    assert OPENAI_HISTORY["messages"][-1]["role"] == "tool"  # the agent's body is not changed


# -- configuration --------------------------------------------------------------


def _problems(section: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(f"llm_proxy:\n{section}\n", env={})
    return info.value.problems


def test_an_llm_proxy_alone_is_a_whole_config() -> None:
    cfg = parse_config("llm_proxy:\n  openai:\n", env={})
    assert cfg.bots == [] and cfg.llm_proxy is not None
    assert cfg.llm_proxy.openai is not None and cfg.llm_proxy.anthropic is None
    assert cfg.llm_proxy.openai.upstream == "https://api.openai.com"
    assert parse_config("bots: []\nllm_proxy:\n", env={}).llm_proxy is not None
    with pytest.raises(ConfigError, match=r"^bots: at least one bot is required \(or an llm_pr"):
        parse_config("bots: []\n", env={})


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ("  profile: nope", "llm_proxy.profile: no guard profile named 'nope' (profiles: default)"),
        ("  block_mode: halt", "llm_proxy.block_mode: must be one of: answer, stop"),
        ("  budget: {usd: 2}", "llm_proxy.budget.usd: a budget in dollars needs prices"),
        ("  openai: {upstream: api.openai.com}", "llm_proxy.openai.upstream: must be an http://"),
        (
            "  openai: {upstream: 'http://x/v1?a=1'}",
            "llm_proxy.openai.upstream: must be a base URL",
        ),
        ("  anthropic: {path: llm}", 'llm_proxy.anthropic.path: must be a URL path like "/llm'),
        ("  anthropic: {path: /v1/x}", "llm_proxy.anthropic.path: must not start with a path"),
        ("  openai: {api_key: 7}", "llm_proxy.openai.api_key: "),
        ("  max_body_bytes: 10", "llm_proxy.max_body_bytes: must be >= 1024"),
    ],
)
def test_llm_proxy_config_errors_name_the_key(section: str, problem: str) -> None:
    found = _problems(section)
    assert any(p.startswith(problem) for p in found), found


def test_calls_without_ids_or_text_still_anchor_a_session() -> None:
    d = OpenAI()
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}  # fmt: skip
    body = {"messages": [{"role": "user", "content": "go"}, message]}
    anchor = d.anchor(body)
    assert anchor is not None and anchor.startswith("calls:")
    # The same answer streamed in fragments gives the same anchor.
    tap = d.stream_tap({})
    for delta in ({"role": "assistant"},
                  {"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": ""}}]},
                  {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": '}}]},
                  {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}):  # fmt: skip
        c = {"choices": [{"index": 0, "delta": delta}]}
        tap.feed(b"data: " + json.dumps(c).encode() + b"\n\n")
    tap.done()
    assert tap.anchor == anchor


@pytest.mark.parametrize("page", ["llm-proxy.md", "mcp-proxy.md"])
def test_the_proxy_pages_configs_are_valid_configs(page: str) -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / page).read_text(encoding="utf-8")
    blocks = [b.split("```", 1)[0] for b in text.split("```yaml\n")[1:]]
    assert blocks
    for block in blocks:
        parse_config(block, env={})  # raises ConfigError naming the key


# -- the Responses API ---------------------------------------------------------------

RESPONSES_OUTPUT: list[dict[str, Any]] = [
    {"type": "reasoning", "id": "rs_1", "summary": []},
    {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
     "arguments": '{"city": "Brest"}', "status": "completed"},
    {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_2", "name": "shell",
     "input": "ls -l"},
]  # fmt: skip
RESPONSES_HISTORY: dict[str, Any] = {
    "model": "m",
    "instructions": "You are terse.",
    "input": [
        {"role": "user", "content": "Weather in Brest?"},
        *RESPONSES_OUTPUT,
        {"type": "function_call_output", "call_id": "call_1", "output": "grey"},
        {"type": "custom_tool_call_output", "call_id": "call_2",
         "output": [{"type": "input_text", "text": "total 0"}]},
        {"type": "function_call_output", "call_id": "call_unknown", "output": "orphan"},
    ],
    "tools": [{"type": "function", "name": "get_weather", "parameters": {}}],
}  # fmt: skip


def test_responses_tool_events_pair_outputs_with_their_calls() -> None:
    from gateway.llmproxy.responses import Responses

    events = Responses().tool_events(RESPONSES_HISTORY)
    assert [(e.key, e.kind, e.tool, e.args, e.output) for e in events] == [
        ("step:call_1", "step", "get_weather", {"city": "Brest"}, None),
        ("step:call_2", "step", "shell", "ls -l", None),
        ("result:call_1", "result", "get_weather", None, "grey"),
        ("result:call_2", "result", "shell", None, "total 0"),
    ]  # the orphan output has no call to pair with: not fed
    assert Responses().tool_events({"model": "m", "input": "hi"}) == []


def test_responses_anchor_from_an_answer_whole_or_streamed_is_its_historys() -> None:
    # Breaks if the answer's anchor (whole, or from response.completed in a
    # stream) differs from the one the next request's history gives: every
    # request would then be a conversation's first, and nothing would be fed.
    from gateway.llmproxy.responses import Responses

    d = Responses()
    expected = d.anchor(RESPONSES_HISTORY)
    assert expected == "ids:call_1,call_2"
    answer = {"object": "response", "output": RESPONSES_OUTPUT,
              "usage": {"input_tokens": 9, "output_tokens": 4}}  # fmt: skip
    whole = WholeTap(d)
    whole.feed(json.dumps(answer).encode())
    whole.done()
    streamed = d.stream_tap({"stream": True})
    events = [{"type": "response.created", "response": {**answer, "output": [], "usage": None}},
              {"type": "response.completed", "response": answer}]  # fmt: skip
    raw = b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)
    assert b"".join(streamed.feed(raw[i : i + 7]) for i in range(0, len(raw), 7)) == raw
    streamed.done()
    for tap in (whole, streamed):
        assert tap.anchor == expected
        assert (tap.usage.input_tokens, tap.usage.output_tokens) == (9, 4)
    grey = {"role": "assistant", "content": [{"type": "output_text", "text": "Grey."}]}
    later = {**RESPONSES_HISTORY, "input": [*RESPONSES_HISTORY["input"], grey]}
    same = fingerprint(d, RESPONSES_HISTORY, "k", expected)
    assert same is not None and fingerprint(d, later, "k", d.anchor(later)) == same


@pytest.mark.parametrize("stream", [False, True])
def test_responses_final_answer_and_note_as_the_sdk_reads_them(stream: bool) -> None:
    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    from gateway.llmproxy.responses import Responses

    d = Responses()
    body = {**RESPONSES_HISTORY, "stream": stream}
    raw, kind = d.final_answer(body, "Stopped: grey.")
    if stream:
        assert kind == "text/event-stream"
        events = [TypeAdapter(ResponseStreamEvent).validate_json(line[6:])
                  for line in raw.decode().splitlines() if line.startswith("data: ")]  # fmt: skip
        assert [e.sequence_number for e in events] == list(range(len(events)))
        done = events[-1]
        assert done.type == "response.completed"
        response = done.response
    else:
        assert kind == "application/json"
        response = Response.model_validate_json(raw)
    assert response.output_text == "Stopped: grey." and response.status == "completed"
    noted = d.with_note({"model": "m", "input": "hi", "tools": [{}]}, "note", True)
    assert noted["input"] == [{"role": "user", "content": "hi"},
                              {"role": "system", "content": "note"}]  # fmt: skip
    assert noted["tool_choice"] == "none"
    err = json.loads(d.error(429, "spent", "budget_exhausted"))
    assert err["error"] == {"message": "spent", "type": "insufficient_quota", "param": None,
                            "code": "budget_exhausted"}  # fmt: skip


# -- any shape of body or answer --------------------------------------------------------

FUZZ_EXAMPLES = int(os.environ.get("BOTBOUNCER_FUZZ_EXAMPLES", "150"))
_KEYS = st.sampled_from([
    "model", "messages", "input", "role", "content", "type", "tool_calls", "function", "name",
    "arguments", "input", "id", "call_id", "tool_call_id", "output", "text", "tool_use_id",
    "is_error", "stream", "tools", "tool_choice", "functions", "previous_response_id",
    "conversation", "store", "instructions", "system", "usage", "choices", "message", "delta",
    "response", "index", "stream_options", "include_usage", "prompt_tokens", "input_tokens",
    "output_tokens", "completion_tokens",
])  # fmt: skip
_SCALARS = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6)
    | st.sampled_from(["assistant", "user", "tool", "system", "function_call", "tool_use",
                       "function_call_output", "custom_tool_call", "custom_tool_call_output",
                       "tool_result", "message", "text", "reasoning", "response.completed",
                       "message_start", "message_delta", "content_block_start", "{}"])
)  # fmt: skip
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=5),
    max_leaves=40,
)
_BODIES = st.dictionaries(_KEYS, _JSON, max_size=7)


@settings(max_examples=FUZZ_EXAMPLES * 2, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=_BODIES, answer=_BODIES)
def test_no_shape_of_body_or_answer_makes_a_dialect_fail(body: Any, answer: Any) -> None:
    # Breaks if any dialect raises on a body or an answer it does not expect:
    # the proxy must forward what it cannot read, never answer with a 500.
    # More examples: BOTBOUNCER_FUZZ_EXAMPLES=2000.
    from gateway.llmproxy.responses import Responses
    from gateway.llmproxy.wire import digest

    for d in (OpenAI(), Anthropic(), Responses()):
        d.tool_events(body)
        digest(d.opening(body))
        d.anchor(body)
        json.dumps(d.with_note(body, "note", True))
        d.prepare(body)
        d.continues(body)
        d.continued_as(body, "resp_1")
        d.tool_events(d.continued(body, [["function_call", "c1", "get", "{}"]]))
        d.final_answer(body, "stop")
        whole = WholeTap(d)
        whole.feed(json.dumps(answer).encode())
        whole.done()
        tap = d.stream_tap(body)
        for event in (answer, {"type": "response.completed", "response": answer},
                      {"type": "message_start", "message": answer}):  # fmt: skip
            tap.feed(f"event: x\ndata: {json.dumps(event)}\n\n".encode())
        tap.done()


def test_json_nested_past_the_stack_is_unreadable_not_a_crash() -> None:
    # Breaks if the proxy parses text from outside with a bare json.loads: a
    # value 20,000 arrays deep is a RecursionError there (a traceback, or a
    # stream cut short), not something the proxy passes on unread.
    from gateway.llmproxy.responses import Responses
    from gateway.llmproxy.wire import parse_arguments

    deep = "[" * 20_000 + "]" * 20_000
    assert parse_arguments(deep) == deep  # kept as the text it came as
    for d in (OpenAI(), Anthropic(), Responses()):
        whole = WholeTap(d)
        whole.feed(deep.encode())
        whole.done()
        tap = d.stream_tap({"stream": True})
        event = f"data: {deep}\n\n".encode()
        assert tap.feed(event) in (event, b"")  # passed on (or held whole, never lost)
        tap.done()
