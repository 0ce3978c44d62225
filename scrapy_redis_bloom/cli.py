"""Operations commands: inspect, reset and feed a scrapy-redis-bloom filter in Redis.

Run as ``scrapy-redis-bloom COMMAND`` or ``python -m scrapy_redis_bloom COMMAND``:

``info``
    Read the filter's config record (``KEY:meta``), check each shard's header and
    each server's marker against it, and count its bits (BITCOUNT per shard):
    identity, geometry, creation time, bits set, fill ratio, estimated items,
    false-positive rate now, memory, totals, live workers, and the shards that are
    missing or not this filter's. Repairs nothing. No settings needed: the record
    says it all.
``reset``
    Delete the filter on every server: its config record, every shard, its counters
    and server markers. Asks for confirmation on a terminal; elsewhere ``--yes`` is
    required. With no usable record, finds the filter's parts by SCAN on every server
    and deletes only those that carry its id (or can be nothing else); keys that only
    share a name are listed and left alone.
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

Where the filter lives is given as to a crawl: ``--redis-url`` once for one server
(``BLOOMFILTER_REDIS_URL``), several times for a server list, in order (shard ``i``
on server ``i mod n``, ``BLOOMFILTER_REDIS_URLS``), or once with ``--cluster`` for a
node of a Redis Cluster (``BLOOMFILTER_REDIS_CLUSTER``). Without ``--redis-url``:
the ``REDIS_URL`` environment variable, else ``redis://localhost:6379``. Every
command goes through the engine (:mod:`.engine`), with its routing and retries
(``--retry-timeout``). Servers are named by host and port only: a password in a URL
is never printed.

Exit status: 0 on success (``reset`` of a filter that does not exist included:
there is nothing to delete); 1 when the work could not be done (no such filter,
Redis unreachable or refusing, a key of the wrong type, an unreadable input,
a reset declined at the prompt); 2 for a usage error (bad arguments, a bad URL,
invalid sizing options, ``reset`` without ``--yes`` when stdin is not a
terminal); 130 when interrupted. Errors are one line on stderr, never a traceback.
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
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import IO, Any, NoReturn, TypeVar

from redis.exceptions import AuthenticationError, RedisClusterException, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import __version__
from .config import BloomConfig, ConnectionConfig, FaultPolicy
from .connection import DEFAULT_PARAMS, filter_clients, url_address
from .engine import inventory, layout
from .engine.backend import make_filter
from .engine.filter import RedisBloomFilter
from .engine.inventory import MarkerCheck, Orphan, StoredRecord
from .engine.native import NativeBloomFilter
from .engine.native import delete as delete_native
from .engine.record import FilterRecord
from .engine.state import FilterState, FilterTotals
from .errors import (
    BloomFilterError,
    ConfigMismatchError,
    FilterUnavailableError,
    ServerListMismatchError,
)
from .redact import scrub, url_secrets
from .sizing import false_positive_rate, format_bytes

logger = logging.getLogger(__name__)

PROG = "scrapy-redis-bloom"
DEFAULT_REDIS_URL = "redis://localhost:6379"
DEFAULT_TIMEOUT = 30.0
#: Seconds a failing Redis command is retried: shorter than a crawl's default (20 s),
#: since someone is waiting at the terminal.
DEFAULT_RETRY_TIMEOUT = 5.0

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

#: Fingerprints sent to the engine per bulk call: bounds the CLI's memory.
BATCH = 10_000
#: COUNT hint of each SSCAN call.
SCAN_COUNT = 1000
#: Keys listed one per line in text output, at most (JSON lists them all).
LISTED = 20

_FINGERPRINT = re.compile(rb"[0-9a-fA-F]{40}")
_SETTING = re.compile(r"\bBLOOMFILTER_[A-Z_]+\b")

#: Sizing options: option name -> the BLOOMFILTER_* setting it stands for.
_SIZING_OPTIONS = {
    "capacity": "BLOOMFILTER_CAPACITY",
    "error_rate": "BLOOMFILTER_ERROR_RATE",
    "bit": "BLOOMFILTER_BIT",
    "hash_number": "BLOOMFILTER_HASH_NUMBER",
    "shard_bit": "BLOOMFILTER_SHARD_BIT",
    "shards": "BLOOMFILTER_SHARDS",
    "expansion": "BLOOMFILTER_EXPANSION",
    "ttl": "BLOOMFILTER_TTL",
}
#: Other settings named in messages from the configuration and the engine.
_OTHER_OPTIONS = {
    "BLOOMFILTER_REDIS_URL": "--redis-url",
    "BLOOMFILTER_REDIS_URLS": "--redis-url",
    "BLOOMFILTER_REDIS_CLUSTER": "--cluster",
    "BLOOMFILTER_RETRY_TIMEOUT": "--retry-timeout",
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


#: Either backend's filter, as owned by a command.
_B = TypeVar("_B", RedisBloomFilter, NativeBloomFilter, RedisBloomFilter | NativeBloomFilter)


@dataclass
class _Context:
    """What every command gets: the arguments, the clients, and what to close at the end.

    ``where`` names the servers in messages; ``address`` is the same without words,
    for JSON (``host:port``, comma-separated for a list).
    """

    args: argparse.Namespace
    clients: list[Any]
    where: str
    address: str
    faults: FaultPolicy
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    @property
    def key(self) -> str:
        """The filter's key (``--key``)."""
        return str(self.args.key)

    def own(self, bloom: _B) -> _B:
        """Close ``bloom``'s connections when the command ends."""
        self.stack.callback(bloom.close)
        return bloom


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


