"""The fake LLM server does what tests rely on it to do."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from tests.fakes.llm import (
    FakeLLM,
    answer,
    close,
    hang,
    malformed,
    no_choices,
    slow,
    status,
)

REQUEST = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}


async def post(
    llm: FakeLLM, json: Any = REQUEST, *, total: float = 5.0, **kwargs: Any
) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=total)) as session,
        session.post(llm.url, json=json, **kwargs) as resp,
    ):
        return resp.status, await resp.text()


async def post_json(llm: FakeLLM, **kwargs: Any) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{llm.base_url}/chat/completions", json=REQUEST, **kwargs) as resp,
    ):
        return resp.status, await resp.json()


async def test_urls() -> None:
    async with FakeLLM() as llm:
        assert llm.base_url.startswith("http://127.0.0.1:")
        assert llm.base_url.endswith("/v1")
        assert int(llm.base_url.split(":")[2].split("/")[0]) > 0
        assert llm.url == llm.base_url + "/chat/completions"


async def test_default_answers_reply_as_chat_completion() -> None:
    async with FakeLLM() as llm:
        code, body = await post_json(llm)
    assert code == 200
    assert body["object"] == "chat.completion"
    assert body["model"] == "gpt-test"
    assert isinstance(body["id"], str) and isinstance(body["created"], int)
    assert body["choices"] == [
        {"index": 0, "message": {"role": "assistant", "content": "REPLY"}, "finish_reason": "stop"}
    ]
    assert body["usage"]["total_tokens"] > 0


@pytest.mark.parametrize("text", ["REPLY", "SKIP", "maybe? who knows", ""])
async def test_answer_text(text: str) -> None:
    async with FakeLLM() as llm:
        llm.then(answer(text))
        _, body = await post_json(llm)
    assert body["choices"][0]["message"]["content"] == text


async def test_queue_then_default_and_call_record() -> None:
    async with FakeLLM() as llm:
        llm.then(answer("SKIP"), status(500)).then(answer("junk"))
        llm.default = answer("SKIP")
        contents = []
        for _ in range(5):
            code, body = await post_json(llm, headers={"X-Trace": "t1"})
            contents.append(body["choices"][0]["message"]["content"] if code == 200 else code)
        assert contents == ["SKIP", 500, "junk", "SKIP", "SKIP"]
        assert llm.count == 5
        assert [c.behaviour for c in llm.calls] == [
            "answer('SKIP')",
            "status(500)",
            "answer('junk')",
            "answer('SKIP')",
            "answer('SKIP')",
        ]
        assert llm.calls[0].body == REQUEST
        assert llm.calls[0].headers["x-trace"] == "t1"


async def test_status_has_openai_error_body() -> None:
    async with FakeLLM() as llm:
        llm.then(status(429, "slow down"), status(503))
        code, body = await post_json(llm)
        assert code == 429
        assert body["error"]["message"] == "slow down"
        assert isinstance(body["error"]["type"], str)
        code, body = await post_json(llm)
        assert code == 503 and "message" in body["error"]


async def test_malformed_is_not_json() -> None:
    async with FakeLLM() as llm:
        llm.then(malformed())
        async with aiohttp.ClientSession() as session, session.post(llm.url, json=REQUEST) as resp:
            assert resp.status == 200
            assert resp.content_type == "application/json"
            with pytest.raises(ValueError):
                await resp.json()


async def test_no_choices() -> None:
    async with FakeLLM() as llm:
        llm.then(no_choices())
        code, body = await post_json(llm)
    assert code == 200 and body["choices"] == []


async def test_slow_waits_then_behaves_as_then() -> None:
    async with FakeLLM() as llm:
        llm.then(slow(0.2, then=answer("SKIP")), slow(0.01))
        start = time.monotonic()
        _, body = await post_json(llm)
        assert time.monotonic() - start >= 0.2
        assert body["choices"][0]["message"]["content"] == "SKIP"
        _, body = await post_json(llm)
        assert body["choices"][0]["message"]["content"] == "REPLY"
        assert llm.calls[0].behaviour == "slow(0.2, answer('SKIP'))"


async def test_slow_is_cut_short_by_stop() -> None:
    async with FakeLLM() as llm:
        llm.then(slow(60))
        with pytest.raises(asyncio.TimeoutError):
            await post(llm, total=0.1)  # the handler is still sleeping on the server
        assert llm.count == 1
        start = time.monotonic()
    assert time.monotonic() - start < 0.5


async def test_hang_makes_the_client_time_out() -> None:
    async with FakeLLM() as llm:
        llm.then(hang())
        start = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            await post(llm, total=0.2)
        assert time.monotonic() - start < 1
        assert llm.calls[0].behaviour == "hang()"
        code, _ = await post(llm)  # the next request is answered as usual
        assert code == 200
        start = time.monotonic()
    assert time.monotonic() - start < 0.5  # stopping releases the hung handler


async def test_close_drops_the_connection() -> None:
    async with FakeLLM() as llm:
        llm.then(close())
        with pytest.raises((aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)):
            await post(llm)
        assert llm.calls[0].behaviour == "close()"
        code, _ = await post(llm)
        assert code == 200


async def test_require_key() -> None:
    async with FakeLLM() as llm:
        llm.require_key("sk-good")
        llm.then(answer("SKIP"))
        code, body = await post_json(llm)
        assert code == 401 and "message" in body["error"]
        code, _ = await post_json(llm, headers={"Authorization": "Bearer sk-bad"})
        assert code == 401
        code, body = await post_json(llm, headers={"Authorization": "Bearer sk-good"})
        assert code == 200
        assert body["choices"][0]["message"]["content"] == "SKIP"  # refusals kept the queue
        behaviours = [c.behaviour for c in llm.calls]
        assert behaviours == ["unauthorized", "unauthorized", "answer('SKIP')"]
        assert llm.calls[2].headers["authorization"] == "Bearer sk-good"


async def test_non_json_body_is_recorded_and_refused() -> None:
    async with FakeLLM() as llm:
        llm.then(answer("SKIP"))
        code, text = await post(llm, json=None, data=b"not json")
        assert code == 400 and "error" in text
        code, text = await post(llm, json=[1, 2])  # JSON, but not an object
        assert code == 400
        assert [(c.body, c.behaviour) for c in llm.calls] == [
            (None, "bad_request"),
            (None, "bad_request"),
        ]
        _, text = await post(llm)
        assert "SKIP" in text
