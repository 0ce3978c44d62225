"""One filter round trip per crawled page: a spider middleware checks a response's links together.

A Bloom filter cannot forget, so batching is off when a middleware processes the output after
this one (it could drop a request already marked seen).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, Self

from scrapy import Request, signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.misc import load_object
from scrapy.utils.python import global_object_name

from scrapy_redis_bloom.core.events import emit, guard_loggers
from scrapy_redis_bloom.core.settings import BATCH_MAX, BATCH_WINDOW
from scrapy_redis_bloom.scrapy.dupefilter import RFPDupeFilter

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

_OUTPUT_METHODS = ("process_spider_output", "process_spider_output_async")


class _Window:
    """The requests of several responses, checked together when the window closes (asyncio)."""

    def __init__(self, check: Callable[[list[Request]], None], seconds: float, limit: int):
        self._check = check
        self._seconds = seconds
        self._limit = limit
        self._held: list[Request] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._timer: asyncio.TimerHandle | None = None

    async def join(self, requests: list[Request]) -> None:
        """Hold ``requests`` until the window closes and they are checked."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._held.extend(requests)
        self._waiters.append(waiter)
        if len(self._held) >= self._limit:
            self.close()
        elif self._timer is None:
            self._timer = loop.call_later(self._seconds, self.close)
        await waiter

    def close(self) -> None:
        """Check every held request in one call, then resume the responses that wait."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        held, waiters = self._held, self._waiters
        self._held, self._waiters = [], []
        try:
            self._check(held)
        finally:
            for waiter in waiters:
                if not waiter.done():  # a response cancelled meanwhile (the crawl stops)
                    waiter.set_result(None)


def later_middlewares(settings: BaseSettings, cls: type[Any]) -> list[str]:
    """Name the enabled spider middlewares whose output processing runs after ``cls``'s."""
    # Scrapy >= 2.14 merges the setting with its _BASE also where a class is given as its path.
    merged = getattr(settings, "get_component_priority_dict_with_base", settings.getwithbase)
    enabled: list[tuple[float, str, Any]] = []
    for path, order in dict(merged("SPIDER_MIDDLEWARES")).items():
        if order is None:
            continue
        component = load_object(path) if isinstance(path, str) else path
        name = path if isinstance(path, str) else global_object_name(path)
        enabled.append((order, name, component))
    ours = [order for order, _, c in enabled if isinstance(c, type) and issubclass(c, cls)]
    return [
        f"{name} (order {order})"
        for order, name, component in sorted(enabled, key=lambda e: e[0])
        if ours
        and order <= ours[0]
        and not (isinstance(component, type) and issubclass(component, cls))
        and any(hasattr(component, method) for method in _OUTPUT_METHODS)
    ]


def later_in_chain(methods: Sequence[Callable[..., Any] | None], middleware: object) -> list[str]:
    """Name the middlewares whose output method comes after ``middleware``'s in ``methods``."""
    mine = [i for i, m in enumerate(methods) if getattr(m, "__self__", None) is middleware]
    later = methods[mine[0] + 1 :] if mine else []
    return [global_object_name(type(getattr(m, "__self__", m))) for m in later if m is not None]


