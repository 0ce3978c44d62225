"""From what the user asks for (capacity and error rate, or bits and k) to a geometry.

The request (:class:`Sizing`) is stored in the record: a worker asking the same adopts the
stored geometry, so a release that sizes differently never locks users out.
"""

from __future__ import annotations

import math
from ast import literal_eval
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Literal

from scrapy_redis_bloom.core.hashing import BLOCK_BITS, MAX_HASH_COUNT, MAX_SHARD_BITS, FilterSpec
from scrapy_redis_bloom.core.layout import HEADER_BYTES

#: Shards of at most 2**26 bits (8 MiB): allocating one stalls Redis for milliseconds.
DEFAULT_SHARD_BIT = 26
#: How much more than the bits need that the shards' Redis allocations may reserve.
ALLOCATION_SLACK = 0.02
#: Bytes a Redis string needs beyond its payload: sds header (≤ 9 below 4 GiB), NUL, rounded up.
STRING_OVERHEAD = 16
#: Bytes Redis spends per key besides the value's block: dict entry, object, key name.
KEY_OVERHEAD = 56


def optimal_bits(capacity: int, error_rate: float) -> int:
    """Bits m that hold ``capacity`` items at ``error_rate``: -n ln p / (ln 2)**2."""
    return math.ceil(-capacity * math.log(error_rate) / math.log(2) ** 2)


def native_geometry(capacity: int, error_rate: float) -> tuple[int, int]:
    """Return RedisBloom's ``(bits, k)`` for a (sub-)filter: -n ln p / (ln 2)**2, ceil(-log2 p)."""
    return optimal_bits(capacity, error_rate), max(1, math.ceil(-math.log2(error_rate)))


def native_link(capacity: int, rate: float, expansion: int, g: int) -> tuple[int, int, int]:
    """Return sub-filter ``g`` of a shard ``BF.RESERVE``'d for ``capacity`` at ``rate``.

    As ``(items, bits, k)``: a growing shard's sub-filters take ``expansion`` times the items
    of the one before, each at the rate tightened once more (:data:`NATIVE_TIGHTENING`).
    """
    if not expansion:
        return (capacity, *native_geometry(capacity, rate))
    items = capacity * expansion**g
    return (items, *native_geometry(items, rate * NATIVE_TIGHTENING ** (g + 1)))


#: RedisBloom's index excess (:func:`native_excess`) at half the bits set, times ``k m``.
#: Fitted to a simulation of its arithmetic, 64-bit ``a + i b`` taken ``mod m``, on full
#: filters of 1,000 to 100,000 items: 4.2 (k = 20) to 6.6 (k = 11), kept at the top.
NATIVE_EXCESS = 6.0
#: RedisBloom's tightening of each sub-filter's error rate (the first one's too).
NATIVE_TIGHTENING = 0.5
#: Sub-filters a growing native shard's rate bound adds up: past them the terms vanish.
NATIVE_CHAIN = 64
#: Least share of the asked rate that :func:`native_reserve_rate` hands ``BF.RESERVE``: past
#: it a shard is too small for its rate (bits grow as ``log 1/p``, its excess falls as 1/m).
NATIVE_LEAST_SHARE = 0.1


def native_excess(bits: int, hash_count: int, fill: float) -> float:
    """Return the false-positive rate a RedisBloom filter adds to the Bloom formula's.

    It probes bit ``(a + i b) mod m`` (a 64-bit sum): some of its ``k`` probes meet, so a
    check reads fewer bits than ``k`` (about ``k**2/m`` of them lose one, a few collapse to
    one or two bits), and two items with near ``b`` share runs of bits. The excess is
    ``O(1/m)``, :data:`NATIVE_EXCESS` ``(2 fill)**3 / (k m)`` with ``fill`` the share of bits
    set: under 1% of the rate for a sub-filter of more than about ``600 / (k p)`` bits, but
    half of it for one of 1,000 bits at 1e-3 (a shard of 60 items).
    """
    if bits <= 0:
        return 0.0
    return NATIVE_EXCESS * (2 * fill) ** 3 / (hash_count * bits)


def native_link_rate(capacity: int, error_rate: float) -> float:
    """Return a full RedisBloom sub-filter's false-positive rate: the formula's plus its excess."""
    bits, k = native_geometry(capacity, error_rate)
    fill = -math.expm1(-k * capacity / bits) if bits > 0 else 1.0
    return min(1.0, fill**k + native_excess(bits, k, fill))


