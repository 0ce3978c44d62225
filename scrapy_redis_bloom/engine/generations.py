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


#: Bit offsets in generation 0's header of the shard's growth state: the number of
#: generations (u16; 0 reads as 1) and the items in the newest one (u32).
GENERATIONS_BIT = 208
COUNT_BIT = 224
#: Width of the seeds passed for generations after the first (Lua doubles are exact
#: below 2**53).
WIDE = 2**52


def wide_seeds(element: str | bytes, shards: int) -> tuple[int, int]:
    """Return the seeds of generations 1 and later: the hash before it is cut to a shard."""
    import mmh3

    h1, h2 = mmh3.hash64(element, seed=0, x64arch=True, signed=False)
    return (h1 // shards) % WIDE, h2 % WIDE


def growing_script_source(plan: Growth) -> str:
    """Return the Lua of check-and-add on a growing shard (draft, see docs/design).

    ``KEYS[1]``: generation 0 of the shard (``{KEY:i}:g0``); later generations are
    ``{KEY:i}:g<g>``, in the same slot. ``ARGV``: the shard's identity, x and y of
    generation 0 (as today), then the wide seeds of later generations. Reply
    ``{answer, generations}``: answer 1 seen (every bit of some generation set, none
    written), 0 new (set in the newest generation, which may have grown), 2 identity
    mismatch (nothing written).
    """
    from .layout import HEADER_BITS, HEADER_BYTES, IDENTITY_BYTES
    from .scripts import MISMATCH

    gens = [plan.generation(g) for g in range(plan.last + 1)]
    bits = ", ".join(str(gen.bits) for gen in gens)
    ks = ", ".join(str(gen.hash_count) for gen in gens)
    caps = ", ".join(str(gen.capacity) for gen in gens)
    return f"""
local g0 = KEYS[1]
local base = string.sub(g0, 1, -2)
if redis.call('GETRANGE', g0, 0, {IDENTITY_BYTES - 1}) ~= ARGV[1] then return {{{MISMATCH}, 0}} end
local M = {{{bits}}}
local K = {{{ks}}}
local C = {{{caps}}}
local st = redis.call('BITFIELD', g0, 'GET', 'u16', {GENERATIONS_BIT}, 'GET', 'u32', {COUNT_BIT})
local G = st[1]
if G == 0 then G = 1 end
local count = st[2]
local function seeds(g)
  if g == 0 then return tonumber(ARGV[2]), tonumber(ARGV[3]) end
  return tonumber(ARGV[4]) % M[g + 1], tonumber(ARGV[5]) % M[g + 1]
end
for g = G - 1, 0, -1 do
  local key = base .. g
  local m, k = M[g + 1], K[g + 1]
  local a, b = seeds(g)
  local hit = 1
  for i = 1, k do
    if redis.call('GETBIT', key, {HEADER_BITS} + a) == 0 then hit = 0 break end
    a = (a + b) % m
    b = (b + i) % m
  end
  if hit == 1 then return {{1, G}} end
end
local g = G - 1
local key = base .. g
local m, k = M[g + 1], K[g + 1]
local a, b = seeds(g)
for i = 1, k do
  redis.call('SETBIT', key, {HEADER_BITS} + a, 1)
  a = (a + b) % m
  b = (b + i) % m
end
count = count + 1
if count >= C[g + 1] and G < #M then
  local new = base .. G
  redis.call('SETRANGE', new, {HEADER_BYTES} + math.ceil(M[G + 1] / 8) - 1, string.char(0))
  redis.call('SETRANGE', new, 0, ARGV[1])
  redis.call('BITFIELD', g0, 'SET', 'u16', {GENERATIONS_BIT}, G + 1, 'SET', 'u32', {COUNT_BIT}, 0)
  return {{0, G + 1}}
end
redis.call('BITFIELD', g0, 'SET', 'u16', {GENERATIONS_BIT}, G, 'SET', 'u32', {COUNT_BIT}, count)
return {{0, G}}
"""
