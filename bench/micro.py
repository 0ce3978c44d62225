"""Measures (a) and (b): request_seen throughput; the contenders of every dupefilter measure.

Every dupefilter is loaded by its class path and built the way Scrapy builds a
``DUPEFILTER_CLASS``: ``cls.from_crawler(get_crawler(spider, settings))``. Only the
public dupefilter API is then used (``open``, ``request_seen``, ``close``). Each
timing starts on an empty Redis. Measures (c) and (d) are in ``bulk.py``.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness import BenchRedis, Samples, interleave
from peers import BF_ADD_CLASS
from scrapy import Request, Spider
from scrapy.utils.misc import load_object
from scrapy.utils.test import get_crawler
from workloads import Stream, crawl_stream, unique_urls

logger = logging.getLogger("bench.micro")

OURS = "scrapy_redis_bloom.dupefilter.RFPDupeFilter"
SCRAPY_REDIS = "scrapy_redis.dupefilter.RFPDupeFilter"
OLD = "scrapy_redis_bloomfilter.dupefilter.RFPDupeFilter"

NAME_OURS = "ours"
NAME_OURS_NO_CACHE = "ours, BLOOMFILTER_CACHE_SIZE=0"
NAME_OURS_NATIVE = "ours, BLOOMFILTER_BACKEND=native"
NAME_SCRAPY_REDIS = "scrapy-redis 0.9 (SET)"
NAME_OLD = "scrapy-redis-bloomfilter 0.8.1"
NAME_REDISBLOOM = "RedisBloom BF.ADD"

#: The peer Bloom filter's own defaults, which are also ours: m = 2**30 bits, k = 6.
OLD_DEFAULT_BIT = 30
OLD_DEFAULT_HASH_NUMBER = 6


class BenchSpider(Spider):
    """The spider the dupefilters are built for (filter keys use its name)."""

    name = "bench"


def old_plugin_installed() -> bool:
    """Tell whether scrapy-redis-bloomfilter can be imported."""
    return importlib.util.find_spec("scrapy_redis_bloomfilter") is not None


def setting_recognised(name: str, value: Any) -> bool:
    """Tell whether this package knows the setting ``name`` (found by trying it).

    A setting it validates rejects a bad value, naming the setting; a setting it
    reads changes the configuration when set to ``value``. An unknown one does neither.
    """
    from scrapy_redis_bloom.core.settings import BloomConfig

    try:
        BloomConfig.from_settings({name: object()})
    except ValueError as exc:
        if name in str(exc):
            return True
    try:
        return bool(BloomConfig.from_settings({name: value}) != BloomConfig.from_settings({}))
    except ValueError:
        return False


def cache_setting_recognised() -> bool:
    """Tell whether this package knows ``BLOOMFILTER_CACHE_SIZE``."""
    return setting_recognised("BLOOMFILTER_CACHE_SIZE", 0)


def backend_setting_recognised() -> bool:
    """Tell whether this package knows ``BLOOMFILTER_BACKEND`` (the native backend)."""
    return setting_recognised("BLOOMFILTER_BACKEND", "native")


def blocked_setting_recognised() -> bool:
    """Tell whether this package knows ``BLOOMFILTER_BLOCKED`` (hash scheme 2)."""
    return setting_recognised("BLOOMFILTER_BLOCKED", True)


def batching_middleware() -> str | None:
    """Return why ``scrapy_redis_bloom.batching.BatchingMiddleware`` cannot be used, or None."""
    try:
        module = importlib.import_module("scrapy_redis_bloom.scrapy.batching")
    except ImportError as exc:
        return f"scrapy_redis_bloom.scrapy.batching cannot be imported ({exc})"
    if not hasattr(module, "BatchingMiddleware"):
        return "scrapy_redis_bloom.scrapy.batching has no BatchingMiddleware"
    return None


@dataclass(frozen=True)
class Peers:
    """What this run can measure besides ours and scrapy-redis, and why not otherwise."""

    old: bool
    cache: bool
    #: The server has BF.* (RedisBloom loaded).
    bloom: bool
    #: The package knows BLOOMFILTER_BACKEND.
    backend: bool
    #: The package knows BLOOMFILTER_BLOCKED.
    blocked: bool = False

    @property
    def native(self) -> bool:
        """Ours with BLOOMFILTER_BACKEND = "native" can run."""
        return self.bloom and self.backend

    def ours_settings(self) -> dict[str, Any]:
        """Return settings that keep "ours" on bitmaps: 'auto' would pick native on a BF server."""
        return {"BLOOMFILTER_BACKEND": "bitmap"} if self.backend else {}


@dataclass(frozen=True)
class DupeFilter:
    """A dupefilter to measure: its class path, its settings, the calls it gets."""

    name: str
    class_path: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    #: Measured on the smaller sample (it is too slow for the full one).
    slow: bool = False


#: scrapy-redis-bloomfilter with its defaults, on the smaller sample (it is slow).
OLD_DEFAULTS = DupeFilter(
    NAME_OLD,
    OLD,
    {"BLOOMFILTER_BIT": OLD_DEFAULT_BIT, "BLOOMFILTER_HASH_NUMBER": OLD_DEFAULT_HASH_NUMBER},
    slow=True,
)


def redisbloom_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """BF.RESERVE's capacity and error rate for the filter ours builds from ``settings``.

    RedisBloom grows (EXPANSION 2, its default) when ours does, else it is NONSCALING.
    """
    from scrapy_redis_bloom.core.settings import BloomConfig

    config = BloomConfig.from_settings(settings)
    return {
        "REDISBLOOM_CAPACITY": config.capacity,
        "REDISBLOOM_ERROR_RATE": float(f"{config.expected_error_rate:.3g}"),
        "REDISBLOOM_EXPANSION": 2 if config.expansion else 0,
    }


def dupefilters(peers: Peers) -> list[DupeFilter]:
    """Return the contenders of measures (a) and (b).

    Ours runs with its defaults, m = 2**30 bits and k = 6, which are also the defaults
    of scrapy-redis-bloomfilter: both filters have the same geometry. RedisBloom gets
    the capacity and error rate of ours' default filter.
    """
    bitmap = peers.ours_settings()
    contenders = [DupeFilter(NAME_OURS, OURS, bitmap)]
    if peers.cache:
        contenders.append(
            DupeFilter(NAME_OURS_NO_CACHE, OURS, {**bitmap, "BLOOMFILTER_CACHE_SIZE": 0})
        )
    if peers.native:
        contenders.append(DupeFilter(NAME_OURS_NATIVE, OURS, {"BLOOMFILTER_BACKEND": "native"}))
    contenders.append(DupeFilter(NAME_SCRAPY_REDIS, SCRAPY_REDIS))
    if peers.bloom:
        contenders.append(DupeFilter(NAME_REDISBLOOM, BF_ADD_CLASS, redisbloom_settings({})))
    if peers.old:
        contenders.append(OLD_DEFAULTS)
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