class BatchingMiddleware:
    """Check the links of each response in one filter round trip (see the module)."""

    BLOOM_BATCHING = True  #: How the dupefilter finds it in SPIDER_MIDDLEWARES (no import back).

    def __init__(
        self, crawler: Crawler, limit: int = BATCH_MAX.default, window: float = 0.0
    ) -> None:
        guard_loggers()  # this module's logger among them (see core.events)
        self.crawler = crawler
        self.limit = limit
        self.window = window  #: Seconds a response's requests wait for others' (0: none).
        self._window: _Window | None = None
        self.disabled: str | None = None  #: Why batching is off for this crawl, or None.
        self._dupefilter: RFPDupeFilter | None = None
        self._resolved = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Build for a crawl; NotConfigured (and an INFO line) if its dupefilter is not ours."""
        settings = crawler.settings
        dupefilter_cls = load_object(settings["DUPEFILTER_CLASS"])
        if not (isinstance(dupefilter_cls, type) and issubclass(dupefilter_cls, RFPDupeFilter)):
            logger.info(
                "BatchingMiddleware is off: DUPEFILTER_CLASS is %s, not"
                " scrapy_redis_bloom.dupefilter.RFPDupeFilter.",
                settings["DUPEFILTER_CLASS"],
            )
            raise NotConfigured
        middleware = cls(crawler, BATCH_MAX.read(settings), BATCH_WINDOW.read(settings))
        if later := later_middlewares(settings, cls):
            middleware.disable(", ".join(later))
        crawler.signals.connect(middleware._spider_opened, signal=signals.spider_opened)
        return middleware

    def disable(self, later: str) -> None:
        """Stop batching for the crawl: ``later`` processes the output after this middleware."""
        self.disabled = later
        logger.warning(
            "BatchingMiddleware does not batch in this crawl: %s process(es) the spider"
            " output after it and could drop a request already marked seen in the Bloom"
            " filter. Each request is checked alone instead. Give BatchingMiddleware the"
            " lowest order in SPIDER_MIDDLEWARES (e.g. 0) to batch.",
            later,
        )
        if self.crawler.stats is not None:
            try:  # at the start (from_crawler, spider_opened): the stats store may be down
                self.crawler.stats.set_value("bloomfilter/batching_disabled", 1)
            except Exception as exc:
                emit(
                    logger,
                    logging.WARNING,
                    "Could not set the stat bloomfilter/batching_disabled: %s: %s",
                    type(exc).__name__,
                    exc,
                )

    def _spider_opened(self, spider: Spider) -> None:
        """Find the dupefilter; check the running chain: nothing may process the output after us."""
        self._resolve()
        if self.disabled is not None:
            return
        try:
            manager = self.crawler.engine.scraper.spidermw
            methods = list(manager.methods["process_spider_output"])
        except (AttributeError, KeyError, RuntimeError) as exc:  # Scrapy internals moved
            logger.debug("Could not read the spider middleware chain: %r", exc)
            return
        if later := later_in_chain(methods, self):
            self.disable(", ".join(later))

    def _resolve(self) -> RFPDupeFilter | None:
        """Find the crawl's dupefilter (built when the scheduler opens), once."""
        if not self._resolved:
            self._resolved = True
            self._dupefilter = RFPDupeFilter.for_crawler(self.crawler)
            if self._dupefilter is None:
                logger.info(
                    "BatchingMiddleware passes the output through: this crawl's scheduler"
                    " uses no scrapy_redis_bloom dupefilter."
                )
        return self._dupefilter

    async def process_spider_output(
        self, response: Response, result: AsyncIterator[Any], spider: Spider | None = None
    ) -> AsyncIterator[Any]:
        """Yield items at once; hold the requests to filter, check them together, yield them."""
        dupefilter = None if self.disabled is not None else self._resolve()
        if dupefilter is None:
            async for output in result:
                yield output
            return
        held: list[Request] = []
        try:
            async for output in result:
                if isinstance(output, Request) and not output.dont_filter:
                    held.append(output)
                    if len(held) >= self.limit:
                        self._check(dupefilter, held)
                        for request in held:
                            yield request
                        held = []
                else:
                    yield output
        except Exception:
            # The callback failed: what it yielded before is scheduled, as without us.
            self._check(dupefilter, held)
            for request in held:
                yield request
            raise
        window = self._window_for(dupefilter) if held else None
        if window is None:
            self._check(dupefilter, held)
        else:
            await window.join(held)
        for request in held:
            yield request

    def _window_for(self, dupefilter: RFPDupeFilter) -> _Window | None:
        """Return the window this crawl's responses share, or None (off, or no asyncio loop)."""
        if self.window <= 0:
            return None
        if self._window is None:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                self.window = 0.0
                logger.warning(
                    "BLOOMFILTER_BATCH_WINDOW is ignored: it needs Scrapy's asyncio reactor"
                    " (TWISTED_REACTOR = 'twisted.internet.asyncioreactor."
                    "AsyncioSelectorReactor', the default). Each response is checked alone."
                )
                return None
            self._window = _Window(
                lambda held: self._check(dupefilter, held), self.window, self.limit
            )
        return self._window

    def _check(self, dupefilter: RFPDupeFilter, held: list[Request]) -> None:
        """Pre-answer the held requests (see :meth:`.RFPDupeFilter.check_batch`)."""
        if not held:
            return
        try:
            dupefilter.check_batch(held)
        except Exception:
            # A bug past the filter call: said, counted; request_seen checks each alone.
            dupefilter.bloom.events.count("batch_failed")
            emit(
                logger,
                logging.ERROR,
                "Holding the answers of %d request(s) failed",
                len(held),
                exc_info=True,
            )
