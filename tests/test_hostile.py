"""Broken or hostile input on real servers: huge geometries, forged records, foreign keys.

Each case must end in one clear error naming the problem, quickly and without taking
memory: a filter that cannot fit is refused before anything is written, a forged
record is neither trusted nor walked shard by shard, and a reset of it removes only
what carries the filter's id.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
import redis
from cli_run import assert_one_line_error, run
from redis_server import RedisServer

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.core.errors import (
    BloomFilterError,
    FilterDamagedError,
    NotEnoughMemoryError,
    WrongTypeError,
)
from scrapy_redis_bloom.engine.lifecycle import VERIFIED, sample


def make(client: redis.Redis, key: str, **settings: object) -> RedisBloomFilter:
    config = BloomConfig.from_settings(settings)
    return RedisBloomFilter(
        client, key, config.spec, config.capacity, expansion=config.expansion, ttl=config.ttl
    )


def test_a_filter_bigger_than_the_host_is_refused_at_once(redis_client: redis.Redis) -> None:
    started = time.monotonic()
    with pytest.raises(NotEnoughMemoryError, match=r"needs 16\.0 TiB on Redis at .* no maxmemory"):
        make(redis_client, "huge", BLOOMFILTER_BIT=47).open()
    assert time.monotonic() - started < 1
    assert redis_client.dbsize() == 0


def test_a_filter_bigger_than_maxmemory_is_refused_at_once() -> None:
    with RedisServer("--maxmemory", "200mb") as server:
        client = server.client()
        started = time.monotonic()
        # 10 billion URLs at 1e-6 in the default (blocked) layout: 49.8 GiB.
        with pytest.raises(NotEnoughMemoryError, match=r"needs 49\.8 GiB .* maxmemory 200\.0 MiB"):
            make(
                client, "huge", BLOOMFILTER_CAPACITY=10_000_000_000, BLOOMFILTER_ERROR_RATE=1e-6
            ).open()
        assert time.monotonic() - started < 1
        assert client.dbsize() == 0
        client.close()


def forge(client: redis.Redis, key: str, shards: int) -> None:
    """Create a small filter, then make its record claim ``shards`` shards."""
    bloom = make(client, key, BLOOMFILTER_CAPACITY=10_000)
    bloom.open()
    bloom.close()
    spec = bloom.spec
    client.hset(f"{key}:meta", mapping={"shards": shards, "bits": shards * spec.shard_bits})


def test_opening_a_forged_huge_record_checks_a_sample_only(redis_client: redis.Redis) -> None:
    forge(redis_client, "forged", 2_000_000)
    started = time.monotonic()
    with pytest.raises(FilterDamagedError, match=r"of the 2,000,000 shards .* are gone"):
        make(redis_client, "forged", BLOOMFILTER_CAPACITY=10_000).open()
    assert time.monotonic() - started < 1


@pytest.mark.parametrize(
    ("edit", "differs"),
    [
        (
            lambda spec: {"shards": 6, "bits": 6 * spec.shard_bits},
            r"'\{edited:6\}:g0' on [^:]+:\d+: a shard past the last \(the record says 6 shards\)",
        ),
        (
            lambda spec: {"shard_bits": 2 * spec.shard_bits, "bits": 2 * spec.bits},
            r"'\{edited:0\}:g0' on [^:]+:\d+: [\d,]+ bytes, where the record gives [\d,]+",
        ),
    ],
)
def test_a_record_edited_away_from_its_shards_is_refused(
    redis_client: redis.Redis, edit: Any, differs: str
) -> None:
    """Another geometry than the shards' would read other bits: URLs added come back "new"."""
    bloom = make(redis_client, "edited", BLOOMFILTER_CAPACITY=10_000, BLOOMFILTER_SHARDS=11)
    urls = [f"https://example.com/{i}" for i in range(1000)]
    assert bloom.add_many(urls).count(True) <= 1
    bloom.close()
    redis_client.hset("edited:meta", mapping=edit(bloom.spec))
    again = make(redis_client, "edited", BLOOMFILTER_CAPACITY=10_000)
    match = rf"record 'edited:meta' .* does not describe its shards: {differs}.* edited"
    with pytest.raises(FilterDamagedError, match=match):
        again.contains_many(urls)
    again.close()


