"""Measure (t): Redis command time and commands per check, per dupefilter.

Each contender's ``request_seen`` is called on distinct URLs (every call adds), as in
(a), while Redis times every command (``cmdtime.CommandClock``: the slow log at
threshold 0 for top-level commands, ``INFO commandstats`` for the breakdown). The
clock is reset after ``open()`` and read before ``close()``, so what is counted is
what the checks cost the server: command time per check and commands per check.
Ours also counts its round trips on the client (its filter's ``round_trips``, behind
the stat ``bloomfilter/round_trips``, where this version has them); every peer sends
one command per round trip.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cmdtime import CommandClock, per_call
from harness import BenchRedis, Samples, interleave
from micro import (
    NAME_OURS,
    NAME_OURS_NATIVE,
    NAME_REDISBLOOM,
    NAME_SCRAPY_REDIS,
    OLD_DEFAULTS,
    OURS,
    SCRAPY_REDIS,
    DupeFilter,
    Peers,
    build,
    close,
    redisbloom_settings,
)
from peers import BF_ADD_CLASS, BFAddDupeFilter, bf_madd
from report import md_table, ratio
from scrapy import Request
from size import capacity_text, rate_text
from workloads import unique_urls, url

logger = logging.getLogger("bench.redistime")

#: The sized filter of issue 12's figures: 1,000,000 fingerprints at 1e-4.
SIZED: dict[str, Any] = {"BLOOMFILTER_CAPACITY": 1_000_000, "BLOOMFILTER_ERROR_RATE": 1e-4}
FIXED: dict[str, Any] = {**SIZED, "BLOOMFILTER_EXPANSION": 0}
#: Every element's k bits in one 512-bit block of its shard (hash scheme 2).
BLOCKED: dict[str, Any] = {"BLOOMFILTER_BLOCKED": True}
#: The classic layout: k bits anywhere in the shard (hash scheme 1), no longer the default.
CLASSIC: dict[str, Any] = {"BLOOMFILTER_BLOCKED": False}

NAME_OURS_SIZED = "ours, 1M @ 1e-4"
NAME_OURS_FIXED = "ours, 1M @ 1e-4, BLOOMFILTER_EXPANSION=0"
NAME_OURS_CLASSIC = "ours, classic layout"
NAME_OURS_SIZED_CLASSIC = "ours, 1M @ 1e-4, classic layout"
NAME_NATIVE_SIZED = "ours, native, 1M @ 1e-4"
NAME_REDISBLOOM_SIZED = "RedisBloom BF.ADD, 1M @ 1e-4"
#: The size the package is for (issue 23): 100M fingerprints at 1e-4, 248 MiB, every
#: bit a cache miss. Its rows are named by :func:`big_names` from the capacity asked.
BIG_CAPACITY = 100_000_000
BIG_ERROR_RATE = 1e-4
ROUND_TRIPS_STAT = "bloomfilter/round_trips"
#: Fingerprints per pipelined SADD of the prefill.
SADD_CHUNK = 1_000


def prefill(dupefilter: Any, count: int) -> bool:
    """Add ``count`` other fingerprints in bulk; return False if this contender cannot.

    A crawl's filter is resident: its pages were touched by the checks before. A
    RedisBloom filter is calloc'd at BF.RESERVE, so without this its first checks
    each pay page faults (at 128 MiB, tens of thousands) that a long crawl pays once.
    Every contender gets the same prefill, through its bulk path: ours' ``add_many``,
    ``BF.MADD``, pipelined ``SADD``.
    """
    fingerprints = [hashlib.sha1(b"prefill %d" % i).hexdigest() for i in range(count)]
    bloom = getattr(dupefilter, "bloom", None)
    if bloom is not None and hasattr(bloom, "add_many"):
        bloom.add_many(fingerprints)
    elif isinstance(dupefilter, BFAddDupeFilter):
        bf_madd(dupefilter.server, dupefilter.key, fingerprints)
    elif hasattr(dupefilter, "server") and hasattr(dupefilter, "key") and not bloom:
        pipe = dupefilter.server.pipeline(transaction=False)
        for i in range(0, count, SADD_CHUNK):
            pipe.sadd(dupefilter.key, *fingerprints[i : i + SADD_CHUNK])
        pipe.execute()
    else:
        return False
    return True


@dataclass(frozen=True)
class BigNames:
    """The names of (t)'s rows at the big size: ours unblocked, blocked, native; BF.ADD."""

    unblocked: str
    blocked: str
    native: str
    redisbloom: str


def big_settings(capacity: int) -> dict[str, Any]:
    """BLOOMFILTER_CAPACITY and BLOOMFILTER_ERROR_RATE of (t)'s big rows."""
    return {"BLOOMFILTER_CAPACITY": capacity, "BLOOMFILTER_ERROR_RATE": BIG_ERROR_RATE}


