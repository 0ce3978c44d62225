"""The native backend's shards: how one is made (``BF.RESERVE``), checked and deleted.

:class:`Blooms` is the :class:`~..lifecycle.Shards` of :class:`.filter.NativeBloomFilter`.
"""

from __future__ import annotations

from collections.abc import Iterable

from scrapy_redis_bloom.core.errors import FilterDamagedError
from scrapy_redis_bloom.core.record import FilterRecord
from scrapy_redis_bloom.engine import health
from scrapy_redis_bloom.engine.lifecycle import named
from scrapy_redis_bloom.engine.native import parts as native_parts
from scrapy_redis_bloom.engine.native import ttl as native_ttl
from scrapy_redis_bloom.engine.parts import Parts, script_call
from scrapy_redis_bloom.transport.executor import Call
from scrapy_redis_bloom.transport.topology import Topology
from scrapy_redis_bloom.transport.wire import pack_command


class Blooms:
    """The native backend's :class:`.lifecycle.Shards`: a ``BF.RESERVE``'d filter per shard.

    With a TTL, a shard's key holds its anchor (:mod:`.native.ttl`); windows come as needed.
    A shard's name carries its filter's id: missing, it is lost; another type is foreign.
    """

    noun = "native Bloom filter"

    def __init__(self, parts: Parts, topology: Topology) -> None:
        self.parts = parts
        self.topology = topology

    def shard_key(self, record: FilterRecord, shard: int) -> str:
        """Return the key of a shard's Bloom filter (or its anchor, with a TTL)."""
        return native_parts.shard_key(self.parts.key, shard, record.filter_id)

    def check_servers(self) -> None:
        """Refuse servers without ``BF.*``, naming them."""
        native_parts.require_bloom(self.parts.executor, self.topology, self.parts.key)

    def prepare(
        self, wanted: FilterRecord, servers: list[health.ServerHealth], markers: list[str | None]
    ) -> FilterRecord | None:
        """Nothing to clear: a new filter's shards are named by its new id."""
        return None

    def create(self, record: FilterRecord, shards: Iterable[int], replace: bool = False) -> int:
        """Create shards by ``BF.RESERVE`` (or anchors; any there must be ours); return how many."""
        order = [(shard, self.shard_key(record, shard)) for shard in shards]
        anchor = native_ttl.CREATE_ANCHOR
        rate, capacity, options = native_parts.reserve_arguments(record)
        reserve = (repr(rate), capacity, *options)
        calls = [
            script_call(anchor, key, shard=shard)
            if record.ttl
            else Call(pack_command(b"BF.RESERVE", key, *reserve), key=key, shard=shard)
            for shard, key in order
        ]
        replies = self.parts.executor.run("create the filter's shards", calls, write=True).replies
        existing = [
            shard
            for (shard, _), reply in zip(order, replies, strict=True)
            if (isinstance(reply, BaseException) and "exists" in str(reply))
            or (record.ttl and reply != b"created")
        ]
        for (shard, key), reply in zip(order, replies, strict=True):
            if isinstance(reply, BaseException) and shard not in existing:
                raise self.parts.refusal(reply, key, "create the filter's shards")
        self.missing(record, existing)
        return len(order) - len(existing)

    def missing(self, record: FilterRecord, shards: Iterable[int]) -> dict[int, str]:
        """Return the shards whose key is missing; refuse any key of another type."""
        keys = [(shard, self.shard_key(record, shard)) for shard in shards]
        ours = ("none", "string" if record.ttl else native_parts.NATIVE_TYPE)
        found = dict(zip([s for s, _ in keys], native_parts.types(self.parts, keys), strict=True))
        foreign = {shard: f"a {kind}" for shard, kind in found.items() if kind not in ours}
        if foreign:
            raise FilterDamagedError(
                f"Where the native Bloom filter {self.parts.key!r} keeps its shards, Redis holds"
                f" {named(self.topology, lambda s: self.shard_key(record, s), foreign)}. It is"
                " never overwritten: remove those keys, or choose another BLOOMFILTER_KEY."
            )
        return {shard: "missing" for shard, kind in found.items() if kind == "none"}

    def delete(self, record: FilterRecord) -> int:
        """Delete the filter's parts, each only if still its own (see :func:`delete`)."""
        return delete(self.parts, record)


def delete(parts: Parts, record: FilterRecord) -> int:
    """Delete a native filter's parts, each only if still its own; return how many keys.

    A shard key only while of its type (a Bloom filter; with a TTL an anchor string, and the
    windows that may exist); then the counters and server markers; the record last.
    """
    windows = parts.windows(record)  # with a TTL: those whose keys may exist now
    typed = [
        (key, shard, "string" if record.ttl else native_parts.NATIVE_TYPE)
        for shard in range(record.spec.shards)
        for key in [native_parts.shard_key(parts.key, shard, record.filter_id)]
    ]
    typed += [
        (native_ttl.window_key(key, w), shard, native_parts.NATIVE_TYPE)
        for key, shard, _ in list(typed)
        for w in windows
    ]
    script = native_ttl.DELETE_TYPED
    return parts.delete(record, [script_call(script, k, kind, shard=s) for k, s, kind in typed])
