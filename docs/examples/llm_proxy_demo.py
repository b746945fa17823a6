"""The LLM proxy stopping a tool loop, on this machine alone (docs/llm-proxy.md).

A stand-in for a model that loops (it asks for the same tool call every
time, unless told tool_choice "none"), botbouncer's proxy in front of it, and
the tool loop of OpenAI's function-calling guide pointed at the proxy:

    .venv/bin/python docs/examples/llm_proxy_demo.py
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

from aiohttp import web
from openai import AsyncOpenAI

from gateway.config import parse_config
from gateway.daemon import Daemon


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def looping_model(request: web.Request) -> web.Response:
    """Chat Completions that always wants get_weather for Brest."""
    body = await request.json()
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if body.get("tool_choice") == "none":
        message["content"] = "It is grey in Brest, 11 °C."
    else:
        n = len(body["messages"])
        message["tool_calls"] = [{
            "id": f"call_{n}", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Brest"}'},
        }]  # fmt: skip
    return web.json_response({
        "id": f"chatcmpl-{len(body['messages'])}", "object": "chat.completion", "created": 0,
        "model": body["model"], "choices": [{"index": 0, "message": message,
        "finish_reason": "tool_calls" if message["content"] is None else "stop"}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60},
    })  # fmt: skip


async def main() -> None:
    model = web.Application()
    model.router.add_post("/v1/chat/completions", looping_model)
    runner = web.AppRunner(model)
    await runner.setup()
    model_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", model_port).start()

    config = f"""
http: {{listen: "127.0.0.1:{free_port()}"}}
llm_proxy:
  openai: {{upstream: "http://127.0.0.1:{model_port}"}}
"""
    daemon = Daemon(parse_config(config))
    url = await daemon.start()

    # The agent: only its base URL points at botbouncer.
    client = AsyncOpenAI(base_url=f"{url}/llm/openai/v1", api_key="sk-anything")
    tools = [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}}}}}]  # fmt: skip
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Brest?"}]
    while True:
        raw = await client.chat.completions.with_raw_response.create(
            model="any-model", messages=messages, tools=tools
        )
        guard = raw.headers.get("x-botbouncer-guard", "allow")
        msg = raw.parse().choices[0].message
        messages.append(msg)
        if not msg.tool_calls:
            print(f"answer ({guard}): {msg.content}")
            break
        for call in msg.tool_calls:
            print(f"tool call {call.function.name} {call.function.arguments} ({guard})")
            result = json.dumps({"city": "Brest", "sky": "grey", "celsius": 11})
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})

    session = raw.headers["x-botbouncer-session"]
    state = await daemon.guard.state(session)
    assert state is not None
    print(f"session {session[:8]}…: {state['tools']['get_weather']['calls']} calls counted, "
          f"{state['spent']['tokens']:.0f} tokens spent")  # fmt: skip
    await client.close()
    await daemon.stop()
    await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main())
