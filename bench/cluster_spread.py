"""Show how a filter's shards spread over the masters of a 3-master Redis Cluster.

Run: ``python bench/cluster_spread.py``.

It forms a real cluster on loopback ports (tests/redis_cluster.py), then, for a few
filter sizes, counts the shard keys each master serves.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from redis_cluster import RedisClusterNodes

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter

SIZES = [
    {"BLOOMFILTER_CAPACITY": 10**6, "BLOOMFILTER_ERROR_RATE": 1e-4},
    {"BLOOMFILTER_BIT": 30},
    {"BLOOMFILTER_CAPACITY": 10**9, "BLOOMFILTER_ERROR_RATE": 1e-4},
]


def main() -> int:
    """Print, per filter size, the shard count of each master."""
    with RedisClusterNodes() as nodes:
        client = nodes.client()
        for settings in SIZES:
            config = BloomConfig.from_settings(settings)
            bloom = RedisBloomFilter(client, "demo:bloomfilter", config.spec, config.capacity)
            per_master = collections.Counter(nodes.node_of(key) for key in bloom.shard_keys)
            counts = sorted(per_master.values(), reverse=True)
            sys.stdout.write(f"{settings}: {config.spec.shards} shards -> per master {counts}\n")
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
