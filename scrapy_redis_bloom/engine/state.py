"""How full the filter is: from its bits (:func:`read_state`: O(m) in Redis) or its counters."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scrapy_redis_bloom.core.errors import taking_apart
from scrapy_redis_bloom.core.generations import GENERATIONS_BIT, Generation, Growth, window_key
from scrapy_redis_bloom.core.hashing import FilterSpec, distinct_bits
from scrapy_redis_bloom.core.layout import HEADER_BYTES
from scrapy_redis_bloom.core.sizing import allocation, false_positive_rate
from scrapy_redis_bloom.engine.parts import Parts, integer
from scrapy_redis_bloom.transport.executor import Call
from scrapy_redis_bloom.transport.wire import pack_command


@dataclass(frozen=True, slots=True)
class FilterTotals:
    """Outcomes of check-and-add over all workers, from the filter's counters."""

    added: int
    seen: int


@dataclass(frozen=True, slots=True)
class GenerationState:
    """Generation ``generation`` over the shards that have it (of the live windows)."""

    generation: int
    shards: int
    bits: int
    bits_set: int
    hash_count: int
    capacity: int
    estimated_items: int
    estimated_fpr: float

    @property
    def fill_ratio(self) -> float:
        """Fraction of its bits that are set."""
        return self.bits_set / self.bits if self.bits else 0.0


@dataclass(frozen=True, slots=True)
class FilterState:
    """What the filter's fill says: bits set (per shard when read from the bits), memory.

    ``generations`` break a growing (or windowed) filter down; ``fpr`` then covers them all.
    """

    spec: FilterSpec
    bits_set: int
    memory_bytes: int
    bits_set_per_shard: tuple[int, ...] = ()
    estimated_items: int = 0
    generations: tuple[GenerationState, ...] = ()
    fpr: float | None = None
    total_bits: int = 0

    @property
    def fill_ratio(self) -> float:
        """Fraction of all bits that are set."""
        return self.bits_set / (self.total_bits or self.spec.bits)

    @property
    def estimated_fpr(self) -> float:
        """Chance that a new element is reported seen now: the mean of (X/S)**k over shards."""
        if self.fpr is not None:
            return self.fpr
        spec = self.spec
        size, k, block = spec.shard_bits, spec.hash_count, spec.block_bits
        if not self.bits_set_per_shard:
            return _rate(spec.bits, k, round(self.fill_ratio * spec.bits), block)
        rates = [_rate(size, k, ones, block) for ones in self.bits_set_per_shard]
        return sum(rates) / len(rates)


def _rate(bits: int, k: int, ones: int, block: int) -> float:
    """Return the rate of a part with ``ones`` of its ``bits`` set: (X/m)**k unblocked.

    Blocked (busy blocks answer falsely more often than the mean fill): the rate of its items.
    """
    if not block:
        return (ones / bits) ** k
    return false_positive_rate(bits, k, _items(bits, k, ones, block), block)


def _items(bits: int, k: int, ones: int, block: int) -> float:
    """Items that set ``ones`` of ``bits`` bits: -(m/d) ln(1 - X/m); a lower bound when full.

    ``d``: distinct bits per item, k less those coinciding in a block (:func:`.distinct_bits`).
    """
    if bits <= 1:
        return float(ones)
    distinct = distinct_bits(k, block) if block else k
    return -bits / distinct * math.log1p(-min(ones, bits - 1) / bits)


def read_state(parts: Parts, growth: Growth) -> FilterState:
    """Count the bits set in every shard (of each generation, window) and their memory."""
    if growth.expansion or growth.ttl:
        return _read_generations(parts, growth)
    calls: list[Call] = []
    for shard in range(parts.spec.shards):
        key = parts.shard_key(shard)
        calls.append(Call(pack_command(b"BITCOUNT", key, HEADER_BYTES, -1), key=key, shard=shard))
        calls.append(Call(pack_command(b"MEMORY", b"USAGE", key), key=key, shard=shard))
    replies = parts.run("count the filter's bits", calls, take=integer)
    per_shard = tuple(replies[::2])
    first = _generation(0, growth.generations[0], per_shard)
    return FilterState(
        spec=parts.spec,
        bits_set=sum(per_shard),
        memory_bytes=sum(replies[1::2]),
        bits_set_per_shard=per_shard,
        estimated_items=first.estimated_items,
        generations=(first,),
    )


def _generation(g: int, gen: Generation, found: Sequence[int]) -> GenerationState:
    """Return generation ``g``'s state from each shard's part of it (``gen``: one part)."""
    bits, k, block = gen.bits, gen.hash_count, gen.block_bits
    return GenerationState(
        generation=g,
        shards=len(found),
        bits=bits * len(found),
        bits_set=sum(found),
        hash_count=k,
        capacity=gen.capacity * len(found),
        estimated_items=round(sum(_items(bits, k, x, block) for x in found)),
        estimated_fpr=sum(_rate(bits, k, x, block) for x in found) / len(found),
    )


