"""A stalled Redis (SIGSTOP: it keeps its connections and answers nothing) stalls no crawl.

Issue 33, item 1: under ``BLOOMFILTER_ON_ERROR = "allow"`` the first check returns within
the retry timeout and one socket timeout, later checks fail fast (no I/O until a second
has passed since the last attempt), and once Redis answers again what was let through is
added. On a real redis-server of its own, stopped and continued with signals.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator

import mmh3
import pytest
import redis
from redis_cluster import RedisClusterNodes
from redis_server import RedisServer
from reply_cutter import ReplyCutter
from waiting import until_tried

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.core.errors import FilterUnavailableError, WrongTypeError
from scrapy_redis_bloom.core.hashing import locate
from scrapy_redis_bloom.core.settings import FaultPolicy
from scrapy_redis_bloom.engine.base import MIN_OWED
from scrapy_redis_bloom.engine.lease import WorkerLease
from scrapy_redis_bloom.engine.state import FilterTotals
from scrapy_redis_bloom.transport.executor import PROBE_INTERVAL
from scrapy_redis_bloom.transport.topology import make_topology

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
    until_tried(bloom.executor)  # the watch saw Redis answer, or the next attempt is due
    bloom.check_and_add_many(fingerprints(5, "settle"))  # a write that settles what is owed
    # What was let through while Redis stalled is in the filter now, for every worker.
    other = RedisBloomFilter.from_config(client, "stall", config, cache_size=0)
    assert other.contains_many(let_through) == [True] * len(let_through)
    bloom.close()
    other.close()
    client.close()


@pytest.mark.timeout(120)
def test_writes_held_by_a_pause_fail_fast_until_they_run_again(server: RedisServer) -> None:
    """``CLIENT PAUSE WRITE`` (what Redis's ``FAILOVER`` does): reads answer, writes wait.

    The watch asked for a ``PING``, which a write pause answers: the next check then waited a
    socket timeout again, every other second. It asks with a script no one loaded, which a
    write pause holds as it holds the checks: they fail fast until writes run again.
    """
    client = redis.Redis.from_url(server.url, socket_timeout=SOCKET_TIMEOUT)
    config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 20_000, "BLOOMFILTER_SHARDS": 1})
    faults = FaultPolicy(retry_timeout=RETRY_TIMEOUT, on_error="allow")
    bloom = RedisBloomFilter.from_config(client, "paused", config, faults=faults, cache_size=0)
    assert bloom.check_and_add("before") is False
    admin = server.client()
    admin.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
    let_through = fingerprints(80, "paused")
    try:
        started = time.monotonic()
        assert bloom.check_and_add(let_through[0]) is False
        assert time.monotonic() - started <= RETRY_TIMEOUT + SOCKET_TIMEOUT + 0.5
        waits = []
        for element in let_through[1:]:  # 4 s of checks, one every 50 ms
            started = time.monotonic()
            assert bloom.check_and_add(element) is False
            waits.append(time.monotonic() - started)
            time.sleep(0.05)
        assert max(waits) < 0.5, sorted(waits)[-3:]
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
    deadline = time.monotonic() + 10
    added = False
    while not added and time.monotonic() < deadline:  # the watch sees writes run again
        time.sleep(0.5)
        bloom.check_and_add_many(fingerprints(5, f"settle-{time.monotonic()}"))  # settles
        added = bloom.contains_many(let_through) == [True] * len(let_through)
    assert added, "what was let through while writes were held is added once they run"
    bloom.close()
    admin.close()
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
    until_tried(bloom.executor)  # the outage's next attempt is due
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


def test_requests_let_through_past_what_a_worker_remembers_are_said_and_counted(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker remembers at most ``MIN_OWED`` (or its cache size) requests to add later.

    Those past it are forgotten: fetched again if met again, never lost. That is said
    while the crawl runs, in the log and in ``bloomfilter/owed_forgotten``, and the count
    is true: what was remembered is added once Redis answers, and the rest is not.
    """
    client = redis.Redis.from_url(server.url, socket_timeout=SOCKET_TIMEOUT)
    config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 50_000, "BLOOMFILTER_SHARDS": 1})
    faults = FaultPolicy(retry_timeout=0.5, on_error="allow")
    bloom = RedisBloomFilter.from_config(client, "forgot", config, faults=faults, cache_size=0)
    bloom.open()
    owed = fingerprints(MIN_OWED + 25, "owed")
    server.kill()
    assert [bloom.check_and_add(e) for e in owed] == [False] * len(owed)  # let through
    assert bloom.events.counts["owed_forgotten"] == 25
    said = [r.getMessage() for r in caplog.records if "Could not remember" in r.getMessage()]
    assert said[0].startswith("Could not remember 1 request(s) let through")
    server.restart()
    until_tried(bloom.executor)  # the outage's next attempt is due
    bloom.open()  # no persistence: the filter is created again
    bloom.check_and_add_many(fingerprints(5, "settle"))  # this write settles what is owed
    assert bloom.contains_many(owed[:MIN_OWED]) == [True] * MIN_OWED
    assert sum(bloom.contains_many(owed[MIN_OWED:])) <= 2  # false positives only (~1e-3)
    bloom.close()
    client.close()


