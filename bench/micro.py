"""Measures (a) to (d): request_seen throughput, memory per fingerprint, bulk adds.

Every dupefilter is loaded by its class path and built the way Scrapy builds a
``DUPEFILTER_CLASS``: ``cls.from_crawler(get_crawler(spider, settings))``. Only the
public dupefilter API is then used (``open``, ``request_seen``, ``close``), and for
this package's bulk path the public engine (``BloomConfig``, ``RedisBloomFilter``,
``hashing.locate`` / ``offsets``). Each timing starts on an empty Redis.
"""

from __future__ import annotations

import gc
import importlib.util
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness import BenchRedis, Samples, interleave
from scrapy import Request, Spider
from scrapy.utils.misc import load_object
from scrapy.utils.test import get_crawler
from workloads import Stream, crawl_stream, fingerprints, unique_urls

logger = logging.getLogger("bench.micro")

OURS = "scrapy_redis_bloom.dupefilter.RFPDupeFilter"
SCRAPY_REDIS = "scrapy_redis.dupefilter.RFPDupeFilter"
OLD = "scrapy_redis_bloomfilter.dupefilter.RFPDupeFilter"

NAME_OURS = "ours"
NAME_OURS_NO_CACHE = "ours, BLOOMFILTER_CACHE_SIZE=0"
NAME_SCRAPY_REDIS = "scrapy-redis 0.9 (SET)"
NAME_OLD = "scrapy-redis-bloomfilter 0.8.1"
NAME_ADD_MANY = "ours: RedisBloomFilter.add_many"
NAME_SETBIT = "redis-py pipeline of SETBIT"
NAME_SET = "scrapy-redis SET (pipelined SADD)"

#: The peer Bloom filter's own defaults, which are also ours: m = 2**30 bits, k = 6.
OLD_DEFAULT_BIT = 30
OLD_DEFAULT_HASH_NUMBER = 6

#: Commands per pipeline flush of the SETBIT baseline.
SETBIT_BATCH = 10_000
#: Members per SADD command, and commands per flush, when filling the SET.
SADD_MEMBERS = 1_000
SADD_BATCH = 10


class BenchSpider(Spider):
    """The spider the dupefilters are built for (filter keys use its name)."""

    name = "bench"


def old_plugin_installed() -> bool:
    """Tell whether scrapy-redis-bloomfilter can be imported."""
    return importlib.util.find_spec("scrapy_redis_bloomfilter") is not None


def cache_setting_recognised() -> bool:
    """Tell whether this package knows ``BLOOMFILTER_CACHE_SIZE`` (found by trying it).

    A setting it validates rejects a value that is not a number, naming the setting;
    a setting it reads changes the configuration. An unknown one does neither.
    """
    from scrapy_redis_bloom.config import BloomConfig

    try:
        BloomConfig.from_settings({"BLOOMFILTER_CACHE_SIZE": "not-a-number"})
    except ValueError as exc:
        if "BLOOMFILTER_CACHE_SIZE" in str(exc):
            return True
    try:
        with_zero = BloomConfig.from_settings({"BLOOMFILTER_CACHE_SIZE": 0})
        return bool(with_zero != BloomConfig.from_settings({}))
    except ValueError:
        return False


@dataclass(frozen=True)
class DupeFilter:
    """A dupefilter to measure: its class path, its settings, the calls it gets."""

    name: str
    class_path: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    #: Measured on the smaller sample (it is too slow for the full one).
    slow: bool = False


def dupefilters(cache_setting: bool, old_installed: bool) -> list[DupeFilter]:
    """Return the contenders of measures (a) and (b).

    Ours runs with its defaults, m = 2**30 bits and k = 6, which are also the defaults
    of scrapy-redis-bloomfilter: both filters have the same geometry.
    """
    contenders = [DupeFilter(NAME_OURS, OURS)]
    if cache_setting:
        contenders.append(DupeFilter(NAME_OURS_NO_CACHE, OURS, {"BLOOMFILTER_CACHE_SIZE": 0}))
    contenders.append(DupeFilter(NAME_SCRAPY_REDIS, SCRAPY_REDIS))
    if old_installed:
        old_settings = {
            "BLOOMFILTER_BIT": OLD_DEFAULT_BIT,
            "BLOOMFILTER_HASH_NUMBER": OLD_DEFAULT_HASH_NUMBER,
        }
        contenders.append(DupeFilter(NAME_OLD, OLD, old_settings, slow=True))
    return contenders


