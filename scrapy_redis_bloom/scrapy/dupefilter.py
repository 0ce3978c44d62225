"""Scrapy glue: the dupefilter that scrapy-redis's and Scrapy's schedulers call.

Each ``request_seen`` is one fingerprint and, unless the near-cache knows it, one atomic
command in Redis; when the filter cannot answer, it is said once and the crawl stops.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Self

from redis.exceptions import AuthenticationError, RedisClusterException, RedisError
from scrapy import signals
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.misc import load_object
from scrapy_redis.dupefilter import RFPDupeFilter as _RedisRFPDupeFilter

from scrapy_redis_bloom.core.errors import (
    AccessDeniedError,
    BloomFilterError,
    CredentialsRefusedError,
    FilterBusyError,
    FilterUnavailableError,
)
from scrapy_redis_bloom.core.events import FilterEvents, RateLimitedLog, emit, guard_loggers
from scrapy_redis_bloom.core.record import UNSAID
from scrapy_redis_bloom.core.settings import BloomConfig, SettingsLike, boolean_setting
from scrapy_redis_bloom.core.versions import check_installed
from scrapy_redis_bloom.engine.backend import make_filter
from scrapy_redis_bloom.engine.cache import LRU
from scrapy_redis_bloom.scrapy.addon import SCHEDULER
from scrapy_redis_bloom.scrapy.connection import (
    filter_clients,
    refuse_decoded_queue,
)
from scrapy_redis_bloom.scrapy.reservations import Reservations
from scrapy_redis_bloom.scrapy.stats import FilterStats
from scrapy_redis_bloom.transport.connection import url_address
from scrapy_redis_bloom.transport.topology import server_address

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)

FINISH_REASON = "bloomfilter_error"  #: Of a crawl stopped because the filter could not answer.

#: The dupefilter of each crawl, for :mod:`.batching`; weak both ways: it refers to its crawler.
_BY_CRAWLER: weakref.WeakKeyDictionary[Crawler, weakref.ref[RFPDupeFilter]] = (
    weakref.WeakKeyDictionary()
)


class RFPDupeFilter(_RedisRFPDupeFilter):  # type: ignore[misc]  # scrapy-redis is untyped
    """Drop-in for scrapy-redis's dupefilter, backed by a sharded Bloom filter in Redis."""

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
        crawler: Crawler | None = None,
        fingerprints: str | None = None,
    ) -> None:
        super().__init__(server, key, debug)
        guard_loggers()  # the modules' loggers imported since the package's
        self.config = config if config is not None else BloomConfig.from_settings({})
        self.stats = stats
        self.crawler = crawler
        self.bloom = make_filter(
            list(servers) if servers else [server],
            key,
            self.config,
            cache_size=self.config.cache_size,
            faults=self.config.faults,
            events=FilterEvents(),
            fingerprints=_fingerprints(type(self), fingerprint, fingerprints),
        )
        self._fingerprint = fingerprint if fingerprint is not None else self.request_fingerprint
        # scrapy-redis's fingerprint is pure: a bodiless GET's is remembered by URL.
        self._memo: LRU[str, str] = LRU(self.config.cache_size)
        if (
            fingerprint is None
            and self.config.cache_size
            and type(self).request_fingerprint is _RedisRFPDupeFilter.request_fingerprint
        ):
            self._fingerprint = self._remembered_fingerprint
        self._finished = self._failed = False
        self._log = RateLimitedLog(logger)
        #: Answers given ahead by check_batch, taken by request_seen.
        self.reservations = Reservations(
            self._unscheduled, self.config.cache_size, self.bloom.count_seen
        )
        self._owned_clients: list[Any] = []  #: Clients _build made, closed with the filter.
        interval = crawler.settings.getfloat("LOGSTATS_INTERVAL", 60.0) if crawler else 0.0
        self.filter_stats = FilterStats(self.bloom, stats, interval)
        where = self.bloom.topology.describe()
        worker = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease = self.bloom.lease(worker, self.config.worker_ttl)
        try:
            # The lease first: no other worker clears the filter while this one opens it.
            others = self.lease.start()
            record = self.bloom.open()
        except BaseException:
            with contextlib.suppress(Exception):  # the start's own error is the one raised
                self.lease.release()  # so that it holds up no other worker's clear
            self.lease.close()
            self.bloom.close()
            raise
        logger.info(
            "Bloom filter %r (id %s, %s backend) on %s: %s; fingerprints of %s; worker %s joins"
            " %d other live worker(s)",
            key,
            record.filter_id,
            record.backend,
            where,
            self.bloom.describe_geometry(self.config, record),
            record.fingerprints or f"{self.bloom.wanted.fingerprints} (its record does not say)",
            worker,
            others,
        )

    @classmethod
    def _build(
        cls, settings: SettingsLike, spider_name: str | None, crawler: Crawler | None
    ) -> Self:
        check_installed()  # pip enforced the minimums at install time only
        config = BloomConfig.from_settings(settings)
        refuse_decoded_queue(settings)
        _say_unused_batching(settings)
        _say_redis_scheduler(settings)
        key = config.key_for(spider_name)
        fingerprint: Callable[[Request], str] | None = None
        fingerprints = None
        if config.fingerprinter == "crawler":
            if crawler is None:
                raise ValueError(
                    "BLOOMFILTER_FINGERPRINTER = 'crawler' needs the crawler's request"
                    " fingerprinter: build the dupefilter with from_crawler() or from_spider()."
                )
            fingerprinter = crawler.request_fingerprinter
            maker = type(fingerprinter)
            fingerprints = f"crawler:{maker.__module__}.{maker.__qualname__}"

            def fingerprint(request: Request) -> str:
                return fingerprinter.fingerprint(request).hex()

        try:
            clients = filter_clients(config.connection, settings, config.faults.retry_timeout)
        except (RedisError, RedisClusterException) as exc:
            where = ", ".join(url_address(url) for url in config.connection.urls)
            raise BloomFilterError(
                f"Cannot connect to the Bloom filter's Redis at {where}: {exc}"
            ) from exc
        try:
            instance = cls(
                clients[0],
                key,
                debug=boolean_setting(settings, "DUPEFILTER_DEBUG"),
                config=config,
                stats=crawler.stats if crawler is not None else None,
                fingerprint=fingerprint,
                servers=clients,
                crawler=crawler,
                fingerprints=fingerprints,
            )
        except BaseException as exc:
            for client in clients:  # a refused start leaves no connection behind
                client.close()
            if isinstance(exc, (AuthenticationError, CredentialsRefusedError)):
                raise _credentials_error(clients, config) from None
            raise
        instance._owned_clients = clients
        if crawler is not None:
            _BY_CRAWLER[crawler] = weakref.ref(instance)
            connect = crawler.signals.connect
            connect(instance.reservations.scheduled, signal=signals.request_scheduled)
            # scrapy-redis's Scheduler never calls close(): report on spider_closed too.
            connect(instance._finish, signal=signals.spider_closed)
            connect(instance.filter_stats.start, signal=signals.spider_opened)
            # Out of requests: everything is final now, for monitors that run at close.
            connect(instance.filter_stats.publish, signal=signals.spider_idle)
        return instance

    @classmethod
    def from_settings(cls, settings: SettingsLike) -> Self:
        """Build without a crawler: BLOOMFILTER_KEY must then not use %(spider)s."""
        return cls._build(settings, None, None)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Build for Scrapy's own scheduler (``DUPEFILTER_CLASS``)."""
        return cls._build(crawler.settings, crawler.spidercls.name, crawler)

    @classmethod
    def from_spider(cls, spider: Spider) -> Self:
        """Build for scrapy-redis's Scheduler, which calls this when it opens."""
        return cls._build(spider.settings, spider.name, spider.crawler)

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> RFPDupeFilter | None:
        """Return the dupefilter built for ``crawler`` (None: none of ours, or not yet)."""
        ref = _BY_CRAWLER.get(crawler)
        return ref() if ref is not None else None

    def request_seen(self, request: Request) -> bool:
        """Add the request's fingerprint; return True if it was seen before.

        One atomic round trip (none if :meth:`check_batch` answered ahead): of workers offering
        the same request at once, exactly one is told it is new. When the filter cannot
        answer, the crawl stops and the request is answered new.
        """
        fingerprint = self._fingerprint(request)
        answer = self.reservations.take(fingerprint, request)
        if answer is not None:
            return answer
        try:
            return self.bloom.check_and_add(fingerprint)
        except Exception as exc:  # whatever failed, the request is not dropped
            self._fail(exc)
            return False  # a doubt: to the scheduler, whose queue may outlive this run

    def check_batch(self, requests: Sequence[Request]) -> int:
        """Check-and-add requests together, ahead of ``request_seen``; return how many.

        One pipelined round trip per server, each answer held for :meth:`request_seen`. A
        failed batch's commands may have run, so asking again could answer "seen" for bits it
        set: every request of it answers "new", and the crawl stops as in ``request_seen``.
        """
        batch: list[Request] = []
        fingerprints: list[str] = []
        for request in requests:
            if request.dont_filter:
                continue
            try:
                fingerprint = self._fingerprint(request)
            except Exception:  # raised again, and reported, by request_seen
                continue
            if fingerprint not in self.reservations:
                batch.append(request)
                fingerprints.append(fingerprint)
        if not batch:
            return 0
        unique = list(dict.fromkeys(fingerprints))
        try:
            answers = dict(zip(unique, self.bloom.check_and_add_many(unique), strict=True))
        except Exception as exc:
            self.bloom.events.count("batch_failed")
            answers = dict.fromkeys(unique, False)  # a doubt: to the scheduler
            if isinstance(exc, BloomFilterError):
                self._fail(exc)
            else:  # a bug, not a Redis fault: said with its traceback; no page lost for it
                emit(
                    logger,
                    logging.ERROR,
                    "Checking %d request(s) together in the Bloom filter %r failed: they are"
                    " answered 'new'.",
                    len(unique),
                    self.key,
                    exc_info=True,
                )
        self.reservations.reserve(batch, fingerprints, [answers[f] for f in fingerprints])
        self.filter_stats.batches += 1
        self.filter_stats.batched += len(batch)
        return len(batch)

    def _unscheduled(self, urls: list[str]) -> None:
        """Report requests answered "new" by a batch that never reached the scheduler."""
        self.bloom.events.count("batch_unscheduled", len(urls))
        self._log.log(
            logging.WARNING,
            "unscheduled",
            "%d request(s) checked together and answered 'new' never reached the scheduler"
            " (e.g. %s): a request_scheduled handler dropped them, or the crawl ended first."
            " The Bloom filter %r holds them now: this worker answers 'new' if it meets them"
            " again; other workers, and later runs, take them for seen.",
            len(urls),
            urls[0],
            self.key,
        )

    def _fail(self, exc: Exception) -> None:
        """Count a failure; say why the filter cannot answer, once, and stop the crawl."""
        if not isinstance(exc, (FilterUnavailableError, AccessDeniedError)):  # the engine's
            self.bloom.events.count("errors")
        if self._failed:
            return
        self._failed = True
        emit(
            logger,
            logging.ERROR,
            "The Bloom filter %r cannot answer, so the crawl stops (finish reason %r): %s",
            self.key,
            FINISH_REASON,
            exc if isinstance(exc, BloomFilterError) else f"{type(exc).__name__}: {exc}",
            exc_info=not isinstance(exc, BloomFilterError),
        )
        try:
            engine = self.crawler.engine if self.crawler is not None else None
        except RuntimeError:  # Scrapy >= 2.19 raises before the crawl starts
            engine = None
        spider = getattr(engine, "spider", None)
        if engine is None or spider is None:
            return
        close_async = getattr(engine, "close_spider_async", None)
        if close_async is not None:  # Scrapy >= 2.14
            deferred = deferred_from_coro(close_async(reason=FINISH_REASON))
        else:
            deferred = engine.close_spider(spider, FINISH_REASON)
        deferred.addErrback(lambda failure: logger.debug("Closing the spider: %s", failure))

    def _remembered_fingerprint(self, request: Request) -> str:
        if request.method != "GET" or request.body:
            return self.request_fingerprint(request)  # type: ignore[no-any-return]
        url = request.url
        fingerprint = self._memo.get(url)
        if fingerprint is None:
            fingerprint = self.request_fingerprint(request)
            self._memo.put(url, fingerprint)
        return fingerprint

    def log(self, request: Request, spider: Spider) -> None:
        """Log a filtered request as Scrapy does, and count it in the stats."""
        super().log(request, spider)
        self.filter_stats.count_filtered()  # bloomfilter/filtered and dupefilter/filtered

    def clear(self) -> None:
        """Forget every request: delete the filter's record and bits from Redis.

        Only when no other worker holds a live lease, else :class:`FilterBusyError`: the
        filter is kept for them. scrapy-redis's Scheduler calls this when a worker flushes,
        then empties the queue the others crawl from, whose requests would stay "seen" and
        never be fetched; the exception stops it first (at close Scrapy logs it as a
        scheduler close failure). ``scrapy_redis_bloom.scheduler.Scheduler`` (the add-on's)
        calls :meth:`clear_unless_shared` instead, and keeps the queue with the filter.
        """
        if not self._clear(None, said=False):
            raise FilterBusyError(
                f"Not clearing the Bloom filter {self.key!r}: other workers still use it"
                f" ({self._others()}), and scrapy-redis's Scheduler (which flushes at close"
                " unless SCHEDULER_PERSIST = True, and at start with SCHEDULER_FLUSH_ON_START"
                " = True) would then empty the queue they crawl from: its requests, seen in"
                " the filter, would never be fetched. Set SCHEDULER ="
                f" {SCHEDULER!r} (scrapy-redis's, whose flush keeps the queue while the filter"
                " is kept; the add-on sets it), or SCHEDULER_PERSIST = True. The filter and"
                " the queue are kept."
            )

    def clear_unless_shared(self, then: Callable[[], object] | None = None) -> bool:
        """Clear the filter unless another worker uses it, then ``then()``; say if cleared.

        ``then`` (the scheduler's queue clear) runs inside the claim, before a starting
        worker can take a lease and queue requests it would delete.
        """
        return self._clear(then, said=True)

    def _clear(self, then: Callable[[], object] | None, said: bool) -> bool:
        self.bloom.sync_counters()
        with self.lease.clearing() as others:
            if others:
                self._record_state(full=False)
                self.bloom.events.count("flush_kept")
                if said:
                    self._say_kept(others)
                return False
            self._record_state(full=True)
            self.bloom.clear()
            if then is not None:
                then()
        logger.info("Cleared the Bloom filter %r: no other worker uses it.", self.key)
        return True

    def _say_kept(self, others: int) -> None:
        """Say a flush kept the filter and the queue: a WARNING at start, INFO at close."""
        starting = not self.filter_stats.running  # a flush on start, else at close
        logger.log(
            logging.WARNING if starting else logging.INFO,
            "Not clearing the Bloom filter %r, nor the queue: %d other worker(s) hold a lease"
            " on them (%s). A flush by the last of them clears them (a crashed worker counts"
            " until %ss after its last lease renewal).%s",
            self.key,
            others,
            self._others(),
            f"{self.config.worker_ttl:g}",
            " This crawl starts with the filter and the queue as they are: URLs the filter"
            " holds are not fetched again (SCHEDULER_FLUSH_ON_START did not apply)."
            if starting
            else "",
        )

    def _others(self) -> str:
        """Name the other live workers, for a message: a failed read is said, never raised."""
        try:
            workers = self.bloom.live_workers(settle=0)
        except BloomFilterError as exc:
            return f"their names unread: {exc}"
        return ", ".join(w for w in workers if w != self.lease.worker_id)

    def close(self, reason: str = "") -> None:
        """Report the filter's state and leave the registry. The filter stays in Redis.

        Scrapy's own scheduler calls it (scrapy-redis's does not: ``spider_closed`` does).
        """
        self._say_unfetched(reason)
        self._finish()

    def _say_unfetched(self, reason: str) -> None:
        """Warn of requests left in Scrapy's queue in memory: the filter keeps them as seen.

        Without ``JOBDIR`` the queue ends with the crawl, the filter does not: a later crawl
        with it never fetches them. The scheduler's own stats give how many.
        """
        stats, crawler = self.stats, self.crawler
        if stats is None or crawler is None or crawler.settings.get("JOBDIR"):
            return
        try:  # a shared stats store may be down: said, never raised over the close
            queued = stats.get_value("scheduler/enqueued", 0)
            queued -= stats.get_value("scheduler/dequeued", 0)
            if queued > 0:
                stats.set_value("bloomfilter/unfetched_at_close", queued)
        except Exception as exc:
            emit(logger, logging.WARNING, "Could not read the scheduler's stats: %r", exc)
            return
        if queued <= 0:
            return
        logger.warning(
            "%d request(s) were still queued when the crawl closed (%s): Scrapy's scheduler"
            " keeps its queue in memory, and the Bloom filter %r keeps them as seen, so a"
            " later crawl with this filter will not fetch them. Set JOBDIR to keep the queue"
            " with the filter, or reset the filter before the next crawl (scrapy bloom reset"
            " --key %r).",
            queued,
            reason or "closed",
            self.key,
            self.key,
        )

    def _finish(self) -> None:  # on spider_closed too; not close(), which a subclass may override
        if self._finished:
            return
        self._finished = True
        self.filter_stats.stop()
        self.reservations.close()
        if self.reservations.forgotten:
            logger.warning(
                "The Bloom filter %r forgot %d unscheduled request(s) (too many to remember).",
                self.key,
                self.reservations.forgotten,
            )
        try:
            others: int | None = None
            try:
                self.bloom.settle_owed()  # what an outage let through: its counts go too
            except BloomFilterError as exc:
                logger.warning(
                    "Could not add what the Bloom filter %r let through during an outage: %s",
                    self.key,
                    exc,
                )
            try:
                self.bloom.sync_counters()
                others = self.lease.release()
            except BloomFilterError as exc:
                logger.warning(
                    "Could not leave the Bloom filter %r's registry of workers (this worker's"
                    " lease lapses within %ss): %s",
                    self.key,
                    f"{self.config.worker_ttl:g}",
                    exc,
                )
            # The last worker counts the bits (O(m) in Redis); the others estimate, in O(1).
            try:
                self._record_state(full=others == 0)
            except BloomFilterError as exc:
                logger.warning("Could not record the Bloom filter %r's state: %s", self.key, exc)
        finally:
            self.lease.close()
            try:
                self.bloom.close()
            except BloomFilterError as exc:  # settle_owed's again: said above, once
                logger.debug("Closing the Bloom filter %r: %s", self.key, exc)
            finally:
                for client in self._owned_clients:
                    client.close()
                self.filter_stats.publish(counts_only=True)  # the last trips (counters, lease)

    def _record_state(self, full: bool) -> None:
        """Write the filter's stats and log its state (``full``: the bits counted in Redis)."""
        if self.bloom.record is None:
            return
        totals = self.bloom.totals()  # read now: other workers may have synced since
        windows = self.bloom.record.ttl > 0  # the counters hold URLs forgotten since, too
        if full or self.bloom.backend == "native":  # O(shards) in Redis: always affordable
            state = self.bloom.state()
        elif windows:
            state = self.bloom.live_state()  # the live windows' headers: O(shards)
        else:
            state = self.bloom.estimate(totals.added)
        self.filter_stats.publish(state)
        logger.info(
            "Bloom filter %r: about %s items, %.2f%% of bits set, false-positive rate now"
            " %.3g, %s bytes in Redis%s",
            self.key,
            f"{state.estimated_items:,}",
            100 * state.fill_ratio,
            state.estimated_fpr,
            f"{state.memory_bytes:,}",
            ""
            if full
            else " (from the windows' headers)"
            if windows
            else " (estimated from the counters)",
        )


