"""Bulk calls: snapshots (numpy) and BITFIELD or script (pure Python) give check-and-add's answers.

Against real redis-servers: bulk answers equal one call per element in order, on fixed
and growing filters (across the growth boundary); concurrent bulk writers in several
processes find each element new exactly once; a snapshot whose shard another worker
writes to meanwhile falls back; a lost shard is found and recovered; a Redis SIGKILLed
and restarted (AOF) under bulk calls costs no answer, on every bulk path; a write that
ran but whose reply was lost (cut at that exact reply by a proxy, ``reply_cutter``)
never answers "seen", on every bulk path and pass. The numpy kernel is held to the
pure-Python definition by hypothesis.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import multiprocessing
import os
import queue
import random
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from redis_server import RedisServer
from reply_cutter import ReplyCutter

from scrapy_redis_bloom import BloomConfig, FaultPolicy, RedisBloomFilter
from scrapy_redis_bloom.core.generations import COUNT_BIT, GENERATIONS_BIT
from scrapy_redis_bloom.core.hashing import (
    BLOCK_BITS,
    MAX_SHARD_BITS,
    block_masks,
    locate,
    offsets,
)
from scrapy_redis_bloom.core.layout import HEADER_BITS
from scrapy_redis_bloom.engine.bitmap import bulk, snapshot
from scrapy_redis_bloom.engine.bitmap.local import HAVE_NUMPY, check_sequential
from scrapy_redis_bloom.engine.bitmap.wirecost import WireCost
from scrapy_redis_bloom.engine.scripts import READ_BLOCKS, WRITE_BLOCKS
from scrapy_redis_bloom.transport.wire import pack_command

needs_numpy = pytest.mark.skipif(not HAVE_NUMPY, reason="numpy (the numpy extra) is not installed")

GROWING = {"BLOOMFILTER_CAPACITY": 2_000, "BLOOMFILTER_ERROR_RATE": 1e-3, "BLOOMFILTER_SHARDS": 1}
FIXED = {
    "BLOOMFILTER_CAPACITY": 20_000,
    "BLOOMFILTER_ERROR_RATE": 1e-4,
    "BLOOMFILTER_SHARDS": 3,
    "BLOOMFILTER_EXPANSION": 0,
}

#: The same in the classic layout (a new filter's default is blocked).
CLASSIC = {**FIXED, "BLOOMFILTER_BLOCKED": False}
#: A growing filter with re-crawl windows: its current window grows as GROWING does.
WINDOWED = {**GROWING, "BLOOMFILTER_TTL": 3_600}
#: A growing filter of several shards in the classic layout (its generations read whole).
GROWING_CLASSIC = {**GROWING, "BLOOMFILTER_SHARDS": 2, "BLOOMFILTER_BLOCKED": False}


def fingerprints(n: int, tag: str) -> list[str]:
    return [hashlib.sha1(f"{tag}-{i}".encode()).hexdigest() for i in range(n)]


def make(client: Any, settings: dict[str, Any], key: str, **options: Any) -> RedisBloomFilter:
    return RedisBloomFilter.from_config(client, key, BloomConfig.from_settings(settings), **options)


def calls(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0))


def read_by_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make blocked shards' snapshots read their batch's blocks, never the whole shard.

    As 8 MiB shards with a few hundred elements do (:func:`snapshot.take`); the
    tests' shards are small enough to be read whole otherwise. The link is taken for
    loopback's: on a loaded machine its measure can exceed the noise floor, and small
    shards are then cheaper to move whole.
    """
    monkeypatch.setattr(bulk, "BLOCKS_NS_PER_ELEMENT", 1)
    monkeypatch.setattr(WireCost, "extra", lambda self, address, key: 0.0)


@pytest.fixture(params=[False, True], ids=["whole", "blocks"])
def by_blocks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether blocked shards' snapshots read only their batch's blocks (else whole)."""
    if request.param:
        read_by_blocks(monkeypatch)
    return bool(request.param)


@pytest.fixture(
    params=[
        "snapshot",
        "snapshot-in-pieces",
        "pure",
        "blocks",
        "blocks-pure",
        "blocks-scripts",
        "chunks",
    ]
)
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which bulk path new filters take: snapshots, or BITFIELD and scripts (``chunks``).

    ``snapshot-in-pieces``: shards read in GETRANGEs of 777 bytes (as 8 MiB ones are in
    MiBs). ``pure``: snapshots answered in Python, as without numpy. ``blocks``: the
    (blocked) filters' snapshots read only the blocks of their batch, by GETRANGE and
    SETRANGE per run (numpy); ``blocks-pure`` too, as a default install does: answered
    in Python, by the block scripts, the blocks joined into one string by the read
    script (as for redis-py without hiredis); ``blocks-scripts``: the same, each run a
    string of the script's reply (as with hiredis).
    """
    if request.param in ("snapshot", "snapshot-in-pieces", "blocks") and not HAVE_NUMPY:
        pytest.skip("numpy (the numpy extra) is not installed")
    if request.param in ("pure", "blocks-pure", "blocks-scripts"):
        monkeypatch.setattr(bulk, "HAVE_NUMPY", False)
    if request.param.startswith("blocks"):
        read_by_blocks(monkeypatch)
    if request.param in ("blocks-pure", "blocks-scripts"):
        monkeypatch.setattr(snapshot, "_JOINED", b"1" if request.param == "blocks-pure" else b"0")
    if request.param == "chunks":
        monkeypatch.setattr(bulk, "SNAPSHOTS", False)
    if request.param == "snapshot-in-pieces":
        monkeypatch.setattr(snapshot, "PIECE", 777)
        monkeypatch.setattr(bulk, "JOINT_BYTES", 1)  # and a transaction per shard
        monkeypatch.setattr(snapshot, "RUN_BLOCKS", 3)
    return str(request.param)


# -- the kernel ---------------------------------------------------------------------------


