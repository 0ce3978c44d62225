"""End-to-end crawls: Scrapy, scrapy-redis and the Bloom dupefilter against a real site.

Each crawl runs ``crawl_runner.py`` in a subprocess (Twisted's reactor cannot restart
in this process) against the session's redis-server and a local HTTP server serving
the generated site of ``website.py``. The filter is sized for 100,000 items at a 1e-6
false-positive rate and holds at most a few hundred, so a false positive (a new page
reported as seen) would take odds of about 1e-50: the counts below are exact.
"""

from __future__ import annotations

import collections
import itertools
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from scrapy import Request
from scrapy_redis.dupefilter import RFPDupeFilter as ScrapyRedisDupeFilter
from website import Site, SiteServer

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.core.layout import HEADER_BYTES
from scrapy_redis_bloom.core.record import FilterRecord

HERE = Path(__file__).parent
RUNNER = HERE / "crawl_runner.py"

# Mirrors crawl_runner.BASE_SETTINGS: the geometry every crawl here expects.
SIZING = {"BLOOMFILTER_CAPACITY": 100_000, "BLOOMFILTER_ERROR_RATE": 1e-6}
CONFIG = BloomConfig.from_settings(SIZING)
SPEC = CONFIG.spec

PAGES = 300
CRAWL_TIMEOUT = 90  # seconds per subprocess; a crawl takes 1 to 4 here

# scrapy-redis 0.9.1 passes spider= to StatsCollector.inc_value(), deprecated by Scrapy
# 2.19. Every other warning in a crawl subprocess fails the test.
#: Warnings other libraries raise, matched by their text: scrapy-redis's, and Spidermon's
#: (its runner logs through Spider.log(), deprecated in Scrapy 2.19).
KNOWN_WARNINGS = (
    "Passing a 'spider' argument to StatsCollector.inc_value() is deprecated",
    "spidermon/contrib/scrapy/runners.py:119: ScrapyDeprecationWarning: Spider.log()",
)


_outputs = itertools.count()


@dataclass
class Crawl:
    """What one crawl subprocess left behind."""

    returncode: int
    log: str
    output: dict[str, Any]

    @property
    def stats(self) -> dict[str, Any]:
        return self.output["stats"]  # type: ignore[no-any-return]

    @property
    def fetched(self) -> list[str]:
        return self.output["fetched"]  # type: ignore[no-any-return]

    def describe(self) -> str:
        """Return the log's tail, for assertion messages."""
        return "\n".join(self.log.splitlines()[-40:])


def crawl(
    server: Any,
    redis_url: str,
    tmp_path: Path,
    *,
    mode: str,
    scheduler: str = "scrapy-redis",
    settings: dict[str, Any] | None = None,
    spider_name: str | None = None,
    start_dont_filter: bool = False,
) -> Crawl:
    output = tmp_path / f"crawl-{next(_outputs)}.json"
    args = [
        sys.executable,
        str(RUNNER),
        "--site", server.url,
        "--redis-url", redis_url,
        "--scheduler", scheduler,
        "--mode", mode,
        "--settings", json.dumps(settings or {}),
        "--output", str(output),
    ]  # fmt: skip
    if spider_name:
        args += ["--spider-name", spider_name]
    if start_dont_filter:
        args.append("--start-dont-filter")
    done = subprocess.run(args, capture_output=True, text=True, timeout=CRAWL_TIMEOUT, check=False)
    assert output.exists(), f"the crawl wrote no output (exit {done.returncode}):\n{done.stderr}"
    assert done.stdout.strip() == str(output), done.stdout
    result = Crawl(done.returncode, done.stderr, json.loads(output.read_text()))
    unexpected = [
        text for text in result.output["warnings"] if not any(k in text for k in KNOWN_WARNINGS)
    ]
    assert not unexpected, f"warnings in the crawl: {unexpected}"
    return result


def assert_finished(result: Crawl) -> None:
    """Check that the crawl ran to its end and logged no error."""
    assert result.returncode == 0, result.describe()
    assert result.output["error"] is None, result.describe()
    assert result.stats["finish_reason"] == "finished", result.describe()
    assert "log_count/ERROR" not in result.stats, result.describe()
    assert "Traceback" not in result.log, result.describe()


