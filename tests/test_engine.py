"""The engine against a real redis-server: layout, atomic bits, record, errors, statistics."""

from __future__ import annotations

import json
import logging
import math
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis_server import RedisServer
from waiting import until_tried

from scrapy_redis_bloom.core.errors import (
    BloomFilterError,
    ConfigMismatchError,
    FilterDamagedError,
    FilterMissingError,
    OrphanedShardsError,
    WrongTypeError,
)
from scrapy_redis_bloom.core.hashing import FilterSpec, locate, offsets
from scrapy_redis_bloom.core.layout import HEADER_BITS, HEADER_BYTES, header
from scrapy_redis_bloom.core.record import FilterRecord
from scrapy_redis_bloom.core.settings import BloomConfig, FaultPolicy
from scrapy_redis_bloom.core.sizing import STRING_OVERHEAD, allocation, false_positive_rate
from scrapy_redis_bloom.engine.bitmap.bulk import CHUNK
from scrapy_redis_bloom.engine.bitmap.fastpath import STATE_FIELD
from scrapy_redis_bloom.engine.bitmap.filter import RedisBloomFilter
from scrapy_redis_bloom.engine.state import FilterTotals

SMALL = FilterSpec(shards=4, shard_bits=4096, hash_count=5)


def make(
    client: redis.Redis, spec: FilterSpec = SMALL, key: str = "bf", **kwargs: object
) -> RedisBloomFilter:
    return RedisBloomFilter(client, key, spec, capacity=500, **kwargs)  # type: ignore[arg-type]


def fingerprints(n: int, tag: str = "") -> list[str]:
    return [uuid.uuid5(uuid.NAMESPACE_URL, f"{tag}{i}").hex + "00000000" for i in range(n)]