def _listing(key: str, orphans: Sequence[Orphan]) -> list[str]:
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
            f" shards {_ranges(o.shard or 0 for o in shards)}, on {', '.join(places)}"
        )
    rest = [o for o in orphans if o.kind != "shard"]
    lines += [f"  {o.key!r} on {o.address}: {o.what}" for o in rest[:LISTED]]
    if len(rest) > LISTED:
        lines.append(f"  ... and {len(rest) - LISTED:,} more")
    return lines


def _ranges(numbers: Iterable[int]) -> str:
    """Write numbers as ranges: ``0-5, 7, 9-12``."""
    spans: list[list[int]] = []
    for n in sorted(set(numbers)):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans)


def _orphan_data(orphans: Sequence[Orphan]) -> list[dict[str, str]]:
    """Describe keys for JSON."""
    return [{"key": o.key, "server": o.address, "what": o.what} for o in orphans]


def _utc(timestamp: float) -> datetime:
    """Return a Unix timestamp as an aware UTC datetime."""
    return datetime.fromtimestamp(timestamp, tz=timezone.utc)


def _decode(value: Any) -> str:
    """Decode a reply item, whether or not the client decodes responses."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _scrub(text: str, secrets: Sequence[str]) -> str:
    """Remove passwords from a message and fold it onto one line."""
    return " ".join(scrub(text, secrets).split())


def _option_names(message: str) -> str:
    """Name the command-line options in a message about BLOOMFILTER_* settings."""
    options = {setting: "--" + name.replace("_", "-") for name, setting in _SIZING_OPTIONS.items()}
    options.update(_OTHER_OPTIONS)

    def rename(match: re.Match[str]) -> str:
        return options.get(match.group(0), match.group(0))

    return _SETTING.sub(rename, message.replace(" setting ", " option "))


# -- connecting ------------------------------------------------------------------


def _urls(args: argparse.Namespace) -> list[str]:
    """Return the URLs given, else ``$REDIS_URL``, else the default."""
    given: list[str] = args.redis_url or []
    return given or [os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL]


def _describe(urls: Sequence[str], cluster: bool) -> tuple[str, str]:
    """Return (``where`` for messages, ``address`` for JSON): addresses, no password."""
    address = ", ".join(url_address(url) for url in urls)
    return (f"the Redis Cluster at {address}" if cluster else address), address


def _connection(args: argparse.Namespace) -> ConnectionConfig:
    """Validate the connection options as the crawl's BLOOMFILTER_REDIS_* settings."""
    urls = _urls(args)
    if args.cluster and len(urls) != 1:
        raise UsageError(
            "--cluster takes one --redis-url: the URL of one node of the cluster to start"
            " from (the client discovers the others)."
        )
    connect = min(args.timeout, float(DEFAULT_PARAMS["socket_connect_timeout"]))
    params: dict[str, Any] = {"socket_timeout": args.timeout, "socket_connect_timeout": connect}
    # TLS files, passed as a crawl passes them in BLOOMFILTER_REDIS_PARAMS.
    tls_options = (
        ("--tls-ca-cert", args.tls_ca_cert, "ssl_ca_certs"),
        ("--tls-cert", args.tls_cert, "ssl_certfile"),
        ("--tls-key", args.tls_key, "ssl_keyfile"),
    )
    for option, path, param in tls_options:
        if path is None:
            continue
        if not all(url.startswith("rediss://") for url in urls):
            raise UsageError(f"{option} needs a rediss:// URL (Redis over TLS) in --redis-url.")
        if not os.path.isfile(path):
            raise UsageError(f"{option}: no such file: {path}")
        params[param] = path
    if args.tls_key is not None and args.tls_cert is None:
        raise UsageError("--tls-key needs --tls-cert: the client certificate it belongs to.")
    settings: dict[str, Any] = {
        "BLOOMFILTER_REDIS_CLUSTER": args.cluster,
        "BLOOMFILTER_REDIS_PARAMS": params,
    }
    if len(urls) == 1:
        settings["BLOOMFILTER_REDIS_URL"] = urls[0]
    else:
        settings["BLOOMFILTER_REDIS_URLS"] = urls
    try:
        return ConnectionConfig.from_settings(settings)
    except ValueError as exc:
        raise UsageError(_option_names(str(exc))) from None


