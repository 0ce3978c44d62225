"""Several OS processes race to add the same fingerprints: each must win exactly once.

Four processes (``spawn``: fresh interpreters, as separate Scrapy workers would be)
start together at a barrier and offer the same 5,000 fingerprints to one filter in
the same Redis, one ``check_and_add`` call each, so that their calls interleave. The
check and the add of one element run in one Lua script, atomically: of the processes
offering an element, exactly one may be told it is new.
"""

from __future__ import annotations

import collections
import hashlib
import multiprocessing
import queue
import random
import traceback
from typing import Any

import pytest
import redis

from scrapy_redis_bloom import FilterSpec, RedisBloomFilter
from scrapy_redis_bloom.core.hashing import locate, offsets
from scrapy_redis_bloom.core.settings import false_positive_rate

PROCESSES = 4
ELEMENTS = 5_000
KEY = "race:bloomfilter"
# 4 shards of 2**20 bits (512 KiB in all), k = 7. With all 5,000 elements in, a new
# element is a false positive with probability (1 - e**(-k n / m))**k = 2.7e-15
# (asserted below), so about 1.4e-11 for the whole run. More to the point,
# test_no_false_positive_is_possible checks that every element has a bit no other
# element sets: none can be reported seen before it was added, in any order.
SPEC = FilterSpec(shards=4, shard_bits=2**20, hash_count=7)
RESULT_TIMEOUT = 120  # seconds; the race itself takes a few


def fingerprints() -> list[str]:
    """Return the race's elements: 40-hex-digit strings, as request fingerprints are."""
    return [hashlib.sha1(f"race-{i}".encode()).hexdigest() for i in range(ELEMENTS)]


def _race(
    index: int,
    redis_url: str,
    elements: list[str],
    shuffle_seed: int | None,
    barrier: Any,
    results: Any,
) -> None:
    """Offer every element once, after the barrier; report those found new.

    Runs in a child process. Puts ``(index, new elements, None)`` on ``results``, or
    ``(index, None, traceback)`` if anything fails.
    """
    try:
        client = redis.Redis.from_url(redis_url)
        bloom = RedisBloomFilter(client, KEY, SPEC, capacity=ELEMENTS)
        bloom.open()  # the record exists: this checks the geometry against it
        order = list(elements)
        if shuffle_seed is not None:
            random.Random(shuffle_seed).shuffle(order)
        client.ping()  # connected before the start
        barrier.wait(timeout=60)
        new = [element for element in order if not bloom.check_and_add(element)]
        client.close()
        results.put((index, new, None))
    except BaseException:
        results.put((index, None, traceback.format_exc()))


def join_all(workers: list[Any]) -> None:
    """Wait for each process up to 30 s, killing one that hangs (the test fails on it)."""
    for worker in workers:
        worker.join(timeout=30)
        if worker.is_alive():
            worker.kill()
            worker.join()


def test_no_false_positive_is_possible() -> None:
    assert false_positive_rate(SPEC.bits, SPEC.hash_count, ELEMENTS) < 3e-15
    bits = [
        {(shard, offset) for offset in offsets(x, y, SPEC.hash_count, SPEC.shard_bits)}
        for shard, x, y in (locate(fp, SPEC) for fp in fingerprints())
    ]
    setters = collections.Counter(bit for element_bits in bits for bit in element_bits)
    # An element whose every bit is also set by others could read as seen before it is added.
    covered = [i for i, mine in enumerate(bits) if all(setters[bit] > 1 for bit in mine)]
    assert covered == []


@pytest.mark.timeout(180)
@pytest.mark.parametrize("order", ["shuffled", "lockstep"])
def test_each_fingerprint_is_new_to_exactly_one_process(
    order: str, redis_url: str, redis_client: redis.Redis
) -> None:
    elements = fingerprints()
    # Create the record up front: the race is about check_and_add, not open().
    RedisBloomFilter(redis_client, KEY, SPEC, capacity=ELEMENTS).open()

    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES)
    results = context.Queue()
    # Shuffled: each process in its own order. Lockstep: all in the same order, so they
    # contend for each element at about the same moment.
    seeds = [1000 + i if order == "shuffled" else None for i in range(PROCESSES)]
    workers = [
        context.Process(
            target=_race,
            args=(i, redis_url, elements, seeds[i], barrier, results),
            name=f"race-{i}",
            daemon=True,
        )
        for i in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    new_to: dict[int, list[str]] = {}
    errors: list[str] = []
    try:
        for _ in workers:
            try:
                index, new, error = results.get(timeout=RESULT_TIMEOUT)
            except queue.Empty:
                pytest.fail(f"a racing process did not report within {RESULT_TIMEOUT} s")
            if error is not None:
                errors.append(f"process {index}:\n{error}")
            else:
                new_to[index] = new
    finally:
        join_all(workers)
    assert errors == []
    assert [worker.exitcode for worker in workers] == [0] * PROCESSES

    wins = collections.Counter(element for new in new_to.values() for element in new)
    shares = {index: len(new) for index, new in sorted(new_to.items())}
    twice = [element for element, n in wins.items() if n > 1]
    assert twice == [], f"new to several processes: {twice[:5]} (wins per process: {shares})"
    assert set(wins) == set(elements), f"wins per process: {shares}"
    assert sum(shares.values()) == ELEMENTS

    # The filter now holds every element, as one sequential writer would have left it.
    bloom = RedisBloomFilter(redis_client, KEY, SPEC, capacity=ELEMENTS)
    assert all(bloom.contains_many(elements))
    assert abs(bloom.state().estimated_items - ELEMENTS) <= ELEMENTS // 100
