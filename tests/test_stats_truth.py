"""The ``bloomfilter/*`` stats and the periodic log line tell the truth while the crawl runs.

Spidermon's monitors (``scrapy_redis_bloom.scrapy.monitors``) read these stats. They are
written by :class:`FilterStats` every second, here called by hand on real Redis servers:

* the log line's totals are the stats' (this worker's unsynced counts included).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import pytest
import redis
from scrapy.statscollectors import StatsCollector
from scrapy.utils.test import get_crawler

from scrapy_redis_bloom import BloomConfig
from scrapy_redis_bloom.engine import counters
from scrapy_redis_bloom.engine.backend import make_filter
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
