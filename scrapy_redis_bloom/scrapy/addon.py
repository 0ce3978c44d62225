"""The Scrapy add-on: ``ADDONS = {"scrapy_redis_bloom.Addon": 100}`` turns the filter on.

It checks every filter setting, so a bad value stops the crawl before it starts.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy_redis_bloom.core.settings import BloomConfig, boolean_setting

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

DUPEFILTER = "scrapy_redis_bloom.dupefilter.RFPDupeFilter"
SCHEDULER = "scrapy_redis_bloom.scheduler.Scheduler"
#: scrapy-redis's own, whose flush empties a queue the filter keeps: replaced by its subclass.
REDIS_SCHEDULER = "scrapy_redis.scheduler.Scheduler"
BATCHING = "scrapy_redis_bloom.batching.BatchingMiddleware"
PRIORITY = "addon"  #: The settings' priority the add-on writes at (``SETTINGS_PRIORITIES``).


class Addon:
    """Activate the Bloom dupefilter (and optionally scrapy-redis's Scheduler, batching)."""

    def update_settings(self, settings: BaseSettings) -> None:
        """Set the components, then validate every filter setting (ValueError if bad)."""
        from scrapy_redis_bloom.scrapy.connection import filter_clients, refuse_decoded_queue

        _claim(settings, "DUPEFILTER_CLASS", DUPEFILTER, "the Bloom dupefilter")
        _keep_the_queue(settings)
        if boolean_setting(settings, "BLOOMFILTER_ADDON_SCHEDULER"):
            _claim(settings, "SCHEDULER", SCHEDULER, "scrapy-redis's Scheduler", REDIS_SCHEDULER)
        if boolean_setting(settings, "BLOOMFILTER_ADDON_BATCHING"):
            # An order the project gave the middleware itself (priority "project") wins.
            settings["SPIDER_MIDDLEWARES"].set(BATCHING, 0, PRIORITY)
        # Make the clients as a crawl will (no connection; a cluster client's would connect).
        config = BloomConfig.from_settings(settings)
        refuse_decoded_queue(settings)
        if not (config.connection.cluster or _cluster_class(settings)):
            for client in filter_clients(config.connection, settings):
                client.close()
            logger.debug("scrapy_redis_bloom.Addon: %s", config.describe())

    def __repr__(self) -> str:
        return f"<{type(self).__module__}.{type(self).__name__}>"


def _claim(
    settings: BaseSettings, name: str, path: str, what: str, kind: str | None = None
) -> None:
    """Set ``name`` to ``path``, unless the project set another above the add-on.

    Another is refused, unless a subclass of ``path`` (or of ``kind``, if given).
    """
    from scrapy.settings import SETTINGS_PRIORITIES
    from scrapy.utils.misc import load_object

    from scrapy_redis_bloom.scrapy.connection import loaded

    current = settings.get(name)
    if (settings.getpriority(name) or 0) > SETTINGS_PRIORITIES[PRIORITY]:
        given = loaded(current)  # None: not even a class, certainly not ours
        if not (isinstance(given, type) and issubclass(given, load_object(kind or path))):
            raise ValueError(
                f"The {name} setting ({current!r}) contradicts the scrapy_redis_bloom.Addon"
                f" of the ADDONS setting, which sets it to {path!r}: the project's value"
                f" outranks the add-on's, so {what} would not run. Remove that {name} line"
                " (or remove the add-on)."
            )
        return
    settings.set(name, path, PRIORITY)


def _keep_the_queue(settings: BaseSettings) -> None:
    """Put the subclass in place of scrapy-redis's Scheduler named by the project (said).

    scrapy-redis's flush would empty the shared queue while the filter is kept for the
    workers still running (:meth:`.RFPDupeFilter.clear`): their queued requests, seen in the
    filter, would never be fetched. The subclass keeps both; it differs in nothing else.
    """
    from scrapy.utils.misc import load_object

    from scrapy_redis_bloom.scrapy.connection import loaded

    current = settings.get("SCHEDULER")
    if loaded(current) is not load_object(REDIS_SCHEDULER):
        return
    settings.set("SCHEDULER", SCHEDULER, settings.getpriority("SCHEDULER") or PRIORITY)
    logger.info(
        "scrapy_redis_bloom.Addon: SCHEDULER = %r, scrapy-redis's Scheduler but for its"
        " flush, which keeps the queue while other workers keep the Bloom filter (in place"
        " of %r).",
        SCHEDULER,
        current,
    )


def _cluster_class(settings: BaseSettings) -> bool:
    """Tell whether REDIS_PARAMS gives scrapy-redis a client class other than a redis.Redis."""
    import redis
    from scrapy.utils.misc import load_object

    params = settings.get("REDIS_PARAMS")
    redis_cls = params.get("redis_cls") if isinstance(params, dict) else None
    if redis_cls is None:
        return False
    loaded = load_object(redis_cls) if isinstance(redis_cls, str) else redis_cls
    return not (isinstance(loaded, type) and issubclass(loaded, redis.Redis))
