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
from gateway.config.llmproxy import Price
from gateway.llmproxy.anthropic import Anthropic
from gateway.llmproxy.openai import OpenAI
from gateway.llmproxy.session import fingerprint
from gateway.llmproxy.wire import Dialect, SseReader, WholeTap

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


def test_a_usage_the_agent_did_not_ask_for_leaves_no_trace_in_its_stream() -> None:
    # Breaks if only the usage-only chunk is kept back: asked for usage, the
    # upstream writes `"usage":null` in every chunk before it, and the agent
    # got a stream other than the one it asked for.
    from gateway.llmproxy.openai import OpenAIStreamTap

    chunks = [
        {"id": "c", "choices": [{"index": 0, "delta": {"content": "Hi"}}], "usage": None},
        {"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
    ]
    for separators in ((",", ":"), (", ", ": ")):  # compact, as OpenAI writes; or spaced
        raw = b"".join(b"data: " + json.dumps(c, separators=separators).encode() + b"\n\n"
                       for c in chunks) + b"data: [DONE]\n\n"  # fmt: skip
        hidden = OpenAIStreamTap(hide_usage=True)
        out = b"".join(hidden.feed(raw[i : i + 9]) for i in range(0, len(raw), 9)) + hidden.done()
        alone = {"id": "c", "choices": [{"index": 0, "delta": {"content": "Hi"}}]}
        want = b"data: " + json.dumps(alone, separators=separators).encode() + b"\n\n"
        assert out == want + b"data: [DONE]\n\n"
        assert hidden.usage.input_tokens == 3
        kept = OpenAIStreamTap(hide_usage=False)  # the agent asked: as it came
        assert kept.feed(raw) + kept.done() == raw


CALL_TYPES = ("function_call", "custom_tool_call")
OUTPUT_TYPES = ("function_call_output", "custom_tool_call_output")


def first_anchor(d: Dialect, body: dict[str, Any]) -> str | None:
    found = d.anchors(body)
    return found[0] if found else None


def test_the_fingerprint_is_anchored_on_the_first_answer() -> None:
    d = OpenAI()
    anchor = first_anchor(d, OPENAI_HISTORY)
    assert anchor == "ids:call_1"
    same = fingerprint(d, OPENAI_HISTORY, "Bearer k", anchor)
    assert same is not None and same.startswith("llm-")
    # The same conversation one turn later: the same session.
    longer = {**OPENAI_HISTORY, "messages": [*OPENAI_HISTORY["messages"],
              {"role": "assistant", "content": "Grey and sunny."}]}  # fmt: skip
    assert fingerprint(d, longer, "Bearer k", first_anchor(d, longer)) == same
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
    assert tap.anchor == first_anchor(d, OPENAI_HISTORY)
    assert (tap.usage.input_tokens, tap.usage.output_tokens) == (7, 3)
    a = Anthropic()
    atap = WholeTap(a)
    atap.feed(json.dumps({"content": ANTHROPIC_HISTORY["messages"][1]["content"]}).encode())
    atap.done()
    assert atap.anchor == first_anchor(a, ANTHROPIC_HISTORY) == "ids:toolu_1"


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


SSE_STREAM = (
    b"data: a\n\n"
    b"event: e\r\ndata: b\r\ndata: c\r\n\r\n"
    b"data: d\r\r"
    b": comment\n\n"
    b"data:e\r\n\r\n"
    b"data: tail"
)
SSE_EVENTS = [
    (b"data: a\n\n", "a"),
    (b"event: e\r\ndata: b\r\ndata: c\r\n\r\n", "b\nc"),
    (b"data: d\r\r", "d"),
    (b": comment\n\n", None),
    (b"data:e\r\n\r\n", "e"),
]


def test_sse_reader_gives_the_same_events_however_the_stream_is_cut() -> None:
    # Breaks if an event's end (\n\n, \r\n\r\n or \r\r) split across two
    # pieces is missed or found twice, or an event comes out cut or joined
    # to the next: the proxy would lose a usage or a tool call, or hand the
    # agent a stream that is not the upstream's.
    cuts = [(i, j) for i in range(len(SSE_STREAM) + 1) for j in range(i, len(SSE_STREAM) + 1)]
    for i, j in cuts:
        r = SseReader()
        got = r.feed(SSE_STREAM[:i]) + r.feed(SSE_STREAM[i:j]) + r.feed(SSE_STREAM[j:])
        assert (got, r.rest()) == (SSE_EVENTS, b"data: tail"), (i, j)
    r = SseReader()
    got = [e for k in range(len(SSE_STREAM)) for e in r.feed(SSE_STREAM[k : k + 1])]
    assert (got, r.rest(), r.rest()) == (SSE_EVENTS, b"data: tail", b"")


def test_sse_reader_searches_each_byte_of_a_long_event_about_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Breaks if the reader searches the whole unfinished event for its end
    # again with each piece that arrives: a 2 MB event (an image the model
    # made) in 1,460-byte pieces then costs some 1.4 GB searched, seconds
    # of the event loop during which no other request is served.
    # What is measured is the bytes searched, not the time taken.
    import re

    from gateway.llmproxy import wire

    class Counting:
        """The reader's pattern, counting the bytes each search may go through."""

        def __init__(self, pattern: re.Pattern[bytes]) -> None:
            self.pattern, self.searched = pattern, 0

        def search(self, string: bytes, pos: int = 0) -> re.Match[bytes] | None:
            m = self.pattern.search(string, pos)
            self.searched += (m.end() if m else len(string)) - pos
            return m

        def __getattr__(self, name: str) -> Any:  # finditer, split...: the whole of it
            method = getattr(self.pattern, name)

            def counted(string: bytes, *args: Any, **kwargs: Any) -> Any:
                self.searched += len(string)
                return method(string, *args, **kwargs)

            return counted

    counting = Counting(wire._EVENT_END)
    monkeypatch.setattr(wire, "_EVENT_END", counting)
    line = b"data: " + b"QUJD" * 250 + b"\n"  # base64, 1,000 characters a line
    event = b"event: response.output_item.done\n" + line * 2_000 + b"\n"
    r = SseReader()
    got = [e for i in range(0, len(event), 1460) for e in r.feed(event[i : i + 1460])]
    assert got == [(event, "\n".join(["QUJD" * 250] * 2_000))]
    assert r.rest() == b""
    assert counting.searched < 2 * len(event), counting.searched


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


@pytest.mark.parametrize(
    "url", ["https://bob:s3cr3tpass@api.example.com/v1", "http://bob@10.0.0.1:8000", "https://@x"]
)
@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_an_upstream_url_with_a_user_or_password_is_refused(api: str, url: str) -> None:
    # Breaks if an upstream URL with a user info loads: every request with
    # the agent's Authorization is then a 500 (aiohttp will not send both),
    # and the password is in the 502 an agent gets when the upstream is
    # down, and in the WARNING logged.
    assert _problems(f"  {api}: {{upstream: '{url}'}}") == [
        f"llm_proxy.{api}.upstream: must not hold a user name or password (user:password@host): "
        "the key goes in api_key, which may take it from the environment as ${VAR}"
    ]
    cfg = parse_config(f"llm_proxy:\n  {api}: {{upstream: 'https://x/a@b'}}\n", env={})
    assert cfg.llm_proxy is not None  # an @ in the path is no user info
    assert cfg.llm_proxy.apis()[0][1].upstream == "https://x/a@b"


def test_calls_without_ids_or_text_still_anchor_a_session() -> None:
    d = OpenAI()
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}  # fmt: skip
    body = {"messages": [{"role": "user", "content": "go"}, message]}
    anchor = first_anchor(d, body)
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


