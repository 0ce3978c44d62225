"""Bugs found in the seams of the engine (issue 22), each on real servers.

1. A failure of a check that is not a connection error (credentials refused after a
   password rotation, an ACL refusal) went around ``BLOOMFILTER_ON_ERROR`` and raised
   out of ``request_seen``: the scheduler dropped the request.
5. A non-transport error in the middle of a multi-node check left replies owed on the
   other nodes: the next call failed with "replies read out of order".
6. The scriptless fast path set the bits before it learned the shard's identity: a
   stale worker, after a reset under the same key, wrote into the new filter.
7. The scriptless growth margin (16 late counts per worker) covered about 64 workers;
   with more, generation 0 overfilled before generation 1 started.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator

import mmh3
import pytest
import redis
from redis_server import RedisServer
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from scrapy_redis_bloom import BloomConfig, FilterSpec, RedisBloomFilter
from scrapy_redis_bloom.core.errors import ConfigMismatchError
from scrapy_redis_bloom.core.hashing import offsets, place
from scrapy_redis_bloom.core.layout import HEADER_BITS
from scrapy_redis_bloom.core.settings import FaultPolicy
from scrapy_redis_bloom.scrapy.dupefilter import RFPDupeFilter

RULES = ["on", ">old", "allkeys", "+@all"]


class BooksSpider(Spider):
    name = "books"


def fingerprints(n: int, tag: str) -> list[str]:
    return [hashlib.sha1(f"{tag}{i}".encode()).hexdigest() for i in range(n)]


@pytest.fixture
def acl_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        server.client().execute_command("ACL", "SETUSER", "bloom", *RULES)
        yield server


def rotate_password(server: RedisServer) -> None:
    """Rotate the user's password as an operator does: a new one, old sessions killed."""
    admin = server.client()
    admin.execute_command("ACL", "SETUSER", "bloom", "resetpass", ">new")
    admin.execute_command("CLIENT", "KILL", "USER", "bloom")
    admin.close()


def dupefilter(server: RedisServer, on_error: str) -> RFPDupeFilter:
    url = f"redis://bloom:old@127.0.0.1:{server.port}/0"
    settings = {
        "REDIS_URL": url,
        "BLOOMFILTER_CAPACITY": 10_000,
        "BLOOMFILTER_ON_ERROR": on_error,
        "BLOOMFILTER_RETRY_TIMEOUT": 0.5,
        "BLOOMFILTER_CACHE_SIZE": 0,
    }
    return RFPDupeFilter.from_crawler(get_crawler(BooksSpider, settings))


@pytest.mark.parametrize("on_error", ["allow", "raise"])
def test_a_rotated_password_mid_crawl_answers_new_and_never_raises(
    acl_server: RedisServer, on_error: str, caplog: pytest.LogCaptureFixture
) -> None:
    df = dupefilter(acl_server, on_error)
    assert df.request_seen(Request("https://example.com/1")) is False
    rotate_password(acl_server)
    with caplog.at_level(logging.WARNING):
        # The scheduler enqueues a request whose request_seen returns False: not dropped.
        assert df.request_seen(Request("https://example.com/2")) is False
        assert df.request_seen(Request("https://example.com/1")) is False
    assert df.bloom.events.counts["errors"] == 2
    text = caplog.text
    assert "refused the filter's credentials" in text
    assert "REDIS_URL" in text  # what to fix is named
    if on_error == "raise":
        assert df._failed  # the crawl stops, finish reason bloomfilter_error
        assert "the crawl stops (finish reason 'bloomfilter_error')" in text
    else:
        assert not df._failed
        assert "BLOOMFILTER_ON_ERROR = 'allow'" in text
    df.close("finished")


