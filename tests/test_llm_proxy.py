"""The LLM API proxy end to end: the real openai and anthropic SDKs, pointed
at a daemon on Redis in front of a fake upstream (tests/fakes/llm)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import signal
import time
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
import anthropic
import openai
import pydantic
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from gateway.llmproxy import session as sessions
from gateway.llmproxy.wire import with_key
from gateway.store import StoreError
from gateway.store.failover import FailoverStore
from tests.fakes.forward_proxy import ForwardProxy
from tests.fakes.llm import Behaviour, Exchange, FakeLLM, answer, hang, repeat_tool_call, status
from tests.llm_proxy import (
    WEATHER_TOOL,
    WEATHER_TOOL_ANTHROPIC,
    WEATHER_TOOL_RESPONSES,
    anthropic_agent,
    anthropic_client,
    openai_agent,
    openai_client,
    proxy_daemon,
    raw_post,
    refused_by_both,
    responses_agent,
    weather,
)
from tests.redis_server import RedisServer

# tool_choice, as each API spells it
NONE = {"openai": "none", "responses": "none", "anthropic": {"type": "none"}}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", ["openai", "responses", "anthropic"])
async def test_the_sdks_tool_loop_ends_with_an_answer(
    redis_url: str, key_prefix: str, api: str, stream: bool
) -> None:
    async with FakeLLM() as llm:
        llm.default = repeat_tool_call("get_weather", {"city": "Brest"}, otherwise="Grey, 11 C.")
        async with proxy_daemon(llm, redis_url, key_prefix) as (_, url):
            if api == "openai":
                client = openai_client(f"{url}/llm/openai/v1")
                answer, ran = await openai_agent(client, "Weather in Brest?", stream=stream)
            elif api == "responses":
                client = openai_client(f"{url}/llm/openai/v1")
                answer, ran = await responses_agent(client, "Weather in Brest?", stream=stream)
            else:
                aclient = anthropic_client(f"{url}/llm/anthropic")
                answer, ran = await anthropic_agent(aclient, "Weather in Brest?", stream=stream)
    assert answer == "Grey, 11 C."
    assert ran == 4
    assert llm.count == 5
    assert llm.calls[-1].body["tool_choice"] == NONE[api]  # tools disabled on the last call
    assert all("tool_choice" not in c.body for c in llm.calls[:-1])  # and on no other


# -- what the guard's decisions do to the request ---------------------------------


@pytest.mark.parametrize("api", ["openai", "responses"])
async def test_a_warning_is_a_note_and_tools_stay_on(
    redis_url: str, key_prefix: str, api: str
) -> None:
    agent, items = (openai_agent, "messages") if api == "openai" else (responses_agent, "input")
    async with FakeLLM() as llm:
        llm.default = repeat_tool_call("get_weather", {"city": "Brest"}, otherwise="Grey.")
        async with proxy_daemon(llm, redis_url, key_prefix) as (_, url):
            await agent(openai_client(f"{url}/llm/openai/v1"), "Weather in Brest?")
    route = "/v1/chat/completions" if api == "openai" else "/v1/responses"
    assert [c.path for c in llm.calls] == [route] * 5
    # The 3rd identical call (sent back with the 4th request) is a warning.
    warned = llm.calls[3].body
    assert warned is not None and "tool_choice" not in warned
    note = warned[items][-1]
    assert note["role"] == "system"
    assert note["content"].startswith("botbouncer (loop guard): You called get_weather")
    # The request before it went out as the agent sent it: no note.
    assert all(m.get("role") != "system" for m in llm.calls[2].body[items])  # type: ignore[index]


@pytest.mark.parametrize("kept", ["previous_response_id", "conversation"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_responses_chained_on_the_server_are_one_session_and_stop(
    redis_url: str, key_prefix: str, stream: bool, kept: str
) -> None:
    # Breaks if a request that continues a stored response, or adds to a
    # conversation the upstream keeps (it carries only the new
    # function_call_output items), is not paired with the calls of the answer
    # it continues (nothing fed: the loop never ends), or is not taken for
    # the same session (each would be a session of its own).
    async with FakeLLM() as llm:
        llm.default = repeat_tool_call("get_weather", {"city": "Brest"}, otherwise="Grey, 11 C.")
        async with proxy_daemon(llm, redis_url, key_prefix) as (d, url):
            client = openai_client(f"{url}/llm/openai/v1")
            how: dict[str, Any] = (
                {"conversation": f"conv_{key_prefix}"} if kept == "conversation"
                else {"chained": True}
            )  # fmt: skip
            answer, ran = await responses_agent(client, "Weather in Brest?", stream=stream, **how)
            session = {c.headers.get("x-botbouncer-session") for c in llm.calls}
            actions = {a: d.metrics.llm_requests.labels("openai", a)._value.get()
                       for a in ("forwarded", "noted", "tools_disabled")}  # fmt: skip
    assert (answer, ran, llm.count) == ("Grey, 11 C.", 4, 5)
    assert all(kept in c.body for c in llm.calls[1:])  # type: ignore[operator]
    for c in llm.calls[1:]:  # only the new output (and, on the last two, the guard's note)
        assert c.body is not None and c.body["input"][0]["type"] == "function_call_output"
        assert not [i for i in c.body["input"] if i.get("type") == "function_call"]
    assert llm.calls[-1].tool_choice == "none"
    assert all(c.tool_choice is None for c in llm.calls[:-1])
    assert actions == {"forwarded": 3, "noted": 1, "tools_disabled": 1}
    assert session == {None}


@pytest.mark.parametrize(
    ("header", "streamed"), [(True, False), (False, False), (True, True)],
    ids=["header", "fingerprint", "streamed"],
)  # fmt: skip
async def test_background_responses_are_fed_and_counted_once_when_fetched(
    redis_url: str, key_prefix: str, header: bool, streamed: bool
) -> None:
    # Breaks if a response made in the background (answered queued, no
    # output, no usage; fetched finished with GET /v1/responses/<id>) is
    # relayed unread: its usage never reached the budget and its calls never
    # reached the requests that continue it, so a looping agent in background
    # mode was never stopped; or if a finished response fetched twice counts
    # twice.
    async with FakeLLM() as llm:
        llm.default = repeat_tool_call("get_weather", {"city": "Brest"}, otherwise="Grey, 11 C.")
        llm.background_polls = 0 if streamed else 1  # in progress at a first fetch
        budget = {"tokens": 1_000_000}
        async with proxy_daemon(llm, redis_url, key_prefix, budget=budget) as (d, url):
            headers = {"X-Botbouncer-Session": f"bg-{key_prefix}"} if header else {}
            client = openai_client(f"{url}/llm/openai/v1", default_headers=headers)
            answer, ran = await responses_agent(
                client, "Weather in Brest?", chained=True, background=True, fetch_streamed=streamed
            )
            first = next(iter(llm.background))
            again = await client.responses.retrieve(first)  # a third fetch
            async for event in await client.responses.retrieve(first, stream=True):  # a fourth
                assert event.type == "response.completed"
            assert d.llm_proxy is not None
            chained = await d.llm_proxy.chains.recall("response:" + first)
            assert chained is not None
            session = chained.session
            await d.inflight.idle()
            state = await d.guard.state(session)
    assert (answer, ran) == ("Grey, 11 C.", 4)  # the loop stopped as in the foreground
    assert again.status == "completed"
    assert llm.calls_to("responses")[-1].tool_choice == "none"
    assert state is not None
    written = sum(r["usage"]["input_tokens"] + r["usage"]["output_tokens"]
                  for r in llm.background.values())  # fmt: skip
    assert state["spent"]["tokens"] == written, state["spent"]
    assert len(llm.background) == 5


async def spent_tokens(d: Any, session: str) -> int:
    """The session's tokens spent, once the daemon has finished what it was
    relaying (usage is counted after the agent has the answer)."""
    await d.inflight.idle()
    state = await d.guard.state(session)
    assert state is not None, f"no guard session {session}"
    return int(state["spent"]["tokens"])


def session_client(url: str, session: str) -> openai.AsyncOpenAI:
    return openai_client(f"{url}/llm/openai/v1", default_headers={sessions.HEADER: session})


async def test_a_background_response_counts_once_however_late_it_is_fetched_again(
    redis_url: str, key_prefix: str
) -> None:
    # Breaks if what makes a finished response count once lapses before the
    # record of it does: fetched again a day later (the claim's TTL), it
    # counted again.
    async with FakeLLM() as llm, proxy_daemon(llm, redis_url, key_prefix) as (d, url):
        session = f"bg-late-{key_prefix}"
        client = session_client(url, session)
        queued = await client.responses.create(model="gpt-test", input="Hi", background=True)
        done = await client.responses.retrieve(queued.id)
        assert done.usage is not None
        once = await spent_tokens(d, session)
        claims = aioredis.from_url(redis_url)
        try:
            async for claim in claims.scan_iter(match=f"{key_prefix}:claim:llm-bg:*"):
                await claims.delete(claim)  # a day later, the claim lapsed
        finally:
            await claims.aclose()
        await client.responses.retrieve(queued.id)
        twice = await spent_tokens(d, session)
    assert once == twice == done.usage.input_tokens + done.usage.output_tokens


async def test_a_background_stream_dropped_and_resumed_is_counted(
    redis_url: str, key_prefix: str
) -> None:
    # Breaks if a background stream's id is read only from its last event:
    # a stream that dropped before it (what background mode is for; the
    # agent resumes it with GET /v1/responses/<id>?stream=true) was never
    # counted, nor its tool calls given to the requests that continue it.
    async with FakeLLM() as llm:
        llm.default = repeat_tool_call("get_weather", {"city": "Brest"}, otherwise="Grey.")
        llm.background_stream_seconds = 0.3
        async with proxy_daemon(llm, redis_url, key_prefix) as (d, url):
            session = f"bg-drop-{key_prefix}"
            headers = {sessions.HEADER: session, "Authorization": "Bearer sk-test"}
            body = {"model": "gpt-test", "input": "Weather in Brest?", "background": True,
                    "stream": True, "tools": [WEATHER_TOOL_RESPONSES]}  # fmt: skip
            async with aiohttp.ClientSession() as http:
                route = f"{url}/llm/openai/v1/responses"
                async with http.post(route, json=body, headers=headers) as resp:
                    assert (await resp.content.readline()).startswith(b"event: response.created")
            client = openai_client(f"{url}/llm/openai/v1", default_headers=headers)
            [made] = llm.background
            resumed = [e async for e in await client.responses.retrieve(made, stream=True)]
            assert [e.type for e in resumed] == ["response.completed"]
            await d.inflight.idle()
            state = await d.guard.state(session)
            assert d.llm_proxy is not None
            chained = await d.llm_proxy.chains.recall("response:" + made)
    usage = llm.background[made]["usage"]
    assert state is not None
    assert state["spent"]["tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert chained is not None and [c[2] for c in chained.calls] == ["get_weather"]


async def test_a_background_stream_read_to_its_end_counts_once_however_often_fetched(
    redis_url: str, key_prefix: str
) -> None:
    async with FakeLLM() as llm, proxy_daemon(llm, redis_url, key_prefix) as (d, url):
        session = f"bg-whole-{key_prefix}"
        client = session_client(url, session)
        events = await client.responses.create(
            model="gpt-test", input="Hi", background=True, stream=True
        )
        [done] = [e.response async for e in events if e.type == "response.completed"]
        for _ in range(2):
            await client.responses.retrieve(done.id)
        spent = await spent_tokens(d, session)
    assert done.usage is not None
    assert spent == done.usage.input_tokens + done.usage.output_tokens


async def test_a_background_response_is_kept_by_digests_not_by_its_prompt(
    redis_url: str, key_prefix: str
) -> None:
    # Breaks if the record of a background response of a conversation not
    # named yet keeps the opening itself: the whole first user turn (an
    # inline file, a patient's record) sat in Redis for the state TTL, up to
    # max_body_bytes a request, where a digest is all the fingerprint takes.
    secret = "PATIENT-RECORD-" + "x" * 600_000
    async with FakeLLM() as llm, proxy_daemon(llm, redis_url, key_prefix) as (d, url):
        client = openai_client(f"{url}/llm/openai/v1")
        await client.responses.create(model="gpt-test", input=secret, background=True)
        await d.inflight.idle()
        kept = aioredis.from_url(redis_url)
        try:
            [key] = [k async for k in kept.scan_iter(match=f"{key_prefix}:cursor:llm-bg:*")]
            record = await kept.get(key)
        finally:
            await kept.aclose()
    assert record is not None and len(record) < 1024 and b"PATIENT" not in record


async def test_a_background_response_is_kept_before_the_agent_has_its_id(
    redis_url: str, key_prefix: str
) -> None:
    # Breaks if the proxy keeps a background response only after the agent
    # has its id: fetched at once through another replica, finished, it was
    # relayed unread there and never counted. A slow store write on the
    # replica that made it shows the order.
    async with FakeLLM() as llm, AsyncExitStack() as stack:
        a, url_a = await stack.enter_async_context(proxy_daemon(llm, redis_url, key_prefix))
        b, url_b = await stack.enter_async_context(proxy_daemon(llm, redis_url, key_prefix))
        assert a.llm_proxy is not None
        mark = a.llm_proxy.background.mark
        slow = asyncio.Event()

        async def slow_mark(response_id: str, pending: Any) -> None:
            await asyncio.sleep(0.2)
            await mark(response_id, pending)
            slow.set()

        a.llm_proxy.background.mark = slow_mark  # type: ignore[method-assign]
        session = f"bg-race-{key_prefix}"
        queued = await session_client(url_a, session).responses.create(
            model="gpt-test", input="Hi", background=True
        )
        assert slow.is_set(), "the agent had the id before the response was kept"
        done = await session_client(url_b, session).responses.retrieve(queued.id)
        await a.inflight.idle()
        spent = await spent_tokens(b, session)
    assert done.usage is not None
    assert spent == done.usage.input_tokens + done.usage.output_tokens


@pytest.mark.parametrize("background", [False, True])
async def test_a_large_whole_answer_arrives_as_written_background_or_not(
    redis_url: str, key_prefix: str, background: bool
) -> None:
    # Breaks if a background request's whole answer, held until the response
    # is kept, is written wrong once it passes what is held (an upstream that
    # answers background requests at once, finished): a chunk went out twice.
    written = {"id": "resp_big", "object": "response", "status": "completed", "model": "m",
               "output": [{"type": "message", "id": "msg_1", "role": "assistant",
                           "content": [{"type": "output_text", "text": "x" * 1_200_000}]}],
               "usage": {"input_tokens": 3, "output_tokens": 5, "total_tokens": 8}}  # fmt: skip

    async def in_pieces(ex: Exchange) -> web.StreamResponse:
        """Past HELD_AT_MOST, in 64 KiB writes, without a Content-Length."""
        data = json.dumps(written).encode()
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(ex.request)
        for i in range(0, len(data), 1 << 16):
            await resp.write(data[i : i + (1 << 16)])
            await asyncio.sleep(0)
        await resp.write_eof()
        return resp

    async with FakeLLM() as llm:
        llm.background_ignored = True
        llm.default = Behaviour("in_pieces", in_pieces)
        async with proxy_daemon(llm, redis_url, key_prefix) as (d, url):
            body = {"model": "m", "input": "hi", "background": background}
            headers = {"Authorization": "Bearer sk-test", sessions.HEADER: f"big-{key_prefix}"}
            async with aiohttp.ClientSession() as http:
                route = f"{url}/llm/openai/v1/responses"
                async with http.post(route, json=body, headers=headers) as resp:
                    got = json.loads(await resp.read())
            await d.inflight.idle()
    assert got == written


async def sse_post(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[dict[str, Any] | None, str]:
    """A streamed Responses request sent raw: its response.completed
    response (None when the stream broke first) and its guard header."""
    async with http.post(url, json=body, headers=headers) as resp:
        try:
            text = (await resp.read()).decode()
        except aiohttp.ClientPayloadError:
            return None, "dropped"
    for line in text.splitlines():
        if line.startswith("data: ") and '"response.completed"' in line:
            return json.loads(line[6:])["response"], resp.headers.get("X-Botbouncer-Guard", "")
    return None, "no response.completed"


async def test_a_chained_background_stream_loop_stops_as_in_the_foreground(
    redis_url: str, key_prefix: str
) -> None:
    # Breaks if a background stream read to its end keeps its tool calls
    # under no key: a request continuing it (previous_response_id) was fed
    # nothing, and the loop ran until the agent's own turn limit.
    async with FakeLLM() as llm:
        llm.default = repeat_tool_call("get_weather", {"city": "Brest"}, otherwise="Grey.")
        async with proxy_daemon(llm, redis_url, key_prefix) as (_, url):
            route = f"{url}/llm/openai/v1/responses"
            headers = {sessions.HEADER: f"bgs-{key_prefix}", "Authorization": "Bearer sk-test"}
            base = {"model": "gpt-test", "background": True, "stream": True,
                    "tools": [WEATHER_TOOL_RESPONSES]}  # fmt: skip
            async with aiohttp.ClientSession() as http:
                answer, _ = await sse_post(http, route, {**base, "input": "Weather?"}, headers)
                turns = 1
                while answer is not None and turns < 8:
                    calls = [i for i in answer["output"] if i["type"] == "function_call"]
                    if not calls:
                        break
                    out = {"type": "function_call_output", "call_id": calls[0]["call_id"],
                           "output": weather("Brest")}  # fmt: skip
                    body = {**base, "previous_response_id": answer["id"], "input": [out]}
                    answer, _ = await sse_post(http, route, body, headers)
                    turns += 1
    assert turns == 5  # as the same loop in the foreground: the 5th with tools off
    assert llm.calls_to("responses")[-1].tool_choice == "none"


async def test_a_retry_of_a_dropped_stream_keeps_its_block(redis_url: str, key_prefix: str) -> None:
    # Breaks if a (not background) stream that breaks after response.created
    # keeps its answer's id with no calls: that replaced the conversation's
    # kept calls, and the agent's retry of the blocked request, its results
    # paired with nothing, went out again with tools on.
    async def created_then_broken(ex: Exchange) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(ex.request)
        started = {"id": "resp_broken", "object": "response", "status": "in_progress"}
        event = {"type": "response.created", "sequence_number": 0, "response": started}
        await resp.write(f"event: response.created\ndata: {json.dumps(event)}\n\n".encode())
        assert ex.request.transport is not None
        ex.request.transport.abort()  # the upstream breaks off
        return resp

    async with FakeLLM() as llm:
        llm.default = repeat_tool_call("get_weather", {"city": "Brest"}, otherwise="Grey.")
        async with proxy_daemon(llm, redis_url, key_prefix) as (_, url):
            route = f"{url}/llm/openai/v1/responses"
            headers = {sessions.HEADER: f"conv-drop-{key_prefix}",
                       "Authorization": "Bearer sk-test"}  # fmt: skip
            base = {"model": "gpt-test", "stream": True, "conversation": f"conv_{key_prefix}",
                    "tools": [WEATHER_TOOL_RESPONSES]}  # fmt: skip
            async with aiohttp.ClientSession() as http:
                answer, _ = await sse_post(http, route, {**base, "input": "Weather?"}, headers)
                for turn in range(2, 6):
                    assert answer is not None
                    [call] = [i for i in answer["output"] if i["type"] == "function_call"]
                    out = {"type": "function_call_output", "call_id": call["call_id"],
                           "output": weather("Brest")}  # fmt: skip
                    body = {**base, "input": [out]}
                    if turn == 5:
                        llm.then(Behaviour("created_then_broken", created_then_broken))
                    answer, _ = await sse_post(http, route, body, headers)
                await sse_post(http, route, body, headers)  # the agent retries it unchanged
    assert llm.calls[-2].tool_choice == "none"  # the 5th: blocked, tools off
    assert llm.calls[-1].tool_choice == "none", "the retry went out with tools on"


async def test_a_background_answer_of_no_session_counts_in_the_metrics(
    redis_url: str, key_prefix: str
) -> None:
    # Breaks if a background answer of no session (no header, no tool
    # calls) is left out of botbouncer_llm_tokens, as a foreground one is not.
    async with FakeLLM() as llm, proxy_daemon(llm, redis_url, key_prefix) as (d, url):
        client = openai_client(f"{url}/llm/openai/v1")
        for background in (False, True):
            tokens = d.metrics.llm_tokens.labels("openai", "output")
            before = tokens._value.get()
            events = await client.responses.create(
                model="gpt-test", input="Hi", stream=True, background=background
            )
            [done] = [e.response async for e in events if e.type == "response.completed"]
            await d.inflight.idle()
            assert done.usage is not None
            assert tokens._value.get() - before == done.usage.output_tokens, background


async def test_warn_note_off_forwards_warned_requests_untouched(
    redis_url: str, key_prefix: str
) -> None:
    async with FakeLLM() as llm:
        llm.default = repeat_tool_call("get_weather", {"city": "Brest"}, otherwise="Grey.")
        async with proxy_daemon(llm, redis_url, key_prefix, warn_note=False) as (_, url):
            _, ran = await openai_agent(openai_client(f"{url}/llm/openai/v1"), "Brest?")
    assert ran == 4
    assert all(m["role"] != "system" for c in llm.calls[:-1] for m in c.messages)
    assert llm.calls[-1].body["tool_choice"] == "none"  # the block still acts


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_block_mode_stop_answers_without_the_model(
    redis_url: str, key_prefix: str, stream: bool
) -> None:
    async with FakeLLM() as llm:
        llm.default = repeat_tool_call("get_weather", {"city": "Brest"}, obey=False)
        async with proxy_daemon(llm, redis_url, key_prefix, block_mode="stop") as (_, url):
            answer, ran = await openai_agent(
                openai_client(f"{url}/llm/openai/v1"), "Brest?", stream=stream
            )
            a_answer, a_ran = await anthropic_agent(
                anthropic_client(f"{url}/llm/anthropic"), "Brest?", stream=stream
            )
            r_answer, r_ran = await responses_agent(
                openai_client(f"{url}/llm/openai/v1"), "Brest?", stream=stream
            )
    # The model (which never stops asking) was called 4 times per agent: the
    # 5th request was answered by the proxy.
    assert (ran, a_ran, r_ran) == (4, 4, 4)
    assert llm.count == 12
    for text in (answer, a_answer, r_answer):
        assert text.startswith("[botbouncer (loop guard): identical_call] You called get_weather")


class Forecast(pydantic.BaseModel):
    city: str
    sky: str


# get_weather as chat.completions.parse() takes it: strict, its arguments parsed too.
STRICT_TOOL = {"type": "function", "function": {**WEATHER_TOOL["function"], "strict": True}}  # type: ignore[dict-item]


async def parsing_agent(url: str, api: str, stream: bool) -> Any:
    """The tool loop of each API's guide with the answer asked as a Forecast
    through the SDK's parse() (or its stream): the last answer, as parsed."""
    ask = {"role": "user", "content": "Weather in Brest?"}
    history: list[Any] = [ask]
    for _ in range(10):
        if api == "openai":
            client = openai_client(f"{url}/llm/openai/v1")
            kw: dict[str, Any] = {"model": "gpt-test", "messages": history,
                                  "tools": [STRICT_TOOL], "response_format": Forecast}  # fmt: skip
            if stream:
                async with client.chat.completions.stream(**kw) as s:
                    completion = await s.get_final_completion()
            else:
                completion = await client.chat.completions.parse(**kw)
            msg = completion.choices[0].message
            if not msg.tool_calls:
                return msg
            history.append(msg.model_dump(include={"role", "content", "tool_calls"}))
            calls = [(c.id, c.function.arguments) for c in msg.tool_calls]
            history += [{"role": "tool", "tool_call_id": i, "content": weather(**json.loads(a))}
                        for i, a in calls]  # fmt: skip
        elif api == "responses":
            client = openai_client(f"{url}/llm/openai/v1")
            kw = {"model": "gpt-test", "input": history, "tools": [WEATHER_TOOL_RESPONSES],
                  "text_format": Forecast}  # fmt: skip
            if stream:
                async with client.responses.stream(**kw) as rs:
                    response = await rs.get_final_response()
            else:
                response = await client.responses.parse(**kw)
            made = [i for i in response.output if i.type == "function_call"]
            if not made:
                return response
            for c in made:
                history.append({"type": "function_call", "call_id": c.call_id, "name": c.name,
                                "arguments": c.arguments})  # fmt: skip
                history.append({"type": "function_call_output", "call_id": c.call_id,
                                "output": weather(**json.loads(c.arguments))})  # fmt: skip
        else:
            aclient = anthropic_client(f"{url}/llm/anthropic")
            kw = {"model": "claude-test", "max_tokens": 1024, "messages": history,
                  "tools": [WEATHER_TOOL_ANTHROPIC], "output_format": Forecast}  # fmt: skip
            if stream:
                async with aclient.messages.stream(**kw) as ms:
                    message = await ms.get_final_message()
            else:
                message = await aclient.messages.parse(**kw)
            if message.stop_reason != "tool_use":
                return message
            history.append({"role": "assistant", "content": message.content})
            history.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": b.id, "content": weather(**b.input)}
                for b in message.content if b.type == "tool_use"]})  # fmt: skip
    raise AssertionError("the agent never answered")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", ["openai", "responses", "anthropic"])
