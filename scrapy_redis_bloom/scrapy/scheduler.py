"""scrapy-redis's Scheduler, whose flush keeps the queue while the filter is kept.

scrapy-redis flushes (at close unless ``SCHEDULER_PERSIST``, at start with
``SCHEDULER_FLUSH_ON_START``) by clearing the dupefilter, then the queue. The Bloom filter is
not cleared while another worker holds a lease: emptying the queue then would lose its
requests for good, "seen" in the filter and queued nowhere. Its queue's calls are timed: a
stall of the queue's Redis pauses the crawl as one of the filter's would, and is said as one.
The add-on puts this class in place of scrapy-redis's.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from scrapy_redis.queue import PriorityQueue
from scrapy_redis.scheduler import Scheduler as RedisScheduler

from scrapy_redis_bloom.core.errors import BloomFilterError
from scrapy_redis_bloom.core.events import RateLimitedLog
from scrapy_redis_bloom.transport.executor import SLOW_REPLY
from scrapy_redis_bloom.transport.topology import server_address

logger = logging.getLogger(__name__)


class Scheduler(RedisScheduler):  # type: ignore[misc]  # (scrapy-redis is untyped)
    """scrapy-redis's Scheduler, but for :meth:`flush` (and a flush at close that fails).

    And its queue's calls timed (:class:`WatchedQueue`).
    """

    queue: Any  # (set by scrapy-redis's open)

    def open(self, spider: Any) -> Any:
        """Open as scrapy-redis does, then watch the queue's calls."""
        opened = super().open(spider)
        if not isinstance(self.queue, WatchedQueue):
            self.queue = WatchedQueue(self.queue, self)
        return opened

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
            if (events := _events(self)) is not None:
                events.count("flush_failed")
            logger.warning(
                "Could not flush at close (SCHEDULER_PERSIST = False): the Bloom filter and the"
                " queue are kept, and the next crawl starts with them. %s",
                exc,
            )


class WatchedQueue:
    """scrapy-redis's request queue, whose ``push``, ``pop`` and length say a stall of its Redis.

    The crawl waits for them (scrapy-redis calls Redis in the reactor's thread): a reply that
    took over :data:`.SLOW_REPLY` s, beyond a blocking pop's own wait
    (``SCHEDULER_IDLE_BEFORE_CLOSE``; a ``PriorityQueue``'s pop does not block), is a WARNING,
    at most once a minute, and counted in ``bloomfilter/queue_slow_replies``. The filter's
    calls say their own (``slow_replies``).
    """

    def __init__(self, queue: Any, scheduler: Scheduler) -> None:
        self.queue = queue
        self._scheduler = scheduler
        self._log = RateLimitedLog(logger)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.queue, name)

    def __len__(self) -> int:
        """Count the queue's requests (``has_pending_requests``); said when Redis took long."""
        started = time.monotonic()
        length = len(self.queue)
        self._took("count the requests of", started, 0.0)
        return length

    def push(self, request: Any) -> None:
        """Push ``request``, as the queue does; said when Redis took over a second."""
        started = time.monotonic()
        self.queue.push(request)
        self._took("push a request onto", started, 0.0)

    def pop(self, timeout: float = 0) -> Any:
        """Pop a request, as the queue does; said when Redis took past ``timeout`` plus a second."""
        started = time.monotonic()
        request = self.queue.pop(timeout)
        blocks = not isinstance(self.queue, PriorityQueue)  # (whose pop ignores the timeout)
        self._took("pop a request from", started, timeout if blocks else 0.0)
        return request

    def _took(self, operation: str, started: float, allowance: float) -> None:
        took = time.monotonic() - started
        if took <= SLOW_REPLY + allowance:
            return
        if (events := _events(self._scheduler)) is not None:
            events.count("queue_slow_replies")
        waits = f" (a blocking pop waits up to {allowance:g} s of it for a request)"
        server = getattr(self.queue, "server", None)  # (a queue of another class may have none)
        self._log.log(
            logging.WARNING,
            "slow",
            "Redis at %s took %.1f s to %s scrapy-redis's queue (%r)%s, and the crawl waited"
            " for it: a stall (a slow command, a fork for a snapshot, swapping, a paused machine"
            " or a congested link).",
            "the queue's server" if server is None else server_address(server),
            took,
            operation,
            getattr(self.queue, "key", "?"),
            waits if allowance else "",
        )


def _events(scheduler: Scheduler) -> Any:
    """Return the filter's events, pulled into the stats (None for another dupefilter)."""
    return getattr(getattr(scheduler.df, "bloom", None), "events", None)