def _say_unused_batching(settings: SettingsLike) -> None:
    """Warn when the batching settings are set but the middleware that reads them is not on."""
    names = ("BLOOMFILTER_BATCH_MAX", "BLOOMFILTER_BATCH_WINDOW")
    given = [name for name in names if settings.get(name) is not None]
    getwithbase = getattr(settings, "getwithbase", None)
    if not given or getwithbase is None:  # (a plain dict: no middlewares to tell)
        return
    for path, order in getwithbase("SPIDER_MIDDLEWARES").items():
        if order is None:
            continue
        try:
            middleware = load_object(path)
        except (ImportError, NameError, ValueError):  # Scrapy names it as it builds the chain
            continue
        # By a marker: scrapy.batching imports this module. A subclass keeps it.
        if getattr(middleware, "BLOOM_BATCHING", False):
            return
    logger.warning(
        "%s %s set, but the BatchingMiddleware that reads %s is not enabled: each request is"
        " checked on its own. Set BLOOMFILTER_ADDON_BATCHING = True (with the add-on), or add"
        " scrapy_redis_bloom.batching.BatchingMiddleware to SPIDER_MIDDLEWARES at order 0"
        " (docs/howto/batching.md).",
        " and ".join(given),
        "are" if given[1:] else "is",
        "them" if given[1:] else "it",
    )


