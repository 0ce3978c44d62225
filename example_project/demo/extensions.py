"""A Scrapy extension that writes the crawl's final stats to a JSON file.

Each worker of the demo is a separate ``scrapy crawl`` process; this is how ``run.py``
collects their stats to merge them. It is enabled in ``settings.py`` and writes to
the path in the ``DEMO_STATS_FILE`` setting (taken from the environment variable of the
same name); without a path it stays disabled.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)


def jsonable(value: Any) -> Any:
    """Return a stats value as JSON can hold it: datetimes as ISO 8601 text."""
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


class StatsDump:
    """Write the final stats of the crawl to ``DEMO_STATS_FILE`` when the engine stops.

    The file is written on ``engine_stopped``, after every ``spider_closed`` handler
    has run: the dupefilter records its ``bloomfilter/*`` stats on ``spider_closed``
    and connects to it after the extensions do, so an earlier dump would miss them.
    """

    def __init__(self, stats: StatsCollector, path: Path) -> None:
        self.stats = stats
        self.path = path

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> StatsDump:
        """Enable the extension when ``DEMO_STATS_FILE`` names a file."""
        path = crawler.settings.get("DEMO_STATS_FILE")
        if not path:
            raise NotConfigured("DEMO_STATS_FILE is not set")
        assert crawler.stats is not None
        extension = cls(crawler.stats, Path(path))
        crawler.signals.connect(extension.engine_stopped, signal=signals.engine_stopped)
        return extension

    def engine_stopped(self) -> None:
        """Write the stats, atomically: a reader sees the whole file or none."""
        stats = {name: jsonable(value) for name, value in self.stats.get_stats().items()}
        data = {"pid": os.getpid(), "stats": stats}
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps(data, indent=2, sort_keys=True), encoding="utf-8")
        partial.replace(self.path)
        logger.info("Wrote the final stats to %s", self.path)
