"""The demo spider: a scrapy-redis ``RedisSpider`` that follows every link of the demo site.

Start it with ``scrapy crawl demo`` in as many processes as you like, then push a start
URL to the Redis list ``demo:start_urls``::

    redis-cli LPUSH demo:start_urls '{"url": "http://127.0.0.1:8000/page/0"}'

One worker takes it; the links found on each page go through the shared Bloom filter
into the shared queue, from which every worker takes requests. Each worker closes on
its own after ``MAX_IDLE_TIME_BEFORE_CLOSE`` idle seconds once the queue has drained.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import scrapy
from scrapy.http import Response
from scrapy_redis import defaults
from scrapy_redis.spiders import RedisSpider
from scrapy_redis.utils import bytes_to_str

#: How often a worker waiting for the crawl to begin looks into Redis, in seconds.
START_POLL_INTERVAL = 0.1


class DemoSpider(RedisSpider):  # type: ignore[misc]  # scrapy-redis is untyped
    """Crawl the demo site from the start URLs in Redis, yielding one item per page."""

    name = "demo"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # scrapy-redis measures idleness from this attribute, but sets it once, when its
        # module is imported, and resets it only while start URLs are waiting. Without a
        # reset on every response, a worker busy for longer than MAX_IDLE_TIME_BEFORE_CLOSE
        # would close at the first moment the shared queue is empty, even if other
        # workers are about to fill it again.
        self.spider_idle_start_time = int(time.time())

    async def start(self) -> AsyncIterator[Any]:
        """Yield the start URLs waiting in Redis, or wait until the crawl has begun.

        Scrapy 2.13+ calls ``start()``, not scrapy-redis's ``start_requests()``. A worker
        that finds no start URL (another worker took it) waits, up to ``DEMO_START_WAIT``
        seconds, until requests appear in the shared queue: otherwise it would go idle
        and only look at the queue again at Scrapy's next idle check, 5 seconds later.
        """
        deadline = time.monotonic() + self.settings.getfloat("DEMO_START_WAIT", 15)
        while True:
            found = False
            for request in self.next_requests():
                found = True
                yield request
            if found or self._queue_has_requests() or time.monotonic() >= deadline:
                return
            await asyncio.sleep(START_POLL_INTERVAL)

    def _queue_has_requests(self) -> bool:
        """Tell whether the scheduler queue that all workers share holds requests."""
        template = self.settings.get("SCHEDULER_QUEUE_KEY", defaults.SCHEDULER_QUEUE_KEY)
        return bool(self.server.exists(template % {"spider": self.name}))

    def make_request_from_data(self, data: bytes | str) -> scrapy.Request | None:
        """Build the request for one start URL from Redis: ``{"url": ...}`` or a bare URL.

        Unlike scrapy-redis's default, the request goes through the dupefilter (no
        ``dont_filter``): the start page is recorded in the Bloom filter, so the links
        back to it from other pages are dropped as duplicates.
        """
        text = bytes_to_str(data, self.redis_encoding).strip()
        url = json.loads(text).get("url") if text.startswith("{") else text
        if not url:
            self.logger.warning("Ignoring start URL data without a URL: %r", text)
            return None
        return scrapy.Request(url, callback=self.parse)

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        """Yield the page as an item, then a request for every link on the demo site."""
        self.spider_idle_start_time = int(time.time())  # busy: see __init__
        site = (self.settings.get("DEMO_SITE_URL") or response.urljoin("/")).rstrip("/") + "/"
        links = response.css("a::attr(href)").getall()
        yield {
            "url": response.url,
            "title": response.css("title::text").get(),
            "links": len(links),
        }
        for href in links:
            url = response.urljoin(href)
            if url.startswith(site):
                yield response.follow(url, callback=self.parse)
