"""Moving from scrapy-redis's SET (docs/howto/migrate.md), every step run as a user runs it.

The page's blocks are read from the page and done in order, in a Scrapy project in a
temporary directory, against the suite's real Redis and a local website
(tests/website.py) of :data:`OLD_PAGES` pages:

1. the project runs with the page's scrapy-redis settings (its first block): a
   ``scrapy crawl myspider`` (a subprocess) fetches every page once and scrapy-redis's
   own dupefilter fills its SET;
2. settings.py becomes the page's second block (the add-on, the sizing, no
   ``DUPEFILTER_CLASS``);
3. ``scrapy bloom migrate --spider myspider`` runs in the project as the page writes it,
   and prints what the page shows, line for line (the server's address aside);
4. the site grows to :data:`NEW_PAGES` pages, and the page's ``scrapy crawl myspider``
   fetches none of the pages the SET had (but the start URL, which Scrapy never filters)
   and every new page its links lead to, each once, its filter counting them;
5. the page's ``redis-cli DEL`` (run with redis-py) deletes the SET, and a last crawl on
   the filter alone fetches nothing but its start URL.

A block added to the page, or one removed or moved, fails :func:`test_the_steps_are_the_pages`.
"""

from __future__ import annotations

import re
import shlex
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import redis
from readme_blocks import ROOT, Block, Hosts, commands, parse_blocks
from scrapy_run import NOT_INSTALLED
from scrapy_run import scrapy as scrapy_run
from test_readme import session
from test_tutorial import dumped_stats
from website import Site, SiteServer

from scrapy_redis_bloom.scrapy.stats import PREFIX

PAGE = "docs/howto/migrate.md"
SPIDER = "myspider"
SET_KEY = f"{SPIDER}:dupefilter"
FILTER_KEY = f"{SPIDER}:bloomfilter"
#: The site the first crawl (on scrapy-redis's SET) fetches whole.
OLD_PAGES = 40
#: The site the crawl on the filter finds: the old pages and new ones.
NEW_PAGES = 80
#: Seconds a crawl may take (each takes 2 to 4).
TIMEOUT = 120

#: The page's blocks, in order, and what the test does with each.
STEPS = {
    "Move from scrapy-redis's SET#1": "the project's settings.py for the first crawl",
    "Step 2: the filter's settings#1": "the project's settings.py from then on",
    "Step 3: copy the SET into the filter#1": "run in the project; prints the page's lines",
    "Step 4: crawl on#1": "run in the project: the crawl on the filter",
    "Step 5: delete the SET#1": "run with redis-py; a crawl after it on the filter alone",
}

SPIDER_CODE = """
import scrapy


class MySpider(scrapy.Spider):
    name = "myspider"
    start_urls = [{start!r}]

    def parse(self, response):
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href)
"""


def page_blocks() -> list[Block]:
    return parse_blocks((ROOT / PAGE).read_text(encoding="utf-8"), PAGE)


def test_the_steps_are_the_pages() -> None:
    assert [b.id for b in page_blocks()] == list(STEPS)


def make_project(root: Path, start: str) -> Path:
    """Write a Scrapy project with ``myspider``, which follows every link from ``start``."""
    (root / "proj" / "spiders").mkdir(parents=True)
    (root / "scrapy.cfg").write_text("[settings]\ndefault = proj.settings\n")
    (root / "proj" / "__init__.py").write_text("")
    (root / "proj" / "spiders" / "__init__.py").write_text("")
    (root / "proj" / "spiders" / "myspider.py").write_text(SPIDER_CODE.format(start=start))
    return root


def use_settings(project: Path, found: Block, hosts: Hosts) -> None:
    """Make settings.py the project's names and the block, its hosts the test's."""
    text = re.sub(r'"(redis://[^"]+)"', lambda m: repr(hosts.text(m[1])), found.text)
    (project / "proj" / "settings.py").write_text(
        'BOT_NAME = "proj"\nSPIDER_MODULES = ["proj.spiders"]\nLOG_LEVEL = "INFO"\n' + text,
        encoding="utf-8",
    )


