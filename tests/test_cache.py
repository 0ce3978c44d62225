"""The near-cache: answers repeats locally, never differently from Redis."""

from __future__ import annotations

import hashlib
import random
import time
import tracemalloc
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler
from scrapy_redis.dupefilter import RFPDupeFilter as ScrapyRedisDupeFilter

from scrapy_redis_bloom import BloomConfig, FilterSpec, RedisBloomFilter
from scrapy_redis_bloom.scrapy.dupefilter import RFPDupeFilter

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
        bf._cache.put(int.from_bytes(digest[:16], "little"), True)
    grown, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # The README gives about 150 bytes per cached fingerprint: 15 MB for the default.
    assert grown / len(digests) < 160


class _Spider(Spider):
    name = "memo"


def test_dupefilter_remembers_link_fingerprints_exactly(redis_url: str) -> None:
    crawler = get_crawler(_Spider, {"REDIS_URL": redis_url, "BLOOMFILTER_CACHE_SIZE": 50})
    df = RFPDupeFilter.from_crawler(crawler)
    requests = [Request(f"https://example.com/p?b={i % 70}&a={i % 3}") for i in range(300)]
    requests += [Request("https://example.com/p?a=1&b=2"), Request("https://example.com/p?b=2&a=1")]
    requests += [
        Request("https://example.com/form", method="POST", body=f"q={i}") for i in range(5)
    ]
    for request in requests:
        # The remembered fingerprint is scrapy-redis's, whatever the memo's state.
        assert df._fingerprint(request) == ScrapyRedisDupeFilter.request_fingerprint(None, request)
    assert len(df._memo) == 50  # bounded by BLOOMFILTER_CACHE_SIZE
    assert all(url.startswith("https://example.com/p?") for url in df._memo)  # GETs only
    df.close("finished")


def test_no_memo_when_the_fingerprint_is_someone_elses(redis_url: str) -> None:
    class Custom(RFPDupeFilter):
        def request_fingerprint(self, request: Request) -> str:
            return hashlib.sha1(request.url.encode()).hexdigest()

    crawler = get_crawler(_Spider, {"REDIS_URL": redis_url, "BLOOMFILTER_KEY": "custom"})
    custom = Custom.from_crawler(crawler)
    assert custom.request_seen(Request("https://example.com/")) is False
    assert custom.request_seen(Request("https://example.com/")) is True
    assert not custom._memo
    off = RFPDupeFilter.from_crawler(
        get_crawler(_Spider, {"REDIS_URL": redis_url, "BLOOMFILTER_CACHE_SIZE": 0})
    )
    off.request_seen(Request("https://example.com/"))
    assert not off._memo
    custom.close("finished")
    off.close("finished")


@pytest.mark.parametrize("bulk", [False, True], ids=["one", "many"])
def test_with_windows_the_cache_forgets_what_redis_forgets(
    redis_client: redis.Redis, bulk: bool
) -> None:
    """With ``BLOOMFILTER_TTL`` the near-cache is emptied as each window starts.

    It answered "seen" from memory for good: a worker never re-crawled what it had checked
    once (20 of 20 URLs "seen" 6 s after their add with a TTL of 2 s, where Redis had
    forgotten all of them), so re-crawl windows did nothing with the default cache.
    """
    config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 10_000, "BLOOMFILTER_TTL": 3})
    bloom = RedisBloomFilter.from_config(redis_client, "cachettl", config, cache_size=1_000)
    urls = fingerprints(20, "ttl")
    check = bloom.check_and_add_many if bulk else lambda us: [bloom.check_and_add(u) for u in us]
    bloom.open()  # (created before the window's keeping time, 1 to 2 s in, begins)
    time.sleep(3 - (time.time() - 1.2) % 3)  # mid-window: answers are kept, no clear below
    assert check(urls) == [False] * len(urls)
    assert check(urls) == [True] * len(urls)  # inside their window: seen (from the cache)
    assert bloom.cache_hits == len(urls)
    time.sleep(2 * 3 + 1.5)  # past 2 x TTL (and the cache's margin of a second)
    assert bloom.contains_many(urls) == [False] * len(urls)  # Redis forgot them
    assert check(urls) == [False] * len(urls)  # and so does the worker: re-crawled
    bloom.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bulk", [False, True], ids=["one", "many"])
