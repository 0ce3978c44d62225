"""The parts of a native filter in Redis: server-side Bloom filters (``BF.*``), one per shard.

Layout 3: ``KEY:meta``, ``KEY:count`` and ``KEY:workers`` as for a bitmap filter; shard
``i`` in ``{KEY:<i>}:bf:<id>``, whose record id proves ownership as a bitmap header does (a
worker on a reset filter's keys finds its shard missing). Shards are made by ``BF.RESERVE``
(:func:`reserve_arguments`), never by the hot path, whose ``BF.INSERT ... NOCREATE``
answers ``ERR not found`` for a missing one, which ``BLOOMFILTER_ON_LOSS`` handles.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from scrapy_redis_bloom.core.errors import UnsupportedServerError
from scrapy_redis_bloom.core.record import FilterRecord
from scrapy_redis_bloom.core.sizing import native_geometry
from scrapy_redis_bloom.engine.parts import Parts, pairs, text
from scrapy_redis_bloom.engine.state import FilterState, GenerationState
from scrapy_redis_bloom.transport.executor import Call, Executor, error_text
from scrapy_redis_bloom.transport.topology import Topology
from scrapy_redis_bloom.transport.wire import pack_command

#: The Redis type of a RedisBloom (and valkey-bloom) Bloom filter.
NATIVE_TYPE = "MBbloom--"
#: RedisBloom tightens each new sub-filter's error rate by this ratio, the first one
#: included when the filter scales (``BF.DEBUG``, RedisBloom 2.8).
NATIVE_TIGHTENING = 0.5
#: What to install when a server lacks ``BF.*``.
INSTALL_HINT = (
    "Redis 8 (Bloom filters built in), Redis Stack, the RedisBloom module, or Valkey with"
    " valkey-bloom"
)


_ERROR_RATE = re.compile(r"(?:^| )error_rate=([0-9.e+-]+)(?: |$)")


def shard_key(key: str, shard: int, filter_id: str) -> str:
    """Return the key of a native filter's shard ``shard``."""
    return f"{{{key}:{shard}}}:bf:{filter_id}"


def is_not_found(reply: object) -> bool:
    """Tell whether an error reply is RedisBloom's answer for a missing key (``NOCREATE``)."""
    return isinstance(reply, BaseException) and error_text(reply).endswith("not found")


def is_full(reply: object) -> bool:
    """Tell whether an error reply says a non-scaling filter is full."""
    return isinstance(reply, BaseException) and "full" in error_text(reply)


@dataclass(frozen=True, slots=True)
class Link:
    """One sub-filter a shard's scalable Bloom filter has or may add (its "generation")."""

    capacity: int
    error_rate: float

    @property
    def bits(self) -> int:
        """Bits RedisBloom gives it (:func:`.sizing.native_geometry`)."""
        return native_geometry(self.capacity, self.error_rate)[0]

    @property
    def hash_count(self) -> int:
        """Hash functions RedisBloom gives it (:func:`.sizing.native_geometry`)."""
        return native_geometry(self.capacity, self.error_rate)[1]


def reserve_arguments(record: FilterRecord) -> tuple[float, int, tuple[Any, ...]]:
    """Return ``BF.RESERVE``'s error rate, capacity and options for a shard of ``record``.

    The capacity: a bitmap shard's generation 0's. The rate: the bound all generations stay
    under (as asked, or :attr:`.Growth.bound`; RedisBloom tightens sub-filters by
    :data:`NATIVE_TIGHTENING` as our growth does); with a TTL half (two windows are read).
    """
    growth = record.growth
    options: tuple[Any, ...] = (
        (b"EXPANSION", record.expansion) if record.expansion else (b"NONSCALING",)
    )
    asked = _ERROR_RATE.search(record.sizing)
    rate = float(asked.group(1)) if asked else growth.bound
    if record.ttl and asked:  # two re-crawl windows are consulted: half the rate each
        rate /= 2
    return rate, growth.first_capacity, options


def links(record: FilterRecord, count: int) -> list[Link]:
    """Return the first ``count`` sub-filters of a shard, as RedisBloom sizes them."""
    rate, capacity, _ = reserve_arguments(record)
    if not record.expansion:
        return [Link(capacity, rate)]
    return [
        Link(capacity * record.expansion**g, rate * NATIVE_TIGHTENING ** (g + 1))
        for g in range(count)
    ]


