"""Measure what growth costs and buys: ``python bench/growth.py`` writes ``bench/growth.md``.

A growing filter (``BLOOMFILTER_EXPANSION=2``, the default) adds a larger, tighter
generation whenever the last one is full, so it promises to stay under the configured
error rate p however far it is filled past its capacity; a fixed-size one
(``BLOOMFILTER_EXPANSION=0``) does not. This script checks that promise and its price
against a real redis-server (it starts its own):

1. capacity 100,000 at p = 0.001, filled to 1x, 4x and 10x its capacity with distinct
   fingerprints: the false-positive rate measured on 200,000 never-added ones, growing
   against fixed size, with the generations and the memory Redis holds;
2. at 10x, the grown filter's memory against a fixed-size filter sized for the
   1,000,000 items from the start, and against the optimum -n ln p / (ln 2)^2 bits;
3. 1,000,000 items at p = 1e-4 (1x), growing against fixed size in bytes per item:
   what sizing generation 0 for p/2 (so the generations sum to under p) costs.

The measured rates are reported as they come out; a growing filter over p is flagged.
"""

from __future__ import annotations

import hashlib
import logging
import math
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from redis_server import RedisServer  # type: ignore[import-not-found,unused-ignore]

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.core.sizing import false_positive_rate

logger = logging.getLogger("bench.growth")

OUTPUT = Path(__file__).resolve().parent / "growth.md"
COMMAND = "PYTHONPATH=. python bench/growth.py"

CAPACITY = 100_000
RATE = 0.001
FILLS = (1, 4, 10)
QUERIES = 200_000
BIG_CAPACITY = 1_000_000
BIG_RATE = 1e-4
CHUNK = 100_000  # elements per add_many / contains_many call
MIB = 1024 * 1024


def fingerprints(tag: str, start: int, stop: int) -> list[str]:
    """Return the distinct 40-hex fingerprints sha1(f"{tag}{i}") for i in [start, stop)."""
    return [hashlib.sha1(f"{tag}{i}".encode()).hexdigest() for i in range(start, stop)]


def six_sigma_bound(rate: float, queries: int) -> float:
    """Return the rate 6 binomial sigmas above ``rate`` over ``queries`` queries."""
    expected = queries * rate
    return (expected + 6 * math.sqrt(expected * (1 - rate))) / queries


def optimal_bytes(items: int, rate: float) -> float:
    """Return the bytes an optimal Bloom filter takes: -n ln p / (ln 2)^2 / 8."""
    return -items * math.log(rate) / math.log(2) ** 2 / 8


def build(client: Any, key: str, capacity: int, rate: float, expansion: int) -> RedisBloomFilter:
    """Return a filter made as the dupefilter makes it from these settings."""
    cfg = BloomConfig.from_settings(
        {
            "BLOOMFILTER_CAPACITY": capacity,
            "BLOOMFILTER_ERROR_RATE": rate,
            "BLOOMFILTER_EXPANSION": expansion,
        }
    )
    logger.info("%s: %s", key, cfg.describe())
    return RedisBloomFilter.from_config(client, key, cfg)


def add(bloom: RedisBloomFilter, members: list[str], start: int, stop: int) -> float:
    """Add members[start:stop] in chunks; return the items added per second."""
    began = time.perf_counter()
    for at in range(start, stop, CHUNK):
        bloom.add_many(members[at : min(stop, at + CHUNK)])
    seconds = time.perf_counter() - began
    logger.info(
        "%s: added %s items in %.1f s (%.0f/s)",
        bloom.key,
        f"{stop - start:,}",
        seconds,
        (stop - start) / seconds,
    )
    return (stop - start) / seconds


def false_positives(bloom: RedisBloomFilter, strangers: list[str]) -> int:
    """Return how many of ``strangers`` (never added) the filter says it holds."""
    began = time.perf_counter()
    hits = 0
    for at in range(0, len(strangers), CHUNK):
        hits += sum(bloom.contains_many(strangers[at : at + CHUNK]))
    logger.info(
        "%s: %s false positives in %s queries (%.1f s)",
        bloom.key,
        f"{hits:,}",
        f"{len(strangers):,}",
        time.perf_counter() - began,
    )
    return hits


@dataclass(frozen=True)
class Point:
    """One measurement of a filter filled to ``items``."""

    mode: str
    fill: int
    items: int
    hits: int
    queries: int
    theory: float | None  # (1 - e^(-kn/m))^k, fixed size only
    predicted: float  # state.estimated_fpr: what the bits set say
    generations: int
    memory_bytes: int
    shards: tuple[int, ...]  # per generation: the shards that have it
    add_rate: float  # items/s added since the last point

    @property
    def measured(self) -> float:
        """The measured false-positive rate."""
        return self.hits / self.queries

    @property
    def z(self) -> float:
        """How many binomial sigmas the hits are off the rate the bits predict."""
        expected = self.queries * self.predicted
        return (self.hits - expected) / math.sqrt(expected * (1 - self.predicted))


