"""Operations commands: inspect, reset and feed a scrapy-redis-bloom filter in Redis.

Run as ``scrapy-redis-bloom COMMAND`` or ``python -m scrapy_redis_bloom COMMAND``:

``info``
    Read the filter's config record (``KEY:meta``) and its bits (BITCOUNT per
    shard): geometry, creation time, bits set, fill ratio, estimated items,
    false-positive rate now, memory. No settings needed: the record says it all.
``reset``
    Delete the filter: its config record and every shard. Asks for confirmation
    on a terminal; elsewhere ``--yes`` is required. With no record but orphaned
    shard keys (``KEY:g<n>:<i>``), deletes those.
``add`` / ``check``
    Read request fingerprints (40 hex digits, one per line) from files or stdin
    and add them to the filter, or count how many it (probably) holds.
``migrate-set``
    Copy the fingerprints of a scrapy-redis dupefilter SET (SSCAN, in batches)
    into the filter.

``add`` and ``migrate-set`` work on an existing filter (created by a crawl); given
sizing options (``--capacity``/``--error-rate`` or ``--bit``/``--hash-number``,
the ``BLOOMFILTER_*`` settings of the same names) they create it when it is
missing, and check them against it when it exists.

The Redis URL comes from ``--redis-url``, else the ``REDIS_URL`` environment
variable, else ``redis://localhost:6379``. Servers are named by host and port
only: a password in the URL is never printed.

Exit status: 0 on success (``reset`` of a filter that does not exist included:
there is nothing to delete); 1 when the work could not be done (no such filter,
Redis unreachable or refusing, a key of the wrong type, an unreadable input,
a reset declined at the prompt); 2 for a usage error (bad arguments, a bad URL,
invalid sizing options, ``reset`` without ``--yes`` when stdin is not a
terminal). Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import IO, Any, NoReturn
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.exceptions import AuthenticationError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import __version__, layout
from .config import BloomConfig, false_positive_rate, format_bytes
from .engine import FilterRecord, RedisBloomFilter, server_address
from .errors import BloomFilterError, ConfigMismatchError

PROG = "scrapy-redis-bloom"
DEFAULT_REDIS_URL = "redis://localhost:6379"

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

#: Fingerprints sent to the engine per bulk call: bounds the CLI's memory.
BATCH = 10_000
#: COUNT hint of each SSCAN / SCAN call.
SCAN_COUNT = 1000

_FINGERPRINT = re.compile(rb"[0-9a-fA-F]{40}")
_URL_CREDENTIALS = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^\s:/@]*:)[^\s@/]*@", re.IGNORECASE)
_SETTING = re.compile(r"\bBLOOMFILTER_[A-Z_]+\b")

#: Sizing options: option name -> the BLOOMFILTER_* setting it stands for.
_SIZING_OPTIONS = {
    "capacity": "BLOOMFILTER_CAPACITY",
    "error_rate": "BLOOMFILTER_ERROR_RATE",
    "bit": "BLOOMFILTER_BIT",
    "hash_number": "BLOOMFILTER_HASH_NUMBER",
    "shard_bit": "BLOOMFILTER_SHARD_BIT",
    "shards": "BLOOMFILTER_SHARDS",
}


class CLIError(Exception):
    """A failure reported as one line on stderr, with ``code`` as the exit status."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class UsageError(CLIError):
    """The command line is wrong: exit status 2."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE)


class _BadLineError(Exception):
    """An input line that is not a fingerprint."""

    def __init__(self, source: str, lineno: int, text: bytes) -> None:
        super().__init__(source, lineno, text)
        self.source = source
        self.lineno = lineno
        self.text = text


class _ArgumentParser(argparse.ArgumentParser):
    """An argument parser that reports errors as a :class:`UsageError`, not by exiting."""

    def error(self, message: str) -> NoReturn:
        """Raise the usage error; :func:`main` prints it as one line."""
        raise UsageError(f"{message} (see '{self.prog} --help')")


@dataclass
class _Context:
    """What every command gets: the parsed arguments and a client of the server."""

    args: argparse.Namespace
    client: redis.Redis
    where: str

    @property
    def key(self) -> str:
        """The filter's key (``--key``)."""
        return str(self.args.key)


