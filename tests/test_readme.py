"""Every code block of README.md and of the docs' pages is run, or checked against the code.

The blocks are parsed out of README.md and the docs' pages (:mod:`readme_blocks`; the
tutorial's are test_tutorial.py's) and named by section and place (``Sentinel#1``).
:data:`BLOCKS` maps each one to the test that checks it; a block that is not in the table,
or a table entry whose block is gone or moved, fails
:func:`test_every_readme_block_has_a_check`, naming it.

- Settings blocks are executed into a dict, validated by ``BloomConfig`` and
  ``ConnectionConfig``, and used as a crawl uses them: the dupefilter built by Scrapy's
  ``from_crawler`` (and by scrapy-redis's Scheduler), a request new, then seen (also by a
  second worker, from Redis), closed. Hosts and certificate paths are replaced by the
  test's servers and files (:class:`readme_blocks.Hosts`); nothing else is changed,
  except a capacity that would allocate gigabytes (said where it is done).
- Command blocks of the operations CLI run line by line, in order, in-process, against
  real servers (one, a list of two, a Redis Cluster, a TLS server) holding the state
  that makes them meaningful: a filter written by a crawl, a SET written by
  scrapy-redis's own dupefilter.
- The ``ACL SETUSER`` line runs on a real server and the filter runs as that user.
- Install, test and benchmark commands are not run (no pip here): the extras, scripts,
  options and entry points they name must exist, and the test command must be the one
  ``.ci/run`` runs.
- Output samples must be fenced as ``text`` and have the shape the code prints: the
  example's table is laid out again by ``example_project/run.py``'s own functions, and
  the filter's periodic log line is compared with one the filter logs here.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import logging
import os
import re
import shlex
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis
from cli_run import run
from readme_blocks import (
    ROOT,
    Block,
    Hosts,
    ShellState,
    all_blocks,
    commands,
    docs_text,
    exec_settings,
    inline_code,
    page_text,
    pages,
    parse_blocks,
    prose,
    pyproject,
    shell_problems,
)
from redis_cluster import RedisClusterNodes
from redis_server import RedisServer, TlsRedisServer, find_tls_redis_server
from scrapy import Request, Spider
from scrapy.settings import Settings
from scrapy.utils.misc import load_object
from scrapy.utils.test import get_crawler
from scrapy_redis.dupefilter import RFPDupeFilter as ScrapyRedisDupeFilter
from scrapy_redis.scheduler import Scheduler as ScrapyRedisScheduler
from scrapy_run import NOT_INSTALLED, make_project
from scrapy_run import scrapy as scrapy_run
from tls_certs import TlsFiles, make_tls_files

from scrapy_redis_bloom import Addon, RedisBloomFilter
from scrapy_redis_bloom.core.errors import AccessDeniedError, CertificateError
from scrapy_redis_bloom.core.settings import BloomConfig, ConnectionConfig
from scrapy_redis_bloom.core.sizing import format_bytes
from scrapy_redis_bloom.engine.state import estimate_from_items
from scrapy_redis_bloom.scrapy.addon import DUPEFILTER, SCHEDULER
from scrapy_redis_bloom.scrapy.dupefilter import RFPDupeFilter
from scrapy_redis_bloom.scrapy.stats import FilterStats


@dataclass(frozen=True, slots=True)
class Check:
    """How one README block is checked."""

    #: The fence's language: ``text`` for output, ``""`` for a Redis command.
    lang: str
    #: How the block's first line starts: a block moved to another place fails clearly.
    starts: str
    #: The test function that checks it.
    test: str
    #: What that test does with it.
    how: str


#: The ``scrapy bloom`` sessions, in the order they run (see
#: :func:`test_scrapy_bloom_sessions`): each command and its block, in the how-to pages.
OPERATE = "Operate a filter with `scrapy bloom`"
BACKUP = "Back up and restore a filter"
OPERATIONS_SESSIONS = {
    "size": f"{OPERATE}#1",
    "info": f"{OPERATE}#2",
    "check": f"{OPERATE}#3",
    "add": f"{OPERATE}#4",
    "watch": f"{OPERATE}#5",
    "dump": f"{BACKUP}#1",
    "reset": f"{BACKUP}#2",
    "restore": f"{BACKUP}#3",
}
#: The alias's block of commands.
ALIAS = "Without a project: `scrapy-redis-bloom`#1"

#: Every README block, by id, and how it is checked. A new block needs an entry here.
BLOCKS: dict[str, Check] = {
    "Try it#1": Check(
        "bash", "python3 -m venv .venv && .venv/bin/pip install", "test_try_it_command",
        "not run (pip): the extra, the venv and example_project/run.py (--help) exist;"
        " the same command as example_project/README.md's",
    ),
    "Try it#2": Check(
        "text", "this crawl (500 URLs)", "test_example_output_table",
        "output: laid out again by example_project/run.py's table()/size(), labels from"
        " its constants, figures consistent with each other and with the demo's sizing",
    ),
    "Install#1": Check(
        "bash", "pip install scrapy-redis-bloom", "test_install_command",
        "not run (pip): installs this project by its name",
    ),
    "Run the tests#1": Check(
        "bash", "python3 -m venv .venv && . .venv/bin/activate", "test_install_and_test_commands",
        "not run (pip): the groups exist; install and test lines are .ci/run's",
    ),
    "Activate#1": Check(
        "python", "ADDONS =", "test_activate_capacity_and_error_rate",
        "exec + BloomConfig/ConnectionConfig; the add-on sets our DUPEFILTER_CLASS;"
        " geometry = the Sizing table's row; a crawl under scrapy-redis's Scheduler and"
        " under Scrapy's (capacity scaled down)",
    ),
    "Activate the filter#1": Check(
        "python", "ADDONS =", "test_activate_pages_agree",
        "the same block as the README's Activate#1 (which is run)",
    ),
    "Activate the filter#2": Check(
        "python", "DUPEFILTER_CLASS =", "test_activate_without_the_addon",
        "exec; the class the add-on sets; a crawl with it and Activate#1's sizing",
    ),
    "Activate the filter#3": Check(
        "python", "BLOOMFILTER_BIT =", "test_activate_bit_and_hash_number",
        "exec + BloomConfig/ConnectionConfig (2**30 bits, k=6); refused beside"
        " Activate#1's ERROR_RATE; a crawl with it as written (130 MiB)",
    ),
    "Settings: what carries over#1": Check(
        "python", 'SCHEDULER = "scrapy_redis_bloomfilter.', "test_from_bloomfilter",
        "exec; scrapy-redis-bloomfilter's classes load, and its filter (bits scaled down) is"
        " written to a real Redis under its default key",
    ),
    "Settings: what carries over#2": Check(
        "python", "ADDONS =", "test_from_bloomfilter",
        "exec + BloomConfig; the add-on sets scrapy-redis's Scheduler and our dupefilter, and"
        " refuses the old DUPEFILTER_CLASS left in (the old SCHEDULER runs ours);"
        " BIT/HASH_NUMBER carry over; a crawl beside the old bitmap, and scrapy bloom reset,"
        " leave it untouched; the page's figures computed",
    ),
    "One round trip per page#1": Check(
        "python", "SPIDER_MIDDLEWARES =", "test_batching_block",
        "exec; the middleware loads, has the lowest order of Scrapy's spider middlewares"
        " and batches (not disabled) beside Activate#1; a response's links in one trip",
    ),
    "Use the server's own Bloom filters (BF.*)#1": Check(
        "python", "BLOOMFILTER_BACKEND =", "test_backend_block",
        "exec + BloomConfig; 'auto' makes a bitmap filter on plain Redis and a native one"
        " (recorded) on a server with RedisBloom; the other two values are accepted",
    ),
    "Watch a crawl: stats, the log line, Spidermon#1": Check(
        "text", "Bloom filter '", "test_progress_log_line",
        "output: same shape as a line FilterStats logs on a real filter; figures"
        " consistent with Activate#1's sizing",
    ),
    "With re-crawl windows#1": Check(
        "text", "Bloom filter '", "test_progress_log_line_with_windows",
        "output: same shape as a line FilterStats logs on a real filter with BLOOMFILTER_TTL",
    ),
    "Monitoring with Spidermon#1": Check(
        "python", "SPIDERMON_ENABLED = True", "test_spidermon_block",
        "exec + BloomConfig (the threshold); a crawl under scrapy-redis's Scheduler with these"
        " settings runs the suite, and every monitor of it passes",
    ),
    "Sentinel#1": Check(
        "python", "REDIS_PARAMS = {", "test_sentinel_blocks",
        "exec; the sentinels replaced by three real ones (quorum 2): scrapy-redis's own"
        " client and the filter of a crawl both reach the primary they name",
    ),
    "Sentinel#2": Check(
        "python", "BLOOMFILTER_REDIS_SENTINELS =", "test_sentinel_blocks",
        "exec + ConnectionConfig; with the same real sentinels, a crawl's filter lives on"
        " their primary while its queue's REDIS_URL is another server",
    ),
    "After a crawl#1": Check(
        "text", "'bloomfilter/added':", "test_stats_sample",
        "output: every stat is one the filter or Scrapy gives, with a value of its type;"
        " test_tutorial.py finds each in a real crawl's stats",
    ),
    **{
        block_id: Check(
            "console", f"$ scrapy bloom {command}", "test_scrapy_bloom_sessions",
            "run in order in a project (subprocess scrapy, settings as the prose says) after"
            " a crawl of 3,000 URLs and a scrapy-redis SET; the output printed, numbers, ids"
            " and bars aside, is the README's line for line",
        )
        for command, block_id in OPERATIONS_SESSIONS.items()
    },
    **{
        block_id: Check(lang, starts, "test_migrate_from_set_blocks", how)
        for block_id, lang, starts, how in (
            ("Move from scrapy-redis's SET#1", "python", "SCHEDULER =",
             "settings.py of the first crawl, on scrapy-redis's SET"),
            ("Step 2: the filter's settings#1", "python", "SCHEDULER =",
             "settings.py from then on"),
            ("Step 3: copy the SET into the filter#1", "console", "$ scrapy bloom migrate",
             "run in the project; the output is the page's, line for line"),
            ("Step 4: crawl on#1", "bash", "scrapy crawl myspider",
             "run: fetches no page the SET had and every new one"),
            ("Step 5: delete the SET#1", "bash", "redis-cli DEL",
             "run with redis-py; a crawl on the filter alone after it"),
        )
    },
    "Choose and change capacity and error rate#1": Check(
        "python", "BLOOMFILTER_CAPACITY =", "test_choose_capacity_blocks",
        "exec + BloomConfig: the sizing the page's scrapy bloom size session asks for",
    ),
    "The error rate: how many pages you may lose#1": Check(
        "console", "$ scrapy bloom size", "test_choose_capacity_blocks",
        "run (subprocess scrapy, no project): the output is the page's, character for character",
    ),
    ALIAS: Check(
        "bash", "scrapy-redis-bloom info", "test_operations_commands",
        "every line run in order (one server, a list of two, a 3-master cluster) after"
        " a crawl and a scrapy-redis SET; the migrated filter then answers a crawl",
    ),
    "TLS#1": Check(
        "python", "BLOOMFILTER_REDIS_URL =", "test_tls_blocks",
        "exec + BloomConfig/ConnectionConfig; a crawl against a mutual-TLS server",
    ),
    "TLS#2": Check(
        "python", "REDIS_URL =", "test_tls_blocks",
        "exec + BloomConfig/ConnectionConfig; a crawl against a mutual-TLS server",
    ),
    "TLS#3": Check(
        "bash", "scrapy-redis-bloom info --redis-url rediss://", "test_tls_blocks",
        "run against the mutual-TLS server, on the filter TLS#1's crawl made",
    ),
    "Least privilege#1": Check(
        "", "ACL SETUSER crawler", "test_acl_setuser_line",
        "run on a real server; a crawl and the bulk API as that user; +scan +dbsize"
        " then let the CLI's info and reset run as that user",
    ),
    "The benchmark: method and results#1": Check(
        "bash", "pip install -e . --group bench", "test_benchmark_command",
        "not run (pip; 4 minutes): the group exists, bench/run.py --help works",
    ),
    "Development#1": Check(
        "bash", "python3 -m venv .venv && . .venv/bin/activate", "test_install_and_test_commands",
        "the same as the README's Run the tests#1",
    ),
    "Development#2": Check(
        "bash", "pip install -e . --group docs", "test_docs_build_command",
        "not run (pip): the group and docs/conf.py exist; the build line is .ci/run's",
    ),
    "The documentation#1": Check(
        "bash", "pip install -e . --group docs", "test_docs_build_command",
        "the same as the development page's Development#2",
    ),
}  # fmt: skip

#: The how-to page whose table test_activate_capacity_and_error_rate checks Activate#1 by.
SIZING_PAGE = "docs/howto/size-a-filter.md"

#: The crawl's spider: the README's commands name the filter ``myspider:bloomfilter``.
SPIDER = "myspider"
KEY = f"{SPIDER}:bloomfilter"
#: A capacity that allocates kilobytes, for blocks that size the filter in gigabytes.
SMALL_CAPACITY = 10_000


class MySpider(Spider):
    name = SPIDER


# -- the README's blocks -------------------------------------------------------------------


@pytest.fixture(scope="module")
def blocks() -> dict[str, Block]:
    found = all_blocks()
    by_id = {b.id: b for b in found}
    twice = sorted({b.id for b in found if by_id[b.id] is not b})
    assert not twice, f"blocks named twice (give their sections other headings): {twice}"
    return by_id


def block(blocks: dict[str, Block], block_id: str) -> Block:
    """Return a block named in :data:`BLOCKS`, checked to be the one its entry means.

    Its fence's language is checked apart, by :func:`test_block_is_labelled`, so that
    a wrong label does not hide what the block's own test finds.
    """
    assert block_id in blocks, f"no page has the block {block_id!r} any more; update BLOCKS"
    found = blocks[block_id]
    check = BLOCKS[block_id]
    first = found.text.strip().splitlines()[0].strip() if found.text.strip() else ""
    assert first.startswith(check.starts), (
        f"{found.where()} starts {first[:60]!r}, not {check.starts!r}: a block was added or"
        " moved; update BLOCKS"
    )
    return found


def test_every_readme_block_has_a_check(blocks: dict[str, Block]) -> None:
    unknown = [
        f"{b.where()}, starting {b.text.strip().splitlines()[0][:60]!r}"
        for b in blocks.values()
        if b.id not in BLOCKS
    ]
    assert not unknown, "blocks no test checks; add them to BLOCKS:\n" + "\n".join(unknown)
    gone = sorted(set(BLOCKS) - set(blocks))
    assert not gone, f"BLOCKS names blocks no page has any more: {gone}"
    tests = {name for name, value in globals().items() if name.startswith("test_")}
    missing = {c.test for c in BLOCKS.values()} - tests
    assert not missing, f"BLOCKS names tests that do not exist: {sorted(missing)}"


@pytest.mark.parametrize("block_id", sorted(BLOCKS))
def test_block_is_labelled(blocks: dict[str, Block], block_id: str) -> None:
    """The block is where its entry says, fenced with its language; output as ``text``."""
    found = block(blocks, block_id)
    check = BLOCKS[block_id]
    assert found.lang == check.lang, (
        f"{found.where()} is fenced as ```{found.lang}, not ```{check.lang}"
        + (": it is output, not a command to run" if check.lang == "text" else "")
    )


# -- a crawl, as the README's settings are used --------------------------------------------


def crawl(settings: dict[str, Any], url: str) -> dict[str, Any]:
    """Use the dupefilter as Scrapy's scheduler does, then as a second worker would.

    The first worker finds ``url`` new, then seen, and closes; a second one, built the
    same way, finds it seen (its near-cache is empty, so Redis answered). Returns the
    first worker's stats.
    """
    settings = {"DUPEFILTER_CLASS": "scrapy_redis_bloom.dupefilter.RFPDupeFilter", **settings}
    dupefilter_class = load_object(settings["DUPEFILTER_CLASS"])
    assert dupefilter_class is RFPDupeFilter
    crawler = get_crawler(MySpider, settings)
    first = dupefilter_class.from_crawler(crawler)
    try:
        assert first.key == KEY
        assert first.request_seen(Request(url)) is False
        assert first.request_seen(Request(url)) is True
    finally:
        first.close("finished")
    second = dupefilter_class.from_crawler(get_crawler(MySpider, settings))
    try:
        assert second.request_seen(Request(url)) is True
    finally:
        second.close("finished")
    assert crawler.stats is not None
    stats: dict[str, Any] = crawler.stats.get_stats()
    assert stats["bloomfilter/added"] == 1
    return stats


def scrapy_redis_crawl(settings: dict[str, Any], url: str) -> None:
    """Use the dupefilter under scrapy-redis's Scheduler, which builds it by ``from_spider``."""
    crawler = get_crawler(MySpider, {"SCHEDULER": "scrapy_redis.scheduler.Scheduler", **settings})
    spider = MySpider.from_crawler(crawler)
    scheduler = ScrapyRedisScheduler.from_crawler(crawler)
    scheduler.open(spider)
    df = scheduler.df
    try:
        assert isinstance(df, RFPDupeFilter)
        assert scheduler.enqueue_request(Request(url)) is True
        assert scheduler.enqueue_request(Request(url)) is False
        assert crawler.stats is not None
        assert crawler.stats.get_value("bloomfilter/filtered") == 1
        scheduler.close("finished")  # SCHEDULER_PERSIST is False: the filter is cleared
    finally:
        df.close("finished")


