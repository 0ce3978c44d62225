"""Hashing scheme: from a fingerprint to one shard and k bit offsets inside it.

Specified in docs/explanation/hashing.md, so that any worker, the CLI or another language
(``engine/lua/scheme.lua``) computes the same bits: one formula (enhanced triple hashing of
``MurmurHash3_x64_128``) in three schemes: 3 (classic), 2 (blocked: in one 512-bit block, a
cache line) and 1 (classic filters of earlier builds: two seeds, not three).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import cast, overload

import mmh3

#: Versions of the scheme, stored in the filter's record: 1 is kept for the filters made with it.
SCHEME_VERSION = 1
#: The blocked scheme's version, and its block: 512 bits, one 64-byte cache line.
BLOCKED_SCHEME = 2
BLOCK_BITS = 512
#: A new classic filter's version: the offsets of scheme 1 with a third seed.
CLASSIC_SCHEME = 3
#: Most values a seed takes (Lua doubles are exact below 2**53; a multiple of B**2).
WIDE = 2**52

#: Most bits in one shard: a Redis string's 2**32 bits less the 256-bit header.
MAX_SHARD_BITS = 2**32 - 256
#: Most hash functions: beyond 64, a lower error rate costs more than it gains.
MAX_HASH_COUNT = 64
#: Most shards: 2**48 bits in shards of 2**26.
MAX_SHARDS = 2**22


@dataclass(frozen=True, slots=True)
class FilterSpec:
    """Geometry of one Bloom filter: what a worker must agree on to share its bits."""

    shards: int
    shard_bits: int
    hash_count: int
    #: :data:`BLOCK_BITS` for scheme 2 (blocked), else 0.
    block_bits: int = 0
    #: Scheme 1: a classic filter created before scheme 3 (never a new filter).
    two_seeds: bool = False
    #: :func:`seed_range`, set once: every check that misses the near-cache reads it.
    seed_range: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.shards <= MAX_SHARDS:
            raise ValueError(f"a filter has 1 to {MAX_SHARDS:,} shards, got {self.shards:,}")
        if not 1 <= self.shard_bits <= MAX_SHARD_BITS:
            raise ValueError(
                f"a shard holds 1 to {MAX_SHARD_BITS:,} bits (a Redis string's limit less its"
                f" header), got {self.shard_bits:,}"
            )
        if not 1 <= self.hash_count <= MAX_HASH_COUNT:
            raise ValueError(
                f"a filter has 1 to {MAX_HASH_COUNT} hash functions, got {self.hash_count:,}"
            )
        if self.block_bits not in (0, BLOCK_BITS):
            raise ValueError(f"a block has {BLOCK_BITS} bits (or 0: none), got {self.block_bits:,}")
        if self.block_bits and self.two_seeds:
            raise ValueError("a blocked filter's offsets have three seeds, not two")
        if self.block_bits and self.shard_bits % self.block_bits:
            raise ValueError(
                f"a blocked filter's shard holds a whole number of {self.block_bits}-bit blocks,"
                f" got {self.shard_bits:,} bits"
            )
        object.__setattr__(
            self, "seed_range", seed_range(self.shard_bits, self.block_bits, self.two_seeds)
        )

    @property
    def scheme(self) -> int:
        """The hashing scheme's version: 2 when blocked, else 3 (1 with two seeds)."""
        if self.block_bits:
            return BLOCKED_SCHEME
        return SCHEME_VERSION if self.two_seeds else CLASSIC_SCHEME

    @property
    def geometry(self) -> tuple[int, int, int, int]:
        """Shards, bits per shard, hash functions and block: what sizing decides (no scheme)."""
        return self.shards, self.shard_bits, self.hash_count, self.block_bits

    @property
    def bits(self) -> int:
        """Total number of bits m over all shards."""
        return self.shards * self.shard_bits

    @property
    def shard_bytes(self) -> int:
        """Bytes of one shard's Redis string."""
        return (self.shard_bits + 7) // 8

    @property
    def total_bytes(self) -> int:
        """Bytes of all shards' bitmaps together (without Redis's per-key overhead)."""
        return self.shards * self.shard_bytes


def hashable(element: object, method: str = "", position: int | None = None) -> str | bytes:
    """Return what mmh3 and Redis are given for an element: the hash it always had, safely.

    mmh3 crashes the process (SIGSEGV) on a lone surrogate (``os.fsdecode``): a non-ASCII str
    goes as UTF-8 with surrogates passed through, the same hash and item for every other str.
    """
    if isinstance(element, str):
        return element if element.isascii() else element.encode("utf-8", "surrogatepass")
    if isinstance(element, bytes):
        return element
    where = f"{method}(): " if method else ""
    at = "" if position is None else f" at position {position:,}"
    raise TypeError(
        f"{where}a Bloom filter element is a str or bytes; the element{at} is"
        f" {type(element).__name__}: {element!r:.60}"
    )


