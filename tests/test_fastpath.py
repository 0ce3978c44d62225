"""The scriptless hot path on real Redis: one BITFIELD per check, exact counts, safe edges.

See :mod:`scrapy_redis_bloom.engine.fastpath`. Growth itself (the boundary, races at it,
rates) is tested in test_generations.py, through this path wherever it applies.
"""

from __future__ import annotations

import pytest
import redis
from test_generations import bloom_for, client_commands, config, fingerprints

from scrapy_redis_bloom.engine.generations import COUNT_BIT, GENERATIONS_BIT
from scrapy_redis_bloom.errors import FilterDamagedError

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


def test_a_stale_view_of_a_grown_shard_never_answers_seen_wrongly(
    redis_client: redis.Redis,
) -> None:
    # A looks at the shard while it is young; B then grows it. A's next check still
    # goes scriptless, lands in generation 0 (read by every check), and A learns.
    cfg = config(2_500, 0.001, BLOOMFILTER_SHARDS=1)
    a, b = bloom_for(redis_client, cfg, KEY), bloom_for(redis_client, cfg, KEY)
    assert a.check_and_add("first") is False
    for element in fingerprints(9_000, "grow"):
        b.check_and_add(element)
    assert state(redis_client, 0)[0] >= 3
    late = fingerprints(50, "late")
    assert [a.check_and_add(e) for e in late[:1]] == [False]
    assert b.check_and_add(late[0]) is True  # found in generation 0
    assert a.generations >= 3
    # From then on A uses the script: its answers and B's agree.
    assert [a.check_and_add(e) for e in late[1:]].count(True) <= 1
    assert b.contains_many(late) == [True] * 50


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
