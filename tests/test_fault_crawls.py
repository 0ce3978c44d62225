"""Crawls through real faults: two workers, a site that counts every lost page.

The site is a :class:`website.TreeSite`: every page is linked from exactly one other,
so a link the dupefilter wrongly drops loses a page for good. The workers run
scrapy-redis's Scheduler with its queue on one Redis and the filter on another (or on
a cluster), and the fault hits the filter's Redis while they crawl: killed and
restarted from its AOF, a cluster master killed and its replica promoted, memory
full, keys evicted, a filter past its capacity. Each test checks what the README's
fault table says: pages lost, duplicate fetches, and the stat or message that tells.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis_cluster import RedisClusterNodes
from redis_server import RedisServer, slow_loading, slow_loading_binary
from shared_crawl import Crawl, run_workers
from website import SiteServer, TreeSite

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter

PAGES = 400


@pytest.fixture
def site() -> Iterator[SiteServer]:
    # 30 ms per page: the crawl lasts a few seconds, so the fault lands in the middle.
    with SiteServer(TreeSite(PAGES), delay=0.03) as server:
        yield server


def filter_settings(url: str, **more: Any) -> dict[str, Any]:
    return {
        "BLOOMFILTER_REDIS_URL": url,
        "BLOOMFILTER_CAPACITY": 100_000,
        "BLOOMFILTER_ERROR_RATE": 1e-6,
        **more,
    }


def assert_clean(done: Crawl) -> None:
    """Every worker finished normally: no error reached Scrapy."""
    for result in done.results:
        assert result["error"] is None, result["error"]
        assert result["stats"]["finish_reason"] == "finished"
        assert result["stats"].get("log_count/ERROR", 0) == 0


#: States a crawl reaches past a fresh filter: grown (two generations before the crawl
#: starts, more during it), and grown inside a re-crawl window. Their checks take the
#: scriptless reads-then-add path (engine/bitmap/stackpath.py), not the fresh BITFIELD.
GROWN = {"BLOOMFILTER_CAPACITY": 60}
STATES = {"fresh": {}, "grown": GROWN, "grown in a window": {**GROWN, "BLOOMFILTER_TTL": 3600}}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("state", list(STATES))
def test_filter_redis_killed_and_restarted_with_aof(
    site: SiteServer, redis_url: str, redis_client: redis.Redis, tmp_path: Path, state: str
) -> None:
    with RedisServer(appendonly=True) as bloom_redis:
        admin = bloom_redis.client()
        settings = filter_settings(bloom_redis.url, **STATES[state])
        if state != "fresh":  # grown before the workers open it: 200 items at capacity 60
            bloom = RedisBloomFilter.from_config(
                admin, "shared:bloomfilter", BloomConfig.from_settings(settings)
            )
            bloom.add_many([f"before-the-crawl-{i}" for i in range(200)])
            assert bloom.generations >= 2
            bloom.close()

        def restart() -> None:
            time.sleep(1.0)
            bloom_redis.kill()
            time.sleep(3.0)
            bloom_redis.restart()

        done = run_workers(site, redis_url, tmp_path, settings, admin, during=restart)
        admin.close()
    assert_clean(done)
    assert done.lost(site) == set()
    assert done.stat("bloomfilter/retries") > 0  # the workers did meet the outage
    if state != "fresh":  # the crawl's adds went on growing it, across the restart
        assert min(r["stats"]["bloomfilter/generations"] for r in done.results) >= 3
    # A duplicate fetch needs a doubt answered "new": at most one per ambiguous answer.
    assert done.duplicates() <= done.stat("bloomfilter/ambiguous")


@pytest.mark.timeout(180)
def test_cluster_master_killed_and_replica_promoted(
    site: SiteServer,
    redis_url: str,
    redis_client: redis.Redis,
    redis_cluster_replicas: RedisClusterNodes,
    tmp_path: Path,
) -> None:
    nodes = redis_cluster_replicas
    nodes.wait_until_consistent(timeout=20)
    nodes.flushall()
    cluster = nodes.client()
    victim = nodes.masters()[0]

    def failover() -> None:
        time.sleep(1.0)
        nodes.kill_node(victim)
        nodes.wait_for_failover(victim)

    settings = {**filter_settings(nodes.startup_url), "BLOOMFILTER_REDIS_CLUSTER": True}
    try:
        done = run_workers(site, redis_url, tmp_path, settings, cluster, during=failover)
    finally:
        nodes.restart_node(victim)
        cluster.close()
    assert_clean(done)
    assert done.lost(site) == set()
    assert done.stat("bloomfilter/retries") > 0
    # Writes the killed master took but had not yet replicated are forgotten: the URLs
    # may be fetched again, never dropped. A handful at most in a crawl this size.
    assert done.duplicates() <= PAGES // 10


#: BatchingMiddleware checking the links of several responses together (a 50 ms window).
WINDOWED = {
    "SPIDER_MIDDLEWARES": {"scrapy_redis_bloom.batching.BatchingMiddleware": 0},
    "BLOOMFILTER_BATCH_WINDOW": 0.05,
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("state", "batching"),
    [("grown", {}), ("fresh", WINDOWED)],
    ids=["grown, per-request", "fresh, windowed-batches"],
)
def test_a_restarted_redis_loading_its_data_for_seconds_loses_no_page(
    site: SiteServer,
    redis_url: str,
    redis_client: redis.Redis,
    tmp_path: Path,
    state: str,
    batching: dict[str, Any],
) -> None:
    # A big filter's Redis answers -LOADING for seconds after a restart: here 40,000 keys
    # in the AOF's RDB base at 100 µs each, beside the filter.
    binary = slow_loading_binary()
    if binary is None:
        pytest.skip("no redis-server 7+ nor valkey-server to slow a loading with")
    with RedisServer(*slow_loading(100), appendonly=True, binary=binary) as bloom_redis:
        admin = bloom_redis.client()
        bloom_redis.slow_to_load(40_000)  # beside the filter, loaded 100 µs a key
        settings = filter_settings(bloom_redis.url, **STATES[state], **batching)
        if state != "fresh":
            bloom = RedisBloomFilter.from_config(
                admin, "shared:bloomfilter", BloomConfig.from_settings(settings)
            )
            bloom.add_many([f"before-the-crawl-{i}" for i in range(200)])
            bloom.close()
        loading: list[int] = []

        def restart() -> None:
            time.sleep(1.0)
            bloom_redis.kill()
            time.sleep(1.0)
            bloom_redis.restart(loaded=False)
            loading.append(int(bloom_redis.info("persistence")["loading"]))

        done = run_workers(site, redis_url, tmp_path, settings, admin, during=restart)
        admin.close()
    assert loading == [1]  # the workers met a Redis still loading
    assert_clean(done)
    assert done.lost(site) == set()
    assert done.stat("bloomfilter/retries") > 0
    assert done.duplicates() <= done.stat("bloomfilter/ambiguous")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("batching", [{}, WINDOWED], ids=["per-request", "windowed-batches"])
def test_a_full_redis_stops_the_crawl_with_the_reason(
    site: SiteServer,
    redis_url: str,
    redis_client: redis.Redis,
    tmp_path: Path,
    batching: dict[str, Any],
) -> None:
    with RedisServer() as bloom_redis:
        admin = bloom_redis.client()

        def fill() -> None:
            time.sleep(1.0)
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", int(admin.info("memory")["used_memory"]) // 2)

        settings = filter_settings(bloom_redis.url, BLOOMFILTER_RETRY_TIMEOUT=1, **batching)
        done = run_workers(site, redis_url, tmp_path, settings, admin, during=fill)
        admin.close()
    stopped = [
        log
        for result, log in zip(done.results, done.logs, strict=True)
        if result["stats"]["finish_reason"] == "bloomfilter_error"
    ]
    assert stopped, [r["stats"]["finish_reason"] for r in done.results]
    for result in done.results:  # never "finished" past a request Redis could not answer
        if result["stats"]["finish_reason"] != "bloomfilter_error":
            # (A worker may finish that asked Redis nothing after the fill: its last links
            # answered by its near-cache, or none left to it. Seen once, under load.)
            assert not result["stats"].get("bloomfilter/errors"), result["stats"]
    assert done.stat("bloomfilter/errors") >= len(stopped)
    assert all("Redis is out of memory" in log for log in stopped)
    assert all("cannot answer, so the crawl stops" in log for log in stopped)
    if batching:  # the windows met the full Redis, not only request_seen
        assert done.stat("bloomfilter/batch_failed") >= 1


@pytest.mark.timeout(180)
def test_evicted_shards_are_recreated_and_no_page_is_lost(
    site: SiteServer, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    with RedisServer() as bloom_redis:
        admin = bloom_redis.client()
        evicted: list[int] = []

        def evict() -> None:
            time.sleep(1.0)
            keys = [k for k in admin.keys("{shared:bloomfilter:*}:g0")]
            used = int(admin.info("memory")["used_memory"])
            admin.config_set("maxmemory-policy", "allkeys-random")
            admin.config_set("maxmemory", used + 2**20)
            for i in range(400):  # bounded: 64 KiB each
                admin.set(f"junk:{i}", b"x" * 65_536)
                gone = len(keys) - int(admin.exists(*keys))
                if gone:
                    evicted.append(gone)
                    break
            admin.config_set("maxmemory", 0)

        settings = filter_settings(bloom_redis.url, BLOOMFILTER_ON_LOSS="recreate")
        done = run_workers(site, redis_url, tmp_path, settings, admin, during=evict)
        admin.close()
    assert evicted, "no shard was evicted"
    assert_clean(done)
    assert done.lost(site) == set()
    assert done.stat("bloomfilter/recreated") >= evicted[0]
    assert any("Recreated" in log and "lost shard" in log for log in done.logs)


@pytest.mark.timeout(180)
def test_a_filter_past_its_capacity_says_so_while_crawling(
    site: SiteServer, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    with RedisServer() as bloom_redis:
        admin = bloom_redis.client()
        settings = filter_settings(bloom_redis.url, BLOOMFILTER_CAPACITY=100)
        settings["BLOOMFILTER_ERROR_RATE"] = 0.01
        settings["BLOOMFILTER_EXPANSION"] = 0  # a fixed-size filter: it cannot grow
        done = run_workers(site, redis_url, tmp_path, settings, admin)
        admin.close()
    warned = [log for log in done.logs if "its capacity of 100" in log]
    assert warned, "no capacity warning while crawling"
    assert "WARNING" in warned[0]
    assert "BLOOMFILTER_CAPACITY" in warned[0]
    assert max(r["stats"].get("bloomfilter/over_capacity", 0) for r in done.results) > 1


@pytest.mark.timeout(180)
@pytest.mark.parametrize("batching", [{}, WINDOWED], ids=["per-request", "windowed-batches"])
def test_a_stalled_redis_under_allow_loses_no_page_and_holds_up_no_worker(
    site: SiteServer,
    redis_url: str,
    redis_client: redis.Redis,
    tmp_path: Path,
    batching: dict[str, Any],
) -> None:
    """The filter's Redis SIGSTOPped for longer than the retry window, two workers crawling.

    It keeps its connections and answers nothing. Under ``allow`` each worker waits the
    retry window and a socket timeout once, then crawls on without waiting for Redis
    again (requests let through, the batching middleware's windows included): the pages
    not fetched yet are fetched while Redis still answers nothing, none is lost, and what
    was let through is added once it answers (the crawl ``finished``, no ERROR).
    """
    stall = 8.0
    with RedisServer() as bloom_redis:
        admin = bloom_redis.client()
        assert bloom_redis.process is not None
        pid = bloom_redis.process.pid
        served: dict[str, int] = {}

        def pages() -> int:  # distinct pages the site has served
            return sum(1 for path in site.hits_snapshot() if path.startswith("/page/"))

        def stalled() -> None:
            time.sleep(1.0)
            served["before"] = pages()
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(stall)
                # Still stalled: a loaded machine may crawl the rest slower than in 8 s.
                deadline = time.monotonic() + 40
                while pages() < PAGES and time.monotonic() < deadline:
                    time.sleep(0.1)
                served["by_the_end"] = pages()
            finally:
                os.kill(pid, signal.SIGCONT)

        settings = filter_settings(
            bloom_redis.url,
            BLOOMFILTER_RETRY_TIMEOUT=1,
            BLOOMFILTER_ON_ERROR="allow",
            BLOOMFILTER_REDIS_PARAMS={"socket_timeout": 1},
            **batching,
        )
        done = run_workers(site, redis_url, tmp_path, settings, admin, during=stalled)
        admin.close()
    assert_clean(done)
    assert done.lost(site) == set()
    assert done.stat("bloomfilter/errors") > 0  # the workers did meet the stall
    assert served["before"] < PAGES
    # The crawl went on through the stall: every page left was fetched during it.
    assert served["by_the_end"] == PAGES, served