@overload
def hashables(elements: Iterable[object], method: str) -> list[str | bytes]: ...
@overload
def hashables(elements: Iterable[object], method: str, lazy: bool) -> Iterable[str | bytes]: ...
def hashables(elements: Iterable[object], method: str, lazy: bool = False) -> Iterable[str | bytes]:
    """Return a collection's elements through :func:`hashable`, for the method ``method``.

    A sequence (without ``lazy``, any iterable) is checked whole before anything is written;
    with ``lazy``, another iterable is checked as it is consumed (in bounded memory).
    """
    if isinstance(elements, (str, bytes, bytearray)):
        raise TypeError(
            f"{method}() takes a collection of elements (e.g. a list), got one"
            f" {type(elements).__name__}: {elements!r:.60} (one element: check_and_add()"
            " or contains())"
        )
    if not isinstance(elements, Iterable):
        raise TypeError(f"{method}() takes an iterable of elements, got {type(elements).__name__}")
    if lazy and not isinstance(elements, Sequence):
        return _checked(elements, method)
    items = elements if isinstance(elements, list) else list(elements)
    try:
        if all(map(str.isascii, items)):  # the usual: ASCII strs, as they are (in C)
            return cast("list[str | bytes]", items)
    except TypeError:  # an element not a str
        pass
    try:
        return [e if type(e) is str and e.isascii() else hashable(e) for e in items]
    except TypeError:
        for i, e in enumerate(items):
            hashable(e, method, i)  # raises, naming the first element refused
        raise


def _checked(elements: Iterable[object], method: str) -> Iterator[str | bytes]:
    """Yield an iterable's elements through :func:`hashable` as they come."""
    for i, e in enumerate(elements):
        yield e if type(e) is str and e.isascii() else hashable(e, method, i)


def locate(element: str | bytes, spec: FilterSpec) -> tuple[int, int, int]:
    """Return ``(shard, x, y)`` for an element of a filter, the seeds of :func:`offsets`."""
    h1, h2 = mmh3.hash64(element, seed=0, x64arch=True, signed=False)
    return place(h1, h2, spec.shards, spec.shard_bits, spec.seed_range)


def place(h1: int, h2: int, shards: int, shard_bits: int, seeds: int) -> tuple[int, int, int]:
    """Return ``(shard, x, y)`` from an element's mmh3 halves; ``seeds``: its seed range."""
    return h1 % shards, (h1 // shards) % shard_bits, h2 % seeds


def seed_range(bits: int, block_bits: int, two_seeds: bool = False) -> int:
    """Return what ``y`` (the second and third seeds) is taken modulo in ``bits`` bits."""
    if block_bits:
        return block_bits * block_bits
    if two_seeds:
        return bits
    return bits * min(bits, WIDE // bits)


def offsets(
    x: int, y: int, hash_count: int, shard_bits: int, block_bits: int = 0, first: int = 0
) -> list[int]:
    """Return the k bit offsets inside a shard, each plus ``first`` (the header's bits).

    ``(x - s) + (s + i b + i (i - 1) / 2 c + (i**3 - i) / 6) mod span``, with ``s = x mod
    span``, ``b = y mod span``, ``c = y div span``: closed form for the bulk path's millions.
    """
    span = block_bits or shard_bits
    start = x % span
    base, step, third = x - start + first, y % span, y // span
    return [
        base + (start + i * step + t * third + c) % span for i, t, c in offset_steps(hash_count)
    ]


def block_masks(
    seeds: Iterable[tuple[int, int, int]], hash_count: int, first: int = 0
) -> list[tuple[int, int]]:
    """Return blocked elements' ``(block start, bits)``, offset ``p`` as bit ``B - 1 - p``."""
    by_step, by_third = _block_terms(hash_count)
    low, bit = BLOCK_BITS - 1, _BLOCK_BIT
    pairs: list[tuple[int, int]] = []
    for _, x, y in seeds:
        start, mask = x & low, 0
        for a, b in zip(by_step[y & low], by_third[y >> _BLOCK_SHIFT], strict=True):
            mask |= bit[(start + a + b) & low]
        pairs.append((x - start + first, mask))
    return pairs


#: The block's bits by offset, as :func:`block_masks` numbers them.
_BLOCK_BIT = tuple(1 << (BLOCK_BITS - 1 - p) for p in range(BLOCK_BITS))
_BLOCK_SHIFT = BLOCK_BITS.bit_length() - 1
assert 1 << _BLOCK_SHIFT == BLOCK_BITS  # a power of two: masks and shifts are mod and div


@lru_cache(maxsize=64)
def _block_terms(hash_count: int) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """Return :func:`block_masks`' tables: per first seed its k terms, per second seed its k."""
    steps = offset_steps(hash_count)
    by_step = [tuple(i * y1 for i, _, _ in steps) for y1 in range(BLOCK_BITS)]
    by_third = [tuple(t * y2 + c for _, t, c in steps) for y2 in range(BLOCK_BITS)]
    return by_step, by_third


@lru_cache(maxsize=64)
def offset_steps(hash_count: int) -> tuple[tuple[int, int, int], ...]:
    """Return ``(i, i (i - 1) / 2, (i**3 - i) / 6)`` for i in 0 .. k-1: offsets()'s constants."""
    return tuple((i, i * (i - 1) // 2, (i**3 - i) // 6) for i in range(hash_count))


@lru_cache(maxsize=64)
def distinct_bits(hash_count: int, span: int) -> float:
    """Return how many distinct bits one element sets, on average, among its k offsets.

    Offsets ``i`` and ``j`` coincide with probability ``g / span`` if ``g = gcd(j - i, t_j -
    t_i, span)`` divides ``c_j - c_i``, else never: k less the expected pairs (first order).
    """
    steps = offset_steps(hash_count)
    pairs = 0.0
    for a, (i, t_i, c_i) in enumerate(steps):
        for j, t_j, c_j in steps[a + 1 :]:
            g = math.gcd(j - i, t_j - t_i, span)
            if (c_j - c_i) % g == 0:
                pairs += g / span
    return hash_count - pairs
