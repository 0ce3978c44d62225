"""The hot path's hand-packed script calls, against a real Redis: replies, errors, recovery."""

from __future__ import annotations

import hashlib
import threading
import time

import pytest
import redis
from redis_server import RedisServer

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter, WrongTypeError

SETTINGS = {"BLOOMFILTER_CAPACITY": 10_000, "BLOOMFILTER_ERROR_RATE": 0.001}


def fingerprints(n: int, salt: str) -> list[str]:
    return [hashlib.sha1(f"{salt}{i}".encode()).hexdigest() for i in range(n)]


def make_filter(client: redis.Redis, key: str = "wire:bf") -> RedisBloomFilter:
    config = BloomConfig.from_settings(SETTINGS)
    bloom = RedisBloomFilter(client, key, config.spec, config.capacity)
    bloom.open()
    return bloom


def held_connection_id(client: redis.Redis) -> int:
    """Return the server-side id of this client's one connection that last ran EVALSHA.

    Test clients are named (``client_name``), so other tests' connections don't count.
    """
    name = client.connection_pool.connection_kwargs["client_name"]
    ids = [
        int(c["id"])
        for c in client.client_list()
        if c["cmd"] == "evalsha" and c.get("name") == name
    ]
    assert len(ids) == 1, client.client_list()
    return ids[0]


def test_replies_match_the_client_path(redis_client: redis.Redis) -> None:
    # The same elements through the hand-packed path and through redis-py's own
    # EVALSHA (another thread) give the same answers: new once, seen afterwards.
    bloom = make_filter(redis_client)
    first = fingerprints(300, "a")
    assert [bloom.check_and_add(e) for e in first] == [False] * 300
    other: list[bool] = []
    thread = threading.Thread(target=lambda: other.extend(bloom.check_and_add(e) for e in first))
    thread.start()
    thread.join()
    assert other == [True] * 300
    assert bloom.contains_many(first) == [True] * 300
    assert [bloom.check_and_add(e) for e in first] == [True] * 300


def test_connection_is_held_once_and_given_back(redis_client: redis.Redis) -> None:
    bloom = make_filter(redis_client)
    pool = redis_client.connection_pool
    for e in fingerprints(50, "b"):
        bloom.check_and_add(e)
    assert len(pool._in_use_connections) == 1  # one connection for every call
    bloom.close()
    assert len(pool._in_use_connections) == 0
    assert bloom.check_and_add(fingerprints(1, "b")[0]) is True  # usable after close


def test_reloads_the_script_after_script_flush(redis_client: redis.Redis) -> None:
    bloom = make_filter(redis_client)
    elements = fingerprints(20, "c")
    assert [bloom.check_and_add(e) for e in elements[:10]] == [False] * 10
    redis_client.script_flush()
    assert [bloom.check_and_add(e) for e in elements] == [True] * 10 + [False] * 10


def test_recovers_when_the_server_drops_the_connection(redis_server: RedisServer) -> None:
    client = redis_server.client(client_name="wire-kill")
    client.flushall()
    bloom = make_filter(client)
    elements = fingerprints(4, "d")
    assert bloom.check_and_add(elements[0]) is False
    killed = client.client_kill_filter(_id=held_connection_id(client))
    assert killed == 1
    # The next call finds the held connection dead and goes through the client.
    assert bloom.check_and_add(elements[1]) is False
    assert [bloom.check_and_add(e) for e in elements] == [True, True, False, False]
    client.close()


def test_a_timeout_leaves_no_reply_behind(redis_server: RedisServer) -> None:
    # The reply to a call that timed out must not be read as the next call's reply.
    client = redis_server.client(socket_timeout=0.05, client_name="wire-timeout")
    client.flushall()
    bloom = make_filter(client)
    element = fingerprints(1, "e")[0]
    assert bloom.check_and_add(fingerprints(1, "warm-up")[0]) is False
    held = held_connection_id(client)
    # Keep the server busy for a few hundred ms with a script sent on another connection.
    blocker = redis_server.client().connection_pool.get_connection()
    blocker.send_command("EVAL", "local i = 0 while i < 30000000 do i = i + 1 end return i", 0)
    time.sleep(0.02)
    try:
        bloom.check_and_add(element)
    except redis.exceptions.TimeoutError:
        pass  # whether the client's own retries outlast the script is redis-py's policy
    finally:
        blocker.read_response(timeout=30)
        blocker.disconnect()
    # The held connection timed out, so it was dropped (and a new one is used).
    assert held not in [int(c["id"]) for c in client.client_list()]
    assert bloom.contains(element) is True  # the command was delivered, so it ran
    after = fingerprints(3, "f")
    assert [bloom.check_and_add(e) for e in after] == [False] * 3
    assert [bloom.check_and_add(e) for e in after] == [True] * 3
    client.close()


def test_wrong_type_is_named_on_the_hot_path(redis_client: redis.Redis) -> None:
    bloom = make_filter(redis_client)
    element = fingerprints(1, "g")[0]
    bloom.check_and_add(element)
    for key in bloom.shard_keys:
        redis_client.delete(key)
        redis_client.lpush(key, "not a bitmap")
    with pytest.raises(WrongTypeError, match="list"):
        bloom.check_and_add(fingerprints(1, "h")[0])
    # The error reply was read to its end: the connection still answers in step.
    for key in bloom.shard_keys:
        redis_client.delete(key)
    assert bloom.check_and_add(fingerprints(1, "h")[0]) is False


def test_bulk_recovers_when_the_server_drops_the_connection(redis_server: RedisServer) -> None:
    client = redis_server.client(client_name="wire-bulk")
    client.flushall()
    bloom = make_filter(client)
    first, second = fingerprints(2_000, "i"), fingerprints(2_000, "j")
    assert bloom.add_many(first) == [False] * 2_000
    me = client.client_id()
    named = [int(c["id"]) for c in client.client_list() if c.get("name") == "wire-bulk"]
    killed = [client.client_kill_filter(_id=i) for i in named if i != me]
    assert killed == [1]  # the held connection: bulk calls borrow no other
    # The held connection is dead: the bulk calls notice and go through the client.
    assert bloom.add_many(second + first) == [False] * 2_000 + [True] * 2_000
    assert bloom.contains_many(second) == [True] * 2_000
    client.close()
