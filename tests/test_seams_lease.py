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
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster
from redis_server import RedisServer
from reply_cutter import ReplyCutter
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler
from waiting import wait_until

from scrapy_redis_bloom import BloomConfig, FilterBusyError, RedisBloomFilter
from scrapy_redis_bloom.core.errors import FilterUnavailableError, Wording
from scrapy_redis_bloom.core.settings import FaultPolicy
from scrapy_redis_bloom.dupefilter import RFPDupeFilter
from scrapy_redis_bloom.engine.lease import CLOCK_MARGIN

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


# -- 2. the lease thread survives any failure, and clear() respects live leases ---------


@contextmanager
def crawling_as_acl_user() -> Iterator[tuple[RedisServer, redis.Redis, RFPDupeFilter]]:
    """Yield a server, an admin client, and a worker crawling as the ACL user ``bloom``.

    The worker's lease lasts 1 s (renewed every third of that); it is closed while
    its server still runs.
    """
    with RedisServer() as server:
        admin = server.client()
        admin.execute_command("ACL", "SETUSER", "bloom", "on", ">pw", "~*", "+@all")
        url = f"redis://bloom:pw@127.0.0.1:{server.port}/0"
        crawling = dupefilter(url, BLOOMFILTER_WORKER_TTL=1.0)
        try:
            assert crawling.request_seen(Request("https://example.com/1")) is False
            yield server, admin, crawling
        finally:
            crawling.close("finished")
            admin.close()


def rotate_password(admin: redis.Redis) -> None:
    """Rotate the user's password and drop its connections: its renewals now fail."""
    admin.execute_command("ACL", "SETUSER", "bloom", "resetpass", ">new")
    admin.execute_command("CLIENT", "KILL", "USER", "bloom")


def test_the_lease_thread_survives_a_password_rotation_says_why_and_counts_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with crawling_as_acl_user() as (_, admin, crawling):
        worker = crawling.lease.worker_id
        thread = crawling.lease._thread
        assert thread is not None
        with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
            rotate_password(admin)  # redis-py's AuthenticationError from now on
            time.sleep(1.5)  # a few renewals (every third of the TTL)
        assert thread.is_alive(), "the lease thread died"
        warned = [r for r in caplog.records if "renew the lease of worker" in r.message]
        assert warned, caplog.text
        assert warned[0].levelno == logging.WARNING
        assert worker in warned[0].message
        assert "refused the filter's credentials" in warned[0].message
        assert len(warned) <= 2  # rate-limited: a line per TTL at most, not per attempt
        # Counted per attempt (every third of the TTL, the password still rotated): two at
        # least, however late a loaded machine ran the thread in the 1.5 s above.
        events = crawling.lease.events
        assert wait_until(lambda: events.counts.get("lease_failed", 0) >= 2, 5.0)
        crawling.filter_stats.tick()  # as the stats timer does, on the reactor's thread
        assert crawling.crawler.stats.get_value("bloomfilter/lease_failed") >= 2
        # The old password is accepted again: the same thread renews the lease.
        admin.execute_command("ACL", "SETUSER", "bloom", ">pw")
        registry = "books:bloomfilter:workers"
        assert wait_until(lambda: admin.zscore(registry, worker) is not None, 5.0)
        assert crawling.lease._thread is thread


def test_no_worker_clears_the_filter_under_a_crawl_whose_renewals_failed_a_while() -> None:
    with crawling_as_acl_user() as (server, admin, crawling):
        rotate_password(admin)
        time.sleep(1.5)  # renewals fail for longer than the TTL
        admin.execute_command("ACL", "SETUSER", "bloom", ">pw")
        time.sleep(1.5)  # longer than the TTL: only a lease renewed since is live now
        # Another worker closing with SCHEDULER_PERSIST = False leaves the filter alone.
        closing = dupefilter(server.url, BLOOMFILTER_WORKER_TTL=1.0)
        try:
            assert closing.clear_unless_shared() is False  # the add-on's Scheduler's flush
            with pytest.raises(FilterBusyError):  # scrapy-redis's would empty the queue
                closing.clear()
        finally:
            closing.close("finished")
        assert admin.exists("books:bloomfilter:meta"), "cleared under a running crawl"
        assert crawling.request_seen(Request("https://example.com/1")) is True