def big_names(capacity: int) -> BigNames:
    """Name (t)'s big rows after their size, e.g. 'ours, 100M @ 1e-4, blocked'."""
    size = f"{capacity_text(capacity)} @ {rate_text(BIG_ERROR_RATE)}"
    return BigNames(
        unblocked=f"ours, {size}, unblocked",
        blocked=f"ours, {size}, blocked",
        native=f"ours, native, {size}",
        redisbloom=f"RedisBloom BF.ADD, {size}",
    )


def big_contenders(peers: Peers, capacity: int) -> list[DupeFilter]:
    """(t)'s rows at the big size: unblocked and blocked set explicitly, native, BF.ADD."""
    names, big, bitmap = big_names(capacity), big_settings(capacity), peers.ours_settings()
    if peers.blocked:
        out = [
            DupeFilter(names.unblocked, OURS, {**bitmap, **big, "BLOOMFILTER_BLOCKED": False}),
            DupeFilter(names.blocked, OURS, {**bitmap, **big, **BLOCKED}),
        ]
    else:
        out = [DupeFilter(names.unblocked, OURS, {**bitmap, **big})]
    if peers.native:
        out.append(DupeFilter(names.native, OURS, {"BLOOMFILTER_BACKEND": "native", **big}))
    if peers.bloom:
        out.append(DupeFilter(names.redisbloom, BF_ADD_CLASS, redisbloom_settings(big)))
    return out


def contenders(peers: Peers, big: int = 0) -> list[DupeFilter]:
    """Ours (bitmap: defaults and 1M @ 1e-4, fixed, blocked; native), SADD, BF.ADD, old.

    ``big``: also the rows at that capacity (:func:`big_contenders`); 0 leaves them out.
    """
    bitmap = peers.ours_settings()
    out = [
        DupeFilter(NAME_OURS, OURS, bitmap),
        DupeFilter(NAME_OURS_SIZED, OURS, {**bitmap, **SIZED}),
        DupeFilter(NAME_OURS_FIXED, OURS, {**bitmap, **FIXED}),
    ]
    if peers.blocked:
        out += [
            DupeFilter(NAME_OURS_CLASSIC, OURS, {**bitmap, **CLASSIC}),
            DupeFilter(NAME_OURS_SIZED_CLASSIC, OURS, {**bitmap, **SIZED, **CLASSIC}),
        ]
    if peers.native:
        native = {"BLOOMFILTER_BACKEND": "native"}
        out += [
            DupeFilter(NAME_OURS_NATIVE, OURS, native),
            DupeFilter(NAME_NATIVE_SIZED, OURS, {**native, **SIZED}),
        ]
    out.append(DupeFilter(NAME_SCRAPY_REDIS, SCRAPY_REDIS))
    if peers.bloom:
        out += [
            DupeFilter(NAME_REDISBLOOM, BF_ADD_CLASS, redisbloom_settings({})),
            DupeFilter(NAME_REDISBLOOM_SIZED, BF_ADD_CLASS, redisbloom_settings(SIZED)),
        ]
    if big:
        out += big_contenders(peers, big)
    if peers.old:
        out.append(OLD_DEFAULTS)
    return out


def _round_trips(dupefilter: Any) -> int | None:
    """Ours' round trips so far: the filter's own count, else the stat; None if neither.

    The stat ``bloomfilter/round_trips`` may be written only at close; the filter's
    ``round_trips`` (where this version has it) is the live count behind it.
    """
    live = getattr(getattr(dupefilter, "bloom", None), "round_trips", None)
    if isinstance(live, int):
        return live
    stats = getattr(dupefilter, "stats", None)
    value = stats.get_value(ROUND_TRIPS_STAT) if stats is not None else None
    return int(value) if value is not None else None


def time_commands(
    bench: BenchRedis,
    clock: CommandClock,
    contender: DupeFilter,
    urls: Sequence[str],
    warmup: Sequence[str] = (),
    prefilled: int = 0,
) -> dict[str, Any]:
    """Call ``request_seen`` for fresh Requests of ``urls``; return what Redis spent.

    ``prefilled`` other fingerprints are added in bulk first (:func:`prefill`), then
    ``warmup`` URLs (others) are checked, both outside the count: ours allocates a
    shard on its first check there, which a long crawl pays once.
    """
    bench.flush()
    dupefilter = build(contender, bench.url)
    try:
        if prefilled and not contender.slow and not prefill(dupefilter, prefilled):
            raise RuntimeError(f"(t) cannot prefill {contender.name}")
        for request in (Request(u) for u in warmup):
            dupefilter.request_seen(request)
        requests = [Request(u) for u in urls]
        gc.collect()
        trips_before = _round_trips(dupefilter)
        clock.reset()
        start = time.perf_counter()
        seen = sum(bool(dupefilter.request_seen(r)) for r in requests)
        elapsed = time.perf_counter() - start
        spent = clock.read()
        trips_after = _round_trips(dupefilter)
    finally:
        close(dupefilter)
    checks = len(urls)
    usec = spent.usec(spent.commands)
    trips = None
    if trips_before is not None and trips_after is not None:
        trips = (trips_after - trips_before) / checks
    return {
        "usec_per_check": per_call(usec, checks),
        "commands_per_check": len(spent.commands) / checks,
        "round_trips_per_check": trips,
        "checks_per_s": checks / elapsed,
        "seen": seen,
        "commands": spent.by_name(spent.commands),
        "commandstats": spent.commandstats,
        "overflowed": spent.overflowed,
    }