def validate(settings: dict[str, Any]) -> tuple[BloomConfig, ConnectionConfig]:
    return BloomConfig.from_settings(settings), ConnectionConfig.from_settings(settings)


@dataclass(frozen=True, slots=True)
class SizingRow:
    capacity: int
    error_rate: float
    k: int
    shards: int
    memory: str


def sizing_rows(markdown: str) -> list[SizingRow]:
    """Return the how-to page's Sizing table: its first (the layouts' tables follow)."""
    first = markdown[markdown.index("\n|") :].split("\n\n", 1)[0]
    rows = []
    for line in first.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 7 and cells[0][:1].isdigit():
            rows.append(
                SizingRow(
                    capacity=int(cells[0].replace(",", "")),
                    error_rate=float(cells[1]),
                    k=int(cells[2]),
                    shards=int(cells[3].replace(",", "")),
                    memory=cells[4],
                )
            )
    return rows


def test_activate_capacity_and_error_rate(
    blocks: dict[str, Block], redis_client: redis.Redis, redis_url: str
) -> None:
    settings = exec_settings(block(blocks, "Activate#1"))
    config, connection = validate(settings)
    assert connection == ConnectionConfig()  # scrapy-redis's own connection
    assert load_object(next(iter(settings["ADDONS"]))) is Addon
    applied = Settings()
    applied.setdict(settings, priority="project")
    Addon().update_settings(applied)
    assert load_object(applied["DUPEFILTER_CLASS"]) is RFPDupeFilter
    capacity, rate = settings["BLOOMFILTER_CAPACITY"], settings["BLOOMFILTER_ERROR_RATE"]
    assert config.capacity == capacity
    assert config.expected_error_rate <= rate
    # The geometry it gets is the Sizing table's row for it.
    table = sizing_rows(page_text(SIZING_PAGE))
    rows = [r for r in table if (r.capacity, r.error_rate) == (capacity, rate)]
    assert rows, f"the Sizing table has no row for capacity {capacity:,} at {rate}"
    assert (config.spec.hash_count, config.spec.shards) == (rows[0].k, rows[0].shards)
    assert format_bytes(config.spec.total_bytes) == rows[0].memory
    # As written it allocates 2.2 GiB at the first open: scaled down for the crawl only.
    small = {**settings, "BLOOMFILTER_CAPACITY": SMALL_CAPACITY, "REDIS_URL": redis_url}
    scrapy_redis_crawl(small, "https://example.com/activate-1")
    assert not redis_client.exists(f"{KEY}:meta")  # cleared on close (no SCHEDULER_PERSIST)
    stats = crawl(small, "https://example.com/activate-1")
    assert stats["bloomfilter/hash_functions"] == validate(small)[0].spec.hash_count
    assert redis_client.exists(f"{KEY}:meta")  # Scrapy's scheduler: the filter outlives it


