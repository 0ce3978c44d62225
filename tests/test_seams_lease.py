"""Leases, clearing, the lease's round trips and the capacity warning, on real servers (issue 22).

Four bugs found in the seams between the lease, the lifecycle and the counters:

* the lease's renewing thread died on any error that was not the package's own (a
  password rotated under an ACL user), so the worker's lease lapsed and another worker's
  ``clear()`` deleted the filter under its running crawl;
* a worker that started while another cleared the filter (``SCHEDULER_FLUSH_ON_START``)
  opened it before it held a lease, so the clear went on under it;
* on a Redis Cluster the lease's copy of the topology counted its round trips apart,
  so they were missing from the stats;
* the capacity warning measured against the worker's ``BLOOMFILTER_CAPACITY``, not
  that of the filter it adopted.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster
from scrapy import Spider
from scrapy.utils.test import get_crawler

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.dupefilter import RFPDupeFilter

#: Small, to keep a test fast; the same sizing for every worker of a test.
SMALL = {"BLOOMFILTER_CAPACITY": 10_000, "BLOOMFILTER_ERROR_RATE": 1e-6}


class BooksSpider(Spider):
    name = "books"


def fingerprints(n: int, salt: str = "") -> list[str]:
    return [hashlib.sha1(f"lease{salt}{i}".encode()).hexdigest() for i in range(n)]


def dupefilter(url: str, **settings: Any) -> RFPDupeFilter:
    """Build a worker's dupefilter as a crawl does (a crawler, its stats)."""
    crawler = get_crawler(BooksSpider, {"REDIS_URL": url, **SMALL, **settings})
    return RFPDupeFilter.from_crawler(crawler)


@pytest.fixture
def opened() -> Iterator[list[RFPDupeFilter]]:
    """Dupefilters a test built: closed at its end (their lease threads stop)."""
    made: list[RFPDupeFilter] = []
    yield made
    for df in made:
        df.close("finished")


def wait_until(condition: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# -- 4. the lease's round trips on a cluster ------------------------------------------


def test_the_lease_round_trips_on_a_cluster_are_counted(redis_cluster: RedisCluster) -> None:
    config = BloomConfig.from_settings(SMALL)
    bloom = RedisBloomFilter.from_config(redis_cluster, "cluster:bloomfilter", config)
    bloom.open()
    lease = bloom.lease("w1", 30.0)
    before = bloom.round_trips
    assert lease.renew() == 0
    assert lease.others() == 0
    assert bloom.round_trips >= before + 2  # one round trip each, at least
    assert lease.release() == 0
    bloom.clear()
    bloom.close()


# -- 9. the capacity warning measures against the filter's capacity ---------------------


def test_the_capacity_warning_uses_the_capacity_of_the_filter_adopted(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # Two configurations of one geometry (same BIT and HASH_NUMBER), differing only in
    # the capacity they state: a worker of either adopts a filter the other created. Of
    # fixed size: a filter that grows reports from its script instead.
    geometry = {"BLOOMFILTER_BIT": 20, "BLOOMFILTER_HASH_NUMBER": 5, "BLOOMFILTER_EXPANSION": 0}
    small = BloomConfig.from_settings({**geometry, "BLOOMFILTER_CAPACITY": 1_000})
    large = BloomConfig.from_settings({**geometry, "BLOOMFILTER_CAPACITY": 1_000_000})
    assert small.spec == large.spec

    def fill(creator: BloomConfig, worker: BloomConfig, key: str) -> list[str]:
        """Create with ``creator``, add 2,500 items as ``worker``; return the warnings."""
        first = RedisBloomFilter.from_config(redis_client, key, creator)
        first.open()
        first.close()
        adopter = RedisBloomFilter.from_config(redis_client, key, worker)
        assert adopter.open().capacity == creator.capacity
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
            for element in fingerprints(2_500, key):
                adopter.check_and_add(element)
            adopter.sync_counters()
        adopter.close()
        return [r.message for r in caplog.records if "its capacity of" in r.message]

    # Created for 1,000 items: a worker stating 1,000,000 is still warned at 2.5x.
    warned = fill(small, large, "created-small:bloomfilter")
    assert len(warned) == 1
    assert "2.5x its capacity of 1,000:" in warned[0]
    # Created for 1,000,000 items: a worker stating 1,000 is not warned at all.
    assert fill(large, small, "created-large:bloomfilter") == []
