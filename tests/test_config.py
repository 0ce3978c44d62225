"""Settings to config: derivations, defaults and one clear ValueError per bad value."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any

import pytest
from scrapy.settings import Settings

from scrapy_redis_bloom.core.hashing import BLOCK_BITS, MAX_SHARD_BITS, FilterSpec
from scrapy_redis_bloom.core.layout import HEADER_BYTES
from scrapy_redis_bloom.core.record import FilterRecord
from scrapy_redis_bloom.core.settings import KEY, BloomConfig, ConnectionConfig, FaultPolicy
from scrapy_redis_bloom.core.sizing import (
    ALLOCATION_SLACK,
    KEY_OVERHEAD,
    STRING_OVERHEAD,
    Sizing,
    allocation,
    false_positive_rate,
    optimal_bits,
    optimal_hash_count,
    shard_allocation,
)
from scrapy_redis_bloom.scrapy.connection import filter_clients

#: What a shard string holds besides its bits.
OVERHEAD = HEADER_BYTES + STRING_OVERHEAD
#: The classic (unblocked, scheme 3) layout, whose shards fill their blocks to the byte
#: and whose m and k are the textbook formulas; a new filter is blocked by default.
CLASSIC = {"BLOOMFILTER_BLOCKED": False}


def reserved(spec: FilterSpec) -> int:
    """Bytes Redis takes for all shards: their blocks and the keys' bookkeeping."""
    return spec.shards * (shard_allocation(spec) + KEY_OVERHEAD)


def assert_snug(spec: FilterSpec, bits: int, slack: float = ALLOCATION_SLACK) -> None:
    """At least ``bits`` bits, each shard filling its block exactly, all within the slack."""
    assert spec.bits >= bits
    assert spec.shard_bits <= MAX_SHARD_BITS
    assert shard_allocation(spec) == spec.shard_bytes + OVERHEAD
    assert reserved(spec) <= bits / 8 * (1 + slack)


def test_defaults_match_scrapy_redis_bloomfilter() -> None:
    classic = BloomConfig.from_settings(CLASSIC)
    assert classic.spec.hash_count == 6
    assert_snug(classic.spec, 2**30)
    # 16 shards of 8 MiB would each take a 10 MiB block: 26 of 5 MiB reserve 130 MiB.
    assert (classic.spec.shards, classic.spec.shard_bytes) == (26, 5 * 2**20 - OVERHEAD)
    # The default is the same bits and k, blocked: each shard's last partial block unused.
    config = BloomConfig.from_settings({})
    whole_blocks = classic.spec.shard_bits // BLOCK_BITS * BLOCK_BITS
    assert config.spec == replace(classic.spec, shard_bits=whole_blocks, block_bits=BLOCK_BITS)
    assert shard_allocation(config.spec) == shard_allocation(classic.spec)
    assert config.capacity == math.floor(config.spec.bits * math.log(2) / 6)
    assert config.key == KEY.default == "%(spider)s:bloomfilter"
    assert config.fingerprinter == "scrapy-redis"
    assert config.sizing == Sizing(bit=30, hash_number=6)
    assert config.faults == FaultPolicy(retry_timeout=20.0, on_error="raise", on_loss="raise")


# The geometry this release gives common settings. A change here changes the geometry of
# NEW filters only: a filter that exists keeps the one in its record, adopted by every
# worker that asks for the same sizing (tests/test_engine.py checks the adoption).
#: A fixed-size filter: sized for the error rate itself (a growing one is sized for half).
FIXED = {"BLOOMFILTER_EXPANSION": 0}

PINNED = [
    (CLASSIC, FilterSpec(shards=26, shard_bits=41_942_656, hash_count=6)),
    (
        {"BLOOMFILTER_CAPACITY": 1_000_000, "BLOOMFILTER_ERROR_RATE": 1e-4, **FIXED, **CLASSIC},
        FilterSpec(shards=21, shard_bits=917_120, hash_count=13),
    ),
    (
        {"BLOOMFILTER_CAPACITY": 10**9, "BLOOMFILTER_ERROR_RATE": 1e-4, **FIXED, **CLASSIC},
        FilterSpec(shards=286, shard_bits=67_108_480, hash_count=13),
    ),
    (
        {"BLOOMFILTER_CAPACITY": 100_000, "BLOOMFILTER_ERROR_RATE": 1e-3, **FIXED, **CLASSIC},
        FilterSpec(shards=9, shard_bits=163_456, hash_count=10),
    ),
    # The default layout, blocked.
    ({}, FilterSpec(shards=26, shard_bits=41_942_528, hash_count=6, block_bits=BLOCK_BITS)),
    (
        {"BLOOMFILTER_CAPACITY": 1_000_000, "BLOOMFILTER_ERROR_RATE": 1e-4, **FIXED},
        FilterSpec(shards=17, shard_bits=1_310_208, hash_count=12, block_bits=BLOCK_BITS),
    ),
    (
        {"BLOOMFILTER_CAPACITY": 10**9, "BLOOMFILTER_ERROR_RATE": 1e-4, **FIXED},
        FilterSpec(shards=329, shard_bits=67_108_352, hash_count=12, block_bits=BLOCK_BITS),
    ),
    (
        {"BLOOMFILTER_CAPACITY": 100_000, "BLOOMFILTER_ERROR_RATE": 1e-3, **FIXED},
        FilterSpec(shards=1, shard_bits=1_572_352, hash_count=9, block_bits=BLOCK_BITS),
    ),
]


