"""Scrapy glue: the dupefilter that scrapy-redis's and Scrapy's schedulers call.

Settings become a :class:`~.config.BloomConfig` once, at startup; each
``request_seen`` is then one fingerprint plus one atomic script call in Redis.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from scrapy import signals
from scrapy_redis.connection import get_redis_from_settings
from scrapy_redis.dupefilter import RFPDupeFilter as _RedisRFPDupeFilter

from .config import BloomConfig, SettingsLike
from .engine import RedisBloomFilter, server_address
from .errors import BloomFilterError

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)

_F = TypeVar("_F", bound="RFPDupeFilter")


class RFPDupeFilter(_RedisRFPDupeFilter):  # type: ignore[misc]  # scrapy-redis is untyped
    """Request duplicates filter backed by a sharded Bloom filter in Redis.

    A drop-in replacement for ``scrapy_redis.dupefilter.RFPDupeFilter``: use it as
    ``DUPEFILTER_CLASS`` under scrapy-redis's Scheduler (``from_spider``) or Scrapy's
    own scheduler (``from_crawler``). It never deletes the filter on close; under
    scrapy-redis's Scheduler, ``SCHEDULER_PERSIST = False`` and
    ``SCHEDULER_FLUSH_ON_START`` clear it through :meth:`clear`.
    """

    logger = logger

    def __init__(
        self,
        server: Any,
        key: str,
        debug: bool = False,
        *,
        config: BloomConfig | None = None,
        stats: StatsCollector | None = None,
        fingerprint: Callable[[Request], str] | None = None,
    ) -> None:
        super().__init__(server, key, debug)
        self.config = config if config is not None else BloomConfig.from_settings({})
        self.stats = stats
        self.bloom = RedisBloomFilter(server, key, self.config.spec, self.config.capacity)
        self._fingerprint = fingerprint if fingerprint is not None else self.request_fingerprint
        self._added = 0
        self._final_state_recorded = False
        where = server_address(server)
        try:
            self.bloom.open()
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise BloomFilterError(
                f"Cannot reach Redis at {where} to open the Bloom filter {key!r}: {exc}"
            ) from exc
        logger.info("Bloom filter %r on %s: %s", key, where, self.config.describe())

    @classmethod
    def _build(
        cls: type[_F],
        settings: SettingsLike,
        spider_name: str | None,
        crawler: Crawler | None,
    ) -> _F:
        config = BloomConfig.from_settings(settings)
        key = config.key_for(spider_name)
        fingerprint: Callable[[Request], str] | None = None
        if config.fingerprinter == "crawler":
            if crawler is None:
                raise ValueError(
                    "BLOOMFILTER_FINGERPRINTER = 'crawler' needs the crawler's request"
                    " fingerprinter: build the dupefilter with from_crawler() or from_spider()."
                )
            fingerprinter = crawler.request_fingerprinter

            def fingerprint(request: Request) -> str:
                return fingerprinter.fingerprint(request).hex()

        debug = _truthy(settings.get("DUPEFILTER_DEBUG", False))
        server = get_redis_from_settings(settings)
        try:
            instance = cls(
                server,
                key,
                debug=debug,
                config=config,
                stats=crawler.stats if crawler is not None else None,
                fingerprint=fingerprint,
            )
        except BaseException:
            server.close()  # a refused start leaves no connection behind
            raise
        if crawler is not None:
            # scrapy-redis's Scheduler never calls close(): report on spider_closed too.
            crawler.signals.connect(instance._on_spider_closed, signal=signals.spider_closed)
        return instance

    @classmethod
    def from_settings(cls: type[_F], settings: SettingsLike) -> _F:
        """Build without a crawler: BLOOMFILTER_KEY must then not use %(spider)s."""
        return cls._build(settings, None, None)

    @classmethod
    def from_crawler(cls: type[_F], crawler: Crawler) -> _F:
        """Build for Scrapy's own scheduler (``DUPEFILTER_CLASS``)."""
        return cls._build(crawler.settings, crawler.spidercls.name, crawler)

    @classmethod
    def from_spider(cls: type[_F], spider: Spider) -> _F:
        """Build for scrapy-redis's Scheduler, which calls this when it opens."""
        return cls._build(spider.settings, spider.name, spider.crawler)

    def request_seen(self, request: Request) -> bool:
        """Add the request's fingerprint; return True if it was seen before.

        One atomic round trip to Redis: of several workers offering the same request
        at once, exactly one is told it is new.
        """
        seen = self.bloom.check_and_add(self._fingerprint(request))
        if not seen:
            self._added += 1
        return seen

    def log(self, request: Request, spider: Spider) -> None:
        """Log a filtered request as Scrapy does, and count it in the stats."""
        super().log(request, spider)
        if self.stats is not None:
            self.stats.inc_value("bloomfilter/filtered")
            self.stats.inc_value("dupefilter/filtered")

    def clear(self) -> None:
        """Forget every request: delete the filter's record and bits from Redis.

        The filter's state is first written to the stats, so a crawl that clears its
        filter on close (``SCHEDULER_PERSIST = False``) still reports it.
        """
        self._record_state()
        self.bloom.clear()

    def close(self, reason: str = "") -> None:
        """Report the filter's state. Unlike scrapy-redis, keep the filter in Redis."""
        self._record_final_state()

    def _on_spider_closed(self, spider: Spider, reason: str) -> None:
        self._record_final_state()

    def _record_final_state(self) -> None:
        if not self._final_state_recorded:
            self._final_state_recorded = True
            self._record_state()

    def _record_state(self) -> None:
        """Write the filter's configuration and BITCOUNT-derived state to the stats."""
        if self.stats is None or not self.bloom.exists():
            return
        state = self.bloom.state()
        spec = self.config.spec
        values: dict[str, Any] = {
            "bloomfilter/added": self._added,
            "bloomfilter/capacity": self.config.capacity,
            "bloomfilter/bits": spec.bits,
            "bloomfilter/hash_functions": spec.hash_count,
            "bloomfilter/shards": spec.shards,
            "bloomfilter/bits_set": state.bits_set,
            "bloomfilter/fill_ratio": round(state.fill_ratio, 6),
            "bloomfilter/estimated_items": state.estimated_items,
            "bloomfilter/estimated_fpr": float(f"{state.estimated_fpr:.6g}"),
            "bloomfilter/memory_bytes": state.memory_bytes,
        }
        for name, value in values.items():
            self.stats.set_value(name, value)
        logger.info(
            "Bloom filter %r: about %s items, %.2f%% of bits set, false-positive rate now"
            " %.3g, %s bytes in Redis",
            self.key,
            f"{state.estimated_items:,}",
            100 * state.fill_ratio,
            state.estimated_fpr,
            f"{state.memory_bytes:,}",
        )


def _truthy(value: Any) -> bool:
    """Read a boolean setting the way Scrapy's ``getbool`` does."""
    if isinstance(value, str):
        if value.lower() in ("true", "1"):
            return True
        if value.lower() in ("false", "0", ""):
            return False
        raise ValueError(
            f"The value of the DUPEFILTER_DEBUG setting ({value!r}) is invalid. It must be a"
            " boolean: True, False, 1 or 0."
        )
    return bool(value)