def results_history(api: str, contents: list[Any], call_id: str = "c") -> dict[str, Any]:
    """A history in `api`'s shape ("openai", "responses", "anthropic"): the
    same `look` call once for each of `contents`, each answered with it."""
    turns: list[Any] = []
    for i, content in enumerate(contents):
        cid = f"{call_id}{i}" if call_id else ""
        if api == "anthropic":
            turns += [
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": cid, "name": "look", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": cid, "content": content}]},
            ]  # fmt: skip
        elif api == "openai":
            turns += [
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": cid, "type": "function",
                     "function": {"name": "look", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": cid, "content": content},
            ]  # fmt: skip
        else:
            turns += [
                {"type": "function_call", "call_id": cid, "name": "look", "arguments": "{}"},
                {"type": "function_call_output", "call_id": cid, "output": content},
            ]
    ask = {"role": "user", "content": "Watch the build."}
    if api == "responses":
        return {"model": "m", "input": [ask, *turns]}
    return {"model": "m", "messages": [ask, *turns]}


def result_outputs(api: str, body: dict[str, Any]) -> list[Any]:
    from gateway.llmproxy.responses import Responses

    dialect = {"openai": OpenAI, "responses": Responses, "anthropic": Anthropic}[api]()
    return [e.output for e in dialect.tool_events(body) if e.kind == "result"]


# A picture, another, and a file, as each API puts them in a tool result.
PICTURE = {
    "anthropic": lambda data: {"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": data}},
    "openai": lambda data: {"type": "image_url", "image_url": {
        "url": f"data:image/png;base64,{data}"}},
    "responses": lambda data: {"type": "input_image", "image_url": f"data:image/png;base64,{data}"},
}  # fmt: skip
A_FILE = {
    "anthropic": {"type": "document", "source": {
        "type": "base64", "media_type": "application/pdf", "data": "JVBERi0x"}},
    "openai": {"type": "file", "file": {"file_id": "file-1"}},
    "responses": {"type": "input_file", "filename": "build.pdf", "file_data": "JVBERi0x"},
}  # fmt: skip
CACHE_MARK = {
    "anthropic": {"cache_control": {"type": "ephemeral"}},
    "openai": {},
    "responses": {"prompt_cache_breakpoint": {"mode": "explicit"}},
}
TEXT_PART = {"anthropic": "text", "openai": "text", "responses": "input_text"}


