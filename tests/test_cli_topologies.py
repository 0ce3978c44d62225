"""The operations commands on several standalone servers and on a Redis Cluster (real servers)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import redis
from cli_run import assert_one_line_error, run, run_json, write_lines
from redis.cluster import RedisCluster
from redis_cluster import RedisClusterNodes
from redis_server import RedisServer, free_port

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter, ServerListMismatchError
from scrapy_redis_bloom.core.layout import shard_key

KEY = "myspider:bloomfilter"
SETTINGS = {
    "BLOOMFILTER_CAPACITY": 20_000,
    "BLOOMFILTER_ERROR_RATE": 0.0001,
    "BLOOMFILTER_SHARD_BIT": 14,
}
SIZING = ["--capacity", "20000", "--error-rate", "0.0001", "--shard-bit", "14"]


def fingerprints(n: int, salt: str = "") -> list[str]:
    return [hashlib.sha1(f"{salt}{i}".encode()).hexdigest() for i in range(n)]


def make_filter(client: Any, key: str = KEY) -> RedisBloomFilter:
    config = BloomConfig.from_settings(SETTINGS)
    bloom = RedisBloomFilter(
        client, key, config.spec, config.capacity, sizing=config.sizing.canonical()
    )
    bloom.open()
    return bloom


def keys(client: Any) -> list[bytes]:
    return sorted(client.keys("*"))


def cluster_keys(nodes: RedisClusterNodes) -> list[bytes]:
    """Return the keys of every master (a cluster client's KEYS asks one node)."""
    found: list[bytes] = []
    for master in nodes.masters():
        client = nodes.node_client(master)
        found += client.keys("*")
        client.close()
    return sorted(found)


# -- several standalone servers ------------------------------------------------------


@pytest.fixture
def target(servers: list[RedisServer], clients: list[redis.Redis]) -> list[str]:
    """Return the options naming the three servers, in order, and the filter's key."""
    return [*(a for s in servers for a in ("--redis-url", s.url)), "--key", KEY]


def test_add_check_info_reset_on_a_server_list(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    servers: list[RedisServer],
    clients: list[redis.Redis],
    target: list[str],
) -> None:
    known = fingerprints(1000)
    path = write_lines(tmp_path / "fps.txt", known)
    data = run_json(capsys, "add", *target, *SIZING, path)
    assert (data["created_filter"], data["new"]) == (True, 1000)

    # What the CLI created is what a crawl with the same settings opens.
    bloom = make_filter(clients)
    assert bloom.record is not None
    assert bloom.record.servers == 3
    assert bloom.contains_many(known) == [True] * 1000
    for i, client in enumerate(clients):
        assert client.get(f"{KEY}:server") == f"{bloom.record.filter_id} {i}/3".encode()
        assert client.exists(shard_key(KEY, i))

    unknown = write_lines(tmp_path / "unknown.txt", fingerprints(100, "unknown"))
    data = run_json(capsys, "check", *target, path, unknown)
    assert data["present"] >= 1000
    assert data["absent"] >= 99

    info = run_json(capsys, "info", *target)
    addresses = [f"127.0.0.1:{s.port}" for s in servers]
    assert info["servers"] == addresses
    assert info["server"] == ", ".join(addresses)
    assert (info["id"], info["state"], info["record_servers"]) == (
        bloom.record.filter_id,
        "ready",
        3,
    )
    assert info["sizing"] == bloom.record.sizing
    assert info["estimated_items"] == pytest.approx(1000, rel=0.05)
    assert info["total_added"] == 1000
    assert (info["shards_missing"], info["shards_foreign"]) == (0, 0)
    assert [m["status"] for m in info["server_markers"]] == ["ok"] * 3
    code, out, err = run(capsys, "info", *target)
    assert (code, err) == (0, "")
    assert "3 of 3 in place" in out
    for address in addresses:
        assert address in out

    for client in clients:
        client.set("unrelated", "kept")
    code, out, err = run(capsys, "reset", *target, "--yes")
    assert (code, err) == (0, "")
    assert f"{bloom.spec.shards} shard key(s)" in out
    assert "server markers on 3 server(s)" in out
    assert [keys(c) for c in clients] == [[b"unrelated"]] * 3


def test_info_shows_missing_and_foreign_shards_and_markers(
    capsys: pytest.CaptureFixture[str], clients: list[redis.Redis], target: list[str]
) -> None:
    bloom = make_filter(clients)
    bloom.add_many(fingerprints(200))
    other = make_filter(clients[1], key="other")
    assert other.record is not None
    clients[1].delete(shard_key(KEY, 1))  # lost: evicted, or its server emptied
    foreign = clients[1].get(shard_key("other", 2))
    assert foreign is not None
    clients[2].set(shard_key(KEY, 2), foreign)  # another filter's shard where ours belongs
    clients[2].delete(f"{KEY}:server")
    before = [keys(c) for c in clients]

    data = run_json(capsys, "info", *target)

    assert (data["shards_missing"], data["shards_foreign"]) == (1, 1)
    damaged = {d["shard"]: d for d in data["damaged_shards"]}
    assert damaged[1]["found"] == "missing"
    assert damaged[1]["server"] == data["servers"][1]
    assert damaged[2]["found"] == f"shard 2 of another filter (id {other.record.filter_id})"
    assert [m["status"] for m in data["server_markers"]] == ["ok", "ok", "missing"]
    code, out, _ = run(capsys, "info", *target)
    assert code == 0
    assert f"2 ('{shard_key(KEY, 1)}' on " in out
    assert "2 of 3 in place" in out
    # Nothing was repaired or recreated.
    assert [keys(c) for c in clients] == before


def test_a_server_list_of_another_length_or_order_is_refused(
    capsys: pytest.CaptureFixture[str],
    servers: list[RedisServer],
    clients: list[redis.Redis],
    target: list[str],
) -> None:
    make_filter(clients).add_many(fingerprints(100))
    before = [keys(c) for c in clients]
    two = ["--redis-url", servers[0].url, "--redis-url", servers[1].url, "--key", KEY]
    for command in ("info", "reset", "check"):
        code, out, err = run(capsys, command, *two, *(["--yes"] if command == "reset" else []))
        assert (code, out) == (1, "")
        assert_one_line_error(err)
        assert "created on 3 server(s); 2 given" in err
    reordered = [servers[0], servers[2], servers[1]]
    argv = [*(a for s in reordered for a in ("--redis-url", s.url)), "--key", KEY, "--yes"]
    code, out, err = run(capsys, "reset", *argv)
    assert (code, out) == (1, "")
    assert_one_line_error(err)
    assert "is server 2/3 of the filter, given as server 1/3" in err
    assert "Nothing was deleted" in err
    assert [keys(c) for c in clients] == before


def test_a_server_list_starting_elsewhere_is_refused_not_missing(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    servers: list[RedisServer],
    clients: list[redis.Redis],
) -> None:
    """Listed first, a server without the record: its marker names its place.

    It said the filter does not exist.
    """
    known = fingerprints(100)
    make_filter(clients).add_many(known)
    before = [keys(c) for c in clients]
    path = write_lines(tmp_path / "fps.txt", known)
    reordered = [servers[1], servers[0], servers[2]]
    argv = [*(a for s in reordered for a in ("--redis-url", s.url)), "--key", KEY]
    for command in ("info", "check", "add"):
        code, out, err = run(capsys, command, *argv, *([] if command == "info" else [path]))
        assert (code, out) == (1, ""), command
        assert_one_line_error(err)
        assert f"Redis at 127.0.0.1:{servers[1].port} is server 1/3 of the Bloom filter" in err
        assert "as server 0/3" in err
        assert "does not exist" not in err
    swapped = [clients[1], clients[0], clients[2]]
    config = BloomConfig.from_settings(SETTINGS)
    with pytest.raises(ServerListMismatchError, match="is server 1/3 of the Bloom filter"):
        RedisBloomFilter(swapped, KEY, config.spec, config.capacity).open(create=False)
    assert [keys(c) for c in clients] == before


def test_reset_refuses_while_a_worker_holds_a_lease(
    capsys: pytest.CaptureFixture[str], clients: list[redis.Redis], target: list[str]
) -> None:
    bloom = make_filter(clients)
    lease = bloom.lease("crawler-1:99:beef", ttl=30)
    lease.renew()
    code, out, err = run(capsys, "reset", *target, "--yes")
    assert (code, out) == (1, "")
    assert "crawler-1:99:beef" in err
    assert bloom.exists()
    assert run(capsys, "reset", *target, "--yes", "--force")[0] == 0
    assert not bloom.exists()
    assert lease.release() == 0


def test_reset_without_record_deletes_orphans_on_every_server(
    capsys: pytest.CaptureFixture[str], clients: list[redis.Redis], target: list[str]
) -> None:
    bloom = make_filter(clients)
    bloom.add_many(fingerprints(300))
    clients[0].delete(f"{KEY}:meta")
    clients[1].set(f"{KEY}:server", "db-replica-2")  # another program's key of that name
    clients[2].set(shard_key(KEY, 5), "not bits")

    data = run_json(capsys, "reset", *target, "--yes")

    assert (data["deleted"], data["record"]) == (True, False)
    assert data["shard_keys"] == bloom.spec.shards - 1
    deleted = {(d["key"], d["server"]) for d in data["deleted_keys"]}
    assert (f"{KEY}:count", data["servers"][0]) in deleted
    assert (f"{KEY}:server", data["servers"][0]) in deleted
    assert (f"{KEY}:server", data["servers"][2]) in deleted
    assert sorted((k["key"], k["server"]) for k in data["not_deleted"]) == [
        (f"{KEY}:server", data["servers"][1]),
        (shard_key(KEY, 5), data["servers"][2]),
    ]
    assert [keys(c) for c in clients] == [
        [],
        [f"{KEY}:server".encode()],
        [shard_key(KEY, 5).encode()],
    ]
    assert clients[1].get(f"{KEY}:server") == b"db-replica-2"


def test_reset_without_record_refuses_servers_out_of_order(
    capsys: pytest.CaptureFixture[str],
    servers: list[RedisServer],
    clients: list[redis.Redis],
) -> None:
    make_filter(clients).add_many(fingerprints(100))
    before = [keys(c) for c in clients]
    reordered = [servers[1], servers[0], servers[2]]
    argv = [*(a for s in reordered for a in ("--redis-url", s.url)), "--key", KEY, "--yes"]
    code, out, err = run(capsys, "reset", *argv)
    assert (code, out) == (1, "")
    assert_one_line_error(err)
    assert f"'{KEY}:meta' on 127.0.0.1:{servers[0].port} is the config record of filter id" in err
    assert f"on another server than the record's (127.0.0.1:{servers[1].port})" in err
    assert "Nothing was deleted" in err
    assert [keys(c) for c in clients] == before


def test_migrate_set_into_a_server_list(
    capsys: pytest.CaptureFixture[str], clients: list[redis.Redis], target: list[str]
) -> None:
    known = fingerprints(500)
    clients[0].sadd("myspider:dupefilter", *known)
    data = run_json(capsys, "migrate-set", *target, "--set-key", "myspider:dupefilter", *SIZING)
    assert (data["created_filter"], data["new"]) == (True, 500)
    assert make_filter(clients).contains_many(known) == [True] * 500


def test_a_cluster_node_given_without_cluster_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], redis_cluster_url: str
) -> None:
    code, out, err = run(capsys, "info", "--redis-url", redis_cluster_url, "--key", KEY)
    assert (code, out) == (2, "")
    assert_one_line_error(err)
    assert "is a node of a Redis Cluster: pass --cluster" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cluster", "--redis-url", "redis://a:1", "--redis-url", "redis://b:1"], "--cluster"),
        (["--redis-url", "redis://h:1/0", "--redis-url", "redis://h:1/0"], "same server"),
        (["--redis-url", "redis://h:1", "--redis-url", "http://:pw99@h:2"], "--redis-url option"),
        (["--retry-timeout", "-1"], "--retry-timeout"),
        (["--retry-timeout", "1e9"], "--retry-timeout option"),
    ],
)  # fmt: skip
def test_bad_connection_options_are_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, "info", *argv, "--key", KEY)
    assert (code, out) == (2, "")
    assert_one_line_error(err)
    assert message in err
    assert "pw99" not in err


