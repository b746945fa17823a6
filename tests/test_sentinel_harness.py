"""The Sentinel harness itself (tests/redis_sentinel.py): a master, a replica
and three sentinels come up; redis-py's Sentinel client writes to the master;
the master is SIGKILLed; the sentinels promote the replica and the same
Sentinel object reads and writes on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis.sentinel import Sentinel

from tests.redis_sentinel import SentinelSetup
from tests.redis_server import answers

pytestmark = pytest.mark.timeout(60)

# down-after 500 ms, then an election (each sentinel waits up to 1 s at
# random before it asks for votes); measured 2.0-2.2 s here. A lost election
# retries after 2 x failover-timeout (6 s): the bound allows one.
PROMOTED_WITHIN = 10.0


@pytest.fixture
def setup() -> Iterator[SentinelSetup]:
    with SentinelSetup() as s:
        yield s


def test_a_killed_master_is_replaced_and_the_client_follows(setup: SentinelSetup) -> None:
    sentinel = Sentinel(setup.sentinels, socket_timeout=0.5, socket_connect_timeout=0.5)
    master = sentinel.master_for(setup.service, decode_responses=True)
    try:
        master.set("bb:harness", "before")
        assert master.wait(1, 2000) == 1  # on the replica before the kill

        old = setup.kill_master()
        assert old == setup.master.port
        took = setup.wait_failover(timeout=PROMOTED_WITHIN + 5)
        print(f"promoted in {took:.2f} s")
        assert took < PROMOTED_WITHIN

        new = setup.master_port()
        assert new == setup.replica.port != old
        assert sentinel.discover_master(setup.service) == ("127.0.0.1", new)
        # The pooled connection is to the dead master: redis-py's retry
        # reconnects, and a new connection asks the sentinels where to go.
        assert master.get("bb:harness") == "before"
        master.set("bb:harness", "after")
        assert master.get("bb:harness") == "after"
        assert master.connection_pool.get_master_address() == ("127.0.0.1", new)
    finally:
        master.close()


def test_addresses_and_a_stop_that_leaves_nothing_running() -> None:
    s = SentinelSetup().start()
    try:
        nodes = ",".join(f"127.0.0.1:{p}" for _, p in s.sentinels)
        assert s.url == f"redis+sentinel://{nodes}/{s.service}"
        assert s.url_for_db(3) == f"redis+sentinel://{nodes}/{s.service}/3"
        assert len(s.sentinels) == 3 and all(h == "127.0.0.1" for h, _ in s.sentinels)
        assert s.master_port() == s.master.port
        ports = [s.master.port, s.replica.port, *(p for _, p in s.sentinels)]
        s.kill_master()  # a dead server among them is stopped all the same
    finally:
        s.stop()
    assert not any(answers("127.0.0.1", p, 0.2) for p in ports)
    assert not s.dir.exists()