def bits_of(raw: bytes) -> set[int]:
    """Return the offsets of the bits set in a shard, counted after its header."""
    return {
        j - HEADER_BITS for j in range(HEADER_BITS, len(raw) * 8) if raw[j // 8] >> (7 - j % 8) & 1
    }


def test_open_writes_the_config_record_and_every_shard(redis_client: redis.Redis) -> None:
    record = make(redis_client).open()
    stored = {k.decode(): v.decode() for k, v in redis_client.hgetall("bf:meta").items()}
    assert stored["shards"] == "4"
    assert stored["shard_bits"] == "4096"
    assert stored["hash_count"] == "5"
    assert stored["bits"] == str(4 * 4096)
    assert stored["scheme"] == "3"
    assert stored["layout"] == "2"
    assert stored["state"] == "ready"
    assert stored["id"] == record.filter_id
    assert len(record.filter_id) == 32
    # A fixed-size filter that remembers forever: one generation, no windows.
    assert (stored["generations"], stored["expansion"], stored["ttl"]) == ("1", "0", "0")
    assert float(stored["created"]) == record.created
    # Every shard exists from the start, with the filter's id in its header.
    for shard in range(4):
        raw = redis_client.get(f"{{bf:{shard}}}:g0")
        assert raw is not None
        assert len(raw) == HEADER_BYTES + 4096 // 8
        assert raw[:HEADER_BYTES] == header(record.filter_id, shard, 5)
        assert not raw[HEADER_BYTES:].strip(b"\0")
    # A second worker with the same geometry reads the same record back.
    again = make(redis_client).open()
    assert (again.created, again.filter_id) == (record.created, record.filter_id)


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
    shard, x, y = locate(element, SMALL)
    for i, key in enumerate(bf.shard_keys):
        ones = bits_of(redis_client.get(key) or b"")
        want = set(offsets(x, y, SMALL.hash_count, SMALL.shard_bits)) if i == shard else set()
        assert ones == want


#: Run in a child process: a crash (mmh3 segfaulted on a lone surrogate) fails the test.
ELEMENTS_CHILD = """
import json, sys
import redis
from scrapy_redis_bloom.core.hashing import FilterSpec
from scrapy_redis_bloom.core.layout import HEADER_BYTES as H
from scrapy_redis_bloom.engine.bitmap.filter import RedisBloomFilter

client = redis.Redis.from_url(sys.argv[1])
spec = FilterSpec(shards=4, shard_bits=4096, hash_count=5)
odd, words = "/caf\\udce9", ["/café", "/日本語", "/\\U0001f600", "/plain"]
out = {}
for op in ("check_and_add", "contains", "add_many", "contains_many", "check_and_add_many"):
    bf = RedisBloomFilter(client, "odd-" + op, spec, capacity=500)
    bf.open()  # (a read of a missing filter raises)
    arg = [odd] if op.endswith("many") else odd
    raw = odd.encode("utf-8", "surrogatepass")
    out[op] = [getattr(bf, op)(arg), bf.contains(odd), bf.contains(raw)]
# Normal strs: as their UTF-8 bytes, one by one and in bulk, bit for bit.
by_str = RedisBloomFilter(client, "by-str", spec, capacity=500)
by_bytes = RedisBloomFilter(client, "by-bytes", spec, capacity=500)
out["str"] = [by_str.check_and_add(w) for w in words] + by_str.add_many(words)
out["bytes"] = [by_bytes.check_and_add(w.encode()) for w in words] + by_bytes.add_many(
    [w.encode() for w in words]
)
out["cross"] = by_str.contains_many([w.encode() for w in words])
pairs = zip(by_str.shard_keys, by_bytes.shard_keys)
out["bits"] = [client.getrange(a, H, -1) == client.getrange(b, H, -1) for a, b in pairs]
print(json.dumps(out))
"""


def test_any_str_element_is_hashed_safely_as_its_utf8_bytes(redis_url: str) -> None:
    # A lone surrogate (os.fsdecode's undecodable bytes) killed the process in mmh3; every
    # other str must keep the hash of its UTF-8 bytes (filters already hold them).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.run(
        [sys.executable, "-c", ELEMENTS_CHILD, redis_url],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
    out = json.loads(child.stdout)
    for op in ("check_and_add", "add_many", "check_and_add_many"):
        assert out[op] == [[False] if op.endswith("many") else False, True, True], op
    for op in ("contains", "contains_many"):
        assert out[op] == [[False] if op.endswith("many") else False, False, False], op
    assert out["str"] == out["bytes"] == [False] * 4 + [True] * 4
    assert out["cross"] == [True] * 4
    assert out["bits"] == [True] * 4


def test_bad_input_to_the_api_is_one_clear_error_before_any_write(
    redis_client: redis.Redis,
) -> None:
    bf = make(redis_client, BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 10**6}).spec)
    # One str or bytes where a collection is expected: it was taken character by character.
    for method, one in (
        ("add_many", "http://x"),
        ("contains_many", b"ab"),
        ("check_and_add_many", "u"),
    ):
        with pytest.raises(TypeError, match=rf"^{method}\(\) takes a collection of elements"):
            getattr(bf, method)(one)
    # A bad element, past the first batch (262,144 were written, then mmh3's raw error).
    urls = [f"https://example.com/{i}" for i in range(300_000)]
    for method, bad in (("add_many", None), ("check_and_add_many", 42)):
        with pytest.raises(
            TypeError, match=rf"^{method}\(\): .* position 300,000 is {type(bad).__name__}"
        ):
            getattr(bf, method)([*urls, bad])
    assert redis_client.dbsize() == 0  # nothing written, not even the filter
    with pytest.raises(TypeError, match=r"^check_and_add\(\): .* element is NoneType"):
        bf.check_and_add(None)  # type: ignore[arg-type]
    # Any iterable, as add_many.
    assert bf.check_and_add_many(u for u in ["a", "b", "a"]) == [False, False, True]
    with pytest.raises(ValueError, match=r"0 or more, got -1"):
        bf.estimate(-1)
    with pytest.raises(TypeError, match=r"whole number of items, got str"):
        bf.estimate("x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"cannot be pickled .* one filter per process"):
        pickle.dumps(bf)
    # The constructors' key: BLOOMFILTER_KEY's rule (None made a filter named 'None').
    config = BloomConfig.from_settings({"BLOOMFILTER_KEY": "k", "BLOOMFILTER_CAPACITY": 1000})
    for key, error in (
        (None, TypeError),
        (b"k", TypeError),
        (5, TypeError),
        ("", ValueError),
        ("{x}", ValueError),
        ("a{b}c", ValueError),
        ("\ud800", ValueError),
    ):
        with pytest.raises(error, match=r"The Bloom filter's key .* is invalid"):
            RedisBloomFilter.from_config(redis_client, key, config)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"BLOOMFILTER_KEY .* UTF-8"):
        BloomConfig.from_settings({"BLOOMFILTER_KEY": "\ud800"})
    # The sizes the record stores, refused as arguments: they wrote a record every later
    # open refused ("its ttl is '1.5' ... reset it").
    spec = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 1000}).spec
    for sizes, error, said in (
        ({"capacity": 0}, ValueError, r"^capacity must be from 1 to .*, got 0$"),
        ({"capacity": True}, TypeError, r"^capacity must be a whole number, got bool True$"),
        ({"ttl": 1.5}, TypeError, r"^ttl must be a whole number, got float 1.5$"),
        ({"ttl": -5}, ValueError, r"^ttl must be from 0 to .*, got -5$"),
        ({"expansion": 1}, ValueError, r"^expansion must be 0 \(no growth\) or from 2 to"),
    ):
        with pytest.raises(error, match=said):
            RedisBloomFilter(redis_client, "sized", spec, **{"capacity": 1000, **sizes})
    assert not redis_client.keys("*sized*")
    names = redis_client.keys()
    assert names
    assert all(k.startswith((b"bf:", b"{bf:")) for k in names), names


