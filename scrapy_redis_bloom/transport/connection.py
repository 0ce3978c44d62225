"""Redis clients for the filter, from its validated connection configuration.

The filter's own connection (``BLOOMFILTER_REDIS_URL``: one server, or with
``BLOOMFILTER_REDIS_CLUSTER`` a Redis Cluster; ``BLOOMFILTER_REDIS_URLS``: several
standalone servers; ``BLOOMFILTER_REDIS_SENTINELS``: a primary found through Sentinel,
see :mod:`.sentinel`) is built here; the connection it shares with scrapy-redis
(``REDIS_URL``, ``REDIS_PARAMS``, ...) is read from Scrapy's settings by the Scrapy layer
(:mod:`scrapy_redis_bloom.scrapy.connection`), which builds that client here too
(:func:`build_client`). Nothing here knows Scrapy: errors name the settings (or options)
the caller says the arguments came from. Either way the filter gets clients of its own,
whose settings its connections copy (see :mod:`.node`), with short timeouts by default
so that a dead server is noticed in seconds: the filter retries by its own policy
(``BLOOMFILTER_RETRY_TIMEOUT``), not by one long socket timeout.
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
    """Return the clients of a configuration with servers of its own (URLs or sentinels).

    One client (a server, a Sentinel primary, a cluster) or one per server. ``setting``
    names where ``config.params`` came from, for the errors that refuse them.
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

    ``source`` names the settings the arguments came from (``the REDIS_URL and
    REDIS_PARAMS setting(s)``): an argument the client refuses is a ValueError naming
    them. A :class:`SentinelRedis` names its own settings and arguments at fault.
    """
    if isinstance(redis_cls, type) and issubclass(redis_cls, SentinelRedis):
        return _checked(redis_cls.from_url(url, **params) if url else redis_cls(**params))
    with _named(source, params):
        return _checked(redis_cls.from_url(url, **params) if url else redis_cls(**params))


def _checked(client: Any) -> Any:
    """Return ``client`` once a connection of its settings could be made (not opened).

    redis-py keeps the arguments of a URL client until its first connection: an
    unknown or ill-typed one would only fail at the first request, as a bare TypeError.
    """
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        pool.connection_class(**pool.connection_kwargs)
    return client


@contextmanager
def _named(source: str, params: dict[str, Any]) -> Iterator[None]:
    """Turn a client's refusal of its arguments into an error naming where they came from.

    The message shows the arguments with secrets masked, never the client's own
    text alone (which names no setting).
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
