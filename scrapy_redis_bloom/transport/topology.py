"""Where each of the filter's keys lives: one server, several servers, or a Redis Cluster."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import RedisClusterException, RedisError
from redis.sentinel import SentinelConnectionPool

from scrapy_redis_bloom.core.errors import BloomFilterError
from scrapy_redis_bloom.core.events import RateLimitedLog
from scrapy_redis_bloom.transport.node import Node, TripCounter, connection_factory

logger = logging.getLogger(__name__)

#: How a server's address ends when its Sentinels name it (it follows their primary).
SENTINEL = " (Sentinel)"


def server_address(client: Any) -> str:
    """Describe where a client connects, as ``host:port`` or a socket path: no password."""
    if isinstance(client, RedisCluster):
        nodes = getattr(client.nodes_manager, "startup_nodes", None) or {}
        return ", ".join(sorted(nodes)) or "a Redis Cluster"
    pool = getattr(client, "connection_pool", None)
    if isinstance(pool, SentinelConnectionPool):  # the primary changes: name the service
        return f"{pool.service_name}{SENTINEL}"
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    if "path" in kwargs:
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


class Topology(Protocol):
    """Routes commands to nodes. Not thread-safe: use :meth:`copy` in another thread."""

    servers: int = 1  #: Number of standalone servers the shards are spread over (1 for a cluster).
    #: Whether one transaction may name several shards' keys (not in a cluster: CROSSSLOT).
    joint_transactions: bool = True
    trips: TripCounter  #: Round trips made by every node of this topology and of its copies.

    def route(self, key: str | None, shard: int | None, server: int | None) -> Node:
        """Return the node for a command on ``key`` (of shard ``shard``), or on ``server``."""

    def primaries(self) -> list[Node]:
        """Return a node for every server that holds part of the filter."""

    def node_at(self, address: str) -> Node:
        """Return the node at ``host:port`` (a cluster's ``ASK`` redirection)."""

    def copy(self) -> Topology:
        """Return the same topology with nodes of its own (for another thread)."""

    def moved(self, address: str, reply: BaseException) -> None:
        """Handle a ``MOVED`` reply from the node at ``address``: follow it, or refuse."""

    def refresh(self) -> None:
        """Re-read where keys live, after a redirection or a failed node. Never raises."""
        return None  # (a fixed list of servers: nothing to re-read)

    def serves(self, node: Node) -> bool:
        """Tell whether ``node`` still serves part of the filter (a fixed list always does)."""
        return True

    def describe(self) -> str:
        """Say where the filter lives, as a noun phrase: addresses, never passwords."""

    def close(self) -> None:
        """Close every connection the nodes hold."""


class ServerList(Topology):
    """One or several standalone servers: shard ``i`` on server ``i mod n``."""

    def __init__(self, clients: Sequence[Any], trips: TripCounter | None = None) -> None:
        if not clients:
            raise ValueError("a filter needs at least one Redis client")
        self.clients = tuple(clients)
        self.servers = len(self.clients)
        self.trips = trips if trips is not None else TripCounter()
        self.nodes = [
            Node(server_address(c), connection_factory(c.connection_pool), self.trips)
            for c in self.clients
        ]

    def route(self, key: str | None, shard: int | None, server: int | None) -> Node:
        """Return server ``server``, else the shard's server, else server 0."""
        if server is not None:
            return self.nodes[server]
        if shard is not None:
            return self.nodes[shard % self.servers]
        return self.nodes[0]

    def primaries(self) -> list[Node]:
        """Return every server's node, in list order."""
        return list(self.nodes)

    def node_at(self, address: str) -> Node:
        """Return the listed server at ``address``."""
        for node in self.nodes:
            if node.address == address:
                return node
        raise ValueError(f"{address} is not one of the filter's servers")

    def copy(self) -> ServerList:
        """Return the same servers with connections of their own (and the same trip count)."""
        return ServerList(self.clients, self.trips)

    def moved(self, address: str, reply: BaseException) -> None:
        """Refuse: a server that answers ``MOVED`` is a cluster node taken for a server."""
        raise BloomFilterError(
            f"Redis at {address} is a node of a Redis Cluster (it answered {reply}), but the"
            " filter was given it as a standalone server. Set BLOOMFILTER_REDIS_CLUSTER = True"
            " with BLOOMFILTER_REDIS_URL (or give scrapy-redis a RedisCluster client through"
            " REDIS_PARAMS), or use --cluster with the command-line tool."
        )

    def describe(self) -> str:
        """Return ``Redis at <addresses>``."""
        return "Redis at " + ", ".join(node.address for node in self.nodes)

    def close(self) -> None:
        """Close every server's connection."""
        for node in self.nodes:
            node.close()


class Cluster(Topology):
    """A Redis Cluster, its slot map kept by a redis-py ``RedisCluster`` client."""

    joint_transactions = False

    def __init__(self, client: RedisCluster, trips: TripCounter | None = None) -> None:
        self.client = client
        self.trips = trips if trips is not None else TripCounter()
        self._nodes: dict[str, Node] = {}
        #: Slot moves, said at most once a minute (a resharding moves many in a row).
        self._moves = RateLimitedLog(logger)

    def _node(self, cluster_node: Any) -> Node:
        name = f"{cluster_node.host}:{cluster_node.port}"
        node = self._nodes.get(name)
        if node is None:
            pool = self.client.get_redis_connection(cluster_node).connection_pool
            node = self._nodes[name] = Node(name, connection_factory(pool), self.trips)
        return node

    def route(self, key: str | None, shard: int | None, server: int | None) -> Node:
        """Return the master of the key's hash slot (``server`` indexes the masters)."""
        if key is None:
            primaries = self.primaries()
            return primaries[(server or 0) % len(primaries)]
        return self._node(self.client.nodes_manager.get_node_from_slot(key_slot(key.encode())))

    def primaries(self) -> list[Node]:
        """Return every master the slot map knows, by address."""
        masters = self.client.get_primaries()  # type: ignore[no-untyped-call]  # untyped
        return [self._node(node) for node in sorted(masters, key=lambda n: n.name)]

    def node_at(self, address: str) -> Node:
        """Return the node at ``address``, known to the slot map or not."""
        if address in self._nodes:
            return self._nodes[address]
        host, _, port = address.rpartition(":")
        cluster_node = self.client.get_node(host=host, port=int(port))  # type: ignore[no-untyped-call]
        if cluster_node is None:
            self.refresh()
            cluster_node = self.client.get_node(host=host, port=int(port))  # type: ignore[no-untyped-call]
        if cluster_node is None:
            raise ValueError(f"{address} is not a node of the cluster")
        return self._node(cluster_node)

    def copy(self) -> Cluster:
        """Return the same cluster with connections of its own (slot map and trip count shared)."""
        return Cluster(self.client, self.trips)

    def moved(self, address: str, reply: BaseException) -> None:
        """Follow a ``MOVED``: the slot map is stale, re-read it; say it (a failover, often).

        A replica promoted may lack the last writes its master acknowledged: counted as a
        failover (which also empties the near-cache).
        """
        self.refresh()
        self._moves.log(
            logging.WARNING,
            "moved",
            "Redis Cluster node %s no longer serves a slot of the Bloom filter (%s): a failover,"
            " or the slot moved. The slot map was read again, and the command follows it.",
            address,
            reply,
        )
        if self.trips.on_moved is not None:
            self.trips.on_moved()

    def refresh(self) -> None:
        """Re-read the slot map from any reachable node; keep the old one if none answers."""
        try:
            self.client.nodes_manager.initialize()
        except (RedisError, RedisClusterException) as exc:
            logger.debug("Could not refresh the cluster's slot map: %s", exc)

    def serves(self, node: Node) -> bool:
        """Re-read the slot map; tell whether ``node`` is still one of its masters."""
        self.refresh()
        masters = self.client.get_primaries()  # type: ignore[no-untyped-call]  # untyped
        return any(f"{master.host}:{master.port}" == node.address for master in masters)

    def describe(self) -> str:
        """Return the cluster's startup nodes."""
        return f"the Redis Cluster at {server_address(self.client)}"

    def close(self) -> None:
        """Close the connections to every node."""
        for node in self._nodes.values():
            node.close()


def make_topology(client: Any) -> Topology:
    """Return the topology of a client: a cluster, one server, or a sequence of servers."""
    clients = tuple(client) if isinstance(client, (list, tuple)) else (client,)
    if len(clients) == 1 and isinstance(clients[0], RedisCluster):
        return Cluster(clients[0])
    if any(isinstance(c, RedisCluster) for c in clients):
        raise ValueError("a filter lives on one Redis Cluster or on standalone servers, not both")
    return ServerList(clients)
