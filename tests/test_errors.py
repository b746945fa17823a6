"""Every error botbouncer raises on purpose derives from one base that says its
HTTP answer (gateway/errors.py); the few that do not are named here, with why."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import adapters
import gateway
from gateway.errors import BotbouncerError

# Not a BotbouncerError on purpose:
OUTSIDE = {
    # an internal signal the error middleware must let through to the
    # connection's own handler, which answers 408 and closes the connection
    "gateway.httpserve.BodyTimeout",
    # the guard's client is the standard-library-only file an agent copies
    "gateway.guard.client.GuardError",
    "gateway.guard.client.GuardBlocked",
}


def _exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for package in (gateway, adapters):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            for name, cls in vars(module).items():
                if (inspect.isclass(cls) and issubclass(cls, BaseException)
                        and cls.__module__ == module.__name__):  # fmt: skip
                    found[f"{cls.__module__}.{name}"] = cls
    return found


def test_every_error_derives_from_the_one_base_or_is_named_as_outside() -> None:
    classes = _exception_classes()
    assert len(classes) >= 20  # the walk found the package's errors
    stray = sorted(n for n, c in classes.items()
                   if not issubclass(c, BotbouncerError) and n not in OUTSIDE)  # fmt: skip
    assert stray == []
    assert set(classes) >= OUTSIDE  # the exceptions still exist


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("gateway.api.common.BadRequest", 400),
        ("gateway.admin.AdminError", 400),
        ("gateway.wire.FieldError", 400),
        ("gateway.guard.requests.GuardInputError", 400),
        ("gateway.guard.service.ProfileConflict", 409),
        ("gateway.store.base.StoreError", 503),
        ("gateway.inflight.ShuttingDown", 503),
        ("gateway.config.errors.ConfigError", 500),
        ("gateway.errors.StartupError", 500),
    ],
)
def test_each_error_says_its_status(path: str, status: int) -> None:
    cls = _exception_classes()[path]
    assert issubclass(cls, BotbouncerError)
    assert cls.status == status
    shown = cls("the detail").public()
    # what a client may be told: its own text below 500; never a 500's detail
    assert ("the detail" in shown) == (status < 500)