def watches() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("bloomfilter-watch")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("state", ["fresh", "grown"])
def test_no_call_waits_a_socket_timeout_while_redis_stays_stalled(
    server: RedisServer, state: str
) -> None:
    """Once the first call gave up, a stall of any length costs no call a socket timeout.

    Before the watch thread, the one attempt a second was made by a call of the crawl,
    which waited a socket timeout each time: a crawl under ``allow`` spent a socket
    timeout in every second plus one of a stall.
    """
    client = redis.Redis.from_url(server.url, socket_timeout=SOCKET_TIMEOUT)
    config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 20_000, "BLOOMFILTER_SHARDS": 1})
    faults = FaultPolicy(retry_timeout=0.5, on_error="allow")
    bloom = RedisBloomFilter.from_config(client, "watch", config, faults=faults, cache_size=0)
    if state == "grown":
        bloom.add_many(fingerprints(30_000, "member"))
    assert bloom.check_and_add("before") is False
    let_through = fingerprints(400, "stalled")
    stall(server, True)
    try:
        assert bloom.check_and_add(let_through[0]) is False  # gives up after the timeouts
        assert watches(), "no thread watches the stalled server"
        slowest, started, i = 0.0, time.monotonic(), 1
        while time.monotonic() - started < 4 * SOCKET_TIMEOUT:  # several watch rounds
            began = time.monotonic()
            assert bloom.check_and_add(let_through[i]) is False
            slowest = max(slowest, time.monotonic() - began)
            i += 1
            time.sleep(0.01)
        # No I/O at all: a call that waited for the server would take a socket timeout.
        assert slowest < SOCKET_TIMEOUT / 2, slowest
        began = time.monotonic()
        assert bloom.add_many(fingerprints(50, "bulk")) == [False] * 50  # bulk fails fast too
        assert time.monotonic() - began < SOCKET_TIMEOUT / 2
    finally:
        stall(server, False)
    deadline = time.monotonic() + 10  # the watch sees it answer within a second or so
    while time.monotonic() < deadline:  # until a check is answered by Redis, not let through
        errors = bloom.events.counts["errors"]
        bloom.check_and_add(f"after-{time.monotonic()}")
        if bloom.events.counts["errors"] == errors:
            break
        time.sleep(0.05)
    assert bloom.events.counts["errors"] == errors, "Redis answered, the filter never asked"
    bloom.check_and_add_many(fingerprints(5, "settle"))  # a write that settles what is owed
    other = RedisBloomFilter.from_config(client, "watch", config, cache_size=0)
    assert other.contains_many(let_through[:i]) == [True] * i
    deadline = time.monotonic() + 2  # the watch thread ends after its last line
    while watches() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not watches()  # the watch ended when the server answered
    bloom.close()
    other.close()
    client.close()


