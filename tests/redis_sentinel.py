"""A real Redis Sentinel setup for the tests: one master, one replica and
three sentinels, each a private process on a free 127.0.0.1 port, nothing
kept on disk. A sentinel is `redis-sentinel <conf>` where Debian's
`redis-sentinel` package is installed, else `redis-server <conf> --sentinel`:
one binary (redis-tools'), which runs as a sentinel when called by that name
or given `--sentinel`. The tests SIGKILL the master and wait for the
sentinels to promote the replica.

Every process logs to a file in the setup's temp dir; when something does not
come up in time the error quotes the logs' tails."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis

from tests.redis_server import INSTALL_HINT, RedisServer, answers, free_port

SERVICE = "bbmaster"
HOST = "127.0.0.1"
DOWN_AFTER_MS = 500  # how long a master may not answer before it is down
FAILOVER_TIMEOUT_MS = 3000
LOG_TAIL = 12  # lines of each log quoted in an error


def _client(port: int) -> redis.Redis:
    return redis.Redis(host=HOST, port=port, socket_timeout=1, socket_connect_timeout=1,
                       decode_responses=True, retry=None)  # fmt: skip


class SentinelSetup:
    """A master, a replica and three sentinels watching them as `service`."""

    def __init__(self, service: str = SERVICE) -> None:
        if shutil.which("redis-server") is None:
            raise RuntimeError(INSTALL_HINT)
        self.service = service
        self.dir = Path(tempfile.mkdtemp(prefix="bb-sentinel-"))
        # The replica may have to serve a sync itself after a promotion: no
        # server waits for more replicas before a diskless sync (7.0: 5 s).
        common = ("--repl-diskless-sync-delay", "0")
        self.master = RedisServer(*common, "--logfile", str(self.dir / "master.log"))
        self.replica = RedisServer(*common, "--logfile", str(self.dir / "replica.log"),
                                   "--replicaof", HOST, str(self.master.port))  # fmt: skip
        self.ports = [free_port() for _ in range(3)]
        self._procs: list[subprocess.Popen[bytes]] = []
        self._killed: int | None = None

    @property
    def sentinels(self) -> list[tuple[str, int]]:
        return [(HOST, p) for p in self.ports]

    @property
    def url(self) -> str:
        """The store URL: `redis+sentinel://h:p,h:p,h:p/<service>`."""
        nodes = ",".join(f"{h}:{p}" for h, p in self.sentinels)
        return f"redis+sentinel://{nodes}/{self.service}"

    def url_for_db(self, db: int) -> str:
        return f"{self.url}/{db}"

    # -- start ---------------------------------------------------------------

    def start(self, timeout: float = 20.0) -> SentinelSetup:
        try:
            self.master.start()
            self.replica.start()
            for port in self.ports:
                self._procs.append(self._start_sentinel(port))
            self._wait(self._ready, timeout,
                       "the replica to sync and each sentinel to see it and two peers")  # fmt: skip
        except BaseException:
            self.stop()
            raise
        return self

    def _start_sentinel(self, port: int) -> subprocess.Popen[bytes]:
        conf = self.dir / f"sentinel-{port}.conf"  # the sentinel rewrites it
        s = self.service
        conf.write_text(
            f"port {port}\n"
            f"bind {HOST}\n"
            f"dir {self.dir}\n"
            f"logfile {self.dir / f'sentinel-{port}.log'}\n"
            "sentinel resolve-hostnames no\n"
            f"sentinel announce-ip {HOST}\n"
            f"sentinel monitor {s} {HOST} {self.master.port} 2\n"
            f"sentinel down-after-milliseconds {s} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {s} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {s} 1\n"
        )
        named = shutil.which("redis-sentinel")
        server = shutil.which("redis-server")
        assert server is not None  # checked in __init__
        args = [named, str(conf)] if named else [server, str(conf), "--sentinel"]
        return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _ready(self) -> str | None:
        """None when all is up, else what is not yet."""
        for proc in [self.master.proc, self.replica.proc, *self._procs]:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        for port in self.ports:
            if not answers(HOST, port, 0.2):
                return f"sentinel :{port} does not answer"
        replica = _client(self.master.port).info("replication").get("slave0", {})
        if replica.get("state") != "online":
            return f"the master shows its replica as {replica or 'absent'}"
        link = _client(self.replica.port).info("replication").get("master_link_status")
        if link != "up":
            return f"the replica's master_link_status is {link}"
        for port in self.ports:
            seen = _client(port).sentinel_master(self.service)
            peers, replicas = int(seen["num-other-sentinels"]), int(seen["num-slaves"])
            if peers != 2 or replicas != 1:
                return f"sentinel :{port} sees {peers} other sentinels and {replicas} replicas"
        return None

    def _wait(self, ready: Callable[[], str | None], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        pending: str | None = "no check finished"
        while True:
            try:
                pending = ready()
                if pending is None:
                    return
            except redis.RedisError as exc:
                pending = f"{type(exc).__name__}: {exc}"
            except RuntimeError as exc:
                raise RuntimeError(f"{exc}\n{self.log_tails()}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout} s waiting for {what} "
                                   f"(last: {pending})\n{self.log_tails()}")  # fmt: skip
            time.sleep(0.05)  # polling child processes: nothing to await

    def log_tails(self, lines: int = LOG_TAIL) -> str:
        out = []
        for log in sorted(self.dir.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name} (last {len(tail)} lines)\n" + "\n".join(tail))
        return "\n".join(out) or f"(no logs in {self.dir})"

    # -- the master and its failover -----------------------------------------

    def _named_masters(self) -> list[int | None]:
        """What each live sentinel names as the master's port (None: no answer)."""
        named: list[int | None] = []
        for port in self.ports:
            try:
                addr = _client(port).execute_command(
                    "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service
                )
                named.append(int(addr[1]) if addr else None)
            except redis.RedisError:
                named.append(None)
        return named

    def master_port(self) -> int:
        """The master's port, as the first sentinel that answers names it."""
        for port in self._named_masters():
            if port is not None:
                return port
        raise RuntimeError(f"no sentinel named a master for {self.service}\n{self.log_tails()}")

    def kill_master(self) -> int:
        """SIGKILL whichever of the two servers is master now; its port."""
        port = self.master_port()
        server = next((s for s in (self.master, self.replica) if s.port == port), None)
        if server is None:
            raise RuntimeError(f"the sentinels name port {port}, not a server of this setup")
        server.kill()
        self._killed = port
        return port

    def wait_failover(self, timeout: float = 15.0, old_port: int | None = None) -> float:
        """Until every sentinel names a master other than `old_port` (by
        default the one `kill_master` killed) and that server answers ROLE as
        a master; the seconds it took."""
        old = self._killed if old_port is None else old_port
        if old is None:
            raise RuntimeError("wait_failover: no master was killed and no old_port given")
        t0 = time.monotonic()

        def promoted() -> str | None:
            named = self._named_masters()
            if len(set(named)) != 1 or named[0] is None or named[0] == old:
                return f"the sentinels name {named}"
            role = _client(named[0]).execute_command("ROLE")
            return None if role[0] == "master" else f":{named[0]} answers ROLE {role[0]}"

        self._wait(promoted, timeout, f"the sentinels to promote a master other than :{old}")
        return time.monotonic() - t0

    # -- stop ----------------------------------------------------------------

    def stop(self) -> None:
        """Stop every process this setup started (and nothing else)."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()
        self.replica.stop()
        self.master.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SentinelSetup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
