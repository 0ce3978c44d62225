"""The hashing schemes (versions 1 and 3, classic) as docs/explanation/hashing.md writes them."""

from __future__ import annotations

import math
import random

import mmh3
import pytest

from scrapy_redis_bloom.core.hashing import (
    CLASSIC_SCHEME,
    SCHEME_VERSION,
    FilterSpec,
    locate,
    offsets,
)
from scrapy_redis_bloom.core.sizing import false_positive_rate

FP = "27adcc2e8979cdee0c9cecbbe8bf8ff51edefb61"


def reference(
    element: bytes, shards: int, size: int, k: int, scheme: int = CLASSIC_SCHEME
) -> tuple[int, list[int]]:
    """Re-implement a classic scheme from its written description, independently."""
    digest = mmh3.hash_bytes(element, 0)  # MurmurHash3_x64_128, seed 0
    h1 = int.from_bytes(digest[:8], "little")
    h2 = int.from_bytes(digest[8:], "little")
    shard, x = h1 % shards, (h1 // shards) % size
    if scheme == SCHEME_VERSION:
        y, c = h2 % size, 0
    else:
        y = h2 % (size * min(size, 2**52 // size))
        y, c = y % size, y // size
    result = [x]
    for i in range(1, k):
        x = (x + y) % size
        y = (y + i + c) % size
        result.append(x)
    return shard, result


@pytest.mark.parametrize("scheme", [SCHEME_VERSION, CLASSIC_SCHEME])
@pytest.mark.parametrize(
    ("shards", "size", "k"), [(1, 2**32 - 256, 7), (16, 2**26, 6), (7, 95_851, 13), (3, 40, 9)]
)
def test_locate_and_offsets_follow_the_written_scheme(
    shards: int, size: int, k: int, scheme: int
) -> None:
    spec = FilterSpec(shards, size, k, two_seeds=scheme == SCHEME_VERSION)
    assert spec.scheme == scheme
    for element in (FP, "", "a" * 1000, "ünï"):
        shard, x, y = locate(element, spec)
        got = shard, offsets(x, y, k, size)
        assert got == reference(element.encode(), shards, size, k, scheme)


def test_the_classic_schemes_are_frozen() -> None:
    # Bits already in users' Redis depend on these numbers: changing them needs a new
    # scheme version, so that old filters are refused rather than misread.
    assert (SCHEME_VERSION, CLASSIC_SCHEME) == (1, 3)
    old = FilterSpec(16, 2**26, 6, two_seeds=True)
    shard, x, y = locate(FP, old)
    assert (shard, x, y) == (1, 4775582, 58773813)
    assert offsets(x, y, 6, 2**26) == [4775582, 63549395, 55214345, 46879297, 38544252, 30209211]
    # A str element hashes as its UTF-8 bytes (ASCII for a hex fingerprint).
    assert locate(FP.encode(), old) == (shard, x, y)
    one = FilterSpec(1, 2**32 - 256, 3, two_seeds=True)
    assert locate("abc", one) == (
        0,
        13012657714217449575 % one.shard_bits,
        4297124817637354834 % one.shard_bits,
    )
    new = FilterSpec(16, 2**26, 6)
    shard, x, y = locate(FP, new)
    assert (shard, x, y) == (1, 4775582, 731955700224309)
    assert offsets(x, y, 6, 2**26) == [4775582, 63549395, 66121334, 12491400, 36877322, 5061373]


def fill_and_probe(spec: FilterSpec, items: int, probes: int) -> tuple[float, int]:
    """Add ``items`` random elements to a one-shard filter in memory, probe new ones.

    Returns the share of bits set and how many of the probes read as seen.
    """
    rng = random.Random(f"{spec.scheme}/{spec.shard_bits}")
    k, size = spec.hash_count, spec.shard_bits
    bits: set[int] = set()
    for _ in range(items):
        _, x, y = locate(rng.randbytes(20).hex(), spec)
        bits.update(offsets(x, y, k, size))
    false = 0
    for _ in range(probes):
        _, x, y = locate(rng.randbytes(20).hex() + "new", spec)
        false += all(o in bits for o in offsets(x, y, k, size))
    return len(bits) / size, false


def poisson_tail(mean: float, count: int) -> float:
    """P(Poisson(mean) >= count) for count >= 1, or P(... <= -count) for count <= 0."""
    if count <= 0:
        return sum(math.exp(-mean) * mean**j / math.factorial(j) for j in range(-count + 1))
    return 1 - sum(math.exp(-mean) * mean**j / math.factorial(j) for j in range(count))


def test_a_small_classic_filter_keeps_the_rate_it_was_sized_for() -> None:
    # Scheme 1 seeds an element's k offsets with (x, y), S**2 pairs: a new element takes
    # the pair of one of the n stored with probability n / S**2, a floor under the rate
    # (6x the design rate here). Scheme 3 adds a seed: n / S**3, under a fiftieth of it.
    # Each count must fall in its Poisson bounds with the floor, which the other
    # scheme's floor would miss (scheme 1 without it: mean 3.6 where 26 are counted).
    # A filter at its capacity, 20 items in 512 bits with k = 10; 300,000 probes.
    items, probes = 20, 300_000
    for scheme in (SCHEME_VERSION, CLASSIC_SCHEME):
        spec = FilterSpec(1, 512, 10, two_seeds=scheme == SCHEME_VERSION)
        filled, false = fill_and_probe(spec, items, probes)
        # Offsets of distinct pairs are nearly independent: filled**k, plus the floor.
        floor = items / spec.shard_bits / spec.seed_range
        mean = probes * (filled**spec.hash_count + floor)
        design = false_positive_rate(spec.shard_bits, spec.hash_count, items)
        # Each count within its Poisson bounds at 1e-6 either way.
        assert poisson_tail(mean, false) > 1e-6, (scheme, false, mean)
        assert poisson_tail(mean, -false) > 1e-6, (scheme, false, mean)
        if scheme == SCHEME_VERSION:
            assert floor > 5 * design
        else:
            assert floor < design / 50


def test_offsets_stay_inside_the_shard() -> None:
    spec = FilterSpec(5, 1000, 20)
    for i in range(2000):
        shard, x, y = locate(f"{i:040x}", spec)
        assert 0 <= shard < 5
        assert all(0 <= o < 1000 for o in offsets(x, y, 20, 1000))


def test_shards_are_chosen_uniformly() -> None:
    n, shards = 100_000, 16
    counts = [0] * shards
    spec = FilterSpec(shards, 2**26, 6)
    for i in range(n):
        counts[locate(f"https://example.com/{i}", spec)[0]] += 1
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
