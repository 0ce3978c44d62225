"""The blocked hashing scheme (``BLOOMFILTER_BLOCKED``, scheme 2) on real Redis.

Why: a blocked filter's bits are computed in several places (hashing.offsets for the hot
path's BITFIELD, the numpy snapshot kernel, the pure-Python BITFIELD chunks, and the Lua
scripts of growing and TTL filters, whose later generations reseed), and its sizing rests
on a rate formula of its own. A slip in any of them silently loses URLs or drops new ones.

What: the scheme against an independent re-implementation of the formula written in
hashing.py; the bits each path leaves in Redis (read back from the shard strings, after
their header) against that reference; elements added by one path answered "seen" by all
others; the false-positive rate of a full blocked filter against
``sizing.false_positive_rate`` (binomial bounds, as in test_generations.py); the setting,
the record (scheme 2) and the refusals; a cluster; and ``auto`` on a server with BF.*.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import mmh3
import pytest
import redis
from redis.cluster import RedisCluster
from test_bulk import calls
from test_generations import bloom_for, config, fingerprints, upper
from test_hashing import reference as reference_v1

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.core.errors import ConfigMismatchError
from scrapy_redis_bloom.core.generations import GENERATIONS_BIT, Generation
from scrapy_redis_bloom.core.hashing import (
    BLOCK_BITS,
    BLOCKED_SCHEME,
    CLASSIC_SCHEME,
    SCHEME_VERSION,
    WIDE,
    FilterSpec,
    distinct_bits,
    locate,
    offsets,
)
from scrapy_redis_bloom.core.layout import HEADER_BITS, HEADER_BYTES, meta_key, shard_key
from scrapy_redis_bloom.core.sizing import (
    BLOCKED_HEADROOM,
    Sizing,
    check_cost,
    false_positive_rate,
    filter_allocation,
    layout_costs,
    miss_share,
    optimal_bits,
    optimal_geometry,
)
from scrapy_redis_bloom.engine.backend import make_filter
from scrapy_redis_bloom.engine.bitmap import bulk
from scrapy_redis_bloom.engine.bitmap.local import HAVE_NUMPY

KEY = "blocked:bloomfilter"
B = BLOCK_BITS

needs_numpy = pytest.mark.skipif(not HAVE_NUMPY, reason="numpy (the numpy extra) is not installed")


def blocked(capacity: int, rate: float, **more: Any) -> BloomConfig:
    """Return the config of a blocked filter (see test_generations.config)."""
    return config(capacity, rate, BLOOMFILTER_BLOCKED=True, **more)


def lower(queries: int, rate: float) -> float:
    """Return the fewest false positives q new elements give at rate p, but for a 1e-9 chance."""
    return queries * rate - 6 * math.sqrt(queries * rate * (1 - rate))


# -- the scheme, written out independently ------------------------------------------------


def in_block(x: int, y: int, k: int) -> list[int]:
    """Return offset[i] of hashing.py's formula, term by term (y < B**2)."""
    return [
        (x - x % B) + (x % B + i * (y % B) + i * (i - 1) // 2 * (y // B) + (i**3 - i) // 6) % B
        for i in range(k)
    ]


def reference(element: bytes, shards: int, size: int, k: int) -> tuple[int, list[int]]:
    """Return (shard, offsets) of scheme 2 from its written description."""
    digest = mmh3.hash_bytes(element, 0)  # MurmurHash3_x64_128, seed 0
    h1 = int.from_bytes(digest[:8], "little")
    h2 = int.from_bytes(digest[8:], "little")
    return h1 % shards, in_block((h1 // shards) % size, h2 % B**2, k)


def expected(element: str, shards: int, gen: Generation, g: int) -> tuple[int, set[int]]:
    """Return an element's shard and bits in generation ``g`` of it.

    Generation 0 is the scheme itself; later ones take the seeds before the mod, cut to
    WIDE, modulo their own size (generations.seed_arguments).
    """
    digest = mmh3.hash_bytes(element.encode(), 0)
    h1 = int.from_bytes(digest[:8], "little")
    h2 = int.from_bytes(digest[8:], "little")
    q = h1 // shards
    x = q % gen.bits if g == 0 else q % WIDE % gen.bits
    return h1 % shards, set(in_block(x, h2 % WIDE % B**2, gen.hash_count))


def union(elements: list[str], shards: int, gen: Generation, g: int = 0) -> list[set[int]]:
    """Return, per shard, the bits the elements set in generation ``g``."""
    out: list[set[int]] = [set() for _ in range(shards)]
    for element in elements:
        shard, bits = expected(element, shards, gen, g)
        out[shard] |= bits
    return out


def bits_set(client: Any, key: str | bytes) -> set[int]:
    """Return the offsets of the bits set in a shard string, after its header."""
    raw = client.get(key)
    assert raw is not None, key
    body = raw[HEADER_BYTES:]
    return {8 * i + j for i, byte in enumerate(body) if byte for j in range(8) if byte & 0x80 >> j}


def shard_bits_set(client: Any, bloom: RedisBloomFilter, g: int = 0) -> list[set[int]]:
    """Return, per shard, the bits set in its generation ``g``."""
    return [bits_set(client, shard_key(bloom.key, s, g)) for s in range(bloom.spec.shards)]


# -- pure: the scheme, the spec, the sizing ----------------------------------------------------


@pytest.mark.parametrize(
    ("shards", "size", "k"), [(1, 2**26, 7), (16, 512, 13), (7, 512 * 187, 20)]
)
def test_blocked_offsets_follow_the_written_formula(shards: int, size: int, k: int) -> None:
    spec = FilterSpec(shards, size, k, B)
    for element in ["", "a" * 1000, "ünï", *fingerprints(500, "scheme")]:
        shard, x, y = locate(element, spec)
        got = offsets(x, y, k, size, B)
        assert (shard, got) == reference(element.encode(), shards, size, k)
        assert 0 <= y < B**2
        # One block: the one x falls in, inside the shard.
        assert {o // B for o in got} == {x // B}
        assert all(0 <= o < size for o in got)


def test_without_a_block_and_with_two_seeds_the_scheme_is_version_1() -> None:
    for element in fingerprints(300, "v1"):
        for shards, size, k in [(16, 2**26, 6), (7, 95_851, 13)]:
            shard, x, y = locate(element, FilterSpec(shards, size, k, two_seeds=True))
            expected_v1 = reference_v1(element.encode(), shards, size, k, SCHEME_VERSION)
            assert (shard, offsets(x, y, k, size, 0)) == expected_v1
    assert FilterSpec(1, 1024, 3, two_seeds=True).scheme == SCHEME_VERSION == 1
    assert FilterSpec(1, 1024, 3, B).scheme == BLOCKED_SCHEME == 2
    assert FilterSpec(1, 1024, 3).scheme == CLASSIC_SCHEME == 3
    with pytest.raises(ValueError, match="three seeds, not two"):
        FilterSpec(1, 1024, 3, B, two_seeds=True)


@needs_numpy
def test_the_snapshot_kernel_computes_the_same_blocked_offsets() -> None:
    from scrapy_redis_bloom.engine.bitmap.local import locate_many, offsets_many

    elements = fingerprints(3_000, "vector")
    for shards, size, k in [(1, 2**26, 7), (5, 512, 14), (3, 512 * 313, 30)]:
        spec = FilterSpec(shards, size, k, B)
        shard, x, y = locate_many(elements, spec)
        located = [locate(e, spec) for e in elements]
        assert list(zip(shard.tolist(), x.tolist(), y.tolist(), strict=True)) == located
        got = offsets_many(x, y, k, size, B).tolist()
        assert got == [
            [HEADER_BITS + o for o in offsets(sx, sy, k, size, B)] for _, sx, sy in located
        ]


def test_spec_refuses_other_blocks_and_partial_blocks() -> None:
    for block in (1, 256, 1024, -512):
        with pytest.raises(ValueError, match=f"a block has 512 bits .*got {block:,}"):
            FilterSpec(1, 512 * 4, 3, block)
    for size in (1000, 513, 511):
        with pytest.raises(ValueError, match="whole number of 512-bit blocks"):
            FilterSpec(2, size, 3, B)
    assert FilterSpec(2, 512 * 3, 3, B).bits == 2 * 1536
    assert FilterSpec(2, 1000, 3, 0).bits == 2000  # unblocked: any size


@pytest.mark.parametrize(
    ("capacity", "rate"), [(1_000, 1e-2), (50_000, 1e-3), (1_000_000, 1e-4), (3_000_000, 1e-5)]
)
def test_blocked_sizing_meets_the_rate_in_whole_blocks_with_more_bits(
    capacity: int, rate: float
) -> None:
    sizing = Sizing(capacity=capacity, error_rate=rate, blocked=True)
    spec = sizing.spec()
    assert (spec.block_bits, spec.scheme) == (B, 2)
    assert spec.shard_bits % B == 0
    assert false_positive_rate(spec.bits, spec.hash_count, capacity, B) <= rate
    # The least bits for its k: one block fewer misses the rate less the headroom.
    m, k = sizing.geometry()
    assert (m, k) == optimal_geometry(capacity, rate, B)
    assert m % B == 0
    aim = rate / BLOCKED_HEADROOM
    assert (
        false_positive_rate(m, k, capacity, B) <= aim < false_positive_rate(m - B, k, capacity, B)
    )
    # Blocks cost bits: more than the classic request gets, before and after sharding.
    plain = Sizing(capacity=capacity, error_rate=rate, blocked=False)
    assert m > optimal_bits(capacity, rate) == plain.geometry()[0]
    assert spec.bits > plain.spec().bits
    # Blocked is the default; the text says the layout only when it was asked for, so a
    # default request's text is the one classic filters were created with before.
    default = Sizing(capacity=capacity, error_rate=rate)
    assert default.spec() == spec
    assert sizing.canonical() == f"{default.canonical()} blocked=True"
    assert plain.canonical() == f"{default.canonical()} blocked=False"
    assert "blocked" not in default.canonical()
    for request in (sizing, plain, default):
        assert Sizing.parse(request.canonical()) == request


# -- what each layout costs ------------------------------------------------------------

#: Redis µs per check of a new fingerprint, measured on 2026-11-26 (bench/run.py --only t,
#: ratios to SADD at 1.6 µs): (layout, capacity, rate, measured low, high), growing filters.
MEASURED = [
    ("classic", 1_000_000, 1e-4, 2.3 * 1.6, 3.4 * 1.6),
    ("blocked", 1_000_000, 1e-4, 1.7 * 1.6, 2.0 * 1.6),
    ("classic", 100_000_000, 1e-4, 7.7, 8.3),
    ("blocked", 100_000_000, 1e-4, 4.3, 4.3),
    ("native", 100_000_000, 1e-4, 1.16 * 3.0, 1.16 * 3.1),
]


@pytest.mark.parametrize(("layout", "capacity", "rate", "low", "high"), MEASURED)
def test_the_cost_model_gives_the_measured_figures_within_15_percent(
    layout: str, capacity: int, rate: float, low: float, high: float
) -> None:
    costs = {c.layout: c for c in layout_costs(Sizing(capacity, rate, rate_share=0.5), capacity)}
    assert 0.85 * low <= costs[layout].check_us <= 1.15 * high


def test_the_cost_model_scales_with_size_and_k_as_documented() -> None:
    # Nothing missed in cache, nearly everything a hundred times past it.
    assert miss_share(2**20) == 0.0 < miss_share(2**22) < miss_share(2**28) < 1.0
    small, big = 2**20, 2**28
    # Classic: every one of k bits misses; blocked: one block whatever k.
    classic = [check_cost("classic", k, big) - check_cost("classic", k, small) for k in (6, 13)]
    blocked = [check_cost("blocked", k, big) - check_cost("blocked", k, small) for k in (6, 13)]
    assert classic[1] == pytest.approx(classic[0] * 13 / 6)
    assert blocked[1] == pytest.approx(blocked[0])
    assert all(check_cost("blocked", k, big) < check_cost("classic", k, big) for k in (6, 13))
    # A fixed-size filter's command has one field fewer.
    assert check_cost("classic", 6, big, growing=False) < check_cost("classic", 6, big)


@pytest.mark.parametrize("rate", [1e-3, 1e-4, 1e-6])
def test_each_layouts_memory_is_its_geometrys(rate: float) -> None:
    n = 100_000_000
    growing = config(n, rate)  # the default: growing, blocked
    costs = {c.layout: c for c in layout_costs(growing.sizing, n)}
    assert costs["blocked"].memory_bytes == filter_allocation(growing.spec)
    classic = config(n, rate, BLOOMFILTER_BLOCKED=False)
    assert costs["classic"].memory_bytes == filter_allocation(classic.spec)
    assert costs["classic"].hash_count == classic.spec.hash_count
    # Blocks cost memory, more as the rate falls: 9% at 1e-3, 18.5% at 1e-4, 42% at 1e-6
    # (where their seed floor, n / (m B**2), takes 10% of the rate).
    extra = costs["blocked"].memory_bytes / costs["classic"].memory_bytes - 1
    assert extra == pytest.approx({1e-3: 0.094, 1e-4: 0.185, 1e-6: 0.422}[rate], abs=0.005)
    # Each meets the rate generation 0 is sized for (half: it may grow).
    assert all(c.error_rate <= rate / 2 * 1.01 for c in costs.values())


@pytest.mark.parametrize(
    ("bits", "k", "items"), [(512 * 400, 7, 20_000), (512 * 2_000, 13, 50_000)]
)
def test_the_blocked_rate_is_the_poisson_mixture_over_block_loads(
    bits: int, k: int, items: int
) -> None:
    # Recomputed independently: pmf by recurrence, j far past any significant term; plus
    # the floor of an item of the block with the same three seeds (B**3 triples: (a, b, c)
    # give distinct offsets 0, 1, 2, so only the same triple shares all k).
    load = B * items / bits
    total, pmf = 0.0, math.exp(-load)
    for j in range(int(load + 60 * math.sqrt(load) + 200)):
        total += pmf * (1 - (1 - 1 / B) ** (k * j)) ** k
        pmf *= load / (j + 1)
    floor = load / B**3
    assert false_positive_rate(bits, k, items, B) == pytest.approx(total + floor, rel=1e-9)
    # Uneven block loads cost: above the unblocked rate of the same bits.
    assert total > false_positive_rate(bits, k, items)


@pytest.mark.timeout(10)
def test_a_heavy_block_load_is_summed_in_steps() -> None:
    """Past a load of 40,000 per block every step-th term counts, weighed by the step.

    Term by term, a capacity of 2**63 in a small filter took minutes: a record or setting
    with it hung ``info``, ``reset`` and a crawl's start. Here a block of 2**20 bits keeps
    the mixture unsaturated at a load of 10**6, and the sum is checked term by term.
    """
    block, k = 2**20, 1
    bits, items = 1_000 * block, 10**9
    load = block * items / bits
    width = 12 * math.sqrt(load) + 40
    total = 0.0
    for j in range(int(load - width), int(load + width) + 1):
        pmf = math.exp(j * math.log(load) - load - math.lgamma(j + 1))
        total += pmf * (1 - (1 - 1 / block) ** (k * j)) ** k
    floor = items / bits / block**2
    assert 0.5 < total < 0.7
    assert false_positive_rate(bits, k, items, block) == pytest.approx(total + floor, rel=1e-6)
    assert false_positive_rate(2**20, 5, 2**63 - 1, B) == 1.0  # at once, not in minutes


# -- the bits in Redis, path by path ---------------------------------------------------------


@pytest.mark.parametrize(
    ("settings_", "command"),
    [
        ({"BLOOMFILTER_EXPANSION": 0, "BLOOMFILTER_SHARDS": 3}, "bitfield"),
        ({"BLOOMFILTER_SHARDS": 3}, "bitfield"),  # growing, far below its limit
        # One shard of 1,000 items has no scriptless margin: the script's first generation.
        ({"BLOOMFILTER_SHARDS": 1}, "evalsha"),
    ],
    ids=["fixed", "growing", "script"],
)
def test_a_hot_path_check_sets_exactly_its_k_bits_in_one_block(
    redis_client: redis.Redis, settings_: dict[str, Any], command: str
) -> None:
    capacity = 1_000 if command == "evalsha" else 20_000
    bloom = bloom_for(redis_client, blocked(capacity, 1e-3, **settings_), KEY, cache_size=0)
    record = bloom.open()
    spec, gen = record.spec, record.growth.generation(0)
    redis_client.config_resetstat()
    elements = fingerprints(40, "hot")
    first = elements[0]
    assert bloom.check_and_add(first) is False
    shard, bits = expected(first, spec.shards, gen, 0)
    assert len({o // B for o in bits}) == 1
    key = shard_key(KEY, shard)
    assert [redis_client.getbit(key, HEADER_BITS + o) for o in sorted(bits)] == [1] * len(bits)
    assert redis_client.bitcount(key, HEADER_BYTES, -1) == len(bits)  # those, no others
    answers = [bloom.check_and_add(e) for e in elements[1:]]
    assert answers.count(True) <= upper(len(answers), 1e-3)
    assert shard_bits_set(redis_client, bloom) == union(elements, spec.shards, gen)
    other = "evalsha" if command == "bitfield" else "bitfield"
    assert calls(redis_client, command) >= len(elements)
    assert calls(redis_client, other) == 0


@pytest.mark.parametrize("kind", ["fixed", "growing"])
@pytest.mark.parametrize("path", ["snapshot", "pure"])
def test_add_many_sets_the_schemes_bits(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, kind: str, path: str
) -> None:
    if path == "pure":  # the BITFIELD or script path: no snapshot
        monkeypatch.setattr(bulk, "HAVE_NUMPY", False)
        monkeypatch.setattr(bulk, "SNAPSHOTS", False)
    elif not HAVE_NUMPY:
        pytest.skip("numpy (the numpy extra) is not installed")
    more = {"BLOOMFILTER_EXPANSION": 0} if kind == "fixed" else {}
    bloom = bloom_for(redis_client, blocked(20_000, 1e-3, BLOOMFILTER_SHARDS=2, **more), KEY)
    record = bloom.open()
    redis_client.config_resetstat()
    elements = fingerprints(1_500, "bulk")
    answers = bloom.add_many(elements)
    assert answers.count(True) <= upper(len(elements), 1e-3)
    gen = record.growth.generation(0)
    assert shard_bits_set(redis_client, bloom) == union(elements, record.spec.shards, gen)
    # The path taken: one snapshot of the two small shards together (one MULTI/EXEC on
    # their one server), or BITFIELD chunks / scripts.
    if path == "snapshot":
        assert calls(redis_client, "exec") == 1
    else:
        assert calls(redis_client, "exec") == 0
        assert calls(redis_client, "bitfield" if kind == "fixed" else "evalsha") > 0


def test_a_ttl_filter_keeps_the_schemes_bits_in_its_window(redis_client: redis.Redis) -> None:
    cfg = blocked(20_000, 1e-3, BLOOMFILTER_SHARDS=2, BLOOMFILTER_TTL=3_600)
    bloom = bloom_for(redis_client, cfg, KEY, cache_size=0)
    record = bloom.open()
    redis_client.config_resetstat()
    hot, many = fingerprints(30, "ttl-hot"), fingerprints(600, "ttl-bulk")
    assert [bloom.check_and_add(e) for e in hot].count(True) <= 1
    assert bloom.add_many(many).count(True) <= upper(len(many), 1e-3)
    spec, gen = record.spec, record.growth.generation(0)
    for shard, wanted in enumerate(union(hot + many, spec.shards, gen)):
        assert redis_client.strlen(shard_key(KEY, shard)) == HEADER_BYTES  # the anchor
        # (A window turning meanwhile splits the bits over two: their union is the same.)
        windows = redis_client.keys(f"{{{KEY}:{shard}}}:w*:g0")
        assert 1 <= len(windows) <= 2
        found: set[int] = set()
        for window in windows:
            found |= bits_set(redis_client, window)
        assert found == wanted
    # The script started the window; the bulk call read and wrote it in a transaction.
    assert calls(redis_client, "evalsha") > 0
    assert calls(redis_client, "exec") >= 1


def test_a_grown_shard_puts_new_bits_in_its_newest_generation(redis_client: redis.Redis) -> None:
    bloom = bloom_for(redis_client, blocked(200, 0.01, BLOOMFILTER_SHARDS=1), KEY, cache_size=0)
    growth = bloom.open().growth
    bloom.add_many(fingerprints(260, "fill"))  # generation 0 takes 200
    g0 = shard_key(KEY, 0)
    assert redis_client.bitfield(g0).get("u16", GENERATIONS_BIT).execute() == [2]
    gen = growth.generation(1)
    assert gen.bits % B == 0
    assert gen.bits != growth.generation(0).bits  # reseeded: x modulo another size
    g1 = shard_key(KEY, 0, 1)
    assert redis_client.strlen(g1) == HEADER_BYTES + gen.nbytes
    before_g0 = bits_set(redis_client, g0)
    # The hot path's script, one element at a time: exactly its bits, in generation 1.
    written = 0
    for element in fingerprints(25, "one"):
        before = bits_set(redis_client, g1)
        if bloom.check_and_add(element):
            continue  # a false positive: nothing written
        written += 1
        _, bits = expected(element, 1, gen, 1)
        assert bits <= bits_set(redis_client, g1)
        assert bits_set(redis_client, g1) - before <= bits
    # The bulk path's script, many per call.
    batch = fingerprints(60, "many")
    before = bits_set(redis_client, g1)
    new = [e for e, seen in zip(batch, bloom.add_many(batch), strict=True) if not seen]
    after = bits_set(redis_client, g1)
    wanted = union(new, 1, gen, 1)[0]
    assert wanted <= after
    assert after - before <= wanted
    assert written + len(new) >= 85 - upper(85, 0.01)
    assert bits_set(redis_client, g0) == before_g0  # the full generation is left alone


# -- cross-path agreement ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "more",
    [{"BLOOMFILTER_EXPANSION": 0}, {}, {"BLOOMFILTER_TTL": 3_600}],
    ids=["fixed", "growing", "ttl"],
)
def test_what_one_path_adds_every_other_path_finds(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, more: dict[str, Any]
) -> None:
    cfg = blocked(20_000, 1e-3, BLOOMFILTER_SHARDS=3, **more)
    vector = bloom_for(redis_client, cfg, KEY, cache_size=0)
    with monkeypatch.context() as patch:
        patch.setattr(bulk, "HAVE_NUMPY", False)
        plain = bloom_for(redis_client, cfg, KEY, cache_size=0)
    hot = fingerprints(300, "by-hot")
    by_vector, by_plain = fingerprints(2_000, "by-vector"), fingerprints(2_000, "by-plain")
    news = [not vector.check_and_add(e) for e in hot]
    news += [not seen for seen in vector.add_many(by_vector)]
    news += [not seen for seen in plain.add_many(by_plain)]
    assert news.count(False) <= upper(len(news), 1e-3)
    everything = hot + by_vector + by_plain
    assert vector.contains_many(everything) == [True] * len(everything)
    assert plain.contains_many(everything) == [True] * len(everything)
    # The hot path of a third worker (no near-cache) finds each, and adds nothing.
    third = bloom_for(redis_client, cfg, KEY, cache_size=0)
    assert [third.check_and_add(e) for e in everything[::7]] == [True] * len(everything[::7])
    strangers = fingerprints(3_000, "stranger")
    assert sum(vector.contains_many(strangers)) <= upper(len(strangers), 1e-3)
    assert plain.contains_many(strangers) == vector.contains_many(strangers)


def test_a_filter_grown_over_several_generations_finds_everything(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    rate = 0.01
    cfg = blocked(300, rate, BLOOMFILTER_SHARDS=2)
    bloom = bloom_for(redis_client, cfg, KEY, cache_size=0)
    members = fingerprints(6_000, "member")
    # Half through the hot path, half in bulk: the same generations.
    seen = [bloom.check_and_add(e) for e in members[:1_500]] + bloom.add_many(members[1_500:])
    assert sum(seen) <= upper(len(members), rate)
    assert bloom.generations >= 4
    with monkeypatch.context() as patch:
        patch.setattr(bulk, "HAVE_NUMPY", False)
        plain = bloom_for(redis_client, cfg, KEY, cache_size=0)
    assert bloom.contains_many(members) == [True] * len(members)
    assert plain.contains_many(members) == [True] * len(members)
    other = bloom_for(redis_client, cfg, KEY, cache_size=0)
    assert [other.check_and_add(e) for e in members[::11]] == [True] * len(members[::11])
    assert cfg.growth.rate_bound <= rate
    strangers = fingerprints(20_000, "stranger")
    assert sum(bloom.contains_many(strangers)) <= upper(len(strangers), rate)


# -- the false-positive rate -------------------------------------------------------------------


def _full(client: redis.Redis, capacity: int, rate: float) -> RedisBloomFilter:
    """Return a fixed-size blocked filter holding exactly ``capacity`` members."""
    cfg = blocked(capacity, rate, BLOOMFILTER_EXPANSION=0)
    bloom = bloom_for(client, cfg, KEY)
    bloom.add_many(fingerprints(capacity, "member"))
    return bloom


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("capacity", "rate", "queries"), [(50_000, 1e-2, 400_000), (50_000, 1e-3, 1_000_000)]
)
def test_a_full_blocked_filter_has_the_blocked_rate(
    redis_client: redis.Redis, capacity: int, rate: float, queries: int
) -> None:
    bloom = _full(redis_client, capacity, rate)
    spec = bloom.spec
    theory = false_positive_rate(spec.bits, spec.hash_count, capacity, B)
    assert theory <= rate
    # These bits unblocked would give far fewer: the bound tells the layouts apart.
    assert queries * false_positive_rate(spec.bits, spec.hash_count, capacity) < lower(
        queries, theory
    )
    hits = sum(bloom.contains_many(fingerprints(queries, "stranger")))
    assert lower(queries, theory) <= hits <= upper(queries, theory), (hits, queries * theory)


def test_the_state_of_a_full_blocked_filter_estimates_its_blocked_rate(
    redis_client: redis.Redis,
) -> None:
    capacity = 50_000
    bloom = _full(redis_client, capacity, 1e-3)
    spec = bloom.spec
    state = bloom.state()
    assert state.estimated_items == pytest.approx(capacity, rel=0.03)
    # What a new element meets: the blocked rate (the unblocked (X/S)**k is ~40% lower).
    theory = false_positive_rate(spec.bits, spec.hash_count, capacity, B)
    assert state.estimated_fpr == pytest.approx(theory, rel=0.1)


# -- the setting, the record -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "on"), [(True, True), (False, False), ("1", True), ("0", False), ("true", True)]
)
def test_the_setting_takes_booleans(value: object, on: bool) -> None:
    cfg = config(10_000, 1e-3, BLOOMFILTER_BLOCKED=value)
    assert cfg.sizing.blocked is on
    assert cfg.spec.block_bits == (B if on else 0)
    assert f"blocked={on}" in cfg.sizing.canonical()
    default = config(10_000, 1e-3)  # unset: blocked, and the text says nothing
    assert (default.sizing.blocked, default.spec.block_bits) == (None, B)
    assert "blocked" not in default.sizing.canonical()


def test_the_setting_refuses_anything_else_by_name() -> None:
    with pytest.raises(ValueError, match=r"BLOOMFILTER_BLOCKED setting \('maybe'\) is invalid"):
        config(10_000, 1e-3, BLOOMFILTER_BLOCKED="maybe")


def test_blocked_and_native_are_refused_together() -> None:
    with pytest.raises(ValueError, match=r"BLOOMFILTER_BLOCKED.*BLOOMFILTER_BACKEND"):
        blocked(10_000, 1e-3, BLOOMFILTER_BACKEND="native")
    for backend in ("bitmap", "auto"):
        assert blocked(10_000, 1e-3, BLOOMFILTER_BACKEND=backend).spec.block_bits == B


def test_the_record_says_scheme_2_and_other_schemes_are_refused(redis_client: redis.Redis) -> None:
    cfg = blocked(10_000, 1e-3)
    first = bloom_for(redis_client, cfg, KEY)
    first.add_many(fingerprints(100, "member"))
    stored = redis_client.hgetall(meta_key(KEY))
    assert stored[b"scheme"] == b"2"
    assert b"blocked=True" in stored[b"sizing"]
    assert int(stored[b"shard_bits"]) % B == 0
    # A second blocked worker adopts it and finds what the first added.
    second = bloom_for(redis_client, cfg, KEY)
    assert second.open().spec.block_bits == B
    assert second.contains_many(fingerprints(100, "member")) == [True] * 100
    # A classic worker with the same capacity and rate is refused, and told why.
    classic = config(10_000, 1e-3, BLOOMFILTER_BLOCKED=False)
    with pytest.raises(ConfigMismatchError, match="blocked"):
        bloom_for(redis_client, classic, KEY).open()
    # And the other way round.
    bloom_for(redis_client, classic, "plain").open()
    assert redis_client.hget(meta_key("plain"), "scheme") == b"3"
    with pytest.raises(ConfigMismatchError, match="blocked"):
        bloom_for(redis_client, cfg, "plain").open()


def test_a_scheme_1_filter_of_an_earlier_build_keeps_its_bits_and_says_its_floor(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # A classic filter as earlier builds created it: hash scheme 1, two seeds. Small, so
    # that its floor (30 items in 1,152 bits: 30 / 1,152**2 = 2.3e-5) passes its rate.
    asked = config(30, 1e-6, BLOOMFILTER_BLOCKED=False)
    old = dataclasses.replace(asked, spec=dataclasses.replace(asked.spec, two_seeds=True))
    first = bloom_for(redis_client, old, "old")
    members = fingerprints(30, "member")
    assert first.add_many(members) == [False] * 30
    assert redis_client.hget(meta_key("old"), "scheme") == b"1"
    # Its bits are scheme 1's, as the written scheme computes them.
    spec = first.spec
    assert spec.two_seeds
    assert spec.shards == 1
    want = {
        o
        for e in members
        for o in reference_v1(e.encode(), 1, spec.shard_bits, spec.hash_count, SCHEME_VERSION)[1]
    }
    raw = redis_client.get(shard_key("old", 0)) or b""
    got = {
        i - HEADER_BITS for i in range(HEADER_BITS, 8 * len(raw)) if raw[i // 8] & (0x80 >> i % 8)
    }
    assert got == want
    # A worker of this build opens it as it is, finds every member, and says the floor.
    caplog.clear()
    worker = bloom_for(redis_client, asked, "old")
    assert worker.open().spec == spec
    assert worker.contains_many(members) == [True] * 30
    floor = 30 / spec.shard_bits**2
    assert worker.events.values["rate_floor"] == pytest.approx(floor)
    (said,) = [r for r in caplog.records if r.levelname == "WARNING"]
    text = said.getMessage()
    assert "hash scheme 1" in text
    assert f"cannot go below {floor:.3g}" in text
    assert "reset --key 'old'" in text
    # A new classic filter of the same request has scheme 3, and no floor to say.
    caplog.clear()
    new = bloom_for(redis_client, asked, "new")
    assert new.add_many(members) == [False] * 30
    assert redis_client.hget(meta_key("new"), "scheme") == b"3"
    assert new.spec.geometry == spec.geometry
    assert new.spec.seed_range == spec.shard_bits**2
    assert "rate_floor" not in new.events.values
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    for bloom in (first, worker, new):
        bloom.close()


def test_a_default_worker_keeps_a_classic_filter_and_creates_blocked_ones(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # A classic filter, as every filter was before blocked became the default.
    classic = config(10_000, 1e-3, BLOOMFILTER_BLOCKED=False)
    first = bloom_for(redis_client, classic, "plain")
    first.add_many(fingerprints(100, "member"))
    before = redis_client.hgetall(meta_key("plain"))
    assert before[b"scheme"] == b"3"
    # A worker with the default settings opens it with one INFO line, keeping its layout.
    default = config(10_000, 1e-3)
    assert default.spec.block_bits == B
    caplog.set_level("INFO")
    worker = bloom_for(redis_client, default, "plain")
    assert worker.open().spec == first.spec
    assert worker.spec.block_bits == 0
    assert worker.contains_many(fingerprints(100, "member")) == [True] * 100
    said = [r for r in caplog.records if r.name.startswith("scrapy_redis_bloom")]
    assert [r.levelname for r in said if r.levelno >= 20] == ["INFO"]
    assert "keeps the classic (unblocked) layout" in said[0].getMessage()
    assert redis_client.hgetall(meta_key("plain")) == before  # nothing rewritten
    # A new filter of the default settings is blocked; its text names no layout, so a
    # worker asking for blocked filters adopts it and one asking for classic is refused.
    fresh = bloom_for(redis_client, default, KEY)
    assert fresh.open().spec.block_bits == B
    stored = redis_client.hgetall(meta_key(KEY))
    assert stored[b"scheme"] == b"2"
    assert b"blocked" not in stored[b"sizing"]
    assert bloom_for(redis_client, blocked(10_000, 1e-3), KEY).open().spec == fresh.spec
    with pytest.raises(ConfigMismatchError, match="blocked"):
        bloom_for(redis_client, classic, KEY).open()
    for bloom in (first, worker, fresh):
        bloom.close()


# -- topologies and backends -------------------------------------------------------------------


def test_a_blocked_filter_on_a_cluster_answers_as_on_one_server(
    redis_cluster: RedisCluster, redis_client: redis.Redis
) -> None:
    cfg = blocked(20_000, 1e-3, BLOOMFILTER_SHARDS=6)
    members, strangers = fingerprints(2_000, "member"), fingerprints(2_000, "stranger")
    answers: list[tuple[list[bool], list[bool], list[set[int]]]] = []
    for client in (redis_cluster, redis_client):
        bloom = bloom_for(client, cfg, KEY)
        added = [bloom.check_and_add(e) for e in members[:200]] + bloom.add_many(members[200:])
        assert bloom.contains_many(members) == [True] * len(members)
        fresh = bloom.contains_many(strangers)
        assert sum(fresh) <= upper(len(strangers), 1e-3)
        answers.append((added, fresh, shard_bits_set(client, bloom)))
        bloom.close()
    assert answers[0] == answers[1]  # the same answers and the same bits


def test_auto_makes_a_new_blocked_filter_a_bitmap_one_on_a_bloom_server(
    bloom_redis_client: redis.Redis,
) -> None:
    # The control: the default layout, where auto picks the server's BF.* filters,
    # sized unblocked (blocks are the bitmap backend's default, not a reason to pick it).
    native = make_filter(bloom_redis_client, "plain", config(10_000, 1e-3))
    assert native.backend == "native"
    assert native.open().spec.block_bits == 0
    assert bloom_redis_client.hget(meta_key("plain"), "scheme") == b"1"
    cfg = blocked(10_000, 1e-3, BLOOMFILTER_BACKEND="auto")
    bloom = make_filter(bloom_redis_client, KEY, cfg)
    assert isinstance(bloom, RedisBloomFilter)
    assert bloom.backend == "bitmap"
    elements = fingerprints(500, "member")
    assert bloom.add_many(elements).count(True) <= upper(len(elements), 1e-3)
    assert bloom.contains_many(elements) == [True] * len(elements)
    stored = bloom_redis_client.hgetall(meta_key(KEY))
    assert (stored[b"backend"], stored[b"scheme"]) == (b"bitmap", b"2")
    types = {bloom_redis_client.type(name) for name in bloom_redis_client.keys(f"*{KEY}*")}
    assert types == {b"hash", b"string"}  # the record and counters, and bitmaps: no BF.*
    # A later worker under auto adopts the record's backend.
    again = make_filter(bloom_redis_client, KEY, cfg)
    assert again.backend == "bitmap"
    assert again.contains_many(elements) == [True] * len(elements)
    native.close()
    bloom.close()
    again.close()


def test_distinct_bits_per_element_match_the_scheme() -> None:
    # The first-order formula against the offsets themselves, over every (y, z) of a
    # smaller block (the same arithmetic as 512 bits, enumerable).
    for k, block in ((13, 64), (6, 128), (9, 32)):
        total = 0
        for y in range(block * block):
            total += len(set(offsets(0, y, k, block * 8, block)))
        exact = total / (block * block)
        assert distinct_bits(k, block) == pytest.approx(exact, rel=0.02)
