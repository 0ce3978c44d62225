# ruff: noqa: E501  (the tables of bad values read best one case a line)
"""Sentinel: one REDIS_PARAMS gives scrapy-redis's queue and the filter the same primary.

Real processes (:mod:`redis_sentinel`): a primary, a replica and three sentinels (quorum
2, ``down-after-milliseconds`` 1000). The settings are checked first, with no server;
then the filter follows a failover and accepts the promoted replica as the same filter;
then two workers crawl a :class:`website.TreeSite` (every page linked from one other only,
so a dropped link is a lost page, counted on the site's side) while the primary is failed
over gracefully (``SENTINEL FAILOVER``) or SIGKILLed. A first-listed Sentinel stopped or
killed costs a worker one short wait, said by its address.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis_sentinel import SERVICE, SentinelGroup
from redis_server import RedisServer, free_port
from shared_crawl import Crawl, run_workers
from website import SiteServer, TreeSite

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.core.errors import FilterUnavailableError, UnsupportedServerError
from scrapy_redis_bloom.core.settings import ConnectionConfig, FaultPolicy
from scrapy_redis_bloom.scrapy.connection import filter_clients, scrapy_redis_client
from scrapy_redis_bloom.transport.sentinel import SENTINEL_TIMEOUT, SentinelRedis

PAGES = 400

# -- settings, no server ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"BLOOMFILTER_REDIS_SENTINELS": ["a:26379"]}, r"^The BLOOMFILTER_REDIS_SENTINELS setting needs BLOOMFILTER_REDIS_SENTINEL_SERVICE"),
        ({"BLOOMFILTER_REDIS_SENTINEL_SERVICE": "m"}, r"^The BLOOMFILTER_REDIS_SENTINEL_SERVICE setting needs BLOOMFILTER_REDIS_SENTINELS"),
        ({"BLOOMFILTER_REDIS_SENTINELS": [], "BLOOMFILTER_REDIS_SENTINEL_SERVICE": "m"}, r"^The value of the BLOOMFILTER_REDIS_SENTINELS setting \(\[\]\) is invalid\. It must be a non-empty list"),
        ({"BLOOMFILTER_REDIS_SENTINELS": ["a"], "BLOOMFILTER_REDIS_SENTINEL_SERVICE": "m"}, r"Its entry 'a' is no host:port"),
        ({"BLOOMFILTER_REDIS_SENTINELS": ["a:0"], "BLOOMFILTER_REDIS_SENTINEL_SERVICE": "m"}, r"Its entry 'a:0' is no host:port"),
        ({"BLOOMFILTER_REDIS_SENTINELS": [("a", "x")], "BLOOMFILTER_REDIS_SENTINEL_SERVICE": "m"}, r"Its entry \('a', 'x'\) is no host:port"),
        ({"BLOOMFILTER_REDIS_SENTINELS": "a:1,a:1", "BLOOMFILTER_REDIS_SENTINEL_SERVICE": "m"}, r"the same Sentinel more than once"),
        ({"BLOOMFILTER_REDIS_SENTINELS": ["a:1"], "BLOOMFILTER_REDIS_SENTINEL_SERVICE": ""}, r"^The value of the BLOOMFILTER_REDIS_SENTINEL_SERVICE setting \(''\) is invalid\. It must be the name"),
        ({"BLOOMFILTER_REDIS_SENTINELS": ["a:1"], "BLOOMFILTER_REDIS_SENTINEL_SERVICE": "m", "BLOOMFILTER_REDIS_URL": "redis://b"}, r"BLOOMFILTER_REDIS_SENTINELS contradicts BLOOMFILTER_REDIS_URL"),
        ({"BLOOMFILTER_REDIS_SENTINELS": ["a:1"], "BLOOMFILTER_REDIS_SENTINEL_SERVICE": "m", "BLOOMFILTER_REDIS_PARAMS": {"port": 6380}}, r"remove 'port'"),
        ({"BLOOMFILTER_REDIS_SENTINELS": ["a:1"], "BLOOMFILTER_REDIS_SENTINEL_SERVICE": "m", "BLOOMFILTER_REDIS_PARAMS": {"sentinel_kwargs": {"socket_timeout": "x"}}}, r"BLOOMFILTER_REDIS_PARAMS\['sentinel_kwargs'\] setting .* Its 'socket_timeout' must be a number"),
    ],
)  # fmt: skip
def test_bad_sentinel_settings_are_refused_by_name(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BloomConfig.from_settings(settings)


def test_sentinel_settings_are_read() -> None:
    settings = {
        "BLOOMFILTER_REDIS_SENTINELS": "10.0.0.1:26379, 10.0.0.2:26380",
        "BLOOMFILTER_REDIS_SENTINEL_SERVICE": "bloom",
        "BLOOMFILTER_REDIS_PARAMS": {"password": "secret", "db": 2},
    }
    connection = ConnectionConfig.from_settings(settings)
    assert connection.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26380))
    assert connection.service == "bloom"
    assert connection.urls == ()
    [client] = filter_clients(connection, settings)  # made, not connected
    assert isinstance(client, SentinelRedis)
    assert (
        repr(client) == "<SentinelRedis(service=bloom, sentinels=[10.0.0.1:26379,10.0.0.2:26380])>"
    )
    assert client.connection_pool.connection_kwargs["db"] == 2
    client.close()


def test_scrapy_redis_builds_it_from_redis_params_without_a_warning() -> None:
    from scrapy.settings import Settings
    from scrapy_redis.connection import get_redis_from_settings

    from scrapy_redis_bloom.transport.sentinel import FAILOVER_RETRIES

    params = {"redis_cls": "scrapy_redis_bloom.sentinel.SentinelRedis", "sentinels": ["a:1"]}
    # pytest turns warnings into errors: redis-py's deprecation of retry_on_timeout too.
    client = get_redis_from_settings(Settings({"REDIS_PARAMS": {**params, "service_name": "m"}}))
    try:
        assert isinstance(client, SentinelRedis)
        kwargs = client.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == 30  # scrapy-redis's defaults reach the primary
        assert "retry_on_timeout" not in kwargs
        assert kwargs["retry"].get_retries() == FAILOVER_RETRIES
    finally:
        client.close()


def test_an_unknown_client_argument_names_the_filter_setting() -> None:
    settings = {
        "BLOOMFILTER_REDIS_SENTINELS": ["a:1"],
        "BLOOMFILTER_REDIS_SENTINEL_SERVICE": "m",
        "BLOOMFILTER_REDIS_PARAMS": {"password": "pw-not-shown", "bogus": 1},
    }
    with pytest.raises(
        ValueError,
        match=r"^The Redis client refuses the arguments of the BLOOMFILTER_REDIS_PARAMS setting .*'bogus': 1",
    ) as refused:
        filter_clients(ConnectionConfig.from_settings(settings), settings)
    assert "pw-not-shown" not in str(refused.value)


@pytest.mark.parametrize(
    ("params", "url", "message"),
    [
        ({"service_name": "m"}, None, r"^The REDIS_PARAMS setting gives redis_cls SentinelRedis without sentinels"),
        ({"sentinels": ["a:1"]}, None, r"without service_name"),
        ({"sentinels": ["a:1"], "service_name": "m", "host": "b"}, None, r"remove 'host'"),
        ({"sentinels": ["a:1"], "service_name": "m", "no_such_argument": 1}, None, r"^The Redis client refuses the arguments of the REDIS_PARAMS setting .*'no_such_argument': 1\}\) for the Sentinel-managed primary: .*unexpected keyword argument 'no_such_argument'"),
        ({"sentinels": "a", "service_name": "m"}, None, r"REDIS_PARAMS\['sentinels'\] setting \('a'\) is invalid"),
        ({"sentinels": ["a:1"], "service_name": "m"}, "redis://b:6379", r"^The REDIS_URL setting names one server"),
    ],
)  # fmt: skip
def test_bad_redis_params_for_sentinel_are_refused(
    params: dict[str, Any], url: str | None, message: str
) -> None:
    settings = {
        "REDIS_PARAMS": {"redis_cls": "scrapy_redis_bloom.sentinel.SentinelRedis", **params}
    }
    if url:
        settings["REDIS_URL"] = url
    with pytest.raises(ValueError, match=message):
        scrapy_redis_client(settings)


# -- real sentinels -----------------------------------------------------------------------


#: What keeps a primary from taking writes once its replica was promoted (see README,
#: Sentinel): it must have one replica, acknowledging within 10 s.
MIN_REPLICAS = ("--min-replicas-to-write", "1", "--min-replicas-max-lag", "10")


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    # Down after 2 s, not 1: on a busy 2-vCPU machine a just-promoted primary was once
    # taken for down within a second, and failed over to the restarted empty server.
    with SentinelGroup(server_args=MIN_REPLICAS, down_after_ms=2000) as started:
        yield started


def sentinel_params(group: SentinelGroup, **more: Any) -> dict[str, Any]:
    """REDIS_PARAMS for scrapy-redis and the filter: the group's primary, by Sentinel."""
    return {
        "redis_cls": "scrapy_redis_bloom.sentinel.SentinelRedis",
        "sentinels": group.addresses,
        "service_name": SERVICE,
        **more,
    }


