"""Keeping configured secrets out of logs and error messages.

Every secret a loaded config holds (each `SecretStr` field: platform tokens,
`http.admin_token`, API keys, webhook headers, the Telegram webhook secret;
and the password of any URL, such as the Redis one) is remembered process-wide
by `load_config`. The daemon's log handler carries a `RedactingFilter`, which
replaces each of them, in every form a library may print it (URL-encoded,
JSON- or repr-escaped, base64), with `***` in the message, the traceback and
the stack of every record, whichever logger it came from (httpx logs request
URLs, and a Telegram token is part of the Bot API URL). Error messages built
from what a remote end answered (a webhook or an LLM endpoint may echo the
request's headers) are masked where they are built, before they are cut short.

Values shorter than MIN_LENGTH characters are not masked: they would garble
every line and protect nothing.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import Iterable, Iterator
from urllib.parse import parse_qsl, quote, quote_plus, urlsplit

from pydantic import BaseModel, SecretStr

__all__ = [
    "MASK",
    "MIN_LENGTH",
    "SECRETS",
    "RedactingFilter",
    "Redactor",
    "redact",
    "remember",
    "secret_values",
]

MASK = "***"
MIN_LENGTH = 4

_FORMATTER = logging.Formatter()


def _parts(secret: str) -> Iterator[str]:
    """The secret, and for a header value such as `Bearer <token>` the credential
    alone too (a server may echo just that)."""
    yield secret
    scheme, sep, credential = secret.partition(" ")
    if sep and scheme.isalpha() and credential.strip():
        yield credential.strip()


def _url_secrets(text: str) -> Iterator[str]:
    """The password in a URL's user info or its `password=` query parameter."""
    if "://" not in text:
        return
    try:
        parts = urlsplit(text)
        password = parts.password
    except ValueError:
        return
    if password:
        yield password
    for key, value in parse_qsl(parts.query):
        if key.lower() == "password" and value:
            yield value


def secret_values(model: BaseModel) -> set[str]:
    """Every secret in a (config) model: SecretStr values and URL passwords."""
    found: set[str] = set()

    def walk(value: object) -> None:
        if isinstance(value, SecretStr):
            found.update(_parts(value.get_secret_value()))
        elif isinstance(value, str):
            found.update(_url_secrets(value))
        elif isinstance(value, BaseModel):
            for name in type(value).model_fields:
                walk(getattr(value, name))
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple | set | frozenset):
            for item in value:
                walk(item)

    walk(model)
    return {s for s in found if len(s) >= MIN_LENGTH}


def _forms(secret: str) -> set[str]:
    """How `secret` may look once a library has printed it."""
    raw = secret.encode("utf-8", "surrogatepass")
    errors = "surrogatepass"  # an environment variable may carry lone surrogates
    quoted = {
        quote(secret, safe="", errors=errors),
        quote(secret, errors=errors),
        quote_plus(secret, errors=errors),
    }
    forms = {
        secret,
        *quoted,
        *(re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), q) for q in quoted),
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        repr(secret)[1:-1],
        repr(raw)[2:-1],
    }
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        encoded = encode(raw).decode("ascii")
        forms |= {encoded, encoded.rstrip("=")}
    return {f for f in forms if len(f) >= MIN_LENGTH}


class Redactor:
    """Replaces known secret values (in all their printed forms) with MASK."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self.add(secrets)

    @property
    def active(self) -> bool:
        return self._pattern is not None

    def add(self, secrets: Iterable[str]) -> None:
        new = {p for s in secrets for p in _parts(s) if len(p) >= MIN_LENGTH} - self._secrets
        if not new:
            return
        known = self._secrets | new
        forms = {f for s in known for f in _forms(s)}
        # Longest first, so a form is never half-masked by a shorter one.
        alternatives = sorted(forms, key=lambda f: (-len(f), f))
        self._pattern = re.compile("|".join(re.escape(f) for f in alternatives))
        self._secrets = known

    def __call__(self, text: str) -> str:
        pattern = self._pattern
        return text if pattern is None else pattern.sub(MASK, text)


# Every secret of every config this process loaded (see load_config).
SECRETS = Redactor()


def remember(config: BaseModel) -> None:
    """Mask this config's secrets in every later log line (and redact())."""
    SECRETS.add(secret_values(config))


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """`text` without the remembered secrets nor the `secrets` given here (the
    ones the caller holds, e.g. the API key of the request that failed)."""
    given = [s for s in secrets if s]
    text = SECRETS(text)
    return Redactor(given)(text) if given else text


class RedactingFilter(logging.Filter):
    """A handler filter that masks secrets in each record's message, traceback
    and stack before it is formatted. It rewrites the record itself, so every
    handler after it sees the masked text too."""

    def __init__(self, redactor: Redactor | None = None) -> None:
        super().__init__()
        self.redactor = SECRETS if redactor is None else redactor

    def filter(self, record: logging.LogRecord) -> bool:
        scrub = self.redactor
        if not scrub.active:
            return True
        try:
            message = record.getMessage()
        except Exception:  # a malformed call: keep its text, never its raw arguments
            record.msg, record.args = scrub(f"{record.msg!s} {record.args!r}"), None
        else:
            # kept formatted: the handler's formatter need not format it again
            record.msg, record.args = scrub(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = _FORMATTER.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = scrub(record.stack_info)
        return True
