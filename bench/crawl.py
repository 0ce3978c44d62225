"""Measure (e): a 2-worker scrapy-redis crawl of a local site, per dupefilter.

Each crawl runs ``tests/crawl_runner.py --mode shared`` in two worker processes (a
scrapy-redis ``RedisSpider`` under scrapy-redis's Scheduler, as in
``tests/test_workers.py``) against the benchmark's Redis and a local site of
interlinked pages (``tests/website.py``), with ``DUPEFILTER_CLASS`` the only setting
that differs between contenders (plus each filter's own sizing settings).

Why three times are reported: a scrapy-redis worker closes only after its queue has
been idle for ``MAX_IDLE_TIME_BEFORE_CLOSE`` seconds, and Scrapy looks at an idle
spider on a 5-second heartbeat, so a short crawl's wall time is mostly process start
and idle waiting, the same for every dupefilter. The site records when it served each
request, so the *crawl span* (first page served to last page served) measures the
crawl itself; *to last page* adds the workers' start-up; *wall* is launch to exit.

Redis's side of each crawl is measured too (``cmdtime.CommandClock``): the command
time of the dupefilter's commands (those on a key other than the scheduler's queue
and the start URLs) and of all the workers' commands, per page fetched, and ours'
round trips as it counts them (stat ``bloomfilter/round_trips``, where reported).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cmdtime import CommandClock, CommandTime
from harness import TESTS, BenchRedis, Samples, interleave
from micro import (
    NAME_OLD,
    NAME_OURS,
    NAME_REDISBLOOM,
    NAME_SCRAPY_REDIS,
    OLD,
    OURS,
    SCRAPY_REDIS,
    Peers,
)
from peers import BF_ADD_CLASS
from website import Site, SiteServer

logger = logging.getLogger("bench.crawl")

RUNNER = TESTS / "crawl_runner.py"
HERE = Path(__file__).resolve().parent
WORKERS = 2
START_URLS_KEY = "shared:start_urls"
#: Where each worker of crawl_runner.py adds its pid once it waits for start URLs.
READY_KEY = "shared:ready"
#: Keys of the crawl that are not the dupefilter's: scrapy-redis's queue, the start URLs.
NOT_FILTER_KEYS = frozenset({"shared:requests", START_URLS_KEY, READY_KEY})
ROUND_TRIPS_STAT = "bloomfilter/round_trips"
BATCHING = "scrapy_redis_bloom.batching.BatchingMiddleware"
NAME_OURS_BATCHED = "ours, batched"
NAME_OURS_NATIVE_BATCHED = "ours, native, batched"
#: BLOOMFILTER_BATCH_WINDOW of the windowed contenders, seconds.
WINDOW = 0.05
NAME_OURS_WINDOW = f"ours, batched, {WINDOW * 1000:g} ms window"
NAME_OURS_NATIVE_WINDOW = f"ours, native, batched, {WINDOW * 1000:g} ms window"
NAME_OURS_CLASSIC_WINDOW = f"ours, classic layout, batched, {WINDOW * 1000:g} ms window"

#: Ours and RedisBloom's BF.ADD peer sized alike for the crawl, at the issue's reference
#: rate: 100,000 URLs at 1e-4 (ours growing: k = 14, 240 KiB).
CAPACITY, ERROR_RATE = 100_000, 1e-4
OURS_SETTINGS: dict[str, Any] = {
    "DUPEFILTER_CLASS": OURS,
    "BLOOMFILTER_CAPACITY": CAPACITY,
    "BLOOMFILTER_ERROR_RATE": ERROR_RATE,
}


@dataclass(frozen=True)
class CrawlContender:
    """A dupefilter for the crawl: a name and the settings that select it."""

    name: str
    settings: dict[str, Any]


def crawl_contenders(peers: Peers, batching: bool = False) -> list[CrawlContender]:
    """Return ours (batched too: per response, windowed), scrapy-redis's and the peers'.

    ``batching``: ``BatchingMiddleware`` can be imported. scrapy-redis-bloomfilter
    runs with its defaults (BLOOMFILTER_BIT 30, k 6); ours and RedisBloom sized for
    100,000 URLs at 1e-4.
    """
    ours = {**OURS_SETTINGS, **peers.ours_settings()}
    contenders = [CrawlContender(NAME_OURS, ours)]
    if batching:
        batched = {**ours, "SPIDER_MIDDLEWARES": {BATCHING: 0}}
        contenders.append(CrawlContender(NAME_OURS_BATCHED, batched))
        windowed = {**batched, "BLOOMFILTER_BATCH_WINDOW": WINDOW}
        contenders.append(CrawlContender(NAME_OURS_WINDOW, windowed))
        if peers.blocked:  # the layout the default (blocked) is not
            classic = {**windowed, "BLOOMFILTER_BLOCKED": False}
            contenders.append(CrawlContender(NAME_OURS_CLASSIC_WINDOW, classic))
        if peers.native:
            native = {**batched, "BLOOMFILTER_BACKEND": "native"}
            contenders.append(CrawlContender(NAME_OURS_NATIVE_BATCHED, native))
            native_windowed = {**windowed, "BLOOMFILTER_BACKEND": "native"}
            contenders.append(CrawlContender(NAME_OURS_NATIVE_WINDOW, native_windowed))
    contenders.append(CrawlContender(NAME_SCRAPY_REDIS, {"DUPEFILTER_CLASS": SCRAPY_REDIS}))
    if peers.bloom:
        bloom = {
            "DUPEFILTER_CLASS": BF_ADD_CLASS,
            "REDISBLOOM_CAPACITY": CAPACITY,
            "REDISBLOOM_ERROR_RATE": ERROR_RATE,
        }
        contenders.append(CrawlContender(NAME_REDISBLOOM, bloom))
    if peers.old:
        contenders.append(CrawlContender(NAME_OLD, {"DUPEFILTER_CLASS": OLD}))
    return contenders


def start_pages(site: Site) -> tuple[int, int]:
    """Return the two start pages: the home page and the page farthest from it.

    Each worker takes one, pushed once both wait for start URLs (``shared:ready``).
    Had one worker started first, it could find the other's start page before that
    one polled; the other would then see its start request filtered and an empty
    queue, and sleep until Scrapy's next 5 s idle heartbeat, leaving the whole crawl
    to one worker. The farthest page (deepest in a breadth-first walk from the home
    page) keeps the two apart for as long as possible.
    """
    depth = {0: 0}
    frontier = [0]
    while frontier:
        following = []
        for page in frontier:
            for target in site.links(page):
                if target not in depth:
                    depth[target] = depth[page] + 1
                    following.append(target)
        frontier = following
    farthest = max(depth, key=lambda page: (depth[page], -page))
    return 0, farthest


class TimedSiteServer(SiteServer):
    """The test site, also noting when each request arrived (``time.monotonic()``)."""

    def __init__(self, site: Site, delay: float = 0.0) -> None:
        super().__init__(site, delay=delay)
        self.arrivals: list[tuple[float, str]] = []
        self._arrivals_lock = threading.Lock()

    def _count(self, target: str) -> None:
        now = time.monotonic()
        super()._count(target)
        with self._arrivals_lock:
            self.arrivals.append((now, target))


@dataclass
class CrawlOutcome:
    """What one crawl did, seen from the site and from the workers."""

    contender: str
    wall: float
    to_last_page: float
    span: float
    pages_reachable: int
    pages_fetched: int
    duplicate_fetches: int
    lost_pages: int
    per_worker: list[int]
    requests_offered: int
    error: str | None = None
    #: Redis command time of the dupefilter's commands, and of all the workers', usec.
    filter_usec: int = 0
    redis_usec: int = 0
    filter_commands: int = 0
    #: Ours' round trips (stat bloomfilter/round_trips summed), None if not reported.
    round_trips: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def fetches(self) -> int:
        """Pages fetched, duplicate fetches included: what the per-page figures divide by."""
        return self.pages_fetched + self.duplicate_fetches


@dataclass(frozen=True)
class CrawlConfig:
    """The crawl's shape: site size, latency, concurrency, idle close, time limit."""

    pages: int = 1000
    delay: float = 0.0
    concurrency: int = 8
    max_idle: int = 5
    timeout: float = 120.0

    def settings(self) -> dict[str, Any]:
        """Return the settings common to every contender (the runner adds its own base)."""
        return {
            "SCHEDULER_PERSIST": True,
            "MAX_IDLE_TIME_BEFORE_CLOSE": self.max_idle,
            "SHARED_START_WAIT": self.timeout,
            "CONCURRENT_REQUESTS": self.concurrency,
            "CONCURRENT_REQUESTS_PER_DOMAIN": self.concurrency,
        }


