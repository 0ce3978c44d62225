"""How a filter's shards grow and forget: generations and re-crawl windows.

Pure functions of the config record, so every worker and the scripts compute the same
numbers (docs/explanation/growth.md). The rates leave out the seed floor (``floor=False``)
so that the generations of filters created before it was counted keep their sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from scrapy_redis_bloom.core.hashing import (
    MAX_HASH_COUNT,
    MAX_SHARD_BITS,
    WIDE,
    FilterSpec,
    distinct_bits,
    seed_range,
)
from scrapy_redis_bloom.core.sizing import false_positive_rate, optimal_bits, optimal_geometry

#: Most generations a shard may have (fewer past a Redis string's size, :attr:`Growth.last`).
MAX_GENERATIONS = 16
#: RedisBloom's default tightening ratio of the error rate per generation.
DEFAULT_TIGHTENING = 0.5
#: Default expansion: each generation takes twice the items of the one before.
DEFAULT_EXPANSION = 2
#: Most items a generation may take: the script counts them in a u32 of the header.
MAX_GENERATION_ITEMS = 2**32 - 1

#: Bit offsets of a header's state: generations (u16; 0 reads as 1), the newest one's items
#: (u32); in a TTL anchor, whether the window before existed (u16), the newest window (u32).
GENERATIONS_BIT = 208
COUNT_BIT = 224


@dataclass(frozen=True, slots=True)
class Generation:
    """One generation of a shard: items, bits, hash functions, error rate, and the scheme."""

    capacity: int
    bits: int
    hash_count: int
    error_rate: float
    block_bits: int = 0
    two_seeds: bool = False
    #: Set once: every check of a grown or windowed shard reads it.
    seed_range: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "seed_range", seed_range(self.bits, self.block_bits, self.two_seeds)
        )

    @property
    def span(self) -> int:
        """Where an element's k bits fall: its block, or the whole generation."""
        return self.block_bits or self.bits

    @property
    def seed_floor(self) -> float:
        """Least false-positive rate at capacity, however many bits: ``n / (bits seed_range)``.

        A new element with a stored one's seeds shares all its bits (scheme 1: ``n / S**2``).
        """
        return self.capacity / self.bits / self.seed_range

    @property
    def nbytes(self) -> int:
        """Bytes of its bitmap."""
        return (self.bits + 7) // 8

    @property
    def distinct(self) -> float:
        """Distinct bits one item sets, on average (its k offsets may meet in a block)."""
        return (
            distinct_bits(self.hash_count, self.block_bits) if self.block_bits else self.hash_count
        )

    def recount(self, ones: int) -> int:
        """Return the items to count in it, found with ``ones`` bits set (its count was lost).

        A shard's generation 0 counts its newest generation's items: recreated, it counts
        them again from that generation's bits. The items that set X of m bits, n = -(m/d)
        ln(1 - X/m), are estimated within about 0.67 sqrt(n/k) (one sigma, at capacity, blocked
        or not): 4 sqrt(n/k) above, the generation takes no more than its capacity but for a
        chance under 1e-9. At most its capacity: full, the next add starts the next one. The
        script's twin: ``kept`` in ``engine/lua/check_and_add.lua``.
        """
        m = self.bits
        items = -m / self.distinct * math.log1p(-min(ones, m - 1) / m)
        return min(self.capacity, math.ceil(items + 4 * math.sqrt(items / self.hash_count)))


#: Least margin, in items, between the scriptless path's counts and a shard's growth.
SCRIPTLESS_MARGIN = 1024


