"""Real faults against the engine: not one new fingerprint answered "seen", every fault said.

Each test injects a fault into a real redis-server (CLIENT KILL, SIGKILL and restart with
AOF, DEBUG SLEEP, maxmemory under noeviction and allkeys-lru, eviction, a failing RDB save, a
filter past its capacity) and checks the answer contract: "seen" only when Redis confirmed it
in this call; any doubt answers "new"; otherwise a clear error, never a wrong answer.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis_server import RedisServer, slow_loading, slow_loading_binary
from reply_cutter import Command, ReplyCutter
from waiting import until_tried

from scrapy_redis_bloom import (
    BloomConfig,
    BloomFilterError,
    FaultPolicy,
    FilterDamagedError,
    FilterUnavailableError,
    NotEnoughMemoryError,
    RedisBloomFilter,
    UnsupportedServerError,
)
from scrapy_redis_bloom.core.hashing import locate
from scrapy_redis_bloom.core.layout import shard_key
from scrapy_redis_bloom.engine.health import ServerHealth, check_versions
from scrapy_redis_bloom.engine.state import FilterTotals
from scrapy_redis_bloom.transport.node import IDLE_CHECK

SETTINGS = {"BLOOMFILTER_CAPACITY": 200_000, "BLOOMFILTER_ERROR_RATE": 1e-6}
#: The classic layout (hash scheme 1), named: a new filter's default is blocked.
CONFIG = BloomConfig.from_settings({**SETTINGS, "BLOOMFILTER_BLOCKED": False})
#: The same with each element's bits in one block (hash scheme 2): the same commands,
#: other offsets; the fault tests that send them run both.
BLOCKED = BloomConfig.from_settings({**SETTINGS, "BLOOMFILTER_BLOCKED": True})
SCHEMES = pytest.mark.parametrize("blocked", [False, True], ids=["scheme1", "blocked"])


def fingerprints(n: int, salt: str) -> list[str]:
    return [hashlib.sha1(f"{salt}{i}".encode()).hexdigest() for i in range(n)]


def make(
    client: redis.Redis, key: str = "faults", blocked: bool = False, **faults: object
) -> RedisBloomFilter:
    # The filter the settings give: growing, as by default.
    return RedisBloomFilter.from_config(
        client,
        key,
        BLOCKED if blocked else CONFIG,
        faults=FaultPolicy(**faults),  # type: ignore[arg-type]
    )


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """Start a fresh server per test: faults leave their mark on a server's settings."""
    with RedisServer() as started:
        yield started


# -- dropped connections ---------------------------------------------------------------


@SCHEMES
def test_client_kill_every_50ms_during_check_and_add(server: RedisServer, blocked: bool) -> None:
    client = server.client()
    bloom = make(client, blocked=blocked)
    new = fingerprints(30_000, "hot")
    with server.connection_killer(interval=0.05) as killer:
        answers = [bloom.check_and_add(fp) for fp in new]
    assert killer.killed > 10  # the fault really hit the crawl
    assert answers.count(True) == 0
    assert bloom.contains_many(new) == [True] * len(new)
    assert [bloom.check_and_add(fp) for fp in new[:1000]] == [True] * 1000
    client.close()


@SCHEMES
def test_client_kill_during_add_many(server: RedisServer, blocked: bool) -> None:
    client = server.client()
    bloom = make(client, blocked=blocked)
    new = fingerprints(150_000, "bulk")

    def halted_halfway() -> Iterator[str]:
        # A fast machine loads all of it within one kill interval: halfway through,
        # wait (bounded) for a kill, so it surely falls inside the call.
        for i, fp in enumerate(new):
            if i == len(new) // 2:
                deadline = time.monotonic() + 10
                while not killer.killed and time.monotonic() < deadline:
                    time.sleep(0.01)
            yield fp

    # Kills for 3 s, not until the call ends: a loaded machine (CI's) can take longer than
    # the 0.3 s interval over one batch, which a storm without end then never lets finish.
    with server.connection_killer(interval=0.3, max_duration=3.0) as killer:
        answers = bloom.add_many(halted_halfway())
    assert killer.killed >= 1
    assert answers == [False] * len(new)
    assert bloom.contains_many(new) == [True] * len(new)
    client.close()