@needs_numpy
@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text(max_size=20) | st.binary(max_size=20), max_size=40),
    st.integers(1, 64),
    st.integers(1, MAX_SHARD_BITS),
    st.integers(1, 2**22),
)
def test_vectorised_seeds_and_offsets_are_the_schemes(
    elements: list[str | bytes], k: int, size: int, shards: int
) -> None:
    from scrapy_redis_bloom.core.hashing import FilterSpec
    from scrapy_redis_bloom.engine.bitmap.local import locate_many, offsets_many

    spec = FilterSpec(shards, size, k)
    shard, x, y = locate_many(elements, spec)
    expected = [locate(e, spec) for e in elements]
    assert list(zip(shard.tolist(), x.tolist(), y.tolist(), strict=True)) == expected
    got = offsets_many(x, y, k, size).tolist()
    assert got == [[o + HEADER_BITS for o in offsets(sx, sy, k, size)] for _, sx, sy in expected]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.text(max_size=20) | st.binary(max_size=20), max_size=40),
    st.integers(1, 32),
    st.integers(1, 2**20),
    st.integers(1, 64),
    st.sampled_from([0, 512]),
    st.integers(1, 5),
)
def test_located_groups_and_offsets_are_the_schemes_with_and_without_numpy(
    elements: list[str | bytes], k: int, size: int, shards: int, block: int, least: int
) -> None:
    from scrapy_redis_bloom.core.hashing import FilterSpec
    from scrapy_redis_bloom.engine.bitmap.local import Located

    size = max(size - size % block, block) if block else size
    spec = FilterSpec(shards=shards, shard_bits=size, hash_count=k, block_bits=block)
    seeds = [locate(e, spec) for e in elements]
    expected: dict[int, list[int]] = {}
    for position, (shard, _, _) in enumerate(seeds):
        expected.setdefault(shard, []).append(position)
    expected = {s: p for s, p in expected.items() if len(p) >= least}
    for vectorised in [False, True] if HAVE_NUMPY else [False]:
        located = Located(elements, spec, vectorised)
        groups = located.crowded(least)
        assert {s: [int(p) for p in g] for s, g in groups.items()} == expected
        for positions in groups.values():
            got = located.offsets(positions)
            want = [
                offsets(seeds[p][1], seeds[p][2], k, size, block, HEADER_BITS) for p in positions
            ]
            if vectorised:
                assert got.tolist() == want
            elif block:  # without numpy, a blocked element is its block and bits there
                assert [bit_offsets(pair) for pair in got] == [set(w) for w in want]
            else:
                assert got == want
        parts = [(g, [True] * len(g)) for g in groups.values()]
        taken = {int(p) for g in groups.values() for p in g}
        assert located.placed(parts) == [p in taken for p in range(len(elements))]
        assert located.outside(list(groups.values())) == sorted(set(range(len(elements))) - taken)


def bit_offsets(pair: tuple[int, int]) -> set[int]:
    """Return the bit offsets a ``(block start, bits)`` pair of ``block_masks`` stands for."""
    start, bits = pair
    return {start + BLOCK_BITS - 1 - j for j in range(BLOCK_BITS) if bits >> j & 1}


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_block_masks_answer_and_write_as_the_sequential_kernel(data: st.DataObject) -> None:
    from scrapy_redis_bloom.engine.bitmap import local

    blocks = data.draw(st.integers(1, 4))
    start = data.draw(st.binary(min_size=4 + 64 * blocks, max_size=4 + 64 * blocks))
    k = data.draw(st.integers(1, 16))
    seed = st.tuples(
        st.just(0), st.integers(0, BLOCK_BITS * blocks - 1), st.integers(0, BLOCK_BITS**2 - 1)
    )
    pool = data.draw(st.lists(seed, min_size=1, max_size=20))
    batch = data.draw(st.lists(st.sampled_from(pool), max_size=40))  # duplicates common
    write = data.draw(st.booleans())
    # A shard string whose bits start 32 bits in (a short header), as offsets() adds it.
    pairs = block_masks(batch, k, 32)
    listed = [offsets(x, y, k, BLOCK_BITS * blocks, BLOCK_BITS, 32) for _, x, y in batch]
    assert [bit_offsets(pair) for pair in pairs] == [set(offsets_) for offsets_ in listed]
    by_masks, sequential = bytearray(start), bytearray(start)
    answers, low, high = local.check_masks(by_masks, pairs, write)
    expected, low_, high_ = check_sequential(sequential, listed, write)
    assert answers == expected
    assert by_masks == sequential
    # The span written back covers every change.
    assert low <= low_
    assert high >= high_


@needs_numpy
@settings(max_examples=300, deadline=None)
@given(st.data())
def test_commands_packed_by_numpy_are_those_packed_one_by_one(data: st.DataObject) -> None:
    import numpy as np

    from scrapy_redis_bloom.engine.bitmap import local

    keys = data.draw(st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=4))
    n = data.draw(st.integers(0, 12))
    owner = data.draw(st.lists(st.integers(0, len(keys) - 1), min_size=n, max_size=n))
    offsets = data.draw(st.lists(st.integers(0, 10**9 - 1), min_size=n, max_size=n))
    ends = data.draw(st.lists(st.integers(0, 10**9 - 1), min_size=n, max_size=n))
    width = data.draw(st.integers(1, 130))
    rows = [data.draw(st.binary(min_size=width, max_size=width)) for _ in range(n)]
    at, first, second = (np.asarray(v, dtype=np.int64) for v in (owner, offsets, ends))
    got, lengths = local.range_commands(b"GETRANGE", keys, at, first, second)
    expected = [
        pack_command(b"GETRANGE", keys[k], start, end)
        for k, start, end in zip(owner, offsets, ends, strict=True)
    ]
    assert got == b"".join(expected)
    assert lengths.tolist() == [len(command) for command in expected]
    data_rows = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(n, width)
    got, _ = local.range_commands(b"SETRANGE", keys, at, first, data_rows)
    assert got == b"".join(
        pack_command(b"SETRANGE", keys[k], start, row)
        for k, start, row in zip(owner, offsets, rows, strict=True)
    )


@needs_numpy
@settings(max_examples=200, deadline=None)
@given(st.data())
def test_block_reads_packed_together_are_each_shards_runs(data: st.DataObject) -> None:
    import numpy as np

    from scrapy_redis_bloom.engine.bitmap import local

    shards = data.draw(st.integers(1, 4))
    keys = [b"k{%d}:g0" % (i * 7) for i in range(shards)]  # (keys of unequal lengths)
    blocks = [
        np.asarray(sorted(data.draw(st.sets(st.integers(0, 40), max_size=20))), dtype=np.int64)
        for _ in range(shards)
    ]
    longest = data.draw(st.integers(1, 5))
    packed = local.range_reads(keys, blocks, longest)
    for key, mine, (commands, count) in zip(keys, blocks, packed, strict=True):
        spans = local.runs(mine.tolist(), range(len(mine)), longest)  # the loop's runs
        expected = [
            pack_command(
                b"GETRANGE",
                key,
                32 + int(mine[first]) * 64,
                32 + (int(mine[first]) + stop - first) * 64 - 1,
            )
            for first, stop in spans
        ]
        assert commands == b"".join(expected)
        assert count == len(expected)


