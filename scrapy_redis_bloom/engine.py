"""The Bloom filter in Redis: sharded bitmaps, one atomic script call per element.

:class:`RedisBloomFilter` knows Redis and the hashing scheme, nothing of Scrapy.
Elements are request fingerprints as hex strings (see :mod:`.hashing`). The client
may be a ``redis.Redis`` or a ``redis.RedisCluster``: every command touches one key.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import mmh3
from redis.exceptions import RedisError, ResponseError

from . import layout, scripts
from .errors import (
    BloomFilterError,
    ConfigMismatchError,
    FilterMissingError,
    OrphanedShardsError,
    ServerListMismatchError,
    WrongTypeError,
)
from .hashing import SCHEME_VERSION, FilterSpec, locate, offset_steps
from .wire import (
    CONNECTION_ERRORS,
    BitfieldPacker,
    HeldConnection,
    ScriptCaller,
    pack_command,
)

logger = logging.getLogger(__name__)

#: Commands sent per pipeline flush by the maintenance operations.
BATCH = 1000
#: Elements hashed, grouped per shard and sent together by add_many / contains_many.
BULK_CHUNK = 10_000
#: Bits per BITFIELD command of the bulk path (a multiple of k is used): about 1 ms
#: of Redis time, so other clients wait no longer than that between commands.
BULK_BITS = 5_000
#: check_and_add outcomes counted locally before they are added to Redis's counters.
SYNC_EVERY = 10_000


class _Script:
    """A Lua script called by SHA, loaded on the first NOSCRIPT reply."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


_ALLOCATE = scripts.ALLOCATE.encode()


@dataclass
class _ServerPlan:
    """One server's share of a bulk chunk: shards to allocate, BITFIELDs to run."""

    allocations: list[int] = field(default_factory=list)
    #: (shard, first, end): that slice of the shard's offsets in one BITFIELD.
    commands: list[tuple[int, int, int]] = field(default_factory=list)
    #: The held connection's generation when sent on it, else None.
    sent: int | None = None


@dataclass
class _Chunk:
    """A hashed bulk chunk: per shard, its elements' positions and k offsets each."""

    write: bool
    size: int
    groups: dict[int, tuple[list[int], list[int]]]
    plans: dict[int, _ServerPlan]


def _text(value: Any) -> str:
    """Decode a reply item: clients with or without ``decode_responses``."""
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class FilterRecord:
    """The config record stored beside the bits (``KEY:meta``)."""

    spec: FilterSpec
    capacity: int
    created: float
    servers: int = 1
    layout: int = layout.LAYOUT_VERSION
    scheme: int = SCHEME_VERSION

    def geometry(self) -> tuple[object, ...]:
        """Return what every worker of the filter must agree on."""
        return (self.spec, self.servers, self.scheme, self.layout)

    def fields(self) -> dict[str, str]:
        """Return the record as the hash fields written to Redis."""
        spec = self.spec
        values = {
            "layout": self.layout,
            "scheme": self.scheme,
            "shards": spec.shards,
            "shard_bits": spec.shard_bits,
            "hash_count": spec.hash_count,
            "bits": spec.bits,
            "capacity": self.capacity,
            "servers": self.servers,
            "generations": "0",
            "created": repr(self.created),
        }
        return {name: str(values[name]) for name in layout.RECORD_FIELDS}

    @classmethod
    def parse(cls, key: str, fields: dict[str, str]) -> FilterRecord:
        """Build a record from the hash read back; refuse one this version cannot read."""
        try:
            return cls(
                spec=FilterSpec(
                    shards=int(fields["shards"]),
                    shard_bits=int(fields["shard_bits"]),
                    hash_count=int(fields["hash_count"]),
                ),
                capacity=int(fields["capacity"]),
                created=float(fields["created"]),
                servers=int(fields.get("servers", 1)),
                layout=int(fields["layout"]),
                scheme=int(fields["scheme"]),
            )
        except (KeyError, ValueError) as exc:
            raise BloomFilterError(
                f"The config record {key!r} is not one this version of scrapy-redis-bloom"
                f" can read ({exc!r} in {fields!r}). Check that BLOOMFILTER_KEY names a"
                " filter created by scrapy-redis-bloom."
            ) from None

    def describe(self) -> str:
        """Return the geometry as the user would compare it with settings."""
        spec = self.spec
        return (
            f"m={spec.bits:,} bits in {spec.shards:,} shard(s) of {spec.shard_bits:,} bits,"
            f" k={spec.hash_count}, {self.servers} server(s), hash scheme {self.scheme},"
            f" layout {self.layout}"
            f" (sized for {self.capacity:,} items)"
        )