async def test_block_mode_stop_refuses_an_answer_asked_in_a_schema(
    redis_url: str, key_prefix: str, api: str, stream: bool
) -> None:
    # Breaks if, with block_mode: stop, the proxy's answer to a request that
    # asks for its answer in a JSON schema (as the SDKs' parse() and the
    # Agents SDK's output_type do) is plain text: the SDK validates it as
    # the schema's JSON and raises in the agent, instead of ending its loop.
    # A refusal is returned unparsed.
    async with FakeLLM() as llm:
        llm.default = repeat_tool_call("get_weather", {"city": "Brest"}, obey=False)
        async with proxy_daemon(llm, redis_url, key_prefix, block_mode="stop") as (_, url):
            last = await parsing_agent(url, api, stream)
    assert llm.count == 4  # the 5th request was answered by the proxy
    said = "[botbouncer (loop guard): identical_call] You called get_weather"
    if api == "openai":
        assert (last.content, last.parsed) == (None, None)
        assert last.refusal.startswith(said)
    elif api == "responses":
        assert (last.output_parsed, last.output_text) == (None, "")
        [message] = last.output
        assert [p.type for p in message.content] == ["refusal"]
        assert message.content[0].refusal.startswith(said)
    else:
        assert (last.stop_reason, last.content, last.parsed_output) == ("refusal", [], None)
        assert last.stop_details.explanation.startswith(said)