@pytest.mark.parametrize("api", ["anthropic", "responses", "openai"])
def test_results_that_are_pictures_or_files_are_told_apart(api: str) -> None:
    # Breaks if the parts of a tool result that are not text (Anthropic's
    # image and document blocks, the Responses API's input_image and
    # input_file, Chat Completions' image_url and file) are read as no text
    # at all: a computer-use agent's screenshots, each a different picture,
    # would be one identical result, and the agent blocked (identical_call)
    # while every result changed.
    picture, text = PICTURE[api], TEXT_PART[api]
    contents = [
        [picture("AAAA")],
        [picture("BBBB")],
        [{**picture("AAAA"), **CACHE_MARK[api]}],  # the prompt-cache mark moved onto it
        [{"type": text, "text": "Page 1"}, picture("AAAA")],
        [A_FILE[api]],
    ]
    outputs = result_outputs(api, results_history(api, contents))
    assert len(outputs) == 5
    assert outputs[0] != outputs[1]  # two pictures: two results
    assert outputs[0] == outputs[2]  # one picture: one result, wherever the cache mark is
    assert outputs[3] == "Page 1" + outputs[0]
    kind = PICTURE[api]("")["type"]
    assert outputs[0].startswith(f"[{kind} ") and outputs[0].endswith("]")
    assert outputs[4].startswith(f"[{A_FILE[api]['type']} ")
    assert len(set(outputs)) == 4


