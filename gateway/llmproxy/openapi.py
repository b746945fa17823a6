"""The LLM proxy's part of the OpenAPI document (gateway/openapi.py), at the
default paths (`llm_proxy.<api>.path` moves them). The request and answer
bodies are the upstream APIs' own; what the proxy adds is described here."""

from __future__ import annotations

from typing import Any

from gateway.llmproxy.session import HEADER

# The watched routes: (API section, route under its path, what it is, operationId).
GUARDED = [
    ("openai", "/v1/chat/completions", "OpenAI Chat Completions", "llmProxyOpenai"),
    ("openai", "/v1/responses", "OpenAI Responses", "llmProxyOpenaiResponses"),
    ("anthropic", "/v1/messages", "Anthropic Messages", "llmProxyAnthropic"),
]
PREFIX = {"openai": "/llm/openai", "anthropic": "/llm/anthropic"}
_TITLE = {"openai": "OpenAI", "anthropic": "Anthropic"}
_ERROR = {"openai": "OpenAIError", "anthropic": "AnthropicError"}

SCHEMAS: dict[str, Any] = {
    "OpenAIError": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": "null"},
                    "code": {"type": "string"},
                },
            }
        },
    },
    "AnthropicError": {
        "type": "object",
        "required": ["type", "error"],
        "properties": {
            "type": {"const": "error"},
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
}


def _error(api: str, text: str) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{_ERROR[api]}"}
    return {"description": text, "content": {"application/json": {"schema": ref}}}


def _model_call(api: str, title: str, operation: str) -> dict[str, Any]:
    return {
        "operationId": operation,
        "summary": f"{title} through the guard: the history's new tool calls and "
        "results are fed to it, a loop it blocks ends with an answer",
        "parameters": [
            {
                "name": HEADER,
                "in": "header",
                "required": False,
                "description": "the guard session (else a fingerprint of the conversation)",
                "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:@-]{1,128}$"},
            },
        ],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"type": "object"}}},
        },
        "responses": {
            "200": {
                "description": "the upstream's answer, whole or streamed as it arrives (or, "
                "block_mode: stop, a final answer the proxy wrote)",
                "headers": {
                    HEADER: {
                        "schema": {"type": "string"},
                        "description": "the session (once the conversation has one)",
                    },
                    "X-Botbouncer-Guard": {
                        "schema": {"type": "string"},
                        "description": "`<decision> <reason>` unless allow",
                    },
                },
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "text/event-stream": {"schema": {"type": "string"}},
                },
            },
            "400": _error(
                api,
                "invalid_session: a bad X-Botbouncer-Session header; "
                "invalid_path: a `..` segment in the path",
            ),
            "409": _error(api, "guard_conflict: the session runs under another profile"),
            "413": _error(api, "request_too_large: over llm_proxy.max_body_bytes"),
            "429": _error(api, "budget_exhausted: the session's budget is spent"),
            "502": _error(api, "upstream_unreachable"),
            "503": _error(api, "shutting_down: the daemon is stopping"),
            "504": _error(api, "upstream_timeout: no answer within timeouts.read_seconds"),
            "default": {"description": "the upstream's own answer, with its status"},
        },
    }


def _passthrough(api: str, method: str) -> dict[str, Any]:
    return {
        "operationId": f"llmProxy{api.capitalize()}{method.capitalize()}",
        "summary": f"Any other {_TITLE[api]} API request (models, files, ...), "
        "forwarded as it came",
        "parameters": [
            {"name": "tail", "in": "path", "required": True, "schema": {"type": "string"}}
        ],
        "responses": {
            "default": {"description": "the upstream's own answer, with its status"},
            "400": _error(api, "invalid_path: a `..` segment in the path"),
            "413": _error(api, "request_too_large"),
            "502": _error(api, "upstream_unreachable"),
            "504": _error(api, "upstream_timeout"),
        },
    }


def paths() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for api, route, title, operation in GUARDED:
        out[PREFIX[api] + route] = {"post": _model_call(api, title, operation)}
    for api in PREFIX:
        out[PREFIX[api] + "/{tail}"] = {
            "get": _passthrough(api, "get"),
            "post": _passthrough(api, "post"),
        }
    return out
