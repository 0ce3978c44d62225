"""Dumping a filter to a stream: every part's bytes, chunked and checksummed (see :mod:`.dumpfile`).

Parts are read and written in pieces of at most :data:`PIECE` bytes, so memory stays flat.
"""

from __future__ import annotations

import logging
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import version
from typing import TYPE_CHECKING, Any, BinaryIO

from scrapy_redis_bloom.core import layout
from scrapy_redis_bloom.core.errors import (
    BloomFilterError,
    FilterBusyError,
    FilterDamagedError,
    FilterMissingError,
)
from scrapy_redis_bloom.core.generations import GENERATIONS_BIT
from scrapy_redis_bloom.core.record import FilterRecord
from scrapy_redis_bloom.core.settings import WORKER_TTL
from scrapy_redis_bloom.engine.native import parts as native_parts
from scrapy_redis_bloom.engine.parts import BATCH, Parts, blob, pairs, text
from scrapy_redis_bloom.ops import dumpfile
from scrapy_redis_bloom.ops.dumpfile import DumpWriter, Totals
from scrapy_redis_bloom.ops.inventory import read_hash
from scrapy_redis_bloom.transport.executor import Call
from scrapy_redis_bloom.transport.wire import pack_command

if TYPE_CHECKING:
    from scrapy_redis_bloom.engine.base import FilterBase

logger = logging.getLogger(__name__)