@needs_numpy
@settings(max_examples=300, deadline=None)
@given(st.data())
def test_runs_and_their_bytes_are_the_same_with_numpy_and_without(data: st.DataObject) -> None:
    from scrapy_redis_bloom.engine.bitmap import local

    # A compact copy: the header, then the blocks a batch touched (sorted, distinct).
    blocks = sorted(data.draw(st.sets(st.integers(0, 60), min_size=1, max_size=30)))
    copy = bytearray(
        data.draw(st.binary(min_size=32 + 64 * len(blocks), max_size=32 + 64 * len(blocks)))
    )
    slots = sorted(data.draw(st.sets(st.integers(0, len(blocks) - 1))))
    longest = data.draw(st.integers(1, 5))
    got = local.packed_runs(blocks, slots, longest), local.slot_bytes(copy, slots)
    local.HAVE_NUMPY = False  # a default install's loops
    try:
        expected = local.packed_runs(blocks, slots, longest), local.slot_bytes(copy, slots)
    finally:
        local.HAVE_NUMPY = True
    assert got == expected
    # Each run: consecutive blocks of the chosen slots, at most ``longest``; all slots once.
    pairs = [
        (int.from_bytes(got[0][i : i + 4], "big"), int.from_bytes(got[0][i + 4 : i + 8], "big"))
        for i in range(0, len(got[0]), 8)
    ]
    assert [b for first, count in pairs for b in range(first, first + count)] == [
        blocks[slot] for slot in slots
    ]
    assert all(1 <= count <= longest for _, count in pairs)


@needs_numpy
@settings(max_examples=300, deadline=None)
@given(st.data())
def test_vectorised_answers_and_bytes_are_the_sequential_ones(data: st.DataObject) -> None:
    size = data.draw(st.integers(1, 48))
    start = data.draw(st.binary(min_size=size, max_size=size))
    k = data.draw(st.integers(1, 8))
    bit = st.integers(0, 8 * size - 1)
    pool = data.draw(st.lists(st.lists(bit, min_size=k, max_size=k), min_size=1, max_size=30))
    # Elements drawn from a pool: duplicates within the batch are common.
    batch = data.draw(st.lists(st.sampled_from(pool), max_size=60))
    write = data.draw(st.booleans())
    vectorised = _same_as_sequential(start, batch, k, write, data.draw(st.integers(1, 64)))
    if not write:
        assert vectorised == start


def _same_as_sequential(
    start: bytes, rows: list[list[int]], k: int, write: bool, slice_: int
) -> bytearray:
    """Check rows with the numpy kernel in slices of ``slice_`` and one at a time: the same.

    Returns the bytes the numpy kernel left.
    """
    import numpy as np

    from scrapy_redis_bloom.engine.bitmap import local

    vectorised, sequential = bytearray(start), bytearray(start)
    array = np.array(rows, dtype=np.int64).reshape(len(rows), k)
    whole, local.SLICE = local.SLICE, slice_  # a batch in slices too
    try:
        got = local.check_vectorised(vectorised, array, write)
    finally:
        local.SLICE = whole
    assert got == check_sequential(sequential, rows, write)
    assert vectorised == sequential
    return vectorised


@needs_numpy
@settings(max_examples=300, deadline=None)
@given(st.data())
def test_vectorised_blocked_rows_answer_as_the_sequential_ones(data: st.DataObject) -> None:
    """Rows each in one block (a blocked filter's) take the kernel's per-window path.

    Few blocks make rows share one often (sorted among themselves), many leave most
    alone (answered by their own bits); a row may repeat a bit, and one straddling two
    blocks sends the slice to the general path.
    """
    from scrapy_redis_bloom.core.hashing import BLOCK_BITS

    blocks = data.draw(st.integers(1, 120))
    size = HEADER_BITS // 8 + blocks * BLOCK_BITS // 8
    start = data.draw(st.binary(min_size=size, max_size=size))
    k = data.draw(st.integers(1, 14))
    rows = []
    for _ in range(data.draw(st.integers(1, 80))):
        block = data.draw(st.integers(0, blocks - 1))
        base = HEADER_BITS + block * BLOCK_BITS
        rows.append([base + data.draw(st.integers(0, BLOCK_BITS - 1)) for _ in range(k)])
    if data.draw(st.booleans()) and blocks > 1:  # one row straddling two blocks
        moved = (rows[-1][0] - HEADER_BITS + BLOCK_BITS) % (blocks * BLOCK_BITS)
        rows[-1][-1] = HEADER_BITS + moved
    write = data.draw(st.booleans())
    _same_as_sequential(start, rows, k, write, data.draw(st.integers(1, 96)))


# -- bulk against one at a time ---------------------------------------------------------------


def _state(client: redis.Redis, key: str) -> tuple[int, int, int]:
    """Return a one-shard filter's generations, newest count and generation keys."""
    head = f"{{{key}:0}}:g0"
    generations, count = (
        client.bitfield(head).get("u16", GENERATIONS_BIT).get("u32", COUNT_BIT).execute()
    )
    keys = client.exists(*[f"{{{key}:0}}:g{g}" for g in range(16)])
    return generations, count, keys


def _windows_state(client: redis.Redis, key: str) -> list[tuple[str, int, int, int]]:
    """Return a one-shard TTL filter's windows: name, generations, newest count, keys."""
    out = []
    for name in sorted(k.decode() for k in client.keys(f"{{{key}:0}}:w*:g0")):
        generations, count = (
            client.bitfield(name).get("u16", GENERATIONS_BIT).get("u32", COUNT_BIT).execute()
        )
        keys = client.exists(*[f"{name[:-1]}{g}" for g in range(16)])
        out.append((name.split(":")[-2], generations, count, keys))
    return out


def one_by_one(
    client: redis.Redis, settings_: dict[str, Any], count: int, tag: str, seed: int, again: int
) -> tuple[list[str], list[bool]]:
    """Return elements (``again`` of the ``count`` twice), shuffled, and check-and-add's answers.

    Answered one element after the other, by the filter ``one``.
    """
    elements = fingerprints(count, tag)
    rng = random.Random(seed)
    elements += rng.sample(elements, again)  # duplicates, within a call and across calls
    rng.shuffle(elements)
    one = make(client, settings_, "one")
    expected = [one.check_and_add(e) for e in elements]
    one.close()  # sends the counts its scriptless checks still hold (at most 15 a shard)
    return elements, expected