# -- output ----------------------------------------------------------------------


def _out(text: str = "") -> None:
    """Write a line to stdout (looked up at call time, so capture works)."""
    sys.stdout.write(text + "\n")


def _err(text: str) -> None:
    """Write a line to stderr."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def _emit(ctx: _Context, data: dict[str, Any], lines: Sequence[str]) -> None:
    """Print a command's result: ``data`` as JSON with ``--json``, else ``lines``."""
    if ctx.args.json:
        _out(json.dumps(data, indent=2))
    else:
        for line in lines:
            _out(line)


def _table(rows: Sequence[tuple[str, str]]) -> list[str]:
    """Lay out label/value rows in two aligned columns."""
    width = max(len(label) for label, _ in rows)
    return [f"{label:<{width}}  {value}" for label, value in rows]


def _utc(timestamp: float) -> datetime:
    """Return a Unix timestamp as an aware UTC datetime."""
    return datetime.fromtimestamp(timestamp, tz=timezone.utc)


def _decode(value: Any) -> str:
    """Decode a reply item, whether or not the client decodes responses."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _secrets(url: str) -> list[str]:
    """Return the password of a Redis URL, raw and percent-decoded, to keep out of output."""
    found: list[str] = []
    with contextlib.suppress(ValueError):
        parts = urlsplit(url)
        if parts.password:
            found += [parts.password, unquote(parts.password)]
        for value in parse_qs(parts.query).get("password", []):
            found.append(value)
    return sorted({s for s in found if s}, key=len, reverse=True)


def _scrub(text: str, secrets: Sequence[str]) -> str:
    """Remove passwords from a message and fold it onto one line."""
    for secret in secrets:
        text = text.replace(secret, "***")
    text = _URL_CREDENTIALS.sub(r"\1***@", text)
    return " ".join(text.split())


# -- Redis -----------------------------------------------------------------------


def _connect(url: str, timeout: float) -> redis.Redis:
    """Build a client for the URL (no connection is made yet)."""
    try:
        return redis.Redis.from_url(
            url, socket_connect_timeout=min(timeout, 10.0), socket_timeout=timeout
        )
    except ValueError as exc:
        raise UsageError(f"invalid --redis-url: {exc}") from None


def _load_record(ctx: _Context, key: str) -> FilterRecord | None:
    """Read the filter's config record; None when it does not exist."""
    meta = layout.meta_key(key)
    kind = _decode(ctx.client.type(meta))
    if kind == "none":
        return None
    if kind != "hash":
        raise CLIError(
            f"Redis key {meta!r} on {ctx.where} holds a {kind}, not a scrapy-redis-bloom"
            f" config record (a hash): is {key!r} the key of a Bloom filter?"
        )
    raw: Any = ctx.client.hgetall(meta)
    if not raw:  # deleted since TYPE
        return None
    return FilterRecord.parse(meta, {_decode(k): _decode(v) for k, v in raw.items()})


def _missing(ctx: _Context, key: str, hint: str = "") -> CLIError:
    """Return the error for a filter whose config record does not exist."""
    meta = layout.meta_key(key)
    message = f"No Bloom filter {key!r} on {ctx.where}: its config record {meta!r} does not exist."
    first_shard = layout.shard_key(key, 0)
    if key.endswith(":meta"):
        message += f" Give the filter's key without ':meta': --key {key[: -len(':meta')]!r}."
    elif ctx.client.exists(first_shard):
        message += (
            f" Its shard key {first_shard!r} exists without the record (orphaned bits):"
            f" delete them with '{PROG} reset --key {key}'."
        )
    elif hint:
        message += " " + hint
    return CLIError(message)


