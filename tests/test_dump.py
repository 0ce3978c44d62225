"""Dump and restore of a filter (engine side), on real servers: exact round trips, refusals.

A round trip is exact when every fingerprint added answers "seen" afterwards AND the
bits are identical (each part's bytes, so BITCOUNT per shard), the record keeps its
geometry and id, the counters their counts, and fresh fingerprints answer "new" at
the rate the filter was sized for. A refused file leaves no key behind.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from scrapy_redis_bloom import BloomConfig
from scrapy_redis_bloom.engine.backend import make_filter
from scrapy_redis_bloom.engine.restore import restore_filter
from scrapy_redis_bloom.engine.transfer import dump_filter

KEY = "dumped"


def fingerprints(n: int, tag: str) -> list[str]:
    return [hashlib.sha1(f"{tag}-{i}".encode()).hexdigest() for i in range(n)]


def config(capacity: int, rate: float, **more: Any) -> BloomConfig:
    return BloomConfig.from_settings(
        {"BLOOMFILTER_CAPACITY": capacity, "BLOOMFILTER_ERROR_RATE": rate, **more}
    )


def upper(queries: int, rate: float) -> float:
    """Return the most false positives q new elements give at rate p, but for a 1e-9 chance."""
    return queries * rate + 6 * math.sqrt(queries * rate * (1 - rate))


def filled(client: Any, cfg: BloomConfig, members: list[str], key: str = KEY) -> Any:
    bloom = make_filter(client, key, cfg, faults=cfg.faults)
    bloom.add_many(members)
    bloom.sync_counters()
    return bloom


def part_bytes(client: Any, bloom: Any) -> dict[str, bytes]:
    """Return every part's bytes by key name: shards and their generations (or BF dumps)."""
    out: dict[str, bytes] = {}
    record = bloom.parts.read_record()
    pattern = "{" + bloom.key + ":*}:*"
    clients = client if isinstance(client, list) else [client]
    for c in clients:
        if isinstance(c, RedisCluster):
            keys = c.keys(pattern, target_nodes=RedisCluster.ALL_NODES)
        else:
            keys = c.keys(pattern)
        for name in keys:
            name = name.decode()
            if record.backend == "native":
                chunks, cursor = [], 0
                while True:
                    cursor, data = c.execute_command("BF.SCANDUMP", name, cursor)
                    if cursor == 0:
                        break
                    chunks.append(bytes(data))
                out[name] = b"".join(chunks)
            else:
                out[name] = c.get(name)
    return out


def all_keys(client: Any) -> list[bytes]:
    clients = client if isinstance(client, list) else [client]
    found: list[bytes] = []
    for c in clients:
        if isinstance(c, RedisCluster):
            found += c.keys("*", target_nodes=RedisCluster.ALL_NODES)
        else:
            found += c.keys("*")
    return sorted(found)


def dump(bloom: Any, path: Path, **kwargs: Any) -> Any:
    with path.open("wb") as out:
        return dump_filter(bloom, out, **kwargs)


def restore(client: Any, path: Path, key: str = KEY, **kwargs: Any) -> Any:
    with path.open("rb") as inp:
        return restore_filter(client, key, inp, **kwargs)


def reopened(client: Any, cfg: BloomConfig, key: str = KEY) -> Any:
    bloom = make_filter(client, key, cfg, faults=cfg.faults)
    bloom.open(create=False)
    return bloom


def round_trip(source: Any, target: Any, tmp_path: Path, members: list[str], cfg: Any) -> None:
    """Dump, reset, restore into ``target``; check the answers, the bits, the record."""
    bloom = filled(source, cfg, members)
    before = part_bytes(source, bloom)
    record = bloom.parts.read_record()
    totals = bloom.totals()
    path = tmp_path / "filter.dump"
    summary = dump(bloom, path)
    assert summary.added == totals.added
    assert totals.added + totals.seen == len(members)
    assert summary.totals.file_bytes == path.stat().st_size
    bloom.clear()
    bloom.close()
    assert all_keys(source) == []
    restored = restore(target, path)
    assert restored.totals == summary.totals
    again = reopened(target, cfg)
    after = part_bytes(target, again)
    assert after == before  # every part, byte for byte: same fill, BITCOUNT, headers
    got = again.parts.read_record()
    assert got.filter_id == record.filter_id
    assert (got.spec, got.capacity, got.sizing) == (record.spec, record.capacity, record.sizing)
    assert (got.expansion, got.created) == (record.expansion, record.created)
    assert got.servers == (len(target) if isinstance(target, list) else 1)
    assert again.totals() == totals
    assert all(again.contains_many(members))
    strangers = fingerprints(20_000, "stranger")
    assert sum(again.contains_many(strangers)) <= upper(20_000, cfg.expected_error_rate)
    assert sum(again.check_and_add_many(strangers[:1000])) <= upper(1000, cfg.expected_error_rate)
    again.close()


# -- round trips ------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_200k_fingerprints_survive_dump_reset_restore_exactly(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    cfg = config(250_000, 1e-3, BLOOMFILTER_SHARDS=8)
    round_trip(redis_client, redis_client, tmp_path, fingerprints(200_000, "seen"), cfg)
