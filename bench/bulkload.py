"""One timed bulk load for measure (s): fingerprints given in calls of a fixed size.

A script seeding a filter from a file, or moving a scrapy-redis SET in pages, hands
the filter its fingerprints in calls of 10,000 to 100,000. :func:`load_ours` times
``add_many`` on such calls, :func:`load_madd` RedisBloom's ``BF.MADD`` on the same
ones, and both read what the load cost Redis (:class:`RedisCost`): ``INFO
commandstats`` and the main thread's CPU time (``INFO cpu``).

Run as a script (``python bench/bulkload.py --without numpy,hiredis SPEC``), it
makes a default install out of the benchmark's environment: the modules named cannot
be imported (``sys.modules[name] = None`` before anything imports redis or the
package), which is what ``pip install scrapy-redis-bloom`` without extras gives. It
then runs :func:`load_ours` on the JSON ``SPEC`` (or, with ``"peer": "madd"``,
:func:`load_madd`: BF.MADD from the same install) and prints the result as JSON. Only
the standard library is imported at the top, so nothing reaches numpy or hiredis
before they are blocked.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

logger = logging.getLogger("bench.bulkload")

#: Commands of commandstats left out of the sum: the benchmark's own (INFO, CONFIG
#: RESETSTAT), and the wrappers whose inner commands commandstats counts one by one
#: too (EXEC's queued commands, a script's redis.call): each command is counted once.
WRAPPERS = frozenset({"exec", "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"})
OWN = frozenset({"config|resetstat", "info"})
#: Fingerprints per BF.MADD command, and commands per pipeline flush (as bench/peers.py).
MADD_CHUNK = 1_000
MADD_BATCH = 10


@dataclass
class RedisCost:
    """What a span of work cost Redis: command time by commandstats, main-thread CPU."""

    #: commandstats' usec summed over every command once (wrappers left out, see WRAPPERS).
    command_usec: int = 0
    #: The wrappers' own usec (their inner commands included: not added to the above).
    wrapper_usec: int = 0
    #: used_cpu_user_main_thread + used_cpu_sys_main_thread over the span, in usec.
    cpu_usec: float = float("nan")
    #: commandstats of the span: {command: calls}.
    calls: dict[str, int] = field(default_factory=dict)
    #: Bytes Redis read from its clients and wrote to them over the span (INFO stats
    #: total_net_input_bytes / total_net_output_bytes): what crossed the network.
    net_in: int = 0
    net_out: int = 0


class RedisClock:
    """Reset commandstats and note the main thread's CPU; later read what ran since."""

    def __init__(self, admin: Any) -> None:
        self.admin = admin
        self._cpu = float("nan")
        self._net = (0, 0)

    def start(self) -> None:
        """CONFIG RESETSTAT, then note the CPU time and the network bytes so far."""
        self.admin.config_resetstat()
        self._cpu = main_thread_cpu(self.admin)
        self._net = net_bytes(self.admin)

    def read(self) -> RedisCost:
        """Return what Redis spent since :meth:`start`."""
        cpu = main_thread_cpu(self.admin)
        net_in, net_out = net_bytes(self.admin)
        stats = self.admin.info("commandstats")
        cost = RedisCost(
            cpu_usec=(cpu - self._cpu) * 1e6,
            net_in=net_in - self._net[0],
            net_out=net_out - self._net[1],
        )
        for name, values in stats.items():
            command = name.removeprefix("cmdstat_")
            if command in OWN:
                continue
            usec, calls = int(values["usec"]), int(values["calls"])
            cost.calls[command] = calls
            if command in WRAPPERS:
                cost.wrapper_usec += usec
            else:
                cost.command_usec += usec
        return cost


def main_thread_cpu(admin: Any) -> float:
    """Seconds of CPU Redis's main thread used so far (NaN if INFO cpu lacks the fields)."""
    cpu = admin.info("cpu")
    try:
        return float(cpu["used_cpu_user_main_thread"]) + float(cpu["used_cpu_sys_main_thread"])
    except KeyError:
        return float("nan")


def net_bytes(admin: Any) -> tuple[int, int]:
    """Bytes Redis has read from and written to clients since it started (INFO stats)."""
    stats = admin.info("stats")
    return int(stats["total_net_input_bytes"]), int(stats["total_net_output_bytes"])


