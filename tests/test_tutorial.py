"""The tutorial (docs/tutorial.md), run as a reader runs it, against real servers.

Every code block of the tutorial is read from the page and done in order, in a temporary
directory: ``scrapy startproject``, the settings appended to the project's settings.py,
the spider saved where the page says, two ``scrapy crawl`` workers started as
subprocesses, the start URL pushed, ``scrapy bloom info`` and ``watch`` run while the
workers hold the filter, and the stats each worker dumps compared with the page's. The
install block is checked, not run (no pip here). The hosts the page names are replaced by
the suite's Redis and a local website (tests/website.py) of :data:`PAGES` pages; the
workers get ``-s DOWNLOAD_DELAY=0`` (the site is local, and Scrapy's project template
asks for a second between requests).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from readme_blocks import ROOT, Block, Hosts, ShellState, commands, parse_blocks, shell_problems
from scrapy_run import NOT_INSTALLED, SCRAPY
from scrapy_run import scrapy as scrapy_run
from test_readme import normalised, session, stats_sample
from website import Site, SiteServer

from scrapy_redis_bloom.scrapy.stats import PREFIX, STATS

PAGE = ROOT / "docs" / "tutorial.md"
#: The site the tutorial crawls, and the test's stand-in for it.
SITE = "https://quotes.toscrape.com/"
PAGES = 60
#: Seconds the site takes per page: with the project template's one request at a time per
#: site, the crawl lasts long enough to be watched (about 6 s).
DELAY = 0.2
KEY = "quotes:bloomfilter"
#: Seconds the whole crawl may take (it takes about 45: 6 of crawling, then each worker
#: waits MAX_IDLE_TIME_BEFORE_CLOSE, checked at Scrapy's 5 s heartbeat).
TIMEOUT = 80

#: Rows of ``info`` with figures the settings fix: shown exactly as printed.
FIXED_ROWS = ("Sizing", "Hash functions (k)", "Capacity")

#: Every block of the page, in order: its id and what the test does with it.
BLOCKS = {
    "Install#1": "checked: the project and its dependencies",
    "A Scrapy project#1": "run: scrapy startproject",
    "A Scrapy project#2": "appended to settings.py, the Redis URL replaced",
    "A spider for several workers#1": "saved as the spider, the site replaced",
    "Two workers#1": "two workers started, in the project",
    "Two workers#2": "the start URL pushed (the command run with redis-py)",
    "The filter while they crawl#1": "run while the workers hold leases: the rows shown",
    "The filter while they crawl#2": "run while the workers hold leases: line for line",
    "The stats after the crawl#1": "each stat shown is in the workers' dumped stats",
}


@pytest.fixture(scope="module")
def blocks() -> dict[str, Block]:
    found = {b.id: b for b in parse_blocks(PAGE.read_text(encoding="utf-8"), "docs/tutorial.md")}
    assert list(found) == list(BLOCKS), "the tutorial's blocks changed: update BLOCKS"
    return found


def test_install_block(blocks: dict[str, Block]) -> None:
    state = ShellState(venvs=set())
    problems = [p for c in commands(blocks["Install#1"].text) for p in shell_problems(c, state)]
    assert not problems, problems


def rows(output: str) -> dict[str, str]:
    """Return the rows of ``info``'s table: label -> value."""
    found = {}
    for line in output.splitlines():
        label, _, value = line.partition("  ")
        if value.strip():
            found[label.strip()] = value.strip()
    return found