def test_a_shard_is_allocated_whole_at_its_exact_size(redis_client: redis.Redis) -> None:
    spec = BloomConfig.from_settings({"BLOOMFILTER_BIT": 20}).spec
    bf = make(redis_client, spec)
    bf.add_many(fingerprints(500))
    size = HEADER_BYTES + spec.shard_bytes
    for key in bf.shard_keys:
        assert redis_client.strlen(key) == size
        # No greedy preallocation: the shard's jemalloc block plus the key's bookkeeping.
        usage = redis_client.memory_usage(key)
        assert size < usage <= allocation(size + STRING_OVERHEAD) + 128
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
    assert bits_of(redis_client.get(bulk.shard_keys[2]) or b"") == bits_of(
        redis_client.get(one_by_one.shard_keys[2]) or b""
    )


def test_bulk_across_chunks_equals_per_item_results(redis_client: redis.Redis) -> None:
    # Two chunks (CHUNK), several BITFIELDs per shard and chunk, and repeats whose first
    # occurrence is in the other chunk or in the same one.
    unique = fingerprints(CHUNK * 6 // 5)
    repeats = unique[CHUNK * 9 // 10 :]
    elements = unique + repeats
    spec = FilterSpec(shards=3, shard_bits=400_009, hash_count=7)
    one_by_one = make(redis_client, spec, key="single")
    expected = [one_by_one.check_and_add(e) for e in elements]
    assert expected.count(True) >= len(repeats)
    bulk = make(redis_client, spec, key="bulk")
    assert bulk.add_many(elements) == expected
    for shard in range(spec.shards):
        single = redis_client.get(one_by_one.shard_keys[shard]) or b""
        assert bits_of(redis_client.get(bulk.shard_keys[shard]) or b"") == bits_of(single)
    one_by_one.sync_counters()
    added = expected.count(False)
    assert bulk.totals() == one_by_one.totals() == FilterTotals(added, len(elements) - added)


def test_threads_share_one_filter_safely(redis_client: redis.Redis) -> None:
    # Four threads offer the same 2,000 elements, one call at a time or in bulk: each
    # element is new to exactly one call, and every answer is a bool.
    bf = make(redis_client, FilterSpec(shards=3, shard_bits=200_003, hash_count=7), cache_size=50)
    elements = fingerprints(2_000, "threads")
    answers: list[list[bool]] = [[] for _ in range(4)]

    def work(i: int) -> None:
        mine = elements[i::2] + elements[(i + 1) % 2 :: 2]
        if i % 2:
            answers[i] = bf.add_many(mine)
        else:
            answers[i] = [bf.check_and_add(e) for e in mine]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(isinstance(a, bool) for got in answers for a in got)
    assert sum(a.count(False) for a in answers) == 2_000


def test_false_positive_rate_matches_theory(redis_client: redis.Redis) -> None:
    # The classic layout, whose rate is the textbook formula (blocked: tests/test_blocked.py).
    n, p = 20_000, 0.01
    config = BloomConfig.from_settings(
        {
            "BLOOMFILTER_BLOCKED": False,
            "BLOOMFILTER_CAPACITY": n,
            "BLOOMFILTER_ERROR_RATE": p,
            "BLOOMFILTER_SHARD_BIT": 15,
            "BLOOMFILTER_EXPANSION": 0,
        }
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
    assert 0.85 * p <= theory <= p  # the shards' blocks add a few bits, never remove any
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
    assert "scrapy bloom reset --key 'bf'" in message
    # Nothing was written under the other geometry.
    assert redis_client.strlen("{bf:0}:g0") == HEADER_BYTES + 4096 // 8


def test_a_stored_geometry_is_adopted_by_the_same_sizing(redis_client: redis.Redis) -> None:
    # A filter created by a release that sized "capacity=1000 error_rate=0.01" as SMALL:
    # a worker asking for the same sizing, sized differently by this release, adopts the
    # stored geometry instead of being locked out.
    older = make(redis_client, sizing="capacity=1000 error_rate=0.01")
    assert older.add_many(fingerprints(300)) == [False] * 300
    other = FilterSpec(shards=5, shard_bits=2048, hash_count=7)
    newer = make(redis_client, other, sizing="capacity=1000 error_rate=0.01")
    assert newer.open().spec == SMALL
    assert newer.spec == SMALL
    assert newer.contains_many(fingerprints(300)) == [True] * 300
    assert newer.check_and_add(fingerprints(1, "new")[0]) is False
    # Another sizing with another geometry is still refused.
    with pytest.raises(ConfigMismatchError):
        make(redis_client, other, sizing="capacity=2000 error_rate=0.01").open()


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
    with pytest.raises(
        WrongTypeError, match=r"'bf:meta' holds a set, where the Bloom filter 'bf' keeps its config"
    ):
        make(redis_client).open()


def test_wrong_type_shard_key_is_a_clear_error_at_open(redis_client: redis.Redis) -> None:
    redis_client.rpush("{bf:2}:g0", "x")
    with pytest.raises(WrongTypeError, match=r"'\{bf:2\}:g0' holds a list, where .* shard's bits"):
        make(redis_client).open()


def test_wrong_type_shard_key_is_a_clear_error_while_running(redis_client: redis.Redis) -> None:
    bf = make(redis_client)
    bf.open()
    for key in bf.shard_keys:
        redis_client.delete(key)
        redis_client.sadd(key, "x")
    with pytest.raises(WrongTypeError, match=r"holds a set, where the Bloom filter 'bf'"):
        bf.check_and_add("a" * 40)
    with pytest.raises(WrongTypeError, match=r"holds a set"):
        bf.add_many(fingerprints(10))


def test_bits_without_a_record_are_refused(redis_client: redis.Redis) -> None:
    redis_client.setbit("{bf:1}:g0", 7, 1)
    with pytest.raises(OrphanedShardsError, match=r"1 shard key\(s\) such as .* does not"):
        make(redis_client).open()


def test_a_lost_record_is_restored_from_intact_shards(redis_client: redis.Redis) -> None:
    # The record is evicted first under allkeys-lru (it is read only at open): a worker
    # that finds every shard intact, with one id and its own geometry, restores it.
    first = make(redis_client)
    first.add_many(fingerprints(100))
    record = first.open()
    redis_client.delete("bf:meta")
    restored = make(redis_client).open()
    assert restored.filter_id == record.filter_id
    assert make(redis_client).contains_many(fingerprints(100)) == [True] * 100
    # Shards of another geometry are not taken for this filter's.
    redis_client.delete("bf:meta")
    with pytest.raises(OrphanedShardsError, match="do not form the filter this worker asks for"):
        make(redis_client, FilterSpec(shards=4, shard_bits=4096, hash_count=6)).open()


def restored_holding(client: redis.Redis, held: list[str], **kwargs: object) -> FilterRecord:
    """Open the filter 'bf' with ``kwargs`` (its record restored); check it holds ``held``."""
    restored = make(client, **kwargs)
    record = restored.open()
    assert restored.contains_many(held) == [True] * len(held)
    return record


def test_a_lost_record_is_restored_only_with_the_re_crawl_windows_its_shards_show(
    redis_client: redis.Redis,
) -> None:
    # Neither BLOOMFILTER_TTL nor the expansion is in a shard's header: a worker with another
    # TTL "restored" the record with its own (5 -> 9), and URLs added a second before read
    # "new" (0 of 3,000 seen, a probe); the workers still on the old record never noticed.
    first = make(redis_client, ttl=5)
    assert first.add_many(fingerprints(100)) == [False] * 100
    redis_client.delete("bf:meta")
    for ttl in (9, 3):
        with pytest.raises(OrphanedShardsError, match=rf"BLOOMFILTER_TTL = 5\b.*sets {ttl}\b"):
            make(redis_client, ttl=ttl).open()
    assert redis_client.exists("bf:meta") == 0
    assert restored_holding(redis_client, fingerprints(100), ttl=5).ttl == 5


def test_a_lost_record_is_restored_only_with_the_growth_its_shards_show(
    redis_client: redis.Redis,
) -> None:
    # A grown shard's generation 1 has the size its expansion gives: a worker asking for
    # another read it with its own (2 -> 4: 2,069 of 3,000 URLs seen, a probe).
    first = make(redis_client, expansion=2)
    assert first.add_many(fingerprints(1500)) == [False] * 1500
    assert first.state().generations[-1].generation >= 1  # grown
    redis_client.delete("bf:meta")
    for expansion in (4, 3):
        with pytest.raises(
            OrphanedShardsError, match=f"EXPANSION = 2\\).*EXPANSION = {expansion} give"
        ):
            make(redis_client, expansion=expansion).open()
    assert restored_holding(redis_client, fingerprints(1500), expansion=2).expansion == 2


def test_a_lost_record_is_restored_only_with_the_growth_of_the_window_before_too(
    redis_client: redis.Redis,
) -> None:
    # Only the window before the newest had grown: its generation 1 went unmeasured, and a
    # worker asking for EXPANSION = 2 restored a filter grown by 4 (545 of 3,000 URLs seen).
    first = make(redis_client, expansion=4, ttl=2)
    held = fingerprints(1500)
    assert first.add_many(held) == [False] * 1500  # the window grows past generation 0
    window = int(redis_client.time()[0]) // 2
    while int(redis_client.time()[0]) // 2 == window:
        time.sleep(0.05)
    first.add_many(fingerprints(40, "next"))  # the next window: every shard, no growth
    redis_client.delete("bf:meta")
    with pytest.raises(OrphanedShardsError, match=r"EXPANSION = 4\).*EXPANSION = 2 give"):
        make(redis_client, expansion=2, ttl=2).open()
    assert restored_holding(redis_client, held, expansion=4, ttl=2).expansion == 4


def test_counters_that_say_nothing_was_added_are_no_loss(redis_client: redis.Redis) -> None:
    # A sync's HINCRBY of 0 landing just after a reset left 'bf:count' behind: the next
    # worker was refused as if a filter had been lost whole.
    redis_client.hset("bf:count", mapping={"added": 0, "seen": 0})
    assert make(redis_client).add_many(fingerprints(10)) == [False] * 10


@pytest.mark.parametrize("policy", ["raise", "recreate"])
def test_counters_left_by_a_filter_lost_whole_are_said(
    redis_client: redis.Redis, policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A reset deletes the counters before the record: counters without a record or shards
    # are a filter lost whole (evicted, deleted by hand). Created anew without a word, its
    # URLs were all "new" and its totals went on from the lost filter's.
    first = make(redis_client)
    first.add_many(fingerprints(100))
    assert first.sync_counters() is not None
    redis_client.delete("bf:meta", *first.shard_keys)
    later = make(redis_client, faults=FaultPolicy(on_loss=policy))
    if policy == "raise":
        with pytest.raises(FilterDamagedError, match=r"'bf:count'.*100 added.*reset"):
            later.open()
        assert redis_client.exists("bf:meta") == 0
        return
    with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
        later.open()
    assert "lost whole" in caplog.text
    assert later.events.read()[0]["recreated"] == SMALL.shards
    assert later.add_many(fingerprints(10, "anew")) == [False] * 10
    assert later.sync_counters() is not None
    assert later.totals().added == 10


def test_a_sizing_that_gives_the_filters_geometry_is_adopted_saying_so(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # CAPACITY 1000 -> 1001 gives the same bits: opened without a word, the worker's own
    # sizing seemingly in force (a probe).
    def sized(capacity: int) -> RedisBloomFilter:
        settings = {"BLOOMFILTER_CAPACITY": capacity, "BLOOMFILTER_ERROR_RATE": 0.01}
        return RedisBloomFilter.from_config(redis_client, "bf", BloomConfig.from_settings(settings))

    assert sized(1000).open().capacity == 1000
    with caplog.at_level(logging.INFO, logger="scrapy_redis_bloom"):
        record = sized(1001).open()
    assert record.capacity == 1000
    assert "created with capacity=1000 error_rate=0.01" in caplog.text
    assert "asks for capacity=1001 error_rate=0.01, which gives the same layout" in caplog.text


def test_a_read_of_a_filter_whose_record_is_lost_says_its_shards_are_there(
    redis_client: redis.Redis,
) -> None:
    # "There is no Bloom filter" alone, while its shards held every URL (a probe).
    first = make(redis_client)
    first.add_many(fingerprints(100))
    redis_client.delete("bf:meta")
    with pytest.raises(FilterMissingError, match=r"no config record.*shards are there"):
        make(redis_client).contains_many(fingerprints(10))
    assert make(redis_client).open().filter_id == first.record.filter_id  # restored by a writer


def _creator_between_read_and_prepare(late: RedisBloomFilter, creator: RedisBloomFilter) -> None:
    """Make ``creator`` open (create) the filter just after ``late`` read that there is none."""
    parts = late.lifecycle.parts
    read = parts.read_record

    def read_then_lose_the_race() -> Any:
        record = read()
        if record is None:
            parts.read_record = read  # (once)
            creator.open()
        return record

    parts.read_record = read_then_lose_the_race  # type: ignore[method-assign]


def test_a_worker_that_loses_the_creation_race_takes_the_winners_filter(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # Workers start together: one reads "no record", another creates the filter before the
    # first looks for stray shards. The shards it finds are the winner's, not orphans: the
    # record was written before them. (Before: "had lost its config record" and a restore.)
    winner, late = make(redis_client), make(redis_client)
    _creator_between_read_and_prepare(late, winner)
    with caplog.at_level(logging.DEBUG, logger="scrapy_redis_bloom"):
        record = late.open()
    assert record.filter_id == winner.open().filter_id
    assert "restored" not in late.events.read()[0]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert late.check_and_add("a" * 40) is False
    assert winner.check_and_add("a" * 40) is True


def test_a_worker_that_loses_the_race_to_another_geometry_is_told_as_a_later_one(
    redis_client: redis.Redis,
) -> None:
    # The winner's shards differ from those this worker asks for. (Before: OrphanedShardsError,
    # "the layout of their bits is unknown", where the record that says it was there.)
    other = FilterSpec(shards=4, shard_bits=4096, hash_count=6)
    winner, late = make(redis_client), make(redis_client, other)
    _creator_between_read_and_prepare(late, winner)
    with pytest.raises(BloomFilterError) as raced:
        late.open()
    with pytest.raises(BloomFilterError) as later:
        make(redis_client, other).open()
    assert not isinstance(raced.value, OrphanedShardsError), raced.value
    assert type(raced.value) is type(later.value)
    assert str(raced.value) == str(later.value)


def test_clear_deletes_everything_and_the_filter_reopens(redis_client: redis.Redis) -> None:
    bf = make(redis_client)
    bf.add_many(fingerprints(100))
    assert bf.exists()
    bf.clear()
    assert redis_client.keys("*bf*") == []
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


def test_reads_of_a_missing_filter_create_nothing(redis_client: redis.Redis) -> None:
    """``contains``, ``contains_many`` and ``state`` of no filter raise FilterMissingError.

    They opened it creating it: a read under a mistyped key allocated a whole filter (210 MiB
    for 100 million items) and answered "not there" for everything.
    """
    for read in (
        lambda bf: bf.contains("a" * 40),
        lambda bf: bf.contains_many(["a" * 40, "b" * 40]),
        lambda bf: bf.state(),
    ):
        with pytest.raises(FilterMissingError, match=r"There is no Bloom filter 'bf'"):
            read(make(redis_client))
    assert redis_client.keys("*") == []
    bf = make(redis_client)
    bf.open()
    assert bf.contains("a" * 40) is False  # an existing one reads as before
    reader = make(redis_client)
    assert reader.contains_many(["a" * 40]) == [False]
    assert reader.state().bits_set == 0


def test_an_estimate_of_no_filter_is_the_wanted_ones_without_a_redis_call(
    redis_client: redis.Redis,
) -> None:
    """``estimate`` makes no Redis call: it opened (and created) the filter first."""
    bf = make(redis_client)
    state = bf.estimate(100)
    assert bf.round_trips == 0
    assert redis_client.keys("*") == []
    assert state.spec == SMALL
    assert 0 < state.estimated_fpr < 1
    bf.open()
    assert bf.estimate(100) == state


def test_a_clear_behind_a_running_worker_is_said_not_mixed(redis_client: redis.Redis) -> None:
    # Worker A clears (a reset while B still crawls, its lease lapsed): B's next call
    # finds its shard gone and stops with the reason, instead of answering from nothing.
    a, b = make(redis_client), make(redis_client)
    a.add_many(fingerprints(50))
    b.open()
    a.clear()
    with pytest.raises(FilterDamagedError, match=r"4 of the 4 shards of the Bloom filter 'bf'"):
        b.check_and_add("f" * 40)
    assert not redis_client.exists("bf:meta")  # nothing half-restored
    # A new crawl creates the filter again; B, still running, adopts the new filter.
    c = make(redis_client)
    assert c.check_and_add("f" * 40) is False
    # B's BITFIELD reached the new filter's shard before B knew of it: what it finds set
    # there may be its own bits, so it answers "new" (a duplicate fetch at worst).
    assert b.check_and_add("f" * 40) is False
    assert b.events.counts["ambiguous"] == 1
    assert b.check_and_add("f" * 40) is True
    assert b.record is not None
    assert c.record is not None
    assert b.record.filter_id == c.record.filter_id
    assert b.events.counts["reopened"] == 1


def test_a_clear_behind_a_worker_that_recreates_lost_parts(redis_client: redis.Redis) -> None:
    a = make(redis_client)
    b = make(redis_client, faults=FaultPolicy(on_loss="recreate"))
    a.add_many(fingerprints(50))
    b.open()
    a.clear()
    assert b.check_and_add("f" * 40) is False  # the filter is back, empty
    assert b.add_many(fingerprints(20, "late")) == [False] * 20
    assert b.events.counts["recreated"] == 4
    assert make(redis_client).open().spec == SMALL
    assert make(redis_client).contains("f" * 40)


def test_clear_deletes_only_what_is_the_filters(redis_client: redis.Redis) -> None:
    bf = make(redis_client)
    bf.add_many(fingerprints(10))
    redis_client.set("bf:server", "web-1")  # another program's key, one of the filter's names
    bf.clear()
    assert redis_client.get("bf:server") == b"web-1"
    assert redis_client.keys("*") == [b"bf:server"]


# -- forks ------------------------------------------------------------------------------------


def in_child(work: Callable[[], bytes], wait: float = 10.0) -> bytes | None:
    """Fork; run ``work`` in the child; return what it returned (None: no answer in ``wait`` s)."""
    read, write = os.pipe()
    with warnings.catch_warnings():  # (3.12+ warns of forking a threaded process: the point)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child
        try:
            os.write(write, work())
        finally:
            os._exit(0)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], wait)
        answer = os.read(read, 100) if ready else None
    finally:
        os.close(read)
        if answer is None:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return answer


@pytest.mark.timeout(60)
def test_a_child_forked_while_threads_are_in_calls_has_locks_of_its_own(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """A child forked while a thread of the parent was in a call answers its own calls.

    It inherited the filter's lock (and the lease's) held by a thread that does not exist
    in the child: its first call hung for good.
    """
    bloom = make(redis_client, key="forked")
    bloom.open()
    lease = bloom.lease("forked-worker", ttl=30)
    pause = redis_server.pause(1.5)  # the threads' calls wait for their replies meanwhile
    threads = [
        threading.Thread(target=bloom.check_and_add, args=("parent",)),
        threading.Thread(target=lease.renew),
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.3)  # both inside their calls, holding the locks

    def work() -> bytes:
        seen = bloom.check_and_add("child")
        lease.close()
        bloom.close()
        return b"seen" if seen else b"new"

    assert in_child(work) == b"new"
    pause.join()
    for thread in threads:
        thread.join()
    assert bloom.check_and_add("child") is True  # the child's add reached Redis
    lease.release()
    bloom.close()


@pytest.mark.timeout(60)
def test_a_child_forked_during_an_outage_tries_redis_again_once_it_answers() -> None:
    """A child forked while its filter waited for a silent server recovers when it answers.

    The parent's watch of the server (a PING a second, from a thread) is not in the child,
    which inherited the outage it was to end: every call of the child failed fast for good
    (answered "new" under "allow", never added).
    """
    with RedisServer() as server:
        client = server.client(socket_timeout=0.5)
        faults = FaultPolicy(retry_timeout=0.3, on_error="allow")
        bloom = make(client, key="forkwatch", faults=faults, cache_size=0)
        bloom.open()
        client.save()
        server.kill()
        assert bloom.check_and_add("during") is False  # let through: the outage is watched
        restart = threading.Timer(1.0, server.restart)

        def work() -> bytes:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                errors = bloom.events.counts["errors"]
                element = f"child-{time.monotonic()}"
                seen = bloom.check_and_add(element)
                if bloom.events.counts["errors"] == errors:  # Redis answered this one
                    bloom.close()
                    return element.encode() if not seen else b"seen"
                time.sleep(0.2)
            return b"stuck"

        restart.start()
        answer = in_child(work, wait=20)
        restart.join()
        assert answer is not None
        assert answer.startswith(b"child-"), answer
        # Asked of Redis, once the parent's own watch sees it answer: a check_and_add here
        # would answer "seen" from what the parent let through and owes, Redis or not.
        until_tried(bloom.executor)
        assert bloom.contains(answer) is True, "the child's add never reached Redis"
        bloom.close()
        client.close()


def test_a_forked_child_does_not_sync_its_parents_counts(redis_client: redis.Redis) -> None:
    """Counts the parent had not synced at the fork are synced once, by the parent.

    The child synced its copy of them too: the totals (and the shards' counts of items)
    counted them twice.
    """
    # Growing, far from its limit: the shards count items, some held back by the parent.
    spec = FilterSpec(shards=4, shard_bits=1 << 20, hash_count=7)
    bloom = RedisBloomFilter(redis_client, "forkcounts", spec, capacity=100_000, expansion=2)
    assert bloom.check_and_add("first") is False
    bloom.sync_counters()
    new = 1 + [bloom.check_and_add(e) for e in fingerprints(100, "parent")].count(False)

    def work() -> bytes:
        seen = bloom.check_and_add("child")
        bloom.sync_counters()  # and the shards' counts
        bloom.close()
        return b"seen" if seen else b"new"

    answer = in_child(work)
    assert answer in (b"new", b"seen")
    new += answer == b"new"
    bloom.sync_counters()
    assert bloom.totals().added == new
    counts = [
        redis_client.bitfield(key).get("u32", STATE_FIELD + 16).execute()[0]
        for key in bloom.shard_keys
    ]
    assert sum(counts) == new
    bloom.close()


def test_close_syncs_the_counts_not_synced_yet(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    bloom = make(redis_client)
    bloom.open()
    # Within one sync interval: nothing synced before close.
    answers = [bloom.check_and_add(f) for f in fingerprints(1000) * 2]
    added = answers.count(False)
    assert added > 500  # past the capacity of 500
    with caplog.at_level("WARNING", logger="scrapy_redis_bloom.engine.counters"):
        bloom.close()
    assert make(redis_client).totals() == FilterTotals(added=added, seen=2000 - added)
    assert "its capacity of 500" in caplog.text
    assert "over_capacity" in bloom.events.values


@pytest.mark.parametrize("ttl", [0, 1])
def test_over_capacity_is_what_the_filter_holds_not_what_its_windows_forgot(
    redis_client: redis.Redis, ttl: int
) -> None:
    """``over_capacity`` is not set from all ever added when windows forget (BLOOMFILTER_TTL).

    700 items per window of a filter of 500 a TTL, three windows: it said 4.2x (2,100 / 500)
    although no window held more than 700; without windows, 2,100 items are 4.2x.
    """
    spec = FilterSpec(shards=4, shard_bits=1 << 14, hash_count=5)
    bloom = RedisBloomFilter(redis_client, "oc", spec, capacity=500, expansion=2, ttl=ttl)
    for window in range(3):
        bloom.add_many(fingerprints(700, f"w{window}"))  # synced on return
        if ttl:
            time.sleep(ttl)
    added = bloom.totals().added
    assert added > 3 * 690
    if ttl:
        assert "over_capacity" not in bloom.events.values
    else:
        assert bloom.events.values["over_capacity"] == round(added / 500, 2)
    bloom.close()


def test_counters_found_gone_are_said_and_counted(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # Evicted (allkeys-lru) or deleted: the next sync's HINCRBY starts a fresh hash.
    bloom = make(redis_client)
    bloom.open()
    bloom.add_many(fingerprints(30, "kept"))  # synced on return
    bloom.add_many(fingerprints(10, "more"))
    assert "counters_lost" not in bloom.events.counts
    redis_client.delete("bf:count")
    with caplog.at_level("WARNING", logger="scrapy_redis_bloom.engine.counters"):
        bloom.add_many(fingerprints(5, "after"))
    assert bloom.events.counts["counters_lost"] == 1
    assert "without the 40 added and 0 seen counted before" in caplog.text
    bloom.clear()  # its own reset: the counters start anew, said by nobody
    bloom.open()
    bloom.add_many(fingerprints(5, "anew"))
    assert bloom.events.counts["counters_lost"] == 1
    bloom.close()
