"""Measures (c) and (d): Redis bytes per fingerprint, false positives, bulk adds.

(d) adds the same fingerprints in bulk with each filter's own bulk command: ours
``RedisBloomFilter.add_many`` (bitmaps, and the native backend where this version has
it), RedisBloom's ``BF.MADD`` pipelined in chunks, and a SETBIT-per-bit pipeline as the
naive baseline. (c) reads ``MEMORY USAGE`` of what each fill left, and the measured
false-positive rate: never-added fingerprints offered to the filled filter. Only the
public engine is used (``BloomConfig``, the filter's ``add_many`` / ``contains_many``,
``hashing.locate`` / ``offsets``).
"""

from __future__ import annotations

import gc
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from harness import BenchRedis, Samples, interleave
from micro import NAME_OLD, NAME_OURS, OLD, DupeFilter, Peers, build, close
from peers import (
    bf_expected_rate,
    bf_geometry,
    bf_madd,
    bf_mexists,
    bf_reserve,
    bloom_rate,
    check_old_plugin_offsets,
    old_plugin_false_positives,
)
from scrapy import Request
from workloads import fingerprints, unique_urls

logger = logging.getLogger("bench.bulk")

NAME_ADD_MANY = "ours: RedisBloomFilter.add_many"
NAME_ADD_MANY_NATIVE = "ours, native: add_many"
NAME_ADD_MANY_CLASSIC = "ours, classic layout: add_many"
NAME_BF_MADD = "RedisBloom BF.MADD (pipelined)"
NAME_BF_MADD_FIXED = "RedisBloom BF.MADD, NONSCALING"
NAME_SETBIT = "redis-py pipeline of SETBIT"
NAME_SET = "scrapy-redis SET (pipelined SADD)"
NAME_REDISBLOOM_MEMORY = "RedisBloom (BF.RESERVE p n)"
NAME_REDISBLOOM_FIXED = "RedisBloom (BF.RESERVE p n NONSCALING)"
NAME_OURS_NATIVE_MEMORY = "ours, native"
NAME_OURS_CLASSIC_MEMORY = "ours, classic layout"

#: Commands per pipeline flush of the SETBIT baseline.
SETBIT_BATCH = 10_000
#: Members per SADD command, and commands per flush, when filling the SET.
SADD_MEMBERS = 1_000
SADD_BATCH = 10
#: RedisBloom's type name, as TYPE reports a key holding one of its filters.
BLOOM_TYPE = "MBbloom--"


def optimum_bytes_per_item(error_rate: float) -> float:
    """Bytes per item of an optimal Bloom filter: log2(1/p) / ln 2 bits (1.44 log2(1/p))."""
    return math.log2(1 / error_rate) / math.log(2) / 8


def old_plugin_geometry(capacity: int, error_rate: float) -> tuple[int, int]:
    """Return (BLOOMFILTER_BIT, BLOOMFILTER_HASH_NUMBER) for n items at rate p.

    BIT: the smallest power of two with at least the optimal -n ln p / (ln 2)**2 bits.
    HASH_NUMBER: the fewest hash functions that reach p with that many bits (each costs
    it two round trips per request, and memory does not depend on it).
    """
    optimal = -capacity * math.log(error_rate) / math.log(2) ** 2
    bit = max(1, math.ceil(math.log2(optimal)))
    bits = 2**bit
    for k in range(1, 64):
        if (-math.expm1(-k * capacity / bits)) ** k <= error_rate:
            return bit, k
    return bit, round(bits / capacity * math.log(2))


@dataclass
class BulkResults:
    """What measures (c) and (d) found."""

    throughput: dict[str, Samples]
    memory: dict[str, Samples]
    #: Measured false-positive rates, per filter, with the expected one in extra.
    fpr: dict[str, Samples]
    info: dict[str, Any]
    #: Correctness checks that failed (the old plugin's offsets reproduced wrongly).
    failed: list[str]


