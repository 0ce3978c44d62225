"""``scrapy bloom``: the Scrapy command, run as a user runs it, in a subprocess.

The ``scrapy`` executable beside the running Python must have the command through
the ``scrapy.commands`` entry point (an install of this package: ``pip install -e
.``), or these tests are skipped, saying so. Each runs inside a temporary Scrapy
project made of files (scrapy.cfg, settings.py, a spider), or outside any project,
against real redis-server processes: one server, a server list, a Redis Cluster.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import select
import signal
import struct
import subprocess
import termios
import time
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster
from redis_server import RedisServer, free_port
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler
from scrapy_run import (
    NOT_INSTALLED,
    SCRAPY,
    SUBCOMMANDS,
    make_project,
    one_line_error,
    scrapy,
)

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.cli.contents import marker_key
from scrapy_redis_bloom.core.sizing import filter_allocation, format_bytes
from scrapy_redis_bloom.scrapy.dupefilter import RFPDupeFilter

pytestmark = NOT_INSTALLED


SIZING = {"BLOOMFILTER_CAPACITY": 20_000, "BLOOMFILTER_ERROR_RATE": 0.0001}


def stored_filter(client: redis.Redis, key: str, items: list[str]) -> None:
    """Create a filter of the project's sizing holding ``items``, as a crawl would."""
    bloom = RedisBloomFilter.from_config(client, key, BloomConfig.from_settings(SIZING))
    bloom.open()
    bloom.add_many(items)
    bloom.sync_counters()
    bloom.close()


def fingerprints(n: int, salt: str = "") -> list[str]:
    return [hashlib.sha1(f"{salt}{i}".encode()).hexdigest() for i in range(n)]


def write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


