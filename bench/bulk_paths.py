"""Calibrate the bulk path's choice: a shard moved whole against its blocks, forced each way.

``add_many`` answers a shard's elements by reading it whole (and writing back what
changed) or by reading and writing only the 64-byte blocks they touch; it picks by a
cost model (``engine/bitmap/bulk.py``: ``SNAPSHOT_NS_PER_BYTE`` per shard byte,
``BLOCKS_NS_PER_ELEMENT`` per block, plus what a byte costs on the wire,
``engine/bitmap/wirecost.py``). This script forces each path in turn (``Bulk._whole``
replaced in this process) on a fresh filter and prints fp/s, this process's and Redis's
CPU per fingerprint and the bytes on the wire, on loopback or through ``bench/link.py``
(``--link``), alternating the paths so the machine's drift hits both::

    python bench/bulk_paths.py --capacity 100000000 --call 1000000 --total 2000000 [--link]

Run it with and without hiredis installed: the blocks path's cost is mostly parsing one
reply per block. The figures behind the constants are in ``bench/NOTES.md``.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from link import Link  # noqa: E402
from redis_server import RedisServer  # noqa: E402

logger = logging.getLogger("bench.bulk_paths")


def main(argv: Sequence[str] | None = None) -> int:
    """Load a fresh filter through each path in turn; log what each cost."""
    from redis.utils import HIREDIS_AVAILABLE

    from scrapy_redis_bloom import BloomConfig
    from scrapy_redis_bloom.engine.backend import make_filter
    from scrapy_redis_bloom.engine.bitmap.bulk import Bulk

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--capacity", type=int, default=100_000_000)
    parser.add_argument("--call", type=int, default=1_000_000, help="fingerprints per call")
    parser.add_argument("--total", type=int, default=2_000_000, help="fingerprints per run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--link", action="store_true", help="through a 1 Gbit/s link")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    rng = random.Random(7)
    calls = [
        [f"{rng.getrandbits(160):040x}" for _ in range(args.call)]
        for _ in range(max(1, args.total // args.call))
    ]
    settings = {
        "BLOOMFILTER_CAPACITY": args.capacity,
        "BLOOMFILTER_ERROR_RATE": 1e-4,
        "BLOOMFILTER_BACKEND": "bitmap",
    }
    chosen = Bulk._whole
    with RedisServer() as server:
        admin = server.client()
        link = Link(server.port).start() if args.link else None
        try:
            for _ in range(args.rounds):
                for path in ("whole", "blocks"):
                    Bulk._whole = lambda *_, whole=(path == "whole"): whole  # type: ignore[method-assign]
                    admin.flushall()
                    client = redis.Redis(port=link.port if link else server.port)
                    bloom: Any = make_filter(client, "bf", BloomConfig.from_settings(settings))
                    bloom.open()
                    try:
                        _run(admin, bloom, calls, path, HIREDIS_AVAILABLE, args)
                    finally:
                        bloom.close()
                        client.close()
        finally:
            Bulk._whole = chosen  # type: ignore[method-assign]
            if link is not None:
                link.close()
    return 0


def _run(
    admin: Any, bloom: Any, calls: list[list[str]], path: str, hiredis: bool, args: Any
) -> None:
    """Time the calls on one path; log fp/s, CPU and wire bytes per fingerprint."""
    stats, cpu = admin.info("stats"), _cpu(admin)
    start, own = time.perf_counter(), time.process_time()
    for call in calls:
        bloom.add_many(call)
    took, own = time.perf_counter() - start, time.process_time() - own
    count = sum(map(len, calls))
    after = admin.info("stats")
    wire = sum(
        int(after[name]) - int(stats[name])
        for name in ("total_net_input_bytes", "total_net_output_bytes")
    )
    logger.info(
        "hiredis=%s %s %s calls of %s, %-6s: %9.0f fp/s, client %5.2f us/fp, Redis %5.2f"
        " us/fp, %6.0f B/fp",
        hiredis,
        "link" if args.link else "loopback",
        f"{args.capacity:,}",
        f"{args.call:,}",
        path,
        count / took,
        own / count * 1e6,
        (_cpu(admin) - cpu) / count * 1e6,
        wire / count,
    )


def _cpu(admin: Any) -> float:
    """Seconds of CPU Redis's main thread used so far."""
    info = admin.info("cpu")
    return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])


if __name__ == "__main__":
    raise SystemExit(main())
