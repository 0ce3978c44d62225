"""How full the filter is: from its bits, its headers' item counts, or its counters.

:func:`read_state` counts the bits (O(m) in Redis); :func:`read_counts` reads the item counts
in the headers of a filter that grows or forgets (O(shards)); :func:`estimate_from_items`
asks Redis nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from scrapy_redis_bloom.core import layout
from scrapy_redis_bloom.core.errors import taking_apart
from scrapy_redis_bloom.core.generations import GENERATIONS_BIT, Generation, Growth, window_key
from scrapy_redis_bloom.core.hashing import FilterSpec, distinct_bits
from scrapy_redis_bloom.core.layout import HEADER_BYTES, IDENTITY_BYTES
from scrapy_redis_bloom.core.record import FilterRecord
from scrapy_redis_bloom.core.sizing import allocation, false_positive_rate
from scrapy_redis_bloom.engine.parts import Parts, blob, integer
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
class DamagedPart:
    """A part the headers say exists, missing or not the filter's (``found``: what is there)."""

    shard: int
    key: str
    found: str


@dataclass(frozen=True, slots=True)
class FilterState:
    """What the filter's fill says: bits set (per shard when read from the bits), memory.

    ``generations`` break a growing (or windowed) filter down; ``fpr`` then covers them all.
    ``damaged``: parts lost or replaced (when read from the bits), left out of the figures
    of a growing or windowed filter. ``from_counters``: figured from a number of items alone
    (a backend's ``estimate``), nothing read from Redis: with re-crawl windows, whose items
    come and go, the counters' number is not what the filter holds.
    """

    spec: FilterSpec
    bits_set: int
    memory_bytes: int
    bits_set_per_shard: tuple[int, ...] = ()
    estimated_items: int = 0
    generations: tuple[GenerationState, ...] = ()
    fpr: float | None = None
    total_bits: int = 0
    damaged: tuple[DamagedPart, ...] = ()
    from_counters: bool = False

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
    """Return the rate of a part with ``ones`` of its ``bits`` set: (X/m)**k, blocked its items'."""
    if not block:
        return (ones / bits) ** k
    return false_positive_rate(bits, k, _items(bits, k, ones, block), block)


def _items(bits: int, k: int, ones: int, block: int) -> float:
    """Items that set ``ones`` of ``bits`` bits: -(m/d) ln(1 - X/m), d distinct bits per item."""
    if bits <= 1:
        return float(ones)
    distinct = distinct_bits(k, block) if block else k
    return -bits / distinct * math.log1p(-min(ones, bits - 1) / bits)


def read_state(parts: Parts, record: FilterRecord) -> FilterState:
    """Count the bits set in every shard (each generation, window), their memory, damaged parts."""
    growth = record.growth
    if growth.expansion or growth.ttl:
        return _read_generations(parts, record)
    calls: list[Call] = []
    for shard in range(parts.spec.shards):
        key = parts.shard_key(shard)
        calls.append(Call(pack_command(b"BITCOUNT", key, HEADER_BYTES, -1), key=key, shard=shard))
        calls.append(Call(pack_command(b"MEMORY", b"USAGE", key), key=key, shard=shard))
        calls.append(_identity_call(key, shard))
    replies = _taken(parts, "count the filter's bits", calls, (integer, integer, blob))
    per_shard = tuple(replies[::3])
    damaged = _Damage(record)
    for shard, found in enumerate(replies[2::3]):
        damaged.check(shard, parts.shard_key(shard), found)
    gen = growth.generations[0]
    first = _generation(0, gen, [_counted_part(s, 0, gen, x) for s, x in enumerate(per_shard)])
    return FilterState(
        spec=parts.spec,
        bits_set=sum(per_shard),
        memory_bytes=sum(replies[1::3]),
        bits_set_per_shard=per_shard,
        estimated_items=first.estimated_items,
        generations=(first,),
        damaged=tuple(damaged.parts),
    )


def _identity_call(key: str, shard: int) -> Call:
    """Return the call reading a part's identity (b"" when it is missing)."""
    return Call(pack_command(b"GETRANGE", key, 0, IDENTITY_BYTES - 1), key=key, shard=shard)


def _taken(
    parts: Parts, operation: str, calls: list[Call], takes: Sequence[Callable[[Any], Any]]
) -> list[Any]:
    """Run ``calls``; return the replies, the i-th read by ``takes[i % len(takes)]``."""
    replies = parts.run(operation, calls)
    out = []
    for i, (call, reply) in enumerate(zip(calls, replies, strict=True)):
        with taking_apart(operation, call.key or ""):
            out.append(takes[i % len(takes)](reply))
    return out


class _Damage:
    """The parts found missing or not the filter's, by their identity."""

    def __init__(self, record: FilterRecord) -> None:
        self.record = record
        self.parts: list[DamagedPart] = []
        self._identities: dict[int, bytes] = {}

    def identity(self, shard: int) -> bytes:
        """Return the identity every part of ``shard`` carries."""
        found = self._identities.get(shard)
        if found is None:
            record = self.record
            found = layout.identity(record.filter_id, shard, record.spec.hash_count)
            self._identities[shard] = found
        return found

    def check(self, shard: int, key: str, found: bytes) -> bool:
        """Tell whether a part carries its shard's identity; note it damaged if not."""
        if found[:IDENTITY_BYTES] == self.identity(shard):
            return True
        what = layout.describe_identity(found[:IDENTITY_BYTES], self.record.filter_id, shard)
        self.parts.append(DamagedPart(shard, key, what))
        return False


