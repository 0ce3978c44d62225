"""The native backend (BLOOMFILTER_BACKEND): server-side Bloom filters (BF.*) per shard.

On real servers: RedisBloom loaded into redis-server 7 (``bloom_redis_*`` fixtures, which
skip when no Bloom-capable server exists) and the plain redis-server of the suite.
False-positive bounds are binomial, as in test_generations.py.
"""

from __future__ import annotations

import hashlib
import logging
import math
import multiprocessing
import pickle
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mmh3
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis_modules import SKIP_REASON, bloom_server
from redis_server import RedisServer
from reply_cutter import Command, ReplyCutter
from waiting import until_tried

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.core.errors import (
    AccessDeniedError,
    BloomFilterError,
    ConfigMismatchError,
    FilterDamagedError,
    FilterMissingError,
    FilterUnavailableError,
    NotEnoughMemoryError,
    OrphanedShardsError,
    ServerListMismatchError,
    UnsupportedServerError,
)
from scrapy_redis_bloom.core.events import FilterEvents
from scrapy_redis_bloom.core.layout import NATIVE_TYPE
from scrapy_redis_bloom.core.record import FilterRecord
from scrapy_redis_bloom.core.settings import FaultPolicy
from scrapy_redis_bloom.core.sizing import split
from scrapy_redis_bloom.engine.backend import make_filter
from scrapy_redis_bloom.engine.native import filter as native_filter
from scrapy_redis_bloom.engine.native import ttl as native_ttl
from scrapy_redis_bloom.engine.native.filter import NativeBloomFilter
from scrapy_redis_bloom.engine.native.parts import reserve_arguments
from scrapy_redis_bloom.engine.parts import pairs

KEY = "nat"


def fingerprints(n: int, tag: str) -> list[str]:
    return [hashlib.sha1(f"{tag}-{i}".encode()).hexdigest() for i in range(n)]


def config(**more: Any) -> BloomConfig:
    return BloomConfig.from_settings(
        {"BLOOMFILTER_CAPACITY": 10_000, "BLOOMFILTER_ERROR_RATE": 1e-3, **more}
    )


def native(client: Any, key: str = KEY, events: FilterEvents | None = None, **more: Any) -> Any:
    cfg = config(BLOOMFILTER_BACKEND="native", **more)
    bloom = make_filter(
        [client], key, cfg, events=events, faults=cfg.faults, cache_size=cfg.cache_size
    )
    assert isinstance(bloom, NativeBloomFilter)
    return bloom


def upper(queries: int, rate: float) -> float:
    """Return the most false positives q new elements give at rate p, but for a 1e-9 chance."""
    return queries * rate + 6 * math.sqrt(queries * rate * (1 - rate))


class Recorder(FilterEvents):
    """Events as a dict: counts summed, values set."""

    @property
    def seen(self) -> dict[str, Any]:
        counts, values = self.read()
        return {**counts, **values}


# -- settings and the record: no server --------------------------------------------------


def test_backend_setting_is_validated() -> None:
    assert config().backend == "auto"
    assert config(BLOOMFILTER_BACKEND="native").backend == "native"
    with pytest.raises(ValueError, match=r"BLOOMFILTER_BACKEND setting \('bloom'\) is invalid"):
        config(BLOOMFILTER_BACKEND="bloom")
    assert config(BLOOMFILTER_BACKEND="native", BLOOMFILTER_TTL=3600).ttl == 3600


def test_a_record_without_backend_is_a_bitmap_filter_and_native_has_layout_4() -> None:
    cfg = config()
    bitmap = FilterRecord.new(cfg.spec, cfg.capacity, "x")
    fields = bitmap.fields()
    assert "reserved_rate" not in fields  # a native record's only
    del fields["backend"]
    assert FilterRecord.parse("k:meta", fields).backend == "bitmap"
    native_cfg = config(BLOOMFILTER_BACKEND="native")  # unblocked: native has no blocks
    nat = FilterRecord.new(native_cfg.spec, cfg.capacity, "x", backend="native")
    assert nat.fields()["layout"] == "4"  # releases reading layouts 2 and 3 refuse it
    assert FilterRecord.parse("k:meta", nat.fields()) == nat
    wrong = {**nat.fields(), "layout": "2"}
    with pytest.raises(BloomFilterError, match=r"backend \('native'\) and its layout \('2'\)"):
        FilterRecord.parse("k:meta", wrong)
    with pytest.raises(BloomFilterError, match="backend is 'bf'"):
        FilterRecord.parse("k:meta", {**nat.fields(), "backend": "bf"})


def test_a_native_record_says_the_rate_its_shards_were_reserved_at() -> None:
    """Layout 4 carries ``reserved_rate``; layout 3 (earlier builds) has none: the bare rate."""
    native_cfg = config(BLOOMFILTER_BACKEND="native", BLOOMFILTER_ERROR_RATE=1e-4)
    nat = FilterRecord.new(
        native_cfg.spec, 10_000, native_cfg.sizing.canonical(), expansion=2, backend="native"
    )
    fields = nat.fields()
    assert float(fields["reserved_rate"]) == nat.reserved_rate == nat.shard_rate
    assert nat.target_rate == 1e-4
    # As earlier builds wrote it: layout 3, no reserved_rate; its shards hold the bare rate.
    bare = {name: value for name, value in fields.items() if name != "reserved_rate"}
    old = FilterRecord.parse("k:meta", {**bare, "layout": "3"})
    assert (old.layout, old.reserved_rate, old.shard_rate) == (3, None, 1e-4)
    assert reserve_arguments(old)[0] == 1e-4
    assert old.fields() == {**bare, "layout": "3"}
    with pytest.raises(BloomFilterError, match=r"layout \('4'\) and its reserved_rate \('none'\)"):
        FilterRecord.parse("k:meta", bare)
    with pytest.raises(BloomFilterError, match=r"layout \('3'\) and its reserved_rate"):
        FilterRecord.parse("k:meta", {**fields, "layout": "3"})
    for wrong in ("0", "1", "nan", "-1e-4", "x"):
        with pytest.raises(BloomFilterError, match=f"its reserved_rate is '{wrong}', not a"):
            FilterRecord.parse("k:meta", {**fields, "reserved_rate": wrong})
    with pytest.raises(BloomFilterError, match=r"reads layout 2 \(bitmap\) or 3 or 4 \(native"):
        FilterRecord.parse("k:meta", {**fields, "layout": "5"})


def test_reserve_gives_the_first_sub_filter_the_bitmaps_rate_share() -> None:
    from scrapy_redis_bloom.core.sizing import native_reserve_rate

    cfg = config(BLOOMFILTER_BACKEND="native", BLOOMFILTER_SHARDS=4)
    grown = FilterRecord.new(
        cfg.spec, 10_000, cfg.sizing.canonical(), expansion=2, backend="native"
    )
    rate, capacity, options = reserve_arguments(grown)
    assert grown.reserved_rate == rate  # the record's
    # RedisBloom halves it for the first sub-filter (1 - tightening); less its index excess.
    assert rate == native_reserve_rate(capacity, 1e-3, 2)
    assert 0.9e-3 < rate < 1e-3
    assert capacity == grown.growth.first_capacity
    assert options == (b"EXPANSION", 2)
    fixed_cfg = config(BLOOMFILTER_BACKEND="native", BLOOMFILTER_SHARDS=4, BLOOMFILTER_EXPANSION=0)
    sizing = fixed_cfg.sizing.canonical()
    fixed = FilterRecord.new(fixed_cfg.spec, 10_000, sizing, backend="native")
    shards = fixed.spec.shards
    share = fixed.growth.native_capacity  # with headroom: the fullest shard's
    assert share > math.ceil(10_000 / shards)
    wanted = (native_reserve_rate(share, 1e-3, 0), share, (b"NONSCALING",))
    assert reserve_arguments(fixed) == wanted


# -- choosing the backend ---------------------------------------------------------------


def test_auto_picks_native_where_bf_exists_and_records_it(
    bloom_redis_client: redis.Redis,
) -> None:
    events = Recorder()
    bloom = make_filter([bloom_redis_client], KEY, config(), events=events)
    assert isinstance(bloom, NativeBloomFilter)
    record = bloom.open()
    assert record.backend == "native"
    assert events.seen["backend"] == "native"
    assert bloom_redis_client.hget(f"{KEY}:meta", "backend") == b"native"
    assert bloom_redis_client.type(bloom.shard_keys[0]) == NATIVE_TYPE.encode()
    # A second worker: auto adopts the record; explicit bitmap is refused naming both.
    again = make_filter([bloom_redis_client], KEY, config())
    assert isinstance(again, NativeBloomFilter)
    assert again.open().filter_id == record.filter_id
    other = make_filter([bloom_redis_client], KEY, config(BLOOMFILTER_BACKEND="bitmap"))
    with pytest.raises(ConfigMismatchError, match=r"BLOOMFILTER_BACKEND = 'native'.*'bitmap'"):
        other.open()
    for b in (bloom, again, other):
        b.close()


def test_auto_picks_bitmap_where_bf_is_missing(
    bloom_redis_client: redis.Redis, redis_client: redis.Redis
) -> None:
    ttl = make_filter([bloom_redis_client], KEY, config(BLOOMFILTER_BACKEND="bitmap"))
    assert ttl.open().backend == "bitmap"
    plain = make_filter([redis_client], KEY, config())
    assert isinstance(plain, RedisBloomFilter)
    plain.open()
    # A bitmap filter's record wins over auto, and refuses an explicit native.
    assert isinstance(make_filter([bloom_redis_client], KEY, config()), RedisBloomFilter)
    explicit = make_filter([bloom_redis_client], KEY, config(BLOOMFILTER_BACKEND="native"))
    with pytest.raises(ConfigMismatchError, match=r"BLOOMFILTER_BACKEND = 'bitmap'.*'native'"):
        explicit.open()
    for b in (ttl, plain, explicit):
        b.close()


def test_native_on_a_server_without_bf_is_refused_naming_it(redis_client: redis.Redis) -> None:
    bloom = make_filter([redis_client], KEY, config(BLOOMFILTER_BACKEND="native"))
    port = redis_client.connection_pool.connection_kwargs["port"]
    with pytest.raises(UnsupportedServerError) as caught:
        bloom.open()
    message = str(caught.value)
    assert f":{port} has none" in message
    assert "RedisBloom" in message
    assert "\n" not in message
    assert redis_client.keys("*") == []  # nothing was created
    bloom.close()


def test_auto_takes_bitmaps_for_a_filter_sized_by_bits_and_says_why(
    bloom_redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """As for BLOOMFILTER_BLOCKED = True: BF.RESERVE has no bits or k, so BIT would not apply."""
    for settings_ in ({"BLOOMFILTER_BIT": 20}, {"BLOOMFILTER_HASH_NUMBER": 4}):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="scrapy_redis_bloom"):
            bloom = make_filter([bloom_redis_client], KEY, BloomConfig.from_settings(settings_))
        assert isinstance(bloom, RedisBloomFilter)
        said = [r for r in caplog.records if "BLOOMFILTER_BACKEND = 'auto'" in r.message]
        assert len(said) == 1, caplog.text
        assert said[0].levelno == logging.INFO
        name = next(iter(settings_))
        assert f"picks the bitmap backend for the Bloom filter {KEY!r}: {name}" in said[0].message
        bloom.close()
    # Unsized, the defaults (BIT 30, k 6) only give a capacity: native is taken.
    unsized = make_filter([bloom_redis_client], KEY, BloomConfig.from_settings({}))
    assert isinstance(unsized, NativeBloomFilter)
    unsized.close()
    assert bloom_redis_client.keys("*") == []


