"""A filter as it is in Redis, read without opening it (which repairs): what the CLI needs.

Compares the parts with the record, and finds by ``SCAN`` the parts that provably are a
filter's when it has no usable record.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from scrapy_redis_bloom.core import layout
from scrapy_redis_bloom.core.errors import (
    AccessDeniedError,
    BloomFilterError,
    CredentialsRefusedError,
    taking_apart,
)
from scrapy_redis_bloom.core.hashing import FilterSpec
from scrapy_redis_bloom.core.layout import NATIVE_TYPE
from scrapy_redis_bloom.core.record import RECORD_MARKS, FilterRecord
from scrapy_redis_bloom.core.settings import FaultPolicy
from scrapy_redis_bloom.engine import access
from scrapy_redis_bloom.engine.bitmap.filter import RedisBloomFilter
from scrapy_redis_bloom.engine.parts import BATCH, Parts, blob, pairs, text
from scrapy_redis_bloom.ops.scanning import Scan
from scrapy_redis_bloom.transport.executor import Call
from scrapy_redis_bloom.transport.topology import Cluster
from scrapy_redis_bloom.transport.wire import pack_command

logger = logging.getLogger(__name__)

#: Geometry of a filter built before its record is read: ask it nothing that touches bits.
UNKNOWN_SPEC = FilterSpec(shards=1, shard_bits=1, hash_count=1)
SCAN_COUNT = 1000  #: COUNT hint of each SCAN call (and of migrate's SSCAN).
COUNTER_FIELDS = frozenset({"added", "seen"})


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """The record of the hash at ``KEY:meta`` as stored (None: unusable, see ``problem``)."""

    record: FilterRecord | None
    problem: str = ""


def read_record(bloom: RedisBloomFilter) -> StoredRecord | None:
    """Read ``KEY:meta`` without creating or restoring anything; None when it is absent."""
    fields = read_hash(bloom.parts, bloom.parts.meta_key, "read the filter's record")
    return stored_record(bloom, fields) if fields else None


def stored_record(bloom: RedisBloomFilter, fields: dict[str, str]) -> StoredRecord:
    """Make a record of the hash read back, if it can be trusted (not more shards than keys)."""
    meta = bloom.parts.meta_key
    try:
        record = FilterRecord.parse(meta, fields)
    except BloomFilterError as exc:
        return StoredRecord(None, str(exc))
    servers = len(addresses(bloom))
    if record.servers not in (1, servers):
        return StoredRecord(record)  # the wrong servers: refused by name later
    calls = [Call(pack_command(b"DBSIZE"), server=i) for i in range(servers)]
    try:
        keys = sum(bloom.parts.run("count the keys", calls, take=int))  # all servers'
    except CredentialsRefusedError:
        raise
    except AccessDeniedError as exc:  # a command of the CLI's only: the probe has no word of it
        user = " / ".join(access.users(bloom.topology)) or "default"
        raise AccessDeniedError(
            f"{exc.server or bloom.topology.describe()} refuses DBSIZE, which the commands send"
            " to check a filter's record against the keys its servers hold: its Redis user"
            f" {user!r} lacks this ACL permission. Grant it: ACL SETUSER {user} +dbsize. See"
            " docs/howto/tls-acl.md#least-privilege.",
            server=exc.server,
            commands=("dbsize",),
        ) from None
    if record.spec.shards > keys:
        return StoredRecord(
            None,
            f"The config record {meta!r} cannot be used: it claims {record.spec.shards:,}"
            f" shards, but its server(s) hold {keys:,} key(s) in all, so it is corrupt or the"
            f" filter has lost its shards. Reset it (scrapy bloom reset --key"
            f" {bloom.key!r}): the filter's parts are then found by SCAN.",
        )
    return StoredRecord(record)


def probe(client: Any, key: str, faults: FaultPolicy | None = None) -> RedisBloomFilter:
    """Return a filter to look at ``key`` before its geometry is known (:data:`UNKNOWN_SPEC`)."""
    return RedisBloomFilter(client, key, UNKNOWN_SPEC, 1, faults=faults)


def addresses(bloom: RedisBloomFilter) -> list[str]:
    """Return the address of every server (or cluster master) the filter's topology holds."""
    return [node.address for node in bloom.topology.primaries()]


def cluster_nodes(bloom: RedisBloomFilter) -> list[str]:
    """Return the addresses of the listed standalone servers that are Redis Cluster nodes."""
    if isinstance(bloom.topology, Cluster):
        return []
    found = []
    for server, node in enumerate(bloom.topology.primaries()):
        # The command's first call to each server: a server that does not answer is said
        # here, within the retry timeout (skipped, the next call waited it out again).
        call = Call(pack_command(b"INFO", b"cluster"), server=server)
        (reply,) = bloom.executor.run("read INFO", [call]).replies
        if not isinstance(reply, BaseException) and "cluster_enabled:1" in text(reply):
            found.append(node.address)
    return found


