"""The hashing scheme's two copies, Python and Lua, give the same bits for every scheme.

The Lua copy (``engine/lua/scheme.lua``, with the generation seeds of
``engine/lua/check_and_add.lua``) runs in a real redis-server through a small wrapper
that returns the offsets instead of touching bits; the Python copy is
:func:`scrapy_redis_bloom.core.hashing.offsets` with the seeds
:func:`scrapy_redis_bloom.core.generations.seed_arguments` sends. Classic and blocked
layouts, several k and shard sizes, every generation a shard may grow.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import mmh3
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.core.generations import Generation, Growth, seed_arguments
from scrapy_redis_bloom.core.hashing import (
    BLOCK_BITS,
    MAX_HASH_COUNT,
    MAX_SHARD_BITS,
    WIDE,
    FilterSpec,
    locate,
    offsets,
)
from scrapy_redis_bloom.core.layout import HEADER_BITS
from scrapy_redis_bloom.engine import scripts

#: The wrapper's body: for generation ARGV[4], the offsets of each element whose four
#: seeds follow, by the scripts' own functions (ARGV[1..3] as a check's: unused here).
WRAPPER = """
local g, out = tonumber(ARGV[4]), {}
for e = 5, #ARGV, 4 do
  local x, y = seeds(g, e)
  offsets(x, y, K[g + 1], B[g + 1], H, at)
  for i = 1, K[g + 1] do out[#out + 1] = at[i] end
end
return out
"""

#: Geometries: (shards, shard bits, k, scheme), from the smallest to the largest shard, in
#: each scheme: 3 (classic), 2 (blocked), 1 (classic with two seeds, of earlier builds).
SCHEMES = [
    (1, 1, 1, 3),
    (3, 1_000, 7, 3),
    (16, 2**20 + 7, 14, 3),
    (2, 2**27 + 3, 9, 3),
    (5, MAX_SHARD_BITS, MAX_HASH_COUNT, 3),
    (1, BLOCK_BITS, 1, 2),
    (7, BLOCK_BITS * 9, 6, 2),
    (16, BLOCK_BITS * 4096, 13, 2),
    (3, MAX_SHARD_BITS - MAX_SHARD_BITS % BLOCK_BITS, 30, 2),
    (1, 1, 1, 1),
    (3, 1_000, 7, 1),
    (5, MAX_SHARD_BITS, MAX_HASH_COUNT, 1),
]


def growth_of(shards: int, bits: int, k: int, scheme: int, expansion: int = 2) -> Growth:
    spec = FilterSpec(shards, bits, k, BLOCK_BITS if scheme == 2 else 0, two_seeds=scheme == 1)
    assert spec.scheme == scheme
    return Growth(spec, capacity=max(1, bits // (4 * k)) * shards, expansion=expansion)


def wrapper(growth: Growth) -> str:
    """Return a script that reports the offsets the check-and-add scripts compute."""
    return (
        scripts.LAYOUT
        + scripts.lua("scheme")
        + scripts.geometry(growth)
        + scripts.lua("check_and_add")
        + WRAPPER
    )


def seeds_sent(h1: int, h2: int, spec: FilterSpec) -> list[bytes]:
    """Return the four seeds a check sends for an element, read back from their RESP."""
    packed = seed_arguments(h1, h2, spec.shards, spec.shard_bits, spec.seed_range)
    return packed.split(b"\r\n")[1::2]


def python_offsets(element: bytes, growth: Growth, g: int) -> list[int]:
    """Return the Python copy's offsets of an element in generation g of its shard."""
    spec, gen = growth.spec, growth.generation(g)
    if g == 0:
        _, x, y = locate(element, spec)
    else:
        # A later generation: the wide seeds reduced by its own size (seed_arguments).
        h1, h2 = hash_of(element)
        x, y = h1 // spec.shards % WIDE % gen.bits, h2 % WIDE % gen.seed_range
    return offsets(x, y, gen.hash_count, gen.bits, gen.block_bits, HEADER_BITS)


def hash_of(element: bytes) -> tuple[int, int]:
    h1, h2 = mmh3.hash64(element, seed=0, x64arch=True, signed=False)
    return h1, h2


def lua_offsets(
    client: redis.Redis, growth: Growth, g: int, elements: Sequence[bytes]
) -> list[list[int]]:
    """Return the Lua copy's offsets of each element in generation g, from one script call."""
    args: list[Any] = [b"", b"r", b"0", g]
    for element in elements:
        args += seeds_sent(*hash_of(element), growth.spec)
    flat = client.eval(wrapper(growth), 1, "scheme:probe", *args)
    k = growth.generation(g).hash_count
    return [list(flat[i * k : (i + 1) * k]) for i in range(len(elements))]


def fingerprints(n: int, tag: str) -> list[bytes]:
    return [hashlib.sha1(f"{tag}-{i}".encode()).hexdigest().encode() for i in range(n)]


@pytest.mark.parametrize(("shards", "bits", "k", "scheme"), SCHEMES)
def test_lua_and_python_give_the_same_bits_in_every_generation(
    redis_client: redis.Redis, shards: int, bits: int, k: int, scheme: int
) -> None:
    growth = growth_of(shards, bits, k, scheme)
    elements = fingerprints(300, f"{shards}-{bits}-{k}")
    for g in range(growth.last + 1):
        want = [python_offsets(element, growth, g) for element in elements]
        assert lua_offsets(redis_client, growth, g, elements) == want, g


def test_the_schemes_cover_growth_and_both_layouts() -> None:
    """The table above reaches late generations, in every scheme, up to the largest k.

    And seeds past 2**53 nowhere: a scheme-3 shard of more than 2**26 bits takes its
    seeds modulo :data:`WIDE`, which Lua's doubles hold exactly.
    """
    grown = [growth_of(*scheme) for scheme in SCHEMES]
    assert max(growth.last for growth in grown) >= 8
    assert {growth.spec.scheme for growth in grown} == {1, 2, 3}
    ranges = [gen.seed_range for growth in grown for gen in growth.generations]
    assert WIDE // 2 < max(ranges) <= WIDE
    last: list[Generation] = [growth.generation(growth.last) for growth in grown]
    assert max(gen.hash_count for gen in last) == MAX_HASH_COUNT


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    elements=st.lists(st.binary(min_size=0, max_size=64), min_size=1, max_size=20),
    scheme=st.sampled_from(SCHEMES),
    k=st.integers(1, MAX_HASH_COUNT),
    expansion=st.sampled_from([0, 2, 3]),
    generation=st.integers(0, 15),
)
def test_any_element_gets_the_same_bits_in_lua_and_python(
    redis_client: redis.Redis,
    elements: list[bytes],
    scheme: tuple[int, int, int, int],
    k: int,
    expansion: int,
    generation: int,
) -> None:
    shards, bits, _, version = scheme
    growth = growth_of(shards, bits, k, version, expansion)
    g = min(generation, growth.last)
    want = [python_offsets(element, growth, g) for element in elements]
    assert lua_offsets(redis_client, growth, g, elements) == want