@pytest.mark.parametrize(("settings", "spec"), PINNED)
def test_geometry_of_common_settings_is_pinned(settings: dict[str, Any], spec: FilterSpec) -> None:
    assert BloomConfig.from_settings(settings).spec == spec


def test_sizing_is_stored_in_a_stable_form() -> None:
    by_capacity = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": "1e6"}).sizing
    assert by_capacity.canonical() == "capacity=1000000 error_rate=0.001"
    by_bits = BloomConfig.from_settings({"BLOOMFILTER_BIT": 28, "BLOOMFILTER_SHARDS": 4})
    assert by_bits.sizing.canonical() == "bit=28 hash_number=6 shards=4"
    assert by_bits.sizing.spec() == by_bits.spec


def test_bit_and_hash_number_accept_strings_from_the_command_line() -> None:
    config = BloomConfig.from_settings(
        Settings({"BLOOMFILTER_BIT": "20", "BLOOMFILTER_HASH_NUMBER": "7", **CLASSIC})
    )
    assert config.spec.hash_count == 7
    # 128 KiB: no block size meets 2% once each key's bookkeeping counts; the least is 2.1%.
    assert_snug(config.spec, 2**20, slack=0.025)


def test_capacity_and_error_rate_give_the_optimal_m_and_k() -> None:
    config = BloomConfig.from_settings(
        {"BLOOMFILTER_CAPACITY": 1_000_000, "BLOOMFILTER_ERROR_RATE": 0.001, **FIXED, **CLASSIC}
    )
    m = math.ceil(-1_000_000 * math.log(0.001) / math.log(2) ** 2)
    assert m == optimal_bits(1_000_000, 0.001) == 14_377_588
    assert_snug(config.spec, m)
    assert config.spec.hash_count == round(m / 1_000_000 * math.log(2)) == 10
    assert config.expected_error_rate == pytest.approx(0.001, rel=0.05)


def test_capacity_alone_uses_the_default_error_rate() -> None:
    config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": "1e6", **FIXED, **CLASSIC})
    assert_snug(config.spec, optimal_bits(1_000_000, 0.001))


def test_capacity_may_accompany_bit_sizing_to_report_the_expected_rate() -> None:
    config = BloomConfig.from_settings(
        {"BLOOMFILTER_BIT": 30, "BLOOMFILTER_CAPACITY": 10**8, **CLASSIC}
    )
    assert config.capacity == 10**8
    expected = false_positive_rate(config.spec.bits, 6, 10**8)
    assert config.expected_error_rate == pytest.approx(expected)
    assert expected < false_positive_rate(2**30, 6, 10**8)  # the block's spare bits help


def test_bit_40_exceeds_one_redis_string() -> None:
    config = BloomConfig.from_settings({"BLOOMFILTER_BIT": 40, **CLASSIC})
    assert_snug(config.spec, 2**40)
    assert config.spec.shard_bits <= 2**26
    assert config.spec.shards > 2**14


def test_shard_bit_sets_the_largest_shard() -> None:
    config = BloomConfig.from_settings(
        {"BLOOMFILTER_BIT": 40, "BLOOMFILTER_SHARD_BIT": 32, **CLASSIC}
    )
    assert_snug(config.spec, 2**40)
    assert 2**26 < config.spec.shard_bits <= 2**32


def test_shard_count_splits_bits_into_equal_shards() -> None:
    config = BloomConfig.from_settings({"BLOOMFILTER_BIT": 30, "BLOOMFILTER_SHARDS": 3, **CLASSIC})
    assert config.spec.shards == 3
    assert config.spec.shard_bits >= math.ceil(2**30 / 3)
    # The shards fill the 48 MiB blocks Redis reserves for them.
    assert shard_allocation(config.spec) == 48 * 2**20
    assert config.spec.shard_bytes == 48 * 2**20 - OVERHEAD


def test_capacity_sizing_rounds_up_to_whole_shards_only() -> None:
    config = BloomConfig.from_settings(
        {"BLOOMFILTER_CAPACITY": 10**9, "BLOOMFILTER_ERROR_RATE": 1e-4, **FIXED, **CLASSIC}
    )
    wanted = optimal_bits(10**9, 1e-4)
    assert_snug(config.spec, wanted)
    assert config.spec.shard_bits <= 2**26
    assert optimal_hash_count(wanted, 10**9) == config.spec.hash_count == 13


def test_key_for_fills_in_the_spider() -> None:
    config = BloomConfig.from_settings({"BLOOMFILTER_KEY": "bf:%(spider)s:v2"})
    assert config.key_for("books") == "bf:books:v2"
    with pytest.raises(ValueError, match=r"BLOOMFILTER_KEY setting \('bf:%\(spider\)s:v2'\)"):
        config.key_for(None)


def test_describe_names_m_k_shards_and_rate() -> None:
    text = BloomConfig.from_settings({"BLOOMFILTER_BIT": 30, **CLASSIC}).describe()
    assert "m=1,090,509,056 bits (130.0 MiB)" in text
    assert "26 shard(s) of 41,942,656 bits" in text
    assert "k=6" in text
    assert "expected false-positive rate at capacity 0.0156" in text


