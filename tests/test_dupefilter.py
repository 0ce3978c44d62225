"""The Scrapy glue, built the way both schedulers build it, against a real Redis."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from scrapy import Request, Spider, signals
from scrapy.core.scheduler import Scheduler as ScrapyScheduler
from scrapy.crawler import Crawler
from scrapy.utils.misc import build_from_crawler, load_object
from scrapy.utils.test import get_crawler
from scrapy_redis.scheduler import Scheduler as RedisScheduler
from waiting import until_tried

import scrapy_redis_bloom
from scrapy_redis_bloom import RedisBloomFilter, WorkerLease
from scrapy_redis_bloom.core.errors import (
    BloomFilterError,
    ConfigMismatchError,
    FilterBusyError,
    WrongTypeError,
)
from scrapy_redis_bloom.core.settings import BloomConfig
from scrapy_redis_bloom.scheduler import Scheduler as BloomScheduler
from scrapy_redis_bloom.scrapy.dupefilter import RFPDupeFilter

SMALL = {"BLOOMFILTER_CAPACITY": 10_000, "BLOOMFILTER_ERROR_RATE": 1e-6}


class BooksSpider(Spider):
    name = "books"


def crawler_for(redis_url: str, **settings: Any) -> Crawler:
    return get_crawler(
        BooksSpider,
        {
            "REDIS_URL": redis_url,
            "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
            "DUPEFILTER_CLASS": "scrapy_redis_bloom.dupefilter.RFPDupeFilter",
            **SMALL,
            **settings,
        },
    )


_OPENED: list[RFPDupeFilter] = []


@pytest.fixture(autouse=True)
def _leave_the_registry() -> Iterator[None]:
    """Stop each test's lease threads (their servers may be gone by the session's end)."""
    yield
    while _OPENED:
        _OPENED.pop().lease.stop()


def redis_scheduler(
    crawler: Crawler, cls: type[RedisScheduler] = RedisScheduler
) -> tuple[RedisScheduler, Spider]:
    spider = BooksSpider.from_crawler(crawler)
    scheduler = cls.from_crawler(crawler)
    scheduler.open(spider)
    _OPENED.append(scheduler.df)
    return scheduler, spider


def seed003_requests() -> list[Request]:
    """Seed 003's test: wd=0..9, then wd=0..99, so 10 of the 110 are duplicates."""
    base = "https://www.example.com/s?wd="
    return [Request(base + str(i)) for i in range(10)] + [
        Request(base + str(i)) for i in range(100)
    ]


def test_exported_at_the_package_root() -> None:
    assert scrapy_redis_bloom.RFPDupeFilter is RFPDupeFilter
    assert scrapy_redis_bloom.__version__ == "0.1.0"
    from scrapy_redis.dupefilter import RFPDupeFilter as Parent

    assert issubclass(RFPDupeFilter, Parent)


def test_seed003_under_the_scrapy_redis_scheduler(redis_url: str) -> None:
    crawler = crawler_for(redis_url)
    scheduler, _ = redis_scheduler(crawler)
    assert isinstance(scheduler.df, RFPDupeFilter)
    enqueued = [scheduler.enqueue_request(r) for r in seed003_requests()]
    assert enqueued.count(True) == 100
    assert crawler.stats.get_value("bloomfilter/filtered") == 10
    assert crawler.stats.get_value("dupefilter/filtered") == 10


def test_seed003_under_scrapys_default_scheduler(redis_client: redis.Redis, redis_url: str) -> None:
    crawler = crawler_for(redis_url, SCHEDULER="scrapy.core.scheduler.Scheduler")
    spider = BooksSpider.from_crawler(crawler)
    df = build_from_crawler(ScrapyScheduler, crawler).df
    assert isinstance(df, RFPDupeFilter)
    assert df.key == "books:bloomfilter"
    # What Scrapy's Scheduler.enqueue_request does with its dupefilter.
    new = 0
    for request in seed003_requests():
        if df.request_seen(request):
            df.log(request, spider)
        else:
            new += 1
    assert new == 100
    assert crawler.stats.get_value("dupefilter/filtered") == 10
    assert crawler.stats.get_value("bloomfilter/filtered") == 10
    df.close("finished")  # Scheduler.close() returns df.close(reason)
    # The state reaches the stats, and the filter stays in Redis.
    stats = crawler.stats.get_stats()
    assert stats["bloomfilter/added"] == 100
    assert stats["bloomfilter/cache_hits"] == 10  # the repeats never reached Redis
    assert stats["bloomfilter/total_filtered"] == 10  # yet Redis's totals count them
    assert stats["bloomfilter/estimated_items"] == pytest.approx(100, abs=2)
    assert stats["bloomfilter/capacity"] == 10_000
    assert 0 < stats["bloomfilter/fill_ratio"] < 0.01
    assert 0 <= stats["bloomfilter/estimated_fpr"] < 1e-9
    assert stats["bloomfilter/memory_bytes"] >= df.config.spec.total_bytes
    assert stats["bloomfilter/bits"] == df.config.spec.bits
    assert stats["bloomfilter/hash_functions"] == df.config.spec.hash_count
    assert stats["bloomfilter/shards"] == df.config.spec.shards
    assert redis_client.exists("books:bloomfilter:meta")


