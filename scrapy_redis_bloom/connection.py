"""Redis clients for the filter, from its validated connection configuration.

The filter connects through scrapy-redis's connection settings (``REDIS_URL``,
``REDIS_PARAMS``, ...) unless ``BLOOMFILTER_REDIS_URL`` (one server, or with
``BLOOMFILTER_REDIS_CLUSTER`` a Redis Cluster) or ``BLOOMFILTER_REDIS_URLS`` (several
standalone servers) give it its own. Either way it gets clients of its own, whose
settings its connections copy (see :mod:`.engine.node`), with short timeouts by
default so that a dead server is noticed in seconds: the filter retries by its own
policy (``BLOOMFILTER_RETRY_TIMEOUT``), not by one long socket timeout.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis
from redis.cluster import RedisCluster
from scrapy.utils.misc import load_object
from scrapy_redis import defaults as scrapy_redis_defaults
from scrapy_redis.connection import SETTINGS_PARAMS_MAP

from .config import ConnectionConfig, SettingsLike

#: Defaults for the filter's clients: a stalled server fails one attempt in seconds,
#: and the retry policy decides what happens next.
DEFAULT_PARAMS: dict[str, Any] = {"socket_timeout": 5.0, "socket_connect_timeout": 2.0}


def scrapy_redis_client(settings: SettingsLike) -> Any:
    """Build a client as scrapy-redis's ``get_redis_from_settings`` does, with our timeouts.

    Its defaults (30 s timeouts) give way to :data:`DEFAULT_PARAMS`; whatever the user
    set in ``REDIS_PARAMS`` or the ``REDIS_*`` settings still wins.
    """
    user = settings.get("REDIS_PARAMS") or {}
    if not isinstance(user, dict):
        raise ValueError(
            f"The value of the REDIS_PARAMS setting ({type(user).__name__}) is invalid. It must"
            " be a dict of keyword arguments for the Redis client."
        )
    params: dict[str, Any] = {**scrapy_redis_defaults.REDIS_PARAMS, **DEFAULT_PARAMS, **user}
    for setting, name in SETTINGS_PARAMS_MAP.items():
        value = settings.get(setting)
        if value:
            params[name] = value
    redis_cls = params.pop("redis_cls", scrapy_redis_defaults.REDIS_CLS)
    if isinstance(redis_cls, str):
        redis_cls = load_object(redis_cls)
    url = params.pop("url", None)
    return redis_cls.from_url(url, **params) if url else redis_cls(**params)


def filter_clients(config: ConnectionConfig, settings: SettingsLike) -> list[Any]:
    """Return the filter's clients: one (a server or a cluster) or one per server."""
    if not config.urls:
        return [scrapy_redis_client(settings)]
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