def wait_replicated(group: SentinelGroup, timeout: float = 10.0) -> None:
    """Wait (bounded) until the replica has every write the primary has."""
    primary = group.primary()
    replica = next(s for s in group.servers if s is not primary and s.running)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        offset = primary.info("replication")["master_repl_offset"]
        if replica.info("replication").get("slave_repl_offset", -1) >= offset:
            return
        time.sleep(0.05)
    raise AssertionError("the replica did not catch up")


@pytest.mark.timeout(120)
def test_the_filter_follows_a_failover_and_keeps_its_identity(
    group: SentinelGroup, caplog: pytest.LogCaptureFixture
) -> None:
    settings = {
        "BLOOMFILTER_REDIS_SENTINELS": group.addresses,
        "BLOOMFILTER_REDIS_SENTINEL_SERVICE": SERVICE,
        "BLOOMFILTER_CAPACITY": 10_000,
        "BLOOMFILTER_ERROR_RATE": 1e-6,
    }
    config = BloomConfig.from_settings(settings)
    clients = filter_clients(config.connection, settings)
    # No near-cache: every answer below comes from Redis.
    bloom = RedisBloomFilter.from_config(clients[0], "sentinel:bloomfilter", config, cache_size=0)
    try:
        record = bloom.open()
        assert bloom.topology.describe() == f"Redis at {SERVICE} (Sentinel)"
        before = [f"{i:040x}" for i in range(200)]
        assert bloom.check_and_add_many(before) == [False] * 200  # none was there
        wait_replicated(group)
        old = group.failover()
        new = group.wait_for_failover(old)
        assert new is not old
        # The first write meets the old primary, which refuses it (NOREPLICAS: its replica
        # left): the connection is dropped, and the retry goes to the new primary. Its
        # reply is in doubt, so it answers "new" (a possible duplicate, never a loss).
        assert bloom.check_and_add_many(["f" * 40]) == [False]
        # Every fingerprint the old primary had is on the promoted replica: seen.
        assert bloom.check_and_add_many(before) == [True] * 200
        after = [f"{i:040x}" for i in range(200, 300)]
        assert bloom.check_and_add_many(after) == [False] * 100
        assert new.client().exists("sentinel:bloomfilter:meta")
        # A worker opening it now finds the same filter: not refused, not recreated.
        [client] = filter_clients(config.connection, settings)
        again = RedisBloomFilter.from_config(client, "sentinel:bloomfilter", config, cache_size=0)
        assert again.open().filter_id == record.filter_id
        assert again.check_and_add_many(after) == [True] * 100
        assert not again.events.counts
        again.close()
        client.close()
    finally:
        bloom.close()
        for client in clients:
            client.close()
    assert not set(bloom.events.counts) & {"recreated", "restored", "reopened", "errors"}
    assert bloom.events.counts["failovers"] == 1
    assert "a failover" in caplog.text
    assert f"{new.port}" in caplog.text