def run_crawl(
    bench: BenchRedis,
    contender: CrawlContender,
    config: CrawlConfig,
    workdir: Path,
    clock: CommandClock | None = None,
) -> CrawlOutcome:
    """Run one 2-worker crawl on an empty Redis and a fresh site; return its outcome.

    With ``clock``, Redis's command time is counted from the launch to the exit.
    """
    bench.flush()
    site = Site(config.pages)
    starts = start_pages(site)
    reachable = set().union(*(site.reachable(p) for p in starts))
    settings = {**config.settings(), **contender.settings}
    server = TimedSiteServer(site, delay=config.delay)
    server.start()
    try:
        tag = contender.name.split()[0].replace(",", "")
        outputs = [workdir / f"{tag}-{i}.json" for i in range(WORKERS)]
        logs = [workdir / f"{tag}-{i}.log" for i in range(WORKERS)]
        for stale in outputs:
            stale.unlink(missing_ok=True)
        # The workers import the RedisBloom peer from bench/.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]
        )}  # fmt: skip
        if clock is not None:
            clock.reset()
        launched = time.monotonic()
        procs = []
        for output, log in zip(outputs, logs, strict=True):
            command = [
                sys.executable, str(RUNNER), "--site", server.url, "--redis-url", bench.url,
                "--mode", "shared", "--settings", json.dumps(settings), "--output", str(output),
            ]  # fmt: skip
            with log.open("wb") as sink:
                procs.append(
                    subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
                )
        # One start URL per worker, pushed once both poll for one: they start together.
        error = _wait_ready(bench, procs, launched + config.timeout)
        if error is None:
            bench.redis().rpush(START_URLS_KEY, *[server.page_url(p) for p in starts])
        # On an error, a deadline already passed: the workers are killed at once.
        error = _wait(procs, time.monotonic() if error else launched + config.timeout) or error
        ended = time.monotonic()
        spent = clock.read() if clock is not None else None
        arrivals = list(server.arrivals)
        hits = server.hits_snapshot()
    finally:
        server.stop()
    pages = collections.Counter(
        int(path.rsplit("/", 1)[1]) for path in hits.elements() if path.startswith("/page/")
    )
    page_times = [t for t, path in arrivals if path.startswith("/page/")]
    results = [_read_output(output, log) for output, log in zip(outputs, logs, strict=True)]
    errors = [e for e in (error, *(r.get("error") for r in results)) if e]
    outcome = CrawlOutcome(
        contender=contender.name,
        wall=ended - launched,
        to_last_page=(max(page_times) - launched) if page_times else float("nan"),
        span=(max(page_times) - min(page_times)) if page_times else float("nan"),
        pages_reachable=len(reachable),
        pages_fetched=len(set(pages) & reachable),
        duplicate_fetches=sum(pages.values()) - len(pages),
        lost_pages=len(reachable - set(pages)),
        per_worker=[len(r.get("fetched", [])) for r in results],
        # Every link the spiders followed, plus the start URLs: the request_seen calls.
        requests_offered=len(starts) + sum(int(r.get("offered", 0)) for r in results),
        error="; ".join(str(e) for e in errors) or None,
    )
    outcome.extra["finish_reasons"] = [r.get("stats", {}).get("finish_reason") for r in results]
    trips = [r.get("stats", {}).get(ROUND_TRIPS_STAT) for r in results]
    if any(t is not None for t in trips):
        outcome.round_trips = sum(int(t or 0) for t in trips)
    if spent is not None:
        _count_redis_time(outcome, spent)
    return outcome