def test_what_an_outage_let_through_is_counted_added_once_redis_takes_it(
    server: RedisServer,
) -> None:
    # Each check's write ran but its reply was lost, until the retries ran out: answered
    # "new" and owed. Added once Redis answers, they find their own bits: counted as what
    # they were answered ("new", added), not as "seen".
    config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 20_000, "BLOOMFILTER_SHARDS": 1})
    faults = FaultPolicy(retry_timeout=0.3, on_error="allow")
    owed = fingerprints(3, "late")
    with ReplyCutter(server.port, cut=lambda command, reply: True, times=10_000) as cutter:
        client = redis.Redis(port=cutter.port, socket_timeout=SOCKET_TIMEOUT)
        bloom = RedisBloomFilter.from_config(client, "late", config, faults=faults, cache_size=0)
        bloom.check_and_add("before")
        cutter.armed = True
        assert [bloom.check_and_add(e) for e in owed] == [False] * 3  # let through
        cutter.armed = False
        assert cutter.cuts
        until_tried(bloom.executor)  # the outage's next attempt is due
        assert bloom.check_and_add("after") is False  # adds what it owes first
        assert bloom.sync_counters() == FilterTotals(added=5, seen=0)
        bloom.close()
        client.close()


@pytest.mark.timeout(60)
def test_closing_the_filter_ends_the_watch_of_a_stalled_server(server: RedisServer) -> None:
    client = redis.Redis.from_url(server.url, socket_timeout=SOCKET_TIMEOUT)
    config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 20_000, "BLOOMFILTER_SHARDS": 1})
    faults = FaultPolicy(retry_timeout=0.5, on_error="allow")
    bloom = RedisBloomFilter.from_config(client, "close", config, faults=faults, cache_size=0)
    bloom.check_and_add("before")
    stall(server, True)
    try:
        assert bloom.check_and_add("during") is False
        assert watches()
        bloom.close()
        deadline = time.monotonic() + 2 * SOCKET_TIMEOUT + 2
        while watches() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not watches()
    finally:
        stall(server, False)
        client.close()


@pytest.mark.timeout(180)
def test_a_cluster_failover_that_outlasts_the_retry_timeout_is_followed(
    redis_cluster_replicas: RedisClusterNodes,
) -> None:
    """A master killed for longer than the retry timeout is followed to its replica.

    Once a replica serves its slots, the filter checks with Redis again (the watch of the
    dead master ends when the slot map no longer names it), rather than letting requests
    through for the rest of the crawl.
    """
    nodes = redis_cluster_replicas
    nodes.wait_until_consistent(timeout=20)
    nodes.flushall()
    cluster = nodes.client(socket_timeout=SOCKET_TIMEOUT)
    config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 20_000, "BLOOMFILTER_SHARDS": 6})
    faults = FaultPolicy(retry_timeout=0.5, on_error="allow", on_loss="recreate")
    bloom = RedisBloomFilter.from_config(cluster, "failover", config, faults=faults, cache_size=0)
    bloom.check_and_add_many(fingerprints(100, "before"))
    victim = nodes.masters()[0]
    nodes.wait_for_replication(victim)
    nodes.kill_node(victim)
    try:
        during = fingerprints(300, "during")
        assert bloom.check_and_add_many(during) == [False] * len(during)
        assert bloom.events.counts["errors"] > 0  # the victim's shards were let through
        nodes.wait_for_failover(victim)
        deadline, quiet = time.monotonic() + 30, 0
        while time.monotonic() < deadline and quiet < 50:  # 50 checks in a row by Redis
            errors = bloom.events.counts["errors"]
            bloom.check_and_add(f"after-{time.monotonic()}")
            quiet = quiet + 1 if bloom.events.counts["errors"] == errors else 0
            time.sleep(0.02)
        assert quiet >= 50, "the filter never checked with the promoted replica"
        bloom.check_and_add_many(fingerprints(5, "settle"))  # settles what is owed
        assert bloom.contains_many(during) == [True] * len(during)
    finally:
        bloom.close()
        nodes.restart_node(victim)
        cluster.close()


