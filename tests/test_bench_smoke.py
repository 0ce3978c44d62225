"""Smoke runs of the benchmarks: ``bench/run.py --quick`` and ``bench/faults.py --quick``.

Correctness only: each must exit 0 and write its results. No timing is asserted (a
loaded CI machine says nothing about speed), nor what the contenders did under the
faults beyond the control row: that is the fault table's business.
"""

from __future__ import annotations

import importlib.util
import json
import math
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "bench" / "run.py"
FAULTS = ROOT / "bench" / "faults.py"
TIMEOUT = 300
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))

#: A target may read N/A when the run says it left out what it needs: (in the
#: target's text, in the run's "skipped" notes).
LEFT_OUT_REASONS = (
    ("round trip", "bloomfilter/round_trips"),
    ("native", "BLOOMFILTER_BACKEND = 'native'"),
    ("BF.MADD", "RedisBloom"),
    ("BF.ADD", "RedisBloom"),
    ("batched", "ours, batched"),
    ("blocked", "BLOOMFILTER_BLOCKED"),
    ("TTL", "BLOOMFILTER_TTL"),
)

needs_old_peer = pytest.mark.skipif(
    importlib.util.find_spec("scrapy_redis_bloomfilter") is None,
    reason="scrapy-redis-bloomfilter is not installed (pip install -e . --group bench)",
)


