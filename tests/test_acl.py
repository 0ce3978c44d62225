"""A least-privilege Redis ACL user runs the filter: the README's list of commands is complete.

The user gets exactly the commands and key patterns the README lists; a crawl's work
(create, check and add, bulk, counters, leases, state, clear) must succeed with them.
"""

from __future__ import annotations

import hashlib

import pytest
import redis
from redis_server import RedisServer
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.dupefilter import RFPDupeFilter

#: The commands of the README's "Least privilege" section, as ACL rules.
FILTER_COMMANDS = [
    # sent by the filter
    "+evalsha", "+script|load", "+getrange", "+bitfield", "+exists", "+get", "+set",
    "+hgetall", "+hset", "+hincrby", "+hmget", "+strlen", "+type", "+unlink",
    # run inside its scripts
    "+setbit", "+setrange", "+del", "+time", "+zadd", "+zcard", "+zrem",
    "+zrangebyscore", "+zremrangebyscore", "+zscore", "+pttl", "+pexpire", "+hkeys",
    "+hget", "+hexists",
    # the last worker's and the CLI's figures; server checks at open (optional)
    "+bitcount", "+memory|usage", "+info",
]  # fmt: skip


def fingerprints(n: int) -> list[str]:
    return [hashlib.sha1(f"acl{i}".encode()).hexdigest() for i in range(n)]


class BooksSpider(Spider):
    name = "books"


def test_a_user_with_the_documented_commands_runs_the_filter() -> None:
    with RedisServer() as server:
        admin = server.client()
        rules = ["on", ">pw", "resetkeys", "~books:bloomfilter*", "~{books:bloomfilter:*"]
        admin.execute_command("ACL", "SETUSER", "bloom", *rules, "-@all", *FILTER_COMMANDS)
        user = redis.Redis(port=server.port, username="bloom", password="pw")
        config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 10_000})
        bloom = RedisBloomFilter(user, "books:bloomfilter", config.spec, config.capacity)
        assert bloom.add_many(fingerprints(500)) == [False] * 500
        assert bloom.check_and_add(fingerprints(1)[0]) is True
        assert bloom.contains_many(fingerprints(500)) == [True] * 500
        assert bloom.state().estimated_items == pytest.approx(500, abs=5)
        assert bloom.totals().added == 500
        lease = bloom.lease("w1", ttl=30)
        assert lease.renew() == 0
        assert bloom.live_workers() == ["w1"]
        assert lease.release() == 0
        bloom.clear()
        bloom.close()
        # The same user through the dupefilter, as a crawl builds it.
        url = f"redis://bloom:pw@127.0.0.1:{server.port}/0"
        crawler = get_crawler(BooksSpider, {"REDIS_URL": url, "BLOOMFILTER_CAPACITY": 10_000})
        df = RFPDupeFilter.from_crawler(crawler)
        assert df.request_seen(Request("https://example.com/")) is False
        assert df.request_seen(Request("https://example.com/")) is True
        df.close("finished")
        assert crawler.stats.get_value("bloomfilter/total_added") == 1
        user.close()
        admin.close()
