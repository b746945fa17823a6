"""The daemon's whole HTTP API as one OpenAPI 3.1 document, served at
`GET /openapi.json` and committed as docs/openapi.json:

    python -m gateway.openapi > docs/openapi.json

The guard's part is gateway/guard/openapi.py's (its request schemas come from
the pydantic models that validate the requests). The ingress request is built
from gateway/wire.py's FIELDS, the decision from the enums in gateway/model.py
and the admin limits from gateway/admin.py's keys, so adding a field, a reason
or a limit there without describing it here fails at import or in
tests/test_openapi.py, which also checks real answers against this document.
"""

from __future__ import annotations

import copy
import json
import sys
from typing import Any

from gateway.admin import JSON_LIMIT_KEYS
from gateway.decide import MAX_IDS
from gateway.fields import MAX_COUNT, MAX_WINDOW_SECONDS, MIN_WINDOW_SECONDS
from gateway.guard.openapi import OPENAPI as GUARD_OPENAPI
from gateway.llmproxy import openapi as llm_openapi
from gateway.model import Action, Reason, Turn
from gateway.store.base import DECISION_LOG_SIZE
from gateway.wire import FIELDS, MAX_AT, MAX_ID_CHARS

_ID = {"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS}
_AUTHOR_ID = {"type": "string", "maxLength": MAX_ID_CHARS}

# One schema per field of gateway/wire.py, in its order (a missing one is a KeyError).
_FIELD_SCHEMAS: dict[str, dict[str, Any]] = {
    "chat": {**_ID, "description": "The chat; the store keys it `http:<chat>`."},
    "author": {**_ID, "description": "The author's id; the bot's own name is its own message."},
    "bot": {"type": ["boolean", "null"], "default": False,
            "description": "The author is a bot: the message is a bot turn."},
    "text": {"type": ["string", "null"], "default": "",
             "description": "Empty text neither counts nor resets."},
    "id": {"anyOf": [_ID, {"type": "null"}],
           "description": "Counted once per id; default `in-<16 hex digits>`."},
    "at": {"type": ["number", "null"], "minimum": 0, "maximum": MAX_AT,
           "description": "Seconds; checked, but the daemon decides on the store's clock."},
    "kind": {"enum": ["group", "dm", None], "default": "group",
             "description": "A DM is always addressed to the bot."},
    "mentions": {"type": ["array", "null"], "items": _AUTHOR_ID, "default": [],
                 "description": "Author ids @mentioned."},
    "reply_to": {"anyOf": [_AUTHOR_ID, {"type": "null"}],
                 "description": "The author of the message this one replies to."},
    "system": {"type": ["boolean", "null"], "default": False,
               "description": "A platform event (join, pin): never counted, never a reset."},
}  # fmt: skip

MESSAGE: dict[str, Any] = {
    "type": "object",
    "description": "One message: the fields of a replay transcript line. A field with a "
    "default may be null, meaning the default.",
    "required": ["chat", "author"],
    "properties": {name: _FIELD_SCHEMAS[name] for name in FIELDS},
    "additionalProperties": False,
}

_NULLABLE_STRING = {"type": ["string", "null"]}
DECISION: dict[str, Any] = {
    "type": "object",
    "description": "The decision for one message, and what the bot posted.",
    "required": ["id", "chat", "author", "turn", "soft", "hard", "action", "reason", "warning"],
    "properties": {
        "id": {"type": "string", "description": "The message's id (generated if none was given)."},
        "chat": {"type": "string"},
        "author": {"type": "string"},
        "turn": {"enum": [t.value for t in Turn],
                 "description": "A bot turn's verdict, `reset` (a person), or `none`."},
        "soft": {"type": "integer", "minimum": 0},
        "hard": {"type": "integer", "minimum": 0},
        "action": {"enum": [a.value for a in Action]},
        "reason": {"enum": [*(r.value for r in Reason), None],
                   "description": "Why the bot did not answer; null for a reply."},
        "warning": {**_NULLABLE_STRING, "description": "The limit warning posted (action warn)."},
        "warning_id": {"type": "string",
                       "description": "The id the warning was counted under as this bot's turn."},
        "ticket": {"type": "string",
                   "description": "Decide mode, on reply and warn: report what was sent with it "
                   "(/sent), or that nothing was (/release)."},
        "reply": {"type": "string", "description": "The (first) text the bot answered."},
        "reply_id": {"type": "string",
                     "description": "The id the reply was counted under as this bot's turn."},
        "replies": {
            "type": "array",
            "description": "Only when the backend answered several messages, each counted.",
            "items": {
                "type": "object",
                "required": ["id", "text"],
                "properties": {"id": {"type": "string"}, "text": {"type": "string"}},
                "additionalProperties": False,
            },
        },
    },
    "additionalProperties": False,
}  # fmt: skip

_TICKET = {
    "type": "string",
    "minLength": 1,
    "maxLength": 64,
    "description": "The ticket a decide answer gave.",
}
SENT: dict[str, Any] = {
    "type": "object",
    "description": "Messages the bot sent for a ticket's reply or warning, each counted as "
    "its turn once; the first one of a reply fills the turn it held.",
    "required": ["ticket", "ids"],
    "properties": {
        "ticket": _TICKET,
        "ids": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_IDS,
            "items": _ID,
            "description": "The platform's ids of the sent messages.",
        },
        "texts": {
            "type": "array",
            "items": {"type": "string"},
            "description": "What was sent under each id (optional; for the recent "
            "context a reply decision reads).",
        },
    },
    "additionalProperties": False,
}
SENT_ANSWER: dict[str, Any] = {
    "type": "object",
    "required": ["counted"],
    "properties": {
        "counted": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "turn", "soft", "hard"],
                "properties": {
                    "id": {"type": "string"},
                    "turn": {"enum": [t.value for t in Turn]},
                    "soft": {"type": "integer"},
                    "hard": {"type": "integer"},
                },
                "additionalProperties": False,
            },
        }
    },
    "additionalProperties": False,
}
RELEASE: dict[str, Any] = {
    "type": "object",
    "required": ["ticket"],
    "properties": {"ticket": _TICKET},
    "additionalProperties": False,
}
RELEASED: dict[str, Any] = {
    "type": "object",
    "required": ["released", "id", "reason"],
    "properties": {
        "released": {"const": True},
        "id": {"type": "string", "description": "The message the ticket was for."},
        "reason": {
            "enum": [*(r.value for r in Reason), None],
            "description": "As filed in the chat's decision log.",
        },
    },
    "additionalProperties": False,
}