@pytest.mark.timeout(180)
def test_a_cluster_failover_ridden_through_names_the_node_that_answered(
    redis_cluster_replicas: RedisClusterNodes, caplog: pytest.LogCaptureFixture
) -> None:
    """The WARNING of a check carried out after a failover names the promoted replica.

    It named the dead master as the node that "answered" (the address of the last failed
    round). Now: the node that answered, and that it took over from the one that failed.
    """
    nodes = redis_cluster_replicas
    nodes.wait_until_consistent(timeout=20)
    nodes.flushall()
    cluster = nodes.client(socket_timeout=SOCKET_TIMEOUT)
    config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 20_000, "BLOOMFILTER_SHARDS": 6})
    faults = FaultPolicy(retry_timeout=60)
    bloom = RedisBloomFilter.from_config(cluster, "ridden", config, faults=faults, cache_size=0)
    bloom.check_and_add_many(fingerprints(100, "before"))
    victim = nodes.masters()[0]
    shard = next(s for s, key in enumerate(bloom.shard_keys) if nodes.node_of(key) == victim)
    element = next(f for f in fingerprints(1000, "during") if locate(f, config.spec)[0] == shard)
    nodes.wait_for_replication(victim)
    nodes.kill_node(victim)
    try:
        with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
            assert bloom.check_and_add(element) is False
        promoted = nodes.wait_for_failover(victim)
        retried = [r.getMessage() for r in caplog.records if "of retries" in r.getMessage()]
        # The shards' counts, sent next to another master, may meet CLUSTERDOWN while the
        # cluster votes: a retry of its own, said in a WARNING of its own.
        assert all(m.endswith("carried out.") or "carried out (" in m for m in retried), retried
        said = [m for m in retried if "answered check and add a request" in m]
        assert len(said) == 1, caplog.text
        dead, alive = (f"{host}:{port}" for host, port in (victim, promoted))
        assert said[0].startswith(f"{alive} answered check and add a request after"), said[0]
        assert f"({alive} took over from {dead}: a failover" in said[0]
    finally:
        bloom.close()
        nodes.restart_node(victim)
        cluster.close()


@pytest.mark.timeout(60)
def test_the_worker_lease_knows_the_outage_its_filter_waited_out(server: RedisServer) -> None:
    """A worker closing while Redis stays stalled does not wait out a second retry window.

    The lease renews from a thread of its own, on an executor of its own: before it shared
    its filter's outages, releasing it at close waited its whole retry window and a socket
    timeout (15 s with the defaults) although the filter knew Redis answered nothing.
    """
    client = redis.Redis.from_url(server.url, socket_timeout=SOCKET_TIMEOUT)
    config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 20_000, "BLOOMFILTER_SHARDS": 1})
    faults = FaultPolicy(retry_timeout=RETRY_TIMEOUT, on_error="allow")
    bloom = RedisBloomFilter.from_config(client, "lease", config, faults=faults, cache_size=0)
    bloom.check_and_add("before")
    lease = bloom.lease("worker-1", ttl=30)
    assert lease.renew() == 0
    stall(server, True)
    try:
        assert bloom.check_and_add("during") is False  # waits out the retry window once
        began = time.monotonic()
        with pytest.raises(FilterUnavailableError, match="still failing"):
            lease.release()
        assert time.monotonic() - began < SOCKET_TIMEOUT / 2
    finally:
        stall(server, False)
    deadline = time.monotonic() + 10
    while bloom.events.counts["errors"] and time.monotonic() < deadline:  # until it answers
        errors = bloom.events.counts["errors"]
        bloom.check_and_add(f"after-{time.monotonic()}")
        if bloom.events.counts["errors"] == errors:
            break
        time.sleep(0.05)
    again = bloom.lease("worker-1", ttl=30)
    assert again.renew() == 0  # the lease works again once Redis answers
    again.release()
    bloom.close()
    client.close()