@dataclass(frozen=True, slots=True)
class _Part:
    """One generation of one shard (or live window) in the figures: its bits set, items, rate."""

    shard: int
    generation: int
    ones: int
    items: float
    rate: float


def _counted_part(shard: int, g: int, gen: Generation, ones: int) -> _Part:
    """Return a part from its bits set (``BITCOUNT``): the items and rate they imply."""
    bits, k, block = gen.bits, gen.hash_count, gen.block_bits
    return _Part(shard, g, ones, _items(bits, k, ones, block), _rate(bits, k, ones, block))


def _headed_part(shard: int, g: int, gen: Generation, items: int) -> _Part:
    """Return a part from the items its header counts: the bits and rate they leave, expected.

    The bits: ``m (1 - e^(-d n / m))``, d distinct bits per item (:func:`_items` inverted).
    """
    bits, k, block = gen.bits, gen.hash_count, gen.block_bits
    distinct = distinct_bits(k, block) if block else k
    ones = round(-bits * math.expm1(-distinct * items / bits)) if bits else 0
    return _Part(shard, g, ones, items, false_positive_rate(bits, k, items, block))


def _generation(g: int, gen: Generation, found: Sequence[_Part]) -> GenerationState:
    """Return generation ``g``'s state from each shard's part of it (``gen``: one part)."""
    return GenerationState(
        generation=g,
        shards=len(found),
        bits=gen.bits * len(found),
        bits_set=sum(part.ones for part in found),
        hash_count=gen.hash_count,
        capacity=gen.capacity * len(found),
        estimated_items=round(sum(part.items for part in found)),
        estimated_fpr=sum(part.rate for part in found) / len(found),
    )


