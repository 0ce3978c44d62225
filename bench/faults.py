#!/usr/bin/env python3
"""The fault table: real Redis faults during real crawls, ours beside scrapy-redis's SET.

Usage, from the repository root::

    python bench/faults.py            # full run, about six minutes
    python bench/faults.py --quick    # smoke run, about a minute

Each crawl is one ``tests/crawl_runner.py --scheduler default --mode follow`` worker:
Scrapy's own scheduler with its in-memory queue, so the only Redis traffic is the
dupefilter's and a fault hits the dupefilter alone. The site is a
:class:`website.TreeSite`: every page is linked from exactly one parent (plus back-links
that are duplicates), so a link the dupefilter wrongly drops loses a page for good, and
the site server counts what it served: pages never fetched and duplicate fetches are
measured outside the crawler. Each crawl gets its own redis-server (127.0.0.1, free
port) and its own site; the fault is injected from a thread once the site has served a
share of the pages (or from the start, for the connection killer).

Faults, one row each: none (the control); every client connection killed every 50 ms;
Redis SIGKILLed and restarted from its AOF 3 s later; the same, its restart then answering
``-LOADING`` for seconds (40,000 keys loaded slowly, as a big data set); Redis frozen 3 s
(``DEBUG SLEEP``); Redis stalled 10 s (SIGSTOP: it keeps its connections and answers nothing, longer
than the retry window); ``maxmemory`` set below ``used_memory`` under ``noeviction``; keys evicted
(``allkeys-random`` and junk writes until one of the dupefilter's keys is gone); our
filter sized for 100 items on a 400-page site. Contenders: ours with its default
policies, ours with ``BLOOMFILTER_ON_ERROR = 'allow'`` and ``BLOOMFILTER_ON_LOSS =
'recreate'`` (where a policy comes into play), and scrapy-redis's
``RFPDupeFilter``, interleaved round by round.

It prints the table and writes ``faults.md`` and ``faults.json`` (into ``bench/``
unless ``--out``). Exit status: 0 when every crawl ran, whatever it measured; 1 when a
harness step failed (a server that did not start or come back, a crawl without
output, a fault that could not be injected); 2 for bad arguments; 130 when interrupted.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from harness import TESTS, bench_parser, finish_args, machine, rotated, run_main  # noqa: E402  # also puts tests/ on sys.path
from redis_server import RedisServer, no_retry, slow_loading, slow_loading_binary  # noqa: E402
from report import grid, md_table  # noqa: E402
from website import SiteServer, TreeSite  # noqa: E402

logger = logging.getLogger("bench.faults")

RUNNER = TESTS / "crawl_runner.py"
SPIDER = "site"  # crawl_runner.py's spider: our filter's key is "site:bloomfilter"

OURS_CLASS = "scrapy_redis_bloom.dupefilter.RFPDupeFilter"
SCRAPY_REDIS_CLASS = "scrapy_redis.dupefilter.RFPDupeFilter"

#: The stats our dupefilter sets while a fault lasts, in the order they are reported.
OUR_STATS = (
    "retries",
    "ambiguous",
    "errors",
    "recreated",
    "restored",
    "over_capacity",
    "eviction_risk",
)

#: Junk keys written, at most, to make Redis evict (64 KiB each).
MAX_JUNK = 600
JUNK_BYTES = 65_536

_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[([^\]]+)\] ([A-Z]+): (.*)$")
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Failure)): (.*)$")


# -- contenders ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Contender:
    """A dupefilter: a short id, the name in the table, and the settings that select it."""

    key: str
    name: str
    settings: dict[str, Any]

    @property
    def ours(self) -> bool:
        """Whether this is one of this package's configurations."""
        return bool(self.settings["DUPEFILTER_CLASS"] == OURS_CLASS)


OURS = Contender(
    "ours",
    "ours (defaults)",
    {
        "DUPEFILTER_CLASS": OURS_CLASS,
        "BLOOMFILTER_CAPACITY": 100_000,
        "BLOOMFILTER_ERROR_RATE": 1e-6,
    },
)
LENIENT = Contender(
    "lenient",
    "ours, ON_ERROR=allow, ON_LOSS=recreate",
    {
        **OURS.settings,
        "BLOOMFILTER_ON_ERROR": "allow",
        "BLOOMFILTER_ON_LOSS": "recreate",
    },
)
SCRAPY_REDIS = Contender(
    "scrapy-redis", "scrapy-redis 0.9 (SET)", {"DUPEFILTER_CLASS": SCRAPY_REDIS_CLASS}
)
CONTENDERS = {c.key: c for c in (OURS, LENIENT, SCRAPY_REDIS)}


# -- faults -------------------------------------------------------------------------------


@dataclasses.dataclass
class FaultContext:
    """What a fault acts on during one crawl, and where it reports what it did."""

    server: RedisServer
    contender: Contender
    args: argparse.Namespace
    #: Set when the crawl's process has exited.
    done: threading.Event
    #: What the fault did, for the table ("killed 412 connections in 96 rounds").
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Pages the site has served so far (set once the site runs).
    served: Callable[[], int] = lambda: 0