@pytest.mark.parametrize("jobdir", [False, True])
def test_requests_left_in_scrapys_memory_queue_at_close_are_said(
    redis_url: str, tmp_path: Any, caplog: pytest.LogCaptureFixture, jobdir: bool
) -> None:
    # Scrapy's scheduler without JOBDIR forgets its queue at close, while the filter keeps
    # those requests as seen: a crawl stopped early (CloseSpider) and run again fetched none
    # of them (243 of 300 pages in a probe), and nothing said so.
    more = {"JOBDIR": str(tmp_path / "job")} if jobdir else {}
    crawler = crawler_for(
        redis_url,
        SCHEDULER="scrapy.core.scheduler.Scheduler",
        # (the downloader-aware queue, Scrapy's default, needs a running engine)
        SCHEDULER_PRIORITY_QUEUE="scrapy.pqueues.ScrapyPriorityQueue",
        **more,
    )
    spider = BooksSpider.from_crawler(crawler)
    scheduler = build_from_crawler(ScrapyScheduler, crawler)
    scheduler.open(spider)
    for i in range(3):
        assert scheduler.enqueue_request(Request(f"https://example.com/{i}")) is True
    assert scheduler.next_request() is not None
    with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
        scheduler.close("closespider_pagecount")
    said = [r.getMessage() for r in caplog.records if "still queued" in r.getMessage()]
    if jobdir:  # the queue is kept on disk with the filter: nothing to say
        assert said == []
        assert crawler.stats.get_value("bloomfilter/unfetched_at_close") is None
        return
    assert len(said) == 1
    assert "2 request(s) were still queued" in said[0]
    assert "JOBDIR" in said[0]
    assert crawler.stats.get_value("bloomfilter/unfetched_at_close") == 2


def test_default_fingerprint_is_scrapy_redis_s(redis_url: str) -> None:
    crawler = crawler_for(redis_url)
    scheduler, _ = redis_scheduler(crawler)
    request = Request("https://example.com/a?b=1&a=2")
    assert scheduler.df.request_seen(request) is False
    from scrapy_redis.dupefilter import RFPDupeFilter as Parent

    parent_fp = Parent.request_fingerprint(None, request)
    assert scheduler.df.bloom.contains(parent_fp)
    # Canonicalised like scrapy-redis: query order does not matter.
    assert scheduler.df.request_seen(Request("https://example.com/a?a=2&b=1")) is True


def test_crawler_fingerprinter_on_request(redis_url: str) -> None:
    crawler = crawler_for(redis_url, BLOOMFILTER_FINGERPRINTER="crawler")
    scheduler, _ = redis_scheduler(crawler)
    request = Request("https://example.com/page")
    scheduler.df.request_seen(request)
    assert scheduler.df.bloom.contains(crawler.request_fingerprinter.fingerprint(request).hex())


class QueryBlindFingerprinter:
    """A project's fingerprinter: the URL without its query."""

    def fingerprint(self, request: Request) -> bytes:
        return hashlib.sha1(request.url.split("?")[0].encode()).digest()


