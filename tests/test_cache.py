"""The near-cache: answers repeats locally, never differently from Redis."""

from __future__ import annotations

import hashlib
import random
import tracemalloc

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scrapy_redis_bloom import FilterSpec, RedisBloomFilter

SPEC = FilterSpec(shards=3, shard_bits=30_000, hash_count=6)


def fingerprints(n: int, tag: str = "") -> list[str]:
    return [hashlib.sha1(f"{tag}{i}".encode()).hexdigest() for i in range(n)]


def crawl_like_stream(n: int, seed: int = 7) -> list[str]:
    """About 85% of the calls repeat an earlier fingerprint, as links do in a crawl."""
    rng = random.Random(seed)
    pool = fingerprints(n)
    seen: list[str] = []
    stream = []
    for fp in pool:
        if seen and rng.random() < 0.85:
            stream.append(seen[int(len(seen) * rng.random() ** 2)])
        else:
            seen.append(fp)
            stream.append(fp)
    return stream


def test_cache_answers_exactly_what_redis_answers(redis_client: redis.Redis) -> None:
    stream = crawl_like_stream(5000)
    cached = RedisBloomFilter(redis_client, "cached", SPEC, 1000, cache_size=500)
    plain = RedisBloomFilter(redis_client, "plain", SPEC, 1000, cache_size=0)
    assert [cached.check_and_add(fp) for fp in stream] == [plain.check_and_add(fp) for fp in stream]
    assert cached.cache_hits > 0.5 * len(stream)  # most repeats never reach Redis
    assert plain.cache_hits == 0
    assert len(cached._cache) == 500  # bounded
    # Hits count in Redis's totals too: they are those of the plain filter.
    cached.sync_counters()
    plain.sync_counters()
    assert cached.totals() == plain.totals()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.sampled_from(fingerprints(40)), max_size=200), st.integers(1, 20))
def test_cache_never_lies_whatever_its_size(
    redis_client: redis.Redis, stream: list[str], size: int
) -> None:
    cached = RedisBloomFilter(redis_client, "c", SPEC, 1000, cache_size=size)
    plain = RedisBloomFilter(redis_client, "p", SPEC, 1000, cache_size=0)
    cached.clear()
    plain.clear()
    assert [cached.check_and_add(fp) for fp in stream] == [plain.check_and_add(fp) for fp in stream]
    assert len(cached._cache) <= size


def test_clear_empties_the_cache(redis_client: redis.Redis) -> None:
    bf = RedisBloomFilter(redis_client, "bf", SPEC, 1000, cache_size=100)
    assert bf.check_and_add("a" * 40) is False
    assert bf.check_and_add("a" * 40) is True  # from the cache
    bf.clear()
    assert bf.check_and_add("a" * 40) is False  # forgotten, not answered from the cache


def test_cache_memory_per_entry_is_bounded() -> None:
    bf = RedisBloomFilter(redis.Redis(), "unused", SPEC, 1000, cache_size=10_000)
    digests = [hashlib.sha1(str(i).encode()).digest() for i in range(10_000)]
    tracemalloc.start()
    for digest in digests:  # what check_and_add stores: a 128-bit int per fingerprint
        bf._cache[int.from_bytes(digest[:16], "little")] = None
    grown, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # The README gives about 150 bytes per cached fingerprint: 15 MB for the default.
    assert grown / len(digests) < 160