Inject = Callable[[FaultContext], None]


@dataclasses.dataclass(frozen=True)
class Fault:
    """One row of the table: how to inject the fault, and who is measured under it."""

    key: str
    #: The row's label; ``{outage}`` and ``{kill_ms}`` are filled in from the arguments.
    title: str
    contenders: tuple[str, ...]
    inject: Inject | None
    #: Inject as the crawl starts, not once a share of the pages was served.
    from_start: bool = False
    appendonly: bool = False
    #: Arguments of the row's redis-server (after the harness's own), and its binary
    #: (None: the harness's default).
    server_args: tuple[str, ...] = ()
    binary: Callable[[], str | None] | None = None
    #: Settings added for every contender of this row.
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Settings added for our contenders only.
    ours_settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Contenders not run in this row, and what the table says instead.
    not_run: dict[str, str] = dataclasses.field(default_factory=dict)

    def label(self, args: argparse.Namespace) -> str:
        """Return the row's label for this run's sizes."""
        return self.title.format(
            outage=args.outage, kill_ms=args.kill_interval * 1000, stall=args.stall
        )


def inject_killer(ctx: FaultContext) -> None:
    """Kill every client connection every 50 ms (``CLIENT KILL TYPE normal``) until the end."""
    interval = ctx.args.kill_interval
    with ctx.server.connection_killer(interval, max_duration=ctx.args.crawl_timeout) as killer:
        ctx.done.wait(ctx.args.crawl_timeout)
    ctx.details.update(
        rounds=killer.rounds, connections_killed=killer.killed, kill_errors=killer.errors
    )
    ctx.details["summary"] = f"{killer.killed} connections killed in {killer.rounds} rounds"


def inject_restart(ctx: FaultContext) -> None:
    """SIGKILL redis-server; start it again on the same port and AOF ``--outage`` s later."""
    ctx.server.kill()
    killed = time.monotonic()
    time.sleep(ctx.args.outage)
    ctx.server.restart()
    ctx.details["down_seconds"] = round(time.monotonic() - killed, 2)
    ctx.details["summary"] = f"down {ctx.details['down_seconds']:.1f} s, AOF reloaded"


#: Keys that make the restart's load last seconds (slowed 100 µs a key), as a big filter's.
LOADING_KEYS = 40_000


def inject_restart_loading(ctx: FaultContext) -> None:
    """SIGKILL redis-server, restart it ``--outage`` s later; it answers -LOADING for seconds.

    :data:`LOADING_KEYS` keys beside the crawl's are rewritten into the AOF's RDB base,
    whose loading the server's ``key-load-delay`` slows: what a restart of a Redis holding
    gigabytes does, the clients answered ``-LOADING`` until it is done.
    """
    ctx.server.slow_to_load(LOADING_KEYS)
    ctx.server.kill()
    killed = time.monotonic()
    time.sleep(ctx.args.outage)
    ctx.server.restart(loaded=False)
    restarted = time.monotonic()
    while int(ctx.server.info("persistence")["loading"]):
        time.sleep(0.05)
    ctx.details["down_seconds"] = round(restarted - killed, 2)
    ctx.details["loading_seconds"] = round(time.monotonic() - restarted, 2)
    ctx.details["summary"] = (
        f"down {ctx.details['down_seconds']:.1f} s, then {ctx.details['loading_seconds']:.1f} s"
        " of -LOADING"
    )


def inject_freeze(ctx: FaultContext) -> None:
    """``DEBUG SLEEP --outage``: the server answers nothing for that long."""
    started = time.monotonic()
    thread = ctx.server.pause(ctx.args.outage)
    thread.join(ctx.args.outage + 15)
    if thread.is_alive() or thread.error is not None:
        raise RuntimeError(f"DEBUG SLEEP did not complete: {thread.error}")
    ctx.details["frozen_seconds"] = round(time.monotonic() - started, 2)
    ctx.details["summary"] = f"frozen {ctx.details['frozen_seconds']:.1f} s"


def inject_stall(ctx: FaultContext) -> None:
    """SIGSTOP redis-server for ``--stall`` s (until the crawl ends, if sooner), then SIGCONT.

    The server keeps its connections and answers nothing, as a paused VM or a partition
    that drops packets: a client waits a socket timeout per attempt. Reports the pages the
    site served meanwhile: how much the crawl went on while Redis did not answer.
    """
    process = ctx.server.process
    if process is None:
        raise RuntimeError("redis-server is not running")
    served, started = ctx.served(), time.monotonic()
    os.kill(process.pid, signal.SIGSTOP)
    try:
        ctx.done.wait(ctx.args.stall)
    finally:
        os.kill(process.pid, signal.SIGCONT)
    stalled = time.monotonic() - started
    meanwhile = ctx.served() - served
    ctx.details.update(stalled_seconds=round(stalled, 2), served_meanwhile=meanwhile)
    ctx.details["summary"] = f"stalled {stalled:.1f} s; {meanwhile} pages served meanwhile"