def _count_existing(client: redis.Redis, keys: Sequence[str]) -> int:
    """Count the keys that exist, in batches of EXISTS."""
    total = 0
    for start in range(0, len(keys), SCAN_COUNT):
        total += int(client.exists(*keys[start : start + SCAN_COUNT]))
    return total


def _glob_escape(text: str) -> str:
    """Escape a literal for a SCAN MATCH pattern."""
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)


def _orphaned_shards(client: redis.Redis, key: str) -> list[bytes]:
    """Find a filter's shard keys (``KEY:g<n>:<i>``), their counters and marker by SCAN."""
    shard = re.escape(key.encode()) + rb":g[0-9]+:[0-9]+"
    found: list[bytes] = []
    for pattern, kind, name in (
        (_glob_escape(key) + ":g*", "string", re.compile(shard)),
        ("{" + _glob_escape(key) + ":g*}:count", "hash", re.compile(rb"\{" + shard + rb"\}:count")),
    ):
        found += [
            hit
            for hit in client.scan_iter(match=pattern, count=SCAN_COUNT, _type=kind)
            if isinstance(hit, bytes) and name.fullmatch(hit)
        ]
    # A server of a multi-server filter also holds its place in the server list.
    marker = layout.server_key(key)
    if client.type(marker) in (b"string", "string"):
        found.append(marker.encode())
    return found


def _wrong_shard(ctx: _Context, bloom: RedisBloomFilter) -> CLIError:
    """Return the error for a shard key that holds another type than a string."""
    keys = bloom.shard_keys
    for start in range(0, len(keys), SCAN_COUNT):
        chunk = keys[start : start + SCAN_COUNT]
        with ctx.client.pipeline(transaction=False) as pipe:
            for key in chunk:
                pipe.type(key)
            kinds = pipe.execute()
        for key, kind in zip(chunk, kinds, strict=True):
            if _decode(kind) not in ("string", "none"):
                return CLIError(
                    f"Redis key {key!r} on {ctx.where} holds a {_decode(kind)}, where the"
                    f" Bloom filter {bloom.key!r} keeps a shard's bits (a string). Another"
                    " program wrote it."
                )
    return CLIError(f"A shard key of the Bloom filter {bloom.key!r} holds another type.")


def _confirm(question: str) -> bool:
    """Ask a yes/no question on the terminal; only an explicit yes counts."""
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")


def _stdin_is_tty() -> bool:
    """Tell whether stdin is an interactive terminal."""
    stdin = sys.stdin
    return stdin is not None and not stdin.closed and stdin.isatty()


# -- sizing ----------------------------------------------------------------------


def _option_names(message: str) -> str:
    """Name the command-line options in a message about BLOOMFILTER_* settings."""
    options = {setting: name for name, setting in _SIZING_OPTIONS.items()}

    def rename(match: re.Match[str]) -> str:
        name = options.get(match.group(0))
        return "--" + name.replace("_", "-") if name else match.group(0)

    return _SETTING.sub(rename, message.replace(" setting ", " option "))


def _sizing(args: argparse.Namespace) -> BloomConfig | None:
    """Build the configuration the sizing options describe; None when none is given."""
    settings = {
        setting: getattr(args, name)
        for name, setting in _SIZING_OPTIONS.items()
        if getattr(args, name, None) is not None
    }
    if not settings:
        return None
    try:
        return BloomConfig.from_settings(settings)
    except ValueError as exc:
        raise UsageError(_option_names(str(exc))) from None


def _open_for_writing(ctx: _Context) -> tuple[RedisBloomFilter, bool]:
    """Open the filter for ``add`` / ``migrate-set``: create it if sizing options allow.

    Returns the filter and whether this call created it.
    """
    config = _sizing(ctx.args)
    record = _load_record(ctx, ctx.key)
    if record is None and config is None:
        raise _missing(
            ctx,
            ctx.key,
            "Start the crawl once to create it, or pass --capacity/--error-rate or"
            " --bit/--hash-number (the crawl's BLOOMFILTER_* settings) to create it here.",
        )
    source = config if config is not None else record
    assert source is not None
    bloom = RedisBloomFilter(ctx.client, ctx.key, source.spec, source.capacity)
    try:
        # Creates the record only when sizing options were given, else checks it.
        bloom.open(create=config is not None)
    except ConfigMismatchError as exc:
        if config is None:
            raise
        raise CLIError(
            "The sizing options do not match the existing filter (leave them out to use"
            f" the filter as it is): {exc}"
        ) from None
    return bloom, record is None