def native_chain_rate(capacity: int, error_rate: float, expansion: int) -> float:
    """Return the most false positives a shard ``BF.RESERVE error_rate capacity`` gives.

    Fixed (no ``expansion``): its one sub-filter, full. Growing: RedisBloom reserves
    sub-filter ``g`` for ``capacity expansion**g`` items at ``error_rate 0.5**(g + 1)``, and
    a check reads every one: at most the sum of all of them full (:func:`native_link_rate`).
    """
    if not expansion:
        return native_link_rate(capacity, error_rate)
    total = 0.0
    for g in range(NATIVE_CHAIN):
        rate = error_rate * NATIVE_TIGHTENING ** (g + 1)
        if rate < 1e-300:
            break
        total += native_link_rate(capacity * expansion**g, rate)
    return min(1.0, total)


@lru_cache(maxsize=256)
def native_reserve_rate(capacity: int, error_rate: float, expansion: int) -> float:
    """Return the error rate to hand ``BF.RESERVE`` so a shard stays under ``error_rate``.

    RedisBloom's chain adds up to its rate by the Bloom formula alone, so its index excess
    (:func:`native_excess`) would take it past: that of a small first sub-filter, measurably
    (60 items at 1e-3 gave 0.0014). The largest rate whose :func:`native_chain_rate` stays
    under ``error_rate``; at large sizes within a fraction of a percent of it. A shard too
    small for any down to :data:`NATIVE_LEAST_SHARE` of it (:func:`native_rate_reachable`)
    keeps ``error_rate``: more bits would buy it little, and the startup line warns.
    """
    low = error_rate * NATIVE_LEAST_SHARE
    if native_chain_rate(capacity, error_rate, expansion) <= error_rate:
        return error_rate
    if native_chain_rate(capacity, low, expansion) > error_rate:
        return error_rate
    high = error_rate
    for _ in range(48):  # on the log scale: a relative step of 1e-6 at the end
        middle = math.sqrt(low * high)
        if native_chain_rate(capacity, middle, expansion) <= error_rate:
            low = middle
        else:
            high = middle
    return low


def native_rate_reachable(capacity: int, error_rate: float, expansion: int) -> bool:
    """Tell whether a shard of ``capacity`` items can stay under ``error_rate`` (RedisBloom).

    Its excess falls with its bits, 1/m, while tightening the rate adds bits only as
    ``log 1/p``: a first sub-filter of 30 items cannot keep 1e-3, nor one of 3,000 1e-6.
    """
    rate = native_reserve_rate(capacity, error_rate, expansion)
    return native_chain_rate(capacity, rate, expansion) <= error_rate


def optimal_hash_count(bits: int, capacity: int) -> int:
    """Hash functions k that minimise the false-positive rate: (m / n) ln 2, at least 1."""
    return max(1, round(bits / capacity * math.log(2)))


def false_positive_rate(
    bits: int, hash_count: int, items: float, block_bits: int = 0, floor: bool = True
) -> float:
    """Return the false-positive rate expected after ``items`` insertions.

    Blocked, the mean over a block's Poisson load of ``(1 - (1 - 1/B)**(k j))**k`` (Putze et
    al., 2007), plus the seed floor ``n / (m B**2)`` unless ``floor=False`` (generations).
    """
    if bits <= 0:  # a native sizing for a rate of 1: everything reads as seen
        return 1.0
    if not block_bits:
        return (-math.expm1(-hash_count * items / bits)) ** hash_count
    load = block_bits * items / bits
    if load <= 0:
        return 0.0
    miss = math.log1p(-1 / block_bits) * hash_count
    spread = 12 * math.sqrt(load) + 40
    # Every load up to 40,000 term by term; past it, every step-th term weighed by the step
    # (the Poisson is smooth on its width, sqrt(load)): ~5,000 terms at most, not ~24
    # sqrt(load) (a capacity of 2**63 took minutes).
    step = max(1, int(math.sqrt(load) / 200))
    total = 0.0
    for j in range(max(0, int(load - spread)), int(load + spread) + 1, step):
        weight = math.exp(j * math.log(load) - load - math.lgamma(j + 1))
        total += step * weight * (-math.expm1(miss * j)) ** hash_count
    return min(1.0, total + (items / bits / block_bits**2 if floor else 0.0))


