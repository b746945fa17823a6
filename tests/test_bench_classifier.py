"""bench/classifier.py's premise, kept true: the message it times reaches the
reply decision (one model call, then the echo backend's answer) and its
priming messages fill the context without being answered. The benchmark
itself runs under `make bench`; this runs its set-up and one timed call of
each side (about a second), so a rule that stops the classifier being asked
for such a message fails here, not at the next `make bench`."""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path
from types import ModuleType

from tests.fakes.llm import FakeLLM

ROOT = Path(__file__).resolve().parent.parent


def bench_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_classifier", ROOT / "bench" / "classifier.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


async def test_the_classifier_benchmark_times_a_message_the_model_is_asked_about() -> None:
    bench = bench_module()
    # the benchmark sets up logging for a process of its own: put it back after
    logger = logging.getLogger("botbouncer")
    saved = (logger.level, logger.propagate, list(logger.handlers))
    logs = bench.DecisionLogging()
    try:
        async with FakeLLM() as llm:
            b = bench.Bench(llm, logs)
            try:
                await b.prime()  # raises CannotMeasure if a priming message is answered
                primed = llm.count
                assert primed == bench.CHATS * (bench.CONTEXT + 1)
                assert await b.gateway_call() > 0  # answered, after one model call
                assert llm.count == primed + 1
                body = llm.calls[-1].body
                assert body is not None and body["model"] == "gate"
                b.body = body
                assert await b.bare_call() > 0
                assert await b.classifier_call() > 0
            finally:
                await b.close()
    finally:
        logs.close()
        logging.disable(logging.NOTSET)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        logger.handlers[:] = saved[2]
