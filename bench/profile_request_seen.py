"""Profile ``request_seen`` on unique URLs with pyinstrument.

Run: ``python bench/profile_request_seen.py``.

It starts its own redis-server, builds the dupefilter as Scrapy does, offers 20,000
new requests and prints pyinstrument's call tree: where a request's time goes.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from pyinstrument import Profiler
from redis_server import RedisServer
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from scrapy_redis_bloom.scrapy.dupefilter import RFPDupeFilter

CALLS = 20_000


class ProfileSpider(Spider):
    """A spider only to name the filter."""

    name = "profile"


def main() -> int:
    """Profile CALLS request_seen calls and print the tree."""
    requests = [Request(f"https://example.com/page/{i}?q={i % 7}") for i in range(CALLS)]
    with RedisServer() as server:
        crawler = get_crawler(ProfileSpider, {"REDIS_URL": server.url})
        dupefilter = RFPDupeFilter.from_crawler(crawler)
        profiler = Profiler(interval=0.0002)
        profiler.start()
        for request in requests:
            dupefilter.request_seen(request)
        profiler.stop()
        dupefilter.close("finished")
    sys.stdout.write(profiler.output_text(unicode=False, color=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