def test_a_refused_server_in_a_multi_node_check_leaves_no_reply_owed(
    servers: list[RedisServer],
) -> None:
    for server in servers:
        admin = server.client()
        admin.flushall()
        admin.execute_command("ACL", "SETUSER", "bloom", *RULES)
        admin.close()
    clients = [
        redis.Redis(port=server.port, username="bloom", password="old") for server in servers
    ]
    settings = {"BLOOMFILTER_CAPACITY": 10_000, "BLOOMFILTER_SHARDS": 6}
    config = BloomConfig.from_settings(settings)
    faults = FaultPolicy(retry_timeout=0.5, on_error="allow")
    bloom = RedisBloomFilter(
        clients, "books:bloomfilter", config.spec, config.capacity, faults=faults
    )
    assert bloom.check_and_add_many(fingerprints(60, "a")) == [False] * 60
    rotate_password(servers[1])
    # The refused server's part answers "new" (counted); the others' replies are read.
    assert bloom.check_and_add_many(fingerprints(60, "b")) == [False] * 60
    assert bloom.events.counts["errors"] > 0
    # No connection owes a reply: the next calls read their own replies, in order.
    for node in bloom.topology.primaries():
        assert node.owed == 0
    assert bloom.check_and_add_many(fingerprints(60, "a"))[:3] != [None] * 3
    assert [bloom.check_and_add(fp) for fp in fingerprints(20, "c")] == [False] * 20
    bloom.close()
    for client in clients:
        client.close()


def test_a_stale_worker_after_a_reset_takes_back_the_bits_it_set_in_the_new_filter(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    key = "books:bloomfilter"
    # The classic layout: one shard each, so the stale worker's bits are easy to find.
    old = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 10_000, "BLOOMFILTER_BLOCKED": False})
    stale = RedisBloomFilter(redis_client, key, old.spec, old.capacity, cache_size=0)
    assert stale.add_many(fingerprints(100, "old")) == [False] * 100
    # Another process resets the filter under the same key, and creates it afresh with
    # a larger geometry. The stale worker still believes its own shard is there.
    stale_view = RedisBloomFilter(redis_client, key, old.spec, old.capacity)
    stale_view.clear()
    new = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 20_000, "BLOOMFILTER_BLOCKED": False})
    fresh = RedisBloomFilter(redis_client, key, new.spec, new.capacity, cache_size=0)
    fresh.open()
    element = fingerprints(1, "stale")[0]
    h1, h2 = mmh3.hash64(element, seed=0, x64arch=True, signed=False)
    stale_bits = set(bit_offsets(old.spec, h1, h2))
    fresh_bits = set(bit_offsets(new.spec, h1, h2))
    # Its BITFIELD sets its bits before the reply shows the shard is another filter's.
    with pytest.raises(ConfigMismatchError):
        stale.check_and_add(element)
    (shard_key,) = fresh.shard_keys
    raw = redis_client.get(shard_key) or b""
    blind = [bit for bit in stale_bits - fresh_bits if bit_is_set(raw, bit)]
    assert blind == []  # taken back: they stand for no element of the new filter
    assert stale.events.counts["taken_back"] >= len(stale_bits - fresh_bits) - 2
    assert f"wrote to {shard_key!r} (shard 0) after it was lost or replaced" in caplog.text


def bit_offsets(spec: FilterSpec, h1: int, h2: int) -> list[int]:
    _, x, y = place(h1, h2, spec.shards, spec.shard_bits, spec.seed_range)
    return offsets(x, y, spec.hash_count, spec.shard_bits, spec.block_bits, HEADER_BITS)


def bit_is_set(raw: bytes, bit: int) -> bool:
    byte = bit // 8
    return byte < len(raw) and bool(raw[byte] >> (7 - bit % 8) & 1)


def test_the_scriptless_margin_widens_with_the_live_workers(redis_client: redis.Redis) -> None:
    settings = {"BLOOMFILTER_CAPACITY": 100_000, "BLOOMFILTER_SHARDS": 1}
    config = BloomConfig.from_settings(settings)
    bloom = RedisBloomFilter.from_config(redis_client, "crowd:bloomfilter", config, cache_size=0)
    first = bloom.open().growth.first_capacity
    margin = first - bloom.open().growth.scriptless_limit
    workers = 200  # their late counts (16 each) pass the fixed margin
    assert 16 * workers > margin + 1000
    others = [bloom.lease(f"other-{i}", ttl=60) for i in range(workers - 1)]
    for lease in others:
        lease.renew()
    mine = bloom.lease("me", ttl=60)
    assert mine.renew() == workers - 1
    # Generation 0 holds all but 16 * workers - 500 items: past the 200 workers' margin,
    # within the fixed one. Checks of it must go through the script, which alone crosses
    # the growth boundary.
    assert bloom.add_many(fingerprints(first - 16 * workers + 500, "fill")).count(True) < 50
    scripted_before = evalsha_calls(redis_client)
    for fp in fingerprints(40, "late"):
        bloom.check_and_add(fp)
    assert evalsha_calls(redis_client) - scripted_before >= 30
    mine.release()
    bloom.close()


def evalsha_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
