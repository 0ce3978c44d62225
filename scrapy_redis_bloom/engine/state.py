"""How full the filter is: from its bits (exact, costly) or from its counters (cheap).

:func:`read_state` runs ``BITCOUNT`` and ``MEMORY USAGE`` over every shard: O(m)
work in Redis, done on demand (the CLI's ``info``) and by the last worker to close.
:func:`estimate_from_items` gives the same figures from the number of items added,
which the counters keep at no cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..hashing import FilterSpec
from ..sizing import false_positive_rate
from .executor import Call
from .layout import HEADER_BYTES
from .parts import Parts
from .wire import pack_command


@dataclass(frozen=True, slots=True)
class FilterTotals:
    """Outcomes of check-and-add over all workers, from the filter's counters."""

    added: int
    seen: int


@dataclass(frozen=True, slots=True)
class FilterState:
    """What the filter's fill says: bits set (per shard when read from the bits), memory.

    ``bits_set_per_shard`` is empty when the state was estimated from the counters.
    """

    spec: FilterSpec
    bits_set: int
    memory_bytes: int
    bits_set_per_shard: tuple[int, ...] = ()
    estimated_items: int = 0

    @property
    def fill_ratio(self) -> float:
        """Fraction of all bits that are set."""
        return self.bits_set / self.spec.bits

    @property
    def estimated_fpr(self) -> float:
        """Chance that a new element is reported seen now: the mean of (X/S)**k over shards."""
        size, k = self.spec.shard_bits, self.spec.hash_count
        if not self.bits_set_per_shard:
            return self.fill_ratio**k
        rates = [(ones / size) ** k for ones in self.bits_set_per_shard]
        return sum(rates) / len(rates)


def _items_from_bits(spec: FilterSpec, per_shard: tuple[int, ...]) -> int:
    """Items added, estimated per shard as n = -(S/k) ln(1 - X/S) and summed.

    A saturated shard (every bit set) is counted as if one bit were still clear: the
    estimate is then a lower bound.
    """
    size, k = spec.shard_bits, spec.hash_count
    total = 0.0
    for ones in per_shard:
        total += -size / k * math.log1p(-min(ones, size - 1) / size) if size > 1 else ones
    return round(total)


def read_state(parts: Parts, memory: bool = True) -> FilterState:
    """Count the bits set in every shard (and the memory Redis holds for them)."""
    calls: list[Call] = []
    for shard in range(parts.spec.shards):
        key = parts.shard_key(shard)
        calls.append(Call(pack_command(b"BITCOUNT", key, HEADER_BYTES, -1), key=key, shard=shard))
        if memory:
            calls.append(Call(pack_command(b"MEMORY", b"USAGE", key), key=key, shard=shard))
    replies = parts.run("count the filter's bits", calls)
    step = 2 if memory else 1
    per_shard = tuple(int(reply) for reply in replies[::step])
    used = sum(int(reply or 0) for reply in replies[1::2]) if memory else 0
    return FilterState(
        spec=parts.spec,
        bits_set=sum(per_shard),
        memory_bytes=used,
        bits_set_per_shard=per_shard,
        estimated_items=_items_from_bits(parts.spec, per_shard),
    )


def estimate_from_items(spec: FilterSpec, items: int, memory_bytes: int) -> FilterState:
    """Return the state expected after ``items`` distinct insertions: cheap, no Redis call."""
    fill = -math.expm1(-spec.hash_count * items / spec.bits)
    return FilterState(
        spec=spec,
        bits_set=round(fill * spec.bits),
        memory_bytes=memory_bytes,
        estimated_items=items,
    )


def expected_fpr(spec: FilterSpec, items: int) -> float:
    """Return the false-positive rate expected after ``items`` insertions."""
    return false_positive_rate(spec.bits, spec.hash_count, items)
