"""The commands that change or move what a filter holds: add, check, migrate, dump, restore, reset.

``migrate`` saves its SSCAN cursor and counts after each bulk call, so an interrupted run resumes.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from scrapy_redis_bloom.cli.context import (
    EXIT_INTERRUPTED,
    CLIError,
    Context,
    UsageError,
    check_servers,
    existing,
    native_if,
    open_existing,
    open_for_writing,
    stored,
)
from scrapy_redis_bloom.cli.streams import (
    FINGERPRINT,
    BadLineError,
    bad_line,
    confirm_or_abort,
    emit,
    input_paths,
    listing,
    orphan_data,
    parser_for,
    progress,
    read_lines,
)
from scrapy_redis_bloom.core import layout
from scrapy_redis_bloom.core.errors import (
    BloomFilterError,
    FilterBusyError,
    FilterDamagedError,
    Wording,
)
from scrapy_redis_bloom.core.record import FilterRecord
from scrapy_redis_bloom.core.settings import FINGERPRINTER, WORKER_TTL, ConnectionConfig
from scrapy_redis_bloom.core.sizing import format_bytes
from scrapy_redis_bloom.engine import backend
from scrapy_redis_bloom.engine.bitmap.filter import RedisBloomFilter
from scrapy_redis_bloom.engine.bitmap.local import HAVE_NUMPY
from scrapy_redis_bloom.engine.native.filter import NativeBloomFilter
from scrapy_redis_bloom.engine.parts import pairs, text
from scrapy_redis_bloom.ops import inventory
from scrapy_redis_bloom.ops.dump import Progress, Summary, dump_filter
from scrapy_redis_bloom.ops.dumpfile import DumpFileError
from scrapy_redis_bloom.ops.inventory import SCAN_COUNT, MarkerCheck, StoredRecord
from scrapy_redis_bloom.ops.restore import UNTOUCHED, FilterExistsError, restore_filter
from scrapy_redis_bloom.ops.scanning import Scan, ScannedKeyGoneError
from scrapy_redis_bloom.scrapy.connection import scrapy_redis_client
from scrapy_redis_bloom.transport.connection import url_address
from scrapy_redis_bloom.transport.executor import Call
from scrapy_redis_bloom.transport.topology import server_address
from scrapy_redis_bloom.transport.wire import Arg, pack_command

logger = logging.getLogger(__name__)

#: Fields of the progress marker that hold counts.
_COUNTS = ("new", "present", "skipped")
#: Fingerprints from which a bulk load without numpy warns it is slow (fewer take seconds).
ADVISE_FROM = 1_000_000


def _call(command: bytes, key: str, *args: Arg) -> Call:
    return Call(pack_command(command, key, *args), key=key)


def _created(ctx: Context, created: bool) -> list[str]:
    return [f"Created the Bloom filter {ctx.key!r} on {ctx.where}."] if created else []


def _advise_numpy(bloom: RedisBloomFilter | NativeBloomFilter, count: int) -> None:
    """Warn that a bitmap filter's bulk load of ``count`` fingerprints is slow without numpy."""
    if not HAVE_NUMPY and isinstance(bloom, RedisBloomFilter) and count >= ADVISE_FROM:
        logger.warning(
            "numpy is not installed, so this load runs in pure Python, 5-7x slower than with"
            " the numpy extra: pip install 'scrapy-redis-bloom[numpy]'."
        )


def _interrupted(said: str) -> CLIError:
    """Return the error of a command stopped by Ctrl-C, saying what it left (exit status 130)."""
    error = CLIError(f"interrupted: {said}")
    error.code = EXIT_INTERRUPTED
    return error


