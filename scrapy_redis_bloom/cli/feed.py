"""``add`` and ``check``: feed fingerprints (or URLs) from files or stdin to the filter.

``add`` adds them and counts those new and those already present (a false positive
counts as present); it may create a missing filter from sizing settings. ``check``
counts how many the filter (probably) holds and changes nothing. Both send batches
of :data:`.inputs.BATCH` through the engine's bulk calls, with a progress bar.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from scrapy_redis_bloom.cli.context import EXIT_OK, Context
from scrapy_redis_bloom.cli.inputs import (
    BadLineError,
    bad_line,
    input_paths,
    parser_for,
    read_lines,
)
from scrapy_redis_bloom.cli.opening import open_existing, open_for_writing
from scrapy_redis_bloom.cli.output import emit, progress


def _count_hits(
    ctx: Context,
    paths: Sequence[str],
    operation: Callable[[list[bytes]], list[bool]],
    verb: str,
) -> tuple[int, int]:
    """Run a bulk operation over the fingerprints read; return (true, false) counts."""
    hits = misses = 0
    parse = parser_for(ctx)
    with progress(None, "fp", verb.capitalize()) as bar:
        try:
            for batch in read_lines(paths, parse):
                flags = operation(batch)
                found = sum(flags)
                hits += found
                misses += len(flags) - found
                bar.update(len(flags))
        except BadLineError as exc:
            raise bad_line(ctx, exc, hits + misses, verb) from None
    return hits, misses


def add(ctx: Context) -> int:
    """Add fingerprints read from files or stdin to the filter."""
    paths = input_paths(ctx)
    bloom, created = open_for_writing(ctx)
    present, new = _count_hits(ctx, paths, bloom.add_many, "added")
    total = new + present
    data = {
        "key": ctx.key,
        "server": ctx.address,
        "created_filter": created,
        "fingerprints": total,
        "new": new,
        "already_present": present,
    }
    lines = [f"Created the Bloom filter {ctx.key!r} on {ctx.where}."] if created else []
    lines.append(
        f"Added {total:,} fingerprint(s) to the Bloom filter {ctx.key!r} on {ctx.where}:"
        f" {new:,} new, {present:,} already present."
    )
    emit(ctx, data, lines)
    return EXIT_OK


def check(ctx: Context) -> int:
    """Count how many fingerprints read from files or stdin the filter holds."""
    paths = input_paths(ctx)
    bloom = open_existing(ctx)
    present, absent = _count_hits(ctx, paths, bloom.contains_many, "checked")
    total = present + absent
    data = {
        "key": ctx.key,
        "server": ctx.address,
        "fingerprints": total,
        "present": present,
        "absent": absent,
    }
    emit(
        ctx,
        data,
        [
            f"Checked {total:,} fingerprint(s) against the Bloom filter {ctx.key!r} on"
            f" {ctx.where}: {present:,} present, {absent:,} absent."
        ],
    )
    return EXIT_OK