def _needed_windows(anchor: bytes, window: int) -> tuple[bool, bool]:
    """Return whether windows ``window - 1`` and ``window`` must exist, by a bitmap anchor."""
    before = int.from_bytes(anchor[GENERATIONS_BIT // 8 : GENERATIONS_BIT // 8 + 2], "big")
    newest = int.from_bytes(anchor[GENERATIONS_BIT // 8 + 2 : HEADER_BYTES], "big")
    return windows_needed(newest, before, window)


def windows_needed(newest: int, before: int, window: int) -> tuple[bool, bool]:
    """Return whether windows ``window - 1`` and ``window`` must exist, as ``lua/windows.lua``.

    ``newest``: the newest window started; ``before``: 1 if the one before it existed then.
    """
    previous = newest == window - 1 or (newest == window and before == 1)
    current = newest == window or (newest == window + 1 and before == 1)
    return previous, current


@dataclass(frozen=True, slots=True)
class _Head:
    """The header of a shard's (or a live window's) generation 0, as read."""

    shard: int
    base: str  #: Its generations' keys, less the generation's number.
    #: Generations it has (0: nothing there: not started, expired, lost or not this filter's).
    generations: int
    count: int  #: Items in its newest generation, as the scripts count them.


def _read_heads(
    parts: Parts, record: FilterRecord
) -> tuple[list[_Head], list[tuple[int, str]], _Damage]:
    """Read the headers of every shard's generation 0 (with windows: of each live window's).

    One ``GETRANGE`` of a header per shard and live window (and per anchor): O(shards).
    Returns the heads, the anchors read (with windows) and the damage found so far: a
    window its anchor says must exist, missing, or a header not this filter's.
    """
    growth = record.growth
    shards = parts.spec.shards
    windows: Sequence[int | None] = parts.live_windows(growth.ttl) if growth.ttl else [None]
    # Per shard, the bases of its filters: the shard itself (None), or its live windows.
    bases = [
        (shard, (parts.shard_key(shard) if w is None else window_key(parts.key, shard, w, 0))[:-1])
        for shard in range(shards)
        for w in windows
    ]
    anchors = [(s, parts.shard_key(s)) for s in range(shards)] if growth.ttl else []
    calls = [
        Call(pack_command(b"GETRANGE", key, 0, HEADER_BYTES - 1), key=key, shard=shard)
        for shard, key in [*((shard, f"{base}0") for shard, base in bases), *anchors]
    ]
    replies = _taken(parts, "read the filter's generations", calls, (blob,))
    found_heads, found_anchors = replies[: len(bases)], replies[len(bases) :]
    damage = _Damage(record)
    # Per head: whether it must exist (with windows, as its anchor says; else always).
    needed = [True] * len(bases)
    if growth.ttl:
        window = windows[-1]
        assert window is not None
        for (shard, key), anchor in zip(anchors, found_anchors, strict=True):
            ours = damage.check(shard, key, anchor)
            wanted = _needed_windows(anchor, window) if ours else (False, False)
            needed[shard * 2 : shard * 2 + 2] = wanted
    heads = []
    for (shard, base), head, must in zip(bases, found_heads, needed, strict=True):
        generations = count = 0
        if not head[:IDENTITY_BYTES].strip(b"\0") and not must:
            pass  # not started (or expired): nothing there yet
        elif damage.check(shard, f"{base}0", head):
            state = head[GENERATIONS_BIT // 8 : HEADER_BYTES].ljust(6, b"\0")
            generations = max(int.from_bytes(state[:2], "big"), 1)  # 0 reads as 1
            count = int.from_bytes(state[2:], "big")
        heads.append(_Head(shard, base, generations, count))
    return heads, anchors, damage


def _read_generations(parts: Parts, record: FilterRecord) -> FilterState:
    gens = record.growth.generations
    heads, anchors, damage = _read_heads(parts, record)
    keys = [
        (head.shard, g, f"{head.base}{g}")
        for head in heads
        for g in range(min(head.generations, len(gens)))
    ]
    calls = [
        Call(pack_command(b"BITCOUNT", key, HEADER_BYTES, -1), key=key, shard=shard)
        for shard, _, key in keys
    ]
    calls += [
        Call(pack_command(b"MEMORY", b"USAGE", key), key=key, shard=shard)
        for shard, key in [*((shard, key) for shard, _, key in keys), *anchors]
    ]
    later = [(shard, key) for shard, g, key in keys if g]  # generation 0: checked above
    calls += [_identity_call(key, shard) for shard, key in later]
    replies = parts.run("count the filter's bits", calls)
    with taking_apart("count the filter's bits", parts.key):
        numbers = [integer(reply) for reply in replies[: len(calls) - len(later)]]
        identities = [blob(reply) for reply in replies[len(calls) - len(later) :]]
    lost = {
        key
        for (shard, key), head in zip(later, identities, strict=True)
        if not damage.check(shard, key, head)
    }
    ones = numbers[: len(keys)]
    memory = numbers[len(keys) :]
    # Not an empty generation, one whose items are gone (or not this filter's): left out.
    found = [
        _counted_part(shard, g, gens[g], n)
        for (shard, g, key), n in zip(keys, ones, strict=True)
        if key not in lost
    ]
    owned = [size for (_, _, key), size in zip(keys, memory, strict=False) if key not in lost]
    return _assemble(parts, gens, found, sum(owned) + sum(memory[len(keys) :]), damage)


def read_counts(parts: Parts, record: FilterRecord) -> FilterState:
    """Return the state the headers' item counts imply: O(shards) in Redis, no bit read.

    For a filter that grows or forgets (its scripts count the items of each shard's, or each
    live window's, newest generation; the older ones hold their capacity). With re-crawl
    windows this is what the live windows hold, where the counters hold every item ever
    added: cheap enough for every stats tick, where :func:`read_state` counts every bit.
    Counts a worker holds back (the scriptless paths) reach the headers at its next sync.
    The memory is estimated from the parts' sizes.
    """
    gens = record.growth.generations
    heads, anchors, damage = _read_heads(parts, record)
    found = []
    for head in heads:
        last = min(head.generations, len(gens)) - 1
        for g in range(last + 1):
            items = head.count if g == last else gens[g].capacity
            found.append(_headed_part(head.shard, g, gens[g], items))
    memory = sum(allocation(HEADER_BYTES + gens[part.generation].nbytes) for part in found)
    return _assemble(parts, gens, found, memory + len(anchors) * allocation(HEADER_BYTES), damage)


def _assemble(
    parts: Parts, gens: Sequence[Generation], found: Sequence[_Part], memory: int, damage: _Damage
) -> FilterState:
    """Return the state of a filter whose shards hold the parts ``found`` (``gens``: its growth).

    A check consults every part of its shard, so a shard's rate is that of any of them
    answering; the filter's, the mean over the shards.
    """
    shards = parts.spec.shards
    per_gen: dict[int, list[_Part]] = {}
    # Per shard: the log of the chance every part misses a new element (keeps rates < 1e-16).
    clear = [0.0] * shards
    per_shard = [0] * shards
    for part in found:
        per_gen.setdefault(part.generation, []).append(part)
        clear[part.shard] += math.log1p(-min(part.rate, 1.0 - 1e-16))
        per_shard[part.shard] += part.ones  # every part's: the fill of the shard's bits
    states = tuple(_generation(g, gens[g], part) for g, part in sorted(per_gen.items()))
    return FilterState(
        spec=parts.spec,
        bits_set=sum(per_shard),
        memory_bytes=memory,
        bits_set_per_shard=tuple(per_shard),
        estimated_items=sum(gen.estimated_items for gen in states),
        generations=states,
        fpr=sum(-math.expm1(c) for c in clear) / shards,
        total_bits=sum(gen.bits for gen in states) or parts.spec.bits,
        damaged=tuple(sorted(damage.parts, key=lambda part: part.shard)),  # (stable)
    )


def estimate_from_items(growth: Growth, items: int) -> FilterState:
    """Return the state ``items`` distinct insertions leave, spread evenly: no Redis call."""
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
        from_counters=True,
    )
