"""Workers race across growth boundaries while their connections are killed and Redis pauses.

Three OS processes (``spawn``, as separate Scrapy workers) share one filter of one shard
that grows twice during the run, each through another entry point: ``add_many`` (the bulk
path: snapshots, stacks, chunks), ``check_and_add_many`` (the batching middleware's) and
``check_and_add`` (``request_seen``'s). Meanwhile the test kills every client connection
every 20 ms and now and then pauses Redis (``DEBUG SLEEP``). Each process offers its own
elements, and the same shared elements as the others, in the same order.

What must hold (``BLOOMFILTER_ON_ERROR = "allow"``, a 1e-7 error rate: the run's ~9,900
checks meet a false positive with a chance of 1e-3 at most, two with one below 5e-7, so
one is allowed):

- no exception reaches the caller;
- none of a process's own elements is answered "seen" (that would be a lost page);
- every shared element is answered "new" by at least one process, and more than once
  only where a reply was in doubt (at most one extra per ``ambiguous`` or ``errors``);
- afterwards every element is in the filter (nothing acknowledged was lost).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import queue
import random
import threading
import traceback
from typing import Any

import pytest
import redis
from redis_server import RedisServer
from test_generations import upper
from test_race import join_all

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.engine.native.filter import NativeBloomFilter

KEY = "chaos:bloomfilter"
RATE = 1e-7
OWN = 3_000  # per process
SHARED = 900  # offered by every process
RESULT_TIMEOUT = 240
MODES = ("add_many", "check_and_add_many", "check_and_add")
#: Capacity 2,000 per generation: ~9,900 items make three generations.
BASE = {
    "BLOOMFILTER_CAPACITY": 2_000,
    "BLOOMFILTER_ERROR_RATE": RATE,
    "BLOOMFILTER_SHARDS": 1,
    "BLOOMFILTER_ON_ERROR": "allow",
    "BLOOMFILTER_RETRY_TIMEOUT": 10,
}
STATES = {
    "grown": {},
    "grown in a window": {"BLOOMFILTER_TTL": 3600},
    "native, grown in a window": {"BLOOMFILTER_BACKEND": "native", "BLOOMFILTER_TTL": 3600},
}


def fingerprints(n: int, tag: str) -> list[str]:
    return [hashlib.sha1(f"{tag}-{i}".encode()).hexdigest() for i in range(n)]


def open_filter(client: redis.Redis, settings: dict[str, Any]) -> RedisBloomFilter:
    config = BloomConfig.from_settings(settings)
    if settings.get("BLOOMFILTER_BACKEND") == "native":
        return NativeBloomFilter.from_config(client, KEY, config)
    return RedisBloomFilter.from_config(client, KEY, config, cache_size=0)


def _offer(index: int, url: str, settings: dict[str, Any], barrier: Any, results: Any) -> None:
    """Offer this process's elements and the shared ones through ``MODES[index]``.

    Puts ``(index, own answers, shared answers, event counts, None)`` on ``results``, or
    ``(index, None, None, None, traceback)`` if anything raises.
    """
    try:
        client = redis.Redis.from_url(url, socket_timeout=5)
        bloom = open_filter(client, settings)
        own, shared = fingerprints(OWN, f"own-{index}"), fingerprints(SHARED, "shared")
        step = 400 if MODES[index] == "add_many" else 10
        mine: list[bool] = []
        theirs: list[bool] = []
        barrier.wait(timeout=60)
        for start in range(0, OWN, step):
            part = own[start : start + step]
            common = shared[start * SHARED // OWN : (start + step) * SHARED // OWN]
            if MODES[index] == "check_and_add":
                answers = [bloom.check_and_add(e) for e in part + common]
            else:
                answers = getattr(bloom, MODES[index])(part + common)
            mine += answers[: len(part)]
            theirs += answers[len(part) :]
        counts = dict(bloom.events.counts)
        bloom.close()
        client.close()
        results.put((index, mine, theirs, counts, None))
    except BaseException:
        results.put((index, None, None, None, traceback.format_exc()))


def _chaos(admin: redis.Redis, stop: threading.Event) -> None:
    """Kill every other client's connections every 20 ms; pause Redis 0.2 s now and then."""
    pick = random.Random(7)
    while not stop.wait(0.02):
        try:
            if pick.random() < 0.03:
                admin.execute_command("DEBUG", "SLEEP", "0.2")
            else:
                admin.client_kill_filter(_type="normal", skipme=True)
        except redis.RedisError:
            pass  # our own connection met a pause: the next round tries again


@pytest.mark.timeout(300)
@pytest.mark.parametrize("state", list(STATES))
def test_racing_workers_under_killed_connections_and_pauses_lose_nothing(
    state: str, bloom_redis_server: RedisServer
) -> None:
    settings = {**BASE, **STATES[state]}
    admin = bloom_redis_server.client()
    admin.flushall()
    open_filter(admin, settings).close()  # the record exists before the race

    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(MODES) + 1)
    results = context.Queue()
    workers = [
        context.Process(
            target=_offer,
            args=(i, bloom_redis_server.url, settings, barrier, results),
            daemon=True,
        )
        for i in range(len(MODES))
    ]
    for worker in workers:
        worker.start()
    stop = threading.Event()
    chaos = threading.Thread(target=_chaos, args=(admin, stop), daemon=True)
    reports: dict[int, tuple[list[bool], list[bool], dict[str, int]]] = {}
    errors: list[str] = []
    try:
        barrier.wait(timeout=120)
        chaos.start()
        for _ in workers:
            try:
                index, mine, theirs, counts, error = results.get(timeout=RESULT_TIMEOUT)
            except queue.Empty:
                pytest.fail(f"a process did not report within {RESULT_TIMEOUT} s")
            if error is not None:
                errors.append(f"{MODES[index]}:\n{error}")
            else:
                reports[index] = (mine, theirs, counts)
    finally:
        stop.set()
        if chaos.is_alive():
            chaos.join(10)
        join_all(workers)
    assert errors == []
    doubts = sum(c.get("ambiguous", 0) + c.get("errors", 0) for _, _, c in reports.values())
    assert sum(c.get("retries", 0) for _, _, c in reports.values()) + doubts > 0  # it hit

    # Poisson with a mean of 1e-3 at most: one false positive may come (two: below 5e-7).
    bound = int(upper(OWN * len(MODES) + SHARED, RATE)) + 1
    for index, (mine, _, _) in reports.items():
        assert len(mine) == OWN
        assert sum(mine) <= bound, f"{MODES[index]} was told 'seen' for its own new elements"
    new_to = [sum(not theirs[i] for _, theirs, _ in reports.values()) for i in range(SHARED)]
    assert new_to.count(0) <= bound  # a shared element nobody was told is new: lost
    assert sum(n - 1 for n in new_to if n > 1) <= doubts

    bloom = open_filter(admin, settings)
    everything = [e for i in range(len(MODES)) for e in fingerprints(OWN, f"own-{i}")]
    assert bloom.contains_many(everything + fingerprints(SHARED, "shared")) == [True] * (
        len(everything) + SHARED
    )
    assert len(bloom.state().generations) >= 3  # the race crossed two growth boundaries
    bloom.close()
    admin.close()