def fill_series(
    client: Any, expansion: int, members: list[str], strangers: list[str]
) -> list[Point]:
    """Fill one filter (capacity CAPACITY, rate RATE) to each of FILLS, measuring each."""
    mode = "growth (EXPANSION=2)" if expansion else "fixed (EXPANSION=0)"
    bloom = build(client, f"bench-growth:e{expansion}", CAPACITY, RATE, expansion)
    bloom.clear()
    points: list[Point] = []
    held = 0
    try:
        for fill in FILLS:
            items = fill * CAPACITY
            add_rate = add(bloom, members, held, items)
            held = items
            hits = false_positives(bloom, strangers)
            state = bloom.state()
            spec = state.spec
            theory = (
                None
                if expansion
                else false_positive_rate(spec.bits, spec.hash_count, items, spec.block_bits)
            )
            points.append(
                Point(
                    mode,
                    fill,
                    items,
                    hits,
                    len(strangers),
                    theory,
                    state.estimated_fpr,
                    len(state.generations),
                    state.memory_bytes,
                    tuple(gen.shards for gen in state.generations),
                    add_rate,
                )
            )
            logger.info(
                "%s at %dx: measured %.3g, generations %d, %.2f MiB",
                mode,
                fill,
                hits / len(strangers),
                len(state.generations),
                state.memory_bytes / MIB,
            )
    finally:
        bloom.clear()
        bloom.close()
    return points


@dataclass(frozen=True)
class Filled:
    """A filter filled with ``items`` items: its memory, generations and measured rate."""

    label: str
    items: int
    hits: int
    queries: int
    generations: int
    memory_bytes: int
    add_rate: float


def fill_once(
    client: Any,
    key: str,
    label: str,
    rate: float,
    capacity: int,
    expansion: int,
    members: list[str],
    strangers: list[str],
) -> Filled:
    """Fill a new filter with members[:capacity], then measure it."""
    bloom = build(client, f"bench-growth:{key}", capacity, rate, expansion)
    bloom.clear()
    try:
        add_rate = add(bloom, members, 0, capacity)
        hits = false_positives(bloom, strangers)
        state = bloom.state()
    finally:
        bloom.clear()
        bloom.close()
    return Filled(
        label,
        capacity,
        hits,
        len(strangers),
        len(state.generations),
        state.memory_bytes,
        add_rate,
    )


def verdict(measured: float, rate: float, bound: float) -> str:
    """OK when ``measured`` is at most ``rate``; else say by how much it is over."""
    if measured <= rate:
        return "OK"
    if measured <= bound:
        return "over p (within 6-sigma)"
    return "**over p, beyond 6-sigma**"


