"""The bitmap backend's shards (:class:`Bitmaps`): how one is made, checked and deleted."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from scrapy_redis_bloom.core import layout
from scrapy_redis_bloom.core.errors import FilterDamagedError, OrphanedShardsError, taking_apart
from scrapy_redis_bloom.core.events import FilterEvents
from scrapy_redis_bloom.core.generations import GENERATIONS_BIT, window_key
from scrapy_redis_bloom.core.record import UNSAID, FilterRecord
from scrapy_redis_bloom.core.sizing import shard_allocation
from scrapy_redis_bloom.engine import access, health
from scrapy_redis_bloom.engine.lifecycle import NAMED, named
from scrapy_redis_bloom.engine.parts import Parts, blob
from scrapy_redis_bloom.transport.executor import Call
from scrapy_redis_bloom.transport.topology import Topology
from scrapy_redis_bloom.transport.wire import pack_command

logger = logging.getLogger(__name__)

_GENERATIONS = GENERATIONS_BIT // 8  # where a header's state begins (core/generations.py)


def delete(parts: Parts, record: FilterRecord) -> int:
    """Delete a bitmap filter: every part still carrying its identity, its record last."""
    k = record.spec.hash_count
    windows = parts.windows(record)
    calls = [
        parts.delete_if_still(name, "shard", layout.identity(record.filter_id, shard, k))
        for shard in range(record.spec.shards)
        for name in parts.part_keys(record, shard, windows)
    ]
    return parts.delete(record, calls)


class Bitmaps:
    """Bitmap shards: strings allocated whole, each with a header naming the filter."""

    noun = "Bloom filter"

    def __init__(self, parts: Parts, topology: Topology, events: FilterEvents) -> None:
        self.parts = parts
        self.topology = topology
        self.events = events
        self.key = parts.key

    def shard_key(self, record: FilterRecord, shard: int) -> str:
        """Return the key of a shard's bitmap."""
        return self.parts.shard_key(shard)

    def check_servers(self) -> None:
        """Refuse servers where the Redis user may not run what the filter needs."""
        access.check_access(self.parts.executor, self.topology, self.key)

    def prepare(
        self, wanted: FilterRecord, servers: list[health.ServerHealth], markers: list[str | None]
    ) -> FilterRecord | None:
        """Refuse a filter that does not fit; clear debris; restore a record from orphans.

        Return the record restored, or the one a racing worker has just created; else None.
        """
        # First, in O(servers): a filter that could never fit is refused.
        each = shard_allocation(wanted.spec)
        health.check_room(self.key, servers, {}, spread=(wanted.spec.shards * each, len(servers)))
        found_all = self.parts.identities(range(wanted.spec.shards))
        self._clear_debris({shard: found for shard, found in found_all.items() if _debris(found)})
        present = {
            shard: found for shard, found in found_all.items() if found and not _debris(found)
        }
        if present or any(marker is not None for marker in markers):
            # A worker that created the filter since this one read "none" wrote its record
            # before these: they are its, not orphans.
            racer = self.parts.read_record()
            return racer if racer is not None else self._restore_orphans(wanted, present, markers)
        held = Counter(self._address(shard) for shard in range(wanted.spec.shards))
        health.check_room(self.key, servers, {address: n * each for address, n in held.items()})
        return None

    def create(self, record: FilterRecord, shards: Iterable[int], replace: bool = False) -> int:
        """Allocate shards whole with their header (``replace``: over what was lost)."""
        allocated = self._allocate(record, shards, replace)
        return sum(reply == 1 for reply in allocated.values())

    def recreate(self, record: FilterRecord, shards: Iterable[int]) -> tuple[int, dict[int, str]]:
        """Allocate lost shards anew, empty; return how many, and what each kept of its growth.

        A grown shard's key is its generation 0, whose header counts the shard's
        generations: a fresh header left the later ones, intact, unread (their URLs "new")
        and unreported. Those still carrying the filter's id are kept (:meth:`_grown_after`).
        """
        order = list(shards)
        grown = self._grown_after(record, order) if record.growth.last and not record.ttl else {}
        states = {shard: kept.state for shard, kept in grown.items()}
        allocated = self._allocate(record, order, True, states)
        kept = {shard: grown[shard].said() for shard in grown if allocated[shard] == 1}
        return sum(reply == 1 for reply in allocated.values()), kept

    def _allocate(
        self,
        record: FilterRecord,
        shards: Iterable[int],
        replace: bool,
        states: Mapping[int, bytes] | None = None,
    ) -> dict[int, int]:
        """Allocate shards (see :meth:`.Parts.allocate`); refuse a key another's."""
        allocated = self.parts.allocate(record, shards, replace=replace, states=states)
        refused = [shard for shard, reply in allocated.items() if reply < 0]
        if refused:
            found = self.parts.identities(refused)
            raise FilterDamagedError(
                f"Cannot create the Bloom filter {self.key!r}: where its shards belong,"
                f" Redis already holds {self._list(record, found)}. Remove those keys or"
                " choose another BLOOMFILTER_KEY."
            )
        return allocated

    def _grown_after(self, record: FilterRecord, shards: list[int]) -> dict[int, _Kept]:
        """Return what lost shards keep of their growth: the later generations still theirs.

        The newest of them gives the shard's generations (one more when it is sealed: the one
        after it was lost too, and is recreated empty when next written); its items are
        counted again from its bits (:meth:`.Generation.recount`). Shards without any: left out.
        """
        growth = record.growth
        k = record.spec.hash_count
        keys = [
            (shard, g, layout.shard_key(self.key, shard, g))
            for shard in shards
            for g in range(1, growth.last + 1)
        ]
        heads = self._heads([(shard, key) for shard, _, key in keys])
        intact: dict[int, list[tuple[int, bytes]]] = {}
        for (shard, g, _), (_, head) in zip(keys, heads, strict=True):
            if head[: layout.IDENTITY_BYTES] == layout.identity(record.filter_id, shard, k):
                intact.setdefault(shard, []).append((g, head))
        newest = {shard: found[-1] for shard, found in intact.items()}
        counted = [
            (shard, g, layout.shard_key(self.key, shard, g))
            for shard, (g, head) in newest.items()
            if not _sealed(head)
        ]
        calls = [
            Call(pack_command(b"BITCOUNT", key, layout.HEADER_BYTES, -1), key=key, shard=shard)
            for shard, _, key in counted
        ]
        operation = "count the bits of the filter's generations"
        ones = self.parts.run(operation, calls, take=int) if calls else []
        items = {
            shard: growth.generation(g).recount(n)
            for (shard, g, _), n in zip(counted, ones, strict=True)
        }
        return {
            shard: _Kept(
                min(g + 1 if shard in items else g + 2, growth.last + 1),
                items.get(shard, 0),
                tuple(kept for kept, _ in intact[shard]),
            )
            for shard, (g, _) in newest.items()
        }

    def missing(self, record: FilterRecord, shards: Iterable[int]) -> dict[int, str]:
        """Return the shards missing or without a header; refuse any other header or data."""
        k = record.spec.hash_count
        wrong = {
            shard: found
            for shard, found in self.parts.identities(shards).items()
            if found != layout.identity(record.filter_id, shard, k)
        }
        foreign = {s: f for s, f in wrong.items() if f and f.strip(b"\0")}
        if foreign:
            raise FilterDamagedError(
                f"Where the Bloom filter {self.key!r} (id {record.filter_id}) keeps its"
                f" shards, Redis holds {self._list(record, foreign)}. It is never overwritten:"
                " remove those keys, or reset the filter, or choose another BLOOMFILTER_KEY."
            )
        return {
            shard: layout.describe_identity(found, record.filter_id, shard)
            for shard, found in wrong.items()
        }

    def misfits(self, record: FilterRecord, shards: Iterable[int]) -> dict[int, str]:
        """Return the shards not of the header and payload's length; one past the last if any."""
        past = record.spec.shards
        order = [*shards, past]
        size = layout.HEADER_BYTES + record.shard_payload
        found = dict(zip(order, self._lengths(order), strict=True))
        wrong = {
            shard: f"{length:,} bytes, where the record gives {size:,} (header included)"
            for shard, length in found.items()
            if length and length != size and shard != past
        }
        if found[past]:
            wrong[past] = f"a shard past the last (the record says {past:,} shards)"
        return wrong

    def delete(self, record: FilterRecord) -> int:
        """Delete the filter (see :func:`delete`)."""
        return delete(self.parts, record)

    def part_identity(self, key: str) -> bytes:
        """Read a shard's part's identity by its own key (Redis routes it where it is)."""
        call = Call(pack_command(b"GETRANGE", key, 0, layout.IDENTITY_BYTES - 1), key=key)
        return bytes(self.parts.run("check the filter's generations", [call])[0])

    def lost_part(
        self, record: FilterRecord, shard: int, key: str, found: bytes
    ) -> FilterDamagedError:
        """Return the error for a generation or re-crawl window of a shard found wrong."""
        where = self.topology.route(key, shard, None).address
        what = layout.describe_identity(found, record.filter_id, shard)
        if not found.strip(b"\0"):  # missing, or bits written where it was: as good as gone
            return FilterDamagedError(
                f"Part {key!r} of shard {shard} of the Bloom filter {self.key!r} (a generation"
                f" it grew, or a re-crawl window) is gone from {where}. It was evicted (see"
                " maxmemory-policy), deleted, or its server lost its data. The URLs it held"
                " would be taken for new, so the crawl stops here. Set BLOOMFILTER_ON_LOSS ="
                " 'recreate' to go on with it empty (URLs it held may be fetched again, never"
                " dropped), or reset the filter."
            )
        return FilterDamagedError(
            f"Where the Bloom filter {self.key!r} (id {record.filter_id}) keeps part {key!r}"
            f" of shard {shard}, {where} holds {what}. It is never overwritten: remove that"
            " key, or reset the filter, or choose another BLOOMFILTER_KEY."
        )

    def _clear_debris(self, debris: dict[int, bytes]) -> None:
        """Delete headerless bitmaps (a lost shard's BITFIELD) where a new filter's shards go."""
        if not debris:
            return
        calls = [
            self.parts.delete_if_still(self.parts.shard_key(shard), "shard", found)
            for shard, found in debris.items()
        ]
        self.parts.run("delete bitmaps left without a header", calls)
        logger.warning(
            "Deleted %d bitmap(s) without a header, such as %r, where the Bloom filter %r"
            " is created: bits a worker wrote after the filter was lost.",
            len(debris),
            self.parts.shard_key(next(iter(debris))),
            self.key,
        )

    def _restore_orphans(
        self, wanted: FilterRecord, present: dict[int, bytes], markers: list[str | None]
    ) -> FilterRecord:
        """Rebuild a lost record from intact shards that all carry one id, or refuse."""
        spec = wanted.spec
        first = layout.Identity.parse(next(iter(present.values()), b""))
        filter_id = first.filter_id if first is not None else None
        complete = (
            filter_id is not None
            and len(present) == spec.shards
            and all(
                found == layout.identity(filter_id, shard, spec.hash_count)
                for shard, found in present.items()
            )
            and all(
                marker in (None, layout.server_marker(filter_id, i, wanted.servers))
                for i, marker in enumerate(markers)
            )
            and all(
                length == layout.HEADER_BYTES + wanted.shard_payload for length in self._lengths()
            )
        )
        if not complete or filter_id is None:
            example = next(iter(present), None)
            what = (
                f"{len(present):,} shard key(s) such as"
                f" {self.parts.shard_key(example)!r} ({self._address(example)})"
                if example is not None
                else f"server markers {self.parts.marker_key!r}"
            )
            # A default worker asks for a blocked filter: a classic one's shards are not its own.
            classic = (
                " If the filter was created with the classic layout (before blocked filters"
                " became the default), set BLOOMFILTER_BLOCKED = False: a worker asking for"
                " it restores the record from the shards."
                if spec.block_bits and "blocked=" not in wanted.sizing
                else ""
            )
            raise OrphanedShardsError(
                f"{what} of a Bloom filter {self.key!r} exist, but its config record"
                f" {self.parts.meta_key!r} does not, and they do not form the filter this"
                " worker asks for, so the layout of their bits is unknown. (A record"
                " evicted under maxmemory-policy allkeys-* does this.) Reset the filter"
                f" (scrapy bloom reset --key {self.key!r}) or choose another"
                f" BLOOMFILTER_KEY.{classic}"
            )
        differs = self._growth_differs(wanted)
        if differs is not None:
            raise OrphanedShardsError(
                f"The {spec.shards:,} shard(s) of the Bloom filter {self.key!r} (id"
                f" {filter_id}) are intact, but its config record {self.parts.meta_key!r} is"
                f" gone, and {differs}. The record is restored only by a worker with the"
                " filter's own settings: start one with them, reset the filter (scrapy bloom"
                f" reset --key {self.key!r}) or choose another BLOOMFILTER_KEY."
            )
        # The shards do not show whose fingerprints they hold: the record does not say.
        restored = replace(wanted, filter_id=filter_id, state="ready", fingerprints=UNSAID)
        record = self.parts.create_record(restored)
        self.events.count("restored")
        logger.warning(
            "The Bloom filter %r had lost its config record %r, but all %s of its shards"
            " (id %s) are intact and match this worker's settings: the record was"
            " restored. It was evicted or deleted; see the maxmemory-policy of %s.",
            self.key,
            self.parts.meta_key,
            f"{spec.shards:,}",
            filter_id,
            self.topology.describe(),
        )
        if wanted.servers > 1:
            self.parts.write_markers(record, range(wanted.servers))
        return record

    def _growth_differs(self, wanted: FilterRecord) -> str | None:
        """Say how the shards show another TTL or expansion than ``wanted``'s; None if none.

        A shard's header holds neither. A TTL shows in the newest re-crawl window an anchor
        names (numbered by the clock over the TTL) and in that window's expiry, which the
        scripts set at (window + 2) x TTL; an expansion, in the size of a grown part's
        generation 1. What no part shows yet is this worker's to give.
        """
        heads = self._heads([(s, self.parts.shard_key(s)) for s in range(wanted.spec.shards)])
        if wanted.ttl:
            windows = self._windows_differ(wanted.ttl, heads)
            if isinstance(windows, str):
                return windows
            grown = windows
        else:
            grown = [(s, layout.shard_key(self.key, s, 1)) for s, head in heads if _grown(head)]
        growth = wanted.growth
        if grown and not growth.expansion:
            return (
                "its shards have grown past their first generation, which no filter of this"
                " worker's BLOOMFILTER_EXPANSION = 0 does"
            )
        wanted_size = layout.HEADER_BYTES + growth.generation(1).nbytes if grown else 0
        for length in self._lengths_of(grown[:NAMED]):
            if length != wanted_size:
                shown = [
                    e
                    for e in range(2, 2**4)
                    if length
                    == layout.HEADER_BYTES + replace(growth, expansion=e).generation(1).nbytes
                ]
                size = f" (that of BLOOMFILTER_EXPANSION = {shown[0]})" if shown else ""
                return (
                    f"its generation 1 holds {length:,} bytes{size}, where this worker's"
                    f" BLOOMFILTER_CAPACITY ({growth.capacity:,}) and BLOOMFILTER_EXPANSION ="
                    f" {growth.expansion} give {wanted_size:,}"
                )
        return None

    def _windows_differ(
        self, ttl: int, anchors: list[tuple[int, bytes]]
    ) -> str | list[tuple[int, str]]:
        """Say how the anchors' newest windows show another TTL than ``ttl``.

        Else return the keys of generation 1 of the grown live windows, to measure.
        """
        started = [(s, _newest(head)) for s, head in anchors if _newest(head)]
        keys = [(s, window_key(self.key, s, n, 0)) for s, n in started]
        calls = [
            Call(pack_command(*argv), key=key, shard=s)
            for s, key in keys
            for argv in [(b"TIME",), (b"PTTL", key)]
        ]
        replies = self.parts.run("check the filter's re-crawl windows", calls)
        grown = []
        for (s, n), clock, left, (_, head) in zip(
            started, replies[::2], replies[1::2], self._heads(keys), strict=True
        ):
            with taking_apart("check the filter's re-crawl windows", self.key):
                now, left = int(clock[0]) + int(clock[1]) / 1e6, int(left) / 1000
            if left > 0 and abs(now + left - (n + 2) * ttl) > 2:  # (expiry: lua/windows.lua)
                shown = round((now + left) / (n + 2))
                return (
                    f"its re-crawl windows show BLOOMFILTER_TTL = {shown}; this worker sets {ttl}"
                )
            if n > now // ttl + 1:
                return (
                    f"its newest re-crawl window ({n}) is one this worker's BLOOMFILTER_TTL ="
                    f" {ttl} reaches only later: the filter's TTL is shorter"
                )
            if left > 0 and _grown(head):
                grown.append((s, window_key(self.key, s, n, 1)))
        # The window before the newest is read by checks too, for a TTL more: its growth counts.
        before = [(s, window_key(self.key, s, n - 1, 0)) for s, n in started]
        grown += [
            (s, key[:-1] + "1")
            for (s, key), (_, head) in zip(before, self._heads(before), strict=True)
            if _grown(head)
        ]
        return grown

    def _heads(self, keys: list[tuple[int, str]]) -> list[tuple[int, bytes]]:
        """Return the header of each ``(shard, key)`` (b"" where missing)."""
        calls = [
            Call(pack_command(b"GETRANGE", key, 0, layout.HEADER_BYTES - 1), key=key, shard=s)
            for s, key in keys
        ]
        replies = self.parts.run("read the filter's headers", calls, take=blob)
        return [(s, head) for (s, _), head in zip(keys, replies, strict=True)]

    def _lengths(self, shards: Iterable[int] | None = None) -> list[int]:
        order = range(self.parts.spec.shards) if shards is None else shards
        return self._lengths_of([(shard, self.parts.shard_key(shard)) for shard in order])

    def _lengths_of(self, keys: list[tuple[int, str]]) -> list[int]:
        calls = [Call(pack_command(b"STRLEN", key), key=key, shard=shard) for shard, key in keys]
        return self.parts.run("measure the filter's shards", calls, take=int)

    def _address(self, shard: int) -> str:
        return self.topology.route(self.parts.shard_key(shard), shard, None).address

    def _list(self, record: FilterRecord, found: dict[int, bytes]) -> str:
        what = {s: layout.describe_identity(f, record.filter_id, s) for s, f in found.items()}
        return named(self.topology, self.parts.shard_key, what)


