"""The geometry of a growing filter's generations (draft for issue 11, see docs/design).

Each shard grows on its own: generation ``g`` of a shard holds ``E**g`` times the
items of generation 0 at ``r**g`` times its error rate, so that the compound rate of
all generations stays under the configured one: ``sum(p_0 r**g) <= p_0 / (1 - r) = p``
with ``p_0 = p (1 - r)``, the rate generation 0 must be sized for. Generation 0 is the
filter's own shard geometry, so a filter without growth is one that never grew. Every
number here is a pure function of the record, so every worker (and the script)
computes the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..hashing import MAX_HASH_COUNT, FilterSpec
from ..sizing import false_positive_rate, optimal_bits

#: Most generations a shard may have: with E = 2, 2**15 times the first one.
MAX_GENERATIONS = 16
#: RedisBloom's default tightening ratio of the error rate per generation.
DEFAULT_TIGHTENING = 0.5


@dataclass(frozen=True, slots=True)
class Generation:
    """One generation of a shard: items it takes, bits, hash functions, its error rate."""

    capacity: int
    bits: int
    hash_count: int
    error_rate: float


@dataclass(frozen=True, slots=True)
class Growth:
    """How a filter's shards grow: ``expansion`` E (0: never) and ``tightening`` r."""

    spec: FilterSpec
    capacity: int
    error_rate: float
    expansion: int = 2
    tightening: float = DEFAULT_TIGHTENING

    def __post_init__(self) -> None:
        if self.expansion < 0 or self.expansion == 1:
            raise ValueError(f"expansion is 0 (no growth) or at least 2, got {self.expansion}")
        if not 0 < self.tightening < 1:
            raise ValueError(f"tightening is strictly between 0 and 1, got {self.tightening}")

    @property
    def shard_capacity(self) -> int:
        """Items generation 0 of one shard takes: its share of the capacity."""
        return math.ceil(self.capacity / self.spec.shards)

    def generation(self, g: int) -> Generation:
        """Return generation ``g`` of a shard (0: the filter's own shard geometry)."""
        if not 0 <= g < MAX_GENERATIONS or (g and not self.expansion):
            raise ValueError(f"a shard has generations 0 to {self.last}, not {g}")
        if g == 0:  # as created: its rate is what its bits give at its capacity
            spec, capacity = self.spec, self.shard_capacity
            rate = false_positive_rate(spec.shard_bits, spec.hash_count, capacity)
            return Generation(capacity, spec.shard_bits, spec.hash_count, rate)
        capacity = self.shard_capacity * self.expansion**g
        rate = self.base_rate * self.tightening**g
        hash_count = min(MAX_HASH_COUNT, math.ceil(math.log2(1 / rate)))
        return Generation(capacity, optimal_bits(capacity, rate), hash_count, rate)

    @property
    def base_rate(self) -> float:
        """Error rate a growing filter's generation 0 is sized for: p (1 - r).

        The sizing must ask for it (not for p) when growth is on, so that the rates of
        all generations sum to at most p. Later generations get ``base_rate * r**g``.
        """
        return self.error_rate * (1 - self.tightening) if self.expansion else self.error_rate

    @property
    def last(self) -> int:
        """The last generation a shard may have."""
        return MAX_GENERATIONS - 1 if self.expansion else 0

    def compound_rate(self, generations: int) -> float:
        """Return the false-positive rate bound of a shard with ``generations`` full ones."""
        return sum(self.generation(g).error_rate for g in range(generations))
