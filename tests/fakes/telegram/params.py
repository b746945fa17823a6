"""Reading a method's parameters, and the error answer of the Bot API.

python-telegram-bot and aiogram send every parameter as a form field, with every value
that is no string JSON-encoded ("5", "true", objects and lists as JSON text); parameters
nested in a JSON object (reply_parameters) carry native values. The readers take both.
"""

from __future__ import annotations

import contextlib
import json
from http import HTTPStatus
from typing import Any

from tests.fakes.telegram.world import Json


class ApiError(Exception):
    """Answered as {"ok": false, "error_code": status, "description": ...}.

    PTB maps the HTTP status, not `error_code`: 400 BadRequest, 401/404 InvalidToken,
    403 Forbidden, 409 Conflict, `parameters.retry_after` RetryAfter; it strips a
    leading "Bad Request: " (and capitalises the rest) from the description. aiogram
    maps the same statuses (TelegramBadRequest, TelegramUnauthorizedError, TelegramNotFound,
    TelegramForbiddenError, TelegramConflictError, TelegramRetryAfter) and keeps the
    description as it is."""

    def __init__(
        self, status: int, description: str | None = None, *, retry_after: int | None = None
    ) -> None:
        if description is None:
            description = (
                f"Too Many Requests: retry after {retry_after}"
                if status == 429
                else HTTPStatus(status).phrase
            )
        super().__init__(description)
        self.status = status
        self.description = description
        self.retry_after = retry_after

    def body(self) -> Json:
        data: Json = {"ok": False, "error_code": self.status, "description": self.description}
        if self.retry_after is not None:
            data["parameters"] = {"retry_after": self.retry_after}
        return data


def opt_str(params: Json, name: str) -> str | None:
    value = params.get(name)
    if value is None or isinstance(value, str):
        return value
    raise ApiError(400, f'Bad Request: parameter "{name}" must be a string')


def opt_int(params: Json, name: str, error: str | None = None) -> int | None:
    value = params.get(name)
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return int(value.strip())
    raise ApiError(400, error or f"Bad Request: invalid {name} specified")


def opt_float(params: Json, name: str) -> float | None:
    value = params.get(name)
    if value is None or value == "":
        return None
    with contextlib.suppress(TypeError, ValueError):
        return float(value)
    raise ApiError(400, f"Bad Request: invalid {name} specified")


def opt_bool(params: Json, name: str) -> bool:
    value = params.get(name)
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ApiError(400, f"Bad Request: invalid {name} specified")


def opt_json(params: Json, name: str, what: str) -> Any:
    """A JSON-encoded parameter (`what` names it in the error, as Telegram does)."""
    value = params.get(name)
    if value is None or value == "":
        return None
    try:
        return json.loads(value) if isinstance(value, str) else value
    except ValueError:
        raise ApiError(400, f"Bad Request: can't parse {what} JSON object") from None


def opt_json_object(params: Json, name: str, what: str) -> Json | None:
    value: Json | None = opt_json(params, name, what)
    if value is not None and not isinstance(value, dict):
        raise ApiError(400, f"Bad Request: can't parse {what} JSON object")
    return value


def opt_strings(params: Json, name: str, what: str) -> list[str] | None:
    value: list[str] | None = opt_json(params, name, what)
    if value is not None and not (
        isinstance(value, list) and all(isinstance(v, str) for v in value)
    ):
        raise ApiError(400, f"Bad Request: can't parse {what} JSON object")
    return value
