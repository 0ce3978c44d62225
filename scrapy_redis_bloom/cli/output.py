"""What the commands print: result lines or JSON on stdout, prompts and progress on stderr.

Everything a command prints goes through here: stdout carries the result only (so
``--json`` output can be piped), stderr the prompts, the progress bars (``tqdm``,
shown only when stderr is a terminal) and the errors (:func:`.context.err`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from tqdm import tqdm

from scrapy_redis_bloom.cli.context import CLIError, Context, err
from scrapy_redis_bloom.ops.inventory import Orphan

#: Keys listed one per line in text output, at most (JSON lists them all).
LISTED = 20
#: Rows of the shard fill chart, at most: shards are bucketed beyond that.
CHART_ROWS = 16
#: Width of the chart's longest bar, in characters.
CHART_WIDTH = 30
_EIGHTHS = " ▏▎▍▌▋▊▉█"


def out(text: str = "") -> None:
    """Write a line to stdout (looked up at call time, so capture works)."""
    sys.stdout.write(text + "\n")


def emit(ctx: Context | argparse.Namespace, data: dict[str, Any], lines: Sequence[str]) -> None:
    """Print a command's result: ``data`` as JSON with ``--json``, else ``lines``."""
    args = ctx.args if isinstance(ctx, Context) else ctx
    if args.json:
        out(json.dumps(data, indent=2))
    else:
        for line in lines:
            out(line)


def table(rows: Sequence[tuple[str, str]]) -> list[str]:
    """Lay out label/value rows in two aligned columns."""
    width = max(len(label) for label, _ in rows)
    return [f"{label:<{width}}  {value}" for label, value in rows]


def bar(fraction: float, width: int = CHART_WIDTH) -> str:
    """Draw ``fraction`` (0 to 1) of ``width`` characters with block eighths."""
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, rest = divmod(eighths, 8)
    return ("█" * full + (_EIGHTHS[rest] if rest else "")).ljust(width)


def fill_chart(per_shard: Sequence[int], bits_per_shard: int) -> list[tuple[str, str]]:
    """Return rows of a bar chart of the shards' fill: one per shard, or per bucket.

    Bars are scaled to the fullest row (a young filter's fill is a small fraction:
    unscaled bars would all be empty); each row also says its fill in percent.
    """
    if not per_shard or bits_per_shard <= 0:
        return []
    size = -(-len(per_shard) // CHART_ROWS)
    rows: list[tuple[str, float]] = []
    for start in range(0, len(per_shard), size):
        bucket = per_shard[start : start + size]
        label = f"{start}" if len(bucket) == 1 else f"{start}-{start + len(bucket) - 1}"
        rows.append((label, sum(bucket) / (len(bucket) * bits_per_shard)))
    top = max(fill for _, fill in rows) or 1.0
    name = "Fill, shards" if size > 1 else "Fill, shard"
    return [(f"{name} {label}", f"{bar(fill / top)} {100 * fill:.4f} %") for label, fill in rows]


def progress(total: int | None, unit: str, what: str) -> tqdm[Any]:
    """Return a progress bar on stderr, quiet when stderr is not a terminal."""
    stream = sys.stderr
    quiet = stream is None or not stream.isatty()
    return tqdm(total=total, unit=unit, desc=what, file=stream, disable=quiet, unit_scale=True)


def listing(key: str, orphans: Sequence[Orphan]) -> list[str]:
    """List keys one per line, indented, at most :data:`LISTED` of them.

    The shard keys of one filter id are summed up on one line: a filter has thousands.
    """
    groups: dict[str, list[Orphan]] = {}
    for orphan in orphans:
        if orphan.kind == "shard":
            groups.setdefault(orphan.filter_id, []).append(orphan)
    lines = []
    for filter_id, shards in groups.items():
        places = sorted({o.address for o in shards})
        pattern = "{" + key + ":<i>}:g<m>"
        lines.append(
            f"  {len(shards):,} shard key(s) {pattern!r} of filter id {filter_id}:"
            f" shards {ranges(o.shard or 0 for o in shards)}, on {', '.join(places)}"
        )
    rest = [o for o in orphans if o.kind != "shard"]
    lines += [f"  {o.key!r} on {o.address}: {o.what}" for o in rest[:LISTED]]
    if len(rest) > LISTED:
        lines.append(f"  ... and {len(rest) - LISTED:,} more")
    return lines


def ranges(numbers: Iterable[int]) -> str:
    """Write numbers as ranges: ``0-5, 7, 9-12``."""
    spans: list[list[int]] = []
    for n in sorted(set(numbers)):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans)


def orphan_data(orphans: Sequence[Orphan]) -> list[dict[str, str]]:
    """Describe keys for JSON."""
    return [{"key": o.key, "server": o.address, "what": o.what} for o in orphans]


def utc(timestamp: float) -> datetime:
    """Return a Unix timestamp as an aware UTC datetime."""
    return datetime.fromtimestamp(timestamp, tz=UTC)


def stdin_is_tty() -> bool:
    """Tell whether stdin is an interactive terminal."""
    stdin = sys.stdin
    return stdin is not None and not stdin.closed and stdin.isatty()


def confirm_or_abort(ctx: Context, what: str, lines: Sequence[str] = ()) -> None:
    """Ask before deleting, unless ``--yes``; raise if the answer is not an explicit yes."""
    if ctx.args.yes:
        return
    for line in lines:
        err(line)
    sys.stderr.write(f"Delete {what}? Every request it has seen will be forgotten. [y/N] ")
    sys.stderr.flush()
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise CLIError("Not confirmed: nothing was deleted.")