def _open_existing(ctx: _Context) -> RedisBloomFilter:
    """Open a filter that must exist, with the geometry its record describes."""
    record = _load_record(ctx, ctx.key)
    if record is None:
        raise _missing(ctx, ctx.key, "A crawl creates it on its first request.")
    bloom = RedisBloomFilter(ctx.client, ctx.key, record.spec, record.capacity)
    bloom.open(create=False)  # checks the hash scheme and layout versions
    return bloom


# -- input -----------------------------------------------------------------------


def _read_fingerprints(paths: Sequence[str]) -> Iterator[list[bytes]]:
    """Yield batches of fingerprints read from files (``-`` is stdin).

    Blank lines are skipped and hex digits lowercased (the form scrapy-redis uses).
    At a line that is not a fingerprint, the lines before it are yielded, then
    :class:`_BadLineError` is raised.
    """
    batch: list[bytes] = []
    for path in paths:
        source = "<stdin>" if path == "-" else path
        with contextlib.ExitStack() as stack:
            stream: IO[bytes]
            stream = sys.stdin.buffer if path == "-" else stack.enter_context(open(path, "rb"))
            for lineno, line in enumerate(stream, 1):
                text = line.strip()
                if not text:
                    continue
                if not _FINGERPRINT.fullmatch(text):
                    if batch:
                        yield batch
                    raise _BadLineError(source, lineno, text)
                batch.append(text.lower())
                if len(batch) == BATCH:
                    yield batch
                    batch = []
    if batch:
        yield batch


def _input_paths(ctx: _Context) -> list[str]:
    """Return the input files; stdin when none is given, unless it is a terminal."""
    paths = [str(path) for path in ctx.args.files]
    if not paths and _stdin_is_tty():
        raise UsageError(
            "no FILE given and stdin is a terminal: give files of fingerprints, or pipe"
            " them in (use - to type them on the terminal)"
        )
    return paths or ["-"]


def _bad_line(exc: _BadLineError, done: int, verb: str) -> CLIError:
    """Return the error for an input line that is not a fingerprint."""
    shown = exc.text[:60].decode(errors="replace")
    return CLIError(
        f"{exc.source}:{exc.lineno}: not a request fingerprint (40 hex digits): {shown!r}."
        f" Stopped there; the {done:,} fingerprint(s) before it were {verb}."
    )


def _progress(done: int, total: int | None) -> None:
    """Show progress on stderr when it is a terminal."""
    if sys.stderr.isatty():
        of = f" of {total:,}" if total else ""
        sys.stderr.write(f"\r{done:,}{of} fingerprints...")
        sys.stderr.flush()


def _progress_done() -> None:
    """End the progress line."""
    if sys.stderr.isatty():
        sys.stderr.write("\n")


# -- commands --------------------------------------------------------------------