# -- 3. a worker that starts while another clears ----------------------------------------


def clear_while_another_starts(
    first: RFPDupeFilter, url: str, settings: dict[str, Any]
) -> RFPDupeFilter:
    """Clear ``first`` while another worker of the same filter starts; return that one.

    The two begin together, as two workers under ``SCHEDULER_FLUSH_ON_START`` do: one
    flushes (scrapy-redis's Scheduler.open calls ``clear()``) as the other opens.
    """
    started = threading.Barrier(2)
    failures: list[BaseException] = []
    second: list[RFPDupeFilter] = []

    def clear() -> None:
        started.wait()
        first.clear_unless_shared()  # (clear() raises when the other came first)

    def start() -> None:
        started.wait()
        try:
            second.append(dupefilter(url, **settings))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=clear), threading.Thread(target=start)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures, failures
    return second[0]


def test_a_worker_starting_while_another_clears_never_opens_a_filter_being_deleted(
    redis_client: redis.Redis, redis_url: str, opened: list[RFPDupeFilter]
) -> None:
    # Many shards: opening checks each one, clearing deletes each one, so the two overlap.
    for attempt in range(3):
        key = f"flush{attempt}:bloomfilter"
        settings = {"BLOOMFILTER_KEY": key, "BLOOMFILTER_SHARDS": 2048}
        first = dupefilter(redis_url, **settings)
        opened.append(first)
        assert first.request_seen(Request("https://example.com/old")) is False
        late = clear_while_another_starts(first, redis_url, settings)
        opened.append(late)
        # Whichever came first, the filter the second worker opened is whole: it answers,
        # with no error (the first worker cleared it only if it was alone, before).
        assert late.request_seen(Request("https://example.com/new")) is False
        assert late.request_seen(Request("https://example.com/new")) is True
        assert not late._failed
        assert late.bloom.events.counts.get("errors", 0) == 0
        assert redis_client.exists(f"{key}:meta")


def test_a_claim_to_clear_holds_off_a_starting_worker_until_the_filter_is_gone(
    redis_client: redis.Redis,
) -> None:
    config = BloomConfig.from_settings(SMALL)
    key = "claim:bloomfilter"
    clearer = RedisBloomFilter.from_config(redis_client, key, config)
    clearer.open()
    lease = clearer.lease("clearer", 5.0)
    lease.start()
    with lease.clearing() as others:
        assert others == 0
        assert clearer.live_workers() == ["clearer"]  # the claim is no worker
        starter = RedisBloomFilter.from_config(redis_client, key, config)
        waiting = starter.lease("starter", 5.0)
        joined: list[int] = []
        thread = threading.Thread(target=lambda: joined.append(waiting.start()))
        thread.start()
        time.sleep(0.5)
        assert joined == []  # it waits for the filter to be deleted
        assert lease.others() == 0
        clearer.clear()
    thread.join(timeout=5)
    assert joined == [1]  # then it joins the clearer
    assert not redis_client.exists(f"{key}:meta")
    # With a live worker, nothing is claimed: the filter stays, and nobody waits.
    with waiting.clearing() as others:
        assert others == 1
    assert waiting.renew() == 1
    waiting.release()
    assert lease.release() == 0
    starter.close()
    clearer.close()


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
    large = BloomConfig.from_settings({**geometry, "BLOOMFILTER_CAPACITY": 100_000})
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

    # Created for 1,000 items: a worker stating 100,000 is still warned at 2.5x.
    warned = fill(small, large, "created-small:bloomfilter")
    assert len(warned) == 1
    assert "2.5x its capacity of 1,000:" in warned[0]
    # Created for 100,000 items: a worker stating 1,000 is not warned at all.
    assert fill(large, small, "created-large:bloomfilter") == []


# -- 4. a registry rolled back by a restart -----------------------------------------------


#: The crawling worker's lease TTL: a renewal after a restart may take a retry or two.
TTL = 9.0