def _faults(args: argparse.Namespace) -> FaultPolicy:
    """Return the engine's fault policy: ``--retry-timeout``; errors raise, losses raise."""
    try:
        return FaultPolicy.from_settings({"BLOOMFILTER_RETRY_TIMEOUT": args.retry_timeout})
    except ValueError as exc:
        raise UsageError(_option_names(str(exc))) from None


def _connect(args: argparse.Namespace, where: str, address: str) -> _Context:
    """Build the clients the way a crawl does (:func:`..connection.filter_clients`)."""
    config = _connection(args)
    faults = _faults(args)
    try:
        clients = filter_clients(config, {})
    except ValueError as exc:  # e.g. a port that is not a number
        raise UsageError(f"invalid --redis-url: {exc}") from None
    except RedisClusterException as exc:  # the cluster client reads the slot map at once
        raise CLIError(f"cannot connect to {where}: {exc}") from None
    logger.debug("Connecting to %s (timeout %s s)", where, args.timeout)
    ctx = _Context(args=args, clients=clients, where=where, address=address, faults=faults)
    for client in clients:
        ctx.stack.callback(client.close)
    return ctx


# -- the filter in Redis -----------------------------------------------------------


def _stored(ctx: _Context) -> tuple[RedisBloomFilter, StoredRecord | None]:
    """Read the filter's record; return a filter of the stored geometry (never opened)."""
    bloom = ctx.own(inventory.probe(ctx.clients, ctx.key, ctx.faults))
    nodes = inventory.cluster_nodes(bloom)  # they would answer MOVED until --retry-timeout
    if nodes:
        raise UsageError(
            f"Redis at {', '.join(nodes)} is a node of a Redis Cluster: pass --cluster, with"
            " the URL of one node as --redis-url."
        )
    stored = inventory.read_record(bloom)
    if stored is not None and stored.record is not None:
        bloom.close()
        bloom = ctx.own(inventory.of_record(ctx.clients, ctx.key, stored.record, ctx.faults))
    return bloom, stored


def _usable(stored: StoredRecord | None) -> FilterRecord | None:
    """Return the stored record; refuse one this version cannot use (reset deletes it)."""
    if stored is None:
        return None
    if stored.record is None:
        raise CLIError(stored.problem)
    return stored.record


def _missing(ctx: _Context, bloom: RedisBloomFilter, hint: str = "") -> CLIError:
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
            f" delete them with '{PROG} reset --key {key}'."
        )
    elif hint:
        message += " " + hint
    return CLIError(message)


def _check_servers(ctx: _Context, bloom: RedisBloomFilter, record: FilterRecord) -> None:
    """Refuse a server list of another length than the filter's: shards would be misplaced."""
    given = bloom.topology.servers
    if record.servers == given:
        return
    raise CLIError(
        f"The Bloom filter {ctx.key!r} (id {record.filter_id}) was created on"
        f" {record.servers} server(s); {given} given. Give each of its servers with"
        " --redis-url, in the order of the crawl's BLOOMFILTER_REDIS_URLS: shard i lives on"
        f" server i mod {record.servers}."
    )


def _refuse_live_workers(ctx: _Context, bloom: RedisBloomFilter) -> None:
    """Refuse to reset while workers hold live leases, unless ``--force``."""
    workers = bloom.live_workers()
    if workers and not ctx.args.force:
        raise CLIError(
            f"{len(workers)} worker(s) still crawl with the Bloom filter {ctx.key!r} on"
            f" {ctx.where} ({', '.join(workers)}): stop them first, or pass --force"
            " (they would go on adding to a filter that forgot what they saw)."
        )


