"""What happens to the filter while it runs, counted in memory for the layer above to read.

The engine knows nothing of Scrapy: it counts events (a retry, an ambiguous answer,
an error answered by policy, a part of the filter recreated) and sets values (how far
past its capacity the filter is) on a :class:`FilterEvents`; each is the stat
``bloomfilter/<name>``, listed in :data:`scrapy_redis_bloom.scrapy.stats.STATS`.
Nothing is pushed: the Scrapy layer reads the counts on its own timer, from the reactor
thread, and copies them into the crawl's stats (:mod:`scrapy_redis_bloom.scrapy.stats`),
so that a stats store that fails, or is not thread-safe, is never called from the
executor's retries, a lease's thread or ``request_seen``. Warnings that could repeat on
every request go through :class:`RateLimitedLog`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any


class FilterEvents:
    """Counts and values of what happened to one filter; thread-safe, read by :meth:`read`.

    Counted from any thread (the crawl's, a lease's renewing thread); never calls out.
    """

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.values: dict[str, Any] = {}
        self._lock = threading.Lock()

    def count(self, name: str, n: int = 1) -> None:
        """Count ``n`` events of kind ``name``."""
        if n:
            with self._lock:
                self.counts[name] += n

    def set(self, name: str, value: Any) -> None:
        """Set the value ``name`` (the latest wins)."""
        with self._lock:
            self.values[name] = value

    def read(self) -> tuple[dict[str, int], dict[str, Any]]:
        """Return a copy of the counts since the start, and of the values, taken together."""
        with self._lock:
            return dict(self.counts), dict(self.values)


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
        emit(self.logger, level, message, *args)


def emit(logger: logging.Logger, level: int, message: str, *args: object, **kwargs: Any) -> bool:
    """Log (``kwargs``: ``exc_info``...), never raising; return whether the record went out.

    A log handler may fail: Scrapy's ``LogCounterHandler`` counts every record into the
    crawl's stats, which scrapy-redis keeps in a Redis that may be down. A message about
    a fault must not become a fault of the code that says it (a lease's thread, a
    request answered "new"); the handler's own failure is not ours to say.
    """
    try:
        logger.log(level, message, *args, **kwargs)
    except Exception:
        return False
    return True
