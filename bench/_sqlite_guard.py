"""The baseline for bench/guard.py: what a user would otherwise write - an
aiohttp endpoint over SQLite, one table, a query per check (insert the call,
count how often this session made it lately). Default sqlite3 settings, one
connection, as the straightforward version has them.

    python bench/_sqlite_guard.py PORT DB_PATH
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import sys
import time

from aiohttp import web


def build(db_path: str) -> web.Application:
    db = sqlite3.connect(db_path)
    db.execute("CREATE TABLE IF NOT EXISTS calls (session TEXT, sig TEXT, at REAL)")
    db.execute("CREATE INDEX IF NOT EXISTS calls_session ON calls (session, sig)")
    db.commit()

    async def step(request: web.Request) -> web.Response:
        session = request.match_info["session"]
        body = await request.json()
        sig = hashlib.sha1(
            (body["tool"] + json.dumps(body.get("args", {}), sort_keys=True)).encode()
        ).hexdigest()
        db.execute("INSERT INTO calls VALUES (?, ?, ?)", (session, sig, time.time()))
        (count,) = db.execute(
            "SELECT count(*) FROM calls WHERE session = ? AND sig = ?", (session, sig)
        ).fetchone()
        db.commit()
        decision = "block" if count >= 3 else "warn" if count == 2 else "allow"
        return web.json_response({"decision": decision}, status=429 if count >= 3 else 200)

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/v1/guard/{session}/step", step)
    app.router.add_get("/healthz", healthz)
    return app


if __name__ == "__main__":
    web.run_app(build(sys.argv[2]), host="127.0.0.1", port=int(sys.argv[1]), print=None)
