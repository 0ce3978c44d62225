"""Components that drop links, for the batching crawls (imported by ``crawl_runner.py``).

Both drop the links found on "dropping" pages (:func:`drops_links`): a spider
middleware that runs after the batching middleware on the output, and an extension
whose ``request_scheduled`` handler raises ``IgnoreRequest``. A page linked from
both a dropping page and another page must still be crawled: its link was dropped,
not seen. The page a link was found on is its ``Referer`` (set by Scrapy's
RefererMiddleware, which processes the output before the batching middleware).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

from scrapy import Request, signals
from scrapy.crawler import Crawler
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response

_PAGE = re.compile(rb"/page/([0-9]+)$")


def drops_links(page: int) -> bool:
    """Tell whether the links found on ``page`` are dropped: every even page but the first."""
    return page > 0 and page % 2 == 0


def _source(request: Request) -> int | None:
    referer = request.headers.get(b"Referer")
    match = _PAGE.search(referer) if referer else None
    return int(match.group(1)) if match else None


class DropLinksMiddleware:
    """Drop the requests yielded by dropping pages (enable it with a low order)."""

    async def process_spider_output(
        self, response: Response, result: AsyncIterator[Any], spider: Any = None
    ) -> AsyncIterator[Any]:  # Scrapy < 2.14 passes the spider too
        """Yield everything but the requests of a dropping page."""
        match = _PAGE.search(response.url.encode())
        dropping = bool(match) and drops_links(int(match.group(1)))  # type: ignore[union-attr]
        async for output in result:
            if dropping and isinstance(output, Request):
                continue
            yield output


class DropScheduledExtension:
    """Raise IgnoreRequest in ``request_scheduled`` for the links of dropping pages."""

    def __init__(self, crawler: Crawler) -> None:
        self.dropped = 0
        self.crawler = crawler
        crawler.signals.connect(self.request_scheduled, signal=signals.request_scheduled)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> DropScheduledExtension:
        """Connect the handler."""
        return cls(crawler)

    def request_scheduled(self, request: Request) -> None:
        """Drop the request if it was found on a dropping page."""
        source = _source(request)
        if source is not None and drops_links(source):
            self.dropped += 1
            assert self.crawler.stats is not None
            self.crawler.stats.inc_value("test/dropped_scheduled")
            raise IgnoreRequest(f"found on page {source}")
