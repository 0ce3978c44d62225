"""Scrapy glue: the dupefilter that scrapy-redis's and Scrapy's schedulers call.

Settings become a :class:`~.config.BloomConfig` once, at startup; each
``request_seen`` is then one fingerprint plus one atomic script call in Redis.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import ClusterDownError, ClusterError, RedisClusterException, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from scrapy import signals
from scrapy_redis.connection import get_redis_from_settings
from scrapy_redis.dupefilter import RFPDupeFilter as _RedisRFPDupeFilter

from .config import BloomConfig, SettingsLike, boolean_setting
from .connection import cluster_state, filter_clients, url_address
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
        servers: Sequence[Any] | None = None,
    ) -> None:
        super().__init__(server, key, debug)
        self.config = config if config is not None else BloomConfig.from_settings({})
        self.stats = stats
        clients = list(servers) if servers else [server]
        self.bloom = RedisBloomFilter(
            clients, key, self.config.spec, self.config.capacity, self.config.cache_size
        )
        self._fingerprint = fingerprint if fingerprint is not None else self.request_fingerprint
        # scrapy-redis's fingerprint is a pure function of method, URL and body: for the
        # GET requests without body that links make, remember it by URL, as many as the
        # near-cache holds. A repeated link then costs no canonicalisation, JSON or SHA1.
        self._memo: OrderedDict[str, str] = OrderedDict()
        if (
            fingerprint is None
            and self.config.cache_size
            and type(self).request_fingerprint is _RedisRFPDupeFilter.request_fingerprint
        ):
            self._fingerprint = self._remembered_fingerprint
        self._added = 0
        self._finished = False
        #: Clients this filter made (from_crawler / from_spider), closed when it closes.
        self._owned_clients: list[Any] = []
        where = ", ".join(server_address(client) for client in clients)
        worker = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease = self.bloom.lease(worker, self.config.worker_ttl)
        try:
            self.bloom.open()
            others = self.lease.renew()
        except (ClusterDownError, ClusterError, RedisConnectionError, RedisTimeoutError) as exc:
            state = cluster_state(clients[0])
            if isinstance(exc, (ClusterDownError, ClusterError)) or state not in (None, "ok"):
                raise BloomFilterError(
                    f"The Redis Cluster at {where} is down (cluster_state:{state or 'unknown'}),"
                    f" so the Bloom filter {key!r} cannot be used: {exc}. Repair the cluster"
                    " (CLUSTER INFO on each node), then start the crawl again."
                ) from exc
            raise BloomFilterError(
                f"Cannot reach Redis at {where} for the Bloom filter {key!r}: {exc}"
            ) from exc
        self.lease.start()
        logger.info(
            "Bloom filter %r on %s: %s; worker %s joins %d other live worker(s)",
            key,
            where,
            self.config.describe(),
            worker,
            others,
        )

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

        debug = boolean_setting(settings, "DUPEFILTER_DEBUG")
        try:
            clients = filter_clients(config.connection, lambda: get_redis_from_settings(settings))
        except (RedisError, RedisClusterException) as exc:
            where = ", ".join(url_address(url) for url in config.connection.urls)
            raise BloomFilterError(
                f"Cannot connect to the Bloom filter's Redis at {where}: {exc}"
            ) from exc
        try:
            instance = cls(
                clients[0],
                key,
                debug=debug,
                config=config,
                stats=crawler.stats if crawler is not None else None,
                fingerprint=fingerprint,
                servers=clients,
            )
        except BaseException:
            for client in clients:  # a refused start leaves no connection behind
                client.close()
            raise
        instance._owned_clients = clients
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

    def _remembered_fingerprint(self, request: Request) -> str:
        if request.method != "GET" or request.body:
            return self.request_fingerprint(request)  # type: ignore[no-any-return]
        memo, url = self._memo, request.url
        fingerprint = memo.get(url)
        if fingerprint is None:
            fingerprint = memo[url] = self.request_fingerprint(request)
            if len(memo) > self.config.cache_size:
                memo.popitem(last=False)
        return fingerprint

    def log(self, request: Request, spider: Spider) -> None:
        """Log a filtered request as Scrapy does, and count it in the stats."""
        super().log(request, spider)
        if self.stats is not None:
            self.stats.inc_value("bloomfilter/filtered")
            self.stats.inc_value("dupefilter/filtered")

    def clear(self) -> None:
        """Forget every request: delete the filter's record and bits from Redis.

        Only when no other worker holds a live lease on the filter: scrapy-redis calls
        this when ANY worker closes (``SCHEDULER_PERSIST = False``) or starts
        (``SCHEDULER_FLUSH_ON_START``), which would wipe a crawl still running
        elsewhere. The filter's state is first written to the stats.
        """
        self._record_state()
        others = self.lease.others()
        if others:
            logger.info(
                "Not clearing the Bloom filter %r: %d other worker(s) still use it. The last"
                " worker to close clears it (a crashed worker stops counting %ss after its"
                " last lease renewal).",
                self.key,
                others,
                f"{self.config.worker_ttl:g}",
            )
            return
        self.bloom.clear()
        logger.info("Cleared the Bloom filter %r: no other worker uses it.", self.key)

    def close(self, reason: str = "") -> None:
        """Report the filter's state and leave the registry. The filter stays in Redis."""
        self._finish()

    def _on_spider_closed(self, spider: Spider, reason: str) -> None:
        self._finish()

    def _finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        if self.stats is not None:
            # inc_value: a shared stats collector (scrapy-redis's) sums the workers.
            self.stats.inc_value("bloomfilter/added", self._added)
            self.stats.inc_value("bloomfilter/cache_hits", self.bloom.cache_hits)
        try:
            self.bloom.sync_counters()
            self._record_state()
        finally:
            try:
                self.lease.release()
            finally:
                self.bloom.close()
                for client in self._owned_clients:
                    client.close()

    def _record_state(self) -> None:
        """Write the filter's configuration and BITCOUNT-derived state to the stats."""
        if self.stats is None or not self.bloom.exists():
            return
        state = self.bloom.state()
        spec = self.config.spec
        totals = self.bloom.totals()
        values: dict[str, Any] = {
            "bloomfilter/total_added": totals.added,
            "bloomfilter/total_filtered": totals.seen,
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