@dataclass(frozen=True, slots=True)
class Growth:
    """How a filter's shards grow (``expansion``: 0 or at least 2) and forget (``ttl``)."""

    spec: FilterSpec
    capacity: int
    expansion: int = 0
    tightening: float = DEFAULT_TIGHTENING
    ttl: int = 0

    @property
    def shard_capacity(self) -> int:
        """Items generation 0 of one shard takes: its share of the capacity."""
        return math.ceil(self.capacity / self.spec.shards)

    def generation(self, g: int) -> Generation:
        """Return generation ``g`` of a shard (0: the filter's own shard geometry)."""
        if not 0 <= g <= self.last:
            raise ValueError(f"a shard has generations 0 to {self.last}, not {g}")
        return _generation_of(self, g)

    @property
    def scriptless_limit(self) -> int:
        """Items a one-generation shard may hold before its checks go through the script.

        :mod:`.fastpath`'s counts arrive late: a margin keeps it clear of growth (script only).
        """
        first = self.first_capacity
        return max(0, first - max(SCRIPTLESS_MARGIN, first // 100))

    @property
    def bound(self) -> float:
        """The rate all generations together stay under: p_0 / (1 - r), p if sized by rate p."""
        p0 = self.first_rate(self.shard_capacity)
        return p0 / (1 - self.tightening) if self.expansion else p0

    def first_rate(self, items: int) -> float:
        """Return generation 0's false-positive rate after ``items`` (without the seed floor)."""
        spec = self.spec
        return false_positive_rate(
            spec.shard_bits, spec.hash_count, items, spec.block_bits, floor=False
        )

    @property
    def first_capacity(self) -> int:
        """Items generation 0 of a shard takes before the shard grows.

        Its share plus 4 sigma (rate under 3/4 of :attr:`bound`), lest half the shards grow early.
        """
        nominal = self.shard_capacity
        if not self.expansion or self.spec.shards == 1:
            return nominal
        ceiling = 0.75 * self.bound
        high = nominal + math.ceil(4 * math.sqrt(nominal))
        if self.first_rate(high) <= ceiling:
            return high
        low = nominal  # its rate is (1 - r) of the bound: under the ceiling
        while high - low > 1:
            middle = (low + high) // 2
            if self.first_rate(middle) <= ceiling:
                low = middle
            else:
                high = middle
        return low

    @property
    def native_capacity(self) -> int:
        """Items a native shard's first sub-filter is reserved for (``BF.RESERVE``).

        Growing, :attr:`first_capacity`. Fixed (``NONSCALING`` refuses items past it, and the
        crawl stops): what the fullest shard holds of the capacity but for
        :data:`FIXED_STOP_CHANCE` (:func:`fullest_share`). The bitmap backend's fixed shard
        does not refuse, so it keeps its share.
        """
        if self.expansion:
            return self.first_capacity
        return fullest_share(self.capacity, self.spec.shards)

    @property
    def last(self) -> int:
        """The last generation a shard may have: its bits and items must fit a Redis string."""
        return _last_of(self)

    @property
    def generations(self) -> list[Generation]:
        """Every generation a shard may have, in order."""
        return [_generation_of(self, g) for g in range(self.last + 1)]

    @property
    def grown_capacity(self) -> int:
        """Items the whole filter takes before its shards run out of generations."""
        return sum(gen.capacity for gen in self.generations) * self.spec.shards

    def compound_rate(self, generations: int) -> float:
        """Return the false-positive rate bound of a shard with ``generations`` full ones."""
        return sum(_generation_of(self, g).error_rate for g in range(generations))

    @property
    def rate_bound(self) -> float:
        """The false-positive rate the filter stays under at any fill, while it can grow."""
        return self.compound_rate(self.last + 1)


#: Most chance that a fixed native filter's fullest shard fills before the filter holds its
#: capacity (the crawl would stop there).
FIXED_STOP_CHANCE = 1e-9


def fullest_share(items: int, shards: int, chance: float = FIXED_STOP_CHANCE) -> int:
    """Return the most items the fullest of ``shards`` holds, but for ``chance``.

    Each item lands in a shard at random: a shard's count is Binomial(items, 1/shards), of mean
    ``mu`` and variance under ``mu``. Bernstein's inequality gives P(X >= mu + t) <= exp(-t**2 /
    (2 (mu + t/3))); over the shards (a union bound) that is ``chance`` at ``a = ln(shards /
    chance)``, ``t = a/3 + sqrt(a**2/9 + 2 mu a)`` (4 shards: about ``6.7 sqrt(mu)``).
    """
    if shards <= 1:
        return items
    mu = items / shards
    a = math.log(shards / chance)
    return min(items, math.ceil(mu + a / 3 + math.sqrt(a * a / 9 + 2 * mu * a)))


@lru_cache(maxsize=4096)
def _generation_of(growth: Growth, g: int) -> Generation:
    spec, nominal, block = growth.spec, growth.shard_capacity, growth.spec.block_bits
    if g == 0:
        capacity = growth.first_capacity
        rate = growth.first_rate(capacity)
        return Generation(capacity, spec.shard_bits, spec.hash_count, rate, block, spec.two_seeds)
    capacity = nominal * growth.expansion**g
    # What generation 0 leaves of the bound, shared out as (1 - r) r**(g - 1).
    rest = growth.bound - _generation_of(growth, 0).error_rate
    rate = rest * (1 - growth.tightening) * growth.tightening ** (g - 1)
    if block:
        bits, hash_count = optimal_geometry(capacity, rate, block, floor=False)
        return Generation(capacity, bits, hash_count, rate, block)
    hash_count = min(MAX_HASH_COUNT, max(1, math.ceil(math.log2(1 / rate))))
    bits = optimal_bits(capacity, rate)
    return Generation(capacity, bits, hash_count, rate, two_seeds=spec.two_seeds)


@lru_cache(maxsize=256)
def _last_of(growth: Growth) -> int:
    if not growth.expansion:
        return 0
    for g in range(1, MAX_GENERATIONS):
        gen = _generation_of(growth, g)
        if gen.bits > MAX_SHARD_BITS or gen.capacity > MAX_GENERATION_ITEMS:
            return g - 1
    return MAX_GENERATIONS - 1


def growth_limit(growth: Growth) -> str:
    """Say what stops a growing shard short of :data:`MAX_GENERATIONS` ("" if nothing does).

    A generation is at most a Redis string's 512 MB and :data:`MAX_GENERATION_ITEMS` items
    (:func:`_last_of`): with large shards (``BLOOMFILTER_SHARD_BIT``/``SHARDS``) a shard has
    fewer generations, or one.
    """
    if not growth.expansion or growth.last == MAX_GENERATIONS - 1:
        return ""
    beyond = _generation_of(growth, growth.last + 1)
    size = "512 MB" if beyond.bits > MAX_SHARD_BITS else f"{MAX_GENERATION_ITEMS:,} items"
    if growth.last == 0:
        return f"cannot grow: its shards are already at the largest generation size ({size})"
    return (
        f"{growth.last + 1} generations of {MAX_GENERATIONS}: a shard's next would pass the"
        f" largest generation size, {size}"
    )


def growth_text(growth: Growth) -> str:
    """Say how far a filter grows, and what stops it (the startup line, ``scrapy bloom size``)."""
    limit = growth_limit(growth)
    if growth.last == 0:
        return f"{limit}, so it holds up to {growth.grown_capacity:,} items"
    grows = f"grows {growth.expansion}x per generation up to {growth.grown_capacity:,} items"
    return f"{grows} ({limit})" if limit else grows


#: :func:`seed_arguments`' format: four RESP bulk strings.
_FOUR_BULKS = b"$%d\r\n%b\r\n" * 4


def seed_arguments(h1: int, h2: int, shards: int, shard_bits: int, seeds: int) -> bytes:
    """Pack an element's four seeds as the check-and-add scripts' arguments (RESP).

    Generation 0's ``x`` and ``y``, then both cut to :data:`WIDE`: one format per cache miss.
    """
    q = h1 // shards
    x, y = b"%d" % (q % shard_bits), b"%d" % (h2 % seeds)
    wx, wy = b"%d" % (q % WIDE), b"%d" % (h2 % WIDE)
    return _FOUR_BULKS % (len(x), x, len(y), y, len(wx), wx, len(wy), wy)


def window_key(key: str, shard: int, window: int, generation: int) -> str:
    """Return the key of generation ``generation`` of a shard's re-crawl window."""
    return f"{{{key}:{shard}}}:w{window}:g{generation}"
