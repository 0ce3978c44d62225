"""The scriptless hot path on real Redis: one BITFIELD per check, exact counts, safe edges.

See :mod:`scrapy_redis_bloom.engine.bitmap.fastpath`. Growth itself (the boundary, races at it,
rates) is tested in test_generations.py, through this path wherever it applies.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from redis_server import RedisServer
from reply_cutter import Command, ReplyCutter
from test_generations import bloom_for, client_commands, config, fingerprints, upper
from waiting import until_tried

from scrapy_redis_bloom.core.errors import FilterDamagedError, FilterUnavailableError
from scrapy_redis_bloom.core.generations import COUNT_BIT, GENERATIONS_BIT
from scrapy_redis_bloom.core.settings import FaultPolicy
from scrapy_redis_bloom.engine.bitmap.fastpath import STATE_EVERY

KEY = "fast:bloomfilter"


def state(client: redis.Redis, shard: int) -> tuple[int, int]:
    """Return a shard's (generations, count) as its header holds them."""
    key = f"{{{KEY}:{shard}}}:g0"
    generations, count = (
        client.bitfield(key).get("u16", GENERATIONS_BIT).get("u32", COUNT_BIT).execute()
    )
    return generations, count


@pytest.mark.timeout(60)
@pytest.mark.parametrize("expansion", [2, 0])
def test_a_check_is_one_bitfield_and_a_repeat_none(
    redis_client: redis.Redis, expansion: int
) -> None:
    bloom = bloom_for(
        redis_client,
        config(100_000, 0.001, BLOOMFILTER_EXPANSION=expansion),
        KEY,
        cache_size=100,
    )
    bloom.open()
    bloom.sync_counters()
    fresh = fingerprints(5, "fresh")
    sent = client_commands(redis_client, lambda: [bloom.check_and_add(e) for e in fresh])
    assert len(sent) == 5, sent
    assert all(command.startswith("BITFIELD ") for command in sent), sent
    assert client_commands(redis_client, lambda: bloom.check_and_add(fresh[0])) == []
    bloom.close()


def test_counts_reach_the_header_exactly(redis_client: redis.Redis) -> None:
    cfg = config(100_000, 0.001)
    bloom = bloom_for(redis_client, cfg, KEY)
    elements = fingerprints(3_000, "counted")
    answers = [bloom.check_and_add(e) for e in elements + elements[:500]]
    new = answers.count(False)
    assert answers[3_000:] == [True] * 500
    bloom.close()  # sends what each shard's last check found new
    states = [state(redis_client, shard) for shard in range(cfg.spec.shards)]
    assert all(generations <= 1 for generations, _ in states)
    assert sum(count for _, count in states) == new
    assert new >= 3_000 - 3  # a false positive at 3% of capacity is rare


def test_a_worker_crossing_its_limit_hands_the_shard_to_the_script(
    redis_client: redis.Redis,
) -> None:
    # One shard whose generation 0 takes ~2,600 items: the scriptless path stops 1,024
    # short of that, the script grows the shard, and every new item is counted once.
    cfg = config(2_500, 0.001, BLOOMFILTER_SHARDS=1)
    growth = cfg.growth
    assert 0 < growth.scriptless_limit < growth.first_capacity
    bloom = bloom_for(redis_client, cfg, KEY)
    elements = fingerprints(9_000, "cross")
    new = [e for e in elements if not bloom.check_and_add(e)]
    bloom.close()
    generations, count = state(redis_client, 0)
    assert generations >= 3
    full = sum(growth.generation(g).capacity for g in range(generations - 1))
    assert len(new) == full + count
    fresh = bloom_for(redis_client, cfg, KEY)
    assert fresh.contains_many(elements) == [True] * len(elements)


@pytest.mark.parametrize("shards", [1, 4])
def test_a_batch_from_a_worker_that_never_read_the_counts_stops_at_the_boundary(
    redis_client: redis.Redis, shards: int
) -> None:
    # A batch plans every check before any reply: a worker that had not read a shard's count
    # sent 100,000 checks of a filter just under capacity to generation 0 (300,110 items in
    # a generation of 206,940): 9x the rate, for good, and never said.
    cfg = config(2_500, 0.001, BLOOMFILTER_SHARDS=shards)
    growth = cfg.growth
    filler = bloom_for(redis_client, cfg, KEY)
    filler.add_many(fingerprints(growth.scriptless_limit * shards - 50 * shards, "fill"))
    filler.close()
    batch = bloom_for(redis_client, cfg, KEY)  # has read no count yet
    new = fingerprints(3 * growth.first_capacity * shards, "batch")
    assert batch.check_and_add_many(new).count(True) <= upper(len(new), 0.001)
    batch.close()
    for shard in range(shards):
        generations, _ = state(redis_client, shard)
        assert generations >= 2  # grown, by the script
    g0 = batch.state().generations[0]  # (counted from its bits)
    assert g0.estimated_items <= 1.02 * g0.capacity