# -- a Redis Cluster -----------------------------------------------------------------


@pytest.fixture
def cluster_target(redis_cluster_url: str) -> list[str]:
    return ["--redis-url", redis_cluster_url, "--cluster", "--key", KEY]


def test_add_check_info_reset_on_a_cluster(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    redis_cluster: RedisCluster,
    redis_cluster_nodes: RedisClusterNodes,
    cluster_target: list[str],
) -> None:
    known = fingerprints(2000)
    path = write_lines(tmp_path / "fps.txt", known)
    data = run_json(capsys, "add", *cluster_target, *SIZING, path)
    assert (data["created_filter"], data["new"]) == (True, 2000)
    bloom = make_filter(redis_cluster)
    assert bloom.contains_many(known) == [True] * 2000
    owners = {redis_cluster_nodes.node_of(key) for key in bloom.shard_keys}
    assert len(owners) >= 2  # the shards spread over the masters

    data = run_json(capsys, "check", *cluster_target, path)
    assert (data["present"], data["absent"]) == (2000, 0)

    info = run_json(capsys, "info", *cluster_target)
    assert info["cluster"] is True
    assert sorted(info["servers"]) == sorted(f"{h}:{p}" for h, p in redis_cluster_nodes.masters())
    assert info["estimated_items"] == pytest.approx(2000, rel=0.05)
    assert (info["shards_missing"], info["shards_foreign"], info["server_markers"]) == (0, 0, [])
    code, out, err = run(capsys, "info", *cluster_target)
    assert (code, err) == (0, "")
    assert "Redis Cluster, 3 master(s)" in out

    redis_cluster.set("unrelated", "kept")
    code, out, err = run(capsys, "reset", *cluster_target, "--yes")
    assert (code, err) == (0, "")
    assert "the Redis Cluster at" in out
    assert f"{bloom.spec.shards} shard key(s)" in out
    assert cluster_keys(redis_cluster_nodes) == [b"unrelated"]


