"""Run every benchmark in bench/ (what `make bench` does) and summarise them.

Each `bench/*.py` except this file and files starting with `_` runs as its own
process, one after another (they measure the machine: running them side by
side would measure each other). Their output streams through as it comes; at
the end one screen says, per benchmark, whether it exited 0 and its last line,
which by convention holds its ratios. Exit status 1 if any benchmark failed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@dataclass(frozen=True, slots=True)
class Outcome:
    name: str
    code: int
    seconds: float
    last_line: str


def benchmarks() -> list[Path]:
    me = Path(__file__).resolve()
    return sorted(p for p in HERE.glob("*.py") if p.resolve() != me and not p.name.startswith("_"))


def run(path: Path) -> Outcome:
    """Run one benchmark from the repo root, echoing its stdout line by line;
    its stderr goes straight through."""
    print(f"=== {path.name} ===", flush=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    last = ""
    with subprocess.Popen(
        [sys.executable, str(path)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                if line.strip():
                    last = line.strip()
            code = proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            raise
    return Outcome(path.name, code, time.perf_counter() - started, last)


def main() -> int:
    paths = benchmarks()
    if not paths:
        print(f"no benchmarks found in {HERE}", file=sys.stderr)
        return 1
    try:
        outcomes = [run(p) for p in paths]
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    width = max(len(o.name) for o in outcomes)
    print()
    print("=== summary ===")
    for o in outcomes:
        status = "ok" if o.code == 0 else f"FAILED (exit {o.code})"
        print(f"{o.name:<{width}}  {status:<16} {o.seconds:6.1f} s  {o.last_line or '-'}")
    failed = [o.name for o in outcomes if o.code != 0]
    if failed:
        print(f"{len(failed)} of {len(outcomes)} benchmarks failed: {', '.join(failed)}")
        return 1
    print(f"all {len(outcomes)} benchmarks exited 0 (a MISS is a measurement, not a failure)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
