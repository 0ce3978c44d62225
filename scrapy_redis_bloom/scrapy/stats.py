"""What the crawl sees of its filter: the ``bloomfilter/*`` stats, kept current, and a log line.

Written every second, and in full when the crawl idles or the dupefilter closes, so monitors
see them all before any ``spider_closed`` handler.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet import task

from scrapy_redis_bloom.core.errors import BloomFilterError
from scrapy_redis_bloom.core.events import RateLimitedLog, handler_failures
from scrapy_redis_bloom.engine.counters import SYNC_INTERVAL

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

    from scrapy_redis_bloom.engine.backend import BloomBackend
    from scrapy_redis_bloom.engine.state import FilterState

logger = logging.getLogger(__name__)

PREFIX = "bloomfilter/"  #: The prefix of every stat the filter gives.

#: Header reads a second one worker's stats may spend on re-crawl windows' figures: a
#: reading takes ~3 per shard (two live windows and an anchor), so a filter of more than
#: ~80 shards (1B URLs: 395) is read less often than every second.
WINDOW_READS = 250

#: The counts of what happened (:class:`..core.events.FilterEvents` ``count``).
_EVENTS = {
    "retries": "rounds of retrying a Redis command that failed (with backoff)",
    "ambiguous": "requests answered 'new' because a reply was lost after the command was sent",
    "errors": "requests Redis could not answer, handled per BLOOMFILTER_ON_ERROR",
    "owed_forgotten": (
        "requests let through while Redis could not answer, past the most a worker remembers"
        " to add once it answers (they may be fetched again)"
    ),
    "failovers": (
        "new connections that reached another server than before, or Redis Cluster slots of"
        " the filter found served by another node (a failover, or a slot moved)"
    ),
    "reconnects": (
        "new connections to a server this worker was connected to before (a dropped"
        " connection, a restart)"
    ),
    "restarts": (
        "of those, the ones that found another server process than before (a restart, perhaps"
        " from an older copy; or its INFO refused, so not known): the near-cache is emptied"
    ),
    "slow_replies": (
        "replies Redis took over a second to give (more for a big batch): a stall the call"
        " waited out"
    ),
    "queue_slow_replies": (
        "calls to scrapy-redis's request queue (push, pop, length) that Redis took over a second to"
        " answer, beyond a blocking pop's own wait: a stall the crawl waited out"
        " (scrapy_redis_bloom's Scheduler)"
    ),
    "recreated": "lost parts recreated empty (BLOOMFILTER_ON_LOSS = 'recreate')",
    "restored": "lost metadata (record, server marker) rewritten from intact shards",
    "counters_lost": "times the filter's counters were found evicted or deleted (totals restart)",
    "reopened": "times the filter was found reset and created again, and adopted",
    "taken_back": "bits a check set in a shard found not to be this filter's, cleared again",
    "lease_failed": "renewals of this worker's lease that failed (retried every second)",
    "grown": "generations a shard started because it held its capacity",
    "rolled_back": (
        "shards found with fewer generations than before: Redis lost acknowledged writes (a"
        " restart from an older snapshot, a failover to a replica behind)"
    ),
    "full": "checks of a shard past the capacity of its last generation",
    "near_full": (
        "1 when a fixed-size native filter passed 90% of its capacity: a shard may soon refuse"
        " new items, which stops the crawl"
    ),
    "memory_short": "servers (per generation) whose maxmemory the filter's growth passes",
    "batch_failed": "batches that could not be checked (their requests answered 'new')",
    "batch_unscheduled": "requests a batch answered 'new' that never reached the scheduler",
    "stats_failed": "times writing these stats to the crawl's stats collector failed (retried)",
    "flush_kept": (
        "scheduler flushes that kept the filter (and with scrapy_redis_bloom's Scheduler the"
        " queue) because other workers hold leases on them"
    ),
    "flush_failed": "flushes at close that failed (the filter and the queue were kept)",
}
#: Every stat the filter gives (without :data:`PREFIX`), and what it says.
STATS: dict[str, str] = {
    # This worker's answers (summed over the workers by a shared stats collector).
    "added": "requests this worker added to the filter (answered 'new')",
    "filtered": "requests this worker dropped as duplicates (also dupefilter/filtered)",
    "cache_hits": "duplicates this worker's near-cache answered, with no round trip",
    "round_trips": "network round trips this worker made to the filter's Redis",
    "batches": "batches of requests checked together (BatchingMiddleware)",
    "batched": "requests checked in those batches",
    # What happened, as it happened.
    **_EVENTS,
    "log_failed": (
        "the package's log lines, in this worker's process, that a log handler failed to take"
        " (Scrapy's LogCounterHandler, its stats store down): said, and sent to the others"
    ),
    "batching_disabled": "1 when a later middleware could drop requests: no batching",
    "unfetched_at_close": (
        "requests left in Scrapy's in-memory queue at close (no JOBDIR), kept as seen by the"
        " filter: a later crawl will not fetch them"
    ),
    "eviction_risk": "servers whose maxmemory-policy may evict the filter's keys",
    "rate_floor": (
        "least false-positive rate of a hash scheme 1 filter at its capacity, when above a"
        " tenth of its rate"
    ),
    "over_capacity": (
        "items over all workers, as a multiple of the capacity (when past it; not with"
        " re-crawl windows, whose items come and go)"
    ),
    # The filter, over all workers.
    "backend": "where the bits are: 'bitmap' (this package's) or 'native' (BF.*)",
    "capacity": "items the filter was created for",
    "bits": "bits of the filter's first generation (of all generations, native)",
    "hash_functions": "hash functions k",
    "shards": "shards the bits are split into",
    "expansion": "growth per generation (0: fixed size)",
    "ttl": "seconds a URL is remembered at least (0: forever)",
    "generations": "most generations a shard has started",
    "total_added": "items added by every worker (with re-crawl windows: in every window)",
    "total_filtered": "duplicates found by every worker",
    "bits_set": (
        "bits set (counted by the last worker to close, else estimated; with re-crawl"
        " windows, of the live windows)"
    ),
    "fill_ratio": "share of the bits that are set (with re-crawl windows: the live windows')",
    "estimated_items": (
        "items in the filter, from all workers' counters; with re-crawl windows, the items"
        " the live windows hold, from their own counts (the counters count forgotten ones too)"
    ),
    "estimated_fpr": (
        "chance that a new URL is taken for a seen one, now (with re-crawl windows: by the"
        " live windows a check reads)"
    ),
    "memory_bytes": "bytes Redis holds for the filter (estimated until counted)",
}

#: Counts of this worker, added to the stats as increments.
_COUNTS = ("added", "filtered", "cache_hits", "round_trips", "batches", "batched", "log_failed")
EVENT_COUNTS = tuple(_EVENTS)  #: The counts of what happened, every one in :data:`STATS`.
_DUPEFILTER = "dupefilter/filtered"  #: Scrapy's own count, the same as ``bloomfilter/filtered``.
#: The stats workers add to, created with 0 when the spider opens (:meth:`FilterStats.start`).
_CREATED = (*(PREFIX + name for name in (*_COUNTS, *EVENT_COUNTS)), _DUPEFILTER)


class FilterStats:
    """Copies one worker's filter stats into the crawl's stats and logs a line (reactor thread)."""

    def __init__(self, bloom: BloomBackend, stats: StatsCollector | None, interval: float) -> None:
        self.bloom = bloom
        self.stats = stats
        self.interval = interval
        #: Requests checked in batches, and duplicates dropped (the dupefilter counts them).
        self.batches = self.batched = self.filtered = 0
        self._given: dict[str, int] = {}  #: Per stat added to: how much of its count was.
        self._tasks: list[task.LoopingCall] = []
        self._log = RateLimitedLog(logger)
        self._log_failed_before = handler_failures()
        #: The live windows' last reading, and when the next one is due (monotonic).
        self._windows: FilterState | None = None
        self._windows_due = 0.0

    def start(self) -> None:
        """Create the counts workers add to; start the timers (stats every second, log line).

        Created by an increment of 0: two workers creating one at once would lose a count.
        """
        if self._tasks:
            return
        for call, every in ((self.tick, SYNC_INTERVAL), (self.log, self.interval)):
            if every > 0:
                self._tasks.append(task.LoopingCall(call))
                self._tasks[-1].start(every, now=False)
        if (stats := self.stats) is not None:
            self._guarded(lambda: self._add(stats, dict.fromkeys(_CREATED, 0)))

    @property
    def running(self) -> bool:
        """Whether the timers run: from the spider's opening to its close."""
        return bool(self._tasks)

    def stop(self) -> None:
        """Stop the timers."""
        for timer in self._tasks:
            if timer.running:
                timer.stop()
        self._tasks = []

    def tick(self) -> None:
        """Sync what an idle worker still holds, then publish; never raises (the timer's call)."""
        self._guarded(self.bloom.sync_counters_if_due)
        self.publish()

    def count_filtered(self) -> None:
        """Count a duplicate dropped, written at once as Scrapy's own dupefilter does (guarded)."""
        self.filtered += 1
        if (stats := self.stats) is not None:
            n = self.filtered
            self._guarded(lambda: self._add(stats, {f"{PREFIX}filtered": n, _DUPEFILTER: n}))

    def publish(self, state: FilterState | None = None, counts_only: bool = False) -> bool:
        """Write every stat now (``state``: counted in Redis); return whether all were written."""
        stats = self.stats
        return stats is None or self._guarded(lambda: self._publish(stats, state, counts_only))

    def _guarded(self, write: Callable[[], object]) -> bool:
        """Run ``write``; an exception is said (rate-limited WARNING) and counted, not raised."""
        try:
            write()
        except Exception as exc:
            self.bloom.events.count("stats_failed")
            self._log.log(
                logging.WARNING,
                "stats",
                "Could not write the Bloom filter %r's stats to the crawl's stats (tried"
                " again every second): %s: %s",
                self.bloom.key,
                type(exc).__name__,
                exc,
            )
            return False
        return True

    def _add(self, stats: StatsCollector, counts: dict[str, int]) -> None:
        """Add to each stat what of its count it was not given yet (the stats sum workers)."""
        for name, value in counts.items():
            given = self._given.get(name)
            if value != given:
                stats.inc_value(name, value - (given or 0))
                self._given[name] = value  # only once written: a failure is retried

    def _publish(self, stats: StatsCollector, state: FilterState | None, counts_only: bool) -> None:
        bloom = self.bloom
        counted, values = bloom.events.read()
        mine = {
            "added": bloom.counters.added,
            "filtered": self.filtered,
            "cache_hits": bloom.cache_hits,
            "round_trips": bloom.round_trips,
            "batches": self.batches,
            "batched": self.batched,
            "log_failed": handler_failures() - self._log_failed_before,
        }
        counts = {PREFIX + name: n for name, n in (*mine.items(), *counted.items())}
        counts[_DUPEFILTER] = self.filtered
        self._add(stats, counts)
        if not counts_only and bloom.record is not None:
            values.update(self._state(state))
        for name, value in values.items():
            stats.set_value(PREFIX + name, value)

    def _state(self, state: FilterState | None) -> dict[str, Any]:
        """Return the filter's stats over all workers: totals, geometry, fill, rate.

        ``state``: one read from Redis, else None. Without re-crawl windows the counters'
        items are what the filter holds: the items, and the fill and rate when no ``state``
        is given, are theirs, the same before and after the last worker counts the bits.
        With windows the counters also count items the expired windows took with them: the
        items, fill and rate are the live windows' (``state``, else
        :meth:`.FilterBase.live_state`, O(shards) in Redis, so read at most as often as
        :data:`WINDOW_READS` allows: every 5 s at 1B URLs). If Redis does not answer, the
        figures written last stand (said).
        """
        bloom = self.bloom
        record = bloom.record
        assert record is not None
        if bloom.counters.synced is None:
            bloom.sync_counters()  # the first: reads them
        totals = bloom.counters.current()  # as last synced, plus this worker's unsynced
        values: dict[str, Any] = {
            "total_added": totals.added,
            "total_filtered": totals.seen,
            "capacity": record.capacity,
            "shards": bloom.spec.shards,
            "expansion": record.expansion,
            "ttl": record.ttl,
            "backend": bloom.backend,
        }
        if not record.ttl:
            estimated = bloom.estimate(totals.added)
            items, state = estimated.estimated_items, state or estimated
        else:
            if state is None or state.from_counters:
                try:
                    state = self._live_windows()
                except BloomFilterError as exc:
                    self._log.log(
                        logging.WARNING,
                        "windows",
                        "Could not read the re-crawl windows of the Bloom filter %r (tried"
                        " again every second): its item, fill and rate stats keep their last"
                        " reading. %s",
                        bloom.key,
                        exc,
                    )
                    return values
            items = state.estimated_items
        # The server sizes its own native filters: their bits and k, not the bitmap geometry.
        native = state.generations if bloom.backend == "native" else None
        values.update(
            {
                "bits": state.total_bits if native else bloom.spec.bits,
                "hash_functions": native[0].hash_count if native else bloom.spec.hash_count,
                "bits_set": state.bits_set,
                "fill_ratio": round(state.fill_ratio, 6),
                "estimated_items": items,
                "estimated_fpr": float(f"{state.estimated_fpr:.6g}"),
                "memory_bytes": state.memory_bytes,
                "generations": max(len(state.generations), bloom.generations),
            }
        )
        return values

    def _live_windows(self) -> FilterState:
        """Return the live windows' reading, read anew once at most :data:`WINDOW_READS` allow.

        Every worker reads them, so at O(shards) a second each, 100 workers on a 1B-URL
        filter would send Redis ~120,000 header reads a second for their stats alone.
        """
        now = time.monotonic()
        if self._windows is None or now >= self._windows_due:
            self._windows = self.bloom.live_state()
            every = 3 * self.bloom.spec.shards / WINDOW_READS
            # Half a tick early: the timer's next tick after ``every`` reads them.
            self._windows_due = now + max(SYNC_INTERVAL, every) - SYNC_INTERVAL / 2
        return self._windows

    def log(self) -> None:
        """Log one line: the timer's call. Never raises (see :meth:`tick`)."""
        self._guarded(self._line)

    def _line(self) -> None:
        """Log one line, of the figures the stats give; a Redis that does not answer is said.

        The totals are read anew (other workers' syncs since this worker's last), plus this
        worker's counts not synced yet, as in the stats.
        """
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
            bloom.totals()
        except BloomFilterError as exc:
            logger.info("Bloom filter %r: %s; totals unavailable: %s", bloom.key, mine, exc)
            return
        figures = self._state(None)
        if "estimated_fpr" not in figures:  # the windows could not be read (said)
            logger.info(
                "Bloom filter %r: %s added by all workers; %s; its re-crawl windows unavailable",
                bloom.key,
                f"{figures['total_added']:,}",
                mine,
            )
            return
        if record.ttl:  # no share of the capacity: the windows' items come and go
            held = (
                f"{figures['estimated_items']:,} items in its live re-crawl windows (capacity"
                f" {record.capacity:,} per {record.ttl:,} s window; {figures['total_added']:,}"
                " added by all workers in all)"
            )
        else:
            held = (
                f"{figures['total_added']:,} items from all workers"
                f" ({100 * figures['total_added'] / record.capacity:.1f}% of capacity"
                f" {record.capacity:,})"
            )
        logger.info(
            "Bloom filter %r: %s, %.2f%% of bits set, false-positive rate now %.3g; %s",
            bloom.key,
            held,
            100 * figures["fill_ratio"],
            figures["estimated_fpr"],
            mine,
        )
