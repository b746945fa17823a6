"""The replay input fields (docs/replay.md) are read by one parser, gateway/wire.py,
for `botbouncer replay` lines and the HTTP ingress body (docs/http-api.md) alike: every bad
value is refused by both, with the same words naming the field - a 400 on the
ingress, `line N: ...` and exit status 2 on replay."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gateway.cli import main
from gateway.config import parse_config
from gateway.daemon import Daemon
from gateway.wire import MAX_ID_CHARS

LONG = "x" * (MAX_ID_CHARS + 1)
AT = "at: must be a finite number of seconds (0 to 1e12), not "
BOOL = "must be true or false, not "

# A fragment of a message object that has chat and author -> the error.
BAD: dict[str, tuple[str, str]] = {
    "at-a-string": ('"at": "x"', AT + '"x"'),
    "at-nan": ('"at": NaN', AT + "NaN"),
    "at-infinity": ('"at": Infinity', AT + "Infinity"),
    "at-minus-infinity": ('"at": -Infinity', AT + "-Infinity"),
    "at-1e400": ('"at": 1e400', AT + "Infinity"),  # json reads it as inf
    "at-an-integer-past-float": ('"at": 1' + "0" * 400, AT + "a 401-digit number"),
    "at-negative": ('"at": -1', AT + "-1"),
    "at-too-far": ('"at": 1e13', AT + "10000000000000.0"),
    "at-a-bool": ('"at": true', AT + "true"),
    "at-a-list": ('"at": [1]', AT + "a list"),
    "bot-yes": ('"bot": "yes"', "bot: " + BOOL + '"yes"'),
    "bot-1": ('"bot": 1', "bot: " + BOOL + "1"),
    "system-no": ('"system": "no"', "system: " + BOOL + '"no"'),
    "system-an-object": ('"system": {"a": 1}', "system: " + BOOL + "an object"),
    "kind-room": ('"kind": "room"', 'kind: must be "group" or "dm", not "room"'),
    "kind-a-number": ('"kind": 1', 'kind: must be "group" or "dm", not 1'),
    "mentions-a-string": (
        '"mentions": "bot"',
        'mentions: must be a list of author ids (strings), not "bot"',
    ),
    "mentions-an-object": (
        '"mentions": {"bot": 1}',
        "mentions: must be a list of author ids (strings), not an object",
    ),
    "mentions-a-number-in-it": (
        '"mentions": ["bot", 7]',
        "mentions: item 2 must be an author id (a string), not 7",
    ),
    "mentions-a-null-in-it": (
        '"mentions": [null]',
        "mentions: item 1 must be an author id (a string), not null",
    ),
    "mentions-a-huge-id": (
        f'"mentions": ["{LONG}"]',
        f"mentions: item 1 must be at most {MAX_ID_CHARS} characters, not {MAX_ID_CHARS + 1}",
    ),
    "mentions-a-lone-surrogate": (
        '"mentions": ["\\ud800"]',
        "mentions: item 1 is not valid Unicode (a lone surrogate)",
    ),
    "reply-to-a-number": ('"reply_to": 1', "reply_to: must be an author id or null, not 1"),
    "reply-to-a-bool": ('"reply_to": false', "reply_to: must be an author id or null, not false"),
    "reply-to-huge": (
        f'"reply_to": "{LONG}"',
        f"reply_to: must be at most {MAX_ID_CHARS} characters, not {MAX_ID_CHARS + 1}",
    ),
    "id-a-number": ('"id": 7', "id: must be a string, not 7"),
    "id-a-float": ('"id": 7.5', "id: must be a string, not 7.5"),
    "id-a-list": ('"id": ["7"]', "id: must be a string, not a list"),
    "id-empty": ('"id": ""', "id: must not be empty"),
    "id-huge": (
        f'"id": "{LONG}"',
        f"id: must be at most {MAX_ID_CHARS} characters, not {MAX_ID_CHARS + 1}",
    ),
    "text-a-number": ('"text": 5', "text: must be a string, not 5"),
    "text-a-list": ('"text": ["hi"]', "text: must be a string, not a list"),
    "text-a-lone-surrogate": (
        '"text": "a\\udfff"',
        "text: is not valid Unicode (a lone surrogate)",
    ),
    "unknown-field": (
        '"colour": "red"',
        "colour: unknown field (known: chat, author, bot, text, id, at, kind, mentions, "
        "reply_to, system)",
    ),
}
# Fragments that replace chat and author.
BAD_WHO: dict[str, tuple[str, str]] = {
    "chat-missing": ('"author": "a"', "chat: is required"),
    "chat-null": ('"chat": null, "author": "a"', "chat: is required"),
    "chat-a-number": ('"chat": 5, "author": "a"', "chat: must be a string, not 5"),
    "chat-empty": ('"chat": "", "author": "a"', "chat: must not be empty"),
    "chat-huge": (
        f'"chat": "{LONG}", "author": "a"',
        f"chat: must be at most {MAX_ID_CHARS} characters, not {MAX_ID_CHARS + 1}",
    ),
    "author-missing": ('"chat": "c"', "author: is required"),
    "author-a-bool": ('"chat": "c", "author": true', "author: must be a string, not true"),
    "author-a-long-string": (
        '"chat": "c", "author": ' + json.dumps("y" * 60_000),
        f"author: must be at most {MAX_ID_CHARS} characters, not 60000",
    ),
}
CASES = {
    **{k: ('{"chat": "c", "author": "a", ' + frag + "}", msg) for k, (frag, msg) in BAD.items()},
    **{k: ("{" + frag + "}", msg) for k, (frag, msg) in BAD_WHO.items()},
}
GOOD = {
    # null is as good as absent for every field that has a default
    "nulls": '{"chat": "c", "author": "a", "bot": null, "text": null, "id": null, "at": null, '
    '"kind": null, "mentions": null, "reply_to": null, "system": null}',
    "at-an-integer": '{"chat": "c", "author": "a", "at": 3}',
    "at-zero": '{"chat": "c", "author": "a", "at": 0}',
    "at-the-largest": '{"chat": "c", "author": "a", "at": 1e12}',
    "ids-at-their-longest": json.dumps(
        {
            "chat": "c" * MAX_ID_CHARS,
            "author": "a" * MAX_ID_CHARS,
            "id": "i" * MAX_ID_CHARS,
            "mentions": ["m" * MAX_ID_CHARS],
            "reply_to": "r" * MAX_ID_CHARS,
        }
    ),
}


@pytest.fixture
async def ingress() -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    config = "bots: [{name: bot, platform: http, backend: {type: echo}}]"
    daemon = Daemon(parse_config(config))
    for adapter in daemon.adapters:
        await adapter.start()
    client = TestClient(TestServer(daemon.server.app))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()
        await daemon.stop()


Replay = Callable[[list[str]], Awaitable[tuple[int, str, str]]]


@pytest.fixture
def replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Replay:
    """`botbouncer replay` in process; in a thread, as it runs its own event loop."""

    async def run(lines: list[str]) -> tuple[int, str, str]:
        path = tmp_path / "t.jsonl"
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        capsys.readouterr()
        code = await asyncio.to_thread(main, ["replay", str(path)])
        out, err = capsys.readouterr()
        assert "Traceback" not in err
        return code, out, err

    return run


FIRST = '{"chat": "c", "author": "a", "text": "one", "at": 0}'
SECOND = '{"chat": "c", "author": "b", "text": "two", "at": 1}'


@pytest.mark.parametrize(("body", "message"), list(CASES.values()), ids=list(CASES))
async def test_a_bad_field_is_refused_by_the_ingress_and_replay_in_the_same_words(
    ingress: TestClient,  # type: ignore[type-arg]
    replay: Replay,
    body: str,
    message: str,
) -> None:
    resp = await ingress.post("/v1/bots/bot/messages", data=body.encode())
    assert resp.status == 400, await resp.text()
    assert (await resp.json())["error"] == message
    code, out, err = await replay([FIRST, SECOND, body, FIRST])
    assert code == 2
    assert len(out.splitlines()) == 2  # the lines before it were decided
    assert err.rstrip("\n").endswith(f": line 3: {message}"), err


@pytest.mark.parametrize("body", list(GOOD.values()), ids=list(GOOD))
async def test_what_is_valid_is_taken_by_both(
    ingress: TestClient,  # type: ignore[type-arg]
    replay: Replay,
    body: str,
) -> None:
    resp = await ingress.post("/v1/bots/bot/messages", data=body.encode())
    assert resp.status == 200, await resp.text()
    code, out, err = await replay([body])
    assert code == 0, err
    assert len(out.splitlines()) == 1


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"chat": "c", "author": "a", "at": ' + "7" * 5000 + "}", "line 1: invalid JSON: "),
        ("[" * 100_000 + "]" * 100_000, "line 1: invalid JSON: nested too deeply"),
        (
            '{"chat": "c", "author": "a", "text": ' + "[" * 100_000 + "]" * 100_000 + "}",
            "line 1: invalid JSON: nested too deeply",
        ),
    ],
    ids=["a-5000-digit-number", "nested-100000-deep", "nested-in-a-field"],
)
async def test_a_line_json_cannot_read_is_an_error_not_a_traceback(
    replay: Replay, line: str, message: str
) -> None:
    code, out, err = await replay([line])
    assert (code, out) == (2, "")
    assert message in err, err
