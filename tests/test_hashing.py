"""The hashing scheme (version 1) as the README writes it down."""

from __future__ import annotations

import math

import mmh3
import pytest

from scrapy_redis_bloom.core.hashing import SCHEME_VERSION, FilterSpec, locate, offsets

FP = "27adcc2e8979cdee0c9cecbbe8bf8ff51edefb61"


def reference(element: bytes, shards: int, size: int, k: int) -> tuple[int, list[int]]:
    """Re-implement the scheme from its written description, independently."""
    digest = mmh3.hash_bytes(element, 0)  # MurmurHash3_x64_128, seed 0
    h1 = int.from_bytes(digest[:8], "little")
    h2 = int.from_bytes(digest[8:], "little")
    shard, x, y = h1 % shards, (h1 // shards) % size, h2 % size
    result = [x]
    for i in range(1, k):
        x = (x + y) % size
        y = (y + i) % size
        result.append(x)
    return shard, result


@pytest.mark.parametrize(("shards", "size", "k"), [(1, 2**32, 7), (16, 2**26, 6), (7, 95_851, 13)])
def test_locate_and_offsets_follow_the_written_scheme(shards: int, size: int, k: int) -> None:
    for element in (FP, "", "a" * 1000, "ünï"):
        shard, x, y = locate(element, shards, size)
        assert (shard, offsets(x, y, k, size)) == reference(element.encode(), shards, size, k)


def test_scheme_version_1_is_frozen() -> None:
    # Bits already in users' Redis depend on these numbers: changing them needs a new
    # SCHEME_VERSION, so that old filters are refused rather than misread.
    assert SCHEME_VERSION == 1
    shard, x, y = locate(FP, 16, 2**26)
    assert (shard, x, y) == (1, 4775582, 58773813)
    assert offsets(x, y, 6, 2**26) == [4775582, 63549395, 55214345, 46879297, 38544252, 30209211]
    # A str element hashes as its UTF-8 bytes (ASCII for a hex fingerprint).
    assert locate(FP.encode(), 16, 2**26) == (shard, x, y)
    assert locate("abc", 1, 2**32) == (0, 13012657714217449575 % 2**32, 4297124817637354834 % 2**32)


def test_offsets_stay_inside_the_shard() -> None:
    for i in range(2000):
        shard, x, y = locate(f"{i:040x}", 5, 1000)
        assert 0 <= shard < 5
        assert all(0 <= o < 1000 for o in offsets(x, y, 20, 1000))


def test_shards_are_chosen_uniformly() -> None:
    n, shards = 100_000, 16
    counts = [0] * shards
    for i in range(n):
        counts[locate(f"https://example.com/{i}", shards, 2**26)[0]] += 1
    # Each count is Binomial(n, 1/16): allow 6 standard deviations.
    sigma = math.sqrt(n * (1 / shards) * (1 - 1 / shards))
    assert all(abs(c - n / shards) <= 6 * sigma for c in counts), counts


def test_spec_refuses_impossible_geometry() -> None:
    with pytest.raises(ValueError, match=r"1 to 4,294,967,040 bits"):
        FilterSpec(shards=1, shard_bits=2**32 + 1, hash_count=3)
    with pytest.raises(ValueError, match="1 to 4,194,304 shards, got 0"):
        FilterSpec(shards=0, shard_bits=8, hash_count=3)
    with pytest.raises(ValueError, match="1 to 4,194,304 shards, got 4,194,305"):
        FilterSpec(shards=2**22 + 1, shard_bits=8, hash_count=3)
    with pytest.raises(ValueError, match="1 to 64 hash functions, got 0"):
        FilterSpec(shards=1, shard_bits=8, hash_count=0)
    with pytest.raises(ValueError, match="1 to 64 hash functions, got 100,000,000"):
        FilterSpec(shards=1, shard_bits=8, hash_count=100_000_000)
    spec = FilterSpec(shards=3, shard_bits=1001, hash_count=2)
    assert (spec.bits, spec.shard_bytes, spec.total_bytes) == (3003, 126, 378)