def _read_generations(parts: Parts, growth: Growth) -> FilterState:
    gens = growth.generations
    shards = parts.spec.shards
    windows: Sequence[int | None] = parts.live_windows(growth.ttl) if growth.ttl else [None]
    # Per shard, the bases of its filters: the shard itself (None), or its live windows.
    bases = [
        (shard, (parts.shard_key(shard) if w is None else window_key(parts.key, shard, w, 0))[:-1])
        for shard in range(shards)
        for w in windows
    ]
    heads = [(shard, f"{base}0") for shard, base in bases]
    first = [
        Call(
            pack_command(b"BITFIELD_RO", key, b"GET", b"u16", GENERATIONS_BIT), key=key, shard=shard
        )
        for shard, key in heads
    ] + [Call(pack_command(b"EXISTS", key), key=key, shard=shard) for shard, key in heads]
    replies = parts.run("read the filter's generations", first)
    with taking_apart("read the filter's generations", parts.key):
        if not all(isinstance(reply, list) for reply in replies[: len(bases)]):
            raise ValueError(f"BITFIELD's values, got {replies[: len(bases)]!r:.200}")
        counts = [
            (max(int(reply[0]), 1) if int(exists) else 0)
            for reply, exists in zip(replies[: len(bases)], replies[len(bases) :], strict=True)
        ]
    keys = [
        (shard, g, f"{base}{g}")
        for (shard, base), count in zip(bases, counts, strict=True)
        for g in range(min(count, len(gens)))
    ]
    calls = [
        Call(pack_command(b"BITCOUNT", key, HEADER_BYTES, -1), key=key, shard=shard)
        for shard, _, key in keys
    ]
    anchors = [(s, parts.shard_key(s)) for s in range(shards)] if growth.ttl else []
    calls += [
        Call(pack_command(b"MEMORY", b"USAGE", key), key=key, shard=shard)
        for shard, key in [*((shard, key) for shard, _, key in keys), *anchors]
    ]
    replies = parts.run("count the filter's bits", calls, take=integer)
    ones = replies[: len(keys)]
    per_gen: dict[int, list[int]] = {}
    # Per shard: the log of the chance every part misses a new element (keeps rates < 1e-16).
    clear = [0.0] * shards
    per_shard = [0] * shards
    for (shard, g, _), found in zip(keys, ones, strict=True):
        gen = gens[g]
        per_gen.setdefault(g, []).append(found)
        clear[shard] += math.log1p(-_rate(gen.bits, gen.hash_count, found, gen.block_bits))
        per_shard[shard] += found  # every part's: the fill of the shard's bits
    states = tuple(_generation(g, gens[g], found) for g, found in sorted(per_gen.items()))
    return FilterState(
        spec=parts.spec,
        bits_set=sum(ones),
        memory_bytes=sum(replies[len(keys) :]),
        bits_set_per_shard=tuple(per_shard),
        estimated_items=sum(gen.estimated_items for gen in states),
        generations=states,
        fpr=sum(-math.expm1(c) for c in clear) / shards,
        total_bits=sum(gen.bits for gen in states) or parts.spec.bits,
    )


def estimate_from_items(growth: Growth, items: int) -> FilterState:
    """Return the state ``items`` distinct insertions leave, spread evenly: no Redis call.

    Generations fill in turn (with a TTL, an upper bound).
    """
    spec = growth.spec
    per_shard = items / spec.shards
    states: list[GenerationState] = []
    clear = 0.0  # log of the chance a new element is missed by every generation
    for gen in growth.generations:
        share = min(per_shard, gen.capacity) if gen is not growth.generations[-1] else per_shard
        fill = -math.expm1(-gen.hash_count * share / gen.bits)
        rate = false_positive_rate(gen.bits, gen.hash_count, share, gen.block_bits)
        clear += math.log1p(-rate)
        states.append(
            GenerationState(
                generation=len(states),
                shards=spec.shards,
                bits=gen.bits * spec.shards,
                bits_set=round(fill * gen.bits) * spec.shards,
                hash_count=gen.hash_count,
                capacity=gen.capacity * spec.shards,
                estimated_items=round(share * spec.shards),
                estimated_fpr=rate,
            )
        )
        per_shard -= share
        if per_shard <= 0:
            break
    memory = spec.shards * sum(
        allocation(HEADER_BYTES + growth.generation(g).nbytes) for g in range(len(states))
    )
    return FilterState(
        spec=spec,
        bits_set=sum(gen.bits_set for gen in states),
        memory_bytes=memory,
        estimated_items=items,
        generations=tuple(states),
        fpr=-math.expm1(clear),
        total_bits=sum(gen.bits for gen in states),
    )
