"""``reset``: delete the filter on every server, or the parts it left without a usable record.

Deletes the config record, every shard, the counters and the server markers, each
only if it is still the filter's; refuses while workers hold live leases unless
``--force``. With no usable record, finds the filter's parts by SCAN on every server
and deletes only those that carry its id (or can be nothing else): keys that only
share a name are listed and left alone. Asks first, unless ``--yes``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scrapy_redis_bloom.cli.context import EXIT_OK, CLIError, Context
from scrapy_redis_bloom.cli.opening import check_servers, native_if, refuse_live_workers, stored
from scrapy_redis_bloom.cli.output import confirm_or_abort, emit, listing, orphan_data, utc
from scrapy_redis_bloom.core import layout
from scrapy_redis_bloom.core.record import FilterRecord
from scrapy_redis_bloom.engine.bitmap.filter import RedisBloomFilter
from scrapy_redis_bloom.engine.native.filter import delete as delete_native
from scrapy_redis_bloom.ops import inventory
from scrapy_redis_bloom.ops.inventory import MarkerCheck, StoredRecord


def run(ctx: Context) -> int:
    """Delete the filter on every server, or the parts it left without a usable record."""
    bloom, found = stored(ctx)
    if found is not None and found.record is not None:
        return _reset_filter(ctx, bloom, found.record)
    return _reset_orphans(ctx, bloom, found)


def _reset_filter(ctx: Context, bloom: RedisBloomFilter, record: FilterRecord) -> int:
    """Delete a filter that has a record: every part its geometry and server count name."""
    key = ctx.key
    check_servers(ctx, bloom, record)
    refuse_live_workers(ctx, bloom)
    markers = inventory.check_markers(bloom, record)
    _refuse_foreign_markers(ctx, record, markers)
    native = native_if(ctx, record)
    if native is not None:
        present = len(native.existing())
    else:
        present = len(bloom.parts.existing(range(record.spec.shards)))
    counters = inventory.count_existing(bloom, [bloom.parts.counter_key]) > 0
    marked = sum(1 for marker in markers if marker.found is not None)
    created = utc(record.created).strftime("%Y-%m-%d %H:%M:%S UTC")
    parts = ["its config record", f"{present:,} shard key(s)"]
    if counters:
        parts.append("its counters")
    if marked:
        parts.append(f"its server markers on {marked} server(s)")
    what = (
        f"the Bloom filter {key!r} on {ctx.where} (id {record.filter_id}, created {created},"
        f" {record.describe()}): {', '.join(parts[:-1])} and {parts[-1]}"
    )
    confirm_or_abort(ctx, what)
    if native is not None:
        delete_native(native.parts, record)
    else:
        bloom.parts.delete(record)
    data: dict[str, Any] = {
        "key": key,
        "server": ctx.address,
        "servers": inventory.addresses(bloom),
        "deleted": True,
        "record": True,
        "id": record.filter_id,
        "shard_keys": present,
        "counters": counters,
        "server_markers": marked,
    }
    emit(ctx, data, [f"Deleted {what}."])
    return EXIT_OK


def _refuse_foreign_markers(
    ctx: Context, record: FilterRecord, markers: Sequence[MarkerCheck]
) -> None:
    """Refuse to reset by a server list that does not match the servers' markers.

    Deleting by geometry on servers listed in another order would miss parts, and on
    a server of another filter, or holding another program's key, delete theirs.
    """
    for marker in markers:
        if marker.status != "foreign" or marker.found is None:
            continue
        found = layout.parse_marker(marker.found)
        if found is None:
            problem = (
                f"its key {layout.server_key(ctx.key)!r} holds {marker.found!r}, which is no"
                " filter's server marker: another program's key where the filter keeps its"
                " marker. Remove or rename that key, then reset again"
            )
        elif found[0] == record.filter_id:
            problem = (
                f"it is server {found[1]}/{found[2]} of the filter, given as server"
                f" {marker.server}/{record.servers}. Give the servers in BLOOMFILTER_REDIS_URLS"
                " in the crawl's order"
            )
        else:
            problem = (
                f"it holds part of another Bloom filter named {ctx.key!r} (id {found[0]}): the"
                " servers given mix two filters'. Give this filter's own servers; reset"
                " another filter's leftovers on their server alone"
            )
        raise CLIError(
            ctx.frontend.rename(
                f"Cannot reset the Bloom filter {ctx.key!r} (id {record.filter_id}) on"
                f" {ctx.where}: Redis at {marker.address} is not its server {marker.server}:"
                f" {problem}. Nothing was deleted."
            )
        )


def _reset_orphans(ctx: Context, bloom: RedisBloomFilter, unusable: StoredRecord | None) -> int:
    """Delete what a filter without a usable record left, if it carries the filter's id."""
    key = ctx.key
    refuse_live_workers(ctx, bloom)
    found = inventory.find_orphans(bloom)
    if found.blocking:
        record = found.blocking[0]
        raise CLIError(
            ctx.frontend.rename(
                f"Cannot delete parts of the Bloom filter {key!r} on {ctx.where} as orphans:"
                f" {record.key!r} on {record.address} is {record.what}. Give the servers in"
                " BLOOMFILTER_REDIS_URLS in the filter's order, then reset again. Nothing was"
                " deleted."
            )
        )
    kept = list(found.kept)
    data: dict[str, Any] = {
        "key": key,
        "server": ctx.address,
        "servers": inventory.addresses(bloom),
        "record": False,
        "not_deleted": orphan_data(kept),
    }
    kept_lines = ["Not deleted (carries no filter id):", *listing(key, kept)] if kept else []
    if not found.deletable:
        data.update(deleted=False, shard_keys=0, deleted_keys=[])
        lines = [f"No Bloom filter {key!r} on {ctx.where}: nothing to delete.", *kept_lines]
        emit(ctx, data, lines)
        return EXIT_OK
    orphans = list(found.deletable)
    shards = sum(1 for o in orphans if o.kind == "shard")
    others = len(orphans) - shards
    why = "its config record cannot be used" if unusable is not None else "it has no config record"
    what = (
        f"{shards:,} orphaned shard key(s)"
        + (f" and {others:,} other part(s)" if others else "")
        + f" of the Bloom filter {key!r} on {ctx.where} ({why})"
    )
    confirm_or_abort(ctx, what, [f"To delete, {what}:", *listing(key, orphans), *kept_lines])
    deleted = inventory.delete_orphans(bloom, orphans)
    changed = [o for o in orphans if o not in deleted]
    data.update(
        deleted=True, shard_keys=sum(1 for o in deleted if o.kind == "shard"),
        deleted_keys=orphan_data(deleted), changed=orphan_data(changed),
    )  # fmt: skip
    lines = [f"Deleted {what}:", *listing(key, deleted)]
    if changed:
        lines += ["Not deleted (changed since listed):", *listing(key, changed)]
    emit(ctx, data, lines + kept_lines)
    return EXIT_OK
