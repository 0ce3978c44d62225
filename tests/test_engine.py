"""The engine against a real redis-server: atomic bits, record, errors, statistics."""

from __future__ import annotations

import math
import threading
import uuid

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scrapy_redis_bloom.config import BloomConfig, false_positive_rate
from scrapy_redis_bloom.engine import BULK_CHUNK, FilterTotals, RedisBloomFilter
from scrapy_redis_bloom.errors import (
    ConfigMismatchError,
    FilterMissingError,
    OrphanedShardsError,
    WrongTypeError,
)
from scrapy_redis_bloom.hashing import FilterSpec, locate, offsets
from scrapy_redis_bloom.layout import STRING_OVERHEAD, allocation

SMALL = FilterSpec(shards=4, shard_bits=4096, hash_count=5)


def make(client: redis.Redis, spec: FilterSpec = SMALL, key: str = "bf") -> RedisBloomFilter:
    return RedisBloomFilter(client, key, spec, capacity=500)


def fingerprints(n: int, tag: str = "") -> list[str]:
    return [uuid.uuid5(uuid.NAMESPACE_URL, f"{tag}{i}").hex + "00000000" for i in range(n)]


def test_open_writes_the_config_record(redis_client: redis.Redis) -> None:
    record = make(redis_client).open()
    stored = {k.decode(): v.decode() for k, v in redis_client.hgetall("bf:meta").items()}
    assert stored["shards"] == "4"
    assert stored["shard_bits"] == "4096"
    assert stored["hash_count"] == "5"
    assert stored["bits"] == str(4 * 4096)
    assert stored["scheme"] == "1"
    assert stored["layout"] == "1"
    assert stored["generations"] == "0"
    assert float(stored["created"]) == record.created
    # A second worker with the same geometry reads the same record back.
    assert make(redis_client).open().created == record.created


def test_check_and_add_reports_new_then_seen(redis_client: redis.Redis) -> None:
    bf = make(redis_client)
    assert bf.check_and_add("a" * 40) is False
    assert bf.check_and_add("a" * 40) is True
    assert bf.contains("a" * 40) is True
    assert bf.contains("b" * 40) is False


