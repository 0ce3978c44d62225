"""``migrate``: copy a scrapy-redis fingerprint SET into the filter, resumably.

The SET is read by SSCAN through the first client (or the cluster client): it lives
where scrapy-redis keeps it, not in the filter's shards. Its members go to the
filter in bulk calls; after each call the SSCAN cursor reached and the counts so far
are saved in a progress marker beside the SET (``SETKEY:bloom-migration``, a hash
naming the filter's id). A migration that is interrupted (Ctrl-C, a lost
connection) continues from that cursor when run again; one that finishes deletes
the marker. SSCAN returns every member present for the whole scan at least once,
across a resume too; a member added twice counts as already present. ``--restart``
ignores a marker. The SET itself is left in place.
"""

from __future__ import annotations

from typing import Any

from scrapy_redis_bloom.cli.context import EXIT_OK, CLIError, Context
from scrapy_redis_bloom.cli.inputs import FINGERPRINT
from scrapy_redis_bloom.cli.opening import open_for_writing
from scrapy_redis_bloom.cli.output import emit, progress

#: COUNT hint of each SSCAN call.
SCAN_COUNT = 1000
#: Fields of the progress marker that hold counts.
_COUNTS = ("new", "present", "skipped")


def marker_key(set_key: str) -> str:
    """Return the key of a migration's progress marker: beside the SET it reads."""
    return f"{set_key}:bloom-migration"


def _decode(value: Any) -> str:
    """Decode a reply item, whether or not the client decodes responses."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _resume_point(client: Any, marker: str, filter_id: str) -> tuple[int, dict[str, int]]:
    """Return the cursor and counts a marker of this filter saved; (0, zeros) if none."""
    fields = {_decode(k): _decode(v) for k, v in (client.hgetall(marker) or {}).items()}
    counts = dict.fromkeys(_COUNTS, 0)
    if fields.get("filter_id") != filter_id:
        return 0, counts
    try:
        return int(fields["cursor"]), {name: int(fields[name]) for name in _COUNTS}
    except (KeyError, ValueError):  # not a marker this version wrote: start over
        return 0, counts


def run(ctx: Context) -> int:
    """Copy a scrapy-redis fingerprint SET into the filter, from where a run stopped."""
    set_key = str(ctx.args.set_key)
    batch_size = int(ctx.args.batch)
    client = ctx.clients[0]
    source = ctx.where.split(", ")[0] if not ctx.cluster else ctx.where
    kind = _decode(client.type(set_key))
    if kind == "none":
        raise CLIError(f"Redis key {set_key!r} does not exist on {source}: nothing to migrate.")
    if kind != "set":
        raise CLIError(
            f"Redis key {set_key!r} on {source} holds a {kind}, not a set of request"
            " fingerprints like scrapy-redis's dupefilter keeps."
        )
    size = int(client.scard(set_key))
    bloom, created = open_for_writing(ctx)
    record = bloom.record
    assert record is not None  # opened
    marker = marker_key(set_key)
    cursor, counts = (0, dict.fromkeys(_COUNTS, 0))
    if not ctx.args.restart:
        cursor, counts = _resume_point(client, marker, record.filter_id)
    resumed = cursor != 0
    batch: list[bytes] = []
    with progress(size, "fp", "Migrating") as bar:
        bar.update(min(size, sum(counts.values())))

        def flush(reached: int) -> None:
            seen = bloom.add_many(batch) if batch else []
            hits = sum(seen)
            counts["present"] += hits
            counts["new"] += len(seen) - hits
            bar.update(len(seen))
            batch.clear()
            if reached:
                client.hset(
                    marker, mapping={"filter_id": record.filter_id, "cursor": reached, **counts}
                )

        while True:
            cursor, members = client.sscan(set_key, cursor, count=min(SCAN_COUNT, batch_size))
            cursor = int(cursor)
            for member in members:
                text = member.strip() if isinstance(member, bytes) else str(member).encode()
                if FINGERPRINT.fullmatch(text.strip()):
                    batch.append(text.strip().lower())
                else:
                    counts["skipped"] += 1
                    bar.update(1)
            if cursor == 0:
                break
            if len(batch) >= batch_size:
                flush(cursor)
        flush(0)
    client.delete(marker)
    new, present, skipped = (counts[name] for name in _COUNTS)
    total = new + present
    data = {
        "key": ctx.key,
        "server": ctx.address,
        "set_key": set_key,
        "created_filter": created,
        "resumed": resumed,
        "fingerprints": total,
        "new": new,
        "already_present": present,
        "skipped": skipped,
    }
    lines = [f"Created the Bloom filter {ctx.key!r} on {ctx.where}."] if created else []
    if resumed:
        lines.append(f"Resumed the migration where it stopped (progress marker {marker!r}).")
    lines.append(
        f"Migrated {total:,} fingerprint(s) from the set {set_key!r} into the Bloom filter"
        f" {ctx.key!r} on {ctx.where}: {new:,} new, {present:,} already present."
    )
    if skipped:
        lines.append(f"Skipped {skipped:,} member(s) that are not 40-hex-digit fingerprints.")
    lines.append(
        f"The set {set_key!r} is left in place: delete it once the crawl runs on the filter."
    )
    emit(ctx, data, lines)
    return EXIT_OK