@dataclass(frozen=True, slots=True)
class MarkerCheck:
    """One server's marker (``KEY:server``) compared with the one the record expects."""

    server: int
    address: str
    found: str | None
    expected: str

    @property
    def status(self) -> Literal["ok", "missing", "foreign"]:
        """``ok``; ``missing`` (evicted or deleted); ``foreign`` (another place or filter)."""
        if self.found is None:
            return "missing"
        return "ok" if self.found == self.expected else "foreign"


def check_markers(bloom: RedisBloomFilter, record: FilterRecord) -> list[MarkerCheck]:
    """Read every server's marker; empty for a filter on one server (which has none)."""
    places = addresses(bloom)
    return [
        MarkerCheck(i, places[i], value, layout.server_marker(record.filter_id, i, record.servers))
        for i, value in enumerate(bloom.parts.markers(record.servers))
    ]


def read_hash(parts: Parts, key: str, operation: str) -> dict[str, str]:
    """Read one of the filter's hashes (HGETALL): its fields, empty when it does not exist."""
    (fields,) = parts.run(operation, [Call(pack_command(b"HGETALL", key), key=key)], take=pairs)
    return dict(fields)


def existing_keys(parts: Parts, keys: Sequence[tuple[str, int | None, int | None]]) -> list[str]:
    """Return which keys exist (EXISTS), each given as ``(key, shard, server)`` to route it."""
    calls = [Call(pack_command(b"EXISTS", k), key=k, shard=s, server=i) for k, s, i in keys]
    replies = parts.run("look for the filter's keys", calls, take=int)
    return [key for (key, _, _), reply in zip(keys, replies, strict=True) if reply]


def glob_escape(literal: str) -> str:
    """Escape a literal for a SCAN MATCH pattern."""
    return re.sub(r"([\\*?\[\]])", r"\\\1", literal)


def scan(bloom: RedisBloomFilter, pattern: str) -> list[tuple[int, str]]:
    """Return ``(index of its primary, key)`` of each key matching ``pattern``, once each."""
    found: dict[tuple[int, str], None] = {}
    for server in range(len(bloom.topology.primaries())):
        keys = Scan(bloom.parts, (b"SCAN",), "its keys", (b"MATCH", pattern), server=server)
        cursor: int | None = 0
        while cursor is not None:
            cursor, names = keys.next(cursor, SCAN_COUNT)
            found.update(dict.fromkeys((server, text(name)) for name in names))
    return list(found)


OrphanKind = Literal["shard", "native", "marker", "counters", "record"]
_HASHES = ("counters", "record")


@dataclass(frozen=True, slots=True)
class Orphan:
    """A key named like a part; ``kind``: what it was proven to be (None: left alone)."""

    key: str
    server: int
    address: str
    what: str
    kind: OrphanKind | None = None
    proof: bytes = b""
    filter_id: str = ""
    shard: int | None = None


@dataclass(frozen=True, slots=True)
class Orphans:
    """What :func:`find_orphans` found; ``blocking``: records that make deleting unsafe."""

    deletable: tuple[Orphan, ...] = ()
    kept: tuple[Orphan, ...] = ()
    blocking: tuple[Orphan, ...] = ()


def find_orphans(bloom: RedisBloomFilter) -> Orphans:
    """Find, on every server or master, the parts of the filter ``bloom.key`` by SCAN.

    Only what carries a filter id, or cannot be anything else, is deletable: a shard string
    whose header is its identity, a RedisBloom filter named with an id, a server marker, a
    counter hash of ``added``/``seen``, a record hash on the record's server. Others so named
    are kept; ``KEY:workers`` and keys merely alike are not listed.
    """
    key = bloom.key
    parts = r"(?:(?:w[0-9]+:)?g[0-9]+|bf:[0-9a-f]{32}(?::w[0-9]+)?)"  # bitmap | native
    shard_name = re.compile(r"\{" + re.escape(key) + r":([0-9]+)\}:" + parts)
    names = {
        bloom.parts.marker_key: "marker",
        bloom.parts.counter_key: "counters",
        bloom.parts.meta_key: "record",
    }
    places = addresses(bloom)
    shards = {
        (server, name): int(match.group(1))
        for server, name in scan(bloom, "{" + glob_escape(key) + ":*}:*")
        if (match := shard_name.fullmatch(name))
    }
    candidates: list[tuple[int, str, str]] = [  # (server, key, the part it would be)
        (server, name, "native" if "}:bf:" in name else "shard")
        for (server, name), _ in sorted(shards.items(), key=lambda item: (item[1], item[0]))
    ]
    candidates += sorted(
        (server, name, names[name])
        for server, name in scan(bloom, glob_escape(key) + ":*")
        if name in names
    )
    calls = [  # per candidate, its type and what proves it is the part (error replies kept)
        Call(command, key=name, server=server)
        for server, name, part in candidates
        for command in (pack_command(b"TYPE", name), _read_command(name, part))
    ]
    replies: list[Any] = []
    for start in range(0, len(calls), BATCH):
        batch = calls[start : start + BATCH]
        replies += bloom.executor.run("read the filter's keys", batch).replies
    kinds, contents = replies[::2], replies[1::2]
    home = bloom.topology.route(bloom.parts.meta_key, None, None).address
    deletable: list[Orphan] = []
    kept: list[Orphan] = []
    blocking: list[Orphan] = []
    for (server, name, part), kind, content in zip(candidates, kinds, contents, strict=True):
        shard = shards.get((server, name))
        found = Orphan(name, server, places[server], f"a {text(kind)}", shard=shard)
        typed = "hash" if part in _HASHES else NATIVE_TYPE if part == "native" else "string"
        if text(kind) != typed or isinstance(content, BaseException):
            kept.append(found)  # e.g. WRONGTYPE: another type than the part's
            continue
        with taking_apart("read the filter's keys", name):
            if part != "record":
                orphan, usable = _proven(found, part, content), False
            else:
                orphan, usable = _as_record(bloom, found, pairs(content))
        if part == "record":
            why = ""
            if orphan.kind is not None and places[server] != home:
                why = (
                    f", on another server than the record's ({home}): the servers are given in"
                    " another order than the filter's BLOOMFILTER_REDIS_URLS"
                )
            elif usable:
                why = ": the filter exists (created since its record was looked for)"
            if why:
                blocking.append(replace(orphan, what=orphan.what + why))
                continue
        (deletable if orphan.kind is not None else kept).append(orphan)
    logger.debug(
        "Parts of the Bloom filter %r found by SCAN: %d deletable, %d kept, %d blocking.",
        key,
        len(deletable),
        len(kept),
        len(blocking),
    )
    return Orphans(tuple(deletable), tuple(kept), tuple(blocking))


