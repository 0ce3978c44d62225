"""The filter's stats are pulled by the Scrapy layer, never pushed from the engine (issue 33).

The engine counts what happens to the filter in memory; the Scrapy layer copies the
counts into the crawl's stats collector on its own timer, from the reactor thread, and
at close. A stats collector that fails (scrapy-redis's ``RedisStatsCollector``, its Redis
restarting) is met in that one place, guarded: said, counted, and the timer goes on.
Before, the engine called the collector from the executor's retry loop, from
``request_seen``, from the batching middleware and from the lease thread, so a Redis
restart let redis-py's ``ConnectionError`` out of ``request_seen``, killed the lease
thread and stopped the stats timer for good.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis_server import RedisServer
from scrapy import Request, Spider
from scrapy.utils.log import LogCounterHandler
from scrapy.utils.test import get_crawler
from shared_crawl import run_workers
from twisted.internet import task
from waiting import until_tried, wait_until
from website import SiteServer, TreeSite

from scrapy_redis_bloom.core import events
from scrapy_redis_bloom.dupefilter import RFPDupeFilter

PAGES = 400
SMALL = {"BLOOMFILTER_CAPACITY": 10_000, "BLOOMFILTER_ERROR_RATE": 1e-6}
REDIS_STATS = "scrapy_redis.stats.RedisStatsCollector"


class BooksSpider(Spider):
    name = "books"


def dupefilter(**settings: Any) -> RFPDupeFilter:
    """Build a worker's dupefilter as a crawl does (a crawler, its stats)."""
    return RFPDupeFilter.from_crawler(get_crawler(BooksSpider, {**SMALL, **settings}))


def fire(timer: task.LoopingCall) -> None:
    """Run a LoopingCall's due call as the reactor does (no reactor runs in the tests)."""
    assert timer.call is not None, "the timer stopped"
    timer.call.cancel()
    timer()


def lease_threads(worker: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"bloomfilter-lease-{worker}"]


# -- a crawl whose stats store, the filter's Redis, restarts ------------------------------

#: The batching middleware, the Bloom filter and scrapy-redis's stats collector, all on
#: one Redis; Scrapy's own scheduler keeps the queue in memory, so it survives a restart.
#: The collector forgives Scrapy's own calls (see stats_store.py): they lose pages when
#: their stats store fails, which is not this package's doing.
SHARED_STORE: dict[str, Any] = {
    "SCHEDULER": "scrapy.core.scheduler.Scheduler",
    "STATS_CLASS": "stats_store.ForgivingRedisStatsCollector",
    "SPIDER_MIDDLEWARES": {"scrapy_redis_bloom.batching.BatchingMiddleware": 0},
    "BLOOMFILTER_ON_ERROR": "allow",
    "BLOOMFILTER_RETRY_TIMEOUT": 2,
    "BLOOMFILTER_WORKER_TTL": 3,
    "BLOOMFILTER_CAPACITY": 100_000,
    "BLOOMFILTER_ERROR_RATE": 1e-6,
}


@pytest.fixture
def site() -> Iterator[SiteServer]:
    # 50 ms per page: the crawl lasts several seconds, so the restart lands in the middle
    # and both workers still crawl while their leases are sampled after it.
    with SiteServer(TreeSite(PAGES), delay=0.05) as server:
        yield server


def _ours(log: str) -> list[str]:
    """Return the tracebacks in a worker's log that pass through this package."""
    blocks = re.split(r"\n(?=\S)", log)
    return [b for b in blocks if b.startswith("Traceback") and "scrapy_redis_bloom" in b]


