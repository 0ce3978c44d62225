"""Monitors at spider close see the filter's stats; the Spidermon suite fails what it should.

Spidermon runs its ``SPIDERMON_SPIDER_CLOSE_MONITORS`` from its own ``spider_closed``
handler, connected before the dupefilter exists, so before the dupefilter's. Real
crawls (scrapy-redis's Scheduler with a persistent queue, Scrapy's own scheduler) show
that every stat is there by then, and equal to the final one; the suite of
:mod:`scrapy_redis_bloom.scrapy.monitors` then passes. Each of its monitors is also run on
stats that must fail it, and its message must name the stat.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from scrapy.utils.test import get_crawler
from spidermon.runners import MonitorRunner
from test_crawl import assert_finished, crawl
from website import Site, SiteServer

# The module, not its classes: pytest would collect the monitors (unittest cases) here.
from scrapy_redis_bloom.scrapy import monitors

PAGES = 200
SPIDERMON = {
    "SPIDERMON_ENABLED": True,
    "EXTENSIONS": {"spidermon.contrib.scrapy.extensions.Spidermon": 500},
    "SPIDERMON_SPIDER_CLOSE_MONITORS": [
        "monitor_helpers.SawStatsSuite",
        "scrapy_redis_bloom.monitors.BloomFilterMonitorSuite",
    ],
    "BLOOMFILTER_CAPACITY": 10_000,
    "BLOOMFILTER_ERROR_RATE": 0.001,
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("scheduler", "settings"),
    [("scrapy-redis", {"SCHEDULER_PERSIST": True}), ("default", {})],
    ids=["scrapy-redis-persist", "scrapy"],
)
def test_monitors_at_spider_close_see_every_filter_stat(
    redis_url: str, tmp_path: Path, scheduler: str, settings: dict[str, Any]
) -> None:
    with SiteServer(Site(PAGES)) as site:
        result = crawl(
            site, redis_url, tmp_path, mode="follow", scheduler=scheduler,
            settings={**SPIDERMON, **settings},
        )  # fmt: skip
    assert_finished(result)
    stats = result.stats
    assert stats["bloomfilter/added"] == PAGES
    # What the monitors saw at spider_closed is what the final stats say.
    for name in ("added", "total_added", "total_filtered", "capacity", "estimated_items"):
        assert stats[f"saw/bloomfilter/{name}"] == stats[f"bloomfilter/{name}"], name
    assert 0 < stats["saw/bloomfilter/estimated_fpr"] < 1e-6
    assert stats["saw/bloomfilter/fill_ratio"] > 0
    # The shipped suite ran and passed.
    for monitor in ("a fixed-size filter within its capacity", "no failover",
                    "estimated false-positive rate under the threshold",
                    "no request answered 'new' for doubt"):  # fmt: skip
        assert f"{monitor}... OK" in result.log, monitor
    assert "... FAIL" not in result.log
    assert "... ERROR" not in result.log


def _run(monitor: type[Any], stats: dict[str, Any], settings: dict[str, Any] | None = None) -> str:
    """Run one monitor on ``stats``; return its failure messages (empty: it passed)."""
    suite = monitors.BloomFilterMonitorSuite(monitors=[monitor])
    crawler = get_crawler(settings_dict=settings or {})
    result = MonitorRunner().run(suite, stats=stats, crawler=crawler)
    return "\n".join(str(failure.error) for failure in result.monitor_results if failure.error)


GOOD = {
    "bloomfilter/capacity": 1000,
    "bloomfilter/estimated_fpr": 1e-4,
    "bloomfilter/total_added": 900,
}


@pytest.mark.parametrize(
    ("monitor", "bad", "named"),
    [
        (monitors.CapacityMonitor, {"bloomfilter/over_capacity": 1.7, "bloomfilter/expansion": 0},
         "bloomfilter/over_capacity is 1.7"),
        (monitors.CapacityMonitor, {"bloomfilter/full": 3}, "bloomfilter/full is 3"),
        (monitors.FalsePositiveRateMonitor, {"bloomfilter/estimated_fpr": 0.02},
         "bloomfilter/estimated_fpr is 0.02, above 0.001"),
        (monitors.DoubtMonitor, {"bloomfilter/errors": 5}, "bloomfilter/errors is 5"),
        (monitors.DoubtMonitor, {"bloomfilter/ambiguous": 1}, "bloomfilter/ambiguous is 1"),
        (monitors.DoubtMonitor, {"bloomfilter/batch_failed": 2}, "bloomfilter/batch_failed is 2"),
        (monitors.FailoverMonitor, {"bloomfilter/failovers": 1}, "bloomfilter/failovers is 1"),
    ],
)  # fmt: skip
def test_each_monitor_fails_on_its_stat_and_names_it(
    monitor: type[Any], bad: dict[str, Any], named: str
) -> None:
    settings = {"BLOOMFILTER_CAPACITY": 1000, "BLOOMFILTER_ERROR_RATE": 0.001}
    assert _run(monitor, GOOD, settings) == ""
    said = _run(monitor, {**GOOD, **bad}, settings)
    assert named in said


def test_a_grown_filter_passes_the_capacity_monitor() -> None:
    """Past its capacity a growing filter grew and kept its rate: not a failure.

    A fixed-size one, or a full shard, is (docs/explanation/growth.md#past-capacity).
    """
    settings = {"BLOOMFILTER_CAPACITY": 1000, "BLOOMFILTER_ERROR_RATE": 0.001}
    grown = {**GOOD, "bloomfilter/over_capacity": 4.2, "bloomfilter/expansion": 2}
    assert _run(monitors.CapacityMonitor, grown, settings) == ""
    windows = {**GOOD, "bloomfilter/over_capacity": 4.2, "bloomfilter/expansion": 0,
               "bloomfilter/ttl": 3600}  # fmt: skip
    assert _run(monitors.CapacityMonitor, windows, settings) == ""
    fixed = {**grown, "bloomfilter/expansion": 0}
    assert "the fixed-size filter" in _run(monitors.CapacityMonitor, fixed, settings)
    full = {**grown, "bloomfilter/full": 2}
    assert "bloomfilter/full is 2" in _run(monitors.CapacityMonitor, full, settings)


def test_the_false_positive_threshold_is_a_setting() -> None:
    stats = {**GOOD, "bloomfilter/estimated_fpr": 0.005}
    rate = monitors.FalsePositiveRateMonitor
    sized = {"BLOOMFILTER_ERROR_RATE": 0.001, "BLOOMFILTER_CAPACITY": 1000}
    assert "above 0.001" in _run(rate, stats, sized)
    assert _run(rate, stats, {"BLOOMFILTER_MONITOR_MAX_FPR": 0.01}) == ""
    said = _run(rate, stats, {"BLOOMFILTER_MONITOR_MAX_FPR": 2})
    assert "The value of the BLOOMFILTER_MONITOR_MAX_FPR setting (2) is invalid" in said