def _count_redis_time(outcome: CrawlOutcome, spent: CommandTime) -> None:
    """Split the crawl's Redis time: the dupefilter's commands, and everything."""
    mine = spent.select(lambda c: c.key is not None and c.key not in NOT_FILTER_KEYS)
    outcome.filter_usec = spent.usec(mine)
    outcome.filter_commands = len(mine)
    outcome.redis_usec = spent.usec(spent.commands)
    outcome.extra["filter_commands"] = spent.by_name(mine)
    outcome.extra["filter_usec_by_command"] = spent.usec_by_name(mine)
    outcome.extra["all_commands"] = spent.by_name(spent.commands)
    if spent.overflowed:
        outcome.error = "the slow log filled up: Redis time undercounted"


def _wait_ready(
    bench: BenchRedis, procs: list[subprocess.Popen[bytes]], deadline: float
) -> str | None:
    """Wait until every worker polls for start URLs; return an error, or None."""
    client = bench.redis()
    while client.scard(READY_KEY) < len(procs):
        if any(proc.poll() is not None for proc in procs):
            return "a worker exited before the crawl began"
        if time.monotonic() > deadline:
            return "the workers did not start in time"
        time.sleep(0.02)
    return None


def _wait(procs: list[subprocess.Popen[bytes]], deadline: float) -> str | None:
    """Wait for the workers; kill them at the deadline. Return an error, or None."""
    error = None
    try:
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                error = "timed out"
                break
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    failed = [p.returncode for p in procs if p.returncode != 0]
    if failed and error is None:
        error = f"worker exit status {failed}"
    return error


