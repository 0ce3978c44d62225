"""The filter's parts in Redis (record, shards, markers, counters): read and written, not judged."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from scrapy_redis_bloom.core import layout
from scrapy_redis_bloom.core.errors import BloomFilterError, WrongTypeError, taking_apart
from scrapy_redis_bloom.core.generations import window_key
from scrapy_redis_bloom.core.hashing import FilterSpec
from scrapy_redis_bloom.core.record import FilterRecord
from scrapy_redis_bloom.engine import scripts
from scrapy_redis_bloom.transport.executor import Call, Executor, access_denied, error_text
from scrapy_redis_bloom.transport.wire import Arg, Script, pack_command

#: A native shard's re-crawl window: ``{KEY:<i>}:bf:<id>:w<window>``.
_WINDOW = re.compile(r"\}:bf:[^:]*:w-?[0-9]+$")
#: Commands sent in one batch by the maintenance operations.
BATCH = 1000
#: Shard bytes allocated in one batch at most: zeroing more outlasts the socket timeout.
ALLOCATE_BYTES = 256 << 20


def text(value: Any) -> str:
    """Decode a reply item (bytes from the filter's own connections)."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def script_call(
    script: Script, key: str, *args: Arg, shard: int | None = None, server: int | None = None
) -> Call:
    """Return the call running ``script`` on ``key`` by SHA (the executor loads it if needed)."""
    argv = pack_command(b"EVALSHA", script.sha, 1, key, *args)
    return Call(argv, key=key, shard=shard, server=server, script=script)


def pairs(reply: Any) -> dict[str, str]:
    """Return a hash reply (a flat RESP2 list or a RESP3 map) as a dict of text."""
    if isinstance(reply, dict):
        return {text(k): text(v) for k, v in reply.items()}
    if not isinstance(reply, list) or len(reply) % 2:
        raise ValueError(f"a hash's fields and values, got {reply!r:.200}")
    return {text(reply[i]): text(reply[i + 1]) for i in range(0, len(reply), 2)}


def blob(reply: Any) -> bytes:
    """Return a string reply's bytes."""
    if not isinstance(reply, bytes):
        raise ValueError(f"a string, got {reply!r:.200}")
    return reply


def integer(reply: Any) -> int:
    """Return an integer reply, None (a missing key's ``MEMORY USAGE``) as 0."""
    return 0 if reply is None else int(reply)


def refusal(
    executor: Executor,
    filter_key: str,
    reply: BaseException,
    key: str,
    operation: str,
    server: int | None = None,
) -> BloomFilterError:
    """Return the error (ACL, a key of another type, else Redis's) for an error reply, by key.

    It names the server the call went to (``key``'s, or ``server``), not every server.
    """
    node = executor.topology.route(key or None, shard_of(filter_key, key), server)
    where = f"Redis at {node.address}"
    if (denied := access_denied(reply, operation, key, where)) is not None:
        return executor.explain(denied)
    message = error_text(reply)
    if "WRONGTYPE" in message:  # inside a script, Redis 6.2 wraps it in "ERR ..."
        calls = [Call(pack_command(b"TYPE", key), key=key, shard=shard_of(filter_key, key))]
        kind = text(executor.run("read a key's type", calls).replies[0])
        return WrongTypeError(
            f"Redis key {key!r} holds a {kind}, where the Bloom filter {filter_key!r} keeps"
            f" {role(filter_key, key, kind)}. Another program wrote it."
            " Choose another BLOOMFILTER_KEY, or remove that key if it is not needed."
        )
    return BloomFilterError(
        f"{where} refused to {operation} for the Bloom filter {filter_key!r} (key {key!r}):"
        f" {message}"
    )


def role(filter_key: str, key: str, kind: str) -> str:
    """Say what the filter keeps in ``key`` (found holding a ``kind``), and of which type."""
    fixed = {
        layout.meta_key(filter_key): "its config record (a hash)",
        layout.counter_key(filter_key): "its counters (a hash)",
        layout.workers_key(filter_key): "its registry of live workers (a sorted set)",
        layout.server_key(filter_key): "its server marker (a string)",
    }.get(key)
    if fixed is not None:
        return fixed
    if "}:bf:" not in key:
        return "a shard's bits (a string)"
    bloom = "a Bloom filter, BF.*"
    if _WINDOW.search(key):
        return f"a shard's re-crawl window ({bloom})"
    if kind == "string":  # a native shard without BLOOMFILTER_TTL
        return f"a shard ({bloom})"
    if kind == layout.NATIVE_TYPE:  # with BLOOMFILTER_TTL: the shard's anchor
        return "a shard's anchor (a string naming its re-crawl windows)"
    return f"a shard ({bloom}; with BLOOMFILTER_TTL, a string naming its re-crawl windows)"


