"""Bulk adds by filter state: ``add_many`` fp/s on a fresh, a grown and a windowed filter.

Issue 32 asks ``add_many`` on a filter grown to 3x, and on one with re-crawl windows
(``BLOOMFILTER_TTL``), for at least half the same filter's fresh rate, with and
without numpy. This measures that, against a Redis given by URL, in three steps:

* ``prepare``: fill the states once, under ``bench:states:<state>``: ``fresh``,
  created empty; ``grown``, 3x its capacity added (at 1M @ 1e-4, every shard's
  generation 1 is then within its margin of capacity: the first ~1,000 new items per
  shard go through the script, which starts generation 2); ``grown+``, 3.1x (every
  shard in generation 2); ``ttl``, a windowed filter with half its capacity in the
  current window; ``ttl2``, the same with a window before it (a copy of the current
  one under the previous window's name, the anchor saying it existed);
* ``measure``: per state and call size, copy the state's keys to a scratch filter
  (the same filter id: ``COPY``), add new fingerprints in calls of that size, and
  print the fp/s as one JSON line; run it with the code to measure on ``PYTHONPATH``
  (a worktree of an older commit, say) and ``--no-numpy`` for a default install
  (numpy hidden from the import);
* ``clean``: delete what ``prepare`` wrote.

``--backend native`` measures the same states of RedisBloom-backed filters (``fresh``,
``grown``, ``grown+``, ``ttl``), against a Redis that has the module.

Example (a redis-server on port 6399)::

    python bench/bulk_states.py prepare --url redis://localhost:6399 --capacity 1000000
    PYTHONPATH=/work/base python bench/bulk_states.py measure --url ... --capacity 1000000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

STATES = ("fresh", "grown", "grown+", "ttl", "ttl2")
PREFIX = "bench:states"


#: The backend of the filters (``--backend``): the bitmap one, or RedisBloom's ``native``.
BACKEND = "bitmap"


def settings(state: str, capacity: int, error_rate: float) -> dict[str, Any]:
    """Return the settings of a state's filter."""
    out: dict[str, Any] = {
        "BLOOMFILTER_CAPACITY": capacity,
        "BLOOMFILTER_ERROR_RATE": error_rate,
        "BLOOMFILTER_BACKEND": BACKEND,
    }
    if state.startswith("ttl"):
        out["BLOOMFILTER_TTL"] = 3_600
    return out


def fingerprints(n: int, tag: str, start: int = 0) -> list[str]:
    """Return n distinct fingerprints (hex SHA-1), as a crawl's are."""
    return [hashlib.sha1(f"{tag}-{i}".encode()).hexdigest() for i in range(start, start + n)]


def make(client: Any, key: str, state: str, capacity: int, error_rate: float) -> Any:
    """Return a state's filter under ``key``, of the backend and the code on the path."""
    from scrapy_redis_bloom import BloomConfig, RedisBloomFilter

    config = BloomConfig.from_settings(settings(state, capacity, error_rate))
    if BACKEND == "native":  # built as the dupefilter builds it (the bitmap class is bitmap's)
        from scrapy_redis_bloom.engine.backend import make_filter

        return make_filter(client, key, config)
    return RedisBloomFilter.from_config(client, key, config)


