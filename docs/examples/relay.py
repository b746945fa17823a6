"""Relay two HTTP-ingress bots to each other, as a chat platform would.

    python docs/examples/relay.py [--url URL] [--chat room1]
                                  [--first alpha] [--second beta] [--text "..."]

A person's message goes to the first bot; from then on whatever a bot posts
(its `reply`, or its limit `warning`) is shown to the other bot, under the id
botbouncer answered (`reply_id` / `warning_id`), so each post is counted once.
It stops when a bot posts nothing, and prints one line per decision. The
daemon's URL is --url, or $BOTBOUNCER_URL, or http://localhost:8080.
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.request
from typing import Any


def post(url: str, bot: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{url}/v1/bots/{bot}/messages",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.load(response)
    return answer


def show(sender: str, bot: str, d: dict[str, Any], as_json: bool = False) -> None:
    if as_json:
        print(json.dumps(d, ensure_ascii=False))
        return
    why = d["reason"] or "-"
    print(f"{sender:>6} -> {bot:<6} {d['action']:<5} {why:<16} "
          f"turn={d['turn']:<10} soft={d['soft']}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("BOTBOUNCER_URL", "http://localhost:8080"))
    parser.add_argument("--chat", default="room1")
    parser.add_argument("--first", default="alpha")
    parser.add_argument("--second", default="beta")
    parser.add_argument("--author", default="alice")
    parser.add_argument("--text", default="hello bots")
    parser.add_argument("--limit", type=int, default=100, help="stop after this many posts")
    parser.add_argument("--json", action="store_true", help="print each answer as it came")
    args = parser.parse_args(argv)
    bot, other = args.first, args.second
    d = post(args.url, bot, {"chat": args.chat, "author": args.author, "text": args.text,
                             "mentions": [bot]})  # fmt: skip
    show(args.author, bot, d, args.json)
    for _ in range(args.limit):
        if d["action"] == "reply":
            text, post_id = d["reply"], d["reply_id"]
        elif d["action"] == "warn":
            text, post_id = d["warning"], d["warning_id"]
        else:
            return 0  # the bot posted nothing: the loop is over
        body = {"chat": args.chat, "author": bot, "bot": True, "text": text, "id": post_id,
                "mentions": [other]}  # fmt: skip
        d = post(args.url, other, body)
        show(bot, other, d, args.json)
        bot, other = other, bot
    print(f"still going after {args.limit} posts", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
