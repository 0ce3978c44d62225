"""The Bloom filter in Redis: :class:`RedisBloomFilter`, the facade over the engine.

It knows Redis and the hashing scheme, nothing of Scrapy. Elements are request
fingerprints as hex strings (see :mod:`..hashing`). The answer contract, for
:meth:`~RedisBloomFilter.check_and_add`, :meth:`~RedisBloomFilter.add_many` and
:meth:`~RedisBloomFilter.contains_many` alike:

* "seen" (True) only when Redis confirmed, in this call, that every bit of the
  element was already set in a shard that carries this filter's id;
* any doubt answers "new" (False): a reply lost after the command was sent, with a
  re-run finding the bits set (counted as ``ambiguous``); a shard found lost;
  Redis unavailable for ``BLOOMFILTER_RETRY_TIMEOUT`` under ``BLOOMFILTER_ON_ERROR =
  "allow"`` (counted as ``errors``). A duplicate fetch is cheap; a lost page is not.
* otherwise an error, never a wrong answer: :class:`~..errors.FilterUnavailableError`,
  :class:`~..errors.FilterDamagedError`, :class:`~..errors.WrongTypeError`, ...

Elements let through under ``"allow"`` are remembered by this worker (a second offer
is a duplicate: it answers "seen") and added to the filter once Redis answers again,
so that other workers learn of them too.

Thread-safe: calls from several threads are serialised by a lock.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

import mmh3
from redis.cluster import RedisCluster

from ..config import BloomConfig, FaultPolicy
from ..errors import FilterDamagedError, FilterUnavailableError
from ..hashing import FilterSpec
from . import layout, scripts
from .access import check_access
from .bulk import Bulk, Outcome, ScriptHooks
from .cache import LRU
from .counters import Counters
from .events import FilterEvents, RateLimitedLog
from .executor import Call, Executor, Kind, classify
from .generations import seed_arguments
from .lease import WorkerLease, workers_of
from .lifecycle import Lifecycle
from .node import ReplyLostError, TransportError
from .parts import Parts
from .record import FilterRecord
from .state import FilterState, FilterTotals, read_state
from .topology import Cluster, ServerList, Topology
from .wire import command_head, encode, pack_command

logger = logging.getLogger(__name__)


def make_topology(client: Any) -> Topology:
    """Return the topology of a client: a cluster, one server, or a sequence of servers."""
    clients = tuple(client) if isinstance(client, (list, tuple)) else (client,)
    if len(clients) == 1 and isinstance(clients[0], RedisCluster):
        return Cluster(clients[0])
    if any(isinstance(c, RedisCluster) for c in clients):
        raise ValueError("a filter lives on one Redis Cluster or on standalone servers, not both")
    return ServerList(clients)


#: Elements let through on error that are remembered at least, whatever the cache size.
MIN_OWED = 10_000


def _tag(element: str | bytes) -> int:
    """Return an element's 128-bit digest: the near-cache's key."""
    h1, h2 = mmh3.hash64(element, seed=0, x64arch=True, signed=False)
    return h1 | h2 << 64


class _Redo(Exception):  # noqa: N818  # internal signal, never raised to callers
    """The hot path's reply asks for the executor (a redirection, a retry)."""


