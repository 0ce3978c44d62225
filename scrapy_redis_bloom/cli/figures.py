"""The commands that show figures and change nothing: ``info``, ``watch`` and ``size``."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from scrapy_redis_bloom.cli.context import EXIT_OK, Context, config_of, existing, open_existing
from scrapy_redis_bloom.cli.streams import emit, fill_chart, out, table
from scrapy_redis_bloom.core.generations import growth_limit
from scrapy_redis_bloom.core.record import FilterRecord
from scrapy_redis_bloom.core.settings import WORKER_TTL, BloomConfig, SettingsLike
from scrapy_redis_bloom.core.sizing import (
    LayoutCost,
    Sizing,
    check_cost,
    false_positive_rate,
    filter_allocation,
    format_bytes,
    layout_costs,
    rate_share,
)
from scrapy_redis_bloom.engine.bitmap.filter import RedisBloomFilter
from scrapy_redis_bloom.engine.native import parts as native_parts
from scrapy_redis_bloom.engine.native.filter import NativeBloomFilter
from scrapy_redis_bloom.engine.state import (
    DamagedPart,
    FilterState,
    estimate_from_items,
    read_state,
)
from scrapy_redis_bloom.ops import inventory

#: The two ways of sizing: given one, the other's settings are set aside.
_BY_RATE = ("BLOOMFILTER_CAPACITY", "BLOOMFILTER_ERROR_RATE")
_BY_BITS = ("BLOOMFILTER_BIT", "BLOOMFILTER_HASH_NUMBER")
#: The figures of a filter's (or a generation's) state, in ``info --json``'s order.
_STATE = "bits_set fill_ratio estimated_items estimated_fpr"
#: What ``info --json`` says of each generation, in order.
_GENERATION = "generation shards bits hash_count capacity " + _STATE


def _fields(source: object, names: str) -> dict[str, Any]:
    """Return the attributes of ``source`` that ``names`` lists (as words), by name."""
    return {name: getattr(source, name) for name in names.split()}


def _servers_text(ctx: Context, places: Sequence[str]) -> str:
    if ctx.cluster:
        return f"Redis Cluster, {len(places)} master(s): {', '.join(places)}"
    if len(places) == 1:
        return places[0]
    return f"{len(places)}: " + ", ".join(f"{i}={place}" for i, place in enumerate(places))


def info(ctx: Context) -> int:
    """Show the filter's record, the state of its parts and of its bits; repair nothing."""
    key = ctx.key
    bloom, record = existing(ctx)
    if isinstance(bloom, NativeBloomFilter):
        return _native_info(ctx, bloom, record)
    spec = record.spec
    state = read_state(bloom.parts, record)  # every part's identity checked with its bits
    damaged = _damaged(bloom, state.damaged)
    missing = sum(1 for shard in damaged if shard["found"] == "missing")
    markers = inventory.check_markers(bloom, record)
    activity, activity_rows = _activity(bloom, state, WORKER_TTL.read(ctx.settings))
    places = inventory.addresses(bloom)
    at_capacity = false_positive_rate(spec.bits, spec.hash_count, record.capacity, spec.block_bits)
    growth = record.growth
    written = sum(1 for ones in state.bits_set_per_shard if ones)
    data: dict[str, Any] = {
        "key": key,
        "backend": "bitmap",
        "server": ctx.address,
        "servers": places,
        "cluster": ctx.cluster,
        "id": record.filter_id,
        "state": "damaged" if damaged else record.state,
        "record_state": record.state,
        "created": datetime.fromtimestamp(record.created, UTC).isoformat(),
        "created_timestamp": record.created,
        **_fields(record, "layout scheme"),
        "block_bits": spec.block_bits,
        "sizing": record.sizing,
        "fingerprints": record.fingerprints or None,
        "record_servers": record.servers,
        "bits": spec.bits,
        "bytes": spec.total_bytes,
        **_fields(spec, "shards shard_bits hash_count"),
        "capacity": record.capacity,
        "expected_fpr_at_capacity": at_capacity,
        **_fields(state, _STATE),
        "total_bits": state.total_bits,  # every generation's: what bits_set counts among
        **activity,
        "shards_with_bits_set": written,
        "shards_missing": missing,
        "shards_foreign": len(damaged) - missing,
        "damaged_shards": damaged,
        "server_markers": [
            {"server": m.address, "marker": m.found, "status": m.status} for m in markers
        ],
        "bits_set_per_shard": list(state.bits_set_per_shard),
        **_fields(record, "expansion tightening ttl"),
        "max_generations": growth.last + 1,
        **_fields(growth, "grown_capacity rate_bound"),
        "generations": [_fields(gen, _GENERATION) for gen in state.generations],
    }
    state_text: str = record.state
    if record.state == "creating":
        state_text += " (being created, or its creator stopped: a worker opening it finishes it)"
    if damaged:
        state_text = _damaged_state(damaged, record)
    blocked = f" (blocked: {spec.block_bits}-bit blocks)" if spec.block_bits else ""
    rows = [
        ("Bloom filter", key),
        ("Filter id", record.filter_id),
        ("Backend", "bitmap (Redis strings, hashed client-side)"),
        ("State", state_text),
        ("Servers" if len(places) > 1 else "Server", _servers_text(ctx, places)),
        ("Created", record.created_text()),
        ("Layout / hash scheme", f"{record.layout} / {record.scheme}{blocked}"),
        ("Sizing", record.sizing),
        ("Fingerprints", fingerprints_text(record)),
        ("Bits (m)", f"{spec.bits:,} ({format_bytes(spec.total_bytes)})"),
        ("Shards", f"{spec.shards:,} of {spec.shard_bits:,} bits, {written:,} with bits set"),
        ("Missing or foreign shards", _damaged_text(damaged)),
    ]
    if markers:
        bad = [f"; {m.address}: {m.status} ({m.found!r})" for m in markers if m.status != "ok"]
        in_place = len(markers) - len(bad)
        rows.append(("Server markers", f"{in_place} of {len(markers)} in place{''.join(bad)}"))
    grown = (  # what growth buys a growing filter
        f"; up to {growth.last + 1} generations per shard, {growth.grown_capacity:,} items"
        f" in all at an FP rate under {growth.rate_bound:.3g}"
        if record.expansion
        else ""
    )
    rows += [
        ("Hash functions (k)", str(spec.hash_count)),
        ("Capacity", f"{record.capacity:,} items"),
        ("Expected FP rate at capacity", f"{at_capacity:.3g}"),
        ("Growth / re-crawl", record.growth_text() + grown),
    ]
    data["layouts"], layout_rows = _record_layouts(record)
    rows += layout_rows
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
    together = " (all generations together)" if len(state.generations) > 1 else ""
    rows += [
        (
            "Bits set",
            f"{state.bits_set:,}" + (f" of {state.total_bits:,}{together}" if together else ""),
        ),
        ("Fill ratio", f"{100 * state.fill_ratio:.4f} %"),
        *fill_chart(state.bits_set_per_shard, state.total_bits // spec.shards),
        ("Estimated items", f"{state.estimated_items:,}"),
        ("Estimated FP rate now", f"{state.estimated_fpr:.3g}{together}"),
    ]
    return emit(ctx, data, table(rows + activity_rows))


def _activity(
    bloom: RedisBloomFilter | NativeBloomFilter, state: FilterState, worker_ttl: float
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Return the data and the info rows on memory, the workers' counts and the live workers."""
    totals = bloom.totals()
    workers = bloom.live_workers(worker_ttl)
    data = {
        "memory_bytes": state.memory_bytes,
        "total_added": totals.added,
        "total_filtered": totals.seen,
        "live_workers": workers,
    }
    return data, [
        ("Memory in Redis", f"{format_bytes(state.memory_bytes)} ({state.memory_bytes:,} bytes)"),
        ("Added by all workers", f"{totals.added:,}"),
        ("Filtered by all workers", f"{totals.seen:,}"),
        ("Live workers", f"{len(workers)}" + (f" ({', '.join(workers)})" if workers else "")),
    ]


def _native_info(ctx: Context, bloom: NativeBloomFilter, record: FilterRecord) -> int:
    """Show a native filter (BF.* shards): its record, its shards' items, memory and rate."""
    present = bloom.existing()
    state = bloom.state(present)  # with a TTL: its live windows lost or foreign, damaged
    activity, activity_rows = _activity(bloom, state, WORKER_TTL.read(ctx.settings))
    places = [node.address for node in bloom.topology.primaries()]
    absent = [
        DamagedPart(s, bloom.shard_keys[s], "missing")
        for s in range(record.spec.shards)
        if s not in present
    ]
    damaged = _damaged(bloom, sorted([*absent, *state.damaged], key=lambda part: part.shard))
    missing = [part["key"] for part in damaged if part["found"] == "missing"]
    layouts, layout_rows = _record_layouts(record)
    state_text = _damaged_state(damaged, record) if damaged else record.state
    data: dict[str, Any] = {
        "key": ctx.key,
        "backend": "native",
        "servers": places,
        "id": record.filter_id,
        "state": "damaged" if damaged else record.state,
        "record_state": record.state,
        "created": datetime.fromtimestamp(record.created, UTC).isoformat(),
        **_fields(record, "layout sizing"),
        "shards": record.spec.shards,
        "shards_missing": len(missing),
        "shards_foreign": len(damaged) - len(missing),
        "missing_shard_keys": missing,
        "damaged_shards": damaged,
        **_fields(record, "capacity expansion"),
        "reserved_capacity": record.growth.native_capacity,
        "reserved_rate": record.shard_rate,
        "generations": len(state.generations),
        **_fields(state, "estimated_items estimated_fpr"),
        "layouts": layouts,
        **activity,
    }
    rows = [
        ("Bloom filter", ctx.key),
        ("Backend", "native (server-side Bloom filters, BF.*)"),
        ("Filter id", record.filter_id),
        ("State", state_text),
        ("Servers" if len(places) > 1 else "Server", _servers_text(ctx, places)),
        ("Created", record.created_text()),
        ("Sizing", record.sizing),
        ("Fingerprints", fingerprints_text(record)),
        ("Shards", f"{record.spec.shards:,}, {len(missing):,} missing"),
        ("Missing or foreign shards", _damaged_text(damaged)),
        ("Capacity", f"{record.capacity:,} items"),
        ("Each shard (BF.RESERVE)", _reserved_text(record)),
        ("Growth", record.growth_text()),
        *layout_rows,
        ("Sub-filters (most in a shard)", f"{len(state.generations)}"),
        ("Estimated items", f"{state.estimated_items:,}"),
        ("Estimated FP rate now", f"{state.estimated_fpr:.3g}"),
    ]
    return emit(ctx, data, table(rows + activity_rows))


def _reserved_text(record: FilterRecord) -> str:
    """Say what ``BF.RESERVE`` gave each shard of a native filter, as its record says."""
    window = " per re-crawl window" if record.ttl else ""
    earlier = (
        f" (layout {record.layout}: the rate asked, as earlier builds reserved it)"
        if record.reserved_rate is None
        else ""
    )
    return (
        f"{record.growth.native_capacity:,} items at error rate {record.shard_rate:.3g}"
        f"{window}{earlier}"
    )


_MODEL = (
    "est. Redis time per check: a model of Redis 7.0 on 2 vCPUs"
    " (docs/howto/size-a-filter.md#layouts-classic-blocked-native)"
)
_LAYOUT_NAMES = {
    "classic": "Classic layout (unblocked)",
    "blocked": "Blocked layout",
    "native": "Native (BF.*)",
}


def _layouts(
    sizing: Sizing,
    capacity: int,
    expansion: int,
    servers: int,
    current: str,
    mark: str,
    native: FilterRecord | None = None,
) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """Return what each layout costs, as data and as rows; ``current`` is marked ``mark``.

    Given a native filter's record, its row says what ``BF.RESERVE`` makes of it (at the
    reserved rate, as the rows above the table do), not the model's bare-rate guess.
    """
    costs = layout_costs(sizing, capacity, growing=bool(expansion), servers=servers)
    if native is not None:
        costs = tuple(_reserved_cost(native, servers) if c.layout == "native" else c for c in costs)
    data = [
        {
            **_fields(cost, "layout hash_count memory_bytes"),
            "error_rate_at_capacity": cost.error_rate,
            "redis_us_per_check": round(cost.check_us, 2),
            "current": cost.layout == current,
        }
        for cost in costs
    ]
    rows = [("Layouts", _MODEL)] + [
        (
            _LAYOUT_NAMES[cost.layout] + (f" ({mark})" if cost.layout == current else ""),
            f"k={cost.hash_count}, {format_bytes(cost.memory_bytes)}, FP rate at capacity"
            f" {cost.error_rate:.3g}, ~{cost.check_us:.1f} µs of Redis per check",
        )
        for cost in costs
    ]
    return data, rows


def _reserved_cost(record: FilterRecord, servers: int) -> LayoutCost:
    """Return a native filter's layout figures as its shards' ``BF.RESERVE`` makes them."""
    first = native_parts.links(record, 1)[0]
    memory = record.spec.shards * native_parts.shard_bytes(record)
    rate = false_positive_rate(first.bits, first.hash_count, first.capacity)
    growing = bool(record.expansion)
    cost = check_cost("native", first.hash_count, memory // max(1, servers), growing=growing)
    return LayoutCost("native", first.hash_count, memory, rate, cost)


def _record_layouts(record: FilterRecord) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """Return what each layout costs at the filter's capacity and rate, this one marked."""
    share = rate_share(record.expansion, record.ttl, record.tightening)
    sizing = Sizing.parse(record.sizing, share)
    if sizing is None:  # a filter made from a bare geometry: its capacity at its own rate
        spec = record.spec
        rate = false_positive_rate(spec.bits, spec.hash_count, record.capacity, spec.block_bits)
        sizing = Sizing(capacity=record.capacity, error_rate=rate)
    current = "blocked" if record.spec.block_bits else "classic"
    if record.backend == "native":
        current = "native"
    return _layouts(
        sizing,
        record.capacity,
        record.expansion,
        record.servers,
        current,
        "this filter",
        record if record.backend == "native" else None,
    )


def _damaged(
    bloom: RedisBloomFilter | NativeBloomFilter, parts: Sequence[DamagedPart]
) -> list[dict[str, Any]]:
    """Return the parts missing or not the filter's, each with the server that holds its key."""
    return [
        dict(
            shard=part.shard,
            key=part.key,
            server=bloom.topology.route(part.key, part.shard, None).address,
            found=part.found,
        )
        for part in parts
    ]


def _damaged_state(damaged: Sequence[dict[str, Any]], record: FilterRecord) -> str:
    """Say the filter is damaged, and what its record says."""
    return (
        f"damaged: {len(damaged):,} part(s) missing or foreign, listed below (its record says"
        f" {record.state}): URLs they held are lost"
    )


def _damaged_text(damaged: Sequence[dict[str, Any]]) -> str:
    """Say which shards are missing or not this filter's: the first few, then a count."""
    if not damaged:
        return "0"
    named = [f"{d['key']!r} on {d['server']}: {d['found']}" for d in damaged[:5]]
    more = f"; and {len(damaged) - 5:,} more" if len(damaged) > 5 else ""
    return f"{len(damaged):,} ({'; '.join(named)}{more})"


def _sample(bloom: RedisBloomFilter | NativeBloomFilter) -> dict[str, Any]:
    record = bloom.record
    assert record is not None  # opened
    totals = bloom.totals()
    if isinstance(bloom, NativeBloomFilter):
        state = bloom.state(bloom.existing())
        items, fill = state.estimated_items, None
    elif record.ttl:  # the counters hold what the windows forgot, too
        state = bloom.live_state()
        items, fill = state.estimated_items, state.fill_ratio
    else:
        state = estimate_from_items(record.growth, totals.added)
        items, fill = totals.added, state.fill_ratio
    return {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "items": items,
        "capacity": record.capacity,
        "fill_ratio": fill,
        "estimated_fpr": state.estimated_fpr,
        "filtered": totals.seen,
        "live_workers": len(bloom.live_workers(settle=0)),  # a sample a second: no wait
    }


def _line(sample: dict[str, Any], previous: dict[str, Any] | None) -> str:
    added = sample["items"] - previous["items"] if previous else 0
    fill = sample["fill_ratio"]
    return (
        f"{sample['time'][11:19]}  {sample['items']:,} items"
        f" ({100 * sample['items'] / sample['capacity']:.2f} % of {sample['capacity']:,})"
        f"  {added:+,}"  # less than before: counts restored from an older copy
        + (f"  fill {100 * fill:.4f} %" if fill is not None else "")
        + f"  FP rate {sample['estimated_fpr']:.3g}"
        f"  {sample['filtered']:,} filtered  {sample['live_workers']} live worker(s)"
    )


def watch(ctx: Context) -> int:
    """Print a line of figures every ``--interval`` seconds, ``--count`` times or until Ctrl-C."""
    bloom = open_existing(ctx)
    count = ctx.args.count
    previous: dict[str, Any] | None = None
    with contextlib.suppress(KeyboardInterrupt):  # the way to stop a watch without --count
        for done in itertools.count() if count is None else range(count):
            if done:
                time.sleep(ctx.args.interval)
            sample = _sample(bloom)
            out(json.dumps(sample) if ctx.args.json else _line(sample, previous))
            sys.stdout.flush()  # a line a sample, also into a pipe or a file
            previous = sample
    return EXIT_OK


def size_overrides(given: dict[str, Any]) -> dict[str, Any]:
    """Return the settings a calculation overrides: those given, and the other way unset."""
    for way, other in ((_BY_RATE, _BY_BITS), (_BY_BITS, _BY_RATE)):
        if any(name in given for name in way):
            return {**dict.fromkeys(other), **given}
    return given


def size(args: argparse.Namespace, settings: SettingsLike) -> int:
    """Print the geometry, rates and memory the sizing settings give."""
    config = config_of(settings)
    if config.backend == "native":
        return _native_size(args, config)
    spec = config.spec
    growth = config.growth
    memory = filter_allocation(spec)
    wanted, _ = config.sizing.geometry()
    if config.sizing.capacity is not None:
        other_way = "The same, the other way"
        other = (
            f"BLOOMFILTER_BIT = {math.ceil(math.log2(wanted))},"
            f" BLOOMFILTER_HASH_NUMBER = {spec.hash_count} (at least as many bits)"
        )
    else:  # (a filter sized by them has its own m and k: not "the same")
        other_way = "Sized by capacity and rate"
        rate = float(f"{config.expected_error_rate:.3g}")
        asked: dict[str, Any] = {"BLOOMFILTER_CAPACITY": config.capacity}
        asked["BLOOMFILTER_ERROR_RATE"] = rate
        if (blocked := settings.get("BLOOMFILTER_BLOCKED")) is not None:
            asked["BLOOMFILTER_BLOCKED"] = blocked  # (else the layout those two choose)
        sized = config_of(asked)  # (a rate that underflows to 0 was refused: settings)
        other = (
            f"BLOOMFILTER_CAPACITY = {config.capacity}, BLOOMFILTER_ERROR_RATE = {rate:.3g}"
            f" ({sized.spec.bits:,} bits, k = {sized.spec.hash_count})"
        )
    data: dict[str, Any] = {
        "sizing": config.sizing.canonical(),
        "capacity": config.capacity,
        "error_rate_at_capacity": config.expected_error_rate,
        "bits": spec.bits,
        "bits_asked": wanted,
        "hash_number": spec.hash_count,
        **_fields(spec, "shards shard_bits block_bits"),
        "bytes": spec.total_bytes,
        "memory_bytes": memory,
        **_fields(config, "expansion ttl"),
        **_fields(growth, "grown_capacity rate_bound"),
    }
    current = "blocked" if spec.block_bits else "classic"
    servers = 1 if config.connection.cluster else max(1, len(config.connection.urls))
    data["layouts"], layout_rows = _layouts(
        config.sizing, config.capacity, config.expansion, servers, current, "these settings"
    )
    rows = [
        ("Sizing asked for", config.sizing.canonical()),
        ("Bits (m)", f"{spec.bits:,} ({format_bytes(spec.total_bytes)}; {wanted:,} asked)"),
        ("Hash functions (k)", str(spec.hash_count)),
        (other_way, other),
        ("Capacity", f"{config.capacity:,} items"),
        ("Expected FP rate at capacity", f"{config.expected_error_rate:.3g}"),
        ("Shards", f"{spec.shards:,} of {spec.shard_bits:,} bits"),
        *(
            [("Blocked", f"each URL's bits in one {spec.block_bits}-bit block (hash scheme 2)")]
            if spec.block_bits
            else []
        ),
        ("Memory in Redis", f"{format_bytes(memory)} ({memory:,} bytes, generation 0)"),
        *layout_rows,
    ]
    limit = growth_limit(growth)
    grows = (
        f"{limit}, so it holds up to {growth.grown_capacity:,} items"
        if growth.last == 0
        else f"x{config.expansion} per generation, up to {growth.grown_capacity:,} items"
        + (f" ({limit})" if limit else "")
    ) + f" at an FP rate under {growth.rate_bound:.3g}"
    fixed = "none (BLOOMFILTER_EXPANSION = 0): a fixed size"
    rows.append(("Growth", grows if config.expansion else fixed))
    if config.ttl:
        rows.append(("Re-crawl window", f"URLs forgotten {config.ttl:,} to {2 * config.ttl:,} s"))
    return emit(args, data, table(rows))


def _native_size(args: argparse.Namespace, config: BloomConfig) -> int:
    """Print what a native filter of these settings would be: its shards' ``BF.RESERVE``.

    Not the bitmap geometry: RedisBloom picks each sub-filter's bits and k, and grows a shard
    by sub-filters of its own, bound by no bitmap generation's size.
    """
    record = config.record("native")
    first = native_parts.links(record, 1)[0]
    memory = record.spec.shards * native_parts.shard_bytes(record)
    bound = native_parts.rate_bound(record)
    if bound is None:
        keeps = f"under {config.design_error_rate:.3g}"
    else:  # (per window: a check reads two)
        window = " per re-crawl window" if config.ttl else ""
        keeps = f"up to {bound:.3g}{window}: its shards are too small to keep their rate"
    data: dict[str, Any] = {
        "sizing": config.sizing.canonical(),
        "backend": "native",
        "capacity": config.capacity,
        "shards": record.spec.shards,
        "reserved_capacity": record.growth.native_capacity,
        "reserved_rate": record.shard_rate,
        "first_bits": first.bits,
        "hash_number": first.hash_count,
        "memory_bytes": memory,
        "rate_bound": config.design_error_rate if bound is None else bound,
        **_fields(config, "expansion ttl"),
    }
    servers = 1 if config.connection.cluster else max(1, len(config.connection.urls))
    data["layouts"], layout_rows = _layouts(
        config.sizing,
        config.capacity,
        config.expansion,
        servers,
        "native",
        "these settings",
        record,
    )
    grows = (
        f"x{config.expansion} per sub-filter in each shard (RedisBloom's EXPANSION), as far as"
        f" the servers' memory goes, at an FP rate {keeps}"
        if config.expansion
        else "none (BLOOMFILTER_EXPANSION = 0): a shard refuses items past its capacity,"
        f" which stops the crawl; FP rate {keeps}"
    )
    rows = [
        ("Sizing asked for", config.sizing.canonical()),
        ("Backend", "native (server-side Bloom filters, BF.*)"),
        ("Capacity", f"{config.capacity:,} items"),
        ("Shards", f"{record.spec.shards:,}"),
        ("Each shard (BF.RESERVE)", _reserved_text(record)),
        (
            "First sub-filters",
            f"m={first.bits:,} bits, k={first.hash_count} hash functions each",
        ),
        ("Memory in Redis", f"{format_bytes(memory)} ({memory:,} bytes, first sub-filters)"),
        *layout_rows,
        ("Growth", grows),
    ]
    if config.ttl:
        rows.append(("Re-crawl window", f"URLs forgotten {config.ttl:,} to {2 * config.ttl:,} s"))
    return emit(args, data, table(rows))


def fingerprints_text(record: FilterRecord) -> str:
    """Say what makes the filter's elements, as its record says (workers must agree)."""
    return (
        record.fingerprints
        or "not recorded (created by the Python API, a tool or an older release)"
    )