@pytest.mark.parametrize(
    "settings_",
    [GROWING, FIXED, CLASSIC, WINDOWED, GROWING_CLASSIC],
    ids=["growing", "fixed", "fixed-classic", "windowed", "growing-classic"],
)
def test_bulk_answers_are_those_of_one_call_per_element(
    path: str, settings_: dict[str, Any], redis_client: redis.Redis
) -> None:
    elements, expected = one_by_one(redis_client, settings_, 7_000, "order", 12, 1_500)
    redis_client.config_resetstat()
    many = make(redis_client, settings_, "many")
    answers: list[bool] = []
    at = 0
    # The growing filter's one shard takes 2,000 before it grows (scriptless below 976):
    # snapshots, then the script across the boundary, then stacks of its generations
    # (scriptless below 2,976 in generation 1), the script across the next boundary...
    for size in (500, 400, 1, 3_000, 40, 5_000):
        answers += many.add_many(elements[at : at + size])
        at += size
    assert at >= len(elements)
    assert answers == expected
    assert many.contains_many(elements) == [True] * len(elements)
    if settings_ is GROWING:
        assert _state(redis_client, "many") == _state(redis_client, "one")
        assert _state(redis_client, "one")[0] >= 3  # the boundary was crossed twice
    if settings_ is WINDOWED:
        assert _windows_state(redis_client, "many") == _windows_state(redis_client, "one")
        assert _windows_state(redis_client, "one")[-1][1] >= 3
    if path != "chunks":
        assert calls(redis_client, "exec") >= 2
    else:
        assert calls(redis_client, "exec") == 0
    totals = many.totals()
    assert (totals.added, totals.seen) == (expected.count(False), expected.count(True))


def test_a_bulk_call_that_raises_part_way_counts_what_it_wrote(
    path: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The elements written before a bulk call raised are counted (they were lost from stats).

    The iterable breaks after 5,000 elements: batches and chunks of 1,000 had been written.
    Only a chunk whose replies were still unread when it broke is not counted (chunks: the
    one sent last; what it did is unknown). They are synced as usual, by the next sync.
    """
    monkeypatch.setattr(bulk, "BATCH", 1_000)
    monkeypatch.setattr(bulk, "MAX_BATCH", 1_000)
    monkeypatch.setattr(bulk, "CHUNK", 1_000)
    settings_ = {**FIXED, "BLOOMFILTER_CAPACITY": 200_000}
    bloom = make(redis_client, settings_, "broken")
    elements = fingerprints(5_000, "broken")

    def source() -> Any:
        yield from elements
        raise RuntimeError("the source broke")

    with pytest.raises(RuntimeError, match="the source broke"):
        bloom.add_many(source())
    # (The chunk whose replies were unread is dropped with its connection: it may have run
    # in part, or not at all, with hiredis on the oldest versions' run.)
    written = elements[:4_000] if path == "chunks" else elements
    assert bloom.contains_many(written) == [True] * len(written)
    assert bloom.totals().added == 0  # not synced yet: the call raised before its sync
    counted = bloom.sync_counters()  # (as the next call, or the stats timer, does)
    assert counted is not None
    assert counted.seen == 0
    assert counted.added == len(elements) - (1_000 if path == "chunks" else 0)


@pytest.mark.parametrize("settings_", [GROWING, WINDOWED], ids=["growing", "windowed"])
@pytest.mark.parametrize("snapshots", [True, False], ids=["default", "chunks"])
def test_bulk_answers_after_a_script_flush_are_those_of_one_call_per_element(
    snapshots: bool,
    settings_: dict[str, Any],
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Script calls answered NOSCRIPT (a flush, a restart, a fresh server) run again in order.

    The chunk sent after one that failed waits for it: it does not run first.
    """
    if snapshots and not HAVE_NUMPY:
        pytest.skip("numpy (the numpy extra) is not installed")
    monkeypatch.setattr(bulk, "SNAPSHOTS", snapshots)
    monkeypatch.setattr(bulk, "CHUNK", 500)  # many chunks in flight, two at a time
    elements, expected = one_by_one(redis_client, settings_, 6_000, "flushed", 5, 3_000)
    many = make(redis_client, settings_, "many")
    answers: list[bool] = []
    for at in range(0, len(elements), 3_000):
        redis_client.script_flush()  # each call begins on a server that knows no script
        answers += many.add_many(elements[at : at + 3_000])
    assert sum(a != b for a, b in zip(answers, expected, strict=True)) == 0
    if settings_ is GROWING:
        assert _state(redis_client, "many") == _state(redis_client, "one")


# -- concurrent bulk writers -----------------------------------------------------------------

PROCESSES = 3
RACE_ELEMENTS = 30_000
RACE_SETTINGS = {
    "growing": {"BLOOMFILTER_CAPACITY": 200_000, "BLOOMFILTER_ERROR_RATE": 1e-6},
    "fixed": {**FIXED, "BLOOMFILTER_CAPACITY": 200_000, "BLOOMFILTER_ERROR_RATE": 1e-6},
}


def _race(index: int, url: str, kind: str, barrier: Any, results: Any) -> None:
    """Add every element in calls of 3,000, in an order of its own; report those found new."""
    try:
        client = redis.Redis.from_url(url)
        bloom = make(client, RACE_SETTINGS[kind], "race")
        bloom.open()
        elements = fingerprints(RACE_ELEMENTS, "race")
        random.Random(index).shuffle(elements)
        barrier.wait(timeout=60)
        new: list[str] = []
        for at in range(0, len(elements), 3_000):
            batch = elements[at : at + 3_000]
            new += [e for e, seen in zip(batch, bloom.add_many(batch), strict=True) if not seen]
        results.put((new, None))
        bloom.close()
    except BaseException:
        results.put((None, traceback.format_exc()))


@needs_numpy
@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["growing", "fixed"])
def test_concurrent_bulk_writers_find_each_element_new_once(
    kind: str, redis_url: str, redis_client: redis.Redis
) -> None:
    make(redis_client, RACE_SETTINGS[kind], "race").open()
    redis_client.config_resetstat()
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES)
    results = context.Queue()
    workers = [
        context.Process(target=_race, args=(i, redis_url, kind, barrier, results), daemon=True)
        for i in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    reports = []
    try:
        for _ in workers:
            try:
                reports.append(results.get(timeout=200))
            except queue.Empty:
                pytest.fail("a racing process did not report in time")
    finally:
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
    assert [error for _, error in reports if error] == []
    wins = collections.Counter(e for new, _ in reports for e in new)
    assert [e for e, n in wins.items() if n > 1] == []  # new to one process at most
    # Missed by all only as a false positive: at 1e-6, none of 30,000 but by a fluke.
    assert RACE_ELEMENTS - len(wins) <= 1
    assert calls(redis_client, "exec") > 0  # snapshots were taken
    if kind == "growing":  # counted once each, over the shards
        shards = make(redis_client, RACE_SETTINGS[kind], "race").spec.shards
        counts = [
            redis_client.bitfield(f"{{race:{i}}}:g0").get("u32", COUNT_BIT).execute()[0]
            for i in range(shards)
        ]
        assert sum(counts) == len(wins)


# -- a snapshot meets another writer, a lost shard -----------------------------------------------


def another_writer_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
    other: RedisBloomFilter,
    target: str,
    then: Callable[[], Any] = lambda: None,
) -> list[bool]:
    """Make ``other`` add ``target`` between a snapshot's read and its write, once.

    Returns the list its answer goes in; ``then`` runs right after it.
    """
    other.open()
    told: list[bool] = []
    kernel = snapshot.check_vectorised

    def with_a_writer(buffer: bytearray, offsets: Any, write: bool) -> Any:
        if not told:
            told.append(other.check_and_add(target))
            then()
        return kernel(buffer, offsets, write)

    monkeypatch.setattr(snapshot, "check_vectorised", with_a_writer)
    return told


