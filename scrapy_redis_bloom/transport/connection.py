"""Redis clients for the filter, from its validated connection configuration.

The filter connects through scrapy-redis's connection settings (``REDIS_URL``,
``REDIS_PARAMS``, ...) unless ``BLOOMFILTER_REDIS_URL`` (one server, or with
``BLOOMFILTER_REDIS_CLUSTER`` a Redis Cluster) or ``BLOOMFILTER_REDIS_URLS`` (several
standalone servers) or ``BLOOMFILTER_REDIS_SENTINELS`` (a primary found through Sentinel,
see :mod:`.sentinel`) give it its own. Either way it gets clients of its own, whose
settings its connections copy (see :mod:`.engine.node`), with short timeouts by
default so that a dead server is noticed in seconds: the filter retries by its own
policy (``BLOOMFILTER_RETRY_TIMEOUT``), not by one long socket timeout.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.cluster import RedisCluster
from scrapy.utils.misc import load_object
from scrapy_redis import defaults as scrapy_redis_defaults
from scrapy_redis.connection import SETTINGS_PARAMS_MAP

from scrapy_redis_bloom.core.redact import masked, scrub, url_secrets
from scrapy_redis_bloom.core.settings import (
    ConnectionConfig,
    SettingsLike,
    check_url,
    client_params,
)
from scrapy_redis_bloom.transport.sentinel import SentinelRedis

#: Defaults for the filter's clients: a stalled server fails one attempt in seconds,
#: and the retry policy decides what happens next.
DEFAULT_PARAMS: dict[str, Any] = {"socket_timeout": 5.0, "socket_connect_timeout": 2.0}


def scrapy_redis_client(settings: SettingsLike) -> Any:
    """Build a client as scrapy-redis's ``get_redis_from_settings`` does, with our timeouts.

    Its defaults (30 s timeouts) give way to :data:`DEFAULT_PARAMS`; whatever the user
    set in ``REDIS_PARAMS`` or the ``REDIS_*`` settings still wins. Its default
    ``retry_on_timeout`` is left out: redis-py 6+ retries timeouts anyway and deprecates
    the argument (the filter's connections retry nothing themselves, see :mod:`.engine.node`).
    """
    user = client_params("REDIS_PARAMS", settings.get("REDIS_PARAMS"))
    defaults = {
        name: value
        for name, value in scrapy_redis_defaults.REDIS_PARAMS.items()
        if name != "retry_on_timeout"
    }
    params: dict[str, Any] = {**defaults, **DEFAULT_PARAMS, **user}
    for setting, name in SETTINGS_PARAMS_MAP.items():
        value = settings.get(setting)
        if value:
            params[name] = value
    redis_cls = params.pop("redis_cls", scrapy_redis_defaults.REDIS_CLS)
    if isinstance(redis_cls, str):
        redis_cls = load_object(redis_cls)
    url = params.pop("url", None)
    if url is not None:
        check_url("REDIS_URL" if settings.get("REDIS_URL") else "REDIS_PARAMS['url']", url)
    if isinstance(redis_cls, type) and issubclass(redis_cls, SentinelRedis):
        # Its errors name REDIS_PARAMS and the argument at fault themselves.
        return _checked(redis_cls.from_url(url, **params) if url else redis_cls(**params))
    with _named("REDIS_URL and REDIS_PARAMS", params):
        return _checked(redis_cls.from_url(url, **params) if url else redis_cls(**params))


def filter_clients(config: ConnectionConfig, settings: SettingsLike) -> list[Any]:
    """Return the filter's clients: one (server, Sentinel primary, cluster) or one per server."""
    if not config.urls and not config.sentinels:
        return [scrapy_redis_client(settings)]
    params = {**DEFAULT_PARAMS, **dict(config.params)}
    if config.sentinels:
        client = SentinelRedis(
            sentinels=list(config.sentinels),
            service_name=config.service,
            setting="BLOOMFILTER_REDIS_PARAMS",
            **params,
        )
        return [_checked(client)]
    with _named("BLOOMFILTER_REDIS_PARAMS", params):
        if config.cluster:
            return [RedisCluster.from_url(config.urls[0], **params)]
        return [_checked(redis.Redis.from_url(url, **params)) for url in config.urls]


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
def _named(settings: str, params: dict[str, Any]) -> Iterator[None]:
    """Turn a client's refusal of its arguments into an error naming the settings.

    The message shows the arguments with secrets masked, never the client's own
    text alone (which names no setting).
    """
    try:
        yield
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"The Redis client refuses the arguments of the {settings} setting(s)"
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
