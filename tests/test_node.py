"""Reply accounting on a real server: every reply matched to its command, or thrown away."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time

import pytest
import redis
from redis_server import RedisServer

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.core.errors import UnsupportedServerError
from scrapy_redis_bloom.transport.node import Node, NotSentError, ReplyLostError, connection_factory
from scrapy_redis_bloom.transport.wire import pack_command

SETTINGS = {"BLOOMFILTER_CAPACITY": 10_000, "BLOOMFILTER_ERROR_RATE": 0.001}


def fingerprints(n: int, salt: str) -> list[str]:
    return [hashlib.sha1(f"{salt}{i}".encode()).hexdigest() for i in range(n)]


def make_filter(client: redis.Redis, key: str = "node:bf") -> RedisBloomFilter:
    config = BloomConfig.from_settings(SETTINGS)
    bloom = RedisBloomFilter(client, key, config.spec, config.capacity)
    bloom.open()
    return bloom


def node_of(client: redis.Redis) -> Node:
    return Node("test", connection_factory(client.connection_pool))


def named_connections(client: redis.Redis, name: str) -> list[int]:
    return [int(c["id"]) for c in client.client_list() if c.get("name") == name]


def test_replies_come_back_in_order_and_errors_in_place(redis_client: redis.Redis) -> None:
    node = node_of(redis_client)
    first = node.send(pack_command(b"SET", b"a", b"1") + pack_command(b"LPUSH", b"a", b"x"), 2)
    second = node.send(pack_command(b"GET", b"a"), 1)
    assert node.owed == 2
    ok, wrong = node.receive(first)
    assert ok == b"OK"
    assert "WRONGTYPE" in str(wrong)
    assert node.receive(second) == [b"1"]
    assert node.owed == 0
    node.close()


def test_reading_out_of_order_throws_the_connection_away(redis_client: redis.Redis) -> None:
    node = node_of(redis_client)
    first = node.send(pack_command(b"PING"), 1)
    second = node.send(pack_command(b"ECHO", b"two"), 1)
    with pytest.raises(ReplyLostError, match="owed to an earlier batch"):
        node.receive(second)
    # Neither reply can be read any more: they are never handed to the wrong command.
    with pytest.raises(ReplyLostError):
        node.receive(first)
    assert node.exchange(pack_command(b"ECHO", b"three"), 1) == [b"three"]
    node.close()


def test_a_dead_server_is_not_sent_and_a_killed_connection_loses_replies(
    redis_server: RedisServer,
) -> None:
    admin = redis_server.client()
    client = redis_server.client(client_name="node-kill")
    node = node_of(client)
    assert node.exchange(pack_command(b"PING"), 1) == [b"PONG"]
    (connection,) = named_connections(admin, "node-kill")
    admin.client_kill_filter(_id=connection)
    # The command may have left before the kill was noticed: its reply is lost, not faked.
    with pytest.raises(ReplyLostError):
        node.exchange(pack_command(b"INCR", b"counter"), 1)
    assert node.exchange(pack_command(b"PING"), 1) == [b"PONG"]  # a new connection
    nowhere = Node("nowhere", connection_factory(redis.Redis(port=1).connection_pool))
    with pytest.raises(NotSentError):
        nowhere.exchange(pack_command(b"PING"), 1)
    node.close()
    admin.close()
    client.close()


def test_one_connection_per_server_for_every_call(redis_server: RedisServer) -> None:
    client = redis_server.client(client_name="node-one")
    client.flushall()
    bloom = make_filter(client)
    for e in fingerprints(50, "b"):
        bloom.check_and_add(e)
    bloom.add_many(fingerprints(500, "c"))
    assert len(named_connections(client, "node-one")) <= 2  # the filter's, and this test's
    bloom.close()
    deadline = time.monotonic() + 2  # the server notices the close asynchronously
    while len(named_connections(client, "node-one")) > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(named_connections(client, "node-one")) == 1
    assert bloom.check_and_add(fingerprints(1, "b")[0]) is True  # usable after close
    bloom.close()
    client.close()


def test_reloads_the_script_after_script_flush(redis_client: redis.Redis) -> None:
    bloom = make_filter(redis_client)
    elements = fingerprints(20, "c")
    assert [bloom.check_and_add(e) for e in elements[:10]] == [False] * 10
    redis_client.script_flush()
    assert [bloom.check_and_add(e) for e in elements] == [True] * 10 + [False] * 10


def test_a_killed_connection_never_turns_new_into_seen(redis_server: RedisServer) -> None:
    client = redis_server.client(client_name="node-hot")
    client.flushall()
    admin = redis_server.client()
    bloom = make_filter(client)
    elements = fingerprints(4, "d")
    assert bloom.check_and_add(elements[0]) is False
    for connection in named_connections(admin, "node-hot"):
        admin.client_kill_filter(_id=connection)
    assert bloom.check_and_add(elements[1]) is False
    assert [bloom.check_and_add(e) for e in elements] == [True, True, False, False]
    admin.close()
    client.close()


def test_a_timeout_leaves_no_reply_behind(redis_server: RedisServer) -> None:
    # The reply to a call that timed out must not be read as the next call's reply.
    # A timeout well above a loaded machine's hiccups, below the script's second or so.
    client = redis_server.client(socket_timeout=0.3, client_name="node-timeout")
    client.flushall()
    bloom = make_filter(client)
    element = fingerprints(1, "e")[0]
    assert bloom.check_and_add(fingerprints(1, "warm-up")[0]) is False
    # Keep the server busy for about a second with a script sent on another connection.
    blocker = redis.Connection(host="127.0.0.1", port=redis_server.port, socket_timeout=30)
    blocker.connect()
    blocker.send_command("EVAL", "local i = 0 while i < 150000000 do i = i + 1 end return i", 0)
    time.sleep(0.02)
    ambiguous = bloom.events.counts["ambiguous"]
    try:
        # Timed out, retried until the script ends: the retry finds the bits set by the
        # first attempt, and that doubt answers "new".
        assert bloom.check_and_add(element) is False
    finally:
        blocker.read_response()
        blocker.disconnect()
    assert bloom.events.counts["ambiguous"] == ambiguous + 1
    assert bloom.events.counts["retries"] >= 1
    assert bloom.contains(element) is True  # the command was delivered, so it ran
    after = fingerprints(3, "f")
    assert [bloom.check_and_add(e) for e in after] == [False] * 3
    assert [bloom.check_and_add(e) for e in after] == [True] * 3
    client.close()


def killed_after_a_batch(
    server: RedisServer, name: str
) -> tuple[redis.Redis, redis.Redis, RedisBloomFilter, list[str], list[str]]:
    """Add 2,000 elements through a client named ``name``, then kill its connections.

    Returns the client, an admin client, the filter, the elements added and 2,000 others.
    """
    client = server.client(client_name=name)
    client.flushall()
    admin = server.client()
    bloom = make_filter(client)
    first, second = fingerprints(2_000, f"{name}-a"), fingerprints(2_000, f"{name}-b")
    assert bloom.add_many(first) == [False] * 2_000
    for connection in named_connections(admin, name):
        admin.client_kill_filter(_id=connection)
    return client, admin, bloom, first, second


def test_bulk_answers_new_for_a_chunk_whose_replies_were_lost(
    redis_server: RedisServer,
) -> None:
    client, admin, bloom, first, second = killed_after_a_batch(redis_server, "node-bulk")
    # Sent at once on the killed connection, the chunk's replies are lost and it runs
    # again: its "already there" answers can no longer be trusted, so they answer new.
    answers = bloom.add_many(second + first)
    assert answers[:2_000] == [False] * 2_000
    assert answers[2_000:].count(False) == bloom.events.counts["ambiguous"]
    assert bloom.contains_many(second + first) == [True] * 4_000
    admin.close()
    client.close()


def test_a_connection_closed_while_idle_is_found_before_sending(
    redis_server: RedisServer,
) -> None:
    client, admin, bloom, first, second = killed_after_a_batch(redis_server, "node-idle")
    time.sleep(1.2)  # idle long enough to be checked before the next send
    assert bloom.add_many(second + first) == [False] * 2_000 + [True] * 2_000
    assert bloom.check_and_add(first[0]) is True
    assert bloom.events.counts["ambiguous"] == 0
    admin.close()
    client.close()


def test_a_thread_and_the_main_thread_share_the_connection_in_turn(
    redis_client: redis.Redis,
) -> None:
    bloom = make_filter(redis_client)
    first = fingerprints(300, "a")
    assert [bloom.check_and_add(e) for e in first] == [False] * 300
    other: list[bool] = []
    thread = threading.Thread(target=lambda: other.extend(bloom.check_and_add(e) for e in first))
    thread.start()
    thread.join()
    assert other == [True] * 300
    assert bloom.contains_many(first) == [True] * 300


def test_responds_tells_a_server_that_answers_from_one_that_does_not() -> None:
    """``Node.responds`` (the executor's watch of a server that stopped answering).

    Any reply counts, a refused password too; a stopped server or a closed port does not.
    """
    with RedisServer(password="right") as server:
        right = redis.Redis("127.0.0.1", server.port, password="right", socket_timeout=0.5)
        wrong = redis.Redis("127.0.0.1", server.port, password="wrong", socket_timeout=0.5)
        assert node_of(right).responds() is True
        assert node_of(wrong).responds() is True  # refused: but the server is there
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            began = time.monotonic()
            assert node_of(right).responds() is False
            assert time.monotonic() - began < 2.0  # within its socket timeouts
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        assert node_of(right).responds() is True
        port = server.port
    gone = redis.Redis("127.0.0.1", port, socket_timeout=0.5)
    assert node_of(gone).responds() is False


def test_a_refused_connection_setup_is_named_not_raised_raw(redis_server: RedisServer) -> None:
    # A database number out of range (SELECT 99) refused in the handshake escaped as
    # redis-py's ResponseError out of request_seen, naming no setting (a probe).
    client = redis.Redis.from_url(f"redis://127.0.0.1:{redis_server.port}/99")
    bloom = RedisBloomFilter.from_config(
        client, "setup", BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 1_000})
    )
    with pytest.raises(UnsupportedServerError, match=r"refuses the connection's setup: DB index"):
        bloom.check_and_add("x" * 40)
    client.close()