#: How far a blocked filter's real rate runs above :func:`false_positive_rate`.
BLOCKED_HEADROOM = 1.05
#: Most bits a default request's blocked layout may take, as a multiple of the classic one's.
BLOCKED_MOST = 2
#: The items that comparison prices both layouts at: the rate decides, not rounding.
NOMINAL_ITEMS = 1_000_000


@lru_cache(maxsize=256)
def optimal_geometry(
    capacity: int, error_rate: float, block_bits: int = 0, floor: bool = True
) -> tuple[int, int]:
    """Return the least (m, k) holding ``capacity`` items at ``error_rate``.

    Blocked: for each k near the unblocked optimum, the fewest whole blocks; a rate needing
    far more than :data:`MAX_HASH_COUNT` gets the unblocked answer (to be refused).
    """
    bits = optimal_bits(capacity, error_rate)
    centre = optimal_hash_count(bits, capacity)
    if not block_bits or centre - 8 > MAX_HASH_COUNT:
        return bits, centre
    error_rate /= BLOCKED_HEADROOM
    found = []
    for k in range(max(1, centre - 8), min(MAX_HASH_COUNT, centre + 3) + 1):
        low, high = bits // block_bits, 2 * bits // block_bits + 1
        while false_positive_rate(high * block_bits, k, capacity, block_bits, floor) > error_rate:
            low, high = high, 2 * high
        while high - low > 1:
            middle = (low + high) // 2
            rate = false_positive_rate(middle * block_bits, k, capacity, block_bits, floor)
            if rate > error_rate:
                low = middle
            else:
                high = middle
        found.append((high * block_bits, k))
    return min(found)  # the fewest bits, and of those the fewest hash functions


def optimal_capacity(bits: int, hash_count: int) -> int:
    """Return the item count for which ``hash_count`` is the optimal k: m ln 2 / k."""
    return max(1, math.floor(bits * math.log(2) / hash_count))