@dataclass(frozen=True, slots=True)
class FilterState:
    """What the bits say about the filter, read with BITCOUNT and MEMORY USAGE."""

    spec: FilterSpec
    bits_set_per_shard: tuple[int, ...]
    memory_bytes: int

    @property
    def bits_set(self) -> int:
        """Number of bits set over all shards."""
        return sum(self.bits_set_per_shard)

    @property
    def fill_ratio(self) -> float:
        """Fraction of all bits that are set."""
        return self.bits_set / self.spec.bits

    @property
    def estimated_items(self) -> int:
        """Items added, estimated per shard as n = -(S/k) ln(1 - X/S) and summed.

        A saturated shard (every bit set) is counted as if one bit were still clear:
        the estimate is then a lower bound.
        """
        size, k = self.spec.shard_bits, self.spec.hash_count
        total = 0.0
        for ones in self.bits_set_per_shard:
            total += -size / k * math.log1p(-min(ones, size - 1) / size) if size > 1 else ones
        return round(total)

    @property
    def estimated_fpr(self) -> float:
        """Chance that a new element is reported seen now: the mean of (X/S)**k over shards."""
        size, k = self.spec.shard_bits, self.spec.hash_count
        rates = [(ones / size) ** k for ones in self.bits_set_per_shard]
        return sum(rates) / len(rates)


@dataclass(frozen=True, slots=True)
class FilterTotals:
    """Outcomes of check-and-add over all workers, summed from the shards' counters."""

    added: int
    seen: int