def test_health_checks_and_pauses_in_the_iterable_do_not_shift_replies(
    server: RedisServer,
) -> None:
    # redis-py's health check would send a PING while a chunk's replies are owed, and
    # read one of them as its PONG. The filter's connections make no health checks.
    client = server.client(health_check_interval=1)
    bloom = make(client)
    new = fingerprints(30_000, "pause")

    def slow() -> Iterator[str]:
        for i, fp in enumerate(new):
            if i and i % 10_000 == 0:
                time.sleep(1.5)
            yield fp

    assert bloom.add_many(slow()) == [False] * len(new)
    assert bloom.contains_many(new) == [True] * len(new)
    client.close()


def test_an_iterable_that_raises_leaves_no_reply_behind(server: RedisServer) -> None:
    client = server.client()
    bloom = make(client)

    def broken() -> Iterator[str]:
        yield from fingerprints(15_000, "first")
        raise ValueError("the source broke")

    with pytest.raises(ValueError, match="the source broke"):
        bloom.add_many(broken())
    fresh = fingerprints(200, "fresh")
    assert [bloom.check_and_add(fp) for fp in fresh] == [False] * 200
    checked = bloom.contains_many(fingerprints(300, "other") + fresh)
    assert isinstance(checked, list)
    assert checked == [False] * 300 + [True] * 200
    client.close()


# -- a server that stops, restarts, stalls -----------------------------------------------


@SCHEMES
def test_redis_killed_and_restarted_with_aof_costs_no_answer(blocked: bool) -> None:
    with RedisServer(appendonly=True) as server:
        client = server.client()
        bloom = make(client, blocked=blocked, retry_timeout=20)
        new = fingerprints(4_000, "restart")
        answers: list[bool] = []

        def crawl(_: threading.Event) -> None:
            for fp in new:
                answers.append(bloom.check_and_add(fp))
                time.sleep(0.001)

        server.outage_during(crawl, after=0.5, down=3)
        assert len(answers) == len(new)
        assert answers.count(True) == 0
        assert bloom.events.counts["retries"] > 0  # the outage really hit the calls
        # Every acknowledged write was on disk before its reply (appendfsync always).
        assert bloom.contains_many(new) == [True] * len(new)
        client.close()


#: States whose parts a worker writes without the script (engine/bitmap/stackpath.py): a
#: filter that grows past its capacity, re-crawl windows, and both.
ROLLED_BACK = {
    "grown": {"BLOOMFILTER_CAPACITY": 2_000},
    "windows": {"BLOOMFILTER_TTL": 3600},
    "grown windows": {"BLOOMFILTER_CAPACITY": 2_000, "BLOOMFILTER_TTL": 3600},
}


