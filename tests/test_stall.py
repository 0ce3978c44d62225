"""A stalled Redis (SIGSTOP: it keeps its connections and answers nothing) stalls no crawl.

Issue 33, item 1: under ``BLOOMFILTER_ON_ERROR = "allow"`` the first check returns within
the retry timeout and one socket timeout, later checks fail fast (no I/O until a second
has passed since the last attempt), and once Redis answers again what was let through is
added. On a real redis-server of its own, stopped and continued with signals.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from collections.abc import Iterator

import mmh3
import pytest
import redis
from redis_server import RedisServer

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.core.errors import WrongTypeError
from scrapy_redis_bloom.core.settings import FaultPolicy

SOCKET_TIMEOUT = 1.0
RETRY_TIMEOUT = 2.0


def fingerprints(n: int, tag: str) -> list[str]:
    return [hashlib.sha1(f"{tag}-{i}".encode()).hexdigest() for i in range(n)]


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


def stall(server: RedisServer, stopped: bool) -> None:
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP if stopped else signal.SIGCONT)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("state", ["fresh", "grown", "windows"])
def test_a_stalled_redis_answers_new_fast_then_adds_what_it_let_through(
    server: RedisServer, state: str
) -> None:
    client = redis.Redis.from_url(server.url, socket_timeout=SOCKET_TIMEOUT)
    settings = {"BLOOMFILTER_CAPACITY": 20_000, "BLOOMFILTER_SHARDS": 1}
    if state == "windows":
        settings["BLOOMFILTER_TTL"] = 3600
    config = BloomConfig.from_settings(settings)
    faults = FaultPolicy(retry_timeout=RETRY_TIMEOUT, on_error="allow")
    bloom = RedisBloomFilter.from_config(client, "stall", config, faults=faults, cache_size=0)
    if state != "fresh":
        bloom.add_many(fingerprints(30_000, "member"))  # grown (or a window's 1.5x)
    assert bloom.check_and_add("before") is False
    let_through = fingerprints(200, "stalled")
    stall(server, True)
    try:
        started = time.monotonic()
        assert bloom.check_and_add(let_through[0]) is False
        first = time.monotonic() - started
        # The retry timeout, and one socket timeout for the attempt under way then.
        assert first <= RETRY_TIMEOUT + SOCKET_TIMEOUT + 0.5, first
        started = time.monotonic()
        answers = [bloom.check_and_add(e) for e in let_through[1:]]
        later = time.monotonic() - started
        # Fail fast: at most one attempt a second, each a socket timeout at most.
        attempts = later / 1.0 + 1
        assert later <= attempts * (SOCKET_TIMEOUT + 0.1) + 0.5, later
        assert later < 5.0, later
        assert answers == [False] * len(answers)
        assert bloom.events.counts["errors"] >= len(let_through)
    finally:
        stall(server, False)
    time.sleep(1.1)  # the next attempt is due
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # bounded: Redis answers again at once
        if bloom.check_and_add(fingerprints(1, f"after-{time.monotonic()}")[0]) is False:
            break
    bloom.check_and_add_many(fingerprints(5, "settle"))  # a write that settles what is owed
    # What was let through while Redis stalled is in the filter now, for every worker.
    other = RedisBloomFilter.from_config(client, "stall", config, cache_size=0)
    assert other.contains_many(let_through) == [True] * len(let_through)
    bloom.close()
    other.close()
    client.close()


def test_requests_owed_after_an_outage_are_kept_when_adding_them_fails_otherwise(
    server: RedisServer,
) -> None:
    """Issue 33: ``_settle`` dropped what it owed on any error but unavailable or refused."""
    client = redis.Redis.from_url(server.url, socket_timeout=SOCKET_TIMEOUT)
    config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 20_000, "BLOOMFILTER_SHARDS": 2})
    faults = FaultPolicy(retry_timeout=0.5, on_error="allow")
    bloom = RedisBloomFilter.from_config(client, "owed", config, faults=faults, cache_size=0)

    def on_shard_0(tag: str) -> list[str]:
        return [e for e in fingerprints(20, tag) if mmh3.hash64(e, signed=False)[0] % 2 == 0]

    bloom.open()
    owed = fingerprints(20, "owed")
    server.kill()
    assert [bloom.check_and_add(e) for e in owed] == [False] * len(owed)  # let through
    server.restart()
    shard = "{owed:1}:g0"
    assert not client.exists(shard)  # no persistence: the filter is gone, recreated next
    time.sleep(1.1)  # the outage's next attempt is due
    bloom.open()
    client.delete(shard)
    client.rpush(shard, "not a bitmap")  # another program took shard 1's key
    # A write on shard 0 goes through; adding what is owed (on both shards) fails.
    with pytest.raises(WrongTypeError):
        bloom.check_and_add_many(on_shard_0("later"))
    client.delete(shard)
    bloom.clear()
    bloom.check_and_add_many(on_shard_0("again"))  # this settle adds them
    assert bloom.contains_many(owed) == [True] * len(owed)
    bloom.close()
    client.close()