def test_a_fingerprint_function_other_than_the_filters_is_refused(
    redis_client: redis.Redis, redis_url: str
) -> None:
    # A filter of scrapy-redis's fingerprints reopened with the crawler's (or another
    # fingerprinter class): every URL it held looked new, and a probe's second run fetched all
    # 300 pages again, without a word.
    first, _ = redis_scheduler(crawler_for(redis_url, SCHEDULER_PERSIST=True))
    assert redis_client.hget("books:bloomfilter:meta", "fingerprints") == b"scrapy-redis"
    first.df.close("finished")
    crawler = crawler_for(redis_url, BLOOMFILTER_FINGERPRINTER="crawler")
    with pytest.raises(
        ConfigMismatchError,
        match=r"fingerprints of scrapy-redis; this worker makes those of"
        r" crawler:scrapy\.utils\.request\.RequestFingerprinter\. .*BLOOMFILTER_FINGERPRINTER",
    ):
        RFPDupeFilter.from_crawler(crawler)
    redis_client.flushdb()
    made = crawler_for(redis_url, BLOOMFILTER_FINGERPRINTER="crawler")
    RFPDupeFilter.from_crawler(made).close("finished")
    other = crawler_for(
        redis_url,
        BLOOMFILTER_FINGERPRINTER="crawler",
        REQUEST_FINGERPRINTER_CLASS=f"{__name__}.QueryBlindFingerprinter",
    )
    with pytest.raises(ConfigMismatchError, match=r"those of crawler:.*QueryBlindFingerprinter"):
        RFPDupeFilter.from_crawler(other)


class OwnFingerprint(RFPDupeFilter):
    """A project's dupefilter with a fingerprint of its own."""

    def request_fingerprint(self, request: Request) -> str:
        return hashlib.sha1(request.url.encode()).hexdigest()


class OwnFingerprintLogging(OwnFingerprint):
    """Its subclass: the same fingerprints."""


def test_a_subclass_inheriting_a_fingerprint_makes_the_same_ones(redis_url: str) -> None:
    # Named by the class, not by the function: refused beside its parent (a probe).
    first = OwnFingerprint.from_crawler(crawler_for(redis_url))
    assert first.bloom.record.fingerprints.endswith("OwnFingerprint.request_fingerprint")
    second = OwnFingerprintLogging.from_crawler(crawler_for(redis_url))
    assert second.bloom.record.filter_id == first.bloom.record.filter_id
    for df in (first, second):
        df.close("finished")