def _shard_address(bloom: RedisBloomFilter, shard: int) -> str:
    """Return where a shard lives."""
    return bloom.topology.route(bloom.parts.shard_key(shard), shard, None).address


def _confirm(question: str) -> bool:
    """Ask a yes/no question on the terminal; only an explicit yes counts."""
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")


def _confirm_or_abort(ctx: _Context, what: str, listing: Sequence[str] = ()) -> None:
    """Ask before deleting, unless ``--yes``; raise if the answer is not yes."""
    if ctx.args.yes:
        return
    for line in listing:
        _err(line)
    question = f"Delete {what}? Every request it has seen will be forgotten."
    if not _confirm(question):
        raise CLIError("Not confirmed: nothing was deleted.")


def _stdin_is_tty() -> bool:
    """Tell whether stdin is an interactive terminal."""
    stdin = sys.stdin
    return stdin is not None and not stdin.closed and stdin.isatty()


# -- sizing and opening ------------------------------------------------------------


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


def _native_if(ctx: _Context, record: FilterRecord | None) -> NativeBloomFilter | None:
    """Return the native filter a record of the native backend describes (not opened)."""
    if record is None or record.backend != "native":
        return None
    return ctx.own(NativeBloomFilter.of_record(ctx.clients, ctx.key, record, ctx.faults))


def _open_for_writing(
    ctx: _Context,
) -> tuple[RedisBloomFilter | NativeBloomFilter, bool]:
    """Open the filter for ``add`` / ``migrate-set``: create it if sizing options allow.

    Returns the filter and whether this call created it.
    """
    config = _sizing(ctx.args)
    bloom, stored = _stored(ctx)
    record = _usable(stored)
    if record is None and config is None:
        raise _missing(
            ctx,
            bloom,
            "Start the crawl once to create it, or pass --capacity/--error-rate or"
            " --bit/--hash-number (the crawl's BLOOMFILTER_* settings) to create it here.",
        )
    if record is not None:
        _check_servers(ctx, bloom, record)
    opened: RedisBloomFilter | NativeBloomFilter = _native_if(ctx, record) or bloom
    if config is not None:
        opened = ctx.own(make_filter(ctx.clients, ctx.key, config, faults=ctx.faults))
    try:
        # Creates the filter only when sizing options were given, else checks it.
        opened.open(create=config is not None)
    except ServerListMismatchError:
        raise
    except ConfigMismatchError as exc:
        if config is None:
            raise
        raise CLIError(
            "The sizing options do not match the existing filter (leave them out to use"
            f" the filter as it is): {exc}"
        ) from None
    return opened, record is None


def _open_existing(ctx: _Context) -> RedisBloomFilter | NativeBloomFilter:
    """Open a filter that must exist, with the geometry its record describes."""
    bloom, stored = _stored(ctx)
    record = _usable(stored)
    if record is None:
        raise _missing(ctx, bloom, "A crawl creates it on its first request.")
    _check_servers(ctx, bloom, record)
    opened = _native_if(ctx, record) or bloom
    opened.open(create=False)  # checks every part: a lost shard is an error, not "absent"
    return opened


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


def _servers_text(ctx: _Context, places: Sequence[str]) -> str:
    """Say where the filter lives, for the info table."""
    if ctx.args.cluster:
        return f"Redis Cluster, {len(places)} master(s): {', '.join(places)}"
    if len(places) == 1:
        return places[0]
    return f"{len(places)}: " + ", ".join(f"{i}={place}" for i, place in enumerate(places))


