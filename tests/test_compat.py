"""The compatibility matrix: one compact, real scenario on every kind of server.

Each test runs once per row of :data:`compat_servers.KINDS` (Redis 6.2, Redis 7.0,
Valkey 9.1, Redis 7.0 with RedisBloom), on a real server of that kind started for the
module: the version the filter reads at open, check-and-add answers, growth past
capacity, a TTL window filter, the backend ``auto`` picks (and ``native`` refused
where BF.* is missing), the CLI's ``info`` and a crawl through scrapy-redis's Scheduler.
A kind absent here is skipped, saying what is missing; CI requires them all
(``SRB_COMPAT_REQUIRE``). The Scrapy axis (oldest and newest supported versions) is
``.ci/run``'s: it runs this module again in a virtualenv of the oldest versions.
"""

from __future__ import annotations

import collections
import hashlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from cli_run import run_json
from compat_servers import KINDS, ServerKind, locate, required
from redis_server import RedisServer
from test_crawl import assert_finished, assert_site_crawled_once, crawl
from website import Site, SiteServer

from scrapy_redis_bloom import BloomConfig
from scrapy_redis_bloom.core.errors import AccessDeniedError, UnsupportedServerError
from scrapy_redis_bloom.engine import health
from scrapy_redis_bloom.engine.backend import make_filter
from scrapy_redis_bloom.engine.native.filter import NativeBloomFilter

KEY = "compat:bloomfilter"
#: Pages of the crawled site: a crawl takes a second or two.
PAGES = 120


def fingerprints(n: int, tag: str) -> list[str]:
    return [hashlib.sha1(f"{tag}-{i}".encode()).hexdigest() for i in range(n)]


def config(**more: Any) -> BloomConfig:
    return BloomConfig.from_settings(
        {"BLOOMFILTER_CAPACITY": 10_000, "BLOOMFILTER_ERROR_RATE": 1e-3, **more}
    )


def upper(queries: int, rate: float) -> float:
    """Return the most false positives ``queries`` new elements give at ``rate`` (6 sigma)."""
    return queries * rate + 6 * math.sqrt(queries * rate * (1 - rate))


@pytest.fixture(scope="module", params=KINDS, ids=[kind.name for kind in KINDS])
def kind(request: pytest.FixtureRequest) -> ServerKind:
    """Return a row of the matrix; skip it (fail, if SRB_COMPAT_REQUIRE names it) if absent."""
    row: ServerKind = request.param
    found, why = locate(row)
    if found is None:
        if row.name in required():
            pytest.fail(f"SRB_COMPAT_REQUIRE names {row.name}, which is missing: {why}")
        pytest.skip(why)
    return row


@pytest.fixture(scope="module")
def redis_server(kind: ServerKind) -> Iterator[RedisServer]:
    """Start the row's server for the module: conftest's ``redis_client`` then uses it."""
    found, _ = locate(kind)
    assert found is not None
    with RedisServer(*found.args, binary=found.binary) as started:
        yield started


def test_the_filter_reads_the_servers_version_at_open(
    kind: ServerKind, redis_client: redis.Redis
) -> None:
    bloom = make_filter([redis_client], KEY, config())
    bloom.open()
    (surveyed,) = health.survey(bloom.executor, bloom.topology)
    bloom.close()
    info = redis_client.info("server")
    assert surveyed.known
    assert surveyed.version >= health.MIN_VERSION
    if kind.name.startswith("valkey"):
        # Valkey answers as the Redis it is compatible with, and names itself apart.
        assert info["server_name"] == "valkey"
        assert str(info["valkey_version"]).startswith("9.1.")
        assert surveyed.version == (7, 2, 4)
        assert surveyed.product == f"Valkey {info['valkey_version']}"
    else:
        assert surveyed.version[:2] == kind.version
        assert surveyed.product == f"Redis {info['redis_version']}"


