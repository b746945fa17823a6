"""The LLM API proxy end to end: the real openai and anthropic SDKs, pointed
at a daemon on Redis in front of a fake upstream (tests/fakes/llm)."""

from __future__ import annotations

import pytest

from tests.fakes.llm import FakeLLM, repeat_tool_call
from tests.llm_proxy import (
    anthropic_agent,
    anthropic_client,
    openai_agent,
    openai_client,
    proxy_daemon,
)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_openai_loop_ends_with_an_answer(
    redis_url: str, key_prefix: str, stream: bool
) -> None:
    async with FakeLLM() as llm:
        llm.default = repeat_tool_call("get_weather", {"city": "Brest"}, otherwise="Grey, 11 C.")
        async with proxy_daemon(llm, redis_url, key_prefix) as (_, url):
            client = openai_client(f"{url}/llm/openai/v1")
            answer, ran = await openai_agent(client, "Weather in Brest?", stream=stream)
    assert answer == "Grey, 11 C."
    assert ran == 4
    assert llm.count == 5
    assert llm.calls[-1].body["tool_choice"] == "none"
    assert all("tool_choice" not in c.body for c in llm.calls[:-1])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_anthropic_loop_ends_with_an_answer(
    redis_url: str, key_prefix: str, stream: bool
) -> None:
    async with FakeLLM() as llm:
        llm.default = repeat_tool_call("get_weather", {"city": "Brest"}, otherwise="Grey, 11 C.")
        async with proxy_daemon(llm, redis_url, key_prefix) as (_, url):
            client = anthropic_client(f"{url}/llm/anthropic")
            answer, ran = await anthropic_agent(client, "Weather in Brest?", stream=stream)
    assert answer == "Grey, 11 C."
    assert ran == 4
    assert llm.calls[-1].body["tool_choice"] == {"type": "none"}
