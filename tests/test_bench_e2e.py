"""bench/_e2e.py's CPU reading and the bound it prints, held to hand-made
figures: the end-to-end benchmarks run under `make bench`, and a wrong sum
here would misread every one of them."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def bench_module() -> ModuleType:
    sys.path.insert(0, str(ROOT / "bench"))  # its own imports (_redis) live there
    try:
        spec = importlib.util.spec_from_file_location("bench_e2e", ROOT / "bench" / "_e2e.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look themselves up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "bench"))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
def test_process_cpu_reads_what_the_process_spent() -> None:
    e2e = bench_module()
    # time.process_time: every thread of this process, as process_cpu reads it
    before, started = e2e.process_cpu(os.getpid()), time.process_time()
    while time.process_time() < started + 0.02:
        pass
    after, spent = e2e.process_cpu(os.getpid()), time.process_time() - started
    assert before is not None and after is not None
    assert abs((after - before) - spent) < 0.004
    assert e2e.process_cpu(2**22 + 7) is None  # no such process (above pid_max's default)


def test_the_bound_is_the_cores_over_b_s_cpu_a_message_against_a_s_rate(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    e2e = bench_module()
    monkeypatch.setattr(os, "cpu_count", lambda: 2)

    def run(label: str, seconds: float, all_cpu_ms: float, window: float) -> object:
        return e2e.Run(label, 1000, seconds, [0.01] * 1000, cpu_ms=0.3, bot_cpu_ms=0.3,
                       all_cpu_ms=all_cpu_ms, cpu_window_s=window)  # fmt: skip

    # a: 1,000 messages a second at 1.6 ms of CPU each (1.6 of 2 cores over a
    # 1.0 s window); b at 2.5 ms a message can do at most 800 a second: 0.8 of a
    a = [run("a", 1.0, 1.6, 1.0), run("a", 1.0, 1.6, 1.0), run("a", 2.0, 1.6, 2.0)]
    b = [run("b", 1.5, 2.5, 1.5), run("b", 1.5, 2.0, 1.5), run("b", 1.5, 2.5, 1.5)]
    e2e.say_ceiling(a, b)
    said = capsys.readouterr().out
    # rounds: 2 * 1000 / (2.5 * 1000) = 0.8, 2 * 1000 / (2.0 * 1000) = 1.0,
    # 2 * 1000 / (2.5 * 500) = 1.6: the median, 1.0
    assert "can be at most 1.000 here" in said
    assert "a kept 1.60 of the 2 busy" in said
    e2e.say_ceiling([run("a", 1.0, 1.6, 1.0)], [run("b", 1.5, 2.5, 1.5)])
    assert "can be at most 0.800 here" in capsys.readouterr().out
    # without CPU figures (a platform where /proc is not there) nothing is said
    e2e.say_ceiling([e2e.Run("a", 10, 1.0, [0.1] * 10)], [e2e.Run("b", 10, 1.0, [0.1] * 10)])
    assert capsys.readouterr().out == ""


def test_the_baseline_daemon_gets_the_next_database_of_the_same_redis() -> None:
    e2e = bench_module()
    assert e2e.baseline_store("redis://127.0.0.1:6379/14") == "redis://127.0.0.1:6379/15"
    assert e2e.baseline_store("redis://127.0.0.1:6379/15") == "redis://127.0.0.1:6379/0"
    assert e2e.baseline_store("redis://127.0.0.1:7000") == "redis://127.0.0.1:7000/1"
    assert (e2e.baseline_store("rediss://u:p@h:1/3?socket_timeout=2")
            == "rediss://u:p@h:1/4?socket_timeout=2")  # fmt: skip
    assert e2e.baseline_store("memory://") == "memory://"