@dataclass
class Load:
    """One timed bulk load: what went in, how long it took, what Redis spent."""

    elements: int
    calls: int
    seconds: float
    #: Elements answered "already there" (false positives, for distinct fingerprints).
    seen: int
    cost: RedisCost
    #: Stopped at the time cap before every fingerprint was given.
    capped: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Elements per second."""
        return self.elements / self.seconds if self.seconds > 0 else float("nan")


@functools.lru_cache(maxsize=1)
def _fingerprints(count: int) -> list[str]:
    """Return the first ``count`` fingerprints of ``workloads``, made once per process."""
    from workloads import fingerprints

    return fingerprints(count)


def _calls(elements: Sequence[str], size: int) -> list[Sequence[str]]:
    """Cut the fingerprints into calls of ``size`` (sliced before any timing)."""
    return [elements[i : i + size] for i in range(0, len(elements), size)]


def _timed(calls: Sequence[Sequence[str]], one: Any, cap: float, clock: RedisClock) -> Load:
    """Give ``one`` each call in turn until done or past ``cap`` seconds; time it."""
    gc.collect()
    clock.start()
    done = seen = given = 0
    start = time.perf_counter()
    elapsed = 0.0
    for call in calls:
        seen += one(call)
        done += len(call)
        given += 1
        elapsed = time.perf_counter() - start
        if elapsed >= cap:
            break
    cost = clock.read()
    total = sum(len(c) for c in calls)
    return Load(done, given, elapsed, seen, cost, capped=done < total)


def build_ours(client: Any, key: str, settings: dict[str, Any]) -> Any:
    """Build ours from settings as the package builds it (``make_filter`` where it has one)."""
    from scrapy_redis_bloom import BloomConfig, RedisBloomFilter

    config = BloomConfig.from_settings(settings)
    try:
        from scrapy_redis_bloom.engine.backend import make_filter  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return RedisBloomFilter.from_config(client, key, config)
    return make_filter(client, key, config)


def load_ours(url: str, settings: dict[str, Any], count: int, call_size: int, cap: float) -> Load:
    """Time ours' ``add_many`` on ``count`` fingerprints in calls of ``call_size``.

    The filter is created first, outside the time, as :func:`load_madd`'s ``BF.RESERVE``
    is: a 1B filter's 3 GB allocated inside it weighed seconds on a load that its time
    cap cuts to a few hundred thousand fingerprints (through the link, in calls of
    100,000: 0.16x BF.MADD so, 0.71x created first; runs of 2026-11-28 22:58 and 23:06).
    """
    import redis

    calls = _calls(_fingerprints(count), call_size)
    client, admin = redis.Redis.from_url(url), redis.Redis.from_url(url)
    try:
        bloom = build_ours(client, "bench:size", settings)
        try:
            bloom.open()
            load = _timed(calls, lambda call: sum(bloom.add_many(call)), cap, RedisClock(admin))
            load.extra["backend"] = str(getattr(bloom, "backend", "bitmap"))
            load.extra["shards"] = int(bloom.spec.shards)
            load.extra["hash_count"] = int(bloom.spec.hash_count)
            load.extra["block_bits"] = int(getattr(bloom.spec, "block_bits", 0))
        finally:
            bloom.close()
    finally:
        client.close()
        admin.close()
    load.extra["numpy"] = _importable("numpy")
    load.extra["hiredis"] = _importable("hiredis")
    return load


def load_madd(
    client: Any, capacity: int, error_rate: float, count: int, call_size: int, cap: float
) -> Load:
    """Time RedisBloom's BF.MADD on the same calls, after BF.RESERVE of the same size.

    The filter grows as RedisBloom grows by default (EXPANSION 2). A call is sent as a
    user would send it: BF.MADD commands of :data:`MADD_CHUNK` fingerprints, pipelined
    :data:`MADD_BATCH` at a time; a call's replies are all read before the next call.
    """
    key = "bench:size:redisbloom"
    client.execute_command("BF.RESERVE", key, repr(error_rate), capacity, "EXPANSION", 2)
    calls = _calls(_fingerprints(count), call_size)

    def one(call: Sequence[str]) -> int:
        added = 0
        pipe = client.pipeline(transaction=False)
        for i in range(0, len(call), MADD_CHUNK):
            pipe.execute_command("BF.MADD", key, *call[i : i + MADD_CHUNK])
            if len(pipe) >= MADD_BATCH:
                added += sum(sum(int(x) for x in reply) for reply in pipe.execute())
        added += sum(sum(int(x) for x in reply) for reply in pipe.execute())
        return len(call) - added

    return _timed(calls, one, cap, RedisClock(client))


def _importable(name: str) -> bool:
    """Tell whether ``name`` can be imported here (False when blocked or not installed)."""
    if name in sys.modules:
        return sys.modules[name] is not None
    import importlib.util

    return importlib.util.find_spec(name) is not None


def load_as_dict(load: Load) -> dict[str, Any]:
    """Return a load as JSON-ready data (NaN as None)."""
    data = asdict(load)
    cpu = data["cost"]["cpu_usec"]
    data["cost"]["cpu_usec"] = None if cpu != cpu else cpu
    return data


def load_from_dict(data: dict[str, Any]) -> Load:
    """Rebuild a :class:`Load` from :func:`load_as_dict`'s data."""
    cost = dict(data["cost"])
    if cost["cpu_usec"] is None:
        cost["cpu_usec"] = float("nan")
    return Load(**{**data, "cost": RedisCost(**cost)})


def main(argv: Sequence[str] | None = None) -> int:
    """Block the modules asked, run one load of ours from the JSON spec, print it as JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--without", default="", help="modules made unimportable, e.g. numpy")
    parser.add_argument(
        "spec", help="JSON: url, settings, count, call_size, cap; peer: 'madd' for BF.MADD"
    )
    args = parser.parse_args(argv)
    for name in filter(None, args.without.split(",")):
        sys.modules[name] = None  # type: ignore[assignment]  # import then raises ImportError
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    spec = json.loads(args.spec)
    import redis.utils

    if spec.get("peer") == "madd":  # RedisBloom's BF.MADD from the same install
        client = redis.Redis.from_url(spec["url"])
        try:
            load = load_madd(
                client,
                spec["settings"]["BLOOMFILTER_CAPACITY"],
                spec["settings"]["BLOOMFILTER_ERROR_RATE"],
                spec["count"],
                spec["call_size"],
                spec["cap"],
            )
        finally:
            client.close()
        load.extra["numpy"] = _importable("numpy")
        load.extra["hiredis"] = _importable("hiredis")
    else:
        load = load_ours(
            spec["url"], spec["settings"], spec["count"], spec["call_size"], spec["cap"]
        )

    load.extra["hiredis_used_by_redis_py"] = bool(getattr(redis.utils, "HIREDIS_AVAILABLE", False))
    sys.stdout.write(json.dumps(load_as_dict(load)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
