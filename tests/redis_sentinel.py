"""A real Redis Sentinel setup for the tests: one master, one replica and
three sentinels, each a private `redis-server` on a free 127.0.0.1 port
(a sentinel is `redis-server <conf> --sentinel`, the binary Debian's
`redis-sentinel` links to), nothing kept on disk. The tests kill the master
(SIGKILL) and wait for the sentinels to promote the replica."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis

from tests.redis_server import RedisServer, answers, free_port

SERVICE = "bbmaster"
DOWN_AFTER_MS = 500  # how long a master may not answer before it is down
FAILOVER_TIMEOUT_MS = 3000


class SentinelSetup:
    def __init__(self, service: str = SERVICE) -> None:
        self.service = service
        self.master = RedisServer()
        self.replica = RedisServer("--replicaof", "127.0.0.1", str(self.master.port))
        self.ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        nodes = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        return f"redis+sentinel://{nodes}/{self.service}"

    def start(self, timeout: float = 20.0) -> SentinelSetup:
        try:
            self.master.start()
            self.replica.start()
            binary = shutil.which("redis-server")
            assert binary is not None  # RedisServer checked it
            for port in self.ports:
                conf = Path(self.master.dir) / f"sentinel-{port}.conf"
                conf.write_text(
                    f"port {port}\nbind 127.0.0.1\ndir {self.master.dir}\n"
                    f"sentinel monitor {self.service} 127.0.0.1 {self.master.port} 2\n"
                    f"sentinel down-after-milliseconds {self.service} {DOWN_AFTER_MS}\n"
                    f"sentinel failover-timeout {self.service} {FAILOVER_TIMEOUT_MS}\n"
                    f"sentinel parallel-syncs {self.service} 1\n"
                )
                self.sentinels.append(subprocess.Popen(
                    [binary, str(conf), "--sentinel"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip
            self._wait(self._ready, timeout, "the sentinels to see the master, replica and peers")
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        if not all(answers("127.0.0.1", p, 0.2) for p in self.ports):
            return False
        link = redis.Redis(port=self.replica.port, socket_timeout=1).info("replication")
        if link.get("master_link_status") != "up":
            return False
        for port in self.ports:
            seen = redis.Redis(port=port, socket_timeout=1).sentinel_master(self.service)
            if int(seen["num-other-sentinels"]) < 2 or int(seen["num-slaves"]) < 1:
                return False
        return True

    @staticmethod
    def _wait(ready: object, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if ready():  # type: ignore[operator]
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.05)  # polling child processes: nothing to await

    def master_port(self) -> int:
        for port in self.ports:
            try:
                _, found = redis.Redis(port=port, socket_timeout=1).execute_command(
                    "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service
                )
                return int(found)
            except redis.RedisError:
                continue
        raise RuntimeError("no sentinel answered")

    def kill_master(self) -> int:
        """SIGKILL whichever server is master now; its port."""
        port = self.master_port()
        (self.master if self.master.port == port else self.replica).kill()
        return port

    def wait_failover(self, old_port: int, timeout: float = 15.0) -> float:
        """Until the sentinels name another master that answers as one; seconds taken."""
        t0 = time.monotonic()

        def promoted() -> bool:
            port = self.master_port()
            role = redis.Redis(port=port, socket_timeout=1).execute_command("ROLE")
            return port != old_port and role[0] in (b"master", "master")

        self._wait(promoted, timeout, "the sentinels to promote the replica")
        return time.monotonic() - t0

    def stop(self) -> None:
        for proc in self.sentinels:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.sentinels.clear()
        self.replica.stop()
        self.master.stop()

    def __enter__(self) -> SentinelSetup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
