"""Counts of what the filter answered, shared by all workers, and the capacity warning.

Each worker adds its local counts to ``KEY:count`` every :data:`SYNC_INTERVAL` and at
close. A failed sync never changes an answer: its counts wait for the next one.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from scrapy_redis_bloom.core import layout
from scrapy_redis_bloom.core.errors import BloomFilterError, foreign_reply
from scrapy_redis_bloom.core.events import FilterEvents, RateLimitedLog
from scrapy_redis_bloom.core.hashing import FilterSpec
from scrapy_redis_bloom.core.sizing import false_positive_rate
from scrapy_redis_bloom.engine.parts import Parts, integer, text
from scrapy_redis_bloom.engine.state import FilterTotals
from scrapy_redis_bloom.transport.executor import Call, Results
from scrapy_redis_bloom.transport.wire import pack_command

logger = logging.getLogger(__name__)

#: Seconds between two syncs of the local counts to Redis, while there are any.
SYNC_INTERVAL = 1.0
_ADDING = "add to the filter's counters"


class Counters:
    """One worker's outcomes: those synced to ``KEY:count`` and those not yet."""

    def __init__(self, key: str, capacity: int, events: FilterEvents) -> None:
        self.key = key
        #: The capacity warned about: the record's, from the first sync (an adopter's may differ).
        self.capacity = capacity
        self.events = events
        #: Outcomes of this worker, since it started.
        self.added = self.seen = 0
        self._unsynced_added = self._unsynced_seen = 0
        self._next_sync = time.monotonic() + SYNC_INTERVAL
        self._warned_at = 0  # the capacity multiple last warned about
        #: The totals over all workers Redis gave at the last sync or read (None: none yet).
        self.synced: FilterTotals | None = None
        #: The last sync found no config record (counts kept), or another filter's (adopted).
        self.record_gone = self.replaced = False
        #: A fixed-size filter (neither growing nor forgetting), whose capacity is warned about;
        #: one with re-crawl windows, whose items come and go (see :meth:`follow`).
        self.fixed, self.forgets = True, False
        self._log = RateLimitedLog(logger)

    def record(self, added: int, seen: int) -> bool:
        """Count outcomes of this worker; return whether a sync is due (see :attr:`due`)."""
        self.added += added
        self.seen += seen
        self._unsynced_added += added
        self._unsynced_seen += seen
        return time.monotonic() >= self._next_sync

    def current(self) -> FilterTotals:
        """Return the totals as last synced, plus this worker's counts not synced since."""
        synced = self.synced or FilterTotals(added=0, seen=0)
        return FilterTotals(
            added=synced.added + self._unsynced_added, seen=synced.seen + self._unsynced_seen
        )

    @property
    def unsynced(self) -> bool:
        """Tell whether there are counts not synced yet."""
        return (self._unsynced_added or self._unsynced_seen) > 0

    @property
    def due(self) -> bool:
        """Tell whether it is time to sync (unsynced counts, and an interval passed)."""
        return self.unsynced and time.monotonic() >= self._next_sync

    def forget_unsynced(self) -> None:
        """Drop the counts not yet synced: the counters they were for were deleted."""
        self._unsynced_added = self._unsynced_seen = 0
        self.synced = None

    def sync(self, parts: Parts, spec: FilterSpec, filter_id: str) -> FilterTotals | None:
        """Add the unsynced counts to ``KEY:count`` of the filter ``filter_id``; return the totals.

        None: not added. The record's id is read a trip before, so that a filter reset under
        this worker does not take its counts (a record gone keeps them for the next sync).
        """
        added, seen = self._unsynced_added, self._unsynced_seen
        self._unsynced_added = self._unsynced_seen = 0
        self._next_sync = time.monotonic() + SYNC_INTERVAL
        key = parts.counter_key
        # Not sent again once its reply is lost (it may have run): counted twice, a total
        # would stay wrong for good; a few counts less is the smaller error.
        calls = [
            Call(pack_command(b"HINCRBY", key, b"added", added), key=key, resend=b""),
            Call(pack_command(b"HINCRBY", key, b"seen", seen), key=key, resend=b""),
        ]
        try:
            owner = Call(pack_command(b"HGET", parts.meta_key, b"id"), key=parts.meta_key)
            (found,) = parts.run("read the filter's id", [owner], take=_text_or_none)
            self.record_gone, self.replaced = found is None, found not in (None, filter_id)
            if found is None:  # kept for the next sync: the filter restores the record
                self._keep(added, seen)
                return None
            if found != filter_id:
                self._log.log(
                    logging.WARNING,
                    "replaced",
                    "The Bloom filter %r was reset and created again (id %s) while this worker"
                    " used it: %d added and %d seen of the filter before are not added to its"
                    " counters.",
                    self.key,
                    found,
                    added,
                    seen,
                )
                self.synced = None  # the new filter's counters start anew
                return None
            # None ran if this raises (an ACL refusal), or an interrupt came.
            results = parts.executor.run(_ADDING, calls, write=True, partial=True)
        except BaseException as exc:
            self._keep(added, seen)
            if not isinstance(exc, BloomFilterError):
                raise
            self._failed(exc)
            return None
        replies = self._add(parts, results, (added, seen))
        if replies is None:
            return None
        before, totals = self.synced, FilterTotals(added=replies[0], seen=replies[1])
        self.synced = totals
        if before is not None and before.added + before.seen > 0 and replies == (added, seen):
            self._lost(before)
        if parts.capacity is not None and parts.capacity != self.capacity:
            self.capacity = parts.capacity
            self._warned_at = 0
        self.check_capacity(totals.added, spec)
        return totals

    def _keep(self, added: int, seen: int) -> None:
        """Keep counts that were not added for the next sync."""
        self._unsynced_added += added
        self._unsynced_seen += seen

    def _add(
        self, parts: Parts, results: Results, counts: tuple[int, int]
    ) -> tuple[int, int] | None:
        """Read the two ``HINCRBY`` of a sync; return the totals (None: not both known).

        A count whose command surely did not run is kept for the next sync (said); one whose
        reply was lost is not, as it may have run (said at DEBUG).
        """
        totals: list[int] = []
        failure: BaseException | None = None
        for field, count, reply, lost in zip(
            ("added", "seen"), counts, results.replies, results.ambiguous, strict=True
        ):
            if reply.__class__ is int:
                totals.append(reply)
            elif lost or (reply is not None and not isinstance(reply, BaseException)):
                if not lost:  # not this command's reply: it may have run
                    failure = failure or foreign_reply(
                        f"a call to {_ADDING}", parts.counter_key, ValueError(repr(reply))
                    )
                logger.debug(
                    "The reply to adding %d %s to the Bloom filter %r's counters was lost: not"
                    " sent again, as it may have run (the total is short of them if not).",
                    count,
                    field,
                    self.key,
                )
            else:  # not run: the next sync's
                if field == "added":
                    self._unsynced_added += count
                else:
                    self._unsynced_seen += count
                if reply is None:
                    failure = failure or results.failure
                else:
                    failure = failure or parts.refusal(reply, parts.counter_key, _ADDING)
        if failure is not None:
            self._failed(failure)
        return (totals[0], totals[1]) if len(totals) == 2 else None

    def _lost(self, before: FilterTotals) -> None:
        """Say that ``KEY:count`` was found gone: a sync's ``HINCRBY`` replied just its counts."""
        self.events.count("counters_lost")
        self._log.log(
            logging.WARNING,
            "lost",
            "The counters of the Bloom filter %r (%s) were gone (evicted: maxmemory-policy"
            " allkeys-*, or deleted): its totals start again from zero, without the %s added"
            " and %s seen counted before. The filter's bits are intact; its item count"
            " (info, the capacity warning) is short of them. Use maxmemory-policy noeviction"
            " or volatile-* for the filter's Redis.",
            self.key,
            layout.counter_key(self.key),
            f"{before.added:,}",
            f"{before.seen:,}",
        )

    def _failed(self, exc: BaseException) -> None:
        """Say that a sync failed (its counts are kept)."""
        self._log.log(
            logging.WARNING,
            "sync",
            "Could not add this worker's counts to the Bloom filter %r's counters (they"
            " are kept for the next try): %s",
            self.key,
            exc,
        )

    def read(self, parts: Parts) -> FilterTotals:
        """Read the totals over all workers (this worker's unsynced counts not included)."""
        key = parts.counter_key
        call = Call(pack_command(b"HMGET", key, b"added", b"seen"), key=key)
        (self.synced,) = parts.run("read the filter's counters", [call], take=_totals)
        return self.synced

    def follow(self, expansion: int, ttl: float) -> None:
        """Take the filter's shape from its record: whether it grows, whether it forgets."""
        self.fixed, self.forgets = not (expansion or ttl), ttl > 0

    def check_capacity(self, items: int, spec: FilterSpec) -> None:
        """Warn once per doubling past the capacity: 1x, 2x, 4x, ...

        Not with re-crawl windows: ``items``, all ever added, is not what their windows hold.
        """
        if items <= self.capacity or self.forgets:
            return
        ratio = items / self.capacity
        self.events.set("over_capacity", round(ratio, 2))
        multiple = 1 << (int(ratio).bit_length() - 1)  # the power of two passed
        if not self.fixed or multiple <= self._warned_at:
            return
        self._warned_at = multiple
        now = false_positive_rate(spec.bits, spec.hash_count, items, spec.block_bits)
        planned = false_positive_rate(spec.bits, spec.hash_count, self.capacity, spec.block_bits)
        logger.warning(
            "The Bloom filter %r holds about %s items, %.1fx its capacity of %s: its"
            " false-positive rate is now about %.3g (%.3g at capacity), so that share of new"
            " URLs is dropped as already seen. Size the filter for the crawl: reset it with a"
            " larger BLOOMFILTER_CAPACITY (or BLOOMFILTER_BIT), or start a new"
            " BLOOMFILTER_KEY.",
            self.key,
            f"{items:,}",
            ratio,
            f"{self.capacity:,}",
            now,
            planned,
        )


def _text_or_none(reply: Any) -> str | None:
    """Return a field an ``HGET`` read (None: there is none)."""
    return None if reply is None else text(reply)


def _totals(reply: Any) -> FilterTotals:
    """Return the totals an ``HMGET KEY:count added seen`` reply holds (missing: 0)."""
    if not isinstance(reply, list):
        raise ValueError(f"two counts, got {reply!r:.200}")
    added, seen = reply
    return FilterTotals(added=integer(added), seen=integer(seen))
