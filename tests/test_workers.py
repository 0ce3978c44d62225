"""Several Scrapy worker processes crawl one site through one Redis (or a cluster).

Each worker is ``crawl_runner.py --mode shared``: a scrapy-redis ``RedisSpider`` under
scrapy-redis's Scheduler, which takes the start URL from Redis, follows every link
and closes once the shared queue has been idle for a few seconds. The site's pages
link heavily to each other, so most extracted links are duplicates, as in real
crawls. The filter holds a few hundred items at a 1e-6 error rate: a false positive
(a page never fetched) has odds below 1e-3 over the whole crawl, so counts are exact.
"""

from __future__ import annotations

import ast
import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster
from shared_crawl import START_PAGES, WORKERS, run_workers
from website import Site, SiteServer

PAGES = 300


@pytest.fixture
def site() -> Iterator[SiteServer]:
    # 100 ms per page: alone, a worker would need ~7 s, longer than the 5 s an idle
    # Scrapy engine waits before polling the shared queue again.
    with SiteServer(Site(PAGES), delay=0.1) as server:
        yield server


def crawl(
    site: SiteServer,
    redis_url: str,
    tmp_path: Path,
    settings: dict[str, Any],
    filter_redis: redis.Redis | RedisCluster,
) -> list[dict[str, Any]]:
    """Run the workers to the end; return their outputs (each must have run cleanly)."""
    done = run_workers(site, redis_url, tmp_path, settings, filter_redis)
    for result in done.results:
        assert result["error"] is None, result["error"]
    assert done.registered == WORKERS, "the workers never held their leases at the same time"
    return done.results


def check_crawl(results: list[dict[str, Any]], site: SiteServer) -> dict[str, int]:
    """Assert every reachable page was fetched exactly once; return the summed stats."""
    fetched = Counter(url for r in results for url in r["fetched"])
    assert set(fetched) == site.reachable_urls()
    assert max(fetched.values()) == 1, [u for u, n in fetched.items() if n > 1]
    served = site.hits_snapshot()
    assert all(served[f"/page/{p}"] == 1 for p in site.site.reachable())  # server-side
    per_worker = [len(r["fetched"]) for r in results]
    reported = ("added", "filtered", "total_added", "total_filtered", "fill_ratio", "estimated_fpr")
    for result in results:  # every worker's stats are complete, whoever closes first
        missing = [name for name in reported if f"bloomfilter/{name}" not in result["stats"]]
        assert not missing, missing
    assert all(n > 0 for n in per_worker), f"a worker fetched nothing: {per_worker}"
    total = {
        name: sum(int(r["stats"].get(name, 0)) for r in results)
        for name in ("bloomfilter/added", "bloomfilter/filtered", "dupefilter/filtered")
    }
    offered = len(START_PAGES) + sum(r["offered"] for r in results)  # start URLs, then links
    assert total["bloomfilter/added"] == len(site.site.reachable())
    assert total["bloomfilter/filtered"] == total["dupefilter/filtered"]
    assert total["bloomfilter/added"] + total["bloomfilter/filtered"] == offered
    return total