def fpr_table(points: list[Point]) -> list[str]:
    """Part 1 as Markdown rows."""
    bound = six_sigma_bound(RATE, QUERIES)
    lines = [
        "| filter | fill | items | false positives | measured FPR | 6-sigma bound of p"
        " | theory (fixed) | predicted from bits | z vs predicted | ≤ p? | generations"
        " (shards in each) | memory (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for pt in points:
        theory = "—" if pt.theory is None else f"{pt.theory:.4g}"
        lines.append(
            f"| {pt.mode} | {pt.fill}x | {pt.items:,} | {pt.hits:,} / {pt.queries:,}"
            f" | {pt.measured:.4g} | {bound:.4g} | {theory} | {pt.predicted:.4g}"
            f" | {pt.z:+.1f} | {verdict(pt.measured, RATE, bound)} | {pt.generations}"
            f" ({', '.join(map(str, pt.shards))}) | {pt.memory_bytes / MIB:.2f} |"
        )
    return lines


def memory_table(grown: Point, right: Filled) -> list[str]:
    """Part 2 as Markdown rows."""
    optimum = optimal_bytes(right.items, RATE)
    lines = [
        "| filter | items | memory (bytes) | memory (MiB) | x optimum | generations"
        " | measured FPR |",
        "|---|---:|---:|---:|---:|---:|---:|",
        f"| grown: capacity {CAPACITY:,}, EXPANSION=2, filled 10x | {grown.items:,}"
        f" | {grown.memory_bytes:,} | {grown.memory_bytes / MIB:.2f}"
        f" | {grown.memory_bytes / optimum:.2f} | {grown.generations} | {grown.measured:.4g} |",
        f"| fixed: capacity {right.items:,}, EXPANSION=0 | {right.items:,}"
        f" | {right.memory_bytes:,} | {right.memory_bytes / MIB:.2f}"
        f" | {right.memory_bytes / optimum:.2f} | {right.generations}"
        f" | {right.hits / right.queries:.4g} |",
        f"| optimum -n ln p / (ln 2)² / 8 | {right.items:,} | {optimum:,.0f}"
        f" | {optimum / MIB:.2f} | 1.00 | — | — |",
        "",
        f"Grown / right-sized fixed: **{grown.memory_bytes / right.memory_bytes:.2f}x**"
        f" the memory.",
    ]
    return lines


def per_item_table(rows: list[Filled]) -> list[str]:
    """Part 3 as Markdown rows."""
    optimum = optimal_bytes(BIG_CAPACITY, BIG_RATE) / BIG_CAPACITY
    bound = six_sigma_bound(BIG_RATE, QUERIES)
    lines = [
        "| filter | items | memory (MiB) | bytes / item | x optimum | generations"
        " | false positives | measured FPR | ≤ p? |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        per_item = row.memory_bytes / row.items
        measured = row.hits / row.queries
        lines.append(
            f"| {row.label} | {row.items:,} | {row.memory_bytes / MIB:.2f} | {per_item:.3f}"
            f" | {per_item / optimum:.2f} | {row.generations} | {row.hits:,} / {row.queries:,}"
            f" | {measured:.3g} | {verdict(measured, BIG_RATE, bound)} |"
        )
    half = optimal_bytes(BIG_CAPACITY, BIG_RATE / 2) / BIG_CAPACITY
    lines += [
        f"| optimum for p = {BIG_RATE:g} | {BIG_CAPACITY:,}"
        f" | {optimum * BIG_CAPACITY / MIB:.2f} | {optimum:.3f} | 1.00 | — | — | — | — |",
        f"| optimum for p/2 = {BIG_RATE / 2:g} | {BIG_CAPACITY:,}"
        f" | {half * BIG_CAPACITY / MIB:.2f} | {half:.3f} | {half / optimum:.2f}"
        " | — | — | — | — |",
    ]
    return lines


def throughput_table(points: list[Point], right: Filled, big: list[Filled]) -> list[str]:
    """Items per second that ``add_many`` took in each step (informational)."""
    lines = ["| filter | items added | items/s |", "|---|---|---:|"]
    held: dict[str, int] = {}
    for pt in points:
        start = held.get(pt.mode, 0)
        held[pt.mode] = pt.items
        lines.append(
            f"| {pt.mode}, capacity {CAPACITY:,}, p = {RATE:g} | {start:,} to {pt.items:,}"
            f" | {pt.add_rate:,.0f} |"
        )
    lines.append(
        f"| fixed (EXPANSION=0), capacity {right.items:,}, p = {RATE:g}"
        f" | 0 to {right.items:,} | {right.add_rate:,.0f} |"
    )
    for row in big:
        lines.append(
            f"| {row.label}, capacity {BIG_CAPACITY:,}, p = {BIG_RATE:g}"
            f" | 0 to {row.items:,} | {row.add_rate:,.0f} |"
        )
    return lines


def findings(points: list[Point], grown: Point, right: Filled, big: list[Filled]) -> list[str]:
    """Plain statements read off the numbers (nothing adjusted)."""
    bound = six_sigma_bound(RATE, QUERIES)
    notes = []
    for pt in points:
        if pt.mode.startswith("growth"):
            if pt.measured > RATE:
                extra = (
                    " and beyond the 6-sigma bound" if pt.measured > bound else " (within 6-sigma)"
                )
                notes.append(
                    f"- Growth at {pt.fill}x measured {pt.measured:.4g}, **over p = {RATE:g}**"
                    f"{extra}."
                )
            else:
                notes.append(f"- Growth at {pt.fill}x measured {pt.measured:.4g} ≤ p = {RATE:g}.")
            if pt.fill == 1 and pt.generations > 1:
                notes.append(
                    f"- At 1x (exactly its capacity) the growing filter has already grown:"
                    f" {pt.shards[1]} of {pt.shards[0]} shards started generation 1, because a"
                    " shard's generation 0 takes capacity / shards items and the items do not"
                    f" spread evenly. It then takes {pt.memory_bytes / MIB:.2f} MiB."
                )
        elif pt.fill > 1:
            notes.append(
                f"- Fixed size at {pt.fill}x measured {pt.measured:.4g}"
                f" ({pt.measured / RATE:,.0f}x p; theory {pt.theory:.4g})."
            )
    notes.append(
        f"- At 10x the grown filter takes {grown.memory_bytes / right.memory_bytes:.2f}x the"
        f" memory of a fixed-size filter sized for 10x from the start."
    )
    grow, fixed = big
    fixed_1x = next(pt for pt in points if not pt.mode.startswith("growth") and pt.fill == 1)
    grown_1x = next(pt for pt in points if pt.mode.startswith("growth") and pt.fill == 1)
    notes.append(
        f"- At 1x the growing filter takes {grown_1x.memory_bytes / fixed_1x.memory_bytes:.2f}x"
        " the memory of the fixed-size one."
    )
    notes.append(
        f"- At 1M / p = {BIG_RATE:g}, growth takes {grow.memory_bytes / grow.items:.3f} B/item"
        f" against {fixed.memory_bytes / fixed.items:.3f} B/item fixed"
        f" ({grow.memory_bytes / fixed.memory_bytes:.2f}x)."
    )
    return notes


def report(
    points: list[Point],
    right: Filled,
    big: list[Filled],
    redis_version: str,
    seconds: float,
) -> str:
    """Return the whole Markdown document."""
    grown = next(pt for pt in points if pt.mode.startswith("growth") and pt.fill == FILLS[-1])
    bound = six_sigma_bound(RATE, QUERIES)
    growth_cfg = BloomConfig.from_settings(
        {"BLOOMFILTER_CAPACITY": CAPACITY, "BLOOMFILTER_ERROR_RATE": RATE}
    )
    lines = [
        "# Growth: false-positive rate and memory",
        "",
        f"A filter with capacity {CAPACITY:,} at error rate p = {RATE:g} is filled with"
        f" distinct fingerprints to {', '.join(f'{f}x' for f in FILLS)} its capacity, once"
        " growing (`BLOOMFILTER_EXPANSION=2`, the default) and once at a fixed size"
        f" (`BLOOMFILTER_EXPANSION=0`); at each fill {QUERIES:,} fingerprints never added are"
        " checked with `contains_many`. The 6-sigma bound is (q·p + 6·√(q·p·(1-p)))/q: a measured"
        f' rate above it ({bound:.4g} here) is not noise around p. "Predicted from bits" is'
        " `state().estimated_fpr`, the rate the bits set imply (compound over generations);"
        " the same strangers are queried at every fill, so the points of one filter are not"
        " independent samples. Memory is"
        " `state().memory_bytes` (what Redis reports for the bitmaps). Then the grown"
        " filter's memory at 10x is compared with a fixed-size filter sized for the"
        f" {FILLS[-1] * CAPACITY:,} items from the start, and {BIG_CAPACITY:,} items at"
        f" p = {BIG_RATE:g} show in bytes per item what sizing generation 0 for p/2 costs.",
        "",
        f"- Command: `{COMMAND}`",
        f"- Date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- Redis: {redis_version}",
        f"- Run time: {seconds:.0f} s",
        f"- Growing filter: {growth_cfg.describe()}",
        "",
        f"## 1. False-positive rate at 1x, 4x, 10x (capacity {CAPACITY:,}, p = {RATE:g})",
        "",
        *fpr_table(points),
        "",
        f"## 2. Memory at 10x ({FILLS[-1] * CAPACITY:,} items, p = {RATE:g})",
        "",
        *memory_table(grown, right),
        "",
        f"## 3. Bytes per item at {BIG_CAPACITY:,} items, p = {BIG_RATE:g} (1x)",
        "",
        f"{QUERIES:,} queries expect about {QUERIES * BIG_RATE:.0f} false positives at p, so"
        " the measured rates here are coarse.",
        "",
        *per_item_table(big),
        "",
        "## Add throughput (informational)",
        "",
        "`add_many` in chunks of 100,000 from one Python process, the redis-server on the"
        " same machine.",
        "",
        *throughput_table(points, right, big),
        "",
        "## Findings",
        "",
        *findings(points, grown, right, big),
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    """Run every measurement, write bench/growth.md and the same Markdown to stdout."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    began = time.perf_counter()
    most = max(FILLS[-1] * CAPACITY, BIG_CAPACITY)
    logger.info("making %s members and %s strangers", f"{most:,}", f"{QUERIES:,}")
    members = fingerprints("m", 0, most)
    strangers = fingerprints("s", 0, QUERIES)
    with RedisServer() as server:
        client = server.client()
        redis_version = str(client.info()["redis_version"])
        logger.info("redis-server %s", redis_version)
        points = fill_series(client, 2, members, strangers)
        points += fill_series(client, 0, members, strangers)
        right = fill_once(
            client, "fixed-10x", "fixed-10x", RATE, FILLS[-1] * CAPACITY, 0, members, strangers
        )
        big = [
            fill_once(client, key, label, BIG_RATE, BIG_CAPACITY, expansion, members, strangers)
            for key, label, expansion in (
                ("big-e2", "growth (EXPANSION=2)", 2),
                ("big-e0", "fixed (EXPANSION=0)", 0),
            )
        ]
    text = report(points, right, big, redis_version, time.perf_counter() - began)
    OUTPUT.write_text(text, encoding="utf-8")
    logger.info("wrote %s", OUTPUT)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