def cmd_info(ctx: _Context) -> int:
    """Show the filter's record, the state of its parts and of its bits; repair nothing."""
    key = ctx.key
    bloom, stored = _stored(ctx)
    record = _usable(stored)
    if record is None:
        raise _missing(ctx, bloom)
    _check_servers(ctx, bloom, record)
    if (native := _native_if(ctx, record)) is not None:
        return _info_native(ctx, native, record)
    spec = record.spec
    shards = inventory.check_shards(bloom, record)
    markers = inventory.check_markers(bloom, record)
    state = inventory.state(bloom)
    totals = bloom.totals()
    workers = bloom.live_workers()
    places = inventory.addresses(bloom)
    created = _utc(record.created)
    at_capacity = false_positive_rate(spec.bits, spec.hash_count, record.capacity)
    growth = record.growth
    written = sum(1 for ones in state.bits_set_per_shard if ones)
    damaged = [(shard, "missing") for shard in shards.missing] + list(shards.foreign)
    damaged.sort()
    bad_markers = [m for m in markers if m.status != "ok"]
    data: dict[str, Any] = {
        "key": key,
        "server": ctx.address,
        "servers": places,
        "cluster": bool(ctx.args.cluster),
        "id": record.filter_id,
        "state": record.state,
        "created": created.isoformat(),
        "created_timestamp": record.created,
        "layout": record.layout,
        "scheme": record.scheme,
        "sizing": record.sizing,
        "record_servers": record.servers,
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
        "shards_missing": len(shards.missing),
        "shards_foreign": len(shards.foreign),
        "damaged_shards": [
            {
                "shard": shard,
                "key": bloom.parts.shard_key(shard),
                "server": _shard_address(bloom, shard),
                "found": what,
            }
            for shard, what in damaged
        ],
        "server_markers": [
            {"server": m.address, "marker": m.found, "status": m.status} for m in markers
        ],
        "bits_set_per_shard": list(state.bits_set_per_shard),
        "expansion": record.expansion,
        "tightening": record.tightening,
        "ttl": record.ttl,
        "max_generations": growth.last + 1,
        "grown_capacity": growth.grown_capacity,
        "rate_bound": growth.rate_bound,
        "generations": [
            {
                "generation": gen.generation,
                "shards": gen.shards,
                "bits": gen.bits,
                "hash_count": gen.hash_count,
                "capacity": gen.capacity,
                "bits_set": gen.bits_set,
                "fill_ratio": gen.fill_ratio,
                "estimated_items": gen.estimated_items,
                "estimated_fpr": gen.estimated_fpr,
            }
            for gen in state.generations
        ],
    }
    state_text: str = record.state
    if record.state == "creating":
        state_text += " (being created, or its creator stopped: a worker opening it finishes it)"
    rows = [
        ("Bloom filter", key),
        ("Filter id", record.filter_id),
        ("State", state_text),
        ("Servers" if len(places) > 1 else "Server", _servers_text(ctx, places)),
        ("Created", created.strftime("%Y-%m-%d %H:%M:%S UTC")),
        ("Layout / hash scheme", f"{record.layout} / {record.scheme}"),
        ("Sizing", record.sizing),
        ("Bits (m)", f"{spec.bits:,} ({format_bytes(spec.total_bytes)})"),
        ("Shards", f"{spec.shards:,} of {spec.shard_bits:,} bits, {written:,} with bits set"),
        ("Missing or foreign shards", _damaged_text(bloom, damaged)),
    ]
    if markers:
        rows.append(
            (
                "Server markers",
                f"{len(markers) - len(bad_markers)} of {len(markers)} in place"
                + "".join(f"; {m.address}: {m.status} ({m.found!r})" for m in bad_markers),
            )
        )
    rows += [
        ("Hash functions (k)", str(spec.hash_count)),
        ("Capacity", f"{record.capacity:,} items"),
        ("Expected FP rate at capacity", f"{at_capacity:.3g}"),
        ("Growth / re-crawl", _growth_text(record)),
    ]
    rows += [
        (
            f"Generation {gen.generation}",
            f"{gen.shards:,} shard(s), k={gen.hash_count}, {100 * gen.fill_ratio:.2f} % of"
            f" {format_bytes((gen.bits + 7) // 8)} set, ~{gen.estimated_items:,} of"
            f" {gen.capacity:,} items, FP rate {gen.estimated_fpr:.3g}",
        )
        for gen in state.generations
        if record.expansion or record.ttl
    ]
    rows += [
        ("Bits set", f"{state.bits_set:,}"),
        ("Fill ratio", f"{100 * state.fill_ratio:.4f} %"),
        ("Estimated items", f"{state.estimated_items:,}"),
        (
            "Estimated FP rate now",
            f"{state.estimated_fpr:.3g}"
            + (" (all generations together)" if len(state.generations) > 1 else ""),
        ),
    ]
    _emit(ctx, data, _table(rows + _activity_rows(state, totals, workers)))
    return EXIT_OK


