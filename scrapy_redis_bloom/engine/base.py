"""What both backends' filters share: connections, counters, leases, the near-cache, outages.

A backend sets up its :class:`.Lifecycle` in ``_setup`` and supplies its hot and bulk paths.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import mmh3

from scrapy_redis_bloom.core.errors import (
    AccessDeniedError,
    BloomFilterError,
    FilterUnavailableError,
)
from scrapy_redis_bloom.core.events import FilterEvents, RateLimitedLog
from scrapy_redis_bloom.core.hashing import FilterSpec, hashable, hashables
from scrapy_redis_bloom.core.record import UNSAID, Backend, FilterRecord
from scrapy_redis_bloom.core.settings import WORKER_TTL, BloomConfig, FaultPolicy, check_key
from scrapy_redis_bloom.engine.cache import LRU
from scrapy_redis_bloom.engine.clock import GUARD
from scrapy_redis_bloom.engine.counters import Counters
from scrapy_redis_bloom.engine.lease import WorkerLease, workers_of
from scrapy_redis_bloom.engine.lifecycle import Lifecycle
from scrapy_redis_bloom.engine.parts import Parts
from scrapy_redis_bloom.engine.state import FilterState, FilterTotals
from scrapy_redis_bloom.transport.executor import Call, Executor
from scrapy_redis_bloom.transport.topology import make_topology
from scrapy_redis_bloom.transport.wire import pack_command

logger = logging.getLogger(__name__)

#: Events after which Redis may no longer hold what it answered before: the near-cache goes.
#: Not the faults themselves (errors, retries, a lost reply, a connection made again to the
#: same server process): Redis forgets nothing by failing to answer, and while it cannot,
#: what it answered before keeps an outage's repeats from being fetched twice. What it may
#: have forgotten shows as another process behind a connection (restarts), a failover, or a
#: part found lost.
FORGETTING = frozenset(
    {
        "restarts",
        "failovers",
        "recreated",
        "restored",
        "counters_lost",
        "reopened",
        "taken_back",
        "rolled_back",
    }
)


def _reconnected(events: FilterEvents, other: bool) -> None:
    """Count a connection made again; and a restart when ``other`` (not known the same process)."""
    events.count("reconnects")
    if other:
        events.count("restarts")


#: Elements let through on error that are remembered at least, whatever the cache size.
MIN_OWED = 10_000

#: Filters and leases of this process, weakly: a forked child renews what it inherits of them.
_FORKABLE: weakref.WeakSet[Any] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """In a forked child: each filter and lease takes locks of its own (see ``_forked``)."""
    for inherited in list(_FORKABLE):
        inherited._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


#: An element for Redis to answer: its position, tag, itself and mmh3 halves.
Todo = tuple[int, int, str | bytes, int, int]


@dataclass(slots=True)
class Outcome:
    """What a bulk call found: answers in order, and counts for the filter's stats."""

    answers: list[bool] = field(default_factory=list)
    added: int = 0
    seen: int = 0
    ambiguous: int = 0
    errors: int = 0
    #: Elements Redis could not take (answered "new" by BLOOMFILTER_ON_ERROR = "allow").
    failed: list[str | bytes] = field(default_factory=list)


def item_count(items: object) -> int:
    """Check ``estimate``'s number of items: a whole number, 0 or more (else a clear error)."""
    if isinstance(items, bool) or not isinstance(items, int):
        raise TypeError(f"estimate() takes a whole number of items, got {type(items).__name__}")
    if items < 0:
        raise ValueError(f"estimate() takes a number of items of 0 or more, got {items:,}")
    return items


