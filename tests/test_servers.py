"""Several standalone Redis servers, global totals and worker leases, on real servers."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator

import pytest
import redis
from redis_server import RedisServer, free_port
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from scrapy_redis_bloom import (
    FilterSpec,
    FilterTotals,
    RedisBloomFilter,
    ServerListMismatchError,
)
from scrapy_redis_bloom.dupefilter import RFPDupeFilter
from scrapy_redis_bloom.engine import live_workers
from scrapy_redis_bloom.errors import BloomFilterError
from scrapy_redis_bloom.layout import counter_key

SPEC = FilterSpec(shards=7, shard_bits=8192, hash_count=5)


def fingerprints(n: int, tag: str = "") -> list[str]:
    return [hashlib.sha1(f"{tag}{i}".encode()).hexdigest() for i in range(n)]


@pytest.fixture(scope="module")
def servers() -> Iterator[list[RedisServer]]:
    started = [RedisServer().start() for _ in range(3)]
    yield started
    for server in started:
        server.stop()


@pytest.fixture
def clients(servers: list[RedisServer]) -> Iterator[list[redis.Redis]]:
    made = [server.client() for server in servers]
    for client in made:
        client.flushall()
    yield made
    for client in made:
        client.close()


def test_shard_i_lives_on_server_i_mod_n(clients: list[redis.Redis]) -> None:
    bf = RedisBloomFilter(clients, "bf", SPEC, 1000)
    assert bf.add_many(fingerprints(2000)) == [False] * 2000
    for i, client in enumerate(clients):
        shards = {k.decode() for k in client.keys("bf:g0:*")}
        assert shards == {f"bf:g0:{s}" for s in range(SPEC.shards) if s % 3 == i}
        assert client.get("bf:server") == f"{i}/3".encode()
    assert clients[0].hget("bf:meta", "servers") == b"3"
    assert not clients[1].exists("bf:meta")
    assert all(bf.contains_many(fingerprints(2000)))
    assert bf.check_and_add(fingerprints(1)[0]) is True
    assert bf.totals().added == 2000


def test_a_reordered_server_list_is_refused_before_any_write(
    clients: list[redis.Redis],
) -> None:
    RedisBloomFilter(clients, "bf", SPEC, 1000).add_many(fingerprints(100))
    before = [sorted(c.keys("*")) for c in clients]
    reordered = [clients[1], clients[0], clients[2]]
    with pytest.raises(ServerListMismatchError, match=r"is server 1/3 of the Bloom filter 'bf'"):
        RedisBloomFilter(reordered, "bf", SPEC, 1000).open()
    with pytest.raises(ServerListMismatchError, match=r"is server 0/3 .* lists it as server 0/2"):
        RedisBloomFilter(clients[:2], "bf", SPEC, 1000).open()
    assert [sorted(c.keys("*")) for c in clients] == before


def test_clear_removes_every_servers_keys(clients: list[redis.Redis]) -> None:
    bf = RedisBloomFilter(clients, "bf", SPEC, 1000)
    bf.add_many(fingerprints(100))
    bf.clear()
    assert [c.keys("*") for c in clients] == [[], [], []]
    # Now another server list may create the filter afresh.
    RedisBloomFilter(clients[:2], "bf", SPEC, 1000).open()


def test_totals_sum_every_workers_outcomes(redis_client: redis.Redis) -> None:
    a = RedisBloomFilter(redis_client, "bf", SPEC, 1000)
    b = RedisBloomFilter(redis_client, "bf", SPEC, 1000)
    outcomes = [a.check_and_add(fp) for fp in fingerprints(300)]
    outcomes += [b.check_and_add(fp) for fp in fingerprints(500)]  # 300 seen, 200 new
    # check_and_add counts locally until synced (every SYNC_EVERY calls, or closed)...
    assert a.totals() == FilterTotals(added=0, seen=0)
    outcomes += b.add_many(fingerprints(50, "x"))
    # ...and add_many syncs its filter's counts when it returns: b's, not a's.
    assert a.totals() == FilterTotals(added=250, seen=300)
    a.sync_counters()
    totals = a.totals()
    assert totals.added == outcomes.count(False) == 550
    assert totals.seen == outcomes.count(True) == 300
    # A counter shares its shard's Redis Cluster hash slot.
    assert counter_key("bf:g0:3") == "{bf:g0:3}:count"


def test_leases_count_other_live_workers(redis_client: redis.Redis) -> None:
    bf = RedisBloomFilter(redis_client, "bf", SPEC, 1000)
    one, two = bf.lease("one", ttl=30), bf.lease("two", ttl=1)
    assert one.renew() == 0
    assert two.renew() == 1
    assert one.others() == 1
    assert sorted(bf.live_workers()) == ["one", "two"]
    assert two.release() == 1
    assert one.others() == 0
    assert bf.live_workers() == ["one"]
    two.renew()  # and let it lapse: no renewal within its 1 s
    assert bf.live_workers() == ["two", "one"]  # soonest expiry first
    time.sleep(1.3)
    assert one.others() == 0
    assert live_workers(redis_client, "bf") == ["one"]  # needs no geometry
    assert 0 < redis_client.pttl("bf:workers") <= 60_000  # the registry expires too
    one.start()  # renews in the background
    assert one.release() == 0
    assert redis_client.zcard("bf:workers") == 0


class BooksSpider(Spider):
    name = "books"


def test_dupefilter_spreads_over_the_urls_setting(
    servers: list[RedisServer], clients: list[redis.Redis]
) -> None:
    crawler = get_crawler(
        BooksSpider,
        {
            "BLOOMFILTER_REDIS_URLS": [s.url for s in servers],
            "BLOOMFILTER_CAPACITY": 10_000,
            "BLOOMFILTER_SHARD_BIT": 12,
        },
    )
    df = RFPDupeFilter.from_crawler(crawler)
    assert [df.request_seen(Request(f"https://example.com/{i}")) for i in range(300)] == [
        False
    ] * 300
    assert df.request_seen(Request("https://example.com/7")) is True
    df.close("finished")
    assert all(client.keys("books:bloomfilter:g0:*") for client in clients)
    assert crawler.stats.get_value("bloomfilter/total_added") == 300
    assert crawler.stats.get_value("bloomfilter/total_filtered") == 1


def test_one_unreachable_server_is_named(
    servers: list[RedisServer], clients: list[redis.Redis]
) -> None:
    dead = f"redis://:s3cret@127.0.0.1:{free_port()}/0"
    crawler = get_crawler(
        BooksSpider,
        {
            "BLOOMFILTER_REDIS_URLS": [servers[0].url, dead],
            "BLOOMFILTER_REDIS_PARAMS": {"socket_connect_timeout": 1},
        },
    )
    with pytest.raises(BloomFilterError, match=r"Cannot reach Redis at .*127\.0\.0\.1:\d+") as e:
        RFPDupeFilter.from_crawler(crawler)
    assert "s3cret" not in str(e.value)


def test_cli_reset_on_each_server_removes_a_multi_server_filter(
    servers: list[RedisServer], clients: list[redis.Redis], capsys: pytest.CaptureFixture[str]
) -> None:
    from scrapy_redis_bloom.cli import main

    RedisBloomFilter(clients, "bf", SPEC, 1000).add_many(fingerprints(500))
    for server in servers:
        assert main(["reset", "--redis-url", server.url, "--key", "bf", "--yes"]) == 0
    assert [c.keys("*") for c in clients] == [[], [], []]
    capsys.readouterr()
    # The servers may now hold a filter over another server list.
    RedisBloomFilter(clients[::-1], "bf", SPEC, 1000).open()