def missing_bloom(executor: Executor, topology: Topology) -> list[str]:
    """Return the addresses of the servers (cluster masters) that have no ``BF.INSERT``.

    Refusing ``COMMAND INFO`` (an ACL) counts as lacking it; silence raises.
    """
    nodes = topology.primaries()
    calls = [
        Call(pack_command(b"COMMAND", b"INFO", b"BF.INSERT"), server=i) for i in range(len(nodes))
    ]
    replies = executor.run("look for Bloom filter commands (BF.*)", calls).replies
    return [
        node.address
        for node, reply in zip(nodes, replies, strict=True)
        if isinstance(reply, BaseException) or not reply or reply[0] is None
    ]


def require_bloom(executor: Executor, topology: Topology, key: str) -> None:
    """Refuse servers without ``BF.*``, naming them and what to install."""
    missing = missing_bloom(executor, topology)
    if missing:
        raise UnsupportedServerError(
            f"BLOOMFILTER_BACKEND = 'native' needs Bloom filter commands (BF.*) on every server"
            f" of the filter {key!r}, and Redis at {', '.join(missing)} has none: install"
            f" {INSTALL_HINT}, or set BLOOMFILTER_BACKEND = 'bitmap' (or 'auto')."
        )


def types(parts: Parts, keys: Sequence[tuple[int, str]]) -> list[str]:
    """Return the Redis type of each ``(shard, key)`` (``none`` when missing)."""
    calls = [Call(pack_command(b"TYPE", key), key=key, shard=shard) for shard, key in keys]
    return [text(reply) for reply in parts.run("check the filter's shards", calls)]


def read_state(parts: Parts, record: FilterRecord, keys: Iterable[tuple[int, str]]) -> FilterState:
    """Read every shard's ``BF.INFO`` and ``MEMORY USAGE``: items, sub-filters, memory.

    Each sub-filter's bits set and rate are estimated by :func:`links`; all but the last full.
    """
    order = list(keys)
    calls = [Call(pack_command(b"BF.INFO", key), key=key, shard=shard) for shard, key in order]
    calls += [
        Call(pack_command(b"MEMORY", b"USAGE", key), key=key, shard=shard) for shard, key in order
    ]
    replies = parts.run("read the filter's shards", calls)
    infos = [pairs(reply) for reply in replies[: len(order)]]
    memory = sum(int(reply or 0) for reply in replies[len(order) :])
    shards = [
        (int(info.get("Number of items inserted", "0")), int(info.get("Number of filters", "1")))
        for info in infos
    ]
    return _state(record, shards, memory)


def estimate(record: FilterRecord, items: int) -> FilterState:
    """Return the state ``items`` adds leave, spread evenly over the shards: no Redis call."""
    shards = record.spec.shards
    share, more = divmod(items, shards)
    links_needed, held = 1, 0
    for link in links(record, 64):
        held += link.capacity
        if share + 1 <= held or not record.expansion:
            break
        links_needed += 1
    per_shard = [(share + (i < more), links_needed) for i in range(shards)]
    memory = shards * sum(link.bits // 8 for link in links(record, links_needed))
    return _state(record, per_shard, memory)


def _state(record: FilterRecord, shards: list[tuple[int, int]], memory: int) -> FilterState:
    """Return the state of shards holding ``(items, sub-filters)`` each."""
    most = max((count for _, count in shards), default=1)
    shape = links(record, most)
    per_gen: dict[int, list[tuple[int, float, int]]] = {}  # g: (items, rate, ones) per shard
    clear = 0.0  # sum over shards of the chance a new element is found by none of its links
    items_total = 0
    for items, count in shards:
        items_total += items
        missed = 0.0  # log of the chance that every link misses a new element
        left = items
        for g, link in enumerate(shape[:count]):
            held = left if g == count - 1 else min(left, link.capacity)
            left -= held
            fill = -math.expm1(-link.hash_count * held / link.bits)
            rate = fill**link.hash_count
            missed += math.log1p(-min(rate, 1 - 1e-12))
            per_gen.setdefault(g, []).append((held, rate, round(fill * link.bits)))
        clear += -math.expm1(missed)
    generations = tuple(
        GenerationState(
            generation=g,
            shards=len(found),
            bits=shape[g].bits * len(found),
            bits_set=sum(ones for _, _, ones in found),
            hash_count=shape[g].hash_count,
            capacity=shape[g].capacity * len(found),
            estimated_items=sum(held for held, _, _ in found),
            estimated_fpr=sum(rate for _, rate, _ in found) / len(found),
        )
        for g, found in sorted(per_gen.items())
    )
    return FilterState(
        spec=record.spec,
        bits_set=sum(gen.bits_set for gen in generations),
        memory_bytes=memory,
        estimated_items=items_total,
        generations=generations,
        fpr=clear / max(1, len(shards)),
        total_bits=sum(gen.bits for gen in generations) or record.spec.bits,
    )
