"""Several Scrapy worker processes crawling one site through one Redis: the harness.

Each worker is ``crawl_runner.py --mode shared``: a scrapy-redis ``RedisSpider`` under
scrapy-redis's Scheduler, which takes a start URL from Redis, follows every link and
closes once the shared queue has been idle for a few seconds. :func:`run_workers`
starts them, pushes the start URLs once all wait, optionally runs a fault while they
crawl (``during``), and returns what each worker reported.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from redis.cluster import RedisCluster
from website import SiteServer

HERE = Path(__file__).parent
RUNNER = HERE / "crawl_runner.py"
WORKERS = 2
START_PAGES = (0, 1)
TIMEOUT = 120
# Deprecations that scrapy-redis 0.9.1 itself triggers under Scrapy 2.19 (spider= to the
# stats, Spider.log(), RedisStatsCollector's method signatures): not ours to fix.
KNOWN_WARNINGS = ("/scrapy_redis/", "RedisStatsCollector", "Passing a 'spider' argument")


@dataclass
class Crawl:
    """What the workers of one crawl did."""

    results: list[dict[str, Any]]
    logs: list[str]
    #: How many workers held a lease at once (all, if they crawled together).
    registered: int

    def stat(self, name: str) -> int:
        """Return a stat summed over the workers."""
        return sum(int(r["stats"].get(name, 0) or 0) for r in self.results)

    @property
    def fetched(self) -> collections.Counter[str]:
        """URLs fetched, with how many times, over all workers."""
        return collections.Counter(url for r in self.results for url in r["fetched"])

    def lost(self, site: SiteServer) -> set[str]:
        """Return the reachable pages that no worker fetched."""
        return site.reachable_urls() - set(self.fetched)

    def duplicates(self) -> int:
        """Return the number of fetches beyond the first of each URL."""
        return sum(n - 1 for n in self.fetched.values())


def run_workers(
    site: SiteServer,
    redis_url: str,
    tmp_path: Path,
    settings: dict[str, Any],
    filter_redis: redis.Redis | RedisCluster,
    during: Callable[[], None] | None = None,
    start_pages: tuple[int, ...] = START_PAGES,
) -> Crawl:
    """Run WORKERS worker processes to the end; return what they reported.

    ``during`` runs once both workers crawl (they hold their leases), for a fault.
    Every worker must exit 0 with no unexpected Python warning.
    """
    base = {
        "SCHEDULER_PERSIST": True,
        "MAX_IDLE_TIME_BEFORE_CLOSE": 3,
        "SHARED_START_WAIT": TIMEOUT,
        "CONCURRENT_REQUESTS": 4,
        **settings,
    }
    procs, outputs, logs = [], [], []
    for i in range(WORKERS):
        output, log = tmp_path / f"worker{i}.json", tmp_path / f"worker{i}.log"
        with log.open("wb") as sink:
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(RUNNER), "--site", site.url, "--redis-url", redis_url,
                     "--mode", "shared", "--settings", json.dumps(base), "--output", str(output)],
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                )
            )  # fmt: skip
        outputs.append(output)
        logs.append(log)
    deadline = time.monotonic() + TIMEOUT
    client = redis.Redis.from_url(redis_url)
    registered = 0
    try:
        # Start pages are pushed once every worker waits for them; each takes one per
        # poll, so all begin at once.
        while client.scard("shared:ready") < WORKERS:
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                break  # checked below: every worker must exit 0
            time.sleep(0.05)
        client.rpush("shared:start_urls", *[site.page_url(p) for p in start_pages])
        # Each worker holds a lease in the filter's registry while it runs.
        while filter_redis.zcard("shared:bloomfilter:workers") < WORKERS:
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        registered = int(filter_redis.zcard("shared:bloomfilter:workers"))
        if during is not None:
            during()
        for proc in procs:
            proc.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        client.close()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results, texts = [], []
    for proc, output, log in zip(procs, outputs, logs, strict=True):
        text = log.read_text(errors="replace")
        texts.append(text)
        assert proc.returncode == 0, text[-3000:]
        result = json.loads(output.read_text())
        unexpected = [w for w in result["warnings"] if not any(k in w for k in KNOWN_WARNINGS)]
        assert not unexpected, unexpected
        results.append(result)
    return Crawl(results, texts, registered)
