"""Check-and-add computed in Python on a copy of a shard's bytes (the snapshot kernel).

The answers equal check-and-add on each element in order (:func:`check_sequential`, the
definition); :func:`check_vectorised` does the same with numpy.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import mmh3

from scrapy_redis_bloom.core.generations import Generation
from scrapy_redis_bloom.core.hashing import (
    BLOCK_BITS,
    WIDE,
    FilterSpec,
    block_masks,
    locate,
    offsets,
)
from scrapy_redis_bloom.core.layout import HEADER_BITS, HEADER_BYTES
from scrapy_redis_bloom.core.versions import NUMPY_MINIMUM, parse_version

# HAVE_NUMPY: the optional extra is installed, at its minimum version or newer.
try:
    import numpy as np
except ImportError:
    HAVE_NUMPY = False
else:
    HAVE_NUMPY = parse_version(np.__version__) >= NUMPY_MINIMUM

if TYPE_CHECKING:
    from numpy.typing import NDArray


#: Elements answered together by :func:`check_vectorised` (their k bits sorted at once).
SLICE = 8_192
#: The most elements whose offsets :meth:`Located.offsets` computes at once (memory).
ALL_OFFSETS = 131_072
#: Bytes of one block of a blocked filter.
BLOCK_BYTES = BLOCK_BITS // 8


class Located:
    """A batch of elements hashed: each one's shard and seeds, and offsets on demand."""

    def __init__(self, elements: Sequence[str | bytes], spec: FilterSpec, vectorised: bool) -> None:
        self.size = len(elements)
        self.spec = spec
        self.vectorised = vectorised
        self._elements = elements
        self._wide: Any = None
        self._offsets: dict[Generation | None, Any] = {}  # (all elements', per generation)
        if vectorised:
            self.shard, self.x, self.y = locate_many(elements, spec)
            self._seeds: list[tuple[int, int, int]] = []
        else:
            self._seeds = [locate(element, spec) for element in elements]

    def crowded(self, least: int) -> dict[int, Any]:
        """Return the positions of the elements of each shard with at least ``least``."""
        if self.vectorised:
            counts = np.bincount(self.shard, minlength=self.spec.shards)
            busy = np.flatnonzero(counts >= least)
            if not len(busy):
                return {}
            order = np.argsort(self.shard, kind="stable")
            starts = np.concatenate(([0], np.cumsum(counts)))
            return {int(s): order[starts[s] : starts[s + 1]] for s in busy.tolist()}
        groups: dict[int, list[int]] = {}
        for position, (shard, _, _) in enumerate(self._seeds):
            groups.setdefault(shard, []).append(position)
        return {shard: group for shard, group in groups.items() if len(group) >= least}

    def offsets(self, positions: Any, generation: Generation | None = None) -> Any:
        """Return the bit offsets (header included) of the elements at ``positions``.

        An (n, k) array, or lists (pairs for a blocked filter); ``generation``: in that one.
        """
        g, spec = generation, self.spec
        k, block = (g or spec).hash_count, (g or spec).block_bits
        bits = spec.shard_bits if g is None else g.bits
        if self.vectorised:
            every = self.size <= ALL_OFFSETS  # all at once: numpy's cost is per call
            if every and g in self._offsets:
                return self._offsets[g][positions]
            chosen = slice(None) if every else positions  # else a shard's: bounded memory
            if g is None:
                x, y = self.x[chosen], self.y[chosen]
            else:
                if self._wide is None:
                    h1, h2 = hashes_many(self._elements)
                    shards = np.uint64(spec.shards)
                    self._wide = (h1 // shards) % np.uint64(WIDE), h2 % np.uint64(WIDE)
                x = (self._wide[0][chosen] % np.uint64(bits)).astype(np.int64)
                y = (self._wide[1][chosen] % np.uint64(g.seed_range)).astype(np.int64)
            found = offsets_many(x, y, k, bits, block)
            if not every:
                return found
            self._offsets[g] = found
            return found[positions]
        if g is None:
            wide = [self._seeds[p] for p in positions]
        else:
            known: dict[int, tuple[int, int]] = self._wide if self._wide is not None else {}
            self._wide = known
            wide = []
            for p in positions:
                seeds = known.get(p)
                if seeds is None:
                    a, b = mmh3.hash64(self._elements[p], seed=0, x64arch=True, signed=False)
                    seeds = known[p] = (a // spec.shards) % WIDE, b % WIDE
                wide.append((0, seeds[0] % bits, seeds[1] % g.seed_range))
        if block:
            return block_masks(wide, k, HEADER_BITS)
        return [offsets(sx, sy, k, bits, block, HEADER_BITS) for _, sx, sy in wide]

    def outside(self, taken: Sequence[Any]) -> list[int]:
        """Return the positions that are in none of the ``taken`` groups of positions."""
        if self.vectorised:
            left = np.ones(self.size, dtype=bool)
            for positions in taken:
                left[positions] = False
            return [int(p) for p in np.flatnonzero(left).tolist()]
        done = {position for positions in taken for position in positions}
        return [position for position in range(self.size) if position not in done]

    def placed(self, parts: Sequence[tuple[Any, Sequence[bool]]]) -> list[bool]:
        """Return the answers: each part's answers at its positions, False elsewhere."""
        if self.vectorised:
            array = np.zeros(self.size, dtype=bool)
            for positions, values in parts:
                array[positions] = values
            listed: list[bool] = array.tolist()
            return listed
        answers = [False] * self.size
        for positions, values in parts:
            for position, value in zip(positions, values, strict=True):
                answers[position] = value
        return answers


def within(seen: Any, room: int) -> int:
    """Return how many elements come before the ``room + 1``-th not ``seen`` (all: len)."""
    if isinstance(seen, list):
        missing: Any = [i for i, there in enumerate(seen) if not there]
    else:
        missing = np.flatnonzero(~seen)
    room = max(room, 0)
    return int(missing[room]) if len(missing) > room else len(seen)


def locate_many(
    elements: Sequence[str | bytes], spec: FilterSpec
) -> tuple[NDArray[Any], NDArray[Any], NDArray[Any]]:
    """Return ``(shard, x, y)`` arrays for elements: :func:`..hashing.locate`, vectorised."""
    h1, h2 = hashes_many(elements)
    n, s = np.uint64(spec.shards), np.uint64(spec.shard_bits)
    return (
        (h1 % n).astype(np.int64),
        ((h1 // n) % s).astype(np.int64),
        (h2 % np.uint64(spec.seed_range)).astype(np.int64),
    )


def hashes_many(elements: Sequence[str | bytes]) -> tuple[NDArray[Any], NDArray[Any]]:
    """Return the elements' mmh3 halves ``h1`` and ``h2``: ``hash_bytes``' little-endian u64s."""
    raw = np.frombuffer(b"".join(map(mmh3.hash_bytes, elements)), dtype="<u8")
    return raw[0::2], raw[1::2]


def offsets_many(
    x: NDArray[Any], y: NDArray[Any], hash_count: int, shard_bits: int, block_bits: int = 0
) -> NDArray[Any]:
    """Return each element's k bit offsets in its shard's string, header included, as (n, k)."""
    span = block_bits or shard_bits
    out = np.empty((hash_count, len(x)), dtype=np.int64)
    cx, cy = x.astype(np.int64), y.astype(np.int64)
    cx, base = cx % span, cx - cx % span + HEADER_BITS
    cy, third = cy % span, cy // span
    out[0] = cx
    for i in range(1, hash_count):
        cx += cy
        cx -= span * (cx >= span)
        cy += i % span + third
        cy -= span * (cy >= span)
        cy -= span * (cy >= span)
        out[i] = cx
    out += base
    # Contiguous rows: fancy indexing of the transposed view costs as much as the kernel.
    return np.ascontiguousarray(out.T)


def check_vectorised(
    buffer: bytearray, offsets: NDArray[Any], write: bool
) -> tuple[list[bool], int, int]:
    """Answer elements from a shard's bytes (``write``: set their bits); answers, changed span."""
    answers: list[bool] = []
    low, high = len(buffer), 0
    for first in range(0, offsets.shape[0], SLICE):
        answered, start, stop = _check_slice(buffer, offsets[first : first + SLICE], write)
        answers += answered
        if start < stop:
            low, high = min(low, start), max(high, stop)
    return (answers, low, high) if low < high else (answers, 0, 0)


def _check_slice(
    buffer: bytearray, offsets: NDArray[Any], write: bool
) -> tuple[list[bool], int, int]:
    copy = np.frombuffer(buffer, dtype=np.uint8)
    flat = offsets.reshape(-1)
    have = ((copy[flat >> 3] >> (7 - (flat & 7)).astype(np.uint8)) & 1).astype(bool)
    have = have.reshape(offsets.shape)
    if not write:
        return have.all(axis=1).tolist(), 0, 0
    clear = ~have
    if not clear.any():
        return [True] * offsets.shape[0], 0, 0
    shared = _shared(offsets)
    if shared is not None:
        return _check_windows(copy, offsets, clear, shared)
    new, low, high = _first_setters(copy, offsets, clear)
    return (~new).tolist(), low, high


#: ``offset >> _WINDOW_SHIFT``: ``offset // BLOCK_BITS``.
_WINDOW_SHIFT = BLOCK_BITS.bit_length() - 1


def _shared(offsets: NDArray[Any]) -> NDArray[Any] | None:
    """Return per row whether another row shares its block; None: one sort costs less."""
    first = (offsets[0] - HEADER_BITS) >> _WINDOW_SHIFT  # (a shift: floor, as //, but cheaper)
    if bool((first != first[0]).any()):
        return None  # the first row straddles: a classic filter's (spread over the shard)
    windows = (offsets[:, 0] - HEADER_BITS) >> _WINDOW_SHIFT
    low = windows.min()
    shared: NDArray[Any] = np.bincount(windows - low)[windows - low] > 1
    if int(np.count_nonzero(shared)) * 4 > 3 * len(shared):
        return None
    if not bool((((offsets - HEADER_BITS) >> _WINDOW_SHIFT) == windows[:, None]).all()):
        return None
    return shared


def _check_windows(
    copy: NDArray[Any], offsets: NDArray[Any], clear: NDArray[Any], shared: NDArray[Any]
) -> tuple[list[bool], int, int]:
    """Do what :func:`_check_slice` does, sorting only the rows that share a block."""
    new: NDArray[Any] = np.asarray(clear.any(axis=1))
    if shared.any():
        rows = np.flatnonzero(shared)  # in order: earlier rows first, as the slice has them
        new[rows] = _first_setters(copy, offsets[rows], clear[rows])[0]
    # The alone rows' bits, a column at a time: no two rows share a byte.
    lonely = offsets[~shared]
    for column in range(lonely.shape[1]):
        bit = lonely[:, column]
        copy[bit >> 3] |= (np.uint8(0x80) >> (bit & 7).astype(np.uint8)).astype(np.uint8)
    where = offsets[clear] >> 3
    return (~new).tolist(), int(where.min()), int(where.max()) + 1


def _first_setters(
    copy: NDArray[Any], offsets: NDArray[Any], clear: NDArray[Any]
) -> tuple[NDArray[Any], int, int]:
    """Return which rows are new (first to want a clear bit) and the span changed; set them."""
    n = offsets.shape[0]
    if not clear.any():
        return np.zeros(n, dtype=bool), 0, 0
    # Clear bits with their element, sorted: the first of each bit's run sets it (new).
    shift = max(1, n.bit_length())
    owners = np.broadcast_to(np.arange(n, dtype=np.int64)[:, None], offsets.shape)[clear]
    keys = np.sort((offsets[clear] << shift) | owners)
    bits = keys >> shift
    first = np.ones(len(keys), dtype=bool)
    first[1:] = bits[1:] != bits[:-1]
    new = np.zeros(n, dtype=bool)
    new[keys[first] & ((1 << shift) - 1)] = True
    # Set the clear bits: OR the masks of bits sharing a byte, then into the copy.
    wanted = bits[first]
    where = wanted >> 3
    masks = (np.uint8(0x80) >> (wanted & 7).astype(np.uint8)).astype(np.uint8)
    starts = np.flatnonzero(np.concatenate(([True], where[1:] != where[:-1])))
    copy[where[starts]] |= np.bitwise_or.reduceat(masks, starts)
    return new, int(where[0]), int(where[-1]) + 1


def check_masks(
    buffer: bytearray, pairs: Sequence[tuple[int, int]], write: bool
) -> tuple[list[bool], int, int]:
    """Do what :func:`check_sequential` does for blocked elements: a block as an integer."""
    answers: list[bool] = []
    append = answers.append
    low, high = len(buffer), 0
    for start, bits in pairs:
        at = start >> 3
        block = int.from_bytes(buffer[at : at + BLOCK_BYTES], "big")
        if block & bits == bits:
            append(True)
            continue
        append(False)
        if write:
            buffer[at : at + BLOCK_BYTES] = (block | bits).to_bytes(BLOCK_BYTES, "big")
            low, high = min(low, at), max(high, at + BLOCK_BYTES)
    return (answers, low, high) if low < high else (answers, 0, 0)


def check_sequential(
    buffer: bytearray, offsets: Sequence[Sequence[int]], write: bool
) -> tuple[list[bool], int, int]:
    """Do what :func:`check_vectorised` does, one element at a time: the definition."""
    answers: list[bool] = []
    low, high = len(buffer), -1
    for element in offsets:
        seen = True
        for offset in element:
            byte, mask = offset >> 3, 0x80 >> (offset & 7)
            if not buffer[byte] & mask:
                seen = False
                if write:
                    buffer[byte] |= mask
                    low, high = min(low, byte), max(high, byte)
        answers.append(seen)
    return (answers, low, high + 1) if low <= high else (answers, 0, 0)


def gather(offsets: Any) -> tuple[Any, Any]:
    """Return the blocks a blocked batch touches, and its offsets in the compact copy of them."""
    if isinstance(offsets, list):  # (a pair's first item is its block's start)
        touched = [(element[0] - HEADER_BITS) // BLOCK_BITS for element in offsets]
        blocks = sorted(set(touched))
        slot = {block: i for i, block in enumerate(blocks)}
        if is_masks(offsets):
            return blocks, [
                (HEADER_BITS + slot[block] * BLOCK_BITS, bits)
                for (_, bits), block in zip(offsets, touched, strict=True)
            ]
        return blocks, [
            [offset + (slot[block] - block) * BLOCK_BITS for offset in element]
            for element, block in zip(offsets, touched, strict=True)
        ]
    touched_array = (offsets[:, 0] - HEADER_BITS) // BLOCK_BITS
    unique, slots = np.unique(touched_array, return_inverse=True)
    return unique, offsets + ((slots.reshape(-1) - touched_array) * BLOCK_BITS)[:, None]


def is_masks(offsets: Any) -> bool:
    """Tell whether a batch's offsets are :func:`masks`' pairs (else lists, or an array)."""
    return isinstance(offsets, list) and bool(offsets) and isinstance(offsets[0], tuple)


def changed_slots(before: bytes, after: bytearray) -> list[int]:
    """Return the slots of a compact copy (see :func:`gather`) whose bytes differ."""
    if HAVE_NUMPY:
        differ: list[int] = _changed(before, after).tolist()
        return differ
    starts, end = range(HEADER_BYTES, len(after), BLOCK_BYTES), BLOCK_BYTES
    return [i for i, at in enumerate(starts) if before[at : at + end] != after[at : at + end]]


def _rows(copy: bytes | bytearray) -> NDArray[Any]:
    """Return a compact copy's slots (see :func:`gather`) as rows of bytes (numpy)."""
    return np.frombuffer(copy, dtype=np.uint8)[HEADER_BYTES:].reshape(-1, BLOCK_BYTES)


def _changed(before: bytes, after: bytearray) -> NDArray[Any]:
    return np.flatnonzero((_rows(before) != _rows(after)).any(axis=1))


def packed_runs(blocks: Sequence[int], slots: Sequence[int], longest: int) -> bytes:
    """Pack ``slots`` (sorted) as :func:`runs`, each as its first block and length (u32)."""
    if not HAVE_NUMPY:
        flat = [
            value
            for first, stop in runs(blocks, slots, longest)
            for value in (blocks[first], stop - first)
        ]
        return struct.pack(f">{len(flat)}I", *flat)
    chosen = np.asarray(slots, dtype=np.int64)
    if not len(chosen):
        return b""
    at = np.asarray(blocks, dtype=np.int64)[chosen]
    first = _run_firsts(at, chosen[1:] != chosen[:-1] + 1, longest)
    counts = np.diff(np.append(first, len(chosen)))
    return np.stack([at[first], counts], axis=1).astype(">u4").tobytes()


def _run_firsts(at: NDArray[Any], apart: NDArray[Any], longest: int) -> NDArray[Any]:
    """Return where each run of ``at`` starts (``apart[i]``: a run ends at i; ``longest``)."""
    start = np.ones(len(at), dtype=bool)
    start[1:] = apart | (at[1:] != at[:-1] + 1)
    first = np.flatnonzero(start)
    # A run longer than ``longest`` is cut every ``longest`` blocks.
    start |= (np.arange(len(at)) - first[np.cumsum(start) - 1]) % longest == 0
    return np.flatnonzero(start)


def range_reads(
    keys: Sequence[bytes], blocks: Sequence[NDArray[Any]], longest: int
) -> list[tuple[bytes, int]]:
    """Pack a ``GETRANGE`` of each run of each shard's ``blocks`` (numpy), per shard."""
    sizes = [len(b) for b in blocks]
    if not sum(sizes):
        return [(b"", 0) for _ in blocks]
    shard = np.repeat(np.arange(len(blocks)), sizes)
    at = np.concatenate(blocks).astype(np.int64)
    first = _run_firsts(at, shard[1:] != shard[:-1], longest)
    counts = np.diff(np.append(first, len(at)))
    offsets = HEADER_BYTES + at[first] * BLOCK_BYTES
    owner = shard[first]
    packed, lengths = range_commands(
        b"GETRANGE", keys, owner, offsets, offsets + counts * BLOCK_BYTES - 1
    )
    runs = np.bincount(owner, minlength=len(blocks))
    ends = np.cumsum(np.bincount(owner, weights=lengths, minlength=len(blocks)).astype(np.int64))
    bounds = [0, *ends.tolist()]
    return [(packed[bounds[i] : bounds[i + 1]], int(runs[i])) for i in range(len(blocks))]


def range_writes(
    keys: Sequence[bytes],
    blocks: Sequence[NDArray[Any]],
    before: Sequence[bytes],
    after: Sequence[bytearray],
) -> tuple[bytes, int]:
    """Pack a ``SETRANGE`` of each block changed in each shard's compact copy (numpy)."""
    owners, offsets, rows = [], [], []
    for i, (read, left) in enumerate(zip(before, after, strict=True)):
        slots = _changed(read, left)
        owners.append(np.full(len(slots), i))
        offsets.append(HEADER_BYTES + blocks[i][slots].astype(np.int64) * BLOCK_BYTES)
        rows.append(_rows(left)[slots])
    owner = np.concatenate(owners)
    packed, _ = range_commands(
        b"SETRANGE", keys, owner, np.concatenate(offsets), np.concatenate(rows)
    )
    return packed, len(owner)


#: Decimal digits of an offset (a string is at most 512 MiB), and a cell's bytes (``$n\r\n..\r\n``).
_DIGITS = 9
_CELL = 4 + _DIGITS + 2


def range_commands(
    name: bytes,
    keys: Sequence[bytes],
    owner: NDArray[Any],
    offsets: NDArray[Any],
    second: NDArray[Any],
) -> tuple[bytes, NDArray[Any]]:
    """Pack ``name <key> <offset> <second>`` once per row, in a few array operations (numpy)."""
    n = len(offsets)
    head = b"*4\r\n$%d\r\n%b\r\n" % (len(name), name)
    named = [b"$%d\r\n%b\r\n" % (len(key), key) for key in keys]
    width = max(len(word) for word in named)
    table = np.zeros((len(keys), width), dtype=np.uint8)
    for i, word in enumerate(named):
        table[i, : len(word)] = np.frombuffer(word, np.uint8)
    lengths = np.fromiter(map(len, named), dtype=np.int64, count=len(named))
    tail = _CELL if second.ndim == 1 else len(b"$%d\r\n" % second.shape[1]) + second.shape[1] + 2
    row = np.empty((n, len(head) + width + _CELL + tail), dtype=np.uint8)
    used = np.ones(row.shape, dtype=bool)
    row[:, : len(head)] = np.frombuffer(head, np.uint8)
    at = len(head)
    row[:, at : at + width] = table[owner]
    used[:, at : at + width] = np.arange(width) < lengths[owner][:, None]
    at += width
    _decimal(offsets, row[:, at : at + _CELL], used[:, at : at + _CELL])
    at += _CELL
    if second.ndim == 1:
        _decimal(second, row[:, at:], used[:, at:])
    else:
        prefix = np.frombuffer(b"$%d\r\n" % second.shape[1], np.uint8)
        row[:, at : at + len(prefix)] = prefix
        row[:, at + len(prefix) : -2] = second
        row[:, -2:] = (13, 10)
    return row[used].tobytes(), row.shape[1] - (~used).sum(axis=1)


def _decimal(values: NDArray[Any], cell: NDArray[Any], used: NDArray[Any]) -> None:
    """Write each value as a RESP bulk string, right-aligned, in its row of ``cell`` (``used``)."""
    if len(values) and int(values.max()) >= 10**_DIGITS:
        raise ValueError(f"an offset of {int(values.max())} is beyond a Redis string")
    rest = values.astype(np.int32)
    digits = np.ones(len(values), dtype=np.int32)
    cell[:, 0] = ord("$")
    cell[:, 2:4] = (13, 10)
    cell[:, -2:] = (13, 10)
    for column in range(3 + _DIGITS, 3, -1):  # the last digit first
        cell[:, column] = rest % 10 + ord("0")
        rest //= 10
        digits += rest > 0
    cell[:, 1] = digits + ord("0")
    used[:, 4 : 4 + _DIGITS] = np.arange(_DIGITS) >= (_DIGITS - digits)[:, None]


def slot_bytes(copy: bytearray, slots: Sequence[int]) -> bytes:
    """Return the bytes of a compact copy's ``slots`` (:func:`gather`), in order: runs' bytes."""
    if not HAVE_NUMPY:
        return b"".join(
            copy[HEADER_BYTES + i * BLOCK_BYTES : HEADER_BYTES + (i + 1) * BLOCK_BYTES]
            for i in slots
        )
    return _rows(copy)[np.asarray(slots, dtype=np.intp)].tobytes()


def runs(blocks: Sequence[int], slots: Sequence[int], longest: int) -> list[tuple[int, int]]:
    """Group ``slots`` (sorted) into runs ``[first, stop)`` of neighbouring blocks."""
    out: list[tuple[int, int]] = []
    first = previous = -2
    for slot in slots:
        if slot == previous + 1 and blocks[slot] == blocks[previous] + 1 and slot - first < longest:
            previous = slot
            continue
        if first >= 0:
            out.append((first, previous + 1))
        first = previous = slot
    if first >= 0:
        out.append((first, previous + 1))
    return out
