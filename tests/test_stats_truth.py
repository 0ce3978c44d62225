"""The ``bloomfilter/*`` stats and the periodic log line tell the truth while the crawl runs.

Spidermon's monitors (``scrapy_redis_bloom.scrapy.monitors``) read these stats. They are
written by :class:`FilterStats` every second, here called by hand on real Redis servers:

* with re-crawl windows (``BLOOMFILTER_TTL``), the items, fill and rate are what the two
  live windows hold, not every item the counters ever counted;
* the log line's totals are the stats' (this worker's unsynced counts included).

False-positive bounds are binomial, as in test_generations.py: q queries of new elements,
each a false positive with probability p, give q p +- 6 sqrt(q p (1 - p)) hits but for a
chance below 1e-9.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from typing import Any

import pytest
import redis
from redis_server import RedisServer
from scrapy.statscollectors import StatsCollector
from scrapy.utils.test import get_crawler

from scrapy_redis_bloom import BloomConfig
from scrapy_redis_bloom.core.sizing import BLOCKED_HEADROOM
from scrapy_redis_bloom.engine import counters
from scrapy_redis_bloom.engine.backend import make_filter
from scrapy_redis_bloom.scrapy import stats as stats_module
from scrapy_redis_bloom.scrapy.stats import PREFIX, FilterStats

KEY = "truth:bloomfilter"
LOGGER = "scrapy_redis_bloom.scrapy.stats"


class Stats:
    """A crawl's stats collector (Scrapy's own, in memory), read by the stat's short name."""

    def __init__(self) -> None:
        stats = get_crawler().stats
        assert stats is not None
        self.collector: StatsCollector = stats

    def stat(self, name: str) -> Any:
        return self.collector.get_value(PREFIX + name)


def fingerprints(n: int, tag: str) -> list[str]:
    """Return n distinct 40-hex-digit elements, as request fingerprints are."""
    return [hashlib.sha1(f"{tag}-{i}".encode()).hexdigest() for i in range(n)]


def config(**more: Any) -> BloomConfig:
    return BloomConfig.from_settings(
        {"BLOOMFILTER_CAPACITY": 2_000, "BLOOMFILTER_ERROR_RATE": 0.01, **more}
    )


def within(hits: int, queries: int, rate: float, headroom: float = 1.0) -> bool:
    """Tell whether ``hits`` of ``queries`` new elements fit a rate ``rate``, 6 sigma wide.

    ``headroom``: how far above ``rate`` the layout's real rate may run.
    """
    low, high = queries * rate, queries * min(1.0, rate * headroom)
    return low - 6 * math.sqrt(low * (1 - rate)) <= hits <= high + 6 * math.sqrt(high * (1 - rate))


