"""Run one Scrapy crawl with the Bloom dupefilter and write what happened as JSON.

The crawl tests start this script as a subprocess, because Twisted's reactor cannot be
restarted inside the pytest process. For example::

    python tests/crawl_runner.py --site http://127.0.0.1:8000
        --redis-url redis://127.0.0.1:6379/0 --scheduler scrapy-redis --mode follow
        --settings '{"SCHEDULER_PERSIST": true}' --output /tmp/result.json

Schedulers: ``scrapy-redis`` (``scrapy_redis.scheduler.Scheduler``, its queue in
Redis) or ``default`` (Scrapy's own). Spider modes:

* ``follow``: start at ``/page/0`` and follow every link of every page;
* ``seed003``: request ``/search?wd=0`` .. ``9`` and then ``/search?wd=0`` .. ``99``,
  i.e. 110 requests of which 10 are duplicates;
* ``shared``: a scrapy-redis ``RedisSpider`` named ``shared``, one of several workers:
  it takes its start URL from ``shared:start_urls`` in Redis, follows every link, and
  closes once the shared queue has been idle for ``MAX_IDLE_TIME_BEFORE_CLOSE`` seconds.

``--spider-name`` renames the spider (the filter's key is ``<name>:bloomfilter``) and
``--start-dont-filter`` gives the start requests ``dont_filter=True``. In ``--settings``, a
null removes a base setting (``{"DUPEFILTER_CLASS": null}``: no dupefilter line).

The output file holds:

* ``stats``: the crawl's final stats, datetimes as ISO strings;
* ``fetched``: the URL of every response the spider received, in order;
* ``offered``: how many requests the spider yielded, start requests included;
* ``warnings``: every Python warning raised in this process, as text;
* ``error``: null, or the type and message of the exception that stopped the crawl,
  with ``chain``: the same for each exception it was raised while handling.

The exit status is 0 when the crawl ran and 1 when it failed. Everything goes to the
log (stderr) as under ``scrapy crawl``: an exception that stops the crawl is logged by
Twisted as an unhandled error. The output path is printed on stdout at the end.
"""

from __future__ import annotations

import logging
import warnings

logger = logging.getLogger("crawl_runner")

# Record every warning, including those raised while Scrapy is imported: a subprocess
# cannot fail the test on a warning itself, so the test asserts on this list.
_WARNINGS: list[str] = []


def _record_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: object = None,
    line: str | None = None,
) -> None:
    text = f"{filename}:{lineno}: {category.__name__}: {message}"
    _WARNINGS.append(text)
    logger.warning("Python warning: %s", text)


warnings.showwarning = _record_warning
# Once per place in the code: scrapy-redis warns on every request it schedules.
warnings.simplefilter("default")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import datetime  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import AsyncIterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import scrapy  # noqa: E402
from scrapy.crawler import CrawlerProcess  # noqa: E402
from scrapy.http import Response  # noqa: E402
from scrapy_redis.spiders import RedisSpider  # noqa: E402
from twisted.python.failure import Failure  # noqa: E402

SCHEDULERS = {
    "scrapy-redis": "scrapy_redis.scheduler.Scheduler",
    "default": "scrapy.core.scheduler.Scheduler",
}

#: Small filter: 100,000 items at a false-positive rate of 1e-6 is about 351 KiB in one
#: shard with k = 20, so a crawl of a few hundred pages never sees a false positive.
BASE_SETTINGS: dict[str, Any] = {
    "DUPEFILTER_CLASS": "scrapy_redis_bloom.dupefilter.RFPDupeFilter",
    "BLOOMFILTER_CAPACITY": 100_000,
    "BLOOMFILTER_ERROR_RATE": 1e-6,
    "LOG_LEVEL": "INFO",
    "TELNETCONSOLE_ENABLED": False,
    "ROBOTSTXT_OBEY": False,
    # PriorityQueue.pop ignores it; a list queue would block the reactor in BRPOP.
    "SCHEDULER_IDLE_BEFORE_CLOSE": 0,
    "COOKIES_ENABLED": False,
    "RETRY_ENABLED": False,
    "DOWNLOAD_TIMEOUT": 20,
    # The close-spider extension stops a crawl that runs away (a broken filter).
    "CLOSESPIDER_TIMEOUT": 60,
}


