"""What happens to the filter while it runs, reported as it happens.

The engine knows nothing of Scrapy: it counts events (a retry, an ambiguous answer,
an error answered by policy, a part of the filter recreated) and sets values (how far
past its capacity the filter is) on a :class:`FilterEvents`; each is the stat
``bloomfilter/<name>``, listed in :data:`scrapy_redis_bloom.scrapy.stats.STATS`.
The dupefilter connects that to the crawl's stats, so a fault shows in the stats
while the crawl runs, not only at its end. Warnings that could repeat on every request go through
:class:`RateLimitedLog`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any


class FilterEvents:
    """Counts and values of what happened to one filter; forwarded to a sink if connected."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.values: dict[str, Any] = {}
        self._on_count: Callable[[str, int], None] | None = None
        self._on_value: Callable[[str, Any], None] | None = None

    def connect(
        self, on_count: Callable[[str, int], None], on_value: Callable[[str, Any], None]
    ) -> None:
        """Forward every later count and value to these callbacks (e.g. Scrapy's stats)."""
        self._on_count, self._on_value = on_count, on_value

    def count(self, name: str, n: int = 1) -> None:
        """Count ``n`` events of kind ``name``."""
        if n:
            self.counts[name] += n
            if self._on_count is not None:
                self._on_count(name, n)

    def set(self, name: str, value: Any) -> None:
        """Set the value ``name`` (the latest wins)."""
        self.values[name] = value
        if self._on_value is not None:
            self._on_value(name, value)


class RateLimitedLog:
    """Log a message at most once per ``interval`` seconds per topic, counting the rest.

    A fault that hits every request must be said while it lasts, without one log line
    per request: the first occurrence is logged, then one line per interval saying
    how many more there were.
    """

    def __init__(self, logger: logging.Logger, interval: float = 60.0) -> None:
        self.logger = logger
        self.interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: Counter[str] = Counter()

    def log(self, level: int, topic: str, message: str, *args: object) -> None:
        """Log ``message % args`` unless ``topic`` was logged less than ``interval`` ago."""
        now = time.monotonic()
        last = self._last.get(topic)
        if last is not None and now - last < self.interval:
            self._suppressed[topic] += 1
            return
        self._last[topic] = now
        skipped = self._suppressed.pop(topic, 0)
        if skipped:
            message += " (%d more like this since the last such message)"
            args = (*args, skipped)
        self.logger.log(level, message, *args)