@pytest.mark.parametrize("api", ["anthropic", "responses", "openai"])
def test_results_of_text_alone_read_as_they_always_have(api: str) -> None:
    # Breaks if a result of text alone reads otherwise than it always has:
    # the guard compares each new result with the ones it holds for the
    # session, and keeps the key of each event it was fed (a result without
    # a call id is keyed by its text), so every session under way would see
    # its results as new ones.
    text = TEXT_PART[api]
    parts = [{"type": text, "text": "build "}, {"type": text, "text": "at 40%"}]
    assert result_outputs(api, results_history(api, [parts, "build at 40%", []])) == [
        "build at 40%",
        "build at 40%",
        "",
    ]
    if api == "responses":  # a result keyed by its place and text, pinned
        from gateway.llmproxy.responses import Responses

        events = Responses().tool_events(results_history(api, [parts], call_id=""))
        keys = ["step:#1:0e25f723f8c23296", "result:#2:faf4f4aa5d3f50f4"]
        assert [e.key for e in events] == keys


def test_responses_anchor_from_an_answer_whole_or_streamed_is_its_historys() -> None:
    # Breaks if the answer's anchor (whole, or from response.completed in a
    # stream) differs from the one the next request's history gives: every
    # request would then be a conversation's first, and nothing would be fed.
    from gateway.llmproxy.responses import Responses

    d = Responses()
    expected = first_anchor(d, RESPONSES_HISTORY)
    assert expected == "ids:call_1"
    # Each call with its output after it, as an agent may write the history:
    # the same anchor (it was the answer's calls' ids all together, so no
    # request was ever named, and the budget was never asked).
    calls = [i for i in RESPONSES_HISTORY["input"] if i.get("type") in CALL_TYPES]
    outputs = [i for i in RESPONSES_HISTORY["input"] if i.get("type") in OUTPUT_TYPES][:2]
    interleaved = {**RESPONSES_HISTORY, "input": [RESPONSES_HISTORY["input"][0], calls[0],
                                                   outputs[0], calls[1], outputs[1]]}  # fmt: skip
    assert first_anchor(d, interleaved) == expected
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
    assert same is not None and fingerprint(d, later, "k", first_anchor(d, later)) == same


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
    # Breaks if only a request that lists its tools gets them turned off: a
    # stored prompt (`prompt: {id}`) carries its tools on the server, and its
    # loop went on through every block.
    stored = d.with_note({"model": "m", "input": "hi", "prompt": {"id": "pmpt_1"}}, "note", True)
    assert stored["tool_choice"] == "none"
    # Breaks if the note is an input item of a request the upstream keeps in
    # a conversation (or a response chain): it stayed in that context, the
    # tools said off, for every turn after.
    for kept in ({"conversation": "conv_1"}, {"previous_response_id": "resp_1"}):
        body = {"model": "m", "input": [{"role": "user", "content": "go on"}], **kept}
        noted = d.with_note(body, "note", True)
        assert noted["input"] == body["input"] and noted["instructions"] == "note"
        noted = d.with_note({**body, "instructions": "Be brief."}, "note", False)
        assert noted["instructions"] == "Be brief.\n\nnote" and "tool_choice" not in noted
    err = json.loads(d.error(429, "spent", "budget_exhausted"))
    assert err["error"] == {"message": "spent", "type": "insufficient_quota", "param": None,
                            "code": "budget_exhausted"}  # fmt: skip