@needs_numpy
@pytest.mark.parametrize("settings_", [GROWING, FIXED], ids=["growing", "fixed"])
def test_a_snapshot_whose_shard_changes_meanwhile_falls_back(
    settings_: dict[str, Any], redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    elements = fingerprints(900, "meanwhile")
    target = elements[500]
    other = make(redis_client, settings_, "meanwhile")
    # (commandstats from then on: this worker's alone)
    told = another_writer_meanwhile(monkeypatch, other, target, redis_client.config_resetstat)
    bloom = make(redis_client, settings_, "meanwhile")
    answers = bloom.add_many(elements)
    assert told == [False]  # the other worker found it new: so this one must find it seen
    assert answers == [e == target for e in elements]
    if settings_ is GROWING:  # its one shard's EXEC did nothing: taken again as a stack
        assert calls(redis_client, "exec") == 2
        assert calls(redis_client, "evalsha") == 0
    else:  # the three small shards' one EXEC did nothing: each is taken again alone
        assert calls(redis_client, "exec") == 4
        assert calls(redis_client, "bitfield") == 0
    assert bloom.contains_many(elements) == [True] * len(elements)
    other.close()  # the hot path sends its count late (with a later check, a sync, close)
    if settings_ is GROWING:
        assert _state(redis_client, "meanwhile")[1] == len(elements)


def test_a_shard_lost_between_bulk_calls_is_found_and_recovered(
    path: str, redis_client: redis.Redis
) -> None:
    bloom = make(redis_client, FIXED, "lost", faults=FaultPolicy(on_loss="recreate"))
    held = fingerprints(3_000, "held")
    assert bloom.add_many(held) == [False] * len(held)
    redis_client.delete("{lost:0}:g0")
    answers = bloom.add_many(held)
    lost = [locate(e, bloom.spec)[0] == 0 for e in held]
    assert 0 < sum(lost) < len(held)
    # Elements of the lost shard are new again (a duplicate fetch, never a lost page).
    assert [not a for a in answers] == lost
    assert bloom.events.counts["recreated"] >= 1
    assert bloom.contains_many(held) == [True] * len(held)


def test_a_lost_shard_raises_by_default(path: str, redis_client: redis.Redis) -> None:
    from scrapy_redis_bloom import FilterDamagedError

    bloom = make(redis_client, FIXED, "raise")
    held = fingerprints(3_000, "held")
    bloom.add_many(held)
    redis_client.delete("{raise:1}:g0")
    with pytest.raises(FilterDamagedError):
        bloom.add_many(held)


@needs_numpy
def test_a_shard_lost_during_a_snapshot_is_found_and_recovered(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    bloom = make(redis_client, FIXED, "gone", faults=FaultPolicy(on_loss="recreate"))
    held = fingerprints(3_000, "held")
    assert bloom.add_many(held) == [False] * len(held)
    kernel = snapshot.check_vectorised
    deleted: list[int] = []

    def losing_a_shard(buffer: bytearray, offsets: Any, write: bool) -> Any:
        if not deleted:  # between the GET and the EXEC, the shard is lost
            deleted.append(redis_client.delete("{gone:0}:g0"))
        return kernel(buffer, offsets, write)

    monkeypatch.setattr(snapshot, "check_vectorised", losing_a_shard)
    # New elements too: the snapshot of shard 0 (the first taken) must write, and its
    # EXEC finds the shard changed. (Had it nothing to write, its answers would stand:
    # true when its GET ran, before the loss.)
    batch = held + fingerprints(3_000, "new")
    answers = bloom.add_many(batch)
    assert deleted == [1]
    lost = [locate(e, bloom.spec)[0] == 0 for e in batch]
    expected = [not gone and i < len(held) for i, gone in enumerate(lost)]
    assert answers == expected  # the lost shard's elements are new again, no others
    assert bloom.events.counts["recreated"] >= 1
    assert bloom.contains_many(batch) == [True] * len(batch)


@needs_numpy
def test_a_connection_dropped_between_a_snapshots_read_and_its_exec_leaves_no_doubt(
    by_blocks: bool, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dropped after the read, before the write-back is sent: found closed, nothing sent.

    The transaction is not sent on another connection (its WATCH is gone with the old one)
    nor left in doubt: the snapshot is given up whole and the elements answered anew, each
    as the truth has it. (A write-back whose reply is lost: the ReplyCutter tests below.)
    """
    bloom = make(redis_client, GROWING, "doubt")
    held = fingerprints(300, "held")
    assert bloom.add_many(held) == [False] * len(held)
    batch = held + fingerprints(300, "new")
    kernel = snapshot.check_vectorised
    killed: list[int] = []

    def dropping_the_connection(buffer: bytearray, offsets: Any, write: bool) -> Any:
        if not killed:  # the filter's connection dies before its EXEC is sent
            killed.append(redis_client.client_kill_filter(_type="normal", skipme=True))
        return kernel(buffer, offsets, write)

    monkeypatch.setattr(snapshot, "check_vectorised", dropping_the_connection)
    answers = bloom.add_many(batch)
    assert killed
    assert killed[0] >= 1
    assert answers == [True] * len(held) + [False] * (len(batch) - len(held))
    assert bloom.events.counts["ambiguous"] == 0
    assert bloom.contains_many(batch) == [True] * len(batch)


@pytest.mark.parametrize("protocol", ["ranges", "scripts"])
@pytest.mark.parametrize("settings_", [GROWING, FIXED], ids=["growing", "fixed"])
def test_block_snapshots_read_and_write_only_their_blocks(
    settings_: dict[str, Any],
    protocol: str,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if protocol == "ranges" and not HAVE_NUMPY:
        pytest.skip("numpy (the numpy extra) is not installed")
    if protocol == "scripts":  # as without numpy: answered in Python, by the block scripts
        monkeypatch.setattr(bulk, "HAVE_NUMPY", False)
    read_by_blocks(monkeypatch)
    elements = fingerprints(600, "blocks")
    one = make(redis_client, settings_, "blocks-one")
    expected = [one.check_and_add(e) for e in elements + elements[:50]]
    many = make(redis_client, settings_, "blocks-many")
    many.open()
    shards = many.spec.shards
    redis_client.config_resetstat()
    answers = many.add_many(elements)
    # A header and at most one run per element read, at most one block per element
    # written back: never the whole shard (no GET), never an element's bits one by one
    # (no BITFIELD). All shards in one transaction: no check-and-add script.
    assert 0 < calls(redis_client, "getrange") <= 600 + shards
    assert 0 < calls(redis_client, "setrange") <= 600 + shards
    assert calls(redis_client, "get") == calls(redis_client, "bitfield") == 0
    assert calls(redis_client, "exec") == 1
    loads = calls(redis_client, "script|load") + calls(redis_client, "script")
    if protocol == "scripts":
        # The two scripts, in the one trip (Redis 7 counts SCRIPT LOAD apart, 6.2 as
        # SCRIPT); each shard's read and write scripts.
        assert loads == 2
        assert calls(redis_client, "evalsha") == 2 * shards
    else:  # plain commands: each shard's length, then its runs and blocks
        assert loads == calls(redis_client, "evalsha") == 0
        assert calls(redis_client, "strlen") == shards
    # (Fewer elements than pay for a transaction take the other path.)
    assert answers + many.add_many(elements[:50]) == expected
    assert many.contains_many(elements) == [True] * len(elements)
    # The same bits as one call per element set (the headers differ: each filter's id).
    for mine, theirs in zip(many.shard_keys, one.shard_keys, strict=True):
        assert redis_client.getrange(mine, 32, -1) == redis_client.getrange(theirs, 32, -1)
    if settings_ is GROWING:  # the same count (the generations field: 0 until a script runs)
        assert _state(redis_client, "blocks-many")[1:] == _state(redis_client, "blocks-one")[1:]


@needs_numpy
def test_a_joint_block_snapshot_another_worker_wrote_to_is_taken_again_shard_by_shard(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    read_by_blocks(monkeypatch)
    elements = fingerprints(900, "joint")
    target = elements[500]
    other = make(redis_client, FIXED, "joint")
    # (commandstats from then on: this worker's alone)
    told = another_writer_meanwhile(monkeypatch, other, target, redis_client.config_resetstat)
    bloom = make(redis_client, FIXED, "joint")
    assert bloom.spec.shards == 3
    answers = bloom.add_many(elements)
    assert told == [False]
    assert answers == [e == target for e in elements]
    # The three shards' transaction did nothing; each was then taken on its own.
    assert calls(redis_client, "exec") == 4
    assert calls(redis_client, "bitfield") == 0  # (a fixed filter's other path)
    assert bloom.contains_many(elements) == [True] * len(elements)
    other.close()


@needs_numpy
@pytest.mark.parametrize("fault", ["none", "writer", "killed"])
def test_overlapped_transactions_answer_as_one_at_a_time_or_new(
    fault: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call's transactions overlap on two connections, one shard each here.

    ``writer``: another worker adds an element while the first transaction is answered
    and the second's reads (and WATCH) are in: its shard's transaction does nothing and
    is taken again. ``killed``: both connections die while the second is answered, the
    first's EXEC in flight and the third's reads sent after it: writes that may have run
    answer "new", none of the batch's new elements is "seen", and everything is added.
    """
    read_by_blocks(monkeypatch)
    monkeypatch.setattr(bulk, "JOINT_BYTES", 64 * 200)  # a transaction per shard (~300 each)
    held = fingerprints(900, "overlap-held")
    new = fingerprints(900, "overlap-new")
    one = make(redis_client, FIXED, "overlap-one")
    one.add_many(held)
    expected = [one.check_and_add(e) for e in held + new]
    bloom = make(redis_client, FIXED, "overlap")
    assert bloom.add_many(held) == [False] * len(held)
    kernel = snapshot.check_vectorised
    done: list[Any] = []
    target = new[500]
    other = make(redis_client, FIXED, "overlap")

    def meanwhile(buffer: bytearray, offsets: Any, write: bool) -> Any:
        done.append(None)
        if fault == "writer" and len(done) == 1:
            assert other.check_and_add(target) is False
        if fault == "killed" and len(done) == 2:
            done.append(redis_client.client_kill_filter(_type="normal", skipme=True))
        return kernel(buffer, offsets, write)

    monkeypatch.setattr(snapshot, "check_vectorised", meanwhile)
    answers = bloom.add_many(held + new)
    if fault == "none":
        assert answers == expected
    elif fault == "writer":
        assert answers == [a or e == target for a, e in zip(expected, held + new, strict=True)]
    else:
        assert done[2] >= 2  # the call's two connections (and the other worker's)
        assert answers[len(held) :] == [False] * len(new)
        assert bloom.events.counts["ambiguous"] >= answers[: len(held)].count(False)
    monkeypatch.undo()
    assert bloom.contains_many(held + new) == [True] * (len(held) + len(new))
    other.close()


@needs_numpy
def test_a_big_filters_bulk_call_reads_enough_for_whole_snapshots() -> None:
    # A 100M filter's 8 MiB shards are answered whole from 1,048,576 elements at a time
    # (~25,000 a shard: ~0.3 µs of transfer each); a 1M filter's small shards from 131,072.
    big = BloomConfig.from_settings(
        {"BLOOMFILTER_CAPACITY": 100_000_000, "BLOOMFILTER_ERROR_RATE": 1e-4}
    ).spec
    small = BloomConfig.from_settings(
        {"BLOOMFILTER_CAPACITY": 1_000_000, "BLOOMFILTER_ERROR_RATE": 1e-4}
    ).spec
    assert bulk.batch_size(big, 1) == bulk.MAX_BATCH
    assert bulk.batch_size(small, 1) == bulk.BATCH
    per_shard = bulk.MAX_BATCH // big.shards
    whole_ns = bulk.SNAPSHOT_NS_PER_BYTE * big.shard_bytes / per_shard
    assert whole_ns < 1_000  # a whole snapshot's bytes cost < 1 µs an element


@needs_numpy
def test_one_transaction_holds_at_most_joint_bytes_of_shards(
    by_blocks: bool, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    elements = fingerprints(3_000, "budget")
    bloom = make(redis_client, FIXED, "budget")
    bloom.open()
    shard = bloom.spec.shard_bytes + 32
    expected = [False] * len(elements)
    # Two shards' worth (whole), or ~2,000 elements' blocks: the third shard waits.
    budget = 2 * shard if not by_blocks else 64 * 2_100
    monkeypatch.setattr(bulk, "JOINT_BYTES", budget)
    redis_client.config_resetstat()
    assert bloom.add_many(elements) == expected
    assert calls(redis_client, "exec") == 2
    assert bloom.contains_many(elements) == [True] * len(elements)


@pytest.mark.parametrize("settings_", [GROWING, FIXED], ids=["growing", "fixed"])
def test_a_full_redis_never_answers_seen_and_the_elements_are_added_later(
    path: str, settings_: dict[str, Any]
) -> None:
    import time

    from redis_server import RedisServer

    from scrapy_redis_bloom import FilterUnavailableError

    with RedisServer() as server:
        client = server.client()
        strict = make(client, settings_, "oom", faults=FaultPolicy(retry_timeout=0.3))
        lenient = make(
            client, settings_, "oom", faults=FaultPolicy(retry_timeout=0.3, on_error="allow")
        )
        held = fingerprints(1_000, "held")
        assert strict.add_many(held) == [False] * len(held)
        batch = held + fingerprints(1_000, "new")
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", used // 2)
        with pytest.raises(FilterUnavailableError, match="out of memory"):
            strict.add_many(batch)
        # Redis takes no write: no new element is taken for seen, and every element let
        # through is counted. (A shard full to its limit, as the growing filter's are here,
        # answers what it holds from its read, which Redis still serves.)
        answers = lenient.add_many(batch)
        assert answers[len(held) :] == [False] * (len(batch) - len(held))
        assert lenient.events.counts["errors"] == answers.count(False)
        client.config_set("maxmemory", 0)
        time.sleep(1.1)  # the next attempt is allowed a second after the last one
        assert lenient.add_many(fingerprints(10, "after")) == [False] * 10
        assert strict.contains_many(batch) == [True] * len(batch)  # the owed ones added
        client.close()


@pytest.mark.timeout(120)
def test_redis_killed_and_restarted_with_aof_during_bulk_calls_costs_no_answer(
    path: str,
) -> None:
    import threading
    import time

    from redis_server import RedisServer

    # A key and elements of this run alone: the restart frees the server's port for a
    # moment, and a server of another run of this test that took it must not answer ours.
    run = os.urandom(4).hex()
    with RedisServer(appendonly=True) as server:
        client = server.client()
        settings_ = {**FIXED, "BLOOMFILTER_CAPACITY": 200_000}
        bloom = make(client, settings_, f"restart-{run}", faults=FaultPolicy(retry_timeout=20))
        new = fingerprints(60_000, f"restart-{run}")
        answers: list[bool] = []

        def load(back: threading.Event) -> None:
            # Calls of 400 until a few after the restart (bounded by the elements).
            after = 0
            for at in range(0, len(new), 400):
                answers.extend(bloom.add_many(new[at : at + 400]))
                after += back.is_set()
                if after > 3:
                    return
                time.sleep(0.005)

        server.outage_during(load, after=0.4, down=2)
        assert 400 < len(answers) < len(new)  # calls ran before, during and after the outage
        # Every element is new: one answered "seen" would be a page lost, unless a twin
        # filter given the same calls finds it too (a false positive, at its rate).
        twin = make(client, settings_, f"twin-{run}")
        expected = [
            seen for at in range(0, len(answers), 400) for seen in twin.add_many(new[at : at + 400])
        ]
        assert [i for i, seen in enumerate(answers) if seen and not expected[i]] == []
        assert bloom.events.counts["retries"] > 0  # the outage really hit the calls
        # Every acknowledged write was on disk before its reply (appendfsync always), and
        # the calls the outage cut were sent again whole.
        done = new[: len(answers)]
        assert bloom.contains_many(done) == [True] * len(done)
        client.close()


def commits(command: list[bytes], reply: bytes = b"") -> bool:
    """Whether a command writes bits at once: ``EXEC``, a ``BITFIELD SET``, the script.

    (Not the block scripts: the read one writes nothing, the write one runs queued in
    a transaction, its ``EXEC`` commits it.)
    """
    name, args = command[0], command[1:]
    if name == b"BITFIELD":
        return b"SET" in (arg.upper() for arg in args[1:])
    blocks = {READ_BLOCKS.sha.encode(), WRITE_BLOCKS.sha.encode()}
    return name == b"EXEC" or (name == b"EVALSHA" and args[0] not in blocks)


#: A filter with re-crawl windows whose current window exists (its shard takes a stack).
WINDOW_OPEN = {**WINDOWED, "prefill": 100}
#: A growing filter its call takes over the growth boundary: the script takes the
#: elements up to its capacity, the others come in a deferred pass (stacks, chunks).
AT_THE_BOUNDARY = {**GROWING, "prefill": 1_700}
#: What is cut: the first write's reply (and the retry's), or the first EXEC's.
CUTS: dict[str, tuple[Callable[[list[bytes], bytes], bool], int]] = {
    "write": (commits, 1),
    "write-and-its-retry": (commits, 2),
    "exec": (lambda command, reply: command[0] == b"EXEC", 1),
}


@pytest.mark.parametrize("cut", list(CUTS))
@pytest.mark.parametrize(
    "settings_",
    [FIXED, GROWING, WINDOW_OPEN, AT_THE_BOUNDARY],
    ids=["fixed", "growing", "windowed", "boundary"],
)
def test_a_write_that_ran_but_whose_reply_was_lost_never_answers_seen(
    path: str,
    settings_: dict[str, Any],
    cut: str,
    redis_server: RedisServer,
    redis_client: redis.Redis,
) -> None:
    """A write ran and its reply never came: its elements answer "new", on every path.

    What a SIGKILL between ``EXEC`` and its reply does by chance (the AOF holds the
    commit), made at one exact command by a proxy. The retry finds the call's own bits
    set; each element must answer "new" all the same.
    """
    if cut == "exec" and path == "chunks":
        pytest.skip("the chunks take no snapshot: no EXEC")
    settings_ = dict(settings_)
    prefill = fingerprints(settings_.pop("prefill", 0), "held")
    new = fingerprints(600, "new")
    # What the same call answers when nothing is cut (false positives of the prefill).
    twin = make(redis_client, settings_, "twin")
    twin.add_many(prefill)
    expected = twin.add_many(new)
    assert expected.count(True) <= 3
    picks, times = CUTS[cut]
    with ReplyCutter(redis_server.port, picks, times) as cutter:
        client = redis.Redis(host="127.0.0.1", port=cutter.port)
        bloom = make(client, settings_, "cut", faults=FaultPolicy(retry_timeout=5))
        bloom.add_many(prefill)
        bloom.open()
        cutter.armed = True
        answers = bloom.add_many(new)
        cutter.armed = False
        assert len(cutter.cuts) == times  # the write (and its retry) ran, unanswered
        # Only what the uncut call found set before it, never the call's own bits.
        assert [i for i, seen in enumerate(answers) if seen and not expected[i]] == []
        # The retry did find this call's bits (the write ran): answered "new" anyway.
        assert bloom.events.counts["ambiguous"] > 0
        assert bloom.contains_many(new) == [True] * len(new)
        client.close()


@pytest.mark.parametrize("settings_", [FIXED, GROWING], ids=["fixed", "growing"])
def test_a_retried_write_whose_reply_was_lost_never_answers_seen(
    path: str, settings_: dict[str, Any], redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """A write Redis refused for now (out of memory), retried, ran unanswered: "new".

    A chunk's write answered ``OOM`` is run again by the executor; that run's reply is
    cut. The executor marks it ambiguous, so the next run's "already set" (this
    call's own bits) answers "new".
    """
    new = fingerprints(600, "new")
    refused: list[list[bytes]] = []

    def after_a_refusal(command: list[bytes], reply: bytes) -> bool:
        if not commits(command) or command[0] == b"EXEC":
            return False
        if b"OOM" in reply:  # Redis takes writes again from now on
            refused.append(command)
            redis_client.config_set("maxmemory", 0)
            return False
        # The executor's run of a refused write: it ran, its reply is cut. (Not a
        # write sent with it, which Redis may have read after writes were let in.)
        return command in refused

    with ReplyCutter(redis_server.port, after_a_refusal) as cutter:
        client = redis.Redis(host="127.0.0.1", port=cutter.port)
        bloom = make(client, settings_, "oom-cut", faults=FaultPolicy(retry_timeout=5))
        bloom.open()
        redis_client.config_set("maxmemory-policy", "noeviction")
        redis_client.config_set("maxmemory", 1)
        cutter.armed = True
        try:
            answers = bloom.add_many(new)
        finally:
            redis_client.config_set("maxmemory", 0)
        cutter.armed = False
        assert refused
        assert len(cutter.cuts) == 1
        assert answers == [False] * len(new)
        assert bloom.events.counts["ambiguous"] > 0
        assert bloom.contains_many(new) == [True] * len(new)
        client.close()


@pytest.mark.parametrize("where", ["cluster", "servers"])
def test_bulk_on_a_cluster_and_on_several_servers_is_one_call_per_element(
    path: str, where: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = request.getfixturevalue("redis_cluster" if where == "cluster" else "clients")
    taken: list[bool] = []

    def counting(original: Callable[..., list[snapshot.Taken]]) -> Callable[..., Any]:
        def counted(*args: Any) -> list[snapshot.Taken]:
            results = original(*args)
            taken.extend(result.answers is not None for result in results)
            return results

        return counted

    # A batch's transactions end in finish (overlapped); a shard tried again alone, in take.
    monkeypatch.setattr(bulk, "take", counting(bulk.take))
    monkeypatch.setattr(bulk, "finish", counting(bulk.finish))
    elements = fingerprints(4_000, "spread")
    elements += elements[:500]
    one = make(client, FIXED, "spread-one")
    expected = [one.check_and_add(e) for e in elements]
    many = make(client, FIXED, "spread-many")
    assert many.add_many(elements[:3_000]) + many.add_many(elements[3_000:]) == expected
    assert many.contains_many(elements) == [True] * len(elements)
    if path != "chunks":  # each shard's node took its snapshots, none fell back
        assert len(taken) >= 3
        assert all(taken)
    else:
        assert taken == []


#: README's least-privilege grants (no WATCH, MULTI, EXEC: snapshots are refused).
LEAST = (
    "-@all +evalsha +script|load +getrange +bitfield +bitfield_ro +exists +get +set +hgetall +hset"
    " +hincrby +hmget +strlen +type +unlink +setbit +getbit +expireat +setrange +del +time"
    " +zadd +zrange +zrem +zrangebyscore +zremrangebyscore +zscore +pexpire +hkeys"
    " +hget +hexists +bitcount +memory|usage +info"
)


def acl_user(client: redis.Redis, grants: str) -> redis.Redis:
    """Create the Redis user ``bulk`` with ``grants`` on the keys ``least*``; connect as it."""
    client.execute_command(
        "ACL", "SETUSER", "bulk", "on", ">secret", "~least*", "~{least:*", *grants.split()
    )
    kwargs = client.connection_pool.connection_kwargs
    return redis.Redis(host=kwargs["host"], port=kwargs["port"], username="bulk", password="secret")


@needs_numpy
def test_a_user_with_the_documented_grants_takes_block_snapshots(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    read_by_blocks(monkeypatch)
    # docs/howto/tls-acl.md: EVALSHA and SCRIPT LOAD, not EVAL; the transactions' commands.
    user = acl_user(redis_client, LEAST + " +watch +multi +exec +discard +unwatch")
    try:
        elements = fingerprints(3_000, "least")
        bloom = make(user, FIXED, "least")
        bloom.open()  # (it probes the documented commands once)
        redis_client.script_flush()  # as after a restart: the scripts are loaded again
        redis_client.config_resetstat()
        with caplog.at_level(logging.INFO, logger="scrapy_redis_bloom"):
            assert bloom.add_many(elements) == [False] * len(elements)
            assert bloom.add_many(elements) == [True] * len(elements)
        assert "no snapshots" not in caplog.text
        assert calls(redis_client, "exec") >= 1
        assert calls(redis_client, "bitfield") == 0  # no element went the other way
        user.close()
    finally:
        redis_client.execute_command("ACL", "DELUSER", "bulk")


@needs_numpy
def test_a_user_without_transactions_gets_bitfield_and_is_told(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    user = acl_user(redis_client, LEAST)
    try:
        elements = fingerprints(3_000, "least")
        bloom = make(user, FIXED, "least")
        with caplog.at_level(logging.INFO, logger="scrapy_redis_bloom"):
            assert bloom.add_many(elements) == [False] * len(elements)
            assert bloom.add_many(elements) == [True] * len(elements)
        told = [r for r in caplog.records if "no snapshots" in r.getMessage()]
        assert len(told) == 1  # said once, then snapshots are not tried again
        assert "ACL: refused the command" in told[0].getMessage()
        user.close()
    finally:
        redis_client.execute_command("ACL", "DELUSER", "bulk")


@needs_numpy
def test_a_grown_shard_takes_a_stack_and_one_created_anew_snapshots(
    redis_client: redis.Redis,
) -> None:
    bloom = make(redis_client, GROWING, "anew")
    bloom.add_many(fingerprints(3_000, "first"))  # grows past generation 0
    redis_client.config_resetstat()
    assert bloom.add_many(fingerprints(500, "second")) == [False] * 500
    assert calls(redis_client, "exec") == 1  # its generations, in one transaction
    assert calls(redis_client, "evalsha") == 0
    bloom.clear()
    assert bloom.add_many(fingerprints(500, "second")) == [False] * 500
    assert calls(redis_client, "exec") == 2  # the new filter's one shard (found anew)
    assert bloom.add_many(fingerprints(500, "third")) == [False] * 500
    assert calls(redis_client, "exec") == 3