@pytest.fixture
def project(tmp_path: Path, redis_url: str) -> Path:
    """Return a project whose crawls use ``redis_url`` (scrapy-redis's REDIS_URL)."""
    return make_project(tmp_path / "project", f"REDIS_URL = {redis_url!r}\n")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Return a directory in no Scrapy project."""
    path = tmp_path / "elsewhere"
    path.mkdir()
    return path


# -- help ------------------------------------------------------------------------------


def test_help_lists_the_subcommands_outside_a_project(outside: Path) -> None:
    result = scrapy(outside, "bloom", "--help")
    assert (result.code, result.err) == (0, "")
    assert "130 interrupted (Ctrl-C; watch stops on it with 0)" in " ".join(result.out.split())
    for name in SUBCOMMANDS:
        assert f"\n    {name} " in result.out, name
    listing = scrapy(outside, "-h")
    assert "bloom" in listing.out
    assert "Bloom filter" in listing.out


def test_help_lists_the_subcommands_inside_a_project(project: Path) -> None:
    result = scrapy(project, "bloom", "--help")
    assert (result.code, result.err) == (0, "")
    for name in SUBCOMMANDS:
        assert f"\n    {name} " in result.out, name
    sub = scrapy(project, "bloom", "check", "--help")
    assert sub.code == 0
    # as the commands reference has it (it said "scrapy bloom COMMAND [options] check")
    assert sub.out.startswith("usage: scrapy bloom check [-h] "), sub.out
    wrong = scrapy(project, "bloom", "restore")
    assert wrong.code == 2
    assert wrong.err.splitlines()[-1].startswith("scrapy bloom restore: error: "), wrong.err
    assert "--urls" in sub.out
    assert "--spider" in sub.out


@pytest.mark.parametrize("argv", [[], ["-s", "LOG_LEVEL=INFO"]])
def test_without_a_subcommand_lists_them(outside: Path, argv: list[str]) -> None:
    result = scrapy(outside, "bloom", *argv)
    assert (result.code, result.out) == (2, ""), result
    assert "Traceback" not in result.err
    usage, listing = result.err.split("scrapy: error: give a command, one of:\n")
    assert "scrapy bloom COMMAND" in usage
    listed = re.findall(r"^  ([a-z-]+) +(\S.*)$", listing, re.MULTILINE)
    assert tuple(name for name, _ in listed) == SUBCOMMANDS
    helps = " ".join(scrapy(outside, "bloom", "--help").out.split())
    for name, description in listed:
        assert f"{name} {description}" in helps
    assert result.err.endswith("See 'scrapy bloom COMMAND --help' for a command's options.\n")


# -- the project's settings ------------------------------------------------------------


def test_the_project_settings_name_and_reach_the_filter(
    project: Path, redis_client: redis.Redis, tmp_path: Path
) -> None:
    data = write(tmp_path / "fp.txt", fingerprints(300))
    added = scrapy(project, "bloom", "add", "--spider", "books", data)
    assert added.code == 0, added
    # The project's sizing created the filter, under the crawl's key for the spider.
    assert "Created the Bloom filter 'books:bloomfilter'" in added.out
    assert "300 new, 0 already present" in added.out
    assert redis_client.exists("books:bloomfilter:meta")
    info = scrapy(project, "bloom", "info", "--spider", "books", "--json")
    assert info.code == 0, info
    shown = json.loads(info.out)
    assert (shown["key"], shown["capacity"], shown["backend"]) == (
        "books:bloomfilter",
        20_000,
        "bitmap",
    )
    assert shown["estimated_items"] == pytest.approx(300, rel=0.05)
    assert shown["total_added"] == 300
    # A spider's custom_settings apply, as in `scrapy crawl news`.
    news = scrapy(project, "bloom", "add", "--spider", "news", data)
    assert "Created the Bloom filter 'fresh:news'" in news.out
    # --key names a filter directly; a spider the project does not have is refused.
    check = scrapy(project, "bloom", "check", "--key", "books:bloomfilter", data)
    assert "300 present, 0 absent" in check.out
    unknown = scrapy(project, "bloom", "info", "--spider", "bokos")
    assert "No spider named 'bokos'" in one_line_error(unknown, 2)
    which = scrapy(project, "bloom", "info")
    assert "--spider NAME" in one_line_error(which, 2)


def test_the_commands_retry_timeout_is_said_to_be_their_default(outside: Path) -> None:
    # It said "(BLOOMFILTER_RETRY_TIMEOUT = 5 s)", though no project set it: a crawl's is 20 s.
    dead = ("-s", f"REDIS_URL=redis://127.0.0.1:{free_port()}/0")
    unset = one_line_error(scrapy(outside, "bloom", "info", "--key", "k", *dead), 1)
    assert unset.endswith(
        "Retried for 5.0 s (BLOOMFILTER_RETRY_TIMEOUT not set: the command's default = 5 s).\n"
    ), unset
    given = scrapy(
        outside, "bloom", "info", "--key", "k", *dead, "-s", "BLOOMFILTER_RETRY_TIMEOUT=1"
    )
    assert one_line_error(given, 1).endswith(" (BLOOMFILTER_RETRY_TIMEOUT = 1 s).\n"), given


def test_s_overrides_the_project_settings(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}"
    project = make_project(tmp_path / "p", f"REDIS_URL = {dead!r}\n")
    data = write(tmp_path / "fp.txt", fingerprints(50))
    failed = scrapy(project, "bloom", "add", "--key", "k", data)
    assert "cannot connect" in one_line_error(failed, 1)
    # -s before or after the subcommand's name.
    first = scrapy(project, "bloom", "-s", f"REDIS_URL={redis_url}", "add", "--key", "k", data)
    assert "50 new, 0 already present" in first.out, first
    second = scrapy(project, "bloom", "add", "--key", "k", data, "-s", f"REDIS_URL={redis_url}")
    assert "0 new, 50 already present" in second.out, second
    assert redis_client.exists("k:meta")
    # A sizing setting given with -s that does not match the filter is refused.
    other = scrapy(project, "bloom", "add", "--key", "k", data, "-s", f"REDIS_URL={redis_url}",
                   "-s", "BLOOMFILTER_CAPACITY=30000")  # fmt: skip
    assert "do not match the existing filter" in one_line_error(other, 1)


@pytest.mark.parametrize(
    ("name", "value", "named"),
    [
        ("BLOOMFILTER_ERROR_RATE", "2", "BLOOMFILTER_ERROR_RATE"),
        ("BLOOMFILTER_REDIS_URL", "http://127.0.0.1:1", "BLOOMFILTER_REDIS_URL"),
        ("BLOOMFILTER_RETRY_TIMEOUT", "-1", "BLOOMFILTER_RETRY_TIMEOUT"),
        ("BLOOMFILTER_KEY", "a{b}", "BLOOMFILTER_KEY"),
    ],
)
def test_bad_settings_are_one_line(outside: Path, name: str, value: str, named: str) -> None:
    result = scrapy(outside, "bloom", "info", "--key", "k", "-s", f"{name}={value}")
    assert named in one_line_error(result, 2)
    if name in ("BLOOMFILTER_ERROR_RATE", "BLOOMFILTER_KEY"):  # what the calculator reads
        sized = scrapy(outside, "bloom", "size", "-s", f"{name}={value}")
        assert named in one_line_error(sized, 2)


def test_size_by_bits_names_what_capacity_and_rate_would_create(outside: Path) -> None:
    # 2**30 bits and k = 3 hold 1,000 items at 9.75e-11; a filter sized by that capacity and
    # rate has other bits and k (it said "The same, the other way").
    sizing = ["-s", "BLOOMFILTER_CAPACITY=1000", "-s", "BLOOMFILTER_HASH_NUMBER=3"]
    result = scrapy(outside, "bloom", "size", *sizing)
    assert result.code == 0, result.err
    rows = dict(line.split("  ", 1) for line in result.out.splitlines() if "  " in line)
    rows = {label.strip(): value.strip() for label, value in rows.items()}
    other = rows["Sized by capacity and rate"]
    rate = float(re.findall(r"BLOOMFILTER_ERROR_RATE = ([0-9.e+-]+)", other)[0])
    config = BloomConfig.from_settings(
        {"BLOOMFILTER_CAPACITY": 1000, "BLOOMFILTER_ERROR_RATE": rate}
    )
    assert other.startswith("BLOOMFILTER_CAPACITY = 1000, BLOOMFILTER_ERROR_RATE = 9.75e-11")
    assert f"({config.spec.bits:,} bits, k = {config.spec.hash_count})" in other
    assert config.spec.hash_count != 3
    assert "The same, the other way" not in result.out


def test_size_of_a_native_filter_says_what_bf_reserve_makes(outside: Path) -> None:
    """What the servers would hold, not the bitmap geometry.

    It said "Classic layout (these settings)", the bitmap memory, and a growth "up to
    102,300,000 items (10 generations of 16: a shard's next would pass the largest generation
    size, 512 MB)" that RedisBloom's sub-filters are not bound by.
    """
    from scrapy_redis_bloom.core.sizing import native_reserve_rate

    native = ["-s", "BLOOMFILTER_BACKEND=native"]
    sizing = ["--capacity", "100000", "--error-rate", "1e-6"]
    result = scrapy(outside, "bloom", "size", *sizing, *native)
    assert result.code == 0, result.err
    rows = dict(line.split("  ", 1) for line in result.out.splitlines() if "  " in line)
    rows = {label.strip(): value.strip() for label, value in rows.items()}
    assert rows["Backend"].startswith("native")
    assert rows["Shards"] == "1"
    rate = native_reserve_rate(100_000, 1e-6, 2)
    assert rows["Each shard (BF.RESERVE)"] == f"100,000 items at error rate {rate:.3g}"
    assert "Native (BF.*) (these settings)" in rows
    assert "Classic layout (unblocked) (these settings)" not in rows
    assert "generation" not in rows["Growth"]
    assert rows["Growth"].endswith("at an FP rate under 1e-06"), rows["Growth"]
    # The layouts table's native row is the same filter: its k and memory, not the model's
    # bare-rate guess (it said k=21, 372.2 KiB under "k=22 hash functions", 384.3 KiB).
    first = rows["First sub-filters"]
    k = first.split("k=")[1].split(" ")[0]
    memory = rows["Memory in Redis"].split(" (")[0]
    assert rows["Native (BF.*) (these settings)"].startswith(f"k={k}, {memory}, "), rows
    # Shards too small for their rate (BLOOMFILTER_SHARDS) are said, in the JSON too.
    small = scrapy(outside, "bloom", "size", "--json", "--capacity", "100",
                   "-s", "BLOOMFILTER_SHARDS=10", *native)  # fmt: skip
    assert small.code == 0, small.err
    data = json.loads(small.out)
    assert (data["backend"], data["shards"], data["reserved_capacity"]) == ("native", 10, 10)
    assert data["rate_bound"] > 5e-3  # 10 items a shard: far past 1e-3
    assert [layout["layout"] for layout in data["layouts"] if layout["current"]] == ["native"]


def test_an_option_of_the_alias_is_named_with_its_setting(outside: Path) -> None:
    # It was "scrapy: error: unexpected argument(s): --capacity urls.txt" (its value taken
    # for a file of fingerprints).
    result = scrapy(outside, "bloom", "add", "--key", "k", "--capacity", "100", "--urls", "u.txt")
    said = one_line_error(result, 2)
    assert "--capacity is an option of the scrapy-redis-bloom command, not of scrapy bloom" in said
    assert "give -s BLOOMFILTER_CAPACITY=VALUE" in said


def test_passwords_are_not_shown(outside: Path) -> None:
    url = f"redis://:pw5678@127.0.0.1:{free_port()}"
    result = scrapy(outside, "bloom", "info", "--key", "k", "-s", f"BLOOMFILTER_REDIS_URL={url}")
    err = one_line_error(result, 1)
    assert "pw5678" not in err
    assert "127.0.0.1" in err


# -- URLs fingerprinted as the crawl does ------------------------------------------------


class BooksSpider(Spider):
    name = "books"


@pytest.mark.parametrize("fingerprinter", ["scrapy-redis", "crawler"])
def test_check_urls_sees_what_the_dupefilter_marked(
    project: Path, redis_url: str, tmp_path: Path, fingerprinter: str
) -> None:
    seen = [f"https://example.com/book/{i}?b=2&a=1" for i in range(40)]
    unseen = [f"https://example.com/other/{i}" for i in range(25)]
    settings = {"REDIS_URL": redis_url, "BLOOMFILTER_FINGERPRINTER": fingerprinter, **SIZING}
    dupefilter = RFPDupeFilter.from_crawler(get_crawler(BooksSpider, settings))
    try:
        assert all(dupefilter.request_seen(Request(url)) is False for url in seen)
    finally:
        dupefilter.close("finished")
    given = ["-s", f"BLOOMFILTER_FINGERPRINTER={fingerprinter}", "--spider", "books", "--urls"]
    # Canonicalised as the crawl does: the same URL with its query in another order.
    reordered = [url.replace("?b=2&a=1", "?a=1&b=2") for url in seen]
    result = scrapy(
        project, "bloom", "check", *given, write(tmp_path / "u.txt", reordered + unseen)
    )
    assert result.code == 0, result
    assert "40 present, 25 absent" in result.out
    # From stdin, and added by URL: then the crawl's dupefilter finds them seen.
    added = scrapy(project, "bloom", "add", *given, stdin="\n".join(unseen) + "\n")
    assert "25 new, 0 already present" in added.out, added
    again = RFPDupeFilter.from_crawler(get_crawler(BooksSpider, settings))
    try:
        assert all(again.request_seen(Request(url)) for url in unseen)
    finally:
        again.close("finished")
    bad = scrapy(project, "bloom", "check", *given, stdin="https://example.com/x\nnot a url\n")
    assert "<stdin>:2: not a URL" in one_line_error(bad, 1)


@pytest.mark.parametrize("fingerprinter", ["scrapy-redis", "crawler"])
@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://[::1", "Invalid IPv6 URL"),
        ("http://a:99999/", "Port out of range"),
        ("http://[zz]/", "'zz' does not appear to be an IPv4 or IPv6 address"),
    ],
)
def test_a_url_the_regex_passes_but_parsing_refuses_is_one_line(
    project: Path, fingerprinter: str, url: str, problem: str
) -> None:
    # The URL parser's ValueError ended in a traceback.
    given = ["-s", f"BLOOMFILTER_FINGERPRINTER={fingerprinter}", "--key", "k", "--urls"]
    added = scrapy(project, "bloom", "add", *given, stdin=f"https://example.com/a\n\n{url}\n")
    said = one_line_error(added, 1)
    assert f"<stdin>:3: not a URL: {url!r} ({problem}" in said
    assert "the 1 fingerprint(s) before it were added" in said


@pytest.mark.parametrize(
    ("fingerprinter", "name", "value", "problem"),
    [
        ("crawler", "REQUEST_FINGERPRINTER_CLASS", "no.such.Class", "no module named 'no'"),
        ("crawler", "REQUEST_FINGERPRINTER_CLASS", "Class", "not a full path"),
        ("crawler", "REQUEST_FINGERPRINTER_CLASS", "shop.NoSuch", "module 'shop' has no 'NoSuch'"),
        ("scrapy-redis", "DUPEFILTER_CLASS", "no.such.Class", "no module named 'no'"),
    ],
)
def test_a_class_setting_that_does_not_load_is_one_line(
    project: Path, fingerprinter: str, name: str, value: str, problem: str
) -> None:
    # load_object's ModuleNotFoundError (or NameError, ValueError) ended in a traceback.
    given = ["-s", f"BLOOMFILTER_FINGERPRINTER={fingerprinter}", "--key", "k", "--urls"]
    result = scrapy(
        project, "bloom", "add", *given, "-s", f"{name}={value}", stdin="https://example.com/a\n"
    )
    said = one_line_error(result, 2)
    assert f"{name}={value!r}" in said
    assert problem in said


def test_an_error_inside_the_fingerprinter_module_still_surfaces(project: Path) -> None:
    # Not a wrong name: the module's own import failing is a bug, shown with its traceback.
    (project / "shop" / "fingerprinting.py").write_text("import no_such_dependency\n")
    given = ["-s", "BLOOMFILTER_FINGERPRINTER=crawler", "--key", "k", "--urls"]
    wrong = ["-s", "REQUEST_FINGERPRINTER_CLASS=shop.fingerprinting.Fingerprinter"]
    result = scrapy(project, "bloom", "add", *given, *wrong, stdin="https://example.com/a\n")
    assert result.code == 1, result
    assert "ModuleNotFoundError: No module named 'no_such_dependency'" in result.err


# -- topologies --------------------------------------------------------------------------


def test_info_add_check_on_a_server_list(
    outside: Path, servers: list[RedisServer], clients: list[redis.Redis], tmp_path: Path
) -> None:
    urls = ",".join(server.url for server in servers)
    where = ["-s", f"BLOOMFILTER_REDIS_URLS={urls}", "--key", "listed:bf"]
    sizing = ["-s", "BLOOMFILTER_CAPACITY=10000", "-s", "BLOOMFILTER_SHARD_BIT=12"]
    data = write(tmp_path / "fp.txt", fingerprints(500))
    added = scrapy(outside, "bloom", "add", *where, *sizing, data)
    assert "500 new" in added.out, added
    info = json.loads(scrapy(outside, "bloom", "info", *where, "--json").out)
    assert info["servers"] == [f"127.0.0.1:{server.port}" for server in servers]
    assert info["shards_missing"] == 0
    # Every server holds part of the filter.
    assert all(any(k.startswith(b"{listed:bf") for k in client.scan_iter()) for client in clients)
    check = scrapy(
        outside, "bloom", "check", *where, data, write(tmp_path / "n.txt", fingerprints(100, "x"))
    )
    assert check.code == 0, check
    assert "600 fingerprint(s)" in check.out
    assert "500 present" in check.out
    # Given one server of the three, the command refuses rather than misplace shards.
    one = scrapy(
        outside,
        "bloom",
        "check",
        "-s",
        f"BLOOMFILTER_REDIS_URL={servers[0].url}",
        "--key",
        "listed:bf",
        data,
    )
    assert "created on 3 server(s); 1 given" in one_line_error(one, 1)


def test_info_add_check_on_a_cluster(
    outside: Path, redis_cluster_url: str, redis_cluster: RedisCluster, tmp_path: Path
) -> None:
    where = [
        "-s",
        f"BLOOMFILTER_REDIS_URL={redis_cluster_url}",
        "-s",
        "BLOOMFILTER_REDIS_CLUSTER=True",
    ]
    sizing = ["-s", "BLOOMFILTER_CAPACITY=10000", "-s", "BLOOMFILTER_SHARD_BIT=12"]
    data = write(tmp_path / "fp.txt", fingerprints(400))
    added = scrapy(outside, "bloom", "add", *where, *sizing, "--key", "clustered:bf", data)
    assert "400 new" in added.out, added
    info = scrapy(outside, "bloom", "info", *where, "--key", "clustered:bf")
    assert info.code == 0, info
    assert "Redis Cluster, 3 master(s)" in info.out
    assert "Fill, shard" in info.out
    check = scrapy(outside, "bloom", "check", *where, "--key", "clustered:bf", data)
    assert "400 present, 0 absent" in check.out
    # A cluster node given as a plain server is named for what it is.
    plain = scrapy(
        outside,
        "bloom",
        "info",
        "-s",
        f"BLOOMFILTER_REDIS_URL={redis_cluster_url}",
        "--key",
        "clustered:bf",
    )
    assert "BLOOMFILTER_REDIS_CLUSTER" in one_line_error(plain, 2)


# -- reset, size, watch ------------------------------------------------------------------


def test_reset_asks_unless_yes(project: Path, redis_client: redis.Redis, redis_url: str) -> None:
    stored_filter(redis_client, "books:bloomfilter", fingerprints(10))
    refused = scrapy(project, "bloom", "reset", "--spider", "books", stdin="y\n")
    assert "--yes" in one_line_error(refused, 2)
    assert redis_client.exists("books:bloomfilter:meta")
    done = scrapy(project, "bloom", "reset", "--spider", "books", "--yes")
    assert done.code == 0, done
    assert "Deleted the Bloom filter 'books:bloomfilter'" in done.out
    assert redis_client.keys("*books:bloomfilter*") == []
    again = scrapy(project, "bloom", "reset", "--spider", "books", "--yes")
    assert "nothing to delete" in again.out


def test_size_calculator(outside: Path) -> None:
    by_rate = json.loads(
        scrapy(
            outside, "bloom", "size", "--capacity", "1000000", "--error-rate", "0.001", "--json"
        ).out
    )
    config = BloomConfig.from_settings(
        {"BLOOMFILTER_CAPACITY": 1_000_000, "BLOOMFILTER_ERROR_RATE": 0.001}
    )
    assert (by_rate["bits"], by_rate["hash_number"]) == (config.spec.bits, config.spec.hash_count)
    assert by_rate["memory_bytes"] >= config.spec.total_bytes
    text = scrapy(
        outside,
        "bloom",
        "size",
        "--bit",
        "20",
        "--hash-number",
        "5",
        "-s",
        "BLOOMFILTER_EXPANSION=0",
    )
    assert text.code == 0, text
    assert "BLOOMFILTER_CAPACITY = " in text.out
    assert "a fixed size" in text.out
    # Options of one way replace the project's settings of the other (no contradiction).
    project = make_project(outside / "p", "")
    assert scrapy(project, "bloom", "size", "--bit", "20", "--hash-number", "5").code == 0
    bad = scrapy(outside, "bloom", "size", "--capacity", "0")
    assert "BLOOMFILTER_CAPACITY" in one_line_error(bad, 2)


def test_size_says_when_the_shard_size_bounds_growth(outside: Path) -> None:
    asked = ("bloom", "size", "--capacity", "1000000000", "--error-rate", "0.0001")
    grown = scrapy(outside, *asked, "--shards", "8")
    assert grown.code == 0, grown
    assert "cannot grow: its shards are already at the largest generation size" in grown.out
    assert "x2 per generation" not in grown.out
    fewer = scrapy(outside, *asked, "--shard-bit", "32")
    assert "(2 generations of 16: a shard's next would pass" in fewer.out


def test_size_compares_the_layouts(outside: Path) -> None:
    asked = ("--capacity", "100000000", "--error-rate", "0.0001")
    data = json.loads(scrapy(outside, "bloom", "size", *asked, "--json").out)
    layouts = {entry["layout"]: entry for entry in data["layouts"]}
    assert list(layouts) == ["classic", "blocked", "native"]
    # A new bitmap filter is blocked by default; --no-blocked asks for the classic layout.
    assert [name for name, entry in layouts.items() if entry["current"]] == ["blocked"]
    assert data["block_bits"] == 512
    settings = {"BLOOMFILTER_CAPACITY": 10**8, "BLOOMFILTER_ERROR_RATE": 1e-4}
    for name, blocked in (("classic", False), ("blocked", True)):
        spec = BloomConfig.from_settings({**settings, "BLOOMFILTER_BLOCKED": blocked}).spec
        assert layouts[name]["memory_bytes"] == filter_allocation(spec)
        assert layouts[name]["hash_count"] == spec.hash_count
    # The memory the README's sizing table states, and the model's order of the layouts.
    assert format_bytes(layouts["classic"]["memory_bytes"]) == "248.0 MiB"
    assert format_bytes(layouts["blocked"]["memory_bytes"]) == "294.0 MiB"
    times = {name: entry["redis_us_per_check"] for name, entry in layouts.items()}
    assert times["native"] < times["blocked"] < times["classic"]
    classic = json.loads(scrapy(outside, "bloom", "size", *asked, "--no-blocked", "--json").out)
    assert [e["layout"] for e in classic["layouts"] if e["current"]] == ["classic"]
    assert classic["block_bits"] == 0
    assert classic["layouts"] == [
        {**e, "current": not e["current"]} if e["layout"] != "native" else e
        for e in data["layouts"]
    ]
    text = scrapy(outside, "bloom", "size", *asked)
    rows = {
        label.strip(): value.strip()
        for label, value in (line.split("  ", 1) for line in text.out.splitlines())
    }
    assert rows["Blocked layout (these settings)"].startswith(
        "k=13, 294.0 MiB, FP rate at capacity"
    )
    assert rows["Classic layout (unblocked)"].startswith("k=14, 248.0 MiB, FP rate at capacity")
    assert rows["Native (BF.*)"].endswith("µs of Redis per check")


def test_a_mismatch_advises_the_reset_of_this_front_end(
    project: Path, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """It advised 'scrapy-redis-bloom reset', which without --redis-url acts on another server."""
    stored_filter(redis_client, "books:bloomfilter", fingerprints(10))
    path = write(tmp_path / "fps.txt", fingerprints(10))
    argv = ["add", "--spider", "books", "-s", "BLOOMFILTER_CAPACITY=5000", path]
    err = one_line_error(scrapy(project, "bloom", *argv), 1)
    assert "do not match the existing filter" in err
    assert "(scrapy bloom reset --key 'books:bloomfilter')" in err
    assert "scrapy-redis-bloom" not in err


def test_watch_prints_count_lines(project: Path, redis_client: redis.Redis) -> None:
    stored_filter(redis_client, "books:bloomfilter", fingerprints(1000))
    result = scrapy(
        project, "bloom", "watch", "--spider", "books", "--interval", "0.2", "--count", "3"
    )
    assert result.code == 0, result
    lines = result.out.splitlines()
    assert len(lines) == 3
    assert all("1,000 items (5.00 % of 20,000)" in line for line in lines)
    sample = json.loads(
        scrapy(project, "bloom", "watch", "--spider", "books", "--count", "1", "--json").out
    )
    assert sample["items"] == 1000
    assert 0 < sample["fill_ratio"] < 1


def test_watch_of_recrawl_windows_gives_what_the_live_windows_hold(
    project: Path, redis_client: redis.Redis
) -> None:
    # It gave the counters' every URL ever added: 1,000 items once the windows had expired.
    config = BloomConfig.from_settings({**SIZING, "BLOOMFILTER_TTL": 1})
    bloom = RedisBloomFilter.from_config(redis_client, "books:bloomfilter", config)
    bloom.add_many(fingerprints(1000))
    bloom.sync_counters()
    bloom.close()
    argv = ["bloom", "watch", "--spider", "books", "--count", "1", "--json", "-s"]
    sample = json.loads(scrapy(project, *argv, "BLOOMFILTER_TTL=1").out)
    assert 990 <= sample["items"] <= 1010  # counted by the windows' headers, not the bits
    time.sleep(2.2)  # both windows that held them expired
    sample = json.loads(scrapy(project, *argv, "BLOOMFILTER_TTL=1").out)
    assert sample["items"] == 0
    assert sample["fill_ratio"] == 0


def test_watch_refuses_an_interval_no_sleep_takes(outside: Path) -> None:
    """An interval of 1e300 s raised OverflowError at the first sleep: a usage error now."""
    result = scrapy(outside, "bloom", "watch", "--key", "k", "--interval", "1e300")
    assert result.code == 2, result
    assert "Traceback" not in result.err
    assert "argument --interval: must be at most 86,400, got '1e300'" in result.err


def test_watch_lines_reach_a_pipe_as_printed_and_a_fall_reads_as_one(
    project: Path, redis_client: redis.Redis
) -> None:
    """Each line is flushed, and counts rolled back read "-20", not "+-20".

    A pipe to a log got nothing until 4 KiB had gathered (~50 s of lines); counts go
    down when an older AOF is restored or by a hand edit.
    """
    stored_filter(redis_client, "books:bloomfilter", fingerprints(50))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCRAPY_", "REDIS_URL"))}
    env.pop("PYTHONUNBUFFERED", None)
    argv = [str(SCRAPY), "bloom", "watch", "--spider", "books", "--interval", "1", "--count", "3"]
    with subprocess.Popen(argv, cwd=project, env=env, stdout=subprocess.PIPE, text=True) as watch:
        assert watch.stdout is not None
        first = _line_within(watch, 30)
        assert watch.poll() is None, "its first line came out only when it ended"
        redis_client.hincrby("books:bloomfilter:count", "added", -20)
        rest, _ = watch.communicate(timeout=30)
    assert watch.returncode == 0
    after = rest.splitlines()
    assert [(line.split(" items")[0].split()[-1], line.split()[7]) for line in [first, *after]] == [
        ("50", "+0"),
        ("30", "-20"),
        ("30", "+0"),
    ]
    assert "+-" not in rest


def _line_within(process: subprocess.Popen[str], seconds: float) -> str:
    """Return the process's first line of stdout, failing when none comes within ``seconds``."""
    assert process.stdout is not None
    deadline = time.monotonic() + seconds
    while not select.select([process.stdout], [], [], 0.1)[0]:
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"no line of output within {seconds} s")
    return process.stdout.readline()


