"""Several standalone Redis servers, global totals and worker leases, on real servers."""

from __future__ import annotations

import hashlib
import time

import pytest
import redis
from redis_server import RedisServer, free_port
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from scrapy_redis_bloom import (
    FaultPolicy,
    FilterDamagedError,
    FilterSpec,
    FilterTotals,
    RedisBloomFilter,
    ServerListMismatchError,
)
from scrapy_redis_bloom.core.errors import BloomFilterError
from scrapy_redis_bloom.engine import counters
from scrapy_redis_bloom.scrapy.dupefilter import RFPDupeFilter

SPEC = FilterSpec(shards=7, shard_bits=8192, hash_count=5)


def fingerprints(n: int, tag: str = "") -> list[str]:
    return [hashlib.sha1(f"{tag}{i}".encode()).hexdigest() for i in range(n)]


def test_shard_i_lives_on_server_i_mod_n(clients: list[redis.Redis]) -> None:
    bf = RedisBloomFilter(clients, "bf", SPEC, 1000)
    assert bf.add_many(fingerprints(2000)) == [False] * 2000
    assert bf.record is not None
    for i, client in enumerate(clients):
        shards = {k.decode() for k in client.keys("{bf:*}:g0")}
        assert shards == {f"{{bf:{s}}}:g0" for s in range(SPEC.shards) if s % 3 == i}
        assert client.get("bf:server") == f"{bf.record.filter_id} {i}/3".encode()
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
    with pytest.raises(ServerListMismatchError, match=r"on 3 server\(s\); this worker lists 2"):
        RedisBloomFilter(clients[:2], "bf", SPEC, 1000).open()
    assert [sorted(c.keys("*")) for c in clients] == before


def test_clear_removes_every_servers_keys(clients: list[redis.Redis]) -> None:
    bf = RedisBloomFilter(clients, "bf", SPEC, 1000)
    bf.add_many(fingerprints(100))
    bf.clear()
    assert [c.keys("*") for c in clients] == [[], [], []]
    # Now another server list may create the filter afresh.
    RedisBloomFilter(clients[:2], "bf", SPEC, 1000).open()


def test_totals_sum_every_workers_outcomes(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(counters, "SYNC_INTERVAL", 3600.0)  # no timed sync: a loaded machine
    a = RedisBloomFilter(redis_client, "bf", SPEC, 1000)
    b = RedisBloomFilter(redis_client, "bf", SPEC, 1000)
    outcomes = [a.check_and_add(fp) for fp in fingerprints(300)]
    outcomes += [b.check_and_add(fp) for fp in fingerprints(500)]  # 300 seen, 200 new
    # check_and_add counts locally until synced (about once a second, or closed)...
    assert a.totals() == FilterTotals(added=0, seen=0)
    monkeypatch.setattr(counters, "SYNC_INTERVAL", 1.0)  # b's next: a second after add_many's
    outcomes += b.add_many(fingerprints(50, "x"))
    # ...and add_many syncs its filter's counts when it returns: b's, not a's.
    assert a.totals() == FilterTotals(added=250, seen=300)
    a.sync_counters()
    totals = a.totals()
    assert totals.added == outcomes.count(False) == 550
    assert totals.seen == outcomes.count(True) == 300
    assert redis_client.hgetall("bf:count") == {b"added": b"550", b"seen": b"300"}  # one key
    # Within a second, a call syncs on its own: the totals stay live during a crawl.
    time.sleep(1.1)
    b.check_and_add(fingerprints(1, "late")[0])
    assert a.totals() == FilterTotals(added=551, seen=300)


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
    assert bf.live_workers() == ["one"]
    assert redis_client.zrange("bf:workers", 0, -1) == [b"one"]  # the lapsed one removed
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
    assert all(client.keys("{books:bloomfilter:*}:g0") for client in clients)
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
            "BLOOMFILTER_RETRY_TIMEOUT": 0.5,
        },
    )
    with pytest.raises(
        BloomFilterError, match=r"Redis at 127\.0\.0\.1:\d+ could not .*: cannot connect"
    ) as e:
        RFPDupeFilter.from_crawler(crawler)
    assert "s3cret" not in str(e.value)


def test_one_server_listed_under_two_names_is_refused_before_anything_is_written(
    servers: list[RedisServer], clients: list[redis.Redis]
) -> None:
    # 127.0.0.1 and localhost: one server. Its shards and markers would collide: the filter
    # was created, then never reopened ("is server 0/2 ... lists it as server 1/2").
    port = servers[0].port
    urls = [f"redis://127.0.0.1:{port}/0", f"redis://localhost:{port}/0"]
    for _ in range(2):
        crawler = get_crawler(BooksSpider, {"BLOOMFILTER_REDIS_URLS": urls})
        with pytest.raises(ServerListMismatchError) as refused:
            RFPDupeFilter.from_crawler(crawler)
        message = str(refused.value)
        assert f"127.0.0.1:{port} and localhost:{port} are one Redis server" in message
        assert "list each server once" in message
        assert clients[0].keys("*") == []


def test_an_emptied_server_is_found_not_remapped(clients: list[redis.Redis]) -> None:
    # Server 1 is replaced by an empty one (or restarts without persistence): its shards
    # are gone. A worker must not answer "new" for the URLs they held without saying so.
    bf = RedisBloomFilter(clients, "bf", SPEC, 1000)
    seen = fingerprints(200)
    bf.add_many(seen)
    clients[1].flushall()
    with pytest.raises(FilterDamagedError, match=r"emptied or replaced") as raised:
        RedisBloomFilter(clients, "bf", SPEC, 1000).open()
    assert "BLOOMFILTER_ON_LOSS = 'recreate'" in str(raised.value)
    # The running worker finds out at the first touch of a shard of that server.
    on_server_1 = next(fp for fp in seen if bf_shard(fp) % 3 == 1)
    with pytest.raises(FilterDamagedError):
        bf.check_and_add(on_server_1)
    # Told to, a worker recreates that server's part empty: what it held may be fetched
    # again, and nothing held elsewhere is forgotten.
    again = RedisBloomFilter(clients, "bf", SPEC, 1000, faults=FaultPolicy(on_loss="recreate"))
    answers = again.contains_many(seen)
    assert all(answers[i] for i, fp in enumerate(seen) if bf_shard(fp) % 3 != 1)
    assert not any(answers[i] for i, fp in enumerate(seen) if bf_shard(fp) % 3 == 1)
    assert again.events.counts["recreated"] == len(range(1, SPEC.shards, 3))


def test_an_evicted_marker_is_restored(clients: list[redis.Redis]) -> None:
    bf = RedisBloomFilter(clients, "bf", SPEC, 1000)
    bf.add_many(fingerprints(100))
    marker = clients[2].get("bf:server")
    clients[2].delete("bf:server")  # evicted alone: the shards on server 2 are intact
    other = RedisBloomFilter(clients, "bf", SPEC, 1000)
    assert other.contains_many(fingerprints(100)) == [True] * 100
    assert clients[2].get("bf:server") == marker
    assert other.events.counts["restored"] == 1


def bf_shard(fingerprint: str) -> int:
    from scrapy_redis_bloom.core.hashing import locate

    return locate(fingerprint, SPEC)[0]


def test_a_foreign_server_key_is_named_not_taken_for_a_marker(clients: list[redis.Redis]) -> None:
    clients[1].set("bf:server", "web-1")
    with pytest.raises(ServerListMismatchError, match=r"holds 'bf:server' = 'web-1', which is not"):
        RedisBloomFilter(clients, "bf", SPEC, 1000).open()
    assert clients[1].get("bf:server") == b"web-1"