def _read_output(output: Path, log: Path) -> dict[str, Any]:
    """Read a worker's JSON output; on failure, an error with the log's tail."""
    try:
        result: dict[str, Any] = json.loads(output.read_text())
        if result.get("error"):
            result["error"] = f"{result['error'].get('type')}: {result['error'].get('message')}"
        return result
    except (OSError, ValueError) as exc:
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        return {"error": f"no output from the worker ({exc}); log tail: {tail}"}


def _time_shares(outcomes: list[CrawlOutcome]) -> str:
    """Which commands the filter's Redis time went to, over some crawls (top 4)."""
    spent: collections.Counter[str] = collections.Counter()
    for o in outcomes:
        spent.update(o.extra.get("filter_usec_by_command", {}))
    total = sum(spent.values()) or 1
    return ", ".join(f"{name} {usec / total:.0%}" for name, usec in spent.most_common(4))


def measure_crawl(
    bench: BenchRedis, contenders: list[CrawlContender], config: CrawlConfig, rounds: int
) -> tuple[dict[str, dict[str, Samples]], list[CrawlOutcome]]:
    """Measure (e): interleaved crawls; return per-metric samples and every outcome.

    A crawl that failed is kept among the outcomes (with its error) but left out of
    the medians.
    """
    by_name = {c.name: c for c in contenders}
    outcomes: list[CrawlOutcome] = []
    metrics = ("span", "to_last_page", "wall")
    samples: dict[str, dict[str, Samples]] = {
        metric: {name: Samples(name, "s", sample_size=config.pages) for name in by_name}
        for metric in metrics
    }
    per_page = {"filter_usec": "usec", "redis_usec": "usec", "round_trips": "trips"}
    for metric in per_page:
        samples[metric] = {}
    with (
        tempfile.TemporaryDirectory(prefix="srb-bench-crawl-") as tmp,
        CommandClock(bench.redis()) as clock,
    ):
        workdir = Path(tmp)

        def run_one(name: str, round_index: int) -> None:
            outcome = run_crawl(bench, by_name[name], config, workdir, clock)
            outcomes.append(outcome)
            logger.info(
                "  %-34s span %.2fs, to last page %.2fs, wall %.2fs; %d/%d pages,"
                " %d duplicate fetches, %d lost, per worker %s; filter %.1f usec/page,"
                " Redis %.1f usec/page, round trips %s%s",
                name,
                outcome.span,
                outcome.to_last_page,
                outcome.wall,
                outcome.pages_fetched,
                outcome.pages_reachable,
                outcome.duplicate_fetches,
                outcome.lost_pages,
                outcome.per_worker,
                outcome.filter_usec / max(1, outcome.fetches),
                outcome.redis_usec / max(1, outcome.fetches),
                outcome.round_trips,
                f"; ERROR {outcome.error}" if outcome.error else "",
            )
            if outcome.error is None:
                for metric in metrics:
                    samples[metric][name].values.append(float(getattr(outcome, metric)))
                for metric, unit in per_page.items():
                    value = getattr(outcome, metric)
                    if value is not None and outcome.fetches:
                        samples[metric].setdefault(
                            name, Samples(name, unit, sample_size=config.pages)
                        ).values.append(value / outcome.fetches)

        interleave(list(by_name), rounds, run_one, "(e) 2-worker crawl")
    bench.flush()
    for name, per in samples["filter_usec"].items():
        per.note = _time_shares([o for o in outcomes if o.contender == name and not o.error])
    for name in by_name:
        mine = [o for o in outcomes if o.contender == name]
        samples["span"][name].note = (
            f"{sum(o.pages_fetched for o in mine)}/{sum(o.pages_reachable for o in mine)} pages"
            f" in {len(mine)} crawl(s), {sum(o.duplicate_fetches for o in mine)} duplicate"
            f" fetches, {sum(o.lost_pages for o in mine)} lost, {sum(bool(o.error) for o in mine)}"
            " failed; pages per worker "
            + ", ".join("+".join(str(n) for n in o.per_worker) for o in mine)
        )
    return samples, outcomes
