"""scrapy-redis's Scheduler, whose flush keeps the queue while the filter is kept.

scrapy-redis flushes (at close unless ``SCHEDULER_PERSIST``, at start with
``SCHEDULER_FLUSH_ON_START``) by clearing the dupefilter, then the queue. The Bloom filter is
not cleared while another worker holds a lease: emptying the queue then would lose its
requests for good, "seen" in the filter and queued nowhere. The add-on puts this class in
place of scrapy-redis's.
"""

from __future__ import annotations

import logging

from scrapy_redis.scheduler import Scheduler as RedisScheduler

from scrapy_redis_bloom.core.errors import BloomFilterError

logger = logging.getLogger(__name__)


class Scheduler(RedisScheduler):  # type: ignore[misc]  # (scrapy-redis is untyped)
    """scrapy-redis's Scheduler, but for :meth:`flush` (and a flush at close that fails)."""

    def flush(self) -> None:
        """Clear the filter, and the queue only if the filter was (no other worker uses it).

        The queue is cleared under the filter's claim, before another worker can start.
        """
        clear = getattr(self.df, "clear_unless_shared", None)
        if clear is None:  # another dupefilter: as scrapy-redis does
            super().flush()
        else:
            clear(then=self.queue.clear)

    def close(self, reason: str) -> None:
        """Flush unless ``SCHEDULER_PERSIST``; a flush that fails keeps both, said, not raised.

        (A flush at start that fails stops the crawl: it would start with what it asked to
        forget.)
        """
        try:
            super().close(reason)
        except BloomFilterError as exc:
            events = getattr(getattr(self.df, "bloom", None), "events", None)
            if events is not None:
                events.count("flush_failed")
            logger.warning(
                "Could not flush at close (SCHEDULER_PERSIST = False): the Bloom filter and the"
                " queue are kept, and the next crawl starts with them. %s",
                exc,
            )