def build(contender: DupeFilter, redis_url: str, extra: Mapping[str, Any] | None = None) -> Any:
    """Build a dupefilter as Scrapy does for ``DUPEFILTER_CLASS``, and open it."""
    settings = {"REDIS_URL": redis_url, **contender.settings, **(extra or {})}
    crawler = get_crawler(BenchSpider, settings)
    dupefilter = load_object(contender.class_path).from_crawler(crawler)
    dupefilter.open()
    return dupefilter


def close(dupefilter: Any) -> None:
    """Close a dupefilter as the scheduler does, then drop its connections."""
    dupefilter.close("finished")
    for client in {id(c): c for c in _clients(dupefilter)}.values():
        client.close()


def _clients(dupefilter: Any) -> list[Any]:
    bloom = getattr(dupefilter, "bloom", None)
    clients = list(getattr(bloom, "clients", ()))
    return [dupefilter.server, *clients]


def time_request_seen(bench: BenchRedis, contender: DupeFilter, urls: Sequence[str]) -> Samples:
    """Time ``request_seen`` over fresh Requests for ``urls`` on an empty Redis.

    Returns one sample: calls per second, with the number of calls answered "seen".
    Building the dupefilter and the Requests is not timed; the first call's shard
    allocation and everything else ``request_seen`` does is.
    """
    bench.flush()
    dupefilter = build(contender, bench.url)
    try:
        requests = [Request(u) for u in urls]
        gc.collect()
        seen = 0
        start = time.perf_counter()
        for request in requests:
            if dupefilter.request_seen(request):
                seen += 1
        elapsed = time.perf_counter() - start
    finally:
        close(dupefilter)
    sample = Samples(contender.name, "calls/s", [len(urls) / elapsed], len(urls))
    sample.extra["seen"] = seen
    return sample


def measure_request_seen(
    bench: BenchRedis,
    contenders: Sequence[DupeFilter],
    full: Sequence[str],
    slow: Sequence[str],
    rounds: int,
    label: str,
) -> dict[str, Samples]:
    """Interleave :func:`time_request_seen` over the contenders for ``rounds`` rounds."""
    by_name = {c.name: c for c in contenders}
    results: dict[str, Samples] = {}

    def run_one(name: str, round_index: int) -> None:
        contender = by_name[name]
        urls = slow if contender.slow else full
        sample = time_request_seen(bench, contender, urls)
        logger.info("  %-34s %10.0f calls/s", name, sample.values[0])
        kept = results.setdefault(name, Samples(name, "calls/s", sample_size=len(urls)))
        kept.values.extend(sample.values)
        kept.extra.setdefault("seen", []).append(sample.extra["seen"])

    interleave(list(by_name), rounds, run_one, label)
    return results


def measure_unique(
    bench: BenchRedis, contenders: Sequence[DupeFilter], calls: int, slow_calls: int, rounds: int
) -> dict[str, Samples]:
    """Measure (a): ``request_seen`` on distinct URLs (every call adds)."""
    results = measure_request_seen(
        bench, contenders, unique_urls(calls), unique_urls(slow_calls), rounds, "(a) unique"
    )
    for samples in results.values():
        samples.extra["distinct"] = samples.sample_size
    return results


def measure_stream(
    bench: BenchRedis,
    contenders: Sequence[DupeFilter],
    calls: int,
    slow_calls: int,
    repeat: float,
    rounds: int,
) -> tuple[dict[str, Samples], dict[str, Stream]]:
    """Measure (b): ``request_seen`` on a crawl-like stream where most calls repeat."""
    full, slow = crawl_stream(calls, repeat), crawl_stream(slow_calls, repeat)
    results = measure_request_seen(
        bench, contenders, full.urls, slow.urls, rounds, "(b) crawl-like stream"
    )
    streams = {name: (slow if c.slow else full) for c in contenders for name in [c.name]}
    for name, samples in results.items():
        stream = streams[name]
        samples.extra.update(
            distinct=stream.distinct, repeat_fraction=round(stream.repeat_fraction, 4)
        )
        samples.note = f"{100 * stream.repeat_fraction:.1f}% repeats"
    return results, streams


# -- (c) and (d): bulk adds and memory ---------------------------------------------


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
    info: dict[str, Any]


def _ours_filter(client: Any, capacity: int, error_rate: float) -> Any:
    from scrapy_redis_bloom import BloomConfig, RedisBloomFilter

    # A fixed-size filter, as its peers here are: memory at the Bloom optimum for the
    # rate, and the BITFIELD bulk path. A growing one (the default) is sized for half
    # the rate and adds through its script: bench/growth.py measures it.
    config = BloomConfig.from_settings(
        {
            "BLOOMFILTER_CAPACITY": capacity,
            "BLOOMFILTER_ERROR_RATE": error_rate,
            "BLOOMFILTER_EXPANSION": 0,
        }
    )
    return RedisBloomFilter(client, "bench:bulk", config.spec, config.capacity)