@contextlib.contextmanager
def _telling(
    ctx: Context, done: Callable[[], str], damaged: Callable[[], str] | None = None
) -> Iterator[None]:
    """Turn Redis failing or Ctrl-C during a load into an error that says what was ``done()``.

    A filter found damaged (parts gone or replaced) says ``damaged()`` instead: what was
    loaded is not all in it, so running again does not simply resume.
    """
    try:
        yield
    except KeyboardInterrupt:
        raise _interrupted(done()) from None
    except BloomFilterError as exc:
        said = damaged() if damaged and isinstance(exc, FilterDamagedError) else done()
        raise CLIError(f"{ctx.frontend.words(exc).rstrip('.')}. Stopped: {said}") from None


def _count_hits(
    ctx: Context,
    batches: Iterable[list[bytes]],
    bloom: RedisBloomFilter | NativeBloomFilter,
    write: bool,
) -> tuple[int, int]:
    """Add (``write``) or check the fingerprints read; return (true, false) counts."""
    operation = bloom.add_many if write else bloom.contains_many
    verb = "added" if write else "checked"
    hits = done = pending = 0  # pending: the fingerprints of the call under way

    def report() -> str:
        if not write:
            return f"{done:,} fingerprint(s) were checked before it: {hits:,} present."
        stopped = (
            f", and some of the next {pending:,} (fingerprints {done + 1:,} to {done + pending:,}"
            " read), whose call it stopped, may be in it too"
            if pending
            else ""
        )
        return (
            f"{done:,} fingerprint(s) were added before it{stopped}; adding them again is safe:"
            " those added count as already present."
        )

    def lost() -> str:
        return (
            f"{done:,} fingerprint(s) were added before it, but the filter is damaged: not all"
            " of them may be in it. Once it is reset, add them all again."
        )

    damaged = lost if write else None
    with _telling(ctx, report, damaged), progress(None, "fp", verb.capitalize()) as bar:
        try:
            for index, batch in enumerate(batches):
                if not index:  # (batches of streams.BATCH: one full is a big load)
                    _advise_numpy(bloom, len(batch))
                pending = len(batch)
                flags = operation(batch)
                hits += sum(flags)
                done += len(flags)
                pending = 0
                bar.update(len(flags))
        except BadLineError as exc:
            raise bad_line(ctx, exc, done, verb) from None
    return hits, done - hits


def add(ctx: Context) -> int:
    """Add fingerprints read from files or stdin to the filter.

    The files are checked and the first batch read before the filter is opened: a missing
    file or a first line that is no fingerprint creates no filter (allocated whole).
    """
    batches = read_lines(input_paths(ctx), parser_for(ctx))
    try:
        first = list(itertools.islice(batches, 1))
    except BadLineError as exc:
        raise bad_line(ctx, exc, 0, "added") from None
    bloom, created = open_for_writing(ctx)
    present, new = _count_hits(ctx, itertools.chain(first, batches), bloom, True)
    total = new + present
    data = ctx.result(created_filter=created, fingerprints=total, new=new, already_present=present)
    line = (
        f"Added {total:,} fingerprint(s) to the Bloom filter {ctx.key!r} on {ctx.where}:"
        f" {new:,} new, {present:,} already present."
    )
    return emit(ctx, data, [*_created(ctx, created), line])


def check(ctx: Context) -> int:
    """Count how many fingerprints read from files or stdin the filter holds."""
    paths = input_paths(ctx)
    bloom = open_existing(ctx)
    present, absent = _count_hits(ctx, read_lines(paths, parser_for(ctx)), bloom, False)
    total = present + absent
    data = ctx.result(fingerprints=total, present=present, absent=absent)
    line = (
        f"Checked {total:,} fingerprint(s) against the Bloom filter {ctx.key!r} on"
        f" {ctx.where}: {present:,} present, {absent:,} absent."
    )
    return emit(ctx, data, [line])


def marker_key(set_key: str) -> str:
    """Return the key of a migration's progress marker: beside the SET it reads."""
    return f"{set_key}:bloom-migration"


#: ``--set-redis-url``'s default in ``scrapy bloom``: the SET is where scrapy-redis keeps it.
SCRAPY_REDIS_CONNECTION = object()


