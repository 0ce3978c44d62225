"""The geometry of a growing filter's generations: pure numbers, checked against the math."""

from __future__ import annotations

import math

import pytest

from scrapy_redis_bloom import BloomConfig
from scrapy_redis_bloom.engine.generations import MAX_GENERATIONS, Growth
from scrapy_redis_bloom.sizing import false_positive_rate


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
