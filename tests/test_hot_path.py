"""The hot path stays short: request_seen of a new URL reaches the socket in a few hops.

Counted with ``sys.setprofile`` on a real crawler's dupefilter against a real Redis,
near-cache off (every request goes to Redis), default settings otherwise: the package's
function calls made by one ``request_seen`` of a new URL, and the package frames on the
stack when the command is written to the socket. Issue 22's bounds: at most 5 frames
(request_seen included) and 15 calls, on both backends (7 and 28 before on the bitmap
backend). A newcomer follows request_seen -> filter -> backend -> executor -> node.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import redis
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from scrapy_redis_bloom.scrapy.dupefilter import RFPDupeFilter

PACKAGE = str(Path(__file__).resolve().parent.parent / "scrapy_redis_bloom")
MAX_FRAMES = 5
MAX_CALLS = 15


class HotSpider(Spider):
    name = "hot"


class Recorder:
    """Counts the package's calls and its frames on the stack at each socket write."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.depths: list[list[str]] = []

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            self.calls.append(frame.f_code.co_qualname)
        elif event == "c_call" and getattr(arg, "__name__", "") in ("sendall", "send"):
            stack = []
            current: FrameType | None = frame
            while current is not None:
                if current.f_code.co_filename.startswith(PACKAGE):
                    stack.append(current.f_code.co_qualname)
                current = current.f_back
            self.depths.append(stack)


def measure(dupefilter: RFPDupeFilter, url: str) -> Recorder:
    request = Request(url)
    for i in range(300):  # connections, scripts and every shard's command head warm
        dupefilter.request_seen(Request(f"{url}-warm-{i}"))
    recorder = Recorder()
    sys.setprofile(recorder)
    try:
        seen = dupefilter.request_seen(request)
    finally:
        sys.setprofile(None)
    assert seen is False
    return recorder


@pytest.fixture
def filters(redis_url: str, bloom_redis_client: redis.Redis) -> Iterator[dict[str, RFPDupeFilter]]:
    pool = bloom_redis_client.connection_pool.connection_kwargs
    native_url = f"redis://{pool['host']}:{pool['port']}"
    made = {}
    for name, url, backend in (("bitmap", redis_url, "bitmap"), ("native", native_url, "native")):
        crawler = get_crawler(
            HotSpider,
            {"REDIS_URL": url, "BLOOMFILTER_CACHE_SIZE": 0, "BLOOMFILTER_BACKEND": backend},
        )
        made[name] = RFPDupeFilter.from_crawler(crawler)
    yield made
    for dupefilter in made.values():
        dupefilter.close("finished")


@pytest.mark.parametrize("backend", ["bitmap", "native"])
def test_request_seen_is_a_few_hops_from_the_socket(
    filters: dict[str, RFPDupeFilter], backend: str
) -> None:
    recorder = measure(filters[backend], f"https://example.com/{backend}/page")
    assert len(recorder.depths) == 1, recorder.depths  # one write: one round trip
    (stack,) = recorder.depths
    assert stack[-1] == "RFPDupeFilter.request_seen"
    assert len(recorder.calls) <= MAX_CALLS, f"{len(recorder.calls)} calls: {recorder.calls}"
    assert len(stack) <= MAX_FRAMES, f"{len(stack)} frames: {list(reversed(stack))}"
    assert len(recorder.calls) <= MAX_CALLS, f"{len(recorder.calls)} calls: {recorder.calls}"