class _WithRedisUrl:
    """The settings, with ``REDIS_URL`` given: scrapy-redis's connection to another server."""

    def __init__(self, settings: Any, url: str) -> None:
        self.settings, self.url = settings, url

    def get(self, name: str, default: Any = None) -> Any:
        return self.url if name == "REDIS_URL" else self.settings.get(name, default)


def _set_clients(ctx: Context) -> tuple[list[Any], str]:
    """Return the clients of the SET's Redis, and its address for messages.

    ``--set-redis-url``, else (``scrapy bloom``) scrapy-redis's connection, REDIS_URL and
    REDIS_PARAMS, which the filter's own (``BLOOMFILTER_REDIS_URL``...) may not be; the alias
    reads it on the filter's first server (or cluster).
    """
    url: Any = getattr(ctx.args, "set_redis_url", None)  # a URL, None or the default
    on_filter = ctx.clients, ctx.where.split(", ")[0] if not ctx.cluster else ctx.where
    if url is None:
        return on_filter
    if url is SCRAPY_REDIS_CONNECTION:
        config = ConnectionConfig.from_settings(ctx.settings)
        if not config.urls and not config.sentinels:  # the filter's connection too
            return on_filter
        settings = ctx.settings
    else:
        settings = _WithRedisUrl(ctx.settings, url)
    try:
        client = scrapy_redis_client(settings)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    ctx.stack.callback(client.close)
    return [client], server_address(client) if url is SCRAPY_REDIS_CONNECTION else url_address(url)


