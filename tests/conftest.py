"""Shared fixtures: a real redis-server per test session, emptied before each test."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

sys.path.insert(0, str(Path(__file__).parent))

from redis.cluster import RedisCluster
from redis_cluster import RedisClusterNodes
from redis_server import RedisServer


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
