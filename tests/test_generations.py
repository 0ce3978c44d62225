"""Growth and re-crawl windows on real Redis: rates within the math, nothing forgotten early.

Bounds are binomial: q queries of new elements, each a false positive with probability
at most p, give at most q p + 6 sqrt(q p (1 - p)) hits but for a chance below 1e-9.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import math
import multiprocessing
import queue
import re
import struct
import threading
import time
import traceback
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.cluster import RedisCluster
from redis.crc import key_slot

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.core.errors import (
    ConfigMismatchError,
    FilterDamagedError,
    FilterUnavailableError,
    WrongTypeError,
)
from scrapy_redis_bloom.core.generations import (
    COUNT_BIT,
    GENERATIONS_BIT,
    MAX_GENERATIONS,
    Growth,
    _generation_of,
)
from scrapy_redis_bloom.core.hashing import BLOCK_BITS, FilterSpec
from scrapy_redis_bloom.core.settings import FaultPolicy
from scrapy_redis_bloom.core.sizing import false_positive_rate
from scrapy_redis_bloom.engine.bitmap.fastpath import STATE_EVERY
from scrapy_redis_bloom.transport.executor import PROBE_INTERVAL

KEY = "grow:bloomfilter"


def fingerprints(n: int, tag: str) -> list[str]:
    """Return n distinct 40-hex-digit elements, as request fingerprints are."""
    return [hashlib.sha1(f"{tag}-{i}".encode()).hexdigest() for i in range(n)]


def config(capacity: int, rate: float, **more: Any) -> BloomConfig:
    return BloomConfig.from_settings(
        {"BLOOMFILTER_CAPACITY": capacity, "BLOOMFILTER_ERROR_RATE": rate, **more}
    )


def bloom_for(client: Any, cfg: BloomConfig, key: str = KEY, **kwargs: Any) -> RedisBloomFilter:
    return RedisBloomFilter.from_config(client, key, cfg, **kwargs)


def upper(queries: int, rate: float) -> float:
    """Return the most false positives q new elements give at rate p, but for a 1e-9 chance."""
    return queries * rate + 6 * math.sqrt(queries * rate * (1 - rate))


def generations_for(growth: Growth, items_per_shard: float) -> int:
    """Return how many generations a shard holding ``items_per_shard`` items has."""
    held, g = 0, 0
    for gen in growth.generations:
        held += gen.capacity
        g += 1
        if items_per_shard <= held:
            break
    return g


# -- the geometry: pure numbers --------------------------------------------------------


@pytest.mark.parametrize("blocked", [False, True], ids=["classic", "blocked"])
@pytest.mark.parametrize(("capacity", "rate"), [(10_000, 1e-3), (1_000_000, 1e-4)])
def test_the_compound_rate_stays_under_the_configured_one(
    capacity: int, rate: float, blocked: bool
) -> None:
    growth = config(capacity, rate, BLOOMFILTER_BLOCKED=blocked).growth
    spec = growth.spec
    # Generation 0 is sized for p (1 - r) at its share of the capacity; it takes more, up
    # to 3/4 of the bound, as headroom for the spread over shards (none with one shard).
    at_share = false_positive_rate(
        spec.shard_bits, spec.hash_count, growth.shard_capacity, spec.block_bits
    )
    assert at_share <= rate * 0.5
    assert growth.generation(0).error_rate <= max(rate * 0.5, 0.75 * growth.bound)
    # Each later one for r times the one before: together under p.
    for g in range(1, growth.last + 2):
        assert growth.compound_rate(g) <= rate
    assert growth.rate_bound <= rate


def test_each_generation_takes_e_times_the_items_at_r_times_the_rate() -> None:
    # The classic layout's generations: k = log2(1/p) (the blocked one's k differs).
    growth = config(1_000_000, 1e-4, BLOOMFILTER_EXPANSION=4, BLOOMFILTER_BLOCKED=False).growth
    share = growth.shard_capacity
    for g in range(1, growth.last + 1):
        gen = growth.generation(g)
        assert gen.capacity == share * 4**g
        if g > 1:
            assert gen.error_rate == pytest.approx(growth.generation(g - 1).error_rate * 0.5)
        assert gen.hash_count == math.ceil(math.log2(1 / gen.error_rate))
        # Its own bits hold its items at its rate (the optimum, rounded up).
        assert false_positive_rate(gen.bits, gen.hash_count, gen.capacity) <= gen.error_rate * 1.1


def test_generation_0_has_headroom_for_the_spread_over_shards() -> None:
    # 1,000,000 items over 21 shards: each gets its share +- sqrt(share). Without headroom,
    # half the shards would grow at exactly the capacity; with 4 sigma, none.
    growth = config(1_000_000, 1e-3).growth
    share = growth.shard_capacity
    assert growth.spec.shards > 1
    assert growth.first_capacity >= share + 4 * math.sqrt(share)
    # Its rate there stays within the bound, the rest of which the later generations share.
    assert growth.generation(0).error_rate <= 0.75 * growth.bound
    assert growth.rate_bound <= growth.bound <= 1e-3


def test_generations_stop_where_a_redis_string_ends() -> None:
    # 8 MiB shards doubling: the 7th generation would pass 512 MiB (2**32 bits).
    growth = BloomConfig.from_settings({}).growth
    assert growth.spec.shard_bits <= 2**26
    assert 0 < growth.last < MAX_GENERATIONS - 1
    assert growth.generation(growth.last).bits <= 2**32
    past = _generation_of(Growth(growth.spec, growth.capacity, 2), growth.last + 1)
    assert past.bits > 2**32 - 256
    # The default filter then holds 63x its capacity before its rate can rise.
    assert growth.grown_capacity >= 63 * growth.capacity


def test_no_growth_has_generation_0_only() -> None:
    growth = config(10_000, 1e-3, BLOOMFILTER_EXPANSION=0).growth
    assert growth.last == 0
    assert growth.generation(0).error_rate <= 1e-3
    with pytest.raises(ValueError, match="generations 0 to 0"):
        growth.generation(1)


# -- false-positive rate at 1x, 4x, 10x capacity ---------------------------------------


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fill", [1, 4, 10])
def test_a_growing_filter_keeps_its_rate_at_any_fill(fill: int, redis_client: redis.Redis) -> None:
    capacity, rate = 5_000, 0.01
    cfg = config(capacity, rate)
    bloom = bloom_for(redis_client, cfg)
    members = fingerprints(capacity * fill, "member")
    bloom.add_many(members)
    queries = 50_000
    hits = sum(bloom.contains_many(fingerprints(queries, "stranger")))
    assert hits <= upper(queries, rate), (fill, hits)
    # Every member is still there, in whichever generation holds it.
    assert all(bloom.contains_many(members))
    state = bloom.state()
    assert len(state.generations) == generations_for(cfg.growth, capacity * fill / cfg.spec.shards)
    assert state.estimated_fpr <= rate
    assert state.estimated_items == pytest.approx(len(members), rel=0.05)
    bloom.close()


@pytest.mark.timeout(120)
def test_without_growth_the_rate_explodes_past_capacity(redis_client: redis.Redis) -> None:
    capacity, rate = 5_000, 0.01
    cfg = config(capacity, rate, BLOOMFILTER_EXPANSION=0)
    bloom = bloom_for(redis_client, cfg)
    bloom.add_many(fingerprints(capacity * 4, "member"))
    queries = 20_000
    hits = sum(bloom.contains_many(fingerprints(queries, "stranger")))
    theory = false_positive_rate(cfg.spec.bits, cfg.spec.hash_count, capacity * 4)
    assert theory > 0.4  # what the README's table says: ~half of new URLs dropped
    sigma = math.sqrt(queries * theory * (1 - theory))
    assert abs(hits - queries * theory) <= 6 * sigma
    bloom.close()


# -- topologies: standalone, server list, cluster ---------------------------------------


def _grow_and_check(client: Any) -> None:
    cfg = config(2_000, 0.01, BLOOMFILTER_SHARDS=4)
    bloom = bloom_for(client, cfg)
    members = fingerprints(20_000, "member")
    # Half through the hot path, half in bulk: one script, the same generations.
    hot = [bloom.check_and_add(e) for e in members[:2_000]]
    bulk = bloom.add_many(members[2_000:])
    assert sum(hot) + sum(bulk) <= upper(20_000, 0.01)
    assert all(bloom.contains_many(members))
    assert all(bloom.check_and_add(e) for e in members[::97])
    assert bloom.generations >= 4
    assert bloom.events.counts["grown"] >= 4 * 3
    hits = sum(bloom.contains_many(fingerprints(20_000, "stranger")))
    assert hits <= upper(20_000, 0.01)
    bloom.clear()
    bloom.close()


@pytest.mark.timeout(180)
def test_growth_on_one_server(redis_client: redis.Redis) -> None:
    _grow_and_check(redis_client)
    assert redis_client.keys("*grow:bloomfilter*") == []  # clear() took every generation


@pytest.mark.timeout(180)
def test_growth_on_a_server_list(clients: list[redis.Redis]) -> None:
    _grow_and_check(clients)
    assert all(client.keys("*grow:bloomfilter*") == [] for client in clients)


@pytest.mark.timeout(180)
def test_growth_on_a_cluster(redis_cluster: RedisCluster) -> None:
    # Every generation of a shard is in its slot: the script reaches them on its node.
    _grow_and_check(redis_cluster)
    assert redis_cluster.keys("*grow:bloomfilter*", target_nodes=RedisCluster.ALL_NODES) == []


# -- no false negatives, whatever the order of adds ---------------------------------------


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batches=st.lists(
        st.tuples(st.integers(0, 400), st.booleans()),
        min_size=1,
        max_size=12,
    )
)
def test_nothing_added_is_ever_reported_new(
    redis_client: redis.Redis, batches: list[tuple[int, bool]]
) -> None:
    redis_client.flushdb()
    cfg = config(100, 0.05, BLOOMFILTER_SHARDS=2, BLOOMFILTER_EXPANSION=3)
    bloom = bloom_for(redis_client, cfg)
    bloom.open()  # (a read of a missing filter raises: the first batch may add nothing)
    added: list[str] = []
    for n, (size, bulk) in enumerate(batches):
        batch = fingerprints(size, f"b{n}")
        if bulk:
            bloom.add_many(batch)
        else:
            for element in batch:
                bloom.check_and_add(element)
        added += batch
        assert all(bloom.contains_many(added))
    bloom.close()


# -- the race at the growth boundary -----------------------------------------------------

PROCESSES = 4
RACE = {"BLOOMFILTER_CAPACITY": 100, "BLOOMFILTER_ERROR_RATE": 0.001, "BLOOMFILTER_SHARDS": 1}
#: Generations of 3,000 items and more: most checks go without the script
#: (engine/bitmap/stackpath.py), which takes over in the last items before each boundary.
SCRIPTLESS = {**RACE, "BLOOMFILTER_CAPACITY": 3_000}
#: Per race: its settings, the elements offered, the generations it must reach at least.
RACES = {"small": (RACE, 3_000, 5), "scriptless": (SCRIPTLESS, 20_000, 3)}


def _race(
    index: int, redis_url: str, barrier: Any, results: Any, race: dict[str, Any], count: int
) -> None:
    """Offer every element once, after the barrier; report those found new and growths."""
    try:
        client = redis.Redis.from_url(redis_url)
        bloom = bloom_for(client, BloomConfig.from_settings(race))
        bloom.open()
        client.ping()
        barrier.wait(timeout=60)
        elements = fingerprints(count, "race")
        new = [e for e in elements if not bloom.check_and_add(e)]
        results.put((index, new, bloom.events.counts["grown"], None))
        bloom.close()
    except BaseException:
        results.put((index, None, 0, traceback.format_exc()))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", list(RACES))
def test_workers_crossing_the_growth_boundary_together_grow_once(
    redis_url: str, redis_client: redis.Redis, name: str
) -> None:
    # One shard: the elements cross several boundaries, all 4 processes at once.
    race, count, least = RACES[name]
    cfg = BloomConfig.from_settings(race)
    bloom_for(redis_client, cfg).open()
    redis_client.config_resetstat()
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES)
    results = context.Queue()
    workers = [
        context.Process(
            target=_race, args=(i, redis_url, barrier, results, race, count), daemon=True
        )
        for i in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    new_to: list[list[str]] = []
    grown = 0
    errors: list[str] = []
    try:
        for _ in workers:
            try:
                _, new, grew, error = results.get(timeout=200)
            except queue.Empty:
                pytest.fail("a racing process did not report in time")
            if error is not None:
                errors.append(error)
            else:
                new_to.append(new)
                grown += grew
    finally:
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
    assert errors == []
    wins = collections.Counter(e for new in new_to for e in new)
    assert [e for e, n in wins.items() if n > 1] == []  # new to one process at most
    # Each new answer is one item counted in one generation: the full generations hold
    # their capacity, the newest its count. A generation started twice, or an item
    # counted twice, breaks the sum. A full generation may hold a few more than its
    # capacity: the counts the workers held back when it filled (fewer than STATE_EVERY
    # each, engine/bitmap/stackpath.py; these workers hold no lease, so none is told of
    # the others), counted in the next one.
    growth = cfg.growth
    key = "{grow:bloomfilter:0}:g0"
    generations, count_now = (
        redis_client.bitfield(key).get("u16", GENERATIONS_BIT).get("u32", COUNT_BIT).execute()
    )
    full = sum(growth.generation(g).capacity for g in range(generations - 1))
    late = sum(wins.values()) - (full + count_now)
    assert 0 <= late <= PROCESSES * STATE_EVERY * (generations - 1)
    assert generations >= least
    assert grown == generations - 1  # each generation started by exactly one call
    names = [f"{{grow:bloomfilter:0}}:g{g}" for g in range(MAX_GENERATIONS)]
    assert redis_client.exists(*names) == generations
    # Elements missed by all were false positives: rare, at most the compound rate.
    assert count - len(wins) <= upper(count, growth.rate_bound)
    scripts = redis_client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    assert scripts > 0  # the boundaries were crossed by the script
    if name == "scriptless":  # most checks went without it
        assert scripts < PROCESSES * count / 2


# -- a lost generation ------------------------------------------------------------------------


def _grown(client: redis.Redis, **faults: Any) -> RedisBloomFilter:
    cfg = config(200, 0.01, BLOOMFILTER_SHARDS=1)
    bloom = bloom_for(client, cfg, faults=FaultPolicy(**faults))
    bloom.add_many(fingerprints(700, "member"))
    assert bloom.generations == 3
    return bloom


def test_a_lost_generation_stops_the_filter_by_default(redis_client: redis.Redis) -> None:
    bloom = _grown(redis_client)
    redis_client.delete("{grow:bloomfilter:0}:g1")
    with pytest.raises(FilterDamagedError, match=r"g1' of shard 0 .* is gone .*ON_LOSS"):
        bloom.check_and_add(fingerprints(1, "new")[0])
    redis_client.set("{grow:bloomfilter:0}:g1", "not a filter")
    with pytest.raises(FilterDamagedError, match="never overwritten"):
        bloom.check_and_add(fingerprints(1, "new")[0])
    assert redis_client.get("{grow:bloomfilter:0}:g1") == b"not a filter"


@pytest.mark.parametrize("foreign", ["list", "string", "hash"])
@pytest.mark.parametrize("bulk", [False, True])
def test_a_foreign_key_where_a_shard_grows_is_never_overwritten(
    redis_client: redis.Redis, foreign: str, bulk: bool
) -> None:
    """Another program's key where the next generation goes stops the growth, named.

    As at generation 0 (WrongTypeError, or FilterDamagedError for a string without a
    header); nothing of the call is added: once the key is gone, its URLs are new.
    """
    g1 = "{grow:bloomfilter:0}:g1"
    write = {
        "list": lambda: redis_client.rpush(g1, "another", "program"),
        "string": lambda: redis_client.set(g1, "another program's value"),
        "hash": lambda: redis_client.hset(g1, "another", "program"),
    }[foreign]
    write()
    cfg = config(1000, 0.01, BLOOMFILTER_SHARDS=1, BLOOMFILTER_CACHE_SIZE=0)
    bloom = bloom_for(redis_client, cfg)
    fps = fingerprints(3000, "foreign")
    error = WrongTypeError if foreign != "string" else FilterDamagedError
    named = rf"{re.escape(repr(g1))} .*(holds a {foreign}|never overwritten)"

    def feed() -> None:
        if bulk:
            bloom.add_many(fps)
        for fp in fps:
            bloom.check_and_add(fp)

    with pytest.raises(error, match=named):
        feed()
    assert redis_client.type(g1) == foreign.encode()
    assert bloom.generations == 1
    redis_client.delete(g1)
    rest = fps[1000:]
    assert sum(bloom.add_many(rest)) <= upper(len(rest), 0.01)
    assert bloom.generations >= 2
    bloom.close()


def test_a_lost_generation_is_recreated_empty_when_asked(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    bloom = _grown(redis_client, on_loss="recreate")
    redis_client.delete("{grow:bloomfilter:0}:g1")
    assert bloom.check_and_add(fingerprints(1, "new")[0]) is False
    assert bloom.events.counts["recreated"] == 1
    assert "recreated empty" in caplog.text
    assert redis_client.strlen("{grow:bloomfilter:0}:g1") > 32


#: Shard 0's keys of the filter the tests grow.
SHARD = "{grow:bloomfilter:0}"


def _state_of(client: redis.Redis, key: str) -> tuple[int, int]:
    """Return a generation 0's state: the generations, and the newest one's items."""
    head = client.getrange(key, GENERATIONS_BIT // 8, COUNT_BIT // 8 + 3)
    generations, count = struct.unpack(">HI", head)
    return generations, count


def _by_generation(members: list[str], growth: Growth, seen: list[bool]) -> dict[str, list[str]]:
    """Return members added in order to an empty one-shard filter, by the generation they are in.

    Generation 0 takes the first ones found new, 1 the next, 2 the rest: the false positives
    (``seen`` at their add, so in none) shift the bounds by far less than the 100 left out.
    """
    first, second = growth.generation(0).capacity, growth.generation(1).capacity
    added = [member if not was else "" for member, was in zip(members, seen, strict=True)]
    return {
        "g0": [member for member in added[:first] if member],
        "g1": [member for member in added[first + 100 : first + second] if member],
        "g2": [member for member in added[first + second + 100 :] if member],
    }


@pytest.mark.parametrize("lost", [("g0",), ("g0", "g1"), ("g0", "g2")], ids=["g0", "g1", "g2"])
def test_a_lost_generation_0_is_recreated_keeping_the_generations_grown_after_it(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture, lost: tuple[str, ...]
) -> None:
    """``ON_LOSS = "recreate"`` of a grown shard's generation 0 keeps its later generations.

    Generation 0's header counts the shard's generations: recreated with a fresh one, the
    shard read g0 alone, its intact g1 and g2 left unread (their URLs "new"), unreported,
    and ``state()`` showed one generation. Only the URLs of what was lost may come back.
    """
    cfg = config(1000, 0.01, BLOOMFILTER_SHARDS=1)
    growth = cfg.growth
    bloom = bloom_for(redis_client, cfg, cache_size=0, faults=FaultPolicy(on_loss="recreate"))
    members = fingerprints(5000, "kept")
    parts = _by_generation(members, growth, bloom.add_many(members))
    assert bloom.generations == 3
    _, held = _state_of(redis_client, f"{SHARD}:g0")  # items in g2, the newest
    redis_client.delete(*(f"{SHARD}:{name}" for name in lost))
    with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
        answers = dict(zip(members, bloom.contains_many(members), strict=True))
    kept = [g for g in (1, 2) if f"g{g}" not in lost]
    for name, part in parts.items():
        seen = sum(answers[member] for member in part)
        if name in lost:  # only false positives of what is kept
            assert seen <= upper(len(part), growth.rate_bound), name
        else:
            assert seen == len(part), name
    # The warning names what was recreated, and what was kept.
    assert f"Recreated 1 lost shard(s) of the Bloom filter {KEY!r}" in caplog.text
    assert f"'{SHARD}:g0'" in caplog.text
    listed = ", ".join(map(str, kept))
    assert f"shard 0: kept generation{'s' if len(kept) > 1 else ''} {listed}" in caplog.text
    assert bloom.events.counts["recreated"] == 1
    # The header counts the generations; the newest one's count is its items (from its bits,
    # a few sigmas above), or none where it was lost too: adds go on in it.
    generations, count = _state_of(redis_client, f"{SHARD}:g0")
    assert generations == 3
    if "g2" in lost:
        assert count == 0
    else:
        assert held <= count <= held + 8 * math.sqrt(held)
    # state() shows the generations kept, and those lost as well as damaged.
    state = bloom.state()
    assert [gen.generation for gen in state.generations] == [0, *kept]
    assert {part.key for part in state.damaged} == {f"{SHARD}:{n}" for n in lost if n != "g0"}
    assert state.estimated_items >= 0.9 * sum(len(parts[f"g{g}"]) for g in kept)
    # New URLs go to the newest generation (recreated empty if it was lost): none to the
    # recreated g0, no generation started early.
    later = fingerprints(300, "later")
    assert sum(bloom.add_many(later)) <= upper(len(later), growth.rate_bound)
    assert redis_client.bitcount(f"{SHARD}:g0", 32, -1) == 0
    assert bloom.generations == 3
    assert not redis_client.exists(f"{SHARD}:g3")
    assert _state_of(redis_client, f"{SHARD}:g0")[1] >= count + 300 - upper(300, 0.01)
    assert all(bloom.contains_many(later))
    for g in kept:
        assert all(bloom.contains_many(parts[f"g{g}"]))
    assert bloom.state().damaged == ()
    # Another worker reads them too.
    other = bloom_for(redis_client, cfg, cache_size=0)
    for g in kept:
        assert all(other.contains_many(parts[f"g{g}"]))
    bloom.close()
    other.close()


@pytest.mark.parametrize("window", ["current", "before", "anchor too"])
def test_a_lost_generation_0_of_a_window_keeps_the_generations_it_grew(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture, window: str
) -> None:
    """The same for a re-crawl window's generation 0, which the script recreates.

    The current window's came back with one generation, its g1 and g2 unread; the window
    before's was never recreated, and read as one generation lost. Now reads pass over the
    lost g0 to g1 and g2 (a bulk read of many of a shard's elements was lost again and again
    till the retry timeout, then raised), and a write recreates it keeping them. With the
    shard's anchor lost too (recreated naming no window), the window was started anew.
    """
    ttl = 86_400
    cfg = config(1000, 0.01, BLOOMFILTER_TTL=ttl, BLOOMFILTER_SHARDS=1)
    growth = cfg.growth
    bloom = bloom_for(redis_client, cfg, cache_size=0, faults=FaultPolicy(on_loss="recreate"))
    members = fingerprints(5000, "window")
    parts = _by_generation(members, growth, bloom.add_many(members))
    assert bloom.generations == 3
    w = int(redis_client.time()[0]) // ttl
    if window == "before":  # make it the window before: the anchor says w has not started
        for g in range(3):
            redis_client.rename(f"{SHARD}:w{w}:g{g}", f"{SHARD}:w{w - 1}:g{g}")
        redis_client.setrange(f"{SHARD}:g0", GENERATIONS_BIT // 8, struct.pack(">HI", 0, w - 1))
        w -= 1
    base = f"{SHARD}:w{w}:g"
    _, held = _state_of(redis_client, f"{base}0")
    redis_client.delete(f"{base}0")
    if window == "anchor too":  # (then no read knows the window started before a write)
        redis_client.delete(f"{SHARD}:g0")
    later = parts["g1"] + parts["g2"]
    with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
        if window != "anchor too":
            assert all(bloom.contains_many(later))  # read before any write
        assert bloom.check_and_add(fingerprints(1, "new")[0]) is False
        assert sum(bloom.contains_many(parts["g0"])) <= upper(len(parts["g0"]), growth.rate_bound)
        assert all(bloom.contains_many(later))
    assert bloom.events.counts["recreated"] >= 1
    which = "previous" if window == "before" else "current"
    assert f"Generation 0 of the {which} re-crawl window of shard 0" in caplog.text
    assert "was kept (generations 1 to 2)" in caplog.text
    generations, count = _state_of(redis_client, f"{base}0")
    assert generations == 3
    assert held <= count <= held + 8 * math.sqrt(held) + 1
    # It expires with its window (the window before's a TTL earlier than the current's).
    assert 0 < redis_client.ttl(f"{base}0") <= redis_client.ttl(f"{base}1")
    if window == "before":
        assert redis_client.ttl(f"{base}0") <= ttl
    state = bloom.state()
    assert [gen.generation for gen in state.generations] == [0, 1, 2]
    assert state.damaged == ()
    assert bloom_for(redis_client, cfg, cache_size=0).contains_many(later) == [True] * len(later)
    bloom.close()


@pytest.mark.parametrize("ttl", [0, 86_400])
def test_a_bulk_read_passes_over_a_lost_generation_when_asked(
    redis_client: redis.Redis, ttl: int
) -> None:
    """``contains_many`` of a shard whose g1 is lost, under ``ON_LOSS = "recreate"``.

    The leave to pass over the lost part went with the call's first script of the shard:
    each next one met it lost again, until the retry timeout, and the read raised "lost
    again each time it was recreated" (nothing was). A read recreates nothing.
    """
    more = {"BLOOMFILTER_TTL": ttl} if ttl else {}
    cfg = config(1000, 0.01, BLOOMFILTER_SHARDS=1, **more)
    faults = FaultPolicy(on_loss="recreate", retry_timeout=2)
    bloom = bloom_for(redis_client, cfg, cache_size=0, faults=faults)
    members = fingerprints(5000, "passed")
    parts = _by_generation(members, cfg.growth, bloom.add_many(members))
    window = f":w{int(redis_client.time()[0]) // ttl}" if ttl else ""
    lost = f"{SHARD}{window}:g1"
    redis_client.delete(lost)
    answers = dict(zip(members, bloom.contains_many(members), strict=True))
    assert all(answers[member] for member in parts["g0"] + parts["g2"])
    assert sum(answers[member] for member in parts["g1"]) <= upper(
        len(parts["g1"]), cfg.growth.rate_bound
    )
    assert not redis_client.exists(lost)
    assert bloom.check_and_add(fingerprints(1, "new")[0]) is False  # recreates it
    assert redis_client.exists(lost)
    bloom.close()


# -- the record: workers agree ------------------------------------------------------------------


def test_the_record_decides_growth_and_ttl(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    bloom_for(redis_client, config(1_000, 0.01)).open()
    stored = redis_client.hgetall("grow:bloomfilter:meta")
    assert (stored[b"expansion"], stored[b"ttl"], stored[b"tightening"]) == (b"2", b"0", b"0.5")
    # Another expansion: the record's applies, said in the log.
    asked = config(1_000, 0.01, BLOOMFILTER_EXPANSION=4)
    other = bloom_for(redis_client, asked)
    record = other.open()
    assert record.expansion == 2
    assert "created with BLOOMFILTER_EXPANSION = 2" in caplog.text
    # The startup line says the growth in use, not the setting's (it said "grows 4x").
    said = other.describe_geometry(asked, record)
    assert "growing 2x per generation" in said
    assert "4x" not in said
    # Another TTL: refused, every worker must forget alike.
    with pytest.raises(ConfigMismatchError, match="BLOOMFILTER_TTL = 0"):
        bloom_for(redis_client, config(1_000, 0.01, BLOOMFILTER_TTL=60)).open()


def test_a_filter_from_before_growth_keeps_working(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    old = bloom_for(redis_client, config(1_000, 0.01, BLOOMFILTER_EXPANSION=0))
    old.add_many(fingerprints(100, "member"))
    for name in ("expansion", "tightening", "ttl"):
        redis_client.hdel("grow:bloomfilter:meta", name)
    redis_client.hset("grow:bloomfilter:meta", "generations", "0")
    new = bloom_for(redis_client, config(1_000, 0.01))
    assert new.open().expansion == 0
    assert "It cannot grow" in caplog.text
    assert all(new.contains_many(fingerprints(100, "member")))


# -- re-crawl windows -------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_url_is_remembered_for_ttl_and_forgotten_within_twice_ttl(
    redis_client: redis.Redis,
) -> None:
    ttl = 2
    cfg = config(1_000, 0.001, BLOOMFILTER_TTL=ttl, BLOOMFILTER_SHARDS=2)
    bloom = bloom_for(redis_client, cfg, cache_size=0)
    elements = fingerprints(40, "ttl")
    added: dict[str, float] = {}
    forgotten: dict[str, float] = {}
    start = time.monotonic()
    # Add one element every 0.1 s over a window and a half, so they fall at every phase.
    for element in elements:
        sent = time.monotonic()  # (the add ran at this or later: ``kept`` is not underrated)
        assert bloom.check_and_add(element) is False
        added[element] = sent
        time.sleep(0.1)
    deadline = start + 4 * ttl + 6
    while len(forgotten) < len(elements) and time.monotonic() < deadline:
        answers = bloom.contains_many(elements)
        now = time.monotonic()
        for element, there in zip(elements, answers, strict=True):
            assert not (there and element in forgotten), element  # forgotten for good
            if not there and element not in forgotten:
                forgotten[element] = now
        time.sleep(0.05)
    assert len(forgotten) == len(elements)
    for element in elements:
        kept = forgotten[element] - added[element]
        # Remembered at least TTL; forgotten by 2 x TTL (plus the polling step and the
        # rounding of Redis TIME to whole seconds).
        assert ttl - 0.05 <= kept <= 2 * ttl + 1.2, (element, kept)
    # Every key that holds bits expires; the anchors, record and counters stay.
    for name in redis_client.keys("*grow:bloomfilter*"):
        text = name.decode()
        if ":w" in text:
            assert 0 < redis_client.ttl(name) <= 2 * ttl, text
        else:
            assert text.endswith((":g0", ":meta", ":count")), text
            if text.endswith(":g0"):  # an anchor: the header alone
                assert redis_client.strlen(name) == 32, text
    # A forgotten URL is new again, once.
    assert bloom.check_and_add(elements[0]) is False
    assert bloom.check_and_add(elements[0]) is True
    bloom.clear()
    assert redis_client.keys("*grow:bloomfilter*") == []


def test_windows_when_the_server_clock_steps_back(redis_client: redis.Redis) -> None:
    """The window model both backends share (``engine/lua/windows.lua``), clock behind the anchor.

    As after a failover to a replica whose clock is behind: a window the anchor shows
    was started (and not expired) must exist, a missing one is reported; a window it
    does not show is started quietly; the anchor never moves back. The native
    backend's twin: tests/test_native.py.
    """
    ttl, anchor = 86_400, "{grow:bloomfilter:0}:g0"
    bloom = bloom_for(
        redis_client, config(1_000, 0.001, BLOOMFILTER_TTL=ttl, BLOOMFILTER_SHARDS=1), cache_size=0
    )
    element, other = fingerprints(2, "clock")
    assert bloom.check_and_add(element) is False
    w = int(redis_client.time()[0]) // ttl
    window = f"{{grow:bloomfilter:0}}:w{w}:g0"

    def set_anchor(before: int, newest: int) -> None:
        redis_client.setrange(anchor, GENERATIONS_BIT // 8, struct.pack(">HI", before, newest))

    def newest() -> int:
        return int(struct.unpack(">I", redis_client.getrange(anchor, COUNT_BIT // 8, 31))[0])

    # Window w + 1 started, w existed then: w is consulted; the anchor stays at w + 1.
    set_anchor(1, w + 1)
    assert bloom.check_and_add(element) is True
    assert newest() == w + 1
    # Two windows ahead, nothing said of w: w is no loss, it is started anew.
    set_anchor(0, w + 2)
    redis_client.delete(window)
    assert bloom.check_and_add(other) is False
    assert redis_client.exists(window)
    assert newest() == w + 2
    # The anchor says w existed when w + 1 started: w missing is a loss, reported.
    set_anchor(1, w + 1)
    redis_client.delete(window)
    with pytest.raises(FilterDamagedError, match="gone"):
        bloom.check_and_add(other)
    bloom.close()


# -- one round trip per check ----------------------------------------------------------------


HANDSHAKE = {"HELLO", "CLIENT", "SELECT", "AUTH"}


def client_commands(client: redis.Redis, action: Any) -> list[str]:
    """Run ``action``; return the commands clients sent meanwhile (MONITOR, not scripts')."""
    return [text for by_script, text in monitored(client, action) if not by_script]


def monitored(client: redis.Redis, action: Any) -> list[tuple[bool, str]]:
    """Run ``action``; return the commands run meanwhile, each with whether a script ran it.

    The handshake of this test's client is left out.
    """
    seen: list[tuple[bool, str]] = []
    with client.monitor() as monitor:
        done = threading.Event()

        def read() -> None:
            for command in monitor.listen():
                text = command["command"]
                if text == "ECHO monitor-stop":
                    done.set()
                    return
                by_script = command.get("client_type") == "lua"
                if by_script or text.split()[0] not in HANDSHAKE:
                    seen.append((by_script, text))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        time.sleep(0.2)
        action()
        client.echo("monitor-stop")
        assert done.wait(10)
        reader.join(5)
    return seen


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ttl", [0, 60])
def test_the_keys_a_script_names_itself_are_in_the_slot_of_its_key(
    redis_client: redis.Redis, ttl: int
) -> None:
    """Issue 22, bug 8: the limit the README states, and where it holds.

    A check passes the shard's key alone in KEYS; the script touches the shard's later
    generations and re-crawl windows by names it builds from it (how many, and which
    window, only the script knows). Each such name carries the shard key's hash tag, so
    it is in the same slot: Redis and Valkey (one server, Sentinel, Cluster:
    ``test_growth_on_a_cluster``) run such scripts; a proxy that routes or locks by the
    keys declared does not.
    """
    cfg = config(200, 0.01, BLOOMFILTER_SHARDS=2, BLOOMFILTER_TTL=ttl)
    bloom = bloom_for(redis_client, cfg, cache_size=0)
    bloom.add_many(fingerprints(2_000, "member"))  # several generations per shard

    def checks() -> None:
        for element in fingerprints(50, "fresh"):
            bloom.check_and_add(element)
        bloom.contains_many(fingerprints(50, "member"))

    commands = monitored(redis_client, checks)
    declared = {text.split()[3] for by_script, text in commands if text.startswith("EVALSHA ")}
    touched = {text.split()[1] for by_script, text in commands if by_script and " " in text}
    tags = {key[: key.index("}") + 1] for key in declared}
    assert len(tags) == 2  # both shards checked
    assert touched - declared  # names the scripts built: later generations, windows
    for key in touched:
        assert key[: key.index("}") + 1] in tags, key
        assert key_slot(key.encode()) in {key_slot(k.encode()) for k in declared}, key
    bloom.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ttl", [0, 60])
def test_a_check_is_two_round_trips_at_most_however_grown(
    redis_client: redis.Redis, ttl: int
) -> None:
    if ttl:  # away from a window's edges, where the script starts the next window
        into = int(redis_client.time()[0]) % ttl
        if into < 5:
            time.sleep(5 - into)
        elif into > ttl - 15:
            time.sleep(ttl - into + 5)
    cfg = config(200, 0.01, BLOOMFILTER_SHARDS=1, BLOOMFILTER_TTL=ttl)
    bloom = bloom_for(redis_client, cfg, cache_size=100)
    bloom.add_many(fingerprints(1_000, "member"))  # 200 + 400 + 800: 3 generations
    assert bloom.generations == 3
    for element in fingerprints(5, "warm-up"):  # what this worker knows of the shard settles
        bloom.check_and_add(element)
    bloom.sync_counters()
    fresh = fingerprints(3, "fresh")
    trips = bloom.round_trips
    sent = client_commands(redis_client, lambda: [bloom.check_and_add(e) for e in fresh])
    # (Counts reach Redis about once a second, in one HINCRBY per counter: not per check.)
    sent = [command for command in sent if not command.startswith("HINCRBY ")]
    # A new element: one round of reads (every generation's block and header), one add.
    assert bloom.round_trips - trips <= 2 * len(fresh), sent
    assert {command.split()[0] for command in sent} <= {"GETRANGE", "BITFIELD", "TIME"}, sent
    adds = [c for c in sent if c.startswith("BITFIELD ") and " SET u1 " in c]
    assert len(adds) == len(fresh), sent
    # Beside each add that is not to generation 0, the state read (and counted) there.
    states = [c for c in sent if c.startswith("BITFIELD ") and c not in adds]
    assert len(states) <= len(fresh), sent
    assert all(c.split()[1].endswith(":g0") and " u48 208" in c for c in states), sent
    # A member: the reads alone, one round trip (the counts synced just before).
    bloom.sync_counters()
    trips = bloom.round_trips
    assert bloom.check_and_add(fingerprints(1, "member")[0]) is True
    assert bloom.round_trips - trips == 1
    # A repeat is answered by the near-cache: no round trip at all.
    assert client_commands(redis_client, lambda: bloom.check_and_add(fresh[0])) == []
    bloom.close()


# -- faults at the growth boundary ------------------------------------------------------------


def _full_first_generation(client: redis.Redis, **faults: Any) -> tuple[RedisBloomFilter, str]:
    """Return a one-shard filter whose generation 0 holds exactly its capacity, and its key."""
    from scrapy_redis_bloom.core.settings import FaultPolicy

    cfg = config(200, 0.01, BLOOMFILTER_SHARDS=1)
    bloom = bloom_for(client, cfg, faults=FaultPolicy(**faults))
    key = "{grow:bloomfilter:0}:g0"
    capacity = cfg.growth.generation(0).capacity
    for element in fingerprints(capacity * 2, "fill"):  # bounded: FPs aside, `capacity` do
        bloom.check_and_add(element)
        if client.bitfield(key).get("u32", COUNT_BIT).execute()[0] == capacity:
            break
    assert client.bitfield(key).get("u32", COUNT_BIT).execute()[0] == capacity
    assert bloom.generations == 1
    return bloom, key


def test_out_of_memory_when_a_shard_must_grow_writes_nothing_and_never_answers_seen(
    redis_client: redis.Redis,
) -> None:
    bloom, key = _full_first_generation(redis_client, retry_timeout=0.5)
    header = redis_client.getrange(key, 0, 31)
    used = int(redis_client.info("memory")["used_memory"])
    redis_client.config_set("maxmemory-policy", "noeviction")
    redis_client.config_set("maxmemory", used // 2)
    element = fingerprints(1, "grow")[0]
    try:
        # Starting generation 1 is the call's first write: Redis refuses it whole.
        with pytest.raises(FilterUnavailableError, match=r"Redis is out of memory"):
            bloom.check_and_add(element)
        assert redis_client.getrange(key, 0, 31) == header
        assert not redis_client.exists("{grow:bloomfilter:0}:g1")
    finally:
        redis_client.config_set("maxmemory", 0)
    time.sleep(PROBE_INTERVAL)  # after a failed retry window, one attempt a second
    assert bloom.check_and_add(element) is False
    assert bloom.generations == 2
    assert bloom.check_and_add(element) is True


def test_a_full_redis_still_answers_a_grown_filters_members_and_loses_no_count(
    redis_client: redis.Redis,
) -> None:
    # Grown (generation 1 taking adds without the script): reads, then an add to the newest,
    # which carries the counts this worker owes.
    bloom, key = _full_first_generation(redis_client, retry_timeout=0.3)
    members = fingerprints(100, "grown")
    added = [bloom.check_and_add(e) for e in members].count(False)
    assert bloom.generations == 2
    bloom.sync_counters()
    # Held by the worker until the next add, which carries them (STATE_EVERY - 1 at most).
    owed = fingerprints(STATE_EVERY - 1, "owed")
    added += [bloom.check_and_add(e) for e in owed].count(False)
    assert added >= 100 + STATE_EVERY - 2
    used = int(redis_client.info("memory")["used_memory"])
    redis_client.config_set("maxmemory-policy", "noeviction")
    redis_client.config_set("maxmemory", used // 2)
    new = fingerprints(2, "refused")
    try:
        # Members are answered by the reads, which a full Redis still serves.
        assert bloom.check_and_add(members[0]) is True
        assert bloom.check_and_add_many(members[1:4]) == [True] * 3
        with pytest.raises(FilterUnavailableError, match=r"Redis is out of memory"):
            bloom.check_and_add(new[0])
        time.sleep(PROBE_INTERVAL)  # the next attempt: its reads run, its add is refused
        with pytest.raises(FilterUnavailableError, match=r"Redis is out of memory"):
            bloom.check_and_add_many([members[5], new[1]])
        bloom.sync_counters()  # refused too: the counts stay owed
    finally:
        redis_client.config_set("maxmemory", 0)
    time.sleep(PROBE_INTERVAL)  # after a failed retry window, one attempt a second
    assert not any(bloom.contains_many(new))  # nothing of the refused adds was written
    assert bloom.check_and_add_many(new) == [False, False]
    assert bloom.check_and_add_many(new) == [True, True]
    bloom.sync_counters()
    # Generation 1 holds what was added since it started, each counted once: no count
    # that rode on a refused add was lost, none counted twice.
    assert int(redis_client.bitfield(key).get("u32", COUNT_BIT).execute()[0]) == added + 2
    bloom.close()


@pytest.mark.parametrize(
    ("room", "how"), [("short", "checks"), ("short", "bulk"), ("plenty", "checks")]
)
def test_growth_that_takes_redis_past_maxmemory_is_said_as_it_begins(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture, room: str, how: str
) -> None:
    """The first shard to start a generation says when the others' will pass maxmemory.

    Growth allocates each generation whole, and Redis lets the command that passes maxmemory
    through: a scrapy-redis queue in the same Redis then had its pushes refused (requests
    lost) with nothing from the filter. Four shards on one server, room for two of their
    generations 1 (checks) or for the four but not their generations 2 (a bulk load, which
    grows them together and asks once its replies are in): said once, and counted; with
    room, nothing.
    """
    cfg = config(200_000, 0.01, BLOOMFILTER_SHARDS=4)
    bloom = bloom_for(redis_client, cfg, cache_size=0)
    elements = fingerprints(2 * cfg.capacity, "past")
    bloom.add_many(elements[: cfg.capacity * 95 // 100])  # no shard grows yet (13 sigma below)
    assert bloom.generations == 1
    generation_1 = cfg.growth.generation(1).bits // 8  # one shard's
    used = int(redis_client.info("memory")["used_memory"])
    redis_client.config_set("maxmemory-policy", "noeviction")
    margin = {"checks": 2, "bulk": 5}[how] * generation_1 if room == "short" else 64 << 20
    redis_client.config_set("maxmemory", used + margin)
    rest = elements[cfg.capacity * 95 // 100 :]
    try:
        with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
            if how == "bulk":
                answers = bloom.add_many(rest[: cfg.capacity // 10])
            else:
                for element in rest:
                    bloom.check_and_add(element)
                    if bloom.generations > 1:  # the first shard: the others have not yet
                        break
    finally:
        redis_client.config_set("maxmemory", 0)
    assert bloom.generations == 2
    if how == "bulk":  # the check went after the load's replies: none of them lost
        assert bloom.events.counts["ambiguous"] == 0
        assert answers.count(True) <= upper(len(answers), 0.01)
    said = [r.getMessage() for r in caplog.records if "passes maxmemory" in r.getMessage()]
    if room == "plenty":
        assert said == []
        assert bloom.events.counts["memory_short"] == 0
        return
    assert len(said) == 1, said
    port = redis_client.connection_pool.connection_kwargs["port"]
    assert said[0].startswith(f"Redis at 127.0.0.1:{port} has "), said[0]
    assert "as they start generation 1 and " in said[0]
    assert "a scrapy-redis queue in the same Redis loses the requests it cannot push" in said[0]
    assert bloom.events.counts["memory_short"] == 1
    bloom.close()


@pytest.mark.timeout(60)
def test_connections_killed_at_the_growth_boundary_lose_no_answer(
    redis_client: redis.Redis,
) -> None:
    bloom, _ = _full_first_generation(redis_client)
    elements = fingerprints(600, "kill")  # 200 -> generations 1 and 2 start meanwhile
    stop = threading.Event()

    def kill() -> None:
        while not stop.wait(0.02):  # bounded by the adds below
            redis_client.client_kill_filter(_type="normal", skipme=True)

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    try:
        answers = [bloom.check_and_add(e) for e in elements]
    finally:
        stop.set()
        killer.join(5)
    # A new element is never "seen" (a lost reply answers "new"), and nothing is lost.
    assert sum(answers) <= upper(len(elements), 0.01)
    assert all(bloom.contains_many(elements))
    assert bloom.generations >= 3


def test_a_records_generations_are_those_earlier_builds_gave_it() -> None:
    # No record stores the generations after a shard's first: every build must compute
    # the same ones from the record, whatever its sizing of new filters (which now counts
    # a blocked filter's seed floor, and the generations do not). Frozen on 2026-11-29
    # from b33f2ab's build; a change here strands the generations filters have in Redis.
    default_1m = Growth(FilterSpec(31, 785_920, 13, BLOCK_BITS), 1_000_000, 2)
    assert default_1m.first_capacity == 32_978
    assert default_1m.last == 11
    assert [(g.capacity, g.bits, g.hash_count) for g in default_1m.generations[:4]] == [
        (32_978, 785_920, 13),
        (64_518, 1_774_080, 14),
        (129_036, 3_862_528, 14),
        (258_072, 8_386_560, 15),
    ]
    billion = Growth(FilterSpec(638, 67_108_352, 17, BLOCK_BITS), 10**9, 2)
    assert [(g.capacity, g.bits, g.hash_count) for g in billion.generations] == [
        (1_572_407, 67_108_352, 17),
        (3_134_798, 145_851_904, 18),
        (6_269_596, 314_071_552, 19),
        (12_539_192, 675_197_440, 19),
        (25_078_384, 1_451_074_048, 20),
        (50_156_768, 3_115_452_416, 20),
    ]