def setbit_pipeline(client: Any, spec: Any, elements: Sequence[str]) -> None:
    """Add elements with one SETBIT per bit, pipelined: the baseline of measure (d).

    The shard and the k offsets are those of the hashing scheme (``hashing.locate``
    and ``hashing.offsets``), so the bits set are exactly the filter's.
    """
    from scrapy_redis_bloom.hashing import locate, offsets

    shards, shard_bits, k = spec.shards, spec.shard_bits, spec.hash_count
    keys = [f"bench:setbit:{i}" for i in range(shards)]
    pipe = client.pipeline(transaction=False)
    pending = 0
    for element in elements:
        shard, x, y = locate(element, shards, shard_bits)
        key = keys[shard]
        for offset in offsets(x, y, k, shard_bits):
            pipe.setbit(key, offset, 1)
        pending += k
        if pending >= SETBIT_BATCH:
            pipe.execute()
            pending = 0
    if pending:
        pipe.execute()


def measure_bulk(
    bench: BenchRedis,
    count: int,
    setbit_count: int,
    error_rate: float,
    rounds: int,
    old_sample: int,
    old_installed: bool,
) -> BulkResults:
    """Measures (d) bulk adds per second and (c) Redis bytes per stored fingerprint.

    Ours adds ``count`` fingerprints with ``add_many`` into a filter sized for exactly
    ``count`` items at ``error_rate``; the memory of (c) is read after each of those
    rounds. The SETBIT baseline adds the first ``setbit_count`` of the same
    fingerprints. The SET and scrapy-redis-bloomfilter are filled once.
    """
    client = bench.redis()
    elements = fingerprints(count)
    spec = _ours_filter(client, count, error_rate).spec
    throughput: dict[str, Samples] = {
        NAME_ADD_MANY: Samples(NAME_ADD_MANY, "fp/s", sample_size=count),
        NAME_SETBIT: Samples(NAME_SETBIT, "fp/s", sample_size=setbit_count),
    }
    ours_memory = Samples(NAME_OURS, "B/fp", sample_size=count)

    def run_ours() -> None:
        bench.flush()
        bloom = _ours_filter(client, count, error_rate)
        gc.collect()
        start = time.perf_counter()
        flags = bloom.add_many(elements)
        elapsed = time.perf_counter() - start
        throughput[NAME_ADD_MANY].values.append(count / elapsed)
        throughput[NAME_ADD_MANY].extra.setdefault("reported_seen", []).append(sum(flags))
        keys, used = bench.memory_of_all_keys()
        ours_memory.values.append(used / count)
        ours_memory.extra.update(keys=keys, bytes=used)
        logger.info("  %-34s %10.0f fp/s, %.3f B/fp", NAME_ADD_MANY, count / elapsed, used / count)

    def run_setbit() -> None:
        bench.flush()
        sample = elements[:setbit_count]
        gc.collect()
        start = time.perf_counter()
        setbit_pipeline(client, spec, sample)
        elapsed = time.perf_counter() - start
        throughput[NAME_SETBIT].values.append(setbit_count / elapsed)
        logger.info("  %-34s %10.0f fp/s", NAME_SETBIT, setbit_count / elapsed)

    runners: dict[str, Callable[[], None]] = {NAME_ADD_MANY: run_ours, NAME_SETBIT: run_setbit}
    interleave(list(runners), rounds, lambda name, _: runners[name](), "(c, d) bulk add")

    memory = {NAME_OURS: ours_memory, NAME_SET: _set_memory(bench, elements)}
    optimum = optimum_bytes_per_item(error_rate)
    ours_memory.extra.update(
        shards=spec.shards,
        shard_bits=spec.shard_bits,
        hash_count=spec.hash_count,
        bits=spec.bits,
        bitmap_bytes=spec.total_bytes,
        optimum_bytes_per_item=optimum,
    )
    ours_memory.note = f"k={spec.hash_count}, {spec.shards} shards"
    if old_installed:
        memory[NAME_OLD] = _old_plugin_memory(bench, count, error_rate, old_sample)
    bench.flush()
    info = {"capacity": count, "error_rate": error_rate, "optimum_bytes_per_item": optimum}
    return BulkResults(throughput=throughput, memory=memory, info=info)


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