class SiteSpider(scrapy.Spider):
    """Crawl the test site: follow its links, or request the seed-003 search pages."""

    name = "site"

    def __init__(
        self,
        site: str,
        mode: str,
        start_dont_filter: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.site = site.rstrip("/")
        self.mode = mode
        self.start_dont_filter = start_dont_filter
        self.fetched: list[str] = []
        self.offered = 0

    async def start(self) -> AsyncIterator[scrapy.Request]:
        """Yield the start requests of the mode."""
        if self.mode == "follow":
            urls = [f"{self.site}/page/0"]
        elif self.mode == "seed003":
            words = [*range(10), *range(100)]
            urls = [f"{self.site}/search?wd={wd}" for wd in words]
        else:
            raise ValueError(f"unknown spider mode {self.mode!r}")
        for url in urls:
            self.offered += 1
            yield scrapy.Request(url, dont_filter=self.start_dont_filter)

    def parse(self, response: Response, **kwargs: Any) -> Any:
        """Record the response; in follow mode, request every link of the page."""
        self.fetched.append(response.url)
        if self.mode != "follow":
            return
        for href in response.css("a::attr(href)").getall():
            self.offered += 1
            yield response.follow(href, callback=self.parse)


class SharedSiteSpider(RedisSpider):  # type: ignore[misc]  # scrapy-redis is untyped
    """One of several workers crawling the test site through one Redis."""

    name = "shared"
    redis_key = "shared:start_urls"
    #: Where each worker adds its pid once it polls for start URLs.
    ready_key = "shared:ready"
    #: Start URLs taken per poll. scrapy-redis 0.9 ignores REDIS_START_URLS_BATCH_SIZE
    #: (it takes CONCURRENT_REQUESTS at a time) unless the spider sets this.
    redis_batch_size = 1

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fetched: list[str] = []
        self.offered = 0

    async def start(self) -> AsyncIterator[Any]:
        """Take start URLs; with ``SHARED_START_WAIT``, wait that long for them to come.

        scrapy-redis reads its start URLs once at start, then only when the spider is
        idle, which Scrapy checks every 5 s. A launcher that waits for every worker
        in ``shared:ready`` before pushing one start URL per worker (each takes one
        per poll) has them all start crawling at once.
        """
        self.server.sadd(self.ready_key, os.getpid())
        deadline = time.monotonic() + self.settings.getfloat("SHARED_START_WAIT", 0)
        while True:
            requests = list(self.next_requests())
            for request in requests:
                yield request
            if requests or time.monotonic() >= deadline:
                return
            await asyncio.sleep(0.05)

    def make_request_from_data(self, data: bytes) -> scrapy.Request:
        """Request the pushed URL through the dupefilter.

        scrapy-redis makes start requests ``dont_filter=True``: the start page would be
        fetched again when a page links back to it.
        """
        return scrapy.Request(data.decode(), callback=self.parse)

    def parse(self, response: Response, **kwargs: Any) -> Any:
        """Record the response and request every link of the page."""
        self.fetched.append(response.url)
        for href in response.css("a::attr(href)").getall():
            self.offered += 1
            yield response.follow(href, callback=self.parse)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (datetime.datetime, datetime.date, datetime.timedelta)):
        return str(value) if isinstance(value, datetime.timedelta) else value.isoformat()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def _close_scrapy_redis_leftovers() -> None:
    """Close the Redis client of any scrapy-redis Scheduler still in memory.

    When its dupefilter refuses to open, scrapy-redis's Scheduler is dropped without
    closing the client it made; collecting it then warns of an unclosed socket,
    depending on when the garbage collector runs. That socket is scrapy-redis's, not
    ours: close it, so that the warnings left are about our own connections.
    """
    from scrapy_redis.scheduler import Scheduler

    for obj in gc.get_objects():
        if isinstance(obj, Scheduler) and getattr(obj, "server", None) is not None:
            obj.server.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the crawl; return what the output file holds."""
    settings = dict(BASE_SETTINGS)
    settings["REDIS_URL"] = args.redis_url
    settings["SCHEDULER"] = SCHEDULERS[args.scheduler]
    settings.update(json.loads(args.settings))
    # A null removes a base setting (e.g. DUPEFILTER_CLASS, to test the add-on alone).
    settings = {name: value for name, value in settings.items() if value is not None}

    spidercls: type[scrapy.Spider] = SharedSiteSpider if args.mode == "shared" else SiteSpider
    if args.spider_name:
        spidercls = type(
            "NamedSiteSpider", (SiteSpider,), {"name": args.spider_name, "__module__": __name__}
        )
    process = CrawlerProcess(settings)
    # Scrapy's configure_logging() routed warnings to logging: record them again.
    warnings.showwarning = _record_warning
    crawler = process.create_crawler(spidercls)
    error: dict[str, Any] | None = None

    def failed(failure: Failure) -> Failure:
        nonlocal error
        # Scrapy may raise again while closing a crawl that failed to open (e.g. "Engine
        # slot not assigned"), hiding the cause: record the whole chain of exceptions.
        chain: list[dict[str, Any]] = []
        exc: BaseException | None = failure.value
        while exc is not None and len(chain) < 10:
            chain.append(
                {
                    "type": type(exc).__name__,
                    "bases": [base.__name__ for base in type(exc).__mro__],
                    "message": str(exc),
                }
            )
            exc = exc.__cause__ or exc.__context__
        error = {**chain[0], "chain": chain}
        # Left unhandled, as under "scrapy crawl": Twisted logs it, as a user would see it.
        return failure

    kwargs: dict[str, Any] = {}
    if args.mode != "shared":
        kwargs = {"site": args.site, "mode": args.mode, "start_dont_filter": args.start_dont_filter}
    deferred = process.crawl(crawler, **kwargs)
    deferred.addErrback(failed)
    process.start()
    # Twisted logs an unhandled failure when its Deferred is collected: do it now,
    # while Scrapy's log handler is still installed.
    del deferred
    _close_scrapy_redis_leftovers()
    gc.collect()
    if process.bootstrap_failed and error is None:
        error = {"type": "BootstrapFailed", "message": "the crawl failed to start", "chain": []}

    spider = crawler.spider
    try:
        stats = crawler.stats.get_stats() if crawler.stats is not None else {}
    except RuntimeError:  # Scrapy 2.14+: no stats before the crawl starts (an add-on refused)
        stats = {}
    return {
        "error": error,
        "spider": crawler.spidercls.name,
        "stats": {name: _jsonable(value) for name, value in stats.items()},
        "fetched": list(spider.fetched) if spider is not None else [],
        "offered": spider.offered if spider is not None else 0,
    }


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, crawl, write the output file; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--site", required=True, help="base URL of the test site")
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--scheduler", choices=sorted(SCHEDULERS), default="scrapy-redis")
    parser.add_argument("--mode", choices=["follow", "seed003", "shared"], required=True)
    parser.add_argument("--spider-name", default=None, help="spider name (default: 'site')")
    parser.add_argument(
        "--start-dont-filter",
        action="store_true",
        help="give the start requests dont_filter=True",
    )
    parser.add_argument("--settings", default="{}", help="extra settings, a JSON object")
    parser.add_argument("--output", required=True, type=Path)
    args = parser.parse_args(argv)

    result = run(args)
    result["warnings"] = list(_WARNINGS)
    args.output.write_text(json.dumps(result, indent=2, sort_keys=True))
    print(args.output)
    return 1 if result["error"] is not None else 0


if __name__ == "__main__":
    sys.exit(main())