def whole(name: str, value: object, low: int, high: int) -> int:
    """Check a whole-number argument of a filter, as its record stores it (else a clear error).

    ``expansion``'s 0 (no growth) is allowed below ``low``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a whole number, got {type(value).__name__} {value!r}")
    if not low <= value <= high and not (name == "expansion" and value == 0):
        zero = "0 (no growth) or " if name == "expansion" else ""
        raise ValueError(f"{name} must be {zero}from {low:,} to {high:,}, got {value:,}")
    return value


def tag(element: str | bytes) -> int:
    """Return an element's 128-bit digest: the near-cache's key (its mmh3 halves, joined)."""
    h1, h2 = mmh3.hash64(element, seed=0, x64arch=True, signed=False)
    return h1 | h2 << 64


class FilterBase:
    """The part of a filter that does not depend on its backend.

    ``client``: a ``redis.Redis``, a ``RedisCluster`` or a sequence of standalone clients.
    """

    record: FilterRecord | None
    #: Opens and recovers the filter, given the backend's shards (set by :meth:`_setup`).
    lifecycle: Lifecycle

    #: Which ``BLOOMFILTER_BACKEND`` this is (see :mod:`.backend`).
    backend: Backend = "bitmap"

    def __init__(
        self,
        client: Any,
        key: str,
        spec: FilterSpec,
        capacity: int,
        cache_size: int = 0,
        *,
        sizing: str | None = None,
        faults: FaultPolicy | None = None,
        events: FilterEvents | None = None,
        expansion: int = 0,
        ttl: int = 0,
        fingerprints: str = UNSAID,
    ) -> None:
        self.key = check_key(key)  # as BLOOMFILTER_KEY: it names the Redis keys
        self.capacity = capacity = whole("capacity", capacity, 1, 2**63)
        expansion, ttl = whole("expansion", expansion, 2, 2**16), whole("ttl", ttl, 0, 2**31)
        self.topology = make_topology(client)
        self.faults = faults if faults is not None else FaultPolicy()
        self.events = events if events is not None else FilterEvents()
        # The events, not the filter: a reference back to it would keep it alive.
        self.topology.trips.on_moved = functools.partial(self.events.count, "failovers")
        self.topology.trips.on_reconnect = functools.partial(_reconnected, self.events)
        self.events.forgetting = FORGETTING
        self.executor = Executor(
            self.topology, self.faults.retry_timeout, self.events, budget=self.faults.retry_budget
        )
        # Its connections are its own: closed with it, or when it is collected.
        weakref.finalize(self, self.topology.close)
        self.parts = Parts(self.executor, key, spec)
        self.record = None
        self.counters = Counters(key, capacity, self.events)
        self.cache_size = cache_size
        self._cache: LRU[int, bool] = LRU(cache_size)
        self.cache_hits = 0
        self._cache_window = -1  # with re-crawl windows, the one the cache holds (see _cached)
        self._cache_keep = True  # whether what Redis answers now may be kept (see _cached)
        self._cache_epoch = 0  # the events' epoch the cache was filled in (see _cached)
        #: Elements let through while Redis could not answer, to add once it does.
        self._owed: dict[int, str | bytes] = {}
        self._lock = threading.RLock()
        self._log = RateLimitedLog(logging.getLogger(type(self).__module__))
        if sizing is None:
            sizing = f"shards={spec.shards} shard_bits={spec.shard_bits} k={spec.hash_count}"
        self.wanted = FilterRecord.new(
            spec,
            capacity,
            sizing,
            self.topology.servers,
            expansion=expansion,
            ttl=ttl,
            backend=self.backend,
            fingerprints=fingerprints,
        )
        #: Most generations (sub-filters) seen in a shard by this worker (stats, the log).
        self.generations = 1
        #: Workers holding a live lease, this one included, as its lease last saw (1: none).
        self.workers = 1
        self._setup()
        _FORKABLE.add(self)

    def _forked(self) -> None:
        """Start a forked child afresh: locks of its own, none of its parent's pending work.

        A lock held at the fork stays held; the parent syncs and adds what is pending.
        """
        self._lock = threading.RLock()
        self.topology.trips.lock = threading.Lock()
        self.executor.forked()
        self.events.forked()
        self.counters.forget_unsynced()
        self._owed = {}
        self._cache.clear()

    def _setup(self) -> None:
        """Set up the backend's own parts (called at the end of ``__init__``)."""

    def open(self, create: bool = True) -> FilterRecord:
        """Create the filter or check it (missing, ``create=False`` raises FilterMissingError)."""
        with self._lock:
            record = self.lifecycle.open(self.wanted, create)
            self._adopt(record)
            return record

    def clear(self) -> None:
        """Delete the filter: every part proven its own, its record last; the leases are kept."""
        with self._lock:
            record = self.record if self.record is not None else self.parts.read_record()
            if record is not None:
                self.lifecycle.shards.delete(record)
            self.record = None
            self._cache.clear()
            self.counters.forget_unsynced()

    def _adopt(self, record: FilterRecord) -> None:
        """Use ``record``: its geometry, its id; forget the near-cache of another filter."""
        raise NotImplementedError

    def _current(self) -> FilterRecord:
        """Return the record in use, opening the filter on first use."""
        return self.record if self.record is not None else self.open()

    def _existing(self) -> FilterRecord:
        """Return the record in use, opening the filter if it exists: a read creates nothing.

        No filter raises FilterMissingError, where creating one would answer "not there".
        """
        return self.record if self.record is not None else self.open(create=False)

    def _recover(self, shards: Iterable[int]) -> None:
        """Sort out shards found lost or wrong (see :meth:`.Lifecycle.recover`); adopt."""
        self._adopt(self.lifecycle.recover(self._current(), shards, self.wanted))

    def __reduce_ex__(self, protocol: object) -> Any:
        """Refuse pickling: a filter holds its connections, lock and counts for one process."""
        # RedisBloomFilter.from_config opens bitmap filters only; the dupefilter, either.
        how = (
            "RedisBloomFilter.from_config with the same key and BloomConfig.from_settings"
            if self.backend == "bitmap"
            else "a Scrapy dupefilter with the same settings"
        )
        raise TypeError(
            f"A Bloom filter ({type(self).__name__} {self.key!r}) cannot be pickled or sent to"
            " another process: it holds this process's connections, lock and unsynced counts."
            f" Build one filter per process instead ({how}); they share the filter in Redis."
        )

    @classmethod
    def from_config(cls, client: Any, key: str, config: BloomConfig, **options: Any) -> Self:
        """Return the filter a validated configuration asks for (``options``: the constructor's).

        ``key``: the filter's, filled in (``BloomConfig.key_for``), under BLOOMFILTER_KEY's
        rule: a key that breaks it is a TypeError or ValueError.
        """
        return cls(
            client,
            key,
            config.spec,
            config.capacity,
            sizing=config.sizing.canonical(),
            expansion=config.expansion,
            ttl=config.ttl,
            **options,
        )

    @classmethod
    def of_record(
        cls, client: Any, key: str, record: FilterRecord, faults: FaultPolicy | None = None
    ) -> Self:
        """Return a filter of a stored record's geometry, capacity and sizing; not opened."""
        return cls(
            client,
            key,
            record.spec,
            record.capacity,
            sizing=record.sizing,
            faults=faults,
            expansion=record.expansion,
            ttl=record.ttl,
            fingerprints=record.fingerprints,
        )

    def describe_geometry(self, config: BloomConfig, record: FilterRecord) -> str:
        """Say the open filter's geometry for the startup line: ``config``'s, else the record's.

        An existing filter keeps its own geometry, layout and growth (:meth:`FilterRecord.check`).
        """
        same = (record.spec, record.expansion, record.capacity)
        if same == (config.spec, config.expansion, config.capacity):
            return config.describe()
        return f"{record.describe()}{record.growth_limit()} (the filter's own)"

    @property
    def spec(self) -> FilterSpec:
        """The geometry in use: the stored one once the filter is open."""
        return self.parts.spec

    def estimate(self, items: int) -> FilterState:
        """Return the state ``items`` distinct adds leave: no Redis call.

        By the record in use; before the filter is open, by the configuration wanted.
        """
        raise NotImplementedError

    def live_state(self) -> FilterState:
        """Return the state of what a check consults now, at O(shards) in Redis at most.

        Cheap enough for the stats every second. Without re-crawl windows the counters hold
        every item: their estimate (:meth:`estimate`), no Redis call. With windows they also
        hold items forgotten since: the live windows' own reading (:meth:`_windows_state`).
        No filter under the key raises FilterMissingError.
        """
        with self._lock:
            record = self._existing()
            if not record.ttl:
                return self.estimate(self.counters.current().added)
            return self._windows_state(record)

    def _windows_state(self, record: FilterRecord) -> FilterState:
        """Return what the live re-crawl windows of ``record``'s filter hold, in O(shards)."""
        raise NotImplementedError

    def exists(self) -> bool:
        """Tell whether the filter's config record is in Redis."""
        call = Call(pack_command(b"EXISTS", self.parts.meta_key), key=self.parts.meta_key)
        with self._lock:
            return bool(self.parts.run("look for the filter", [call])[0])

    def close(self) -> None:
        """Close the filter's connections (they reopen on demand).

        First :meth:`settle_owed`, then the counts not synced yet are synced: the totals and
        the capacity warning count what was answered in the last interval. A sync that fails
        is said, never raised over the close.
        """
        with self._lock:
            try:
                self.settle_owed()  # raises only what no retry fixes (a damaged filter)
            finally:
                try:
                    self._flush_counts()
                    if self.counters.unsynced:
                        self.sync_counters()
                except BloomFilterError as exc:
                    logger.warning(
                        "Closing the Bloom filter %r without syncing this worker's last counts"
                        " (its totals miss them): %s",
                        self.key,
                        exc,
                    )
                finally:
                    self.executor.close()

    def settle_owed(self) -> None:
        """Add now what an outage let through, not at a later write that may never come.

        What Redis does not take is forgotten, said and counted.
        """
        with self._lock:
            if not self._owed:
                return
            self._settle()
            if self._owed:
                forgotten, self._owed = len(self._owed), {}
                self.events.count("owed_forgotten", forgotten)
                logger.warning(
                    "Closing the Bloom filter %r with %d request(s) let through while Redis"
                    " could not answer and not added since: they may be fetched again.",
                    self.key,
                    forgotten,
                )

    def totals(self) -> FilterTotals:
        """Return the counts over all workers, as synced to Redis."""
        with self._lock:
            return self.counters.read(self.parts)

    def count_seen(self, count: int = 1) -> None:
        """Count duplicates answered without a check: "seen" in this worker's counts and totals.

        A check counts its own answer. A request that repeats one a batch checked (a link
        twice in one response) takes the answer held for it, and is no check: the
        dupefilter counts it here, so that the filter's ``seen`` total is every duplicate
        the workers dropped.
        """
        with self._lock:
            self.counters.record(0, count)

    def sync_counters(self) -> FilterTotals | None:
        """Add this worker's unsynced counts to Redis now; return the totals (None: failed).

        A record found gone is written back while every shard is intact
        (:meth:`.Lifecycle.restore_record`); another filter's is adopted, as a check would.
        """
        with self._lock:
            record = self.record
            if record is None:
                return None
            self._flush_counts()
            totals = self.counters.sync(self.parts, self.spec, record.filter_id)
            if self.counters.record_gone and self.lifecycle.restore_record(record):
                totals = self.counters.sync(self.parts, self.spec, record.filter_id)
            elif self.counters.replaced:  # reset and created again: what its checks may not see
                self._recover([])
            return totals

    def sync_counters_if_due(self) -> None:
        """Sync the counts when due (for a timer: live totals while the worker waits)."""
        with self._lock:
            if self.counters.due:
                self.sync_counters()

    def lease(self, worker_id: str, ttl: float) -> WorkerLease:
        """Return this worker's lease, whose renewals tell the filter :attr:`workers`."""
        lease = WorkerLease(
            self.topology,
            self.key,
            worker_id,
            ttl,
            self.faults.retry_timeout,
            self.events,
            follows=self.executor,
            budget=self.faults.retry_budget,
        )
        lease.on_workers = functools.partial(setattr, self, "workers")  # from its thread
        _FORKABLE.add(lease)
        return lease

    def live_workers(self, settle: float = WORKER_TTL.default) -> list[str]:
        """Return the ids (``host:pid:random``) of the workers holding a live lease.

        Waits up to ``settle`` s after the registry's server restarts (:func:`.lease.unsettled`).
        """
        with self._lock:
            return workers_of(self.executor, self.key, settle)

    def contains_many(self, elements: Iterable[str | bytes]) -> list[bool]:
        """Return, per element, whether it is (probably) in the filter (see :meth:`_existing`).

        ``elements``: any iterable of elements (not one str or bytes: a TypeError).
        """
        items = hashables(elements, "contains_many", lazy=True)
        with self._lock:
            self._existing()
            return self._many(False, items).answers

    def add_many(self, elements: Iterable[str | bytes]) -> list[bool]:
        """Add elements in bulk, as :meth:`check_and_add` each; the counts are synced on return.

        ``elements``: any iterable of elements (not one str or bytes: a TypeError). A
        sequence's elements are all checked before any is added (one not a str or bytes is a
        TypeError naming its position); another iterable's as they come, in bounded memory.
        """
        items = hashables(elements, "add_many", lazy=True)
        with self._lock:
            outcome = Outcome()
            try:
                self._many(True, items, outcome)
            finally:  # (raised part-way, e.g. by the iterable: what it wrote is counted)
                self.counters.record(outcome.added, outcome.seen)
            self._owe_or_settle(outcome)
            self.sync_counters()
            return outcome.answers

    def check_and_add_many(self, elements: Iterable[str | bytes]) -> list[bool]:
        """Add a page's links as :meth:`check_and_add` each, in one round trip per server.

        ``elements``: any iterable of elements, all checked before any is added (as
        :meth:`add_many`'s sequence).
        """
        items = hashables(elements, "check_and_add_many")
        answers = [True] * len(items)
        with self._lock:
            todo = self._unknown(items)
            if todo:
                outcome = self._check_and_add_all(todo)
                self.counters.record(outcome.added, outcome.seen)
                failed = set(outcome.failed)
                keep = self.cache_size and self._cache_keep
                for (i, digest, element, _, _), seen in zip(todo, outcome.answers, strict=True):
                    answers[i] = seen
                    if keep and element not in failed:
                        self._cache.put(digest, True)
                self._owe_or_settle(outcome)
            if self.counters.due:
                self.sync_counters()
        return answers

    def _many(
        self, write: bool, elements: Iterable[str | bytes], outcome: Outcome | None = None
    ) -> Outcome:
        """Check (and with ``write`` add) elements in bulk, applying BLOOMFILTER_ON_ERROR.

        Fills ``outcome`` (a new one if None) as it goes, so that a call that raises part-way
        leaves the counts of what it wrote.
        """
        raise NotImplementedError

    def _check_and_add_all(self, todo: list[Todo]) -> Outcome:
        """Check and add ``(position, tag, element, h1, h2)`` items together: the bulk path's."""
        return self._many(True, [element for _, _, element, _, _ in todo])

    def _owe_or_settle(self, outcome: Outcome) -> None:
        """Remember what a write let through; else add what earlier ones did, if any."""
        if outcome.failed:
            self._owe({tag(e): e for e in outcome.failed})
        elif self._owed and len(outcome.answers) > outcome.errors:
            self._settle()

    def contains(self, element: str | bytes) -> bool:
        """Return True if the element is (probably) in the filter. Changes nothing.

        No filter under the key raises FilterMissingError: a check creates none.
        """
        return self.contains_many([hashable(element, "contains")])[0]

    def check_and_add(self, element: str | bytes) -> bool:
        """Add an element; return True if it was (probably) there already.

        One atomic command in Redis (none when the near-cache knows the element): of several
        workers adding the same element at once, exactly one gets False. An element is a
        str or bytes (a str hashes as its UTF-8 bytes); anything else is a TypeError.
        """
        if type(element) is not str or not element.isascii():
            element = hashable(element, "check_and_add")
        h1, h2 = mmh3.hash64(element, seed=0, x64arch=True, signed=False)
        tag = h1 | h2 << 64  # as tag()
        with self._lock:
            if (self.cache_size and self._cached(tag)) or (self._owed and tag in self._owed):
                self.cache_hits += 1
                due = self.counters.record(0, 1)
                seen = True
            else:
                try:
                    seen = self._check_and_add(element, h1, h2)
                except (FilterUnavailableError, AccessDeniedError) as exc:
                    answer = self._unavailable(exc, 1)[0]
                    self._owe({tag: element})
                    return answer
                due = self.counters.record(int(not seen), int(seen))
                if self.cache_size and self._cache_keep:
                    self._cache.put(tag, True)
                if self._owed:
                    self._settle()
            if due:
                self.sync_counters()
            return seen

    def _cached(self, tag: int) -> bool:
        """Tell whether the near-cache knows an element as seen.

        With re-crawl windows an answer lasts only to the end of its window: the cache is
        emptied as each starts, GUARD early, and keeps answers only away from a window's edges.
        It is emptied too after any event of :data:`FORGETTING`: Redis may have lost what it
        answered before (a restart from an older copy, a failover, a part lost or recreated).
        """
        if self.events.epoch != self._cache_epoch:
            self._cache.clear()
            self._cache_epoch = self.events.epoch
        ttl = (self.record or self.wanted).ttl
        if ttl:
            now = time.time()
            window = int((now + GUARD) // ttl)
            if window != self._cache_window:
                self._cache.clear()
                self._cache_window = window
            self._cache_keep = int((now - GUARD) // ttl) == window
        else:
            self._cache_keep = True
        return bool(self._cache.get(tag))

    def _check_and_add(self, element: str | bytes, h1: int, h2: int) -> bool:
        """Check and add one element (its mmh3 halves) in one backend command, via the executor."""
        raise NotImplementedError

    @property
    def round_trips(self) -> int:
        """Network round trips this filter made to Redis so far, from every thread."""
        return self.topology.trips.value

    def _unknown(self, elements: Sequence[str | bytes]) -> list[Todo]:
        """Return the elements Redis must answer; the others (known, owed, repeats) count "seen"."""
        todo: list[Todo] = []
        taken: set[int] = set()
        for i, element in enumerate(elements):
            h1, h2 = mmh3.hash64(element, seed=0, x64arch=True, signed=False)
            tag = h1 | h2 << 64  # as tag()
            if (
                tag in taken
                or (self.cache_size and self._cached(tag))
                or (self._owed and tag in self._owed)
            ):
                self.cache_hits += 1
                self.counters.record(0, 1)
                continue
            taken.add(tag)
            todo.append((i, tag, element, h1, h2))
        return todo

    def _flush_counts(self, only: int | None = None) -> None:
        """Send what the backend holds back between syncs (by default none); ``only``: a shard."""

    def _add_owed(self, elements: list[str | bytes]) -> Outcome:
        """Add elements for :meth:`_settle`: by default the bulk path's."""
        return self._many(True, elements)

    def _settle(self) -> None:
        """Add the elements let through while Redis could not answer, now that it answers."""
        owed, self._owed = self._owed, {}
        try:
            outcome = self._add_owed(list(owed.values()))
        except BaseException as exc:
            self._owed.update(owed)  # kept for the next time, whatever went wrong
            if not isinstance(exc, (FilterUnavailableError, AccessDeniedError)):
                raise
            self._log.log(
                logging.WARNING,
                "settle",
                "Could not yet add %d request(s) let through while Redis could not answer: %s",
                len(owed),
                exc,
            )
            return
        # Answered "new" already: added, even when one finds its own late write's bits.
        self.counters.record(outcome.added + outcome.seen, 0)
        if outcome.failed:
            failed = set(outcome.failed)
            self._owe({tag: e for tag, e in owed.items() if e in failed})
        if self._cache_keep:
            for tag in owed:
                self._cache.put(tag, True)
        logger.info(
            "Added %d request(s) to the Bloom filter %r that were let through while Redis"
            " could not answer.",
            len(owed) - len(outcome.failed),
            self.key,
        )

    def _owe(self, elements: dict[int, str | bytes]) -> None:
        """Remember elements let through while Redis could not answer (bounded)."""
        room = max(self.cache_size, MIN_OWED) - len(self._owed)
        if room < len(elements):
            forgotten = len(elements) - max(room, 0)
            self.events.count("owed_forgotten", forgotten)
            self._log.log(
                logging.WARNING,
                "owed",
                "Could not remember %d request(s) let through while Redis could not answer"
                " (%d remembered already): they may be fetched again.",
                forgotten,
                len(self._owed),
            )
        self._owed.update(list(elements.items())[: max(room, 0)])

    def _report(self, event: str, level: int, message: str, *args: object) -> None:
        """Count an event (the stat ``bloomfilter/<event>``) and say it, rate-limited."""
        self.events.count(event)
        self._log.log(level, event, message, *args)

    def _unavailable(
        self, exc: FilterUnavailableError | AccessDeniedError, count: int
    ) -> list[bool]:
        """Apply BLOOMFILTER_ON_ERROR to requests Redis could not answer, or refused."""
        self.events.count("errors", count)
        if self.faults.on_error != "allow":
            raise exc
        self._log.log(
            logging.WARNING,
            "unavailable",
            "Answering 'new' for %d request(s) the Bloom filter %r could not check"
            " (BLOOMFILTER_ON_ERROR = 'allow'; they may be fetched twice): %s",
            count,
            self.key,
            exc,
        )
        return [False] * count