def test_activate_without_the_addon(
    blocks: dict[str, Block], redis_client: redis.Redis, redis_url: str
) -> None:
    settings = exec_settings(block(blocks, "Activate the filter#2"))
    assert settings == {"DUPEFILTER_CLASS": DUPEFILTER}  # what the add-on sets
    sizing = {k: v for k, v in exec_settings(block(blocks, "Activate#1")).items() if k != "ADDONS"}
    small = {**sizing, **settings, "BLOOMFILTER_CAPACITY": SMALL_CAPACITY, "REDIS_URL": redis_url}
    stats = crawl(small, "https://example.com/activate-2")
    assert stats["bloomfilter/added"] == 1


def test_activate_pages_agree(blocks: dict[str, Block]) -> None:
    """The README's add-on block is the docs' one: the README's is run, the docs' compared."""
    assert block(blocks, "Activate the filter#1").text == block(blocks, "Activate#1").text


def test_from_bloomfilter(
    blocks: dict[str, Block],
    capsys: pytest.CaptureFixture[str],
    redis_client: redis.Redis,
    redis_url: str,
) -> None:
    """docs/howto/from-bloomfilter.md: the old settings, the new ones, what carries over."""
    from scrapy.utils.misc import load_object
    from scrapy_redis.scheduler import Scheduler
    from scrapy_redis_bloomfilter import defaults as old_defaults
    from scrapy_redis_bloomfilter.bloomfilter import BloomFilter

    from scrapy_redis_bloom.core.sizing import false_positive_rate

    before_block = block(blocks, "Settings: what carries over#1")
    after_block = block(blocks, "Settings: what carries over#2")
    hosts = Hosts(after_block, {"redis://localhost:6379": redis_url})
    before = exec_settings(before_block)
    after = hosts.settings(exec_settings(after_block))
    for name in ("SCHEDULER", "DUPEFILTER_CLASS"):
        assert load_object(before[name]).__module__.startswith("scrapy_redis_bloomfilter.")
    # The old filter, as its dupefilter writes it (2**20 bits here, not 2**30: 128 MiB).
    old_key = old_defaults.SCHEDULER_DUPEFILTER_KEY % {"spider": SPIDER}
    assert old_key == KEY  # the same name as this package's default BLOOMFILTER_KEY
    old = BloomFilter(redis_client, old_key, 20, before["BLOOMFILTER_HASH_NUMBER"])
    old.insert("f" * 40)
    old_bits = redis_client.get(old_key)
    # The new settings: the add-on sets scrapy-redis's Scheduler (its subclass that keeps the
    # queue while other workers keep the filter) and the Bloom dupefilter.
    validate(after)
    applied = Settings()
    applied.setdict(after, priority="project")
    Addon().update_settings(applied)
    assert load_object(applied["SCHEDULER"]) is load_object(SCHEDULER)
    assert issubclass(load_object(SCHEDULER), Scheduler)
    assert load_object(applied["DUPEFILTER_CLASS"]) is RFPDupeFilter
    # "Remove the DUPEFILTER_CLASS line": left in, the add-on refuses it.
    left = Settings()
    left.setdict({**after, "DUPEFILTER_CLASS": before["DUPEFILTER_CLASS"]}, priority="project")
    with pytest.raises(ValueError, match="Remove that DUPEFILTER_CLASS line"):
        Addon().update_settings(left)
    # The SCHEDULER line left in is accepted, and the old scheduler runs our filter.
    left = Settings()
    left.setdict({**after, "SCHEDULER": before["SCHEDULER"]}, priority="project")
    Addon().update_settings(left)
    assert load_object(left["SCHEDULER"]) is load_object(before["SCHEDULER"])
    small = {**after, "BLOOMFILTER_CAPACITY": SMALL_CAPACITY, "SCHEDULER_PERSIST": True}
    crawler = get_crawler(MySpider, {**small, "SCHEDULER": before["SCHEDULER"]})
    scheduler = load_object(before["SCHEDULER"]).from_crawler(crawler)
    scheduler.open(MySpider.from_crawler(crawler))
    try:
        assert isinstance(scheduler.df, RFPDupeFilter)
    finally:
        scheduler.close("finished")
        scheduler.df.close("finished")
    sizing = {"BLOOMFILTER_BIT", "BLOOMFILTER_HASH_NUMBER"}
    # BIT and HASH_NUMBER carry over, with the same meaning, instead of capacity and rate.
    kept = {
        k: v
        for k, v in after.items()
        if k not in ("BLOOMFILTER_CAPACITY", "BLOOMFILTER_ERROR_RATE")
    }
    carried = BloomConfig.from_settings({**kept, **{k: before[k] for k in sizing}})
    assert 2**30 <= carried.spec.bits <= 1.02 * 2**30
    assert carried.spec.hash_count == 6
    # The page's figures: the old defaults' rate at 126 million URLs, classic and blocked,
    # and 100 million at 1e-4.
    text = page_text("docs/howto/from-bloomfilter.md").replace("\n", " ")
    rates = []
    for blocked in (False, True):
        spec = BloomConfig.from_settings(
            {**{k: before[k] for k in sizing}, "BLOOMFILTER_BLOCKED": blocked}
        ).spec
        rates.append(false_positive_rate(spec.bits, spec.hash_count, 126e6, spec.block_bits))
    said = f"a false-positive rate of {100 * rates[0]:.1f}% ({100 * rates[1]:.1f}% in the"
    assert said in text, said
    config = BloomConfig.from_settings(after)
    rate = f"{after['BLOOMFILTER_ERROR_RATE']:.0e}".replace("e-0", "e-")  # 1e-4
    assert f"{config.capacity // 1_000_000} million at {rate}" in text
    assert f"take {format_bytes(config.spec.total_bytes)}" in text
    # Side by side: a crawl on the new filter, then its reset, leave the old bitmap as it was.
    small = {**after, "BLOOMFILTER_CAPACITY": SMALL_CAPACITY}
    crawl(small, "https://example.com/from-bloomfilter")
    code, _, err = run(capsys, "reset", "--redis-url", redis_url, "--key", KEY, "--yes")
    assert (code, err) == (0, ""), err
    assert not redis_client.exists(f"{KEY}:meta")
    assert redis_client.get(old_key) == old_bits
    assert old.exists("f" * 40)