SCREENSHOT_TOOL = {
    "name": "screenshot",
    "description": "A picture of the screen",
    "input_schema": {"type": "object", "properties": {}},
}


@pytest.mark.parametrize("screen", ["changing", "still"])
async def test_screenshots_are_one_result_only_when_the_picture_is(
    redis_url: str, key_prefix: str, screen: str
) -> None:
    # Breaks if a tool result that is an image is read as no text at all: a
    # computer-use agent watching a screen that changes, screenshot after
    # screenshot, is warned and then blocked (identical_call) as if nothing
    # changed. A screen that does not change is still a loop.
    async with FakeLLM() as llm:
        llm.default = repeat_tool_call("screenshot", otherwise="The build is green.")
        async with proxy_daemon(llm, redis_url, key_prefix) as (_, url):
            client = anthropic_client(f"{url}/llm/anthropic")
            messages: list[Any] = [{"role": "user", "content": "Tell me when the build is green."}]
            for shot in range(6):
                message = await client.messages.create(
                    model="claude-test", max_tokens=1024, messages=messages, tools=[SCREENSHOT_TOOL]
                )
                messages.append({"role": "assistant", "content": message.content})
                if message.stop_reason != "tool_use":
                    break
                screen_bytes = f"screen {shot if screen == 'changing' else 0}".encode()
                picture = {"type": "base64", "media_type": "image/png",
                           "data": base64.b64encode(screen_bytes).decode()}  # fmt: skip
                messages.append({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": b.id,
                     "content": [{"type": "image", "source": picture}]}
                    for b in message.content if b.type == "tool_use"]})  # fmt: skip
    choices = [c.tool_choice for c in llm.calls]
    noted = ["loop guard" in json.dumps((c.body or {}).get("system")) for c in llm.calls]
    if screen == "changing":
        assert (choices, noted) == ([None] * 6, [False] * 6)
    else:  # the 3rd identical screenshot is a warning, the 4th a block
        assert choices == [None] * 4 + [NONE["anthropic"]]
        assert noted == [False] * 3 + [True, True]


