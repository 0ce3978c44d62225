"""Live totals and a periodic INFO line from the filter while the spider runs.

The counts of a worker reach the filter's counters in Redis as its calls come, about
once a second; a timer syncs what an idle worker still holds, so the totals every
worker, ``info`` and these lines read stay live.

Scrapy's LogStats says every ``LOGSTATS_INTERVAL`` seconds how many pages were
crawled; this says, at the same interval, what the filter holds and how it answers:
items over all workers (from the counters every worker adds to about once a second),
the share of the capacity, the fill and false-positive rate they imply, and this
worker's own answers, with those its near-cache gave without a round trip. One read
of the counters per line; no BITCOUNT.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from twisted.internet import task

from .engine.counters import SYNC_INTERVAL
from .engine.state import estimate_from_items
from .errors import BloomFilterError

if TYPE_CHECKING:
    from .engine.backend import BloomBackend

logger = logging.getLogger(__name__)


class FilterProgress:
    """From the reactor until stopped: syncs the counters, logs every ``interval`` seconds."""

    def __init__(self, bloom: BloomBackend, interval: float) -> None:
        self.bloom = bloom
        self.interval = interval
        self._tasks: list[task.LoopingCall] = []

    def start(self) -> None:
        """Start the timers (no log lines when ``interval`` is 0, as LogStats)."""
        if self._tasks:
            return
        timers = [(self.bloom.sync_counters_if_due, SYNC_INTERVAL)]
        if self.interval > 0:
            timers.append((self.log, self.interval))
        for call, every in timers:
            timer = task.LoopingCall(call)
            timer.start(every, now=False)
            self._tasks.append(timer)

    def stop(self) -> None:
        """Stop the timers."""
        for timer in self._tasks:
            if timer.running:
                timer.stop()
        self._tasks = []

    def log(self) -> None:
        """Log one line; a Redis that does not answer is said in the line, not raised."""
        bloom = self.bloom
        record = bloom.record
        if record is None:
            return
        here = bloom.counters
        mine = (
            f"this worker: {here.added:,} new, {here.seen:,} seen"
            f" ({bloom.cache_hits:,} of them from its near-cache, no round trip)"
        )
        try:
            totals = bloom.totals()
        except BloomFilterError as exc:
            logger.info("Bloom filter %r: %s; totals unavailable: %s", bloom.key, mine, exc)
            return
        state = estimate_from_items(record.growth, totals.added)
        logger.info(
            "Bloom filter %r: %s items from all workers (%.1f%% of capacity %s), %.2f%% of"
            " bits set, false-positive rate now %.3g; %s",
            bloom.key,
            f"{totals.added:,}",
            100 * totals.added / record.capacity,
            f"{record.capacity:,}",
            100 * state.fill_ratio,
            state.estimated_fpr,
            mine,
        )