@pytest.mark.parametrize("way", ["list", "clear"])
def test_a_registry_restarted_from_an_older_snapshot_is_waited_for_before_a_clear(
    way: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A restart from an older RDB snapshot brings back the registry as it was then (here:
    # empty), while a worker crawls on and renews only every third of its TTL. A reset,
    # a dump or another worker's clear() in that gap found no live worker: a probe's
    # 'reset' deleted the filter 4.9 s after the restart, under two crawling workers. A
    # filter created since the server started is not waited for (test_acl.py lists at once).
    with RedisServer() as server:
        admin = server.client()
        crawling = dupefilter(server.url, BLOOMFILTER_WORKER_TTL=TTL)  # renews every 3 s
        try:
            assert crawling.request_seen(Request("https://example.com/1")) is False
            admin.delete("books:bloomfilter:workers")
            admin.save()  # the registry as the snapshot has it: no worker
            crawling.lease.renew()  # in the registry now, not in the snapshot
            # The filter older than the next server start, past the margin and the second
            # INFO's uptime may be off by (whole seconds, on a cached clock).
            time.sleep(CLOCK_MARGIN + 2.0)
            server.kill()
            server.restart()
            restarted = time.monotonic()
            with caplog.at_level(logging.INFO, logger="scrapy_redis_bloom"):
                if way == "list":
                    config = BloomConfig.from_settings(SMALL)
                    listing = RedisBloomFilter.from_config(
                        server.client(), "books:bloomfilter", config
                    )
                    assert listing.live_workers(settle=TTL) == [crawling.lease.worker_id]
                else:  # SCHEDULER_PERSIST = False: another worker closes
                    closing = RedisBloomFilter.from_config(
                        server.client(), "books:bloomfilter", BloomConfig.from_settings(SMALL)
                    )
                    with closing.lease("closing", ttl=TTL).clearing() as others:
                        assert others == 1
            assert time.monotonic() - restarted < TTL + 2.0
            assert "the workers' leases may not all be back" in caplog.text
            assert server.client().exists("books:bloomfilter:meta")
            assert crawling.request_seen(Request("https://example.com/1")) is True
        finally:
            crawling.close("finished")
            admin.close()


# -- 5. the counters follow the filter's record -------------------------------------------


def test_a_record_deleted_under_a_crawl_is_restored_by_its_workers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Read only at open, the record is what allkeys-lru evicts first. With the shards
    # intact nothing met its loss: in a probe it stayed gone for 31,702 checks and after
    # close, and 'info' then advised deleting the filter's "orphaned bits".
    with RedisServer() as server:
        client = server.client()
        bloom = RedisBloomFilter.from_config(
            client, "books:bloomfilter", BloomConfig.from_settings(SMALL)
        )
        assert bloom.add_many(fingerprints(100)) == [False] * 100
        client.delete("books:bloomfilter:meta")
        with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
            assert bloom.check_and_add(fingerprints(1, "more")[0]) is False
            assert bloom.sync_counters() is not None
        assert client.hget("books:bloomfilter:meta", "id") == bloom.record.filter_id.encode()
        assert bloom.events.counts["restored"] == 1
        assert "was gone (evicted or deleted)" in caplog.text
        assert bloom.totals().added == 101
        client.close()


def test_a_worker_whose_filter_was_reset_adds_no_counts_to_the_next_one() -> None:
    # A probe's worker synced 4,153 "added" after a 'reset --force' deleted its filter: the
    # next filter began with them, its total_added 4,566 against 100 items in its bits.
    with RedisServer() as server:
        client = server.client()
        config = BloomConfig.from_settings(SMALL)
        stale = RedisBloomFilter.from_config(client, "books:bloomfilter", config)
        stale.add_many(fingerprints(50))
        stale.check_and_add(fingerprints(1, "unsynced")[0])  # counted, not synced yet
        RedisBloomFilter.from_config(client, "books:bloomfilter", config).clear()
        fresh = RedisBloomFilter.from_config(client, "books:bloomfilter", config)
        assert fresh.add_many(fingerprints(100, "fresh")) == [False] * 100
        assert stale.sync_counters() is None
        stale.close()
        assert fresh.totals().added == 100
        client.close()


def test_a_registry_whose_server_refuses_info_says_it_cannot_tell_a_restart(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Without INFO the registry's server cannot be told restarted: the listing goes on at
    # once, as before, and says so (the docs promise the log says what INFO would check).
    with RedisServer() as server:
        admin = server.client()
        admin.execute_command("ACL", "SETUSER", "bloom", "on", ">pw", "~*", "+@all", "-info")
        user = redis.Redis(port=server.port, username="bloom", password="pw")
        bloom = RedisBloomFilter.from_config(user, "books", BloomConfig.from_settings(SMALL))
        bloom.open()
        with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
            assert bloom.live_workers() == []
        assert "refuses INFO" in caplog.text
        assert "cannot be told" in caplog.text
        bloom.close()
        admin.close()


def test_a_clear_whose_claim_reply_was_lost_still_clears_and_ends_its_claim(
    redis_server: RedisServer, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """The claim ran in Redis, its reply was lost, the retry found the claim: its own.

    The retry counted the worker's own claim as another live worker: ``clear()`` said
    "1 other worker(s) still use it" and did not clear, the claim stayed a TTL (the next
    worker waited for it), and the next run (``SCHEDULER_PERSIST = False``, which expects
    a fresh filter) took every URL of the last one for seen.
    """

    def is_claim(command: tuple[bytes, ...], reply: bytes) -> bool:
        return command[0] in (b"EVALSHA", b"EVAL") and command[-1] == b"claim"

    urls = [f"https://example.com/{i}" for i in range(50)]
    with ReplyCutter(redis_server.port, cut=is_claim) as cutter:
        df = dupefilter(f"redis://127.0.0.1:{cutter.port}", BLOOMFILTER_WORKER_TTL=10)
        assert not any(df.request_seen(Request(url)) for url in urls)
        cutter.armed = True
        with caplog.at_level(logging.INFO, logger="scrapy_redis_bloom"):
            df.clear()
        assert cutter.cuts  # the claim's reply was lost, and sent again
        assert "still use it" not in caplog.text
        assert redis_client.zrange("books:bloomfilter:workers", 0, -1) == [
            df.lease.worker_id.encode()
        ]  # no claim left behind
        df.close("finished")
    again = dupefilter(redis_server.url)
    try:
        assert not any(again.request_seen(Request(url)) for url in urls)
    finally:
        again.close("finished")


def test_the_worker_registry_has_no_expiry_for_an_eviction_policy_to_pick(
    redis_client: redis.Redis, redis_url: str, opened: list[RFPDupeFilter]
) -> None:
    """Under a volatile-* policy a key with an expiry is a candidate (volatile-ttl's first).

    The registry had one: evicted, it forgot every live worker, and ``reset`` without
    ``--force`` or a closing worker's ``clear()`` deleted the filter under their crawls.
    """
    df = dupefilter(redis_url)
    opened.append(df)
    df.request_seen(Request("https://example.com/"))
    assert redis_client.zcard("books:bloomfilter:workers") == 1
    assert redis_client.pttl("books:bloomfilter:workers") == -1


def test_a_lease_names_the_retry_timeout_as_its_filter_does() -> None:
    """A command's lease failing says whose retry timeout it waited, as the command does.

    The CLI's filter says "(BLOOMFILTER_RETRY_TIMEOUT not set: the command's default = 5 s)";
    the lease it takes to reset said "(BLOOMFILTER_RETRY_TIMEOUT = 5 s)", a setting not set.
    """
    budget = Wording("{BLOOMFILTER_RETRY_TIMEOUT} not set: the command's default")
    faults = FaultPolicy(retry_timeout=0.5, retry_budget=budget)
    with RedisServer() as server:
        client = server.client()
        config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 1_000})
        bloom = RedisBloomFilter.from_config(client, "named", config, faults=faults)
        lease = bloom.lease("cli:1", ttl=30.0)
        server.stop()
        with pytest.raises(FilterUnavailableError) as caught:
            lease.renew()
    said = str(caught.value)
    assert "(BLOOMFILTER_RETRY_TIMEOUT not set: the command's default = 0.5 s)" in said, said
    lease.close()
    bloom.close()
    client.close()
