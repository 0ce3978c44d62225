"""``dump FILE`` and ``restore FILE``: move a filter between Redis deployments, as a file.

Thin wrappers of the engine's :func:`..engine.transfer.dump_filter` and
:func:`..engine.restore.restore_filter` (streamed, chunked, checksummed: see
:mod:`..engine.dumpfile`), with a progress bar. ``dump`` writes ``FILE.partial``
and renames it to ``FILE`` once whole, so a failed dump leaves no file that looks
complete. ``restore`` checks the whole file before it writes anything, and a refused
or failed restore leaves nothing behind; the target may be another topology than the
source (one server, a server list, a Redis Cluster).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from scrapy_redis_bloom.cli.context import EXIT_OK, CLIError, Context
from scrapy_redis_bloom.cli.opening import existing
from scrapy_redis_bloom.cli.output import emit, progress
from scrapy_redis_bloom.core.sizing import format_bytes
from scrapy_redis_bloom.ops.dump import FilterBusyError, dump_filter
from scrapy_redis_bloom.ops.dumpfile import DumpFileError
from scrapy_redis_bloom.ops.restore import FilterExistsError, restore_filter


class _Bar:
    """Feed the engine's ``progress(done, total)`` calls to a progress bar of bytes."""

    def __init__(self, what: str) -> None:
        self.bar = progress(None, "B", what)

    def __call__(self, done: int, total: int) -> None:
        if self.bar.total != total:
            self.bar.total = total
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        self.bar.close()


def dump(ctx: Context) -> int:
    """Write the filter to ``FILE``: its record, counters and every part's bytes."""
    path = Path(ctx.args.file)
    source = existing(ctx, "Nothing to dump.")
    partial = path.with_name(path.name + ".partial")
    bar = _Bar("Dumping")
    try:
        with open(partial, "wb") as out:
            summary = dump_filter(source, out, bar, force=ctx.args.force)
        os.replace(partial, path)
    except FilterBusyError as exc:
        raise CLIError(f"{exc} (--force)") from None
    finally:
        bar.close()
        partial.unlink(missing_ok=True)
    totals = summary.totals
    data: dict[str, Any] = {
        "key": ctx.key,
        "server": ctx.address,
        "file": str(path),
        "id": summary.record.filter_id,
        "items": summary.added,
        "parts": totals.parts,
        "chunks": totals.chunks,
        "data_bytes": totals.data_bytes,
        "file_bytes": totals.file_bytes,
        "sha256": totals.sha256,
        "seconds": summary.seconds,
        "forced": summary.forced,
    }
    lines = [
        f"Dumped the Bloom filter {ctx.key!r} (id {summary.record.filter_id}) from {ctx.where}"
        f" to {str(path)!r}: {totals.parts:,} part(s), {summary.added:,} items,"
        f" {format_bytes(totals.file_bytes)} in {summary.seconds:.1f} s.",
        f"SHA-256 {totals.sha256}",
    ]
    if summary.forced:
        lines.append("Workers held leases meanwhile: URLs they added may be missing (--force).")
    emit(ctx, data, lines)
    return EXIT_OK


def restore(ctx: Context) -> int:
    """Restore ``FILE`` as the filter, on the servers the settings name."""
    path = Path(ctx.args.file)
    bar = _Bar("Restoring")
    try:
        with open(path, "rb") as inp:
            summary = restore_filter(
                ctx.clients,
                ctx.key,
                inp,
                bar,
                replace=ctx.args.replace,
                name=repr(str(path)),
                faults=ctx.faults,
            )
    except DumpFileError as exc:
        raise CLIError(str(exc)) from None
    except FilterExistsError as exc:
        raise CLIError(f"{exc} (--replace)") from None
    finally:
        bar.close()
    totals = summary.totals
    added = summary.counters.get("added", 0)
    data: dict[str, Any] = {
        "key": ctx.key,
        "server": ctx.address,
        "file": str(path),
        "id": summary.record.filter_id,
        "source": summary.source,
        "replaced": summary.replaced,
        "items": added,
        "parts": totals.parts,
        "data_bytes": totals.data_bytes,
        "sha256": totals.sha256,
        "seconds": summary.seconds,
    }
    lines = [
        f"Restored the Bloom filter {ctx.key!r} (id {summary.record.filter_id}) on {ctx.where}"
        f" from {str(path)!r} (dumped from {summary.source}): {totals.parts:,} part(s),"
        f" {added:,} items, {format_bytes(totals.data_bytes)} in {summary.seconds:.1f} s."
    ]
    if summary.replaced:
        lines.append("The filter that was under this key was deleted first (--replace).")
    emit(ctx, data, lines)
    return EXIT_OK