def test_a_native_filter_sized_by_bits_earlier_warns_that_they_do_not_apply(
    bloom_redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A record an earlier release made under 'auto' from BIT: 'auto' adopts it, and says so."""
    sized = BloomConfig.from_settings({"BLOOMFILTER_BIT": 20})
    earlier = NativeBloomFilter.from_config([bloom_redis_client], KEY, sized.for_native())
    earlier.open()
    earlier.close()
    with caplog.at_level(logging.INFO, logger="scrapy_redis_bloom"):
        bloom = make_filter([bloom_redis_client], KEY, sized)
    assert isinstance(bloom, NativeBloomFilter)
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1, caplog.text
    assert re.search(
        r"BLOOMFILTER_BIT does not apply to the native Bloom filter 'nat'", warned[0].getMessage()
    )
    bloom.close()


def test_the_startup_line_says_the_geometry_bf_reserve_gave(
    bloom_redis_server: RedisServer,
    bloom_redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Not the bitmap geometry of the settings: RedisBloom sizes each shard by capacity and rate."""
    from scrapy.settings import Settings

    from scrapy_redis_bloom.dupefilter import RFPDupeFilter

    settings_ = {
        "REDIS_URL": bloom_redis_server.url,
        "BLOOMFILTER_KEY": KEY,
        "BLOOMFILTER_BACKEND": "native",
        "BLOOMFILTER_CAPACITY": 100_000,
        "BLOOMFILTER_ERROR_RATE": 1e-3,
    }
    with caplog.at_level(logging.INFO, logger="scrapy_redis_bloom"):
        df = RFPDupeFilter.from_settings(Settings(settings_))
    df.close("finished")
    line = next(r.getMessage() for r in caplog.records if "(id " in r.getMessage())
    keys = bloom_redis_client.keys(f"{{{KEY}:*}}:bf:*")
    # A dict with the newest redis-py, a flat list with the oldest.
    infos = [pairs(bloom_redis_client.execute_command("BF.INFO", k)) for k in keys]
    capacity = int(infos[0]["Capacity"])
    assert {info["Capacity"] for info in infos} == {str(capacity)}
    assert f"{len(keys)} native Bloom filter(s) (BF.RESERVE {capacity:,} items at error" in line
    bits = int(re.search(r"m=([0-9,]+) bits", line)[1].replace(",", ""))  # type: ignore[index]
    size = sum(int(info["Size"]) for info in infos) * 8  # BF.INFO's Size adds a header per filter
    assert size - 2048 * len(keys) < bits <= size
    assert "k=11 hash functions" in line  # ceil(-log2(1e-3 / 2)): the first sub-filter's


def test_native_on_a_bitmap_filter_without_bf_says_the_record_is_bitmap(
    redis_client: redis.Redis,
) -> None:
    make_filter([redis_client], KEY, config(BLOOMFILTER_BACKEND="bitmap")).open()
    bloom = make_filter([redis_client], KEY, config(BLOOMFILTER_BACKEND="native"))
    with pytest.raises(UnsupportedServerError) as caught:
        bloom.open()
    message = str(caught.value)
    assert "is native" not in message
    assert f"The Bloom filter {KEY!r} is a bitmap filter (its record says so)" in message
    assert "BLOOMFILTER_BACKEND = 'auto' (it adopts the filter's backend) or 'bitmap'" in message
    bloom.close()


def test_redis_bloom_filter_from_config_is_the_bitmap_backends_only(
    bloom_redis_client: redis.Redis,
) -> None:
    """The public class: it never makes a native filter, and says so, not 'set auto'."""
    with pytest.raises(ValueError, match=r"RedisBloomFilter is the bitmap backend's") as caught:
        RedisBloomFilter.from_config(bloom_redis_client, KEY, config(BLOOMFILTER_BACKEND="native"))
    assert "scrapy_redis_bloom.dupefilter.RFPDupeFilter" in str(caught.value)
    assert bloom_redis_client.keys("*") == []
    made = native(bloom_redis_client)
    made.open()
    made.close()
    said = rf"{KEY!r} is native \(its record says so\), and RedisBloomFilter is the bitmap"
    for backend in ("auto", "bitmap"):
        cfg = config(BLOOMFILTER_BACKEND=backend)
        bloom = RedisBloomFilter.from_config(bloom_redis_client, KEY, cfg)
        with pytest.raises(ConfigMismatchError, match=said) as mismatch:
            bloom.open()
        assert "set BLOOMFILTER_BACKEND" not in str(mismatch.value)
        bloom.close()
    # Nor does its pickling error send a native filter's user there.
    nat = native(bloom_redis_client)
    with pytest.raises(TypeError, match=r"instead \(a Scrapy dupefilter with the same settings\)"):
        pickle.dumps(nat)
    nat.close()


# -- the answer contract ----------------------------------------------------------------


def test_check_and_add_new_then_seen_and_stats(bloom_redis_client: redis.Redis) -> None:
    events = Recorder()
    bloom = native(bloom_redis_client, events=events)
    fps = fingerprints(500, "a")
    assert [bloom.check_and_add(fp) for fp in fps] == [False] * 500
    assert [bloom.check_and_add(fp) for fp in fps] == [True] * 500
    state = bloom.state()
    assert state.estimated_items == 500
    assert len(state.generations) == 1
    assert 0 < state.estimated_fpr < 1e-3
    assert state.memory_bytes > 0
    bloom.sync_counters()
    assert bloom.totals().added == 500
    bloom.close()


def test_reads_of_a_missing_native_filter_create_nothing(bloom_redis_client: redis.Redis) -> None:
    """Reads of no filter raise FilterMissingError; ``estimate`` makes no Redis call.

    They opened it creating it: every shard reserved whole under a mistyped key.
    """
    key = "nat-missing"
    for read in (
        lambda bf: bf.contains("a" * 40),
        lambda bf: bf.contains_many(["a" * 40]),
        lambda bf: bf.state(),
        lambda bf: bf.shard_keys,
        lambda bf: bf.existing(),
    ):
        with pytest.raises(FilterMissingError, match="There is no Bloom filter"):
            read(native(bloom_redis_client, key))
    bloom = native(bloom_redis_client, key)
    trips = bloom.round_trips  # (making it asks the server for BF.*)
    state = bloom.estimate(500)
    assert bloom.round_trips == trips
    assert state.estimated_items == 500
    assert bloom_redis_client.keys(f"*{key}*") == []
    bloom.open()
    assert bloom.estimate(500) == state
    assert native(bloom_redis_client, key).contains("a" * 40) is False
    bloom.clear()
    bloom.close()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.sampled_from(fingerprints(60, "h")), max_size=120))
def test_bulk_equals_one_at_a_time(bloom_redis_client: redis.Redis, items: list[str]) -> None:
    bloom_redis_client.flushall()
    # Three shards: a shard count that is not a power of two catches a bulk path that
    # places elements otherwise than the hot path.
    one = native(bloom_redis_client, key="one", BLOOMFILTER_CACHE_SIZE=0, BLOOMFILTER_SHARDS=3)
    bulk = native(bloom_redis_client, key="bulk", BLOOMFILTER_CACHE_SIZE=0, BLOOMFILTER_SHARDS=3)
    one.open()  # (no items: no check creates it, and a read of no filter raises)
    singly = [one.check_and_add(fp) for fp in items]
    assert bulk.add_many(items) == singly
    assert bulk.contains_many(items) == [True] * len(items)
    assert one.contains_many(items) == [True] * len(items)  # found where the hot path put it
    assert [bulk.check_and_add(fp) for fp in items] == [True] * len(items)
    assert bulk.contains_many(fingerprints(5, "absent")) == [False] * 5
    one.close()
    bulk.close()