def test_sentinel_blocks(
    blocks: dict[str, Block], redis_client: redis.Redis, redis_url: str
) -> None:
    from redis_sentinel import SERVICE, SentinelGroup
    from scrapy_redis.connection import get_redis_from_settings

    from scrapy_redis_bloom.transport.sentinel import SentinelRedis

    sizing = {**exec_settings(block(blocks, "Activate#1")), "BLOOMFILTER_CAPACITY": SMALL_CAPACITY}
    shared = exec_settings(block(blocks, "Sentinel#1"))
    params = shared["REDIS_PARAMS"]
    own = exec_settings(block(blocks, "Sentinel#2"))
    connection = ConnectionConfig.from_settings(own)
    assert len(connection.sentinels) == len(params["sentinels"]) == 3
    assert connection.service == params["service_name"] == SERVICE
    with SentinelGroup() as group:
        primary = group.primary()
        # Sentinel#1: scrapy-redis's own client and the filter reach the named primary.
        shared["REDIS_PARAMS"] = {**params, "sentinels": group.addresses}
        server = get_redis_from_settings(Settings(shared))
        try:
            assert isinstance(server, SentinelRedis)
            assert server.connection_pool.get_master_address()[1] == primary.port
        finally:
            server.close()
        crawl({**sizing, **shared}, "https://example.com/sentinel-1")
        assert primary.client().exists(f"{KEY}:meta")
        primary.client().flushall()
        # Sentinel#2: the filter on the sentinels' primary, the queue's REDIS_URL elsewhere.
        own["BLOOMFILTER_REDIS_SENTINELS"] = group.addresses
        crawl({**sizing, **own, "REDIS_URL": redis_url}, "https://example.com/sentinel-2")
        assert primary.client().exists(f"{KEY}:meta")
        assert not redis_client.exists(f"{KEY}:meta")


def test_activate_bit_and_hash_number(
    blocks: dict[str, Block], redis_client: redis.Redis, redis_url: str
) -> None:
    by_rate = exec_settings(block(blocks, "Activate#1"))
    settings = exec_settings(block(blocks, "Activate the filter#3"))
    config, connection = validate(settings)
    assert connection == ConnectionConfig()
    bits = 2 ** settings["BLOOMFILTER_BIT"]
    assert bits <= config.spec.bits <= 1.02 * bits  # rounded up to whole allocator blocks
    assert config.spec.hash_count == settings["BLOOMFILTER_HASH_NUMBER"]
    # "instead of the two above": with BLOOMFILTER_ERROR_RATE it is refused at startup...
    with pytest.raises(ValueError, match="BLOOMFILTER_ERROR_RATE and BLOOMFILTER_BIT"):
        BloomConfig.from_settings({**by_rate, **settings})
    # ... and a BLOOMFILTER_CAPACITY beside it only states the load.
    stated = BloomConfig.from_settings({**settings, "BLOOMFILTER_CAPACITY": 12_345})
    assert (stated.spec, stated.capacity) == (config.spec, 12_345)
    # A crawl with it as written: Activate#1 with these two lines instead of its sizing.
    sizing = {"BLOOMFILTER_CAPACITY", "BLOOMFILTER_ERROR_RATE"}
    written = {name: value for name, value in by_rate.items() if name not in sizing}
    stats = crawl({**written, **settings, "REDIS_URL": redis_url}, "https://example.com/a-2")
    assert stats["bloomfilter/bits"] == config.spec.bits
    assert stats["bloomfilter/hash_functions"] == settings["BLOOMFILTER_HASH_NUMBER"]


def test_batching_block(
    blocks: dict[str, Block], redis_client: redis.Redis, redis_url: str
) -> None:
    import asyncio

    from scrapy.http import HtmlResponse

    from scrapy_redis_bloom.scrapy.batching import BatchingMiddleware, later_middlewares

    settings = {
        **exec_settings(block(blocks, "Activate#1")),
        **exec_settings(block(blocks, "One round trip per page#1")),
        "BLOOMFILTER_CAPACITY": SMALL_CAPACITY,
        "REDIS_URL": redis_url,
    }
    (path, order), *_ = settings["SPIDER_MIDDLEWARES"].items()
    assert load_object(path) is BatchingMiddleware
    crawler = get_crawler(MySpider, settings)
    assert later_middlewares(crawler.settings, BatchingMiddleware) == []
    base = crawler.settings.getdict("SPIDER_MIDDLEWARES_BASE")
    assert order < min(v for v in base.values() if v is not None)
    middleware = BatchingMiddleware.from_crawler(crawler)
    assert middleware.disabled is None
    dupefilter = RFPDupeFilter.from_crawler(crawler)  # found by the middleware, by crawler
    try:
        links = [Request(f"https://example.com/readme/{i}") for i in range(20)]
        response = HtmlResponse("https://example.com/readme", body=b"")

        async def output() -> Any:
            for link in links:
                yield link

        async def run() -> list[Any]:
            return [r async for r in middleware.process_spider_output(response, output())]

        # On a fresh server the first check loads the script (small shards use it).
        assert dupefilter.request_seen(Request("https://example.com/readme/first")) is False
        before = dupefilter.bloom.round_trips
        assert asyncio.run(run()) == links
        assert dupefilter.bloom.round_trips - before == 1  # the 20 links in one exchange
        assert [dupefilter.request_seen(link) for link in links] == [False] * 20
        assert dupefilter.bloom.round_trips - before == 1  # answered ahead
    finally:
        dupefilter.close("finished")


