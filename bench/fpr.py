"""Measure the false-positive rate against theory: ``python bench/fpr.py``.

For a few (capacity, error rate) pairs it fills a filter to capacity with distinct
fingerprints (``add_many``), queries as many others that were never added
(``contains_many``) and compares the false positives with the binomial expectation
of (1 - e^(-kn/m))^k, as a z-score. It starts its own redis-server.
"""

from __future__ import annotations

import math
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from redis_server import RedisServer

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.core.sizing import false_positive_rate

CASES = [(20_000, 0.01, 200_000), (100_000, 0.001, 1_000_000), (1_000_000, 1e-4, 2_000_000)]


def fingerprints(n: int, tag: str) -> list[str]:
    """Return n distinct 40-hex fingerprints (uuid5, padded)."""
    return [uuid.uuid5(uuid.NAMESPACE_URL, f"{tag}{i}").hex + "00000000" for i in range(n)]


def main() -> int:
    """Run every case and print one line each."""
    with RedisServer() as server:
        client = server.client()
        for capacity, rate, queries in CASES:
            config = BloomConfig.from_settings(
                {"BLOOMFILTER_CAPACITY": capacity, "BLOOMFILTER_ERROR_RATE": rate}
            )
            spec = config.spec
            bloom = RedisBloomFilter(client, f"fpr:{capacity}", spec, capacity)
            bloom.add_many(fingerprints(capacity, "member"))
            hits = sum(bloom.contains_many(fingerprints(queries, "stranger")))
            theory = false_positive_rate(spec.bits, spec.hash_count, capacity, spec.block_bits)
            sigma = math.sqrt(queries * theory * (1 - theory))
            expected = queries * theory
            sys.stdout.write(
                f"n={capacity:,} p={rate:g}: m={spec.bits:,} k={spec.hash_count}"
                f" shards={spec.shards}; {hits:,} false positives in {queries:,} queries"
                f" = {hits / queries:.3g}; theory {theory:.3g} (expected {expected:,.0f}"
                f" ± {sigma:,.0f}, z={(hits - expected) / sigma:+.2f}); predicted from the"
                f" fill {bloom.state().estimated_fpr:.3g}\n"
            )
            bloom.clear()
    return 0


if __name__ == "__main__":
    sys.exit(main())
