"""Finding the filter a command works on: read its record, open it, or refuse plainly.

A command never guesses a filter's geometry: it reads the config record
(``KEY:meta``) and opens the filter it describes, bitmap or native (BF.*). Only
``add`` and ``migrate`` may create a missing filter, and only from sizing settings
given on purpose (:attr:`.context.Context.sizing`).
"""

from __future__ import annotations

from scrapy_redis_bloom.cli.context import CLIError, Context, UsageError
from scrapy_redis_bloom.core import layout
from scrapy_redis_bloom.core.errors import ConfigMismatchError, ServerListMismatchError
from scrapy_redis_bloom.core.record import FilterRecord
from scrapy_redis_bloom.engine.backend import make_filter
from scrapy_redis_bloom.engine.bitmap.filter import RedisBloomFilter
from scrapy_redis_bloom.engine.native.filter import NativeBloomFilter
from scrapy_redis_bloom.ops import inventory
from scrapy_redis_bloom.ops.inventory import StoredRecord


def stored(ctx: Context) -> tuple[RedisBloomFilter, StoredRecord | None]:
    """Read the filter's record; return a filter of the stored geometry (never opened)."""
    bloom = ctx.own(inventory.probe(ctx.clients, ctx.key, ctx.faults))
    nodes = inventory.cluster_nodes(bloom)  # they would answer MOVED until the retry timeout
    if nodes:
        raise UsageError(
            f"Redis at {', '.join(nodes)} is a node of a Redis Cluster:"
            f" {ctx.frontend.cluster_hint}."
        )
    found = inventory.read_record(bloom)
    if found is not None and found.record is not None:
        bloom.close()
        bloom = ctx.own(inventory.of_record(ctx.clients, ctx.key, found.record, ctx.faults))
    return bloom, found


def usable(found: StoredRecord | None) -> FilterRecord | None:
    """Return the stored record; refuse one this version cannot use (reset deletes it)."""
    if found is None:
        return None
    if found.record is None:
        raise CLIError(found.problem)
    return found.record


def missing(ctx: Context, bloom: RedisBloomFilter, hint: str = "") -> CLIError:
    """Return the error for a filter whose config record does not exist."""
    key = ctx.key
    meta = layout.meta_key(key)
    message = f"No Bloom filter {key!r} on {ctx.where}: its config record {meta!r} does not exist."
    first_shard = layout.shard_key(key, 0)
    if key.endswith(":meta"):
        message += f" Give the filter's key without ':meta': --key {key[: -len(':meta')]!r}."
    elif bloom.parts.existing([0]):
        message += (
            f" Its shard key {first_shard!r} exists without the record (orphaned bits):"
            f" delete them with '{ctx.prog} reset --key {key}'."
        )
    elif hint:
        message += " " + hint
    return CLIError(message)


def check_servers(ctx: Context, bloom: RedisBloomFilter, record: FilterRecord) -> None:
    """Refuse a server list of another length than the filter's: shards would be misplaced."""
    given = bloom.topology.servers
    if record.servers == given:
        return
    raise CLIError(
        ctx.frontend.rename(
            f"The Bloom filter {ctx.key!r} (id {record.filter_id}) was created on"
            f" {record.servers} server(s); {given} given. Give each of its servers in"
            " BLOOMFILTER_REDIS_URLS, in the crawl's order: shard i lives on"
            f" server i mod {record.servers}."
        )
    )


def refuse_live_workers(ctx: Context, bloom: RedisBloomFilter) -> None:
    """Refuse to reset while workers hold live leases, unless ``--force``."""
    workers = bloom.live_workers()
    if workers and not ctx.args.force:
        raise CLIError(
            f"{len(workers)} worker(s) still crawl with the Bloom filter {ctx.key!r} on"
            f" {ctx.where} ({', '.join(workers)}): stop them first, or pass --force"
            " (they would go on adding to a filter that forgot what they saw)."
        )


def shard_address(bloom: RedisBloomFilter, shard: int) -> str:
    """Return where a shard lives."""
    return bloom.topology.route(bloom.parts.shard_key(shard), shard, None).address


def native_if(ctx: Context, record: FilterRecord | None) -> NativeBloomFilter | None:
    """Return the native filter a record of the native backend describes (not opened)."""
    if record is None or record.backend != "native":
        return None
    return ctx.own(NativeBloomFilter.of_record(ctx.clients, ctx.key, record, ctx.faults))


def open_for_writing(ctx: Context) -> tuple[RedisBloomFilter | NativeBloomFilter, bool]:
    """Open the filter for ``add`` / ``migrate``: create it if sizing was given.

    Returns the filter and whether this call created it.
    """
    config = ctx.sizing
    bloom, found = stored(ctx)
    record = usable(found)
    if record is None and config is None:
        raise missing(
            ctx,
            bloom,
            ctx.frontend.rename(
                "Start the crawl once to create it, or give its sizing (BLOOMFILTER_CAPACITY"
                " and BLOOMFILTER_ERROR_RATE, or BLOOMFILTER_BIT and BLOOMFILTER_HASH_NUMBER)"
                " to create it here."
            ),
        )
    if record is not None:
        check_servers(ctx, bloom, record)
    opened: RedisBloomFilter | NativeBloomFilter = native_if(ctx, record) or bloom
    if config is not None:
        opened = ctx.own(make_filter(ctx.clients, ctx.key, config, faults=ctx.faults))
    try:
        # Creates the filter only when sizing was given, else checks it.
        opened.open(create=config is not None)
    except ServerListMismatchError:
        raise
    except ConfigMismatchError as exc:
        if config is None:
            raise
        raise CLIError(
            ctx.frontend.rename(
                "The sizing settings do not match the existing filter (leave them out to use"
                f" the filter as it is): {exc}"
            )
        ) from None
    return opened, record is None


def existing(ctx: Context, hint: str) -> RedisBloomFilter | NativeBloomFilter:
    """Return the stored filter, which must exist (else ``hint`` says what to do).

    Not opened: the caller decides whether its parts are checked first.
    """
    bloom, found = stored(ctx)
    record = usable(found)
    if record is None:
        raise missing(ctx, bloom, hint)
    check_servers(ctx, bloom, record)
    return native_if(ctx, record) or bloom


def open_existing(ctx: Context) -> RedisBloomFilter | NativeBloomFilter:
    """Open a filter that must exist, with the geometry its record describes."""
    opened = existing(ctx, "A crawl creates it on its first request.")
    opened.open(create=False)  # checks every part: a lost shard is an error, not "absent"
    return opened