def test_a_workers_first_call_a_batch_takes_the_fast_path(redis_client: redis.Redis) -> None:
    # A worker whose first call was check_and_add_many had not opened the filter: every
    # element of that batch went to the general script (1,000 EVALSHA, 17,000 SETBIT by it).
    cfg = config(200_000, 1e-6)
    bloom_for(redis_client, cfg, KEY).add_many(fingerprints(20_000, "held"))
    batch = bloom_for(redis_client, cfg, KEY)  # never called
    new = fingerprints(1_000, "first")
    sent = client_commands(redis_client, lambda: batch.check_and_add_many(new))
    kinds = [command.split(" ", 1)[0] for command in sent]
    assert kinds.count("BITFIELD") >= len(new), sorted(set(kinds))  # (and one opening)
    assert kinds.count("EVALSHA") < 10, kinds.count("EVALSHA")  # (opening: a few)
    assert batch.contains_many(new) == [True] * len(new)
    batch.close()


def test_a_stale_view_of_a_grown_shard_never_answers_seen_wrongly(
    redis_client: redis.Redis,
) -> None:
    # A looks at the shard while it is young; B then grows it.
    cfg = config(2_500, 0.001, BLOOMFILTER_SHARDS=1)
    a, b = bloom_for(redis_client, cfg, KEY), bloom_for(redis_client, cfg, KEY)
    assert a.check_and_add("first") is False
    for element in fingerprints(9_000, "grow"):
        b.check_and_add(element)
    assert state(redis_client, 0)[0] >= 3
    late = fingerprints(STATE_EVERY + 30, "late")
    # A's checks still go scriptless, into generation 0 (read by every check), until one
    # of them reads the shard's state: new elements answer "new" (but for a rare false
    # positive), and B finds them.
    first = late[:STATE_EVERY]
    assert [a.check_and_add(e) for e in first].count(True) <= 1
    assert a.generations >= 3
    assert b.contains_many(first) == [True] * STATE_EVERY
    # From then on A uses the script: its answers and B's agree.
    assert [a.check_and_add(e) for e in late[STATE_EVERY:]].count(True) <= 1
    assert b.contains_many(late) == [True] * len(late)


def test_a_deleted_shard_is_debris_for_the_script_not_a_silent_empty_filter(
    redis_client: redis.Redis,
) -> None:
    # The BITFIELD writes into the empty place of a deleted shard (Redis creates the
    # string): the reply's id says so, the filter stops, and a new filter clears it away.
    cfg = config(100_000, 0.001, BLOOMFILTER_SHARDS=1)
    bloom = bloom_for(redis_client, cfg, KEY)
    assert bloom.check_and_add("before") is False
    redis_client.delete(f"{{{KEY}:0}}:g0")
    with pytest.raises(FilterDamagedError, match="1 of the 1 shards"):
        bloom.check_and_add("after")
    debris = redis_client.getrange(f"{{{KEY}:0}}:g0", 0, 25)
    assert debris == bytes(26)  # a bitmap without a header
    redis_client.delete(f"{KEY}:meta")  # reset of the record (the shard is lost anyway)
    again = bloom_for(redis_client, cfg, KEY)
    assert again.check_and_add("after") is False
    assert again.check_and_add("after") is True


# -- several elements in one exchange (a page's links) ---------------------------------------


@pytest.mark.parametrize("capacity", [100_000, 300])  # scriptless; grown, through the script
def test_many_at_once_answer_as_one_at_a_time(redis_client: redis.Redis, capacity: int) -> None:
    cfg = config(capacity, 0.001, BLOOMFILTER_SHARDS=4)
    together = bloom_for(redis_client, cfg, KEY, cache_size=50)
    alone = bloom_for(redis_client, cfg, "alone:bloomfilter", cache_size=50)
    pages = [fingerprints(40, f"page-{p}") for p in range(30)]
    for p, links in enumerate(pages):
        # Links repeat inside a page and across pages, as navigation links do.
        links = links + links[:5] + (pages[p - 1][:10] if p else [])
        expected = [alone.check_and_add(link) for link in links]
        assert together.check_and_add_many(links) == expected
    if capacity == 300:
        assert together.generations >= 2
    redis_client.script_flush()  # a node that forgot the scripts: reloaded, answers unchanged
    links = fingerprints(30, "after-flush")
    assert together.check_and_add_many(links) == [alone.check_and_add(e) for e in links]