class RedisBloomFilter:
    """A Bloom filter kept in Redis string bitmaps, sharded over several keys.

    ``client`` is a ``redis.Redis``, a ``redis.cluster.RedisCluster``, or a sequence
    of standalone clients (several servers: shard ``i`` on server ``i mod n``).
    Call :meth:`open` first (the element methods do so on first use): it creates the
    config record or checks this instance's geometry against it, and refuses keys of
    the wrong type and a server list that differs from the filter's.
    """

    def __init__(
        self, client: Any, key: str, spec: FilterSpec, capacity: int, cache_size: int = 0
    ) -> None:
        self.clients: tuple[Any, ...] = (
            tuple(client) if isinstance(client, (list, tuple)) else (client,)
        )
        if not self.clients:
            raise ValueError("a filter needs at least one Redis client")
        self.client = self.clients[0]  # holds the record and the worker registry
        self.key = key
        self.spec = spec
        self.capacity = capacity
        self.meta_key = layout.meta_key(key)
        self.workers_key = layout.workers_key(key)
        self.shard_keys = layout.shard_keys(key, spec.shards)
        self.counter_keys = [layout.counter_key(name) for name in self.shard_keys]
        servers = len(self.clients)
        self._shard_clients = [self.clients[i % servers] for i in range(spec.shards)]
        self._opened = False
        # One held connection per server, for hand-packed commands (see .wire).
        self._held = [HeldConnection(c) for c in self.clients]
        add_one = _Script(scripts.check_and_add_one(spec.hash_count, spec.shard_bits))
        callers = [ScriptCaller(held, add_one.source, add_one.sha) for held in self._held]
        self._add_one = [callers[i % servers] for i in range(spec.shards)]
        self._packers = {write: BitfieldPacker(write) for write in (True, False)}
        # The near-cache: 128-bit digests of elements known to be in the filter, oldest
        # first. A Bloom filter never forgets, so a hit is "seen" without a round trip.
        self.cache_size = cache_size
        self._cache: OrderedDict[int, None] = OrderedDict()
        self.cache_hits = 0
        # check_and_add's outcomes not yet added to the counters in Redis.
        self._unsynced_added = self._unsynced_seen = 0

    def __repr__(self) -> str:
        spec = self.spec
        return (
            f"<RedisBloomFilter key={self.key!r} bits={spec.bits} shards={spec.shards}"
            f" hash_count={spec.hash_count} capacity={self.capacity}"
            f" servers={len(self.clients)}>"
        )

    # -- lifecycle ---------------------------------------------------------------

    def open(self, create: bool = True) -> FilterRecord:
        """Create the filter's config record, or check this geometry against it.

        With ``create=False`` a missing filter raises :class:`FilterMissingError`
        instead of being created (for tools that must not create one by accident).
        Raises :class:`WrongTypeError` if a key where the filter lives holds another
        type, :class:`OrphanedShardsError` if bits exist without a record,
        :class:`ConfigMismatchError` if the record describes another geometry, and
        :class:`ServerListMismatchError` if the servers are not the filter's.
        """
        self._check_servers()
        # Shards are read before the record: a record is written before any bit and
        # deleted after them, so a concurrent create or clear cannot look orphaned.
        keys = [*self.shard_keys, self.meta_key]
        types = dict(zip(keys, self._pipelined(self._calls("type", keys)), strict=True))
        types = {key: _text(kind) for key, kind in types.items()}
        expected = {self.meta_key: ("hash", "config record")}
        wrong = [
            (key, kind, *expected.get(key, ("string", "bitmap shard")))
            for key, kind in types.items()
            if kind != "none" and kind != expected.get(key, ("string",))[0]
        ]
        if wrong:
            key, kind, want, role = wrong[0]
            raise WrongTypeError(
                f"Redis key {key!r} holds a {kind}, where the Bloom filter's {role} (a {want})"
                f" belongs ({len(wrong)} such key(s)). Choose another BLOOMFILTER_KEY, or"
                " remove the key(s) if they are not needed."
            )
        if types[self.meta_key] == "none":
            present = sum(1 for key in self.shard_keys if types[key] != "none")
            if present:
                raise OrphanedShardsError(
                    f"{present} shard key(s) of the Bloom filter {self.key!r} exist, but its"
                    f" config record {self.meta_key!r} does not, so the layout of their bits"
                    " is unknown. Reset the filter (scrapy-redis-bloom reset --key"
                    f" {self.key!r}) or choose another BLOOMFILTER_KEY."
                )
        stored = self._ensure_record(create)
        self._opened = True
        return stored

    def _check_servers(self) -> None:
        """Refuse servers listed in another order or number than at creation.

        Each server of a multi-server filter holds ``KEY:server`` = ``i/n``, written
        when the filter is created; a worker that sees another value stops before
        writing anything, so shards are never re-mapped silently.
        """
        if len(self.clients) == 1:
            return
        marker = layout.server_key(self.key)
        count = len(self.clients)
        for i, client in enumerate(self.clients):
            found = client.get(marker)
            if found is not None and _text(found) != f"{i}/{count}":
                where = server_address(client)
                raise ServerListMismatchError(
                    f"Redis at {where} is server {_text(found)} of the Bloom filter"
                    f" {self.key!r}, but this worker lists it as server {i}/{count}. List the"
                    " servers in BLOOMFILTER_REDIS_URLS exactly as when the filter was created"
                    " (same servers, same order), or reset the filter on every server"
                    f" (scrapy-redis-bloom reset --key {self.key!r}). Shards are never"
                    " re-mapped to other servers."
                )

    def _mark_servers(self) -> None:
        if len(self.clients) > 1:
            marker = layout.server_key(self.key)
            for i, client in enumerate(self.clients):
                client.set(marker, f"{i}/{len(self.clients)}", nx=True)
            self._check_servers()

    def _ensure_record(self, create: bool = True) -> FilterRecord:
        """Write the config record unless it exists; check this geometry against it."""
        mine = FilterRecord(
            spec=self.spec, capacity=self.capacity, created=time.time(), servers=len(self.clients)
        )
        argv = [item for pair in mine.fields().items() for item in pair] if create else []
        try:
            reply = self.client.eval(scripts.CREATE_RECORD, 1, self.meta_key, *argv)
        except ResponseError as exc:
            self._raise_if_wrong_type(exc, self.meta_key)
            raise
        if not reply:
            raise FilterMissingError(
                f"There is no Bloom filter {self.key!r} (no config record {self.meta_key!r})."
            )
        stored = FilterRecord.parse(
            self.meta_key, {_text(reply[i]): _text(reply[i + 1]) for i in range(0, len(reply), 2)}
        )
        if stored.geometry() != mine.geometry():
            created = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stored.created))
            raise ConfigMismatchError(
                f"The Bloom filter {self.key!r} in Redis was created on {created} with"
                f" {stored.describe()}; this worker is configured with {mine.describe()}."
                " A filter's layout cannot change once it holds bits. Either start this"
                " worker with the settings the filter was created with, choose another"
                " BLOOMFILTER_KEY, or reset the filter (scrapy-redis-bloom reset --key"
                f" {self.key!r}), which forgets every URL it has seen."
            )
        self._mark_servers()
        return stored

    def exists(self) -> bool:
        """Tell whether the filter's config record is in Redis."""
        return bool(self.client.exists(self.meta_key))

    def close(self) -> None:
        """Give back the connections :meth:`check_and_add` holds. The filter stays usable."""
        for held in self._held:
            held.close()

    def clear(self) -> None:
        """Delete every shard and counter, then the record (UNLINK: freed in the background).

        Another worker still adding meanwhile re-creates the shards it touches and,
        seeing it allocated one, the record: the filter stays consistent. The worker
        registry is kept: leases belong to the workers.
        """
        calls = [
            *self._calls("unlink", self.shard_keys),
            *self._calls("unlink", self.counter_keys),
            *[(client, "unlink", layout.server_key(self.key)) for client in self.clients[1:]],
            (self.client, "unlink", layout.server_key(self.key)),
            (self.client, "unlink", self.meta_key),
        ]
        for _ in self._pipelined(calls):
            pass
        self._opened = False
        self._cache.clear()
        self._unsynced_added = self._unsynced_seen = 0  # their counters went with it

    def state(self) -> FilterState:
        """Read the bits set per shard and the memory Redis allocates for them."""
        counts: list[int] = []
        memory = 0
        calls = [
            call
            for shard, key in enumerate(self.shard_keys)
            for call in (
                (self._shard_clients[shard], "bitcount", key),
                (self._shard_clients[shard], "memory_usage", key),
            )
        ]
        for i, reply in enumerate(self._pipelined(calls)):
            if i % 2 == 0:
                counts.append(int(reply))
            else:
                memory += int(reply or 0)
        return FilterState(spec=self.spec, bits_set_per_shard=tuple(counts), memory_bytes=memory)

    def totals(self) -> FilterTotals:
        """Sum the shards' counters: elements added and check-and-adds that found them seen.

        Workers add their counts every SYNC_EVERY calls and when they close: the
        totals are exact once every worker has closed.
        """
        added = seen = 0
        for reply in self._pipelined(self._calls("hmget", self.counter_keys, "added", "seen")):
            added += int(reply[0] or 0)
            seen += int(reply[1] or 0)
        return FilterTotals(added=added, seen=seen)

    def lease(self, worker_id: str, ttl: float) -> WorkerLease:
        """Return this worker's lease in the filter's registry of live workers."""
        return WorkerLease(self.client, self.workers_key, worker_id, ttl)

    def live_workers(self) -> list[str]:
        """Return the ids (``host:pid:random``) of the workers holding a live lease."""
        return live_workers(self.client, self.key)

    # -- elements ----------------------------------------------------------------

    def check_and_add(self, element: str | bytes) -> bool:
        """Add an element; return True if it was (probably) there already.

        An element in the near-cache answers True at once. Otherwise one atomic
        script call: of several workers adding the same element at once, exactly one
        gets False.
        """
        h1, h2 = mmh3.hash64(element, seed=0, x64arch=True, signed=False)
        cache = self._cache
        tag = h1 | h2 << 64
        if tag in cache:
            cache.move_to_end(tag)
            self.cache_hits += 1
            self._count(seen=True)
            return True
        if not self._opened:
            self.open()
        spec = self.spec
        shard = h1 % spec.shards
        x, y = (h1 // spec.shards) % spec.shard_bits, h2 % spec.shard_bits
        key = self.shard_keys[shard]
        try:
            reply = self._add_one[shard](key, x, y)
        except ResponseError as exc:
            self._raise_if_wrong_type(exc, key, self._shard_clients[shard])
            raise
        if reply & 2:  # this call allocated the shard: the filter may have been cleared
            self._ensure_record()
        if self.cache_size:
            cache[tag] = None
            if len(cache) > self.cache_size:
                cache.popitem(last=False)
        seen = bool(reply & 1)
        self._count(seen)
        return seen

    def _count(self, seen: bool) -> None:
        """Count an outcome locally; add the counts to Redis every SYNC_EVERY."""
        if seen:
            self._unsynced_seen += 1
        else:
            self._unsynced_added += 1
        if self._unsynced_seen + self._unsynced_added >= SYNC_EVERY:
            self.sync_counters()

    def sync_counters(self) -> None:
        """Add the unsynced outcomes of :meth:`check_and_add` to the counters in Redis.

        check_and_add counts locally (a command saved per request, in the script), and
        the counts go to shard 0's counter, where :meth:`totals` sums them with the rest.
        """
        added, seen = self._unsynced_added, self._unsynced_seen
        if added or seen:
            self._unsynced_added = self._unsynced_seen = 0
            pipe = self._shard_clients[0].pipeline(transaction=False)
            pipe.hincrby(self.counter_keys[0], "added", added)
            pipe.hincrby(self.counter_keys[0], "seen", seen)
            pipe.execute()

    def contains(self, element: str | bytes) -> bool:
        """Return True if the element is (probably) in the filter. Changes nothing."""
        return self.contains_many([element])[0]

    def add_many(self, elements: Iterable[str | bytes]) -> list[bool]:
        """Add elements in bulk; return, per element, whether it was there already.

        The result equals calling :meth:`check_and_add` on each element in order.
        The outcomes are added to the counters in Redis before returning.
        """
        result = self._bulk(True, elements)
        self.sync_counters()
        return result

    def contains_many(self, elements: Iterable[str | bytes]) -> list[bool]:
        """Return, per element, whether it is (probably) in the filter."""
        return self._bulk(False, elements)

    # -- plumbing ----------------------------------------------------------------

    def _bulk(self, write: bool, elements: Iterable[str | bytes]) -> list[bool]:
        """Set (or read) the elements' bits in chunks of BULK_CHUNK elements.

        On standalone servers the chunks overlap: chunk n+1 is hashed, packed and
        sent while Redis still works on chunk n, whose replies are read after.
        """
        if not self._opened:
            self.open()
        result: list[bool] = []
        pending: _Chunk | None = None
        remaining = iter(elements)
        while chunk := list(itertools.islice(remaining, BULK_CHUNK)):
            prepared = self._prepare(write, chunk)
            self._send(prepared)
            if pending is not None:
                result.extend(self._collect(pending))
            pending = prepared
        if pending is not None:
            result.extend(self._collect(pending))
        return result

    def _prepare(self, write: bool, elements: Sequence[str | bytes]) -> _Chunk:
        """Hash a chunk and plan its commands: per server, per shard, BULK_BITS bits each."""
        spec = self.spec
        k, size, shards = spec.hash_count, spec.shard_bits, spec.shards
        steps = offset_steps(k)
        groups: dict[int, tuple[list[int], list[int]]] = {}
        for i, element in enumerate(elements):
            shard, x, y = locate(element, shards, size)
            group = groups.get(shard)
            if group is None:
                group = groups[shard] = ([], [])
            group[0].append(i)
            group[1].extend([(x + j * y + c) % size for j, c in steps])  # offsets(), inlined
        per_command = max(1, BULK_BITS // k) * k
        servers = len(self.clients)
        plans: dict[int, _ServerPlan] = {}
        for shard, (_, bits) in groups.items():
            plan = plans.get(shard % servers)
            if plan is None:
                plan = plans[shard % servers] = _ServerPlan()
            if write:
                plan.allocations.append(shard)
            plan.commands.extend(
                (shard, start, min(start + per_command, len(bits)))
                for start in range(0, len(bits), per_command)
            )
        return _Chunk(write, len(elements), groups, plans)

    def _send(self, chunk: _Chunk) -> None:
        """Send each server's commands on the held connection, where one is usable."""
        for server, plan in chunk.plans.items():
            held = self._held[server]
            if not held.usable:
                continue
            assert held.encode is not None
            encode, packer = held.encode, self._packers[chunk.write]
            keys = {shard: encode(self.shard_keys[shard]) for shard, _, _ in plan.commands}
            last = b"%d" % (self.spec.shard_bytes - 1)
            payload = b"".join(
                [
                    *(
                        pack_command(b"EVAL", _ALLOCATE, b"1", keys[shard], last)
                        for shard in plan.allocations
                    ),
                    *(
                        packer.pack(keys[shard], chunk.groups[shard][1][a:b])
                        for shard, a, b in plan.commands
                    ),
                ]
            )
            try:
                plan.sent = held.send(payload)
            except CONNECTION_ERRORS:
                plan.sent = None  # dropped: _collect goes through the client

    def _collect(self, chunk: _Chunk) -> list[bool]:
        """Read (or run through the client) a chunk's replies; return its answers."""
        k = self.spec.hash_count
        old_bits: dict[int, list[int]] = {shard: [] for shard in chunk.groups}
        created = False
        for server, plan in chunk.plans.items():
            held = self._held[server]
            count = len(plan.allocations) + len(plan.commands)
            replies: list[Any] | None = None
            if plan.sent is not None and plan.sent == held.generation:
                try:
                    replies = held.receive(count)
                except CONNECTION_ERRORS:
                    replies = None  # dropped; run the commands again through the client
            if replies is None:
                replies = self._through_client(server, chunk, plan)
            order = [*plan.allocations, *(shard for shard, _, _ in plan.commands)]
            for shard, reply in zip(order, replies, strict=True):
                if isinstance(reply, Exception):
                    if isinstance(reply, ResponseError):
                        self._raise_if_wrong_type(
                            reply, self.shard_keys[shard], self.clients[server]
                        )
                    raise reply
            created |= any(reply == 1 for reply in replies[: len(plan.allocations)])
            for (shard, _, _), reply in zip(
                plan.commands, replies[len(plan.allocations) :], strict=True
            ):
                old_bits[shard].extend(reply)
        if created:  # a shard was allocated: the filter may have been cleared
            self._ensure_record()
        out = [False] * chunk.size
        added = 0
        for shard, (positions, _) in chunk.groups.items():
            bits = old_bits[shard]
            for n, position in enumerate(positions):
                seen = 0 not in bits[n * k : n * k + k]
                out[position] = seen
                added += not seen
        if chunk.write:
            self._unsynced_added += added
            self._unsynced_seen += chunk.size - added
        return out

    def _through_client(self, server: int, chunk: _Chunk, plan: _ServerPlan) -> list[Any]:
        """Run a server's commands through its client's pipeline: clusters, other threads."""
        client = self.clients[server]
        last = self.spec.shard_bytes - 1
        op = ("SET", "u1") if chunk.write else ("GET", "u1")
        tail = (1,) if chunk.write else ()
        calls: list[tuple[Any, ...]] = [
            (client, "execute_command", "EVAL", scripts.ALLOCATE, 1, self.shard_keys[shard], last)
            for shard in plan.allocations
        ]
        for shard, a, b in plan.commands:
            bits = chunk.groups[shard][1][a:b]
            arguments = [item for offset in bits for item in (*op, offset, *tail)]
            calls.append(
                (client, "execute_command", "BITFIELD", self.shard_keys[shard], *arguments)
            )
        return list(self._pipelined(calls, raise_on_error=False))

    def _calls(self, method: str, keys: Sequence[str], *args: Any) -> list[tuple[Any, ...]]:
        """Build ``(client, method, key, *args)`` calls, each key on its server."""
        if len(self.clients) == 1:
            return [(self.client, method, key, *args) for key in keys]
        route = {name: self._shard_clients[i] for i, name in enumerate(self.shard_keys)}
        route.update({layout.counter_key(n): c for n, c in route.items()})
        return [(route.get(key, self.client), method, key, *args) for key in keys]

    def _pipelined(
        self, calls: Iterable[tuple[Any, ...]], raise_on_error: bool = True
    ) -> Iterator[Any]:
        """Send ``(client, method, *args)`` calls in non-transactional pipelines.

        Replies come back in the order of the calls, whichever server each went to.
        """
        pending: dict[int, tuple[Any, list[int]]] = {}  # per client: pipeline, positions
        replies: dict[int, Any] = {}

        def flush(client_id: int) -> None:
            pipe, positions = pending.pop(client_id)
            for at, reply in zip(
                positions, pipe.execute(raise_on_error=raise_on_error), strict=True
            ):
                replies[at] = reply

        next_out = 0
        for position, (client, method, *args) in enumerate(calls):
            entry = pending.get(id(client))
            if entry is None:
                entry = pending[id(client)] = (client.pipeline(transaction=False), [])
            getattr(entry[0], method)(*args)
            entry[1].append(position)
            if len(entry[1]) == BATCH:
                flush(id(client))
                while next_out in replies:
                    yield replies.pop(next_out)
                    next_out += 1
        for client_id in list(pending):
            flush(client_id)
        while next_out in replies:
            yield replies.pop(next_out)
            next_out += 1

    def _raise_if_wrong_type(self, exc: ResponseError, key: str, client: Any = None) -> None:
        """Turn a WRONGTYPE reply into a :class:`WrongTypeError` naming the key."""
        if "WRONGTYPE" not in str(exc):
            return
        kind = _text((client or self.client).type(key))
        raise WrongTypeError(
            f"Redis key {key!r} holds a {kind}, where the Bloom filter {self.key!r} keeps"
            " its bits or record. Another program wrote it. Choose another BLOOMFILTER_KEY,"
            f" or reset the filter (scrapy-redis-bloom reset --key {self.key!r})."
        ) from exc


class WorkerLease:
    """A worker's lease in a filter's registry of live workers (``KEY:workers``).

    The lease lasts ``ttl`` seconds unless renewed; :meth:`start` renews it from a
    daemon thread every ``ttl / 3`` seconds, so a worker that dies stops counting as
    live within ``ttl``. Workers use it to decide whether they are the last one.
    """

    def __init__(self, client: Any, key: str, worker_id: str, ttl: float) -> None:
        self.client = client
        self.key = key
        self.worker_id = worker_id
        self.ttl = ttl
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _call(self, action: str) -> int:
        ttl_ms = max(1, round(self.ttl * 1000))
        return int(self.client.eval(scripts.LEASE, 1, self.key, self.worker_id, ttl_ms, action))

    def renew(self) -> int:
        """Take or extend the lease; return how many other workers are live."""
        return self._call("renew")

    def others(self) -> int:
        """Return how many other workers hold a live lease."""
        return self._call("count")

    def start(self) -> None:
        """Take the lease and keep renewing it in the background until :meth:`release`."""
        self.renew()
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._keep, name=f"bloomfilter-lease-{self.worker_id}", daemon=True
            )
            self._thread.start()

    def _keep(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.renew()
            except RedisError as exc:  # Redis unreachable: retry at the next tick
                logger.warning("Could not renew the lease of worker %s: %s", self.worker_id, exc)

    def stop(self) -> None:
        """Stop renewing; the lease then lapses after its TTL (as if the worker died)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def release(self) -> int:
        """Stop renewing and drop the lease; return how many other workers are live."""
        self.stop()
        return self._call("release")


def live_workers(client: Any, key: str) -> list[str]:
    """Return the ids of the workers holding a live lease on the filter ``key``.

    A function as well as a method: it needs no geometry, so it also works before a
    worker has created the filter or without reading its record.
    """
    reply = client.eval(scripts.LIVE_WORKERS, 1, layout.workers_key(key))
    return [item.decode() if isinstance(item, bytes) else str(item) for item in reply]


def server_address(client: Any) -> str:
    """Describe where a client connects, as ``host:port`` or a socket path: no password."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    if kwargs is None:  # a cluster client: name the node it started from
        nodes = getattr(client, "startup_nodes", None) or []
        return ", ".join(f"{node.host}:{node.port}" for node in nodes) or "a Redis cluster"
    if "path" in kwargs:
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