#: Bytes read or written per command, at most (1 MiB).
PIECE = 1 << 20
#: ``progress(done, total)``: bytes of the filter's data done so far, of ``total``.
Progress = Callable[[int, int], None]
_GENERATIONS = slice(GENERATIONS_BIT // 8, GENERATIONS_BIT // 8 + 2)


@dataclass(frozen=True, slots=True)
class Summary:
    """What a dump or a restore wrote, and in how long (``forced``: workers were live)."""

    key: str
    record: FilterRecord
    source: str
    totals: Totals
    seconds: float
    counters: dict[str, int]
    forced: bool = False
    target: str = ""
    replaced: bool = False

    @property
    def added(self) -> int:
        """The filter's item count: the workers' ``added`` counter."""
        return self.counters.get("added", 0)


def part_bytes(record: FilterRecord, generation: int) -> int:
    """Return the length of a bitmap shard's generation: its header and its bits."""
    return layout.HEADER_BYTES + record.growth.generation(generation).nbytes


def generations_in(head: bytes) -> int:
    """Return how many generations a shard's generation-0 header says it has (0 reads 1)."""
    return max(1, int.from_bytes(head[_GENERATIONS], "big"))


def part_key(key: str, record: FilterRecord, shard: int, generation: int = 0) -> str:
    """Return the key of a shard's generation (bitmap), or of a native shard."""
    if record.backend == "native":
        return native_parts.shard_key(key, shard, record.filter_id)
    return layout.shard_key(key, shard, generation)


def dump_filter(
    bloom: FilterBase,
    out: BinaryIO,
    progress: Progress | None = None,
    *,
    force: bool = False,
    worker_ttl: float = WORKER_TTL.default,
) -> Summary:
    """Write the filter ``bloom`` reaches (a bitmap or native one) to ``out``; return a summary.

    ``bloom`` needs no opening: the record read from Redis decides (:func:`.inventory.probe`
    will do). ``progress(done, total)``: data bytes dumped (a native ``total`` estimated).
    A failure part way leaves the file without its trailer: a restore refuses it as truncated.
    """
    started = time.monotonic()
    parts = bloom.parts
    record = parts.read_record()
    where = bloom.topology.describe()
    if record is None:
        raise FilterMissingError(
            f"There is no Bloom filter {bloom.key!r} (no config record {parts.meta_key!r})"
            f" on {where}: nothing to dump."
        )
    if record.state != "ready":
        raise BloomFilterError(
            f"The Bloom filter {bloom.key!r} on {where} is still being created (its record is"
            " in state 'creating'): open it once (any worker does) and dump it then."
        )
    if record.ttl:
        raise BloomFilterError(
            f"The Bloom filter {bloom.key!r} forgets URLs (BLOOMFILTER_TTL = {record.ttl}):"
            " its bits live in re-crawl windows that expire, and a dump of it is not"
            " supported. It forgets everything within 2 x BLOOMFILTER_TTL anyway: start the"
            " filter anew on the target servers."
        )
    workers = bloom.live_workers(worker_ttl)  # after a restart, waits for their leases
    if workers and not force:
        raise FilterBusyError(
            f"{len(workers)} worker(s) hold a live lease on the Bloom filter {bloom.key!r}"
            f" (such as {workers[0]}): a dump taken while they add would miss some of their"
            " URLs. Stop the crawl first, or force the dump (URLs added meanwhile may then"
            " be fetched again after a restore)."
        )
    parts.spec = record.spec
    fields = read_hash(parts, parts.counter_key, "read the filter's counters")
    counters = {name: int(value) for name, value in fields.items() if value.isdigit()}
    writer = DumpWriter(out)
    header = {
        "format": "scrapy-redis-bloom dump",
        "version": version("scrapy-redis-bloom"),
        "key": bloom.key,
        "record": record.fields(),
        "counters": counters,
        "source": where,
        "dumped": time.time(),
        "forced": bool(workers),
    }
    pieces: _Pieces
    if record.backend == "native":
        keys = [(s, part_key(parts.key, record, s)) for s in range(record.spec.shards)]
        total = _native_total(parts, keys)
        pieces = _native_pieces(parts, keys)
    else:
        counts = _generation_counts(parts, record)
        total = sum(part_bytes(record, g) for count in counts for g in range(count))
        pieces = _bitmap_pieces(parts, record, counts)
    report = progress if progress is not None else (lambda done, total: None)
    writer.header(header)
    for kind, shard, generation, position, data in pieces:
        writer.chunk(kind, shard, generation, position, data)
        total = max(total, writer.data_bytes)
        report(writer.data_bytes, total)
    totals = writer.finish()
    report(totals.data_bytes, totals.data_bytes)
    seconds = time.monotonic() - started
    logger.info(
        "Dumped the Bloom filter %r from %s: %d part(s), %d chunk(s), %d data bytes in %.1f s.",
        bloom.key,
        where,
        totals.parts,
        totals.chunks,
        totals.data_bytes,
        seconds,
    )
    return Summary(bloom.key, record, where, totals, seconds, counters, forced=bool(workers))


#: What the piece generators yield: (kind, shard, generation, position, data).
_Pieces = Iterator[tuple[int, int, int, int, bytes]]
#: Pieces to read in one round trip: (shard, generation, start, size, call).
_Batch = list[tuple[int, int, int, int, Call]]


def _bitmap_pieces(parts: Parts, record: FilterRecord, counts: array[int]) -> _Pieces:
    """Yield every bitmap shard's generations in pieces, read in batches of about a MiB."""
    batch: _Batch = []
    held = 0
    for shard in range(record.spec.shards):
        for g in range(counts[shard]):
            key = layout.shard_key(parts.key, shard, g)
            length = part_bytes(record, g)
            for start in range(0, length, PIECE):
                size = min(PIECE, length - start)
                call = Call(
                    pack_command(b"GETRANGE", key, start, start + size - 1), key=key, shard=shard
                )
                batch.append((shard, g, start, size, call))
                held += size
                if held >= PIECE or len(batch) >= BATCH:
                    yield from _read_pieces(parts, record, counts, batch)
                    batch, held = [], 0
    yield from _read_pieces(parts, record, counts, batch)


def _generation_counts(parts: Parts, record: FilterRecord) -> array[int]:
    """Read every shard's header: check its identity; return its number of generations."""
    counts = array("H", [1]) * record.spec.shards
    for first in range(0, record.spec.shards, BATCH):
        shards = range(first, min(first + BATCH, record.spec.shards))
        calls = [
            Call(pack_command(b"GETRANGE", key, 0, layout.HEADER_BYTES - 1), key=key, shard=s)
            for s in shards
            for key in [layout.shard_key(parts.key, s, 0)]
        ]
        heads = parts.run("read the filter's shard headers", calls, take=blob)
        for shard, head in zip(shards, heads, strict=True):
            _check_identity(parts, record, shard, 0, head)
            found = generations_in(head) if record.expansion else 1
            if found > record.growth.last + 1:
                raise FilterDamagedError(
                    f"Cannot dump the Bloom filter {parts.key!r}: the header of its shard"
                    f" {shard} claims {found} generations, and it can have"
                    f" {record.growth.last + 1} at most (the header is corrupted)."
                )
            counts[shard] = found
    return counts


def _check_identity(parts: Parts, record: FilterRecord, shard: int, g: int, head: bytes) -> None:
    """Refuse to dump a part that is missing or not this filter's."""
    expected = layout.identity(record.filter_id, shard, record.spec.hash_count)
    if head[: layout.IDENTITY_BYTES] == expected:
        return
    found = layout.describe_identity(head[: layout.IDENTITY_BYTES], record.filter_id, shard)
    raise FilterDamagedError(
        f"Cannot dump the Bloom filter {parts.key!r}: where generation {g} of its shard {shard}"
        f" belongs ({layout.shard_key(parts.key, shard, g)!r}), Redis holds {found}. A dump"
        " of a damaged filter would restore the damage: repair or reset it first."
    )


def _read_pieces(parts: Parts, record: FilterRecord, counts: array[int], batch: _Batch) -> _Pieces:
    """Read a batch of pieces; check each is whole and carries its identity; yield them."""
    replies = parts.run("dump the filter's shards", [call for *_, call in batch], take=blob)
    for (shard, g, start, size, _), data in zip(batch, replies, strict=True):
        if start == 0:
            _check_identity(parts, record, shard, g, data)
            if g == 0 and record.expansion and generations_in(data) != counts[shard]:
                raise BloomFilterError(
                    f"Shard {shard} of the Bloom filter {parts.key!r} went from"
                    f" {counts[shard]} to {generations_in(data)} generations while it was"
                    " dumped (a worker grew it, or Redis restarted from an older snapshot):"
                    " dump it again with no worker running."
                )
        if len(data) != size:
            raise FilterDamagedError(
                f"Cannot dump the Bloom filter {parts.key!r}: generation {g} of its shard"
                f" {shard} is {start + len(data):,} bytes long where it should be"
                f" {part_bytes(record, g):,} (it was truncated or replaced)."
            )
        yield dumpfile.BITMAP, shard, g, start, data


def _native_total(parts: Parts, keys: list[tuple[int, str]]) -> int:
    """Check every shard is a Bloom filter; return their sizes (``BF.INFO``) added up."""
    total = 0
    for first in range(0, len(keys), BATCH):
        group = keys[first : first + BATCH]
        found = native_parts.types(parts, group)
        wrong = [
            (s, key, t) for (s, key), t in zip(group, found, strict=True) if t != layout.NATIVE_TYPE
        ]
        if wrong:
            shard, key, kind = wrong[0]
            what = "missing" if kind == "none" else f"a {kind}, not a Bloom filter"
            more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
            raise FilterDamagedError(
                f"Cannot dump the Bloom filter {parts.key!r}: its shard {shard} ({key!r}) is"
                f" {what}{more}. A dump of a damaged filter would restore the damage: repair"
                " or reset it first."
            )
        calls = [Call(pack_command(b"BF.INFO", key), key=key, shard=s) for s, key in group]
        total += sum(parts.run("measure the filter's shards", calls, take=_size))
    return total


def _native_pieces(parts: Parts, keys: list[tuple[int, str]]) -> _Pieces:
    """Yield every shard's ``BF.SCANDUMP`` chunks; refuse a sub-filter added meanwhile."""
    for shard, key in keys:
        info = Call(pack_command(b"BF.INFO", key), key=key, shard=shard)
        (before,) = parts.run("read a shard's sub-filters", [info], take=_filters)
        cursor = 0
        while True:
            call = Call(pack_command(b"BF.SCANDUMP", key, cursor), key=key, shard=shard)
            ((cursor, data),) = parts.run("dump the filter's shards", [call], take=_chunk)
            if cursor == 0:
                break
            yield dumpfile.NATIVE, shard, 0, cursor, data
        (after,) = parts.run("read a shard's sub-filters", [info], take=_filters)
        if after != before:
            raise BloomFilterError(
                f"Shard {shard} of the Bloom filter {parts.key!r} went from {before} to"
                f" {after} sub-filters while it was dumped (a worker grew it): dump it again"
                " with no worker running."
            )


def _size(reply: Any) -> int:
    return int(pairs(reply).get("Size", "0"))


def _filters(reply: Any) -> int:
    return int(pairs(reply)["Number of filters"])


def _chunk(reply: Any) -> tuple[int, bytes]:
    """Return the cursor and bytes of a ``BF.SCANDUMP`` reply (none with the last, cursor 0)."""
    cursor, data = reply
    cursor = int(text(cursor))
    return cursor, blob(data) if cursor else b""