@pytest.mark.timeout(180)
def test_a_shared_stats_store_restarted_mid_crawl_costs_no_page_stats_or_lease(
    site: SiteServer, tmp_path: Path
) -> None:
    registry = "shared:bloomfilter:workers"
    after: dict[str, Any] = {}
    with RedisServer(appendonly=True) as store:
        admin = store.client()

        def restart() -> None:
            time.sleep(1.0)
            store.kill()
            time.sleep(2.5)
            store.restart()
            client = store.client()
            try:
                time.sleep(0.5)
                samples: list[tuple[dict[bytes, float], int]] = []
                for _ in range(24):  # bounded: every 0.25 s for 6 s after it is back
                    samples.append(
                        (
                            dict(client.zrange(registry, 0, -1, withscores=True)),
                            int(client.hget("shared:stats", "bloomfilter/round_trips") or 0),
                        )
                    )
                    time.sleep(0.25)
                after["samples"] = samples
            finally:
                client.close()

        done = run_workers(site, store.url, tmp_path, SHARED_STORE, admin, during=restart)
        admin.close()
    for log in done.logs:
        assert not _ours(log), _ours(log)[0]
    assert done.lost(site) == set()
    assert any("Could not write the Bloom filter" in log for log in done.logs)
    samples = after["samples"]
    # Both workers hold a lease soon after the restart: each renews within its interval
    # (a second) once its next attempt is let through, though a busy machine may leave
    # one a few samples late (seen: 1.5 s after the restart under load).
    both = [i for i, (held, _) in enumerate(samples[:16]) if len(held) == 2]
    assert both, [sorted(held) for held, _ in samples[:16]]
    (leases, trips), later = samples[both[0]], samples[both[0] + 1 :]
    assert max(t for _, t in later) > trips, "the stats stopped updating"
    # Each worker renews its lease after the restart, unless it finished and gave it back.
    for worker, score in leases.items():
        renewed = any(held.get(worker, 0) > score for held, _ in later)
        released = worker not in later[-1][0]
        assert renewed or released, f"{worker!r}'s lease was not renewed after the restart"
    assert any(held.get(w, 0) > s for w, s in leases.items() for held, _ in later)


# -- the stats timer, the lease thread ----------------------------------------------------


