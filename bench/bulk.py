"""Bulk adds against RedisBloom's BF.MADD, in one run: ``python bench/bulk.py [N] [ROUNDS]``.

Issue 12, item 4: ``RedisBloomFilter.add_many`` must reach at least 0.22x the
fingerprints per second of RedisBloom's ``BF.MADD`` on the bitmap backend, on the
default (growing) filter and on a fixed one (``BLOOMFILTER_EXPANSION = 0``). One
redis-server 7 with RedisBloom loaded (see ``tests/redis_modules.py``) serves all
three, round after round, so the ratios compare like with like on a shared machine:

* ours: N fingerprints (default 1,000,000) into a filter of capacity 1,000,000 at 1e-4
  (``BloomConfig.from_settings`` then ``RedisBloomFilter.from_config``), one call;
* BF.MADD: the same fingerprints into ``BF.RESERVE bf 1e-4 1000000``, 1,000 a command,
  packed by hand (the client's fastest), 20 commands a round trip.

The figures are logged; nothing is written.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from redis_modules import SKIP_REASON, bloom_server  # type: ignore[import-not-found,unused-ignore]
from redis_server import RedisServer  # type: ignore[import-not-found,unused-ignore]

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter

logger = logging.getLogger("bench.bulk")

CAPACITY = 1_000_000
RATE = 1e-4
PER_MADD = 1_000
MADDS_PER_TRIP = 20


def ours(client: redis.Redis, elements: list[str], expansion: int | None) -> float:
    """Return add_many's fingerprints per second into a new filter (growing by default)."""
    settings: dict[str, object] = {"BLOOMFILTER_CAPACITY": CAPACITY, "BLOOMFILTER_ERROR_RATE": RATE}
    if expansion is not None:
        settings["BLOOMFILTER_EXPANSION"] = expansion
    bloom = RedisBloomFilter.from_config(client, "bench-bulk", BloomConfig.from_settings(settings))
    bloom.open()
    started = time.perf_counter()
    answers = bloom.add_many(elements)
    elapsed = time.perf_counter() - started
    if sum(answers) > len(elements) * RATE * 10:
        raise AssertionError(f"{sum(answers)} distinct fingerprints answered seen")
    bloom.clear()
    bloom.close()
    return len(elements) / elapsed


def madd(client: redis.Redis, elements: list[str]) -> float:
    """Return BF.MADD's fingerprints per second, packed by hand and pipelined."""
    client.execute_command("BF.RESERVE", "bf", RATE, CAPACITY)
    connection = client.connection_pool.get_connection()
    started = time.perf_counter()
    trip = PER_MADD * MADDS_PER_TRIP
    for start in range(0, len(elements), trip):
        commands = []
        for first in range(start, min(len(elements), start + trip), PER_MADD):
            batch = elements[first : first + PER_MADD]
            commands.append(
                b"*%d\r\n$7\r\nBF.MADD\r\n$2\r\nbf\r\n" % (2 + len(batch))
                + b"".join(b"$%d\r\n%s\r\n" % (len(e), e.encode()) for e in batch)
            )
        connection.send_packed_command([b"".join(commands)])
        for _ in commands:
            connection.read_response()
    elapsed = time.perf_counter() - started
    client.connection_pool.release(connection)
    client.delete("bf")
    return len(elements) / elapsed


def main() -> int:
    """Run the rounds and log each contender's rates and the ratios to BF.MADD's best."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    found = bloom_server()
    if found is None:
        logger.error("%s", SKIP_REASON)
        return 1
    binary, module = found
    elements = [hashlib.sha1(b"%d" % i).hexdigest() for i in range(count)]
    rates: dict[str, list[float]] = {}
    with RedisServer("--loadmodule", module, binary=binary) as server:
        client = server.client()
        contenders: dict[str, Callable[[], float]] = {
            "ours, fixed (expansion 0)": lambda: ours(client, elements, 0),
            "ours, growing (default)": lambda: ours(client, elements, None),
            "RedisBloom BF.MADD": lambda: madd(client, elements),
        }
        for _ in range(rounds):
            for name, run in contenders.items():
                rates.setdefault(name, []).append(run())
        client.close()
    best = max(rates["RedisBloom BF.MADD"])
    for name, measured in rates.items():
        logger.info(
            "%-28s %s fp/s  best/BF.MADD best = %.2fx",
            name,
            ", ".join(f"{rate:,.0f}" for rate in measured),
            max(measured) / best,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