def migrate(ctx: Context) -> int:
    """Copy a scrapy-redis fingerprint SET into the filter, from where a run stopped."""
    if FINGERPRINTER.read(ctx.settings) == "crawler":
        raise UsageError(
            ctx.frontend.words(
                Wording(
                    "{BLOOMFILTER_FINGERPRINTER} is 'crawler': the filter would hold the SET's"
                    " fingerprints, which are scrapy-redis's (a SHA-1 of the method, URL and"
                    " body), while the crawl checks its REQUEST_FINGERPRINTER_CLASS's, which"
                    " never match them: the crawl would fetch again every page the SET has."
                    " Crawl with {BLOOMFILTER_FINGERPRINTER} = 'scrapy-redis' (the default) to"
                    " move from the SET. Nothing was copied."
                )
            )
        )
    set_key = str(ctx.args.set_key)
    batch_size = int(ctx.args.batch)
    clients, source = _set_clients(ctx)
    reader = ctx.own(inventory.probe(clients, ctx.key, ctx.faults)).parts
    (kind,) = reader.run("read the set's type", [_call(b"TYPE", set_key)], take=text)
    if kind == "none":
        raise CLIError(f"Redis key {set_key!r} does not exist on {source}: nothing to migrate.")
    if kind != "set":
        raise CLIError(
            f"Redis key {set_key!r} on {source} holds a {kind}, not a set of request"
            " fingerprints like scrapy-redis's dupefilter keeps."
        )
    (size,) = reader.run("count the set's members", [_call(b"SCARD", set_key)], take=int)
    bloom, created = open_for_writing(ctx)
    _advise_numpy(bloom, size)
    record = bloom.record
    assert record is not None  # opened
    marker = marker_key(set_key)
    cursor, counts = 0, dict.fromkeys(_COUNTS, 0)
    scan = Scan(reader, (b"SSCAN", set_key), f"the set {set_key!r}", key=set_key)
    # Where a run of this filter stopped, and the server process its cursor came from.
    call = _call(b"HGETALL", marker)
    saved = {} if ctx.args.restart else reader.run("read the progress", [call], take=pairs)[0]
    if saved.get("filter_id") == record.filter_id:
        with contextlib.suppress(KeyError, ValueError):  # not a marker this version wrote
            cursor, counts = int(saved["cursor"]), {name: int(saved[name]) for name in _COUNTS}
            scan.process = saved["process"]
    resumed = cursor != 0
    batch: list[bytes] = []

    def done() -> str:
        return (
            f"{sum(counts.values()):,} of the set's {size:,} members were migrated. Run the"
            f" command again: it resumes from its last saved batch (progress marker"
            f" {marker!r}), and those migrated since count as already present."
        )

    def lost() -> str:
        return (
            f"{sum(counts.values()):,} of the set's {size:,} members were migrated, but the"
            " filter is damaged: not all of them may be in it, and the run cannot resume from"
            f" its progress marker {marker!r}. Once the filter is reset, run the command again"
            " with --restart to migrate the set from its start."
        )

    with _telling(ctx, done, lost), progress(size, "fp", "Migrating") as bar:
        bar.update(min(size, sum(counts.values())))

        def flush(reached: int | None) -> None:
            seen = bloom.add_many(batch) if batch else []
            hits = sum(seen)
            counts["present"] += hits
            counts["new"] += len(seen) - hits
            bar.update(len(seen))
            batch.clear()
            if reached:
                fields: dict[str, str | int] = {"filter_id": record.filter_id, "cursor": reached}
                fields.update(counts, process=scan.process)
                argv = [item for pair in fields.items() for item in pair]
                reader.run("save the progress", [_call(b"HSET", marker, *argv)], write=True)

        next_cursor: int | None = cursor
        while next_cursor is not None:
            restarts = scan.restarts
            try:
                next_cursor, members = scan.next(next_cursor, min(SCAN_COUNT, batch_size))
            except ScannedKeyGoneError:
                flush(None)
                reader.run("delete the progress", [_call(b"DEL", marker)], write=True)
                raise CLIError(
                    f"The set {set_key!r} on {source} is gone (evicted, expired or deleted)"
                    f" after {sum(counts.values()):,} of its {size:,} members were migrated:"
                    " the others are not in the filter, and would be fetched again."
                ) from None
            if scan.restarts != restarts:  # started over: what was added counts as present
                counts = dict.fromkeys(_COUNTS, 0)
                batch.clear()  # read again from 0: else counted twice
                bar.reset()
            for member in members:
                line = member.strip()
                if FINGERPRINT.fullmatch(line):
                    batch.append(line.lower())
                else:
                    counts["skipped"] += 1
                    bar.update(1)
            if len(batch) >= batch_size:
                flush(next_cursor)
        flush(None)
    reader.run("delete the progress", [_call(b"DEL", marker)], write=True)
    new, present, skipped = (counts[name] for name in _COUNTS)
    total = new + present
    data = ctx.result(
        set_key=set_key,
        set_server=source,
        created_filter=created,
        resumed=resumed,
        started_over=scan.restarts,
        fingerprints=total,
        new=new,
        already_present=present,
        skipped=skipped,
    )
    lines = _created(ctx, created)
    if resumed:
        lines.append(f"Resumed the migration where it stopped (progress marker {marker!r}).")
    if scan.restarts:
        lines.append(
            f"Started the scan of the set over {scan.restarts} time(s): Redis restarted or failed"
            " over, and an SSCAN cursor does not outlive its server process."
        )
    elsewhere = f" on {source}" if clients is not ctx.clients else ""
    lines.append(
        f"Migrated {total:,} fingerprint(s) from the set {set_key!r}{elsewhere} into the Bloom"
        f" filter {ctx.key!r} on {ctx.where}: {new:,} new, {present:,} already present."
    )
    if skipped:
        lines.append(f"Skipped {skipped:,} member(s) that are not 40-hex-digit fingerprints.")
    lines.append(
        f"The set {set_key!r} is left in place: delete it once the crawl runs on the filter."
    )
    return emit(ctx, data, lines)


def _follow(bar: tqdm[Any]) -> Progress:
    """Return a ``progress(done, total)`` callback of the ops layer that moves ``bar``."""

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    return update