# The bounds gateway/admin.py checks (tests/test_openapi.py holds them equal).
_COUNT = {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_COUNT}
_LIMIT_SCHEMAS: dict[str, dict[str, Any]] = {
    "soft_limit": _COUNT,
    "hard_limit": _COUNT,
    "max_replies": _COUNT,
    "rate_window_seconds": {"type": ["number", "null"], "minimum": MIN_WINDOW_SECONDS,
                            "maximum": MAX_WINDOW_SECONDS},
}  # fmt: skip
LIMITS: dict[str, Any] = {
    "type": "object",
    "description": "The chat's overrides, replacing the ones it had; absent or null keys "
    "take the configured value, {} clears all.",
    "properties": {key: _LIMIT_SCHEMAS[key] for key in JSON_LIMIT_KEYS},
    "additionalProperties": False,
}

CHAT_STATUS: dict[str, Any] = {
    "type": "object",
    "required": ["bot", "chat", "soft", "hard", "turn", "soft_limit", "hard_limit", "paused",
                 "overrides", "pair_cooldowns", "rate"],
    "properties": {
        "bot": {"type": "string", "description": "Whose configured limits are shown."},
        "done": {"enum": ["reset", "pause", "resume", "limits"],
                 "description": "The action, on an answer to one."},
        "chat": {"type": "string"},
        "soft": {"type": "integer"},
        "hard": {"type": "integer"},
        "turn": {"enum": [t.value for t in Turn]},
        "soft_limit": {"type": "integer"},
        "hard_limit": {"type": "integer"},
        "paused": {"type": "boolean"},
        "overrides": {
            "type": "object",
            "properties": {
                "soft_limit": {"type": "integer"},
                "hard_limit": {"type": "integer"},
                "max_replies": {"type": "integer"},
                "rate_window_ms": {"type": "integer"},
            },
            "additionalProperties": False,
        },
        "pair_cooldowns": {"type": "object", "additionalProperties": {"type": "number"},
                           "description": "`a|b` -> seconds of cooldown left."},
        "rate": {
            "type": "object",
            "required": ["used", "max", "window_seconds"],
            "properties": {"used": {"type": "integer"}, "max": {"type": "integer"},
                           "window_seconds": {"type": "number"}},
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}  # fmt: skip

LOG_ENTRY: dict[str, Any] = {
    "type": "object",
    "required": ["at", "bot", "id", "author", "action", "reason", "turn", "soft", "hard"],
    "properties": {
        "at": {"type": "number"},
        "bot": {"type": "string"},
        "id": {"type": "string"},
        "author": {"type": "string"},
        "action": {"enum": [a.value for a in Action]},
        "reason": {"enum": [*(r.value for r in Reason), None]},
        "turn": {"enum": [t.value for t in Turn]},
        "soft": {"type": "integer"},
        "hard": {"type": "integer"},
    },
    "additionalProperties": False,
}

HEALTH: dict[str, Any] = {
    "type": "object",
    "required": ["status", "store"],
    "properties": {
        "status": {"enum": ["ok", "degraded"]},
        "store": {
            "enum": ["memory", "redis"],
            "description": "redis for any Redis: one server, a cluster or Sentinel",
        },
        "error": {"type": "string", "description": "Why the store is degraded."},
    },
    "additionalProperties": False,
}

_ERROR_REF = {"$ref": "#/components/schemas/Error"}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(text: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": text, "content": {"application/json": {"schema": schema}}}


def _errors(**codes: str) -> dict[str, Any]:
    return {code.removeprefix("s"): _json(text, _ERROR_REF) for code, text in codes.items()}


_BAD_INPUT = "bad input: empty, invalid or too deeply nested JSON, or a wrong field (named)"
_STORE_DOWN = "the state store is unavailable, or the daemon is stopping"
_CHAT = {
    "name": "chat",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "minLength": 1},
    "description": "`http:room1`, `discord:1234`, `telegram:-1001:7`, "
    "`slack:C0123:1700000000.000100`, `matrix:!room:example.org`; a bare id is an HTTP chat.",
}
_BOT_QUERY = {
    "name": "bot",
    "in": "query",
    "required": False,
    "schema": {"type": "string"},
    "description": "Whose configured limits the status shows (default: the first bot of "
    "the chat's platform).",
}
_SECURED: list[dict[str, list[str]]] = [{"bearer": []}]


def _admin(op_id: str, summary: str, ok: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "operationId": op_id,
        "summary": summary,
        "security": _SECURED,
        "parameters": [_CHAT, _BOT_QUERY, *extra.pop("parameters", [])],
        **extra,
        "responses": {
            "200": ok,
            **_errors(
                s400="bad input",
                s401="missing or wrong bearer token",
                s403="the admin API is closed: no http.admin_token is configured",
                s404="no bot of that name, or no bots configured",
                s503="the store is unavailable (pause and limits: also while degraded)",
            ),
        },
    }


def _decide_route(
    op_id: str, summary: str, body: str, ok: dict[str, Any], **errors: str
) -> dict[str, Any]:
    return {
        "operationId": op_id,
        "summary": summary,
        "parameters": [{"name": "bot", "in": "path", "required": True,
                        "schema": {"type": "string"}}],
        "requestBody": {"required": True,
                        "content": {"application/json": {"schema": _ref(body)}}},
        "responses": {
            "200": ok,
            **_errors(
                s400=_BAD_INPUT,
                s404="no decide-mode bot of that name"
                + ("" if op_id == "decide" else ", or no such ticket (never issued, lapsed)"),
                **errors,
                s413="the body is over 64 KiB",
                s503=_STORE_DOWN,
            ),
        },
    }  # fmt: skip


def _status(text: str) -> dict[str, Any]:
    return _json(text, _ref("ChatStatus"))


def document() -> dict[str, Any]:
    guard = copy.deepcopy(GUARD_OPENAPI)
    paths: dict[str, Any] = {
        "/healthz": {
            "get": {
                "operationId": "health",
                "summary": "Liveness, and whether the store answers",
                "responses": {
                    "200": _json("alive (ok, or degraded: deciding on local state)",
                                 _ref("Health")),
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics",
                "responses": {
                    "200": {
                        "description": "Prometheus text exposition format",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document",
                "responses": {"200": _json("OpenAPI 3.1", {"type": "object"})},
            }
        },
        "/v1/bots/{bot}/messages": {
            "post": {
                "operationId": "postMessage",
                "summary": "A message for an http bot; answered with the decision",
                "parameters": [{"name": "bot", "in": "path", "required": True,
                                "schema": {"type": "string"}}],
                "requestBody": {"required": True,
                                "content": {"application/json": {"schema": _ref("Message")}}},
                "responses": {
                    "200": _json("the decision", _ref("Decision")),
                    **_errors(
                        s400=_BAD_INPUT,
                        s404="no http bot of that name",
                        s413="the body is over 64 KiB",
                        s503=_STORE_DOWN + " (nothing was sent for this message)",
                    ),
                },
            }
        },
        "/v1/bots/{bot}/decide": {
            "post": _decide_route(
                "decide", "May a decide-mode bot answer this message? (nothing is generated)",
                "Message", _json("the decision; reply and warn carry a ticket", _ref("Decision")),
            )
        },
        "/v1/bots/{bot}/sent": {
            "post": _decide_route(
                "sent", "What a decide-mode bot sent for a ticket",
                "Sent", _json("each id as counted", _ref("SentAnswer")),
                s409="the ticket was released: nothing can be sent on it",
            )
        },
        "/v1/bots/{bot}/release": {
            "post": _decide_route(
                "release", "A decide-mode bot sent nothing for a ticket: its slot goes back",
                "Release", _json("released", _ref("Released")),
                s409="the ticket was sent or released already",
            )
        },
        "/v1/webhooks/{bot}": {
            "post": {
                "operationId": "platformWebhook",
                "summary": "A platform's POST for a bot: a Telegram update (webhook mode), or a "
                "Slack event or /bouncer command (slack.mode: events)",
                "parameters": [
                    {"name": "bot", "in": "path", "required": True, "schema": {"type": "string"}},
                    {"name": "X-Telegram-Bot-Api-Secret-Token", "in": "header", "required": False,
                     "description": "Telegram: the bot's telegram.secret_token",
                     "schema": {"type": "string"}},
                    {"name": "X-Slack-Signature", "in": "header", "required": False,
                     "description": "Slack: v0=HMAC-SHA256 of v0:<timestamp>:<body>",
                     "schema": {"type": "string"}},
                    {"name": "X-Slack-Request-Timestamp", "in": "header", "required": False,
                     "description": "Slack: within 5 minutes of the daemon's clock",
                     "schema": {"type": "string"}},
                ],
                "requestBody": {"required": True, "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "application/x-www-form-urlencoded": {"schema": {"type": "object"}},
                }},
                "responses": {
                    "200": _json("taken: `{}`; Slack's URL check: its `challenge`; /bouncer: "
                                 "the answer only its caller sees", {
                        "type": "object",
                        "properties": {
                            "challenge": {"type": "string"},
                            "response_type": {"const": "ephemeral"},
                            "text": {"type": "string"},
                        },
                        "additionalProperties": False,
                    }),
                    **_errors(
                        s400=_BAD_INPUT,
                        s401="Slack: a bad or stale signature; the body was not read",
                        s403="Telegram: wrong or missing secret token; the update was not read",
                        s404="no bot here takes webhooks under that name",
                        s413="the body is over 1 MiB (a platform's largest event)",
                        s503=_STORE_DOWN + "; the platform delivers it again",
                    ),
                },
            }
        },
        "/v1/admin/chats/{chat}": {
            "get": _admin("chatStatus", "The chat's counters, limits, pause and rate use",
                          _status("the status")),
        },
        "/v1/admin/chats/{chat}/reset": {
            "post": _admin("resetChat", "Zero the turn counters, pair windows and cooldowns",
                           _status("the status after the reset")),
        },
        "/v1/admin/chats/{chat}/pause": {
            "post": _admin("pauseChat", "No bot answers in the chat until resumed",
                           _status("the status after the pause")),
        },
        "/v1/admin/chats/{chat}/resume": {
            "post": _admin("resumeChat", "Bots answer in the chat again",
                           _status("the status after the resume")),
        },
        "/v1/admin/chats/{chat}/limits": {
            "put": _admin(
                "setLimits", "Replace the chat's limit overrides",
                _status("the status with the new overrides"),
                requestBody={"required": True,
                             "content": {"application/json": {"schema": _ref("Limits")}}},
            ),
        },
        "/v1/admin/chats/{chat}/decisions": {
            "get": _admin(
                "chatDecisions", "The newest decisions, newest first (`why`)",
                _json("the decisions", {
                    "type": "object",
                    "required": ["chat", "decisions"],
                    "properties": {
                        "chat": {"type": "string"},
                        "decisions": {"type": "array", "items": _ref("LogEntry"),
                                      "maxItems": DECISION_LOG_SIZE},
                    },
                    "additionalProperties": False,
                }),
                parameters=[{"name": "limit", "in": "query", "required": False,
                             "schema": {"type": "integer", "default": DECISION_LOG_SIZE,
                                        "minimum": 1, "maximum": DECISION_LOG_SIZE}}],
            ),
        },
        "/v1/guard/openapi.json": {
            "get": {
                "operationId": "guardOpenapi",
                "summary": "The agent guard's part of this document, alone",
                "responses": {"200": _json("OpenAPI 3.1", {"type": "object"})},
            }
        },
    }  # fmt: skip
    paths.update(guard["paths"])
    schemas: dict[str, Any] = {
        "Message": MESSAGE,
        "Decision": DECISION,
        "Sent": SENT,
        "SentAnswer": SENT_ANSWER,
        "Release": RELEASE,
        "Released": RELEASED,
        "Limits": LIMITS,
        "ChatStatus": CHAT_STATUS,
        "LogEntry": LOG_ENTRY,
        "Health": HEALTH,
        **guard["components"]["schemas"],
        **llm_openapi.SCHEMAS,
    }
    paths.update(llm_openapi.paths())
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "botbouncer",
            "version": "1",
            "description": "The HTTP ingress, decide API, admin API, agent guard, LLM proxy, "
            "health and metrics of one botbouncer daemon. Every error is JSON, "
            '{"error": "..."}, but the LLM proxy\'s, which are in its APIs\' own shapes. '
            "Only the admin API takes a token (bearer).",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


OPENAPI = document()


def render() -> str:
    """The document as committed in docs/openapi.json."""
    return json.dumps(OPENAPI, indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
