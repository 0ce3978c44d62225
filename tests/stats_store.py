"""scrapy-redis's stats collector that fails only this package's calls while its Redis is down.

For a crawl whose stats store (scrapy-redis's ``RedisStatsCollector``) restarts: Scrapy's
own components call the stats in the crawl's path (its scheduler after it pops a request,
the depth middleware on every link, the log counter on every record) and lose pages when
the call raises. That is Scrapy's and scrapy-redis's to fix, not this package's. This
collector lets their calls fail quietly, and raises redis-py's error to calls that come
from ``scrapy_redis_bloom``, so that a crawl measures what the package does with a
stats store that fails. A real ``RedisStatsCollector`` on a real Redis in every other
respect. A crawl of ``crawl_runner.py`` uses it as
``STATS_CLASS = "stats_store.ForgivingRedisStatsCollector"``.
"""

from __future__ import annotations

import sys
from typing import Any

import redis
from scrapy_redis.stats import RedisStatsCollector

#: Modules between a caller and the collector: Scrapy's wrappers and the collectors.
_PASSING = ("scrapy.utils.decorators", "scrapy.statscollectors", "scrapy_redis.stats", __name__)


def _from_this_package() -> bool:
    """Tell whether the stats call being made comes from scrapy_redis_bloom."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__", "") in _PASSING:
        frame = frame.f_back  # type: ignore[assignment]
    return frame is not None and frame.f_globals.get("__name__", "").startswith(
        "scrapy_redis_bloom"
    )


class ForgivingRedisStatsCollector(RedisStatsCollector):  # type: ignore[misc]  # untyped
    """A ``RedisStatsCollector`` whose failures reach only this package's calls."""

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(super(), method)(*args, **kwargs)
        except redis.RedisError:
            if _from_this_package():
                raise
            return None

    def get_value(self, key: str, default: Any = None, *args: Any, **kwargs: Any) -> Any:
        value = self._call("get_value", key, default, *args, **kwargs)
        return default if value is None else value

    def set_value(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("set_value", *args, **kwargs)

    def inc_value(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("inc_value", *args, **kwargs)

    def max_value(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("max_value", *args, **kwargs)

    def min_value(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("min_value", *args, **kwargs)
