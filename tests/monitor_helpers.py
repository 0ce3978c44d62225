"""A Spidermon suite for the tests: records the filter's stats as monitors see them at close."""

from __future__ import annotations

from typing import ClassVar

from spidermon import Monitor, MonitorSuite, monitors

from scrapy_redis_bloom.scrapy.stats import PREFIX, STATS


@monitors.name("What a monitor sees")
class SawStats(Monitor):  # type: ignore[misc]
    """Copy every ``bloomfilter/*`` stat, as a monitor sees it, to ``saw/bloomfilter/*``."""

    @monitors.name("sees the filter's stats")
    def test_sees_the_filter_stats(self) -> None:
        stats = self.data.crawler.stats
        for name in STATS:
            value = self.data.stats.get(PREFIX + name)
            if value is not None:
                stats.set_value("saw/" + PREFIX + name, value)
        missing = [
            n
            for n in ("added", "total_added", "estimated_fpr")
            if PREFIX + n not in self.data.stats
        ]
        if missing:
            self.fail(f"missing at spider close: {missing}")


class SawStatsSuite(MonitorSuite):  # type: ignore[misc]
    """The suite of :class:`SawStats`."""

    monitors: ClassVar[list[type[Monitor]]] = [SawStats]