def _file_result(ctx: Context, path: Path, summary: Summary, **more: Any) -> dict[str, Any]:
    """Return the JSON result of ``dump`` or ``restore``: the file, the filter, the counts."""
    totals = summary.totals
    return ctx.result(
        file=str(path),
        id=summary.record.filter_id,
        items=summary.added,
        parts=totals.parts,
        data_bytes=totals.data_bytes,
        sha256=totals.sha256,
        seconds=summary.seconds,
        **more,
    )


def dump(ctx: Context) -> int:
    """Write the filter to ``FILE``: its record, counters and every part's bytes."""
    path, written = Path(ctx.args.file), _dump_target(str(ctx.args.file))
    partial = written.with_name(written.name + ".partial")
    try:
        source, _ = existing(ctx, "Nothing to dump.")
        with progress(None, "B", "Dumping") as bar, open(partial, "wb") as out:
            ttl = WORKER_TTL.read(ctx.settings)
            summary = dump_filter(source, out, _follow(bar), force=ctx.args.force, worker_ttl=ttl)
        os.replace(partial, written)
    except FilterBusyError as exc:
        raise CLIError(f"{exc} (--force)") from None
    except KeyboardInterrupt:
        raise _interrupted(
            f"Nothing was dumped: {str(path)!r} was left as it was, and no partial file is left"
            f" beside it ({partial.name!r}). Run the dump again."
        ) from None
    finally:
        partial.unlink(missing_ok=True)
    totals = summary.totals
    data = _file_result(
        ctx,
        path,
        summary,
        chunks=totals.chunks,
        file_bytes=totals.file_bytes,
        forced=summary.forced,
    )
    lines = [
        f"Dumped the Bloom filter {ctx.key!r} (id {summary.record.filter_id}) from {ctx.where}"
        f" to {str(path)!r}: {totals.parts:,} part(s), {summary.added:,} items,"
        f" a {format_bytes(totals.file_bytes)} file in {summary.seconds:.1f} s.",
        f"SHA-256 {totals.sha256}",
    ]
    if summary.forced:
        lines.append("Workers held leases meanwhile: URLs they added may be missing (--force).")
    return emit(ctx, data, lines)


def _dump_target(name: str) -> Path:
    """Return the regular file a dump goes to (a symlink's target); refuse anything else."""
    if name == "-":
        raise CLIError("A dump goes to a file, written whole before it is named: give its path.")
    path = Path(os.path.realpath(name))  # a symlink: its target is written, the link kept
    if path.exists() and not path.is_file():
        what = "a directory" if path.is_dir() else "not a regular file (a device, a pipe)"
        raise CLIError(
            f"{name!r} is {what}: a dump goes to a file, written beside it first"
            " (FILE.partial) and renamed over it once complete."
        )
    return path


def restore(ctx: Context) -> int:
    """Restore ``FILE`` as the filter, on the servers the settings name."""
    if ctx.args.file == "-":
        raise CLIError(
            "A restore reads a file, twice (it checks every checksum before it writes"
            " anything): give its path, standard input cannot be read again."
        )
    path = Path(ctx.args.file)
    try:
        with progress(None, "B", "Restoring") as bar, open(path, "rb") as inp:
            summary = restore_filter(
                ctx.clients,
                ctx.key,
                inp,
                _follow(bar),
                replace=ctx.args.replace,
                name=repr(str(path)),
                faults=ctx.faults,
                worker_ttl=WORKER_TTL.read(ctx.settings),
            )
    except DumpFileError as exc:
        raise CLIError(str(exc)) from None
    except KeyboardInterrupt as exc:  # restore_filter's note says what it left
        raise _interrupted(" ".join(getattr(exc, "__notes__", None) or [UNTOUCHED])) from None
    except FilterExistsError as exc:
        if exc.replaceable:
            raise CLIError(f"{exc} (--replace)") from None
        prog, key = ctx.frontend.prog, ctx.key
        raise CLIError(
            f"{exc} ('{prog} reset --key {key}' deletes such parts, which"
            f" '{prog} info --key {key}' names.)"
        ) from None
    totals = summary.totals
    data = _file_result(ctx, path, summary, source=summary.source, replaced=summary.replaced)
    lines = [
        f"Restored the Bloom filter {ctx.key!r} (id {summary.record.filter_id}) on {ctx.where}"
        f" from {str(path)!r} (dumped from {summary.source}): {totals.parts:,} part(s),"
        f" {summary.added:,} items, {format_bytes(totals.data_bytes)} of data in"
        f" {summary.seconds:.1f} s."
    ]
    if summary.replaced:
        lines.append("The filter that was under this key was deleted first (--replace).")
    return emit(ctx, data, lines)