# -- budgets -----------------------------------------------------------------------


@pytest.mark.parametrize("api", ["openai", "responses", "anthropic"])
async def test_a_spent_budget_is_a_429_the_sdk_does_not_retry(
    redis_url: str, key_prefix: str, api: str
) -> None:
    async with FakeLLM() as llm:
        llm.default = answer("Fine.", usage=(600, 100))
        budget = {"budget": {"tokens": 1500}}
        async with proxy_daemon(llm, redis_url, key_prefix, **budget) as (d, url):
            headers = {"X-Botbouncer-Session": "budget-run-1"}
            if api == "openai":
                client = openai_client(f"{url}/llm/openai/v1", max_retries=2)
                ask = lambda: client.chat.completions.create(  # noqa: E731
                    model="m", messages=[{"role": "user", "content": "hi"}], extra_headers=headers
                )
                refused: type[Exception] = openai.RateLimitError
            elif api == "responses":
                client = openai_client(f"{url}/llm/openai/v1", max_retries=2)
                ask = lambda: client.responses.create(  # noqa: E731
                    model="m", input="hi", extra_headers=headers
                )
                refused = openai.RateLimitError
            else:
                aclient = anthropic_client(f"{url}/llm/anthropic", max_retries=2)
                ask = lambda: aclient.messages.create(  # noqa: E731
                    model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}],
                    extra_headers=headers,
                )  # fmt: skip
                refused = anthropic.RateLimitError
            await ask()  # 700 tokens
            await ask()  # 1400: 93 %, a warning (a note on the next request)
            await ask()  # 2100: spent, counted after the answer
            with pytest.raises(refused) as caught:
                await ask()
            state = await d.guard.state("budget-run-1")
            name = "anthropic" if api == "anthropic" else "openai"  # the config's section
            refusals = d.metrics.llm_requests.labels(name, "budget_exhausted")._value.get()
    assert llm.count == 3  # the 4th never reached the model
    assert refusals == 1  # and the SDK did not ask again (x-should-retry: false)
    err = caught.value
    assert err.status_code == 429
    assert "budget is spent" in str(err)
    assert state is not None and state["spent"]["tokens"] == 2100


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", ["openai", "responses", "anthropic"])
async def test_input_read_from_the_prompt_cache_costs_its_own_price(
    redis_url: str, key_prefix: str, api: str, stream: bool
) -> None:
    # Breaks if cached input is priced as any input: an agent whose prompt
    # is mostly cached (a coding agent's, 90 % here) had its dollar budget
    # spent five times faster than its bill, and was stopped early.
    async with FakeLLM() as llm:
        llm.default = answer("Fine.", usage=(100_000, 1_000), cached=90_000)
        prices = {"m": {"input": 10, "output": 20, "cached_input": 1}}
        proxy = {"prices": prices, "budget": {"usd": 100}}
        async with proxy_daemon(llm, redis_url, key_prefix, **proxy) as (d, url):
            headers = {"X-Botbouncer-Session": f"cached-{api}-{stream}"}
            said = [{"role": "user", "content": "hi"}]
            if api == "openai":
                chat = openai_client(f"{url}/llm/openai/v1").chat.completions
                got = await chat.create(model="m", messages=said, stream=stream,
                                        extra_headers=headers)  # fmt: skip
            elif api == "responses":
                responses = openai_client(f"{url}/llm/openai/v1").responses
                got = await responses.create(model="m", input="hi", stream=stream,
                                             extra_headers=headers)  # fmt: skip
            else:
                messages = anthropic_client(f"{url}/llm/anthropic").messages
                got = await messages.create(model="m", max_tokens=10, messages=said,
                                            stream=stream, extra_headers=headers)  # fmt: skip
            if stream:
                async for _ in got:  # type: ignore[union-attr]
                    pass
            state = await d.guard.state(headers["X-Botbouncer-Session"])
    # 10,000 at $10, 90,000 cached at $1, 1,000 out at $20 a million tokens
    assert state is not None
    assert state["spent"] == {"usd": pytest.approx(0.1 + 0.09 + 0.02), "tokens": 101_000}