def _say_redis_scheduler(settings: SettingsLike) -> None:
    """Say what scrapy-redis's own Scheduler (not the subclass) leaves undone, before the crawl.

    Its queue's calls are not timed (:class:`.WatchedQueue`): a Redis stall met there passes
    unsaid, so say at start that it is not watched. And warn when it will flush: its flush
    empties the shared queue once :meth:`RFPDupeFilter.clear` returns, so the clear raises
    while other workers use the filter.
    """
    from scrapy_redis.scheduler import Scheduler as RedisScheduler

    from scrapy_redis_bloom.scrapy.connection import loaded
    from scrapy_redis_bloom.scrapy.scheduler import Scheduler

    scheduler = loaded(settings.get("SCHEDULER"))
    if not isinstance(scheduler, type) or not issubclass(scheduler, RedisScheduler):
        return
    if issubclass(scheduler, Scheduler):
        return
    logger.info(
        "SCHEDULER = %r does not time its queue's calls: a Redis stall met by a pop or a push"
        " of scrapy-redis's queue pauses the crawl unsaid (bloomfilter/queue_slow_replies"
        " stays 0). Set SCHEDULER = %r (the add-on sets it), or derive yours from it, to have"
        " such a stall said and counted.",
        f"{scheduler.__module__}.{scheduler.__qualname__}",
        SCHEDULER,
    )
    when = [
        what
        for what, on in (
            (
                "at close (SCHEDULER_PERSIST = False)",
                not boolean_setting(settings, "SCHEDULER_PERSIST"),
            ),
            (
                "at start (SCHEDULER_FLUSH_ON_START = True)",
                boolean_setting(settings, "SCHEDULER_FLUSH_ON_START"),
            ),
        )
        if on
    ]
    if when:
        logger.warning(
            "SCHEDULER = %r flushes %s by clearing the Bloom filter, then the shared queue:"
            " while other workers use the filter, the flush is refused (FilterBusyError, which"
            " stops a worker at start), since emptying their queue would lose its requests."
            " Set SCHEDULER = %r, scrapy-redis's whose flush keeps both while others crawl"
            " (the add-on sets it in place of scrapy-redis's), or derive yours from it.",
            f"{scheduler.__module__}.{scheduler.__qualname__}",
            " and ".join(when),
            SCHEDULER,
        )