def reset(ctx: Context) -> int:
    """Delete the filter on every server, or the parts it left without a usable record."""
    bloom, found = stored(ctx)
    if found is not None and found.record is not None:
        return _reset_filter(ctx, bloom, found.record)
    return _reset_orphans(ctx, bloom, found)


def _reset_filter(ctx: Context, bloom: RedisBloomFilter, record: FilterRecord) -> int:
    """Delete a filter that has a record: every part its geometry and server count name."""
    check_servers(ctx, bloom, record)
    refuse_live_workers(ctx, bloom)
    markers = inventory.check_markers(bloom, record)
    _refuse_foreign_markers(ctx, record, markers)
    native = native_if(ctx, record)
    present = len(native.existing() if native else bloom.parts.existing(range(record.spec.shards)))
    counters = bool(inventory.existing_keys(bloom.parts, [(bloom.parts.counter_key, None, None)]))
    marked = sum(1 for marker in markers if marker.found is not None)
    parts = ["its config record", f"{present:,} shard key(s)"]
    if counters:
        parts.append("its counters")
    if marked:
        parts.append(f"its server markers on {marked} server(s)")
    what = (
        f"the Bloom filter {ctx.key!r} on {ctx.where} (id {record.filter_id}, created"
        f" {record.created_text()}, {record.describe()}): {', '.join(parts[:-1])} and {parts[-1]}"
    )
    confirm_or_abort(ctx, what)
    with claimed(ctx, bloom):
        deleted = backend.delete(bloom.parts, record)
    data = ctx.result(
        servers=inventory.addresses(bloom),
        deleted=True,
        record=True,
        id=record.filter_id,
        shard_keys=present,
        counters=counters,
        server_markers=marked,
        keys_deleted=deleted,  # a grown or windowed shard's every generation and window too
    )
    return emit(ctx, data, [f"Deleted {what}: {deleted:,} keys."])


def _refuse_foreign_markers(
    ctx: Context, record: FilterRecord, markers: Sequence[MarkerCheck]
) -> None:
    """Refuse to reset by a server list the servers' markers contradict (parts would be missed)."""
    for marker in markers:
        if marker.status != "foreign" or marker.found is None:
            continue
        found = layout.parse_marker(marker.found)
        if found is None:
            problem: str | Wording = (
                f"its key {layout.server_key(ctx.key)!r} holds {marker.found!r}, which is no"
                " filter's server marker: another program's key where the filter keeps its"
                " marker. Remove or rename that key, then reset again"
            )
        elif found[0] == record.filter_id:
            problem = Wording(
                "it is server {index}/{count} of the filter, given as server"
                " {given}/{servers}. Give the servers in {BLOOMFILTER_REDIS_URLS} in the"
                " crawl's order",
                index=found[1],
                count=found[2],
                given=marker.server,
                servers=record.servers,
            )
        else:
            problem = (
                f"it holds part of another Bloom filter named {ctx.key!r} (id {found[0]}): the"
                " servers given mix two filters'. Give this filter's own servers; reset"
                " another filter's leftovers on their server alone"
            )
        raise ctx.refusal(
            "Cannot reset the Bloom filter {key!r} (id {id}) on {where}: Redis at"
            " {address} is not its server {server}: {problem}. Nothing was deleted.",
            key=ctx.key,
            id=record.filter_id,
            where=ctx.where,
            address=marker.address,
            server=marker.server,
            problem=problem,
        )