# -- sessions ----------------------------------------------------------------------


async def test_two_conversations_alike_are_two_sessions(redis_url: str, key_prefix: str) -> None:
    """Same key, same question, no session header, at the same time: had they
    been one session, their identical calls would add up and each agent would
    be stopped after about two tool runs."""
    async with FakeLLM() as llm:
        llm.default = repeat_tool_call("get_weather", {"city": "Brest"}, otherwise="Grey.")
        async with proxy_daemon(llm, redis_url, key_prefix) as (_, url):
            client = openai_client(f"{url}/llm/openai/v1")
            runs = await asyncio.gather(
                openai_agent(client, "Weather in Brest?"),
                openai_agent(client, "Weather in Brest?"),
                anthropic_agent(anthropic_client(f"{url}/llm/anthropic"), "Weather in Brest?"),
            )
    assert [ran for _, ran in runs] == [4, 4, 4]
    sessions = {c.headers.get("x-botbouncer-session") for c in llm.calls}
    assert sessions == {None}  # the proxy's own header is not forwarded


async def test_the_session_is_named_in_the_answer_and_can_be_looked_up(
    redis_url: str, key_prefix: str
) -> None:
    async with FakeLLM() as llm:
        llm.default = repeat_tool_call("get_weather", {"city": "Brest"}, otherwise="Grey.")
        async with proxy_daemon(llm, redis_url, key_prefix) as (_, url):
            client = openai_client(f"{url}/llm/openai/v1")
            seen: list[Any] = []
            messages: list[Any] = [{"role": "user", "content": "Brest?"}]
            for _ in range(5):
                raw = await client.chat.completions.with_raw_response.create(
                    model="m", messages=messages, tools=[WEATHER_TOOL]
                )
                seen.append(raw.headers)
                msg = raw.parse().choices[0].message.model_dump(exclude_none=True)
                messages.append(msg)
                for call in msg.get("tool_calls", []):
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": "ok"})
            session = seen[1]["x-botbouncer-session"]
            async with aiohttp.ClientSession() as http, http.get(f"{url}/v1/guard/{session}") as r:
                state = (await r.json())["state"]
    # The first request has no session yet (no answer to anchor it on).
    assert "x-botbouncer-session" not in seen[0]
    assert session.startswith("llm-")
    assert {h["x-botbouncer-session"] for h in seen[1:]} == {session}
    assert [h.get("x-botbouncer-guard") for h in seen] == [
        None, None, None, "warn identical_call", "block identical_call"
    ]  # fmt: skip
    assert state["profile"] == "default"
    assert state["tools"]["get_weather"]["calls"] == 3  # the blocked 4th is not recorded
    assert state["spent"]["tokens"] > 0  # every answer's usage, the first one's too


async def test_three_daemons_on_one_redis_share_a_budget(redis_url: str, key_prefix: str) -> None:
    async with FakeLLM() as llm, AsyncExitStack() as stack:
        llm.default = answer("Fine.", usage=(600, 100))
        urls = []
        for _ in range(3):
            _, url = await stack.enter_async_context(
                proxy_daemon(llm, redis_url, key_prefix, budget={"tokens": 2000})
            )
            urls.append(url)
        clients = [openai_client(f"{u}/llm/openai/v1") for u in urls]
        headers = {"X-Botbouncer-Session": "shared-run"}
        answered = 0
        for i in range(6):
            try:
                await clients[i % 3].chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], extra_headers=headers
                )
                answered += 1
            except openai.RateLimitError:
                break
        refused = []
        for client in clients:
            with pytest.raises(openai.RateLimitError) as caught:
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], extra_headers=headers
                )
            refused.append(caught.value.status_code)
    # 700 tokens an answer: the third takes the session past 2,000, whichever
    # daemon counted the first two, and every daemon refuses the next.
    assert answered == 3
    assert refused == [429, 429, 429]