def allocation(size: int) -> int:
    """Return the bytes jemalloc reserves for ``size``: 16-byte steps to 128, 4 per doubling."""
    if size <= 128:
        return max(16, -(-size // 16) * 16)
    step = 1 << ((size - 1).bit_length() - 3)
    return -(-size // step) * step


def allocation_classes(limit: int) -> list[int]:
    """Return jemalloc's size classes from ``limit / 64`` up to ``limit``, largest first."""
    classes = list(range(16, 129, 16))
    group = 128
    while group < limit:
        classes += [group + group // 4 * j for j in range(1, 5)]
        group *= 2
    return [size for size in reversed(classes) if limit // 64 <= size <= limit]


def shard_allocation(spec: FilterSpec) -> int:
    """Return the bytes Redis reserves for one shard: its header, bits and string overhead."""
    return allocation(HEADER_BYTES + spec.shard_bytes + STRING_OVERHEAD)


def filter_allocation(spec: FilterSpec) -> int:
    """Return the bytes Redis reserves for all of a filter's shards."""
    return spec.shards * shard_allocation(spec)


@dataclass(frozen=True, slots=True)
class Sizing:
    """What the user asked for (``native`` and ``rate_share`` are not in its text)."""

    capacity: int | None = None
    error_rate: float | None = None
    bit: int | None = None
    hash_number: int | None = None
    shard_bit: int | None = None
    shards: int | None = None
    #: ``BLOOMFILTER_BLOCKED``: None for the backend's default (:attr:`layout_blocked`).
    blocked: bool | None = None
    native: bool = False
    rate_share: float = 1.0

    def canonical(self) -> str:
        """Return the request as the text stored in the record: stable across releases."""
        # Unset fields are left out: a default request names no layout, so it adopts either.
        return " ".join(
            f"{name}={value!r}" for name in _CANONICAL if (value := getattr(self, name)) is not None
        )

    @property
    def layout_blocked(self) -> bool:
        """Whether a new filter of this request is blocked: as asked, else as its backend does."""
        if self.blocked is not None:
            return self.blocked
        if self.native:
            return False
        if self.error_rate is None:
            return True
        rate = self.error_rate * self.rate_share
        blocked = optimal_geometry(NOMINAL_ITEMS, rate, BLOCK_BITS)[0]
        return blocked <= BLOCKED_MOST * optimal_geometry(NOMINAL_ITEMS, rate)[0]

    @classmethod
    def parse(cls, text: str, rate_share: float = 1.0) -> Sizing | None:
        """Read back a request's :meth:`canonical` text; None for text it did not write."""
        values: dict[str, object] = {}
        for part in text.split():
            name, sep, value = part.partition("=")
            if not sep or name not in _CANONICAL or name in values:
                return None
            try:
                found = literal_eval(value)
            except (ValueError, SyntaxError):
                return None
            kind = _CANONICAL[name]
            if type(found) is not kind and not (kind is float and type(found) is int):
                return None
            values[name] = found
        if not values:
            return None
        return cls(**values, rate_share=rate_share)  # type: ignore[arg-type]

    def geometry(self) -> tuple[int, int]:
        """Return (m, k) before sharding: the bits wanted and the hash functions."""
        if self.capacity is not None and self.error_rate is not None:
            rate = self.error_rate * self.rate_share
            return optimal_geometry(self.capacity, rate, self.block_bits)
        if self.bit is None or self.hash_number is None:
            raise ValueError(f"an incomplete sizing: {self.canonical()!r}")
        return 2**self.bit, self.hash_number

    @property
    def block_bits(self) -> int:
        """The block of the hashing scheme: :data:`..hashing.BLOCK_BITS`, or 0."""
        return BLOCK_BITS if self.layout_blocked else 0

    def spec(self) -> FilterSpec:
        """Return the geometry this release gives the request.

        A native filter's shards are as few as its shard size allows, each an equal share of
        the bits: RedisBloom allocates its own, so the allocator's classes (:func:`split`) do
        not count, and a smaller shard holds a smaller first sub-filter, whose meeting probes
        (:func:`native_excess`) may take it past its rate. A stored filter keeps its record's.
        """
        bits, k = self.geometry()
        if self.native and self.shards is None:
            most = 2 ** (DEFAULT_SHARD_BIT if self.shard_bit is None else self.shard_bit)
            shards = -(-bits // min(most, MAX_SHARD_BITS))
            return FilterSpec(shards, -(-bits // (8 * shards)) * 8, k)
        return split(bits, k, self.shards, self.shard_bit, self.block_bits)


#: The fields of a request's text and their types (:meth:`Sizing.parse`).
_CANONICAL: dict[str, type] = {
    "capacity": int, "error_rate": float, "bit": int, "hash_number": int, "shard_bit": int,
    "shards": int, "blocked": bool,
}  # fmt: skip


def rate_share(expansion: int, ttl: int, tightening: float) -> float:
    """Return the share of the error rate generation 0 is sized for (:attr:`Sizing.rate_share`)."""
    return (1 - tightening if expansion else 1.0) * (0.5 if ttl else 1.0)


def split(
    bits: int, hash_count: int, shards: int | None, shard_bit: int | None, block_bits: int = 0
) -> FilterSpec:
    """Split at least ``bits`` bits into equal shards that fill their Redis allocations.

    ``shards`` of them, else the largest allocator block within :data:`ALLOCATION_SLACK` of
    the bits, or failing that the cheapest. ValueError for a request no geometry satisfies.
    """
    unit = max(block_bits, 8)  # shard payloads in whole bytes, or whole blocks
    overhead = STRING_OVERHEAD + HEADER_BYTES
    need = -(-bits // unit) * unit // 8  # bytes of bits
    if shards is not None:
        payload = -(-need * 8 // shards // unit) * unit // 8
        if payload * 8 > MAX_SHARD_BITS:
            raise ValueError(f"{shards:,} shards of {payload * 8:,} bits exceed a Redis string")
        block = allocation(payload + overhead)
        shard_bits = min((block - overhead) * 8, MAX_SHARD_BITS) // unit * unit
        return FilterSpec(shards, shard_bits, hash_count, block_bits)
    max_payload = min(2 ** (DEFAULT_SHARD_BIT if shard_bit is None else shard_bit), MAX_SHARD_BITS)
    max_payload //= 8
    cap = allocation(min(max_payload, need) + overhead)
    best: tuple[int, int] | None = None  # (total bytes, payload bits)
    for block in allocation_classes(cap):
        if not overhead < block <= max_payload + overhead or (block - overhead) * 8 < unit:
            continue
        payload_bits = (block - overhead) * 8 // unit * unit
        total = -(-need * 8 // payload_bits) * (block + KEY_OVERHEAD)
        if best is None or total < best[0]:
            best = (total, payload_bits)
        if total <= need * (1 + ALLOCATION_SLACK):
            best = (total, payload_bits)
            break
    if best is None:
        raise ValueError(f"no shard of at most {max_payload:,} bytes fits an allocator block")
    return FilterSpec(-(-bits // best[1]), best[1], hash_count, block_bits)


def format_bytes(nbytes: int) -> str:
    """Format a byte count for humans (binary units)."""
    size = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.1f} {unit}" if unit != "B" else f"{nbytes} B"
        size /= 1024
    return f"{size:.1f} TiB"


# -- what each layout costs: memory, and Redis time per check --------------------------

#: The layouts :func:`layout_costs` compares: bitmap classic and blocked, and native (BF.*).
Layout = Literal["classic", "blocked", "native"]
LAYOUTS: tuple[Layout, ...] = ("classic", "blocked", "native")

# :func:`check_cost`'s parameters, fitted to bench/run.py --only t (bench/NOTES.md).
#: Bytes of a filter that stay in the CPU's caches between two checks (1.8 MiB).
CACHE_BYTES = 1_887_437
#: A BITFIELD's own cost, and each field's (k bits, identity, a growing shard's count).
COMMAND_US = 1.05
FIELD_US = 0.12
#: A bit's cache miss, and a blocked filter's one block's.
BIT_MISS_US = 0.37
BLOCK_MISS_US = 1.22
#: The native backend (BF.INSERT ... NOCREATE): its command, and each bit's miss.
NATIVE_COMMAND_US = 0.95
NATIVE_MISS_US = 0.174


def miss_share(nbytes: int) -> float:
    """Return the share of a filter's random bit reads that miss the CPU's caches."""
    return max(0.0, 1.0 - CACHE_BYTES / nbytes) if nbytes > 0 else 0.0


def check_cost(layout: Layout, hash_count: int, nbytes: int, *, growing: bool = True) -> float:
    """Return the estimated Redis time (µs) of one check on ``nbytes`` (ratios count)."""
    share = miss_share(nbytes)
    if layout == "native":
        return NATIVE_COMMAND_US + hash_count * NATIVE_MISS_US * share
    fields = hash_count + (2 if growing else 1)
    misses = BLOCK_MISS_US if layout == "blocked" else hash_count * BIT_MISS_US
    return COMMAND_US + fields * FIELD_US + misses * share


@dataclass(frozen=True, slots=True)
class LayoutCost:
    """One layout's figures for a request: its k, memory, rate at capacity, time per check."""

    layout: Layout
    hash_count: int
    memory_bytes: int
    error_rate: float
    check_us: float


def layout_costs(
    sizing: Sizing, capacity: int, *, growing: bool = True, servers: int = 1
) -> tuple[LayoutCost, ...]:
    """Return what each layout costs for ``sizing`` at ``capacity`` (native: as RedisBloom)."""
    found: list[LayoutCost] = []
    classic = replace(sizing, blocked=False, native=False).spec()
    if sizing.capacity is not None and sizing.error_rate is not None:
        rate = sizing.error_rate * sizing.rate_share
    else:
        rate = false_positive_rate(classic.bits, classic.hash_count, capacity)
    for layout in LAYOUTS:
        if layout == "native":
            if rate <= 0:  # (below the least float: no RedisBloom filter is sized by it)
                continue
            bits, k = native_geometry(capacity, rate)
            per_shard = -(-bits // classic.shards) // 8 + 1
            memory = classic.shards * allocation(per_shard + STRING_OVERHEAD)
            expected = false_positive_rate(bits, k, capacity)
        else:
            spec = classic if layout == "classic" else replace(sizing, blocked=True).spec()
            k, memory = spec.hash_count, filter_allocation(spec)
            expected = false_positive_rate(spec.bits, k, capacity, spec.block_bits)
        cost = check_cost(layout, k, memory // max(1, servers), growing=growing)
        found.append(LayoutCost(layout, k, memory, expected, cost))
    return tuple(found)
