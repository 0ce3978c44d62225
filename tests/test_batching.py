"""One filter round trip per crawled page: BatchingMiddleware, against real Redis and real crawls.

The engine's batch (``check_and_add_many``) must answer as ``check_and_add`` one at a
time, in one round trip; the dupefilter's ``request_seen`` must take the answers held
ahead with none; a request answered "new" that never reaches the scheduler must be
reported and answered "new" again by this worker. The crawls run ``crawl_runner.py``
(and ``shared_crawl.py`` for two workers) with the middleware enabled through
``SPIDER_MIDDLEWARES`` and compare what was fetched, and the round trips counted on
the client (``bloomfilter/round_trips``), with the same crawl without it.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
import math
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from batching_helpers import drops_links
from redis_server import RedisServer
from scrapy import Request, Spider
from scrapy.core.spidermw import SpiderMiddlewareManager
from scrapy.crawler import Crawler
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler
from shared_crawl import run_workers
from test_crawl import assert_finished, crawl
from waiting import until_tried
from website import Site, SiteServer, TreeSite

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.core.settings import BATCH_MAX, BATCH_WINDOW
from scrapy_redis_bloom.scrapy.batching import (
    BatchingMiddleware,
    later_in_chain,
    later_middlewares,
)
from scrapy_redis_bloom.scrapy.dupefilter import RFPDupeFilter

batch_max, batch_window = BATCH_MAX.read, BATCH_WINDOW.read

logger = logging.getLogger(__name__)

MIDDLEWARE = "scrapy_redis_bloom.batching.BatchingMiddleware"
START = "scrapy.spidermiddlewares.start.StartSpiderMiddleware"
BATCHING = {"SPIDER_MIDDLEWARES": {MIDDLEWARE: 0}}
SMALL = {"BLOOMFILTER_CAPACITY": 100_000, "BLOOMFILTER_ERROR_RATE": 1e-6}
PAGES = 300


def timed_trips(stats: dict[str, Any]) -> int:
    """Return the most round trips a worker makes besides its checks' (its stats at close).

    It syncs its counts at most once a second (2 trips: the record's id, then HINCRBY) and
    makes a few trips to open and close: more on a slower (loaded) crawl, for as many pages.
    """
    return 2 * math.ceil(stats["elapsed_time_seconds"]) + 10


def fingerprints(n: int, salt: str) -> list[str]:
    return [hashlib.sha1(f"{salt}{i}".encode()).hexdigest() for i in range(n)]


def make(client: redis.Redis, key: str, cache_size: int = 1000) -> RedisBloomFilter:
    bloom = RedisBloomFilter.from_config(
        client, key, BloomConfig.from_settings(SMALL), cache_size=cache_size
    )
    bloom.open()
    return bloom


def expected_pages(site: Site) -> set[int]:
    """Pages reachable from page 0 when the links of dropping pages are dropped."""
    seen, todo = {0}, [0]
    while todo:
        page = todo.pop()
        if drops_links(page):
            continue
        for target in site.links(page):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


# -- the engine's batch --------------------------------------------------------------


@pytest.mark.parametrize("cache_size", [0, 1000])
def test_a_batch_answers_as_one_at_a_time_in_one_round_trip(
    redis_client: redis.Redis, cache_size: int
) -> None:
    batch = make(redis_client, "batch", cache_size)
    single = make(redis_client, "single", cache_size)
    first = fingerprints(50, "a")
    for bloom in (batch, single):  # both hold the first 50, nothing else
        bloom.add_many(first)
    # Known, new, repeated within the batch, in any order.
    elements = [*first[:10], *fingerprints(40, "b"), *first[5:15], *fingerprints(40, "b")[:5]]
    batch.sync_counters()  # no counter sync falls due while measuring
    before = batch.round_trips
    answers = batch.check_and_add_many(elements)
    trips = batch.round_trips - before
    assert answers == [single.check_and_add(e) for e in elements]
    assert answers.count(False) == 40
    assert trips == 1  # one server: one pipelined exchange
    assert batch.counters.added == single.counters.added
    assert batch.counters.seen == single.counters.seen


def test_a_batch_on_a_server_without_the_script_loads_it_once_and_resends_together(
    redis_client: redis.Redis,
) -> None:
    # A window of 1,000 items (one shard) filled to 980, in the last items before it grows:
    # every check of this filter is an EVALSHA.
    config = BloomConfig.from_settings(
        {**SMALL, "BLOOMFILTER_CAPACITY": 1000, "BLOOMFILTER_SHARDS": 1, "BLOOMFILTER_TTL": 3600}
    )
    bloom, single = (
        RedisBloomFilter.from_config(redis_client, key, config, cache_size=0)
        for key in ("noscript", "noscript-single")
    )
    for each in (bloom, single):
        each.open()
    assert bloom._fast is None
    elements = fingerprints(20, "s")
    for each in (bloom, single):
        each.add_many(fingerprints(975, "filler"))
        each.add_many(elements[:5])
    assert bloom.check_and_add(elements[0]) is True  # it reads the window's count
    bloom.sync_counters()
    redis_client.script_flush()  # as after a restart: every EVALSHA answers NOSCRIPT
    before = bloom.round_trips
    answers = bloom.check_and_add_many(elements)
    # The batch, one SCRIPT LOAD, the batch again: not one trip per element.
    assert bloom.round_trips - before == 3
    assert answers == [True] * 5 + [False] * 15
    assert answers == [single.check_and_add(e) for e in elements]
    assert bloom.events.counts["ambiguous"] == 0  # NOSCRIPT: the calls did not run


def test_repeats_are_answered_by_the_near_cache_with_no_round_trip(
    redis_client: redis.Redis,
) -> None:
    bloom = make(redis_client, "near")
    elements = fingerprints(30, "n")
    bloom.sync_counters()
    assert bloom.check_and_add_many([*elements, *elements]) == [False] * 30 + [True] * 30
    trips, hits = bloom.round_trips, bloom.cache_hits
    assert hits == 30  # the repeats within the batch
    assert bloom.check_and_add_many(elements[::-1]) == [True] * 30  # across batches
    assert bloom.round_trips == trips
    assert bloom.cache_hits == hits + 30
    # Part known, part new: only the new ones travel, still in one trip.
    assert bloom.check_and_add_many([*elements[:5], "f" * 40]) == [True] * 5 + [False]
    assert bloom.round_trips == trips + 1


@pytest.mark.parametrize("where", ["servers", "cluster"])
def test_a_batch_costs_one_round_trip_per_server(
    where: str, request: pytest.FixtureRequest
) -> None:
    client = request.getfixturevalue("clients" if where == "servers" else "redis_cluster")
    config = BloomConfig.from_settings({**SMALL, "BLOOMFILTER_SHARDS": 12})
    batch = RedisBloomFilter.from_config(client, "spread", config, cache_size=100)
    single = RedisBloomFilter.from_config(client, "spread1", config, cache_size=100)
    elements = [*fingerprints(300, "s"), *fingerprints(100, "s")]
    single.add_many(elements[:50])
    batch.add_many(elements[:50])
    batch.sync_counters()
    before = batch.round_trips
    answers = batch.check_and_add_many(elements)
    assert answers == [single.check_and_add(e) for e in elements]
    # Three servers, or three cluster masters; this worker's first batch of more than
    # STATE_EVERY elements a shard reads the shards' counts first (one trip each).
    assert batch.round_trips - before == 3 + 3
    before = batch.round_trips
    more = fingerprints(400, "more")
    assert batch.check_and_add_many(more) == [single.check_and_add(e) for e in more]
    assert batch.round_trips - before == 3  # from then on, one per server
    batch.close()
    single.close()


def test_a_batch_redis_cannot_take_under_allow_answers_new_and_is_added_later() -> None:
    with RedisServer(appendonly=True) as server:
        client = server.client()
        config = BloomConfig.from_settings(
            {**SMALL, "BLOOMFILTER_ON_ERROR": "allow", "BLOOMFILTER_RETRY_TIMEOUT": 0.5}
        )
        bloom = RedisBloomFilter.from_config(client, "allow", config, faults=config.faults)
        bloom.open()
        elements = fingerprints(20, "allow")
        server.kill()
        assert bloom.check_and_add_many(elements) == [False] * 20  # a doubt: new
        assert bloom.events.counts["errors"] == 20
        # Let through by this worker: a second offer is a duplicate, with no trip.
        trips = bloom.round_trips
        assert bloom.check_and_add_many(elements) == [True] * 20
        assert bloom.round_trips == trips
        server.restart()
        until_tried(bloom.executor)  # the next attempt is allowed a second after the last one
        assert bloom.check_and_add_many(["e" * 40]) == [False]
        # Redis answers again: what was let through is added for every worker.
        other = RedisBloomFilter.from_config(client, "allow", config)
        assert other.contains_many(elements) == [True] * 20
        for made in (bloom, other):
            made.close()
        client.close()


def test_round_trips_count_each_exchange_once(redis_client: redis.Redis) -> None:
    bloom = make(redis_client, "trips", cache_size=0)
    bloom.check_and_add("0" * 40)  # the script is loaded now
    bloom.sync_counters()
    before = bloom.round_trips
    for element in fingerprints(5, "t"):
        bloom.check_and_add(element)
    assert bloom.round_trips - before == 5
    bloom.check_and_add_many(fingerprints(500, "u"))
    assert bloom.round_trips - before == 7  # the shards' counts (first batch), the batch
    bloom.check_and_add_many(fingerprints(500, "v"))
    assert bloom.round_trips - before == 8


# -- the dupefilter: answers held ahead ------------------------------------------------


class BooksSpider(Spider):
    name = "books"


@pytest.fixture
def crawler(redis_url: str) -> Crawler:
    return get_crawler(
        BooksSpider,
        {
            "REDIS_URL": redis_url,
            "DUPEFILTER_CLASS": "scrapy_redis_bloom.dupefilter.RFPDupeFilter",
            **SMALL,
        },
    )


@pytest.fixture
def dupefilter(crawler: Crawler) -> Iterator[RFPDupeFilter]:
    df = RFPDupeFilter.from_crawler(crawler)
    yield df
    df.close()


def stat(crawler: Crawler, name: str) -> Any:
    """Return a stat as the stats timer writes it (it copies the engine's counts)."""
    assert crawler.stats is not None
    dupefilter = RFPDupeFilter.for_crawler(crawler)
    if dupefilter is not None:
        dupefilter.filter_stats.publish(counts_only=True)  # the timer's copy
    return crawler.stats.get_value(name)


@pytest.mark.parametrize("enabled", [False, True])
def test_batch_settings_without_the_middleware_are_said(
    redis_url: str, caplog: pytest.LogCaptureFixture, enabled: bool
) -> None:
    # BLOOMFILTER_BATCH_WINDOW / _MAX set, the middleware not: every request went alone,
    # and nothing said the settings were not applied.
    middlewares = {"scrapy_redis_bloom.batching.BatchingMiddleware": 0} if enabled else {}
    settings = {"BLOOMFILTER_BATCH_WINDOW": 0.05, "BLOOMFILTER_BATCH_MAX": 50}
    crawler = get_crawler(
        BooksSpider,
        {
            "REDIS_URL": redis_url,
            "DUPEFILTER_CLASS": "scrapy_redis_bloom.dupefilter.RFPDupeFilter",
            "SPIDER_MIDDLEWARES": middlewares,
            **SMALL,
            **settings,
        },
    )
    with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
        RFPDupeFilter.from_crawler(crawler).close()
    said = [r.getMessage() for r in caplog.records if "BatchingMiddleware" in r.getMessage()]
    if enabled:
        assert said == []
    else:
        assert len(said) == 1, said
        assert "BLOOMFILTER_BATCH_MAX and BLOOMFILTER_BATCH_WINDOW are set" in said[0]
        assert "BLOOMFILTER_ADDON_BATCHING = True" in said[0]


def test_request_seen_takes_the_answers_held_ahead(
    dupefilter: RFPDupeFilter, crawler: Crawler
) -> None:
    assert RFPDupeFilter.for_crawler(crawler) is dupefilter
    old = Request("https://example.com/old")
    assert not dupefilter.request_seen(old)
    links = [
        Request("https://example.com/old"),
        Request("https://example.com/a"),
        Request("https://example.com/b"),
        Request("https://example.com/a"),  # the same link twice in one response
        Request("https://example.com/c", dont_filter=True),
    ]
    dupefilter.bloom.sync_counters()
    before = dupefilter.bloom.round_trips
    assert dupefilter.check_batch(links) == 4  # dont_filter left alone
    assert dupefilter.bloom.round_trips == before + 1
    assert [dupefilter.request_seen(r) for r in links[:4]] == [True, False, False, True]
    assert dupefilter.bloom.round_trips == before + 1  # request_seen asked Redis nothing
    assert len(dupefilter.reservations) == 0
    # A later response offering the same links: the near-cache answers, no trip.
    again = [Request("https://example.com/a"), Request("https://example.com/b")]
    dupefilter.check_batch(again)
    assert [dupefilter.request_seen(r) for r in again] == [True, True]
    assert dupefilter.bloom.round_trips == before + 1


def test_repeats_in_a_batch_count_in_the_filters_totals(
    dupefilter: RFPDupeFilter, crawler: Crawler
) -> None:
    # A page linking a URL twice puts it in one batch twice: the batch checks it once, and
    # the second request took "seen" without reaching the counters, so that
    # bloomfilter/total_filtered (1,780) fell short of the workers' filtered (1,798).
    spider = BooksSpider.from_crawler(crawler)
    old = Request("https://example.com/old")
    assert not dupefilter.request_seen(old)
    links = [Request(f"https://example.com/{path}") for path in ("a", "old", "a", "old", "a")]
    dupefilter.check_batch(links)
    # Before the batch's requests: one with a fingerprint held, not in the batch itself.
    late = Request("https://example.com/a")
    dupefilter.check_batch([late])
    answers = [dupefilter.request_seen(r) for r in [late, *links]]
    assert answers == [False, True, True, True, True, True]
    for request, seen in zip([late, *links], answers, strict=True):
        if seen:
            dupefilter.log(request, spider)  # as the scheduler does
    dupefilter.close()
    assert crawler.stats is not None
    stats = crawler.stats.get_stats()
    assert stats["bloomfilter/filtered"] == 5
    assert stats["bloomfilter/total_filtered"] == 5
    assert stats["bloomfilter/total_added"] == stats["bloomfilter/added"] == 2


def test_a_request_dropped_by_a_request_scheduled_handler_is_reported(
    dupefilter: RFPDupeFilter, crawler: Crawler, caplog: pytest.LogCaptureFixture
) -> None:
    dropped, other = Request("https://example.com/x"), Request("https://example.com/y")
    dupefilter.check_batch([dropped, other])
    # The engine calls the request_scheduled handlers, then (unless one raised
    # IgnoreRequest) the scheduler's request_seen for the same request.
    dupefilter.reservations.scheduled(dropped)
    assert stat(crawler, "bloomfilter/batch_unscheduled") is None
    dupefilter.reservations.scheduled(other)  # not request_seen(dropped): it was dropped
    assert stat(crawler, "bloomfilter/batch_unscheduled") == 1
    assert "never reached the scheduler (e.g. https://example.com/x)" in caplog.text
    assert not dupefilter.request_seen(other)
    # Found again elsewhere: this worker answers "new" once, then "seen" as usual.
    assert not dupefilter.request_seen(Request("https://example.com/x"))
    assert dupefilter.request_seen(Request("https://example.com/x"))


def test_a_request_collected_before_request_seen_is_reported(
    dupefilter: RFPDupeFilter, crawler: Crawler
) -> None:
    kept = Request("https://example.com/kept")
    dupefilter.check_batch([Request("https://example.com/lost"), kept])
    gc.collect()  # the first request is gone, its answer not taken
    assert not dupefilter.request_seen(kept)
    assert stat(crawler, "bloomfilter/batch_unscheduled") == 1
    assert not dupefilter.request_seen(Request("https://example.com/lost"))


def test_an_answer_not_taken_when_the_crawl_ends_is_reported(
    dupefilter: RFPDupeFilter, crawler: Crawler
) -> None:
    pending = [Request("https://example.com/p1"), Request("https://example.com/p2")]
    dupefilter.check_batch(pending)
    assert dupefilter.request_seen(pending[0]) is False
    dupefilter.close()
    assert stat(crawler, "bloomfilter/batch_unscheduled") == 1
    assert stat(crawler, "bloomfilter/round_trips") > 0


def test_a_failed_batch_answers_new_and_stops_the_crawl(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with RedisServer() as server:
        crawler = get_crawler(
            BooksSpider,
            {
                "REDIS_URL": server.url,
                "DUPEFILTER_CLASS": "scrapy_redis_bloom.dupefilter.RFPDupeFilter",
                "BLOOMFILTER_RETRY_TIMEOUT": 0.5,
                **SMALL,
            },
        )
        df = RFPDupeFilter.from_crawler(crawler)
        try:
            server.stop()
            links = [Request("https://example.com/f1"), Request("https://example.com/f2")]
            assert df.check_batch(links) == 2
            assert stat(crawler, "bloomfilter/batch_failed") == 1
            assert stat(crawler, "bloomfilter/errors") == 2
            # As request_seen under ON_ERROR = "raise": said once, the crawl stops, and
            # the requests go to the scheduler (the batch may have set their bits).
            assert caplog.text.count("cannot answer, so the crawl stops") == 1
            trips = df.bloom.round_trips
            assert [df.request_seen(r) for r in links] == [False, False]
            assert df.bloom.round_trips == trips
        finally:
            df.lease.stop()
            df.bloom.close()


# -- the middleware ---------------------------------------------------------------------


def test_items_pass_at_once_and_requests_after_the_output_ends(
    dupefilter: RFPDupeFilter, crawler: Crawler
) -> None:
    middleware = BatchingMiddleware.from_crawler(crawler)
    pulled: list[str] = []  # what the callback yielded so far, when each output came out
    events: list[tuple[str, int]] = []

    async def callback() -> AsyncIterator[Any]:
        for output in [
            {"item": 1},
            Request("https://example.com/r1"),
            {"item": 2},
            Request("https://example.com/r2", dont_filter=True),
            Request("https://example.com/r1"),
        ]:
            pulled.append(repr(output))
            yield output

    async def run() -> None:
        response = HtmlResponse("https://example.com/", body=b"")
        async for output in middleware.process_spider_output(response, callback()):
            if not isinstance(output, Request):
                kind = "item"
            else:
                kind = "free" if output.dont_filter else "request"
            events.append((kind, len(pulled)))

    asyncio.run(run())
    # Items and dont_filter requests come out as soon as they are yielded; the other
    # requests once the callback is done, checked together.
    assert events == [("item", 1), ("item", 3), ("free", 4), ("request", 5), ("request", 5)]
    assert dupefilter.filter_stats.batches == 1
    assert dupefilter.filter_stats.batched == 2


def test_a_callback_that_fails_still_sends_what_it_yielded(
    dupefilter: RFPDupeFilter, crawler: Crawler
) -> None:
    middleware = BatchingMiddleware.from_crawler(crawler)
    received: list[Any] = []

    async def callback() -> AsyncIterator[Any]:
        yield Request("https://example.com/before")
        raise ValueError("the callback broke")

    async def run() -> None:
        response = HtmlResponse("https://example.com/", body=b"")
        async for output in middleware.process_spider_output(response, callback()):
            received.append(output)

    with pytest.raises(ValueError, match="the callback broke"):
        asyncio.run(run())
    assert [r.url for r in received] == ["https://example.com/before"]
    assert dupefilter.request_seen(received[0]) is False  # checked ahead, then taken
    assert dupefilter.filter_stats.batches == 1


def test_a_window_checks_the_requests_of_several_responses_together(
    dupefilter: RFPDupeFilter, crawler: Crawler
) -> None:
    middleware = BatchingMiddleware.from_crawler(crawler)
    middleware.window = 0.5
    resumed: list[tuple[str, float]] = []

    async def callback(page: str, links: int) -> AsyncIterator[Any]:
        for i in range(links):
            yield Request(f"https://example.com/{page}/{i}")
        yield Request("https://example.com/shared")  # a link both pages carry

    async def respond(page: str, links: int, delay: float) -> list[Request]:
        await asyncio.sleep(delay)
        response = HtmlResponse(f"https://example.com/{page}", body=b"")
        out = [r async for r in middleware.process_spider_output(response, callback(page, links))]
        resumed.append((page, time.monotonic()))
        return out

    async def run() -> tuple[list[Request], list[Request]]:
        return await asyncio.gather(respond("a", 3, 0.0), respond("b", 2, 0.05))

    started = time.monotonic()
    first, second = asyncio.run(run())
    # One check for both responses, when the window the first one opened closed.
    assert (dupefilter.filter_stats.batches, dupefilter.filter_stats.batched) == (1, 7)
    assert all(0.49 <= at - started < 2.0 for _, at in resumed)
    assert [r.url.rsplit("/", 2)[-2:] for r in first][-1] == ["example.com", "shared"]
    # Each answer is taken once: the shared link is new for the first taker only.
    answers = [dupefilter.request_seen(r) for r in [*first, *second]]
    assert answers == [False] * 4 + [False, False, True]


def test_a_full_window_closes_before_its_time(dupefilter: RFPDupeFilter, crawler: Crawler) -> None:
    middleware = BatchingMiddleware.from_crawler(crawler)
    middleware.window, middleware.limit = 5.0, 4

    async def callback(page: str) -> AsyncIterator[Any]:
        for i in range(2):
            yield Request(f"https://example.com/{page}/{i}")

    async def respond(page: str) -> list[Request]:
        response = HtmlResponse(f"https://example.com/{page}", body=b"")
        return [r async for r in middleware.process_spider_output(response, callback(page))]

    async def run() -> list[list[Request]]:
        return list(await asyncio.gather(respond("a"), respond("b")))

    started = time.monotonic()
    outputs = asyncio.run(run())
    assert time.monotonic() - started < 2.0  # the fourth request closed it, not the 5 s
    assert [len(out) for out in outputs] == [2, 2]
    assert (dupefilter.filter_stats.batches, dupefilter.filter_stats.batched) == (1, 4)


def test_without_an_asyncio_loop_the_window_is_off_and_said(
    dupefilter: RFPDupeFilter, crawler: Crawler, caplog: pytest.LogCaptureFixture
) -> None:
    from twisted.internet.defer import Deferred

    middleware = BatchingMiddleware.from_crawler(crawler)
    middleware.window = 0.05

    async def callback() -> AsyncIterator[Any]:
        yield Request("https://example.com/a")

    async def collect() -> list[Any]:
        response = HtmlResponse("https://example.com/", body=b"")
        return [r async for r in middleware.process_spider_output(response, callback())]

    # Twisted drives the coroutine, as under a reactor other than asyncio's: no loop runs.
    got: list[list[Any]] = []
    Deferred.fromCoroutine(collect()).addCallback(got.append)
    assert [r.url for r in got[0]] == ["https://example.com/a"]
    assert middleware.window == 0.0
    assert dupefilter.filter_stats.batches == 1  # checked alone, at once
    assert "BLOOMFILTER_BATCH_WINDOW is ignored" in caplog.text


# -- the middleware's settings and position ----------------------------------------------


def test_batch_max_is_checked() -> None:
    assert batch_max(get_crawler(settings_dict={}).settings) == 1000
    assert batch_max(get_crawler(settings_dict={"BLOOMFILTER_BATCH_MAX": "50"}).settings) == 50
    for bad in (0, -1, "x", 1.5, True):
        settings = get_crawler(settings_dict={"BLOOMFILTER_BATCH_MAX": bad}).settings
        with pytest.raises(ValueError, match=r"BLOOMFILTER_BATCH_MAX setting \("):
            batch_max(settings)


@pytest.mark.parametrize("value", [-0.1, 11, "soon", float("nan"), True, "inf"])
def test_batch_window_is_checked(value: Any) -> None:
    assert batch_window(get_crawler(settings_dict={}).settings) == 0.0
    assert (
        batch_window(get_crawler(settings_dict={"BLOOMFILTER_BATCH_WINDOW": "0.05"}).settings)
        == 0.05
    )
    settings = get_crawler(settings_dict={"BLOOMFILTER_BATCH_WINDOW": value}).settings
    with pytest.raises(ValueError, match=r"BLOOMFILTER_BATCH_WINDOW setting \(.*\) is invalid"):
        batch_window(settings)


def test_later_middlewares_are_named() -> None:
    def later(middlewares: dict[str, int | None]) -> list[str]:
        settings = get_crawler(settings_dict={"SPIDER_MIDDLEWARES": middlewares}).settings
        return later_middlewares(settings, BatchingMiddleware)

    assert later({MIDDLEWARE: 0}) == []
    # Scrapy's StartSpiderMiddleware (25) processes the output: ours must come below.
    assert later({MIDDLEWARE: 30}) == [f"{START} (order 25)"]
    no_start: dict[str, int | None] = {START: None}
    assert later({MIDDLEWARE: 750, **no_start}) == [
        "scrapy.spidermiddlewares.referer.RefererMiddleware (order 700)"
    ]
    assert later({MIDDLEWARE: 20, "batching_helpers.DropLinksMiddleware": 20}) == [
        "batching_helpers.DropLinksMiddleware (order 20)"
    ]
    # HttpErrorMiddleware (50) has no process_spider_output: it cannot drop output.
    assert later({MIDDLEWARE: 49, **no_start}) == []


def test_the_running_chain_is_checked_too() -> None:
    settings = {
        "DUPEFILTER_CLASS": "scrapy_redis_bloom.dupefilter.RFPDupeFilter",
        "SPIDER_MIDDLEWARES": {MIDDLEWARE: 0, "batching_helpers.DropLinksMiddleware": -10},
    }
    manager = SpiderMiddlewareManager.from_crawler(get_crawler(settings_dict=settings))
    ours = next(m for m in manager.middlewares if isinstance(m, BatchingMiddleware))
    chain = list(manager.methods["process_spider_output"])
    assert later_in_chain(chain, ours) == ["batching_helpers.DropLinksMiddleware"]
    assert ours.disabled is not None  # the settings said so already
    settings["SPIDER_MIDDLEWARES"] = {MIDDLEWARE: 0}
    manager = SpiderMiddlewareManager.from_crawler(get_crawler(settings_dict=settings))
    ours = next(m for m in manager.middlewares if isinstance(m, BatchingMiddleware))
    assert later_in_chain(list(manager.methods["process_spider_output"]), ours) == []
    assert ours.disabled is None


def test_another_dupefilter_turns_the_middleware_off(caplog: pytest.LogCaptureFixture) -> None:
    from scrapy.exceptions import NotConfigured

    caplog.set_level(logging.INFO)
    with pytest.raises(NotConfigured):
        BatchingMiddleware.from_crawler(get_crawler(settings_dict={}))
    assert "BatchingMiddleware is off" in caplog.text


# -- crawls ---------------------------------------------------------------------------


@pytest.fixture
def site_server() -> Iterator[SiteServer]:
    with SiteServer(Site(PAGES)) as server:
        yield server


def assert_each_once(fetched: list[str], urls: set[str]) -> None:
    assert len(fetched) == len(set(fetched)), "a page was fetched twice"
    assert set(fetched) == urls


@pytest.mark.timeout(180)
@pytest.mark.parametrize("scheduler", ["scrapy-redis", "default"])
def test_a_batched_crawl_fetches_the_same_pages_in_at_most_one_trip_per_page(
    scheduler: str,
    site_server: SiteServer,
    redis_url: str,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    plain = crawl(site_server, redis_url, tmp_path, mode="follow", scheduler=scheduler)
    redis_client.flushdb()
    batched = crawl(
        site_server, redis_url, tmp_path, mode="follow", scheduler=scheduler, settings=BATCHING
    )
    for result in (plain, batched):
        assert_finished(result)
        assert_each_once(result.fetched, site_server.reachable_urls())
    # The same counts: request_seen still counts and logs every duplicate.
    for name in ("bloomfilter/added", "bloomfilter/filtered", "dupefilter/filtered"):
        assert batched.stats[name] == plain.stats[name], name
    # Redis's totals count every duplicate, those a page links twice (one batch) too.
    for result in (plain, batched):
        assert result.stats["bloomfilter/total_filtered"] == result.stats["bloomfilter/filtered"]
    pages = batched.stats["response_received_count"]
    trips = batched.stats["bloomfilter/round_trips"]
    before = plain.stats["bloomfilter/round_trips"]
    logger.warning(
        "%s: %d pages, round trips %d without batching (%.2f/page), %d with (%.2f/page)",
        scheduler,
        pages,
        before,
        before / pages,
        trips,
        trips / pages,
    )
    assert trips <= pages + timed_trips(batched.stats)
    assert trips < before
    assert batched.stats["bloomfilter/batches"] > 0
    assert batched.stats["bloomfilter/batch_unscheduled"] == 0
    assert "bloomfilter/batching_disabled" not in batched.stats


@pytest.mark.timeout(180)
def test_a_window_fetches_the_same_pages_in_fewer_round_trips(
    site_server: SiteServer, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    per_page = crawl(site_server, redis_url, tmp_path, mode="follow", settings=BATCHING)
    redis_client.flushdb()
    windowed = crawl(
        site_server,
        redis_url,
        tmp_path,
        mode="follow",
        settings={**BATCHING, "BLOOMFILTER_BATCH_WINDOW": 0.05},
    )
    for result in (per_page, windowed):
        assert_finished(result)
        assert_each_once(result.fetched, site_server.reachable_urls())
    for name in ("bloomfilter/added", "bloomfilter/filtered", "dupefilter/filtered"):
        assert windowed.stats[name] == per_page.stats[name], name
    trips = [r.stats["bloomfilter/round_trips"] for r in (per_page, windowed)]
    batches = [r.stats["bloomfilter/batches"] for r in (per_page, windowed)]
    logger.warning("round trips %s, batches %s: per response, then a 50 ms window", trips, batches)
    assert batches[1] < batches[0]
    assert trips[1] < trips[0]
    assert windowed.stats["bloomfilter/batch_unscheduled"] == 0


@pytest.mark.timeout(120)
def test_at_most_batch_max_requests_are_held(
    site_server: SiteServer, redis_url: str, tmp_path: Path
) -> None:
    settings = {**BATCHING, "BLOOMFILTER_BATCH_MAX": 2}
    result = crawl(site_server, redis_url, tmp_path, mode="follow", settings=settings)
    assert_finished(result)
    assert_each_once(result.fetched, site_server.reachable_urls())
    # Each page yields up to 10 links: checked 2 at a time.
    assert result.stats["bloomfilter/batches"] >= result.stats["bloomfilter/batched"] // 2


@pytest.mark.timeout(120)
def test_a_middleware_that_drops_links_after_ours_turns_batching_off(
    site_server: SiteServer, redis_url: str, tmp_path: Path
) -> None:
    settings = {"SPIDER_MIDDLEWARES": {MIDDLEWARE: 0, "batching_helpers.DropLinksMiddleware": -10}}
    result = crawl(site_server, redis_url, tmp_path, mode="follow", settings=settings)
    expected = {site_server.page_url(p) for p in expected_pages(site_server.site)}
    assert len(expected) < PAGES  # some pages were only linked from dropping pages
    assert_each_once(result.fetched, expected)  # the others, reached from elsewhere
    assert result.stats["bloomfilter/batching_disabled"] == 1
    assert result.stats["bloomfilter/batches"] == 0
    warned = [line for line in result.log.splitlines() if "does not batch" in line]
    assert warned
    assert "WARNING" in warned[0]
    assert "batching_helpers.DropLinksMiddleware (order -10)" in warned[0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "reactor",
    [
        None,  # asyncio: Scrapy queues outputs, the generator runs ahead of the scheduler
        "twisted.internet.epollreactor.EPollReactor",  # each output scheduled in turn
    ],
)
def test_links_dropped_by_a_request_scheduled_handler_are_crawled_when_found_elsewhere(
    site_server: SiteServer, redis_url: str, tmp_path: Path, reactor: str | None
) -> None:
    settings: dict[str, Any] = {
        **BATCHING,
        "EXTENSIONS": {"batching_helpers.DropScheduledExtension": 0},
    }
    if reactor:
        settings["TWISTED_REACTOR"] = reactor
    result = crawl(site_server, redis_url, tmp_path, mode="follow", settings=settings)
    expected = {site_server.page_url(p) for p in expected_pages(site_server.site)}
    assert_each_once(result.fetched, expected)
    stats = result.stats
    assert stats["bloomfilter/batches"] > 0
    # Each link answered "new" and then dropped is told: the stat and a warning.
    assert stats["bloomfilter/batch_unscheduled"] > 0
    assert "never reached the scheduler" in result.log
    assert stats["test/dropped_scheduled"] >= stats["bloomfilter/batch_unscheduled"]


@pytest.fixture
def shared_site() -> Iterator[SiteServer]:
    with SiteServer(Site(PAGES), delay=0.1) as server:
        yield server


@pytest.mark.timeout(180)
def test_two_batching_workers_fetch_every_page_once(
    shared_site: SiteServer, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    (tmp_path / "plain").mkdir()
    plain = run_workers(shared_site, redis_url, tmp_path / "plain", {}, redis_client)
    redis_client.flushdb()
    done = run_workers(shared_site, redis_url, tmp_path, BATCHING, redis_client)
    assert done.registered == 2
    for result in done.results:
        assert result["error"] is None, result["error"]
        assert result["stats"]["bloomfilter/batches"] > 0
    assert done.lost(shared_site) == set()
    assert done.duplicates() == 0
    assert done.stat("bloomfilter/added") == len(shared_site.site.reachable())
    pages = done.stat("response_received_count")
    trips = done.stat("bloomfilter/round_trips")
    before = plain.stat("bloomfilter/round_trips")
    logger.warning(
        "two workers: %d pages, round trips %d without batching (%.2f/page), %d with (%.2f/page)",
        pages,
        before,
        before / plain.stat("response_received_count"),
        trips,
        trips / pages,
    )
    assert trips <= pages + sum(timed_trips(r["stats"]) for r in done.results)
    assert trips < before


@pytest.mark.timeout(180)
@pytest.mark.parametrize("window", [0, 0.05], ids=["per-response", "window"])
def test_redis_killed_during_batched_crawl_under_allow_loses_no_page(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path, window: float
) -> None:
    with SiteServer(TreeSite(400), delay=0.03) as site, RedisServer(appendonly=True) as bloom:
        admin = bloom.client()

        def restart() -> None:
            time.sleep(1.0)
            bloom.kill()
            time.sleep(3.0)
            bloom.restart()

        settings = {
            **BATCHING,
            "BLOOMFILTER_BATCH_WINDOW": window,
            "BLOOMFILTER_REDIS_URL": bloom.url,
            "BLOOMFILTER_ON_ERROR": "allow",
            "BLOOMFILTER_RETRY_TIMEOUT": 1,
            **SMALL,
        }
        done = run_workers(site, redis_url, tmp_path, settings, admin, during=restart)
        admin.close()
        lost = done.lost(site)
    for result in done.results:
        assert result["error"] is None, result["error"]
        assert result["stats"]["finish_reason"] == "finished"
    assert lost == set()
    assert done.stat("bloomfilter/errors") > 0  # the batches did meet the outage
    assert done.stat("bloomfilter/batches") > 0
