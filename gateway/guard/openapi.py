"""The guard API as an OpenAPI 3.1 document, served at /v1/guard/openapi.json.

Request schemas come from the pydantic models that validate the requests, so
the document cannot drift from what the server accepts."""

from __future__ import annotations

from typing import Any

from gateway.guard.requests import (
    HandoffBody,
    KbQueryBody,
    ResultBody,
    RetryBody,
    StepBody,
    UsageBody,
)
from gateway.guard.service import REASONS, SessionView

_OPS: dict[str, tuple[str, type[Any], str]] = {
    "step": ("Check a tool call before making it", StepBody, "step"),
    "result": ("Report a tool call's result", ResultBody, "result"),
    "retry": ("Check a retry of a named task", RetryBody, "retry"),
    "handoff": ("Check a handoff between agents", HandoffBody, "handoff"),
    "kb-query": ("Check a knowledge-base query", KbQueryBody, "kbQuery"),
    "usage": ("Report cost and tokens; check the budget", UsageBody, "usage"),
}

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string"}},
}

_ANSWER: dict[str, Any] = {
    "type": "object",
    "required": ["session", "decision", "reason", "message", "evidence", "also", "budget", "steps"],
    "properties": {
        "session": {"type": "string"},
        "decision": {"type": "string", "enum": ["allow", "warn", "block"]},
        "reason": {"type": "string", "enum": sorted(REASONS)},
        "message": {"type": "string"},
        "evidence": {"type": "object"},
        "also": {"type": "array", "items": {"type": "string"}},
        "budget": {
            "type": "object",
            "properties": {
                "usd_spent": {"type": "number"},
                "usd_limit": {"type": ["number", "null"]},
                "usd_remaining": {"type": ["number", "null"]},
                "tokens_spent": {"type": "integer"},
                "tokens_limit": {"type": ["integer", "null"]},
                "tokens_remaining": {"type": ["integer", "null"]},
            },
        },
        "steps": {
            "type": "object",
            "properties": {"used": {"type": "integer"}, "max": {"type": "integer"}},
        },
    },
}

_SESSION = {
    "name": "session",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:@-]{1,128}$"},
}
_PROFILE = {
    "name": "profile",
    "in": "query",
    "required": False,
    "schema": {"type": "string"},
    "description": "The guard profile; a session keeps the one it started with.",
}


def _json(text: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": text, "content": {"application/json": {"schema": schema}}}


def _responses(answer: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if answer:
        ref = {"$ref": "#/components/schemas/Answer"}
        out["200"] = _json("allow or warn", ref)
        out["429"] = _json("block", ref)
        out["409"] = _json("the session runs under another profile", _ERROR)
        out["413"] = _json("a body over 8 MiB", _ERROR)
    out["400"] = _json("bad input; the message names the field", _ERROR)
    out["503"] = _json("the state store is unavailable, or the daemon is stopping", _ERROR)
    return out


def _document() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {"Answer": _ANSWER, "Error": _ERROR}
    for op, (summary, model, op_id) in _OPS.items():
        name = model.__name__
        schemas[name] = model.model_json_schema()
        paths[f"/v1/guard/{{session}}/{op}"] = {
            "post": {
                "operationId": op_id,
                "summary": summary,
                "parameters": [_SESSION, _PROFILE],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}
                    },
                },
                "responses": _responses(),
            }
        }
    view = SessionView.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(view.pop("$defs", {}))
    schemas["SessionView"] = view
    paths["/v1/guard/{session}"] = {
        "get": {
            "operationId": "getSession",
            "summary": "The session's state and history",
            "parameters": [_SESSION],
            "responses": {
                "200": _json(
                    "the session, by documented names",
                    {
                        "type": "object",
                        "required": ["session", "state"],
                        "properties": {
                            "session": {"type": "string"},
                            "state": {"$ref": "#/components/schemas/SessionView"},
                        },
                    },
                ),
                "404": _json("no such session", _ERROR),
                **_responses(answer=False),
            },
        },
        "delete": {
            "operationId": "resetSession",
            "summary": "Forget the session",
            "parameters": [_SESSION],
            "responses": {
                "200": _json("done", {"type": "object"}),
                **_responses(answer=False),
            },
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "botbouncer agent guard",
            "version": "1",
            "description": "Call before each agent step; 200 = allow or warn, 429 = block. "
            "Reason codes: " + "; ".join(f"{k}: {v}" for k, v in REASONS.items()),
        },
        "paths": paths,
        "components": {"schemas": schemas},
    }


OPENAPI = _document()