@NOT_INSTALLED
def test_the_tutorial(
    blocks: dict[str, Block], redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    with ExitStack() as stack:
        site = stack.enter_context(SiteServer(Site(PAGES), delay=DELAY))
        start = site.page_url(0)
        hosts = Hosts(blocks["A Scrapy project#2"], {"redis://localhost:6379": redis_url})
        (startproject,) = commands(blocks["A Scrapy project#1"].text)
        argv = shlex.split(startproject)
        assert argv[:2] == ["scrapy", "startproject"], startproject
        made = scrapy_run(tmp_path, *argv[1:])
        assert made.code == 0, made
        project = tmp_path / argv[2]
        settings = project / argv[2] / "settings.py"
        settings.write_text(
            settings.read_text(encoding="utf-8")
            + "\n"
            + re.sub(
                r'"(redis://[^"]+)"',
                lambda m: repr(hosts.text(m[1])),
                blocks["A Scrapy project#2"].text,
            ),
            encoding="utf-8",
        )
        spider = blocks["A spider for several workers#1"].text
        assert SITE in spider
        (project / argv[2] / "spiders" / "quotes.py").write_text(
            spider.replace(SITE, site.url + "/"), encoding="utf-8"
        )
        workers = [
            stack.enter_context(worker(project, command, tmp_path / f"worker-{i}.log"))
            for i, command in enumerate(commands(blocks["Two workers#1"].text), 1)
        ]
        assert len(workers) == 2
        wait_for(lambda: redis_client.zcard(f"{KEY}:workers") >= 2, "both workers' leases")
        (push,) = commands(blocks["Two workers#2"].text)
        cli, verb, key, url = shlex.split(push)
        assert (cli, verb, url) == ("redis-cli", "LPUSH", SITE)
        redis_client.lpush(key, start)
        wait_for(lambda: int(redis_client.hget(f"{KEY}:count", "added") or 0) >= 1, "a page")
        outputs = {}
        for name in ("The filter while they crawl#1", "The filter while they crawl#2"):
            command, shown = session(blocks[name])
            result = scrapy_run(project, *shlex.split(command)[1:])
            assert (result.code, result.err) == (0, ""), result
            outputs[name] = (shown, result.out)
        for process in workers:
            process.wait(timeout=TIMEOUT)
        logs = [(tmp_path / f"worker-{i}.log").read_text(encoding="utf-8") for i in (1, 2)]
        hits = site.hits_snapshot()
        reachable = {urlsplit(url).path for url in site.reachable_urls()}
    capture = os.environ.get("SRB_TUTORIAL_CAPTURE")
    if capture:
        Path(capture).write_text(json.dumps({"outputs": outputs, "logs": logs}, indent=2))
    assert [p.returncode for p in workers] == [0, 0], logs
    # The crawl: every page of the site fetched exactly once, by the two workers.
    pages = {path: n for path, n in hits.items() if path.startswith("/page/")}
    assert set(pages) == reachable, "pages not fetched"
    assert set(pages.values()) == {1}, "pages fetched twice"
    # info: every row the page shows is printed, with the live workers and the sizing.
    shown, printed = outputs["The filter while they crawl#1"]
    got = rows(printed)
    for label, value in rows(shown).items():
        assert label in got, f"info prints no {label!r} row:\n{printed}"
        if not re.search(r"\d", value) or label in FIXED_ROWS:
            assert got[label] == value, f"{label}: {got[label]!r}, the page says {value!r}"
    assert got["Live workers"].split()[0] == "2", printed
    # watch: line for line, the figures aside.
    shown, printed = outputs["The filter while they crawl#2"]
    assert normalised(printed) == normalised(shown), printed
    # The stats: each one the page shows is in the workers' dumps, added sums to the pages.
    dumped = [dumped_stats(log) for log in logs]
    for name in stats_sample(blocks["The stats after the crawl#1"]):
        assert any(name in stats for stats in dumped), f"no worker dumped {name}"
        assert name in ("dupefilter/filtered",) or name.removeprefix(PREFIX) in STATS
    assert sum(int(s.get(f"{PREFIX}added", 0)) for s in dumped) == PAGES
    assert max(s[f"{PREFIX}total_added"] for s in dumped) == PAGES  # the last to close
    for stats in dumped:
        assert stats.get(f"{PREFIX}filtered") == stats.get("dupefilter/filtered")
    # The README's sample after a crawl names stats a crawl dumps, too.
    readme = {b.id: b for b in parse_blocks((ROOT / "README.md").read_text(encoding="utf-8"))}
    for name in stats_sample(readme["After a crawl#1"]):
        assert any(name in stats for stats in dumped), f"README: no worker dumped {name}"


class worker:  # noqa: N801  (used as a context manager, like open())
    """A ``scrapy crawl`` worker in the project, its log in a file; killed if still running."""

    def __init__(self, project: Path, command: str, log: Path) -> None:
        argv = shlex.split(command)
        assert argv[:2] == ["scrapy", "crawl"], command
        self.argv = [str(SCRAPY), *argv[1:], "-s", "DOWNLOAD_DELAY=0"]
        self.project = project
        self.log = log

    def __enter__(self) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SCRAPY_", "REDIS_URL"))}
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                self.argv, cwd=self.project, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        return self.process

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def wait_for(condition: Any, what: str, timeout: float = TIMEOUT) -> None:
    """Wait until ``condition()`` is true (at most ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.1)


_DUMPED = re.compile(r"^ *'(?P<name>[a-z_/]+)': (?P<value>[^,]+),?$")


def dumped_stats(log: str) -> dict[str, Any]:
    """Return the numbers of the stats a worker dumped at the end of its log."""
    dump = log.rsplit("Dumping Scrapy stats:", 1)[1]
    found: dict[str, Any] = {}
    for line in dump.splitlines():
        match = _DUMPED.match(line.lstrip("{"))
        if match and re.fullmatch(r"-?[\d.e+-]+", match["value"].rstrip("}")):
            found[match["name"]] = float(match["value"].rstrip("}"))
    return found
