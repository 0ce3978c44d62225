"""A least-privilege Redis ACL user runs the filter: the README's list of commands is complete.

The user gets exactly the commands and key patterns the README lists; a crawl's work
(create, check and add, bulk, counters, leases, state, clear) must succeed with them.
A user that lacks any of them is refused at open, by one error that names every
missing command and key pattern (:mod:`scrapy_redis_bloom.engine.access`); rights
taken away later surface as the same error, naming the operation, never as an answer.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import pytest
import redis
from cli_run import run
from redis.cluster import RedisCluster
from redis_cluster import RedisClusterNodes
from redis_server import RedisServer
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.core.errors import AccessDeniedError
from scrapy_redis_bloom.core.settings import FaultPolicy
from scrapy_redis_bloom.engine.access import check_access, probe_keys, probes
from scrapy_redis_bloom.scrapy.dupefilter import RFPDupeFilter
from scrapy_redis_bloom.transport.node import Node

#: The commands of the README's "Least privilege" section, as ACL rules.
FILTER_COMMANDS = [
    # sent by the filter
    "+evalsha", "+script|load", "+getrange", "+bitfield", "+bitfield_ro", "+exists", "+get", "+set",
    "+hgetall", "+hset", "+hincrby", "+hmget", "+strlen", "+type", "+unlink",
    # run inside its scripts
    "+setbit", "+getbit", "+expireat", "+setrange", "+del", "+time", "+zadd", "+zrange", "+zrem",
    "+zrangebyscore", "+zremrangebyscore", "+zscore", "+pexpire", "+hkeys",
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


def test_the_cli_names_dbsize_for_a_user_with_the_filters_commands_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every command reading a record counts the keys (DBSIZE): named, with its grant.

    The page said only info and reset need it; the refusal named no user and no grant.
    """
    with RedisServer() as server, contextlib.closing(server.client()) as admin:
        config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 10_000})
        bloom = RedisBloomFilter(admin, "books:bloomfilter", config.spec, config.capacity)
        bloom.add_many(fingerprints(10))
        bloom.close()
        rules = ["on", ">pw", "resetkeys", "~books:bloomfilter*", "~{books:bloomfilter:*"]
        admin.execute_command("ACL", "SETUSER", "bloom", *rules, "-@all", *FILTER_COMMANDS)
        url = f"redis://bloom:pw@127.0.0.1:{server.port}/0"
        code, out, err = run(capsys, "check", "--redis-url", url, "--key", KEY, "/dev/null")
        assert (code, out) == (1, "")
        assert f"Redis at 127.0.0.1:{server.port} refuses DBSIZE" in err
        assert "Grant it: ACL SETUSER bloom +dbsize." in err
        admin.execute_command("ACL", "SETUSER", "bloom", "+dbsize")
        code, _, err = run(capsys, "check", "--redis-url", url, "--key", KEY, "/dev/null")
        assert (code, err) == (0, "")


# -- the permission check at open ---------------------------------------------------------

KEY = "books:bloomfilter"
#: The key patterns the README asks for, as ACL rules.
KEY_PATTERNS = [f"~{KEY}*", f"~{{{KEY}:*"]
CONFIG = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 10_000})


def set_user(admin: redis.Redis, rules: Sequence[str]) -> None:
    """(Re)define the user ``bloom`` (password ``pw``) with exactly ``rules``."""
    admin.execute_command("ACL", "SETUSER", "bloom", "reset", "on", ">pw", *rules)


def open_as_bloom(server: RedisServer) -> tuple[redis.Redis, RedisBloomFilter]:
    user = redis.Redis(port=server.port, username="bloom", password="pw")
    return user, RedisBloomFilter(user, KEY, CONFIG.spec, CONFIG.capacity)


def test_the_probe_covers_exactly_the_readme_list() -> None:
    """Every command the README lists is probed at open, and nothing else."""
    record, shard = probe_keys(KEY)
    assert (record, shard) == (f"{KEY}:acl-probe", f"{{{KEY}:acl-probe}}:g0")
    probed = {probe.command for probe in probes(record, shard)}
    assert probed == {rule[1:] for rule in FILTER_COMMANDS}
    # Writes go to the probe keys only.
    assert {probe.key for probe in probes(record, shard)} == {record, shard}