def _read_command(name: str, part: str) -> bytes:
    """Return the command that reads what proves a candidate is the filter's part."""
    if part in _HASHES:
        return pack_command(b"HGETALL", name)
    if part == "native":  # its name carries the filter id; its type proves it a Bloom filter
        return pack_command(b"TYPE", name)
    if part == "marker":
        return pack_command(b"GETRANGE", name, 0, 255)  # a marker is about 40 bytes
    return pack_command(b"GETRANGE", name, 0, layout.IDENTITY_BYTES - 1)


def _proven(found: Orphan, part: str, content: Any) -> Orphan:
    """Return a shard, marker or counters candidate as the part its content proves, if it does."""
    if part == "shard":
        shard, head = found.shard or 0, blob(content)
        ident = layout.Identity.parse(head)
        if ident is None or ident.shard != shard:
            return replace(found, what=f"a string that is not shard {shard}'s bits (no filter id)")
        what = f"shard {shard} of filter id {ident.filter_id}"
        return replace(found, what=what, kind="shard", proof=head, filter_id=ident.filter_id)
    if part == "native":
        shard, filter_id = found.shard or 0, found.key.partition("}:bf:")[2][:32]
        what = f"native shard {shard} of filter id {filter_id}"
        return replace(
            found, what=what, kind="native", proof=NATIVE_TYPE.encode(), filter_id=filter_id
        )
    if part == "marker":
        value = blob(content)
        marker = layout.parse_marker(text(value))
        if marker is None:
            return replace(found, what="a string that is not a server marker (no filter id)")
        what = f"server marker {text(value)!r}"
        return replace(found, what=what, kind="marker", proof=value, filter_id=marker[0])
    fields = pairs(content)
    if not fields or not set(fields) <= COUNTER_FIELDS:
        return replace(found, what="a hash with other fields than the counters'")
    counts = ", ".join(f"{name}={fields[name]}" for name in sorted(fields))
    return replace(found, what=f"counters ({counts})", kind="counters")


def _as_record(
    bloom: RedisBloomFilter, found: Orphan, fields: dict[str, str]
) -> tuple[Orphan, bool]:
    """Tell whether a hash at ``KEY:meta`` is a config record, and whether it is usable."""
    if not all(name in fields for name in RECORD_MARKS):
        return replace(found, what="a hash that is not a config record"), False
    filter_id = fields.get("id", "")
    stored = stored_record(bloom, fields)
    what = f"the config record of filter id {filter_id}"
    if stored.record is None:
        what = f"a config record that cannot be used ({stored.problem.split(': ', 1)[-1]})"
    return replace(found, what=what, kind="record", filter_id=filter_id), stored.record is not None


def delete_orphans(bloom: RedisBloomFilter, orphans: Sequence[Orphan]) -> list[Orphan]:
    """Delete proven parts (the record last), each only if still what was proven; return them."""
    order = sorted((o for o in orphans if o.kind is not None), key=lambda o: o.kind == "record")
    calls = [bloom.parts.delete_if_still(o.key, o.kind or "", o.proof, o.server) for o in order]
    replies = bloom.parts.run("delete the filter's orphaned parts", calls, write=True, take=int)
    deleted = [o for o, reply in zip(order, replies, strict=True) if reply]
    if len(deleted) < len(order):
        logger.warning(
            "%d part(s) of the Bloom filter %r changed after they were listed and were left alone.",
            len(order) - len(deleted),
            bloom.key,
        )
    return deleted