def _ours_filter(
    client: Any, capacity: int, error_rate: float, backend: str | None, blocked: bool | None = None
) -> Any:
    """Ours on bitmaps, fixed size: it takes the BITFIELD bulk path.

    A growing one (the default) is sized for half the rate and adds through its
    script: bench/growth.py measures it. ``backend`` is BLOOMFILTER_BACKEND (None: a
    version without the setting); the filter is built as the package builds it. The
    native backend keeps its default growth: a fixed native shard refuses items past
    its share of the capacity, and shards fill unevenly. ``blocked`` sets
    BLOOMFILTER_BLOCKED (None: the package's default layout; sizing picks the bits the
    layout's rate needs).
    """
    from scrapy_redis_bloom import BloomConfig, RedisBloomFilter

    settings: dict[str, Any] = {
        "BLOOMFILTER_CAPACITY": capacity,
        "BLOOMFILTER_ERROR_RATE": error_rate,
    }
    if blocked is not None:
        settings["BLOOMFILTER_BLOCKED"] = blocked
    if backend != "native":
        settings["BLOOMFILTER_EXPANSION"] = 0
    if backend is not None:
        settings["BLOOMFILTER_BACKEND"] = backend
    config = BloomConfig.from_settings(settings)
    try:
        from scrapy_redis_bloom.engine.backend import make_filter  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return RedisBloomFilter.from_config(client, "bench:bulk", config)
    return make_filter(client, "bench:bulk", config)


def _native_keys(bench: BenchRedis) -> list[str]:
    """Return the keys that hold a RedisBloom filter (the native backend's shards)."""
    client = bench.redis()
    return [
        key.decode() if isinstance(key, bytes) else str(key)
        for key in client.scan_iter(count=1000)
        if client.type(key) in (BLOOM_TYPE, BLOOM_TYPE.encode())
    ]


def measure_bulk(
    bench: BenchRedis,
    count: int,
    setbit_count: int,
    error_rate: float,
    rounds: int,
    old_sample: int,
    peers: Peers,
    probes: int,
) -> BulkResults:
    """Measures (d) bulk adds per second and (c) bytes per fingerprint and false positives.

    Ours (and RedisBloom) add ``count`` fingerprints into a filter sized for exactly
    ``count`` items at ``error_rate``; memory and the false-positive rate on
    ``probes`` never-added fingerprints are read after each round. The SETBIT
    baseline adds the first ``setbit_count``. The SET and scrapy-redis-bloomfilter are
    filled once.
    """
    client = bench.redis()
    elements = fingerprints(count + probes)
    elements, never = elements[:count], elements[count:]
    backend = "bitmap" if peers.backend else None
    spec = _ours_filter(client, count, error_rate, backend).spec
    throughput: dict[str, Samples] = {}
    memory: dict[str, Samples] = {}
    fpr: dict[str, Samples] = {}

    def keep(table: dict[str, Samples], name: str, unit: str, value: float, size: int) -> Samples:
        samples = table.setdefault(name, Samples(name, unit, sample_size=size))
        samples.values.append(value)
        return samples

    def fill_ours(
        name: str, memory_name: str, which: str | None, blocked: bool | None = None
    ) -> None:
        bench.flush()
        bloom = _ours_filter(client, count, error_rate, which, blocked)
        gc.collect()
        start = time.perf_counter()
        flags = bloom.add_many(elements)
        elapsed = time.perf_counter() - start
        added = keep(throughput, name, "fp/s", count / elapsed, count)
        added.extra.setdefault("reported_seen", []).append(sum(flags))
        keys, used = bench.memory_of_all_keys()
        mem = keep(memory, memory_name, "B/fp", used / count, count)
        mem.extra.update(keys=keys, bytes=used)
        false = sum(bloom.contains_many(never))
        rate = keep(fpr, memory_name, "rate", false / probes, probes)
        if which == "native":
            native = _native_keys(bench)
            mem.extra["native_keys"] = len(native)
            added.note = mem.note = (
                f"{len(native)} RedisBloom key(s)" if native else "NOT native: no BF key made"
            )
            # A probe goes to one shard, each as likely: the mean of the shards' rates.
            rates = [bf_expected_rate(client, key) for key in native]
            rate.extra["expected"] = sum(rates) / len(rates) if rates else float("nan")
        else:
            _describe(mem, rate, bloom.spec, count)
        rate.extra.setdefault("false_positives", []).append(false)
        bloom.close()
        logger.info("  %-34s %10.0f fp/s, %.3f B/fp, FPR %.2e", name, count / elapsed,
                    used / count, false / probes)  # fmt: skip

    def run_setbit() -> None:
        bench.flush()
        sample = elements[:setbit_count]
        gc.collect()
        start = time.perf_counter()
        setbit_pipeline(client, spec, sample)
        elapsed = time.perf_counter() - start
        keep(throughput, NAME_SETBIT, "fp/s", setbit_count / elapsed, setbit_count)
        logger.info("  %-34s %10.0f fp/s", NAME_SETBIT, setbit_count / elapsed)

    def run_madd(name: str, memory_name: str, expansion: int) -> None:
        bench.flush()
        key = "bench:redisbloom"
        bf_reserve(client, key, count, error_rate, expansion)
        gc.collect()
        start = time.perf_counter()
        added = bf_madd(client, key, elements)
        elapsed = time.perf_counter() - start
        keep(throughput, name, "fp/s", count / elapsed, count).extra.setdefault("added", []).append(
            added
        )
        keys, used = bench.memory_of_all_keys()
        mem = keep(memory, memory_name, "B/fp", used / count, count)
        geometry = bf_geometry(client, key)
        mem.extra.update(keys=keys, bytes=used, geometry=geometry)
        false = bf_mexists(client, key, never)
        rate = keep(fpr, memory_name, "rate", false / probes, probes)
        rate.extra.setdefault("false_positives", []).append(false)
        rate.extra["expected"] = bf_expected_rate(client, key)
        if geometry:
            mem.note = f"k={geometry['hashes']}, {geometry['bits']:,} bits"
        logger.info("  %-34s %10.0f fp/s, %.3f B/fp, FPR %.2e", name, count / elapsed,
                    used / count, false / probes)  # fmt: skip

    runners: dict[str, Callable[[], None]] = {
        NAME_ADD_MANY: lambda: fill_ours(NAME_ADD_MANY, NAME_OURS, backend),
    }
    if peers.blocked:  # the layout the default (blocked) is not: its memory, its fill
        runners[NAME_ADD_MANY_CLASSIC] = lambda: fill_ours(
            NAME_ADD_MANY_CLASSIC, NAME_OURS_CLASSIC_MEMORY, backend, blocked=False
        )
    runners[NAME_SETBIT] = run_setbit
    if peers.native:
        runners[NAME_ADD_MANY_NATIVE] = lambda: fill_ours(
            NAME_ADD_MANY_NATIVE, NAME_OURS_NATIVE_MEMORY, "native"
        )
    if peers.bloom:
        runners[NAME_BF_MADD] = lambda: run_madd(NAME_BF_MADD, NAME_REDISBLOOM_MEMORY, 2)
        runners[NAME_BF_MADD_FIXED] = lambda: run_madd(NAME_BF_MADD_FIXED, NAME_REDISBLOOM_FIXED, 0)
    interleave(list(runners), rounds, lambda name, _: runners[name](), "(c, d) bulk add")

    memory[NAME_SET] = _set_memory(bench, elements)
    optimum = optimum_bytes_per_item(error_rate)
    memory[NAME_OURS].extra["optimum_bytes_per_item"] = optimum
    failed: list[str] = []
    if peers.old:
        memory[NAME_OLD] = _old_plugin_memory(bench, count, error_rate, old_sample)
        fpr[NAME_OLD], problem = _old_plugin_fpr(elements, never, count, error_rate)
        failed += [problem] if problem else []
    for rate in fpr.values():
        expected = rate.extra.get("expected", float("nan"))
        rate.note = f"expected {expected:.2e}; {rate.extra.get('false_positives')} of {probes:,}"
    bench.flush()
    info = {
        "capacity": count,
        "error_rate": error_rate,
        "optimum_bytes_per_item": optimum,
        "probes": probes,
    }
    return BulkResults(throughput, memory, fpr, info, failed)