@pytest.mark.parametrize(
    ("shards", "said"),
    [
        (
            {},
            "; grows 2x per generation up to 63,002,408,324 items (6 generations of 16: a"
            " shard's next would pass the largest generation size, 512 MB), rate",
        ),
        (
            {"BLOOMFILTER_SHARD_BIT": 29},
            "; grows 2x per generation up to 7,000,858,128 items (3 generations of 16: a"
            " shard's next would pass the largest generation size, 512 MB), rate",
        ),
        (
            {"BLOOMFILTER_SHARDS": 8},
            "; cannot grow: its shards are already at the largest generation size (512 MB),"
            " so it holds up to 1,000,357,776 items, rate",
        ),
    ],
)
def test_describe_says_when_the_shard_size_bounds_growth(shards: dict[str, int], said: str) -> None:
    # A generation is at most 512 MB: large shards grow fewer times, or not at all.
    settings = {"BLOOMFILTER_CAPACITY": 10**9, "BLOOMFILTER_ERROR_RATE": 0.0001, **shards}
    text = BloomConfig.from_settings(settings).describe()
    assert said in text


@pytest.mark.parametrize(
    ("size", "block"),
    [
        (1, 16),
        (17, 32),
        (128, 128),
        (129, 160),
        (8 * 2**20, 8 * 2**20),
        (8 * 2**20 + 10, 10 * 2**20),
    ],
)
def test_allocation_follows_jemalloc_size_classes(size: int, block: int) -> None:
    assert allocation(size) == block


