"""The filter's Redis clients from its validated connection configuration, with short timeouts."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
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
    """Return the clients of a configuration with URLs or sentinels (``setting``: its name)."""
    params = {**DEFAULT_PARAMS, **dict(config.params)}
    if config.sentinels:
        client = SentinelRedis(
            sentinels=list(config.sentinels), service_name=config.service, setting=setting, **params
        )
        return [_checked(client)]
    redis_cls = RedisCluster if config.cluster else redis.Redis  # (a cluster: one URL)
    source = f"the filter's Redis URL (its query too) and the {setting} setting"
    return [build_client(redis_cls, url, params, source) for url in config.urls]


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