# -- the upstream ------------------------------------------------------------------


async def test_other_routes_pass_through(redis_url: str, key_prefix: str) -> None:
    async with FakeLLM() as llm:
        llm.models = ["fake-a", "fake-b"]
        async with proxy_daemon(llm, redis_url, key_prefix) as (_, url):
            o = await openai_client(f"{url}/llm/openai/v1").models.list()
            a = await anthropic_client(f"{url}/llm/anthropic").models.list()
            embeddings = f"{url}/llm/openai/v1/embeddings?x=1"
            async with aiohttp.ClientSession() as http, http.post(embeddings, json={}) as resp:
                missing = resp.status, await resp.json()
    assert [m.id for m in o.data] == ["fake-a", "fake-b"]
    assert [m.id for m in a.data] == ["fake-a", "fake-b"]
    assert missing[0] == 404 and "Unknown request URL" in missing[1]["error"]["message"]
    assert llm.calls[-1].path == "/v1/embeddings"


@pytest.mark.parametrize("code", [400, 401, 500, 529])
async def test_upstream_errors_pass_through_with_their_status(
    redis_url: str, key_prefix: str, code: int
) -> None:
    async with FakeLLM() as llm:
        llm.default = status(code, "upstream says no")
        async with proxy_daemon(llm, redis_url, key_prefix) as (_, url):
            o, a = await refused_by_both(url)
    assert (o.status_code, a.status_code) == (code, code)
    assert "upstream says no" in str(o) and "upstream says no" in str(a)


async def test_the_upstream_is_reached_through_the_proxy_the_environment_names(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Breaks if the LLM proxy ignores HTTP(S)_PROXY, which the SDKs it stands
    # in for honour: on a host whose only way out is a proxy, every agent
    # pointed at the daemon got a 502.
    async with FakeLLM() as llm, ForwardProxy() as forward:
        llm.default = answer("Fine.")
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", forward.url)
        async with proxy_daemon(llm, redis_url, key_prefix) as (_, url):
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            async with (  # aiohttp, unlike the SDKs, ignores the environment by default
                aiohttp.ClientSession() as http,
                http.post(f"{url}/llm/openai/v1/chat/completions", json=body) as resp,
            ):
                assert resp.status == 200, await resp.text()
    assert len(forward.seen) == 1 and forward.seen[0].endswith("/chat/completions")


async def test_an_unreachable_upstream_is_a_502_in_the_apis_shape(
    redis_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with FakeLLM() as llm:
        pass  # stopped: its port answers nothing now
    async with proxy_daemon(llm, redis_url, key_prefix) as (d, url):
        o, a = await refused_by_both(url)
        counted = {
            (s.labels["api"], s.labels.get("action") or s.labels["how"]): s.value
            for m in (d.metrics.llm_requests, d.metrics.llm_failed)
            for c in m.collect()
            for s in c.samples
            if s.name.endswith("_total")
        }
    assert o.status_code == 502 and a.status_code == 502
    # One request each: counted once by what was done, once by how it failed,
    # so a sum over the actions is the number of requests.
    assert counted == {
        ("openai", "forwarded"): 1, ("openai", "unreachable"): 1,
        ("anthropic", "forwarded"): 1, ("anthropic", "unreachable"): 1,
    }  # fmt: skip
    assert o.body["code"] == "upstream_unreachable"  # type: ignore[index]
    assert a.body["error"]["type"] == "api_error"  # type: ignore[index]
    assert "is unreachable" in str(o)
    ours = [r for r in caplog.records if r.name.startswith("botbouncer")]
    assert [r.levelname for r in ours] == ["WARNING", "WARNING"]
    assert all("unreachable" in r.getMessage() and r.exc_info is None for r in ours)


async def test_a_slow_upstream_is_a_504(redis_url: str, key_prefix: str) -> None:
    async with FakeLLM() as llm:
        llm.default = hang()
        timeouts = {"read_seconds": 0.3}
        async with proxy_daemon(llm, redis_url, key_prefix, timeouts=timeouts) as (_, url):
            with pytest.raises(openai.APIStatusError) as o:
                await openai_client(f"{url}/llm/openai/v1").chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}]
                )
    assert o.value.status_code == 504
    assert o.value.body["code"] == "upstream_timeout"  # type: ignore[index]


def scripted(parts: list[bytes], pause: float = 0.0, content_type: str = "text/event-stream",
             cut: bool = False) -> Behaviour:  # fmt: skip
    """Answers exactly `parts`, one write each, `pause` seconds after the
    first; `cut` drops the connection instead of ending the answer."""

    async def run(ex: Exchange) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": content_type})
        await resp.prepare(ex.request)
        for i, part in enumerate(parts):
            await resp.write(part)
            if i == 0 and pause:
                await asyncio.sleep(pause)
        if cut:
            assert ex.request.transport is not None
            ex.request.transport.abort()
            return resp
        await resp.write_eof()
        return resp

    return Behaviour("scripted", run)