def run_quick(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a benchmark with ``--quick``; on time-out, SIGTERM it so it stops its servers."""
    proc = subprocess.Popen(
        [sys.executable, str(script), "--quick", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            stdout, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        pytest.fail(f"{script.name} --quick took over {TIMEOUT} s:\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@needs_old_peer
@pytest.mark.timeout(TIMEOUT + 60)
def test_quick_run_writes_all_measures(tmp_path: Path) -> None:
    from redis_modules import bloom_server

    bloom = bloom_server() is not None
    result = run_quick(RUN, "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "result" in result.stdout  # the results table, with its targets

    document = json.loads((tmp_path / "results.json").read_text())
    measures = document["measures"]
    assert set(measures) >= {"a", "b", "c", "d", "e", "t", "s", "g"}
    assert document["redisbloom"] is bloom
    skipped = " ".join(document["skipped"])
    if not bloom:
        assert "RedisBloom" in skipped
    assert document["checks_failed"] == []
    assert document["redis"]["version"]
    assert document["machine"]["nproc"] >= 1

    ours, scrapy_redis, old = "ours", "scrapy-redis 0.9 (SET)", "scrapy-redis-bloomfilter 0.8.1"
    redisbloom = "RedisBloom BF.ADD"
    peers = (ours, scrapy_redis, old, *((redisbloom,) if bloom else ()))
    for measure in ("a", "b"):
        for name in peers:
            assert measures[measure][name]["median"] > 0, (measure, name)
    assert measures["c"][ours]["median"] > 0
    assert measures["c"]["scrapy-redis SET (pipelined SADD)"]["median"] > 0
    assert measures["c"][old]["extra"]["bytes"] > 0
    fpr = measures["c"]["fpr"]
    assert {ours, old} <= set(fpr)
    assert all(0 <= entry["median"] < 0.01 for entry in fpr.values())
    assert all(entry["median"] > 0 for entry in measures["d"].values())
    if bloom:
        assert measures["d"]["RedisBloom BF.MADD (pipelined)"]["median"] > 0
        assert measures["c"]["RedisBloom (BF.RESERVE p n)"]["median"] > 0
    # (t): Redis time per check and commands per check, every contender measured.
    usec, commands = measures["t"]["usec"], measures["t"]["commands"]
    for name in (ours, "ours, 1M @ 1e-4", scrapy_redis, old, *((redisbloom,) if bloom else ())):
        assert usec[name]["median"] > 0, name
        assert commands[name]["median"] >= 1, name
    assert commands[old]["median"] >= 2  # k GETBITs, then k SETBITs for a new URL
    if document["blocked_setting_recognised"]:  # the classic layout beside the default
        for name in ("ours, classic layout", "ours, 1M @ 1e-4, classic layout"):
            assert usec[name]["median"] > 0, name
            assert commands[name]["median"] >= 1, name
        # (c): ours is blocked (the default); the classic layout is measured beside it.
        assert measures["c"]["ours"]["extra"]["block_bits"] > 0
        assert measures["c"]["ours, classic layout"]["median"] > 0
        assert measures["c"]["ours, classic layout"]["extra"]["block_bits"] == 0
        assert fpr["ours, classic layout"]["extra"]["expected"] > 0
        texts = {t["text"] for t in document["targets"]}
        assert "ours, classic layout within 2% of the Bloom optimum" in texts
        assert "ours (default layout) within 2% of its bitmap's bytes" in texts
    else:
        assert "BLOOMFILTER_BLOCKED" in skipped
    # (t) at the size the package is for: unblocked always, the others where they can run.
    assert usec["ours, 100M @ 1e-4, unblocked"]["median"] > 0
    if bloom:
        assert usec["RedisBloom BF.ADD, 100M @ 1e-4"]["median"] > 0
    assert_size_measure(document, bloom)
    for name in peers:
        assert measures["e"]["span"][name]["median"] > 0, name
        assert measures["e"]["filter_usec"][name]["median"] > 0, name
        assert measures["e"]["redis_usec"][name]["median"] > 0, name
    crawls = document["crawls"]
    assert {c["contender"] for c in crawls} >= set(peers)
    for crawl in crawls:
        assert crawl["error"] is None, crawl
        assert crawl["pages_fetched"] == crawl["pages_reachable"] > 0, crawl
        assert 0 < crawl["filter_usec"] <= crawl["redis_usec"], crawl

    targets = document["targets"]
    assert {t["measure"] for t in targets} == {"a", "b", "c", "d", "e", "t", "s", "g"}
    assert_targets_judged(targets, skipped)
    markdown = (tmp_path / "results.md").read_text()
    for heading in ("## Results", "## Targets", "## Crawls (e)", "## How it was measured"):
        assert heading in markdown
    assert "## Redis time per check at 100M @ 1e-4 (t)" in markdown


def assert_targets_judged(targets: list[dict[str, Any]], skipped: str) -> None:
    """Every target has a finite value, or reads N/A for a contender the run left out."""
    for target in targets:
        if target["value"] is None:  # N/A only for a figure the run says it left out
            assert any(
                needle in target["text"] and reason in skipped
                for needle, reason in LEFT_OUT_REASONS
            ), (target, skipped)
        else:
            assert math.isfinite(target["value"]), target


#: Measure (s)'s contenders: always there, with blocking known, with RedisBloom.
SIZE_ALWAYS = ("ours, defaults (bitmap, numpy)", "ours, default install (no numpy, no hiredis)")
SIZE_BLOCKED = ("ours, BLOOMFILTER_BLOCKED=True", "ours, BLOOMFILTER_BLOCKED=False")
SIZE_BLOOM = (
    "ours, native: add_many",
    "RedisBloom BF.MADD",
    "RedisBloom BF.MADD, default install (no hiredis)",
)


def assert_size_measure(document: dict[str, Any], bloom: bool) -> None:
    """(s) measured every cell with every contender it can run, and their bytes on the wire.

    Two sizes, two call sizes, on loopback and through the 1 Gbit/s link.
    """
    size = {k: v for k, v in document["measures"]["s"].items() if k != "info"}
    info = document["measures"]["s"]["info"]
    assert info["links"] == ["loopback", "1gbit"]
    assert len(size) == len(info["capacities"]) * len(info["call_sizes"]) * 2 == 8
    expected = set(SIZE_ALWAYS)
    if document["blocked_setting_recognised"]:
        expected |= set(SIZE_BLOCKED)
    if bloom:
        expected |= set(SIZE_BLOOM)
    linked = {"ours, defaults (bitmap, numpy)"} | (
        {"RedisBloom BF.MADD", "ours, native: add_many"} if bloom else set()
    )
    through = [label for label in size if label.endswith(", 1 Gbit/s link")]
    assert len(through) == 4
    for label, metrics in size.items():
        if label in through:
            assert set(metrics["fp_per_s"]) == linked, label
            continue
        assert set(metrics["fp_per_s"]) == expected, label
        for metric in ("fp_per_s", "cpu_usec", "command_usec", "wire_bytes"):
            for name, samples in metrics[metric].items():
                assert samples["median"] > 0, (label, metric, name)
        # Each fingerprint crosses the wire at least once: 40 hex characters.
        assert metrics["wire_bytes"]["ours, defaults (bitmap, numpy)"]["median"] > 40
        children = ["ours, default install (no numpy, no hiredis)"]
        if bloom:
            children.append("RedisBloom BF.MADD, default install (no hiredis)")
        for name in children:
            child = metrics["fp_per_s"][name]["extra"]
            assert child["numpy"] is False, child
            assert child["hiredis"] is False, child
            assert child["hiredis_used_by_redis_py"] is False, child
        defaults = metrics["fp_per_s"]["ours, defaults (bitmap, numpy)"]["extra"]
        assert defaults["numpy"] is (importlib.util.find_spec("numpy") is not None)
        if bloom:
            assert metrics["fp_per_s"]["ours, native: add_many"]["extra"]["backend"] == "native"
    rows = [row for row in document["rows"] if row["measure"].startswith("s ")]
    # Per cell, a row per contender for its rate and one for its bytes on the wire.
    assert len(rows) == 4 * 2 * len(expected) + 4 * 2 * len(linked)


@pytest.mark.timeout(TIMEOUT + 60)
def test_quick_size_measure_alone(tmp_path: Path) -> None:
    """(s) runs on its own in seconds: its cells, targets and README table are written."""
    from redis_modules import bloom_server

    bloom = bloom_server() is not None
    result = run_quick(RUN, "--only", "s", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads((tmp_path / "results.json").read_text())
    assert set(document["measures"]) == {"s"}
    assert document["checks_failed"] == []
    targets = document["targets"]
    assert {t["measure"] for t in targets} == {"s"}
    # Per loopback cell four (issue 23) and its bytes on the wire; per cell through the
    # link its bytes (its speed is a target from calls of 100,000 at 100M on).
    assert len(targets) == 4 * 5 + 4
    assert_targets_judged(targets, " ".join(document["skipped"]))
    assert_size_measure(document, bloom)
    markdown = (tmp_path / "results.md").read_text()
    assert "## Bulk loads at the size it is for (s)" in markdown
    assert "| 100M @ 1e-4, calls of 10,000 |" in markdown


#: Measure (g)'s states: always there, and with RedisBloom (the native backend, BF.ADD).
STATES_ALWAYS = (
    "bitmap, fresh",
    "bitmap, 0.9x",
    "bitmap, just past capacity (1.05x)",
    "bitmap, grown to 3x",
    "bitmap, EXPANSION=0, 0.9x",
    "bitmap, TTL=3600, fresh window",
    "bitmap, TTL=3600, 0.9x in the window",
    "bitmap, TTL, next window (0.9x before, 0.45x now)",
    "scrapy-redis SADD, set of 0.9x",
)
STATES_BLOOM = (
    "native, fresh",
    "native, grown to 3x",
    "native, TTL=3600, fresh window",
    "native, TTL=3600, 0.9x in the window",
    "native, TTL, next window (0.9x before, 0.45x now)",
    "RedisBloom BF.ADD, scaling, 3x",
)


@pytest.mark.timeout(TIMEOUT + 60)
@pytest.mark.parametrize("no_bloom", [False, True], ids=["bloom", "no-bloom"])
def test_quick_states_measure_alone(tmp_path: Path, no_bloom: bool) -> None:
    """(g) runs on its own in seconds: every state, new and seen, with its targets and table.

    Seen fingerprints must be answered seen (a failed check otherwise); without RedisBloom
    the native states and BF.ADD are left out and their targets read N/A.
    """
    from redis_modules import bloom_server

    bloom = not no_bloom and bloom_server() is not None
    result = run_quick(RUN, "--only", "g", "--out", str(tmp_path), *(["--no-bloom"] * no_bloom))
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads((tmp_path / "results.json").read_text())
    assert set(document["measures"]) == {"g"}
    assert document["checks_failed"] == []
    measure = document["measures"]["g"]
    [label] = [key for key in measure if key not in ("info", "warnings")]
    assert label == "20k @ 1e-4"
    states = {s["name"] for s in measure["info"][label]["states"]}
    assert states == set(STATES_ALWAYS) | (set(STATES_BLOOM) if bloom else set())
    usec, commands, trips = (measure[label][m] for m in ("usec", "commands", "round_trips"))
    for state in states:
        for kind in ("new", "seen"):
            name = f"{state}: {kind}"
            assert usec[name]["median"] > 0, name
            assert commands[name]["median"] >= 1, name
            assert trips[name]["median"] >= 1, name
            if kind == "seen":  # every fingerprint the fill added is found
                assert usec[name]["extra"]["answered_seen"] == [300], name
    filled = {s["name"]: s["fill"] for s in measure["info"][label]["states"]}
    assert filled["bitmap, grown to 3x"] == 3.0
    assert filled["bitmap, just past capacity (1.05x)"] == 1.05
    # The window before filled to 0.9x, then, past a window boundary, this one to 0.45x.
    assert filled["bitmap, TTL, next window (0.9x before, 0.45x now)"] == 1.35
    targets = document["targets"]
    assert {t["measure"] for t in targets} == {"g"}
    assert len(targets) == 22
    assert_targets_judged(targets, " ".join(document["skipped"]))
    if not bloom:
        assert all(t["value"] is None for t in targets if "native" in t["text"])
    markdown = (tmp_path / "results.md").read_text()
    assert f"## Redis time per check by state, {label} (g)" in markdown
    assert "Issue 32's targets" in markdown


def test_floor_measures_every_way_on_a_small_filter(tmp_path: Path) -> None:
    """bench/floor.py runs, at a small size, and writes a row per way with its CPU."""
    from redis_modules import bloom_server

    if bloom_server() is None:
        pytest.skip("no redis-server that loads RedisBloom here (tests/redis_modules.py)")
    out = tmp_path / "floor.md"
    small = ["--capacity", "1000000", "--elements", "3000", "--rounds", "1", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "floor.py"), *small],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in out.read_text().splitlines() if line.endswith("x |")]
    assert [row.split(" | ")[0] for row in rows] == [
        "| BF.MADD (RedisBloom)",
        "| block scripts (the bulk path's, no numpy)",
        "| GETRANGE + SETRANGE (the bulk path's)",
        "| BITFIELD SET u1 x k",
    ]
    for row in rows:  # Redis spent some CPU on each way's elements
        assert float(row.split(" | ")[1].split()[0]) > 0


def test_old_plugin_offsets_match_its_own_hash() -> None:
    """The in-memory reproduction behind (c)'s FPR of scrapy-redis-bloomfilter is exact."""
    pytest.importorskip("scrapy_redis_bloomfilter")
    from peers import check_old_plugin_offsets, old_plugin_offsets
    from workloads import fingerprints

    values = fingerprints(300)
    assert check_old_plugin_offsets(values, 25, 5)
    assert check_old_plugin_offsets(values, 30, 6)
    first = old_plugin_offsets(values[:1], 25, 5)
    assert first[0] == [sum(map(ord, values[0])) & (2**25 - 1)]  # seed 0 sums the characters
    with pytest.raises(ValueError, match="ASCII values of one length"):
        old_plugin_offsets(["ab", "abc"], 25, 5)


def test_command_clock_counts_top_level_commands_once(redis_server: Any) -> None:
    """(t) and (e) sum each command once: a script's inner commands are in its own time."""
    from cmdtime import CommandClock

    admin, worker = redis_server.client(), redis_server.client()
    try:
        with CommandClock(admin) as clock:
            worker.eval(
                "redis.call('set', KEYS[1], 'v'); return redis.call('get', KEYS[1])", 1, "k"
            )
            worker.sadd("s", "x")
            admin.get("k")  # the benchmark's own connection: left out
            spent = clock.read()
        names = [c.name for c in spent.commands]
        assert "eval" in names
        assert "sadd" in names
        assert "set" not in names
        assert "get" not in names
        assert spent.commandstats["set"]["calls"] == 1  # commandstats does count it
        [script] = spent.select(lambda c: c.name == "eval")
        assert script.key == "k"
        assert script.usec >= 0
        assert not spent.overflowed
        slowlog = admin.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"]
        assert slowlog != "0"  # restored on exit
    finally:
        admin.close()
        worker.close()


@pytest.mark.timeout(TIMEOUT + 60)
def test_quick_fault_table_runs_and_writes_both_outputs(tmp_path: Path) -> None:
    result = run_quick(FAULTS, "--only", "none,restart,evict", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "pages never fetched" in result.stdout  # the table's header

    document = json.loads((tmp_path / "faults.json").read_text())
    assert document["harness_errors"] == []
    crawls = document["crawls"]
    assert {(c["fault"], c["contender"]) for c in crawls} == {
        ("none", "ours"),
        ("none", "scrapy-redis"),
        ("restart", "ours"),
        ("restart", "scrapy-redis"),
        ("evict", "ours"),
        ("evict", "lenient"),
        ("evict", "scrapy-redis"),
    }
    for crawl in crawls:
        assert crawl["harness_error"] is None, crawl
        assert not crawl["timed_out"], crawl
        if crawl["fault"] == "none":  # the control: the site's counts are exact
            assert crawl["never_fetched"] == 0, crawl
            assert crawl["duplicate_fetches"] == 0, crawl
            assert crawl["finish_reason"] == "finished", crawl
        else:
            assert crawl["injected_at"] is not None, crawl
            assert crawl["fault_details"]["summary"], crawl
    assert document["redis"]["version"]
    markdown = (tmp_path / "faults.md").read_text()
    for heading in ("## Faults", "## Every crawl, in the order run", "## How it was measured"):
        assert heading in markdown


def test_redisbloom_peer_answers_like_a_dupefilter(bloom_redis_server: Any) -> None:
    """(a), (b), (t), (e)'s RedisBloom peer: BF.ADD's reply read as scrapy-redis reads SADD's."""
    from peers import BFAddDupeFilter, bf_expected_rate, bf_madd, bf_mexists
    from scrapy import Request
    from scrapy.settings import Settings

    settings = Settings(
        {
            "REDIS_URL": bloom_redis_server.url,
            "REDISBLOOM_CAPACITY": 1000,
            "REDISBLOOM_ERROR_RATE": 0.001,
            "REDISBLOOM_EXPANSION": 0,
        }
    )
    dupefilter = BFAddDupeFilter.from_settings(settings)
    again = BFAddDupeFilter.from_settings(settings)  # the filter exists: kept, no error
    try:
        assert again.key == dupefilter.key
        assert dupefilter.request_seen(Request("https://example.com/a")) is False
        assert dupefilter.request_seen(Request("https://example.com/a")) is True
        assert again.request_seen(Request("https://example.com/b")) is False
        info = dupefilter.server.execute_command("BF.INFO", dupefilter.key, "CAPACITY")
        values = list(info.values()) if isinstance(info, dict) else info
        assert [int(v) for v in (values if isinstance(values, list) else [values])] == [1000]
        elements = [f"{i:040x}" for i in range(500)]
        assert bf_madd(dupefilter.server, dupefilter.key, elements) == 500
        assert bf_mexists(dupefilter.server, dupefilter.key, elements) == 500
        assert 0 < bf_expected_rate(dupefilter.server, dupefilter.key) < 0.001
    finally:
        dupefilter.clear()
        dupefilter.server.close()
        again.server.close()
