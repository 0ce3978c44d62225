"""Opening a filter: creating it whole, or checking every part of it; recovering lost parts.

One flow for both backends, whose :class:`Shards` make, check and delete shards. Creating
writes the record (``creating``), markers and shards, then ``ready``: each step idempotent,
so any worker finishes a creation. A missing record or marker over intact shards is
restored, another id adopted, a lost shard raised or recreated (``BLOOMFILTER_ON_LOSS``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from scrapy_redis_bloom.core import layout
from scrapy_redis_bloom.core.errors import (
    BloomFilterError,
    FilterDamagedError,
    FilterMissingError,
    OrphanedShardsError,
    ServerListMismatchError,
    Wording,
)
from scrapy_redis_bloom.core.events import FilterEvents, RateLimitedLog
from scrapy_redis_bloom.core.record import FilterRecord
from scrapy_redis_bloom.core.settings import FaultPolicy
from scrapy_redis_bloom.engine import health
from scrapy_redis_bloom.engine.parts import Parts, pairs
from scrapy_redis_bloom.transport.executor import Call
from scrapy_redis_bloom.transport.topology import Topology
from scrapy_redis_bloom.transport.wire import pack_command

logger = logging.getLogger(__name__)

#: Parts named in an error message, at most.
NAMED = 5
#: Shards whose headers are checked when a ready filter is opened, at most.
VERIFIED = 4096
#: Least seconds between two readings of the servers' policies after losses (:meth:`loss_found`).
RECHECK_INTERVAL = 60.0


def sample(shards: int, servers: int) -> range | list[int]:
    """Return the shards checked at open: all, or :data:`VERIFIED` (each server's first, spread)."""
    if shards <= VERIFIED:
        return range(shards)
    first = min(servers, VERIFIED // 2)
    step = (shards - first) / (VERIFIED - first)
    spread = {first + int(j * step) for j in range(VERIFIED - first)}
    return sorted(set(range(first)) | spread | {shards - 1})


class Shards(Protocol):
    """How a backend makes, checks and deletes shards; :class:`Lifecycle` decides when."""

    #: How messages name the filter: "Bloom filter", "native Bloom filter".
    noun: str
    #: The filter's parts and its servers.
    parts: Parts
    topology: Topology

    def shard_key(self, record: FilterRecord, shard: int) -> str:
        """Return the key of a shard (for messages)."""

    def check_servers(self) -> None:
        """Refuse servers that cannot hold the filter (a missing permission, no ``BF.*``)."""

    def prepare(
        self, wanted: FilterRecord, servers: list[health.ServerHealth], markers: list[str | None]
    ) -> FilterRecord | None:
        """Before a record is created: refuse what cannot be; return one restored or raced."""

    def create(self, record: FilterRecord, shards: Iterable[int], replace: bool = False) -> int:
        """Create shards (``replace``: where lost); return how many; refuse a foreign key."""

    def recreate(self, record: FilterRecord, shards: Iterable[int]) -> tuple[int, dict[int, str]]:
        """Create lost shards anew; return how many, and per shard what it kept (said)."""

    def missing(self, record: FilterRecord, shards: Iterable[int]) -> dict[int, str]:
        """Return the lost shards, with what stands in their place; refuse a foreign key."""

    def misfits(self, record: FilterRecord, shards: Iterable[int]) -> dict[int, str]:
        """Return the shards (present) not as the record says, and what; one past the last."""

    def delete(self, record: FilterRecord) -> int:
        """Delete every part of the filter still its own, its record last; return how many."""


class Lifecycle:
    """Opens, checks and recovers a filter, whose backend keeps ``shards``."""

    def __init__(self, shards: Shards, faults: FaultPolicy, events: FilterEvents) -> None:
        self.shards = shards
        self.parts = shards.parts
        self.topology = shards.topology
        self.faults = faults
        self.events = events
        self.key = self.parts.key
        #: Why the backend is fixed whatever BLOOMFILTER_BACKEND says (:meth:`FilterRecord.check`).
        self.fixed: str | None = None
        self._rechecked: float | None = None  # when loss_found() last read the policies
        self._log = RateLimitedLog(logger)  # losses a full Redis repeats: counted, said a minute

    def open(self, wanted: FilterRecord, create: bool = True) -> FilterRecord:
        """Create the filter ``wanted``, or check it; return its record (the geometry to use)."""
        servers = health.survey(self.parts.executor, self.topology)
        health.check_versions(servers)
        health.check_primaries(servers)
        self.shards.check_servers()
        record = self.parts.read_record()
        if record is None:
            if not create:
                self.check_placement()  # the record is on another server of the list
                left = (
                    " Its shards are there without it (the record was evicted or deleted): a"
                    " worker that opens the filter to add (a crawl, scrapy bloom add) restores"
                    " it from them."
                    if self.parts.existing([0])
                    else ""
                )
                raise FilterMissingError(
                    f"There is no Bloom filter {self.key!r} (no config record"
                    f" {self.parts.meta_key!r}) on {self.topology.describe()}.{left}"
                )
            self.parts.spec = wanted.spec
            # A server listed out of place is refused before anything is written.
            markers = self.parts.markers(wanted.servers)
            self.check_markers(markers, wanted.servers)
            restored = self.shards.prepare(wanted, servers, markers)
            if restored is None:
                self._lost_whole(wanted)
            record = restored if restored is not None else self.parts.create_record(wanted)
        record = self._settle(record, wanted)
        self.events.set("eviction_risk", health.warn_risks(self.key, servers, record.ttl > 0))
        self._warn_seed_floor(record)
        return record

    def _lost_whole(self, wanted: FilterRecord) -> None:
        """Refuse (or, as ``ON_LOSS`` says, recreate) a filter whose counters outlived it.

        A reset deletes ``KEY:count`` before the record: counters without a record are a
        record lost. The bitmap shards were then found gone too (:meth:`Shards.prepare`); a
        native filter's are named by the id the record held, so no worker finds them.
        """
        counter = self.parts.counter_key
        call = Call(pack_command(b"HGETALL", counter), key=counter)
        (counts,) = self.parts.run("read the filter's counters", [call], take=pairs)
        if counts.get("added", "0") == "0":  # none, or a sync's after a reset: nothing lost
            return
        added = counts.get("added", "?")
        if wanted.backend == "native":
            raise OrphanedShardsError(
                f"The native Bloom filter {self.key!r} has lost its config record"
                f" {self.parts.meta_key!r}, but its counters {counter!r} remain ({added}"
                " added): its shards, named by the id the record held, may still be in Redis."
                " A worker still running on it restores the record within seconds: start"
                " this one again then. Else reset the filter (scrapy bloom reset --key"
                f" {self.key!r} finds what is left and deletes it), or restore it from a dump."
                " A new filter beside them would take every URL for new."
            )
        if self.faults.on_loss == "raise":
            raise FilterDamagedError(
                f"The Bloom filter {self.key!r} was lost whole: its config record"
                f" {self.parts.meta_key!r} and every shard are gone (evicted, see"
                " maxmemory-policy, or deleted), and only its counters"
                f" {counter!r} remain ({added} added). The URLs it held would be taken for new,"
                " so nothing is created. Reset the filter (scrapy bloom reset --key"
                f" {self.key!r}) to start over, or set BLOOMFILTER_ON_LOSS = 'recreate' to go on"
                " with it empty (URLs it held may be fetched again, never dropped)."
            )
        self.parts.run(
            "delete the lost filter's counters",
            [self.parts.delete_if_still(counter, "counters")],
            write=True,
        )
        self.events.count("recreated", wanted.spec.shards)
        logger.warning(
            "The Bloom filter %r was lost whole (its record and every shard gone: evicted or"
            " deleted; its counters, %s added, were left): created anew, empty"
            " (BLOOMFILTER_ON_LOSS = 'recreate'). URLs it held may be fetched again.",
            self.key,
            added,
        )

    def loss_found(self, expiring: bool) -> None:
        """Re-read the servers' maxmemory-policy (changed since open?) once a part was lost."""
        now = time.monotonic()
        if self._rechecked is not None and now - self._rechecked < RECHECK_INTERVAL:
            return
        self._rechecked = now
        try:
            servers = health.survey(self.parts.executor, self.topology)
        except BloomFilterError as exc:  # the loss is said by the caller; this is its cause
            logger.info("Could not read the maxmemory-policy of %s: %s", self.key, exc)
            return
        self.events.set("eviction_risk", health.warn_risks(self.key, servers, expiring))

    def _warn_seed_floor(self, record: FilterRecord) -> None:
        """Warn (and a stat) when a scheme-1 filter's generation 0 floor passes 1/10 its rate."""
        if record.backend != "bitmap" or not record.spec.two_seeds:
            return
        growth = record.growth
        first = growth.generation(0)
        if first.seed_floor <= growth.bound / 10:
            return
        self.events.set("rate_floor", first.seed_floor)
        logger.warning(
            "The Bloom filter %r has hash scheme 1 (a classic filter of an earlier build),"
            " whose elements share all their bits with probability 1/S**2 in a generation of"
            " S bits: at its capacity (%s items in %s bits per shard) its false-positive"
            " rate cannot go below %.3g, against the %.3g its bits give. Reset it"
            " (scrapy bloom reset --key %r; it forgets every URL it holds): a new"
            " classic filter has hash scheme 3, whose floor is S times lower.",
            self.key,
            f"{first.capacity:,}",
            f"{first.bits:,}",
            first.seed_floor,
            growth.bound,
            self.key,
        )

    def _settle(self, record: FilterRecord, wanted: FilterRecord) -> FilterRecord:
        """Check a record against this worker's request; verify it, or finish creating it."""
        record.check(self.key, wanted, self.fixed)
        self.parts.spec = record.spec
        if record.state != "creating":
            return self.verify(record, wanted)
        self.check_markers(self.parts.markers(record.servers), record.servers, record.filter_id)
        self.parts.write_markers(record, range(record.servers))
        created = self.shards.create(record, range(record.spec.shards))
        self.parts.mark_ready()
        logger.debug(
            "%s the %s %r (id %s) on %s: %s shard(s).",
            "Created" if created else "Found the shards of",  # (a racing worker's)
            self.shards.noun,
            self.key,
            record.filter_id,
            self.topology.describe(),
            f"{record.spec.shards:,}",
        )
        return record.ready()

    def verify(self, record: FilterRecord, wanted: FilterRecord) -> FilterRecord:
        """Check every marker and a :func:`sample` of the shards (every check finds the rest)."""
        markers = self.parts.markers(record.servers)
        self.check_markers(markers, record.servers, record.filter_id)
        missing_markers = [i for i, marker in enumerate(markers) if marker is None]
        checked = sample(record.spec.shards, record.servers)
        lost = self.shards.missing(record, checked)
        # A record edited by hand, or another filter's, would read other bits than those set.
        wrong = self.shards.misfits(record, [shard for shard in checked if shard not in lost])
        if wrong:
            raise FilterDamagedError(
                f"The config record {self.parts.meta_key!r} of the {self.shards.noun}"
                f" {self.key!r} does not describe its shards: {self._list(record, wrong)}."
                " The record was edited, or belongs to another filter: put back the record"
                " the filter was created with, or reset the filter (which forgets every URL"
                " it holds)."
            )
        if lost or missing_markers:
            return self.recover(record, lost, wanted, missing_markers)
        return record

    def check_placement(self) -> None:
        """Refuse the listed servers if their markers place them elsewhere (no record found)."""
        servers = self.topology.servers
        self.check_markers(self.parts.markers(servers), servers)

    def check_markers(self, markers: list[str | None], servers: int, filter_id: str = "") -> None:
        """Refuse servers listed in another order, or holding another filter (of ``filter_id``)."""
        for i, marker in enumerate(markers):
            if marker is None:
                continue
            parsed = layout.parse_marker(marker)
            if parsed is None:
                raise ServerListMismatchError(
                    Wording(
                        "Redis at {server} holds {key!r} = {marker!r}, which is not a Bloom"
                        " filter's server marker: another program uses that key. Choose"
                        " another {BLOOMFILTER_KEY}, or remove that key if it is not needed.",
                        server=self._server(i),
                        key=self.parts.marker_key,
                        marker=marker[:40],
                    )
                )
            place = f"{parsed[1]}/{parsed[2]}"
            if place != f"{i}/{servers}":
                raise ServerListMismatchError(
                    Wording(
                        "Redis at {server} is server {place} of the Bloom filter {key!r}, but"
                        " this worker lists it as server {i}/{servers}. List the servers in"
                        " {BLOOMFILTER_REDIS_URLS} exactly as when the filter was created"
                        " (same servers, same order). Shards are never re-mapped to other"
                        " servers.",
                        server=self._server(i),
                        place=place,
                        key=self.key,
                        i=i,
                        servers=servers,
                    )
                )
        for i, marker in enumerate(markers if filter_id else ()):
            if marker not in (None, layout.server_marker(filter_id, i, servers)):
                raise ServerListMismatchError(
                    f"Redis at {self._server(i)} holds part of another Bloom filter named"
                    f" {self.key!r} (marker {marker!r}), not of the one whose record is on"
                    f" server 0 (id {filter_id}). The server list mixes two filters'"
                    " servers: list the filter's own servers, or reset the filter on every"
                    " server."
                )

    def recover(
        self,
        record: FilterRecord,
        shards: Iterable[int],
        wanted: FilterRecord,
        missing_markers: Sequence[int] = (),
    ) -> FilterRecord:
        """Sort out shards found lost or wrong (see the module's docstring); return the record."""
        current = self.parts.read_record()
        if current is not None and current.filter_id != record.filter_id:
            self.events.count("reopened")
            logger.warning(
                "The Bloom filter %r was reset and created again (id %s, was %s) while this"
                " worker used it: going on with the new filter.",
                self.key,
                current.filter_id,
                record.filter_id,
            )
            return self._settle(current, wanted)
        # Only shards wrong now; a record lost (or the whole filter) is restored from this copy.
        lost = self.shards.missing(record, range(record.spec.shards) if current is None else shards)
        if current is None and (len(lost) < record.spec.shards or self.faults.on_loss != "raise"):
            self._write_back(record)
        lost_servers = sorted(set(missing_markers) & {s % record.servers for s in lost})
        if lost or missing_markers:
            self.loss_found(record.ttl > 0)
        if lost and self.faults.on_loss == "raise":
            raise FilterDamagedError(
                f"{len(lost):,} of the {record.spec.shards:,} shards of the {self.shards.noun}"
                f" {self.key!r} are gone: {self._list(record, lost)}."
                + (
                    f" Server(s) {', '.join(self._server(i) for i in lost_servers)} hold"
                    " none of the filter's parts: emptied or replaced."
                    if lost_servers
                    else ""
                )
                + " They were evicted (see maxmemory-policy), deleted, or their server lost its"
                " data (a restart without persistence). The URLs they held would be taken"
                " for new, so the crawl stops here. Set BLOOMFILTER_ON_LOSS = 'recreate' to"
                " go on with those shards empty (URLs they held may be fetched again, never"
                " dropped), or reset the filter."
            )
        if missing_markers:
            self.parts.write_markers(record, missing_markers)
            if not lost_servers:
                self.events.count("restored", len(missing_markers))
                self._log.log(
                    logging.WARNING,
                    "restored",
                    "Restored the server marker of the %s %r on %s (evicted or"
                    " deleted; the shards there are intact).",
                    self.shards.noun,
                    self.key,
                    ", ".join(self._server(i) for i in missing_markers),
                )
        if lost:
            created, kept = self.shards.recreate(record, lost)
            self.events.count("recreated", created)
            self._log.log(
                logging.WARNING,
                "recreated",
                "Recreated %d lost shard(s) of the %s %r empty"
                " (BLOOMFILTER_ON_LOSS = 'recreate'): %s. URLs they held may be fetched"
                " again.%s",
                len(lost),
                self.shards.noun,
                self.key,
                self._list(record, lost),
                _kept(kept),
            )
        return record

    def restore_record(self, record: FilterRecord) -> bool:
        """Write back the config record, found gone, while every shard is intact; say if so."""
        try:
            if self.parts.read_record() is not None:
                return False
            if self.shards.missing(record, range(record.spec.shards)):
                return False
            self._write_back(record)
        except BloomFilterError as exc:
            logger.warning("Could not restore the Bloom filter %r's record: %s", self.key, exc)
            return False
        return True

    def _write_back(self, record: FilterRecord) -> None:
        self.parts.create_record(record)
        self.events.count("restored")
        logger.warning(
            "The config record %r of the Bloom filter %r was gone (evicted or deleted)"
            " while this worker used it: restored from this worker's copy.",
            self.parts.meta_key,
            self.key,
        )
        self.loss_found(record.ttl > 0)

    def _server(self, i: int) -> str:
        return self.topology.route(None, None, i).address

    def _list(self, record: FilterRecord, found: dict[int, str]) -> str:
        return named(self.topology, lambda shard: self.shards.shard_key(record, shard), found)


def _kept(kept: dict[int, str]) -> str:
    """Say what lost shards kept of their growth (up to :data:`NAMED`); "" if nothing."""
    if not kept:
        return ""
    listed = [f"shard {shard}: {what}" for shard, what in list(kept.items())[:NAMED]]
    more = len(kept) - NAMED
    return (
        " Only their generation 0 is new: the generations grown after it, found intact, were"
        " kept, and the URLs they hold are still seen ("
        + "; ".join(listed)
        + (f"; and {more:,} more" if more > 0 else "")
        + ")."
    )


def named(topology: Topology, key: Callable[[int], str], found: dict[int, str]) -> str:
    """Name up to :data:`NAMED` shards: their keys (``key(shard)``), where, what is there."""
    listed = [
        f"{key(shard)!r} on {topology.route(key(shard), shard, None).address}: {what}"
        for shard, what in list(found.items())[:NAMED]
    ]
    more = len(found) - NAMED
    return "; ".join(listed) + (f"; and {more:,} more" if more > 0 else "")