def chunk(content: str | None = None, usage: bool = False) -> bytes:
    body: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk", "created": 1,
                            "model": "m", "choices": []}  # fmt: skip
    if content is not None:
        body["choices"] = [{"index": 0, "delta": {"content": content}, "finish_reason": None}]
    if usage:
        body["usage"] = {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def test_a_stream_passes_as_it_arrives_byte_for_byte(redis_url: str, key_prefix: str) -> None:
    parts = [chunk("Hel"), chunk("lo"), b"data: [DONE]\n\n"]
    async with FakeLLM() as llm:
        llm.then(scripted(parts, pause=1.0))
        async with proxy_daemon(llm, redis_url, key_prefix) as (_, url):
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            code, headers, got, first_at = await raw_post(
                f"{url}/llm/openai/v1/chat/completions", body
            )
    assert code == 200 and headers["Content-Type"] == "text/event-stream"
    assert got == b"".join(parts)
    assert first_at < 0.9  # the first chunk came before the upstream's pause ended


async def test_stream_usage_is_read_without_the_agent_seeing_it(
    redis_url: str, key_prefix: str
) -> None:
    parts = [chunk("Hi"), chunk(usage=True), b"data: [DONE]\n\n"]
    async with FakeLLM() as llm:
        llm.then(scripted(parts), scripted(parts))
        async with proxy_daemon(llm, redis_url, key_prefix) as (d, url):
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            target = f"{url}/llm/openai/v1/chat/completions"
            _, _, hidden, _ = await raw_post(target, body, **{"X-Botbouncer-Session": "s-1"})
            asked = {**body, "stream_options": {"include_usage": True}}
            _, _, shown, _ = await raw_post(target, asked, **{"X-Botbouncer-Session": "s-1"})
            state = await d.guard.state("s-1")
    # The proxy asked for the usage the agent did not, and kept it back.
    assert llm.calls[0].body["stream_options"] == {"include_usage": True}
    assert hidden == chunk("Hi") + b"data: [DONE]\n\n"
    assert shown == b"".join(parts)  # asked for: passed on
    assert state is not None and state["spent"]["tokens"] == 84


async def test_the_usage_request_is_added_to_the_agents_own_bytes(
    redis_url: str, key_prefix: str
) -> None:
    # The request goes on as the agent wrote it, the one key added at its
    # end: not parsed and written anew (which cost a JSON encoding of the
    # whole history before the first byte, and changed its spacing).
    raw = b'{"model": "m",\n "stream": true, "messages": [{"role": "user", "content": "hi"}]}\n'
    async with FakeLLM() as llm:
        llm.then(scripted([chunk("Hi"), chunk(usage=True), b"data: [DONE]\n\n"]))
        async with (
            proxy_daemon(llm, redis_url, key_prefix) as (_, url),
            aiohttp.ClientSession() as http,
        ):
            target = f"{url}/llm/openai/v1/chat/completions"
            headers = {"Content-Type": "application/json"}
            async with http.post(target, data=raw, headers=headers) as resp:
                assert resp.status == 200
                await resp.read()
    sent = raw.rstrip()[:-1] + b',"stream_options":{"include_usage":true}}'
    assert llm.calls[0].raw == sent


def test_a_key_is_added_to_a_json_objects_bytes() -> None:
    for raw in [b"{}", b' {"a": 1} ', b'{"a": [1, {}]}\r\n', b'{\n  "a": "}"\n}\n', b"{ }"]:
        added = with_key(raw, "k", {"v": True})
        assert added is not None and json.loads(added) == {**json.loads(raw), "k": {"v": True}}
    assert with_key(b"[1, 2]", "k", 1) is None  # not an object
    assert with_key('{"a": 1}'.encode("utf-16"), "k", 1) is None  # JSON, not UTF-8


async def test_an_answer_cut_off_mid_stream_closes_the_agents_connection(
    redis_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with FakeLLM() as llm:
        llm.then(scripted([chunk("Hel")], cut=True))
        async with proxy_daemon(llm, redis_url, key_prefix) as (_, url):
            client = openai_client(f"{url}/llm/openai/v1")
            got = []
            with pytest.raises(openai.APIError):
                stream = await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], stream=True
                )
                async for c in stream:
                    got.append(c.choices[0].delta.content)
    assert got == ["Hel"]
    assert "upstream broke off its answer" in caplog.text


async def test_whole_answers_pass_byte_for_byte(redis_url: str, key_prefix: str) -> None:
    whole = b'{"id":"x","object":"chat.completion","choices":[],  "odd": "spacing"}'
    async with FakeLLM() as llm:
        llm.then(scripted([whole], content_type="application/json"))
        async with proxy_daemon(llm, redis_url, key_prefix) as (_, url):
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            code, _, got, _ = await raw_post(f"{url}/llm/openai/v1/chat/completions", body)
    assert (code, got) == (200, whole)


# -- credentials and bad input ------------------------------------------------------


async def test_credentials_pass_through_and_are_never_logged_or_kept(
    redis_url: str, key_prefix: str, redis_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with FakeLLM() as llm:
        llm.require_key("sk-test-key")
        llm.default = repeat_tool_call("get_weather", {"city": "Brest"}, otherwise="Grey.")
        async with proxy_daemon(llm, redis_url, key_prefix) as (_, url):
            await openai_agent(openai_client(f"{url}/llm/openai/v1"), "Brest?")
            stored = [
                (k, await redis_client.dump(k))
                async for k in redis_client.scan_iter(f"{key_prefix}:*")
            ]
    assert all(c.headers["authorization"] == "Bearer sk-test-key" for c in llm.calls)
    assert stored  # the guard's state and the events fed are there...
    assert not any(b"sk-test-key" in (v or b"") or "sk-test-key" in k for k, v in stored)
    assert "sk-test-key" not in caplog.text  # ...and the key nowhere


async def test_a_configured_key_replaces_the_agents(redis_url: str, key_prefix: str) -> None:
    async with FakeLLM() as llm:
        llm.require_key("sk-real")
        llm.default = answer("Fine.")
        root = llm.anthropic_base_url
        keyed = {"openai": {"upstream": root, "api_key": "sk-real"},
                 "anthropic": {"upstream": root, "api_key": "sk-real"}}  # fmt: skip
        async with proxy_daemon(llm, redis_url, key_prefix, **keyed) as (d, url):
            o = await openai_client(f"{url}/llm/openai/v1").chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
            a = await anthropic_client(f"{url}/llm/anthropic").messages.create(
                model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
            )
            shown = repr(d.config.llm_proxy)
    assert o.choices[0].message.content == "Fine." and a.content[0].text == "Fine."  # type: ignore[union-attr]
    assert llm.calls[0].headers["authorization"] == "Bearer sk-real"
    assert llm.calls[1].headers["x-api-key"] == "sk-real"
    assert "authorization" not in llm.calls[1].headers
    assert "sk-real" not in shown


async def test_bad_input_is_answered_in_the_apis_shape(redis_url: str, key_prefix: str) -> None:
    async with (
        FakeLLM() as llm,
        proxy_daemon(llm, redis_url, key_prefix, max_body_bytes=2048) as (_, url),
    ):
        with pytest.raises(openai.BadRequestError) as bad:
            await openai_client(f"{url}/llm/openai/v1").chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}],
                extra_headers={"X-Botbouncer-Session": "no spaces allowed"},
            )  # fmt: skip
        with pytest.raises(anthropic.APIStatusError) as big:
            await anthropic_client(f"{url}/llm/anthropic").messages.create(
                model="m", max_tokens=5, messages=[{"role": "user", "content": "x" * 4000}]
            )
        code, _, _, _ = await raw_post(f"{url}/llm/openai/v1/chat/completions", {"a": 1})
    assert "X-Botbouncer-Session header: use 1-128 of" in str(bad.value)
    assert big.value.status_code == 413
    assert big.value.body["error"]["type"] == "request_too_large"  # type: ignore[index]
    assert "llm_proxy.max_body_bytes (2048 bytes)" in str(big.value)
    # A body the proxy cannot read as a conversation is the upstream's to judge.
    assert (code, llm.count, llm.calls[0].body) == (200, 1, {"a": 1})


async def test_a_body_nested_past_the_stack_is_forwarded_unread(
    redis_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Breaks if the proxy parses the request with a bare json.loads: 20,000
    # nested arrays are a RecursionError there, answered 500 with a
    # traceback, not forwarded for the upstream to judge.
    deep = b'{"model": "m", "messages": [{"role": "user", "content": ' + b"[" * 20_000
    deep += b"]" * 20_000 + b"}]}"
    async with FakeLLM() as llm, proxy_daemon(llm, redis_url, key_prefix) as (d, url):
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{url}/llm/openai/v1/chat/completions", data=deep) as resp,
        ):
            status, said = resp.status, await resp.json()
        passed = d.metrics.llm_requests.labels("openai", "passthrough")._value.get()
    assert (status, llm.count, passed) == (400, 1, 1)  # the fake's own refusal, relayed
    assert said["error"]["message"].startswith("We could not parse the JSON body")
    ours = ("botbouncer", "aiohttp")  # not a client an earlier test left to the collector
    assert not [r for r in caplog.records if r.exc_info and r.name.startswith(ours)]


