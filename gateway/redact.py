"""Keeping configured secrets out of logs and error messages.

Every secret a loaded config holds (each `SecretStr` field: platform tokens,
`http.admin_token`, API keys, webhook headers, the Telegram webhook secret;
and the password in the user info or `password=` parameter of any URL, plain
string field or not: the Redis URL, a webhook `url`, an OpenAI `endpoint`) is
remembered process-wide by `load_config`. The daemon's log handler carries a
`RedactingFilter`, which replaces each of them, in every form a library may
print it, with `***` in the message, the traceback and the stack of every
record, whichever logger it came from (httpx logs request URLs, and a Telegram
token is part of the Bot API URL). Those forms: percent-encoded in any of the
ways URL libraries do it (yarl leaves `!$&+` of a password as they are, urllib
encodes them), JSON- or repr-escaped, and base64 at any byte offset, so that
the `Basic` header aiohttp makes of `user:password` in a URL (or any other
`prefix:secret`) is recognised without knowing the prefix; the whole base64
run around it is masked. Error messages built from what a remote end answered
(a webhook or an LLM endpoint may echo the request's headers) are masked where
they are built, before they are cut short.

Values shorter than MIN_LENGTH characters are not masked: they would garble
every line and protect nothing (and a 4-character one in base64 only where it
starts the encoding: at other offsets too little of it shows to be sure).
"""

from __future__ import annotations

import base64
import json
import logging
import re
import string
from collections.abc import Iterable, Iterator
from urllib.parse import unquote, unquote_plus, urlsplit

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
_MIN_CORE = 6  # base64 characters: 36 bits, see _base64_cores

_FORMATTER = logging.Formatter()


def _parts(secret: str) -> Iterator[str]:
    """The secret, and for a header value such as `Bearer <token>` the credential
    alone too (a server may echo just that)."""
    yield secret
    scheme, sep, credential = secret.partition(" ")
    if sep and scheme.isalpha() and credential.strip():
        yield credential.strip()


def _url_secrets(text: str) -> Iterator[str]:
    """The password in a URL's user info or its `password=` query parameter (a
    Sentinel URL's `sentinel_password=` too), as written and decoded: aiohttp
    sends the decoded user info as a Basic header."""
    if "://" not in text:
        return
    try:
        parts = urlsplit(text)
        password = parts.password
    except ValueError:
        return
    if password:
        yield password
        yield unquote(password)
    for pair in re.split("[&;]", parts.query):
        key, _, value = pair.partition("=")
        if unquote_plus(key).lower() in ("password", "sentinel_password") and value:
            yield value
            yield unquote_plus(value)


def secret_values(model: BaseModel) -> set[str]:
    """Every secret in a (config) model: SecretStr values and URL passwords."""
    found: set[str] = set()

    def walk(value: object) -> None:
        if isinstance(value, SecretStr):
            secret = value.get_secret_value()
            found.update(_parts(secret))
            found.update(_url_secrets(secret))
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


# Characters no URL encoder escapes (RFC 3986 "unreserved").
_UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._~")
# Both base64 alphabets; a masked base64 run extends over all of these.
_BASE64 = frozenset(string.ascii_letters + string.digits + "+/-_")


def _percent_patterns(secret: str) -> list[str]:
    """Regexes for `secret` with each character that is not unreserved either as
    it is or percent-encoded, in either case: encoders disagree on which to
    escape (urllib's quote and quote_plus, yarl, httpx), so no list of their
    outputs is complete. One regex per way of writing the first character: a
    pattern whose every alternative starts with a literal is searched for
    several times faster."""
    chars = []
    for char in secret:
        if char in _UNRESERVED:
            chars.append([re.escape(char)])
            continue
        encoded = "".join(
            "%" + "".join(f"[{d}{d.lower()}]" if d.isalpha() else d for d in f"{byte:02X}")
            for byte in char.encode("utf-8", "surrogatepass")
        )
        chars.append([re.escape(char), encoded, *([r"\+"] if char == " " else [])])
    rest = "".join(c[0] if len(c) == 1 else f"(?:{'|'.join(c)})" for c in chars[1:])
    return [first + rest for first in chars[0]]


def _base64_cores(raw: bytes) -> set[str]:
    """What base64 shows of `raw` whatever comes before and after it: for each of
    the three byte offsets the encoding may start at, the characters made of
    `raw`'s bits alone (the first ones also carry the prefix's bits, the last
    one the suffix's). A `Basic` header encodes `user:secret`, the secret at
    the offset len(user) + 1. A core shorter than _MIN_CORE is left out (for
    offset 0, the encoding of `raw` alone stands in): a masked core takes the
    whole run of base64 characters around it, a URL path for one, so a chance
    match of a few characters would hide much."""
    cores = set()
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        for offset, mixed in ((0, 0), (1, 2), (2, 3)):
            whole = 8 * (offset + len(raw)) // 6
            core = encode(b"\0" * offset + raw).decode("ascii")[mixed:whole]
            if len(core) >= _MIN_CORE:
                cores.add(core)
            elif offset == 0:
                alone = encode(raw).decode("ascii")
                cores |= {alone, alone.rstrip("=")}
    return {c for c in cores if len(c) >= MIN_LENGTH}


def _forms(secret: str) -> tuple[dict[str, int], set[str]]:
    """How `secret` may look once a library has printed it: regexes (each with
    the length it sorts by) and the base64 cores among them."""
    raw = secret.encode("utf-8", "surrogatepass")
    percent = _percent_patterns(secret)
    literal = {
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        repr(secret)[1:-1],
        repr(raw)[2:-1],
    }
    forms = dict.fromkeys(percent, len(secret))
    either = "|".join(percent)
    forms.update((re.escape(f), len(f)) for f in literal if not re.fullmatch(either, f, re.DOTALL))
    cores = _base64_cores(raw)
    forms.update((re.escape(c), len(c)) for c in cores)
    return forms, cores


class Redactor:
    """Replaces known secret values (in all their printed forms) with MASK."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: set[str] = set()
        self._forms: dict[str, int] = {}
        self._cores: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self.add(secrets)

    @property
    def active(self) -> bool:
        return self._pattern is not None

    def add(self, secrets: Iterable[str]) -> None:
        new = {p for s in secrets for p in _parts(s) if len(p) >= MIN_LENGTH} - self._secrets
        if not new:
            return
        for secret in new:
            forms, cores = _forms(secret)
            for form, length in forms.items():
                self._forms[form] = max(length, self._forms.get(form, 0))
            self._cores |= cores
        # Longest first, so a form is never half-masked by a shorter one.
        alternatives = sorted(self._forms, key=lambda f: (-self._forms[f], f))
        self._pattern = re.compile("|".join(alternatives), re.DOTALL)
        self._secrets |= new

    def __call__(self, text: str) -> str:
        pattern = self._pattern
        if pattern is None or (found := pattern.search(text)) is None:
            return text
        out: list[str] = []
        done, end = 0, len(text)
        while found is not None:
            start, stop = found.span()
            if found.group() in self._cores:  # the whole base64 run it is part of
                while start > done and text[start - 1] in _BASE64:
                    start -= 1
                while stop < end and text[stop] in _BASE64:
                    stop += 1
                for _ in range(2):
                    if stop < end and text[stop] == "=":
                        stop += 1
            out += (text[done:start], MASK)
            done = stop
            found = pattern.search(text, done)
        out.append(text[done:])
        return "".join(out)


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