@dataclass(frozen=True, slots=True)
class _Kept:
    """What a lost shard keeps of its growth: its generations, the newest one's items."""

    generations: int
    items: int
    #: The later generations found intact (those between missing: lost as well).
    intact: tuple[int, ...]

    @property
    def state(self) -> bytes:
        """The state of the recreated generation 0's header: generations (u16), items (u32)."""
        return self.generations.to_bytes(2, "big") + self.items.to_bytes(4, "big")

    def said(self) -> str:
        """Say what was kept, and what of the growth was lost as well."""
        lost = [g for g in range(1, self.generations) if g not in self.intact]
        also = f"; {_generations(lost)} lost as well (recreated empty when next written)"
        return f"kept {_generations(self.intact)}" + (also if lost else "")


def _generations(numbers: Sequence[int]) -> str:
    return f"generation{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))}"


def _sealed(head: bytes) -> bool:
    """Tell whether a later generation's header is sealed: a generation after it started."""
    return head[_GENERATIONS : _GENERATIONS + 2].strip(b"\0") != b""


def _grown(head: bytes) -> bool:
    """Tell whether a shard's (or window's) header counts more than one generation."""
    return int.from_bytes(head[_GENERATIONS : _GENERATIONS + 2], "big") > 1


def _newest(anchor: bytes) -> int:
    """Return the newest re-crawl window a TTL anchor's header names (0: none started)."""
    return int.from_bytes(anchor[_GENERATIONS + 2 : _GENERATIONS + 6], "big")


def _debris(found: bytes) -> bool:
    """Tell whether a shard key's first bytes are those of a bitmap without a header."""
    return bool(found) and not found.strip(b"\0")