def _describe(memory: Samples, rate: Samples, spec: Any, count: int) -> None:
    """Note a bitmap filter's geometry on its (c) rows; its expected rate at ``count`` items.

    The expected rate is the package's own formula for the spec: (1 - e^(-kn/m))^k, or
    for a blocked filter its mean over the blocks' Poisson loads.
    """
    from scrapy_redis_bloom.core.sizing import false_positive_rate

    block_bits = getattr(spec, "block_bits", 0)
    memory.extra.update(
        shards=spec.shards,
        shard_bits=spec.shard_bits,
        hash_count=spec.hash_count,
        bits=spec.bits,
        bitmap_bytes=spec.total_bytes,
        block_bits=block_bits,
    )
    memory.note = f"k={spec.hash_count}, {spec.shards} shards, {spec.bits:,} bits" + (
        f", blocks of {block_bits} bits" if block_bits else ""
    )
    rate.extra["expected"] = (
        false_positive_rate(spec.bits, spec.hash_count, count, block_bits)
        if block_bits
        else bloom_rate(spec.bits, spec.hash_count, count)
    )


def _old_plugin_fpr(
    elements: Sequence[str], never: Sequence[str], capacity: int, error_rate: float
) -> tuple[Samples, str | None]:
    """scrapy-redis-bloomfilter's false-positive rate at (capacity, error_rate), in memory.

    Its bit array is rebuilt from its own offsets (checked against its HashMap on a
    sample first); its ``exists`` would answer the same from Redis, 2k round trips
    per fingerprint later.
    """
    bit, hash_number = old_plugin_geometry(capacity, error_rate)
    problem = None
    if not check_old_plugin_offsets(list(elements[:500]) + list(never[:500]), bit, hash_number):
        problem = "(c) the reproduction of scrapy-redis-bloomfilter's offsets disagrees with it"
    false = old_plugin_false_positives(elements, never, bit, hash_number)
    samples = Samples(NAME_OLD, "rate", [false / len(never)], len(never))
    samples.extra.update(
        false_positives=[false],
        expected=bloom_rate(2**bit, hash_number, capacity),
        bit=bit,
        hash_number=hash_number,
    )
    logger.info("  %-34s FPR %.2e (its offsets, in memory)", NAME_OLD, false / len(never))
    return samples, problem


