"""The operations commands, run in-process (and once as a subprocess) on a real Redis."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from cli_run import assert_one_line_error, run, run_json, run_scrapy_bloom, write_lines
from redis_server import RedisServer, free_port

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.cli import contents, streams
from scrapy_redis_bloom.core.errors import FilterDamagedError
from scrapy_redis_bloom.core.record import FilterRecord
from scrapy_redis_bloom.core.sizing import false_positive_rate, filter_allocation, format_bytes
from scrapy_redis_bloom.engine import backend
from scrapy_redis_bloom.engine.lease import CLOCK_MARGIN
from scrapy_redis_bloom.engine.native.filter import NativeBloomFilter
from scrapy_redis_bloom.engine.state import FilterState
from scrapy_redis_bloom.ops import inventory, restore
from scrapy_redis_bloom.ops.scanning import Scan

KEY = "myspider:bloomfilter"
#: A small filter over several shards, so that sharding is exercised.
SETTINGS = {
    "BLOOMFILTER_CAPACITY": 20_000,
    "BLOOMFILTER_ERROR_RATE": 0.0001,
    "BLOOMFILTER_SHARD_BIT": 16,
}


def fingerprints(n: int, salt: str = "") -> list[str]:
    return [hashlib.sha1(f"{salt}{i}".encode()).hexdigest() for i in range(n)]


def make_filter(client: redis.Redis, key: str = KEY) -> RedisBloomFilter:
    config = BloomConfig.from_settings(SETTINGS)
    bloom = RedisBloomFilter.from_config(client, key, config)
    bloom.open()
    return bloom


def read_record(client: redis.Redis, key: str) -> FilterRecord:
    raw: Any = client.hgetall(f"{key}:meta")
    return FilterRecord.parse(key, {k.decode(): v.decode() for k, v in raw.items()})


class _TTY(io.StringIO):
    """Stdin that answers a prompt, as a user at a terminal would."""

    def isatty(self) -> bool:
        return True


# -- info ------------------------------------------------------------------------


@pytest.mark.parametrize("blocked", [True, False])
def test_info_gives_one_rate_for_a_fixed_filter(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str, blocked: bool
) -> None:
    """A fixed filter's only generation is the filter: the same rate, the same capacity.

    The fixed filter's generation was built apart from a growing one's: it gave the
    classic rate, (X/m)^k, for a blocked filter (a quarter of its true rate at half
    its capacity) and a capacity of 0.
    """
    settings = {**SETTINGS, "BLOOMFILTER_EXPANSION": 0, "BLOOMFILTER_BLOCKED": blocked}
    bloom = RedisBloomFilter.from_config(redis_client, KEY, BloomConfig.from_settings(settings))
    bloom.open()
    bloom.add_many(fingerprints(10_000))
    data = run_json(capsys, "info", "--redis-url", redis_url, "--key", KEY)
    (only,) = data["generations"]
    assert only["estimated_fpr"] == pytest.approx(data["estimated_fpr"], rel=1e-9)
    # The generation's capacity is its shards' (each rounded up): the record's, or a little more.
    assert data["capacity"] == 20_000 <= only["capacity"] < 20_000 + bloom.spec.shards
    assert only["estimated_items"] == data["estimated_items"]
    # Half full: the rate is the sizing's at half the capacity, whatever the layout.
    expected = false_positive_rate(
        bloom.spec.shard_bits, bloom.spec.hash_count, 10_000 / bloom.spec.shards,
        bloom.spec.block_bits,
    )  # fmt: skip
    assert data["estimated_fpr"] == pytest.approx(expected, rel=0.3)
    bloom.close()


def test_info_json_matches_engine_state(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    bloom = make_filter(redis_client)
    bloom.add_many(fingerprints(1000))
    assert bloom.check_and_add(fingerprints(1)[0]) is True
    bloom.sync_counters()
    state = bloom.state()
    record = read_record(redis_client, KEY)

    data = run_json(capsys, "info", "--redis-url", redis_url, "--key", KEY)
    assert (data["total_added"], data["total_filtered"]) == (1000, 1)

    spec = bloom.spec
    assert data["key"] == KEY
    assert data["server"] == redis_url.split("//")[1].split("/")[0]
    assert (data["bits"], data["shards"], data["shard_bits"], data["hash_count"]) == (
        spec.bits,
        spec.shards,
        spec.shard_bits,
        spec.hash_count,
    )
    assert spec.shards > 1
    assert data["capacity"] == 20_000
    assert data["bits_set"] == state.bits_set
    assert data["bits_set_per_shard"] == list(state.bits_set_per_shard)
    assert data["fill_ratio"] == pytest.approx(state.fill_ratio)
    assert data["estimated_items"] == state.estimated_items
    assert data["estimated_items"] == pytest.approx(1000, rel=0.05)
    assert data["estimated_fpr"] == pytest.approx(state.estimated_fpr)
    assert data["memory_bytes"] == state.memory_bytes > spec.total_bytes // 2
    # A growing filter: generation 0 is sized for half the rate, all together under it.
    assert data["expected_fpr_at_capacity"] == pytest.approx(0.5e-4, rel=0.2)
    assert (data["expansion"], data["ttl"], data["tightening"]) == (2, 0, 0.5)
    assert data["rate_bound"] <= 1e-4
    assert [g["generation"] for g in data["generations"]] == [0]
    assert data["generations"][0]["estimated_items"] == data["estimated_items"]
    assert data["created_timestamp"] == record.created
    created = datetime.fromisoformat(data["created"])
    assert created.utcoffset() == UTC.utcoffset(None)
    assert created.timestamp() == pytest.approx(record.created)


def test_info_human_table(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    bloom = make_filter(redis_client)
    bloom.add_many(fingerprints(1000))
    state = bloom.state()

    code, out, err = run(capsys, "info", "--redis-url", redis_url, "--key", KEY)

    assert (code, err) == (0, "")
    rows = dict(line.split("  ", 1) for line in out.splitlines())
    rows = {label.strip(): value.strip() for label, value in rows.items()}
    assert rows["Bloom filter"] == KEY
    assert rows["Bits set"] == f"{state.bits_set:,}"
    assert rows["Estimated items"] == f"{state.estimated_items:,}"
    assert rows["Hash functions (k)"] == str(bloom.spec.hash_count)
    assert rows["Created"].endswith(" UTC")
    assert rows["Bits (m)"].startswith(f"{bloom.spec.bits:,} (")
    assert rows["Live workers"] == "0"


@pytest.mark.parametrize("blocked", [False, True])
def test_info_shows_each_layouts_memory_and_redis_time(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str, blocked: bool
) -> None:
    config = BloomConfig.from_settings({**SETTINGS, "BLOOMFILTER_BLOCKED": blocked})
    bloom = RedisBloomFilter.from_config(redis_client, KEY, config)
    spec = bloom.open().spec
    data = run_json(capsys, "info", "--redis-url", redis_url, "--key", KEY)
    layouts = {entry["layout"]: entry for entry in data["layouts"]}
    assert list(layouts) == ["classic", "blocked", "native"]
    this = "blocked" if blocked else "classic"
    assert [name for name, entry in layouts.items() if entry["current"]] == [this]
    # This filter's own row is its geometry, exactly; the other bitmap layout's is what
    # the same capacity and rate give it (blocked: more bits for the same rate).
    other = BloomConfig.from_settings({**SETTINGS, "BLOOMFILTER_BLOCKED": not blocked}).spec
    for name, geometry in ((this, spec), ("classic" if blocked else "blocked", other)):
        assert layouts[name]["hash_count"] == geometry.hash_count
        assert layouts[name]["memory_bytes"] == filter_allocation(geometry)
    assert layouts["blocked"]["memory_bytes"] > layouts["classic"]["memory_bytes"]
    assert all(entry["error_rate_at_capacity"] <= 1e-4 for entry in layouts.values())
    assert all(entry["redis_us_per_check"] > 0 for entry in layouts.values())
    # The table says the same in rows, this filter's marked.
    code, out, err = run(capsys, "info", "--redis-url", redis_url, "--key", KEY)
    assert (code, err) == (0, "")
    rows = {
        label.strip(): value.strip()
        for label, value in (line.split("  ", 1) for line in out.splitlines())
    }
    mark = "Blocked layout (this filter)" if blocked else "Classic layout (unblocked) (this filter)"
    assert rows[mark].startswith(
        f"k={spec.hash_count}, {format_bytes(filter_allocation(spec))}, FP rate at capacity"
    )
    assert rows[mark].endswith("µs of Redis per check")
    assert "model" in rows["Layouts"]
    assert rows["Native (BF.*)"].startswith(f"k={layouts['native']['hash_count']}, ")
    bloom.close()


def test_info_of_an_empty_filter(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    bloom = make_filter(redis_client)
    data = run_json(capsys, "info", "--redis-url", redis_url, "--key", KEY)
    assert (data["bits_set"], data["estimated_items"]) == (0, 0)
    assert data["estimated_fpr"] == 0.0
    # Every shard is allocated whole when the filter is created.
    assert data["memory_bytes"] >= bloom.spec.total_bytes
    assert (data["shards_missing"], data["shards_foreign"], data["damaged_shards"]) == (0, 0, [])


def test_info_missing_filter(capsys: pytest.CaptureFixture[str], redis_url: str) -> None:
    code, out, err = run(capsys, "info", "--redis-url", redis_url, "--key", "nospider:bf")
    assert (code, out) == (1, "")
    assert_one_line_error(err)
    assert "No Bloom filter 'nospider:bf'" in err
    assert "'nospider:bf:meta' does not exist" in err


def test_info_hints_at_a_key_given_with_meta(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    make_filter(redis_client)
    code, _, err = run(capsys, "info", "--redis-url", redis_url, "--key", f"{KEY}:meta")
    assert code == 1
    assert f"--key '{KEY}'" in err


def test_info_refuses_a_record_of_the_wrong_type(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    redis_client.set(f"{KEY}:meta", "not a hash")
    code, _, err = run(capsys, "info", "--redis-url", redis_url, "--key", KEY)
    assert code == 1
    assert_one_line_error(err)
    assert f"'{KEY}:meta'" in err
    assert "holds a string" in err


def test_info_names_a_shard_of_the_wrong_type(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    bloom = make_filter(redis_client)
    redis_client.delete(bloom.shard_keys[1])
    redis_client.rpush(bloom.shard_keys[1], "x")
    code, _, err = run(capsys, "info", "--redis-url", redis_url, "--key", KEY)
    assert code == 1
    assert_one_line_error(err)
    assert f"'{bloom.shard_keys[1]}'" in err
    assert "holds a list" in err


def test_info_as_a_subprocess(redis_client: redis.Redis, redis_url: str) -> None:
    bloom = make_filter(redis_client)
    bloom.add_many(fingerprints(500))
    target = ["--redis-url", redis_url, "--key", KEY]
    result = subprocess.run(
        [sys.executable, "-m", "scrapy_redis_bloom", "info", "--json", *target],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    data = json.loads(result.stdout)
    assert data["bits_set"] == bloom.state().bits_set
    assert data["estimated_items"] == pytest.approx(500, rel=0.05)


def test_redis_url_defaults_to_the_environment(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    redis_client: redis.Redis,
    redis_url: str,
) -> None:
    make_filter(redis_client)
    monkeypatch.setenv("REDIS_URL", redis_url)
    data = run_json(capsys, "info", "--key", KEY)
    assert data["key"] == KEY


# -- reset -----------------------------------------------------------------------


def test_reset_with_yes_deletes_record_and_shards(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    bloom = make_filter(redis_client)
    bloom.add_many(fingerprints(1000))
    redis_client.set("unrelated", "kept")
    assert redis_client.exists(f"{KEY}:meta", *bloom.shard_keys) == 1 + bloom.spec.shards

    code, out, err = run(capsys, "reset", "--redis-url", redis_url, "--key", KEY, "--yes")

    assert (code, err) == (0, "")
    assert f"Deleted the Bloom filter '{KEY}'" in out
    assert f"{bloom.spec.shards} shard key(s)" in out
    assert redis_client.keys("*") == [b"unrelated"]


def test_reset_keeps_another_programs_key_named_like_a_server_marker(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    # A filter on one server has no server marker: 'KEY:server' there is not its key.
    redis_client.set(f"{KEY}:server", "web-1")
    make_filter(redis_client).add_many(fingerprints(10))
    code, out, err = run(capsys, "reset", "--redis-url", redis_url, "--key", KEY, "--yes")
    assert (code, err) == (0, "")
    assert "server markers" not in out
    assert redis_client.keys("*") == [f"{KEY}:server".encode()]


def test_reset_refuses_while_workers_hold_leases_unless_forced(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    bloom = make_filter(redis_client)
    bloom.add_many(fingerprints(100))
    lease = bloom.lease("crawler-7:4242:abcd", ttl=30)
    lease.renew()
    info = run_json(capsys, "info", "--redis-url", redis_url, "--key", KEY)
    assert info["live_workers"] == ["crawler-7:4242:abcd"]
    before = sorted(redis_client.keys("*"))

    code, out, err = run(capsys, "reset", "--redis-url", redis_url, "--key", KEY, "--yes")

    assert (code, out) == (1, "")
    assert_one_line_error(err)
    assert "1 worker(s) still crawl" in err
    assert "crawler-7:4242:abcd" in err
    assert "--force" in err
    assert sorted(redis_client.keys("*")) == before

    code, out, err = run(capsys, "reset", "--redis-url", redis_url, "--key", KEY, "-y", "--force")
    assert (code, err) == (0, "")
    assert not bloom.exists()
    assert lease.release() == 0


def test_reset_json(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    bloom = make_filter(redis_client)
    bloom.add_many(fingerprints(10))
    written = redis_client.exists(*bloom.shard_keys)
    data = run_json(capsys, "reset", "--redis-url", redis_url, "--key", KEY, "-y")
    assert bloom.record is not None
    assert data == {
        "key": KEY,
        "server": redis_url.split("//")[1].split("/")[0],
        "servers": [data["server"]],
        "deleted": True,
        "record": True,
        "id": bloom.record.filter_id,
        "shard_keys": written,
        "counters": True,
        "server_markers": 0,
        "keys_deleted": written + 2,  # with the record and the counters
    }
    assert not bloom.exists()
    assert redis_client.keys("*") == []


def test_reset_of_a_grown_filter_says_how_many_keys_it_deleted(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    # It said "1 shard key(s)" ("shard_keys": 1) and nothing else where it deleted the
    # shard's every generation: a user checking Redis's key count found more gone.
    bloom, state = _grown_filter(redis_client)
    bloom.close()
    keys = len(redis_client.keys("*"))
    generations = len(state.generations)
    assert generations > 1
    assert keys >= generations + 2  # with the record and the counters
    data = run_json(capsys, "reset", "--redis-url", redis_url, "--key", KEY, "-y")
    assert (data["shard_keys"], data["keys_deleted"]) == (1, keys)
    assert redis_client.keys("*") == []
    bloom, _ = _grown_filter(redis_client)
    bloom.close()
    code, out, _ = run(capsys, "reset", "--redis-url", redis_url, "--key", KEY, "-y")
    assert code == 0
    assert out.rstrip().endswith(f" and its counters: {keys:,} keys."), out


def test_reset_refuses_without_yes_when_stdin_is_not_a_tty(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    bloom = make_filter(redis_client)
    bloom.add_many(fingerprints(100))
    before = sorted(redis_client.keys("*"))

    code, out, err = run(capsys, "reset", "--redis-url", redis_url, "--key", KEY)

    assert (code, out) == (2, "")
    assert_one_line_error(err)
    assert "--yes" in err
    assert sorted(redis_client.keys("*")) == before


@pytest.mark.parametrize(("answer", "deleted"), [("y\n", True), ("yes\n", True), ("\n", False)])
def test_reset_asks_on_a_terminal(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    redis_client: redis.Redis,
    redis_url: str,
    answer: str,
    deleted: bool,
) -> None:
    make_filter(redis_client).add_many(fingerprints(10))
    monkeypatch.setattr(sys, "stdin", _TTY(answer))

    code, out, err = run(capsys, "reset", "--redis-url", redis_url, "--key", KEY)

    assert f"Delete the Bloom filter '{KEY}'" in err
    assert "[y/N]" in err
    if deleted:
        assert code == 0
        assert "Deleted" in out
        assert redis_client.keys("*") == []
    else:
        assert (code, out) == (1, "")
        assert "nothing was deleted" in err
        assert redis_client.exists(f"{KEY}:meta")


def test_reset_of_a_missing_filter_is_not_an_error(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    redis_client.set("other", "x")
    code, out, err = run(capsys, "reset", "--redis-url", redis_url, "--key", KEY, "--yes")
    assert (code, err) == (0, "")
    assert "nothing to delete" in out
    assert redis_client.exists("other")


def test_reset_deletes_orphaned_shards(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    bloom = make_filter(redis_client)
    bloom.add_many(fingerprints(1000))
    redis_client.delete(f"{KEY}:meta")
    # Keys that only look alike are not even listed.
    lookalikes = [f"{{{KEY}:x}}:g0", f"{{{KEY}x:0}}:g0", f"{KEY}:g0:0", f"{KEY}:other"]
    for name in lookalikes:
        redis_client.set(name, "kept")

    code, _, err = run(capsys, "info", "--redis-url", redis_url, "--key", KEY)
    assert code == 1
    assert "orphaned" in err
    assert "reset" in err

    code, out, err = run(capsys, "reset", "--redis-url", redis_url, "--key", KEY, "--yes")
    assert (code, err) == (0, "")
    assert f"{bloom.spec.shards} orphaned shard key(s) and 1 other part(s)" in out
    assert "it has no config record" in out
    assert f"'{KEY}:count' on " in out  # the counters are listed, with what proves them
    assert "Not deleted" not in out
    assert sorted(redis_client.keys("*")) == sorted(name.encode() for name in lookalikes)


@pytest.mark.parametrize(
    ("stream", "command", "code", "said"),
    [
        ("stdin", "add", 2, "Standard input is closed: give the fingerprints in a file."),
        ("stdout", "info", 1, "Standard output is closed: the result cannot be printed"),
    ],
)
def test_a_command_with_a_stream_closed_says_so(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    redis_client: redis.Redis,
    redis_url: str,
    stream: str,
    command: str,
    code: int,
    said: str,
) -> None:
    # Started with it closed ('<&-', '>&-'), Python has no sys.stdin / sys.stdout: a
    # traceback (AttributeError: 'NoneType' object has no attribute 'buffer' / 'write').
    make_filter(redis_client)
    monkeypatch.setattr(sys, stream, None)
    got, _, err = run(capsys, command, "--redis-url", redis_url, "--key", KEY)
    assert got == code
    assert_one_line_error(err)
    assert said in err


def test_reset_deletes_orphaned_native_shards(
    capsys: pytest.CaptureFixture[str], bloom_redis_client: redis.Redis
) -> None:
    # A native restore killed part-way left its shards without a record: 'reset' said
    # "nothing to delete" and kept them, and every restore after was refused over them.
    config = BloomConfig.from_settings(
        {"BLOOMFILTER_CAPACITY": 10_000, "BLOOMFILTER_BACKEND": "native"}
    )
    bloom = NativeBloomFilter.from_config(bloom_redis_client, KEY, config)
    bloom.add_many(fingerprints(1000))
    bloom_redis_client.delete(f"{KEY}:meta")
    bloom_redis_client.set(f"{{{KEY}:0}}:bf:not-an-id", "kept")  # only looks alike
    url = f"redis://127.0.0.1:{bloom_redis_client.connection_pool.connection_kwargs['port']}/0"
    code, out, err = run(capsys, "reset", "--redis-url", url, "--key", KEY, "--yes")
    assert (code, err) == (0, "")
    assert f"{bloom.spec.shards} orphaned shard key(s)" in out
    assert bloom_redis_client.keys("*") == [f"{{{KEY}:0}}:bf:not-an-id".encode()]


def test_reset_without_record_keeps_what_carries_no_filter_id(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    # Another application's keys that happen to share the filter's names.
    redis_client.set("myapp:server", "web-1")
    redis_client.hset("myapp:count", mapping={"visits": 3})
    redis_client.set("{myapp:0}:g0", "not a shard")
    redis_client.set("{myapp:1}:g0", b"SRB\x02" + bytes(28))  # a header naming shard 0
    before = sorted(redis_client.keys("*"))

    code, out, err = run(capsys, "reset", "--redis-url", redis_url, "--key", "myapp", "--yes")

    assert (code, err) == (0, "")
    assert "No Bloom filter 'myapp'" in out
    assert "nothing to delete" in out
    assert "Not deleted (carries no filter id):" in out
    for name in ("myapp:server", "myapp:count", "{myapp:0}:g0", "{myapp:1}:g0"):
        assert f"'{name}' on " in out
    assert sorted(redis_client.keys("*")) == before

    data = run_json(capsys, "reset", "--redis-url", redis_url, "--key", "myapp", "--yes")
    assert (data["deleted"], data["record"], data["deleted_keys"]) == (False, False, [])
    assert sorted(kept["key"] for kept in data["not_deleted"]) == [
        "myapp:count", "myapp:server", "{myapp:0}:g0", "{myapp:1}:g0",
    ]  # fmt: skip


def test_reset_of_an_orphan_lists_it_before_asking(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    redis_client: redis.Redis,
    redis_url: str,
) -> None:
    bloom = make_filter(redis_client)
    bloom.add_many(fingerprints(10))
    redis_client.delete(f"{KEY}:meta")
    redis_client.set(f"{KEY}:server", "someone else's")
    monkeypatch.setattr(sys, "stdin", _TTY("n\n"))

    code, out, err = run(capsys, "reset", "--redis-url", redis_url, "--key", KEY)

    assert (code, out) == (1, "")
    listing, prompt = err.split("Delete ", 1)
    assert bloom.record is not None
    shards = bloom.spec.shards
    assert f"To delete, {shards} orphaned shard key(s) and 1 other part(s)" in listing
    assert (
        f"  {shards} shard key(s) '{{{KEY}:<i>}}:g<m>' of filter id {bloom.record.filter_id}:"
        f" shards 0-{shards - 1}, on 127.0.0.1:"
    ) in listing
    assert f"'{KEY}:count' on " in listing
    assert f"Not deleted (carries no filter id):\n  '{KEY}:server'" in listing
    assert "[y/N]" in prompt
    assert redis_client.exists(*bloom.shard_keys) == bloom.spec.shards


def test_reset_deletes_a_record_this_version_cannot_read(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    bloom = make_filter(redis_client)
    redis_client.hset(f"{KEY}:meta", "layout", "1")  # e.g. a development build's filter
    code, _, err = run(capsys, "info", "--redis-url", redis_url, "--key", KEY)
    assert code == 1
    assert_one_line_error(err)
    assert "layout '1'" in err
    assert "reset" in err

    code, out, err = run(capsys, "reset", "--redis-url", redis_url, "--key", KEY, "--yes")

    assert (code, err) == (0, "")
    assert "its config record cannot be used" in out
    assert f"'{KEY}:meta' on " in out
    assert f"{bloom.spec.shards} orphaned shard key(s)" in out
    assert redis_client.keys("*") == []


def test_another_programs_hash_at_the_record_key_is_to_delete_by_hand(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    """A hash that is not one of ours: reset leaves it, and info advised reset."""
    redis_client.hset(f"{KEY}:meta", "a", "b")
    code, _, err = run(capsys, "info", "--redis-url", redis_url, "--key", KEY)
    assert code == 1
    assert_one_line_error(err)
    assert f"The hash '{KEY}:meta' is not a config record of scrapy-redis-bloom" in err
    assert f"delete it by hand (redis-cli DEL '{KEY}:meta')" in err
    assert "reset" not in err
    code, out, err = run(capsys, "reset", "--redis-url", redis_url, "--key", KEY, "--yes")
    assert (code, err) == (0, "")
    assert "Not deleted (carries no filter id)" in out
    assert redis_client.hgetall(f"{KEY}:meta") == {b"a": b"b"}


def test_reset_refuses_a_record_of_the_wrong_type(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    redis_client.rpush(f"{KEY}:meta", "someone else's list")
    code, _, err = run(capsys, "reset", "--redis-url", redis_url, "--key", KEY, "--yes")
    assert code == 1
    assert_one_line_error(err)
    assert redis_client.exists(f"{KEY}:meta")


# -- add and check ---------------------------------------------------------------


def test_add_and_check_from_files(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    redis_client: redis.Redis,
    redis_url: str,
) -> None:
    bloom = make_filter(redis_client)
    known = fingerprints(300)
    # Blank lines and surrounding spaces are ignored; hex case does not matter.
    lines = [fp.upper() if i % 2 else f"  {fp} " for i, fp in enumerate(known)]
    first = write_lines(tmp_path / "a.txt", [*lines[:200], ""])
    second = write_lines(tmp_path / "b.txt", lines[200:])
    target = ["--redis-url", redis_url, "--key", KEY]

    data = run_json(capsys, "add", *target, first, second)
    assert data["fingerprints"] == 300
    assert (data["new"], data["already_present"], data["created_filter"]) == (300, 0, False)
    assert all(bloom.contains_many(known))

    code, out, err = run(capsys, "add", *target, first)
    assert (code, err) == (0, "")
    assert "200 fingerprint(s)" in out
    assert "0 new, 200 already present" in out

    unknown = fingerprints(200, salt="unknown")
    mixed = write_lines(tmp_path / "c.txt", known[:100] + unknown)
    expected_absent = bloom.contains_many(unknown).count(False)
    assert expected_absent >= 199
    data = run_json(capsys, "check", *target, mixed)
    assert data["fingerprints"] == 300
    assert data["absent"] == expected_absent
    assert data["present"] == 300 - expected_absent

    code, out, _ = run(capsys, "check", *target, mixed)
    assert code == 0
    assert f"{300 - expected_absent} present, {expected_absent} absent" in out
    assert bloom.contains_many(unknown).count(False) == expected_absent  # check added nothing


def test_add_reads_stdin(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    redis_client: redis.Redis,
    redis_url: str,
) -> None:
    bloom = make_filter(redis_client)
    known = fingerprints(50)
    stdin = io.TextIOWrapper(io.BytesIO("\n".join(known).encode()))
    monkeypatch.setattr(sys, "stdin", stdin)
    data = run_json(capsys, "add", "--redis-url", redis_url, "--key", KEY, "-")
    assert (data["fingerprints"], data["new"]) == (50, 50)
    assert all(bloom.contains_many(known))


def test_add_stops_at_a_bad_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    redis_client: redis.Redis,
    redis_url: str,
) -> None:
    bloom = make_filter(redis_client)
    known = fingerprints(3)
    path = write_lines(tmp_path / "fps.txt", [known[0], known[1], "https://example.com/", known[2]])

    code, out, err = run(capsys, "add", "--redis-url", redis_url, "--key", KEY, path)

    assert (code, out) == (1, "")
    assert_one_line_error(err)
    assert f"{path}:3: not a request fingerprint" in err
    assert "the 2 fingerprint(s) before it were added" in err
    assert bloom.contains_many(known) == [True, True, False]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["redis dies", "ctrl-c"])
@pytest.mark.parametrize("command", ["add", "check"])
def test_add_and_check_stopped_part_way_say_how_many_were_done(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    command: str,
    fault: str,
) -> None:
    # Before, only "could not add in bulk: cannot connect ..." or "interrupted": not the
    # count a bad line's error gives, nor that adding again is safe.
    monkeypatch.setattr(streams, "BATCH", 1000)  # one bulk call a 1,000 lines (1,000,000)
    known = fingerprints(100_000, "stopped")
    path = write_lines(tmp_path / "fps.txt", known)
    with RedisServer(appendonly=True) as server:
        client = server.client()
        bloom = make_filter(client)
        bloom.add_many(known[:50_000:7])
        read = contents.read_lines

        def reading(*args: Any) -> Iterator[Any]:
            """Yield the lines in calls of 1,000, and meet the fault after the tenth call."""
            for index, batch in enumerate(read(*args)):
                if index == 10:
                    if fault == "ctrl-c":
                        raise KeyboardInterrupt  # as Ctrl-C between two calls
                    server.kill()
                yield batch

        monkeypatch.setattr(contents, "read_lines", reading)
        argv = [command, "--redis-url", server.url, "--key", KEY, "--retry-timeout", "0.5", path]
        code, out, err = run(capsys, *argv)
        assert (code, out) == ((130, "") if fault == "ctrl-c" else (1, ""))
        assert_one_line_error(err)
        verb = "added" if command == "add" else "checked"
        said = re.search(rf"([\d,]+) fingerprint\(s\) were {verb} before it", err)
        assert said, err
        done = int(said[1].replace(",", ""))
        assert done == 10_000  # the ten calls before the fault
        if fault == "redis dies":
            server.restart()
        if command == "add":
            assert "adding them again is safe: those added count as already present" in err
            # The call under way when Redis died may have added some of its own (before, it
            # said only "perhaps some of the next call's too", whichever call that was).
            stopped = "some of the next 1,000 (fingerprints 10,001 to 11,000 read), whose call"
            assert (stopped in err) == (fault == "redis dies"), err
            assert all(bloom.contains_many(known[:done]))  # (kept by the AOF)
        else:
            present = sum(bloom.contains_many(known[:done]))
            assert f"{done:,} fingerprint(s) were checked before it: {present:,} present." in err
        bloom.close()
        client.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", ["add", "migrate-set"])
def test_a_load_that_finds_the_filter_lost_does_not_say_to_resume(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    redis_client: redis.Redis,
    redis_url: str,
    command: str,
) -> None:
    # A restart without persistence empties the filter's server part way. The error named
    # the lost shards and the reset, then ended "adding them again is safe" (add) or "Run
    # the command again: it resumes from its last saved batch" (migrate): untrue, what was
    # loaded went with the shards.
    monkeypatch.setattr(streams, "BATCH", 1000)
    known = fingerprints(30_000, "lost")
    with RedisServer() as server:
        client = server.client()
        if command == "add":
            make_filter(client)
            read = contents.read_lines

            def reading(*args: Any) -> Iterator[Any]:
                for index, batch in enumerate(read(*args)):
                    if index == 10:
                        server.kill()
                        server.restart()
                    yield batch

            monkeypatch.setattr(contents, "read_lines", reading)
            argv = [command, write_lines(tmp_path / "fps.txt", known)]
        else:  # the set on the session's server: the filter's alone is emptied
            redis_client.sadd("myspider:dupefilter", *known)
            restarted: list[bool] = []

            class Restarting(Scan):
                def next(self, cursor: int, count: int) -> tuple[int | None, list[bytes]]:
                    if cursor and not restarted:  # once, after the first page was added
                        restarted.append(True)
                        server.kill()
                        server.restart()
                    return super().next(cursor, count)

            monkeypatch.setattr(contents, "Scan", Restarting)
            argv = [command, *CREATE, "--set-key", "myspider:dupefilter"]
            argv += ["--set-redis-url", redis_url, "--batch", "1000"]
        argv += ["--redis-url", server.url, "--key", KEY, "--retry-timeout", "0.5"]
        code, out, err = run(capsys, *argv)
        client.close()
    assert (code, out) == (1, "")
    assert_one_line_error(err)
    assert f"shards of the Bloom filter '{KEY}' are gone" in err
    assert "again is safe" not in err
    assert "resumes" not in err
    if command == "add":
        said = re.search(r"Stopped: ([\d,]+) fingerprint\(s\) were added before it, but", err)
        assert said, err
        assert int(said[1].replace(",", "")) == 10_000
        assert err.rstrip().endswith(
            "but the filter is damaged: not all of them may be in it. Once it is reset, add"
            " them all again."
        )
    else:
        marker = contents.marker_key("myspider:dupefilter")
        assert re.search(r"Stopped: [\d,]+ of the set's 30,000 members were migrated, but", err)
        assert (
            "but the filter is damaged: not all of them may be in it, and the run cannot resume"
            f" from its progress marker '{marker}'. Once the filter is reset, run the command"
            " again with --restart to migrate the set from its start." in err
        )
        assert f"The Bloom filter '{KEY}' on 127.0.0.1:{server.port} was created by" in err


def test_add_unreadable_file(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    redis_client: redis.Redis,
    redis_url: str,
) -> None:
    make_filter(redis_client)
    missing = str(tmp_path / "missing.txt")
    code, _, err = run(capsys, "add", "--redis-url", redis_url, "--key", KEY, missing)
    assert code == 1
    assert_one_line_error(err)
    assert missing in err


#: A sizing that creates the filter, as ``add --capacity`` does.
CREATE = ["--capacity", "20000", "--error-rate", "0.0001", "--shard-bit", "16"]


@pytest.mark.parametrize("problem", ["No such file or directory", "Is a directory"])
def test_add_refuses_an_unreadable_file_before_creating_the_filter(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    redis_client: redis.Redis,
    redis_url: str,
    problem: str,
) -> None:
    # The filter was created whole (a probe: 290 MiB for --capacity 100000000) before the
    # files were opened, and the error named the file alone.
    good = write_lines(tmp_path / "fps.txt", fingerprints(10))
    bad = tmp_path / ("missing.txt" if problem.startswith("No") else "a-directory")
    if problem == "Is a directory":
        bad.mkdir()
    argv = ["add", "--redis-url", redis_url, "--key", KEY, *CREATE, good, str(bad)]
    code, out, err = run(capsys, *argv)
    assert (code, out) == (1, "")
    assert_one_line_error(err)
    assert f"{bad}: {problem}" in err
    assert redis_client.keys("*") == []  # nothing created, nothing added


def test_add_creates_no_filter_for_a_bad_first_line(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    redis_client: redis.Redis,
    redis_url: str,
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"not-a-fingerprint\n")))
    code, out, err = run(capsys, "add", "--redis-url", redis_url, "--key", KEY, *CREATE)
    assert (code, out) == (1, "")
    assert_one_line_error(err)
    assert "<stdin>:1: not a request fingerprint (40 hex digits): 'not-a-fingerprint'" in err
    assert "the 0 fingerprint(s) before it were added" in err
    assert "created" not in err
    assert redis_client.keys("*") == []


def test_an_add_that_fails_after_creating_the_filter_says_so(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    redis_server: RedisServer,
    redis_client: redis.Redis,
    redis_url: str,
) -> None:
    known = fingerprints(2)
    path = write_lines(tmp_path / "fps.txt", [*known, "not-a-fingerprint"])
    argv = ["add", "--redis-url", redis_url, "--key", KEY, *CREATE, path]
    code, out, err = run(capsys, *argv)
    assert (code, out) == (1, "")
    assert_one_line_error(err)
    assert f"{path}:3: not a request fingerprint" in err
    assert "the 2 fingerprint(s) before it were added" in err
    size = format_bytes(filter_allocation(BloomConfig.from_settings(SETTINGS).spec))
    assert (
        f"The Bloom filter '{KEY}' on 127.0.0.1:{redis_server.port} was created by"
        f" this command ({size}): 'scrapy-redis-bloom reset --key {KEY}' deletes it if it is"
        " not wanted." in err
    )
    assert make_filter(redis_client).contains_many(known) == [True, True]
    # Run again on the filter it left: not created this time, and not said to be.
    code, _, err = run(capsys, *argv)
    assert code == 1
    assert "the 2 fingerprint(s) before it were added" in err
    assert "created" not in err


def test_add_and_check_need_an_existing_filter(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    redis_client: redis.Redis,
    redis_url: str,
) -> None:
    path = write_lines(tmp_path / "fps.txt", fingerprints(5))
    errors = {}
    for command in ("add", "check"):
        code, out, err = run(capsys, command, "--redis-url", redis_url, "--key", KEY, path)
        assert (code, out) == (1, "")
        assert_one_line_error(err)
        assert f"No Bloom filter '{KEY}'" in err
        errors[command] = err
    assert "--capacity" in errors["add"]  # how to create it here
    assert redis_client.keys("*") == []  # neither created a record


def test_add_creates_a_filter_from_sizing_options(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    redis_client: redis.Redis,
    redis_url: str,
) -> None:
    path = write_lines(tmp_path / "fps.txt", fingerprints(100))
    sizing = ["--capacity", "20000", "--error-rate", "0.0001", "--shard-bit", "16"]
    target = ["--redis-url", redis_url, "--key", KEY]

    code, out, err = run(capsys, "add", *target, *sizing, path)
    assert (code, err) == (0, "")
    assert f"Created the Bloom filter '{KEY}'" in out
    assert "100 new" in out
    # The geometry is the one a crawl with the same BLOOMFILTER_* settings expects.
    assert make_filter(redis_client).contains_many(fingerprints(100)) == [True] * 100

    data = run_json(capsys, "add", *target, *sizing, path)
    assert (data["created_filter"], data["already_present"]) == (False, 100)

    code, out, err = run(capsys, "add", *target, "--bit", "20", path)
    assert (code, out) == (1, "")
    assert_one_line_error(err)
    assert "do not match the existing filter" in err
    assert f"(scrapy-redis-bloom reset --key '{KEY}')" in err  # this front end's reset


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--capacity", "0"], "--capacity option ('0') is invalid"),
        (["--bit", "99"], "--bit option ('99') is invalid"),
        (["--error-rate", "0.01"], "--error-rate option needs --capacity"),
        (["--capacity", "10", "--error-rate", "0.1", "--bit", "8"], "--bit contradict"),
        (["--capacity", "ten"], "--capacity option ('ten') is invalid. It must be a positive"),
        (["--capacity", "1.5"], "--capacity option ('1.5') is invalid. It must be a positive"),
    ],
)
def test_invalid_sizing_options_are_usage_errors(
    capsys: pytest.CaptureFixture[str],
    redis_client: redis.Redis,
    redis_url: str,
    options: list[str],
    message: str,
) -> None:
    code, out, err = run(capsys, "add", "--redis-url", redis_url, "--key", KEY, *options)
    assert (code, out) == (2, "")
    assert_one_line_error(err)
    assert message in err
    assert redis_client.keys("*") == []


def test_sizing_options_read_numbers_as_the_settings_do(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    # ``-s BLOOMFILTER_CAPACITY=1e6`` is a million; ``--capacity 1e6`` was "invalid int value".
    sizing = ["--capacity", "1e6", "--error-rate", "1e-4", "--expansion", "0"]
    lines = write_lines(tmp_path / "a.txt", fingerprints(10))
    code, _, err = run(capsys, "add", "--redis-url", redis_url, "--key", KEY, *sizing, lines)
    assert (code, err) == (0, ""), err
    assert redis_client.hget(f"{KEY}:meta", "capacity") == b"1000000"


# -- migrate-set -----------------------------------------------------------------


def test_migrate_set_into_a_new_filter(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    known = fingerprints(2000)
    redis_client.sadd("myspider:dupefilter", *known)
    argv = ["migrate-set", "--redis-url", redis_url, "--key", KEY]
    argv += ["--set-key", "myspider:dupefilter", "--capacity", "20000", "--shard-bit", "16"]

    data = run_json(capsys, *argv)

    assert data["created_filter"] is True
    assert (data["fingerprints"], data["new"], data["skipped"]) == (2000, 2000, 0)
    record = read_record(redis_client, KEY)
    bloom = RedisBloomFilter(redis_client, KEY, record.spec, record.capacity)
    assert bloom.contains_many(known) == [True] * 2000
    assert redis_client.scard("myspider:dupefilter") == 2000  # the set is left in place


def test_migrate_set_into_a_crawl_filter(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    bloom = make_filter(redis_client)
    known = fingerprints(2000)
    bloom.add_many(known[:500])
    redis_client.sadd("myspider:dupefilter", *known, "not-a-fingerprint")

    code, out, err = run(
        capsys,
        "migrate-set",
        "--redis-url",
        redis_url,
        "--key",
        KEY,
        "--set-key",
        "myspider:dupefilter",
    )

    assert (code, err) == (0, "")
    assert "Migrated 2,000 fingerprint(s)" in out
    assert "500 already present" in out
    assert "Skipped 1 member(s)" in out
    assert bloom.contains_many(known) == [True] * 2000


@pytest.mark.parametrize("numpy", [True, False], ids=["numpy", "pure-python"])
def test_big_loads_without_numpy_say_what_the_numpy_extra_saves(
    numpy: bool,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    redis_client: redis.Redis,
    redis_url: str,
) -> None:
    make_filter(redis_client)
    monkeypatch.setattr(contents, "HAVE_NUMPY", numpy)
    monkeypatch.setattr(contents, "ADVISE_FROM", 300)  # (1,000,000: too slow for a test)
    big = write_lines(tmp_path / "big.txt", fingerprints(300, "big"))
    small = write_lines(tmp_path / "small.txt", fingerprints(299, "small"))
    redis_client.sadd("myspider:dupefilter", *fingerprints(300, "set"))
    target = ["--redis-url", redis_url, "--key", KEY]
    for argv, warned in [
        (["add", *target, big], not numpy),
        (["check", *target, big], not numpy),
        (["migrate-set", *target, "--set-key", "myspider:dupefilter"], not numpy),
        (["add", *target, small], False),
    ]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="scrapy_redis_bloom"):
            code, _, _ = run(capsys, *argv)
        assert code == 0
        said = [r.getMessage() for r in caplog.records if "numpy is not installed" in r.msg]
        assert len(said) == (1 if warned else 0), (argv[0], said)
        if warned:
            assert "pip install 'scrapy-redis-bloom[numpy]'" in said[0]


def test_migrate_set_reads_the_set_on_set_redis_url(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    known = fingerprints(500, "elsewhere")
    with RedisServer() as queue:
        queue_client = queue.client()
        queue_client.sadd("myspider:dupefilter", *known)
        argv = ["migrate-set", "--redis-url", redis_url, "--key", KEY, "--capacity", "20000"]
        argv += ["--set-key", "myspider:dupefilter", "--set-redis-url", queue.url]
        data = run_json(capsys, *argv)
        assert (data["fingerprints"], data["new"]) == (500, 500)
        assert data["set_server"] == f"127.0.0.1:{queue.port}"
        assert queue_client.keys(f"{KEY}*") == []
        assert not queue_client.exists(contents.marker_key("myspider:dupefilter"))
        queue_client.close()
    record = read_record(redis_client, KEY)
    bloom = RedisBloomFilter(redis_client, KEY, record.spec, record.capacity)
    assert all(bloom.contains_many(known))
    code, out, err = run(capsys, "migrate-set", "--key", KEY, "--set-key", "s", "--set-redis-url",
                         "http://x")  # fmt: skip
    assert (code, out) == (2, "")
    assert "--set-redis-url: It must be a Redis URL" in err
    assert "redis://[user[:password]@]host" in err  # the form, not masked as a password


@pytest.mark.parametrize(("setup", "message"), [(None, "does not exist"), ("hash", "holds a hash")])
def test_migrate_set_refuses_a_missing_or_wrong_source(
    capsys: pytest.CaptureFixture[str],
    redis_client: redis.Redis,
    redis_url: str,
    setup: str | None,
    message: str,
) -> None:
    make_filter(redis_client)
    if setup == "hash":
        redis_client.hset("myspider:dupefilter", "a", "b")
    code, out, err = run(
        capsys, "migrate-set", "--redis-url", redis_url, "--key", KEY, "--set-key",
        "myspider:dupefilter",
    )  # fmt: skip
    assert (code, out) == (1, "")
    assert_one_line_error(err)
    assert message in err


def test_migrate_set_needs_a_filter_or_sizing(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    redis_client.sadd("myspider:dupefilter", *fingerprints(10))
    code, _, err = run(
        capsys, "migrate-set", "--redis-url", redis_url, "--key", KEY, "--set-key",
        "myspider:dupefilter",
    )  # fmt: skip
    assert code == 1
    assert_one_line_error(err)
    assert "--capacity" in err
    assert not redis_client.exists(f"{KEY}:meta")


@pytest.mark.timeout(120)
def test_migrate_set_says_when_the_set_is_gone_part_way(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    # An SSCAN of a key gone (evicted under volatile-ttl, expired, deleted) ends as if the
    # scan were done: a probe's run said "Migrated 66,048 fingerprint(s)" of 300,000, exit
    # 0, and the how-to's next step deletes the set.
    members = fingerprints(60_000, "gone")
    for start in range(0, len(members), 10_000):
        redis_client.sadd("myspider:dupefilter", *members[start : start + 10_000])
    marker = contents.marker_key("myspider:dupefilter")

    def evict() -> None:
        deadline = time.monotonic() + 60
        while not redis_client.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.002)
        redis_client.delete("myspider:dupefilter")

    thread = threading.Thread(target=evict)
    thread.start()
    code, out, err = run(
        capsys, "migrate-set", "--redis-url", redis_url, "--key", KEY, "--set-key",
        "myspider:dupefilter", "--capacity", "100000", "--batch", "2000",
    )  # fmt: skip
    thread.join()
    assert (code, out) == (1, "")
    assert_one_line_error(err)
    assert "is gone (evicted, expired or deleted) after" in err
    assert "of its 60,000 members were migrated" in err
    assert not redis_client.exists(marker)


def sscans(client: redis.Redis) -> int:
    """Return how many SSCAN calls the server has answered."""
    return int(client.info("commandstats").get("cmdstat_sscan", {}).get("calls", 0))


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "restart", ["during the run", "before a batch is written", "between two runs"]
)
def test_migrate_set_through_a_redis_restart_copies_every_member(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, restart: str
) -> None:
    # An SSCAN cursor is a place in one server process's hash table (seeded at its start):
    # followed after a restart, it skipped about a fifth of this set. Each scan now names the
    # process that answered, and the scan starts over when it changed. Before, a restart
    # during a run stopped it at once ("cannot connect"), and the run that resumed it left
    # members out. And the count was of members read twice: those the stale cursor read and
    # those of the batch not yet written, read again from 0 (8,000 of a 5,000-member set,
    # 3,000 "already present" in a new filter).
    members = fingerprints(60_000, "restarted")
    with RedisServer(appendonly=True) as server:
        client = server.client()
        for start in range(0, len(members), 10_000):
            client.sadd("myspider:dupefilter", *members[start : start + 10_000])
        marker = contents.marker_key("myspider:dupefilter")
        argv = ["migrate-set", "--redis-url", server.url, "--key", KEY, "--set-key"]
        argv += ["myspider:dupefilter", "--capacity", "100000", "--batch", "2000"]

        unwritten = restart == "before a batch is written"
        if unwritten:  # one batch of the whole set: pages of it read, none written
            argv[-1] = "100000"
        before = sscans(client)

        def fault() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if (sscans(client) >= before + 2) if unwritten else client.exists(marker):
                    break
                time.sleep(0.002)
            server.kill()
            if restart != "between two runs":
                time.sleep(0.3)
                server.restart()

        thread = threading.Thread(target=fault)
        thread.start()
        if restart != "between two runs":
            code, out, err = run(capsys, *argv, "--json")
            thread.join()
            assert code == 0, err
            data = json.loads(out)
            assert data["started_over"] >= 1
            said = "restarted or failed over during the scan of the set 'myspider:dupefilter'"
            assert said in caplog.text
        else:
            code, _, err = run(capsys, *argv, "--retry-timeout", "0.5")
            thread.join()
            assert code == 1, err  # Redis stayed down
            said = re.search(r"([\d,]+) of the set's 60,000 members were migrated\. Run", err)
            assert said, err
            assert 0 < int(said[1].replace(",", "")) < len(members)
            assert "it resumes from its last saved batch" in err
            server.restart()
            assert client.exists(marker)  # its progress, kept by the AOF
            data = run_json(capsys, *argv)
            assert (data["resumed"], data["started_over"]) == (True, 1)
        assert (data["fingerprints"], data["skipped"]) == (len(members), 0)
        if unwritten:  # nothing was in the filter: present are false positives alone, at
            # most 0.1 % each (the default rate at capacity; 60 expected at worst)
            assert data["already_present"] < 200, data
        record = read_record(client, KEY)
        bloom = RedisBloomFilter(client, KEY, record.spec, record.capacity)
        assert bloom.contains_many(members).count(False) == 0
        assert not client.exists(marker)
        client.close()


def test_a_scan_met_by_a_restart_starts_over_and_finds_every_key() -> None:
    # The same for reset's SCAN of the keys: a cursor from before a restart is not followed.
    with RedisServer(appendonly=True) as server:
        client = server.client()
        names = [f"orphan:{i}" for i in range(5_000)]
        for start in range(0, len(names), 1_000):
            client.mset(dict.fromkeys(names[start : start + 1_000], "x"))
        probe = inventory.probe(client, "orphan")
        keys = Scan(probe.parts, (b"SCAN",), "the keys", (b"MATCH", "orphan:*"), server=0)
        cursor, first = keys.next(0, 100)
        assert cursor
        assert first
        server.kill()
        server.restart()
        # Another process: not followed, started over; what the stale cursor read, dropped.
        assert keys.next(cursor, 100) == (0, [])
        assert keys.restarts == 1
        assert sorted(name for _, name in inventory.scan(probe, "orphan:*")) == sorted(names)
        probe.close()
        client.close()


# -- connection, credentials and usage -------------------------------------------


@pytest.mark.parametrize("command", ["info", "reset", "check", "migrate-set"])
def test_unreachable_redis(capsys: pytest.CaptureFixture[str], command: str) -> None:
    port = free_port()
    argv = [command, "--redis-url", f"redis://127.0.0.1:{port}/0", "--key", KEY]
    argv += ["--retry-timeout", "0.2"]
    argv += {"reset": ["--yes"], "migrate-set": ["--set-key", "s"], "check": ["/dev/null"]}.get(
        command, []
    )
    code, out, err = run(capsys, *argv)
    assert (code, out) == (1, "")
    assert_one_line_error(err)
    assert f"Redis at 127.0.0.1:{port}" in err
    assert "cannot connect" in err


@pytest.mark.parametrize(
    ("retry_timeout", "said"), [("0", "Tried once, for"), ("0.3", "Retried for")]
)
def test_an_unreachable_redis_is_said_tried_once_or_retried(
    capsys: pytest.CaptureFixture[str], retry_timeout: str, said: str
) -> None:
    """With no retry allowed, it said "Retried for 0.0 s (--retry-timeout = 0 s)"."""
    argv = ["info", "--redis-url", f"redis://127.0.0.1:{free_port()}/0", "--key", KEY]
    code, _, err = run(capsys, *argv, "--retry-timeout", retry_timeout)
    assert code == 1
    assert_one_line_error(err)
    assert re.search(rf"\. {said} [0-9.]+ s \(--retry-timeout = {retry_timeout} s\)\.$", err), err


@pytest.fixture
def acl_user(redis_client: redis.Redis) -> Iterator[tuple[str, str]]:
    """Create a Redis user with a password, so that the URL carries credentials."""
    name, password = "cli-operator", "s3cr3t-Pa55word"
    redis_client.acl_setuser(
        name, enabled=True, passwords=[f"+{password}"], keys=["*"], commands=["+@all"]
    )
    yield name, password
    redis_client.acl_deluser(name)


def test_password_is_never_echoed(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    redis_server: RedisServer,
    redis_client: redis.Redis,
    acl_user: tuple[str, str],
) -> None:
    name, password = acl_user
    make_filter(redis_client).add_many(fingerprints(10))
    good = f"redis://{name}:{password}@127.0.0.1:{redis_server.port}/0"
    wrong = f"redis://{name}:{password}-typo@127.0.0.1:{redis_server.port}/0"
    nowhere = f"redis://{name}:{password}@127.0.0.1:{free_port()}/0"

    code, out, err = run(capsys, "info", "--redis-url", good, "--key", KEY)
    assert (code, err) == (0, "")
    assert f"127.0.0.1:{redis_server.port}" in out
    data = run_json(capsys, "info", "--redis-url", good, "--key", KEY)
    assert data["server"] == f"127.0.0.1:{redis_server.port}"
    outputs = [out, json.dumps(data)]

    for url in (wrong, nowhere):
        code, out, err = run(
            capsys, "info", "--redis-url", url, "--key", KEY, "--retry-timeout", "0.2"
        )
        assert code == 1
        assert_one_line_error(err)
        outputs += [out, err]
    monkeypatch.setenv("REDIS_URL", nowhere)
    code, out, err = run(capsys, "reset", "--key", KEY, "--yes", "--retry-timeout", "0")
    assert code == 1
    outputs += [out, err]
    # A mistyped argument that embeds the URL is reported without its password.
    code, out, err = run(capsys, "info", "--key", KEY, good)
    assert code == 2
    assert "***" in err
    outputs += [out, err]

    for text in outputs:
        assert password not in text


@pytest.mark.parametrize(
    "url",
    [
        "http://:pw1234@host/",
        "redis://:pw1234@[::1",  # urlsplit raises before the URL is read (it printed a traceback)
    ],
)
def test_bad_url_is_a_usage_error(capsys: pytest.CaptureFixture[str], url: str) -> None:
    code, out, err = run(capsys, "info", "--redis-url", url, "--key", KEY)
    assert (code, out) == (2, "")
    assert_one_line_error(err)
    assert "--redis-url" in err
    assert "pw1234" not in err


def test_a_server_that_does_not_answer_is_waited_for_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The look for Redis Cluster nodes spent a socket timeout on a silent server and went
    # on: the record's read spent another, and the error said "Tried once" (a probe: 61 s
    # with the CLI's 30 s timeout).
    with RedisServer() as server:
        admin = server.client()
        before = int(admin.info("stats")["total_connections_received"])
        paused = server.pause(4)  # (on a connection of its own)
        argv = ["info", "--redis-url", server.url, "--key", KEY, "--timeout", "1"]
        code, _, err = run(capsys, *argv, "--retry-timeout", "0.5")
        paused.join()
        connections = int(admin.info("stats")["total_connections_received"]) - before
        admin.close()
    assert code == 1
    assert_one_line_error(err)
    assert "cannot connect (Timeout reading from " in err  # socket, or its address (older)
    assert "). Tried once, for " in err
    assert connections == 2  # the pause's and the command's one try


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["info"], "--key"),
        (["frobnicate"], "invalid choice"),
        (["info", "--key", "%(spider)s:bloomfilter"], "myspider:bloomfilter"),
        # a lone surrogate (a file name's undecodable byte): a traceback of ValueError
        (["info", "--key", "shop\udcff"], "text that UTF-8 can encode"),
        (["info", "--key", KEY, "--timeout", "0"], "--timeout"),
        (["migrate-set", "--key", KEY], "--set-key"),
        # beyond what a socket takes (it raised OverflowError) or a batch's memory allows
        (["info", "--key", KEY, "--timeout", "1e10"], "--timeout: must be at most 86,400"),
        (
            ["migrate-set", "--key", KEY, "--set-key", "s", "--batch", "99999999999999999"],
            "--batch",
        ),
    ],
)
def test_bad_arguments_are_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert_one_line_error(err)
    assert message in err


def test_without_a_command_lists_them() -> None:
    """The console script alone: the usage error lists its commands, each with its help."""
    script = Path(sys.executable).with_name("scrapy-redis-bloom")
    if not script.exists():
        pytest.skip("the scrapy-redis-bloom script is not installed (pip install -e .)")
    result = subprocess.run([str(script)], capture_output=True, text=True, timeout=60, check=False)
    assert (result.returncode, result.stdout) == (2, ""), result
    lines = result.stderr.splitlines()
    assert lines[0] == "scrapy-redis-bloom: error: give a command, one of:"
    assert lines[-1] == "See 'scrapy-redis-bloom COMMAND --help' for a command's options."
    listed = [line.split(None, 1) for line in lines[1:-1]]
    assert [name for name, _ in listed] == ["info", "reset", "add", "check", "migrate-set"]
    helps = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, timeout=60, check=False
    ).stdout
    for name, description in listed:
        assert f"{name} {description}" in " ".join(helps.split())


def test_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    assert "130 interrupted (Ctrl-C)" in out  # as the commands reference has it
    for command in ("info", "reset", "add", "check", "migrate-set"):
        assert command in out
    code, out, _ = run(capsys, "--version")
    assert code == 0
    assert out.startswith("scrapy-redis-bloom ")


def test_add_without_files_refuses_a_terminal_stdin(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    redis_client: redis.Redis,
    redis_url: str,
) -> None:
    make_filter(redis_client)
    monkeypatch.setattr(sys, "stdin", _TTY(""))
    code, out, err = run(capsys, "add", "--redis-url", redis_url, "--key", KEY)
    assert (code, out) == (2, "")
    assert_one_line_error(err)
    assert "stdin is a terminal" in err


def _grown_filter(redis_client: redis.Redis) -> tuple[RedisBloomFilter, FilterState]:
    """Return a one-shard filter of capacity 1,000 grown by 5,000 adds, and its state."""
    config = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 1_000, "BLOOMFILTER_SHARDS": 1})
    bloom = RedisBloomFilter.from_config(redis_client, KEY, config)
    bloom.add_many(fingerprints(5_000, "grown"))
    return bloom, bloom.state()


def test_info_on_a_grown_filter_charts_every_generations_bits(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    # The chart counted generation 0's bits alone over every generation's: "Fill, shard 0
    # 4.1575 %" where the shard's bits were 28 % set (a probe), and the JSON's bits set per
    # shard did not add up to its bits set.
    bloom, state = _grown_filter(redis_client)
    assert len(state.generations) > 1
    data = run_json(capsys, "info", "--redis-url", redis_url, "--key", KEY)
    assert data["bits_set_per_shard"] == [data["bits_set"]]
    code, out, _ = run(capsys, "info", "--redis-url", redis_url, "--key", KEY)
    assert code == 0
    shown = next(line for line in out.splitlines() if line.startswith("Fill, shard 0"))
    assert shown.endswith(f"{100 * state.fill_ratio:.4f} %"), shown
    bloom.close()


def test_info_on_a_grown_filter_gives_the_bits_its_bits_set_count_among(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    # "bits" is generation 0's size (what the settings asked), while "bits_set" counts every
    # generation's: bits_set / bits read 1.6 on a filter 28 % full, with nothing in the
    # output to divide by instead.
    bloom, state = _grown_filter(redis_client)
    assert state.total_bits > bloom.spec.bits
    data = run_json(capsys, "info", "--redis-url", redis_url, "--key", KEY)
    assert data["bits"] == bloom.spec.bits
    assert data["total_bits"] == state.total_bits == sum(g["bits"] for g in data["generations"])
    assert data["bits_set"] / data["total_bits"] == pytest.approx(data["fill_ratio"])
    code, out, _ = run(capsys, "info", "--redis-url", redis_url, "--key", KEY)
    assert code == 0
    rows = dict(line.split("  ", 1) for line in out.splitlines() if "  " in line)
    shown = rows["Bits set"].strip()
    assert shown == f"{state.bits_set:,} of {state.total_bits:,} (all generations together)"
    bloom.close()


def test_info_and_state_name_a_lost_or_foreign_generation(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    # Only generation 0 was checked: a generation evicted read as an empty one ("State
    # ready", "Missing or foreign shards 0", "0.00 % ... ~0 of 2,000 items") and the
    # estimated rate dropped, while the worker's next check raised FilterDamagedError.
    bloom, before = _grown_filter(redis_client)
    assert len(before.generations) == 3
    assert not before.damaged
    g1, g2 = (f"{{{KEY}:0}}:g{g}" for g in (1, 2))
    redis_client.delete(g1)  # evicted
    redis_client.setrange(g2, 0, b"not a filter")  # overwritten by another program
    state = bloom.state()
    assert [(part.key, part.found) for part in state.damaged] == [
        (g1, "missing"),
        (g2, "data that is not a Bloom filter shard"),
    ]
    assert [gen.generation for gen in state.generations] == [0]  # none read as empty
    data = run_json(capsys, "info", "--redis-url", redis_url, "--key", KEY)
    assert (data["state"], data["record_state"]) == ("damaged", "ready")
    assert (data["shards_missing"], data["shards_foreign"]) == (1, 1)
    assert [(d["shard"], d["key"], d["found"]) for d in data["damaged_shards"]] == [
        (0, g1, "missing"),
        (0, g2, "data that is not a Bloom filter shard"),
    ]
    assert [gen["generation"] for gen in data["generations"]] == [0]
    code, out, _ = run(capsys, "info", "--redis-url", redis_url, "--key", KEY)
    assert code == 0
    rows = dict(line.split("  ", 1) for line in out.splitlines() if "  " in line)
    assert rows["State"].strip().startswith("damaged: 2 part(s) missing or foreign")
    assert rows["Missing or foreign shards"].strip().startswith(f"2 ('{g1}' on ")
    bloom.close()


def test_info_names_a_lost_re_crawl_window(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str
) -> None:
    # A window the anchor says was started, and not yet expired, must exist: gone, it was
    # lost (the check-and-add script refuses it); info read it as not started.
    settings = {"BLOOMFILTER_CAPACITY": 1_000, "BLOOMFILTER_SHARDS": 2, "BLOOMFILTER_TTL": 3600}
    bloom = RedisBloomFilter.from_config(redis_client, KEY, BloomConfig.from_settings(settings))
    bloom.add_many(fingerprints(500))
    windows = sorted(k.decode() for k in redis_client.keys(f"{{{KEY}:1}}:w*"))
    assert len(windows) == 1
    assert not bloom.state().damaged
    redis_client.delete(windows[0])
    (part,) = bloom.state().damaged
    assert (part.shard, part.key, part.found) == (1, windows[0], "missing")
    data = run_json(capsys, "info", "--redis-url", redis_url, "--key", KEY)
    assert data["state"] == "damaged"
    assert [(d["key"], d["found"]) for d in data["damaged_shards"]] == [(windows[0], "missing")]
    with pytest.raises(FilterDamagedError):
        bloom.add_many(fingerprints(500, "after"))
    bloom.close()


def test_the_alias_takes_the_crawls_worker_ttl(capsys: pytest.CaptureFixture[str]) -> None:
    # After a restart the commands wait for the workers' leases to be back for a worker TTL.
    # The alias had no way to say the crawl's BLOOMFILTER_WORKER_TTL: it waited the default
    # 30 s for a crawl renewing every second, and could not wait long enough for one whose
    # TTL is longer (a reset could then delete a filter under live workers).
    with RedisServer() as server:
        client = server.client()
        make_filter(client).close()
        client.save()
        time.sleep(CLOCK_MARGIN + 2.0)  # the filter older than the next start
        server.kill()
        server.restart()
        began = time.monotonic()
        argv = ["info", "--redis-url", server.url, "--key", KEY, "--worker-ttl", "3"]
        data = run_json(capsys, *argv)
        assert data["key"] == KEY
        assert time.monotonic() - began < 3 + 5  # the default would wait 30 s
        code, _, err = run(capsys, *argv[:-1], "0.2")
        assert code == 2
        assert_one_line_error(err)
        assert "--worker-ttl" in err
        client.close()


# -- dump and restore interrupted (scrapy bloom's own, run in-process) ------------------


@pytest.fixture
def ctrl_c(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Return ``press(share, before)``: SIGINT once a dump's or restore's progress passes it.

    ``before()``, if given, runs just before. SIGINT raises KeyboardInterrupt meanwhile, as
    at a terminal (a background job, and so the tests run in one, ignores it).
    """
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    follow = contents._follow

    def press(share: float, before: Callable[[], None] | None = None) -> None:
        def following(bar: Any) -> Callable[[int, int], None]:
            update = follow(bar)
            pressed: list[bool] = []

            def at(done: int, total: int) -> None:
                update(done, total)
                if total and done >= share * total and not pressed:
                    pressed.append(True)
                    if before is not None:
                        before()
                    signal.raise_signal(signal.SIGINT)

            return at

        monkeypatch.setattr(contents, "_follow", following)

    yield press
    signal.signal(signal.SIGINT, handler)