def cmd_info(ctx: _Context) -> int:
    """Show the filter's configuration and the state of its bits."""
    key = ctx.key
    record = _load_record(ctx, key)
    if record is None:
        raise _missing(ctx, key)
    spec = record.spec
    bloom = RedisBloomFilter(ctx.client, key, spec, record.capacity)
    if record.servers != 1:
        raise CLIError(
            f"The Bloom filter {key!r} is spread over {record.servers} standalone servers;"
            " this command reads filters on one server or one Redis Cluster."
        )
    try:
        state = bloom.state()
        totals = bloom.totals()
        workers = bloom.live_workers()
    except ResponseError as exc:
        if "WRONGTYPE" not in str(exc):
            raise
        raise _wrong_shard(ctx, bloom) from None
    created = _utc(record.created)
    at_capacity = false_positive_rate(spec.bits, spec.hash_count, record.capacity)
    written = sum(1 for ones in state.bits_set_per_shard if ones)
    data: dict[str, Any] = {
        "key": key,
        "server": ctx.where,
        "created": created.isoformat(),
        "created_timestamp": record.created,
        "layout": record.layout,
        "scheme": record.scheme,
        "bits": spec.bits,
        "bytes": spec.total_bytes,
        "shards": spec.shards,
        "shard_bits": spec.shard_bits,
        "hash_count": spec.hash_count,
        "capacity": record.capacity,
        "expected_fpr_at_capacity": at_capacity,
        "bits_set": state.bits_set,
        "fill_ratio": state.fill_ratio,
        "estimated_items": state.estimated_items,
        "estimated_fpr": state.estimated_fpr,
        "memory_bytes": state.memory_bytes,
        "total_added": totals.added,
        "total_filtered": totals.seen,
        "live_workers": workers,
        "shards_with_bits_set": written,
        "bits_set_per_shard": list(state.bits_set_per_shard),
    }
    rows = [
        ("Bloom filter", key),
        ("Server", ctx.where),
        ("Created", created.strftime("%Y-%m-%d %H:%M:%S UTC")),
        ("Layout / hash scheme", f"{record.layout} / {record.scheme}"),
        ("Bits (m)", f"{spec.bits:,} ({format_bytes(spec.total_bytes)})"),
        ("Shards", f"{spec.shards:,} of {spec.shard_bits:,} bits, {written:,} with bits set"),
        ("Hash functions (k)", str(spec.hash_count)),
        ("Capacity", f"{record.capacity:,} items"),
        ("Expected FP rate at capacity", f"{at_capacity:.3g}"),
        ("Bits set", f"{state.bits_set:,}"),
        ("Fill ratio", f"{100 * state.fill_ratio:.4f} %"),
        ("Estimated items", f"{state.estimated_items:,}"),
        ("Estimated FP rate now", f"{state.estimated_fpr:.3g}"),
        ("Memory in Redis", f"{format_bytes(state.memory_bytes)} ({state.memory_bytes:,} bytes)"),
        ("Added by all workers", f"{totals.added:,}"),
        ("Filtered by all workers", f"{totals.seen:,}"),
        ("Live workers", f"{len(workers)}" + (f" ({', '.join(workers)})" if workers else "")),
    ]
    _emit(ctx, data, _table(rows))
    return EXIT_OK


def cmd_reset(ctx: _Context) -> int:
    """Delete the filter's config record and shards (or orphaned shards)."""
    key = ctx.key
    record = _load_record(ctx, key)
    data: dict[str, Any] = {"key": key, "server": ctx.where}
    if record is not None:
        bloom = RedisBloomFilter(ctx.client, key, record.spec, record.capacity)
        workers = bloom.live_workers()
        if workers and not ctx.args.force:
            raise CLIError(
                f"{len(workers)} worker(s) still crawl with the Bloom filter {key!r} on"
                f" {ctx.where} ({', '.join(workers)}): stop them first, or pass --force"
                " (they would go on adding to a filter that forgot what they saw)."
            )
        present = _count_existing(ctx.client, bloom.shard_keys)
        created = _utc(record.created).strftime("%Y-%m-%d %H:%M:%S UTC")
        what = (
            f"the Bloom filter {key!r} on {ctx.where} (created {created}, {record.describe()}):"
            f" its config record and {present:,} shard key(s)"
        )
        _confirm_or_abort(ctx, what)
        bloom.clear()
        data.update(deleted=True, record=True, shard_keys=present)
        message = f"Deleted {what}."
    else:
        orphans = _orphaned_shards(ctx.client, key)
        marker = layout.server_key(key).encode()
        shards = sum(1 for name in orphans if not name.endswith(b":count") and name != marker)
        if not orphans:
            data.update(deleted=False, record=False, shard_keys=0)
            _emit(ctx, data, [f"No Bloom filter {key!r} on {ctx.where}: nothing to delete."])
            return EXIT_OK
        what = (
            f"{shards:,} orphaned shard key(s) of the Bloom filter {key!r} on"
            f" {ctx.where} (it has no config record)"
        )
        _confirm_or_abort(ctx, what)
        for start in range(0, len(orphans), SCAN_COUNT):
            ctx.client.unlink(*orphans[start : start + SCAN_COUNT])
        data.update(deleted=True, record=False, shard_keys=shards)
        message = f"Deleted {what}."
    _emit(ctx, data, [message])
    return EXIT_OK