def _activity_rows(
    state: FilterState, totals: FilterTotals, workers: list[str]
) -> list[tuple[str, str]]:
    """Return the info rows on memory, the workers' counts and the live workers."""
    return [
        ("Memory in Redis", f"{format_bytes(state.memory_bytes)} ({state.memory_bytes:,} bytes)"),
        ("Added by all workers", f"{totals.added:,}"),
        ("Filtered by all workers", f"{totals.seen:,}"),
        ("Live workers", f"{len(workers)}" + (f" ({', '.join(workers)})" if workers else "")),
    ]


def _info_native(ctx: _Context, bloom: NativeBloomFilter, record: FilterRecord) -> int:
    """Show a native filter (BF.* shards): its record, its shards' items, memory and rate."""
    present = bloom.existing()
    state = bloom.state(present)
    totals = bloom.totals()
    workers = bloom.live_workers()
    places = [node.address for node in bloom.topology.primaries()]
    missing = [s for s in range(record.spec.shards) if s not in present]
    data: dict[str, Any] = {
        "key": ctx.key,
        "backend": "native",
        "servers": places,
        "id": record.filter_id,
        "state": record.state,
        "created": _utc(record.created).isoformat(),
        "layout": record.layout,
        "sizing": record.sizing,
        "shards": record.spec.shards,
        "shards_missing": len(missing),
        "missing_shard_keys": [bloom.shard_keys[s] for s in missing],
        "capacity": record.capacity,
        "expansion": record.expansion,
        "generations": len(state.generations),
        "estimated_items": state.estimated_items,
        "estimated_fpr": state.estimated_fpr,
        "memory_bytes": state.memory_bytes,
        "total_added": totals.added,
        "total_filtered": totals.seen,
        "live_workers": workers,
    }
    rows = [
        ("Bloom filter", ctx.key),
        ("Backend", "native (server-side Bloom filters, BF.*)"),
        ("Filter id", record.filter_id),
        ("State", record.state),
        ("Servers" if len(places) > 1 else "Server", _servers_text(ctx, places)),
        ("Created", _utc(record.created).strftime("%Y-%m-%d %H:%M:%S UTC")),
        ("Sizing", record.sizing),
        ("Shards", f"{record.spec.shards:,}, {len(missing):,} missing"),
        ("Capacity", f"{record.capacity:,} items"),
        ("Growth", record.growth_text()),
        ("Sub-filters (most in a shard)", f"{len(state.generations)}"),
        ("Estimated items", f"{state.estimated_items:,}"),
        ("Estimated FP rate now", f"{state.estimated_fpr:.3g}"),
    ]
    _emit(ctx, data, _table(rows + _activity_rows(state, totals, workers)))
    return EXIT_OK


def _growth_text(record: FilterRecord) -> str:
    """Say how the filter grows and forgets, with what growth buys."""
    growth = record.growth
    text = record.growth_text()
    if record.expansion:
        text += (
            f"; up to {growth.last + 1} generations per shard, {growth.grown_capacity:,} items"
            f" in all at an FP rate under {growth.rate_bound:.3g}"
        )
    return text


def _damaged_text(bloom: RedisBloomFilter, damaged: Sequence[tuple[int, str]]) -> str:
    """Say which shards are missing or not this filter's: the first few, then a count."""
    if not damaged:
        return "0"
    named = [
        f"{bloom.parts.shard_key(shard)!r} on {_shard_address(bloom, shard)}: {what}"
        for shard, what in damaged[:5]
    ]
    more = f"; and {len(damaged) - 5:,} more" if len(damaged) > 5 else ""
    return f"{len(damaged):,} ({'; '.join(named)}{more})"


def cmd_reset(ctx: _Context) -> int:
    """Delete the filter on every server, or the parts it left without a usable record."""
    bloom, stored = _stored(ctx)
    if stored is not None and stored.record is not None:
        return _reset_filter(ctx, bloom, stored.record)
    return _reset_orphans(ctx, bloom, stored)


def _reset_filter(ctx: _Context, bloom: RedisBloomFilter, record: FilterRecord) -> int:
    """Delete a filter that has a record: every part its geometry and server count name."""
    key = ctx.key
    _check_servers(ctx, bloom, record)
    _refuse_live_workers(ctx, bloom)
    markers = inventory.check_markers(bloom, record)
    _refuse_foreign_markers(ctx, record, markers)
    native = _native_if(ctx, record)
    if native is not None:
        present = len(native.existing())
    else:
        present = len(bloom.parts.existing(range(record.spec.shards)))
    counters = inventory.count_existing(bloom, [bloom.parts.counter_key]) > 0
    marked = sum(1 for marker in markers if marker.found is not None)
    created = _utc(record.created).strftime("%Y-%m-%d %H:%M:%S UTC")
    parts = ["its config record", f"{present:,} shard key(s)"]
    if counters:
        parts.append("its counters")
    if marked:
        parts.append(f"its server markers on {marked} server(s)")
    what = (
        f"the Bloom filter {key!r} on {ctx.where} (id {record.filter_id}, created {created},"
        f" {record.describe()}): {', '.join(parts[:-1])} and {parts[-1]}"
    )
    _confirm_or_abort(ctx, what)
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
    _emit(ctx, data, [f"Deleted {what}."])
    return EXIT_OK