# -- crawls through a failover -------------------------------------------------------------


@pytest.fixture
def site() -> Iterator[SiteServer]:
    # 30 ms per page: the crawl lasts a few seconds, so the fault lands in the middle.
    with SiteServer(TreeSite(PAGES), delay=0.03) as server:
        yield server


def crawl_through(
    group: SentinelGroup, site: SiteServer, tmp_path: Path, fault: str
) -> tuple[Crawl, dict[str, Any]]:
    """Two workers crawl with queue and filter on the group's primary; ``fault`` hits it."""
    settings = {
        "REDIS_URL": None,  # the runner's base URL: the sentinels name the primary instead
        "REDIS_PARAMS": sentinel_params(group),
        "BLOOMFILTER_CAPACITY": 100_000,
        "BLOOMFILTER_ERROR_RATE": 1e-6,
        # After a kill, the new primary takes writes once the restarted server is its
        # replica (min-replicas-to-write): Sentinel takes 15-20 s to make it one, more
        # on a loaded machine. The workers wait that long, as scrapy-redis's queue does.
        "BLOOMFILTER_RETRY_TIMEOUT": 60,
        # Meanwhile the reactor waits in request_seen: a download in flight must outlast
        # that wait, as it would by Scrapy's retries (the runner turns them off). At the
        # runner's 20 s, a failover of 19 s on a busy machine timed out 26 pages unsent.
        "DOWNLOAD_TIMEOUT": 150,
        # And the crawl may outlast the runner's 60 s (a loaded machine's slow reconfiguration),
        # up to just under run_workers' 120 s.
        "CLOSESPIDER_TIMEOUT": 110,
    }
    watcher = SentinelRedis(sentinels=group.addresses, service_name=SERVICE, socket_timeout=5)
    seen: dict[str, Any] = {}

    def failover() -> None:
        time.sleep(1.0)
        seen["hits_before"] = sum(site.hits_snapshot().values())
        old = group.failover() if fault == "failover" else group.kill_primary()
        started = time.monotonic()
        group.wait_for_failover(old)
        seen["failover_seconds"] = round(time.monotonic() - started, 2)
        seen["hits_at_failover"] = sum(site.hits_snapshot().values())
        if fault == "kill":
            # As a supervisor would: the server comes back (empty), and the sentinels make
            # it the new primary's replica, which min-replicas-to-write waits for.
            old.restart()
            group.wait_for_replica(timeout=90)
            seen["writable_after"] = round(time.monotonic() - started, 2)

    try:
        done = run_workers(site, group.primary().url, tmp_path, settings, watcher, during=failover)
    finally:
        watcher.close()
    return done, seen