def assert_state_stats(stats: dict[str, Any], items: int) -> None:
    """Check the geometry and BITCOUNT-derived state stats of a filter of ``items``."""
    assert stats["bloomfilter/capacity"] == CONFIG.capacity
    assert stats["bloomfilter/bits"] == SPEC.bits
    assert stats["bloomfilter/hash_functions"] == SPEC.hash_count
    assert stats["bloomfilter/shards"] == SPEC.shards
    # Each item sets k bits, fewer where bits collide.
    assert 0 < stats["bloomfilter/bits_set"] <= items * SPEC.hash_count
    assert stats["bloomfilter/fill_ratio"] == pytest.approx(
        stats["bloomfilter/bits_set"] / SPEC.bits, abs=1e-6
    )
    assert 0 < stats["bloomfilter/fill_ratio"] < 0.01
    # Exact but for bit collisions, rare at this fill ratio.
    assert abs(stats["bloomfilter/estimated_items"] - items) <= max(3, items // 100)
    # At this fill the bits alone answer falsely below 1e-20: what is left, blocked, is
    # the floor of an item of the block with the same three seeds, n / (m B**2).
    floor = items / SPEC.bits / SPEC.block_bits**2 if SPEC.block_bits else 0.0
    assert 0 < stats["bloomfilter/estimated_fpr"] == pytest.approx(floor, rel=0.05, abs=1e-20)
    # At least one shard was allocated at its full size, and nothing beyond all of them.
    assert SPEC.shard_bytes <= stats["bloomfilter/memory_bytes"] <= 2 * SPEC.total_bytes + 4096


def fingerprint(url: str) -> str:
    """scrapy-redis's fingerprint of a GET request: what the dupefilter adds by default."""
    return ScrapyRedisDupeFilter(None, "unused").request_fingerprint(Request(url))  # type: ignore[no-any-return]


def filter_keys(client: redis.Redis, spider: str) -> list[str]:
    """Return the keys of a spider's filter: ``<spider>:bloomfilter:*`` and its shards."""
    patterns = (f"{spider}:bloomfilter*", f"{{{spider}:bloomfilter:*")
    return sorted(key.decode() for p in patterns for key in client.scan_iter(match=p))


def bits_per_shard(client: redis.Redis, spider: str) -> dict[str, int]:
    """Return the bits set in each shard of a spider's filter (its header not counted)."""
    shards = [key for key in filter_keys(client, spider) if key.endswith("}:g0")]
    return {key: int(client.bitcount(key, HEADER_BYTES, -1)) for key in shards}


@pytest.fixture
def site_server() -> Iterator[Any]:
    with SiteServer(Site(PAGES)) as server:
        yield server


# -- seed 003: 110 start requests, 10 of them duplicates ------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scheduler", ["scrapy-redis", "default"])
def test_seed003_filters_the_ten_duplicates(
    scheduler: str, site_server: Any, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    result = crawl(
        site_server, redis_url, tmp_path, mode="seed003", scheduler=scheduler, spider_name="seed003"
    )

    assert_finished(result)
    stats = result.stats
    assert result.output["offered"] == 110
    assert stats["bloomfilter/filtered"] == 10
    assert stats["dupefilter/filtered"] == 10
    assert stats["bloomfilter/added"] == 100
    assert stats["response_received_count"] == 100
    assert stats["downloader/request_count"] == 100
    search = [site_server.search_url(wd) for wd in range(100)]
    assert sorted(result.fetched) == sorted(search)
    served = site_server.hits_snapshot()
    assert served == collections.Counter({f"/search?wd={wd}": 1 for wd in range(100)})
    assert_state_stats(stats, items=100)

    if scheduler == "scrapy-redis":
        assert stats["scheduler/enqueued/redis"] == 100
        # SCHEDULER_PERSIST defaults to False: the scheduler cleared the filter on close,
        # after the dupefilter had written its state to the stats.
        assert filter_keys(redis_client, "seed003") == []
        assert redis_client.exists("seed003:requests") == 0
    else:
        assert stats["scheduler/enqueued"] == 100
        # Scrapy's scheduler has no notion of persistence: the filter stays in Redis.
        assert "seed003:bloomfilter:meta" in filter_keys(redis_client, "seed003")
    assert redis_client.keys("site:*") == []  # the filter is named after the spider


# -- following links: every page once -------------------------------------------------


def assert_site_crawled_once(result: Crawl, server: Any) -> int:
    """Every reachable page was fetched exactly once; return how many there are."""
    reachable = server.reachable_urls()
    counts = collections.Counter(result.fetched)
    assert [url for url, n in counts.items() if n > 1] == []
    assert set(counts) == reachable
    served = server.hits_snapshot()
    assert served == collections.Counter({url.removeprefix(server.url): 1 for url in reachable})

    # Each link offered to the scheduler is either the first of its page (added) or a
    # repeat (filtered): the start request plus every link of every page.
    site = server.site
    offered = 1 + site.links_offered(site.reachable())
    assert result.output["offered"] == offered
    stats = result.stats
    assert stats["bloomfilter/added"] == len(reachable)
    assert stats["bloomfilter/filtered"] == offered - len(reachable)
    assert stats["dupefilter/filtered"] == offered - len(reachable)
    assert stats["scheduler/enqueued/redis"] == len(reachable)
    assert stats["scheduler/dequeued/redis"] == len(reachable)
    assert stats["response_received_count"] == len(reachable)
    assert_state_stats(stats, items=len(reachable))
    # One worker: the crawl-wide totals are its own counts, even when the scheduler
    # clears the filter on close (SCHEDULER_PERSIST = False).
    assert stats["bloomfilter/total_added"] == stats["bloomfilter/added"]
    assert stats["bloomfilter/total_filtered"] == stats["bloomfilter/filtered"]
    return len(reachable)


@pytest.mark.timeout(120)
def test_follow_crawl_persist_keeps_the_filter(
    site_server: Any, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    settings = {"SCHEDULER_PERSIST": True, "LOGSTATS_INTERVAL": 0.5}
    result = crawl(site_server, redis_url, tmp_path, mode="follow", settings=settings)

    assert_finished(result)
    pages = assert_site_crawled_once(result, site_server)
    assert pages == PAGES
    assert result.stats["bloomfilter/filtered"] > 5 * pages  # most links are repeats

    # While it crawled, the filter said every LOGSTATS_INTERVAL what it holds, with the
    # live totals of the counters (synced about once a second), never above the end.
    lines = re.findall(
        r"Bloom filter 'site:bloomfilter': ([\d,]+) items from all workers \([\d.]+% of"
        r" capacity [\d,]+\), [\d.]+% of bits set, false-positive rate now \S+; this worker:"
        r" ([\d,]+) new, ([\d,]+) seen \(([\d,]+) of them from its near-cache",
        result.log,
    )
    assert lines, result.log[-2000:]
    items = [int(line[0].replace(",", "")) for line in lines]
    assert items == sorted(items)
    assert items[-1] <= pages
    assert all(int(seen.replace(",", "")) >= int(hits.replace(",", "")) for *_, seen, hits in lines)

    # The filter stays in Redis, with the record of the geometry it was created with.
    keys = filter_keys(redis_client, "site")
    assert set(keys) == {
        "site:bloomfilter:meta",
        "site:bloomfilter:count",
        *(f"{{site:bloomfilter:{shard}}}:g0" for shard in range(SPEC.shards)),
    }
    meta = redis_client.hgetall("site:bloomfilter:meta")
    record = {name.decode(): value.decode() for name, value in meta.items()}
    assert record["shards"] == str(SPEC.shards)
    assert record["shard_bits"] == str(SPEC.shard_bits)
    assert record["hash_count"] == str(SPEC.hash_count)
    assert record["capacity"] == str(CONFIG.capacity)
    assert redis_client.exists("site:requests") == 0  # the queue was drained

    # It holds scrapy-redis's fingerprint of every page, and of nothing else.
    bloom = RedisBloomFilter(redis_client, "site:bloomfilter", SPEC, CONFIG.capacity)
    assert all(bloom.contains_many(fingerprint(url) for url in result.fetched))
    others = [site_server.page_url(page) for page in range(PAGES, PAGES + 1000)]
    others += [site_server.search_url(wd) for wd in range(1000)]
    assert not any(bloom.contains_many(fingerprint(url) for url in others))


@pytest.mark.timeout(120)
def test_follow_crawl_without_persist_clears_the_filter_but_reports_it(
    site_server: Any, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    result = crawl(
        site_server, redis_url, tmp_path, mode="follow", settings={"SCHEDULER_PERSIST": False}
    )

    assert_finished(result)
    assert_site_crawled_once(result, site_server)  # includes the state stats
    assert filter_keys(redis_client, "site") == []
    assert redis_client.keys("site:*") == []


@pytest.mark.timeout(240)
def test_second_crawl_reuses_the_persisted_filter(
    site_server: Any, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    persist = {"SCHEDULER_PERSIST": True}
    first = crawl(site_server, redis_url, tmp_path, mode="follow", settings=persist)
    assert_finished(first)
    pages = assert_site_crawled_once(first, site_server)
    served = site_server.hits_snapshot()

    # The same spider again: scrapy-redis's Scheduler runs start requests through the
    # dupefilter too, so the only start request is filtered and nothing is fetched.
    again = crawl(site_server, redis_url, tmp_path, mode="follow", settings=persist)
    assert_finished(again)
    assert again.fetched == []
    assert again.output["offered"] == 1
    assert again.stats["bloomfilter/filtered"] == 1
    assert again.stats["dupefilter/filtered"] == 1
    assert again.stats["bloomfilter/added"] == 0
    assert "scheduler/enqueued/redis" not in again.stats
    assert "downloader/request_count" not in again.stats
    assert site_server.hits_snapshot() == served
    # The state is still reported, and describes the first crawl's filter unchanged.
    for name in ("bits_set", "estimated_items", "memory_bytes"):
        assert again.stats[f"bloomfilter/{name}"] == first.stats[f"bloomfilter/{name}"], name

    # dont_filter lets the start page through; every link on it is then filtered.
    forced = crawl(
        site_server, redis_url, tmp_path, mode="follow", settings=persist, start_dont_filter=True
    )
    assert_finished(forced)
    links = len(site_server.site.links(0))
    assert forced.fetched == [site_server.page_url(0)]
    assert forced.output["offered"] == 1 + links
    assert forced.stats["bloomfilter/filtered"] == links
    assert forced.stats["bloomfilter/added"] == 0
    assert forced.stats["bloomfilter/estimated_items"] == first.stats["bloomfilter/estimated_items"]
    served["/page/0"] += 1
    assert site_server.hits_snapshot() == served
    assert abs(forced.stats["bloomfilter/estimated_items"] - pages) <= 3


# -- a filter created with other settings ---------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("scheduler", ["scrapy-redis", "default"])
def test_other_sizing_fails_with_config_mismatch(
    scheduler: str, site_server: Any, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    persist = {"SCHEDULER_PERSIST": True}
    seed = {"mode": "seed003", "scheduler": scheduler, "spider_name": "seed003"}
    first = crawl(site_server, redis_url, tmp_path, settings=persist, **seed)
    assert_finished(first)
    record = redis_client.hgetall("seed003:bloomfilter:meta")
    bits_before = bits_per_shard(redis_client, "seed003")
    assert bits_before
    served = site_server.hits_snapshot()

    # SCHEDULER_PERSIST is False: a worker that fails to open must not clear the
    # filter that the others share when it closes.
    other = {"SCHEDULER_PERSIST": False, "BLOOMFILTER_CAPACITY": 1000}
    mismatched = BloomConfig.from_settings({**SIZING, **other})
    assert mismatched.spec != SPEC
    result = crawl(site_server, redis_url, tmp_path, settings=other, **seed)

    assert result.returncode == 1, result.describe()
    chain = result.output["error"]["chain"]
    assert "ConfigMismatchError" in [error["type"] for error in chain], chain
    assert result.fetched == []
    assert site_server.hits_snapshot() == served
    # The message, in the log, says what is in Redis, what this worker has, and the ways out.
    fields = {name.decode(): value.decode() for name, value in record.items()}
    stored = FilterRecord.parse("seed003:bloomfilter:meta", fields).describe()
    mine = mismatched.record().describe()
    log = result.log
    assert "[twisted] CRITICAL: Unhandled error in Deferred:" in log
    error = (
        "scrapy_redis_bloom.core.errors.ConfigMismatchError: The Bloom filter 'seed003:bloomfilter'"
    )
    assert error in log
    for text in (
        f"in Redis was created on {_created(record)} with {stored};",
        f"this worker is configured with {mine}.",
        "A filter's layout cannot change once it holds bits.",
        "start this worker with the settings the filter was created with",
        "choose another BLOOMFILTER_KEY",
        # The project's command: it reads the crawl's Redis from settings.py (the alias would
        # act on $REDIS_URL or localhost).
        "reset the filter (scrapy bloom reset --key 'seed003:bloomfilter')",
        "which forgets every URL it has seen",
    ):
        assert text in log, text
    # The filter in Redis is untouched: same record, same bits.
    assert redis_client.hgetall("seed003:bloomfilter:meta") == record
    assert bits_per_shard(redis_client, "seed003") == bits_before


def _created(record: dict[bytes, bytes]) -> str:
    """Format a record's creation time as the error message does."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(record[b"created"])))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("blocked", [False, True])
def test_a_crawl_ten_times_past_capacity_loses_no_page(
    site_server: Any, redis_url: str, redis_client: redis.Redis, tmp_path: Path, blocked: bool
) -> None:
    # 300 pages through a filter sized for 30: it grows (BLOOMFILTER_EXPANSION's default)
    # and keeps its rate, so every page is fetched, once; blocked or not.
    settings = {
        "SCHEDULER_PERSIST": True,
        "BLOOMFILTER_CAPACITY": 30,
        "BLOOMFILTER_ERROR_RATE": 1e-6,
        "BLOOMFILTER_BLOCKED": blocked,
    }
    result = crawl(site_server, redis_url, tmp_path, mode="follow", settings=settings)

    assert_finished(result)
    reachable = site_server.reachable_urls()
    counts = collections.Counter(result.fetched)
    assert set(counts) == reachable
    assert max(counts.values()) == 1
    stats = result.stats
    assert stats["bloomfilter/added"] == len(reachable) == PAGES
    assert stats["bloomfilter/generations"] >= 4  # 30 + 60 + 120 < 300
    assert stats["bloomfilter/grown"] >= 3
    assert stats["bloomfilter/estimated_fpr"] <= 1e-6
    assert "grows: shard 0 started generation 1" in result.log
    assert not re.search(r"\[scrapy_redis_bloom[\w.]*\] WARNING", result.log)