def test_a_filter_whose_record_does_not_say_its_fingerprints_takes_any(
    redis_client: redis.Redis, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Made by the Python API (or a release before records said): nothing to compare.
    config = BloomConfig.from_settings({**SMALL, "BLOOMFILTER_KEY": "books:bloomfilter"})
    RedisBloomFilter.from_config(redis_client, "books:bloomfilter", config).open()
    assert redis_client.hget("books:bloomfilter:meta", "fingerprints") == b""
    with caplog.at_level(logging.INFO, logger="scrapy_redis_bloom"):
        df = RFPDupeFilter.from_crawler(crawler_for(redis_url, BLOOMFILTER_FINGERPRINTER="crawler"))
    assert "fingerprints of crawler:scrapy.utils.request.RequestFingerprinter (its record" in (
        caplog.text
    )
    df.close("finished")


def test_a_record_restored_from_its_shards_does_not_say_whose_fingerprints_they_hold(
    redis_client: redis.Redis, redis_url: str
) -> None:
    # Restored with the restoring worker's fingerprinter, the record then refused the
    # workers with the filter's real one (ConfigMismatchError, blaming them).
    first = RFPDupeFilter.from_crawler(crawler_for(redis_url, SCHEDULER_PERSIST=True))
    assert first.request_seen(Request("https://example.com/1")) is False
    first.close("finished")
    redis_client.delete("books:bloomfilter:meta")  # evicted
    other = {"BLOOMFILTER_FINGERPRINTER": "crawler", "SCHEDULER_PERSIST": True}
    restoring = RFPDupeFilter.from_crawler(crawler_for(redis_url, **other))
    assert redis_client.hget("books:bloomfilter:meta", "fingerprints") == b""
    restoring.close("finished")
    again = RFPDupeFilter.from_crawler(crawler_for(redis_url, SCHEDULER_PERSIST=True))
    assert again.request_seen(Request("https://example.com/1")) is True
    again.close("finished")


def test_first_duplicate_is_logged_then_silence(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler, _ = redis_scheduler(crawler_for(redis_url))
    with caplog.at_level(logging.DEBUG, logger="scrapy_redis_bloom"):
        for request in seed003_requests():
            scheduler.enqueue_request(request)
    filtered = [r for r in caplog.records if "Filtered duplicate request" in r.getMessage()]
    assert len(filtered) == 1
    assert "no more duplicates will be shown" in filtered[0].getMessage()


def test_dupefilter_debug_logs_every_duplicate(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler, _ = redis_scheduler(crawler_for(redis_url, DUPEFILTER_DEBUG=True))
    with caplog.at_level(logging.DEBUG, logger="scrapy_redis_bloom"):
        for request in seed003_requests():
            scheduler.enqueue_request(request)
    filtered = [r for r in caplog.records if "Filtered duplicate request" in r.getMessage()]
    assert len(filtered) == 10


def test_resolved_config_is_logged_once_without_the_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from redis_server import RedisServer

    with RedisServer(password="s3cret-pass") as server:
        url = f"redis://:s3cret-pass@127.0.0.1:{server.port}/0"
        with caplog.at_level(logging.INFO, logger="scrapy_redis_bloom"):
            scheduler, _ = redis_scheduler(crawler_for(url, SCHEDULER_PERSIST=True))
        scheduler.df.close("finished")  # before the server stops: no lease renewals left
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("scrapy_redis_bloom")]
    # scrapy-redis's own Scheduler leaves its queue unwatched: said first, once.
    assert "does not time its queue's calls" in lines.pop(0)
    # The backend auto picked, and why; then the config, naming the backend too.
    assert len(lines) == 2
    assert "BLOOMFILTER_BACKEND = 'auto' picks the bitmap backend" in lines[0]
    assert "no Bloom filter commands (BF.*)" in lines[0]
    lines = lines[1:]
    assert "'books:bloomfilter' (id " in lines[0]
    assert f", bitmap backend) on Redis at 127.0.0.1:{server.port}: m=" in lines[0]
    # Sized for half the rate, as it may grow: more hash functions than a fixed size's
    # (the default layout, blocked: k = 17 here; classic: 21).
    growing = BloomConfig.from_settings(SMALL).spec.hash_count
    fixed = BloomConfig.from_settings({**SMALL, "BLOOMFILTER_EXPANSION": 0}).spec.hash_count
    assert growing > fixed
    assert f"k={growing} hash functions" in lines[0]
    assert "grows 2x per generation" in lines[0]
    assert "expected false-positive rate at capacity" in lines[0]
    assert "s3cret" not in caplog.text


def test_persist_false_clears_on_close_but_keeps_the_stats(
    redis_client: redis.Redis, redis_url: str
) -> None:
    crawler = crawler_for(redis_url, SCHEDULER_PERSIST=False)
    scheduler, spider = redis_scheduler(crawler)
    for request in seed003_requests():
        scheduler.enqueue_request(request)
    scheduler.close("finished")
    crawler.signals.send_catch_log(signal=signals.spider_closed, spider=spider, reason="finished")
    assert redis_client.keys("books:bloomfilter*") == []
    assert crawler.stats.get_value("bloomfilter/estimated_items") == pytest.approx(100, abs=2)
    assert crawler.stats.get_value("bloomfilter/added") == 100


def test_persist_true_keeps_the_filter_for_the_next_run(
    redis_client: redis.Redis, redis_url: str
) -> None:
    first, _ = redis_scheduler(crawler_for(redis_url, SCHEDULER_PERSIST=True))
    for request in seed003_requests():
        first.enqueue_request(request)
    first.close("finished")
    assert redis_client.exists("books:bloomfilter:meta")
    redis_client.delete("books:requests")  # as if the first crawl had drained its queue
    crawler = crawler_for(redis_url, SCHEDULER_PERSIST=True)
    second, _ = redis_scheduler(crawler)
    assert not any(second.enqueue_request(r) for r in seed003_requests())
    assert crawler.stats.get_value("bloomfilter/filtered") == 110


def test_flush_on_start_clears_when_no_other_worker_is_live(
    redis_client: redis.Redis, redis_url: str
) -> None:
    first, _ = redis_scheduler(crawler_for(redis_url, SCHEDULER_PERSIST=True))
    first.enqueue_request(Request("https://example.com/1"))
    first.df.close("finished")  # leaves the registry
    second, _ = redis_scheduler(
        crawler_for(redis_url, SCHEDULER_PERSIST=True, SCHEDULER_FLUSH_ON_START=True)
    )
    assert not redis_client.exists("books:bloomfilter:meta")
    assert second.enqueue_request(Request("https://example.com/1")) is True  # forgotten
    assert redis_client.exists("books:bloomfilter:meta")  # the record is back


def test_flush_on_start_spares_a_running_crawl_and_its_queue(
    redis_client: redis.Redis, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # scrapy-redis flushes the dupefilter, then the queue. The filter was kept for the running
    # worker, but its queue emptied: those requests, seen in the filter, were never fetched
    # (87 of 300 pages in a probe's crawl).
    first, _ = redis_scheduler(crawler_for(redis_url, SCHEDULER_PERSIST=True))
    first.enqueue_request(Request("https://example.com/1"))
    flushing = crawler_for(redis_url, SCHEDULER_PERSIST=True, SCHEDULER_FLUSH_ON_START=True)
    with caplog.at_level(logging.INFO, logger="scrapy_redis_bloom"):
        late, _ = redis_scheduler(flushing, BloomScheduler)
    assert "Not clearing the Bloom filter 'books:bloomfilter', nor the queue: 1 other" in (
        caplog.text
    )
    assert late.enqueue_request(Request("https://example.com/1")) is False  # still known
    assert len(first) == 1  # and still queued
    # scrapy-redis's own Scheduler would empty the queue: refused, saying how to keep it.
    stock = crawler_for(redis_url, SCHEDULER_PERSIST=True, SCHEDULER_FLUSH_ON_START=True)
    refused = RedisScheduler.from_crawler(stock)
    with pytest.raises(FilterBusyError, match=r"SCHEDULER = 'scrapy_redis_bloom\.scheduler"):
        refused.open(BooksSpider.from_crawler(stock))
    refused.df.close("finished")  # (its worker leaves the registry)
    assert len(first) == 1
    assert first.next_request() is not None
    late.df.close("finished")
    first.df.close("finished")


def test_workers_flushing_on_start_together_all_start(
    redis_client: redis.Redis, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # With the add-on's Scheduler every worker starts; the ones after the first keep the
    # filter and the queue, said and counted (a probe's fleet of 3 started with no stat).
    flush = {"SCHEDULER_PERSIST": True, "SCHEDULER_FLUSH_ON_START": True}
    first, _ = redis_scheduler(crawler_for(redis_url, **flush), BloomScheduler)
    crawler = crawler_for(redis_url, **flush)
    with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
        second, _ = redis_scheduler(crawler, BloomScheduler)
    said = [r.getMessage() for r in caplog.records if "Not clearing" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert first.df.lease.worker_id in said[0]  # the worker it waits for, named
    assert "starts with the filter and the queue as they are" in said[0]
    second.df.filter_stats.publish(counts_only=True)
    assert crawler.stats.get_value("bloomfilter/flush_kept") == 1
    for scheduler in (first, second):
        scheduler.df.close("finished")


def test_scrapy_redis_own_flush_beside_a_live_worker_is_refused_even_with_its_queue_empty(
    redis_client: redis.Redis, redis_url: str
) -> None:
    # The refusal used to look at the queue (EXISTS), and scrapy-redis deleted it after: a
    # push by another worker between the two was deleted, its URL "seen" (a probe: 1,220 of
    # 60,417 requests lost; a real crawl stopped dead at page 6,269, never fetched).
    first, _ = redis_scheduler(crawler_for(redis_url, SCHEDULER_PERSIST=True))
    assert not redis_client.exists("books:requests")
    closing, _ = redis_scheduler(crawler_for(redis_url, SCHEDULER_PERSIST=False))
    with pytest.raises(FilterBusyError, match=r"other workers still use it \(.*"):
        closing.close("finished")
    closing.df.close("finished")
    assert redis_client.exists("books:bloomfilter:meta")
    first.df.close("finished")


@pytest.mark.parametrize(
    ("scheduler", "persist", "warned"),
    [
        ("scrapy_redis.scheduler.Scheduler", False, True),
        ("scrapy_redis.scheduler.Scheduler", True, False),
        (f"{__name__}.KeyedScheduler", False, True),
        ("scrapy_redis_bloom.scheduler.Scheduler", False, False),
    ],
)
def test_a_scheduler_whose_flush_empties_the_queue_is_said_at_start(
    redis_url: str, caplog: pytest.LogCaptureFixture, scheduler: str, persist: bool, warned: bool
) -> None:
    # A project's subclass of scrapy-redis's Scheduler (its own queue key here) is not
    # replaced by the add-on: its flush would be refused beside live workers, unannounced.
    crawler = crawler_for(redis_url, SCHEDULER=scheduler, SCHEDULER_PERSIST=persist)
    with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
        opened, _ = redis_scheduler(crawler, load_object(scheduler))
    said = [r.getMessage() for r in caplog.records if "flushes at close" in r.getMessage()]
    assert len(said) == int(warned), caplog.text
    if warned:
        assert scheduler in said[0]
        assert "SCHEDULER = 'scrapy_redis_bloom.scheduler.Scheduler'" in said[0]
    opened.df.close("finished")


class KeyedScheduler(RedisScheduler):  # type: ignore[misc]
    """A project's subclass of scrapy-redis's Scheduler, with a queue key of its own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue_key = "%(spider)s:queue"


def test_the_add_ons_scheduler_clears_the_queue_before_a_worker_can_start(
    redis_client: redis.Redis, redis_url: str
) -> None:
    # The claim ended before the queue was deleted: a worker starting in between got a new
    # filter, queued requests, and had them deleted (a probe: 62 of 119, with a 50 ms stall).
    scheduler, _ = redis_scheduler(crawler_for(redis_url, SCHEDULER_PERSIST=False), BloomScheduler)
    scheduler.enqueue_request(Request("https://example.com/1"))
    starting: list[int] = []
    threads: list[threading.Thread] = []
    leases: list[WorkerLease] = []

    def clear_queue() -> None:
        starter = RedisBloomFilter.from_config(
            redis_client, "books:bloomfilter", BloomConfig.from_settings(SMALL)
        )
        leases.append(starter.lease("s", 5))
        thread = threading.Thread(target=lambda: starting.append(leases[0].start()))
        thread.start()
        threads.append(thread)
        time.sleep(0.5)
        redis_client.delete("books:requests")
        starting.append(-1)

    scheduler.queue.clear = clear_queue
    try:
        scheduler.close("finished")
        assert starting == [-1]  # the queue was cleared before the worker could start
        threads[0].join(timeout=5)
        assert starting == [-1, 1]  # then it started, beside the closing worker's lease
    finally:
        for lease in leases:
            lease.stop()
            lease.release()
        scheduler.df.close("finished")


def test_a_flush_at_close_that_fails_keeps_both_and_is_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The filter's Redis gone at close: "Scheduler close failure" with a traceback.
    from redis_server import RedisServer

    with RedisServer() as server:
        crawler = crawler_for(server.url, SCHEDULER_PERSIST=False, BLOOMFILTER_RETRY_TIMEOUT=0.2)
        scheduler, _ = redis_scheduler(crawler, BloomScheduler)
        server.kill()
        with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
            scheduler.close("finished")  # no exception
        said = [r.getMessage() for r in caplog.records if "Could not flush" in r.getMessage()]
        assert len(said) == 1, caplog.text
        assert "the Bloom filter and the queue are kept" in said[0]
        assert scheduler.df.bloom.events.counts["flush_failed"] == 1
        scheduler.df.close("finished")


@pytest.mark.parametrize("cls", [BloomScheduler, RedisScheduler])
def test_a_scheduler_that_does_not_watch_its_queue_is_said_at_start(
    redis_url: str, caplog: pytest.LogCaptureFixture, cls: type[RedisScheduler]
) -> None:
    # scrapy-redis's own Scheduler (no add-on, SCHEDULER_PERSIST kept: no flush warning)
    # leaves its queue's calls untimed: a stall met there would pass unsaid.
    name = f"{cls.__module__}.{cls.__qualname__}"
    with caplog.at_level(logging.INFO, logger="scrapy_redis_bloom"):
        crawler = crawler_for(redis_url, SCHEDULER=name, SCHEDULER_PERSIST=True)
        scheduler, _ = redis_scheduler(crawler, cls)
    said = [r for r in caplog.records if "does not time its queue's calls" in r.getMessage()]
    if cls is RedisScheduler:
        assert len(said) == 1, caplog.text
        assert said[0].levelno == logging.INFO
        assert "'scrapy_redis.scheduler.Scheduler' does not time" in said[0].getMessage()
        assert "Set SCHEDULER = 'scrapy_redis_bloom.scheduler.Scheduler'" in said[0].getMessage()
        assert "FilterBusyError" not in caplog.text  # it persists: no flush to warn of
    else:
        assert said == [], caplog.text
    scheduler.df.close("finished")


@pytest.mark.parametrize("cls", [BloomScheduler, RedisScheduler])
def test_persist_false_clears_only_when_the_last_worker_closes(
    redis_client: redis.Redis,
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
    cls: type[RedisScheduler],
) -> None:
    a, _ = redis_scheduler(crawler_for(redis_url, SCHEDULER_PERSIST=False), cls)
    b, _ = redis_scheduler(crawler_for(redis_url, SCHEDULER_PERSIST=False), cls)
    a.enqueue_request(Request("https://example.com/1"))
    with caplog.at_level(logging.INFO, logger="scrapy_redis_bloom"):
        if cls is RedisScheduler:  # it would empty the queue b crawls from: refused
            with pytest.raises(FilterBusyError, match="other workers still use it"):
                a.close("finished")
        else:
            a.close("finished")  # the filter stays for b, and so does the queue
            assert "1 other worker(s) hold a lease on them" in caplog.text
        a.df.close("finished")
    assert redis_client.exists("books:bloomfilter:meta")
    assert b.enqueue_request(Request("https://example.com/1")) is False
    assert b.next_request() is not None  # queued by a: b fetches it
    b.close("finished")  # the last worker clears
    b.df.close("finished")
    assert redis_client.keys("books:bloomfilter*") == []
    assert len(b) == 0


def test_a_crashed_worker_stops_counting_when_its_lease_expires(
    redis_client: redis.Redis, redis_url: str
) -> None:
    ttl = 1.0
    crashed, _ = redis_scheduler(crawler_for(redis_url, BLOOMFILTER_WORKER_TTL=ttl))
    crashed.enqueue_request(Request("https://example.com/1"))
    crashed.df.lease.stop()  # the process died: no more renewals, no release
    survivor, _ = redis_scheduler(crawler_for(redis_url, BLOOMFILTER_WORKER_TTL=ttl))
    assert survivor.df.lease.others() == 1
    deadline = time.monotonic() + 10 * ttl
    while survivor.df.lease.others() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert survivor.df.lease.others() == 0
    survivor.close("finished")  # SCHEDULER_PERSIST=False: the last live worker clears
    assert not redis_client.exists("books:bloomfilter:meta")


def test_a_worker_with_other_settings_is_refused(redis_url: str) -> None:
    redis_scheduler(crawler_for(redis_url))
    with pytest.raises(ConfigMismatchError, match="A filter's layout cannot change"):
        redis_scheduler(crawler_for(redis_url, BLOOMFILTER_ERROR_RATE=1e-3))


def test_scrapy_redis_set_in_the_way_is_a_clear_error(
    redis_client: redis.Redis, redis_url: str
) -> None:
    redis_client.sadd("books:bloomfilter:meta", "27adcc2e8979cdee0c9cecbbe8bf8ff51edefb61")
    with pytest.raises(WrongTypeError, match="'books:bloomfilter:meta' holds a set"):
        redis_scheduler(crawler_for(redis_url))


def test_bad_setting_fails_at_startup(redis_url: str) -> None:
    with pytest.raises(ValueError, match=r"BLOOMFILTER_HASH_NUMBER setting \(0\) is invalid"):
        redis_scheduler(crawler_for(redis_url, BLOOMFILTER_HASH_NUMBER=0, **{
            "BLOOMFILTER_CAPACITY": None, "BLOOMFILTER_ERROR_RATE": None}))  # fmt: skip
    with pytest.raises(ValueError, match=r"DUPEFILTER_DEBUG setting \('maybe'\) is invalid"):
        redis_scheduler(crawler_for(redis_url, DUPEFILTER_DEBUG="maybe"))
    with pytest.raises(
        ValueError, match=r"BLOOMFILTER_EROR_RATE is unknown.* BLOOMFILTER_ERROR_RATE\?"
    ):
        redis_scheduler(crawler_for(redis_url, BLOOMFILTER_EROR_RATE=0.01))


def test_unreachable_redis_names_host_and_port_not_password() -> None:
    from redis_server import free_port

    port = free_port()
    url = f"redis://:hunter2@127.0.0.1:{port}/0"
    with pytest.raises(
        BloomFilterError, match=rf"Redis at 127\.0\.0\.1:{port} could not .*: cannot connect"
    ) as e:
        RFPDupeFilter.from_crawler(crawler_for(url, BLOOMFILTER_RETRY_TIMEOUT=0.5))
    assert "hunter2" not in str(e.value)


def test_from_settings_needs_a_key_without_spider(redis_url: str) -> None:
    from scrapy.settings import Settings

    with pytest.raises(ValueError, match=r"uses %\(spider\)s, but no spider is known"):
        RFPDupeFilter.from_settings(Settings({"REDIS_URL": redis_url, **SMALL}))
    df = RFPDupeFilter.from_settings(
        Settings({"REDIS_URL": redis_url, "BLOOMFILTER_KEY": "shared:bf", **SMALL})
    )
    try:
        assert df.request_seen(Request("https://example.com/")) is False
        assert df.request_seen(Request("https://example.com/")) is True
    finally:
        df.close("finished")  # its lease stops renewing (it would outlive the test)


def test_with_recrawl_windows_a_worker_closing_gives_what_the_live_windows_hold(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A worker that is not the last to close estimated from the counters, which count every
    # URL ever added: "about 50 items" once the windows holding them had expired.
    settings = {"BLOOMFILTER_TTL": 1, "BLOOMFILTER_KEY": "ttl:bloomfilter"}
    first = RFPDupeFilter.from_crawler(crawler_for(redis_url, **settings))
    assert not any(first.request_seen(Request(f"https://example.com/{i}")) for i in range(50))
    time.sleep(2.2)  # both windows that held them expired (a URL is forgotten by 2x TTL)
    other = RFPDupeFilter.from_crawler(crawler_for(redis_url, **settings))  # still running
    with caplog.at_level(logging.INFO, logger="scrapy_redis_bloom"):
        first.close("finished")
    line = next(
        r.getMessage() for r in caplog.records if "false-positive rate now" in r.getMessage()
    )
    assert "about 0 items" in line, line
    assert "from the windows' headers" in line, line
    other.close("finished")


def test_a_filter_lost_in_an_outage_closes_saying_so_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Redis restarted empty under ON_ERROR = "allow": what the outage let through cannot be
    # added. The close said so, then the filter's own close raised it again out of the
    # spider_closed handler: a traceback, the clients left open, the last stats not written.
    from redis_server import RedisServer

    with RedisServer() as server:
        crawler = crawler_for(
            server.url,
            BLOOMFILTER_RETRY_TIMEOUT=0.2,
            BLOOMFILTER_CACHE_SIZE=0,
            BLOOMFILTER_ON_ERROR="allow",
        )
        df = RFPDupeFilter.from_crawler(crawler)
        assert df.request_seen(Request("https://example.com/a")) is False
        server.kill()
        assert df.request_seen(Request("https://example.com/b")) is False  # let through
        server.restart()  # without persistence: the filter is gone
        until_tried(df.bloom.executor)  # the next attempt is allowed a second after the last
        assert crawler.stats.get_value("bloomfilter/errors") is None  # (no tick yet)
        with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
            df.close("finished")
        assert "Could not add what the Bloom filter 'books:bloomfilter' let through" in caplog.text
        assert crawler.stats.get_value("bloomfilter/errors") == 1  # the close's last publish


def test_a_filter_that_cannot_answer_lets_requests_through_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from redis_server import RedisServer

    with RedisServer() as server:
        crawler = crawler_for(server.url, BLOOMFILTER_RETRY_TIMEOUT=0.2, BLOOMFILTER_CACHE_SIZE=0)
        df = RFPDupeFilter.from_crawler(crawler)
        assert df.request_seen(Request("https://example.com/a")) is False
        server.kill()
        with caplog.at_level(logging.ERROR, logger="scrapy_redis_bloom"):
            # Seen before, but the filter cannot say so: let through, never dropped.
            assert df.request_seen(Request("https://example.com/a")) is False
            assert df.request_seen(Request("https://example.com/b")) is False
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1  # said once, not per request
        assert "cannot answer, so the crawl stops (finish reason 'bloomfilter_error')" in (
            errors[0].getMessage()
        )
        assert f"Redis at 127.0.0.1:{server.port} could not check and add" in errors[0].getMessage()
        df.filter_stats.tick()  # as the stats timer does, every second
        assert crawler.stats.get_value("bloomfilter/errors") == 2
        df.close("finished")