def test_read_write_scripting_lacks_time_and_is_refused_at_open(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with RedisServer() as server:
        admin = server.client()
        set_user(admin, [*KEY_PATTERNS, "+@read", "+@write", "+@scripting"])
        user, bloom = open_as_bloom(server)
        with (
            caplog.at_level(logging.INFO, logger="scrapy_redis_bloom"),
            pytest.raises(AccessDeniedError) as caught,
        ):
            bloom.open()
        error = caught.value
        assert error.commands == ("time",)  # MEMORY USAGE and BITCOUNT are in @read
        assert error.keys == ()
        assert str(error) == (
            f"Redis at localhost:{server.port} refuses the Bloom filter {KEY!r} the command"
            " time: its Redis user 'bloom' lacks these ACL permissions. Grant them: ACL"
            " SETUSER bloom +time. See docs/howto/tls-acl.md#least-privilege."
        )
        assert "does not let its user run INFO" in caplog.text  # INFO: not in those groups
        assert admin.keys("*") == []  # the probe keys are gone, nothing was created
        # Granted what the error says, the same user opens the filter.
        admin.execute_command("ACL", "SETUSER", "bloom", "+time")
        bloom.open()
        assert bloom.add_many(fingerprints(10)) == [False] * 10
        bloom.close()
        user.close()
        admin.close()


@pytest.mark.parametrize("granted", [0, 1], ids=["only-KEY*", "only-{KEY:*"])
def test_a_missing_key_pattern_is_named_at_open(granted: int) -> None:
    with RedisServer() as server:
        admin = server.client()
        set_user(admin, [KEY_PATTERNS[granted], "+@all"])
        user, bloom = open_as_bloom(server)
        with pytest.raises(AccessDeniedError) as caught:
            bloom.open()
        missing = KEY_PATTERNS[1 - granted]
        assert caught.value.keys == (missing,)
        assert caught.value.commands == ()
        assert f"the keys {missing} (" in str(caught.value)
        assert f"Grant them: ACL SETUSER bloom {missing}." in str(caught.value)
        assert admin.keys("*") == []
        bloom.close()
        user.close()
        admin.close()


def test_each_missing_command_is_named_alone() -> None:
    """Without any one required command of the README's list, open names exactly it."""
    with RedisServer() as server:
        admin = server.client()
        user, bloom = open_as_bloom(server)
        for rule in FILTER_COMMANDS:
            if rule == "+info":
                continue
            set_user(admin, [*KEY_PATTERNS, *(r for r in FILTER_COMMANDS if r != rule)])
            with pytest.raises(AccessDeniedError) as caught:
                bloom.open()
            assert caught.value.commands == (rule[1:],), rule
            assert caught.value.keys == ()
            assert f"+{rule[1:]}." in str(caught.value)
            assert not admin.exists(f"{KEY}:meta")  # refused before anything was created
        set_user(admin, [*KEY_PATTERNS, *FILTER_COMMANDS])
        bloom.open()
        bloom.close()
        user.close()
        admin.close()


def test_without_info_the_filter_opens_and_the_log_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with RedisServer() as server:
        admin = server.client()
        set_user(admin, [*KEY_PATTERNS, *(r for r in FILTER_COMMANDS if r != "+info")])
        user, bloom = open_as_bloom(server)
        with caplog.at_level(logging.INFO, logger="scrapy_redis_bloom"):
            bloom.open()
        assert bloom.check_and_add(fingerprints(1)[0]) is False
        lines = [r for r in caplog.records if "does not let its user run INFO" in r.message]
        assert len(lines) == 1
        assert lines[0].levelno == logging.INFO
        assert f"Redis at localhost:{server.port}" in lines[0].message
        assert "Grant +info" in lines[0].message
        assert "Could not read INFO" not in caplog.text  # said once, by the permission check
        bloom.close()
        user.close()
        admin.close()


def test_the_readme_list_opens_and_leaves_no_probe_key(caplog: pytest.LogCaptureFixture) -> None:
    with RedisServer() as server:
        admin = server.client()
        set_user(admin, [*KEY_PATTERNS, *FILTER_COMMANDS])
        user, bloom = open_as_bloom(server)
        with caplog.at_level(logging.DEBUG, logger="scrapy_redis_bloom.engine.access"):
            bloom.open()
        assert "lets its user run every command" in caplog.text
        assert "does not let" not in caplog.text
        assert not any(b"acl-probe" in key for key in admin.keys("*"))
        assert admin.exists(f"{KEY}:meta")
        bloom.close()
        user.close()
        admin.close()


def test_a_full_redis_still_opens_its_filter(caplog: pytest.LogCaptureFixture) -> None:
    """Out of memory, Redis refuses the probe's writes: the check is skipped, not retried.

    Opening a filter on a full Redis to read its figures (the CLI's ``stats``) worked
    before the check existed, and still does, without waiting for the retry timeout.
    """
    with RedisServer() as server:
        admin = server.client()
        RedisBloomFilter(admin, KEY, CONFIG.spec, CONFIG.capacity).open()
        used = int(admin.info("memory")["used_memory"])
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", used // 2)
        slow = FaultPolicy(retry_timeout=30.0)
        bloom = RedisBloomFilter(admin, KEY, CONFIG.spec, CONFIG.capacity, faults=slow)
        with caplog.at_level(logging.INFO, logger="scrapy_redis_bloom.engine.access"):
            started = time.monotonic()
            bloom.open()
            assert time.monotonic() - started < 10.0  # one attempt, not 30 s of retries
        assert "Could not check the Redis ACL permissions" in caplog.text
        assert "out of memory" in caplog.text
        assert bloom.state().estimated_items == 0
        admin.config_set("maxmemory", 0)
        bloom.close()
        admin.close()


def test_each_server_of_a_list_is_checked_in_one_round_trip(
    servers: list[RedisServer], clients: list[redis.Redis], monkeypatch: pytest.MonkeyPatch
) -> None:
    without_time = [r for r in FILTER_COMMANDS if r != "+time"]
    for i, client in enumerate(clients):  # server 1 alone lacks TIME
        set_user(client, [*KEY_PATTERNS, *(without_time if i == 1 else FILTER_COMMANDS)])
    users = [redis.Redis(port=s.port, username="bloom", password="pw") for s in servers]
    try:
        bloom = RedisBloomFilter(users, KEY, CONFIG.spec, CONFIG.capacity)
        exchanges: list[tuple[str, int]] = []
        send = Node.send

        def counted(node: Node, payload: bytes, count: int, *args: Any, **kwargs: Any) -> Any:
            exchanges.append((node.address, count))
            return send(node, payload, count, *args, **kwargs)

        monkeypatch.setattr(Node, "send", counted)
        with pytest.raises(AccessDeniedError) as caught:
            check_access(bloom.executor, bloom.topology, KEY)
        monkeypatch.undo()
        probed = len(probes(*probe_keys(KEY)))
        assert exchanges == [(f"localhost:{s.port}", probed) for s in servers]
        assert str(caught.value).startswith(f"Redis at localhost:{servers[1].port} refuses")
        assert caught.value.server == f"Redis at localhost:{servers[1].port}"
        assert caught.value.commands == ("time",)
        assert all(client.keys("*") == [] for client in clients)
        bloom.close()
    finally:
        for user in users:
            user.close()
        for client in clients:
            client.execute_command("ACL", "DELUSER", "bloom")


def test_rights_taken_away_later_raise_naming_the_operation_never_answer() -> None:
    with RedisServer() as server:
        admin = server.client()
        set_user(admin, [*KEY_PATTERNS, *FILTER_COMMANDS])
        user = redis.Redis(port=server.port, username="bloom", password="pw")
        strict = FaultPolicy(retry_timeout=1.0, on_error="raise")
        bloom = RedisBloomFilter(user, KEY, CONFIG.spec, CONFIG.capacity, faults=strict)
        lenient = FaultPolicy(retry_timeout=1.0, on_error="allow")
        allowing = RedisBloomFilter(user, KEY, CONFIG.spec, CONFIG.capacity, faults=lenient)
        known = fingerprints(20)
        assert bloom.add_many(known) == [False] * 20
        allowing.open()
        lease = bloom.lease("w1", ttl=30)
        assert lease.renew() == 0
        where = f"Redis at localhost:{server.port}"

        # TIME, called by the lease script.
        admin.execute_command("ACL", "SETUSER", "bloom", "-time")
        with pytest.raises(AccessDeniedError) as caught:
            lease.renew()
        # Inside a script Redis names no command: the permission probe, run then, does.
        assert str(caught.value) == (
            f"{where} could not renew a worker lease (key '{KEY}:workers'): {where} refuses"
            f" the Bloom filter '{KEY}' the command time: its Redis user 'bloom' lacks these"
            " ACL permissions. Grant them: ACL SETUSER bloom +time."
            " See docs/howto/tls-acl.md#least-privilege."
        )
        assert caught.value.commands == ("time",)
        assert "Redis ACL refused a command of the filter's script" in str(caught.value.__cause__)

        # BITFIELD, the hot path's one command (and the bulk path's): an error, never
        # "seen" (nor "new").
        admin.execute_command("ACL", "SETUSER", "bloom", "+time", "-bitfield")
        for element in (known[0], fingerprints(21)[20]):
            with pytest.raises(
                AccessDeniedError,
                match=rf"could not check and add a request \(key '\{{{KEY}:\d+\}}:g0'\): .* the"
                r" command bitfield: its Redis user 'bloom' lacks",
            ):
                bloom.check_and_add(element)
        with pytest.raises(
            AccessDeniedError,
            match=r"could not check in bulk .* the command bitfield: its Redis user",
        ):
            bloom.contains_many(known)
        # Under BLOOMFILTER_ON_ERROR = "allow", a refused check answers "new", counted
        # and said, like any check Redis could not answer: never "seen", never raised.
        assert allowing.check_and_add(fingerprints(22)[21]) is False
        assert allowing.events.counts["errors"] == 1
        allowing.close()

        # SCRIPT LOAD, when a node forgot the scripts.
        # (Redis 6.2 cannot take a subcommand away: "-script" takes them all.)
        admin.execute_command("ACL", "SETUSER", "bloom", "+bitfield", "-script")
        admin.script_flush()
        with pytest.raises(
            AccessDeniedError, match=r"could not load a script to renew a worker .* \+script"
        ):
            lease.renew()

        # A key pattern taken away: the shards' keys.
        admin.execute_command("ACL", "SETUSER", "bloom", "+script|load", "resetkeys", f"~{KEY}*")
        with pytest.raises(
            AccessDeniedError, match=rf"check and add a request .*the keys ~\{{{KEY}:\*"
        ):
            bloom.check_and_add(known[0])

        # All granted again: the filter answers as before.
        admin.execute_command("ACL", "SETUSER", "bloom", *KEY_PATTERNS)
        assert bloom.check_and_add(known[0]) is True
        assert bloom.contains_many(known) == [True] * 20
        assert lease.release() == 0
        # Each refused check went through BLOOMFILTER_ON_ERROR ("raise" here): counted.
        assert bloom.events.counts.get("errors", 0) == 3
        bloom.close()
        user.close()
        admin.close()


def test_every_master_of_a_cluster_is_checked(
    redis_cluster_nodes: RedisClusterNodes, redis_cluster: RedisCluster
) -> None:
    masters = redis_cluster_nodes.masters()
    # A cluster client also needs to discover the cluster (README "Least privilege").
    discovery = ["+cluster|slots", "+cluster|shards", "+command"]
    without_time = [r for r in FILTER_COMMANDS if r != "+time"]

    def grant(rules: list[str]) -> None:
        for node in masters:
            redis_cluster_nodes.execute(
                node, "ACL", "SETUSER", "bloom", "reset", "on", ">pw", *KEY_PATTERNS, *rules
            )

    grant([*without_time, *discovery])
    client = redis_cluster_nodes.client(username="bloom", password="pw")
    try:
        bloom = RedisBloomFilter(client, KEY, CONFIG.spec, CONFIG.capacity)
        with pytest.raises(AccessDeniedError) as caught:
            bloom.open()
        assert caught.value.commands == ("time",)
        # One sentence for all the masters, which refuse the same.
        addresses = ", ".join(f"{host}:{port}" for host, port in sorted(masters))
        assert str(caught.value).startswith(f"Redis at {addresses} refuses")
        assert redis_cluster.keys("*") == []
        grant([*FILTER_COMMANDS, *discovery])
        bloom.open()
        assert bloom.add_many(fingerprints(100)) == [False] * 100
        assert not any(b"acl-probe" in key for key in redis_cluster.keys("*"))
        bloom.clear()
        bloom.close()
    finally:
        client.close()
        for node in masters:
            redis_cluster_nodes.execute(node, "ACL", "DELUSER", "bloom")