def test_a_deleted_shard_under_a_batch_is_recreated_once_and_answers_new(
    redis_client: redis.Redis,
) -> None:
    # Every element of the batch finds the wrong id (their BITFIELDs went out together):
    # the first recreates the shard (BLOOMFILTER_ON_LOSS = "recreate"), the others find it
    # recreated, and each is checked again, answered "new".
    cfg = config(100_000, 0.001, BLOOMFILTER_SHARDS=1)
    recreate = FaultPolicy(on_loss="recreate")
    bloom = bloom_for(redis_client, cfg, KEY, cache_size=0, faults=recreate)
    links = fingerprints(20, "lost")
    assert bloom.check_and_add_many(links) == [False] * 20
    redis_client.delete(f"{{{KEY}:0}}:g0")
    assert bloom.check_and_add_many(links) == [False] * 20  # the shard forgot them: "new"
    assert bloom.check_and_add_many(links) == [True] * 20
    assert redis_client.getrange(f"{{{KEY}:0}}:g0", 0, 15) != bytes(16)  # a header again
    bloom.close()


def test_many_at_once_across_a_cluster(redis_cluster: Any) -> None:
    cfg = config(100_000, 0.001, BLOOMFILTER_SHARDS=12)
    bloom = bloom_for(redis_cluster, cfg, KEY)
    links = fingerprints(200, "cluster")
    assert bloom.check_and_add_many(links) == [False] * 200
    assert bloom.check_and_add_many(links[::-1]) == [True] * 200


def test_many_at_once_when_redis_is_gone_lets_them_through_and_owes_them() -> None:
    server = RedisServer(appendonly=True).start()
    try:
        client = server.client()
        cfg = config(100_000, 0.001)
        lenient = FaultPolicy(retry_timeout=0.5, on_error="allow")
        bloom = bloom_for(client, cfg, KEY, faults=lenient, cache_size=100)
        links = fingerprints(20, "outage")
        assert bloom.check_and_add_many(links[:10]) == [False] * 10
        server.kill()
        # The first ten from the near-cache; the others let through, and remembered.
        assert bloom.check_and_add_many(links) == [True] * 10 + [False] * 10
        assert bloom.events.counts["errors"] == 10
        assert bloom.check_and_add_many(links[10:]) == [True] * 10
        server.restart()
        until_tried(bloom.executor)  # the next attempt is allowed a second after the last one
        # Once Redis answers, the owed ones are added: another worker finds them all.
        assert bloom.check_and_add_many(fingerprints(3, "later")) == [False] * 3
        other = bloom_for(client, cfg, KEY)
        assert other.contains_many(links) == [True] * 20
        client.close()
    finally:
        server.stop()


@pytest.mark.parametrize("on_error", ["allow", "raise"])
def test_a_first_batch_that_cannot_open_the_filter_answers_per_on_error(on_error: str) -> None:
    # A worker's first call a batch, Redis down: it raised FilterUnavailableError ("could not
    # read the filter's record") under "allow" too, where a single check answers "new".
    server = RedisServer(appendonly=True).start()
    try:
        client = server.client()
        cfg = config(100_000, 0.001)
        faults = FaultPolicy(retry_timeout=0.5, on_error=on_error)  # type: ignore[arg-type]
        bloom_for(client, cfg, KEY).open()
        bloom = bloom_for(client, cfg, KEY, faults=faults)  # never called
        links = fingerprints(20, "unopened")
        server.kill()
        if on_error == "raise":
            with pytest.raises(FilterUnavailableError):
                bloom.check_and_add_many(links)
            bloom.close()  # (its watch of the server gone ends)
            client.close()
            return
        assert bloom.check_and_add_many(links) == [False] * 20
        assert bloom.events.counts["errors"] == 20
        server.restart()
        until_tried(bloom.executor)
        # Once Redis answers, the ones let through are added: another worker finds them.
        assert bloom.check_and_add_many(fingerprints(3, "later")) == [False] * 3
        assert bloom_for(client, cfg, KEY).contains_many(links) == [True] * 20
        bloom.close()
        client.close()
    finally:
        server.stop()


