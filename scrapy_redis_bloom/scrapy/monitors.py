"""Spidermon monitors that fail a crawl the Bloom filter may have cost pages or duplicates."""

from __future__ import annotations

from typing import Any, ClassVar

try:
    from spidermon import MonitorSuite, monitors
    from spidermon.contrib.scrapy.monitors.base import BaseScrapyMonitor
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError(
        "scrapy_redis_bloom.monitors needs Spidermon: pip install 'scrapy-redis-bloom[spidermon]'"
    ) from exc

from scrapy_redis_bloom.core.settings import BloomConfig
from scrapy_redis_bloom.scrapy.stats import PREFIX


class _FilterMonitor(BaseScrapyMonitor):  # type: ignore[misc]  # Spidermon is untyped
    def stat(self, name: str, default: Any = 0) -> Any:
        """Return the stat ``bloomfilter/<name>``."""
        return self.data.stats.get(PREFIX + name, default)


@monitors.name("Bloom filter capacity")
class CapacityMonitor(_FilterMonitor):
    """Check that the filter kept its false-positive rate as it filled (or could grow)."""

    @monitors.name("a fixed-size filter within its capacity")  # type: ignore[untyped-decorator]
    def test_within_capacity(self) -> None:
        """Fail when a filter that does not grow passed ``bloomfilter/capacity``."""
        over = self.stat("over_capacity", None)
        if over and not (self.stat("expansion") or self.stat("ttl")):  # (a filter that grows)
            self.fail(
                f"bloomfilter/over_capacity is {over}: the fixed-size filter"
                f" (BLOOMFILTER_EXPANSION = 0) holds {over}x the"
                f" {self.stat('capacity', '?'):,} items it was created for, so its false-positive"
                " rate is above the design. Reset it with a larger BLOOMFILTER_CAPACITY before"
                " the next crawl, use a new BLOOMFILTER_KEY, or let it grow"
                " (docs/explanation/growth.md#past-capacity).",
            )

    @monitors.name("has room to grow")  # type: ignore[untyped-decorator]
    def test_not_full(self) -> None:
        """Fail when a shard passed the capacity of its last generation."""
        if full := self.stat("full"):
            self.fail(
                f"bloomfilter/full is {full}: shards of the filter passed the capacity of their"
                " last generation and cannot grow further, so new URLs are being taken for seen."
                " Create a larger filter (a higher BLOOMFILTER_CAPACITY) for this crawl"
                " (docs/explanation/growth.md#past-capacity).",
            )


@monitors.name("Bloom filter false-positive rate")
class FalsePositiveRateMonitor(_FilterMonitor):
    """Check the filter's estimated false-positive rate against a threshold."""

    @monitors.name("estimated false-positive rate under the threshold")  # type: ignore[untyped-decorator]
    def test_false_positive_rate(self) -> None:
        """Fail when ``bloomfilter/estimated_fpr`` passed ``BLOOMFILTER_MONITOR_MAX_FPR``."""
        config = BloomConfig.from_settings(self.crawler.settings)
        limit = config.monitor_max_fpr or config.design_error_rate
        rate = self.stat("estimated_fpr", None)
        if rate is None:
            self.fail("bloomfilter/estimated_fpr is missing: the filter wrote no state.")
        if rate > limit:
            self.fail(
                f"bloomfilter/estimated_fpr is {rate:.3g}, above {limit:.3g}"
                " (BLOOMFILTER_MONITOR_MAX_FPR, else the rate the filter is configured for): that"
                " share of new URLs is dropped as seen. Size the filter for the crawl (a higher"
                " BLOOMFILTER_CAPACITY, or BLOOMFILTER_EXPANSION to let it grow) and reset it.",
            )


@monitors.name("Bloom filter answers")
class DoubtMonitor(_FilterMonitor):
    """Check that no request was answered "new" for doubt."""

    @monitors.name("no request answered 'new' for doubt")  # type: ignore[untyped-decorator]
    def test_no_doubt(self) -> None:
        """Fail on ``bloomfilter/errors``, ``bloomfilter/ambiguous`` or ``batch_failed``."""
        doubts = {name: self.stat(name) for name in ("errors", "ambiguous", "batch_failed")}
        said = ", ".join(f"bloomfilter/{name} is {n}" for name, n in doubts.items() if n)
        if said:
            self.fail(
                f"{said}: the filter answered 'new' where Redis could not confirm (no page is"
                " lost, but some may have been fetched twice). Look for the fault in the log"
                " (Redis unreachable, restarted, out of memory, a connection killed) and see"
                " BLOOMFILTER_RETRY_TIMEOUT and BLOOMFILTER_ON_ERROR.",
            )


@monitors.name("Bloom filter failovers")
class FailoverMonitor(_FilterMonitor):
    """Check that the filter's Redis did not fail over during the crawl."""

    @monitors.name("no failover")  # type: ignore[untyped-decorator]
    def test_no_failover(self) -> None:
        """Fail on ``bloomfilter/failovers``."""
        if failovers := self.stat("failovers"):
            self.fail(
                f"bloomfilter/failovers is {failovers}: the filter followed its Redis to another"
                " server. Writes the old primary had not replicated are gone, so some URLs may be"
                " fetched again; use min-replicas-to-write on the primary to keep them"
                " (docs/howto/topologies.md#sentinel).",
            )


class BloomFilterMonitorSuite(MonitorSuite):  # type: ignore[misc]
    """Every monitor of the filter: capacity, false-positive rate, doubt, failovers."""

    monitors: ClassVar[list[type[_FilterMonitor]]] = [
        CapacityMonitor,
        FalsePositiveRateMonitor,
        DoubtMonitor,
        FailoverMonitor,
    ]