def _refuse_foreign_markers(
    ctx: _Context, record: FilterRecord, markers: Sequence[MarkerCheck]
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
                f" {marker.server}/{record.servers}. Give the servers with --redis-url in the"
                " order of the crawl's BLOOMFILTER_REDIS_URLS"
            )
        else:
            problem = (
                f"it holds part of another Bloom filter named {ctx.key!r} (id {found[0]}): the"
                " servers given mix two filters'. Give this filter's own servers; reset"
                " another filter's leftovers on their server alone"
            )
        raise CLIError(
            f"Cannot reset the Bloom filter {ctx.key!r} (id {record.filter_id}) on"
            f" {ctx.where}: Redis at {marker.address} is not its server {marker.server}:"
            f" {problem}. Nothing was deleted."
        )


def _reset_orphans(ctx: _Context, bloom: RedisBloomFilter, stored: StoredRecord | None) -> int:
    """Delete what a filter without a usable record left, if it carries the filter's id."""
    key = ctx.key
    _refuse_live_workers(ctx, bloom)
    found = inventory.find_orphans(bloom)
    if found.blocking:
        record = found.blocking[0]
        raise CLIError(
            f"Cannot delete parts of the Bloom filter {key!r} on {ctx.where} as orphans:"
            f" {record.key!r} on {record.address} is {record.what}. Give the servers with"
            " --redis-url in the filter's order, then reset again. Nothing was deleted."
        )
    kept = list(found.kept)
    data: dict[str, Any] = {
        "key": key,
        "server": ctx.address,
        "servers": inventory.addresses(bloom),
        "record": False,
        "not_deleted": _orphan_data(kept),
    }
    kept_lines = ["Not deleted (carries no filter id):", *_listing(key, kept)] if kept else []
    if not found.deletable:
        data.update(deleted=False, shard_keys=0, deleted_keys=[])
        lines = [f"No Bloom filter {key!r} on {ctx.where}: nothing to delete.", *kept_lines]
        _emit(ctx, data, lines)
        return EXIT_OK
    orphans = list(found.deletable)
    shards = sum(1 for o in orphans if o.kind == "shard")
    others = len(orphans) - shards
    why = "its config record cannot be used" if stored is not None else "it has no config record"
    what = (
        f"{shards:,} orphaned shard key(s)"
        + (f" and {others:,} other part(s)" if others else "")
        + f" of the Bloom filter {key!r} on {ctx.where} ({why})"
    )
    _confirm_or_abort(ctx, what, [f"To delete, {what}:", *_listing(key, orphans), *kept_lines])
    deleted = inventory.delete_orphans(bloom, orphans)
    changed = [o for o in orphans if o not in deleted]
    data.update(
        deleted=True, shard_keys=sum(1 for o in deleted if o.kind == "shard"),
        deleted_keys=_orphan_data(deleted), changed=_orphan_data(changed),
    )  # fmt: skip
    lines = [f"Deleted {what}:", *_listing(key, deleted)]
    if changed:
        lines += ["Not deleted (changed since listed):", *_listing(key, changed)]
    _emit(ctx, data, lines + kept_lines)
    return EXIT_OK


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
        "server": ctx.address,
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
    """Copy a scrapy-redis fingerprint SET into the filter.

    The SET is read through the redis-py client of the first ``--redis-url`` (or the
    cluster client): it lives where scrapy-redis keeps it, not in the filter's shards.
    """
    set_key = str(ctx.args.set_key)
    client = ctx.clients[0]
    source = url_address(_urls(ctx.args)[0])
    kind = _decode(client.type(set_key))
    if kind == "none":
        raise CLIError(f"Redis key {set_key!r} does not exist on {source}: nothing to migrate.")
    if kind != "set":
        raise CLIError(
            f"Redis key {set_key!r} on {source} holds a {kind}, not a set of request"
            " fingerprints like scrapy-redis's dupefilter keeps."
        )
    size = int(client.scard(set_key))
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

    for member in client.sscan_iter(set_key, count=SCAN_COUNT):
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
        "server": ctx.address,
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
    if "{" in value or "}" in value:
        raise argparse.ArgumentTypeError(
            f"{value!r} contains {{ or }}, which no filter's key does (its shards' Redis"
            " Cluster hash tags derive from it)"
        )
    return value