def test_a_command_refused_inside_the_script_later_is_named(
    kind: ServerKind, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """Each server words an ACL refusal inside a script its own way; each is named.

    (Valkey 9.1 says "ACL failure in script: User ... has no permissions to run": it
    reached users as a plain BloomFilterError, without the grant line.)
    """
    redis_client.execute_command(
        "ACL", "SETUSER", "compat", "on", ">pw", f"~{KEY}*", f"~{{{KEY}:*", "+@all"
    )
    user = redis.Redis(port=redis_server.port, username="compat", password="pw")
    bloom = make_filter([user], KEY, config())
    try:
        lease = bloom.lease("w1", ttl=30)
        assert lease.renew() == 0
        redis_client.execute_command("ACL", "SETUSER", "compat", "-time")  # the lease script's
        with pytest.raises(AccessDeniedError, match=r"ACL SETUSER compat \+time"):
            lease.renew()
    finally:
        bloom.close()
        user.close()
        redis_client.execute_command("ACL", "DELUSER", "compat")


def test_check_and_add_answers_new_then_seen(kind: ServerKind, redis_client: redis.Redis) -> None:
    bloom = make_filter([redis_client], KEY, config())
    added = fingerprints(2_000, "added")
    assert [bloom.check_and_add(fp) for fp in added] == [False] * len(added)
    assert [bloom.check_and_add(fp) for fp in added] == [True] * len(added)
    assert all(bloom.contains_many(added))
    # The bulk path on elements never added: none taken for seen, but for false positives.
    others = fingerprints(5_000, "others")
    assert sum(bloom.contains_many(others)) <= upper(len(others), 1e-3)
    assert sum(bloom.add_many(others[:1_000])) <= upper(1_000, 1e-3)  # "there already"
    assert all(bloom.contains_many(others[:1_000]))
    bloom.close()


def test_a_filter_grows_past_its_capacity(kind: ServerKind, redis_client: redis.Redis) -> None:
    cfg = config(BLOOMFILTER_CAPACITY=500, BLOOMFILTER_ERROR_RATE=0.01, BLOOMFILTER_SHARDS=1)
    bloom = make_filter([redis_client], KEY, cfg)
    added = fingerprints(3_000, "grown")  # 6x the capacity
    new = sum(not bloom.check_and_add(fp) for fp in added)
    assert new >= len(added) - upper(len(added), 0.01)
    assert all(bloom.contains_many(added))  # never a false "new" for what is in
    assert len(bloom.state().generations) >= 3  # bitmap generations, or RedisBloom's layers
    others = fingerprints(5_000, "never")
    assert sum(bloom.contains_many(others)) <= upper(len(others), 0.01)
    bloom.close()


def test_a_ttl_window_filter_remembers_and_expires(
    kind: ServerKind, redis_client: redis.Redis
) -> None:
    ttl = 60
    bloom = make_filter([redis_client], KEY, config(BLOOMFILTER_TTL=ttl, BLOOMFILTER_SHARDS=2))
    added = fingerprints(200, "window")
    assert [bloom.check_and_add(fp) for fp in added] == [False] * len(added)
    assert all(bloom.contains_many(added))
    assert bloom.check_and_add(added[0]) is True
    # The bits live in windows that expire by themselves, within two windows:
    # {KEY:<i>}:w<w>:g<g> (bitmaps) or {KEY:<i>}:bf:<id>:w<w> (native).
    windows = [key for key in redis_client.scan_iter(match="{compat:bloomfilter:*}:*w[0-9]*")]
    assert windows
    for name in windows:
        assert 0 < redis_client.ttl(name) <= 2 * ttl
    bloom.close()


def test_auto_picks_the_backend_the_server_has(
    kind: ServerKind, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    bloom = make_filter([redis_client], KEY, config())
    assert isinstance(bloom, NativeBloomFilter) is kind.bloom
    record = bloom.open()
    assert record.backend == ("native" if kind.bloom else "bitmap")
    assert bloom.check_and_add(fingerprints(1, "one")[0]) is False
    assert bloom.check_and_add(fingerprints(1, "one")[0]) is True
    bloom.close()
    if kind.bloom:
        assert redis_client.execute_command("BF.INFO", f"{{{KEY}:0}}:bf:{record.filter_id}")
    else:
        native = config(BLOOMFILTER_BACKEND="native")
        insisting = make_filter([redis_client], "other:bloomfilter", native)
        with pytest.raises(UnsupportedServerError, match=f"127.0.0.1:{redis_server.port} has none"):
            insisting.open()
        insisting.close()


def test_cli_info_reads_the_filter(
    kind: ServerKind,
    redis_server: RedisServer,
    redis_client: redis.Redis,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bloom = make_filter([redis_client], KEY, config())
    bloom.add_many(fingerprints(1_000, "info"))
    bloom.sync_counters()
    bloom.close()
    data = run_json(capsys, "info", "--redis-url", redis_server.url, "--key", KEY)
    assert data["key"] == KEY
    assert data["capacity"] == 10_000
    # Only a native filter's JSON names its backend; a bitmap filter's lists its bits.
    assert data.get("backend", "bitmap") == ("native" if kind.bloom else "bitmap")
    assert ("bits_set" in data) is not kind.bloom
    assert data["estimated_items"] == pytest.approx(1_000, rel=0.05)
    assert data["total_added"] == 1_000


@pytest.mark.timeout(150)
def test_a_crawl_under_scrapy_redis_fetches_every_page_once(
    kind: ServerKind, redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    with SiteServer(Site(PAGES)) as site:
        result = crawl(
            site, redis_server.url, tmp_path, mode="follow", settings={"SCHEDULER_PERSIST": True}
        )
        assert_finished(result)
        reachable = site.reachable_urls()
        assert collections.Counter(result.fetched) == collections.Counter(reachable)
        if not kind.bloom:  # the bitmap's stats: BITCOUNT-derived state, exact counts
            assert_site_crawled_once(result, site)
    stats = result.stats
    assert stats["bloomfilter/backend"] == ("native" if kind.bloom else "bitmap")
    assert stats["bloomfilter/added"] == len(reachable)
    assert stats["bloomfilter/estimated_items"] == pytest.approx(len(reachable), abs=3)
    assert stats["bloomfilter/total_added"] == len(reachable)
    # The filter stays in Redis (SCHEDULER_PERSIST), recorded with its backend.
    assert redis_client.hget("site:bloomfilter:meta", "backend") == (
        b"native" if kind.bloom else b"bitmap"
    )
