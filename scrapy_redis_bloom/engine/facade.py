"""What both backends' filters share: connections, counters, leases, the near-cache, outages.

:class:`Facade` is the base of :class:`.filter.RedisBloomFilter` (bitmaps) and
:class:`.native.NativeBloomFilter` (``BF.*``): everything here is the same whatever
keeps the bits. A subclass calls :meth:`Facade._connect` first in its constructor and
supplies ``contains_many``, ``record`` and ``spec``.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterable
from typing import Any

from redis.cluster import RedisCluster

from ..config import FaultPolicy
from ..errors import FilterUnavailableError
from ..hashing import FilterSpec
from .bulk import Outcome
from .cache import LRU
from .counters import Counters
from .events import FilterEvents, RateLimitedLog
from .executor import Call, Executor
from .lease import WorkerLease, workers_of
from .parts import Parts
from .record import FilterRecord
from .state import FilterTotals
from .topology import Cluster, ServerList, Topology
from .wire import pack_command

logger = logging.getLogger(__name__)

#: Elements let through on error that are remembered at least, whatever the cache size.
MIN_OWED = 10_000


def make_topology(client: Any) -> Topology:
    """Return the topology of a client: a cluster, one server, or a sequence of servers."""
    clients = tuple(client) if isinstance(client, (list, tuple)) else (client,)
    if len(clients) == 1 and isinstance(clients[0], RedisCluster):
        return Cluster(clients[0])
    if any(isinstance(c, RedisCluster) for c in clients):
        raise ValueError("a filter lives on one Redis Cluster or on standalone servers, not both")
    return ServerList(clients)


class Facade:
    """The part of a filter that does not depend on its backend."""

    key: str
    record: FilterRecord | None
    parts: Parts

    def _connect(
        self,
        client: Any,
        key: str,
        spec: FilterSpec,
        capacity: int,
        cache_size: int,
        faults: FaultPolicy | None,
        events: FilterEvents | None,
        log: logging.Logger = logger,
    ) -> None:
        """Set up what every filter has: connections, parts, counters, near-cache, lock.

        ``log``: the subclass's logger, for the rate-limited warnings.
        """
        self.key = key
        self.capacity = capacity
        self.topology = make_topology(client)
        self.faults = faults if faults is not None else FaultPolicy()
        self.events = events if events is not None else FilterEvents()
        self.executor = Executor(self.topology, self.faults.retry_timeout, self.events)
        # Its connections are its own: closed with it, or when it is collected.
        weakref.finalize(self, self.topology.close)
        self.parts = Parts(self.executor, key, spec)
        self.record = None
        self.counters = Counters(key, capacity, self.events)
        self.cache_size = cache_size
        self._cache: LRU[int, bool] = LRU(cache_size)
        self.cache_hits = 0
        #: Elements let through while Redis could not answer, to add once it does.
        self._owed: dict[int, str | bytes] = {}
        self._lock = threading.RLock()
        self._log = RateLimitedLog(log)

    @property
    def spec(self) -> FilterSpec:
        """The geometry in use: the stored one once the filter is open."""
        return self.parts.spec

    def exists(self) -> bool:
        """Tell whether the filter's config record is in Redis."""
        key = self.parts.meta_key
        with self._lock:
            (reply,) = self.parts.run(
                "look for the filter", [Call(pack_command(b"EXISTS", key), key=key)]
            )
        return bool(reply)

    def close(self) -> None:
        """Close the filter's connections. It stays usable: they reopen on demand."""
        with self._lock:
            self.executor.close()

    def totals(self) -> FilterTotals:
        """Return the counts over all workers, as synced to Redis."""
        with self._lock:
            return self.counters.read(self.parts)

    def sync_counters(self) -> FilterTotals | None:
        """Add this worker's unsynced counts to Redis now; return the totals (None: failed)."""
        with self._lock:
            if self.record is None:
                return None
            return self.counters.sync(self.parts, self.spec)

    def sync_counters_if_due(self) -> None:
        """Sync the counts when some are unsynced and the interval passed (for a timer).

        Calls sync them as they come; this keeps the totals live while the worker
        waits (an idle spider, a slow site).
        """
        with self._lock:
            if self.record is not None and self.counters.due:
                self.counters.sync(self.parts, self.spec)

    def lease(self, worker_id: str, ttl: float) -> WorkerLease:
        """Return this worker's lease in the filter's registry of live workers."""
        return WorkerLease(self.topology, self.key, worker_id, ttl, self.faults.retry_timeout)

    def live_workers(self) -> list[str]:
        """Return the ids (``host:pid:random``) of the workers holding a live lease."""
        with self._lock:
            return workers_of(self.executor, self.key)

    def contains_many(self, elements: Iterable[str | bytes]) -> list[bool]:
        """Return, per element, whether it is (probably) in the filter."""
        raise NotImplementedError

    def contains(self, element: str | bytes) -> bool:
        """Return True if the element is (probably) in the filter. Changes nothing."""
        return self.contains_many([element])[0]

    def _add_owed(self, elements: list[str | bytes]) -> Outcome:
        """Add elements in bulk for :meth:`_settle` (the backend's bulk path)."""
        raise NotImplementedError

    def _settle(self) -> None:
        """Add the elements let through while Redis could not answer, now that it answers."""
        owed, self._owed = self._owed, {}
        outcome = self._add_owed(list(owed.values()))
        self.counters.record(outcome.added, outcome.seen)
        if outcome.failed:
            failed = set(outcome.failed)
            self._owe({tag: e for tag, e in owed.items() if e in failed})
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
            self._log.log(
                logging.WARNING,
                "owed",
                "Could not remember %d request(s) let through while Redis could not answer"
                " (%d remembered already): they may be fetched again.",
                len(elements) - max(room, 0),
                len(self._owed),
            )
        for tag, element in list(elements.items())[: max(room, 0)]:
            self._owed[tag] = element

    def _unavailable(self, exc: FilterUnavailableError, count: int) -> list[bool]:
        """Apply BLOOMFILTER_ON_ERROR to requests Redis could not answer."""
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