@pytest.mark.parametrize("state", list(ROLLED_BACK))
def test_a_redis_restarted_from_an_older_snapshot_is_carried_on_with(
    state: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Redis persisting by RDB snapshots (its default) loses the writes since the last one
    # in a crash: the filter is back as it was, while the worker knows parts (a generation,
    # a window) that are gone with it. Its adds there wrote bits into no part, which the
    # script took for foreign data: every check of those shards failed, for good, under
    # either BLOOMFILTER_ON_LOSS. Nothing of the snapshot is lost: no error, no new URL
    # taken for seen, and what the worker adds afterwards stands.
    settings = {**SETTINGS, "BLOOMFILTER_ERROR_RATE": 1e-4, **ROLLED_BACK[state]}
    config = BloomConfig.from_settings(settings)
    with RedisServer() as server:
        client = server.client()
        bloom = RedisBloomFilter.from_config(client, "rolled", config)
        bloom.open()
        client.save()  # the filter as created: no generation grown, no window started
        since = fingerprints(5_000, "since")  # grow it, start its window
        assert sum(bloom.check_and_add(fp) for fp in since) <= 2  # false positives (1e-4)
        server.kill()
        server.restart()
        after = fingerprints(5_000, "after")
        with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
            assert sum(bloom.check_and_add(fp) for fp in after) <= 2
        if state == "grown":  # (a window starts with one generation: no rollback to tell)
            # The generations lost went unsaid: duplicates to come, and no stat or line.
            assert bloom.events.counts["rolled_back"] >= 1
            assert "Redis lost writes it had acknowledged" in caplog.text
        other = RedisBloomFilter.from_config(client, "rolled", config)
        assert other.contains_many(after) == [True] * len(after)
        client.close()


@pytest.mark.parametrize("way", ["one", "batch", "bulk"])
def test_a_restarted_redis_still_loading_its_data_is_waited_for(way: str) -> None:
    # A big filter takes seconds to load after a restart: Redis answers -LOADING meanwhile.
    binary = slow_loading_binary()
    if binary is None:
        pytest.skip("no redis-server 7+ nor valkey-server to slow a loading with")
    with RedisServer(*slow_loading(50), binary=binary) as server:
        client = server.client()
        bloom = make(client, blocked=True, retry_timeout=30)
        members, new = fingerprints(300, "loaded"), fingerprints(300, "after")
        assert bloom.add_many(members) == [False] * len(members)
        client.execute_command("DEBUG", "POPULATE", 40_000, "pad")  # 2 s of loading
        client.save()
        server.kill()
        time.sleep(IDLE_CHECK)  # idle meanwhile: its connection is found closed, no doubt
        server.restart(loaded=False)
        assert int(server.info("persistence")["loading"]) == 1
        retries = bloom.events.counts["retries"]
        mixed = [e for pair in zip(members, new, strict=True) for e in pair]
        if way == "one":
            answers = [bloom.check_and_add(e) for e in mixed]
        elif way == "batch":
            answers = bloom.check_and_add_many(mixed)
        else:
            answers = bloom.add_many(mixed)
        assert int(server.info("persistence")["loading"]) == 0  # it waited for the load
        assert bloom.events.counts["retries"] > retries  # and met it
        assert answers == [True, False] * len(members)
        assert bloom.contains_many(new) == [True] * len(new)
        assert bloom.events.counts["errors"] == bloom.events.counts["ambiguous"] == 0
        client.close()


@pytest.mark.parametrize("way", ["batch", "bulk"])
def test_a_batch_sent_after_redis_closed_the_connection_is_not_in_doubt(way: str) -> None:
    # Restarted between two batches, well within IDLE_CHECK: the connection the batch would
    # go on was closed by the server before it was sent, so nothing of it can have run.
    with RedisServer(appendonly=True) as server:
        client = server.client()
        bloom = make(client, blocked=True, retry_timeout=20)
        members, new = fingerprints(300, "kept"), fingerprints(300, "later")
        assert bloom.check_and_add_many(members) == [False] * len(members)
        server.kill()
        server.restart()
        mixed = [e for pair in zip(members, new, strict=True) for e in pair]
        answers = bloom.check_and_add_many(mixed) if way == "batch" else bloom.add_many(mixed)
        assert bloom.events.counts["ambiguous"] == 0
        assert answers == [True, False] * len(members)
        client.close()


def test_a_paused_redis_is_waited_for_and_the_doubt_answers_new(server: RedisServer) -> None:
    client = server.client(socket_timeout=0.5)
    bloom = make(client, retry_timeout=10)
    bloom.check_and_add(fingerprints(1, "warm")[0])
    element = fingerprints(1, "paused")[0]
    pause = server.pause(2)
    started = time.monotonic()
    assert bloom.check_and_add(element) is False
    # Waited out most of the pause (less what passed before the call), not a socket timeout.
    assert 1.0 < time.monotonic() - started < 10
    pause.join()
    assert bloom.events.counts["retries"] >= 1
    assert bloom.check_and_add(element) is True
    client.close()


def test_unavailable_redis_raises_a_clear_error_or_allows() -> None:
    server = RedisServer(appendonly=True).start()
    client = server.client()
    strict = make(client, "strict", retry_timeout=0.5)
    lenient = make(client, "lenient", retry_timeout=0.5, on_error="allow")
    strict.open()
    lenient.open()
    known, new = fingerprints(2, "known")
    assert lenient.check_and_add(known) is False
    server.kill()
    with pytest.raises(FilterUnavailableError, match=r"Redis at 127\.0\.0\.1:\d+ could not"):
        strict.check_and_add(known)
    lenient.close()  # the cache would answer for ``known``: forget it to ask Redis
    lenient._cache.clear()
    assert lenient.check_and_add(known) is False  # a duplicate fetch, never a lost page
    started = time.monotonic()
    assert lenient.check_and_add(new) is False
    assert time.monotonic() - started < 0.4  # no full retry window per call once down
    # This worker let ``new`` through already: a second offer is a duplicate.
    assert lenient.check_and_add(new) is True
    assert lenient.events.counts["errors"] == 2
    server.restart()
    until_tried(lenient.executor)  # the next attempt is allowed a second after the last one
    assert lenient.check_and_add(fingerprints(1, "later")[0]) is False
    # Redis answers again: what was let through meanwhile is added for every worker.
    other = make(client, "lenient")
    assert other.contains_many([known, new]) == [True, True]
    client.close()
    server.stop()


# -- a full or evicting Redis ------------------------------------------------------------


@SCHEMES
def test_out_of_memory_under_noeviction_is_named(server: RedisServer, blocked: bool) -> None:
    client = server.client()
    strict = make(client, "strict", blocked, retry_timeout=0.5)
    lenient = make(client, "lenient", blocked, retry_timeout=0.5, on_error="allow")
    strict.open()
    lenient.open()
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", used // 2)
    element = fingerprints(1, "oom")[0]
    with pytest.raises(FilterUnavailableError, match=r"Redis is out of memory .*maxmemory"):
        strict.check_and_add(element)
    assert lenient.check_and_add(element) is False
    assert lenient.events.counts["errors"] == 1
    # Reads still work (an out-of-memory Redis refuses writes only), and say so.
    assert lenient.contains(element) is False
    # So does reading the filter's state (info, the stats): it read a header by BITFIELD
    # ... GET, which a full Redis refuses (BITFIELD may write), and info exited 1.
    assert lenient.state().estimated_items == 0
    client.config_set("maxmemory", 0)
    time.sleep(1.1)
    assert lenient.check_and_add(fingerprints(1, "after")[0]) is False
    assert lenient.contains(element) is True  # added once Redis took writes again
    client.close()


def _saves_fail(server: RedisServer, client: redis.Redis, failing: bool) -> None:
    """Make the server's RDB saves fail, as on a full disk (or succeed again), and wait.

    A directory takes the RDB file's name, so the save cannot put its file in place; with a
    save point configured, Redis then refuses writes (``MISCONF``) until a save succeeds.
    """
    rdb = Path(server.dir) / "dump.rdb"
    client.config_set("save", "900 1")
    if failing:
        rdb.unlink(missing_ok=True)  # a save that succeeded before
        rdb.mkdir()
    else:
        rdb.rmdir()
    client.bgsave()
    deadline = time.monotonic() + 10
    want = "err" if failing else "ok"
    while time.monotonic() < deadline:
        persistence = client.info("persistence")
        if not persistence["rdb_bgsave_in_progress"] and (
            persistence["rdb_last_bgsave_status"] == want
        ):
            return
        time.sleep(0.05)
    raise AssertionError(f"the RDB save did not end {want!r}: {server.log_tail()}")


@SCHEMES
def test_a_redis_that_cannot_save_is_named_and_waited_for(
    server: RedisServer, blocked: bool
) -> None:
    # A full disk on the Redis host: every write refused with MISCONF until a save succeeds.
    # It is an outage, not a refusal: retried, answered "new" under "allow", added after.
    client = server.client()
    strict = make(client, "strict", blocked, retry_timeout=0.5)
    lenient = make(client, "lenient", blocked, retry_timeout=0.5, on_error="allow")
    strict.open()
    lenient.open()
    _saves_fail(server, client, failing=True)
    element, many = fingerprints(1, "misconf")[0], fingerprints(500, "misconf-many")
    started = time.monotonic()
    with pytest.raises(FilterUnavailableError, match=r"Redis cannot save to disk .*MISCONF"):
        strict.check_and_add(element)
    assert time.monotonic() - started >= 0.5  # tried again for the retry timeout
    assert lenient.check_and_add(element) is False
    assert lenient.add_many(many) == [False] * len(many)
    assert lenient.events.counts["errors"] == 1 + len(many)
    assert lenient.contains(element) is False  # reads still run, and tell the truth
    _saves_fail(server, client, failing=False)
    time.sleep(1.1)
    assert lenient.check_and_add(fingerprints(1, "after")[0]) is False
    # Redis writes again: what was let through meanwhile is added for every worker.
    assert make(client, "lenient", blocked).contains_many([element, *many]) == [True] * 501
    client.close()


def test_a_filter_that_does_not_fit_maxmemory_is_refused(server: RedisServer) -> None:
    client = server.client()
    client.config_set("maxmemory", 4 * 2**20)
    big = BloomConfig.from_settings({"BLOOMFILTER_BIT": 30})
    bloom = RedisBloomFilter(client, "big", big.spec, big.capacity)
    with pytest.raises(NotEnoughMemoryError, match=r"needs 130\.\d MiB on Redis at .*maxmemory 4"):
        bloom.open()
    assert client.keys("*") == []  # nothing half-created
    client.close()


def _evict_shards(server: RedisServer, client: redis.Redis, bloom: RedisBloomFilter) -> None:
    """Fill a server under allkeys-lru until some of the filter's shards are evicted."""
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory-policy", "allkeys-lru")
    client.config_set("maxmemory", used + 2**20)
    for i in range(2_000):  # bounded: each key adds 64 KiB
        client.set(f"junk:{i}", b"x" * 65_536)
        if sum(client.exists(k) for k in bloom.shard_keys) < bloom.spec.shards:
            return
    raise AssertionError("no shard was evicted")


def test_evicted_shards_stop_the_filter_or_are_recreated(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = server.client()
    bloom = make(client, "evicted")
    seen = fingerprints(2_000, "held")
    bloom.add_many(seen)
    _evict_shards(server, client, bloom)
    with pytest.raises(FilterDamagedError, match=r"evicted \(see maxmemory-policy\)"):
        bloom.add_many(seen)
    # The other policy: go on with the lost shards empty. What they held may be fetched
    # again (answered new), never dropped; what the others hold is still "seen".
    client.config_set("maxmemory", 0)
    with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
        again = make(client, "evicted", on_loss="recreate")
        answers = again.add_many(seen)
    assert again.events.counts["recreated"] >= 1
    assert "maxmemory-policy allkeys-lru" in caplog.text  # said at open
    assert "Recreated" in caplog.text
    assert 0 < answers.count(True) < len(seen)
    assert again.contains_many(seen) == [True] * len(seen)
    client.close()


#: A small filter of 2 shards that grows: 1,000 items take each shard to generation 1.
SMALL = BloomConfig.from_settings(
    {"BLOOMFILTER_CAPACITY": 500, "BLOOMFILTER_ERROR_RATE": 1e-6, "BLOOMFILTER_SHARDS": 2}
)


def _evicted_again(
    server: RedisServer, state: str, how: str, times: int
) -> tuple[int, list[bool] | BloomFilterError]:
    """Evict shard 0 of a filter, then again each time it is recreated, ``times`` in all.

    A proxy deletes it, from another connection, before the filter reads the reply of the
    script that recreated it: what a full Redis under ``allkeys-random`` does by chance.
    Returns the evictions made, and the answers for new elements of shard 0 (or the error).
    """
    direct = server.client()
    direct.config_set("maxmemory-policy", "allkeys-random")
    key, evicted = shard_key("bf", 0).encode(), [1]

    def evict(command: list[bytes], _: bytes) -> bool:
        # The shard's recovery allocated it again (ALLOCATE, mode "replace"): evicted again.
        replace = command[0] == b"EVALSHA" and command[3:4] == [key] and command[-1] == b"replace"
        if replace and len(evicted) < times:
            direct.delete(key)
            evicted.append(1)
        return False  # the reply goes on, after the eviction

    with ReplyCutter(server.port, evict) as proxy:
        client = redis.Redis(host="127.0.0.1", port=proxy.port)
        faults = FaultPolicy(on_loss="recreate", retry_timeout=1)
        bf = RedisBloomFilter.from_config(client, "bf", SMALL, faults=faults)
        bf.add_many(fingerprints(1000 if state == "grown" else 100, "held"))
        assert direct.exists(shard_key("bf", 0, 1)) == (state == "grown")
        direct.delete(key)
        proxy.armed = True
        new = [f for f in fingerprints(400, "new") if locate(f, bf.spec)[0] == 0][:20]
        answers: list[bool] | BloomFilterError
        try:
            answers = bf.add_many(new) if how == "bulk" else [bf.check_and_add(f) for f in new]
        except BloomFilterError as exc:
            answers = exc
        client.close()
    direct.close()
    return len(evicted), answers


@pytest.mark.parametrize("how", ["one", "bulk"])
@pytest.mark.parametrize("state", ["fresh", "grown"])
def test_a_shard_evicted_again_right_after_its_recreation_is_recreated_again(
    state: str, how: str, server: RedisServer
) -> None:
    """Under ``BLOOMFILTER_ON_LOSS = "recreate"``, a full Redis may evict a shard again at once.

    The check recreated it, met it lost again and raised ``FilterDamagedError`` "... still
    does not carry its id after recovery" (1 to 3 times per 15-40k checks under
    ``allkeys-random``): the crawl stopped although the user chose to go on. Now it is
    recovered again, within the call's retry timeout, and the check answers.
    """
    evictions, answers = _evicted_again(server, state, how, times=3)
    assert evictions == 3
    assert answers == [False] * 20


def test_a_shard_evicted_each_time_it_is_recreated_is_named_as_evicted(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Lost again until the retry timeout: an error that says so, and the eviction policy.

    (Not "still does not carry its id", nor a Redis Cluster slot moving on one server.)
    """
    with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
        evictions, answers = _evicted_again(server, "grown", "one", times=1 << 30)
    assert isinstance(answers, FilterUnavailableError), answers
    message = str(answers)
    assert "'{bf:0}:g0' of the Bloom filter 'bf' was lost again each time it was recreated" in (
        message
    )
    assert "maxmemory-policy allkeys-random" in message
    assert evictions > 2
    assert "Cluster" not in message + caplog.text


def test_a_part_back_by_the_time_it_is_read_again_is_no_cluster_slot_moving(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """On one server, a generation missing to the script and there when read again by its key.

    (Another worker recreated it, or it was restored, in between.) The check said "a Redis
    Cluster slot moving" in a WARNING, and counted a retry, on a standalone server. Now it
    checks again at once, without a word of a Cluster.
    """
    direct = server.client()
    part = shard_key("bf", 0, 1).encode()
    with ReplyCutter(server.port, lambda command, reply: False) as proxy:
        client = redis.Redis(host="127.0.0.1", port=proxy.port)
        bf = RedisBloomFilter.from_config(client, "bf", SMALL)
        bf.add_many(fingerprints(1000, "held"))
        dumped = direct.dump(part)
        direct.delete(part)

        def restore(command: list[bytes], reply: bytes) -> bool:
            if command[0] == b"EVALSHA" and part in reply and not direct.exists(part):
                direct.restore(part, 0, dumped)  # the script found it missing: back now
            return False

        proxy.cut = restore
        proxy.armed = True
        new = [f for f in fingerprints(400, "new") if locate(f, bf.spec)[0] == 0][:5]
        with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
            assert [bf.check_and_add(f) for f in new] == [False] * len(new)
        client.close()
    assert direct.exists(part)
    direct.close()
    assert "Cluster" not in caplog.text
    assert bf.events.counts["retries"] == 0


def test_eviction_policy_is_warned_about_at_open(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = server.client()
    client.config_set("maxmemory-policy", "allkeys-lfu")
    with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
        bloom = make(client)
        bloom.open()
    assert "has maxmemory-policy allkeys-lfu: when it reaches maxmemory it may evict" in caplog.text
    assert bloom.events.values["eviction_risk"] == 1
    client.close()


@pytest.mark.parametrize("lost", ["shard", "generation", "record"])
def test_a_loss_found_mid_crawl_says_the_policy_read_again(
    server: RedisServer, caplog: pytest.LogCaptureFixture, lost: str
) -> None:
    # The policy was read at open only: set to an evicting one later (CONFIG SET), the
    # losses it caused were recovered from, or recreated, with no word of it, and the stat
    # still said no risk.
    client = server.client()
    settings = {"BLOOMFILTER_CAPACITY": 1_000, "BLOOMFILTER_SHARDS": 2}
    cfg = BloomConfig.from_settings(settings)
    bloom = RedisBloomFilter.from_config(
        client, "faults", cfg, faults=FaultPolicy(on_loss="recreate")
    )
    held = fingerprints(4_000, "held")
    bloom.add_many(held)  # grown: generations 1 and more
    bloom.sync_counters()
    assert bloom.events.values["eviction_risk"] == 0
    client.config_set("maxmemory-policy", "allkeys-lru")
    key = {"shard": "{faults:0}:g0", "generation": "{faults:0}:g1", "record": "faults:meta"}[lost]
    assert client.delete(key) == 1  # as the policy evicts it
    with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
        if lost == "record":
            bloom.sync_counters()  # the counters' sync finds it gone, and writes it back
        else:
            bloom.add_many(fingerprints(200, "after"))  # the checks of shard 0 find it
    assert client.exists(key)
    assert "has maxmemory-policy allkeys-lru: when it reaches maxmemory it may evict" in caplog.text
    assert bloom.events.values["eviction_risk"] == 1
    bloom.close()
    client.close()


# -- a filter past its capacity -----------------------------------------------------------


def test_passing_capacity_is_warned_about_at_each_doubling(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    small = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 200, "BLOOMFILTER_ERROR_RATE": 0.01})
    bloom = RedisBloomFilter(redis_client, "small", small.spec, small.capacity)
    with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
        bloom.add_many(fingerprints(150, "a"))
        assert "capacity" not in caplog.text
        bloom.add_many(fingerprints(100, "b"))  # about 250 items: past 1x
        first = bloom.totals().added
        bloom.add_many(fingerprints(50, "c"))  # still under 2x: no new warning
        bloom.add_many(fingerprints(500, "d"))  # past 2x (false positives add nothing)
        last = bloom.totals().added
    warnings = [r.getMessage() for r in caplog.records if "its capacity of 200" in r.getMessage()]
    assert 200 < first < 300
    assert last > 400
    assert len(warnings) == 2, warnings
    assert f"holds about {first} items, {first / 200:.1f}x its capacity of 200" in warnings[0]
    assert "false-positive rate is now about" in warnings[0]
    assert "BLOOMFILTER_CAPACITY" in warnings[0]
    assert f"holds about {last} items" in warnings[1]
    assert bloom.events.values["over_capacity"] == round(last / 200, 2)


def test_counter_failures_never_cost_an_answer(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    bloom = make(redis_client, "counted")
    bloom.open()
    redis_client.rpush("counted:count", "not a hash")
    new = fingerprints(50, "counted")
    with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
        assert bloom.add_many(new) == [False] * 50  # its sync fails after the answers
        assert [bloom.check_and_add(fp) for fp in new] == [True] * 50
    assert "Could not add this worker's counts" in caplog.text
    assert "holds a list" in caplog.text


def test_a_counters_sync_whose_reply_is_lost_counts_once(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    # Redis ran the HINCRBY, its reply never came: sent again (or kept for the next sync),
    # the counts would be added twice, for good. Not sent again: the total is exact here.
    def hincrby(command: Command, reply: object) -> bool:
        return command[0] == b"HINCRBY"

    with ReplyCutter(server.port, cut=hincrby) as cutter:
        bloom = make(redis.Redis(port=cutter.port, socket_timeout=2), "synced", retry_timeout=5)
        bloom.open()
        answers = [bloom.check_and_add(fp) for fp in fingerprints(300, "synced")]
        cutter.armed = True
        with caplog.at_level(logging.DEBUG, logger="scrapy_redis_bloom.engine.counters"):
            assert bloom.sync_counters() is None  # the totals are not known
        cutter.armed = False
        assert cutter.cuts == ["HINCRBY"]
        assert "not sent again, as it may have run" in caplog.text
        exact = FilterTotals(added=answers.count(False), seen=answers.count(True))
        assert bloom.sync_counters() == exact  # nothing kept to add twice
        bloom.close()
    assert make(server.client(), "synced").totals() == exact


def test_servers_older_than_the_minimum_are_refused() -> None:
    check_versions([ServerHealth("a:1", known=True, version=(6, 2, 0))])
    check_versions([ServerHealth("a:1", known=False)])  # INFO refused: not checked
    with pytest.raises(UnsupportedServerError, match=r"a:1 is version 5\.0\.7; .* 6\.2 or newer"):
        check_versions([ServerHealth("a:1", known=True, version=(5, 0, 7))])
    # A server that names itself otherwise (Valkey) is checked by its redis_version, named.
    valkey = ServerHealth("b:2", known=True, version=(6, 0, 0), product="Valkey 6.0.0")
    with pytest.raises(UnsupportedServerError, match=r"b:2 is version 6\.0\.0 \(Valkey 6\.0\.0\);"):
        check_versions([valkey])
    check_versions([ServerHealth("b:2", known=True, version=(7, 2, 4), product="Valkey 9.1.2")])


def test_a_replica_is_refused_at_open_by_name() -> None:
    # A URL of a replica (a cloud "reader endpoint", a primary demoted since): every check
    # would wait out the retry timeout, then fail on READONLY. Refused at open instead,
    # naming its primary, for a new filter and for one the primary already holds.
    with RedisServer() as primary, RedisServer() as replica:
        source = primary.client()
        make(source, "held").open()
        client = replica.client()
        client.replicaof("127.0.0.1", primary.port)
        deadline = time.monotonic() + 10
        while client.info("replication")["master_link_status"] != "up":
            assert time.monotonic() < deadline, replica.log_tail()
            time.sleep(0.05)
        for key in ("new", "held"):
            started = time.monotonic()
            with pytest.raises(
                UnsupportedServerError,
                match=rf"Redis at 127\.0\.0\.1:{replica.port} is a replica of"
                rf" 127\.0\.0\.1:{primary.port}: the Bloom filter writes with every check",
            ):
                make(client, key, retry_timeout=5).open()
            assert time.monotonic() - started < 1  # at once, not after the retry timeout
        assert sorted(source.keys("new*")) == []
        client.close()
        source.close()


@pytest.mark.parametrize("grown", [False, True], ids=["fresh", "grown"])
def test_a_stall_ridden_through_by_one_retry_is_counted_and_said(
    grown: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # The hot path's own attempt timed out, the executor's retry answered: no stat, no
    # line (a probe: CLIENT PAUSE 5 s with a 3 s socket timeout, events == {}).
    with RedisServer() as server:
        client = server.client(socket_timeout=1.0)
        bloom = make(client, retry_timeout=8)
        if grown:  # the scriptless reads and add of a grown shard (fast_many)
            bloom.add_many([f"fill{i}" for i in range(3 * CONFIG.capacity)])
        assert bloom.check_and_add("before") is False
        retries = bloom.events.counts["retries"]
        paused = server.pause(1.8)
        with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
            assert bloom.check_and_add("during") is False
        paused.join()
        assert bloom.events.counts["retries"] > retries
        said = [r.getMessage() for r in caplog.records if "of retries" in r.getMessage()]
        assert len(said) == 1, caplog.text
        assert f"127.0.0.1:{server.port} answered" in said[0]
        assert "Timeout reading from" in said[0]  # redis-py's words: "socket" or the address
        client.close()


def test_a_fault_ridden_through_by_retries_is_said_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A restart, a failover or a pause shorter than BLOOMFILTER_RETRY_TIMEOUT was only
    # counted (bloomfilter/retries): no line said it while the crawl ran, under "raise" too
    # (probes: a cluster failover, a restart from an older snapshot that cost 148 refetches).
    with RedisServer() as server:
        client = server.client()
        bloom = make(client, retry_timeout=20)
        assert bloom.check_and_add("before") is False
        client.save()
        server.kill()
        restart = threading.Timer(0.5, server.restart)
        restart.start()
        with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
            assert bloom.check_and_add("during") is False
        restart.join()
        assert bloom.events.counts["retries"] > 0
        said = [r.getMessage() for r in caplog.records if "of retries" in r.getMessage()]
        assert len(said) == 1, caplog.text
        assert f"127.0.0.1:{server.port} answered" in said[0]
        client.close()


def test_shards_lost_again_and_again_are_said_once_a_minute_and_all_counted(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A full Redis evicting shard after shard: each recreation counted, not each a log line.

    Under heavy eviction a probe's worker wrote ~170 "Recreated ... lost shard(s)" WARNINGs
    in 6 s: the log of a crawl drowned in one repeated line.
    """
    client = server.client()
    bloom = make(client, "evicted", on_loss="recreate")
    first, *new = [f for f in fingerprints(2_000, "new") if locate(f, bloom.spec)[0] == 0][:21]
    assert bloom.check_and_add(first) is False  # (a shard is made by its first add)
    with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
        for fingerprint in new:
            assert client.delete(shard_key("evicted", 0)) == 1
            assert bloom.check_and_add(fingerprint) is False
    said = [r for r in caplog.records if r.getMessage().startswith("Recreated ")]
    assert len(said) == 1, caplog.text
    assert said[0].levelno == logging.WARNING
    assert "'{evicted:0}:g0'" in said[0].getMessage(), said[0].getMessage()
    assert bloom.events.counts["recreated"] == len(new)
    bloom.close()
    client.close()


@SCHEMES
def test_client_kill_while_workers_read_the_counts_before_their_first_batch(
    server: RedisServer, blocked: bool
) -> None:
    """A batch from a worker that never read the shards' counts reads them first (``_look``).

    Connections killed under that read, and under the batch after it: every new URL is
    answered new and added, every one held is still in the filter.
    """
    client = server.client()
    held = fingerprints(20_000, "held")
    make(client, blocked=blocked).add_many(held)
    rounds, killed = 0, 0
    # (Kills far apart enough that a batch's round, retried, gets through between two.)
    with server.connection_killer(interval=0.1, max_duration=60.0) as killer:
        for rounds in range(1, 201):  # a worker each: its first batch looks first
            worker = make(client, blocked=blocked)
            new = fingerprints(500, f"new{rounds}:")
            answers = worker.check_and_add_many(new + held[:500])
            assert answers[: len(new)] == [False] * len(new), rounds
            assert worker.contains_many(new) == [True] * len(new), rounds
            killed = killer.killed
            worker.close()
            if killed >= 20 and rounds >= 20:
                break
    assert killed >= 20, (killed, rounds)  # the fault really hit the batches
    assert make(client, blocked=blocked).contains_many(held) == [True] * len(held)
    client.close()