def _bloom_settings(redis_url: str) -> dict[str, Any]:
    return {"REDIS_URL": redis_url, **SETTINGS}


def test_an_interrupted_dump_says_nothing_was_written(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    redis_client: redis.Redis,
    redis_url: str,
    ctrl_c: Callable[..., None],
) -> None:
    # It said "error: interrupted", only.
    make_filter(redis_client).add_many(fingerprints(5000))
    path = tmp_path / "books.dump"
    path.write_bytes(b"an older dump")
    ctrl_c(0.3)
    code, out, err = run_scrapy_bloom(
        capsys, _bloom_settings(redis_url), "dump", "--key", KEY, str(path)
    )
    assert (code, out) == (130, "")
    assert err == (
        f"scrapy bloom: error: interrupted: Nothing was dumped: {str(path)!r} was left as it"
        " was, and no partial file is left beside it ('books.dump.partial'). Run the dump"
        " again.\n"
    )
    assert path.read_bytes() == b"an older dump"
    assert sorted(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize(
    ("stage", "replace"),
    [("checking", False), ("checking", True), ("deleting", True), ("writing", False),
     ("writing", True), ("undoing", True)],
)  # fmt: skip
def test_an_interrupted_restore_says_what_it_left(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    redis_server: RedisServer,
    redis_client: redis.Redis,
    redis_url: str,
    ctrl_c: Callable[..., None],
    stage: str,
    replace: bool,
) -> None:
    # It said "error: interrupted", only: even after --replace had deleted the filter there.
    settings = _bloom_settings(redis_url)
    dumped = fingerprints(5000, "dumped")
    big = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 1_000_000})  # written in pieces
    source = RedisBloomFilter.from_config(redis_client, "source", big)
    source.add_many(dumped)
    source.close()
    path = str(tmp_path / "source.dump")
    assert run_scrapy_bloom(capsys, settings, "dump", "--key", "source", path)[0] == 0
    kept = fingerprints(100, "kept")
    if replace:
        make_filter(redis_client).add_many(kept)
    before = sorted(redis_client.keys(f"*{KEY}*"))
    if stage == "deleting":
        delete = backend.delete

        def deleting(*args: Any) -> int:
            deleted = delete(*args)
            signal.raise_signal(signal.SIGINT)  # as the deletion ends
            return deleted

        monkeypatch.setattr(backend, "delete", deleting)
    else:  # (the progress counts both passes of the file: checking, then writing)

        def written() -> None:  # some of its parts are in Redis by then
            assert stage == "checking" or redis_client.keys(f"*{KEY}*") != []

        ctrl_c(0.25 if stage == "checking" else 0.75, written)
    if stage == "undoing":  # Ctrl-C again, half-way through deleting what it wrote

        class Undoing(restore.Parts):
            def run(self, operation: str, calls: list[Any], **kwargs: Any) -> list[Any]:
                if operation != "undo a failed restore":
                    return super().run(operation, calls, **kwargs)
                super().run(operation, calls[: len(calls) // 2], **kwargs)
                signal.raise_signal(signal.SIGINT)
                raise AssertionError("not interrupted")

        monkeypatch.setattr(restore, "Parts", Undoing)
    argv = ["restore", "--key", KEY, path, *(["--replace"] if replace else [])]
    code, out, err = run_scrapy_bloom(capsys, settings, *argv)
    assert (code, out) == (130, "")
    assert err.startswith("scrapy bloom: error: interrupted: ")
    assert err.count("\n") == 1
    where = f"Redis at 127.0.0.1:{redis_server.port}"
    said = err.removeprefix("scrapy bloom: error: interrupted: ").rstrip()
    if stage == "checking":
        assert (
            said == "Nothing was restored, and nothing on Redis was changed: run the restore again."
        )
        assert sorted(redis_client.keys(f"*{KEY}*")) == before
        if replace:
            assert make_filter(redis_client).contains_many(kept) == [True] * len(kept)
    elif stage == "deleting":
        assert said == (
            f"Nothing was restored, and the Bloom filter '{KEY}' under the key was being"
            " deleted (--replace): part of it may be gone. Run the restore again: it deletes"
            " what is left of that filter first."
        )
    elif stage == "writing":
        assert said == "Nothing was restored: what the restore had written was deleted, and " + (
            f"so was the Bloom filter '{KEY}' that was under the key, first (--replace): there"
            f" is no filter '{KEY}' on {where} now. Run the restore again."
            if replace
            else "nothing else was changed: run the restore again."
        )
        assert redis_client.keys(f"*{KEY}*") == []
    else:
        assert said == (
            f"Restoring the Bloom filter '{KEY}' was interrupted, and deleting what it had"
            f" written was interrupted: reset the filter '{KEY}' to delete its parts. The Bloom"
            f" filter '{KEY}' under the key was deleted first (--replace)."
        )
        assert redis_client.keys(f"*{KEY}*") != []
        monkeypatch.undo()
        reset = run_scrapy_bloom(capsys, settings, "reset", "--key", KEY, "--yes")
        assert reset[0] == 0, reset
    # What it says to do works.
    monkeypatch.undo()
    code, out, err = run_scrapy_bloom(capsys, settings, *argv)
    assert (code, err) == (0, ""), err
    record = read_record(redis_client, KEY)
    restored = RedisBloomFilter(redis_client, KEY, record.spec, record.capacity)
    assert all(restored.contains_many(dumped))