@pytest.mark.timeout(60)
def test_releasing_a_lease_during_an_outage_does_not_wait_for_a_renewal_under_way(
    server: RedisServer,
) -> None:
    """A worker closing while Redis stays stalled does not wait for its lease's renewal.

    The renewal began before its filter's retry window ran out, and holds the lease's
    connections until its own window and a socket timeout are spent: release() and
    close() waited for it (close() went past the retry timeout and a socket timeout by
    that much, up to ~15 s with the defaults). They fail fast now, as the filter does;
    the renewing thread closes the lease's connections when its renewal ends.
    """
    client = redis.Redis.from_url(server.url, socket_timeout=SOCKET_TIMEOUT)
    config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 20_000, "BLOOMFILTER_SHARDS": 1})
    faults = FaultPolicy(retry_timeout=RETRY_TIMEOUT, on_error="allow")
    bloom = RedisBloomFilter.from_config(client, "renewing", config, faults=faults, cache_size=0)
    bloom.check_and_add("before")
    # The lease's own connections wait longer for a reply: a renewal stays under way
    # while the filter's retry window runs out (as one begun just before it does).
    slow = redis.Redis.from_url(server.url, socket_timeout=4 * SOCKET_TIMEOUT + RETRY_TIMEOUT)
    lease = WorkerLease(
        make_topology(slow), "renewing", "worker-1", 3.0, RETRY_TIMEOUT, follows=bloom.executor
    )
    assert lease.start() == 0  # renews every second
    renewing = [t for t in threading.enumerate() if t.name == "bloomfilter-lease-worker-1"]
    stall(server, True)
    try:
        assert bloom.check_and_add("during") is False  # the filter's window runs out
        began = time.monotonic()
        with pytest.raises(FilterUnavailableError, match="still failing"):
            lease.release()
        lease.close()
        assert time.monotonic() - began < SOCKET_TIMEOUT / 2
        assert renewing[0].is_alive()  # its renewal still waits for Redis
    finally:
        stall(server, False)
    renewing[0].join(timeout=10)
    assert not renewing[0].is_alive()  # stopped after that renewal
    bloom.close()
    slow.close()
    client.close()


@pytest.mark.timeout(60)
def test_one_watch_asks_a_stalled_server_for_the_filter_and_its_lease(
    server: RedisServer,
) -> None:
    """The filter and its worker lease share one watch per server: one attempt a second.

    The lease's renewal ran out its window before the filter's did, so it did not follow
    the filter's outage: each started a watch of the same node (two attempts a second,
    where one is allowed). Both wait on the one watch, and both run again when it answers.
    """
    client = redis.Redis.from_url(server.url, socket_timeout=SOCKET_TIMEOUT)
    config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 20_000, "BLOOMFILTER_SHARDS": 1})
    faults = FaultPolicy(retry_timeout=RETRY_TIMEOUT, on_error="allow")
    bloom = RedisBloomFilter.from_config(client, "shared", config, faults=faults, cache_size=0)
    bloom.check_and_add("before")
    lease = bloom.lease("worker-1", ttl=3.0)  # renews every second, within 1 s
    assert lease.start() == 0
    name = f"bloomfilter-watch-127.0.0.1:{server.port}"
    stall(server, True)
    try:
        # The lease's renewal begins within a second, its window ends 1 s later: before the
        # filter's, which the first check below begins.
        assert bloom.check_and_add("during") is False
        failed = bloom.events.counts["lease_failed"]
        deadline = time.monotonic() + 10
        while bloom.events.counts["lease_failed"] == failed and time.monotonic() < deadline:
            time.sleep(0.1)  # until a renewal failed (its window ran out: its own outage)
        assert bloom.events.counts["lease_failed"] > failed
        watches = [t for t in threading.enumerate() if t.name == name]
        assert len(watches) == 1, watches
    finally:
        stall(server, False)
    watches[0].join(timeout=3 * PROBE_INTERVAL)
    assert not watches[0].is_alive()  # it answered: both outages end
    assert lease.renew() == 0
    assert bloom.check_and_add("after") is False
    lease.release()
    bloom.close()
    client.close()