def _seconds(value: str, zero_ok: bool = False) -> float:
    """Parse a finite number of seconds: positive, or also 0 if ``zero_ok``."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not (math.isfinite(number) and (number > 0 or (zero_ok and number == 0))):
        which = "non-negative" if zero_ok else "positive"
        raise argparse.ArgumentTypeError(f"must be a {which} number, got {value!r}")
    return number


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of all commands."""
    common = _ArgumentParser(add_help=False)
    where = common.add_argument_group("where the filter lives (as the crawl's settings)")
    where.add_argument(
        "--redis-url",
        action="append",
        metavar="URL",
        help="Redis URL; give it several times for a server list, in the crawl's order"
        " (BLOOMFILTER_REDIS_URLS: shard i on server i mod n). Default: $REDIS_URL, else"
        f" {DEFAULT_REDIS_URL}",
    )
    where.add_argument(
        "--cluster",
        action="store_true",
        help="the --redis-url is a node of a Redis Cluster (BLOOMFILTER_REDIS_CLUSTER)",
    )
    where.add_argument(
        "--tls-ca-cert",
        metavar="FILE",
        help="CA certificate(s) (PEM) to verify a rediss:// server with (ssl_ca_certs)",
    )
    where.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="client certificate (PEM) for servers that require one (ssl_certfile)",
    )
    where.add_argument(
        "--tls-key", metavar="FILE", help="the client certificate's private key (ssl_keyfile)"
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
        type=_seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="socket timeout of each Redis command (default: %(default)s)",
    )
    common.add_argument(
        "--retry-timeout",
        type=lambda value: _seconds(value, zero_ok=True),
        default=DEFAULT_RETRY_TIMEOUT,
        metavar="SECONDS",
        help="how long a failing Redis command is retried, 0 for once"
        " (BLOOMFILTER_RETRY_TIMEOUT; default: %(default)s)",
    )
    common.add_argument(
        "-v", "--verbose", action="store_true", help="log what the engine does on stderr"
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
    group.add_argument(
        "--expansion", type=int, metavar="E", help="BLOOMFILTER_EXPANSION (default 2; 0: fixed)"
    )
    group.add_argument(
        "--ttl", type=int, metavar="SECONDS", help="BLOOMFILTER_TTL (default 0: forever)"
    )

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
    secrets = url_secrets(os.environ.get("REDIS_URL", ""))
    where = "Redis"
    # Library warnings go to stderr, unless the host program configured logging.
    package_logger = logging.getLogger(__package__)
    handler: logging.Handler = logging.NullHandler()
    if not package_logger.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"{PROG}: %(levelname)s: %(message)s"))
    package_logger.addHandler(handler)
    level = package_logger.level
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:  # --help, --version
            return exc.code if isinstance(exc.code, int) else EXIT_OK
        if args.verbose:
            package_logger.setLevel(logging.DEBUG)
        urls = _urls(args)
        for url in urls:
            secrets = url_secrets(url) + secrets
        where, address = _describe(urls, args.cluster)
        if args.command == "reset" and not args.yes and not _stdin_is_tty():
            raise UsageError(
                "reset deletes the filter and cannot ask for confirmation (stdin is not a"
                " terminal): pass --yes to confirm."
            )
        ctx = _connect(args, where, address)
        with ctx.stack:
            run: Callable[[_Context], int] = args.handler
            return run(ctx)
    except CLIError as exc:
        return _fail(exc.message, exc.code, secrets)
    except FilterUnavailableError as exc:  # the engine retried for --retry-timeout
        return _fail(_option_names(str(exc)), EXIT_FAILURE, secrets)
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
    except (RedisError, RedisClusterException) as exc:
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
        package_logger.setLevel(level)


def _fail(message: str, code: int, secrets: Sequence[str]) -> int:
    """Print an error as one line on stderr and return its exit status."""
    _err(f"{PROG}: error: {_scrub(message, secrets)}")
    return code
