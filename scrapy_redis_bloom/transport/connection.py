"""Redis clients for the filter, from its validated connection configuration.

Its own (URLs, a cluster, sentinels) and the one shared with scrapy-redis (:func:`build_client`),
with short timeouts (:data:`DEFAULT_PARAMS`); errors name the settings the arguments came from.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.cluster import RedisCluster

from scrapy_redis_bloom.core.redact import masked, scrub, url_secrets
from scrapy_redis_bloom.core.settings import ConnectionConfig
from scrapy_redis_bloom.transport.sentinel import SentinelRedis

#: Defaults for the filter's clients: a stalled server fails one attempt in seconds,
#: and the retry policy decides what happens next.
DEFAULT_PARAMS: dict[str, Any] = {"socket_timeout": 5.0, "socket_connect_timeout": 2.0}


def own_clients(config: ConnectionConfig, setting: str) -> list[Any]:
    """Return the clients of a configuration with URLs or sentinels: one, or one per server.

    ``setting`` names where ``config.params`` came from.
    """
    if not config.urls and not config.sentinels:
        raise ValueError("own_clients() needs a configuration with URLs or sentinels")
    params = {**DEFAULT_PARAMS, **dict(config.params)}
    if config.sentinels:
        client = SentinelRedis(
            sentinels=list(config.sentinels),
            service_name=config.service,
            setting=setting,
            **params,
        )
        return [_checked(client)]
    with _named(f"the {setting} setting(s)", params):
        if config.cluster:
            return [RedisCluster.from_url(config.urls[0], **params)]
        return [_checked(redis.Redis.from_url(url, **params)) for url in config.urls]


def build_client(redis_cls: Any, url: str | None, params: dict[str, Any], source: str) -> Any:
    """Make a client of ``redis_cls`` from ``url`` (if any) and ``params``; not connected.

    An argument the client refuses is a ValueError naming ``source``, the settings given.
    """
    if isinstance(redis_cls, type) and issubclass(redis_cls, SentinelRedis):
        return _checked(redis_cls.from_url(url, **params) if url else redis_cls(**params))
    with _named(source, params):
        return _checked(redis_cls.from_url(url, **params) if url else redis_cls(**params))


def _checked(client: Any) -> Any:
    """Return ``client`` once a connection of its settings could be made (not opened).

    redis-py keeps a URL client's arguments until its first connection: a bad one would
    only fail at the first request, as a bare TypeError.
    """
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        pool.connection_class(**pool.connection_kwargs)
    return client


@contextmanager
def _named(source: str, params: dict[str, Any]) -> Iterator[None]:
    """Turn a client's refusal of its arguments into an error naming where they came from.

    (With the arguments, secrets masked: the client's own text names no setting.)
    """
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
