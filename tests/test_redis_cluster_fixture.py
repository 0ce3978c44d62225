"""Tests of the Redis Cluster test fixture, and of the redis-py cluster behaviour we rely on.

Besides checking :class:`redis_cluster.RedisClusterNodes` itself, these pin down how
redis-py's ``RedisCluster`` and ``ClusterPipeline`` handle ``EVALSHA``, ``NOSCRIPT``,
``MOVED`` and ``ASK``, so an upgrade that changes it fails here first.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    MovedError,
    NoScriptError,
    RedisClusterException,
)
from redis.retry import Retry
from redis_cluster import MAX_PORT, RedisClusterNodes, free_cluster_port

# Sets bit ARGV[1] of KEYS[1] and returns the key's BITCOUNT.
SETBIT_LUA = "redis.call('SETBIT', KEYS[1], ARGV[1], 1) return redis.call('BITCOUNT', KEYS[1])"


# The session fixtures that conftest.py is to provide; these module copies override them
# (same names) until then, and can be deleted once conftest.py has them.
def _keys_on_every_node(nodes: RedisClusterNodes, prefix: str) -> list[str]:
    return [nodes.key_on(i, prefix) for i in range(len(nodes.nodes))]


def test_free_cluster_port_leaves_room_for_the_bus_port() -> None:
    taken = {free_cluster_port()}
    port = free_cluster_port(taken)
    assert port < MAX_PORT
    assert port not in taken
    assert port + 10000 not in taken


def test_cluster_is_ok_on_every_node(redis_cluster_nodes: RedisClusterNodes) -> None:
    nodes = redis_cluster_nodes
    assert len(nodes.nodes) == 3
    ports = [port for _, port in nodes.nodes]
    assert len(set(ports)) == 3
    assert all(host == "127.0.0.1" and port < MAX_PORT for host, port in nodes.nodes)
    assert nodes.startup_url == f"redis://127.0.0.1:{ports[0]}"
    expected = [
        (0, 5460, nodes.nodes[0]),
        (5461, 10921, nodes.nodes[1]),
        (10922, 16383, nodes.nodes[2]),
    ]
    for i in range(3):
        info = nodes.cluster_info(i)
        assert info["cluster_state"] == "ok"
        assert info["cluster_slots_assigned"] == "16384"
        assert info["cluster_known_nodes"] == "3"
        assert info["cluster_size"] == "3"
        assert nodes.slot_map(i) == expected
        with nodes.node_client(i, decode_responses=True) as node:
            assert node.config_get("bind") == {"bind": "127.0.0.1"}
            assert node.config_get("cluster-enabled") == {"cluster-enabled": "yes"}
    assert 0 < nodes.startup_seconds < nodes.startup_timeout  # (Redis's own timers: 2-5 s)


def test_client_spreads_keys_over_the_masters(
    redis_cluster_nodes: RedisClusterNodes, redis_cluster: RedisCluster
) -> None:
    keys = [f"spread:{i}" for i in range(60)]
    for i, key in enumerate(keys):
        redis_cluster.set(key, i)
    assert [redis_cluster.get(key) for key in keys] == [str(i).encode() for i in range(60)]

    owners = {key: redis_cluster_nodes.node_of(key) for key in keys}
    assert len(set(owners.values())) >= 2
    for key, owner in owners.items():
        # node_of agrees with redis-py's own routing and with where the key really is.
        assert redis_cluster.get_node_from_key(key).port == owner[1]
        with redis_cluster_nodes.node_client(owner) as node:
            assert node.exists(key) == 1
    sizes = []
    for address in redis_cluster_nodes.nodes:
        with redis_cluster_nodes.node_client(address) as node:
            sizes.append(node.dbsize())
    assert sum(sizes) == 60

    redis_cluster_nodes.flushall()
    assert all(redis_cluster.exists(key) == 0 for key in keys)


def test_evalsha_on_every_node_then_noscript_after_script_flush(
    redis_cluster_nodes: RedisClusterNodes, redis_cluster: RedisCluster
) -> None:
    nodes = redis_cluster_nodes
    keys = _keys_on_every_node(nodes, "lua:")
    # script_load goes to every master, so EVALSHA works wherever the key lives.
    sha = redis_cluster.script_load(SETBIT_LUA)
    assert [nodes.execute(i, "SCRIPT", "EXISTS", sha) for i in range(3)] == [[1], [1], [1]]
    assert [redis_cluster.evalsha(sha, 1, key, 7) for key in keys] == [1, 1, 1]

    nodes.script_flush(1)
    assert nodes.execute(1, "SCRIPT", "EXISTS", sha) == [0]
    # The cluster client aggregates SCRIPT EXISTS over the masters: one miss is False.
    assert redis_cluster.script_exists(sha) == [False]
    with pytest.raises(NoScriptError):
        redis_cluster.evalsha(sha, 1, keys[1], 8)
    assert redis_cluster.evalsha(sha, 1, keys[0], 8) == 2
    assert redis_cluster.evalsha(sha, 1, keys[2], 8) == 2

    # Reloading (on every master) is the recovery.
    assert redis_cluster.script_load(SETBIT_LUA) == sha
    assert redis_cluster.evalsha(sha, 1, keys[1], 8) == 2
    # A registered Script object reloads on NOSCRIPT by itself (outside pipelines).
    script = redis_cluster.register_script(SETBIT_LUA)
    nodes.script_flush(1)
    assert script(keys=[keys[1]], args=[9]) == 3


def test_cross_slot_evalsha_is_refused_client_side(redis_cluster: RedisCluster) -> None:
    sha = redis_cluster.script_load(SETBIT_LUA)
    with pytest.raises(RedisClusterException, match="same key slot"):
        redis_cluster.evalsha(sha, 2, "a", "b", 1)
    # Hash tags put keys in one slot, so a multi-key script is fine.
    assert redis_cluster.evalsha(sha, 2, "{bf}a", "{bf}b", 1) == 1


def test_slot_migration_is_followed_through_moved(
    redis_cluster_nodes: RedisClusterNodes, redis_cluster: RedisCluster
) -> None:
    nodes = redis_cluster_nodes
    key = nodes.key_on(0, "moving:")
    slot = nodes.keyslot(key)
    redis_cluster.set(key, "value")
    sha = redis_cluster.script_load(SETBIT_LUA)
    assert redis_cluster.get(key) == b"value"  # the client's slot cache says node 0

    source = nodes.migrate_slot(slot, 2)
    try:
        assert source == 0
        assert nodes.node_of(key) == nodes.nodes[2]
        for i in range(3):
            assert nodes.owner_of_slot(slot) == nodes.nodes[2]
            assert nodes.cluster_info(i)["cluster_state"] == "ok"
        with nodes.node_client(0) as old, pytest.raises(MovedError) as moved:
            old.get(key)
        assert moved.value.slot_id == slot
        assert moved.value.node_addr == nodes.nodes[2]

        # The same client, with a stale slot cache, follows MOVED.
        assert redis_cluster.get(key) == b"value"
        assert redis_cluster.get_node_from_key(key).port == nodes.nodes[2][1]
        # So does a pipeline built from a fresh client still caching the old owner.
        with nodes.client() as stale:
            nodes.migrate_slot(slot, 1)
            pipe = stale.pipeline()
            pipe.get(key)
            pipe.execute_command("EVALSHA", sha, 1, key, 0)
            # "value" has 21 bits set; bit 0 of "v" (0x76) was clear: 22.
            assert pipe.execute() == [b"value", 22]
    finally:
        nodes.migrate_slot(slot, 0)
    assert nodes.node_of(key) == nodes.nodes[0]
    assert redis_cluster.get(key) == b"\xf6alue"


def test_half_migrated_slot_is_followed_through_ask(
    redis_cluster_nodes: RedisClusterNodes, redis_cluster: RedisCluster
) -> None:
    nodes = redis_cluster_nodes
    stay, go = "{half}stay", "{half}go"
    slot = nodes.keyslot(stay)
    owner = nodes.index(nodes.node_of(stay))
    target = (owner + 1) % 3
    redis_cluster.set(stay, "S")
    redis_cluster.set(go, "G")
    sha = redis_cluster.script_load(SETBIT_LUA)

    assert nodes.begin_slot_migration(slot, target) == owner
    try:
        assert sorted(nodes.open_migrations()) == sorted(
            [(owner, slot, "migrating", target), (target, slot, "importing", owner)]
        )
        with pytest.raises(RuntimeError, match=f"slot {slot} migrating"):
            nodes.wait_until_consistent(timeout=0.2)
        # GETKEYSINSLOT lists keys in order; move exactly the first one.
        first = nodes.execute(owner, "CLUSTER", "GETKEYSINSLOT", slot, 1)[0]
        assert nodes.move_slot_keys(slot, owner, target, limit=1) == 1
        moved, kept = (go, stay) if first == go else (stay, go)
        with nodes.node_client(owner) as source, pytest.raises(AskError) as ask:
            source.get(moved)
        assert not isinstance(ask.value, MovedError)
        assert ask.value.node_addr == nodes.nodes[target]

        # Both keys stay readable, one by the owner, one through ASK; also in a pipeline.
        values = {stay: b"S", go: b"G"}
        assert redis_cluster.get(kept) == values[kept]
        assert redis_cluster.get(moved) == values[moved]
        pipe = redis_cluster.pipeline()
        pipe.get(stay)
        pipe.get(go)
        pipe.execute_command("EVALSHA", sha, 1, moved, 7)
        # "S" (0x53) and "G" (0x47) both have 4 bits set, bit 7 among them.
        assert pipe.execute() == [b"S", b"G", 4]
        # A multi-key command over the split slot gets TRYAGAIN until redis-py gives up
        # (~0.4 s); in a pipeline the ClusterError lands in place of the reply.
        with pytest.raises(ClusterError):
            redis_cluster.mget(stay, go)
        pipe.execute_command("EVALSHA", sha, 2, stay, go, 7)
        pipe.get(stay)
        split, _ = pipe.execute(raise_on_error=False)
        assert isinstance(split, ClusterError)
    finally:
        nodes.move_slot_keys(slot, owner, target)
        nodes.finish_slot_migration(slot, target)
        nodes.migrate_slot(slot, owner)
    assert redis_cluster.mget(stay, go) == [b"S", b"G"]
    assert nodes.open_migrations() == []
    nodes.wait_until_consistent(timeout=5)
    assert nodes.node_of(go) == nodes.nodes[owner]


def test_cluster_pipeline_evalsha_and_noscript(
    redis_cluster_nodes: RedisClusterNodes, redis_cluster: RedisCluster
) -> None:
    nodes = redis_cluster_nodes
    keys = _keys_on_every_node(nodes, "pipe:")
    sha = redis_cluster.script_load(SETBIT_LUA)

    pipe = redis_cluster.pipeline()
    # redis-py up to 8.1 blocks the EVALSHA and SCRIPT helpers (and eval) on cluster
    # pipelines; 8.2 queues them. The package sends raw commands either way ...
    try:
        pipe.evalsha(sha, 1, keys[0], 1)
    except RedisClusterException as exc:
        assert "blocked" in str(exc)  # noqa: PT017 (which of two behaviours decides the rest)
        with pytest.raises(RedisClusterException, match="blocked"):
            pipe.script_load(SETBIT_LUA)
        with pytest.raises(RedisClusterException, match="blocked"):
            redis_cluster.register_script(SETBIT_LUA)(keys=[keys[0]], args=[1], client=pipe)
        with pytest.raises(TypeError):
            pipe.eval(SETBIT_LUA, 1, keys[0], 1)  # type: ignore[call-arg]
    else:
        assert tuple(map(int, redis.__version__.split(".")[:2])) >= (8, 2), redis.__version__
        pipe.reset()
    assert len(pipe) == 0

    # ... but a raw EVALSHA is routed by its key, one slot per command, any mix of nodes.
    for key in keys:
        pipe.execute_command("EVALSHA", sha, 1, key, 1)
        pipe.execute_command("EVALSHA", sha, 1, key, 2)
    assert pipe.execute() == [1, 2, 1, 2, 1, 2]

    nodes.script_flush(1)
    for key in keys:
        pipe.execute_command("EVALSHA", sha, 1, key, 3)
    results = pipe.execute(raise_on_error=False)
    assert results[0] == 3
    assert results[2] == 3
    assert isinstance(results[1], NoScriptError)  # in place, not annotated, not raised
    assert "Command #" not in str(results[1])

    for key in keys:
        pipe.execute_command("EVALSHA", sha, 1, key, 4)
    with pytest.raises(NoScriptError, match=r"Command # 2 \(EVALSHA .*\) of pipeline"):
        pipe.execute()
    # The other commands ran anyway: a cluster pipeline is not a transaction.
    assert redis_cluster.bitcount(keys[0]) == 4
    assert redis_cluster.bitcount(keys[1]) == 2

    redis_cluster.script_load(SETBIT_LUA)
    pipe.execute_command("EVALSHA", sha, 1, keys[1], 4)
    assert pipe.execute() == [3]


def test_cluster_pipeline_memory_bitcount_type_unlink(
    redis_cluster_nodes: RedisClusterNodes, redis_cluster: RedisCluster
) -> None:
    keys = _keys_on_every_node(redis_cluster_nodes, "bits:")
    for key in keys:
        redis_cluster.setbit(key, 8191, 1)
    pipe = redis_cluster.pipeline()
    for key in keys:
        pipe.memory_usage(key)
        pipe.bitcount(key)
        pipe.type(key)
        pipe.unlink(key)
        pipe.type(key)
        pipe.memory_usage(key)
    results = pipe.execute()
    for i in range(3):
        usage, count, kind, unlinked, gone, no_usage = results[6 * i : 6 * i + 6]
        assert usage >= 1024
        assert (count, kind, unlinked, gone, no_usage) == (1, b"string", 1, b"none", None)
    # One key per UNLINK in a cluster pipeline (redis-py splits nothing itself).
    with pytest.raises(RedisClusterException, match="multiple keys"):
        pipe.unlink(*keys)


def test_cluster_pipeline_multi_key_evalsha_needs_one_slot(redis_cluster: RedisCluster) -> None:
    sha = redis_cluster.script_load(SETBIT_LUA)
    pipe = redis_cluster.pipeline(transaction=False)
    pipe.execute_command("EVALSHA", sha, 2, "{bf:1}bits", "{bf:1}count", 3)
    pipe.hset("{bf:1}count", "added", 1)
    pipe.hmget("{bf:1}count", "added", "seen")
    pipe.delete("{bf:1}count")
    assert pipe.execute() == [1, 1, [b"1", None], 1]

    # Keys in different slots: refused client-side at execute(), even with
    # raise_on_error=False, and nothing of the pipeline is sent.
    pipe.set("sent?", 1)
    pipe.execute_command("EVALSHA", sha, 2, "bits", "count", 3)
    with pytest.raises(RedisClusterException, match="same key slot"):
        pipe.execute(raise_on_error=False)
    assert redis_cluster.exists("sent?") == 0


@pytest.mark.timeout(90)
def test_stopped_master_fails_the_cluster_and_restart_recovers() -> None:
    with RedisClusterNodes(node_timeout_ms=1000) as nodes:
        servers = [server for server in nodes.servers if server is not None]
        dirs = [nodes.dir, *(server.dir for server in servers)]
        # No retries: redis-py's default ones take ~2.8 s to give up on CLUSTERDOWN.
        quick = Retry(NoBackoff(), 0)
        with nodes.client(socket_timeout=2, socket_connect_timeout=1, retry=quick) as client:
            alive, dead = nodes.key_on(0), nodes.key_on(2)
            client.set(alive, "a")
            client.set(dead, "d")

            began = time.monotonic()
            nodes.stop_node(2)
            assert nodes.live == [0, 1]
            nodes.wait_for_state("fail", timeout=15)
            assert time.monotonic() - began < 15
            assert nodes.cluster_info(0)["cluster_state"] == "fail"
            with pytest.raises(ClusterDownError):
                client.get(alive)
            with pytest.raises(redis.ConnectionError):
                client.get(dead)

            nodes.restart_node(2)
            assert nodes.live == [0, 1, 2]
            assert [nodes.cluster_info(i)["cluster_state"] for i in range(3)] == ["ok"] * 3
            assert client.get(alive) == b"a"
            assert client.get(dead) is None  # same node id and slots, no persistence
    assert nodes.servers == []
    assert all(server.process is None for server in servers)
    assert not any(Path(path).exists() for path in dirs)
    for address in nodes.nodes:
        # A raw connect: redis-py's default retries would take ~3.5 s per refused port.
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(address, timeout=1).close()


def test_bad_node_count_is_refused() -> None:
    with pytest.raises(ValueError, match="between 1 and 100"):
        RedisClusterNodes(0)


def test_binary_is_the_chosen_one(redis_cluster_nodes: RedisClusterNodes) -> None:
    with redis_cluster_nodes.node_client(0) as node:
        assert node.info("server")["redis_mode"] == "cluster"
    wanted = os.environ.get("SRB_REDIS_SERVER")
    servers = [server for server in redis_cluster_nodes.servers if server is not None]
    if wanted:
        assert all(server.binary == wanted for server in servers)


def test_no_convergence_raises_with_the_node_logs(redis_cluster_nodes: RedisClusterNodes) -> None:
    wrong = [(0, 16383, redis_cluster_nodes.nodes[0])]
    began = time.monotonic()
    with pytest.raises(RuntimeError, match="did not reach") as error:
        redis_cluster_nodes.wait_until_consistent(expected=wrong, timeout=0.3)
    assert time.monotonic() - began < 5
    assert "CLUSTER SLOTS" in str(error.value)
    assert "log:" in str(error.value)
    assert "Ready to accept connections" in str(error.value)


def test_bad_replica_count_is_refused() -> None:
    with pytest.raises(ValueError, match="replicas must be between 0 and 5"):
        RedisClusterNodes(3, replicas=6)


def test_cluster_with_replicas_forms(redis_cluster_replicas: RedisClusterNodes) -> None:
    nodes = redis_cluster_replicas
    nodes.wait_until_consistent(timeout=20)
    assert len(nodes.nodes) == nodes.size == 6
    assert len({port for _, port in nodes.nodes}) == 6
    masters = nodes.masters()
    assert len(masters) == 3
    for master in masters:
        replicas = nodes.replicas_of(master)
        assert len(replicas) == 1
        assert nodes.role(master) == "master"
        assert nodes.role(replicas[0]) == "slave"
        info = nodes.execute(replicas[0], "INFO", "replication")
        assert info["master_link_status"] == "up"
        assert info["master_port"] == master[1]
    for i in range(6):
        info = nodes.cluster_info(i)
        assert info["cluster_state"] == "ok"
        assert info["cluster_known_nodes"] == "6"
        assert info["cluster_size"] == "3"
        assert nodes.slot_map(i) == nodes.slot_map(0)
    with nodes.client() as client:
        key = nodes.key_on(masters[0], "rep:")
        client.set(key, "v")
        nodes.wait_for_replication(masters[0], timeout=10)
        with nodes.node_client(nodes.replicas_of(masters[0])[0]) as replica:
            replica.readonly()
            assert replica.get(key) == b"v"
        nodes.flushall()  # masters only: a replica would refuse FLUSHALL
        assert client.exists(key) == 0


def test_pause_node_freezes_one_node(redis_cluster_replicas: RedisClusterNodes) -> None:
    nodes = redis_cluster_replicas
    with nodes.node_client(0, socket_timeout=0.2, retry=Retry(NoBackoff(), 0)) as node:
        pause = nodes.pause_node(0, 0.5)  # well below the 2 s node timeout: no failover
        with pytest.raises(redis.TimeoutError):
            node.ping()
        pause.join(5)
        assert pause.error is None
        assert node.ping()
    nodes.wait_until_consistent(timeout=20)


@pytest.mark.timeout(90)
def test_killed_master_fails_over_and_rejoins_as_a_replica() -> None:
    with RedisClusterNodes(3, replicas=1, node_timeout_ms=1000) as nodes:
        assert 0 < nodes.startup_seconds < nodes.startup_timeout
        servers = [server for server in nodes.servers if server is not None]
        dirs = [nodes.dir, *(server.dir for server in servers)]
        old = nodes.masters()[0]
        (replica,) = nodes.replicas_of(old)
        with nodes.client(socket_timeout=2, socket_connect_timeout=1) as client:
            key = nodes.key_on(old, "failover:")
            client.set(key, "before")
            # Replication is asynchronous: make sure the replica has the key first.
            nodes.wait_for_replication(old)

            began = time.monotonic()
            nodes.kill_node(old)
            assert nodes.index(old) not in nodes.live
            with pytest.raises(ValueError, match="is running"):
                nodes.wait_for_failover(replica)
            # Well within the 1 s node timeout: too early, and the error shows the logs.
            with pytest.raises(RuntimeError, match="did not reach a failover") as early:
                nodes.wait_for_failover(old, timeout=0.1)
            assert "promoted yet" in str(early.value)
            assert f"(port {old[1]}, killed) log:" in str(early.value)
            new = nodes.wait_for_failover(old, timeout=20)
            assert time.monotonic() - began < 20
            assert new == replica
            assert nodes.role(new) == "master"
            assert nodes.owner_of_slot(nodes.keyslot(key)) == new
            assert [nodes.cluster_info(i)["cluster_state"] for i in nodes.live] == ["ok"] * 5
            # The client that knew the old master finds the new one by itself.
            assert client.get(key) == b"before"
            client.set(key, "after")

            nodes.restart_node(old)
            assert nodes.index(old) in nodes.live
            assert nodes.role(old) == "slave"
            assert nodes.replicas_of(new) == [old]
            assert old not in nodes.masters()
            assert nodes.execute(old, "INFO", "replication")["master_link_status"] == "up"
            nodes.wait_for_replication(new)
            with nodes.node_client(old) as rejoined:
                rejoined.readonly()
                assert rejoined.get(key) == b"after"
            assert client.get(key) == b"after"
    assert nodes.servers == []
    assert all(server.process is None for server in servers)
    assert not any(Path(path).exists() for path in dirs)
