"""``watch``: one line of live figures per interval while a crawl runs.

Each line reads the counters every worker adds to about once a second (one read, no
BITCOUNT, as the crawl's own progress line in :mod:`..progress`): items from all
workers, the share of the capacity, the fill and false-positive rate they imply,
how many were added since the last line, and the live workers. A native filter
(BF.*) reports what its shards say they hold. ``--count N`` stops after N lines
(scripts, tests); otherwise Ctrl-C ends it, with exit status 0.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from scrapy_redis_bloom.cli.context import EXIT_OK, Context
from scrapy_redis_bloom.cli.opening import open_existing
from scrapy_redis_bloom.cli.output import out
from scrapy_redis_bloom.engine.bitmap.filter import RedisBloomFilter
from scrapy_redis_bloom.engine.native.filter import NativeBloomFilter
from scrapy_redis_bloom.engine.state import estimate_from_items


def _sample(bloom: RedisBloomFilter | NativeBloomFilter) -> dict[str, Any]:
    """Read the filter's live figures once."""
    record = bloom.record
    assert record is not None  # opened
    totals = bloom.totals()
    if isinstance(bloom, NativeBloomFilter):
        state = bloom.state(bloom.existing())
        items, fill = state.estimated_items, None
    else:
        state = estimate_from_items(record.growth, totals.added)
        items, fill = totals.added, state.fill_ratio
    return {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "items": items,
        "capacity": record.capacity,
        "fill_ratio": fill,
        "estimated_fpr": state.estimated_fpr,
        "filtered": totals.seen,
        "live_workers": len(bloom.live_workers()),
    }


def _line(sample: dict[str, Any], previous: dict[str, Any] | None) -> str:
    """Lay a sample out as one line."""
    added = sample["items"] - previous["items"] if previous else 0
    fill = sample["fill_ratio"]
    return (
        f"{sample['time'][11:19]}  {sample['items']:,} items"
        f" ({100 * sample['items'] / sample['capacity']:.2f} % of {sample['capacity']:,})"
        f"  +{added:,}"
        + (f"  fill {100 * fill:.4f} %" if fill is not None else "")
        + f"  FP rate {sample['estimated_fpr']:.3g}"
        f"  {sample['filtered']:,} filtered  {sample['live_workers']} live worker(s)"
    )


def run(ctx: Context) -> int:
    """Print a line of figures every ``--interval`` seconds, ``--count`` times or until Ctrl-C."""
    bloom = open_existing(ctx)
    interval = float(ctx.args.interval)
    count: int | None = ctx.args.count
    previous: dict[str, Any] | None = None
    done = 0
    try:
        while count is None or done < count:
            if done:
                time.sleep(interval)
            sample = _sample(bloom)
            out(json.dumps(sample) if ctx.args.json else _line(sample, previous))
            previous = sample
            done += 1
    except KeyboardInterrupt:
        pass  # the way to stop a watch without --count
    return EXIT_OK