def test_a_worker_whose_first_checks_met_an_outage_keeps_its_one_bitfield_after() -> None:
    # A cap on the checks sent before a shard's count is read counted the ones an outage
    # failed too: past STATE_EVERY of them, every later check of the shard took the script.
    server = RedisServer(appendonly=True).start()
    try:
        client = server.client()
        cfg = config(100_000, 0.001, BLOOMFILTER_SHARDS=1)
        bloom_for(client, cfg, KEY).open()  # the filter exists
        lenient = FaultPolicy(retry_timeout=0.3, on_error="allow")
        bloom = bloom_for(client, cfg, KEY, faults=lenient, cache_size=0)
        bloom.open()
        server.kill()
        for element in fingerprints(2 * STATE_EVERY, "outage"):
            assert bloom.check_and_add(element) is False  # let through
        server.restart()
        until_tried(bloom.executor)
        bloom.settle_owed()
        admin = server.client()
        admin.config_resetstat()
        assert [bloom.check_and_add(e) for e in fingerprints(50, "after")] == [False] * 50
        stats = admin.info("commandstats")
        assert "cmdstat_evalsha" not in stats, stats
        assert stats["cmdstat_bitfield"]["calls"] >= 50
        client.close()
        admin.close()
    finally:
        server.stop()


def test_counts_refused_by_a_full_redis_are_kept_and_sent_later() -> None:
    server = RedisServer().start()
    try:
        client = server.client()
        cfg = config(100_000, 0.001, BLOOMFILTER_SHARDS=1)
        bloom = bloom_for(client, cfg, KEY, faults=FaultPolicy(retry_timeout=0.3))
        elements = fingerprints(40, "kept")
        new = [bloom.check_and_add(e) for e in elements].count(False)
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", used // 2)
        assert bloom.sync_counters() is None  # refused, counts kept
        client.config_set("maxmemory", 0)
        time.sleep(1.1)  # the next attempt is allowed a second after the last one
        bloom.close()
        assert state(client, 0)[1] == new
        client.close()
    finally:
        server.stop()


def carrying_counts(times: int) -> Any:
    """Pick each BITFIELD that raises a shard's count, once (its retry goes through)."""
    done: set[tuple[bytes, ...]] = set()

    def pick(command: Command, reply: object) -> bool:
        if command[0] != b"BITFIELD" or b"INCRBY" not in command or tuple(command) in done:
            return False
        if command[command.index(b"INCRBY") + 3] == b"0":
            return False
        done.add(tuple(command))
        return len(done) <= times

    return pick


@pytest.mark.parametrize("way", ["check", "page", "flush"])
def test_a_count_whose_reply_is_lost_is_not_sent_again(way: str) -> None:
    # Redis ran the BITFIELD that carried a shard's count, its reply never came: sent again
    # whole, the count was added twice (and the shard started its next generation early).
    # The retry goes without it, counted as sent: the count is short at most of the
    # elements whose own reply was cut (their retry finds their bits: "new", not counted).
    cfg = config(100_000, 0.001, BLOOMFILTER_SHARDS=1)
    elements = fingerprints(600, way)
    with (
        RedisServer() as server,
        ReplyCutter(server.port, cut=carrying_counts(12), times=12) as cutter,
    ):
        client = redis.Redis(port=cutter.port, socket_timeout=2)
        bloom = bloom_for(client, cfg, KEY, faults=FaultPolicy(retry_timeout=5))
        if way == "check":
            cutter.armed = True
            answers = [bloom.check_and_add(e) for e in elements]
        elif way == "page":
            cutter.armed = True
            # Pages of two: a cut costs their own counts, less than the count carried.
            pages = [elements[i : i + 2] for i in range(0, 600, 2)]
            answers = [a for page in pages for a in bloom.check_and_add_many(page)]
        else:
            answers = [bloom.check_and_add(e) for e in elements]
            cutter.armed = True
            bloom.sync_counters()  # its flush of what the checks found new
        cutter.armed = False
        bloom.close()
        client.close()
        count = state(server.client(), 0)[1]
    assert cutter.cuts, "no count's reply was cut"
    assert answers == [False] * 600
    # A page's checks go on one connection: a cut loses the replies of both.
    assert 600 - len(cutter.cuts) * (2 if way == "page" else 1) <= count <= 600