def test_with_windows_a_url_met_often_is_forgotten_within_twice_ttl(
    redis_client: redis.Redis, bulk: bool
) -> None:
    """A URL checked again and again is new again within 2 x TTL, with the cache on.

    A "seen" Redis gave in the last second of a window (the one that forgets the URL at its
    end) was kept under the next window, the cache's already: the URL stayed "seen" a whole
    window more (7.9 s with a TTL of 3 s).
    """
    ttl = 3
    config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 1_000, "BLOOMFILTER_TTL": ttl})
    bloom = RedisBloomFilter.from_config(redis_client, "cacheoften", config, cache_size=1_000)
    bloom.open()
    urls = fingerprints(5, "often")
    check = bloom.check_and_add_many if bulk else lambda us: [bloom.check_and_add(u) for u in us]

    def now() -> float:
        seconds, micros = redis_client.time()
        return seconds + micros / 1e6

    start = (int(now() // ttl) + 1) * ttl  # a window's start, by Redis's clock
    time.sleep(start + 0.1 - now())
    assert check(urls) == [False] * len(urls)
    added = now()
    # Each URL's first "new" after its add: one pass checks them one after another, so a
    # window's end may fall between two of them; a URL is not checked again once forgotten
    # (its check added it anew).
    forgotten: dict[str, float] = {}
    while len(forgotten) < len(urls) and now() - added < 4 * ttl:
        remembered = [url for url in urls if url not in forgotten]
        answers = check(remembered)
        checked = now()
        for url, seen in zip(remembered, answers, strict=True):
            if not seen:
                forgotten[url] = checked - added
        time.sleep(0.1)  # met again and again, as a link on many pages
    assert sorted(forgotten) == sorted(urls), forgotten  # every one forgotten in the end
    for kept in forgotten.values():
        assert ttl <= kept <= 2 * ttl + 0.5, forgotten  # the polling step and load: 0.5 s
    assert bloom.cache_hits > 0  # the cache did answer, away from the windows' edges
    bloom.close()


def _cached_filter(client: redis.Redis, **faults: Any) -> RedisBloomFilter:
    """Return a filter of 2 shards with a near-cache of 1,000, under the fault policy given."""
    from scrapy_redis_bloom.core.settings import FaultPolicy

    config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 10_000, "BLOOMFILTER_SHARDS": 2})
    policy = FaultPolicy(**faults)
    return RedisBloomFilter.from_config(client, "c", config, faults=policy, cache_size=1_000)


def test_after_redis_forgot_the_cache_answers_as_redis_does() -> None:
    # Redis restarted from a snapshot older than 100 adds, or a part recreated empty: the
    # near-cache kept answering "seen" for those URLs, Redis held none of them (a probe's
    # crawl lost 87-126 pages that way, each linked again and dropped).
    from redis_server import RedisServer

    with RedisServer() as server:
        client = server.client()
        bloom = _cached_filter(client, retry_timeout=10, on_error="raise", on_loss="recreate")
        bloom.check_and_add("before the snapshot")
        server.admin().save()
        later = fingerprints(100, "after the snapshot")
        assert not any(bloom.check_and_add(fp) for fp in later)
        server.kill()
        server.restart()
        assert bloom.check_and_add("a new URL") is False  # its first call meets the restart
        assert not any(bloom.check_and_add(fp) for fp in later)  # as Redis: all lost
        assert bloom.events.counts["reconnects"] == 1
        assert bloom.events.counts["restarts"] == 1  # another process: its run_id
        # Parts lost and recreated empty (BLOOMFILTER_ON_LOSS = "recreate").
        more = fingerprints(100, "more")
        assert not any(bloom.check_and_add(fp) for fp in more)
        assert all(bloom.check_and_add(fp) for fp in more)  # from the cache
        client.delete(*bloom.shard_keys)
        bloom.check_and_add("finds the loss")
        assert bloom.events.counts["recreated"] >= 1
        assert not any(bloom.check_and_add(fp) for fp in more)
        bloom.close()


def test_a_fault_that_forgets_nothing_keeps_the_cache() -> None:
    # Redis failing to answer forgets nothing: the near-cache answers an outage's repeats
    # as before it (the fault table's stalled and full Redis under ON_ERROR = "allow" fetched
    # 160-180 of 400 pages twice when any error emptied it), and a connection killed and made
    # again to the same server process leaves it too (the cache's repeats are not exposed
    # to the next kill's lost replies).
    from redis_server import RedisServer

    with RedisServer() as server:
        faults = {"retry_timeout": 0.5, "on_error": "allow", "on_loss": "raise"}
        bloom = _cached_filter(server.client(), **faults)
        seen = fingerprints(50, "seen")
        assert not any(bloom.check_and_add(fp) for fp in seen)
        server.admin().client_kill_filter(_type="normal", skipme=True)
        assert bloom.check_and_add("after the kill") is False
        assert bloom.events.counts["reconnects"] == 1
        assert bloom.events.counts["restarts"] == 0  # the same process
        hits = bloom.cache_hits
        assert all(bloom.check_and_add(fp) for fp in seen)
        assert bloom.cache_hits - hits == len(seen)
        # Redis out of memory (noeviction): no write of the filter's runs.
        server.admin().config_set("maxmemory", 1)
        assert bloom.check_and_add("refused") is False  # let through, per ON_ERROR
        assert bloom.events.counts["errors"] >= 1
        assert all(bloom.check_and_add(fp) for fp in seen)  # the cache, not "new" again
        assert bloom.cache_hits - hits == 2 * len(seen)
        server.admin().config_set("maxmemory", 0)
        assert bloom.check_and_add("refused") is True  # owed, then added once it answers
        bloom.close()
