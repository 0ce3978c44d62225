"""Restoring a dump (see :mod:`.dumpfile`) into any topology, all or nothing.

The file is read twice: verified whole, then written, the config record last so no worker
uses the filter before it is whole; on failure every key written is deleted.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

from scrapy_redis_bloom.core import layout
from scrapy_redis_bloom.core.errors import (
    BloomFilterError,
    FilterBusyError,
    UnsupportedServerError,
)
from scrapy_redis_bloom.core.record import FilterRecord
from scrapy_redis_bloom.core.settings import WORKER_TTL, FaultPolicy
from scrapy_redis_bloom.core.sizing import STRING_OVERHEAD, allocation
from scrapy_redis_bloom.engine import backend, health
from scrapy_redis_bloom.engine.base import FilterBase
from scrapy_redis_bloom.engine.bitmap.filter import RedisBloomFilter
from scrapy_redis_bloom.engine.native import filter as native
from scrapy_redis_bloom.engine.native import parts as native_parts
from scrapy_redis_bloom.engine.native import ttl as native_ttl
from scrapy_redis_bloom.engine.parts import BATCH, Parts, integer
from scrapy_redis_bloom.ops import dump, dumpfile
from scrapy_redis_bloom.ops.dump import Progress, Summary, part_bytes, part_key
from scrapy_redis_bloom.ops.dumpfile import BITMAP, NATIVE, DumpFileError, DumpReader, part_name
from scrapy_redis_bloom.ops.inventory import existing_keys, read_hash
from scrapy_redis_bloom.transport.executor import Call, Executor
from scrapy_redis_bloom.transport.wire import pack_command

logger = logging.getLogger(__name__)

NAMED = 5  #: Keys named in a message, at most.
#: What a restore interrupted before it changed anything leaves.
UNTOUCHED = "Nothing was restored, and nothing on Redis was changed: run the restore again."
#: Room a restore needs on a server beside its parts: what is sent at once (a bitmap's
#: pieces pipelined, up to this; a native chunk, as big as RedisBloom dumped it) sits in
#: Redis's query buffer, grown by as much again at most (its allocation, or the sds
#: preallocation); and the counters, markers, record and the commands' framing.
WRITING_ROOM = 2 * dump.PIECE
WRITING_SLACK = 64 << 10
#: What to do when a restore does not fit: its size is the dump's, whatever the settings say.
ROOM_ADVICE = (
    "Raise maxmemory or free memory there, or restore it on more servers (a server list or a"
    " cluster spreads its shards): a restored filter has its dump's size, whatever the"
    " BLOOMFILTER_* settings say."
)


class FilterExistsError(BloomFilterError):
    """The target of a restore already holds a filter (or keys) where the restored one goes.

    ``replaceable``: a filter with a config record, which a restore asked to replace deletes;
    else keys no record names (orphaned parts, another program's), which it does not.
    """

    def __init__(self, message: str, *, replaceable: bool = False) -> None:
        super().__init__(message)
        self.replaceable = replaceable


class RestoreFailedError(BloomFilterError):
    """Redis failed a restore half-way; what it had written was deleted (or could not be)."""


@dataclass(frozen=True, slots=True)
class VerifiedDump:
    """A dump file checked whole (pass 1); ``shard_bytes`` and ``largest_chunk`` for the room."""

    header: dict[str, Any]
    record: FilterRecord
    counters: dict[str, int]
    totals: dumpfile.Totals
    shard_bytes: array[int]
    largest_chunk: int


def verify_dump(inp: BinaryIO, name: str, progress: Callable[[int], None]) -> VerifiedDump:
    """Check a whole dump file makes the filter its record describes (pass 1); write nothing."""
    reader = DumpReader(inp, name)
    fail = reader.refuse
    header = reader.header()
    fields = header.get("record")
    if not isinstance(fields, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in fields.items()
    ):
        raise fail("its header holds no config record")
    try:
        record = FilterRecord.parse("KEY:meta", fields)
    except BloomFilterError as exc:  # its advice (reset the key) is not for a file
        problem = str(exc).split(" cannot be used: ", 1)[-1].split(". Check that", 1)[0]
        raise fail(f"the config record it holds cannot be used: {problem}") from None
    if record.ttl or record.state != "ready":
        raise fail("its config record is not that of a ready filter without a TTL")
    counters = header.get("counters", {})
    if not isinstance(counters, dict) or not all(
        name in ("added", "seen") and isinstance(value, int) and value >= 0
        for name, value in counters.items()
    ):
        raise fail("its counters are not 'added' and 'seen' counts")
    kind = NATIVE if record.backend == "native" else BITMAP
    shards = record.spec.shards
    shard, generation, generations, offset = -1, 0, 1, 0
    shard_bytes = array("Q", [0]) * shards
    largest = 0

    def end_part(shard_ends: bool) -> None:  # a bitmap part ends whole; a shard, each generation
        if shard < 0:
            return
        length = part_bytes(record, generation) if kind == BITMAP else offset
        if offset != length:
            raise fail(
                f"{part_name(BITMAP, shard, generation)} holds {offset:,} bytes of {length:,}"
                " (the file is corrupted)"
            )
        if shard_ends and generation + 1 != generations:
            raise fail(
                f"shard {shard} has {generation + 1} generation(s) in the file, and its header"
                f" says {generations} (the file is corrupted)"
            )

    for chunk in reader.chunks():
        where = chunk.where
        if chunk.kind != kind:
            raise fail(
                f"{where} is a {'native' if chunk.kind == NATIVE else 'bitmap'} chunk, and its"
                f" record is of a {record.backend} filter (the file is corrupted)"
            )
        if chunk.index == 1:  # a part's first: the next shard or generation, with the identity
            end_part(chunk.generation == 0)
            due = (shard, generation + 1) if chunk.generation else (shard + 1, 0)
            if (chunk.shard, chunk.generation) != due or chunk.shard >= shards:
                raise fail(
                    f"{where} comes where {'generation' if due[1] else 'shard'}"
                    f" {due[1] or due[0]} was due (the file is corrupted)"
                )
            if chunk.generation >= generations:
                raise fail(
                    f"{where} is past the {generations} generation(s) its shard's header names"
                    " (the file is corrupted)"
                )
            shard, generation, offset = chunk.shard, chunk.generation, 0
            if kind == BITMAP:
                expected = layout.identity(record.filter_id, shard, record.spec.hash_count)
                if chunk.data[: layout.IDENTITY_BYTES] != expected:
                    raise fail(f"{where} does not carry the record's filter id and shard")
                if generation == 0:
                    generations = dump.generations_in(chunk.data) if record.expansion else 1
                    if generations > record.growth.last + 1:
                        raise fail(f"{where}'s header claims {generations} generations")
        if kind == BITMAP and chunk.position != offset:
            raise fail(
                f"{where} starts at byte {chunk.position:,} of its part, where byte {offset:,}"
                " was due (the file is corrupted)"
            )
        if kind == NATIVE and chunk.position == 0:
            raise fail(f"{where} has no BF.SCANDUMP position (corrupted)")
        offset += len(chunk.data)
        shard_bytes[chunk.shard] += len(chunk.data)
        largest = max(largest, len(chunk.data))
        length = part_bytes(record, generation) if kind == BITMAP else offset
        if offset > length:
            raise fail(f"{where} ends past the part's {length:,} bytes (corrupted)")
        progress(reader.offset)
    end_part(True)
    if shard != shards - 1:
        raise fail(
            f"it holds {shard + 1:,} of the filter's {shards:,} shards (the file is corrupted)"
        )
    progress(reader.offset)
    assert reader.totals is not None  # set once the trailer was checked
    counts = {str(name): int(value) for name, value in counters.items()}
    return VerifiedDump(header, record, counts, reader.totals, shard_bytes, largest)


def restore_filter(
    client: Any,
    key: str,
    inp: BinaryIO,
    progress: Progress | None = None,
    *,
    replace: bool = False,
    name: str | None = None,
    faults: FaultPolicy | None = None,
    worker_ttl: float = WORKER_TTL.default,
) -> Summary:
    """Restore the dump in ``inp`` as the filter ``key`` on the servers ``client`` reaches.

    ``inp``: seekable (read twice) from its current position. ``progress(done, total)``: file
    bytes over both passes. ``replace``: delete a filter already under ``key`` (once the file
    is verified, and no worker holds a lease) instead of refusing. On any error nothing of
    the restore is left on the target. Ctrl-C comes out as a KeyboardInterrupt with a note
    (``__notes__``) saying what the restore left, and what to run.
    """
    started = time.monotonic()
    name = name if name is not None else str(getattr(inp, "name", "<stream>"))
    if not inp.seekable():
        raise DumpFileError(
            f"The dump file {name} cannot be restored from a stream that cannot seek (a pipe):"
            " a restore reads it twice, to check every checksum before it writes anything,"
            " then to write. Save it to a file first."
        )
    start = inp.tell()
    size = inp.seek(0, 2) - start
    inp.seek(start)
    report = progress if progress is not None else (lambda done, total: None)
    left = UNTOUCHED  # what Ctrl-C leaves, as the restore goes on: the interrupt's note
    replaced = False
    bloom: FilterBase | None = None
    try:
        verified = verify_dump(inp, name, lambda done: report(done, 2 * size))
        record = verified.record
        target_class: type[FilterBase] = (
            native.NativeBloomFilter if record.backend == "native" else RedisBloomFilter
        )
        bloom = target_class.of_record(client, key, record, faults)
        target = dataclasses.replace(record, servers=bloom.topology.servers, state="ready")
        where = bloom.topology.describe()
        existing = _prepare(bloom, target, verified, name, replace, worker_ttl)
        if existing is not None:
            left = (
                f"Nothing was restored, and the Bloom filter {key!r} under the key was being"
                " deleted (--replace): part of it may be gone. Run the restore again: it"
                " deletes what is left of that filter first."
            )
            _replace(bloom, existing, target, name, where)
            replaced = True
        left = "Nothing was restored: what the restore had written was deleted, and " + (
            f"so was the Bloom filter {key!r} that was under the key, first (--replace):"
            f" there is no filter {key!r} on {where} now. Run the restore again."
            if replaced
            else "nothing else was changed: run the restore again."
        )
        inp.seek(start)
        _write(bloom, target, verified, inp, name, lambda done: report(size + done, 2 * size))
        left = f"The restore was complete: the Bloom filter {key!r} is restored on {where}."
    except KeyboardInterrupt as exc:
        if not getattr(exc, "__notes__", None):
            exc.add_note(left)
        elif replaced:  # the undo's note: it did not finish
            exc.add_note(f"The Bloom filter {key!r} under the key was deleted first (--replace).")
        raise
    finally:
        if bloom is not None:
            bloom.topology.close()
    totals = verified.totals
    seconds = time.monotonic() - started
    logger.info(
        "Restored the Bloom filter %r on %s from %s: %d part(s), %d data bytes in %.1f s.",
        key,
        where,
        name,
        totals.parts,
        totals.data_bytes,
        seconds,
    )
    source = str(verified.header.get("source", "?"))
    return Summary(
        key, target, source, totals, seconds, verified.counters, target=where, replaced=replaced
    )


def _prepare(
    bloom: FilterBase,
    target: FilterRecord,
    verified: VerifiedDump,
    name: str,
    replace: bool,
    worker_ttl: float,
) -> FilterRecord | None:
    """Check the target servers, key and room; return the record of a filter to replace.

    Every refusal comes before the deletion (:func:`_replace`): a filter to replace is
    deleted only once the restored one is known to fit, in the room it frees too.
    """
    where = bloom.topology.describe()
    servers = health.survey(bloom.executor, bloom.topology)
    health.check_versions(servers)
    health.check_primaries(servers)
    health.warn_risks(bloom.key, servers)  # what evicts the parts as they are written
    if target.backend == "native":
        missing = native_parts.missing_bloom(bloom.executor, bloom.topology)
        if missing:
            raise UnsupportedServerError(
                f"The dump file {name} holds a native filter (the server's own Bloom filters,"
                f" BF.*), and Redis at {', '.join(missing)} has no BF.* commands: restore it"
                f" on servers with {native_parts.INSTALL_HINT}. A native filter's bits cannot"
                " be turned into a bitmap filter."
            )
    existing = _existing(bloom, where, replace, worker_ttl)
    owned = _parts_of(bloom, existing) if existing is not None else []
    spared = {key for key, _ in owned} | {bloom.parts.counter_key, bloom.parts.marker_key}
    _refuse_conflicts(bloom, target, name, where, spared if existing is not None else set())
    # Per server: its parts as Redis allocates them, and the pieces pipelined to it at once
    # (Redis holds them in its query buffer while it runs them).
    data: dict[str, int] = {}
    needs: dict[str, int] = {}
    for shard, size in enumerate(verified.shard_bytes):
        address = bloom.topology.route(layout.shard_key(bloom.key, shard), shard, None).address
        data[address] = data.get(address, 0) + size
        needs[address] = needs.get(address, 0) + _allocated(target, size)
    at_once = WRITING_ROOM if target.backend != "native" else verified.largest_chunk
    for address, size in data.items():
        sent = min(size, at_once)
        needs[address] += sent + allocation(sent) + WRITING_SLACK
    freed = _memory(bloom, owned)
    health.check_room(bloom.key, servers, needs, freed=freed, advice=ROOM_ADVICE)
    return existing


def _replace(
    bloom: FilterBase, existing: FilterRecord, target: FilterRecord, name: str, where: str
) -> None:
    """Delete the filter a restore replaces (checked by :func:`_prepare` first)."""
    backend.delete(Parts(bloom.executor, bloom.key, existing.spec), existing)
    logger.warning("Deleted the Bloom filter %r on %s to restore a dump over it.", bloom.key, where)
    _refuse_conflicts(bloom, target, name, where, set())  # a part it left was not its own


def _refuse_conflicts(
    bloom: FilterBase, target: FilterRecord, name: str, where: str, spared: set[str]
) -> None:
    """Refuse keys where the restored filter's go, but those in ``spared`` (to be deleted)."""
    parts = bloom.parts  # the restored filter's shards (generation 0), counters, markers
    keys: list[tuple[str, int | None, int | None]]
    keys = [(part_key(bloom.key, target, s), s, None) for s in range(target.spec.shards)]
    keys.append((parts.counter_key, None, None))
    if target.servers > 1:
        keys += [(parts.marker_key, None, i) for i in range(target.servers)]
    conflicts = existing_keys(parts, [k for k in keys if k[0] not in spared])
    if conflicts:
        named = ", ".join(repr(k) for k in conflicts[:NAMED])
        more = f" and {len(conflicts) - NAMED:,} more" if len(conflicts) > NAMED else ""
        raise FilterExistsError(
            f"Cannot restore {name} as the Bloom filter {bloom.key!r}: {where} already holds"
            f" {named}{more}, where its parts go: no config record names them, and replacing"
            " a filter does not delete them (parts left by a restore or reset cut short, or"
            f" another program's keys). Reset the filter {bloom.key!r} (it deletes orphaned"
            " parts too) or restore it under another key."
        )


def _parts_of(bloom: FilterBase, record: FilterRecord) -> list[tuple[str, int]]:
    """Return the keys (and shards) a filter's bits may be in: what deleting it frees."""
    parts = Parts(bloom.executor, bloom.key, record.spec)
    windows = parts.windows(record)
    if record.backend == "native":
        anchors = [
            (native_parts.shard_key(bloom.key, shard, record.filter_id), shard)
            for shard in range(record.spec.shards)
        ]
        return anchors + [
            (native_ttl.window_key(key, w), shard) for key, shard in anchors for w in windows
        ]
    return [
        (key, shard)
        for shard in range(record.spec.shards)
        for key in parts.part_keys(record, shard, windows)
    ]


def _memory(bloom: FilterBase, keys: list[tuple[str, int]]) -> dict[str, int]:
    """Return, per server, the bytes ``keys`` take there (``MEMORY USAGE``; a missing one 0)."""
    calls = [Call(pack_command(b"MEMORY", b"USAGE", k), key=k, shard=s) for k, s in keys]
    replies = bloom.parts.run("read the memory of the filter to replace", calls, take=integer)
    found: dict[str, int] = {}
    for (key, shard), size in zip(keys, replies, strict=True):
        address = bloom.topology.route(key, shard, None).address
        found[address] = found.get(address, 0) + size
    return found


def _allocated(record: FilterRecord, size: int) -> int:
    """Return the bytes Redis allocates for a shard of ``size`` data bytes (its generations)."""
    if record.backend == "native":
        return allocation(size + STRING_OVERHEAD)
    total, generation = 0, 0
    while size > 0:  # the generations in turn: each a string of its own
        length = part_bytes(record, generation)
        total += allocation(length + STRING_OVERHEAD)
        size -= length
        generation += 1
    return total


def _existing(
    bloom: FilterBase, where: str, replace: bool, worker_ttl: float
) -> FilterRecord | None:
    """Return the record of a filter under the key, to replace; refuse it unless asked to."""
    parts = bloom.parts
    fields = read_hash(parts, parts.meta_key, "look for a filter")
    if not fields:
        return None
    if not replace:
        raise FilterExistsError(
            f"There is already a Bloom filter {bloom.key!r} on {where} (config record"
            f" {parts.meta_key!r}): restoring would overwrite it. Reset it first, restore"
            " under another key, or ask to replace it.",
            replaceable=True,
        )
    existing = FilterRecord.parse(parts.meta_key, fields)  # refuses an unusable one by name
    workers = bloom.live_workers(worker_ttl)
    if workers:
        raise FilterBusyError(
            f"{len(workers)} worker(s) hold a live lease on the Bloom filter {bloom.key!r} on"
            f" {where} (such as {workers[0]}): stop them before replacing it."
        )
    return existing


def _processes(bloom: FilterBase) -> list[str]:
    """Return every server's ``run_id``, sorted: a restart may have silently lost writes."""
    count = len(bloom.topology.primaries())
    calls = [Call(pack_command(b"INFO", b"server"), server=i) for i in range(count)]
    replies = bloom.executor.run("read the servers' process ids", calls).replies
    found = [
        "" if isinstance(reply, BaseException) else health.info_fields(reply).get("run_id", "")
        for reply in replies
    ]
    return sorted(found)


def _write(
    bloom: FilterBase,
    target: FilterRecord,
    verified: VerifiedDump,
    inp: BinaryIO,
    name: str,
    progress: Callable[[int], None],
) -> None:
    """Write every part, the counters, the markers, then the record; undo all on failure."""
    parts = bloom.parts
    undo: list[Call] = []  # deletes what was written, the latest first: the record before all
    written: list[tuple[str, int]] = []  # (key, shard) of each part
    try:
        processes = _processes(bloom)
        reader = DumpReader(inp, name)
        batch: list[Call] = []
        held = 0
        for chunk in reader.chunks():
            key = part_key(bloom.key, target, chunk.shard, chunk.generation)
            if chunk.index == 1:
                if chunk.generation > 0 and existing_keys(parts, [(key, chunk.shard, None)]):
                    raise FilterExistsError(
                        f"Cannot restore {name} as the Bloom filter {bloom.key!r}: Redis"
                        f" already holds {key!r}, where a generation of its shard"
                        f" {chunk.shard} goes. Reset the filter or restore under another key."
                    )
                undo.append(Call(pack_command(b"DEL", key), key=key, shard=chunk.shard))
                written.append((key, chunk.shard))
                if chunk.kind == BITMAP:  # allocated whole: grown piece by piece, Redis
                    last = part_bytes(target, chunk.generation) - 1  # would keep 1 MiB more
                    presize = pack_command(b"SETRANGE", key, last, b"\0")
                    batch.append(Call(presize, key=key, shard=chunk.shard))
            if chunk.kind == NATIVE:  # one at a time: each chunk needs the one before
                packed = pack_command(b"BF.LOADCHUNK", key, chunk.position, chunk.data)
                _load_chunk(bloom, Call(packed, key=key, shard=chunk.shard), chunk.index == 1)
                progress(reader.offset)
                continue
            packed = pack_command(b"SETRANGE", key, chunk.position, chunk.data)
            batch.append(Call(packed, key=key, shard=chunk.shard))
            held += len(chunk.data)
            if held >= dump.PIECE or len(batch) >= BATCH:
                parts.run("restore the filter's shards", batch, write=True)
                batch, held = [], 0
            progress(reader.offset)
        parts.run("restore the filter's shards", batch, write=True)
        progress(reader.offset)  # the trailer too: the whole file
        if verified.counters:
            undo.insert(0, parts.delete_if_still(parts.counter_key, "counters"))
            fields = [item for pair in sorted(verified.counters.items()) for item in pair]
            call = Call(pack_command(b"HSET", parts.counter_key, *fields), key=parts.counter_key)
            parts.run("restore the filter's counters", [call], write=True)
        if _processes(bloom) != processes:
            raise BloomFilterError(
                f"a server of {bloom.topology.describe()} restarted or failed over meanwhile,"
                " so parts written before may be lost (a restart from an older snapshot, a"
                " replica behind its master). Restore it again."
            )
        undo[:0] = parts.marker_deletions(target)  # none on one server
        parts.write_markers(target, range(target.servers))
        _check_written(bloom, target, written, bool(verified.counters))
        undo.insert(0, parts.delete_if_still(parts.meta_key, "record", target.filter_id))
        stored = parts.create_record(target)
        if stored.filter_id != target.filter_id:
            raise FilterExistsError(
                f"Another Bloom filter {bloom.key!r} (id {stored.filter_id}) was created on"
                f" {bloom.topology.describe()} while {name} was restored.",
                replaceable=True,
            )
    except BaseException as exc:
        _undo(bloom, undo, exc)
        said = f"{exc} What the restore had written was deleted."
        if isinstance(exc, FilterExistsError):
            raise FilterExistsError(said, replaceable=exc.replaceable) from None
        if isinstance(exc, DumpFileError):
            raise DumpFileError(said) from None
        if isinstance(exc, BloomFilterError):
            raise RestoreFailedError(
                f"Restoring {name} as the Bloom filter {bloom.key!r} failed, and what it had"
                f" written was deleted: {exc}"
            ) from exc
        raise


def _load_chunk(bloom: FilterBase, call: Call, header: bool) -> None:
    """Run a native shard's ``BF.LOADCHUNK``, its reply lost or not.

    A later chunk copies bytes to their place: sent again, it is harmless. The header (the
    first chunk) creates the key, and RedisBloom refuses it loaded twice ("received bad
    data"): its lost reply leaves unknown whether it ran, so it is never sent blind again;
    the key (the restore's own: none was there) is deleted and the header loaded anew.
    """
    parts = bloom.parts
    operation = "restore the filter's shards"
    if not header:
        parts.run(operation, [call], write=True)
        return
    once = dataclasses.replace(call, resend=b"")  # lost: not sent again, its reply None
    deadline = time.monotonic() + bloom.faults.retry_timeout
    while parts.run(operation, [once], write=True)[0] is None:
        bloom.events.count("retries")
        logger.warning(
            "The reply to the first BF.LOADCHUNK of %r (its header, which creates the key) was"
            " lost, so whether it ran is unknown: deleting the key to load the shard anew.",
            call.key,
        )
        delete = Call(pack_command(b"DEL", call.key or ""), key=call.key, shard=call.shard)
        parts.run("delete a shard whose header load is in doubt", [delete], write=True)
        if time.monotonic() >= deadline:
            raise BloomFilterError(
                f"Redis lost the reply to the header of shard {call.shard} ({call.key!r})"
                f" each time it was loaded, for {bloom.faults.retry_timeout:g} s (the retry"
                " timeout): the connection kept failing. Restore it again."
            )


def _check_written(
    bloom: FilterBase, target: FilterRecord, written: list[tuple[str, int]], counters: bool
) -> None:
    """Raise if a key the restore wrote is gone (evicted), before a worker adopts the filter."""
    parts = bloom.parts
    native_kind = target.backend == "native"
    k = target.spec.hash_count
    checks: list[tuple[Call, bytes]] = [  # (the read, what it must read)
        (
            Call(pack_command(b"TYPE", key), key=key, shard=shard),
            layout.NATIVE_TYPE.encode(),
        )
        if native_kind
        else (
            Call(
                pack_command(b"GETRANGE", key, 0, layout.IDENTITY_BYTES - 1), key=key, shard=shard
            ),
            layout.identity(target.filter_id, shard, k),
        )
        for key, shard in written
    ]
    if counters:
        checks.append(
            (Call(pack_command(b"TYPE", parts.counter_key), key=parts.counter_key), b"hash")
        )
    checks += [
        (
            Call(pack_command(b"GET", parts.marker_key), key=parts.marker_key, server=i),
            layout.server_marker(target.filter_id, i, target.servers).encode(),
        )
        for i in range(target.servers if target.servers > 1 else 0)
    ]
    replies = parts.run("check the restored parts", [call for call, _ in checks])
    gone = [
        call
        for (call, want), reply in zip(checks, replies, strict=True)
        if (reply.encode() if isinstance(reply, str) else reply) != want
    ]
    if not gone:
        return
    where = {bloom.topology.route(call.key or "", call.shard, call.server).address for call in gone}
    policies = ", ".join(
        f"Redis at {server.address} has maxmemory-policy {server.policy}"
        for server in health.survey(bloom.executor, bloom.topology)
        if server.address in where and server.policy
    )
    named = ", ".join(repr(call.key) for call in gone[:NAMED])
    more = f" and {len(gone) - NAMED:,} more" if len(gone) > NAMED else ""
    raise BloomFilterError(
        f"{len(gone):,} key(s) it wrote were gone before its record was written ({named}{more}):"
        f" evicted ({policies or 'see the maxmemory-policy of ' + ', '.join(sorted(where))}),"
        " or deleted. Give Redis room for the filter, with maxmemory-policy noeviction (or"
        " volatile-*, which keeps keys without a TTL), and restore it again."
    )


def _undo(bloom: FilterBase, undo: list[Call], exc: BaseException) -> None:
    """Delete what a failed restore wrote, through an executor of its own (not failing fast)."""
    executor = Executor(
        bloom.topology, bloom.faults.retry_timeout, budget=bloom.faults.retry_budget
    )
    parts = Parts(executor, bloom.key, bloom.parts.spec)
    try:
        parts.run("undo a failed restore", undo, write=True)
    except (BloomFilterError, KeyboardInterrupt) as undone:
        # Ctrl-C, during the restore or its undo, stays a KeyboardInterrupt: said in a note.
        interrupted = isinstance(exc, KeyboardInterrupt)
        stopped = "was interrupted" if interrupted else f"failed ({exc})"
        undoing = (
            "was interrupted"
            if isinstance(undone, KeyboardInterrupt)
            else f"failed{'' if interrupted else ' too'} ({undone})"
        )
        said = (
            f"Restoring the Bloom filter {bloom.key!r} {stopped}, and deleting what it had"
            f" written {undoing}: reset the filter {bloom.key!r} to delete its parts."
        )
        interrupt = undone if isinstance(undone, KeyboardInterrupt) else exc
        if not isinstance(interrupt, KeyboardInterrupt):
            raise RestoreFailedError(said) from exc
        interrupt.add_note(said)
        raise interrupt from None
    logger.info(
        "Restoring the Bloom filter %r failed; the %d key(s) it had written were deleted: %s",
        bloom.key,
        sum(call.key != parts.marker_key for call in undo),  # the markers are not counted
        exc,
    )