def _reset_orphans(ctx: Context, bloom: RedisBloomFilter, unusable: StoredRecord | None) -> int:
    """Delete what a filter without a usable record left, if it carries the filter's id."""
    key = ctx.key
    refuse_live_workers(ctx, bloom)
    found = inventory.find_orphans(bloom)
    if found.blocking:
        record = found.blocking[0]
        raise ctx.refusal(
            "Cannot delete parts of the Bloom filter {key!r} on {where} as orphans: {part!r} on"
            " {address} is {what}. Give the servers in {BLOOMFILTER_REDIS_URLS} in the filter's"
            " order, then reset again. Nothing was deleted.",
            key=key,
            where=ctx.where,
            part=record.key,
            address=record.address,
            what=record.what,
        )
    kept = list(found.kept)
    data = ctx.result(
        servers=inventory.addresses(bloom), record=False, not_deleted=orphan_data(kept)
    )
    kept_lines = ["Not deleted (carries no filter id):", *listing(key, kept)] if kept else []
    if not found.deletable:
        data.update(deleted=False, shard_keys=0, deleted_keys=[])
        lines = [f"No Bloom filter {key!r} on {ctx.where}: nothing to delete.", *kept_lines]
        return emit(ctx, data, lines)
    orphans = list(found.deletable)
    shards = sum(1 for o in orphans if o.kind in ("shard", "native"))
    others = len(orphans) - shards
    why = "its config record cannot be used" if unusable is not None else "it has no config record"
    what = (
        f"{shards:,} orphaned shard key(s)"
        + (f" and {others:,} other part(s)" if others else "")
        + f" of the Bloom filter {key!r} on {ctx.where} ({why})"
    )
    confirm_or_abort(ctx, what, [f"To delete, {what}:", *listing(key, orphans), *kept_lines])
    with claimed(ctx, bloom):
        deleted = inventory.delete_orphans(bloom, orphans)
    changed = [o for o in orphans if o not in deleted]
    data.update(
        deleted=True,
        shard_keys=sum(1 for o in deleted if o.kind in ("shard", "native")),
        deleted_keys=orphan_data(deleted),
        changed=orphan_data(changed),
    )
    lines = [f"Deleted {what}:", *listing(key, deleted)]
    if changed:
        lines += ["Not deleted (changed since listed):", *listing(key, changed)]
    return emit(ctx, data, lines + kept_lines)


@contextlib.contextmanager
def claimed(ctx: Context, bloom: RedisBloomFilter) -> Iterator[None]:
    """Hold the worker registry while deleting: no worker starts on a filter half gone.

    The check for live workers and the claim are one script: one started since the prompt counts.
    """
    if ctx.args.force:
        yield
        return
    ttl = WORKER_TTL.read(ctx.settings)  # the workers': a restarted registry waits for it
    lease = bloom.lease(f"scrapy-bloom-reset:{socket.gethostname()}:{os.getpid()}", ttl=ttl)
    with contextlib.closing(lease), lease.clearing() as others:
        if others:
            refuse_live_workers(ctx, bloom)
        yield


def refuse_live_workers(ctx: Context, bloom: RedisBloomFilter) -> None:
    """Refuse to reset while workers hold live leases, unless ``--force``."""
    if ctx.args.force:
        return
    if workers := bloom.live_workers(WORKER_TTL.read(ctx.settings)):
        raise CLIError(
            f"{len(workers)} worker(s) still crawl with the Bloom filter {ctx.key!r} on"
            f" {ctx.where} ({', '.join(workers)}): stop them first, or pass --force"
            " (they would go on adding to a filter that forgot what they saw)."
        )