def redis_now(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return seconds + micros / 1e6


def next_window(client: redis.Redis, ttl: int) -> None:
    """Sleep until just after the next window of ``ttl`` seconds starts, by Redis's clock."""
    time.sleep(ttl - redis_now(client) % ttl + 0.05)


def window_of(client: redis.Redis, ttl: int) -> int:
    return int(client.time()[0]) // ttl


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["bitmap", "native"])
def test_with_recrawl_windows_the_stats_and_line_give_what_the_live_windows_hold(
    backend: str, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    # The stats were figured from the counters, which count every item ever added: after
    # the windows expired they still gave 11,953 items and a 37% fill; with two live
    # windows, about half the rate a new URL is taken for seen; and the line said "597.6%
    # of capacity", which does not apply to windows.
    client: redis.Redis = request.getfixturevalue(
        "bloom_redis_client" if backend == "native" else "redis_client"
    )
    ttl = 3
    cfg = config(BLOOMFILTER_TTL=ttl, BLOOMFILTER_SHARDS=2, BLOOMFILTER_BACKEND=backend)
    bloom = make_filter(client, KEY, cfg)
    bloom.open()
    stats = Stats()
    filter_stats = FilterStats(bloom, stats.collector, 60)
    # Redis's clock says which windows are live: each step keeps to one window.
    next_window(client, ttl)
    first = window_of(client, ttl)
    new = [answer is False for answer in bloom.check_and_add_many(fingerprints(3_000, "w0"))]
    filter_stats.publish()
    # What the live windows hold: every item answered "new" in them (their own counts).
    assert stats.stat("estimated_items") == sum(new)
    assert window_of(client, ttl) == first, "too slow: the window changed during the step"

    next_window(client, ttl)
    second = window_of(client, ttl)
    new += [answer is False for answer in bloom.check_and_add_many(fingerprints(3_000, "w1"))]
    filter_stats.publish()
    assert stats.stat("estimated_items") == sum(new)
    # The rate a check of a new URL meets, reading both windows, is the reported one.
    queries = 50_000
    hits = sum(bloom.contains_many(fingerprints(queries, "stranger")))
    assert window_of(client, ttl) == second, "too slow: the window changed during the step"
    rate = stats.stat("estimated_fpr")
    headroom = BLOCKED_HEADROOM if bloom.spec.block_bits else 1.0
    assert within(hits, queries, rate, headroom), (hits, queries, backend, rate)
    assert stats.stat("fill_ratio") > 0

    # Two windows later both are forgotten: nothing is held, nothing taken for seen.
    time.sleep(max(0.0, (second + 2) * ttl + 0.05 - redis_now(client)))
    assert window_of(client, ttl) >= second + 2
    assert not any(bloom.contains_many(fingerprints(3_000, "w0")))
    filter_stats.publish()
    assert stats.stat("estimated_items") == 0
    assert stats.stat("estimated_fpr") == 0
    assert stats.stat("fill_ratio") == 0
    assert stats.stat("bits_set") == 0
    assert stats.stat("total_added") == sum(new)  # the counters: every item ever added
    with caplog.at_level(logging.INFO, logger=LOGGER):
        filter_stats.log()
    (line,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert "0 items in its live re-crawl windows" in line
    assert f"{sum(new):,} added by all workers" in line
    assert "of capacity" not in line
    assert "false-positive rate now 0;" in line
    bloom.close()


def test_with_the_windows_unreadable_the_stats_keep_their_last_reading(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Read every second, the live windows' figures must survive an outage: what was
    # written last stands (said), nothing raises out of the timer's call.
    cfg = config(BLOOMFILTER_TTL=3600, BLOOMFILTER_RETRY_TIMEOUT=0.2)
    with RedisServer() as server:
        bloom = make_filter(server.client(), KEY, cfg, faults=cfg.faults)
        new = bloom.check_and_add_many(fingerprints(100, "before")).count(False)
        stats = Stats()
        filter_stats = FilterStats(bloom, stats.collector, 60)
        filter_stats.publish()
        written = {name: stats.stat(name) for name in ("estimated_items", "estimated_fpr")}
        assert written["estimated_items"] == new
        server.kill()
        time.sleep(1.0)  # the next reading is due (within a second the last one stands)
        with caplog.at_level(logging.INFO, logger=LOGGER):
            filter_stats.tick()
            filter_stats.log()
        assert {name: stats.stat(name) for name in written} == written
        said = [r.getMessage() for r in caplog.records if r.name == LOGGER]
        assert any("keep their last reading" in line for line in said), said
        assert any("unavailable" in line for line in said), said
        bloom.close()


def test_the_log_line_counts_what_this_worker_has_not_synced_yet(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The line read the totals as synced to Redis only: "26 items from all workers" beside
    # "this worker: 65 new", where the stats gave the synced totals plus this worker's part.
    monkeypatch.setattr(counters, "SYNC_INTERVAL", 3600.0)  # no sync but those asked for
    cfg = config(BLOOMFILTER_CAPACITY=1_000)
    other = make_filter(redis_client, KEY, cfg)
    other.check_and_add_many(fingerprints(30, "other"))
    other.sync_counters()
    bloom = make_filter(redis_client, KEY, cfg)
    bloom.check_and_add_many(fingerprints(50, "mine"))
    assert bloom.counters.unsynced
    stats = Stats()
    filter_stats = FilterStats(bloom, stats.collector, 60)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        filter_stats.log()
    (line,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert "80 items from all workers (8.0% of capacity 1,000)" in line
    assert "this worker: 50 new" in line
    filter_stats.publish()  # the same figures as the line's
    assert stats.stat("total_added") == 80
    assert f"{100 * stats.stat('fill_ratio'):.2f}% of bits set" in line
    assert f"rate now {stats.stat('estimated_fpr'):.3g};" in line
    other.close()
    bloom.close()


def test_the_live_windows_of_a_filter_of_many_shards_are_read_within_a_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Read every second by every worker, the live windows' headers cost ~3 reads per shard:
    # 100 workers on a 1B-URL filter (395 shards) sent ~120,000 reads a second for stats.
    # Here 400 shards: ~1,200 reads a reading; a budget of 1,200 a second allows one a second.
    monkeypatch.setattr(stats_module, "WINDOW_READS", 1_200)
    cfg = config(BLOOMFILTER_CAPACITY=200_000, BLOOMFILTER_TTL=3600, BLOOMFILTER_SHARDS=400)
    with RedisServer() as server:
        client = server.client()
        bloom = make_filter(client, KEY, cfg)
        first = bloom.check_and_add_many(fingerprints(1_000, "first")).count(False)
        stats = Stats()
        filter_stats = FilterStats(bloom, stats.collector, 60)

        def reads() -> int:
            return int(client.info("commandstats").get("cmdstat_getrange", {}).get("calls", 0))

        before = reads()
        filter_stats.publish()
        one = reads() - before
        assert one >= 3 * 400 - 10, one  # the reading itself: ~3 per shard
        assert stats.stat("estimated_items") == first
        more = bloom.check_and_add_many(fingerprints(1_000, "more")).count(False)
        bloom.sync_counters()
        before = reads()
        filter_stats.publish()
        filter_stats.publish()
        assert reads() - before < 10  # within the second: the last reading stands
        assert stats.stat("estimated_items") == first
        time.sleep(1.0)  # the budget's interval: read anew
        filter_stats.publish()
        assert stats.stat("estimated_items") == first + more
        bloom.close()