def test_backend_block(blocks: dict[str, Block], redis_client: redis.Redis) -> None:
    from redis_modules import bloom_server

    from scrapy_redis_bloom.engine.backend import make_filter

    settings = exec_settings(block(blocks, "Use the server's own Bloom filters (BF.*)#1"))
    assert settings == {"BLOOMFILTER_BACKEND": "auto"}
    for value in ("auto", "native", "bitmap"):
        assert BloomConfig.from_settings({"BLOOMFILTER_BACKEND": value}).backend == value
    config = BloomConfig.from_settings({**settings, "BLOOMFILTER_CAPACITY": SMALL_CAPACITY})
    plain = make_filter(redis_client, KEY, config)
    assert plain.open().backend == "bitmap"
    found = bloom_server()
    if found is None:
        return  # no RedisBloom here: the native half is tests/test_native.py's, skipped too
    binary, module = found
    with RedisServer("--loadmodule", module, binary=binary) as server:
        client = server.client()
        bloom = make_filter(client, KEY, config)
        assert bloom.open().backend == "native"
        assert bloom.check_and_add("f" * 40) is False
        assert bloom.check_and_add("f" * 40) is True
        bloom.close()
        client.close()


# -- output samples -------------------------------------------------------------------------

#: A number as the code prints them: 41,872 / 0.0 / 1.3e-62.
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")


def shape(line: str) -> str:
    """Reduce a log line to its shape: quoted names and numbers replaced."""
    return _NUMBER.sub("N", re.sub(r"'[^']*'", "'KEY'", line))


def numbers(line: str) -> list[float]:
    return [float(n.replace(",", "")) for n in _NUMBER.findall(re.sub(r"'[^']*'", "", line))]


def _one_log_line(settings: dict[str, Any], caplog: pytest.LogCaptureFixture) -> str:
    """Return the periodic line FilterStats logs for a crawl's filter that saw 3 requests."""
    df = RFPDupeFilter.from_crawler(get_crawler(MySpider, settings))
    try:
        for url in ("https://example.com/1", "https://example.com/1", "https://example.com/2"):
            df.request_seen(Request(url))
        df.bloom.sync_counters()
        with caplog.at_level(logging.INFO, logger="scrapy_redis_bloom.scrapy.stats"):
            FilterStats(df.bloom, None, 60).log()
    finally:
        df.close("finished")
    logged = [r.getMessage() for r in caplog.records if r.name == "scrapy_redis_bloom.scrapy.stats"]
    assert len(logged) == 1
    return logged[0]