# -- migrate -----------------------------------------------------------------------------


def test_migrate_reads_the_set_where_scrapy_redis_keeps_it(
    project: Path, redis_client: redis.Redis, redis_url: str
) -> None:
    # The queue and its SET on REDIS_URL, the filter on its own Redis (topologies.md): the
    # SET was looked for on the filter's server ("does not exist ...: nothing to migrate").
    members = fingerprints(300, "set")
    redis_client.sadd("books:dupefilter", *members)
    with RedisServer() as own:
        filter_client = own.client()
        filter_client.sadd("other:set", *fingerprints(50, "other"))
        base = ["bloom", "migrate", "--spider", "books", "-s", f"BLOOMFILTER_REDIS_URL={own.url}"]
        result = scrapy(project, *base, "--json")
        assert result.code == 0, result
        data = json.loads(result.out)
        assert (data["fingerprints"], data["new"]) == (300, 300)
        assert data["set_server"] == redis_url.split("://", 1)[1].split("/", 1)[0]
        bloom = RedisBloomFilter.from_config(
            filter_client, "books:bloomfilter", BloomConfig.from_settings(SIZING)
        )
        assert all(bloom.contains_many(members))
        assert redis_client.keys("books:bloomfilter*") == []  # the filter is on its own Redis
        assert not redis_client.exists(marker_key("books:dupefilter"))

        # --set-redis-url names another server: the SET is read there.
        others = fingerprints(50, "other")
        result = scrapy(project, *base, "--set-key", "other:set", "--set-redis-url", own.url)
        assert result.code == 0, result
        assert f"from the set 'other:set' on 127.0.0.1:{own.port} into" in result.out
        assert all(bloom.contains_many(others))
        bloom.close()
        filter_client.close()


