"""Redis clients for the filter, from its validated connection configuration.

The filter uses scrapy-redis's connection unless ``BLOOMFILTER_REDIS_URL`` (one
server, or with ``BLOOMFILTER_REDIS_CLUSTER`` a Redis Cluster) or
``BLOOMFILTER_REDIS_URLS`` (several standalone servers) give it its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.cluster import RedisCluster

from .config import ConnectionConfig

#: Client defaults, as scrapy-redis's: a stalled server fails a call, not the crawl.
DEFAULT_PARAMS: dict[str, Any] = {"socket_timeout": 30, "socket_connect_timeout": 30}


def filter_clients(config: ConnectionConfig, default: Callable[[], Any]) -> list[Any]:
    """Return the filter's clients: one (a server or a cluster) or one per server.

    ``default`` builds scrapy-redis's client, used when no URL is configured.
    """
    if not config.urls:
        return [default()]
    params = {**DEFAULT_PARAMS, **dict(config.params)}
    if config.cluster:
        return [RedisCluster.from_url(config.urls[0], **params)]
    return [redis.Redis.from_url(url, **params) for url in config.urls]


def url_address(url: str) -> str:
    """Describe a Redis URL as ``host:port`` (or its socket path): never the password."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix:{parts.path}"
    try:
        port = parts.port or 6379
    except ValueError:
        port = 6379
    return f"{parts.hostname or 'localhost'}:{port}"


def cluster_state(client: Any) -> str | None:
    """Return ``cluster_state`` as a reachable node of a cluster client reports it.

    None for a standalone client, or when no node answers.
    """
    if not isinstance(client, RedisCluster):
        return None
    for node in client.get_nodes():  # type: ignore[no-untyped-call]  # untyped in redis-py
        try:
            info = client.cluster_info(target_nodes=node)
        except redis.RedisError:
            continue
        state = info.get("cluster_state") if isinstance(info, dict) else None
        if state is not None:
            return state.decode() if isinstance(state, bytes) else str(state)
    return None