@pytest.mark.parametrize("blocked", [False, True])
@pytest.mark.parametrize("ttl", [0, 60])
def test_the_scripts_set_exactly_the_python_bits(
    redis_client: redis.Redis, blocked: bool, ttl: int
) -> None:
    """End to end: a shard's bits after checks through the real script are Python's.

    Without a TTL a small growing filter checks through the first generation's shortcut
    (``first_generation.lua``); with one, through the windows and ``one.lua``.
    """
    cfg = BloomConfig.from_settings(
        {
            "BLOOMFILTER_CAPACITY": 400,
            "BLOOMFILTER_ERROR_RATE": 1e-3,
            "BLOOMFILTER_SHARDS": 1,
            "BLOOMFILTER_EXPANSION": 2,
            "BLOOMFILTER_BLOCKED": blocked,
            "BLOOMFILTER_TTL": ttl,
        }
    )
    bloom = RedisBloomFilter.from_config(redis_client, "scheme:bits", cfg, cache_size=0)
    elements = fingerprints(150, f"bits-{blocked}-{ttl}")
    assert not any(bloom.check_and_add(element) for element in elements)
    growth = bloom.record.growth if bloom.record else cfg.growth
    want = {o for element in elements for o in python_offsets(element, growth, 0)}
    # Where the bits are: the shard, or its window (two, should a minute begin meanwhile).
    keys = redis_client.keys("{scheme:bits:0}:w*:g0") if ttl else [b"{scheme:bits:0}:g0"]
    got = set()
    for key in keys:
        data = redis_client.get(key) or b""
        assert isinstance(data, bytes)
        got |= {i for i in range(HEADER_BITS, 8 * len(data)) if data[i // 8] & (0x80 >> (i % 8))}
    assert keys
    assert got == want
    bloom.clear()
    bloom.close()