def setbit_pipeline(client: Any, spec: Any, elements: Sequence[str]) -> None:
    """Add elements with one SETBIT per bit, pipelined: the baseline of measure (d).

    The shard and the k offsets are those of the hashing scheme (``hashing.locate``
    and ``hashing.offsets``), so the bits set are exactly the filter's.
    """
    from scrapy_redis_bloom.core.hashing import locate, offsets

    shards, shard_bits, k = spec.shards, spec.shard_bits, spec.hash_count
    keys = [f"bench:setbit:{i}" for i in range(shards)]
    pipe = client.pipeline(transaction=False)
    pending = 0
    for element in elements:
        shard, x, y = locate(element, spec)
        key = keys[shard]
        for offset in offsets(x, y, k, shard_bits):
            pipe.setbit(key, offset, 1)
        pending += k
        if pending >= SETBIT_BATCH:
            pipe.execute()
            pending = 0
    if pending:
        pipe.execute()


def _set_memory(bench: BenchRedis, elements: Sequence[str]) -> Samples:
    """Fill scrapy-redis's SET with the fingerprints; return its MEMORY USAGE per member."""
    bench.flush()
    client = bench.redis()
    key = "bench:dupefilter"
    pipe = client.pipeline(transaction=False)
    start = time.perf_counter()
    for i in range(0, len(elements), SADD_MEMBERS):
        pipe.sadd(key, *elements[i : i + SADD_MEMBERS])
        if len(pipe) >= SADD_BATCH:
            pipe.execute()
    pipe.execute()
    elapsed = time.perf_counter() - start
    members = int(client.scard(key))
    keys, used = bench.memory_of_all_keys()
    samples = Samples(NAME_SET, "B/fp", [used / members], members)
    samples.extra.update(keys=keys, bytes=used, sadd_fp_per_s=round(len(elements) / elapsed))
    samples.note = "40-hex SHA1 members"
    logger.info("  %-34s %10.3f B/fp", NAME_SET, used / members)
    return samples


def _old_plugin_memory(bench: BenchRedis, capacity: int, error_rate: float, sample: int) -> Samples:
    """Size scrapy-redis-bloomfilter for (capacity, error_rate); insert a sample; read memory.

    Its bit array is one string that SETBIT grows up to the highest offset set, and
    the highest offset reaches the end of the array long before ``capacity`` items:
    the memory after ``sample`` requests is what it keeps at ``capacity``.
    """
    bit, hash_number = old_plugin_geometry(capacity, error_rate)
    contender = DupeFilter(
        NAME_OLD, OLD, {"BLOOMFILTER_BIT": bit, "BLOOMFILTER_HASH_NUMBER": hash_number}
    )
    bench.flush()
    dupefilter = build(contender, bench.url)
    try:
        for request in (Request(u) for u in unique_urls(sample)):
            dupefilter.request_seen(request)
        key = dupefilter.key
        keys, used = bench.memory_of_all_keys()
        length = int(bench.redis().strlen(key))
    finally:
        close(dupefilter)
    nominal = 2**bit // 8
    samples = Samples(NAME_OLD, "B/fp", [used / capacity], capacity)
    samples.extra.update(
        bit=bit,
        hash_number=hash_number,
        inserted=sample,
        keys=keys,
        bytes=used,
        string_length=length,
        nominal_bytes=nominal,
        memory_over_nominal=used / nominal,
        expected_fpr=(-math.expm1(-hash_number * capacity / 2**bit)) ** hash_number,
    )
    samples.note = (
        f"BIT={bit}, k={hash_number}; MEMORY USAGE {used:,} B = {used / nominal:.2f}x its"
        f" 2**{bit}/8 = {nominal:,} B (grown by SETBIT, {sample:,} requests inserted)"
    )
    logger.info("  %-34s %10.3f B/fp (%s)", NAME_OLD, used / capacity, samples.note)
    return samples
