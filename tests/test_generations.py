"""The geometry of a growing filter's generations: pure numbers, checked against the math."""

from __future__ import annotations

import math

import pytest
import redis

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.engine import layout
from scrapy_redis_bloom.engine.generations import (
    MAX_GENERATIONS,
    Growth,
    growing_script_source,
    wide_seeds,
)
from scrapy_redis_bloom.hashing import FilterSpec, locate
from scrapy_redis_bloom.sizing import false_positive_rate, optimal_bits


def growth(capacity: int, rate: float, expansion: int = 2) -> Growth:
    """Return the growth plan of a filter sized, as it must be, for p (1 - r) at first."""
    config = BloomConfig.from_settings(
        {"BLOOMFILTER_CAPACITY": capacity, "BLOOMFILTER_ERROR_RATE": rate * 0.5}
    )
    return Growth(config.spec, capacity, rate, expansion)


@pytest.mark.parametrize(("capacity", "rate"), [(10_000, 1e-3), (1_000_000, 1e-4)])
def test_the_compound_rate_stays_under_the_configured_one(capacity: int, rate: float) -> None:
    plan = growth(capacity, rate)
    assert plan.generation(0).error_rate <= plan.base_rate * 1.05  # sizing rounds up bits
    for g in range(1, MAX_GENERATIONS):
        assert plan.compound_rate(g) <= rate * 1.05


def test_each_generation_takes_e_times_the_items_at_r_times_the_rate() -> None:
    plan = growth(1_000_000, 1e-4)
    first = plan.generation(1)
    for g in range(2, 8):
        gen = plan.generation(g)
        assert gen.capacity == first.capacity * 2 ** (g - 1)
        assert gen.error_rate == pytest.approx(first.error_rate * 0.5 ** (g - 1))
        assert gen.hash_count == math.ceil(math.log2(1 / gen.error_rate))
        # Its own bits hold its items at its rate (the optimum, rounded up).
        assert false_positive_rate(gen.bits, gen.hash_count, gen.capacity) <= gen.error_rate * 1.1


def test_no_growth_has_generation_0_only() -> None:
    plan = growth(10_000, 1e-3, expansion=0)
    assert plan.last == 0
    assert plan.base_rate == 1e-3
    with pytest.raises(ValueError, match="generations 0 to 0"):
        plan.generation(1)


def test_a_growing_shard_in_redis_grows_forgets_nothing_and_keeps_its_rate(
    redis_client: redis.Redis,
) -> None:
    # One shard sized for 1,000 items at 0.5% (p (1 - r) for p = 1%), grown 20x past it.
    spec = FilterSpec(shards=1, shard_bits=optimal_bits(1_000, 0.005), hash_count=8)
    plan = Growth(spec, 1_000, 0.01)
    bloom = RedisBloomFilter(redis_client, "grow", spec, 1_000)
    bloom.open()
    assert bloom.record is not None
    identity = layout.identity(bloom.record.filter_id, 0, spec.hash_count)
    script = redis_client.register_script(growing_script_source(plan))

    def add(element: str) -> tuple[int, int]:
        _, x, y = locate(element, 1, spec.shard_bits)
        wx, wy = wide_seeds(element, 1)
        answer, generations = script(keys=["{grow:0}:g0"], args=[identity, x, y, wx, wy])
        return int(answer), int(generations)

    elements = [f"{i:040x}" for i in range(20_000)]
    first = [add(e) for e in elements]
    generations = first[-1][1]
    # 1,000 + 2,000 + 4,000 + 8,000 + ... : 20,000 items need 5 generations.
    assert generations == 5
    assert redis_client.exists(*(f"{{grow:0}}:g{g}" for g in range(5))) == 5
    # No false negative: every element added is seen, whatever generation holds it.
    assert all(add(e)[0] == 1 for e in elements)
    # New elements are taken for seen at most at the configured rate (binomial bound).
    fresh = [add(f"fresh{i:035x}") for i in range(20_000)]
    false_positives = sum(answer for answer, _ in fresh)
    expected = 0.01 * len(fresh)
    assert false_positives <= expected + 4 * math.sqrt(expected)
    bloom.close()