def report(site: SiteServer, done: Crawl, seen: dict[str, Any]) -> dict[str, Any]:
    served = site.hits_snapshot()
    lost = {url for url in site.reachable_urls() if served[url.removeprefix(site.url)] == 0}
    figures = {
        "lost": len(lost),
        "duplicates": sum(n - 1 for n in served.values() if n > 1),
        "retries": done.stat("bloomfilter/retries"),
        "ambiguous": done.stat("bloomfilter/ambiguous"),
        "failovers": done.stat("bloomfilter/failovers"),
        **seen,
    }
    print(figures)
    return figures


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fault", ["failover", "kill"])
def test_a_crawl_through_a_failover_loses_no_page(
    fault: str, group: SentinelGroup, site: SiteServer, tmp_path: Path
) -> None:
    done, seen = crawl_through(group, site, tmp_path, fault)
    figures = report(site, done, seen)
    for result in done.results:
        assert result["error"] is None, result["error"]
        assert result["stats"]["finish_reason"] == "finished"
    assert figures["lost"] == 0
    assert done.lost(site) == set()
    # The fault happened mid-crawl, and the filter says so in its stats and its log.
    assert 0 < seen["hits_before"] < PAGES
    assert done.stat("bloomfilter/failovers") >= 1
    assert any("(a failover): the Bloom filter follows it" in log for log in done.logs)


# -- a Sentinel list that names no Sentinel --------------------------------------------------