@pytest.mark.timeout(60)
def test_a_lease_that_gave_up_does_not_stop_its_filter_riding_out_the_fault(
    server: RedisServer,
) -> None:
    """The lease's retry window is shorter than its filter's: its outage is not the filter's.

    Redis stalled for longer than the lease's window and shorter than the filter's: the
    lease gives up, the filter rides it out. (When the lease's executor shared its outages
    with the filter, a Sentinel failover that refused writes for 10 s stopped the crawl:
    the filter failed fast on the lease's outage.)
    """
    client = redis.Redis.from_url(server.url, socket_timeout=SOCKET_TIMEOUT)
    config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 20_000, "BLOOMFILTER_SHARDS": 1})
    faults = FaultPolicy(retry_timeout=8)
    bloom = RedisBloomFilter.from_config(client, "ride", config, faults=faults, cache_size=0)
    bloom.check_and_add("before")
    lease = bloom.lease("worker-1", ttl=3)  # retries for a third of its TTL: 1 s
    lease.renew()
    resumed = threading.Timer(3.0, stall, (server, False))
    stall(server, True)
    resumed.start()
    try:
        # Gave up after its 1 s and a socket timeout, naming where that second comes from.
        with pytest.raises(
            FilterUnavailableError, match=r"\(a third of BLOOMFILTER_WORKER_TTL = 1 s\)"
        ):
            lease.renew()
        assert resumed.is_alive()  # Redis still stalled: the filter's turn
        assert bloom.check_and_add("during") is False  # retried until Redis answered
        assert bloom.events.counts["errors"] == 0
    finally:
        resumed.join()
    assert bloom.contains("during") is True
    # The lease's own gate still holds its last failure (one attempt a second): its give-up
    # may have ended as late as Redis resumed, so the release waits for its next attempt.
    until_tried(lease._executor)
    assert lease.release() == 0
    bloom.close()
    client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("answers", [True, False], ids=["answers-again", "still-stalled"])