def test_info_shows_a_missing_shard_on_a_cluster(
    capsys: pytest.CaptureFixture[str],
    redis_cluster: RedisCluster,
    redis_cluster_nodes: RedisClusterNodes,
    cluster_target: list[str],
) -> None:
    bloom = make_filter(redis_cluster)
    redis_cluster.delete(bloom.shard_keys[3])
    data = run_json(capsys, "info", *cluster_target)
    assert data["shards_missing"] == 1
    (damaged,) = data["damaged_shards"]
    host, port = redis_cluster_nodes.node_of(bloom.shard_keys[3])
    assert damaged == {
        "shard": 3,
        "key": bloom.shard_keys[3],
        "server": f"{host}:{port}",
        "found": "missing",
    }
    assert not redis_cluster.exists(bloom.shard_keys[3])  # info recreates nothing

    code, out, err = run(capsys, "check", *cluster_target, "/dev/null")
    assert (code, out) == (1, "")
    assert_one_line_error(err)
    assert "are gone" in err


def test_reset_without_record_on_a_cluster(
    capsys: pytest.CaptureFixture[str],
    redis_cluster: RedisCluster,
    redis_cluster_nodes: RedisClusterNodes,
    cluster_target: list[str],
) -> None:
    bloom = make_filter(redis_cluster)
    bloom.add_many(fingerprints(500))
    redis_cluster.delete(f"{KEY}:meta")
    redis_cluster.set(f"{KEY}:server", "not a marker")
    redis_cluster.hset(f"{{{KEY}:9999}}:g0", "a", "b")
    lookalike = f"{{{KEY}:x}}:g0"
    redis_cluster.set(lookalike, "kept")

    data = run_json(capsys, "reset", *cluster_target, "--yes")

    assert data["shard_keys"] == bloom.spec.shards
    assert len({d["server"] for d in data["deleted_keys"]}) >= 2
    assert sorted(k["key"] for k in data["not_deleted"]) == [
        f"{KEY}:server",
        f"{{{KEY}:9999}}:g0",
    ]
    assert cluster_keys(redis_cluster_nodes) == sorted(
        name.encode() for name in (f"{KEY}:server", f"{{{KEY}:9999}}:g0", lookalike)
    )


def test_migrate_set_on_a_cluster(
    capsys: pytest.CaptureFixture[str], redis_cluster: RedisCluster, cluster_target: list[str]
) -> None:
    known = fingerprints(1500)
    redis_cluster.sadd("myspider:dupefilter", *known, "junk")
    data = run_json(
        capsys, "migrate-set", *cluster_target, "--set-key", "myspider:dupefilter", *SIZING
    )
    assert (data["new"], data["skipped"]) == (1500, 1)
    assert make_filter(redis_cluster).contains_many(known) == [True] * 1500


def test_unreachable_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}"
    code, out, err = run(capsys, "info", "--redis-url", url, "--cluster", "--key", KEY)
    assert (code, out) == (1, "")
    assert_one_line_error(err)
    assert "cannot connect to the Redis Cluster at 127.0.0.1:" in err
    assert "hunter2" not in err