def _open_through(sentinel: str, retry_timeout: float) -> RedisBloomFilter:
    settings = {
        "BLOOMFILTER_REDIS_SENTINELS": [sentinel],
        "BLOOMFILTER_REDIS_SENTINEL_SERVICE": SERVICE,
        "BLOOMFILTER_RETRY_TIMEOUT": retry_timeout,
        "BLOOMFILTER_CAPACITY": 1000,
    }
    config = BloomConfig.from_settings(settings)
    clients = filter_clients(ConnectionConfig.from_settings(settings), settings)
    return RedisBloomFilter.from_config(
        clients, "bf", config, faults=FaultPolicy.from_settings(settings)
    )


def test_a_server_that_is_no_sentinel_is_named_at_once(redis_server: RedisServer) -> None:
    """A plain Redis listed as a Sentinel: said so (it was advised to list it where it was)."""
    address = f"127.0.0.1:{redis_server.port}"
    bloom = _open_through(address, retry_timeout=30)
    started = time.monotonic()
    with pytest.raises(UnsupportedServerError) as refused:
        bloom.open()
    assert time.monotonic() - started < 10  # a setting to fix: not retried for 30 s
    assert str(refused.value).startswith(
        f"Redis at {address}, listed in BLOOMFILTER_REDIS_SENTINELS, is not a Sentinel"
        " (unknown command SENTINEL)"
    )
    assert "goes in BLOOMFILTER_REDIS_SENTINELS" not in str(refused.value)
    bloom.close()


def test_an_unreachable_sentinel_is_named_by_address() -> None:
    """redis-py's message carried each Sentinel client's repr: about 1,000 characters."""
    address = f"127.0.0.1:{free_port()}"
    bloom = _open_through(address, retry_timeout=0)
    with pytest.raises(FilterUnavailableError) as failed:
        bloom.open()
    message = str(failed.value)
    assert f"no Sentinel at {address} answered (" in message
    assert "<redis." not in message
    assert len(message) < 400, message
    bloom.close()


# -- a Sentinel down ----------------------------------------------------------------------


