"""scrapy-redis's Scheduler, whose flush keeps the queue while the filter is kept.

scrapy-redis flushes (at close unless ``SCHEDULER_PERSIST``, at start with
``SCHEDULER_FLUSH_ON_START``) by clearing the dupefilter, then the queue. The Bloom filter is
not cleared while another worker holds a lease: emptying the queue then would lose its
requests for good, "seen" in the filter and queued nowhere. The add-on puts this class in
place of scrapy-redis's.
"""

from __future__ import annotations

from scrapy_redis.scheduler import Scheduler as RedisScheduler


class Scheduler(RedisScheduler):  # type: ignore[misc]  # (scrapy-redis is untyped)
    """scrapy-redis's Scheduler, but for :meth:`flush`."""

    def flush(self) -> None:
        """Clear the filter, and the queue only if the filter was (no other worker uses it)."""
        clear = getattr(self.df, "clear_unless_shared", None)
        if clear is None:  # another dupefilter: as scrapy-redis does
            super().flush()
        elif clear():
            self.queue.clear()