def test_cli_info_and_reset_of_a_forged_huge_record(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    forge(redis_client, "forged", 2_000_000)
    redis_client.set("forged:other", "another program's")
    started = time.monotonic()
    code, _, err = run(capsys, "info", "--redis-url", redis_url, "--key", "forged")
    assert code == 1
    assert_one_line_error(err)
    held = redis_client.dbsize()  # its shards and record, and another program's key
    assert f"claims 2,000,000 shards, but its server(s) hold {held} key(s) in all" in err
    code, out, err = run(capsys, "reset", "--redis-url", redis_url, "--key", "forged", "--yes")
    assert code == 0, err
    shards = held - 2  # all but the record and the other program's key
    assert f"Deleted {shards} orphaned shard key(s) and 1 other part(s)" in out
    assert time.monotonic() - started < 10  # was minutes: 2,000,000 shards one by one
    assert sorted(redis_client.keys()) == [b"forged:other"]


def test_a_wrong_type_registry_gets_the_named_error(redis_client: redis.Redis) -> None:
    redis_client.set("typed:workers", "not a sorted set")
    bloom = make(redis_client, "typed", BLOOMFILTER_CAPACITY=10_000)
    with pytest.raises(WrongTypeError, match=r"'typed:workers' holds a string, where .* workers"):
        bloom.lease("w1", ttl=30).renew()
    with pytest.raises(WrongTypeError, match=r"'typed:workers' holds a string"):
        bloom.live_workers()
    bloom.close()


@pytest.mark.parametrize(("shards", "servers"), [(1, 1), (4096, 3), (4097, 1), (2_000_000, 7)])
def test_the_shards_checked_at_open_are_bounded_and_cover_every_server(
    shards: int, servers: int
) -> None:
    chosen = list(sample(shards, servers))
    assert len(chosen) <= VERIFIED + 1
    assert chosen == sorted(set(chosen))
    assert chosen[0] == 0
    assert chosen[-1] == shards - 1
    assert {shard % servers for shard in chosen} == set(range(min(servers, shards)))
    if shards <= VERIFIED:
        assert chosen == list(range(shards))


@pytest.mark.parametrize(
    ("field", "value", "complaint"),
    [
        ("shards", "100000000", "its geometry is impossible (a filter has 1 to 4,194,304 shards"),
        ("hash_count", "100000000", "its geometry is impossible (a filter has 1 to 64 hash"),
        ("shard_bits", "-5", "its shard_bits is '-5', not an integer"),
        ("created", "inf", "its creation time is 'inf', not a Unix timestamp"),
        ("created", "nan", "its creation time is 'nan', not a Unix timestamp"),
        ("created", "-inf", "its creation time is '-inf', not a Unix timestamp"),
        ("created", "-5", "its creation time is '-5', not a Unix timestamp"),
        ("created", "1e300", "its creation time is '1e300', not a Unix timestamp"),
        ("tightening", "1e-300", "its tightening is '1e-300', not a number from 0.01 to 0.99"),
        ("tightening", "1", "its tightening is '1', not a number from 0.01 to 0.99"),
        ("id", "not-hex", "its id is 'not-hex', not 32 hex digits"),
        ("state", "gone", "its state is 'gone'"),
        # It said the layout '2' was not layout 2 or 3.
        ("backend", "native", "its backend ('native') and its layout ('2') contradict each other"),
    ],
)
def test_a_corrupt_record_is_one_clear_error_and_can_be_reset(
    capsys: pytest.CaptureFixture[str], field: str, value: str, complaint: str
) -> None:
    """Each corrupt field is named; ``reset`` clears the filter at once.

    On a server of its own, up for less than the workers' TTL, where ``reset`` waits for
    leases a restart may have lost if the filter is older than the server: a creation time of
    'nan' (compared with nothing) made it wait the TTL out (30 s), as if it were older.
    """
    with RedisServer() as server:
        redis_client, redis_url = server.client(), server.url
        _a_corrupt_record_is_reset(capsys, redis_client, redis_url, field, value, complaint)
        redis_client.close()


def _a_corrupt_record_is_reset(
    capsys: pytest.CaptureFixture[str],
    redis_client: redis.Redis,
    redis_url: str,
    field: str,
    value: str,
    complaint: str,
) -> None:
    bloom = make(redis_client, "corrupt", BLOOMFILTER_CAPACITY=10_000)
    bloom.open()
    bloom.close()
    redis_client.hset("corrupt:meta", field, value)
    started = time.monotonic()
    with pytest.raises(BloomFilterError, match=re.escape(complaint)) as raised:
        make(redis_client, "corrupt", BLOOMFILTER_CAPACITY=10_000).open()
    assert "'corrupt:meta' cannot be used" in str(raised.value)
    code, _, err = run(capsys, "info", "--redis-url", redis_url, "--key", "corrupt")
    assert code == 1
    assert_one_line_error(err)
    assert complaint in err
    code, out, err = run(capsys, "reset", "--redis-url", redis_url, "--key", "corrupt", "--yes")
    assert code == 0, err
    assert "its config record cannot be used" in out
    assert redis_client.keys("*") == []
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("renamed", ["SCRIPT", "EVALSHA"])
def test_a_server_without_scripting_is_named_at_open(renamed: str) -> None:
    """A server whose scripting commands are renamed away (``rename-command X ""``).

    Opening fails with an error naming the server and the command, not redis-py's
    ``ResponseError`` (``SCRIPT``'s was one, out of the script loader).
    """
    with RedisServer("--rename-command", renamed, "") as server:
        client = server.client()
        # Redis 7 quotes the command 'so', Redis 6.2 `so`.
        with pytest.raises(BloomFilterError, match=f"unknown command .{renamed}.") as raised:
            make(client, "scriptless", BLOOMFILTER_CAPACITY=10_000).open()
        assert f"127.0.0.1:{server.port}" in str(raised.value)
        client.close()