async def test_a_stop_lets_an_answer_in_flight_finish(redis_url: str, key_prefix: str) -> None:
    parts = [chunk("Hel"), chunk("lo"), b"data: [DONE]\n\n"]
    async with FakeLLM() as llm:
        llm.then(scripted(parts, pause=2.0))  # past the listener's 1 s shutdown timeout
        async with proxy_daemon(llm, redis_url, key_prefix) as (d, url):
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            asking = asyncio.create_task(raw_post(f"{url}/llm/openai/v1/chat/completions", body))
            await asyncio.sleep(0.3)  # the upstream has sent its first part and pauses
            await d.stop()  # within the grace period (10 s)
            code, _, got, _ = await asking
    assert (code, got) == (200, b"".join(parts))


async def test_a_tool_event_the_guard_cannot_take_is_not_a_refusal(
    redis_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "botbouncer.llm_proxy")
    name = "t" * 300  # over the guard's 200 characters
    call = {"id": "call_1", "type": "function", "function": {"name": name, "arguments": "{}"}}
    body = {"model": "m", "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
    ]}  # fmt: skip
    async with FakeLLM() as llm:
        llm.default = answer("Done.")
        async with proxy_daemon(llm, redis_url, key_prefix) as (_, url):
            code, _, got, _ = await raw_post(f"{url}/llm/openai/v1/chat/completions", body)
    assert code == 200 and json.loads(got)["choices"][0]["message"]["content"] == "Done."
    assert llm.calls[0].body == body  # forwarded untouched
    assert "a step of 'tttt" in caplog.text and "not fed to the guard" in caplog.text


async def test_a_failing_store_forwards_unguarded(
    redis_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with FakeLLM() as llm:
        llm.default = repeat_tool_call("get_weather", {"city": "Brest"}, otherwise="Grey.")
        async with proxy_daemon(llm, redis_url, key_prefix) as (d, url):
            client = openai_client(f"{url}/llm/openai/v1")

            async def broken(*args: Any, **kw: Any) -> Any:
                raise StoreError("redis guard batch failed: Connection refused")

            d.guard.feed = broken  # type: ignore[method-assign]
            with pytest.raises(AssertionError, match="never answered in 6 turns"):
                await openai_agent(client, "Brest?", turns=6)
            opened = d.metrics.llm_requests.labels("openai", "fail_open")._value.get()
    assert opened == 5  # every request but the first (which has nothing to feed)
    assert all(c.tool_choice is None for c in llm.calls)
    assert "forwarded unguarded" in caplog.text


async def test_an_agent_that_leaves_mid_stream_is_not_the_upstreams_fault(
    redis_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    parts = [chunk("Hel"), *[chunk("lo " * 2000) for _ in range(50)], b"data: [DONE]\n\n"]
    async with FakeLLM() as llm:
        llm.then(scripted(parts, pause=0.3))
        async with proxy_daemon(llm, redis_url, key_prefix) as (d, url):
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            async with (
                aiohttp.ClientSession() as http,
                http.post(f"{url}/llm/openai/v1/chat/completions", json=body) as resp,
            ):
                await resp.content.readany()  # the first part, then gone
            await asyncio.sleep(1.0)  # the upstream's rest meets a closed connection
            left = d.metrics.llm_failed.labels("openai", "agent_left")._value.get()
            broke = d.metrics.llm_failed.labels("openai", "upstream_broke")._value.get()
    assert (left, broke) == (1, 0)
    assert "upstream broke off" not in caplog.text


async def test_the_new_events_of_a_request_go_to_the_guard_in_one_call(
    redis_url: str, key_prefix: str
) -> None:
    # Breaks if the proxy feeds each tool call and result in a call (and on
    # Redis a round trip) of its own: three parallel calls and their results
    # were six before the answer was forwarded.
    calls = [{"id": f"call_{i}", "type": "function",
              "function": {"name": f"lookup_{i}", "arguments": json.dumps({"key": i})}}
             for i in range(3)]  # fmt: skip
    body = {"model": "m", "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        *({"role": "tool", "tool_call_id": c["id"], "content": f"value {i}"}
          for i, c in enumerate(calls)),
    ]}  # fmt: skip
    async with FakeLLM() as llm:
        llm.default = answer("Done.")
        async with proxy_daemon(llm, redis_url, key_prefix) as (d, url):
            assert d.guard is not None
            engine, ops = d.guard.engine, []
            run = engine.run

            async def counted(session: str, op: str, *rest: Any) -> list[str]:
                ops.append((op, len(rest[1]) if op == "batch" else 1))
                return await run(session, op, *rest)

            engine.run = counted  # type: ignore[method-assign]
            headers = {"X-Botbouncer-Session": f"{key_prefix}batch"}
            code, _, got, _ = await raw_post(
                f"{url}/llm/openai/v1/chat/completions", body, **headers
            )
            assert code == 200 and json.loads(got)["choices"][0]["message"]["content"] == "Done."
            engine.run = run  # type: ignore[method-assign]
            state = await d.guard.state(f"{key_prefix}batch")
    assert ops[0] == ("batch", 6)  # three steps and three results, in one call
    assert [op for op, _ in ops[1:]] == ["usage"]  # the answer's tokens, after it
    assert state is not None and state["steps"] == 3
    assert [c["tool"] for c in state["recent_calls"]] == ["lookup_0", "lookup_1", "lookup_2"]
    assert all(c["result"] is not None for c in state["recent_calls"])


# -- Redis lost under the proxy ----------------------------------------------------


@pytest.mark.parametrize("outage", ["killed", "frozen"])
async def test_a_lost_redis_costs_one_timeout_and_the_loop_is_still_stopped(outage: str) -> None:
    # Breaks if a lost Redis turns requests into 5xx, stalls each of them on
    # the store's timeout, or lets the loop through (fail-open) while the
    # proxy's own memory could judge it: the agent still gets its final answer
    # after 4 tools ran, as on a Redis that answers.
    redis = RedisServer().start()
    timings: list[float] = []
    try:
        async with FakeLLM() as llm:
            llm.default = repeat_tool_call("get_weather", {"city": "Brest"}, otherwise="Grey.")
            async with proxy_daemon(llm, redis.url, None) as (d, url):
                assert isinstance(d.store, FailoverStore) and not d.store.degraded
                assert redis.proc is not None
                if outage == "killed":
                    redis.kill()
                else:
                    redis.proc.send_signal(signal.SIGSTOP)
                client = openai_client(f"{url}/llm/openai/v1", timeout=10.0)
                started = time.monotonic()
                answer, ran = await openai_agent(client, "Weather in Brest?")
                timings.append(time.monotonic() - started)
                unguarded = d.metrics.llm_requests.labels("openai", "fail_open")._value.get()
                assert d.store.degraded  # judged in memory, not on a Redis that answered
    finally:
        if redis.proc is not None and redis.proc.poll() is None:
            redis.proc.send_signal(signal.SIGCONT)
        redis.stop()
    assert (answer, ran) == ("Grey.", 4)
    assert llm.calls[-1].body["tool_choice"] == "none"  # stopped by the guard, locally
    assert unguarded == 0
    # five requests: a killed Redis refuses at once, a frozen one costs one
    # timeout (0.5 s), then the store answers from memory until it is back
    assert timings[0] < (1.0 if outage == "killed" else 2.0), timings