def test_a_bulk_call_refused_part_way_counts_what_it_wrote(
    bloom_redis_server: RedisServer,
    bloom_redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Shard 1's key refused by an ACL: the call raises, shard 0's items written are counted.

    Chunks run shard by shard, a chunk per batch here: shard 0's were written before shard
    1's refusal (they were lost from the stats).
    """
    monkeypatch.setattr(native_filter, "CHUNK", 50)
    monkeypatch.setattr(native_filter, "BATCH", 1)
    bloom_redis_client.flushall()
    bloom_redis_client.execute_command("ACL", "SETUSER", "part", "on", ">pw", "~*", "+@all")
    user = redis.Redis(port=bloom_redis_server.port, username="part", password="pw")
    bloom = native(user, key="part", BLOOMFILTER_CACHE_SIZE=0, BLOOMFILTER_SHARDS=2)
    bloom.open()
    keys = [k.decode() for k in bloom_redis_client.keys("*")]
    refused = bloom.shard_keys[1]
    assert refused in keys
    allowed = [f"~{k}" for k in keys if k != refused]
    bloom_redis_client.execute_command("ACL", "SETUSER", "part", "resetkeys", *allowed)
    fps = fingerprints(400, "part")
    with pytest.raises(AccessDeniedError):
        bloom.add_many(fps)
    bloom_redis_client.execute_command("ACL", "SETUSER", "part", "~*")
    on_shard_0 = [fp for fp in fps if mmh3.hash64(fp, signed=False)[0] % 2 == 0]
    assert 100 < len(on_shard_0) < 300  # (about half: Binomial(400, 1/2))
    assert bloom.contains_many(on_shard_0) == [True] * len(on_shard_0)
    counted = bloom.sync_counters()
    assert counted is not None
    assert (counted.added, counted.seen) == (len(on_shard_0), 0)
    bloom.close()
    user.close()
    bloom_redis_client.execute_command("ACL", "DELUSER", "part")


def _race(url: str, fps: list[str], start: Any, out: Any) -> None:
    client = redis.Redis.from_url(url)
    bloom = make_filter([client], KEY, config(BLOOMFILTER_BACKEND="native"))
    bloom.open()
    start.wait()
    out.put([fp for fp in fps if not bloom.check_and_add(fp)])
    bloom.close()


def test_workers_racing_on_the_same_fingerprints_each_is_new_to_exactly_one(
    bloom_redis_server: RedisServer, bloom_redis_client: redis.Redis
) -> None:
    fps = fingerprints(3000, "race")
    native(bloom_redis_client).open()
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    workers = [
        ctx.Process(target=_race, args=(bloom_redis_server.url, fps, start, out)) for _ in range(3)
    ]
    for w in workers:
        w.start()
    time.sleep(2)
    start.set()
    new = [fp for _ in workers for fp in out.get(timeout=60)]
    for w in workers:
        w.join(30)
    assert sorted(new) == sorted(fps)  # every one new to exactly one worker


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fill", [1, 4, 10])
def test_growth_keeps_the_false_positive_rate_under_the_configured_one(
    bloom_redis_client: redis.Redis, fill: int
) -> None:
    rate, capacity, queries = 1e-2, 2_000, 20_000
    cfg = BloomConfig.from_settings(
        {
            "BLOOMFILTER_CAPACITY": capacity,
            "BLOOMFILTER_ERROR_RATE": rate,
            "BLOOMFILTER_SHARDS": 2,
            "BLOOMFILTER_BACKEND": "native",
        }
    )
    bloom = make_filter([bloom_redis_client], KEY, cfg)
    added = bloom.add_many(fingerprints(capacity * fill, "grow"))
    assert sum(added) <= upper(len(added), rate)
    false_positives = sum(bloom.contains_many(fingerprints(queries, "query")))
    assert false_positives <= upper(queries, rate)
    generations = len(bloom.state().generations)
    assert generations == (1 if fill == 1 else 3 if fill == 4 else 4)
    bloom.close()


@pytest.mark.timeout(180)
def test_small_shards_grown_keep_the_error_rate_and_say_it(
    bloom_redis_client: redis.Redis,
) -> None:
    """RedisBloom's probes ``(a + i b) mod m`` meet in a small filter: about 6 / (k m) more.

    10,000 items at 1e-4 in 13 shards (as earlier builds split them; now by
    BLOOMFILTER_SHARDS) are shards of 802 items: handed the bare rate, 8 times full they
    answered 1.29e-4 (515 of 4,000,000 new URLs), their estimate said 8.8e-5. Bounds are
    binomial, 4 sigma (a 3e-5 chance each): under the target, and about the estimate.
    """
    rate, capacity, queries = 1e-4, 10_000, 3_000_000
    bloom = native(
        bloom_redis_client,
        BLOOMFILTER_CAPACITY=capacity,
        BLOOMFILTER_ERROR_RATE=rate,
        BLOOMFILTER_SHARDS=13,
    )
    bloom.add_many(fingerprints(8 * capacity, "small-shards"))
    assert bloom.record.spec.shards > 8  # the case: shards of under 1,000 items each
    assert len(bloom.state().generations) == 4
    hits = sum(bloom.contains_many(fingerprints(queries, "small-shards-new")))
    estimate = bloom.state().estimated_fpr
    assert hits <= queries * rate + 4 * math.sqrt(queries * rate), (hits, estimate)
    spread = 4 * math.sqrt(queries * estimate)
    assert abs(hits - queries * estimate) <= spread, (hits, estimate)
    bloom.close()


def test_a_shard_too_small_for_its_rate_is_warned_of(
    bloom_redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A first sub-filter of 10 items cannot keep 1e-3 at any rate RedisBloom is handed."""
    for capacity, warned in ((10, True), (60, False)):
        bloom = native(bloom_redis_client, f"tiny{capacity}", BLOOMFILTER_CAPACITY=capacity)
        record = bloom.open()
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            bloom.describe_geometry(config(BLOOMFILTER_CAPACITY=capacity), record)
        said = [r.getMessage() for r in caplog.records if "cannot keep" in r.getMessage()]
        assert bool(said) == warned, said
        bloom.close()


@pytest.mark.parametrize(
    ("capacity", "rate", "shards"),
    [(10_000, 1e-5, 1), (100_000, 1e-6, 1), (1_000_000, 1e-7, 1), (10_000_000, 1e-4, 4)],
)
@pytest.mark.parametrize("backend", ["native", "auto"])
def test_a_native_filter_takes_as_few_shards_as_its_shard_size_allows(
    bloom_redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    capacity: int,
    rate: float,
    shards: int,
    backend: str,
) -> None:
    """Its shard count is not the bitmap allocator's: small shards cannot keep the rate.

    Earlier builds split it as a bitmap filter: 100,000 at 1e-6 made 31 shards of 3,226
    items, which cannot keep 1e-6 (2.9e-6 measured grown 8x) and said so at startup; 10,000 at
    1e-5 made 19 shards. Each shard is at most 2**26 bits (BLOOMFILTER_SHARD_BIT's default).
    """
    from scrapy_redis_bloom.engine.native import parts as native_parts

    more = {"BLOOMFILTER_CAPACITY": capacity, "BLOOMFILTER_ERROR_RATE": rate}
    cfg = config(BLOOMFILTER_BACKEND=backend, **more)
    bloom = make_filter([bloom_redis_client], f"few{capacity}", cfg)
    assert isinstance(bloom, NativeBloomFilter)
    with caplog.at_level(logging.WARNING):
        record = bloom.open()
        bloom.describe_geometry(cfg.for_native(), record)
    assert record.spec.shards == shards
    assert (shards - 1) * 2**26 < record.spec.bits <= shards * 2**26
    assert native_parts.reachable(record)
    assert "error rate" not in caplog.text, caplog.text
    assert len(bloom.shard_keys) == shards
    bloom.close()


@pytest.mark.parametrize("backend", ["native", "auto"])
def test_a_native_shard_holds_its_first_sub_filter_within_its_shard_size(
    bloom_redis_client: redis.Redis, backend: str
) -> None:
    """Counted in what BF.RESERVE makes, not the bitmap's bits: no allocator class wasted.

    100,000 @ 1e-4 in shards of 2**20 bits was 2 shards whose first sub-filters took 1.05
    Mbit each (131 KiB: jemalloc's 160 KiB class). At the default 2**26 bits, the default
    filter's 16 shards of 8.06 MiB (and every 1B-URL filter's) were reserved as 10 MiB each.
    """
    from scrapy_redis_bloom.engine.native import parts as native_parts

    cfg = config(
        BLOOMFILTER_BACKEND=backend,
        BLOOMFILTER_CAPACITY=100_000,
        BLOOMFILTER_ERROR_RATE=1e-4,
        BLOOMFILTER_SHARD_BIT=20,
    )
    bloom = make_filter([bloom_redis_client], "fits", cfg)
    assert isinstance(bloom, NativeBloomFilter)
    record = bloom.open()
    assert record.spec.shards == 3
    first = native_parts.links(record, 1)[0]
    assert first.bits <= 2**20
    for key in bloom.shard_keys:  # what the server made: its bit array and a small header
        info = pairs(bloom_redis_client.execute_command("BF.INFO", key))
        assert int(info["Capacity"]) == record.growth.native_capacity
        size = int(info["Size"])
        assert 0 <= size - first.bits // 8 <= 256, (key, size)  # the model is the server's
        assert size <= 2**20 // 8 + 256, (key, size)
    bloom.close()
    # Every size a user runs fits too: the default sizing and 1B URLs, growing or fixed.
    for more in ({}, {"BLOOMFILTER_CAPACITY": 1_000_000_000, "BLOOMFILTER_ERROR_RATE": 1e-4}):
        for expansion in (0, 2):
            big = config(BLOOMFILTER_BACKEND="native", BLOOMFILTER_EXPANSION=expansion, **more)
            record = big.record("native")
            assert native_parts.links(record, 1)[0].bits <= 2**26 - 1024, (more, expansion)


def reserved_size(client: redis.Redis, rate: float, capacity: int, *options: Any) -> int:
    """Return ``BF.INFO``'s Size of a filter ``BF.RESERVE``'d so (a key made and deleted)."""
    client.execute_command("BF.RESERVE", "reference", repr(rate), capacity, *options)
    size = int(pairs(client.execute_command("BF.INFO", "reference"))["Size"])
    client.delete("reference")
    return size


@pytest.mark.timeout(180)
def test_a_filter_an_earlier_build_reserved_at_the_bare_rate_is_described_by_it(
    bloom_redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Its record (layout 3, no reserved_rate) and shards written as earlier builds wrote them.

    A worker describes the shards as they are (``BF.RESERVE 802 1e-4``: m=214,916 bits, not
    the 227,370 of this release's rate, 5.63e-5), warns that they pass the rate, and estimates
    what they answer: 8 times full, 1.31e-4 measured, while the Bloom formula alone said 8.8e-5
    and the rate this release reserves at, 8.9e-5. 4 sigma bounds (binomial).
    """
    from scrapy_redis_bloom.engine.native.parts import shard_key

    rate, capacity, queries = 1e-4, 10_000, 3_000_000
    cfg = config(
        BLOOMFILTER_BACKEND="native", BLOOMFILTER_CAPACITY=capacity, BLOOMFILTER_ERROR_RATE=rate
    )
    # Earlier builds split a native filter as a bitmap one (13 shards here): a worker of this
    # release, which would make one shard, keeps the record's 13.
    assert cfg.spec.shards == 1
    earlier = split(*cfg.sizing.geometry(), None, None)
    made = FilterRecord.new(
        earlier, capacity, cfg.sizing.canonical(), expansion=cfg.expansion, backend="native"
    )
    fields = {**made.fields(), "layout": "3", "state": "ready"}
    fields.pop("reserved_rate", None)
    first = made.growth.native_capacity
    for shard in range(made.spec.shards):
        key = shard_key(KEY, shard, made.filter_id)
        bloom_redis_client.execute_command("BF.RESERVE", key, repr(rate), first, "EXPANSION", 2)
    bloom_redis_client.hset(f"{KEY}:meta", mapping=fields)
    bare = reserved_size(bloom_redis_client, rate, first, "EXPANSION", 2)

    bloom = native(bloom_redis_client, BLOOMFILTER_CAPACITY=capacity, BLOOMFILTER_ERROR_RATE=rate)
    with caplog.at_level(logging.WARNING):
        record = bloom.open()  # not "a Bloom filter reserved otherwise"
        line = bloom.describe_geometry(cfg, record)
    assert record.filter_id == made.filter_id
    shards = made.spec.shards
    assert shards > 8  # the case: shards of under 1,000 items each
    assert f"(BF.RESERVE {first:,} items at error rate 0.0001 each)" in line, line
    bits = int(re.search(r"m=([0-9,]+) bits", line)[1].replace(",", ""))  # type: ignore[index]
    assert bare * 8 - 2048 < bits // shards <= bare * 8  # BF.INFO's Size adds a header
    said = [r.getMessage() for r in caplog.records if "passes its error rate" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert "reserved at error rate 0.0001 (by an earlier build: layout 3)" in said[0]

    bloom.add_many(fingerprints(8 * capacity, "earlier"))
    hits = sum(bloom.contains_many(fingerprints(queries, "earlier-new")))
    estimate = bloom.state().estimated_fpr
    assert abs(hits - queries * estimate) <= 4 * math.sqrt(queries * estimate), (hits, estimate)
    assert estimate > 1.2 * rate  # its own excess: not the estimate of shards that keep the rate
    bloom.close()


def test_a_new_filters_record_says_its_reserved_rate_and_every_reader_takes_it(
    bloom_redis_server: RedisServer,
    bloom_redis_client: redis.Redis,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A native record says the rate its shards were reserved at, and every reader takes it.

    Never worked out again (a later release may work it out otherwise): by a second worker,
    its check of the shards' ``BF.INFO``, its startup line, and ``info``.
    """
    from dataclasses import replace

    from cli_run import run, run_json

    more = {"BLOOMFILTER_CAPACITY": 10_000, "BLOOMFILTER_ERROR_RATE": 1e-4}
    bloom = native(bloom_redis_client, **more)
    record = bloom.open()
    first = record.growth.native_capacity
    stored = bloom_redis_client.hget(f"{KEY}:meta", "reserved_rate")
    assert stored is not None
    assert bloom_redis_client.hget(f"{KEY}:meta", "layout") == b"4"
    from scrapy_redis_bloom.core.sizing import native_reserve_rate

    assert float(stored) == native_reserve_rate(first, 1e-4, 2) < 1e-4
    bloom.close()
    # A filter whose record says another rate, as a later release might reserve at.
    other = native(bloom_redis_client, "later", **more)
    other.wanted = replace(other.wanted, reserved_rate=3e-5)
    other.open()
    size = reserved_size(bloom_redis_client, 3e-5, first, "EXPANSION", 2)
    keys = bloom_redis_client.keys("{later:*}:bf:*")
    sizes = {int(pairs(bloom_redis_client.execute_command("BF.INFO", k))["Size"]) for k in keys}
    assert sizes == {size}
    other.close()
    second = native(bloom_redis_client, "later", **more)
    opened = second.open()  # its shards are the record's: not "reserved otherwise"
    assert opened.reserved_rate == 3e-5
    assert "items at error rate 3e-05 each" in second.describe_geometry(config(**more), opened)
    second.close()
    target = ("--redis-url", bloom_redis_server.url, "--key", "later")
    info = run_json(capsys, "info", *target)
    assert (info["reserved_rate"], info["reserved_capacity"], info["layout"]) == (3e-5, first, 4)
    code, out, _ = run(capsys, "info", *target)
    assert code == 0
    assert f"{first:,} items at error rate 3e-05" in out


# -- faults -----------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["raise", "recreate"])
def test_a_shard_deleted_mid_crawl(bloom_redis_client: redis.Redis, policy: str) -> None:
    events = Recorder()
    bloom = native(bloom_redis_client, events=events, BLOOMFILTER_ON_LOSS=policy)
    fps = fingerprints(200, "loss")
    bloom.add_many(fps)
    bloom_redis_client.delete(*bloom.shard_keys)
    if policy == "raise":
        with pytest.raises(FilterDamagedError, match="are gone"):
            bloom.check_and_add(fps[0])
        with pytest.raises(FilterDamagedError, match="are gone"):
            bloom.add_many(fps)
        return
    assert bloom.check_and_add(fps[0]) is False  # the shard is recreated empty
    assert events.seen["recreated"] >= 1
    assert bloom.add_many(fps[1:]) == [False] * 199  # the others, recreated by bulk
    assert all(bloom_redis_client.type(k) == NATIVE_TYPE.encode() for k in bloom.shard_keys)
    bloom.close()


@pytest.mark.parametrize("policy", ["raise", "recreate"])
def test_a_shard_deleted_is_met_by_reads_too(bloom_redis_client: redis.Redis, policy: str) -> None:
    # BF.MEXISTS answers 0 for a missing key: contains() and contains_many() said "absent"
    # for every element of an evicted shard (5,058 of 20,000 in a probe), with no error, no
    # log, no stat, where the writes raise or recreate by BLOOMFILTER_ON_LOSS.
    events = Recorder()
    bloom = native(bloom_redis_client, events=events, BLOOMFILTER_ON_LOSS=policy)
    fps = fingerprints(200, "readloss")
    bloom.add_many(fps)
    bloom_redis_client.delete(*bloom.shard_keys)
    if policy == "raise":
        with pytest.raises(FilterDamagedError, match="are gone"):
            bloom.contains_many(fps)
        with pytest.raises(FilterDamagedError, match="are gone"):
            bloom.contains(fps[0])
        return
    assert bloom.contains_many(fps) == [False] * len(fps)  # recreated empty, and said
    assert events.seen["recreated"] >= 1
    bloom.close()


def test_a_read_whose_type_is_refused_raises_naming_the_command(
    bloom_redis_server: RedisServer, bloom_redis_client: redis.Redis
) -> None:
    # The TYPE that tells a lost shard from an empty answer: an ACL that took it away (then
    # EXISTS) left the reads answering "absent" for a lost shard, with no error, log or stat.
    # (Opening the filter reads its shards' types too: refused there first.)
    fps = fingerprints(50, "acltype")
    native(bloom_redis_client).add_many(fps)
    bloom_redis_client.execute_command(
        "ACL", "SETUSER", "reader", "on", ">pw", "~*", "+@all", "-type"
    )
    user = redis.Redis(port=bloom_redis_server.port, username="reader", password="pw")
    try:
        bloom = native(user)
        refused = r"could not .*: a Redis ACL .* run the 'type' command"
        with pytest.raises(AccessDeniedError, match=refused):
            bloom.contains_many(fps)
        with pytest.raises(AccessDeniedError, match=refused):
            bloom.contains(fps[0])
    finally:
        user.close()
        bloom_redis_client.execute_command("ACL", "DELUSER", "reader")


def test_a_filter_reset_and_created_again_is_adopted_by_a_recreating_worker(
    bloom_redis_client: redis.Redis,
) -> None:
    # A native shard's key carries its filter's id: a worker that recreated its lost shard
    # (ON_LOSS = "recreate") during a reset never met the filter created after it, and went
    # on adding to its own orphaned shard (0 of 2,000 URLs in the current filter, a probe).
    events = Recorder()
    stale = native(bloom_redis_client, events=events, BLOOMFILTER_ON_LOSS="recreate")
    stale.check_and_add(fingerprints(1, "warm")[0])
    bloom_redis_client.delete(*stale.shard_keys)  # a reset: the shards first
    stale.check_and_add(fingerprints(1, "between")[0])  # recreated under the old id
    bloom_redis_client.delete(f"{KEY}:meta", f"{KEY}:count")  # the record last
    current = native(bloom_redis_client)  # the filter created again
    current.check_and_add(fingerprints(1, "current")[0])
    stale.check_and_add(fingerprints(1, "counted")[0])
    stale.sync_counters()  # about once a second in a crawl
    assert stale.record.filter_id == current.record.filter_id
    assert events.seen["reopened"] == 1
    urls = fingerprints(100, "after")
    assert stale.add_many(urls) == [False] * len(urls)
    assert current.contains_many(urls) == [True] * len(urls)
    stale.close()
    current.close()


def test_a_lost_record_is_never_replaced_by_a_second_filter(
    bloom_redis_client: redis.Redis,
) -> None:
    # A native shard's key carries its filter's id, which only the record holds: a worker
    # that found the record gone created a second filter beside the first without a word,
    # and took its URLs for new (1,000 of 1,000, a probe); the running one then said the
    # filter "was reset and created again".
    events = Recorder()
    first = native(bloom_redis_client, events=events)
    urls = fingerprints(100, "lost")
    assert first.add_many(urls) == [False] * 100
    assert first.sync_counters() is not None
    bloom_redis_client.delete(f"{KEY}:meta")
    with pytest.raises(OrphanedShardsError, match=r"'nat:count' remain \(100 added\).*restores"):
        native(bloom_redis_client).open()
    assert bloom_redis_client.exists(f"{KEY}:meta") == 0
    assert first.check_and_add(fingerprints(1, "more")[0]) is False
    first.sync_counters()  # about once a second in a crawl: it restores the record
    assert events.seen["restored"] == 1
    again = native(bloom_redis_client)
    assert again.open().filter_id == first.record.filter_id
    assert again.contains_many(urls) == [True] * 100
    for b in (first, again):
        b.close()


def test_auto_takes_the_bitmap_shards_of_a_lost_record(bloom_redis_client: redis.Redis) -> None:
    # With no record to say the backend, auto picked native where BF.* exists and created a
    # native filter beside the intact bitmap shards (0 of 1,000 URLs seen, a probe).
    first = make_filter([bloom_redis_client], KEY, config(BLOOMFILTER_BACKEND="bitmap"))
    urls = fingerprints(100, "bitmap")
    assert first.add_many(urls) == [False] * 100
    bloom_redis_client.delete(f"{KEY}:meta")
    again = make_filter([bloom_redis_client], KEY, config())
    assert isinstance(again, RedisBloomFilter)
    assert again.open().filter_id == first.record.filter_id  # restored from the shards
    assert again.contains_many(urls) == [True] * 100
    for b in (first, again):
        b.close()


@pytest.mark.parametrize("policy", ["raise", "recreate"])
def test_flushall_mid_crawl(bloom_redis_client: redis.Redis, policy: str) -> None:
    events = Recorder()
    bloom = native(bloom_redis_client, events=events, BLOOMFILTER_ON_LOSS=policy)
    bloom.add_many(fingerprints(100, "flush"))
    bloom_redis_client.flushall()
    if policy == "raise":
        with pytest.raises(FilterDamagedError):
            bloom.check_and_add("x" * 40)
        return
    assert bloom.check_and_add(fingerprints(1, "flush")[0]) is False
    assert events.seen["restored"] == 1
    assert bloom_redis_client.hget(f"{KEY}:meta", "backend") == b"native"
    bloom.close()


def test_a_filter_reset_and_recreated_elsewhere_is_adopted(
    bloom_redis_client: redis.Redis,
) -> None:
    events = Recorder()
    first = native(bloom_redis_client, events=events, BLOOMFILTER_CACHE_SIZE=0)
    first.check_and_add("a" * 40)
    second = native(bloom_redis_client)
    second.clear()
    assert bloom_redis_client.keys("*") == []
    second.open()
    assert first.check_and_add("a" * 40) is False  # the new filter never saw it
    assert events.seen["reopened"] == 1
    for b in (first, second):
        b.close()


def test_clear_deletes_only_the_filters_bloom_filters(bloom_redis_client: redis.Redis) -> None:
    bloom = native(bloom_redis_client)
    bloom.check_and_add("a" * 40)
    keys = bloom.shard_keys
    bloom_redis_client.delete(keys[0])
    bloom_redis_client.set(keys[0], "not ours")
    bloom_redis_client.set("other", "1")
    bloom.clear()
    assert sorted(bloom_redis_client.keys("*")) == sorted([keys[0].encode(), b"other"])


def test_client_kill_during_checks_never_answers_seen_for_a_new_fingerprint(
    bloom_redis_server: RedisServer, bloom_redis_client: redis.Redis
) -> None:
    events = Recorder()
    bloom = native(bloom_redis_client, events=events, BLOOMFILTER_CACHE_SIZE=0)
    fps = fingerprints(4000, "kill")
    with bloom_redis_server.connection_killer(interval=0.002) as killer:
        answers = [bloom.check_and_add(fp) for fp in fps]
    assert killer.killed > 0
    assert not any(answers)  # every one was new
    assert bloom.contains_many(fps) == [True] * len(fps)  # and every one is in
    bloom.close()


@pytest.fixture
def small_bloom_server() -> Iterator[RedisServer]:
    found = bloom_server()
    if found is None:
        pytest.skip(SKIP_REASON)
    binary, module = found
    with RedisServer(
        "--loadmodule", module, "--maxmemory-policy", "noeviction", binary=binary
    ) as server:
        yield server


def test_out_of_memory_while_a_shard_must_scale_is_an_error_never_an_answer(
    small_bloom_server: RedisServer,
) -> None:
    client = small_bloom_server.client()
    bloom = native(client, BLOOMFILTER_RETRY_TIMEOUT=0.5)
    fps = fingerprints(10_000, "oom")
    assert bloom.add_many(fps) == [False] * len(fps)
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used + 4096)
    answers: list[bool] = []

    def fill() -> None:  # the shard must scale: its second sub-filter passes maxmemory
        for fp in fingerprints(20_000, "more"):
            answers.append(bloom.check_and_add(fp))

    with pytest.raises(FilterUnavailableError, match="out of memory"):
        fill()
    assert len(answers) < 20_000
    assert sum(answers) <= upper(len(answers), 1e-3)  # only false positives were "seen"
    client.config_set("maxmemory", 0)
    assert len(bloom.state().generations) == 2
    assert bloom.contains_many(fps) == [True] * len(fps)
    bloom.close()
    client.close()


@pytest.mark.parametrize(
    ("reserve", "differs"),
    [
        ((0.9, None), r"\d[\d,]* bytes \(the record's error rate"),
        ((1e-3, 10), r"capacity 10 in 1 sub-filter\(s\)"),
        ((1e-3, None, "NONSCALING"), r"NONSCALING \(the record says EXPANSION 2\)"),
        ((1e-3, None, "EXPANSION", 4), r"EXPANSION 4 \(the record says EXPANSION 2\)"),
    ],
)
def test_a_shard_reserved_otherwise_is_refused_naming_what_differs(
    bloom_redis_client: redis.Redis, reserve: tuple[Any, ...], differs: str
) -> None:
    """A shard replaced by another BF.RESERVE would answer by its own rate: never used.

    (At 0.9, about half of new URLs would be answered "seen".) Found at open and by recovery,
    as a foreign bitmap shard is: FilterDamagedError naming the key and what differs.
    """
    bloom = native(bloom_redis_client, BLOOMFILTER_SHARDS=4)
    assert bloom.add_many(fingerprints(100, "old")) == [False] * 100
    record = bloom.record
    _, capacity, _ = reserve_arguments(record)
    key = bloom.shard_keys[2]
    bloom_redis_client.delete(key)
    rate, cap, *options = reserve
    bloom_redis_client.execute_command("BF.RESERVE", key, rate, cap or capacity, *options)
    shard = rf"'\{{nat:2\}}:bf:{record.filter_id}' on [^:]+:\d+"
    where = rf"{shard}: a Bloom filter reserved otherwise: {differs}"
    for policy in ("raise", "recreate"):
        with pytest.raises(FilterDamagedError, match=where):
            native(bloom_redis_client, BLOOMFILTER_SHARDS=4, BLOOMFILTER_ON_LOSS=policy).open()
    with pytest.raises(FilterDamagedError, match=where):  # recovery, once the shard is met
        bloom.lifecycle.recover(record, [2], record)
    assert int(bloom_redis_client.execute_command("BF.CARD", key)) == 0  # never overwritten
    bloom.close()


def test_a_shard_replaced_by_a_fixed_size_one_mid_crawl_is_named_when_full(
    bloom_redis_client: redis.Redis,
) -> None:
    """Full, a growing filter's shard was replaced: said so, not blamed on the settings."""
    bloom = native(bloom_redis_client, BLOOMFILTER_SHARDS=1)
    assert bloom.check_and_add("a" * 40) is False
    key = bloom.shard_keys[0]
    bloom_redis_client.delete(key)
    bloom_redis_client.execute_command("BF.RESERVE", key, 1e-3, 1, "NONSCALING")
    bloom_redis_client.execute_command("BF.ADD", key, "other")
    replaced = rf"Shard '{re.escape(key)}' .* is full: it does not grow, though .*EXPANSION = 2"
    with pytest.raises(FilterDamagedError, match=replaced):
        bloom.check_and_add("b" * 40)
    bloom.close()


def test_a_grown_shard_matches_its_record(bloom_redis_client: redis.Redis) -> None:
    """A shard that grew sub-filters as RedisBloom grows them is the filter's own."""
    bloom = native(bloom_redis_client, BLOOMFILTER_CAPACITY=1000, BLOOMFILTER_SHARDS=1)
    answers = bloom.add_many(fingerprints(5000, "grow"))
    assert sum(answers) <= upper(5000, 1e-3)
    assert len(bloom.state().generations) >= 3
    again = native(bloom_redis_client, BLOOMFILTER_CAPACITY=1000, BLOOMFILTER_SHARDS=1)
    again.open()
    again.close()
    bloom.close()


@pytest.mark.parametrize(("capacity", "shards", "items"), [(2000, 1, 10_000), (4000, 4, 8000)])
def test_growth_is_said_and_counted_as_the_bitmaps_is(
    bloom_redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    capacity: int,
    shards: int,
    items: int,
) -> None:
    """RedisBloom grows a shard unseen: the counters tell it (INFO, ``grown``, ``generations``).

    Two workers share the items; their ``grown`` add up to the sub-filters started. The sizes
    are far from any threshold's spread (4 shards of 2,000 items each are past their first
    sub-filter's 1,000 + 4 sigma by 20 sigma, far short of the second's), so it is exact.
    """
    more = {"BLOOMFILTER_CAPACITY": capacity, "BLOOMFILTER_SHARDS": shards}
    one, two = Recorder(), Recorder()
    first = native(bloom_redis_client, events=one, **more)
    second = native(bloom_redis_client, events=two, **more)
    fps = fingerprints(items, "grows")
    with caplog.at_level(logging.INFO, logger="scrapy_redis_bloom"):
        first.add_many(fps[: items // 2])
        second.add_many(fps[items // 2 :])
    replies = [bloom_redis_client.execute_command("BF.INFO", k) for k in first.shard_keys]
    # A dict from newer redis-py; a flat list of names and values from the oldest (7.0.0).
    infos = [r if isinstance(r, dict) else dict(zip(r[::2], r[1::2], strict=True)) for r in replies]
    started = sum(int(info[b"Number of filters"]) - 1 for info in infos)
    assert started >= shards
    assert one.seen.get("grown", 0) + two.seen.get("grown", 0) == started
    most = max(int(info[b"Number of filters"]) for info in infos)
    assert max(one.seen.get("generations", 1), two.seen["generations"]) == most
    said = [r.getMessage() for r in caplog.records if "grows" in r.getMessage()]
    assert said, caplog.records
    assert all(line.startswith("The native Bloom filter 'nat' grows: about") for line in said)
    first.close()
    second.close()


@pytest.mark.parametrize("ttl", [0, 3600])
def test_a_filter_that_does_not_fit_is_refused_before_anything_is_written(
    small_bloom_server: RedisServer, ttl: int
) -> None:
    """As for bitmaps: NotEnoughMemoryError with the numbers, and no record nor shard left."""
    client = small_bloom_server.client()
    client.config_set("maxmemory", 30 * 2**20)
    with pytest.raises(NotEnoughMemoryError, match=r"needs .*maxmemory 30\.0 MiB"):
        native(client, BLOOMFILTER_CAPACITY=100_000_000, BLOOMFILTER_TTL=ttl).open()
    assert client.keys("*") == []
    # One that fits is made (its sub-filters are sized as counted).
    bloom = native(client, BLOOMFILTER_CAPACITY=1_000_000, BLOOMFILTER_TTL=ttl)
    assert bloom.add_many(["a", "b"]) == [False, False]
    bloom.close()
    client.close()


def test_a_full_fixed_size_shard_is_an_error_never_an_answer(
    bloom_redis_client: redis.Redis,
) -> None:
    """A shard made ``NONSCALING`` (``BLOOMFILTER_EXPANSION = 0``) refuses new items once full.

    RedisBloom then refuses the item: raised, naming the shard and what to do, and counted
    (``full``), one at a time and in bulk: never "new" nor "seen". What it holds is still
    answered.
    """
    fixed = {"BLOOMFILTER_EXPANSION": 0, "BLOOMFILTER_CAPACITY": 100, "BLOOMFILTER_SHARDS": 1}
    bloom = native(bloom_redis_client, **fixed)
    fps = fingerprints(300, "full")
    answers: list[bool] = []
    full = r"Shard '\{nat:0\}:bf:\w+' of the native Bloom filter 'nat' is full: .* Reset it"

    def fill() -> None:
        for fp in fps:
            answers.append(bloom.check_and_add(fp))

    with pytest.raises(BloomFilterError, match=full):
        fill()
    held = int(bloom_redis_client.execute_command("BF.CARD", bloom.shard_keys[0]))
    assert answers.count(False) == held >= 100  # refused only once it held its capacity
    assert sum(answers) <= upper(len(answers), 1e-3)
    with pytest.raises(BloomFilterError, match=full):
        bloom.add_many(fps[:10] + fps[-10:])
    assert bloom.events.counts["full"] == 2
    assert bloom.contains_many(fps[: len(answers)]) == [True] * len(answers)
    assert bloom.add_many(fps[:10]) == [True] * 10
    bloom.close()


@pytest.mark.parametrize(("capacity", "shards"), [(1000, 4), (20_000, 16)])
def test_a_fixed_size_filter_takes_its_capacity_and_says_when_near_it(
    bloom_redis_client: redis.Redis, caplog: pytest.LogCaptureFixture, capacity: int, shards: int
) -> None:
    """URLs spread unevenly over the shards: each has headroom for the fullest one's share.

    Reserved with their bare share, the fullest of 4 shards refused the 934th of 1,000 URLs
    (the crawl stopped, unwarned). Past 90% of the capacity a WARNING says so, once.
    """
    events = Recorder()
    more = {"BLOOMFILTER_CAPACITY": capacity, "BLOOMFILTER_SHARDS": shards}
    bloom = native(bloom_redis_client, events=events, BLOOMFILTER_EXPANSION=0, **more)
    fps = fingerprints(capacity, f"fixed{shards}")
    near = int(0.9 * capacity)
    bloom.add_many(fps[: near - 1])
    bloom.sync_counters()
    assert "near_full" not in events.seen
    with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
        answers = [bloom.check_and_add(fp) for fp in fps[near - 1 : near + 1]]
        answers += bloom.add_many(fps[near + 1 :])
        bloom.sync_counters()
    assert sum(answers) <= upper(capacity, 1e-3)
    said = [r.getMessage() for r in caplog.records if "does not grow" in r.getMessage()]
    assert len(said) == 1, said
    assert f"of its capacity of {capacity:,}" in said[0]
    assert events.seen["near_full"] == 1
    cards = [int(bloom_redis_client.execute_command("BF.CARD", k)) for k in bloom.shard_keys]
    assert max(cards) > capacity / shards  # the fullest shard went past its bare share
    bloom.close()


def test_a_fixed_size_filter_reserved_without_headroom_is_still_its_own(
    bloom_redis_client: redis.Redis,
) -> None:
    """Shards an earlier release reserved with the bare share are used as they are."""
    fixed = {"BLOOMFILTER_EXPANSION": 0, "BLOOMFILTER_CAPACITY": 1000, "BLOOMFILTER_SHARDS": 4}
    bloom = native(bloom_redis_client, **fixed)
    bloom.open()
    record = bloom.record
    rate, capacity, _ = reserve_arguments(record)
    assert capacity > 250
    for key in bloom.shard_keys:
        bloom_redis_client.delete(key)
        bloom_redis_client.execute_command("BF.RESERVE", key, rate, 250, "NONSCALING")
    again = native(bloom_redis_client, **fixed)
    again.open()
    fps = fingerprints(100, "legacy")
    assert again.add_many(fps) == [False] * 100
    assert again.contains_many(fps) == [True] * 100
    again.close()
    bloom.close()


def test_restart_without_persistence(small_bloom_server: RedisServer) -> None:
    client = small_bloom_server.client()
    strict = native(client)
    lenient = native(client, key=KEY, BLOOMFILTER_ON_LOSS="recreate")
    strict.add_many(fingerprints(50, "restart"))
    lenient.open()
    small_bloom_server.kill()
    small_bloom_server.restart()
    with pytest.raises(FilterDamagedError):
        strict.check_and_add("b" * 40)
    assert lenient.check_and_add("b" * 40) is False
    assert strict.check_and_add("b" * 40) is True  # the lenient worker restored it
    for b in (strict, lenient):
        b.close()
    client.close()


# -- a real crawl -----------------------------------------------------------------------


@pytest.mark.timeout(150)
@pytest.mark.parametrize("backend", ["native", "auto"])
def test_a_crawl_on_the_native_backend_fetches_every_page_once(
    bloom_redis_server: RedisServer, bloom_redis_client: redis.Redis, tmp_path: Path, backend: str
) -> None:
    from test_crawl import assert_finished, crawl
    from website import Site, SiteServer

    with SiteServer(Site(120)) as site:
        result = crawl(
            site,
            bloom_redis_server.url,
            tmp_path,
            mode="follow",
            settings={"SCHEDULER_PERSIST": True, "BLOOMFILTER_BACKEND": backend},
        )
        assert_finished(result)
        reachable = site.reachable_urls()
        assert sorted(result.fetched) == sorted(reachable)
    stats = result.stats
    assert stats["bloomfilter/backend"] == "native"
    assert stats["bloomfilter/added"] == len(reachable)
    assert stats["bloomfilter/filtered"] > len(reachable)
    assert stats["bloomfilter/estimated_items"] == len(reachable)
    assert stats["bloomfilter/generations"] == 1
    # The server's own sizing: 100,000 items in one shard, reserved at 8.2e-7 to keep 1e-6
    # with RedisBloom's excess (growing: 4.1e-7 for the first sub-filter, so k = 22).
    assert stats["bloomfilter/hash_functions"] == 22
    assert 100_000 * 30 < stats["bloomfilter/bits"] < 100_000 * 33  # shards get headroom
    # Nearly empty: the Bloom formula's 1e-20s, and RedisBloom's index excess (meeting probes).
    assert 0 < stats["bloomfilter/estimated_fpr"] < 1e-12
    assert stats["bloomfilter/memory_bytes"] > 0
    assert bloom_redis_client.hget("site:bloomfilter:meta", "backend") == b"native"


def test_threads_share_one_native_filter(bloom_redis_client: redis.Redis) -> None:
    bloom = native(bloom_redis_client)
    fps = fingerprints(400, "threads")
    new: list[str] = []
    lock = threading.Lock()

    def run() -> None:
        for fp in fps:
            if not bloom.check_and_add(fp):
                with lock:
                    new.append(fp)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(new) == sorted(fps)
    bloom.close()


# -- the CLI ----------------------------------------------------------------------------


def test_cli_info_add_check_and_reset_on_a_native_filter(
    capsys: pytest.CaptureFixture[str],
    bloom_redis_server: RedisServer,
    bloom_redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    from cli_run import run, run_json, write_lines

    url = bloom_redis_server.url
    target = ("--redis-url", url, "--key", KEY)
    bloom = native(bloom_redis_client)
    bloom.add_many(fingerprints(300, "cli"))
    bloom.close()
    info = run_json(capsys, "info", *target)
    assert info["backend"] == "native"
    assert (info["estimated_items"], info["shards_missing"], info["generations"]) == (300, 0, 1)
    assert info["total_added"] == 300
    assert info["memory_bytes"] > 0
    # Each layout's memory and Redis time at the filter's capacity and rate: this one native.
    layouts = {entry["layout"]: entry for entry in info["layouts"]}
    assert list(layouts) == ["classic", "blocked", "native"]
    assert [name for name, entry in layouts.items() if entry["current"]] == ["native"]
    assert layouts["blocked"]["memory_bytes"] > layouts["classic"]["memory_bytes"]
    more = write_lines(tmp_path / "more.txt", fingerprints(310, "cli"))
    added = run_json(capsys, "add", *target, more)
    assert (added["new"], added["already_present"]) == (10, 300)
    checked = run_json(capsys, "check", *target, more)
    assert (checked["present"], checked["absent"]) == (310, 0)
    bloom_redis_client.set("other", "1")
    code, out, err = run(capsys, "reset", *target, "--yes")
    assert (code, err) == (0, ""), err
    assert "1 shard key(s)" in out or f"{bloom.spec.shards} shard key(s)" in out
    assert bloom_redis_client.keys("*") == [b"other"]


def test_bulk_packs_any_text_and_bytes(bloom_redis_client: redis.Redis) -> None:
    one = native(bloom_redis_client, key="one", BLOOMFILTER_CACHE_SIZE=0)
    bulk = native(bloom_redis_client, key="bulk", BLOOMFILTER_CACHE_SIZE=0)
    items: list[str | bytes] = ["é", b"\x00\xff\r\n", "ab", "abc", "ab", b"ab", "", "é"]
    assert bulk.add_many(items) == [one.check_and_add(item) for item in items]
    assert bulk.add_many(items) == [True] * len(items)
    one.close()
    bulk.close()


@pytest.fixture
def two_bloom_servers() -> Iterator[list[RedisServer]]:
    found = bloom_server()
    if found is None:
        pytest.skip(SKIP_REASON)
    binary, module = found
    with (
        RedisServer("--loadmodule", module, binary=binary) as first,
        RedisServer("--loadmodule", module, binary=binary) as second,
    ):
        yield [first, second]


def test_shards_spread_over_servers_in_their_listed_order(
    two_bloom_servers: list[RedisServer],
) -> None:
    clients = [server.client() for server in two_bloom_servers]
    cfg = config(BLOOMFILTER_BACKEND="auto", BLOOMFILTER_SHARDS=4)
    bloom = make_filter(clients, KEY, cfg)
    assert isinstance(bloom, NativeBloomFilter)
    fps = fingerprints(400, "spread")
    assert bloom.add_many(fps) == [False] * 400
    keys = bloom.shard_keys
    for i, client in enumerate(clients):  # shard i on server i mod 2
        assert sorted(client.keys("{nat:*}:bf:*")) == sorted(k.encode() for k in keys[i::2])
    assert [bloom.check_and_add(fp) for fp in fps] == [True] * 400
    swapped = make_filter(clients[::-1], KEY, cfg)
    with pytest.raises(ServerListMismatchError, match="lists it as server"):
        swapped.open()
    bloom.clear()
    assert [client.keys("*") for client in clients] == [[], []]
    for closing in (bloom, swapped, *clients):
        closing.close()


def test_a_native_filter_on_two_servers_recovers_as_a_bitmap_one(
    two_bloom_servers: list[RedisServer],
) -> None:
    """The lifecycle both backends share: a lost marker restored, an emptied server's part."""
    clients = [server.client() for server in two_bloom_servers]
    cfg = config(BLOOMFILTER_BACKEND="native", BLOOMFILTER_SHARDS=4)
    bloom = make_filter(clients, KEY, cfg)
    fps = fingerprints(200, "two")
    bloom.add_many(fps)
    marker = clients[1].get(f"{KEY}:server")
    clients[1].delete(f"{KEY}:server")  # evicted alone: the shards there are intact
    events = Recorder()
    again = make_filter(clients, KEY, cfg, events=events)
    assert again.contains_many(fps) == [True] * 200
    assert clients[1].get(f"{KEY}:server") == marker
    assert events.seen["restored"] == 1
    clients[1].flushall()  # server 1 emptied: its shards and its marker
    with pytest.raises(FilterDamagedError, match="emptied or replaced"):
        make_filter(clients, KEY, cfg).open()
    events = Recorder()
    lenient = make_filter(clients, KEY, cfg, events=events, faults=FaultPolicy(on_loss="recreate"))
    lenient.open()
    assert events.seen["recreated"] == 2  # shards 1 and 3
    assert clients[1].get(f"{KEY}:server") == marker
    for closing in (bloom, again, lenient, *clients):
        closing.close()


def test_a_server_that_lost_redisbloom_is_named_alone_with_what_helps(
    capsys: pytest.CaptureFixture[str], two_bloom_servers: list[RedisServer]
) -> None:
    from cli_run import run

    # The second server restarted without RedisBloom: a running worker was told "Redis at
    # A, B refused ... unknown command 'BF.INSERT'"; a new one with the default 'auto' was
    # told "BLOOMFILTER_BACKEND = 'native' needs BF.* ... or set BLOOMFILTER_BACKEND =
    # 'bitmap' (or 'auto')": a value it never set, and two settings that do not help.
    first, second = two_bloom_servers
    urls = [first.url, second.url]
    cfg = config(BLOOMFILTER_SHARDS=4, BLOOMFILTER_RETRY_TIMEOUT=1)
    running = make_filter([redis.Redis.from_url(u) for u in urls], KEY, cfg, cache_size=0)
    assert isinstance(running, NativeBloomFilter)
    running.add_many(fingerprints(100, "before"))
    binary = bloom_server()
    assert binary is not None
    second.stop()
    plain = RedisServer(port=second.port, binary=binary[0]).start()  # no --loadmodule
    try:
        with pytest.raises(BloomFilterError) as caught:
            [running.check_and_add(fp) for fp in fingerprints(20, "after")]
        message = str(caught.value)
        assert f"Redis at 127.0.0.1:{second.port} refused" in message, message
        assert str(first.port) not in message
        assert "BF.INSERT" in message
        auto = make_filter([redis.Redis.from_url(u) for u in urls], KEY, cfg)
        with pytest.raises(UnsupportedServerError) as caught:
            auto.open()
        message = str(caught.value)
        assert f"127.0.0.1:{second.port} has no Bloom filter commands" in message, message
        assert "its record says" in message
        assert "set BLOOMFILTER_BACKEND" not in message
        assert "another BLOOMFILTER_KEY" in message
        auto.close()
        # What it says helps: the reset needs no BF.*, then 'auto' takes the bitmaps.
        targets = ("--redis-url", urls[0], "--redis-url", urls[1], "--key", KEY)
        code, _, err = run(capsys, "reset", *targets, "--yes")
        assert (code, err) == (0, ""), err
        again = make_filter([redis.Redis.from_url(u) for u in urls], KEY, cfg)
        assert again.check_and_add("x") is False
        assert again.backend == "bitmap"
        again.close()
    finally:
        running.close()
        plain.stop()


def test_a_foreign_key_where_a_native_shard_belongs_is_never_overwritten(
    bloom_redis_client: redis.Redis,
) -> None:
    bloom = native(bloom_redis_client)
    bloom.check_and_add("a" * 40)
    keys = bloom.shard_keys
    bloom_redis_client.delete(keys[0])
    bloom_redis_client.set(keys[0], "not ours")
    with pytest.raises(FilterDamagedError, match=r"holds .* a string\. It is\s+never overwritten"):
        native(bloom_redis_client, BLOOMFILTER_ON_LOSS="recreate").open()
    assert bloom_redis_client.get(keys[0]) == b"not ours"
    bloom.close()


@pytest.mark.parametrize("policy", ["raise", "recreate"])
def test_a_shard_overwritten_mid_crawl_is_refused_by_reads_and_writes(
    bloom_redis_client: redis.Redis, policy: str
) -> None:
    # BF.MEXISTS answers 0 on a key of another type, and the EXISTS sent beside it said 1:
    # contains_many() answered "absent" for every element the overwritten shard held, with
    # no error, log or stat; check_and_add() said the key should be "a string".
    bloom = native(bloom_redis_client, BLOOMFILTER_SHARDS=1, BLOOMFILTER_ON_LOSS=policy)
    fps = fingerprints(100, "overwritten")
    bloom.add_many(fps)
    (key,) = bloom.shard_keys
    bloom_redis_client.delete(key)
    bloom_redis_client.set(key, "written by another program")
    foreign = r"holds .* a string\. It is\s+never overwritten"
    with pytest.raises(FilterDamagedError, match=foreign):
        bloom.contains_many(fps)
    with pytest.raises(FilterDamagedError, match=foreign):
        bloom.contains(fps[0])
    with pytest.raises(BloomFilterError) as caught:
        bloom.check_and_add("new")
    message = str(caught.value)
    assert "holds a string" in message
    assert "(a string)" not in message, message
    assert "Bloom filter, BF.*" in message
    assert bloom_redis_client.get(key) == b"written by another program"
    bloom.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ttl", [0, 3600])
def test_a_cluster_of_bloom_capable_masters(monkeypatch: pytest.MonkeyPatch, ttl: int) -> None:
    from redis.crc import key_slot
    from redis_cluster import RedisClusterNodes

    found = bloom_server()
    if found is None:
        pytest.skip(SKIP_REASON)
    binary, module = found
    monkeypatch.setenv("SRB_REDIS_SERVER", binary)
    with RedisClusterNodes(extra_args=("--loadmodule", module)) as nodes:
        client = nodes.client()
        bloom = make_filter(client, KEY, config(BLOOMFILTER_SHARDS=6, BLOOMFILTER_TTL=ttl))
        assert isinstance(bloom, NativeBloomFilter)  # auto: every master has BF.*
        fps = fingerprints(600, "cluster")
        assert bloom.add_many(fps) == [False] * 600
        assert [bloom.check_and_add(fp) for fp in fps] == [True] * 600
        masters = {
            bloom.topology.route(key, shard, None).address
            for shard, key in enumerate(bloom.shard_keys)
        }
        assert len(masters) > 1  # the hash tags spread shards over the masters
        for shard, key in enumerate(bloom.shard_keys):
            assert key_slot(key.encode()) == key_slot(f"{{{KEY}:{shard}}}".encode())
            assert client.type(key) == (b"string" if ttl else NATIVE_TYPE.encode())
        assert bloom.state().estimated_items == 600
        bloom.clear()
        assert client.keys("*") == []
        bloom.close()
        client.close()


def test_on_error_allow_answers_new_then_adds_what_it_let_through(
    small_bloom_server: RedisServer,
) -> None:
    client = small_bloom_server.client()
    events = Recorder()
    bloom = native(
        client,
        events=events,
        BLOOMFILTER_ON_ERROR="allow",
        BLOOMFILTER_ON_LOSS="recreate",
        BLOOMFILTER_RETRY_TIMEOUT=0.3,
    )
    bloom.open()
    small_bloom_server.kill()
    during = fingerprints(5, "down")
    assert [bloom.check_and_add(fp) for fp in during] == [False] * 5  # answered new
    assert bloom.check_and_add(during[0]) is True  # this worker remembers what it let through
    assert bloom.add_many(fingerprints(3, "down-bulk")) == [False] * 3
    assert events.seen["errors"] >= 8
    small_bloom_server.restart()  # without persistence: the filter is gone
    until_tried(bloom.executor)  # past the executor's probe interval
    assert bloom.check_and_add("c" * 40) is False
    assert events.seen["restored"] == 1
    # The requests let through were added once Redis answered again.
    assert bloom.contains_many(during) == [True] * 5
    assert bloom.contains_many(fingerprints(3, "down-bulk")) == [True] * 3
    bloom.close()
    client.close()


# -- re-crawl windows (BLOOMFILTER_TTL) --------------------------------------------------


def test_ttl_windows_remember_then_forget(bloom_redis_client: redis.Redis) -> None:
    bloom = native(bloom_redis_client, BLOOMFILTER_TTL=1, BLOOMFILTER_CACHE_SIZE=0)
    fps = fingerprints(50, "ttl")
    assert bloom.add_many(fps) == [False] * 50
    assert [bloom.check_and_add(fp) for fp in fps] == [True] * 50
    assert bloom.state().estimated_items >= 50
    anchors = bloom.shard_keys
    assert all(bloom_redis_client.type(k) == b"string" for k in anchors)
    windows = bloom_redis_client.keys("{nat:*}:bf:*:w*")
    assert windows
    assert all(0 < bloom_redis_client.pttl(k) <= 2000 for k in windows)  # expire at (w + 2) T
    time.sleep(2.2)  # past 2T: every window that held them has expired
    assert bloom.contains_many(fps) == [False] * 50
    assert [bloom.check_and_add(fp) for fp in fps] == [False] * 50  # new again
    bloom.clear()
    assert bloom_redis_client.keys("*") == []
    bloom.close()


@pytest.mark.parametrize("call", ["add_many", "check_and_add_many", "check_and_add"])
def test_ttl_a_url_seen_again_is_not_renewed(bloom_redis_client: redis.Redis, call: str) -> None:
    """Remembered at least TTL from its first add, forgotten by 2 TTL, however often seen.

    A bulk call (the script) added every item to the current window, "seen" ones too, so a
    URL requested again each second stayed seen for ever. The ages are bounds, not the time
    before a sleep: a check 1.01 s after the first add may find it forgotten (CI did).
    """
    ttl = 1
    bloom = native(bloom_redis_client, key=call, BLOOMFILTER_TTL=ttl, BLOOMFILTER_CACHE_SIZE=0)
    if call == "check_and_add":
        add: Any = lambda fps: [bloom.check_and_add(fp) for fp in fps]  # noqa: E731
    else:
        add = getattr(bloom, call)
    fps = fingerprints(20, call)
    start = time.monotonic()
    assert add(fps) == [False] * 20
    first = time.monotonic()
    # Each check's age since the first add lies between its shortest and longest bound: the
    # first add ran somewhere in [start, first], the check in [before, after].
    history: list[tuple[float, float, list[bool]]] = []
    while not history or history[-1][0] <= 2 * ttl:
        time.sleep(0.2)
        before = time.monotonic()
        seen = add(fps)
        history.append((before - first, time.monotonic() - start, seen))
    assert all(all(seen) for _, longest, seen in history if longest < 0.95 * ttl), history
    # By 2 TTL each one was forgotten once (and added again then): by the last check at latest.
    assert all(any(not seen[i] for _, _, seen in history) for i in range(len(fps))), history
    bloom.close()


def test_ttl_a_lost_reply_of_the_add_answers_new(bloom_redis_server: RedisServer) -> None:
    """A window's ``BF.INSERT`` that ran but whose reply was cut is a doubt: "new", counted.

    The retry finds the item the lost attempt added: "seen" from it would lose the page.
    """

    def window_add(command: Command, reply: bytes) -> bool:
        return command[0] == b"BF.INSERT"

    bloom_redis_server.client().flushall()
    with ReplyCutter(bloom_redis_server.port, window_add) as cutter:
        client = redis.Redis(host="127.0.0.1", port=cutter.port)
        bloom = native(client, BLOOMFILTER_TTL=3600, BLOOMFILTER_CACHE_SIZE=0)
        assert bloom.add_many(fingerprints(20, "before")) == [False] * 20
        assert bloom.check_and_add(fingerprints(21, "before")[20]) is False  # the window is known
        element = fingerprints(1, "cut")[0]
        cutter.armed = True
        assert bloom.check_and_add(element) is False
        cutter.armed = False
        assert cutter.cuts == ["BF.INSERT"]  # it ran, unanswered
        assert bloom.events.counts["ambiguous"] == 1
        assert bloom.check_and_add(element) is True
        bloom.close()
        client.close()


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.sampled_from(fingerprints(40, "ttl-h")), max_size=80))
def test_ttl_bulk_equals_one_at_a_time(bloom_redis_client: redis.Redis, items: list[str]) -> None:
    bloom_redis_client.flushall()
    more = {"BLOOMFILTER_TTL": 3600, "BLOOMFILTER_CACHE_SIZE": 0, "BLOOMFILTER_SHARDS": 3}
    one = native(bloom_redis_client, key="one", **more)
    bulk = native(bloom_redis_client, key="bulk", **more)
    one.open()  # (no items: no check creates it, and a read of no filter raises)
    assert bulk.add_many(items) == [one.check_and_add(fp) for fp in items]
    assert one.contains_many(items) == [True] * len(items)
    one.close()
    bulk.close()


@pytest.mark.parametrize("policy", ["raise", "recreate"])
def test_ttl_a_lost_window_or_anchor(bloom_redis_client: redis.Redis, policy: str) -> None:
    events = Recorder()
    bloom = native(
        bloom_redis_client,
        events=events,
        BLOOMFILTER_TTL=3600,
        BLOOMFILTER_ON_LOSS=policy,
        BLOOMFILTER_CACHE_SIZE=0,
    )
    fps = fingerprints(20, "lost")
    bloom.add_many(fps)
    bloom_redis_client.delete(*bloom_redis_client.keys("{nat:*}:bf:*:w*"))
    if policy == "raise":
        with pytest.raises(FilterDamagedError, match=r"Re-crawl window .* is gone"):
            bloom.check_and_add(fps[0])
        bloom_redis_client.delete(*bloom.shard_keys)
        with pytest.raises(FilterDamagedError, match="are gone"):
            bloom.add_many(fps)
        return
    assert bloom.check_and_add(fps[0]) is False  # passed over, counted, and added anew
    assert events.seen["recreated"] >= 1
    bloom_redis_client.delete(*bloom.shard_keys)  # the anchors: recreated empty
    assert bloom.add_many(fps[1:]) == [False] * 19
    assert bloom.contains_many(fps) == [True] * 20
    bloom.close()


def test_ttl_fp_rate_combines_the_two_windows_a_check_consults(
    bloom_redis_client: redis.Redis,
) -> None:
    # state().fpr averaged over window keys, though a check consults both live windows of
    # its shard: with both full it said 0.0125 where 1,013 of 40,000 new URLs (0.0253)
    # were answered seen. Per shard 1 - (1 - p1)(1 - p2), then the mean over shards.
    ttl = 86_400
    more = {
        "BLOOMFILTER_TTL": ttl,
        "BLOOMFILTER_SHARDS": 1,
        "BLOOMFILTER_CAPACITY": 4000,
        "BLOOMFILTER_ERROR_RATE": 0.05,
        "BLOOMFILTER_CACHE_SIZE": 0,
    }
    first = native(bloom_redis_client, **more)
    first.add_many(fingerprints(4000, "window-before"))
    (anchor,) = first.shard_keys
    first.close()
    w = int(bloom_redis_client.time()[0]) // ttl
    # What window w - 1 leaves: it holds those, and window w is not started yet.
    bloom_redis_client.rename(f"{anchor}:w{w}", f"{anchor}:w{w - 1}")
    bloom_redis_client.set(anchor, f"{w - 1} 0")
    bloom = native(bloom_redis_client, **more)
    bloom.add_many(fingerprints(4000, "window-now"))
    assert bloom_redis_client.get(anchor) == f"{w} 1".encode()
    state = bloom.state()
    queries = 40_000
    hits = sum(bloom.contains_many(fingerprints(queries, "new")))
    rate = state.estimated_fpr
    spread = 6 * math.sqrt(queries * rate * (1 - rate))  # binomial: a 1e-9 chance outside
    assert queries * rate - spread <= hits <= upper(queries, rate), (hits, rate)
    bloom.close()


def test_ttl_a_live_window_lost_is_told_by_state_and_info(
    capsys: pytest.CaptureFixture[str],
    bloom_redis_server: RedisServer,
    bloom_redis_client: redis.Redis,
) -> None:
    # `info` said "0 missing" (it looked at the anchors only; state() passed over a window
    # key gone), exit 0, while every check raised FilterDamagedError for that window.
    from cli_run import run_json

    more = {"BLOOMFILTER_TTL": 3600, "BLOOMFILTER_SHARDS": 4, "BLOOMFILTER_CACHE_SIZE": 0}
    bloom = native(bloom_redis_client, **more)
    fps = fingerprints(2000, "live-lost")
    bloom.add_many(fps)
    assert bloom.state().damaged == ()  # no window before was started: none is missing
    (lost,) = bloom_redis_client.keys(bloom.shard_keys[1] + ":w*")
    bloom_redis_client.delete(lost)
    lost_key = lost.decode()
    damaged = bloom.state().damaged
    assert [(part.shard, part.key, part.found) for part in damaged] == [(1, lost_key, "missing")]
    info = run_json(capsys, "info", "--redis-url", bloom_redis_server.url, "--key", KEY)
    assert (info["state"], info["shards_missing"], info["shards_foreign"]) == ("damaged", 1, 0)
    assert info["missing_shard_keys"] == [lost_key]
    assert [part["key"] for part in info["damaged_shards"]] == [lost_key]
    with pytest.raises(FilterDamagedError, match=r"Re-crawl window .* is gone"):
        bloom.add_many(fps)  # as the checks say
    bloom.close()


@pytest.mark.parametrize("policy", ["raise", "recreate"])
@pytest.mark.parametrize("which", ["current", "before"])
def test_ttl_a_window_overwritten_mid_crawl_is_refused(
    bloom_redis_client: redis.Redis, policy: str, which: str
) -> None:
    # BF.EXISTS and BF.MEXISTS answer 0 on a key of another type, and EXISTS said 1: a live
    # window overwritten by another program answered "new" for every URL it held (the window
    # before in every check, the current one in reads), with no error, log or stat.
    ttl = 86_400
    more = {"BLOOMFILTER_TTL": ttl, "BLOOMFILTER_SHARDS": 1, "BLOOMFILTER_CACHE_SIZE": 0}
    first = native(bloom_redis_client, BLOOMFILTER_ON_LOSS=policy, **more)
    fps = fingerprints(50, "overwritten-window")
    first.add_many(fps)
    (anchor,) = first.shard_keys
    first.close()
    w = int(bloom_redis_client.time()[0]) // ttl
    if which == "before":  # what window w - 1 leaves: it holds them, and window w is next
        bloom_redis_client.rename(f"{anchor}:w{w}", f"{anchor}:w{w - 1}")
        bloom_redis_client.set(anchor, f"{w - 1} 0")
    bloom = native(bloom_redis_client, BLOOMFILTER_ON_LOSS=policy, **more)
    assert bloom.check_and_add("starts window w") is False
    assert bloom.contains_many(fps) == [True] * 50
    window = f"{anchor}:w{w - 1 if which == 'before' else w}"
    bloom_redis_client.delete(window)
    bloom_redis_client.set(window, "written by another program")
    foreign = rf"window {re.escape(repr(window))}, Redis holds a string\. It is never overwritten"
    with pytest.raises(FilterDamagedError, match=foreign):
        bloom.contains_many(fps)
    with pytest.raises(FilterDamagedError, match=foreign):
        bloom.contains(fps[0])
    # The checks without the script look at the window before's type one check in
    # EXISTS_EVERY (a 0 from another type is "new": a duplicate fetch at worst), the
    # current window's by its add.
    answers = []
    refused = None
    for fp in fps[: native_ttl.EXISTS_EVERY + 1]:
        try:
            answers.append(bloom.check_and_add(fp))
        except BloomFilterError as exc:
            refused = exc
            break
    assert refused is not None, answers
    assert "holds a string" in str(refused)
    assert answers == [False] * len(answers)
    assert len(answers) < (native_ttl.EXISTS_EVERY if which == "before" else 1)
    with pytest.raises(FilterDamagedError, match=foreign):
        bloom.add_many(fps)
    assert bloom_redis_client.get(window) == b"written by another program"
    bloom.close()


def test_ttl_a_window_that_grows_is_said(
    bloom_redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RedisBloom grows a re-crawl window unseen: a sync reads its sub-filters and says it.

    It was silent (no log, ``generations`` 1): a crawl adding more than its capacity a window
    took more memory each window with nothing saying why.
    """
    monkeypatch.setattr(native_filter, "WINDOW_LOOK", 0.0)  # at every sync, not every 10 s
    more = {"BLOOMFILTER_CAPACITY": 1000, "BLOOMFILTER_SHARDS": 2, "BLOOMFILTER_TTL": 3600}
    events = Recorder()
    bloom = native(bloom_redis_client, events=events, **more)
    with caplog.at_level(logging.INFO, logger="scrapy_redis_bloom"):
        bloom.add_many(fingerprints(400, "within"))  # 200 a shard: far from its 500 + 4 sigma
        bloom.sync_counters()
        assert events.seen.get("generations", 1) == 1
        assert not [r for r in caplog.records if "grows" in r.getMessage()]
        bloom.add_many(fingerprints(4000, "past"))
        bloom.sync_counters()
        bloom.sync_counters()  # said once
    windows = bloom_redis_client.keys("{nat:*}:bf:*:w*")
    replies = [bloom_redis_client.execute_command("BF.INFO", k) for k in windows]
    infos = [r if isinstance(r, dict) else dict(zip(r[::2], r[1::2], strict=True)) for r in replies]
    counts = [int(info[b"Number of filters"]) for info in infos]
    assert max(counts) >= 3  # 2,200 a shard: its 500, 1,000 and part of its 2,000
    assert events.seen["generations"] == max(counts)
    said = [r.getMessage() for r in caplog.records if "grows" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith(
        f"The native Bloom filter 'nat' grows: a re-crawl window holds up to {max(counts)}"
    )
    bloom.close()


def test_ttl_windows_when_the_server_clock_steps_back(bloom_redis_client: redis.Redis) -> None:
    """The window model the bitmap backend shares (``engine/lua/windows.lua``), clock behind.

    A window the anchor shows was started must exist; one it does not show is started
    quietly (before the shared model: reported lost); the anchor never moves back. The
    bitmap backend's twin: tests/test_generations.py.
    """
    ttl = 86_400
    more = {"BLOOMFILTER_TTL": ttl, "BLOOMFILTER_CACHE_SIZE": 0, "BLOOMFILTER_SHARDS": 1}
    bloom = native(bloom_redis_client, **more)
    element, other = fingerprints(2, "clock")
    assert bloom.check_and_add(element) is False
    (anchor,) = bloom.shard_keys
    w = int(bloom_redis_client.time()[0]) // ttl
    window = f"{anchor}:w{w}"
    # Window w + 1 started, w existed then: w is consulted; the anchor stays at w + 1.
    bloom_redis_client.set(anchor, f"{w + 1} 1")
    assert bloom.check_and_add(element) is True
    assert bloom_redis_client.get(anchor) == f"{w + 1} 1".encode()
    # Two windows ahead, nothing said of w: w is no loss, it is started anew.
    bloom_redis_client.set(anchor, f"{w + 2} 0")
    bloom_redis_client.delete(window)
    assert bloom.check_and_add(other) is False
    assert bloom_redis_client.exists(window)
    assert bloom_redis_client.get(anchor) == f"{w + 2} 0".encode()
    # The anchor says w existed when w + 1 started: w missing is a loss, reported.
    bloom_redis_client.set(anchor, f"{w + 1} 1")
    bloom_redis_client.delete(window)
    with pytest.raises(FilterDamagedError, match=r"Re-crawl window .* is gone"):
        bloom.check_and_add(other)
    bloom.close()


def test_an_acl_refusing_command_info_is_said_never_taken_for_no_bf(
    bloom_redis_server: RedisServer,
    bloom_redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A user allowed BF.* but not COMMAND|INFO was told "Redis at X has none: install ...
    # RedisBloom" (native), or "has no Bloom filter commands" (auto), on a server that has them.
    bloom_redis_client.execute_command(
        "ACL", "SETUSER", "nocommand", "on", ">pw", "~*", "&*", "+@all", "-command"
    )
    user = redis.Redis(port=bloom_redis_server.port, username="nocommand", password="pw")
    try:
        bloom = native(user)
        with pytest.raises(AccessDeniedError, match=r"COMMAND INFO.*Grant it \+command\|info"):
            bloom.open()
        bloom.close()
        with caplog.at_level(logging.INFO, logger="scrapy_redis_bloom"):
            auto = make_filter([user], KEY, config())
        assert isinstance(auto, RedisBloomFilter)  # it cannot tell: the bitmaps, and says why
        (said,) = [r for r in caplog.records if "BLOOMFILTER_BACKEND = 'auto'" in r.message]
        assert "+command|info" in said.getMessage()
        assert "has no Bloom filter commands" not in said.getMessage()
        auto.close()
        assert bloom_redis_client.keys("*") == []
    finally:
        user.close()
        bloom_redis_client.execute_command("ACL", "DELUSER", "nocommand")


def test_auto_needs_bf_on_every_server(
    bloom_redis_client: redis.Redis, redis_client: redis.Redis
) -> None:
    mixed = [bloom_redis_client, redis_client]
    bloom = make_filter(mixed, KEY, config(BLOOMFILTER_SHARDS=2))
    assert isinstance(bloom, RedisBloomFilter)  # one server lacks BF.*: bitmaps
    bloom.close()
    insisting = make_filter(mixed, KEY, config(BLOOMFILTER_BACKEND="native"))
    plain = redis_client.connection_pool.connection_kwargs["port"]
    with pytest.raises(UnsupportedServerError, match=f"Redis at 127.0.0.1:{plain} has none"):
        insisting.open()
    insisting.close()
    assert bloom_redis_client.keys("*") == []
    assert redis_client.keys("*") == []


def test_auto_says_which_backend_it_picks_and_why(
    bloom_redis_client: redis.Redis, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Not a DEBUG line only: INFO, or WARNING when only some servers have BF.*."""
    plain = f"127.0.0.1:{redis_client.connection_pool.connection_kwargs['port']}"
    with caplog.at_level(logging.INFO, logger="scrapy_redis_bloom"):
        cases = [
            ([redis_client], logging.INFO, rf"picks the bitmap .*Redis at {plain} has no"),
            (
                [bloom_redis_client, redis_client],
                logging.WARNING,
                rf"but Redis at {plain} has none",
            ),
            ([bloom_redis_client], logging.INFO, r"picks the native .*every server has"),
        ]
        for clients, level, said in cases:
            caplog.clear()
            make_filter(clients, KEY, config(BLOOMFILTER_SHARDS=2)).close()
            found = [r for r in caplog.records if "BLOOMFILTER_BACKEND = 'auto'" in r.message]
            assert len(found) == 1, caplog.text
            assert found[0].levelno == level
            assert re.search(said, found[0].getMessage())
        caplog.clear()
        bloom = make_filter([bloom_redis_client], KEY, config(BLOOMFILTER_SHARDS=2))
        bloom.open()
        make_filter([bloom_redis_client], KEY, config(BLOOMFILTER_SHARDS=2)).close()
        assert "uses the native backend, as its record says" in caplog.text
        bloom.close()


def test_many_at_once_answer_as_one_at_a_time_on_native(bloom_redis_client: Any) -> None:
    together = native(bloom_redis_client, "together")
    alone = native(bloom_redis_client, "alone")
    pages = [fingerprints(40, f"page-{p}") for p in range(10)]
    for p, links in enumerate(pages):
        links = links + links[:5] + (pages[p - 1][:10] if p else [])
        expected = [alone.check_and_add(link) for link in links]
        assert together.check_and_add_many(links) == expected
