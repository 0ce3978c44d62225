"""Shared fixtures: a real redis-server per test session, emptied before each test."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from scrapy.utils.reactor import install_reactor

sys.path.insert(0, str(Path(__file__).parent))

# Scrapy's default reactor, installed before any test builds a crawler: Scrapy 2.13-2.14's
# get_crawler() asks which reactor is installed and fails when none is.
install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")

from redis.cluster import RedisCluster  # noqa: E402 - after the reactor, on purpose
from redis_cluster import RedisClusterNodes  # noqa: E402
from redis_server import RedisServer  # noqa: E402


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Close the reactor's asyncio loop, which no test runs: not left to the collector."""
    from twisted.internet import reactor

    loop = getattr(reactor, "_asyncioEventloop", None)
    if loop is not None and not loop.is_running() and not loop.is_closed():
        loop.close()


#: Seconds around each full hour (wall clock) in which no test starts.
HOUR_EDGE = (10.0, 2.0)


@pytest.fixture(autouse=True)
def _away_from_an_hours_edge() -> None:
    """Start no test within :data:`HOUR_EDGE` of a full hour: wait it out first.

    Many tests keep re-crawl windows of an hour (``BLOOMFILTER_TTL = 3600``) and assert
    what a check does inside a window (no script, a transaction, two round trips): within
    a second or two of a window's edge the filter leaves its checks to the script, as it
    should, and those assertions would fail on the time of day alone.
    """
    before, after = HOUR_EDGE
    into = time.time() % 3600
    if into > 3600 - before or into < after:
        time.sleep((after - into) % 3600)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def redis_url(redis_server: RedisServer, redis_client: redis.Redis) -> str:
    """Return the URL of the session's server, emptied for this test."""
    return redis_server.url


@pytest.fixture(scope="session")
def redis_cluster_nodes() -> Iterator[RedisClusterNodes]:
    """Start a real 3-master Redis Cluster for the session, on loopback ports."""
    with RedisClusterNodes() as nodes:
        yield nodes


@pytest.fixture
def redis_cluster(redis_cluster_nodes: RedisClusterNodes) -> Iterator[RedisCluster]:
    """Return a cluster client on the session's cluster, emptied and checked healthy."""
    redis_cluster_nodes.wait_until_consistent(timeout=10)
    redis_cluster_nodes.flushall()
    client = redis_cluster_nodes.client()
    yield client
    client.close()


@pytest.fixture
def redis_cluster_url(redis_cluster_nodes: RedisClusterNodes, redis_cluster: RedisCluster) -> str:
    """Return the URL of a node of the session's cluster, emptied for this test."""
    return redis_cluster_nodes.startup_url


@pytest.fixture(scope="session")
def redis_cluster_replicas() -> Iterator[RedisClusterNodes]:
    """Start a real Redis Cluster of 3 masters with 1 replica each, for the session.

    Nodes 0-2 start as the masters and node 3 + i as the replica of master i. The node
    timeout is 2000 ms, so a killed master fails over within a few seconds (see
    ``kill_node`` and ``wait_for_failover``); a node frozen for longer than that may fail
    over too. A test that kills a node must ``restart_node`` it before it ends; roles may
    stay swapped afterwards, so look them up with ``masters()`` and ``replicas_of()``.
    """
    with RedisClusterNodes(3, replicas=1, node_timeout_ms=2000) as nodes:
        yield nodes


@pytest.fixture
def aof_redis_server() -> Iterator[RedisServer]:
    """Start a fresh redis-server with AOF (``appendfsync always``) for one test.

    Every acknowledged write is on disk, so ``kill()`` then ``restart()`` loses none of
    them: the fixture for crash-recovery tests. The server and its directory are removed
    at the end of the test.
    """
    with RedisServer(appendonly=True) as server:
        yield server


@pytest.fixture(scope="module")
def servers() -> Iterator[list[RedisServer]]:
    """Start three standalone redis-servers for a module: a filter's server list."""
    started = [RedisServer().start() for _ in range(3)]
    yield started
    for server in started:
        server.stop()


@pytest.fixture
def clients(servers: list[RedisServer]) -> Iterator[list[redis.Redis]]:
    """Return a client of each of the three servers, emptied for this test."""
    made = [server.client() for server in servers]
    for client in made:
        client.flushall()
    yield made
    for client in made:
        client.close()


@pytest.fixture(scope="session")
def bloom_redis_server() -> Iterator[RedisServer]:
    """Start a redis-server with RedisBloom loaded (BF.*), or skip saying what is missing."""
    from redis_modules import SKIP_REASON, bloom_server

    found = bloom_server()
    if found is None:
        pytest.skip(SKIP_REASON)
    binary, module = found
    with RedisServer("--loadmodule", module, binary=binary) as server:
        yield server


@pytest.fixture
def bloom_redis_client(bloom_redis_server: RedisServer) -> Iterator[redis.Redis]:
    """Return a client of the BF.*-capable server, emptied for this test."""
    client = bloom_redis_server.client()
    client.flushall()
    yield client
    client.close()
