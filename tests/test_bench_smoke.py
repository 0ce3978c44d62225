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

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "bench" / "run.py"
FAULTS = ROOT / "bench" / "faults.py"
TIMEOUT = 150

needs_old_peer = pytest.mark.skipif(
    importlib.util.find_spec("scrapy_redis_bloomfilter") is None,
    reason="scrapy-redis-bloomfilter is not installed (pip install -e '.[bench]')",
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
def test_quick_run_writes_all_five_measures(tmp_path: Path) -> None:
    result = run_quick(RUN, "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "result" in result.stdout  # the results table, with its targets

    document = json.loads((tmp_path / "results.json").read_text())
    measures = document["measures"]
    assert set(measures) >= {"a", "b", "c", "d", "e"}
    assert document["checks_failed"] == []
    assert document["redis"]["version"]
    assert document["machine"]["nproc"] >= 1

    ours, scrapy_redis, old = "ours", "scrapy-redis 0.9 (SET)", "scrapy-redis-bloomfilter 0.8.1"
    for measure in ("a", "b"):
        for name in (ours, scrapy_redis, old):
            assert measures[measure][name]["median"] > 0, (measure, name)
    assert measures["c"][ours]["median"] > 0
    assert measures["c"]["scrapy-redis SET (pipelined SADD)"]["median"] > 0
    assert measures["c"][old]["extra"]["bytes"] > 0
    assert all(entry["median"] > 0 for entry in measures["d"].values())
    for name in (ours, scrapy_redis, old):
        assert measures["e"]["span"][name]["median"] > 0, name
    crawls = document["crawls"]
    assert {c["contender"] for c in crawls} == {ours, scrapy_redis, old}
    for crawl in crawls:
        assert crawl["error"] is None, crawl
        assert crawl["pages_fetched"] == crawl["pages_reachable"] > 0, crawl

    targets = document["targets"]
    assert {t["measure"] for t in targets} == {"a", "b", "c", "d", "e"}
    assert all(t["value"] is not None and math.isfinite(t["value"]) for t in targets)
    markdown = (tmp_path / "results.md").read_text()
    for heading in ("## Results", "## Targets", "## Crawls (e)", "## How it was measured"):
        assert heading in markdown


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
