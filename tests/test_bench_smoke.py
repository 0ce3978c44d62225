"""Smoke run of the benchmark: ``python bench/run.py --quick`` works end to end.

Correctness only: it must exit 0 and write results for all five measures. No timing
is asserted (a loaded CI machine says nothing about speed).
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
TIMEOUT = 120

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("scrapy_redis_bloomfilter") is None,
    reason="scrapy-redis-bloomfilter is not installed (pip install -e '.[bench]')",
)


def run_quick(out: Path) -> subprocess.CompletedProcess[str]:
    """Run the quick benchmark; on time-out, SIGTERM it so it stops its servers."""
    proc = subprocess.Popen(
        [sys.executable, str(RUN), "--quick", "--out", str(out)],
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
        pytest.fail(f"bench/run.py --quick took over {TIMEOUT} s:\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.mark.timeout(TIMEOUT + 60)
def test_quick_run_writes_all_five_measures(tmp_path: Path) -> None:
    result = run_quick(tmp_path)
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