def big_markdown(usec: dict[str, Samples], names: BigNames, sadd: str) -> str:
    """Render the README's table of (t) at the big size: usec per check, x SADD, x BF.ADD."""
    set_usec = usec[sadd].median if sadd in usec else float("nan")
    bf_usec = usec[names.redisbloom].median if names.redisbloom in usec else float("nan")
    body = []
    rows = (
        ("ours, unblocked", names.unblocked),
        ("ours, blocked", names.blocked),
        ("ours, native backend", names.native),
        ("RedisBloom BF.ADD, same size", names.redisbloom),
        ("scrapy-redis SADD", sadd),
    )
    for label, name in rows:
        if name not in usec:
            continue
        value = usec[name].median
        body.append(
            (
                label,
                f"{value:.2f}",
                f"{ratio(value, set_usec):.2f}x",
                f"{ratio(value, bf_usec):.2f}x",
            )
        )
    size = names.redisbloom.removeprefix("RedisBloom BF.ADD, ")
    return "\n".join(
        [
            f"Redis command time per check (request_seen on new URLs) at {size}:",
            "",
            md_table(("filter", "usec/check", "x SADD", "x BF.ADD"), body),
        ]
    )


def measure_command_time(
    bench: BenchRedis,
    peers: Peers,
    calls: int,
    slow_calls: int,
    rounds: int,
    warmup: int,
    prefilled: int = 0,
    big: int = 0,
) -> dict[str, dict[str, Samples]]:
    """Measure (t): per contender, usec per check, commands per check, round trips.

    Each contender first gets ``prefilled`` other fingerprints in bulk (not the slow
    peer, which has no bulk path) and checks ``warmup`` other URLs (the slow peer: at
    most ``slow_calls``). ``big``: a capacity for the rows at the size the package is
    for (:func:`big_contenders`), 0 for none. Returns {metric: {contender: Samples}}
    for "usec", "commands" and "round_trips" (the last only for contenders that
    report it).
    """
    by_name = {c.name: c for c in contenders(peers, big)}
    full, slow = unique_urls(calls), unique_urls(slow_calls)
    others = [url(calls + i) for i in range(warmup)]
    out: dict[str, dict[str, Samples]] = {"usec": {}, "commands": {}, "round_trips": {}}
    with CommandClock(bench.redis()) as clock:

        def run_one(name: str, round_index: int) -> None:
            contender = by_name[name]
            urls = slow if contender.slow else full
            warm = others[: len(urls)] if contender.slow else others
            got = time_commands(bench, clock, contender, urls, warm, prefilled)
            logger.info(
                "  %-40s %7.2f usec/check, %.3f commands/check%s",
                name,
                got["usec_per_check"],
                got["commands_per_check"],
                ""
                if got["round_trips_per_check"] is None
                else f", {got['round_trips_per_check']:.3f} round trips/check",
            )
            usec = out["usec"].setdefault(name, Samples(name, "usec", sample_size=len(urls)))
            usec.values.append(got["usec_per_check"])
            for key in ("checks_per_s", "seen", "commands", "commandstats", "overflowed"):
                usec.extra.setdefault(key, []).append(got[key])
            commands = out["commands"].setdefault(
                name, Samples(name, "commands", sample_size=len(urls))
            )
            commands.values.append(got["commands_per_check"])
            if got["round_trips_per_check"] is not None:
                trips = out["round_trips"].setdefault(
                    name, Samples(name, "trips", sample_size=len(urls))
                )
                trips.values.append(got["round_trips_per_check"])

        interleave(list(by_name), rounds, run_one, "(t) Redis command time")
    bench.flush()
    for samples in out["usec"].values():
        mix = samples.extra["commands"][-1]
        total = sum(mix.values()) or 1
        samples.note = ", ".join(f"{cmd} {n / total:.0%}" for cmd, n in sorted(mix.items()))
    return out


__all__ = [
    "BIG_CAPACITY",
    "BLOCKED",
    "CLASSIC",
    "NAME_NATIVE_SIZED",
    "NAME_OURS_CLASSIC",
    "NAME_OURS_FIXED",
    "NAME_OURS_SIZED",
    "NAME_OURS_SIZED_CLASSIC",
    "NAME_REDISBLOOM_SIZED",
    "BigNames",
    "big_markdown",
    "big_names",
    "measure_command_time",
]