BAD_VALUES: list[tuple[dict[str, Any], str]] = [
    ({"BLOOMFILTER_BIT": "abc"}, r"BLOOMFILTER_BIT setting \('abc'\) is invalid\. It must be an integer from 1 to 47"),
    ({"BLOOMFILTER_BIT": 0}, r"BLOOMFILTER_BIT setting \(0\) is invalid"),
    ({"BLOOMFILTER_BIT": 48}, r"BLOOMFILTER_BIT setting \(48\) is invalid\. It must be an integer from 1 to 47"),
    ({"BLOOMFILTER_BIT": 30.5}, r"BLOOMFILTER_BIT setting \(30\.5\) is invalid"),
    ({"BLOOMFILTER_BIT": True}, r"BLOOMFILTER_BIT setting \(True\) is invalid"),
    ({"BLOOMFILTER_BIT": [30]}, r"BLOOMFILTER_BIT setting \(\[30\]\) is invalid"),
    ({"BLOOMFILTER_HASH_NUMBER": 0}, r"BLOOMFILTER_HASH_NUMBER setting \(0\) is invalid\. It must be an integer from 1 to 64"),
    ({"BLOOMFILTER_HASH_NUMBER": 65}, r"BLOOMFILTER_HASH_NUMBER setting \(65\) is invalid"),
    ({"BLOOMFILTER_HASH_NUMBER": "six"}, r"BLOOMFILTER_HASH_NUMBER setting \('six'\) is invalid"),
    ({"BLOOMFILTER_CAPACITY": 0}, r"BLOOMFILTER_CAPACITY setting \(0\) is invalid\. It must be a positive integer"),
    ({"BLOOMFILTER_CAPACITY": -5}, r"BLOOMFILTER_CAPACITY setting \(-5\) is invalid"),
    ({"BLOOMFILTER_CAPACITY": "many"}, r"BLOOMFILTER_CAPACITY setting \('many'\) is invalid"),
    ({"BLOOMFILTER_CAPACITY": 1.5}, r"BLOOMFILTER_CAPACITY setting \(1\.5\) is invalid"),
    ({"BLOOMFILTER_CAPACITY": 10, "BLOOMFILTER_ERROR_RATE": 0}, r"BLOOMFILTER_ERROR_RATE setting \(0\) is invalid\. It must be a number strictly between 0 and 1"),
    ({"BLOOMFILTER_CAPACITY": 10, "BLOOMFILTER_ERROR_RATE": 1}, r"BLOOMFILTER_ERROR_RATE setting \(1\) is invalid"),
    ({"BLOOMFILTER_CAPACITY": 10, "BLOOMFILTER_ERROR_RATE": -0.1}, r"BLOOMFILTER_ERROR_RATE setting \(-0\.1\) is invalid"),
    ({"BLOOMFILTER_CAPACITY": 10, "BLOOMFILTER_ERROR_RATE": "nan"}, r"BLOOMFILTER_ERROR_RATE setting \('nan'\) is invalid"),
    ({"BLOOMFILTER_CAPACITY": 10, "BLOOMFILTER_ERROR_RATE": "1%"}, r"BLOOMFILTER_ERROR_RATE setting \('1%'\) is invalid"),
    ({"BLOOMFILTER_CAPACITY": 10, "BLOOMFILTER_ERROR_RATE": 1e-25}, r"BLOOMFILTER_ERROR_RATE setting \(1e-25\) is invalid\. It needs 8\d hash functions; at most 64"),
    ({"BLOOMFILTER_CAPACITY": 10, "BLOOMFILTER_ERROR_RATE": 1e-25, **CLASSIC}, r"BLOOMFILTER_ERROR_RATE setting \(1e-25\) is invalid\. It needs 8\d hash functions; at most 64"),
    ({"BLOOMFILTER_CAPACITY": 10, "BLOOMFILTER_ERROR_RATE": 5e-324}, r"BLOOMFILTER_ERROR_RATE setting \(5e-324\) is invalid\. It needs too many hash functions; at most 64"),
    ({"BLOOMFILTER_CAPACITY": 10, "BLOOMFILTER_ERROR_RATE": "5e-324", "BLOOMFILTER_TTL": 3600}, r"BLOOMFILTER_ERROR_RATE setting \(5e-324\) is invalid\. It needs too many hash functions; at most 64"),
    ({"BLOOMFILTER_CAPACITY": 10**15, "BLOOMFILTER_ERROR_RATE": 1e-9}, r"BLOOMFILTER_CAPACITY setting \(1000000000000000\) is invalid\. At error rate 1e-09 it needs .* more than the 2\*\*47"),
    ({"BLOOMFILTER_BIT": 30, "BLOOMFILTER_ERROR_RATE": 0.01, "BLOOMFILTER_CAPACITY": 10}, r"BLOOMFILTER_ERROR_RATE and BLOOMFILTER_BIT contradict each other"),
    ({"BLOOMFILTER_HASH_NUMBER": 5, "BLOOMFILTER_ERROR_RATE": 0.01, "BLOOMFILTER_CAPACITY": 10}, r"BLOOMFILTER_ERROR_RATE and BLOOMFILTER_HASH_NUMBER contradict"),
    ({"BLOOMFILTER_ERROR_RATE": 0.01}, r"BLOOMFILTER_ERROR_RATE setting needs BLOOMFILTER_CAPACITY"),
    # BF.RESERVE takes a capacity and a rate: BIT 20 beside CAPACITY 1,000 was said as 2**20
    # bits, k=6, and reserved 13 x 760 bytes at k=45 (a probe).
    ({"BLOOMFILTER_BACKEND": "native", "BLOOMFILTER_BIT": 20, "BLOOMFILTER_CAPACITY": 1000}, r"The BLOOMFILTER_BIT setting does not apply to BLOOMFILTER_BACKEND = 'native': .*Size the filter by BLOOMFILTER_CAPACITY and BLOOMFILTER_ERROR_RATE instead"),
    ({"BLOOMFILTER_BACKEND": "native", "BLOOMFILTER_HASH_NUMBER": 4}, r"The BLOOMFILTER_HASH_NUMBER setting does not apply to BLOOMFILTER_BACKEND = 'native'"),
    ({"BLOOMFILTER_BACKEND": "native", "BLOOMFILTER_BIT": 20, "BLOOMFILTER_HASH_NUMBER": 4}, r"The BLOOMFILTER_BIT and BLOOMFILTER_HASH_NUMBER settings do not apply to BLOOMFILTER_BACKEND = 'native'"),
    ({"BLOOMFILTER_SHARD_BIT": 33}, r"BLOOMFILTER_SHARD_BIT setting \(33\) is invalid\. It must be an integer from 7 to 32: a shard holds at most 2\*\*32 bits"),
    ({"BLOOMFILTER_SHARD_BIT": 6}, r"BLOOMFILTER_SHARD_BIT setting \(6\) is invalid\. It must be an integer from 7 to 32"),
    ({"BLOOMFILTER_BIT": 47, "BLOOMFILTER_SHARD_BIT": 7, **CLASSIC}, r"BLOOMFILTER_SHARD_BIT setting \(7\) is invalid\. It cannot split the filter's bits into shards \(a filter has 1 to 4,194,304 shards"),
    ({"BLOOMFILTER_BIT": 24, "BLOOMFILTER_SHARD_BIT": 8}, r"BLOOMFILTER_SHARD_BIT setting \(8\) is invalid\. It cannot split .* A blocked filter's shards hold whole 512-bit blocks: give larger shards, or set BLOOMFILTER_BLOCKED = False"),
    ({"BLOOMFILTER_SHARD_BIT": 2}, r"BLOOMFILTER_SHARD_BIT setting \(2\) is invalid"),
    ({"BLOOMFILTER_SHARDS": 0}, r"BLOOMFILTER_SHARDS setting \(0\) is invalid\. It must be a positive integer"),
    ({"BLOOMFILTER_SHARDS": 4, "BLOOMFILTER_SHARD_BIT": 20}, r"BLOOMFILTER_SHARDS and BLOOMFILTER_SHARD_BIT contradict"),
    # The capacity beside BIT is where the filter grows: 1,024 bits for 20,000 URLs dropped
    # 4,588 of 5,000 new ones as seen, silently (a probe).
    ({"BLOOMFILTER_CAPACITY": 20_000, "BLOOMFILTER_BIT": 10}, r"BLOOMFILTER_CAPACITY = 20,000 and BLOOMFILTER_BIT = 10 contradict each other: 1,024 bits hold 20,000 URLs at a false-positive rate of 1, .* at least 19"),
    ({"BLOOMFILTER_CAPACITY": 10**9, "BLOOMFILTER_BIT": 30}, r"at a false-positive rate of 0\.98, .* at least 35"),
    # A fixed-size one's capacity is where it warns that it is full: 2**12 bits stated to hold
    # 10**9 took 17,642 of 20,000 new URLs for seen, with no word (a probe).
    ({"BLOOMFILTER_CAPACITY": 10**9, "BLOOMFILTER_BIT": 12, "BLOOMFILTER_HASH_NUMBER": 4, "BLOOMFILTER_EXPANSION": 0}, r"BLOOMFILTER_CAPACITY = 1,000,000,000 and BLOOMFILTER_BIT = 12 contradict each other: .* dropped as seen before the filter warns that it is full \(it does not grow\)"),
    ({"BLOOMFILTER_BIT": 40, "BLOOMFILTER_SHARDS": 128}, r"BLOOMFILTER_SHARDS setting \(128\) is invalid\. Each of its shards would hold 8,589,934,592 bits, more than a Redis string holds \(4,294,967,040 after the shard header\): use at least 257 shards"),
    ({"BLOOMFILTER_BIT": 3, "BLOOMFILTER_SHARDS": 9}, r"BLOOMFILTER_SHARDS setting \(9\) is invalid\. The filter has only 8 bits"),
    ({"BLOOMFILTER_KEY": ""}, r"BLOOMFILTER_KEY setting \(''\) is invalid\. It must be a non-empty string"),
    ({"BLOOMFILTER_KEY": 5}, r"BLOOMFILTER_KEY setting \(5\) is invalid"),
    ({"BLOOMFILTER_KEY": "%(name)s:bf"}, r"BLOOMFILTER_KEY setting \('%\(name\)s:bf'\) is invalid\. It may contain the placeholder %\(spider\)s"),
    ({"BLOOMFILTER_KEY": "bf:50%"}, r"BLOOMFILTER_KEY setting \('bf:50%'\) is invalid"),
    ({"BLOOMFILTER_KEY": "{spider}:bf"}, r"BLOOMFILTER_KEY setting \('\{spider\}:bf'\) is invalid\. It must not contain \{ or \}"),
    ({"BLOOMFILTER_REDIS_URL": "localhost:6379"}, r"BLOOMFILTER_REDIS_URL setting \('localhost:6379'\) is invalid\. It must be a Redis URL: redis://"),
    ({"BLOOMFILTER_REDIS_URL": "redis://a", "BLOOMFILTER_REDIS_URLS": ["redis://b"]}, r"BLOOMFILTER_REDIS_URL and BLOOMFILTER_REDIS_URLS contradict"),
    ({"BLOOMFILTER_REDIS_URLS": []}, r"BLOOMFILTER_REDIS_URLS setting \(\[\]\) is invalid\. It must be a non-empty list of Redis URLs"),
    ({"BLOOMFILTER_REDIS_URLS": ["redis://a", 5]}, r"BLOOMFILTER_REDIS_URLS setting \(\['redis://a', 5\]\) is invalid\. It must be a Redis URL"),
    ({"BLOOMFILTER_REDIS_URLS": "redis://a,redis://a"}, r"BLOOMFILTER_REDIS_URLS setting \('redis://a,redis://a'\) is invalid\. It lists the same server more than once"),
    ({"BLOOMFILTER_REDIS_CLUSTER": "maybe"}, r"BLOOMFILTER_REDIS_CLUSTER setting \('maybe'\) is invalid\. It must be a boolean"),
    ({"BLOOMFILTER_REDIS_CLUSTER": True}, r"BLOOMFILTER_REDIS_CLUSTER setting needs BLOOMFILTER_REDIS_URL"),
    ({"BLOOMFILTER_REDIS_URL": "redis://a", "BLOOMFILTER_REDIS_PARAMS": "timeout=3"}, r"BLOOMFILTER_REDIS_PARAMS setting \(a str\) is invalid\. It must be a dict .* or its JSON on the command line"),
    ({"BLOOMFILTER_REDIS_URL": "redis://a", "BLOOMFILTER_REDIS_PARAMS": {"socket_timeout": "3s"}}, r"BLOOMFILTER_REDIS_PARAMS setting \(\{'socket_timeout': '3s'\}\) is invalid\. Its 'socket_timeout' must be a number"),
    # Retried as a connection fault for the whole retry timeout ("Timeout value out of range").
    ({"BLOOMFILTER_REDIS_URL": "redis://a", "BLOOMFILTER_REDIS_PARAMS": {"socket_timeout": -1}}, r"Its 'socket_timeout' must be a finite number above 0, not -1\."),
    ({"BLOOMFILTER_REDIS_URL": "redis://a", "BLOOMFILTER_REDIS_PARAMS": {"socket_connect_timeout": float("nan")}}, r"Its 'socket_connect_timeout' must be a finite number above 0, not nan\."),
    ({"BLOOMFILTER_REDIS_URL": "redis://a", "BLOOMFILTER_REDIS_PARAMS": {"socket_timeout": 0}}, r"Its 'socket_timeout' must be a finite number above 0, not 0\."),
    ({"BLOOMFILTER_REDIS_URL": "redis://a", "BLOOMFILTER_REDIS_PARAMS": {"db": -2}}, r"Its 'db' must be a finite number 0 or more, not -2\."),
    # A rate at capacity below the least float: generation 1's geometry divided by it.
    ({"BLOOMFILTER_CAPACITY": 1, "BLOOMFILTER_HASH_NUMBER": 60, "BLOOMFILTER_BIT": 32, "BLOOMFILTER_BLOCKED": False}, r"BLOOMFILTER_CAPACITY = 1 is so far below what BLOOMFILTER_BIT = 32 holds .* underflows to 0"),
    # What the URL gives, given again: the URL's won, silently (another port, host or db).
    ({"BLOOMFILTER_REDIS_URL": "redis://a:6379", "BLOOMFILTER_REDIS_PARAMS": {"port": 6380}}, r"The BLOOMFILTER_REDIS_PARAMS setting gives 'port', which BLOOMFILTER_REDIS_URL gives too \(its own would win\)"),
    ({"BLOOMFILTER_REDIS_URLS": ["redis://a/2", "redis://b/2"], "BLOOMFILTER_REDIS_PARAMS": {"db": 4, "host": "c"}}, r"gives 'host', 'db', which BLOOMFILTER_REDIS_URLS gives too"),
    ({"BLOOMFILTER_REDIS_URL": "redis://a/2?db=3"}, r"Its database is given twice \(/2 and db=3\)"),
    ({"BLOOMFILTER_REDIS_URL": "redis://a:abc/0"}, r"BLOOMFILTER_REDIS_URL setting \('redis://a:abc/0'\) is invalid\. It is not a valid Redis URL: Port could not be cast"),
    ({"BLOOMFILTER_REDIS_URLS": ["redis://a:1", "redis://b:99999"]}, r"BLOOMFILTER_REDIS_URLS setting .* is invalid\. It is not a valid Redis URL: Port out of range"),
    ({"BLOOMFILTER_REDIS_URL": "redis://a/zero"}, r"BLOOMFILTER_REDIS_URL setting \('redis://a/zero'\) is invalid\. Its database \('zero'\) must be a number"),
    ({"BLOOMFILTER_REDIS_URL": "redis://a/0?socket_timeout=soon"}, r"BLOOMFILTER_REDIS_URL setting .* is invalid\. It is not a valid Redis URL: Invalid value for .socket_timeout. in connection URL"),
    ({"BLOOMFILTER_KEY": "%s"}, r"BLOOMFILTER_KEY setting \('%s'\) is invalid\. It may contain the placeholder"),
    ({"BLOOMFILTER_REDIS_PARAMS": {"socket_timeout": 3}}, r"BLOOMFILTER_REDIS_PARAMS setting needs BLOOMFILTER_REDIS_URL, BLOOMFILTER_REDIS_URLS or BLOOMFILTER_REDIS_SENTINELS"),
    ({"BLOOMFILTER_WORKER_TTL": 0}, r"BLOOMFILTER_WORKER_TTL setting \(0\) is invalid\. It must be a number of seconds from 1 to 86,400"),
    ({"BLOOMFILTER_WORKER_TTL": 5e12}, r"BLOOMFILTER_WORKER_TTL setting \(5000000000000\.0\) is invalid"),
    ({"BLOOMFILTER_WORKER_TTL": "soon"}, r"BLOOMFILTER_WORKER_TTL setting \('soon'\) is invalid"),
    ({"BLOOMFILTER_CACHE_SIZE": -1}, r"BLOOMFILTER_CACHE_SIZE setting \(-1\) is invalid\. It must be an integer from 0 \(no near-cache\) to 100,000,000"),
    ({"BLOOMFILTER_CACHE_SIZE": "lots"}, r"BLOOMFILTER_CACHE_SIZE setting \('lots'\) is invalid"),
    ({"BLOOMFILTER_FINGERPRINTER": "sha256"}, r"BLOOMFILTER_FINGERPRINTER setting \('sha256'\) is invalid\. It must be 'scrapy-redis'"),
    ({"BLOOMFILTER_RETRY_TIMEOUT": -1}, r"BLOOMFILTER_RETRY_TIMEOUT setting \(-1\) is invalid\. It must be a number of seconds from 0 \(no retry\) to 3600"),
    ({"BLOOMFILTER_RETRY_TIMEOUT": "soon"}, r"BLOOMFILTER_RETRY_TIMEOUT setting \('soon'\) is invalid"),
    ({"BLOOMFILTER_ON_ERROR": "ignore"}, r"BLOOMFILTER_ON_ERROR setting \('ignore'\) is invalid\. It must be 'raise' .* or 'allow'"),
    ({"BLOOMFILTER_ON_LOSS": "repair"}, r"BLOOMFILTER_ON_LOSS setting \('repair'\) is invalid\. It must be 'raise' .* or 'recreate'"),
]  # fmt: skip