def stop_answer(api: str, body: dict[str, Any]) -> tuple[str, str]:
    """What final_answer writes for `body`, whole or streamed: ("text", its
    text) or ("refusal", its text), as the API's own fields say it."""
    from gateway.llmproxy.responses import Responses

    dialect = {"openai": OpenAI, "responses": Responses, "anthropic": Anthropic}[api]()
    raw, _ = dialect.final_answer(body, "Stopped.")
    if body.get("stream"):
        events = [json.loads(line[6:]) for line in raw.decode().splitlines()
                  if line.startswith("data: {")]  # fmt: skip
    else:
        events = [json.loads(raw)]
    said: dict[str, str] = {}
    for e in events:
        if api == "openai":
            for c in e["choices"]:
                for field in ("content", "refusal"):
                    part = (c.get("message") or c["delta"]).get(field)
                    said[field] = said.get(field, "") + (part or "")
        elif api == "responses":
            for item in e.get("output", e.get("response", {}).get("output", [])):
                for part in item["content"]:
                    said[part["type"]] = part.get("text") or part.get("refusal")
        else:
            message = e.get("message", e)
            for block in message.get("content", []):
                said["text"] = block["text"]
            said["text"] = said.get("text", "") + e.get("delta", {}).get("text", "")  # streamed
            for stop in (message, e.get("delta", {})):
                if stop.get("stop_reason") == "refusal":
                    said["refusal"] = stop["stop_details"]["explanation"]
    [(kind, text)] = [(k, v) for k, v in said.items() if v]
    return {"content": "text", "output_text": "text"}.get(kind, kind), text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(
    ("api", "asks", "kind"),
    [
        ("openai", {}, "text"),
        ("openai", {"response_format": {"type": "text"}}, "text"),
        ("openai", {"response_format": {"type": "json_object"}}, "refusal"),
        ("openai", {"response_format": {"type": "json_schema", "json_schema": {}}}, "refusal"),
        ("responses", {"text": {"format": {"type": "text"}}}, "text"),
        ("responses", {"text": {"format": {"type": "json_object"}}}, "refusal"),
        ("responses", {"text": {"format": {"type": "json_schema", "schema": {}}}}, "refusal"),
        ("anthropic", {"output_config": {"effort": "low"}}, "text"),
        ("anthropic", {"output_config": {"format": {"type": "json_schema"}}}, "refusal"),
        ("anthropic", {"output_format": {"type": "json_schema"}}, "refusal"),
    ],
)
def test_a_stop_answer_is_a_refusal_where_json_is_asked_and_text_elsewhere(
    api: str, asks: dict[str, Any], kind: str, stream: bool
) -> None:
    # Breaks if block_mode: stop answers in text a request that asks for its
    # answer in JSON (the SDKs parse that text, and raise), or in a refusal
    # one that does not (the agent reads a text answer).
    assert stop_answer(api, {"model": "m", "stream": stream, **asks}) == (kind, "Stopped.")


# -- any shape of body or answer --------------------------------------------------------

FUZZ_EXAMPLES = int(os.environ.get("BOTBOUNCER_FUZZ_EXAMPLES", "150"))
_KEYS = st.sampled_from([
    "model", "messages", "input", "role", "content", "type", "tool_calls", "function", "name",
    "arguments", "input", "id", "call_id", "tool_call_id", "output", "text", "tool_use_id",
    "is_error", "stream", "tools", "tool_choice", "functions", "previous_response_id",
    "conversation", "store", "instructions", "system", "usage", "choices", "message", "delta",
    "response", "index", "stream_options", "include_usage", "prompt_tokens", "input_tokens",
    "output_tokens", "completion_tokens", "response_format", "format", "output_config",
    "output_format",
])  # fmt: skip
_SCALARS = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6)
    | st.sampled_from(["assistant", "user", "tool", "system", "function_call", "tool_use",
                       "function_call_output", "custom_tool_call", "custom_tool_call_output",
                       "tool_result", "message", "text", "reasoning", "response.completed",
                       "message_start", "message_delta", "content_block_start", "{}",
                       "json_schema", "image"])
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
        first_anchor(d, body)
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


def test_a_price_splits_input_read_from_and_written_to_the_cache() -> None:
    price = Price(input=3, output=15, cached_input=0.3, cache_write=3.75)
    # 1,000 plain, 8,000 read, 1,000 written, 500 out (Anthropic's 10,000 input)
    assert price.cost(10_000, 8_000, 1_000, 500) == pytest.approx(
        (1_000 * 3 + 8_000 * 0.3 + 1_000 * 3.75 + 500 * 15) / 1e6
    )
    plain = Price(input=3, output=15)  # the input price for all input when none is given
    assert plain.cost(10_000, 8_000, 1_000, 0) == pytest.approx(10_000 * 3 / 1e6)
    # counts an upstream got wrong (more cached than input) never cost less than nothing
    assert price.cost(100, 500, 500, 0) == pytest.approx(100 * 0.3 / 1e6)
