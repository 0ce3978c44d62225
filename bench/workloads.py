"""Deterministic inputs: unique URLs, a crawl-like stream with repeats, fingerprints.

Every generator depends only on its arguments, so two runs (and every contender of
one run) see exactly the same inputs.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass

#: Where the generated URLs live. Nothing is fetched: they are only fingerprinted.
HOST = "https://shop.example.com"


def url(i: int) -> str:
    """Return the i-th URL: a product page with a query string, as a crawl finds them.

    The query is deliberately out of order, so canonicalisation (part of every
    fingerprint) does the work it does on real links.
    """
    return f"{HOST}/catalog/{i % 97}/item-{i}.html?ref=list&page={i // 50}&sort=price"


def unique_urls(count: int) -> list[str]:
    """Return ``count`` distinct URLs."""
    return [url(i) for i in range(count)]


@dataclass(frozen=True)
class Stream:
    """A sequence of URLs as a crawler offers them to its dupefilter."""

    urls: list[str]
    distinct: int

    @property
    def repeats(self) -> int:
        """Calls that offer a URL offered before."""
        return len(self.urls) - self.distinct

    @property
    def repeat_fraction(self) -> float:
        """Share of calls that repeat an earlier URL."""
        return self.repeats / len(self.urls) if self.urls else 0.0


def crawl_stream(calls: int, repeat: float = 0.85, seed: int = 20240601) -> Stream:
    """Return a crawl-like stream of ``calls`` URLs of which about ``repeat`` are repeats.

    Each call offers a new URL with probability ``1 - repeat``; otherwise it repeats
    an URL already offered, chosen Zipf-like by age: the rank ``r`` (0 = the first URL
    offered, like a home page or a navigation link present on every page) is drawn
    log-uniformly, so ``P(r)`` is about proportional to ``1 / (r + 1)``.
    """
    if not 0.0 <= repeat < 1.0:
        raise ValueError(f"repeat must be in [0, 1), got {repeat}")
    rng = random.Random(seed)
    urls: list[str] = []
    distinct = 0
    for _ in range(calls):
        if distinct == 0 or rng.random() >= repeat:
            urls.append(url(distinct))
            distinct += 1
        else:
            rank = int(math.exp(rng.random() * math.log(distinct + 1))) - 1
            urls.append(url(min(rank, distinct - 1)))
    return Stream(urls=urls, distinct=distinct)


def fingerprints(count: int) -> list[str]:
    """Return ``count`` distinct 40-hex SHA1 fingerprints, as scrapy-redis stores them."""
    return [hashlib.sha1(url(i).encode()).hexdigest() for i in range(count)]