def prepare(client: Any, capacity: int, error_rate: float, states: Sequence[str] = STATES) -> None:
    """Fill each state's filter once."""
    fill = {"fresh": 0, "grown": 3 * capacity, "grown+": 31 * capacity // 10, "ttl": capacity // 2}
    for state in states:
        if state == "ttl2":
            windows_before(client, capacity, error_rate)
            continue
        bloom = make(client, f"{PREFIX}:{state}", state, capacity, error_rate)
        bloom.open()
        step = 200_000
        for start in range(0, fill[state], step):
            bloom.add_many(fingerprints(min(step, fill[state] - start), "fill", start))
        bloom.close()
        sys.stderr.write(f"prepared {state}: {fill[state]:,} items\n")


def windows_before(client: Any, capacity: int, error_rate: float) -> None:
    """Make ``ttl2``: ``ttl`` with its current window copied as the one before."""
    copy_state(client, "ttl", f"{PREFIX}:ttl2")
    source = f"{PREFIX}:ttl2"
    for name in list(client.scan_iter(match=f"*{source}*:w*", count=1_000)):
        text = name.decode()
        head, window, generation = text.rsplit(":", 2)
        before = f"{head}:w{int(window[1:]) - 1}:{generation}"
        client.copy(text, before, replace=True)
    for name in list(client.scan_iter(match=f"{{{source}:*}}:g0", count=1_000)):
        client.setrange(name, 26, (1).to_bytes(2, "big"))  # the window before existed
    sys.stderr.write("prepared ttl2: two windows\n")


def copy_state(client: Any, state: str, scratch: str) -> None:
    """Copy a state's keys to the filter ``scratch`` (the same filter, under another key)."""
    source = f"{PREFIX}:{state}"
    for name in client.scan_iter(match=f"*{source}*", count=1_000):
        text = name.decode()
        if BACKEND == "native":  # COPY does not take a module's keys (RedisBloom's)
            client.restore(text.replace(source, scratch), 0, client.dump(text), replace=True)
        else:
            client.copy(text, text.replace(source, scratch), replace=True)


def drop(client: Any, key: str) -> None:
    """Delete every key of the filter ``key``."""
    for name in client.scan_iter(match=f"*{key}*", count=1_000):
        client.delete(name)


def measure(
    client: Any,
    capacity: int,
    error_rate: float,
    calls: list[int],
    total: int,
    rounds: int,
    states: Sequence[str] = STATES,
) -> None:
    """Print a JSON line per state and call size: fp/s of add_many of new fingerprints."""
    from scrapy_redis_bloom.engine.bitmap.local import HAVE_NUMPY

    for size in calls:
        for state in states:
            rates: list[float] = []
            cpu: list[float] = []  # µs of CPU (this process and Redis) per fingerprint
            for r in range(rounds):
                scratch = f"bench:scratch:{state}"
                drop(client, scratch)
                copy_state(client, state, scratch)
                bloom = make(client, scratch, state, capacity, error_rate)
                bloom.open()
                new = fingerprints(total, f"new-{size}-{r}")
                before = _redis_cpu(client)
                started, python = time.perf_counter(), time.process_time()
                answers: list[bool] = []
                for at in range(0, total, size):
                    answers += bloom.add_many(new[at : at + size])
                elapsed = time.perf_counter() - started
                python = time.process_time() - python
                cpu.append((python + _redis_cpu(client) - before) / total * 1e6)
                bloom.close()
                drop(client, scratch)
                rates.append(total / elapsed)
                assert answers.count(False) >= 0.99 * total, answers.count(False)
            row = {
                "state": state,
                "call": size,
                "numpy": HAVE_NUMPY,
                "capacity": capacity,
                "fp_per_s": round(max(rates)),
                "rates": [round(x) for x in rates],
                "cpu_us_per_fp": round(min(cpu), 2),
            }
            sys.stdout.write(json.dumps(row) + "\n")
            sys.stdout.flush()


def _redis_cpu(client: Any) -> float:
    """Return the seconds of CPU the Redis server has used (user and system)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def main() -> None:
    """Run the step named on the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["prepare", "measure", "clean"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--error-rate", type=float, default=1e-4)
    parser.add_argument("--calls", default="10000,100000")
    parser.add_argument("--total", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-numpy", action="store_true", help="hide numpy from the import")
    parser.add_argument("--states", default=",".join(STATES))
    parser.add_argument(
        "--backend",
        choices=["bitmap", "native"],
        default="bitmap",
        help="the filters' backend (native: a Redis with RedisBloom; its states are kept"
        " apart, and 'ttl2' is the bitmap layout's only)",
    )
    args = parser.parse_args()
    global BACKEND, PREFIX
    BACKEND = args.backend
    if BACKEND == "native":
        PREFIX = "bench:native-states"
    if args.no_numpy:
        sys.modules["numpy"] = None  # type: ignore[assignment]  # an ImportError from now on
    import redis

    client = redis.Redis.from_url(args.url)
    states = args.states.split(",")
    if args.step == "prepare":
        prepare(client, args.capacity, args.error_rate, states)
    elif args.step == "measure":
        calls = [int(c) for c in args.calls.split(",")]
        measure(client, args.capacity, args.error_rate, calls, args.total, args.rounds, states)
    else:
        for state in states:
            drop(client, f"{PREFIX}:{state}")


if __name__ == "__main__":
    main()
