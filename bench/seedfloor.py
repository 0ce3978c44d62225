"""How often a small classic filter loses a page, by hash scheme: ``python bench/seedfloor.py``.

The test suite's crawl of 300 pages through a filter sized for 30 at 1e-6
(``tests/test_crawl.py``, ten times past capacity, classic layout), run in memory many
times: each crawl adds 300 new fingerprints one at a time, as the check-and-add script
does (look in every generation, add to the newest, start the next at capacity), with the
package's own generations and offsets, and counts the new ones answered "seen" (a page
never fetched). Hash scheme 1 (two seeds) has a floor of n/S**2 under the rate of a
generation of S bits; scheme 3 (three seeds), n/S**3 (docs/explanation/hashing.md). No
Redis: the bits are the scheme's, which tests/test_scheme_lua.py holds to the scripts'.

``--crawls N`` per scheme (default 3,000; about a second per 400 on one core).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import random

import mmh3

from scrapy_redis_bloom import BloomConfig
from scrapy_redis_bloom.core.generations import Growth
from scrapy_redis_bloom.core.hashing import CLASSIC_SCHEME, SCHEME_VERSION, WIDE, offsets

logger = logging.getLogger("bench.seedfloor")

#: The crawl test's filter and site.
SETTINGS = {
    "BLOOMFILTER_CAPACITY": 30,
    "BLOOMFILTER_ERROR_RATE": 1e-6,
    "BLOOMFILTER_BLOCKED": False,
}
PAGES = 300


def lost_pages(growth: Growth, rng: random.Random) -> int:
    """Return how many of one crawl's new fingerprints the filter answers "seen"."""
    spec, gens = growth.spec, growth.generations
    bits: list[set[int]] = [set() for _ in gens]
    newest = held = lost = 0
    for _ in range(PAGES):
        h1, h2 = mmh3.hash64(rng.randbytes(20).hex(), seed=0, x64arch=True, signed=False)
        q = h1 // spec.shards

        def element(g: int, h2: int = h2, q: int = q) -> list[int]:
            gen = gens[g]
            x, y = (
                (q % gen.bits, h2 % gen.seed_range)
                if g == 0
                else (
                    q % WIDE % gen.bits,
                    h2 % WIDE % gen.seed_range,
                )
            )
            return offsets(x, y, gen.hash_count, gen.bits)

        if any(all(o in bits[g] for o in element(g)) for g in range(newest + 1)):
            lost += 1
            continue
        if held >= gens[newest].capacity:
            newest, held = newest + 1, 0
        bits[newest].update(element(newest))
        held += 1
    return lost


def main() -> None:
    """Run the crawls for each scheme and log one line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crawls", type=int, default=3_000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config = BloomConfig.from_settings(SETTINGS)
    for scheme in (SCHEME_VERSION, CLASSIC_SCHEME):
        spec = dataclasses.replace(config.spec, two_seeds=scheme == SCHEME_VERSION)
        growth = Growth(spec, config.capacity, expansion=2)
        rng = random.Random(scheme)
        counts = [lost_pages(growth, rng) for _ in range(args.crawls)]
        first = growth.generation(0)
        logger.info(
            "hash scheme %d: %d of %d crawls lost a page (%.2f%%), %d pages in all;"
            " generation 0: %d items in %d bits, floor %.3g",
            scheme,
            sum(1 for c in counts if c),
            args.crawls,
            100 * sum(1 for c in counts if c) / args.crawls,
            sum(counts),
            first.capacity,
            first.bits,
            first.seed_floor,
        )


if __name__ == "__main__":
    main()