@pytest.mark.parametrize(("settings", "message"), BAD_VALUES)
def test_bad_setting_raises_value_error_naming_it(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BloomConfig.from_settings(Settings(settings))


def test_every_bloomfilter_setting_has_a_bad_value_case() -> None:
    documented = {
        "BLOOMFILTER_BIT", "BLOOMFILTER_HASH_NUMBER", "BLOOMFILTER_CAPACITY",
        "BLOOMFILTER_ERROR_RATE", "BLOOMFILTER_SHARD_BIT", "BLOOMFILTER_SHARDS",
        "BLOOMFILTER_KEY", "BLOOMFILTER_FINGERPRINTER", "BLOOMFILTER_REDIS_URL",
        "BLOOMFILTER_REDIS_URLS", "BLOOMFILTER_REDIS_CLUSTER", "BLOOMFILTER_REDIS_PARAMS",
        "BLOOMFILTER_WORKER_TTL", "BLOOMFILTER_CACHE_SIZE", "BLOOMFILTER_RETRY_TIMEOUT",
        "BLOOMFILTER_ON_ERROR", "BLOOMFILTER_ON_LOSS",
    }  # fmt: skip
    named = {m.group(0) for _, msg in BAD_VALUES for m in re.finditer(r"BLOOMFILTER_[A-Z_]+", msg)}
    assert documented <= named


def test_an_unknown_bloomfilter_setting_is_refused_naming_the_closest() -> None:
    # README: every BLOOMFILTER_* setting is checked; a misspelt one was silently ignored.
    for name, given, hint in (
        ("CAPACTIY", {"BLOOMFILTER_CAPACTIY": 5000}, r"Did you mean BLOOMFILTER_CAPACITY\?"),
        (
            "SHARD_BITS",
            Settings({"BLOOMFILTER_SHARD_BITS": 20}),
            r"Did you mean BLOOMFILTER_SHARD_BIT\?",
        ),
        ("FOO", {"BLOOMFILTER_FOO": 1}, r"See the settings reference for the names\."),
        # (``-s bloomfilter_capacity=...``: Scrapy's names are case-sensitive, it was ignored.)
        *(
            (name, {name: 5000}, r"Did you mean BLOOMFILTER_CAPACITY\?")
            for name in ("BLOOMFILTER_capacity", "bloomfilter_capacity")
        ),
    ):
        full = name if name.lower().startswith("bloomfilter_") else f"BLOOMFILTER_{name}"
        with pytest.raises(ValueError, match=rf"^The setting {full} is unknown: .* {hint}$"):
            BloomConfig.from_settings(given)
    # A project's own lower-case setting, like none of ours, is not ours to refuse.
    assert BloomConfig.from_settings({"bloomfilter_seen_log_path": "/tmp/x"}).spec
    # scrapy-redis-bloomfilter's two settings mean the same here (docs/howto/from-bloomfilter.md),
    # and other packages' settings are not BLOOMFILTER_* ones.
    assert BloomConfig.from_settings({"BLOOMFILTER_BIT": 30, "BLOOMFILTER_HASH_NUMBER": 6}).spec
    assert BloomConfig.from_settings(Settings({"REDIS_URL": "redis://h", "OTHER_BIT": 1})).spec


def test_connection_settings() -> None:
    assert BloomConfig.from_settings({}).connection.urls == ()  # scrapy-redis's connection
    config = BloomConfig.from_settings(
        {
            "BLOOMFILTER_REDIS_URLS": "redis://a:6379, redis://b:6379",
            "BLOOMFILTER_REDIS_PARAMS": {"socket_timeout": 5},
            "BLOOMFILTER_WORKER_TTL": "12.5",
        }
    )
    assert config.connection.urls == ("redis://a:6379", "redis://b:6379")
    assert config.connection.params == (("socket_timeout", 5),)
    assert config.worker_ttl == 12.5
    cluster = BloomConfig.from_settings(
        {"BLOOMFILTER_REDIS_URL": "redis://node:7000", "BLOOMFILTER_REDIS_CLUSTER": "true"}
    ).connection
    assert (cluster.urls, cluster.cluster) == (("redis://node:7000",), True)


def test_fault_policy_settings() -> None:
    faults = BloomConfig.from_settings(
        Settings(
            {
                "BLOOMFILTER_RETRY_TIMEOUT": "2.5",
                "BLOOMFILTER_ON_ERROR": "allow",
                "BLOOMFILTER_ON_LOSS": "recreate",
            }
        )
    ).faults
    assert faults == FaultPolicy(retry_timeout=2.5, on_error="allow", on_loss="recreate")
    assert BloomConfig.from_settings({"BLOOMFILTER_RETRY_TIMEOUT": 0}).faults.retry_timeout == 0


@pytest.mark.parametrize("shard_bit", range(7, 33))
def test_every_documented_shard_bit_works(shard_bit: int) -> None:
    settings = {"BLOOMFILTER_BIT": 24, "BLOOMFILTER_SHARD_BIT": shard_bit}
    # As documented: any in the classic layout, 9 or more (whole 512-bit blocks) blocked.
    layouts = [CLASSIC, {}] if shard_bit >= 9 else [CLASSIC]
    for layout in layouts:
        config = BloomConfig.from_settings({**settings, **layout})
        assert config.spec.bits >= 2**24
        assert config.spec.shard_bits <= 2**shard_bit


SECRET = "Sup3r-s3cret"  # a test password


@pytest.mark.parametrize(
    "settings",
    [
        {"BLOOMFILTER_REDIS_URL": f"http://user:{SECRET}@host/0"},
        {"BLOOMFILTER_REDIS_URL": f"redis://user:{SECRET}@host:port/0"},
        {"BLOOMFILTER_REDIS_URL": f"redis://:{SECRET}@host/0?socket_timeout=soon"},
        {"BLOOMFILTER_REDIS_URL": f"redis://host/0?password={SECRET}&db=x"},
        {"BLOOMFILTER_REDIS_URL": f"rediss://:{SECRET}@host/db"},
        {"BLOOMFILTER_REDIS_URLS": [f"redis://:{SECRET}@a:1/0", "ftp://b"]},
        {"BLOOMFILTER_REDIS_URLS": f"redis://:{SECRET}@a:1/0,redis://:{SECRET}@a:1/0"},
        {"BLOOMFILTER_REDIS_URLS": [f"redis://:{SECRET}@a:1/0", 7]},
        {"BLOOMFILTER_REDIS_URL": "redis://a", "BLOOMFILTER_REDIS_PARAMS": f"password={SECRET}"},
        {
            "BLOOMFILTER_REDIS_URL": "redis://a",
            "BLOOMFILTER_REDIS_PARAMS": {"password": SECRET, "socket_timeout": "x"},
        },
        {"BLOOMFILTER_REDIS_URL": "redis://a", "BLOOMFILTER_REDIS_PARAMS": {SECRET: 1, 2: 3}},
        {"BLOOMFILTER_REDIS_URL": f"redis://:{SECRET}@a", "BLOOMFILTER_REDIS_URLS": ["redis://b"]},
    ],
)
def test_no_password_in_any_setting_error(settings: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="BLOOMFILTER_REDIS") as raised:
        ConnectionConfig.from_settings(settings)
    assert SECRET not in str(raised.value)
    assert "BLOOMFILTER_REDIS" in str(raised.value)


def test_spider_names_with_braces_cannot_fill_the_key() -> None:
    config = BloomConfig.from_settings({})
    assert config.key_for("shop") == "shop:bloomfilter"
    with pytest.raises(ValueError, match=r"spider's name \('shop\{eu\}'\) cannot fill in"):
        config.key_for("shop{eu}")
    # An empty name was said to contain { or }.
    with pytest.raises(ValueError, match=r"name \(''\) cannot fill in .* a non-empty string"):
        config.key_for("")
    with pytest.raises(ValueError, match=r"cannot fill in .* text that UTF-8 can encode"):
        config.key_for("shop\udcff")
    literal = BloomConfig.from_settings({"BLOOMFILTER_KEY": "bf:100%%"})
    assert literal.key_for("shop{eu}") == "bf:100%"


@pytest.mark.parametrize("bit", [1, 24, 40, 47])
def test_every_documented_bit_works_with_the_default_shards(bit: int) -> None:
    assert BloomConfig.from_settings({"BLOOMFILTER_BIT": bit}).spec.bits >= 2**bit


def test_client_params_may_be_json_from_the_command_line() -> None:
    # scrapy crawl -s BLOOMFILTER_REDIS_PARAMS='{"socket_timeout": 5}' was refused as a str,
    # where Scrapy's own getdict reads such a string as JSON.
    settings = {"BLOOMFILTER_REDIS_URL": "redis://a", "BLOOMFILTER_REDIS_PARAMS": '{"db": 2}'}
    assert dict(ConnectionConfig.from_settings(settings).params) == {"db": 2}


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        (
            {
                "BLOOMFILTER_REDIS_URL": f"redis://:{SECRET}@h/0",
                "BLOOMFILTER_REDIS_PARAMS": {"bogus_arg": 1},
            },
            "BLOOMFILTER_REDIS_PARAMS",
        ),
        ({"REDIS_URL": f"redis://:{SECRET}@h/0", "REDIS_PARAMS": {"bogus_arg": 1}}, "REDIS_PARAMS"),
    ],
)
def test_unknown_client_arguments_are_refused_at_startup(
    settings: dict[str, Any], named: str
) -> None:
    with pytest.raises(
        ValueError, match=rf"refuses the arguments of the .*{named}.*'bogus_arg'"
    ) as raised:
        filter_clients(ConnectionConfig.from_settings(settings), settings)
    assert SECRET not in str(raised.value)


@pytest.mark.parametrize(
    ("shards", "said"),
    [
        ({}, "growing 2x per generation, URLs remembered forever; 6 generations of 16: a"),
        (
            {"BLOOMFILTER_SHARDS": 8},
            "; cannot grow: its shards are already at the largest generation size (512 MB)",
        ),
    ],
)
def test_an_existing_filters_record_says_what_bounds_its_growth(
    shards: dict[str, int], said: str
) -> None:
    # A worker opening a filter made before says it from the record (the startup line): it said
    # "growing 2x per generation" of a filter whose shards cannot grow at all.
    settings = {"BLOOMFILTER_CAPACITY": 10**9, "BLOOMFILTER_ERROR_RATE": 0.0001, **shards}
    config = BloomConfig.from_settings(settings)
    record = FilterRecord.new(config.spec, config.capacity, "capacity", expansion=config.expansion)
    assert said in record.describe() + record.growth_limit()
    native = FilterRecord.new(
        config.spec, config.capacity, "capacity", expansion=2, backend="native"
    )
    assert native.growth_limit() == ""  # (RedisBloom's own layers)
