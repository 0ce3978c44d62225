"""Bulk loads weigh the bytes they move: measured per node, through a real slow link.

A shard moved whole costs its bytes each way; its blocks cost a command each but a
fraction of the bytes. On loopback a byte is almost free and a small shard goes whole;
through a slow link (``bench/link.py``'s TCP proxy, limited to 20 MB/s here, against
the real redis-server) the package measures what a byte costs and moves only the
blocks: the bytes Redis counts on its wire drop to a block's worth per element, and
every answer stays what one call per element gives.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
import redis

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.engine.bitmap.local import HAVE_NUMPY
from scrapy_redis_bloom.engine.bitmap.wirecost import LOOPBACK_NS_PER_BYTE, WireCost

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from link import Link

pytestmark = pytest.mark.skipif(not HAVE_NUMPY, reason="snapshots need numpy (the numpy extra)")

#: 31 shards of 196 KB (2M @ 1e-4): 250 elements a shard read it whole on loopback
#: (196 KB against 250 blocks' commands), their blocks through a slow link.
SETTINGS = {"BLOOMFILTER_CAPACITY": 2_000_000, "BLOOMFILTER_ERROR_RATE": 1e-4}
#: 20 MB/s: a byte costs 50 ns, 125 times loopback's.
SLOW = 20_000_000


def fingerprints(n: int, tag: str) -> list[str]:
    return [hashlib.sha1(f"{tag}-{i}".encode()).hexdigest() for i in range(n)]


def wire_bytes(admin: redis.Redis) -> int:
    stats = admin.info("stats")
    return int(stats["total_net_input_bytes"]) + int(stats["total_net_output_bytes"])


def load(client: redis.Redis, admin: redis.Redis, key: str, elements: list[str]) -> float:
    """Add ``elements`` in one call to a new filter; return the wire bytes per element."""
    bloom = RedisBloomFilter.from_config(client, key, BloomConfig.from_settings(SETTINGS))
    bloom.open()
    try:
        before = wire_bytes(admin)
        answers = bloom.add_many(elements)
        moved = (wire_bytes(admin) - before) / len(elements)
        assert answers.count(True) <= 1  # distinct fingerprints: a false positive at most
        # The same elements again: every one is found, through the same path.
        assert all(bloom.add_many(elements))
        # And one call per element agrees with the bulk answers.
        assert all(bloom.check_and_add(e) for e in elements[:200])
    finally:
        bloom.close()
    return moved


def test_a_slow_link_moves_blocks_and_loopback_whole_shards(
    redis_client: redis.Redis, redis_url: str
) -> None:
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    elements = fingerprints(7_750, "wire")  # ~250 per shard
    nears: list[float] = []
    for i in range(3):  # (loopback measures as slow only under heavy load: measured again)
        nears.append(load(redis_client, redis_client, f"wire:near{i}", elements))
        if nears[-1] > 1_000:
            break
    with Link(port, rate=SLOW, delay=0.0002) as link:
        far_client = redis.Redis(host="127.0.0.1", port=link.port)
        try:
            far = load(far_client, redis_client, "wire:far", elements)
        finally:
            far_client.close()
    # Loopback: each shard read whole and written back, ~1.5 KB per element.
    assert nears[-1] > 1_000, nears
    # Through the link: the blocks, a few hundred bytes per element (the probes that
    # measured the link included).
    assert far < 600, far


def test_the_measure_tells_a_slow_link_from_loopback(
    redis_client: redis.Redis, redis_url: str
) -> None:
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    redis_client.set("wire:probe", b"\x01" * 65_536)
    bloom = RedisBloomFilter.from_config(
        redis_client, "wire:m", BloomConfig.from_settings(SETTINGS)
    )
    # (A new WireCost measures again: the least of three, as a load burst adds, never takes.)
    near = min(WireCost(bloom.executor).extra("near", "wire:probe") for _ in range(3))
    with Link(port, rate=SLOW, delay=0.0) as link:
        far_client = redis.Redis(host="127.0.0.1", port=link.port)
        try:
            far_bloom = RedisBloomFilter.from_config(
                far_client, "wire:m", BloomConfig.from_settings(SETTINGS)
            )
            far = WireCost(far_bloom.executor).extra("far", "wire:probe")
        finally:
            far_client.close()
    # 50 ns a byte through the link (the proxy's own cost on top); loopback's is
    # LOOPBACK_NS_PER_BYTE, within the noise floor even on a busy machine.
    assert near == 0.0
    assert 50 - LOOPBACK_NS_PER_BYTE * 2 < far < 500, far
