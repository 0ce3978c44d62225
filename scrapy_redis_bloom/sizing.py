"""From what the user asks for (capacity and error rate, or bits and k) to a geometry.

Two ways to size a filter:

* ``bit`` / ``hash_number``: m = 2**bit bits and k hash functions, as in
  scrapy-redis-bloomfilter;
* ``capacity`` / ``error_rate``: m = -n ln p / (ln 2)**2 and k = (m / n) ln 2.

The bits are then split into equal shards sized to fill the blocks Redis's allocator
(jemalloc) reserves for them, so the spare bytes of a block become bits that lower
the false-positive rate instead of slack (:func:`split`).

:class:`Sizing` is the request itself, stored in the filter's record: a worker whose
request equals the stored one adopts the stored geometry, so a later release that
sizes differently never locks users out of a filter they already have.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .engine.layout import HEADER_BYTES
from .hashing import MAX_SHARD_BITS, FilterSpec

#: Shards of at most 2**26 bits (8 MiB): allocating one stalls Redis for
#: milliseconds, not the ~300 ms of a 512 MiB string.
DEFAULT_SHARD_BIT = 26
#: How much more than the bits need that the shards' Redis allocations may reserve.
ALLOCATION_SLACK = 0.02
#: Bytes a Redis string needs beyond its payload: the sds header (at most 9 bytes
#: below 4 GiB) and a NUL, rounded up.
STRING_OVERHEAD = 16
#: Bytes Redis spends per key besides the value's block: dict entry, object, key name
#: (measured: MEMORY USAGE of a 131,073-byte string is its 163,840-byte block + 56).
KEY_OVERHEAD = 56


def optimal_bits(capacity: int, error_rate: float) -> int:
    """Bits m that hold ``capacity`` items at ``error_rate``: -n ln p / (ln 2)**2."""
    return math.ceil(-capacity * math.log(error_rate) / math.log(2) ** 2)


def optimal_hash_count(bits: int, capacity: int) -> int:
    """Hash functions k that minimise the false-positive rate: (m / n) ln 2, at least 1."""
    return max(1, round(bits / capacity * math.log(2)))


def false_positive_rate(bits: int, hash_count: int, items: float) -> float:
    """Return the false-positive rate expected after ``items`` insertions: (1 - e**(-kn/m))**k."""
    return (-math.expm1(-hash_count * items / bits)) ** hash_count


def optimal_capacity(bits: int, hash_count: int) -> int:
    """Return the item count for which ``hash_count`` is the optimal k: m ln 2 / k."""
    return max(1, math.floor(bits * math.log(2) / hash_count))


def allocation(size: int) -> int:
    """Return the bytes jemalloc (Redis's allocator) reserves for a ``size``-byte block.

    jemalloc rounds a request up to a size class: 16-byte steps up to 128 bytes, then
    four classes per doubling (160, 192, 224, 256, 320, ...). A string one byte past a
    class costs the next one: an 8 MiB bitmap plus its header takes a 10 MiB block.
    """
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
    """What the user asked for; exactly one of the two ways is filled in.

    ``shard_bit`` (largest shard, 2**shard_bit bits) or ``shards`` (exact count)
    may be added to either way.
    """

    capacity: int | None = None
    error_rate: float | None = None
    bit: int | None = None
    hash_number: int | None = None
    shard_bit: int | None = None
    shards: int | None = None
    #: The share of ``error_rate`` generation 0 is sized for: below 1 when the filter
    #: grows (``1 - tightening``) or checks two re-crawl windows (1/2), so that all its
    #: generations and windows together stay under ``error_rate``. Not part of the
    #: request's text: it follows from BLOOMFILTER_EXPANSION and BLOOMFILTER_TTL,
    #: which the record stores on their own.
    rate_share: float = 1.0

    def canonical(self) -> str:
        """Return the request as the text stored in the record: stable across releases."""
        parts = [
            f"{name}={value!r}"
            for name in ("capacity", "error_rate", "bit", "hash_number", "shard_bit", "shards")
            if (value := getattr(self, name)) is not None
        ]
        return " ".join(parts)

    def geometry(self) -> tuple[int, int]:
        """Return (m, k) before sharding: the bits wanted and the hash functions."""
        if self.capacity is not None and self.error_rate is not None:
            bits = optimal_bits(self.capacity, self.error_rate * self.rate_share)
            return bits, optimal_hash_count(bits, self.capacity)
        if self.bit is None or self.hash_number is None:
            raise ValueError(f"an incomplete sizing: {self.canonical()!r}")
        return 2**self.bit, self.hash_number

    def spec(self) -> FilterSpec:
        """Return the geometry this release gives the request."""
        bits, k = self.geometry()
        return split(bits, k, self.shards, self.shard_bit)


def split(bits: int, hash_count: int, shards: int | None, shard_bit: int | None) -> FilterSpec:
    """Split at least ``bits`` bits into equal shards that fill their Redis allocations.

    With ``shards`` given, that many. Otherwise the largest allocator block (at most
    2**``shard_bit`` bits of payload) whose shards together take at most
    :data:`ALLOCATION_SLACK` more than ``bits`` needs (blocks and per-key overhead),
    or failing that the block that takes least. Raises ValueError for a request no
    geometry satisfies.
    """
    overhead = STRING_OVERHEAD + HEADER_BYTES
    need = -(-bits // 8)  # bytes of bits
    if shards is not None:
        payload = -(-need // shards)
        if payload * 8 > MAX_SHARD_BITS:
            raise ValueError(f"{shards:,} shards of {payload * 8:,} bits exceed a Redis string")
        block = allocation(payload + overhead)
        shard_bits = min((block - overhead) * 8, MAX_SHARD_BITS)
        return FilterSpec(shards=shards, shard_bits=shard_bits, hash_count=hash_count)

    max_payload = min(2 ** (DEFAULT_SHARD_BIT if shard_bit is None else shard_bit), MAX_SHARD_BITS)
    max_payload //= 8
    # The smallest block that holds as much payload as wanted, and the classes below it
    # whose payload is within the maximum.
    cap = allocation(min(max_payload, need) + overhead)
    candidates = [c for c in allocation_classes(cap) if overhead < c <= max_payload + overhead]
    best: tuple[int, int] | None = None  # (total bytes, block size)
    for block in candidates:
        total = -(-need // (block - overhead)) * (block + KEY_OVERHEAD)
        if best is None or total < best[0]:
            best = (total, block)
        if total <= need * (1 + ALLOCATION_SLACK):
            best = (total, block)
            break
    if best is None:
        raise ValueError(f"no shard of at most {max_payload:,} bytes fits an allocator block")
    payload_bits = (best[1] - overhead) * 8
    return FilterSpec(
        shards=-(-bits // payload_bits), shard_bits=payload_bits, hash_count=hash_count
    )


def format_bytes(nbytes: int) -> str:
    """Format a byte count for humans (binary units)."""
    size = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{nbytes} B"
        size /= 1024
    raise AssertionError("unreachable")