def test_progress_log_line(
    blocks: dict[str, Block], redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    sample = block(blocks, "Watch a crawl: stats, the log line, Spidermon#1").text.strip()
    assert "\n" not in sample
    settings = {"REDIS_URL": redis_url, "BLOOMFILTER_CAPACITY": SMALL_CAPACITY}
    logged = _one_log_line(settings, caplog)
    assert shape(sample) == shape(logged), f"README:\n{sample}\nlogged:\n{logged}"
    # The figures are those of Activate#1's filter with that many items.
    items, share, capacity, fill, fpr, new, seen, cached = numbers(sample)
    activate = exec_settings(block(blocks, "Activate#1"))
    assert capacity == activate["BLOOMFILTER_CAPACITY"]
    spec = BloomConfig.from_settings(activate).spec
    state = estimate_from_items(BloomConfig.from_settings(activate).growth, int(items))
    expected = (f"{100 * items / capacity:.1f}", f"{100 * state.fill_ratio:.2f}")
    assert (f"{share:.1f}", f"{fill:.2f}") == expected
    assert f"{fpr:.3g}" == f"{state.estimated_fpr:.3g}", (
        f"README's rate {fpr:.3g} is not the {state.estimated_fpr:.3g} that {int(items):,}"
        f" items give in Activate#1's filter ({spec.hash_count} hashes, {spec.bits:,} bits)"
    )
    assert new <= items
    assert cached <= seen


def test_progress_log_line_with_windows(
    blocks: dict[str, Block], redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    sample = block(blocks, "With re-crawl windows#1").text.strip()
    assert "\n" not in sample
    settings = {
        "REDIS_URL": redis_url,
        "BLOOMFILTER_CAPACITY": 2000,
        "BLOOMFILTER_TTL": 3,
        "BLOOMFILTER_KEY": "news:bloomfilter",
    }
    logged = _one_log_line(settings, caplog)
    assert shape(sample) == shape(logged), f"docs:\n{sample}\nlogged:\n{logged}"
    items, capacity, ttl, added = numbers(sample)[:4]
    assert (capacity, ttl) == (2000, 3)  # the settings the page describes
    assert items <= added


@functools.cache
def load_example_run() -> ModuleType:
    """Import example_project/run.py (it puts example_project/ on sys.path to import demo)."""
    path = ROOT / "example_project" / "run.py"
    spec = importlib.util.spec_from_file_location("readme_example_run", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    saved = list(sys.path)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[spec.name]
        raise
    finally:
        sys.path[:] = saved
    return module


_SIZE = re.compile(r"^(?P<value>\d+(?:\.\d+)?) (?P<unit>B|KiB|MiB|GiB|TiB)$")
_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}


def parse_size(text: str) -> tuple[float, float]:
    """Return the bytes a size cell of run.py says, and its rounding (half a last digit)."""
    match = _SIZE.match(text)
    assert match, f"{text!r} is not a size as run.py prints it"
    unit = _UNITS[match["unit"]]
    decimals = len(match["value"].partition(".")[2])
    return float(match["value"]) * unit, 0.5 * 10**-decimals * unit


def test_example_output_table(blocks: dict[str, Block]) -> None:
    lines = block(blocks, "Try it#2").text.rstrip("\n").splitlines()
    demo = load_example_run()
    rows = [re.split(r" {2,}", line.strip()) for line in lines]
    rows[0] = ["", *rows[0]]
    assert demo.table(rows) == lines, "not laid out as example_project/run.py's table()"
    count = demo.PAGES
    billion = demo.BILLION
    assert rows[0] == ["", f"this crawl ({count:,} URLs)", "per URL", "1 billion URLs"]
    assert [r[0] for r in rows[1:]] == [
        "SET of 40-hex SHA1 fingerprints",
        f"Bloom filter, error rate {demo.ERROR_RATE:g}",
    ]
    for label, crawl_cell, per_url, per_billion in rows[1:]:
        assert per_url.endswith(" B"), label
        per = float(per_url[:-2])
        assert demo.size(per * billion) == per_billion, label
        assert re.fullmatch(r"\d+\.\d B" if label.startswith("SET") else r"\d+\.\d\d B", per_url)
        total, slack = parse_size(crawl_cell)
        assert demo.size(total) == crawl_cell, label
        if label.startswith("SET"):  # per URL: the SET's bytes over the crawl's URLs
            assert abs(total / count - per) <= slack / count + 0.05, label
    # The filter's row is the demo's filter: its size fixed by its settings.
    settings = {k: v for k, v in vars(demo.demo_settings).items() if k.isupper()}
    spec = BloomConfig.from_settings(settings).spec
    capacity = int(settings["BLOOMFILTER_CAPACITY"])
    assert demo.size(spec.total_bytes) == rows[2][1]
    assert abs(float(rows[2][2][:-2]) - spec.total_bytes / capacity) <= 0.01


# -- the operations CLI --------------------------------------------------------------------


def run_cli_block(
    capsys: pytest.CaptureFixture[str],
    found: Block,
    hosts: Hosts,
    expect: Callable[[list[str], str], None],
) -> list[list[str]]:
    """Run every command of a CLI block, in order, with the stand-ins; return their argv.

    Each must exit 0, print nothing on stderr, and print what ``expect`` checks.
    """
    ran = []
    for command in commands(found.text):
        argv = shlex.split(command)
        assert argv[0] == "scrapy-redis-bloom", f"{found.where()}: not a CLI command: {command}"
        args = hosts.argv(argv[1:])
        code, out, err = run(capsys, *args)
        assert (code, err) == (0, ""), f"{found.where()}: {command}\nexit {code}: {err}{out}"
        expect(args, out)
        ran.append(args)
    return ran


def option(args: list[str], name: str) -> list[str]:
    return [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == name]


def row(out: str, label: str) -> str:
    """Return the value of a row of ``info``'s table."""
    match = re.search(rf"^{re.escape(label)} +(.+)$", out, re.M)
    assert match, f"no {label!r} row in:\n{out}"
    return match.group(1).strip()


def test_operations_commands(
    blocks: dict[str, Block],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    redis_client: redis.Redis,
    redis_url: str,
    servers: list[RedisServer],
    clients: list[redis.Redis],
    redis_cluster_nodes: RedisClusterNodes,
    redis_cluster_url: str,
) -> None:
    found = block(blocks, ALIAS)
    monkeypatch.delenv("REDIS_URL", raising=False)
    r1, r2 = servers[0].url, servers[1].url
    hosts = Hosts(
        found,
        {
            "redis://localhost:6379": redis_url,
            "redis://r1:6379": r1,
            "redis://r2:6379": r2,
            "redis://node1:7000": redis_cluster_url,
        },
    )
    # The state the commands work on: the crawl's filter on each topology...
    small = {"BLOOMFILTER_CAPACITY": SMALL_CAPACITY}
    crawl({**small, "REDIS_URL": redis_url}, "https://example.com/ops")
    crawl({**small, "BLOOMFILTER_REDIS_URLS": [r1, r2]}, "https://example.com/ops")
    cluster = {"BLOOMFILTER_REDIS_URL": redis_cluster_url, "BLOOMFILTER_REDIS_CLUSTER": True}
    crawl({**small, **cluster}, "https://example.com/ops")
    # ... and the SET scrapy-redis's own dupefilter keeps, to migrate.
    urls = [f"https://example.com/page/{i}" for i in range(300)]
    old = ScrapyRedisDupeFilter(server=redis_client, key=f"{SPIDER}:dupefilter")
    assert [old.request_seen(Request(url)) for url in urls] == [False] * len(urls)
    assert redis_client.type(f"{SPIDER}:dupefilter") == b"set"

    def expect(args: list[str], out: str) -> None:
        key = option(args, "--key")[0]
        urls_given = option(args, "--redis-url")
        if args[0] == "info":
            assert row(out, "Bloom filter") == key
            assert row(out, "Added by all workers") == "1"
            if "--cluster" in args:
                masters = redis_cluster_nodes.masters()
                cluster_row = row(out, "Servers")
                assert cluster_row.startswith(f"Redis Cluster, {len(masters)} master(s)"), out
            elif len(urls_given) > 1:
                ports = [RedisUrl(u).address for u in urls_given]
                assert row(out, "Servers") == f"2: 0={ports[0]}, 1={ports[1]}"
            else:
                assert row(out, "Server") == RedisUrl(urls_given[0]).address
        elif args[0] == "reset":
            assert out.startswith(f"Deleted the Bloom filter {key!r}"), out
            assert redis_client.keys(f"*{key}*") == []
        elif args[0] == "migrate-set":
            set_key = option(args, "--set-key")[0]
            assert f"Created the Bloom filter {key!r}" in out, out
            assert (
                f"Migrated {len(urls):,} fingerprint(s) from the set {set_key!r} into the Bloom"
                f" filter {key!r}"
            ) in out, out
            assert f": {len(urls):,} new, 0 already present." in out, out
        else:
            raise AssertionError(f"{found.where()}: no expectation for {args[0]!r}; add one")

    ran = run_cli_block(capsys, found, hosts, expect)
    assert [args[0] for args in ran] == ["info", "reset", "info", "info", "migrate-set"]
    # The migrated filter, opened by a crawl sized as the command created it, knows
    # every URL scrapy-redis had seen, and only those.
    migrate = ran[-1]
    sized = {
        "REDIS_URL": redis_url,
        "BLOOMFILTER_CAPACITY": int(option(migrate, "--capacity")[0]),
        "BLOOMFILTER_ERROR_RATE": float(option(migrate, "--error-rate")[0]),
    }
    df = RFPDupeFilter.from_crawler(get_crawler(MySpider, sized))
    try:
        assert all(df.request_seen(Request(url)) for url in urls)
        assert df.request_seen(Request("https://example.com/never-crawled")) is False
    finally:
        df.close("finished")


@dataclass(frozen=True, slots=True)
class RedisUrl:
    """``host:port`` of a test server's URL, as the CLI names servers."""

    url: str

    @property
    def address(self) -> str:
        return self.url.split("://", 1)[1].split("/", 1)[0]


# -- TLS -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[TlsFiles, str]:
    """Return certificates for a TLS server and a redis-server built with TLS, or skip."""
    binary = find_tls_redis_server()
    if binary is None:
        pytest.skip("no redis-server built with TLS here (see tests/test_tls.py)")
    return make_tls_files(tmp_path_factory.mktemp("readme-tls")), binary


def tls_hosts(found: Block, server: TlsRedisServer, certs: TlsFiles) -> Hosts:
    return Hosts(
        found,
        {
            "rediss://bloom-host:6380/0": server.url,
            "rediss://redis-host:6380/0": server.url,
            "/etc/ssl/redis/ca.crt": str(certs.ca_cert),
            "/etc/ssl/redis/client.crt": str(certs.client_cert),
            "/etc/ssl/redis/client.key": str(certs.client_key),
        },
    )


def test_tls_blocks(
    blocks: dict[str, Block],
    capsys: pytest.CaptureFixture[str],
    tls_files: tuple[TlsFiles, str],
) -> None:
    certs, binary = tls_files
    own, shared, cli = (block(blocks, f"TLS#{i}") for i in (1, 2, 3))
    server = TlsRedisServer(certs, auth_clients=True, binary=binary)
    with server:
        # The filter's own Redis, over mutual TLS.
        settings = exec_settings(own)
        config, connection = validate(settings)
        assert connection.urls == (settings["BLOOMFILTER_REDIS_URL"],)
        assert dict(connection.params) == settings["BLOOMFILTER_REDIS_PARAMS"]
        assert config.key_for(SPIDER) == KEY
        used = tls_hosts(own, server, certs).settings(settings)
        crawl({**used, "BLOOMFILTER_CAPACITY": SMALL_CAPACITY}, "https://example.com/tls-1")
        assert server.admin().exists(f"{KEY}:meta")
        # The CLI on that filter, with the files as options.
        hosts = tls_hosts(cli, server, certs)

        def expect(args: list[str], out: str) -> None:
            assert args[0] == "info", f"{cli.where()}: no expectation for {args[0]!r}"
            assert row(out, "Bloom filter") == KEY
            assert row(out, "Server") == RedisUrl(server.url).address
            assert row(out, "Added by all workers") == "1"

        run_cli_block(capsys, cli, hosts, expect)
        # scrapy-redis's connection, over mutual TLS (the same filter: same sizing).
        settings = exec_settings(shared)
        config, connection = validate(settings)
        assert connection == ConnectionConfig()
        used = tls_hosts(shared, server, certs).settings(settings)
        crawl({**used, "BLOOMFILTER_CAPACITY": SMALL_CAPACITY}, "https://example.com/tls-2")
        assert int(server.admin().hget(f"{KEY}:count", "added") or 0) == 2


def test_tls_certificate_error_sample(
    blocks: dict[str, Block], tls_files: tuple[TlsFiles, str], tmp_path: Path
) -> None:
    """The TLS section's example of a certificate that does not verify (a wrong CA)."""
    certs, binary = tls_files
    sample = inline_sample(docs_text(), "Redis at bloom-host:6380 cannot be reached over TLS")
    wrong = make_tls_files(tmp_path / "wrong")
    own = block(blocks, "TLS#1")
    server = TlsRedisServer(certs, binary=binary)
    with server:
        settings = tls_hosts(own, server, certs).settings(exec_settings(own))
        settings["BLOOMFILTER_REDIS_PARAMS"]["ssl_ca_certs"] = str(wrong.ca_cert)
        with pytest.raises(CertificateError) as failed:
            RFPDupeFilter.from_crawler(get_crawler(MySpider, settings))
    message = str(failed.value).replace(RedisUrl(server.url).address, "bloom-host:6380")
    assert_matches_sample(message, sample)


def inline_sample(markdown: str, start: str) -> str:
    """Return the inline code span of the prose that starts with ``start``, unwrapped."""
    text = re.sub(r"\n\s*", " ", prose(markdown))
    match = re.search(rf"`({re.escape(start)}[^`]*)`", text)
    assert match, f"no page has a sample starting {start!r} any more"
    return match.group(1)


def assert_matches_sample(message: str, sample: str) -> None:
    """Each part of ``sample`` between its ``...`` elisions appears in ``message``, in order."""
    at = 0
    for part in (p.strip() for p in re.split(r"\.\.\.|…", sample)):
        found = message.find(part, at)
        assert found >= 0, f"README sample part {part!r} is not in the real message:\n{message}"
        at = found + len(part)


# -- least privilege -----------------------------------------------------------------------


def command(client: redis.Redis, *args: str) -> Any:
    """Send a raw Redis command (redis-py leaves execute_command untyped)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def test_acl_setuser_line(blocks: dict[str, Block], capsys: pytest.CaptureFixture[str]) -> None:
    found = block(blocks, "Least privilege#1")
    (line,) = commands(found.text)
    argv = shlex.split(line)
    assert argv[:2] == ["ACL", "SETUSER"]
    user, password = argv[2], next(a[1:] for a in argv if a.startswith(">"))
    with RedisServer() as server, contextlib.closing(server.client()) as admin:
        assert command(admin, *argv) == b"OK"
        url = f"redis://{user}:{password}@127.0.0.1:{server.port}/0"
        # A crawl as that user: open (the permission check), check-and-add, counters,
        # leases, and the last worker's BITCOUNT and MEMORY USAGE at close.
        stats = crawl({"REDIS_URL": url, "BLOOMFILTER_CAPACITY": SMALL_CAPACITY}, "https://a.b/")
        assert stats["bloomfilter/memory_bytes"] > 0
        # The bulk API as that user.
        config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": SMALL_CAPACITY})
        prints = [hashlib.sha1(str(i).encode()).hexdigest() for i in range(100)]
        with contextlib.closing(redis.Redis.from_url(url)) as client:
            bloom = RedisBloomFilter(client, KEY, config.spec, config.capacity)
            try:
                assert bloom.add_many(prints) == [False] * 100
                assert bloom.check_and_add(prints[0]) is True
            finally:
                bloom.close()
        # "The CLI needs the same, plus DBSIZE (every command), SCAN and INFO (info, reset)".
        assert command(admin, "ACL", "SETUSER", user, "+scan", "+dbsize") == b"OK"
        code, out, err = run(capsys, "info", "--redis-url", url, "--key", KEY)
        assert (code, err) == (0, ""), err
        assert row(out, "Added by all workers") == "101"
        code, out, err = run(capsys, "reset", "--redis-url", url, "--key", KEY, "--yes")
        assert (code, err) == (0, ""), err
        # The README's example of the error when the user lacks one command (TIME).
        sample = inline_sample(docs_text(), "Redis at redis-host:6379 refuses")
        assert command(admin, "ACL", "SETUSER", user, "-time") == b"OK"
        with contextlib.closing(redis.Redis.from_url(url)) as client:
            bloom = RedisBloomFilter(client, KEY, config.spec, config.capacity)
            try:
                with pytest.raises(AccessDeniedError) as refused:
                    bloom.open()
            finally:
                bloom.close()
        message = re.sub(
            rf"(localhost|127\.0\.0\.1):{server.port}\b", "redis-host:6379", str(refused.value)
        )
        assert_matches_sample(message, sample)


# -- install, test, example and benchmark commands (not run: no pip here) -------------------


def assert_shell_ok(found: Block) -> list[str]:
    """Check each command of a shell block against the repository; return them."""
    state = ShellState(venvs=set())
    lines = commands(found.text)
    problems = [p for line in lines for p in shell_problems(line, state)]
    assert not problems, f"{found.where()}:\n" + "\n".join(problems)
    return lines


def test_try_it_command(blocks: dict[str, Block]) -> None:
    found = block(blocks, "Try it#1")
    assert assert_shell_ok(found)[0].endswith("example_project/run.py")
    example = parse_blocks((ROOT / "example_project" / "README.md").read_text(encoding="utf-8"))
    same = [b for b in example if b.section == "Run it" and b.lang == "bash"]
    assert [b.text for b in same] == [found.text], "differs from example_project/README.md's"


def ci_command(after: str) -> str:
    """Return the line of .ci/run that follows the comment ``after``."""
    lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    at = next((i for i, line in enumerate(lines) if line.strip() == after), None)
    assert at is not None, f".ci/run has no comment {after!r} any more"
    return lines[at + 1].strip()


def test_install_command(blocks: dict[str, Block]) -> None:
    (line,) = assert_shell_ok(block(blocks, "Install#1"))
    assert line == f"pip install {pyproject()['project']['name']}"


def test_remove_scrapy_redis_dupefilter_line(blocks: dict[str, Block]) -> None:
    """The README says to remove scrapy-redis's DUPEFILTER_CLASS line: the add-on refuses it."""
    line = 'DUPEFILTER_CLASS = "scrapy_redis.dupefilter.RFPDupeFilter"'
    assert f"`{line}`" in re.sub(r"\s+", " ", prose(page_text("README.md")))
    settings = Settings()
    settings.setdict(
        {**exec_settings(block(blocks, "Activate#1")), "DUPEFILTER_CLASS": line.split('"')[1]},
        priority="project",
    )
    with pytest.raises(ValueError, match="Remove that DUPEFILTER_CLASS line"):
        Addon().update_settings(settings)


def test_install_and_test_commands(blocks: dict[str, Block]) -> None:
    found = block(blocks, "Run the tests#1")
    assert block(blocks, "Development#1").text == found.text
    venv, install, test = assert_shell_ok(found)
    assert install == ci_command("# The README's install command.")
    assert test == ci_command("# The README's test command.")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert 'python3 -m venv "$venv"' in ci
    assert '. "$venv/bin/activate"' in ci
    assert venv.startswith("python3 -m venv ")


def test_docs_build_command(blocks: dict[str, Block]) -> None:
    """The development page and docs/README.md give the docs' build command, .ci/run's."""
    found = block(blocks, "Development#2")
    install, build = assert_shell_ok(found)
    assert install == "pip install -e . --group docs"
    assert build == "sphinx-build -W --keep-going -b html docs docs/_build/html"
    assert ci_command("pip install --quiet --group docs") == build
    assert block(blocks, "The documentation#1").text == found.text


#: A line of Scrapy's stats dump: ``'name': value,``.
_STAT_LINE = re.compile(r"^'(?P<name>[a-z_/]+)': (?P<value>.+),$")
#: Stats of Scrapy's own that the sample shows beside the filter's.
SCRAPY_STATS = {"dupefilter/filtered": int, "response_received_count": int}


def stats_sample(found: Block) -> dict[str, Any]:
    """Parse a sample of Scrapy's stats dump into name -> value (Python literals)."""
    import ast

    parsed = {}
    for line in found.text.strip().splitlines():
        match = _STAT_LINE.match(line.strip())
        assert match, f"{found.where()}: not a line of Scrapy's stats dump: {line!r}"
        parsed[match["name"]] = ast.literal_eval(match["value"])
    return parsed


def test_stats_sample(blocks: dict[str, Block]) -> None:
    from scrapy_redis_bloom.scrapy.stats import PREFIX, STATS

    sample = stats_sample(block(blocks, "After a crawl#1"))
    for name, value in sample.items():
        if name in SCRAPY_STATS:
            assert isinstance(value, SCRAPY_STATS[name]), name
            continue
        assert name.startswith(PREFIX), name
        assert name.removeprefix(PREFIX) in STATS, f"{name} is not a stat the filter gives"
        assert isinstance(value, int | float), name
    assert sample["bloomfilter/filtered"] == sample["dupefilter/filtered"]
    assert sample["bloomfilter/total_added"] >= sample["bloomfilter/added"]
    # "In the run its README shows": a worker of example_project/README.md's sample...
    demo = load_example_run()
    example = parse_blocks((ROOT / "example_project" / "README.md").read_text(encoding="utf-8"))
    (run,) = [b.text for b in example if b.section == "What you will see"]
    worker = (
        f"{sample['response_received_count']:,}",
        f"{sample['bloomfilter/filtered']:,}",
        f"{sample['bloomfilter/added']:,}",
    )
    rows = [line.split()[2:5] for line in run.splitlines() if re.match(r"^ +\d +\d+ ", line)]
    assert list(worker) in rows, f"no worker of the example's run fetched, filtered, added {worker}"
    assert f"{sample['bloomfilter/total_filtered']:,} seen" in run
    fill = re.search(r"bits set +[\d,]+ \(fill ratio ([\d.]+) %\)", run)
    assert fill, run
    assert f"{100 * sample['bloomfilter/fill_ratio']:.4f}" == fill[1]
    # ... whose filter is the demo's: its capacity, and the memory its geometry takes.
    settings = {k: v for k, v in vars(demo.demo_settings).items() if k.isupper()}
    config = BloomConfig.from_settings(settings)
    assert sample["bloomfilter/capacity"] == config.capacity
    memory = sample["bloomfilter/memory_bytes"]
    assert config.spec.total_bytes <= memory <= 1.01 * config.spec.total_bytes, (
        f"{memory:,} bytes: not the {config.spec.total_bytes:,} of the demo's filter"
    )


def test_benchmark_command(blocks: dict[str, Block]) -> None:
    found = block(blocks, "The benchmark: method and results#1")
    (line,) = assert_shell_ok(found)
    assert line.endswith("python bench/run.py")


#: Inline code that is a command a reader would type: checked like the blocks' commands.
COMMAND_WORDS = ("python", "python3", "pip", "pytest", "scrapy-redis-bloom", "scrapy")


def test_inline_commands() -> None:
    """Commands quoted in the prose name scripts, options and extras that exist.

    For instance ``python bench/run.py --quick``, ``scrapy-redis-bloom reset`` and
    ``pip install "scrapy-redis-bloom[hiredis]"``.
    """
    problems = [
        f"{path.relative_to(ROOT)} line {number}: `{code}`: {problem}"
        for path in pages()
        for number, code in inline_code(path.read_text(encoding="utf-8"))
        if code.split()[0] in COMMAND_WORDS
        for problem in shell_problems(code)
    ]
    assert not problems, "\n".join(problems)


# -- the scrapy bloom sessions -----------------------------------------------------------


_NORMALISE = (
    (re.compile(r"\b[0-9a-f]{32,64}\b"), "<hex>"),
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"), "<date>"),
    (re.compile(r"[█▉▊▋▌▍▎▏]+"), "<bar>"),
    (re.compile(r"\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?"), "<n>"),
    (re.compile(r"[ \t]+"), " "),
)


def normalised(text: str) -> list[str]:
    """Return the lines of an output with what changes from run to run replaced."""
    lines = []
    for line in text.strip("\n").splitlines():
        for pattern, replacement in _NORMALISE:
            line = pattern.sub(replacement, line)
        lines.append(line.strip())
    return lines


def session(found: Block) -> tuple[str, str]:
    """Split a console block into its command (after ``$``) and the output shown."""
    first, _, output = found.text.partition("\n")
    assert first.startswith("$ "), f"{found.where()}: a session starts with '$ '"
    return first[2:], output


@NOT_INSTALLED
def test_scrapy_bloom_sessions(
    blocks: dict[str, Block], redis_client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    """Run the Operations sessions in order; each prints what the README shows.

    With ``SRB_README_CAPTURE=FILE`` the outputs are also written to FILE (JSON), to
    paste into the README when the commands' output changes.
    """
    sessions = [session(block(blocks, block_id)) for block_id in OPERATIONS_SESSIONS.values()]
    project = make_project(
        tmp_path / "project",
        f"REDIS_URL = {redis_url!r}\n"
        "BLOOMFILTER_CAPACITY = 1_000_000\nBLOOMFILTER_ERROR_RATE = 0.0001\n"
        "BLOOMFILTER_SHARD_BIT = 20\n",
    )
    settings = {
        "REDIS_URL": redis_url,
        "BLOOMFILTER_CAPACITY": 1_000_000,
        "BLOOMFILTER_ERROR_RATE": 0.0001,
        "BLOOMFILTER_SHARD_BIT": 20,
    }
    # The state: a crawl saw 3,000 URLs; files of URLs and fingerprints to check and add.
    # (The move from scrapy-redis's SET, migrate, is test_migrate_from_set.py's.)
    crawled = [f"https://example.com/page/{i}" for i in range(3000)]
    df = RFPDupeFilter.from_crawler(get_crawler(MySpider, settings))
    try:
        assert not any(df.request_seen(Request(url)) for url in crawled)
    finally:
        df.close("finished")
    (project / "urls.txt").write_text(
        "".join(f"https://example.com/page/{i}\n" for i in range(2900, 3100))
    )
    (project / "fingerprints.txt").write_text(
        "".join(hashlib.sha1(f"fp{i}".encode()).hexdigest() + "\n" for i in range(1000))
    )
    captured = {}
    wrong = []
    for command, shown in sessions:
        argv = shlex.split(command)
        assert argv[:2] == ["scrapy", "bloom"], command
        with _adding_while(redis_client, settings, argv[2] == "watch"):
            result = scrapy_run(project, *argv[1:])
        assert (result.code, result.err) == (0, ""), f"{command}: {result}"
        captured[command] = result.out
        if normalised(result.out) != normalised(shown):
            wrong.append(f"{command} printed:\n{result.out}")
    capture = os.environ.get("SRB_README_CAPTURE")
    if capture:
        Path(capture).write_text(json.dumps(captured, indent=2))
    assert not wrong, "\n".join(wrong)


@NOT_INSTALLED
def test_choose_capacity_blocks(blocks: dict[str, Block], tmp_path: Path) -> None:
    """The capacity page's settings, and its scrapy bloom size session, as printed."""
    settings = exec_settings(block(blocks, "Choose and change capacity and error rate#1"))
    config = BloomConfig.from_settings(settings)
    command, shown = session(block(blocks, "The error rate: how many pages you may lose#1"))
    argv = shlex.split(command)
    assert argv[:3] == ["scrapy", "bloom", "size"], command
    assert int(option(argv, "--capacity")[0]) == config.capacity
    assert float(option(argv, "--error-rate")[0]) == settings["BLOOMFILTER_ERROR_RATE"]
    result = scrapy_run(tmp_path, *argv[1:])
    assert (result.code, result.err) == (0, ""), result
    assert result.out.strip() == shown.strip(), f"{command} printed:\n{result.out}"
    assert f"({format_bytes(config.spec.total_bytes)};" in shown


def test_migrate_from_set_blocks(blocks: dict[str, Block]) -> None:
    """The SET how-to's blocks are the ones tests/test_migrate_from_set.py runs, in order."""
    from test_migrate_from_set import PAGE, STEPS

    assert [b.id for b in blocks.values() if b.source == PAGE] == list(STEPS)
    for block_id in STEPS:
        block(blocks, block_id)


@contextlib.contextmanager
def _adding_while(client: redis.Redis, settings: dict[str, Any], active: bool) -> Iterator[None]:
    """Add fingerprints to the README's filter from a thread, as a crawl's worker would.

    Only if ``active``; the worker holds a lease, as a crawl's does, so it shows as live.
    """
    if not active:
        yield
        return
    stop = threading.Event()

    def crawl() -> None:
        bloom = RedisBloomFilter.from_config(client, KEY, BloomConfig.from_settings(settings))
        lease = bloom.lease("crawler-1:4242:9f3a61c2", 30.0)
        try:
            bloom.open()
            lease.renew()
            batch = 0
            while not stop.wait(0.5):
                batch += 1
                bloom.add_many(
                    [hashlib.sha1(f"w{batch}:{i}".encode()).hexdigest() for i in range(700)]
                )
                bloom.sync_counters()
        finally:
            lease.release()
            bloom.close()

    worker = threading.Thread(target=crawl)
    worker.start()
    try:
        yield
    finally:
        stop.set()
        worker.join()


def test_spidermon_block(blocks: dict[str, Block], redis_url: str, tmp_path: Path) -> None:
    from test_crawl import assert_finished, crawl
    from website import Site, SiteServer

    settings = exec_settings(block(blocks, "Monitoring with Spidermon#1"))
    assert BloomConfig.from_settings(settings).monitor_max_fpr == 0.001
    with SiteServer(Site(60)) as site:
        result = crawl(site, redis_url, tmp_path, mode="follow", settings=settings)
    assert_finished(result)
    for monitor in ("a fixed-size filter within its capacity", "has room to grow", "no failover"):
        assert f"{monitor}... OK" in result.log
    assert "... FAIL" not in result.log