def crawl(project: Path, command: str, site: SiteServer) -> tuple[Counter[str], dict[str, float]]:
    """Run the page's ``scrapy crawl``; return the pages it fetched and its dumped stats."""
    argv = shlex.split(command)
    assert argv[:2] == ["scrapy", "crawl"], command
    before = site.hits_snapshot()
    result = scrapy_run(project, *argv[1:], timeout=TIMEOUT)
    assert result.code == 0, result.err[-3000:]
    assert "Traceback" not in result.err, result.err[-3000:]
    fetched = site.hits_snapshot()
    fetched.subtract(before)
    return +fetched, dumped_stats(result.err)


def path(page: int) -> str:
    return f"/page/{page}"


@NOT_INSTALLED
def test_move_from_the_set_step_by_step(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    blocks = {b.id: b for b in page_blocks()}
    assert list(blocks) == list(STEPS)
    before, after, migrate, crawl_on, delete = (blocks[step] for step in STEPS)
    address = redis_url.split("://", 1)[1].split("/", 1)[0]
    with ExitStack() as stack:
        site = stack.enter_context(SiteServer(Site(OLD_PAGES)))
        project = make_project(tmp_path, site.page_url(0))
        hosts = Hosts(before, {"redis://localhost:6379": redis_url})

        # The crawl on scrapy-redis's SET: every page once, each fingerprint in the SET.
        assert 'DUPEFILTER_CLASS = "scrapy_redis.dupefilter.RFPDupeFilter"' in before.text
        use_settings(project, before, hosts)
        first, _ = crawl(project, f"scrapy crawl {SPIDER}", site)
        # (The start URL twice: Scrapy never filters a start request, and the first link
        # back to it is the SET's first sight of it.)
        assert first == Counter({path(page): 1 for page in range(OLD_PAGES)}) + Counter([path(0)])
        assert redis_client.type(SET_KEY) == b"set"
        assert redis_client.scard(SET_KEY) == OLD_PAGES
        assert redis_client.keys(f"{FILTER_KEY}*") == []

        # Step 2: the filter's settings.
        assert "DUPEFILTER_CLASS" not in after.text
        assert "ADDONS" in after.text
        use_settings(project, after, Hosts(after, {"redis://localhost:6379": redis_url}))

        # Step 3: migrate, as the page writes it; it prints what the page shows.
        command, shown = session(migrate)
        argv = shlex.split(command)
        assert argv[:3] == ["scrapy", "bloom", "migrate"], command
        result = scrapy_run(project, *argv[1:], timeout=TIMEOUT)
        assert (result.code, result.err) == (0, ""), result
        printed = result.out.replace(address, "localhost:6379")
        assert printed.strip() == shown.strip(), f"{command} printed:\n{printed}"
        assert redis_client.exists(f"{SET_KEY}:bloom-migration") == 0

        # Step 4: the site grew; the crawl on the filter fetches only what is new.
        site.site.pages = NEW_PAGES
        (command,) = commands(crawl_on.text)
        second, stats = crawl(project, command, site)
        expected = {0}  # the start URL: Scrapy's start requests are never filtered
        todo = [0]
        while todo:
            for target in Site(NEW_PAGES).links(todo.pop()):
                if target >= OLD_PAGES and target not in expected:
                    expected.add(target)
                    todo.append(target)
        assert len(expected) > 10, expected
        assert second == Counter({path(page): 1 for page in expected}), (
            f"refetched: {sorted(p for p in second if int(p.rsplit('/', 1)[1]) < OLD_PAGES)}"
        )
        assert stats[f"{PREFIX}added"] == len(expected) - 1
        assert stats[f"{PREFIX}filtered"] > 0
        assert stats[f"{PREFIX}filtered"] == stats["dupefilter/filtered"]

        # Step 5: the SET deleted, the filter alone remembers every page.
        (command,) = commands(delete.text)
        argv = shlex.split(command)
        assert argv[:2] == ["redis-cli", "DEL"], command
        assert redis_client.execute_command(*argv[1:]) == 1
        assert redis_client.exists(SET_KEY) == 0
        third, _ = crawl(project, f"scrapy crawl {SPIDER}", site)
        assert third == Counter({path(0): 1})
