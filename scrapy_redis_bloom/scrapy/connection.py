"""The filter's Redis clients from a crawl's settings, scrapy-redis's connection included."""

from __future__ import annotations

from typing import Any

from scrapy.utils.misc import load_object
from scrapy_redis import defaults as scrapy_redis_defaults
from scrapy_redis.connection import SETTINGS_PARAMS_MAP
from scrapy_redis.scheduler import Scheduler as RedisScheduler

from scrapy_redis_bloom.core.settings import (
    ConnectionConfig,
    SettingsLike,
    check_url,
    client_params,
)
from scrapy_redis_bloom.transport.connection import DEFAULT_PARAMS, build_client, own_clients


def scrapy_redis_client(settings: SettingsLike) -> Any:
    """Build a client as scrapy-redis's ``get_redis_from_settings`` does, with our timeouts."""
    user = client_params("REDIS_PARAMS", settings.get("REDIS_PARAMS"))
    defaults = dict(scrapy_redis_defaults.REDIS_PARAMS)
    defaults.pop("retry_on_timeout", None)  # deprecated by redis-py 6+
    params: dict[str, Any] = {**defaults, **DEFAULT_PARAMS, **user}
    for setting, name in SETTINGS_PARAMS_MAP.items():
        if value := settings.get(setting):
            params[name] = value
    redis_cls = params.pop("redis_cls", scrapy_redis_defaults.REDIS_CLS)
    if isinstance(redis_cls, str):
        redis_cls = load_object(redis_cls)
    url = params.pop("url", None)
    if url is not None:
        check_url("REDIS_URL" if settings.get("REDIS_URL") else "REDIS_PARAMS['url']", url)
    return build_client(redis_cls, url, params, "the REDIS_URL and REDIS_PARAMS setting(s)")


def refuse_decoded_queue(settings: SettingsLike) -> None:
    """Refuse ``decode_responses`` in REDIS_PARAMS under scrapy-redis's Scheduler (ValueError)."""
    scheduler = loaded(settings.get("SCHEDULER"))
    if not (isinstance(scheduler, type) and issubclass(scheduler, RedisScheduler)):
        return
    if client_params("REDIS_PARAMS", settings.get("REDIS_PARAMS")).get("decode_responses"):
        raise ValueError(
            "REDIS_PARAMS sets decode_responses = True, with which scrapy-redis's Scheduler"
            " cannot read back the requests it queues (pickled bytes: a UnicodeDecodeError at"
            " its first pop, and the crawl fetches nothing). Remove it; the filter does not"
            " need it (BLOOMFILTER_REDIS_PARAMS can set it for the filter's own connection)."
        )


def filter_clients(
    config: ConnectionConfig, settings: SettingsLike, retry_timeout: float = 0.0
) -> list[Any]:
    """Return the filter's clients (its own connection's, else scrapy-redis's), one per server.

    ``retry_timeout``: how long a cluster none of whose listed nodes answers is tried.
    """
    if not config.urls and not config.sentinels:
        return [scrapy_redis_client(settings)]
    return own_clients(config, "BLOOMFILTER_REDIS_PARAMS", retry_timeout)


def loaded(value: Any) -> Any:
    """Return the object a component setting names (None if it names none: Scrapy says so)."""
    try:
        return load_object(value) if isinstance(value, str) else value
    except (ImportError, NameError, AttributeError, ValueError):
        return None
