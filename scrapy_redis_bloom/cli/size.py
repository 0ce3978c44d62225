"""``size``: the sizing calculator, capacity and error rate <-> bits and hash functions.

Reads the sizing settings (``BLOOMFILTER_CAPACITY`` / ``_ERROR_RATE`` or ``_BIT`` /
``_HASH_NUMBER``, with ``_SHARD_BIT``, ``_SHARDS``, ``_EXPANSION``, ``_TTL``) and
says what a crawl would create from them: the geometry this release gives them
(:mod:`..sizing`), the other way of writing it, the rate expected at capacity, what
growth buys and the memory Redis reserves. Validated as a crawl validates them
(:class:`..config.BloomConfig`): a bad value is one error line. No Redis needed.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from scrapy_redis_bloom.cli.context import EXIT_OK, UsageError
from scrapy_redis_bloom.cli.output import emit, table
from scrapy_redis_bloom.core.settings import BloomConfig, SettingsLike
from scrapy_redis_bloom.core.sizing import filter_allocation, format_bytes

#: The two ways of sizing: given one, the other's settings are set aside.
_BY_RATE = ("BLOOMFILTER_CAPACITY", "BLOOMFILTER_ERROR_RATE")
_BY_BITS = ("BLOOMFILTER_BIT", "BLOOMFILTER_HASH_NUMBER")


def overrides(given: dict[str, Any]) -> dict[str, Any]:
    """Return the settings a calculation overrides: those given, and the other way unset.

    Options for one way of sizing replace the project's settings of the other way,
    which a crawl would refuse beside them.
    """
    found = {name: value for name, value in given.items() if value is not None}
    if any(name in found for name in _BY_RATE):
        found.update({name: None for name in _BY_BITS if name not in found})
    elif any(name in found for name in _BY_BITS):
        found.update({name: None for name in _BY_RATE if name not in found})
    return found


def run(args: argparse.Namespace, settings: SettingsLike, rename: Any = str) -> int:
    """Print the geometry, rates and memory the sizing settings give."""
    try:
        config = BloomConfig.from_settings(settings)
    except ValueError as exc:
        raise UsageError(rename(str(exc))) from None
    spec = config.spec
    growth = config.growth
    memory = filter_allocation(spec)
    wanted, _ = config.sizing.geometry()
    if config.sizing.capacity is not None:
        other = (
            f"BLOOMFILTER_BIT = {math.ceil(math.log2(wanted))},"
            f" BLOOMFILTER_HASH_NUMBER = {spec.hash_count} (at least as many bits)"
        )
    else:
        other = (
            f"BLOOMFILTER_CAPACITY = {config.capacity},"
            f" BLOOMFILTER_ERROR_RATE = {config.expected_error_rate:.3g}"
        )
    data: dict[str, Any] = {
        "sizing": config.sizing.canonical(),
        "capacity": config.capacity,
        "error_rate_at_capacity": config.expected_error_rate,
        "bits": spec.bits,
        "bits_asked": wanted,
        "hash_number": spec.hash_count,
        "shards": spec.shards,
        "shard_bits": spec.shard_bits,
        "block_bits": spec.block_bits,
        "bytes": spec.total_bytes,
        "memory_bytes": memory,
        "expansion": config.expansion,
        "ttl": config.ttl,
        "grown_capacity": growth.grown_capacity,
        "rate_bound": growth.rate_bound,
    }
    rows = [
        ("Sizing asked for", config.sizing.canonical()),
        ("Bits (m)", f"{spec.bits:,} ({format_bytes(spec.total_bytes)}; {wanted:,} asked)"),
        ("Hash functions (k)", str(spec.hash_count)),
        ("The same, the other way", other),
        ("Capacity", f"{config.capacity:,} items"),
        ("Expected FP rate at capacity", f"{config.expected_error_rate:.3g}"),
        ("Shards", f"{spec.shards:,} of {spec.shard_bits:,} bits"),
        *(
            [("Blocked", f"each URL's bits in one {spec.block_bits}-bit block (hash scheme 2)")]
            if spec.block_bits
            else []
        ),
        ("Memory in Redis", f"{format_bytes(memory)} ({memory:,} bytes, generation 0)"),
    ]
    if config.expansion:
        rows.append(
            (
                "Growth",
                f"x{config.expansion} per generation, up to {growth.grown_capacity:,} items"
                f" at an FP rate under {growth.rate_bound:.3g}",
            )
        )
    else:
        rows.append(("Growth", "none (BLOOMFILTER_EXPANSION = 0): a fixed size"))
    if config.ttl:
        rows.append(("Re-crawl window", f"URLs forgotten {config.ttl:,} to {2 * config.ttl:,} s"))
    emit(args, data, table(rows))
    return EXIT_OK
