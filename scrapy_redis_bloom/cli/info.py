"""``info``: the filter's record, the state of its parts and bits, its workers; repairs nothing.

Reads the config record (``KEY:meta``), checks each shard's header and each server's
marker against it, and counts its bits (BITCOUNT per shard): identity, geometry,
creation time, bits set, fill ratio (with a bar chart of the shards' fill), estimated
items, false-positive rate now, memory, totals, live workers, and the shards that are
missing or not this filter's. A native filter (BF.*) shows its items and memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scrapy_redis_bloom.cli.context import EXIT_OK, Context
from scrapy_redis_bloom.cli.opening import (
    check_servers,
    missing,
    native_if,
    shard_address,
    stored,
    usable,
)
from scrapy_redis_bloom.cli.output import emit, fill_chart, table, utc
from scrapy_redis_bloom.core.record import FilterRecord
from scrapy_redis_bloom.core.sizing import false_positive_rate, format_bytes
from scrapy_redis_bloom.engine.bitmap.filter import RedisBloomFilter
from scrapy_redis_bloom.engine.native.filter import NativeBloomFilter
from scrapy_redis_bloom.engine.state import FilterState, FilterTotals
from scrapy_redis_bloom.ops import inventory


def _servers_text(ctx: Context, places: Sequence[str]) -> str:
    """Say where the filter lives, for the info table."""
    if ctx.cluster:
        return f"Redis Cluster, {len(places)} master(s): {', '.join(places)}"
    if len(places) == 1:
        return places[0]
    return f"{len(places)}: " + ", ".join(f"{i}={place}" for i, place in enumerate(places))


def run(ctx: Context) -> int:
    """Show the filter's record, the state of its parts and of its bits; repair nothing."""
    key = ctx.key
    bloom, found = stored(ctx)
    record = usable(found)
    if record is None:
        raise missing(ctx, bloom)
    check_servers(ctx, bloom, record)
    if (native := native_if(ctx, record)) is not None:
        return _native(ctx, native, record)
    spec = record.spec
    shards = inventory.check_shards(bloom, record)
    markers = inventory.check_markers(bloom, record)
    state = inventory.state(bloom)
    totals = bloom.totals()
    workers = bloom.live_workers()
    places = inventory.addresses(bloom)
    created = utc(record.created)
    at_capacity = false_positive_rate(spec.bits, spec.hash_count, record.capacity, spec.block_bits)
    growth = record.growth
    written = sum(1 for ones in state.bits_set_per_shard if ones)
    damaged = [(shard, "missing") for shard in shards.missing] + list(shards.foreign)
    damaged.sort()
    bad_markers = [m for m in markers if m.status != "ok"]
    data: dict[str, Any] = {
        "key": key,
        "backend": "bitmap",
        "server": ctx.address,
        "servers": places,
        "cluster": ctx.cluster,
        "id": record.filter_id,
        "state": record.state,
        "created": created.isoformat(),
        "created_timestamp": record.created,
        "layout": record.layout,
        "scheme": record.scheme,
        "block_bits": spec.block_bits,
        "sizing": record.sizing,
        "record_servers": record.servers,
        "bits": spec.bits,
        "bytes": spec.total_bytes,
        "shards": spec.shards,
        "shard_bits": spec.shard_bits,
        "hash_count": spec.hash_count,
        "capacity": record.capacity,
        "expected_fpr_at_capacity": at_capacity,
        "bits_set": state.bits_set,
        "fill_ratio": state.fill_ratio,
        "estimated_items": state.estimated_items,
        "estimated_fpr": state.estimated_fpr,
        "memory_bytes": state.memory_bytes,
        "total_added": totals.added,
        "total_filtered": totals.seen,
        "live_workers": workers,
        "shards_with_bits_set": written,
        "shards_missing": len(shards.missing),
        "shards_foreign": len(shards.foreign),
        "damaged_shards": [
            {
                "shard": shard,
                "key": bloom.parts.shard_key(shard),
                "server": shard_address(bloom, shard),
                "found": what,
            }
            for shard, what in damaged
        ],
        "server_markers": [
            {"server": m.address, "marker": m.found, "status": m.status} for m in markers
        ],
        "bits_set_per_shard": list(state.bits_set_per_shard),
        "expansion": record.expansion,
        "tightening": record.tightening,
        "ttl": record.ttl,
        "max_generations": growth.last + 1,
        "grown_capacity": growth.grown_capacity,
        "rate_bound": growth.rate_bound,
        "generations": [
            {
                "generation": gen.generation,
                "shards": gen.shards,
                "bits": gen.bits,
                "hash_count": gen.hash_count,
                "capacity": gen.capacity,
                "bits_set": gen.bits_set,
                "fill_ratio": gen.fill_ratio,
                "estimated_items": gen.estimated_items,
                "estimated_fpr": gen.estimated_fpr,
            }
            for gen in state.generations
        ],
    }
    state_text: str = record.state
    if record.state == "creating":
        state_text += " (being created, or its creator stopped: a worker opening it finishes it)"
    rows = [
        ("Bloom filter", key),
        ("Filter id", record.filter_id),
        ("Backend", "bitmap (Redis strings, hashed client-side)"),
        ("State", state_text),
        ("Servers" if len(places) > 1 else "Server", _servers_text(ctx, places)),
        ("Created", created.strftime("%Y-%m-%d %H:%M:%S UTC")),
        (
            "Layout / hash scheme",
            f"{record.layout} / {record.scheme}"
            + (f" (blocked: {spec.block_bits}-bit blocks)" if spec.block_bits else ""),
        ),
        ("Sizing", record.sizing),
        ("Bits (m)", f"{spec.bits:,} ({format_bytes(spec.total_bytes)})"),
        ("Shards", f"{spec.shards:,} of {spec.shard_bits:,} bits, {written:,} with bits set"),
        ("Missing or foreign shards", _damaged_text(bloom, damaged)),
    ]
    if markers:
        rows.append(
            (
                "Server markers",
                f"{len(markers) - len(bad_markers)} of {len(markers)} in place"
                + "".join(f"; {m.address}: {m.status} ({m.found!r})" for m in bad_markers),
            )
        )
    rows += [
        ("Hash functions (k)", str(spec.hash_count)),
        ("Capacity", f"{record.capacity:,} items"),
        ("Expected FP rate at capacity", f"{at_capacity:.3g}"),
        ("Growth / re-crawl", _growth_text(record)),
    ]
    rows += [
        (
            f"Generation {gen.generation}",
            f"{gen.shards:,} shard(s), k={gen.hash_count}, {100 * gen.fill_ratio:.2f} % of"
            f" {format_bytes((gen.bits + 7) // 8)} set, ~{gen.estimated_items:,} of"
            f" {gen.capacity:,} items, FP rate {gen.estimated_fpr:.3g}",
        )
        for gen in state.generations
        if record.expansion or record.ttl
    ]
    rows += [
        ("Bits set", f"{state.bits_set:,}"),
        ("Fill ratio", f"{100 * state.fill_ratio:.4f} %"),
        *fill_chart(state.bits_set_per_shard, state.total_bits // spec.shards),
        ("Estimated items", f"{state.estimated_items:,}"),
        (
            "Estimated FP rate now",
            f"{state.estimated_fpr:.3g}"
            + (" (all generations together)" if len(state.generations) > 1 else ""),
        ),
    ]
    emit(ctx, data, table(rows + _activity_rows(state, totals, workers)))
    return EXIT_OK


def _activity_rows(
    state: FilterState, totals: FilterTotals, workers: list[str]
) -> list[tuple[str, str]]:
    """Return the info rows on memory, the workers' counts and the live workers."""
    return [
        ("Memory in Redis", f"{format_bytes(state.memory_bytes)} ({state.memory_bytes:,} bytes)"),
        ("Added by all workers", f"{totals.added:,}"),
        ("Filtered by all workers", f"{totals.seen:,}"),
        ("Live workers", f"{len(workers)}" + (f" ({', '.join(workers)})" if workers else "")),
    ]


def _native(ctx: Context, bloom: NativeBloomFilter, record: FilterRecord) -> int:
    """Show a native filter (BF.* shards): its record, its shards' items, memory and rate."""
    present = bloom.existing()
    state = bloom.state(present)
    totals = bloom.totals()
    workers = bloom.live_workers()
    places = [node.address for node in bloom.topology.primaries()]
    absent = [s for s in range(record.spec.shards) if s not in present]
    data: dict[str, Any] = {
        "key": ctx.key,
        "backend": "native",
        "servers": places,
        "id": record.filter_id,
        "state": record.state,
        "created": utc(record.created).isoformat(),
        "layout": record.layout,
        "sizing": record.sizing,
        "shards": record.spec.shards,
        "shards_missing": len(absent),
        "missing_shard_keys": [bloom.shard_keys[s] for s in absent],
        "capacity": record.capacity,
        "expansion": record.expansion,
        "generations": len(state.generations),
        "estimated_items": state.estimated_items,
        "estimated_fpr": state.estimated_fpr,
        "memory_bytes": state.memory_bytes,
        "total_added": totals.added,
        "total_filtered": totals.seen,
        "live_workers": workers,
    }
    rows = [
        ("Bloom filter", ctx.key),
        ("Backend", "native (server-side Bloom filters, BF.*)"),
        ("Filter id", record.filter_id),
        ("State", record.state),
        ("Servers" if len(places) > 1 else "Server", _servers_text(ctx, places)),
        ("Created", utc(record.created).strftime("%Y-%m-%d %H:%M:%S UTC")),
        ("Sizing", record.sizing),
        ("Shards", f"{record.spec.shards:,}, {len(absent):,} missing"),
        ("Capacity", f"{record.capacity:,} items"),
        ("Growth", record.growth_text()),
        ("Sub-filters (most in a shard)", f"{len(state.generations)}"),
        ("Estimated items", f"{state.estimated_items:,}"),
        ("Estimated FP rate now", f"{state.estimated_fpr:.3g}"),
    ]
    emit(ctx, data, table(rows + _activity_rows(state, totals, workers)))
    return EXIT_OK


def _growth_text(record: FilterRecord) -> str:
    """Say how the filter grows and forgets, with what growth buys."""
    growth = record.growth
    text = record.growth_text()
    if record.expansion:
        text += (
            f"; up to {growth.last + 1} generations per shard, {growth.grown_capacity:,} items"
            f" in all at an FP rate under {growth.rate_bound:.3g}"
        )
    return text


def _damaged_text(bloom: RedisBloomFilter, damaged: Sequence[tuple[int, str]]) -> str:
    """Say which shards are missing or not this filter's: the first few, then a count."""
    if not damaged:
        return "0"
    named = [
        f"{bloom.parts.shard_key(shard)!r} on {shard_address(bloom, shard)}: {what}"
        for shard, what in damaged[:5]
    ]
    more = f"; and {len(damaged) - 5:,} more" if len(damaged) > 5 else ""
    return f"{len(damaged):,} ({'; '.join(named)}{more})"
