"""The filter's Redis clients from its validated connection configuration, with short timeouts."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import AuthenticationError, RedisClusterException
from redis.exceptions import ConnectionError as RedisConnectionError

from scrapy_redis_bloom.core.redact import masked, scrub, url_secrets
from scrapy_redis_bloom.core.settings import ConnectionConfig
from scrapy_redis_bloom.transport.sentinel import SentinelRedis

#: Defaults for the filter's clients: a stalled server fails one attempt in seconds,
#: and the retry policy decides what happens next.
DEFAULT_PARAMS: dict[str, Any] = {"socket_timeout": 5.0, "socket_connect_timeout": 2.0}
#: Seconds between two tries to reach a cluster whose listed nodes do not answer.
CLUSTER_RETRY = 0.5


def own_clients(config: ConnectionConfig, setting: str, retry_timeout: float = 0.0) -> list[Any]:
    """Return the clients of a configuration with URLs or sentinels (``setting``: its name).

    A cluster client reads the slot map at once: tried again for ``retry_timeout`` seconds
    when no node listed answers (a cluster briefly down at a worker's start), as a command is.
    """
    params = {**DEFAULT_PARAMS, **dict(config.params)}
    if config.sentinels:
        client = SentinelRedis(
            sentinels=list(config.sentinels), service_name=config.service, setting=setting, **params
        )
        return [_checked(client)]
    source = f"the filter's Redis URL (its query too) and the {setting} setting"
    if config.cluster:  # one client, started from any of the nodes listed that answers
        others = [ClusterNode(*_host_port(url)) for url in config.urls[1:]]  # type: ignore[no-untyped-call]
        cluster = {**params, "startup_nodes": others} if others else params
        deadline = time.monotonic() + retry_timeout
        while True:
            try:
                return [build_client(RedisCluster, config.urls[0], cluster, source)]
            except (RedisClusterException, RedisConnectionError) as exc:
                if isinstance(exc, AuthenticationError) or (
                    time.monotonic() + CLUSTER_RETRY > deadline
                ):  # refused credentials: no retry fixes them
                    raise
                time.sleep(CLUSTER_RETRY)
    return [build_client(redis.Redis, url, params, source) for url in config.urls]


def _host_port(url: str) -> tuple[str, int]:
    """Return a Redis URL's host and port (6379 by default)."""
    parsed = urlsplit(url)
    return parsed.hostname or "localhost", parsed.port or 6379


def build_client(redis_cls: Any, url: str | None, params: dict[str, Any], source: str) -> Any:
    """Make a client of ``redis_cls`` from ``url`` (if any) and ``params``; not connected."""
    sentinel = isinstance(redis_cls, type) and issubclass(redis_cls, SentinelRedis)
    with nullcontext() if sentinel else _named(source, params):  # (names its own arguments)
        return _checked(redis_cls.from_url(url, **params) if url else redis_cls(**params))


def _checked(client: Any) -> Any:
    """Return ``client`` once a connection of its settings could be made (bad ones fail now)."""
    if (pool := getattr(client, "connection_pool", None)) is not None:
        pool.connection_class(**pool.connection_kwargs)
    return client


@contextmanager
def _named(source: str, params: dict[str, Any]) -> Iterator[None]:
    """Turn a client's refusal of its arguments into an error naming where they came from."""
    try:
        yield
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"The Redis client refuses the arguments of {source}"
            f" ({masked(params)}): {scrub(str(exc), url_secrets(str(params.get('url', ''))))}."
        ) from None


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