def test_migrate_refuses_the_crawlers_fingerprinter(
    project: Path, redis_client: redis.Redis
) -> None:
    # The SET holds scrapy-redis's fingerprints; a crawl under 'crawler' checks others, so
    # migrating said "60 new" and the next crawl fetched all 60 pages again.
    members = fingerprints(60, "set")
    redis_client.sadd("books:dupefilter", *members)
    result = scrapy(
        project, "bloom", "migrate", "--spider", "books", "-s", "BLOOMFILTER_FINGERPRINTER=crawler"
    )
    err = one_line_error(result, 2)
    assert "BLOOMFILTER_FINGERPRINTER is 'crawler'" in err
    assert "never match them" in err
    assert redis_client.keys("books:bloomfilter*") == []
    assert redis_client.scard("books:dupefilter") == 60


def test_migrate_resumes_after_an_interruption(project: Path, redis_client: redis.Redis) -> None:
    members = fingerprints(30_000, "set")
    for start in range(0, len(members), 5000):
        redis_client.sadd("books:dupefilter", *members[start : start + 5000])
    argv = [str(SCRAPY), "bloom", "migrate", "--spider", "books", "--batch", "100"]
    # Ctrl-C as in a terminal: SIGINT at its default in the child, even when the tests
    # run in a background job (which ignores SIGINT, and its children inherit that).
    process = subprocess.Popen(
        argv,
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    marker = marker_key("books:dupefilter")
    deadline = time.monotonic() + 60
    while not redis_client.exists(marker) and process.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, (out, err)
    said = re.fullmatch(
        r"scrapy bloom: error: interrupted: ([\d,]+) of the set's 30,000 members were migrated\."
        r" Run the command again: it resumes from its last saved batch .*",
        err.strip(),
    )
    assert said, err
    saved = redis_client.hgetall(marker)
    assert int(saved[b"cursor"]) != 0
    copied = int(saved[b"new"]) + int(saved[b"present"])
    assert 0 < copied <= int(said[1].replace(",", "")) < len(members)

    resumed = scrapy(project, "bloom", "migrate", "--spider", "books", "--json")
    assert resumed.code == 0, resumed
    data = json.loads(resumed.out)
    assert data["resumed"] is True
    # The counts carry over; the members of the batch cut short count as present.
    assert data["fingerprints"] >= len(members)
    assert data["new"] <= len(members)
    assert not redis_client.exists(marker)
    bloom = RedisBloomFilter.from_config(
        redis_client, "books:bloomfilter", BloomConfig.from_settings(SIZING)
    )
    assert all(bloom.contains_many(members))
    bloom.close()
    # Run again: nothing to resume, every member already present.
    again = json.loads(scrapy(project, "bloom", "migrate", "--spider", "books", "--json").out)
    assert (again["resumed"], again["new"], again["already_present"]) == (False, 0, len(members))


# -- dump and restore --------------------------------------------------------------------


def test_dump_reset_restore_on_another_topology(
    project: Path,
    redis_client: redis.Redis,
    redis_cluster_url: str,
    redis_cluster: RedisCluster,
    tmp_path: Path,
) -> None:
    items = fingerprints(20_000, "dump")
    stored_filter(redis_client, "books:bloomfilter", items)
    before = json.loads(scrapy(project, "bloom", "info", "--spider", "books", "--json").out)
    path = tmp_path / "books.dump"
    dumped = scrapy(project, "bloom", "dump", "--spider", "books", str(path), "--json")
    assert dumped.code == 0, dumped
    summary = json.loads(dumped.out)
    assert summary["items"] == len(items)
    assert summary["file_bytes"] == path.stat().st_size
    assert summary["sha256"] == hashlib.sha256(path.read_bytes()[:-32]).hexdigest()
    assert not path.with_name("books.dump.partial").exists()
    assert scrapy(project, "bloom", "reset", "--spider", "books", "--yes").code == 0
    assert redis_client.dbsize() == 0
    # Into a Redis Cluster: the same filter, bit for bit, and every item in it.
    cluster = [
        "-s",
        f"BLOOMFILTER_REDIS_URL={redis_cluster_url}",
        "-s",
        "BLOOMFILTER_REDIS_CLUSTER=1",
    ]
    restored = scrapy(project, "bloom", "restore", "--spider", "books", *cluster, str(path))
    assert restored.code == 0, restored
    assert "Restored the Bloom filter 'books:bloomfilter'" in restored.out
    after = json.loads(
        scrapy(project, "bloom", "info", "--spider", "books", *cluster, "--json").out
    )
    same = ("id", "bits_set", "bits_set_per_shard", "capacity", "total_added", "hash_count")
    assert {k: after[k] for k in same} == {k: before[k] for k in same}
    check = scrapy(project, "bloom", "check", "--spider", "books", *cluster, stdin="\n".join(items))
    assert f"{len(items):,} present, 0 absent" in check.out
    # Restoring over it again is refused: the key is taken.
    again = scrapy(project, "bloom", "restore", "--spider", "books", *cluster, str(path))
    assert "already a Bloom filter" in one_line_error(again, 1)
    assert "(--replace)" in again.err
    replaced = scrapy(
        project, "bloom", "restore", "--spider", "books", *cluster, str(path), "--replace"
    )
    assert "deleted first (--replace)" in replaced.out, replaced


def test_a_dump_goes_to_a_regular_file_or_is_refused(
    project: Path, redis_client: redis.Redis, tmp_path: Path
) -> None:
    # FILE.partial was renamed over whatever FILE was: a pipe or a device became a file no
    # one read, a symlink was replaced and its target never written, '-' made a file named
    # '-'; all with "Dumped ...", exit 0 (a probe).
    stored_filter(redis_client, "books:bloomfilter", fingerprints(200))
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    for target, said in [
        (str(pipe), "is not a regular file (a device, a pipe)"),
        (str(tmp_path), "is a directory"),
        ("-", "A dump goes to a file"),
    ]:
        refused = scrapy(project, "bloom", "dump", "--spider", "books", target)
        assert said in one_line_error(refused, 1)
    assert pipe.is_fifo()
    real, link = tmp_path / "real.dump", tmp_path / "link.dump"
    link.symlink_to(real)
    dumped = scrapy(project, "bloom", "dump", "--spider", "books", str(link))
    assert dumped.code == 0, dumped
    assert link.is_symlink()
    assert real.stat().st_size > 0


def test_a_corrupted_dump_is_refused_and_leaves_nothing(
    project: Path, redis_client: redis.Redis, tmp_path: Path
) -> None:
    stored_filter(redis_client, "books:bloomfilter", fingerprints(2000))
    path = tmp_path / "books.dump"
    # A worker crawls: the dump is refused unless forced, and no file is left.
    bloom = RedisBloomFilter.from_config(
        redis_client, "books:bloomfilter", BloomConfig.from_settings(SIZING)
    )
    lease = bloom.lease("crawler-9:99:feed", 30.0)
    lease.renew()
    try:
        busy = scrapy(project, "bloom", "dump", "--spider", "books", str(path))
        assert "(--force)" in one_line_error(busy, 1)
        assert not path.exists()
        assert not path.with_name("books.dump.partial").exists()
        forced = scrapy(project, "bloom", "dump", "--spider", "books", str(path), "--force")
        assert "Workers held leases meanwhile" in forced.out, forced
    finally:
        lease.release()
        bloom.close()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "bad.dump"
    bad.write_bytes(bytes(data))
    result = scrapy(project, "bloom", "restore", "--key", "copy:bf", str(bad))
    assert "bad.dump" in one_line_error(result, 1)
    assert redis_client.keys("*copy:bf*") == []
    missing = scrapy(project, "bloom", "restore", "--key", "copy:bf", str(tmp_path / "none.dump"))
    assert "No such file" in one_line_error(missing, 1)


def test_parts_without_a_record_in_the_way_of_a_restore_say_that_reset_deletes_them(
    project: Path, redis_client: redis.Redis, tmp_path: Path
) -> None:
    # The parts a killed restore left (no record) refused a restore with an error ending
    # "(--replace)", and restore --replace failed with the same error.
    stored_filter(redis_client, "books:bloomfilter", fingerprints(200))
    path = str(tmp_path / "books.dump")
    assert scrapy(project, "bloom", "dump", "--spider", "books", path).code == 0
    redis_client.delete("books:bloomfilter:meta")
    kept = sorted(redis_client.keys("*"))
    for replace in ([], ["--replace"]):
        refused = scrapy(project, "bloom", "restore", "--spider", "books", path, *replace)
        err = one_line_error(refused, 1)
        assert "--replace" not in err
        assert "no config record names them, and replacing a filter does not delete them" in err
        assert "'scrapy bloom reset --key books:bloomfilter' deletes such parts" in err
        assert sorted(redis_client.keys("*")) == kept
    assert scrapy(project, "bloom", "reset", "--spider", "books", "--yes").code == 0
    assert scrapy(project, "bloom", "restore", "--spider", "books", path).code == 0
    # A filter in place, with its record: replacing it is what works.
    again = scrapy(project, "bloom", "restore", "--spider", "books", path)
    assert one_line_error(again, 1).rstrip().endswith("(--replace)")


def test_restore_from_stdin_is_refused_and_the_sizes_say_what_they_count(
    project: Path, redis_client: redis.Redis, tmp_path: Path
) -> None:
    # 'restore -' failed with "-: No such file or directory" (dump - says why); dump printed
    # the file's size and restore the data's, both unlabelled.
    stored_filter(redis_client, "books:bloomfilter", fingerprints(200))
    path = tmp_path / "books.dump"
    dumped = scrapy(project, "bloom", "dump", "--spider", "books", str(path))
    assert f", a {format_bytes(path.stat().st_size)} file in " in dumped.out, dumped
    stdin = scrapy(project, "bloom", "restore", "--key", "copy:bf", "-", stdin="")
    assert "A restore reads a file, twice" in one_line_error(stdin, 1)
    restored = scrapy(project, "bloom", "restore", "--key", "copy:bf", str(path))
    assert re.search(r", 200 items, [0-9.]+ [KM]iB of data in ", restored.out), restored


def test_progress_bar_on_a_terminal_only(
    project: Path, redis_client: redis.Redis, tmp_path: Path
) -> None:
    stored_filter(redis_client, "books:bloomfilter", [])
    data = write(tmp_path / "fp.txt", fingerprints(10_000))
    argv = [str(SCRAPY), "bloom", "add", "--spider", "books", data]
    # stderr a terminal (100 columns): the bar is drawn there, the result goes to stdout.
    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    process = subprocess.Popen(argv, cwd=project, stdout=subprocess.PIPE, stderr=follower)
    os.close(follower)
    drawn = b""
    with contextlib.suppress(OSError):  # EIO once the process closed the terminal
        while chunk := os.read(leader, 4096):
            drawn += chunk
    os.close(leader)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    assert b"Added 10,000 fingerprint(s)" in out
    assert b"Added: 10.0kfp [" in drawn, drawn
    # Not a terminal: no bar, stderr stays empty.
    again = scrapy(project, "bloom", "add", "--spider", "books", data)
    assert (again.code, again.err) == (0, "")
    assert "10,000 already present" in again.out


def test_info_add_check_through_sentinel(outside: Path, tmp_path: Path) -> None:
    """With the Sentinel settings (once they exist), the commands reach the named primary."""
    redis_sentinel = pytest.importorskip(
        "redis_sentinel", reason="tests/redis_sentinel.py (the Sentinel fixtures) is not here"
    )
    with redis_sentinel.SentinelGroup() as group:
        where = [
            "-s", f"BLOOMFILTER_REDIS_SENTINELS={','.join(group.addresses)}",
            "-s", f"BLOOMFILTER_REDIS_SENTINEL_SERVICE={redis_sentinel.SERVICE}",
            "--key", "watched:bf",
        ]  # fmt: skip
        data = write(tmp_path / "fp.txt", fingerprints(300))
        added = scrapy(outside, "bloom", "add", *where, "-s", "BLOOMFILTER_CAPACITY=10000", data)
        assert "300 new" in added.out, added
        assert f"{redis_sentinel.SERVICE} (Sentinel)" in added.out
        assert group.primary().client().exists("watched:bf:meta")
        info = json.loads(scrapy(outside, "bloom", "info", *where, "--json").out)
        assert info["total_added"] == 300
        check = scrapy(outside, "bloom", "check", *where, data)
        assert "300 present, 0 absent" in check.out, check