def test_the_stats_timer_survives_a_stats_store_that_fails_and_catches_up(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with RedisServer(appendonly=True) as store:
        df = dupefilter(
            STATS_CLASS=REDIS_STATS, REDIS_URL=store.url, BLOOMFILTER_REDIS_URL=redis_url
        )
        stats = df.filter_stats
        try:
            stats.start()  # as spider_opened does
            tick = stats._tasks[0]
            for i in range(5):
                assert df.request_seen(Request(f"https://example.com/{i}")) is False
            store.kill()
            with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
                fire(tick)
                fire(tick)
            assert tick.running, "the stats timer stopped"
            warned = [r for r in caplog.records if "Could not write the Bloom filter" in r.message]
            assert len(warned) == 1  # rate-limited
            assert warned[0].levelno == logging.WARNING
            assert "ConnectionError" in warned[0].message
            store.restart()
            fire(tick)  # the next tick writes what the failed ones could not
            written = store.client().hgetall("books:stats")
            assert written[b"bloomfilter/added"] == b"5"
            assert written[b"bloomfilter/stats_failed"] == b"2"
            assert written[b"bloomfilter/total_added"] == b"5"
        finally:
            stats.stop()
            df.close("finished")


def test_the_lease_thread_survives_a_renewal_failing_while_the_stats_store_is_down() -> None:
    """The lease thread goes on renewing when its stats store (the same Redis) fails.

    A failed renewal's count met a stats store down, and the exception killed the thread
    (the lease then lapsed under a live crawl).
    """
    with RedisServer(appendonly=True) as server:
        df = dupefilter(STATS_CLASS=REDIS_STATS, REDIS_URL=server.url, BLOOMFILTER_WORKER_TTL=1.0)
        try:
            worker, thread = df.lease.worker_id, df.lease._thread
            assert thread is not None
            registry = "books:bloomfilter:workers"
            before = server.client().zscore(registry, worker)
            assert before is not None
            server.kill()
            time.sleep(1.5)  # a few renewals fail (every third of the TTL)
            server.restart()
            admin = server.client()
            assert wait_until(lambda: (admin.zscore(registry, worker) or 0) > before + 1000, 5)
            assert thread.is_alive(), "the lease thread died"
            assert df.lease._thread is thread
            df.filter_stats.tick()  # as the stats timer does, on the reactor's thread
            assert int(admin.hget("books:stats", "bloomfilter/lease_failed") or 0) >= 1
            admin.close()
        finally:
            df.close("finished")


def test_a_lease_stopped_during_a_long_renewal_and_started_again_has_one_thread() -> None:
    """A lease stopped and started again renews from one thread.

    stop() waits 5 s for the thread; one held longer (here a failed renewal counted into
    a stats store that stalls) went on, and start() made a second thread beside it: two
    threads renewed one lease until the worker closed.
    """
    with RedisServer() as stats_server, RedisServer(appendonly=True) as server:
        df = dupefilter(
            STATS_CLASS=REDIS_STATS,
            REDIS_URL=stats_server.url,
            BLOOMFILTER_REDIS_URL=server.url,
            BLOOMFILTER_WORKER_TTL=3.0,
        )
        lease = df.lease
        try:
            server.kill()  # renewals fail (after a second of retries)
            stalled = stats_server.pause(12)
            time.sleep(2.5)
            lease.stop()  # gives up waiting after 5 s
            server.restart()
            # Its renewals' outage (a server that stopped answering) ends when the watch,
            # asking once a second, sees it answer: a fixed sleep raced that probe.
            until_tried(lease._executor)
            lease.start()
            stalled.join()
            time.sleep(1.5)  # the first thread is free again, and would go on
            assert len(lease_threads(lease.worker_id)) == 1
        finally:
            df.close("finished")
        assert wait_until(lambda: not lease_threads(lease.worker_id), 5)


# -- the stats at close --------------------------------------------------------------------


def test_an_idle_worker_closes_with_the_filters_totals_whatever_failed(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """A worker's stats at close are the filter's totals at its close.

    An idle worker's stats were the totals of its start (1) while the busy one's were
    400: when leaving the registry failed at close (its lease's calls refused, or failing
    fast after an outage), the totals were not read again.
    """
    redis_client.execute_command("ACL", "SETUSER", "idle", "on", ">pw", "~*", "+@all")
    port = redis_client.connection_pool.connection_kwargs["port"]
    idle = dupefilter(REDIS_URL=f"redis://idle:pw@127.0.0.1:{port}/0")
    try:
        assert idle.request_seen(Request("https://example.com/start")) is False
        idle.filter_stats.publish()  # spider_idle: what it knows now
        assert idle.crawler.stats.get_value("bloomfilter/total_added") == 1
        busy = dupefilter(REDIS_URL=redis_url)
        for i in range(400):
            assert busy.request_seen(Request(f"https://example.com/{i}")) is False
        busy.close("finished")
        redis_client.execute_command("ACL", "SETUSER", "idle", "-@scripting")  # no lease calls
    finally:
        idle.close("finished")
    stats = idle.crawler.stats
    assert stats.get_value("bloomfilter/total_added") == 401
    assert stats.get_value("bloomfilter/estimated_items") == 401
    assert stats.get_value("bloomfilter/added") == 1


# -- a log handler that fails ----------------------------------------------------------------


def test_a_worker_closes_and_says_so_whatever_a_log_handler_fails(
    redis_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scrapy's LogCounterHandler writing into a stats store that is down fails no close.

    The handler counts every log record into a crawl's stats (scrapy-redis's, in a
    Redis). Scrapy 2.13 puts one on the root logger per crawler, until its engine stops
    (later versions, from spider_opened to spider_closed). With that Redis down,
    redis-py's ConnectionError came out of the filter's log calls (out of close(), and
    out of a lease's start through the executor's "carries out writes again"), and the
    record never reached the handlers after the failing one. Here it sits first, as a
    crawler made earlier in the process leaves it.
    """
    monkeypatch.setattr(events, "_handler_failures_said", {})  # said once a minute at most
    with RedisServer() as stats_server:
        gone = get_crawler(BooksSpider, {"STATS_CLASS": REDIS_STATS, "REDIS_URL": stats_server.url})
    counter = LogCounterHandler(gone, level=logging.DEBUG)
    df = dupefilter(BLOOMFILTER_REDIS_URL=redis_url)
    before = events.handler_failures()
    logging.root.handlers.insert(0, counter)
    try:
        with caplog.at_level(logging.INFO, logger="scrapy_redis_bloom"):
            df.close("finished")
    finally:
        for handler in [counter, *logging.root.handlers]:  # Scrapy 2.13's own one too
            if getattr(handler, "crawler", None) is gone:
                logging.root.removeHandler(handler)
    assert "Bloom filter 'books:bloomfilter': about 0 items" in caplog.text  # the close's line
    said = [r.getMessage() for r in caplog.records if "A log handler failed" in r.getMessage()]
    assert len(said) == 1, said
    assert "LogCounterHandler (ConnectionError: " in said[0]
    # Every line of the close that the handler missed is counted, and in the stats.
    lines = [r for r in caplog.records if r.name.startswith("scrapy_redis_bloom.")]
    assert events.handler_failures() - before == len(lines) - 1 > 0
    assert df.crawler.stats.get_value("bloomfilter/log_failed") == len(lines) - 1


def test_a_log_line_reaches_every_handler_but_the_failing_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """emit() hands the record to each handler: one that raises stops neither it nor them.

    The failure is counted for every record, and said once a minute to the others.
    """
    monkeypatch.setattr(events, "_handler_failures_said", {})
    log = logging.getLogger("tests.emit")  # not the package's: emit() guards any logger
    log.propagate = False
    log.setLevel(logging.DEBUG)
    store = redis.Redis(port=1, socket_connect_timeout=1)  # nothing listens there

    class CountingHandler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            store.incr(f"log_count/{record.levelname}")

    before, after = logging.Handler(), logging.Handler()
    got: list[logging.LogRecord] = []
    before.emit = after.emit = got.append  # type: ignore[method-assign]
    counter = CountingHandler()
    log.handlers = [before, counter, after]
    failures = events.handler_failures()
    try:
        assert events.emit(log, logging.WARNING, "lost %s", "nothing") is False
        assert events.emit(log, logging.DEBUG, "quiet") is False
        counter.setLevel(logging.INFO)
        assert events.emit(log, logging.DEBUG, "quiet again") is True
    finally:
        log.handlers = []
        store.close()
    messages = [record.getMessage() for record in got]
    assert messages[:2] == ["lost nothing"] * 2  # to the handlers before and after
    report = "A log handler failed to take a record (test_a_log_line_reaches_every_handler"
    assert messages[2].startswith(report)
    assert messages[3] == messages[2]
    assert "CountingHandler (ConnectionError: " in messages[2]
    assert messages[4:] == ["quiet"] * 2 + ["quiet again"] * 2  # said once a minute
    assert events.handler_failures() - failures == 2
    assert got[0].funcName == "test_a_log_line_reaches_every_handler_but_the_failing_one"


def test_the_packages_loggers_are_guarded(redis_url: str) -> None:
    """Every logger of the package a crawl uses is a GuardedLogger, once a filter exists."""
    import scrapy_redis_bloom.scrapy.batching  # noqa: F401 (its logger)

    dupefilter(REDIS_URL=redis_url).close("finished")
    unguarded = [
        name
        for name, found in logging.Logger.manager.loggerDict.items()
        if name.startswith("scrapy_redis_bloom.")
        and isinstance(found, logging.Logger)
        and not isinstance(found, events.GuardedLogger)
    ]
    assert not unguarded
