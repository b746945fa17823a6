"""A private Redis Cluster for tests: three masters, no replicas, free ports.

Formed with plain commands over redis-py (CLUSTER ADDSLOTSRANGE, SET-CONFIG-EPOCH,
MEET) rather than `redis-cli --cluster create`, which is not installed everywhere
redis-server is.
"""

from __future__ import annotations

import subprocess
import time

import redis

from tests.redis_server import RedisServer, free_port

SLOTS = 16384
NODE_TIMEOUT_MS = 2000


def _version(binary: str) -> tuple[int, ...]:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    # "Redis server v=7.0.15 sha=..."
    v = next(part for part in out.split() if part.startswith("v="))[2:]
    return tuple(int(x) for x in v.split(".")[:2])


def _info(text: str) -> dict[str, str]:
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


class LocalCluster:
    """`masters` redis-server processes in cluster mode, slots split evenly."""

    def __init__(self, masters: int = 3) -> None:
        self.nodes: list[RedisServer] = []
        self.bus_ports: list[int] = []  # each node's cluster bus port
        self.masters = masters

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]

    def client(self, port: int) -> redis.Redis:
        """A plain (non-cluster) client on one node, for looking at what it holds."""
        return redis.Redis(host="127.0.0.1", port=port, decode_responses=True)

    def start(self, timeout: float = 20.0) -> LocalCluster:
        try:
            for _ in range(self.masters):
                self.nodes.append(self._node().start())
            self._form(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _node(self) -> RedisServer:
        node = RedisServer()  # raises with the install hint when redis-server is missing
        if _version(node.args[0]) >= (7, 0):
            # the bus port is otherwise port + 10000: unchecked, maybe taken or > 65535
            bus = free_port()
            node.args += ["--cluster-port", str(bus)]
        else:
            while node.port + 10000 > 65535:
                node.stop()
                node = RedisServer()
            bus = node.port + 10000
        node.args += ["--cluster-enabled", "yes",
                      "--cluster-config-file", str(node.dir / "nodes.conf"),
                      "--cluster-node-timeout", str(NODE_TIMEOUT_MS)]  # fmt: skip
        self.bus_ports.append(bus)
        return node

    def _form(self, timeout: float) -> None:
        clients = [self.client(p) for p in self.ports]
        try:
            bounds = [SLOTS * i // len(clients) for i in range(len(clients) + 1)]
            for i, c in enumerate(clients):
                first, last = bounds[i], bounds[i + 1] - 1
                try:
                    c.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
                except redis.ResponseError:  # Redis < 7
                    c.execute_command("CLUSTER", "ADDSLOTS", *range(first, last + 1))
                # distinct epochs, as redis-cli sets them: no collision to resolve
                c.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
            # every node meets every other: no waiting for gossip to introduce them
            for i, c in enumerate(clients):
                for port, bus in list(zip(self.ports, self.bus_ports, strict=True))[i + 1 :]:
                    meet = [port] if bus == port + 10000 else [port, bus]  # the 3rd needs 7.0
                    c.execute_command("CLUSTER", "MEET", "127.0.0.1", *meet)
            self._wait_ok(clients, timeout)
        finally:
            for c in clients:
                c.close()

    def _wait_ok(self, clients: list[redis.Redis], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        want = {"cluster_state": "ok", "cluster_known_nodes": str(len(clients)),
                "cluster_size": str(len(clients)),
                "cluster_slots_assigned": str(SLOTS)}  # fmt: skip
        while True:
            infos = [_info(c.execute_command("CLUSTER", "INFO")) for c in clients]
            bad = {
                port: {k: info.get(k) for k, v in want.items() if info.get(k) != v}
                for port, info in zip(self.ports, infos, strict=True)
                if any(info.get(k) != v for k, v in want.items())
            }
            if not bad:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the Redis cluster on ports {self.ports} did not form within "
                    f"{timeout}s; nodes not ready (want {want}): {bad}"
                )
            time.sleep(0.05)  # polling child processes: nothing to await

    def node_of(self, key: str) -> int:
        """The port of the master serving `key`'s slot."""
        with self.client(self.ports[0]) as c:
            slot = int(c.execute_command("CLUSTER", "KEYSLOT", key))
        bounds = [SLOTS * i // len(self.nodes) for i in range(len(self.nodes) + 1)]
        return next(p for i, p in enumerate(self.ports) if bounds[i] <= slot < bounds[i + 1])

    def keys_by_node(self, pattern: str) -> dict[int, set[str]]:
        """Which node holds which keys matching `pattern` (nodes holding none left out)."""
        out: dict[int, set[str]] = {}
        for port in self.ports:
            with self.client(port) as c:
                found = set(c.scan_iter(match=pattern, count=1000))
            if found:
                out[port] = found
        return out

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.nodes = []
        self.bus_ports = []