def _confirm_or_abort(ctx: _Context, what: str) -> None:
    """Ask before deleting, unless ``--yes``; raise if the answer is not yes."""
    if ctx.args.yes:
        return
    question = f"Delete {what}? Every request it has seen will be forgotten."
    if not _confirm(question):
        raise CLIError("Not confirmed: nothing was deleted.")


def _count_hits(
    paths: Sequence[str], operation: Callable[[list[bytes]], list[bool]], verb: str
) -> tuple[int, int]:
    """Run a bulk operation over the fingerprints read; return (true, false) counts."""
    hits = misses = 0
    try:
        for batch in _read_fingerprints(paths):
            flags = operation(batch)
            found = sum(flags)
            hits += found
            misses += len(flags) - found
            _progress(hits + misses, None)
    except _BadLineError as exc:
        _progress_done()
        raise _bad_line(exc, hits + misses, verb) from None
    _progress_done()
    return hits, misses


def cmd_add(ctx: _Context) -> int:
    """Add fingerprints read from files or stdin to the filter."""
    paths = _input_paths(ctx)
    bloom, created = _open_for_writing(ctx)
    present, new = _count_hits(paths, bloom.add_many, "added")
    total = new + present
    data = {
        "key": ctx.key,
        "server": ctx.where,
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
    _emit(ctx, data, lines)
    return EXIT_OK


def cmd_check(ctx: _Context) -> int:
    """Count how many fingerprints read from files or stdin the filter holds."""
    paths = _input_paths(ctx)
    bloom = _open_existing(ctx)
    present, absent = _count_hits(paths, bloom.contains_many, "checked")
    total = present + absent
    data = {
        "key": ctx.key,
        "server": ctx.where,
        "fingerprints": total,
        "present": present,
        "absent": absent,
    }
    _emit(
        ctx,
        data,
        [
            f"Checked {total:,} fingerprint(s) against the Bloom filter {ctx.key!r} on"
            f" {ctx.where}: {present:,} present, {absent:,} absent."
        ],
    )
    return EXIT_OK


def cmd_migrate_set(ctx: _Context) -> int:
    """Copy a scrapy-redis fingerprint SET into the filter."""
    set_key = str(ctx.args.set_key)
    kind = _decode(ctx.client.type(set_key))
    if kind == "none":
        raise CLIError(f"Redis key {set_key!r} does not exist on {ctx.where}: nothing to migrate.")
    if kind != "set":
        raise CLIError(
            f"Redis key {set_key!r} on {ctx.where} holds a {kind}, not a set of request"
            " fingerprints like scrapy-redis's dupefilter keeps."
        )
    size = int(ctx.client.scard(set_key))
    bloom, created = _open_for_writing(ctx)
    new = present = skipped = 0
    batch: list[bytes] = []

    def flush() -> None:
        nonlocal new, present
        seen = bloom.add_many(batch)
        hits = sum(seen)
        present += hits
        new += len(seen) - hits
        batch.clear()
        _progress(new + present + skipped, size)

    for member in ctx.client.sscan_iter(set_key, count=SCAN_COUNT):
        text = member.strip() if isinstance(member, bytes) else str(member).encode().strip()
        if not _FINGERPRINT.fullmatch(text):
            skipped += 1
            continue
        batch.append(text.lower())
        if len(batch) == BATCH:
            flush()
    if batch:
        flush()
    _progress_done()
    total = new + present
    data = {
        "key": ctx.key,
        "server": ctx.where,
        "set_key": set_key,
        "created_filter": created,
        "fingerprints": total,
        "new": new,
        "already_present": present,
        "skipped": skipped,
    }
    lines = [f"Created the Bloom filter {ctx.key!r} on {ctx.where}."] if created else []
    lines.append(
        f"Migrated {total:,} fingerprint(s) from the set {set_key!r} into the Bloom filter"
        f" {ctx.key!r} on {ctx.where}: {new:,} new, {present:,} already present."
    )
    if skipped:
        lines.append(f"Skipped {skipped:,} member(s) that are not 40-hex-digit fingerprints.")
    lines.append(
        f"The set {set_key!r} is left in place: delete it once the crawl runs on the filter."
    )
    _emit(ctx, data, lines)
    return EXIT_OK


# -- command line ----------------------------------------------------------------


def _key(value: str) -> str:
    """Validate ``--key``: a literal Redis key, not a settings template."""
    if not value:
        raise argparse.ArgumentTypeError("the key must not be empty")
    if "%(spider)s" in value:
        raise argparse.ArgumentTypeError(
            f"{value!r} is the BLOOMFILTER_KEY template: give the key with the spider's name"
            f" filled in, e.g. {value.replace('%(spider)s', 'myspider')!r}"
        )
    return value


def _positive_float(value: str) -> float:
    """Parse a positive, finite number of seconds."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not (math.isfinite(number) and number > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {value!r}")
    return number


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of all commands."""
    common = _ArgumentParser(add_help=False)
    common.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL,
        metavar="URL",
        help=f"Redis server URL (default: $REDIS_URL, else {DEFAULT_REDIS_URL})",
    )
    common.add_argument(
        "--key",
        required=True,
        type=_key,
        help="the filter's key: BLOOMFILTER_KEY with the spider's name filled in,"
        " e.g. myspider:bloomfilter",
    )
    common.add_argument("--json", action="store_true", help="print the result as JSON")
    common.add_argument(
        "--timeout",
        type=_positive_float,
        default=30.0,
        metavar="SECONDS",
        help="socket timeout for Redis commands (default: %(default)s)",
    )

    sizing = _ArgumentParser(add_help=False)
    group = sizing.add_argument_group(
        "sizing (to create a missing filter; checked against an existing one)"
    )
    group.add_argument("--capacity", type=int, metavar="N", help="BLOOMFILTER_CAPACITY")
    group.add_argument("--error-rate", type=float, metavar="P", help="BLOOMFILTER_ERROR_RATE")
    group.add_argument("--bit", type=int, metavar="B", help="BLOOMFILTER_BIT (m = 2**B bits)")
    group.add_argument("--hash-number", type=int, metavar="K", help="BLOOMFILTER_HASH_NUMBER")
    group.add_argument("--shard-bit", type=int, metavar="S", help="BLOOMFILTER_SHARD_BIT")
    group.add_argument("--shards", type=int, metavar="N", help="BLOOMFILTER_SHARDS")

    files = _ArgumentParser(add_help=False)
    files.add_argument(
        "files",
        nargs="*",
        default=[],
        metavar="FILE",
        help="files of fingerprints, 40 hex digits per line; - for stdin, which is read"
        " when no FILE is given",
    )

    parser = _ArgumentParser(
        prog=PROG,
        description="Inspect, reset and feed scrapy-redis-bloom filters in Redis.",
        epilog="Exit status: 0 success, 1 failure, 2 usage error.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    info = commands.add_parser(
        "info",
        parents=[common],
        help="show a filter's configuration, fill and false-positive rate",
        description="Show a filter's configuration (from its record) and the state of"
        " its bits: bits set, fill ratio, estimated items and false-positive rate now.",
    )
    info.set_defaults(handler=cmd_info)

    reset = commands.add_parser(
        "reset",
        parents=[common],
        help="delete a filter: its record and every shard",
        description="Delete a filter's config record and shards, forgetting every request"
        " it has seen. Stop the crawl first: a filter with live workers (see info) is"
        " refused unless --force. Asks for confirmation on a terminal; otherwise pass"
        " --yes. A filter that does not exist is not an error.",
    )
    reset.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    reset.add_argument(
        "--force", action="store_true", help="reset even while workers hold live leases"
    )
    reset.set_defaults(handler=cmd_reset)

    add = commands.add_parser(
        "add",
        parents=[common, sizing, files],
        help="add fingerprints from files or stdin",
        description="Add request fingerprints to a filter and count those new and those"
        " already present (a false positive counts as present).",
    )
    add.set_defaults(handler=cmd_add)

    check = commands.add_parser(
        "check",
        parents=[common, files],
        help="count how many fingerprints a filter holds",
        description="Count the fingerprints a filter (probably) holds. Changes nothing.",
    )
    check.set_defaults(handler=cmd_check)

    migrate = commands.add_parser(
        "migrate-set",
        parents=[common, sizing],
        help="copy a scrapy-redis dupefilter SET into a filter",
        description="Copy the fingerprints of a scrapy-redis dupefilter SET into a filter,"
        " by SSCAN in batches. The set is left in place.",
    )
    migrate.add_argument(
        "--set-key",
        required=True,
        metavar="KEY",
        help="the SET to read, e.g. myspider:dupefilter",
    )
    migrate.set_defaults(handler=cmd_migrate_set)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    secrets = _secrets(os.environ.get("REDIS_URL", ""))
    where = "Redis"
    # Library warnings go to stderr, unless the host program configured logging.
    package_logger = logging.getLogger(__package__)
    handler: logging.Handler = logging.NullHandler()
    if not package_logger.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"{PROG}: %(levelname)s: %(message)s"))
    package_logger.addHandler(handler)
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:  # --help, --version
            return exc.code if isinstance(exc.code, int) else EXIT_OK
        secrets = _secrets(args.redis_url) + secrets
        if args.command == "reset" and not args.yes and not _stdin_is_tty():
            raise UsageError(
                "reset deletes the filter and cannot ask for confirmation (stdin is not a"
                " terminal): pass --yes to confirm."
            )
        client = _connect(args.redis_url, args.timeout)
        where = server_address(client)
        try:
            run: Callable[[_Context], int] = args.handler
            return run(_Context(args=args, client=client, where=where))
        finally:
            client.close()
    except CLIError as exc:
        return _fail(exc.message, exc.code, secrets)
    except BloomFilterError as exc:
        return _fail(str(exc), EXIT_FAILURE, secrets)
    except AuthenticationError as exc:
        return _fail(f"Redis at {where} refused the credentials: {exc}", EXIT_FAILURE, secrets)
    except RedisTimeoutError as exc:
        return _fail(f"Redis at {where} did not answer in time: {exc}", EXIT_FAILURE, secrets)
    except RedisConnectionError as exc:
        return _fail(f"cannot connect to Redis at {where}: {exc}", EXIT_FAILURE, secrets)
    except ResponseError as exc:
        return _fail(f"Redis at {where} refused a command: {exc}", EXIT_FAILURE, secrets)
    except RedisError as exc:
        return _fail(f"Redis error from {where}: {exc}", EXIT_FAILURE, secrets)
    except BrokenPipeError:
        # The reader of stdout went away (e.g. `| head`): stop quietly.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILURE
    except OSError as exc:
        name = f"{exc.filename}: " if exc.filename else ""
        return _fail(f"{name}{exc.strerror or exc}", EXIT_FAILURE, secrets)
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_INTERRUPTED, secrets)
    finally:
        package_logger.removeHandler(handler)


def _fail(message: str, code: int, secrets: Sequence[str]) -> int:
    """Print an error as one line on stderr and return its exit status."""
    _err(f"{PROG}: error: {_scrub(message, secrets)}")
    return code