def test_two_workers_share_one_redis(
    site: SiteServer, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    results = crawl(site, redis_url, tmp_path, {}, redis_client)
    total = check_crawl(results, site)
    # The global counters in Redis equal the sum of the workers' own stats.
    last = max(results, key=lambda r: r["stats"]["finish_time"])
    assert last["stats"]["bloomfilter/total_added"] == total["bloomfilter/added"]
    assert last["stats"]["bloomfilter/total_filtered"] == total["bloomfilter/filtered"]
    assert redis_client.exists("shared:bloomfilter:meta")
    assert redis_client.zcard("shared:bloomfilter:workers") == 0  # both left the registry


def test_two_workers_with_the_filter_on_a_cluster(
    site: SiteServer,
    redis_url: str,
    redis_client: redis.Redis,
    redis_cluster_url: str,
    redis_cluster: RedisCluster,
    tmp_path: Path,
) -> None:
    settings = {"BLOOMFILTER_REDIS_URL": redis_cluster_url, "BLOOMFILTER_REDIS_CLUSTER": True}
    results = crawl(site, redis_url, tmp_path, settings, redis_cluster)
    total = check_crawl(results, site)
    assert redis_cluster.exists("shared:bloomfilter:meta")
    assert not redis_client.exists("shared:bloomfilter:meta")  # the queue's Redis has none
    last = max(results, key=lambda r: r["stats"]["finish_time"])
    assert last["stats"]["bloomfilter/total_added"] == total["bloomfilter/added"]


def test_two_workers_with_scrapy_redis_stats_collector(
    site: SiteServer, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    settings = {"STATS_CLASS": "scrapy_redis.stats.RedisStatsCollector"}
    results = crawl(site, redis_url, tmp_path, settings, redis_client)
    # Both workers read the same shared hash: the per-worker counters add up in Redis.
    shared = {k.decode(): v.decode() for k, v in redis_client.hgetall("shared:stats").items()}
    assert int(shared["bloomfilter/added"]) == len(site.site.reachable())
    assert int(shared["bloomfilter/filtered"]) == int(shared["bloomfilter/total_filtered"])
    assert int(shared["bloomfilter/added"]) == int(shared["bloomfilter/total_added"])
    fetched = Counter(url for r in results for url in r["fetched"])
    assert set(fetched) == site.reachable_urls()
    assert max(fetched.values()) == 1


def _counted_events() -> set[str]:
    """Return the names the package counts: ``events.count("x")``, its partial, ``_report``."""
    names: set[str] = set()
    for path in (Path(__file__).resolve().parent.parent / "scrapy_redis_bloom").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func, args = node.func, node.args
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called == "partial":
                func, args = args[0], args[1:]
                called = func.attr if isinstance(func, ast.Attribute) else ""
            on = getattr(func, "value", None)
            owner = getattr(on, "attr", getattr(on, "id", ""))
            counts = (called == "count" and owner == "events") or called == "_report"
            if counts and args and isinstance(args[0], ast.Constant):
                names.add(str(args[0].value))
    return names


def test_every_count_the_package_makes_is_created_at_the_start() -> None:
    from scrapy_redis_bloom.scrapy.stats import EVENT_COUNTS

    counted = _counted_events()
    assert {"retries", "failovers", "grown", "batch_unscheduled"} <= counted  # the scan works
    assert counted == set(EVENT_COUNTS)


def test_counts_exist_from_the_start_so_a_late_worker_resets_none(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """scrapy-redis's RedisStatsCollector creates a stat by HSET 0, then HINCRBY.

    Two workers creating a count at once could lose one's increment (the test above once
    saw 232 of 300 added; one Redis restart makes every worker count its first retry at
    once). Each worker creates its counts with 0 when the spider opens, before it counts
    anything, so later increments only add.
    """
    from scrapy import Spider
    from scrapy.utils.test import get_crawler

    from scrapy_redis_bloom.scrapy.dupefilter import RFPDupeFilter
    from scrapy_redis_bloom.scrapy.stats import EVENT_COUNTS, STATS

    assert set(EVENT_COUNTS) <= set(STATS)

    class CountsSpider(Spider):
        name = "counts"

    settings = {
        "STATS_CLASS": "scrapy_redis.stats.RedisStatsCollector",
        "SCHEDULER_PERSIST": True,
        "REDIS_URL": redis_url,
        "BLOOMFILTER_CAPACITY": 10_000,
    }
    first = RFPDupeFilter.from_crawler(get_crawler(CountsSpider, settings))
    first.filter_stats.start()  # as spider_opened does
    try:
        created = redis_client.hgetall("counts:stats")
        counts = [f"bloomfilter/{name}" for name in ("added", "filtered", *EVENT_COUNTS)]
        for name in (*counts, "dupefilter/filtered"):
            assert created[name.encode()] == b"0", name
        first.filter_stats.stats.inc_value("bloomfilter/added", 5)  # (a worker's first count)
        second = RFPDupeFilter.from_crawler(get_crawler(CountsSpider, settings))
        second.filter_stats.start()  # a worker opening later adds 0, resets nothing
        second.close("finished")
        assert redis_client.hget("counts:stats", "bloomfilter/added") == b"5"
    finally:
        first.close("finished")


def test_a_stats_store_down_at_spider_open_leaves_the_timers_running(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """scrapy-redis's RedisStatsCollector on a Redis that is down: creating the counts fails.

    The failure is said (a WARNING) and counted, not raised, and the timers that write the
    stats every second run all the same, for when that Redis is back.
    """
    from redis_server import RedisServer
    from scrapy import Spider
    from scrapy.utils.test import get_crawler

    from scrapy_redis_bloom.scrapy.dupefilter import RFPDupeFilter

    class CountsSpider(Spider):
        name = "counts"

    with RedisServer() as stats_server:
        settings = {
            "STATS_CLASS": "scrapy_redis.stats.RedisStatsCollector",
            "SCHEDULER_PERSIST": True,
            "REDIS_URL": stats_server.url,  # the stats' Redis
            "BLOOMFILTER_REDIS_URL": redis_url,  # the filter's
            "BLOOMFILTER_CAPACITY": 10_000,
        }
        dupefilter = RFPDupeFilter.from_crawler(get_crawler(CountsSpider, settings))
        stats_server.stop()
        try:
            with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
                dupefilter.filter_stats.start()  # as spider_opened does
            assert "Could not write the Bloom filter 'counts:bloomfilter''s stats" in caplog.text
            assert "ConnectionError" in caplog.text
            assert dupefilter.bloom.events.counts["stats_failed"] == 1
            assert [timer.running for timer in dupefilter.filter_stats._tasks] == [True, True]
        finally:
            dupefilter.close("finished")  # its lease too: no renewal outlives the test