def _credentials_error(clients: list[Any], config: BloomConfig) -> CredentialsRefusedError:
    """Say which Redis refused the filter's credentials, and which setting sets them."""
    where = ", ".join(server_address(client) for client in clients)
    urls = config.connection.urls
    settings, example = "REDIS_URL (or REDIS_PARAMS)", "redis://user:password@host:6379/0."
    if urls:
        settings = "BLOOMFILTER_REDIS_URLS" if len(urls) > 1 else "BLOOMFILTER_REDIS_URL"
    if config.connection.sentinels:
        settings, example = "BLOOMFILTER_REDIS_PARAMS", "{'username': 'user', 'password': '...'}."
    given = any(
        client.get_connection_kwargs().get("password")
        for client in clients
        if hasattr(client, "get_connection_kwargs")
    )
    problem = "refused the password given" if given else "needs a password, and none was given"
    why = " (a wrong password or user, or a disabled user)" if given else ""
    said = f"Redis at {where} {problem} for the Bloom filter{why}."
    return CredentialsRefusedError(f"{said} Set it in {settings}, e.g. {example}")


def _fingerprints(
    cls: type[RFPDupeFilter], fingerprint: Callable[[Request], str] | None, said: str | None
) -> str:
    """Name what makes the filter's elements, for its record: compared between workers.

    scrapy-redis's ``request_fingerprint``, a subclass's own, or ``said`` (the crawler's
    fingerprinter); a function given without a name is not compared.
    """
    if said is not None:
        return said
    if fingerprint is not None:
        return UNSAID
    if cls.request_fingerprint is _RedisRFPDupeFilter.request_fingerprint:
        return "scrapy-redis"
    return f"{cls.request_fingerprint.__module__}.{cls.request_fingerprint.__qualname__}"