def inject_oom(ctx: FaultContext) -> None:
    """``maxmemory-policy noeviction`` and ``maxmemory`` at half of ``used_memory``."""
    admin = ctx.server.admin()
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", used // 2)
    ctx.details.update(used_memory=used, maxmemory=used // 2)
    ctx.details["summary"] = f"maxmemory {used // 2:,} B < used_memory {used:,} B"


def _filter_keys(ctx: FaultContext) -> tuple[list[bytes], list[bytes]]:
    """Return (every key of the dupefilter, the keys that hold its data).

    The server holds nothing else. Ours: the data are the shards; scrapy-redis: its SET.
    """
    # The admin client does not decode: every key is bytes.
    keys = sorted(k for k in ctx.server.admin().keys("*") if isinstance(k, bytes))
    if ctx.contender.ours:
        return keys, [k for k in keys if k.startswith(b"{") and b"}:g" in k]
    return keys, keys


def inject_evict(ctx: FaultContext) -> None:
    """``allkeys-random`` with ``maxmemory`` 1 MiB above ``used_memory``, then junk writes.

    64 KiB junk keys are written until one of the keys holding the dupefilter's data is
    evicted (at most :data:`MAX_JUNK`), then ``maxmemory`` is lifted again.
    """
    admin = ctx.server.admin()
    keys, data = _filter_keys(ctx)
    if not data:
        raise RuntimeError(f"no dupefilter key to evict (keys: {keys!r})")
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory-policy", "allkeys-random")
    admin.config_set("maxmemory", used + 2**20)
    written = 0
    gone: list[bytes] = []
    try:
        for i in range(MAX_JUNK):
            admin.set(f"junk:{i}", b"x" * JUNK_BYTES)
            written += 1
            # Seen the moment it happens: a write of the crawl may re-create the key next.
            gone = [k for k in keys if not admin.exists(k)]
            if any(k in data for k in gone):
                break
    finally:
        admin.config_set("maxmemory", 0)
    lost_data = [k for k in gone if k in data]
    ctx.details.update(
        junk_keys=written,
        evicted=[k.decode(errors="replace") for k in gone],
        evicted_data_keys=len(lost_data),
        data_keys=len(data),
    )
    if not lost_data:
        raise RuntimeError(f"no dupefilter data key evicted after {written} junk keys")
    what = f"{len(lost_data)} of {len(data)} shards" if ctx.contender.ours else "the SET"
    others = len(gone) - len(lost_data)
    ctx.details["summary"] = (
        f"evicted {what}" + (f" (+{others} other key(s))" if others else "") + f", {written} junk"
    )


FAULTS: tuple[Fault, ...] = (
    Fault("none", "none (control)", ("ours", "scrapy-redis"), None),
    Fault(
        "killer",
        "connections killed every {kill_ms:g} ms",
        ("ours", "scrapy-redis"),
        inject_killer,
        from_start=True,
        not_run={"lenient": "not run: no retry window runs out"},
    ),
    Fault(
        "restart",
        "SIGKILL, restart from AOF {outage:g} s later",
        ("ours", "scrapy-redis"),
        inject_restart,
        appendonly=True,
        not_run={"lenient": "not run: the outage is shorter than the retry window"},
    ),
    Fault(
        "restart-loading",
        "SIGKILL, restart from AOF {outage:g} s later, then seconds of -LOADING",
        ("ours", "scrapy-redis"),
        inject_restart_loading,
        appendonly=True,
        server_args=slow_loading(100),
        binary=slow_loading_binary,
        not_run={"lenient": "not run: the outage is shorter than the retry window"},
    ),
    Fault(
        "freeze",
        "frozen {outage:g} s (DEBUG SLEEP), socket_timeout 1 s",
        ("ours", "scrapy-redis"),
        inject_freeze,
        settings={"REDIS_PARAMS": {"socket_timeout": 1}},
        not_run={"lenient": "not run: the freeze is shorter than the retry window"},
    ),
    Fault(
        "stall",
        "stalled {stall:g} s (SIGSTOP), socket_timeout 1 s, retry timeout 2 s",
        ("ours", "lenient", "scrapy-redis"),
        inject_stall,
        settings={"REDIS_PARAMS": {"socket_timeout": 1}},
        ours_settings={"BLOOMFILTER_RETRY_TIMEOUT": 2},
    ),
    Fault("oom", "maxmemory reached (noeviction)", ("ours", "lenient", "scrapy-redis"), inject_oom),
    Fault(
        "evict",
        "keys evicted (allkeys-random)",
        ("ours", "lenient", "scrapy-redis"),
        inject_evict,
    ),
    Fault(
        "capacity",
        "filter over capacity (100 items at 1%)",
        ("ours",),
        None,
        ours_settings={"BLOOMFILTER_CAPACITY": 100, "BLOOMFILTER_ERROR_RATE": 0.01},
        not_run={
            "lenient": "not run: no policy applies",
            "scrapy-redis": "n/a — exact (a SET has no capacity)",
        },
    ),
)
FAULTS_BY_KEY = {f.key: f for f in FAULTS}


# -- one crawl ----------------------------------------------------------------------------


@dataclasses.dataclass
class CrawlOutcome:
    """What one crawl did under one fault, seen from the site, the crawler and its log."""

    fault: str
    contender: str
    round: int
    pages: int
    fetched: int
    never_fetched: int
    duplicate_fetches: int
    finish_reason: str | None
    log_errors: int
    tracebacks: int
    wall: float
    injected_at: float | None
    served_at_injection: int | None
    fault_details: dict[str, Any]
    our_stats: dict[str, Any]
    error_lines: list[str]
    warning_lines: list[str]
    exceptions: dict[str, int]
    crawl_error: str | None
    harness_error: str | None = None
    timed_out: bool = False


@dataclasses.dataclass
class _LogSummary:
    errors: list[str]
    warnings: list[str]
    tracebacks: int
    exceptions: collections.Counter[str]


def read_log(text: str) -> _LogSummary:
    """Pick the ERROR lines, our package's WARNING lines and the exceptions out of a log."""
    errors: list[str] = []
    warnings: list[str] = []
    exceptions: collections.Counter[str] = collections.Counter()
    tracebacks = 0
    for line in text.splitlines():
        if line.startswith("Traceback (most recent call last)"):
            tracebacks += 1
            continue
        found = _LOG_LINE.match(line)
        if found:
            name, level, message = found.groups()
            if level in ("ERROR", "CRITICAL"):
                errors.append(f"[{name}] {message}")
            elif level == "WARNING" and name.startswith("scrapy_redis_bloom"):
                warnings.append(f"[{name}] {message}")
            continue
        exception = _EXCEPTION_LINE.match(line)
        if exception:
            exceptions[exception.group(1).rsplit(".", 1)[-1]] += 1
    return _LogSummary(errors, warnings, tracebacks, exceptions)


def crawl_settings(fault: Fault, contender: Contender, args: argparse.Namespace) -> dict[str, Any]:
    """Return the settings of one crawl: the contender's, the fault's, and the bounds."""
    settings: dict[str, Any] = {**contender.settings, **fault.settings}
    if contender.ours:
        if args.retry_timeout is not None:
            settings["BLOOMFILTER_RETRY_TIMEOUT"] = args.retry_timeout
        settings.update(fault.ours_settings)  # a row's own settings win
    settings.update(
        {
            # A crawl that runs away (a filter answering "new" for every back-link of a
            # cyclic site) is stopped after this many responses or seconds: reported.
            "CLOSESPIDER_PAGECOUNT": args.pages * args.runaway,
            "CLOSESPIDER_TIMEOUT": args.closespider_timeout,
            "LOG_LEVEL": "INFO",
        }
    )
    return settings


def run_crawl(
    fault: Fault, contender: Contender, round_index: int, args: argparse.Namespace, workdir: Path
) -> CrawlOutcome:
    """Run one crawl on a fresh Redis and a fresh site, inject the fault; return the outcome."""
    tag = f"{fault.key}-{contender.key}-{round_index}"
    output, log = workdir / f"{tag}.json", workdir / f"{tag}.log"
    settings = crawl_settings(fault, contender, args)
    site = TreeSite(args.pages)
    reachable = site.reachable()
    trigger = max(1, int(len(reachable) * args.trigger))
    done = threading.Event()
    harness_error: str | None = None
    injected_at: float | None = None
    served_at_injection: int | None = None
    timed_out = False
    binary = fault.binary() if fault.binary is not None else None
    server = RedisServer(*fault.server_args, appendonly=fault.appendonly, binary=binary)
    server.start()
    ctx = FaultContext(server, contender, args, done)
    fault_errors: list[str] = []
    try:
        with SiteServer(site, delay=args.delay) as web:
            ctx.served = lambda: sum(
                n for path, n in web.hits_snapshot().items() if path.startswith("/page/")
            )
            command = [
                sys.executable, str(RUNNER), "--site", web.url, "--redis-url", server.url,
                "--scheduler", "default", "--mode", "follow",
                "--settings", json.dumps(settings), "--output", str(output),
            ]  # fmt: skip
            launched = time.monotonic()
            with log.open("wb") as sink:
                proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)

            def injector() -> None:
                nonlocal injected_at, served_at_injection
                if fault.inject is None:
                    return
                if not fault.from_start:
                    while not done.is_set():
                        served = sum(
                            n
                            for path, n in web.hits_snapshot().items()
                            if path.startswith("/page/")
                        )
                        if served >= trigger:
                            break
                        done.wait(0.01)
                    else:
                        fault_errors.append(
                            f"the crawl ended before {trigger} pages were served: not injected"
                        )
                        return
                injected_at = time.monotonic() - launched
                served_at_injection = sum(
                    n for path, n in web.hits_snapshot().items() if path.startswith("/page/")
                )
                try:
                    fault.inject(ctx)
                except Exception as exc:  # reported as a harness failure, never swallowed
                    logger.exception("Injecting %r failed", fault.key)
                    fault_errors.append(f"injecting the fault failed: {type(exc).__name__}: {exc}")

            thread = threading.Thread(target=injector, name=f"fault-{tag}", daemon=True)
            thread.start()
            try:
                proc.wait(timeout=args.crawl_timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                proc.kill()
                proc.wait()
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                done.set()
            wall = time.monotonic() - launched
            # The fault's own steps are bounded (a restart: 30 s; a freeze: outage + 15 s).
            thread.join(args.outage + 60)
            if thread.is_alive():
                fault_errors.append("the fault thread did not finish")
            hits = web.hits_snapshot()
    finally:
        server.stop()
    if fault_errors:
        harness_error = "; ".join(fault_errors)
    pages = collections.Counter(
        int(path.rsplit("/", 1)[1]) for path in hits.elements() if path.startswith("/page/")
    )
    text = log.read_text(errors="replace") if log.exists() else ""
    summary = read_log(text)
    result: dict[str, Any] = {}
    try:
        result = json.loads(output.read_text())
    except (OSError, ValueError) as exc:
        if not timed_out:
            harness_error = (harness_error + "; " if harness_error else "") + (
                f"no output from the crawl ({exc}); log tail: {text[-1500:]}"
            )
    stats = result.get("stats", {})
    error = result.get("error")
    return CrawlOutcome(
        fault=fault.key,
        contender=contender.key,
        round=round_index,
        pages=len(reachable),
        fetched=len(set(pages) & reachable),
        never_fetched=len(reachable - set(pages)),
        duplicate_fetches=sum(pages.values()) - len(pages),
        finish_reason=stats.get("finish_reason"),
        log_errors=int(stats.get("log_count/ERROR", 0) or 0),
        tracebacks=summary.tracebacks,
        wall=wall,
        injected_at=injected_at,
        served_at_injection=served_at_injection,
        fault_details=ctx.details,
        our_stats={
            name: stats[f"bloomfilter/{name}"]
            for name in OUR_STATS
            if stats.get(f"bloomfilter/{name}") not in (None, 0, 0.0, "", [])
        },
        error_lines=summary.errors[:20],
        warning_lines=summary.warnings[:20],
        exceptions=dict(summary.exceptions.most_common(5)),
        crawl_error=f"{error['type']}: {error['message']}" if error else None,
        harness_error=harness_error,
        timed_out=timed_out,
    )


# -- the table ----------------------------------------------------------------------------


def _per_round(values: Sequence[object]) -> str:
    """Round values joined with " / ", or one value when every round agrees."""
    texts = [str(v) for v in values]
    return texts[0] if len(set(texts)) == 1 else " / ".join(texts)


def _ended(o: CrawlOutcome) -> str:
    if o.timed_out:
        return "killed at the wall-clock limit"
    return o.finish_reason or "no finish reason"


#: Display-only shortenings of log lines for the table (faults.json keeps them whole).
_SHORTER = (
    (re.compile(r"The Bloom filter '[^']*' cannot answer, so the crawl stops \(finish reason"
                r" '(\w+)'\): "), r"crawl stopped (\1): "),
    (re.compile(r"(?:Redis at )?127\.0\.0\.1:\d+"), "Redis"),
    (re.compile(r"Bloom filter '[^']*'"), "filter"),
    (re.compile(r"\[[\w.]+\] "), ""),
)  # fmt: skip


def _short(line: str, limit: int = 150) -> str:
    """One log line, shortened for a table cell."""
    line = re.sub(r"\s+", " ", line).strip()
    for pattern, replacement in _SHORTER:
        line = pattern.sub(replacement, line)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _told(outcomes: Sequence[CrawlOutcome]) -> str:
    """Say what told the user: our stats, then the first ERROR (or our WARNING) line."""
    parts: list[str] = []
    for name in OUR_STATS:
        values = [o.our_stats.get(name, 0) for o in outcomes]
        if any(values):
            parts.append(f"{name} {_per_round(values)}")
    first = next((o for o in outcomes if o.error_lines), None)
    if first is not None:
        errors = _per_round([o.log_errors for o in outcomes])
        parts.append(f"ERROR x{errors}, first: {_short(first.error_lines[0])}")
    else:
        warned = next((o for o in outcomes if o.warning_lines), None)
        if warned is not None:
            parts.append(f"WARNING: {_short(warned.warning_lines[0])}")
    exceptions: collections.Counter[str] = collections.Counter()
    for o in outcomes:
        exceptions.update(o.exceptions)
    if exceptions:
        parts.append(
            "exceptions in the log: " + ", ".join(f"{n} x{c}" for n, c in exceptions.most_common(3))
        )
    return "; ".join(parts) if parts else "nothing"


HEADERS = (
    "fault",
    "contender",
    "pages never fetched",
    "crawl ended",
    "duplicate fetches",
    "ERROR log lines",
    "tracebacks",
    "what told the user",
    "fault injected",
)


def table_rows(
    outcomes: Sequence[CrawlOutcome], faults: Sequence[Fault], args: argparse.Namespace
) -> list[list[str]]:
    """One row per fault and contender; per-round values joined with " / "."""
    rows: list[list[str]] = []
    for fault in faults:
        title = fault.label(args)
        for key in ("ours", "lenient", "scrapy-redis"):
            name = CONTENDERS[key].name
            if key in fault.not_run:
                if key == "scrapy-redis" or fault.key == "capacity":
                    rows.append([title, name, fault.not_run[key], *[""] * (len(HEADERS) - 3)])
                continue
            if key not in fault.contenders:
                continue
            mine = sorted(
                (o for o in outcomes if o.fault == fault.key and o.contender == key),
                key=lambda o: o.round,
            )
            if not mine:
                continue
            rows.append(
                [
                    title,
                    name,
                    _per_round([f"{o.never_fetched}/{o.pages}" for o in mine]),
                    _per_round([_ended(o) for o in mine]),
                    _per_round([o.duplicate_fetches for o in mine]),
                    _per_round([o.log_errors for o in mine]),
                    _per_round([o.tracebacks for o in mine]),
                    _told(mine),
                    _per_round([_injected(o) for o in mine]),
                ]
            )
    return rows


def _injected(o: CrawlOutcome) -> str:
    if o.injected_at is None:
        return "—" if o.fault in ("none", "capacity") else "NOT INJECTED"
    summary = o.fault_details.get("summary", "")
    at = f"at page {o.served_at_injection}" if o.served_at_injection else "from the start"
    return f"{at}: {summary}" if summary else at


def method_notes(args: argparse.Namespace) -> list[str]:
    """Explain how the table was made, with this run's sizes."""
    retry = (
        "its default BLOOMFILTER_RETRY_TIMEOUT (20 s)"
        if args.retry_timeout is None
        else f"BLOOMFILTER_RETRY_TIMEOUT = {args.retry_timeout:g} s"
    )
    return [
        "One Scrapy worker per crawl (tests/crawl_runner.py --scheduler default --mode follow):"
        " Scrapy's own scheduler and in-memory queue, so the dupefilter is the only Redis"
        " client and the fault hits it alone; only DUPEFILTER_CLASS (and the filter's own"
        " settings) differ between contenders. CONCURRENT_REQUESTS 16 (8 per domain),"
        " RETRY_ENABLED False.",
        f"The site: tests/website.py TreeSite of {args.pages} pages, {args.delay:g} s per page;"
        " page i links to 2i+1 and 2i+2 (its only parent links to it) and back to its parent,"
        " the home page and itself (duplicates). 'pages never fetched' and 'duplicate fetches'"
        " are counted by the site server. A fresh redis-server (127.0.0.1, free port, no"
        " persistence except the restart rows: appendonly, appendfsync always) and a fresh"
        " site per crawl.",
        f"The fault is injected from a thread once the site has served {args.trigger:.0%} of"
        " the pages (the connection killer: from the launch of the crawl to its end).",
        f"Ours: BLOOMFILTER_CAPACITY 100,000 at ERROR_RATE 1e-6 (the over-capacity row: 100 at"
        f" 0.01), {retry}, its default policies (ON_ERROR 'raise', ON_LOSS 'raise'); the"
        " lenient contender sets ON_ERROR 'allow' and ON_LOSS 'recreate'. Its near-cache is on"
        " (the default), so a repeat this worker has seen costs no Redis call. It connects"
        " through scrapy-redis's settings (REDIS_URL) with its own 5 s socket timeout."
        " scrapy-redis 0.9.1 runs with its defaults: a redis-py client from REDIS_URL with"
        " socket_timeout 30 and retry_on_timeout, whose connections send a command once more,"
        " at once, after a lost connection or a timeout (redis-py 8.1).",
        f"Faults: connections killed = CLIENT KILL TYPE normal every {args.kill_interval * 1000:g}"
        f" ms for the whole crawl; restart = SIGKILL, {args.outage:g} s down, same port and"
        f" AOF; restart then -LOADING = the same, once {LOADING_KEYS:,} keys were written beside"
        " the crawl's and rewritten into the AOF's RDB base (BGREWRITEAOF), the server started"
        " with key-load-delay 100 µs: it answers -LOADING until they are loaded;"
        f" freeze = DEBUG SLEEP {args.outage:g}, with REDIS_PARAMS socket_timeout 1 s for"
        f" every contender; stalled = SIGSTOP for {args.stall:g} s (or until the crawl ends),"
        " then SIGCONT, with socket_timeout 1 s for every contender and"
        " BLOOMFILTER_RETRY_TIMEOUT 2 s for ours; maxmemory = maxmemory-policy noeviction and"
        " maxmemory at half of used_memory, left so until the end; evicted ="
        " maxmemory-policy allkeys-random,"
        f" maxmemory used_memory + 1 MiB, then {JUNK_BYTES // 1024} KiB junk keys until a shard"
        " (ours) or the SET (scrapy-redis) is gone, then maxmemory 0; over capacity = no"
        " fault, our filter sized for 100 items at 1%.",
        f"Bounds: CLOSESPIDER_PAGECOUNT = {args.runaway}x the pages (a crawl that re-fetches"
        f" without end stops with finish reason closespider_pagecount), CLOSESPIDER_TIMEOUT"
        f" {args.closespider_timeout:g} s, and a wall-clock limit of {args.crawl_timeout:g} s per"
        " crawl.",
        f"{args.rounds} round(s), contenders of a row interleaved in a rotated order; a cell with"
        " ' / ' lists the rounds in order, one value means every round agreed. 'ERROR log"
        " lines' is the crawl's log_count/ERROR; 'tracebacks' counts 'Traceback' blocks in its"
        " log; 'what told the user' is our stats (bloomfilter/...) at the end of each crawl,"
        " then the first ERROR line (or, without one, our first WARNING).",
    ]


#: How to read the table, under it in faults.md.
READING = (
    "**pages never fetched**: reachable pages the site never served. In a crawl that ended"
    " `finished`, each was dropped (its link answered 'seen' while new, or lost to an error)"
    " and the crawl said it was complete: lost silently. In a crawl that ended"
    " `bloomfilter_error`, the crawl stopped and said why: it had not reached those pages"
    " yet. `closespider_pagecount` is this benchmark's bound on a crawl that"
    " re-fetches without end: the pages it never reached were starved, not dropped.",
    "**duplicate fetches**: responses beyond the first per page, counted by the site.",
    "**ERROR log lines** is the crawl's `log_count/ERROR`; **tracebacks** counts"
    " 'Traceback' blocks in its log (a chained exception counts twice).",
    "A cell with ' / ' lists the rounds in order; one value means every round agreed.",
)


def markdown(
    meta: dict[str, Any],
    rows: Sequence[Sequence[str]],
    outcomes: Sequence[CrawlOutcome],
    notes: Sequence[str],
) -> str:
    """Render ``faults.md``."""
    info = meta["machine"]
    packages = ", ".join(f"{k} {v}" for k, v in info["packages"].items() if v)
    detail_rows = [
        [
            o.fault,
            CONTENDERS[o.contender].name,
            str(o.round + 1),
            f"{o.fetched}/{o.pages}",
            str(o.duplicate_fetches),
            _ended(o),
            str(o.log_errors),
            f"{o.wall:.1f}",
            "" if o.injected_at is None else f"{o.injected_at:.1f}",
            _injected(o),
            ", ".join(f"{k} {v}" for k, v in o.our_stats.items()),
            o.harness_error or "",
        ]
        for o in outcomes
    ]
    return "\n".join(
        [
            "# scrapy-redis-bloom fault table",
            "",
            f"- date: {meta['date']} (total run {meta['elapsed']:.0f} s)",
            f"- command: `{meta['command']}`",
            f"- machine: {info['nproc']} CPUs, {info['cpu_model']}; {info['platform']}",
            f"- Python {info['python']}; {packages}",
            f"- Redis {meta['redis']['version']}, {meta['redis']['binary']}, on 127.0.0.1",
            f"- git: {info['git'] or 'unknown'}",
            "",
            "## Faults",
            "",
            md_table(HEADERS, rows),
            "",
            *(f"- {line}" for line in READING),
            "",
            "## Every crawl, in the order run",
            "",
            md_table(
                (
                    "fault",
                    "contender",
                    "round",
                    "pages fetched",
                    "duplicate fetches",
                    "crawl ended",
                    "ERROR lines",
                    "wall s",
                    "injected at s",
                    "fault injected",
                    "our stats",
                    "harness error",
                ),
                detail_rows,
            ),
            "",
            "## How it was measured",
            "",
            *(f"- {note}" for note in notes),
            "",
        ]
    )


# -- the run ------------------------------------------------------------------------------

DEFAULTS: dict[str, Any] = {
    "rounds": 2,
    "pages": 400,
    "delay": 0.06,
    "trigger": 0.25,
    "outage": 3.0,
    "stall": 10.0,
    "kill_interval": 0.05,
    "retry_timeout": None,
    "runaway": 4,
    "closespider_timeout": 90.0,
    "crawl_timeout": 150.0,
}
QUICK: dict[str, Any] = {
    "rounds": 1,
    "pages": 150,
    "delay": 0.04,
    "outage": 1.5,
    "stall": 6.0,
    "retry_timeout": 4.0,
    "closespider_timeout": 40.0,
    "crawl_timeout": 60.0,
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line; --quick changes the defaults, explicit options win."""
    parser = bench_parser(__doc__, "smaller site, one round", "faults.md/json")
    parser.add_argument(
        "--only", default=",".join(FAULTS_BY_KEY), help="faults to run, comma-separated"
    )
    parser.add_argument("--verbose", action="store_true", help="log each crawl's details")
    parser.add_argument(
        "--logs", type=Path, help="keep each crawl's log and output here (default: deleted)"
    )
    group = parser.add_argument_group("sizes (defaults of the full run; --quick changes some)")
    group.add_argument("--rounds", type=int, help="crawls per fault and contender")
    group.add_argument("--pages", type=int, help="pages of the TreeSite")
    group.add_argument("--delay", type=float, help="seconds the site waits per page")
    group.add_argument("--trigger", type=float, help="share of the pages served before the fault")
    group.add_argument("--outage", type=float, help="seconds Redis is down (restart) or frozen")
    group.add_argument("--stall", type=float, help="seconds Redis is stalled (SIGSTOP)")
    group.add_argument("--kill-interval", type=float, help="seconds between CLIENT KILLs")
    group.add_argument(
        "--retry-timeout",
        type=float,
        help="BLOOMFILTER_RETRY_TIMEOUT for ours (default: unset, the package's 20 s)",
    )
    group.add_argument("--runaway", type=int, help="CLOSESPIDER_PAGECOUNT, in pages of the site")
    group.add_argument("--closespider-timeout", type=float, help="CLOSESPIDER_TIMEOUT, seconds")
    group.add_argument("--crawl-timeout", type=float, help="wall-clock limit per crawl, seconds")
    args = finish_args(parser, argv, DEFAULTS, QUICK, list(FAULTS_BY_KEY), "faults")
    if args.rounds < 1 or args.pages < 7 or args.runaway < 2:
        parser.error("--rounds must be at least 1, --pages at least 7, --runaway at least 2")
    if not 0 < args.trigger < 1 or args.delay < 0 or args.outage <= 0 or args.stall <= 0:
        parser.error("--trigger must be in (0, 1), --delay >= 0, --outage and --stall > 0")
    return args


def redis_version() -> dict[str, str]:
    """Start a throwaway redis-server and return its version and binary."""
    with RedisServer() as server:
        client = server.client(retry=no_retry())
        try:
            version = str(client.info("server")["redis_version"])
        finally:
            client.close()
        return {"version": version, "binary": server.binary}


def run(args: argparse.Namespace) -> int:
    """Run every crawl; print the table, write faults.md and faults.json; return the status."""
    started = time.monotonic()
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    faults = [FAULTS_BY_KEY[key] for key in args.only]
    redis_info = redis_version()
    logger.info("redis-server %s at %s", redis_info["version"], redis_info["binary"])
    outcomes: list[CrawlOutcome] = []
    with tempfile.TemporaryDirectory(prefix="srb-bench-faults-") as tmp:
        workdir = args.logs or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for fault in faults:
            for round_index in range(args.rounds):
                order = rotated(list(fault.contenders), round_index)
                logger.info(
                    "%s, round %d/%d: %s",
                    fault.label(args),
                    round_index + 1,
                    args.rounds,
                    ", ".join(order),
                )
                for key in order:
                    outcome = run_crawl(fault, CONTENDERS[key], round_index, args, workdir)
                    outcomes.append(outcome)
                    _log_outcome(outcome, args.verbose)
    rows = table_rows(outcomes, faults, args)
    notes = method_notes(args)
    elapsed = time.monotonic() - started
    failed = [o for o in outcomes if o.harness_error]
    meta = {
        "date": date,
        "elapsed": elapsed,
        "command": shlex.join([Path(sys.executable).name, "bench/faults.py", *sys.argv[1:]]),
        "arguments": vars(args),
        "machine": machine(),
        "redis": redis_info,
        "harness_errors": [
            f"{o.fault}/{o.contender} round {o.round + 1}: {o.harness_error}" for o in failed
        ],
    }
    sys.stdout.write("\n" + grid([list(HEADERS), *rows]) + "\n\n")
    args.out.mkdir(parents=True, exist_ok=True)
    md_path, json_path = args.out / "faults.md", args.out / "faults.json"
    md_path.write_text(markdown(meta, rows, outcomes, notes))
    document = {
        **meta,
        "arguments": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "faults": [
            {
                "key": f.key,
                "title": f.label(args),
                "contenders": list(f.contenders),
                "not_run": f.not_run,
                "settings": f.settings,
                "ours_settings": f.ours_settings,
                "doc": (f.inject.__doc__ or "").strip() if f.inject else "",
            }
            for f in faults
        ],
        "contenders": {
            c.key: {"name": c.name, "settings": c.settings} for c in CONTENDERS.values()
        },
        "table": {"headers": list(HEADERS), "rows": rows},
        "crawls": [dataclasses.asdict(o) for o in outcomes],
        "notes": notes,
    }
    json_path.write_text(json.dumps(document, indent=2, default=str) + "\n")
    sys.stdout.write(f"Wrote {md_path} and {json_path} in {elapsed:.0f} s.\n")
    for o in failed:
        logger.error(
            "Harness step failed: %s/%s round %d: %s",
            o.fault,
            o.contender,
            o.round + 1,
            o.harness_error,
        )
    return 1 if failed else 0


def _log_outcome(o: CrawlOutcome, verbose: bool) -> None:
    logger.info(
        "  %-40s %d/%d pages, %d duplicate fetches, ended %s, %d ERROR lines, %.1f s; %s%s",
        CONTENDERS[o.contender].name,
        o.fetched,
        o.pages,
        o.duplicate_fetches,
        _ended(o),
        o.log_errors,
        o.wall,
        _injected(o),
        f"; HARNESS ERROR {o.harness_error}" if o.harness_error else "",
    )
    if verbose:
        for line in [*o.error_lines[:3], *o.warning_lines[:3]]:
            logger.info("    %s", _short(line, 300))


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, set up logging, run; return the exit status."""
    args = parse_args(argv)
    return run_main(run, args, False, "servers and crawls")


if __name__ == "__main__":
    sys.exit(main())