def test_server_sets_exactly_the_documented_bits(redis_client: redis.Redis) -> None:
    bf = make(redis_client)
    element = "0123456789abcdef0123456789abcdef01234567"
    bf.check_and_add(element)
    shard, x, y = locate(element, SMALL.shards, SMALL.shard_bits)
    for i, key in enumerate(bf.shard_keys):
        raw = redis_client.get(key) or b""
        ones = {j for j in range(len(raw) * 8) if raw[j // 8] >> (7 - j % 8) & 1}
        want = set(offsets(x, y, SMALL.hash_count, SMALL.shard_bits)) if i == shard else set()
        assert ones == want


def test_a_shard_is_allocated_whole_at_its_exact_size(redis_client: redis.Redis) -> None:
    spec = BloomConfig.from_settings({"BLOOMFILTER_BIT": 20}).spec
    bf = make(redis_client, spec)
    bf.add_many(fingerprints(500))
    for key in bf.shard_keys:
        assert redis_client.strlen(key) == spec.shard_bytes
        # No greedy preallocation: the shard's jemalloc block plus the key's bookkeeping.
        usage = redis_client.memory_usage(key)
        assert spec.shard_bytes < usage <= allocation(spec.shard_bytes + STRING_OVERHEAD) + 128
    assert sum(redis_client.memory_usage(k) for k in bf.shard_keys) < 2**17 * 1.03


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.lists(st.text(min_size=1, max_size=60), min_size=1, max_size=300))
def test_never_a_false_negative(redis_client: redis.Redis, elements: list[str]) -> None:
    # A tiny, overloaded filter: many false positives, but never a false negative.
    bf = make(redis_client, FilterSpec(shards=3, shard_bits=97, hash_count=3), key="prop")
    bf.clear()
    bf.add_many(elements)
    assert all(bf.contains_many(elements))
    assert all(bf.check_and_add(e) for e in elements)


def test_bulk_results_equal_per_item_results(redis_client: redis.Redis) -> None:
    elements = fingerprints(3000) + fingerprints(500)  # with repeats
    elements = elements[::2] + elements[1::2]
    spec = FilterSpec(shards=5, shard_bits=30_011, hash_count=4)
    one_by_one = make(redis_client, spec, key="single")
    bulk = make(redis_client, spec, key="bulk")
    expected = [one_by_one.check_and_add(e) for e in elements]
    assert bulk.add_many(elements) == expected
    assert expected.count(False) <= 3000
    assert bulk.contains_many(elements) == [True] * len(elements)
    assert redis_client.get(bulk.shard_keys[2]) == redis_client.get(one_by_one.shard_keys[2])


def test_bulk_across_chunks_and_threads_equals_per_item_results(
    redis_client: redis.Redis,
) -> None:
    # 15,000 elements: two chunks (BULK_CHUNK), several BITFIELDs per shard and chunk,
    # and repeats whose first occurrence is in the other chunk or in the same one.
    assert BULK_CHUNK == 10_000
    elements = fingerprints(12_000) + fingerprints(12_000)[9_000:]
    spec = FilterSpec(shards=3, shard_bits=400_009, hash_count=7)
    one_by_one = make(redis_client, spec, key="single")
    expected = [one_by_one.check_and_add(e) for e in elements]
    assert expected.count(True) >= 3_000
    held = make(redis_client, spec, key="held")  # hand-packed, on its held connection
    assert held.add_many(elements) == expected
    # The same through redis-py's pipeline: from a thread that does not hold the connection.
    piped = make(redis_client, spec, key="piped")
    piped.contains_many(elements[:1])  # this thread takes the held connection
    answers: list[bool] = []
    thread = threading.Thread(target=lambda: answers.extend(piped.add_many(elements)))
    thread.start()
    thread.join()
    assert answers == expected
    for shard in range(spec.shards):
        bits = redis_client.get(one_by_one.shard_keys[shard])
        assert redis_client.get(held.shard_keys[shard]) == bits
        assert redis_client.get(piped.shard_keys[shard]) == bits
    assert held.totals() == piped.totals() == FilterTotals(added=12_000, seen=3_000)


def test_false_positive_rate_matches_theory(redis_client: redis.Redis) -> None:
    n, p = 20_000, 0.01
    config = BloomConfig.from_settings(
        {"BLOOMFILTER_CAPACITY": n, "BLOOMFILTER_ERROR_RATE": p, "BLOOMFILTER_SHARD_BIT": 15}
    )
    spec = config.spec
    assert spec.shards > 1
    bf = RedisBloomFilter(redis_client, "fpr", spec, n)
    bf.add_many(fingerprints(n, "member"))
    queries = 200_000
    hits = sum(bf.contains_many(fingerprints(queries, "stranger")))

    # Each query is a Bernoulli trial with the filter's false-positive probability:
    # allow 6 standard deviations of the binomial count around the expectation.
    def within(rate: float) -> bool:
        sigma = math.sqrt(queries * rate * (1 - rate))
        return abs(hits - queries * rate) <= 6 * sigma

    theory = false_positive_rate(spec.bits, spec.hash_count, n)
    assert theory == pytest.approx(p, rel=0.05)
    assert within(theory), (hits, queries * theory)
    # Against the rate the filter's actual fill predicts, too.
    state = bf.state()
    assert within(state.estimated_fpr), (hits, queries * state.estimated_fpr)
    assert state.estimated_items == pytest.approx(n, rel=0.03)
    assert state.fill_ratio == pytest.approx(state.bits_set / spec.bits)
    assert state.fill_ratio == pytest.approx(0.5, abs=0.02)  # optimal k fills half the bits


def test_different_geometry_is_refused(redis_client: redis.Redis) -> None:
    make(redis_client).open()
    other = FilterSpec(shards=4, shard_bits=4096, hash_count=6)
    with pytest.raises(ConfigMismatchError) as raised:
        make(redis_client, other).open()
    message = str(raised.value)
    assert "was created on" in message
    assert "k=5" in message
    assert "k=6" in message
    assert "choose another BLOOMFILTER_KEY" in message
    assert "scrapy-redis-bloom reset --key 'bf'" in message
    # Nothing was written under the other layout.
    assert redis_client.keys("bf:g0:*") == []


def test_mismatch_is_detected_with_decoded_responses(redis_server: object) -> None:
    from redis_server import RedisServer

    assert isinstance(redis_server, RedisServer)
    client = redis_server.client(decode_responses=True)
    client.flushall()
    make(client).open()
    assert make(client).check_and_add("x") is False
    with pytest.raises(ConfigMismatchError):
        make(client, FilterSpec(shards=2, shard_bits=4096, hash_count=5)).open()


def test_wrong_type_record_key_is_a_clear_error(redis_client: redis.Redis) -> None:
    redis_client.sadd("bf:meta", "27adcc2e8979cdee0c9cecbbe8bf8ff51edefb61")
    with pytest.raises(WrongTypeError, match=r"'bf:meta' holds a set, where the Bloom filter's"):
        make(redis_client).open()


def test_wrong_type_shard_key_is_a_clear_error_at_open(redis_client: redis.Redis) -> None:
    redis_client.rpush("bf:g0:2", "x")
    with pytest.raises(WrongTypeError, match=r"'bf:g0:2' holds a list, where .* bitmap shard"):
        make(redis_client).open()


def test_wrong_type_shard_key_is_a_clear_error_while_running(redis_client: redis.Redis) -> None:
    bf = make(redis_client)
    bf.open()
    for key in bf.shard_keys:
        redis_client.sadd(key, "x")
    with pytest.raises(WrongTypeError, match=r"holds a set, where the Bloom filter 'bf'"):
        bf.check_and_add("a" * 40)
    with pytest.raises(WrongTypeError, match=r"holds a set"):
        bf.add_many(fingerprints(10))


def test_bits_without_a_record_are_refused(redis_client: redis.Redis) -> None:
    redis_client.setbit("bf:g0:1", 7, 1)
    with pytest.raises(OrphanedShardsError, match=r"1 shard key\(s\) .* 'bf:meta' does not"):
        make(redis_client).open()


def test_clear_deletes_everything_and_the_filter_reopens(redis_client: redis.Redis) -> None:
    bf = make(redis_client)
    bf.add_many(fingerprints(100))
    assert bf.exists()
    bf.clear()
    assert redis_client.keys("bf*") == []
    assert not bf.exists()
    assert bf.check_and_add(fingerprints(1)[0]) is False  # forgotten, and reopened
    assert bf.exists()


def test_scripts_survive_a_script_flush(redis_client: redis.Redis) -> None:
    bf = make(redis_client)
    assert bf.check_and_add("a" * 40) is False
    redis_client.script_flush()
    assert bf.check_and_add("a" * 40) is True
    redis_client.script_flush()
    assert bf.add_many(["a" * 40, "b" * 40]) == [True, False]
    redis_client.script_flush()
    assert bf.contains_many(["b" * 40, "c" * 40]) == [True, False]


def test_open_without_create_never_creates(redis_client: redis.Redis) -> None:
    with pytest.raises(FilterMissingError, match=r"There is no Bloom filter 'bf'"):
        make(redis_client).open(create=False)
    assert redis_client.keys("*") == []
    created = make(redis_client).open()
    assert make(redis_client).open(create=False) == created


def test_a_clear_while_another_worker_adds_leaves_a_usable_filter(
    redis_client: redis.Redis,
) -> None:
    # Worker A clears (scrapy-redis with SCHEDULER_PERSIST=False) while B still adds.
    a, b = make(redis_client), make(redis_client)
    a.add_many(fingerprints(50))
    b.open()
    a.clear()
    assert b.check_and_add("f" * 40) is False  # re-creates a shard, and the record
    assert b.add_many(fingerprints(20, "late")) == [False] * 20
    assert redis_client.exists("bf:meta")
    # A later worker opens the filter instead of finding orphaned shards.
    assert make(redis_client).open().spec == SMALL
    assert make(redis_client).contains("f" * 40)