def test_the_sentinels_get_short_timeouts_unless_sentinel_kwargs_sets_them() -> None:
    """Not the primary's (redis-py's rule): a stopped Sentinel cost every client 11 x 5 s."""
    settings = {
        "BLOOMFILTER_REDIS_SENTINELS": ["a:1"],
        "BLOOMFILTER_REDIS_SENTINEL_SERVICE": "m",
        "BLOOMFILTER_REDIS_PARAMS": {"socket_timeout": 7.0, "socket_keepalive": True},
    }
    [client] = filter_clients(ConnectionConfig.from_settings(settings), settings)
    [sentinel] = client.sentinel_manager.sentinels
    kwargs = sentinel.connection_pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (SENTINEL_TIMEOUT,) * 2
    assert kwargs["socket_keepalive"] is True  # the primary's other socket options, as before
    assert kwargs["retry"].get_retries() == 0  # the next Sentinel is asked instead
    assert client.connection_pool.connection_kwargs["socket_timeout"] == 7.0
    client.close()
    # What sentinel_kwargs sets is kept, its timeouts read as redis-py reads them (a connect
    # timeout left out is none of ours); no retry unless it sets one.
    for given in ({"socket_timeout": 9.0, "socket_connect_timeout": None}, {"socket_timeout": 9.0}):
        client = SentinelRedis(sentinels=["a:1"], service_name="m", sentinel_kwargs=given)
        kwargs = client.sentinel_manager.sentinels[0].connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == 9.0
        assert kwargs.get("socket_connect_timeout") != SENTINEL_TIMEOUT
        assert kwargs["retry"].get_retries() == 0
        client.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("fault", "timeout"), [("stopped", None), ("stopped", 2.5), ("killed", None)]
)
def test_a_first_sentinel_down_costs_one_short_wait_and_is_named(
    fault: str, timeout: float | None, group: SentinelGroup, caplog: pytest.LogCaptureFixture
) -> None:
    """Stopped (SIGSTOP: it accepts, never answers) or killed (refused), listed first.

    Each open makes a new client, as each worker and scrapy-redis's queue do; a client
    reconnects after CLIENT KILL. Only the first lookup of the process asks it: it waits
    the Sentinels' socket timeout (``timeout``, given in sentinel_kwargs, or the default),
    is said once by address, and is no stall of the primary. Before: 11 x 5 s per client.
    """
    first = group.sentinels[0]
    assert first.process is not None
    params = {"sentinel_kwargs": {"socket_timeout": timeout}} if timeout else {}
    settings = {
        "BLOOMFILTER_REDIS_SENTINELS": group.addresses,
        "BLOOMFILTER_REDIS_SENTINEL_SERVICE": SERVICE,
        "BLOOMFILTER_REDIS_PARAMS": params,
        "BLOOMFILTER_CAPACITY": 1000,
    }
    config = BloomConfig.from_settings(settings)
    wait = timeout or SENTINEL_TIMEOUT
    opens: list[float] = []
    reconnects: list[float] = []
    caplog.set_level(logging.WARNING, logger="scrapy_redis_bloom")
    if fault == "stopped":
        os.kill(first.process.pid, signal.SIGSTOP)
    else:
        first.process.kill()
        first.process.wait()
    try:
        for i in range(3):
            started = time.monotonic()
            [client] = filter_clients(config.connection, settings)
            bloom = RedisBloomFilter.from_config(client, "sentinel:down", config, cache_size=0)
            try:
                bloom.open()
                opens.append(time.monotonic() - started)
                if fault == "stopped":  # one wait of its socket timeout, not 11
                    assert wait * 0.9 <= opens[0] < wait + 3, opens
                with contextlib.closing(group.primary().client()) as primary:
                    assert primary.execute_command("CLIENT", "KILL", "TYPE", "normal") >= 1
                started = time.monotonic()
                assert bloom.check_and_add_many([f"{i:040x}"]) == [False]
                reconnects.append(time.monotonic() - started)
            finally:
                bloom.close()
                client.close()
    finally:
        if fault == "stopped":
            os.kill(first.process.pid, signal.SIGCONT)
    # Neither a new client nor a reconnect asked it again (each would wait its timeout).
    assert all(took < wait for took in opens[1:] + reconnects), (opens, reconnects)
    said = [r.getMessage() for r in caplog.records if r.name.endswith(".transport.sentinel")]
    assert len(said) == 1, said
    assert said[0].startswith(
        f"The Sentinel at {first.address}, listed in BLOOMFILTER_REDIS_SENTINELS, did not answer ("
    )
    assert "not a stall of the primary" in said[0]
    assert "'sentinel_kwargs' in BLOOMFILTER_REDIS_PARAMS" in said[0]
    assert any(
        f"before the Sentinel at {where} answered" in said[0] for where in group.addresses[1:]
    )
    assert "a stall (a slow command" not in caplog.text  # the executor's: the primary's stall


# -- credentials ---------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_wrong_password_is_named_by_setting_and_never_shown(tmp_path: Path) -> None:
    from scrapy.utils.test import get_crawler

    from scrapy_redis_bloom.core.errors import BloomFilterError
    from scrapy_redis_bloom.scrapy.dupefilter import RFPDupeFilter

    with SentinelGroup(password="s3cret-pw") as group:
        base = {
            "BLOOMFILTER_REDIS_SENTINELS": group.addresses,
            "BLOOMFILTER_REDIS_SENTINEL_SERVICE": SERVICE,
            "BLOOMFILTER_CAPACITY": 10_000,
        }
        wrong = {**base, "BLOOMFILTER_REDIS_PARAMS": {"password": "not-it-pw"}}
        with pytest.raises(BloomFilterError) as refused:
            RFPDupeFilter.from_crawler(get_crawler(settings_dict=wrong))
        message = str(refused.value)
        assert message.startswith(f"Redis at {SERVICE} (Sentinel) refused the password given")
        assert "Set it in BLOOMFILTER_REDIS_PARAMS" in message
        assert "not-it-pw" not in message
        right = {**base, "BLOOMFILTER_REDIS_PARAMS": {"password": "s3cret-pw"}}
        dupefilter = RFPDupeFilter.from_crawler(get_crawler(settings_dict=right))
        try:
            assert group.primary().client().keys("*bloomfilter:meta")  # created, on the primary
            assert dupefilter.bloom.topology.describe() == f"Redis at {SERVICE} (Sentinel)"
        finally:
            dupefilter.close("finished")