def test_what_is_owed_at_close_is_added_or_said_forgotten(
    server: RedisServer, answers: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker that closes before its next write still adds what an outage let through.

    It was added only with a later write: a crawl that ended during (or just after) the
    outage left it out, with no line and no stat (137 of 400 fetched pages missing from
    the filter after a 2-worker crawl, a probe). At close, what Redis takes is added; what
    it does not is said and counted in ``bloomfilter/owed_forgotten``.
    """
    client = redis.Redis.from_url(server.url, socket_timeout=SOCKET_TIMEOUT)
    config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 20_000, "BLOOMFILTER_SHARDS": 1})
    faults = FaultPolicy(retry_timeout=1, on_error="allow")
    bloom = RedisBloomFilter.from_config(client, "owed", config, faults=faults, cache_size=0)
    bloom.check_and_add("before")
    owed = fingerprints(50, "owed")
    stall(server, True)
    try:
        assert [bloom.check_and_add(e) for e in owed] == [False] * len(owed)  # let through
        if answers:
            stall(server, False)
            until_tried(bloom.executor)  # the outage's next attempt is due
        with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
            bloom.close()
    finally:
        stall(server, False)
    other = RedisBloomFilter.from_config(redis.Redis.from_url(server.url), "owed", config)
    found = sum(other.contains_many(owed))
    forgotten = bloom.events.counts["owed_forgotten"]
    if answers:
        assert found == len(owed)
        assert forgotten == 0
    else:
        assert found + forgotten >= len(owed)  # (the command in flight may have landed)
        assert forgotten > 0
        said = [r.getMessage() for r in caplog.records if "may be fetched again" in r.getMessage()]
        assert said, caplog.text
    client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("state", ["fresh", "grown"])
def test_a_bulk_call_on_a_stalled_redis_ends_within_the_retry_timeout(
    server: RedisServer, state: str
) -> None:
    """Bulk calls have several ways to Redis (a snapshot, its chunks, the executor's retries).

    Each waited its own socket timeout, and the last opened a fresh retry window: 5.1 s for
    a bound of 3 (retry 2 s, socket 1 s) in a probe. The retry window now counts from the
    first attempt that failed, whichever way it went.
    """
    client = redis.Redis.from_url(server.url, socket_timeout=SOCKET_TIMEOUT)
    config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 20_000, "BLOOMFILTER_SHARDS": 2})
    faults = FaultPolicy(retry_timeout=RETRY_TIMEOUT, on_error="allow")
    bloom = RedisBloomFilter.from_config(client, "bulkstall", config, faults=faults, cache_size=0)
    if state == "grown":
        bloom.add_many(fingerprints(60_000, "grow"))
    bloom.add_many(fingerprints(1_000, "before"))
    stall(server, True)
    try:
        started = time.monotonic()
        answers = bloom.add_many(fingerprints(1_000, "during"))
        took = time.monotonic() - started
    finally:
        stall(server, False)
    assert answers == [False] * 1_000  # let through, "new"
    assert took <= RETRY_TIMEOUT + SOCKET_TIMEOUT + 0.5, took
    bloom.close()
    client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", ["fresh", "grown", "batch"])
def test_a_stall_shorter_than_the_socket_timeout_is_said_and_counted(
    server: RedisServer, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    """A reply that took seconds, without failing, is a WARNING and ``slow_replies``.

    Below the socket timeout nothing failed, so nothing said it: three 4.5 s stalls stopped a
    two-worker crawl for 13 s with no line and no stat (the hot path's one command, a grown
    shard's reads, a batch's round alike).
    """
    client = redis.Redis.from_url(server.url, socket_timeout=5.0)
    config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 2_000, "BLOOMFILTER_SHARDS": 1})
    bloom = RedisBloomFilter.from_config(client, "slow", config, cache_size=0)
    if path == "grown":
        bloom.add_many(fingerprints(6_000, "member"))
    assert bloom.check_and_add("before") is False
    assert bloom.events.counts["slow_replies"] == 0  # (a fresh filter's first calls too)
    # 2 s: a call sent up to a second late still waits past SLOW_REPLY (1 s) for its reply.
    paused = server.pause(2.0)
    with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
        if path == "batch":
            assert bloom.check_and_add_many(fingerprints(50, "during")) == [False] * 50
        else:
            assert bloom.check_and_add(fingerprints(1, "during")[0]) is False
    paused.join()
    said = [r.getMessage() for r in caplog.records if " s to answer " in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert said[0].startswith(f"Redis at 127.0.0.1:{server.port} took "), said[0]
    took = float(said[0].split(" took ", 1)[1].split(" s", 1)[0])
    assert 1.0 <= took < 3.0, said[0]  # the 2 s pause, less what passed before the call
    operation = "a batch of requests" if path == "batch" else "a request"
    assert f"to answer a call to check and add {operation}, and the call" in said[0], said[0]
    assert bloom.events.counts["slow_replies"] == 1
    assert bloom.events.counts["retries"] == 0  # nothing failed
    bloom.close()
    client.close()


@pytest.mark.timeout(60)
def test_a_batch_ridden_through_a_stall_says_how_long_it_waited(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The WARNING of a batch retried through a stall counts its first socket timeout.

    It said "after 0.9 s of retries" for a 6 s stall (the time since the first round had
    timed out); a single check said 6.0 s.
    """
    client = redis.Redis.from_url(server.url, socket_timeout=SOCKET_TIMEOUT)
    config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 2_000, "BLOOMFILTER_SHARDS": 1})
    faults = FaultPolicy(retry_timeout=10)
    bloom = RedisBloomFilter.from_config(client, "batch", config, faults=faults, cache_size=0)
    assert bloom.check_and_add("before") is False
    stall = 3.0
    paused = server.pause(stall)
    with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
        assert bloom.check_and_add_many(fingerprints(50, "during")) == [False] * 50
    paused.join()
    said = [r.getMessage() for r in caplog.records if "of retries" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert " answered check and add a batch of requests after " in said[0], said[0]
    waited = float(said[0].split(" after ")[1].split(" s of retries")[0])
    # From the first round's send (the stall, less what passed before it: up to 0.6 s on a
    # loaded machine), not from its timeout (a socket timeout less: 2 s at most).
    assert waited >= stall - 0.6, said[0]
    bloom.close()
    client.close()


@pytest.mark.timeout(120)
def test_a_big_batch_that_nothing_stalled_is_not_said_as_a_stall(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch's round of many commands takes its time without a stall: nothing is said.

    The threshold was one second per call whatever it carried: a ``check_and_add_many`` of
    100,000 on loopback took 1.1 s for its round and was said as "a stall" and counted in
    ``slow_replies``, 300,000 twice (a bulk user's every call).
    """
    client = redis.Redis.from_url(server.url)
    config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 1_000_000})
    bloom = RedisBloomFilter.from_config(client, "big", config, cache_size=0)
    batch = fingerprints(300_000, "big")
    with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
        began = time.monotonic()
        assert not any(bloom.check_and_add_many(batch))
        took = time.monotonic() - began
    said = [r.getMessage() for r in caplog.records if " s to answer " in r.getMessage()]
    assert took > 1.0, took  # (else the batch was no test of the threshold)
    assert said == [], said
    assert bloom.events.counts["slow_replies"] == 0
    bloom.close()
    client.close()


@pytest.mark.timeout(60)
def test_a_stall_met_by_scrapy_redis_queue_is_said_and_counted(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """scrapy_redis_bloom's Scheduler times its queue's calls: the crawl waits for them too.

    A 4 s SIGSTOP of Redis mid-crawl that met scrapy-redis's pop (``next_request``) paused
    the crawl with no line and no stat: the filter's calls, which say their own stalls, were
    not waiting. A blocking pop's own wait (``SCHEDULER_IDLE_BEFORE_CLOSE``) is not a stall.
    """
    from scrapy import Request
    from test_dupefilter import crawler_for, redis_scheduler

    from scrapy_redis_bloom.scheduler import Scheduler

    ours = "scrapy_redis_bloom.scheduler.Scheduler"
    crawler = crawler_for(server.url, SCHEDULER=ours, SCHEDULER_IDLE_BEFORE_CLOSE=0)
    scheduler, _ = redis_scheduler(crawler, Scheduler)
    events = scheduler.df.bloom.events
    assert scheduler.enqueue_request(Request("https://example.com/1"))
    assert events.counts["queue_slow_replies"] == 0
    paused = server.pause(2.0)
    with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
        request = scheduler.next_request()
    paused.join()
    assert request is not None
    assert request.url == "https://example.com/1"
    said = [r.getMessage() for r in caplog.records if "scrapy-redis's queue" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert said[0].startswith(f"Redis at 127.0.0.1:{server.port} took "), said[0]
    assert "to pop a request from scrapy-redis's queue ('books:requests')" in said[0], said[0]
    assert events.counts["queue_slow_replies"] == 1
    assert events.counts["slow_replies"] == 0  # the filter waited for nothing
    # A push, and the length the engine asks for, alike (said once a minute, all counted).
    paused = server.pause(2.0)
    assert scheduler.enqueue_request(Request("https://example.com/2", dont_filter=True))
    paused.join()
    paused = server.pause(2.0)
    assert scheduler.has_pending_requests()
    paused.join()
    assert events.counts["queue_slow_replies"] == 3
    scheduler.close("finished")
    scheduler.df.close("finished")

    # A blocking pop on an empty queue waits SCHEDULER_IDLE_BEFORE_CLOSE: not a stall.
    fifo = "scrapy_redis.queue.FifoQueue"  # (the default PriorityQueue's pop does not block)
    crawler = crawler_for(
        server.url, SCHEDULER=ours, SCHEDULER_IDLE_BEFORE_CLOSE=2, SCHEDULER_QUEUE_CLASS=fifo
    )
    scheduler, _ = redis_scheduler(crawler, Scheduler)
    scheduler.queue.clear()
    started = time.monotonic()
    assert scheduler.next_request() is None
    assert time.monotonic() - started >= 1.9  # (it did wait)
    assert scheduler.df.bloom.events.counts["queue_slow_replies"] == 0
    # A stall past that wait is one, said whole (a request there: the pop did not wait).
    assert scheduler.enqueue_request(Request("https://example.com/3"))
    caplog.clear()
    paused = server.pause(4.0)
    with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
        assert scheduler.next_request() is not None
    paused.join()
    said = [r.getMessage() for r in caplog.records if "scrapy-redis's queue" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert "(a blocking pop waits up to 2 s of it for a request)" in said[0], said[0]
    took = float(said[0].split(" took ", 1)[1].split(" s", 1)[0])
    assert 3.0 < took < 5.0, said[0]
    assert scheduler.df.bloom.events.counts["queue_slow_replies"] == 1
    scheduler.close("finished")
    scheduler.df.close("finished")
