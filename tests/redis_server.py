"""Start and stop private redis-server processes for tests.

Tests never stop a Redis they did not start: fault tests take one of these.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis.asyncio as aioredis

INSTALL_HINT = (
    "no Redis answers at REDIS_URL and there is no `redis-server` on PATH to start one.\n"
    "Install it, e.g.  sudo apt-get install redis-server   (Debian/Ubuntu)\n"
    "              or  brew install redis                  (macOS)\n"
    "or point REDIS_URL at a Redis you may use (db 15 by default)."
)


async def delete_matching(url: str, *patterns: str) -> None:
    """Leave a shared Redis as it was found: drop the keys matching each SCAN
    pattern (a test's or a benchmark's own, named by its run)."""
    client = aioredis.from_url(url)
    try:
        for pattern in patterns:
            keys = [k async for k in client.scan_iter(match=pattern, count=1000)]
            if keys:
                await client.delete(*keys)
    finally:
        await client.aclose()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def answers(host: str, port: int, timeout: float = 0.5) -> bool:
    """A PING over a raw socket: no client library, no retries."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


class RedisServer:
    """One redis-server on a free 127.0.0.1 port, nothing kept on disk."""

    def __init__(self, *extra: str) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(INSTALL_HINT)
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="bb-redis-"))
        self.args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                     "--appendonly", "no", "--dir", str(self.dir), *extra]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + timeout
        while not answers("127.0.0.1", self.port, 0.2):
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not answer on port {self.port}")
            time.sleep(0.02)  # polling a child process: nothing to await
        return self

    def kill(self) -> None:
        """SIGKILL, as an outage would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