class RedisBloomFilter:
    """A Bloom filter kept in Redis string bitmaps, sharded over several keys.

    ``client`` is a ``redis.Redis``, a ``redis.cluster.RedisCluster``, or a sequence
    of standalone clients (several servers: shard ``i`` on server ``i mod n``); the
    filter makes its own connections from their settings. ``spec`` and ``capacity``
    (and ``sizing``, the request they come from, see :class:`..sizing.Sizing`) say
    what to create; a filter that exists keeps the geometry stored in its record.
    :meth:`open` is called on first use.
    """

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
    ) -> None:
        self.key = key
        self.capacity = capacity
        self.topology = make_topology(client)
        self.faults = faults if faults is not None else FaultPolicy()
        self.events = events if events is not None else FilterEvents()
        self.executor = Executor(self.topology, self.faults.retry_timeout, self.events)
        self.executor.explain_denial = partial(check_access, self.executor, self.topology, key)
        # Its connections are its own: closed with it, or when it is collected.
        weakref.finalize(self, self.topology.close)
        self.parts = Parts(self.executor, key, spec)
        self.lifecycle = Lifecycle(self.parts, self.topology, self.faults, self.events)
        if sizing is None:
            sizing = f"shards={spec.shards} shard_bits={spec.shard_bits} k={spec.hash_count}"
        self.wanted = FilterRecord.new(
            spec, capacity, sizing, self.topology.servers, expansion=expansion, ttl=ttl
        )
        self.record: FilterRecord | None = None
        self.counters = Counters(key, capacity, self.events)
        self.cache_size = cache_size
        self._cache: LRU[int, bool] = LRU(cache_size)
        self.cache_hits = 0
        #: Elements let through while Redis could not answer, to add once it does.
        self._owed: dict[int, str | bytes] = {}
        self._lock = threading.RLock()
        self._script = scripts.check_and_add(self.wanted.growth, one=True)
        self._bulk_script = scripts.check_and_add(self.wanted.growth)
        self._heads: dict[int, tuple[bytes, str]] = {}
        #: Most generations seen in a shard by this worker (for stats and the log).
        self.generations = 1
        self._identities: dict[int, bytes] = {}
        self._log = RateLimitedLog(logger)
        self._bulk = Bulk(
            self.topology,
            self.executor,
            self.parts,
            self._identity,
            self._recover,
            allow=self.faults.on_error == "allow",
            hooks=ScriptHooks(
                active=lambda: bool(self.record and (self.record.expansion or self.record.ttl)),
                script=lambda: self._bulk_script,
                head=lambda shard, write, n: self._scripted_head(
                    shard, write, n, self._bulk_script
                ),
                note=self._note,
                mismatch=self._mismatch,
                scriptless=self._scriptless,
            ),
        )

    @classmethod
    def from_config(
        cls, client: Any, key: str, config: BloomConfig, **options: Any
    ) -> RedisBloomFilter:
        """Return the filter a validated configuration asks for: geometry, growth, TTL.

        ``options``: the other arguments of the constructor (``cache_size``,
        ``faults``, ``events``).
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

    def __repr__(self) -> str:
        spec = self.spec
        return (
            f"<RedisBloomFilter key={self.key!r} bits={spec.bits} shards={spec.shards}"
            f" hash_count={spec.hash_count} capacity={self.capacity}"
            f" servers={self.topology.servers}>"
        )

    @property
    def spec(self) -> FilterSpec:
        """The geometry in use: the stored one once the filter is open."""
        return self.parts.spec

    @property
    def shard_keys(self) -> list[str]:
        """The keys of every shard, in shard order (built on demand)."""
        return [self.parts.shard_key(shard) for shard in range(self.spec.shards)]

    # -- lifecycle ---------------------------------------------------------------------

    def open(self, create: bool = True) -> FilterRecord:
        """Create the filter, or check this worker's settings and every part against it.

        With ``create=False`` a missing filter raises
        :class:`~..errors.FilterMissingError`. See :mod:`.lifecycle` for what is
        checked and how lost parts are handled.
        """
        with self._lock:
            record = self.lifecycle.open(self.wanted, create)
            self._adopt(record)
            return record

    def _adopt(self, record: FilterRecord) -> None:
        """Use ``record``: its geometry, its id; forget the near-cache of another filter."""
        old, self.record = self.record, record
        if old is None or old.filter_id != record.filter_id or old.growth != record.growth:
            self._script = scripts.check_and_add(record.growth, one=True)
            self._bulk_script = scripts.check_and_add(record.growth)
            self._heads.clear()
            self._identities.clear()
            self.counters.fixed = not (record.expansion or record.ttl)
            if old is not None:
                self._cache.clear()

    def _current(self) -> FilterRecord:
        if self.record is None:
            self.open()
        assert self.record is not None
        return self.record

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

    def clear(self) -> None:
        """Delete the filter: its shards, counters and markers, then its record.

        Only keys proven to be this filter's (see :meth:`.parts.Parts.delete`). The
        worker registry is kept: leases belong to the workers. The next use creates
        the filter anew.
        """
        with self._lock:
            record = self.record if self.record is not None else self.parts.read_record()
            if record is not None:
                self.lifecycle.delete(record)
            self.record = None
            self._cache.clear()
            self.counters.forget_unsynced()

    def state(self) -> FilterState:
        """Count the bits set per shard and the memory Redis holds for them (O(m) in Redis)."""
        with self._lock:
            return read_state(self.parts, self._current().growth)

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

    # -- elements ----------------------------------------------------------------------

    def check_and_add(self, element: str | bytes) -> bool:
        """Add an element; return True if it was (probably) there already.

        One atomic script call in Redis (none when the near-cache knows the element):
        of several workers adding the same element at once, exactly one gets False.
        """
        h1, h2 = mmh3.hash64(element, seed=0, x64arch=True, signed=False)
        tag = h1 | h2 << 64  # as _tag()
        with self._lock:
            if self._cache.get(tag) or (self._owed and tag in self._owed):
                self.cache_hits += 1
                self.counters.record(0, 1)
                seen = True
            else:
                try:
                    seen = self._check_and_add(h1, h2)
                except FilterUnavailableError as exc:
                    answer = self._unavailable(exc, 1)[0]
                    self._owe({tag: element})
                    return answer
                self.counters.record(int(not seen), int(seen))
                self._cache.put(tag, True)
                if self._owed:
                    self._settle()
            if self.counters.due:
                self.counters.sync(self.parts, self.spec)
            return seen

    def _check_and_add(self, h1: int, h2: int, recovered: bool = False) -> bool:
        record = self.record if self.record is not None else self._current()
        spec = record.spec
        shard = h1 % spec.shards
        head, key = self._heads.get(shard) or self._head(shard)
        payload = head + seed_arguments(h1, h2, spec.shards, spec.shard_bits)
        ambiguous = False
        try:
            reply = self.topology.route(key, shard, None).call(payload)
            if classify(reply) is not Kind.RESULT:
                raise _Redo
        except (TransportError, _Redo) as exc:
            ambiguous = isinstance(exc, ReplyLostError)
            call = Call(payload, key=key, shard=shard, script=self._script)
            results = self.executor.run("check and add a request", [call], write=True)
            reply, ambiguous = results.replies[0], ambiguous or results.ambiguous[0]
        if reply.__class__ is int:  # the common reply: the answer alone
            seen = reply == 1
        elif isinstance(reply, BaseException):
            raise self.parts.refusal(reply, key, "check and add a request")
        elif reply[0] == scripts.MISMATCH:
            if recovered:
                raise FilterDamagedError(
                    f"Shard {key!r} of the Bloom filter {self.key!r} still does not carry its id"
                    " after recovery."
                )
            self._mismatch(shard, key, reply[1])
            return self._check_and_add(h1, h2, recovered=True)
        else:
            if reply[1] or reply[2] > self.generations:
                self._note(shard, reply[1], reply[2])
            seen = reply[3] == 1
        if seen and ambiguous:
            self.events.count("ambiguous")
            return False  # the bits may be this call's own, set by a lost attempt
        return seen

    def _mismatch(self, shard: int, key: str, found: object) -> None:
        """Sort out the part a script found wrong: the shard itself, or a generation of it.

        A wrong shard key goes to :meth:`_recover`; a generation or a re-crawl window
        that is missing (with ``BLOOMFILTER_ON_LOSS = "raise"``) or foreign raises.
        """
        bad = found.decode() if isinstance(found, bytes) else str(found)
        if bad == key:
            self._recover(self.parts.identities([shard]))
        else:
            raise self.lifecycle.lost_part(self._current(), shard, bad)

    def _note(self, shard: int, flags: int, generations: int) -> None:
        """Report what a check-and-add did beside answering: growth, a full shard, a loss."""
        if generations > self.generations:
            self.generations = generations
            self.events.set("generations", generations)
        if flags & scripts.GREW:
            self.events.count("grown")
            growth = self._current().growth
            self._log.log(
                logging.INFO,
                "grown",
                "The Bloom filter %r grows: shard %d started generation %d of at most %d"
                " (it takes %s more items at a false-positive rate of %.2g).",
                self.key,
                shard,
                generations - 1,
                growth.last,
                f"{growth.generation(generations - 1).capacity:,}",
                growth.generation(generations - 1).error_rate,
            )
        if flags & scripts.FULL:
            self.events.count("full")
            self._log.log(
                logging.WARNING,
                "full",
                "Shard %d of the Bloom filter %r is past the capacity of its last generation"
                " (%d generations, %s items in all): it cannot grow further, and its"
                " false-positive rate now rises, so some new URLs will be taken for seen."
                " Create a larger filter (a higher BLOOMFILTER_CAPACITY) for this crawl.",
                shard,
                self.key,
                generations,
                f"{self._current().growth.grown_capacity:,}",
            )
        if flags & scripts.RECREATED:
            self.events.count("recreated")
            self._log.log(
                logging.WARNING,
                "recreated",
                "A lost generation or re-crawl window of shard %d of the Bloom filter %r was"
                " recreated empty (BLOOMFILTER_ON_LOSS = 'recreate'): URLs it held may be"
                " fetched again. It was evicted or deleted; see the maxmemory-policy of %s.",
                shard,
                self.key,
                self.topology.describe(),
            )

    def _head(self, shard: int) -> tuple[bytes, str]:
        """Pack ``EVALSHA sha 1 <shard key> <identity> w <recreate>`` for a shard; and its key."""
        key = self.parts.shard_key(shard)
        head = self._scripted_head(shard, True)
        self._heads[shard] = head, key
        return head, key

    def _scripted_head(
        self, shard: int, write: bool, elements: int = 1, script: scripts.Script | None = None
    ) -> bytes:
        """Pack the start of a check-and-add call over ``elements`` elements.

        ``script``: the bulk path's script (same reply), else the hot path's.
        """
        recreate = b"1" if self.faults.on_loss == "recreate" else b"0"
        return command_head(
            7 + 4 * elements,
            b"EVALSHA",
            (script or self._script).sha,
            b"1",
            encode(self.parts.shard_key(shard)),
            self._identity(shard),
            b"w" if write else b"r",
            recreate,
        )

    def _scriptless(self) -> int:
        """Return the scriptless limit of a filter that grows but does not forget; else 0."""
        record = self._current()
        return record.growth.scriptless_limit if record.expansion and not record.ttl else 0

    def _identity(self, shard: int) -> bytes:
        found = self._identities.get(shard)
        if found is None:
            record = self._current()
            found = layout.identity(record.filter_id, shard, record.spec.hash_count)
            self._identities[shard] = found
        return found

    def _recover(self, found: dict[int, bytes]) -> None:
        """Sort out shards whose header did not match (see :meth:`.Lifecycle.recover`)."""
        record = self.lifecycle.recover(self._current(), found, self.wanted)
        self._adopt(record)

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

    def _settle(self) -> None:
        """Add the elements let through while Redis could not answer, now that it answers."""
        owed, self._owed = self._owed, {}
        outcome = self._bulk.run(True, list(owed.values()))
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

    def contains(self, element: str | bytes) -> bool:
        """Return True if the element is (probably) in the filter. Changes nothing."""
        return self.contains_many([element])[0]

    def add_many(self, elements: Iterable[str | bytes]) -> list[bool]:
        """Add elements in bulk; return, per element, whether it was there already.

        The result equals calling :meth:`check_and_add` on each element in order,
        under the same answer contract. The counts reach Redis before it returns.
        """
        with self._lock:
            outcome = self._run_bulk(True, elements)
            self.counters.record(outcome.added, outcome.seen)
            if self.record is not None:
                self.counters.sync(self.parts, self.spec)
            return outcome.answers

    def contains_many(self, elements: Iterable[str | bytes]) -> list[bool]:
        """Return, per element, whether it is (probably) in the filter."""
        with self._lock:
            return self._run_bulk(False, elements).answers

    def _run_bulk(self, write: bool, elements: Iterable[str | bytes]) -> Outcome:
        try:
            self._current()
        except FilterUnavailableError as exc:
            items: Sequence[str | bytes] = list(elements)
            outcome = Outcome(answers=self._unavailable(exc, len(items)), failed=list(items))
        else:
            outcome = self._bulk.run(write, elements)
            self.events.count("ambiguous", outcome.ambiguous)
            if outcome.errors:
                self._unavailable(
                    FilterUnavailableError(f"Redis could not take {outcome.errors:,} element(s)"),
                    outcome.errors,
                )
        if write and outcome.failed:
            self._owe({_tag(e): e for e in outcome.failed})
        elif write and self._owed and len(outcome.answers) > outcome.errors:
            self._settle()
        return outcome
