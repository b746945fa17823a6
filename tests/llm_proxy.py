"""Daemons serving the LLM proxy in front of a FakeLLM, for the proxy's tests
and its benchmark, and the agent loops the SDKs' docs show."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anthropic
import openai
import yaml

from gateway.config import parse_config
from gateway.daemon import Daemon
from tests.daemons import forget, redis_of
from tests.fakes.llm import FakeLLM
from tests.redis_server import free_port

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
# The same tool as the Responses API takes it (no "function" wrapper).
WEATHER_TOOL_RESPONSES = {"type": "function", **WEATHER_TOOL["function"]}  # type: ignore[dict-item]
WEATHER_TOOL_ANTHROPIC = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": WEATHER_TOOL["function"]["parameters"],  # type: ignore[index]
}


def config_for(
    llm: FakeLLM, store_url: str, port: int | None = None, **proxy: Any
) -> dict[str, Any]:
    root = llm.anthropic_base_url  # the fake's root: the proxy adds /v1/...
    section: dict[str, Any] = {
        "openai": {"upstream": root},
        "anthropic": {"upstream": root},
        **proxy,
    }
    return {
        "store": {"url": store_url},
        "http": {"listen": f"127.0.0.1:{port or free_port()}"},
        "llm_proxy": section,
        "bots": [],
    }


@asynccontextmanager
async def proxy_daemon(
    llm: FakeLLM, redis_url: str, prefix: str | None, port: int | None = None, **proxy: Any
) -> AsyncIterator[tuple[Daemon, str]]:
    """A started daemon serving the proxy on this test's Redis prefix, and its
    URL. `prefix` None: a Redis of the test's own, left as the test leaves it
    (killed, frozen), its keys unprefixed and not deleted."""
    d = Daemon(parse_config(yaml.safe_dump(config_for(llm, redis_url, port, **proxy))))
    shared = redis_url.startswith("redis") and prefix is not None
    if shared:
        redis_of(d).prefix = prefix
    url = await d.start()
    try:
        yield d, url
    finally:
        await d.stop()
        if shared:
            await forget(redis_url, prefix)


def openai_client(base_url: str, **kw: Any) -> openai.AsyncOpenAI:
    kw.setdefault("max_retries", 0)  # the SDK retries 429/5xx twice by default
    return openai.AsyncOpenAI(base_url=base_url, api_key="sk-test-key", **kw)


def anthropic_client(base_url: str, **kw: Any) -> anthropic.AsyncAnthropic:
    kw.setdefault("max_retries", 0)
    return anthropic.AsyncAnthropic(base_url=base_url, api_key="sk-ant-test-key", **kw)


async def refused_by_both(url: str) -> tuple[openai.APIStatusError, anthropic.APIStatusError]:
    """The error each SDK raises for a plain "hi" through the daemon at `url`."""
    try:
        await openai_client(f"{url}/llm/openai/v1").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    except openai.APIStatusError as exc:
        o = exc
    else:
        raise AssertionError("the OpenAI request was answered")
    try:
        await anthropic_client(f"{url}/llm/anthropic").messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
    except anthropic.APIStatusError as exc:
        return o, exc
    raise AssertionError("the Anthropic request was answered")


def weather(city: str) -> str:
    return json.dumps({"city": city, "sky": "grey", "celsius": 11})


async def openai_agent(
    client: openai.AsyncOpenAI, question: str, *, stream: bool = False, turns: int = 40
) -> tuple[str, int]:
    """The tool loop of OpenAI's function-calling guide: call the model, run
    each tool call it asks for, send the results back, until it answers.
    Returns the answer and how many tools ran."""
    messages: list[Any] = [{"role": "user", "content": question}]
    ran = 0
    for _ in range(turns):
        if stream:
            msg = await _openai_streamed(client, messages)
        else:
            completion = await client.chat.completions.create(
                model="gpt-test", messages=messages, tools=[WEATHER_TOOL]
            )
            msg = completion.choices[0].message.model_dump(exclude_none=True)
        messages.append(msg)
        calls = msg.get("tool_calls") or []
        if not calls:
            return str(msg.get("content")), ran
        for call in calls:
            args = json.loads(call["function"]["arguments"])
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": weather(**args)}
            )
            ran += 1
    raise AssertionError(f"the agent never answered in {turns} turns ({ran} tools ran)")


async def responses_agent(
    client: openai.AsyncOpenAI,
    question: str,
    *,
    stream: bool = False,
    turns: int = 40,
    chained: bool = False,
    conversation: str | None = None,
    background: bool = False,
    fetch_streamed: bool = False,
) -> tuple[str, int]:
    """The tool loop of OpenAI's function-calling guide on the Responses API:
    the input list grows by each response's output items and a
    `function_call_output` per call, until the model answers. `chained`: as
    the guide's other way, each request continues the last response on the
    server (`previous_response_id`) and carries only the new outputs; with
    `conversation`, each adds its new items to that server-side conversation.
    `background`: each response made in the background and fetched until it
    is done (`responses.retrieve`), as the background-mode guide shows; with
    `fetch_streamed`, by resuming its stream instead."""
    items: list[Any] = [{"role": "user", "content": question}]
    ran = 0
    previous: dict[str, Any] = {"conversation": conversation} if conversation else {}
    for _ in range(turns):
        if stream:
            response = None
            events = await client.responses.create(
                model="gpt-test", input=items, tools=[WEATHER_TOOL_RESPONSES], stream=True,
                **previous,
            )  # fmt: skip
            async for event in events:
                if event.type == "response.completed":
                    response = event.response
            assert response is not None, "the stream ended without response.completed"
        elif background:
            response = await client.responses.create(
                model="gpt-test", input=items, tools=[WEATHER_TOOL_RESPONSES], background=True,
                **previous,
            )  # fmt: skip
            if fetch_streamed:
                async for event in await client.responses.retrieve(response.id, stream=True):
                    if event.type == "response.completed":
                        response = event.response
            while response.status in ("queued", "in_progress"):
                response = await client.responses.retrieve(response.id)
        else:
            response = await client.responses.create(
                model="gpt-test", input=items, tools=[WEATHER_TOOL_RESPONSES], **previous
            )
        if chained:
            items, previous = [], {"previous_response_id": response.id}
        elif conversation:
            items = []
        else:
            items += [item.model_dump(exclude_none=True) for item in response.output]
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            return response.output_text, ran
        for call in calls:
            args = json.loads(call.arguments)
            items.append(
                {"type": "function_call_output", "call_id": call.call_id, "output": weather(**args)}
            )
            ran += 1
    raise AssertionError(f"the agent never answered in {turns} turns ({ran} tools ran)")


async def _openai_streamed(client: openai.AsyncOpenAI, messages: list[Any]) -> dict[str, Any]:
    """A streamed answer put back together from its deltas, as the guide does."""
    content, calls = "", {}
    stream = await client.chat.completions.create(
        model="gpt-test", messages=messages, tools=[WEATHER_TOOL], stream=True
    )
    async for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            call = calls.setdefault(
                tc.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
            )
            call["id"] = tc.id or call["id"]
            if tc.function is not None:
                call["function"]["name"] += tc.function.name or ""
                call["function"]["arguments"] += tc.function.arguments or ""
    msg: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg


async def anthropic_agent(
    client: anthropic.AsyncAnthropic, question: str, *, stream: bool = False, turns: int = 40
) -> tuple[str, int]:
    """The tool loop of Anthropic's tool-use guide: while stop_reason is
    tool_use, run the tools and send their results back."""
    messages: list[Any] = [{"role": "user", "content": question}]
    ran = 0
    for _ in range(turns):
        kw: dict[str, Any] = {
            "model": "claude-test",
            "max_tokens": 1024,
            "messages": messages,
            "tools": [WEATHER_TOOL_ANTHROPIC],
        }
        if stream:
            async with client.messages.stream(**kw) as s:
                message = await s.get_final_message()
        else:
            message = await client.messages.create(**kw)
        messages.append({"role": "assistant", "content": message.content})
        if message.stop_reason != "tool_use":
            return "".join(b.text for b in message.content if b.type == "text"), ran
        results = []
        for block in message.content:
            if block.type == "tool_use":
                results.append(
                    {
                        "type": "tool_result",
                        "tool_use_id": block.id,
                        "content": weather(**block.input),
                    }
                )
                ran += 1
        messages.append({"role": "user", "content": results})
    raise AssertionError(f"the agent never answered in {turns} turns ({ran} tools ran)")


async def raw_post(
    url: str, body: dict[str, Any], **headers: str
) -> tuple[int, dict[str, str], bytes, float]:
    """Status, headers, the body's bytes, and when its first byte came (seconds)."""
    start = time.monotonic()
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers) as resp:
        first = await resp.content.readany()
        at = time.monotonic() - start
        rest = await resp.read()
        return resp.status, dict(resp.headers), first + rest, at