def shard_of(filter_key: str, key: str) -> int | None:
    """Return the shard a key ``{KEY:<i>}:...`` belongs to (None for other keys)."""
    prefix = "{" + filter_key + ":"
    number = key[len(prefix) : key.index("}")] if key.startswith(prefix) and "}" in key else ""
    return int(number) if number.isdigit() else None


class Parts:
    """The parts of the filter ``key`` with geometry ``spec``, reached through ``executor``."""

    def __init__(self, executor: Executor, key: str, spec: FilterSpec) -> None:
        self.executor = executor
        self.key = key
        self.spec = spec
        #: The capacity in the record last read or written (what an adopting worker uses).
        self.capacity: int | None = None
        self.meta_key = layout.meta_key(key)
        self.counter_key = layout.counter_key(key)
        self.marker_key = layout.server_key(key)

    def shard_key(self, shard: int) -> str:
        """Return the key of a shard's bitmap."""
        return layout.shard_key(self.key, shard)

    def run(
        self,
        operation: str,
        calls: list[Call],
        write: bool = False,
        batch_size: int = BATCH,
        take: Callable[[Any], Any] | None = None,
    ) -> list[Any]:
        """Run calls in batches; return the replies (each read by ``take``), refusing errors."""
        out: list[Any] = []
        for start in range(0, len(calls), batch_size):
            batch = calls[start : start + batch_size]
            replies = self.executor.run(operation, batch, write=write).replies
            for call, reply in zip(batch, replies, strict=True):
                if isinstance(reply, BaseException):
                    raise self.refusal(reply, call.key or "", operation, call.server)
                if take is not None:
                    with taking_apart(operation, call.key or ""):
                        reply = take(reply)
                out.append(reply)
        return out

    def refusal(
        self, reply: BaseException, key: str, operation: str, server: int | None = None
    ) -> BloomFilterError:
        """Return the error for an error reply that no retry fixes, naming the key."""
        return refusal(self.executor, self.key, reply, key, operation, server)

    def read_record(self) -> FilterRecord | None:
        """Read the config record; None when there is none."""
        call = Call(pack_command(b"HGETALL", self.meta_key), key=self.meta_key)
        (fields,) = self.run("read the filter's record", [call], take=pairs)
        return self._parse(fields) if fields else None

    def create_record(self, record: FilterRecord) -> FilterRecord:
        """Write ``record`` unless a record exists; return the record in Redis."""
        argv = [item for pair in record.fields().items() for item in pair]
        call = script_call(scripts.CREATE_RECORD, self.meta_key, *argv)
        (fields,) = self.run("create the filter's record", [call], write=True, take=pairs)
        return self._parse(fields)

    def _parse(self, fields: dict[str, str]) -> FilterRecord:
        """Parse the record read or written, noting its capacity."""
        record = FilterRecord.parse(self.meta_key, fields)
        self.capacity = record.capacity
        return record

    def mark_ready(self) -> None:
        """Set the record's state to ``ready``: every part exists."""
        call = Call(pack_command(b"HSET", self.meta_key, b"state", b"ready"), key=self.meta_key)
        self.run("finish creating the filter", [call], write=True)

    def identities(self, shards: Iterable[int]) -> dict[int, bytes]:
        """Return the first bytes of each shard: its identity, or b"" if it is missing."""
        order = list(shards)
        ends = (0, layout.IDENTITY_BYTES - 1)
        replies = self._on_shards("check the filter's shards", order, blob, b"GETRANGE", *ends)
        return dict(zip(order, replies, strict=True))

    def _on_shards(
        self, operation: str, shards: Sequence[int], take: Callable[[Any], Any], *argv: Arg
    ) -> list[Any]:
        """Run ``argv[0] <shard key> argv[1:]`` on each shard; return the replies ``take`` reads."""
        calls = [
            Call(pack_command(argv[0], key, *argv[1:]), key=key, shard=shard)
            for shard in shards
            for key in [self.shard_key(shard)]
        ]
        return self.run(operation, calls, take=take)

    def allocate(
        self,
        record: FilterRecord,
        shards: Iterable[int],
        replace: bool = False,
        states: Mapping[int, bytes] | None = None,
    ) -> dict[int, int]:
        """Allocate shards whole with their header; per shard 1 (now), 0 (there) or -1 (foreign).

        ``states``: a shard's header state after its identity, where not zeros.
        """
        order = list(shards)
        last = layout.HEADER_BYTES + record.shard_payload - 1
        mode = b"replace" if replace else b"create"
        k = record.spec.hash_count
        states = states or {}
        calls = [
            script_call(scripts.ALLOCATE, key, header, last, mode, shard=s)
            for s in order
            for key in [self.shard_key(s)]
            for header in [layout.header(record.filter_id, s, k, states.get(s, b""))]
        ]
        per_batch = max(1, min(BATCH, ALLOCATE_BYTES // (last + 1)))
        replies = self.run(
            "allocate the filter's shards", calls, write=True, batch_size=per_batch, take=int
        )
        return dict(zip(order, replies, strict=True))

    def part_keys(self, record: FilterRecord, shard: int, windows: Sequence[int] = ()) -> list[str]:
        """Return every key a shard's bits may be in: the shard, its generations, ``windows``."""
        generations = range(record.growth.last + 1)
        names = [self.shard_key(shard)]
        if record.ttl:
            names += [window_key(self.key, shard, w, g) for w in windows for g in generations]
        else:
            names += [layout.shard_key(self.key, shard, g) for g in generations[1:]]
        return names

    def windows(self, record: FilterRecord) -> list[int]:
        """Return the windows whose keys may exist now, by server 0's clock (w - 2 to w + 1)."""
        if not record.ttl:
            return []
        now = self.clock() // record.ttl
        return [now - 2, now - 1, now, now + 1]  # w - 1, w live; the others: clock skew

    def live_windows(self, ttl: int) -> list[int]:
        """Return the re-crawl windows a check consults now (w - 1 and w), by server 0's clock."""
        now = self.clock() // ttl
        return [now - 1, now]

    def clock(self) -> int:
        """Return server 0's clock (Redis TIME), in whole seconds: what the scripts use."""
        call = Call(pack_command(b"TIME"), key=self.meta_key)
        (now,) = self.run("read the server's clock", [call], take=lambda r: int(text(r[0])))
        return int(now)

    def existing(self, shards: Sequence[int]) -> list[int]:
        """Return the shards whose keys exist."""
        replies = self._on_shards("look for the filter's shards", shards, int, b"EXISTS")
        return [shard for shard, reply in zip(shards, replies, strict=True) if reply]

    def markers(self, servers: int) -> list[str | None]:
        """Return ``KEY:server`` on each of the servers (None where missing; none on one server)."""
        calls = [
            Call(pack_command(b"GET", self.marker_key), key=self.marker_key, server=i)
            for i in range(servers if servers > 1 else 0)
        ]
        return [
            None if reply is None else text(reply)
            for reply in self.run("read the server markers", calls)
        ]

    def write_markers(self, record: FilterRecord, servers: Iterable[int]) -> None:
        """Write each listed server's marker (``<id> <i>/<n>``) where none exists (none on one)."""
        key = self.marker_key
        calls = [
            Call(pack_command(b"SET", key, marker, b"NX"), key=key, server=i)
            for i in (servers if record.servers > 1 else ())
            for marker in [layout.server_marker(record.filter_id, i, record.servers)]
        ]
        self.run("mark the filter's servers", calls, write=True)

    def delete_if_still(
        self, key: str, kind: str, proof: bytes | str = b"", server: int | None = None
    ) -> Call:
        """Return the call that deletes ``key`` only while ``proof`` proves it that ``kind``."""
        shard = shard_of(self.key, key)
        return script_call(scripts.DELETE_IF_STILL, key, kind, proof, shard=shard, server=server)

    def marker_deletions(self, record: FilterRecord) -> list[Call]:
        """Return the calls deleting a multi-server filter's markers (none on one server)."""
        return [
            self.delete_if_still(self.marker_key, "marker", marker, server=i)
            for i in range(record.servers if record.servers > 1 else 0)
            for marker in [layout.server_marker(record.filter_id, i, record.servers)]
        ]

    def delete(self, record: FilterRecord, shard_calls: list[Call]) -> int:
        """Delete a filter's parts, each only if still its own, the record last; return how many."""
        calls = [*shard_calls, self.delete_if_still(self.counter_key, "counters")]
        calls += self.marker_deletions(record)
        deleted: int = sum(self.run("delete the filter", calls, write=True, take=int))
        last = self.delete_if_still(self.meta_key, "record", record.filter_id)
        (record_deleted,) = self.run("delete the filter's record", [last], write=True, take=int)
        return deleted + int(record_deleted)
