"""The parts of a native filter in Redis: server-side Bloom filters (``BF.*``), one per shard.

Shard ``i`` is ``{KEY:<i>}:bf:<id>``: the record's id in its name proves ownership as a
bitmap header does. Shards are made by ``BF.RESERVE``, never by the hot path (``NOCREATE``).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from scrapy_redis_bloom.core.errors import (
    AccessDeniedError,
    FilterDamagedError,
    UnsupportedServerError,
    foreign_reply,
    taking_apart,
)
from scrapy_redis_bloom.core.layout import NATIVE_TYPE
from scrapy_redis_bloom.core.record import FilterRecord
from scrapy_redis_bloom.core.sizing import (
    KEY_OVERHEAD,
    allocation,
    format_bytes,
    native_chain_rate,
    native_excess,
    native_geometry,
    native_link,
    native_rate_reachable,
)
from scrapy_redis_bloom.engine import health
from scrapy_redis_bloom.engine.lifecycle import named
from scrapy_redis_bloom.engine.native import ttl as native_ttl
from scrapy_redis_bloom.engine.parts import Parts, integer, pairs, script_call, text
from scrapy_redis_bloom.engine.state import (
    DamagedPart,
    FilterState,
    GenerationState,
    windows_needed,
)
from scrapy_redis_bloom.transport.executor import Call, Executor, acl_denial, error_text
from scrapy_redis_bloom.transport.topology import Topology
from scrapy_redis_bloom.transport.wire import pack_command

#: How far past its target a shard's rate bound may run (:func:`rate_bound`) unsaid: the
#: excess is a fit to the top of its spread, and an earlier build's large shards pass by 1%.
UNSAID_EXCESS = 0.1
#: What to install when a server lacks ``BF.*``.
INSTALL_HINT = (
    "Redis 8 (Bloom filters built in), Redis Stack, the RedisBloom module, or Valkey with"
    " valkey-bloom"
)
#: A TTL shard's anchor: ``"<newest window> <0|1>"`` (whether the window before existed).
_ANCHOR = re.compile(r"(-?[0-9]+) ([01])")


def shard_key(key: str, shard: int, filter_id: str) -> str:
    """Return the key of a native filter's shard ``shard``."""
    return f"{{{key}:{shard}}}:bf:{filter_id}"


def is_not_found(reply: object) -> bool:
    """Tell whether an error reply is RedisBloom's answer for a missing key (``NOCREATE``)."""
    return isinstance(reply, BaseException) and error_text(reply).endswith("not found")


class Link(NamedTuple):
    """A sub-filter a shard has or may add (its "generation"), as RedisBloom sizes it."""

    capacity: int
    bits: int
    hash_count: int


def reserve_arguments(record: FilterRecord) -> tuple[float, int, tuple[Any, ...]]:
    """Return ``BF.RESERVE``'s error rate, capacity and options for a shard of ``record``.

    The rate is the record's (:attr:`.FilterRecord.shard_rate`): that its shards hold.
    """
    options = (b"EXPANSION", record.expansion) if record.expansion else (b"NONSCALING",)
    return record.shard_rate, record.growth.native_capacity, options


def reachable(record: FilterRecord) -> bool:
    """Tell whether a shard of ``record`` can keep its target at any rate (not a tiny one)."""
    capacity = record.growth.native_capacity
    return native_rate_reachable(capacity, record.target_rate, record.expansion)


def rate_bound(record: FilterRecord) -> float | None:
    """Return the most false positives a shard's rate gives, if far past its target; else None.

    Every sub-filter full (:func:`.native_chain_rate`): a shard too small for any rate
    (:func:`reachable`), or reserved at the bare target by an earlier build (layout 3).
    """
    capacity = record.growth.native_capacity
    bound = native_chain_rate(capacity, record.shard_rate, record.expansion)
    return bound if bound > record.target_rate * (1 + UNSAID_EXCESS) else None


def links(record: FilterRecord, count: int) -> list[Link]:
    """Return the first ``count`` sub-filters of a shard, as RedisBloom sizes them."""
    rate, capacity, _ = reserve_arguments(record)
    growing = count if record.expansion else 1
    return [Link(*native_link(capacity, rate, record.expansion, g)) for g in range(growing)]


def describe(record: FilterRecord) -> str:
    """Return a native filter's geometry for the startup line: what ``BF.RESERVE`` gave it.

    RedisBloom sizes each shard's first sub-filter from a capacity and a rate (:func:`links`),
    so the record's bits and k (a bitmap geometry) are not what the servers hold.
    """
    rate, capacity, _ = reserve_arguments(record)
    first = links(record, 1)[0]
    bits = record.spec.shards * first.bits
    window = ", per re-crawl window" if record.ttl else ""
    return (
        f"{record.spec.shards:,} native Bloom filter(s) (BF.RESERVE {capacity:,} items at error"
        f" rate {rate:.3g} each{window}): m={bits:,} bits ({format_bytes(bits // 8)}),"
        f" k={first.hash_count} hash functions, capacity {record.capacity:,} items,"
        f" {record.growth_text()}"
    )


def shard_bytes(record: FilterRecord) -> int:
    """Return the bytes a shard's first sub-filter takes (its two live windows' with a TTL)."""
    first = links(record, 1)[0]
    return (2 if record.ttl else 1) * (allocation(first.bits // 8) + KEY_OVERHEAD)


def unlike_reserved(record: FilterRecord, info: dict[str, str]) -> str:
    """Return how a shard's ``BF.INFO`` differs from :func:`reserve_arguments` ("" if not)."""
    rate, _, _ = reserve_arguments(record)
    found = info.get("Expansion rate", "None")
    expansion = "NONSCALING" if found in ("None", "", "0") else f"EXPANSION {found}"
    wanted = f"EXPANSION {record.expansion}" if record.expansion else "NONSCALING"
    try:
        count = int(info.get("Number of filters", "1"))
        capacity = int(info.get("Capacity", "-1"))
        size = int(info.get("Size", "-1"))
        shown = float(info["Error rate"]) if "Error rate" in info else None
    except ValueError:
        return f"unreadable BF.INFO {info!r:.100}"
    if expansion != wanted:
        return f"{expansion} (the record says {wanted})"
    chain = links(record, max(1, count))[: max(1, count)]
    share = record.growth.shard_capacity  # a fixed shard reserved before it had headroom
    if not record.expansion and capacity == share:
        chain = [Link(share, *native_geometry(share, rate))]
    want_capacity = sum(link.capacity for link in chain)
    if count < 1 or (not record.expansion and count != 1) or capacity != want_capacity:
        return f"capacity {capacity:,} in {count} sub-filter(s) (the record says {want_capacity:,})"
    if shown is not None:
        if not math.isclose(shown, rate, rel_tol=0.01):
            return f"error rate {shown:g} (the record says {rate:g})"
        return ""
    want_size = sum(link.bits // 8 for link in chain)
    if abs(size - want_size) > 128 * count + want_size // 100:
        return f"{size:,} bytes (the record's error rate {rate:g} takes {want_size:,})"
    return ""


def missing_bloom(executor: Executor, topology: Topology) -> list[str]:
    """Return the servers (cluster masters) without ``BF.INSERT`` (or refusing to say).

    A Redis ACL refusing ``COMMAND INFO`` is no answer: :class:`AccessDeniedError`.
    """
    nodes = topology.primaries()
    calls = [
        Call(pack_command(b"COMMAND", b"INFO", b"BF.INSERT"), server=i) for i in range(len(nodes))
    ]
    replies = executor.run("look for Bloom filter commands (BF.*)", calls).replies
    denied = [(node.address, r) for node, r in zip(nodes, replies, strict=True) if acl_denial(r)]
    if denied:
        where = ", ".join(address for address, _ in denied)
        raise AccessDeniedError(
            f"Redis at {where} does not let the filter's user run COMMAND INFO, by which the"
            " native backend looks for Bloom filter commands (BF.*): a Redis ACL refused it"
            f" (Redis: {error_text(denied[0][1])}). Grant it +command|info (ACL SETUSER; see"
            " docs/howto/tls-acl.md#least-privilege).",
            server=where,
            commands=("command|info",),
        )
    missing = []
    for node, reply in zip(nodes, replies, strict=True):
        if isinstance(reply, BaseException) or reply == [None]:
            missing.append(node.address)
        elif not (
            isinstance(reply, list) and len(reply) == 1 and isinstance(reply[0], (list, dict))
        ):
            shape = ValueError(f"a command's description, got {reply!r:.200}")
            raise foreign_reply("a call to look for Bloom filter commands", node.address, shape)
    return missing


def types(parts: Parts, keys: Sequence[tuple[int, str]]) -> list[str]:
    """Return the Redis type of each ``(shard, key)`` (``none`` when missing)."""
    calls = [Call(pack_command(b"TYPE", key), key=key, shard=shard) for shard, key in keys]
    return [text(reply) for reply in parts.run("check the filter's shards", calls)]


def read_state(parts: Parts, record: FilterRecord, shards: Sequence[int]) -> FilterState:
    """Read each shard's (or live window's) ``BF.INFO`` and ``MEMORY USAGE``; estimate the rest.

    With a TTL, a live window the anchor says must exist and is missing (or of another type)
    is damage, as the check's script says: listed in ``damaged``, left out of the figures.
    """
    keys = [(shard, shard_key(parts.key, shard, record.filter_id)) for shard in shards]
    damaged: list[DamagedPart] = []
    if record.ttl:
        keys, damaged = _live_windows(parts, record, keys)
    calls = [Call(pack_command(b"BF.INFO", key), key=key, shard=shard) for shard, key in keys]
    calls += [
        Call(pack_command(b"MEMORY", b"USAGE", key), key=key, shard=shard) for shard, key in keys
    ]
    replies = parts.run("read the filter's shards", calls)
    with taking_apart("read the filter's shards", parts.key):
        infos = [pairs(reply) for reply in replies[: len(keys)]]
        memory = sum(integer(reply) for reply in replies[len(keys) :])
    filters = [
        (
            shard,
            int(info.get("Number of items inserted", "0")),
            int(info.get("Number of filters", "1")),
        )
        for (shard, _), info in zip(keys, infos, strict=True)
    ]
    return _state(record, filters, memory, len(shards), tuple(damaged))


def needed_windows(anchor: Any, window: int) -> tuple[bool, bool]:
    """Return whether windows ``window - 1`` and ``window`` must exist, as ``lua/windows.lua``."""
    found = _ANCHOR.fullmatch(text(anchor)) if anchor is not None else None
    if found is None:  # no anchor, or not one: Blooms.missing says so
        return False, False
    return windows_needed(int(found[1]), int(found[2]), window)


def _live_windows(
    parts: Parts, record: FilterRecord, anchors: list[tuple[int, str]]
) -> tuple[list[tuple[int, str]], list[DamagedPart]]:
    """Return the live windows of the shards with ``anchors`` there, and those lost or foreign."""
    windows = parts.live_windows(record.ttl)
    keys = [(s, native_ttl.window_key(anchor, w)) for s, anchor in anchors for w in windows]
    calls = [Call(pack_command(b"GET", key), key=key, shard=shard) for shard, key in anchors]
    calls += [Call(pack_command(b"TYPE", key), key=key, shard=shard) for shard, key in keys]
    replies = parts.run("check the filter's re-crawl windows", calls)
    needed = [
        must for anchor in replies[: len(anchors)] for must in needed_windows(anchor, windows[-1])
    ]
    live, damaged = [], []
    for (shard, key), reply, must in zip(keys, replies[len(anchors) :], needed, strict=True):
        kind = text(reply)
        if kind == NATIVE_TYPE:
            live.append((shard, key))
        elif kind != "none":
            damaged.append(DamagedPart(shard, key, f"a {kind}"))
        elif must:
            damaged.append(DamagedPart(shard, key, "missing"))
    return live, damaged


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
    per_shard = [(i, share + (i < more), links_needed) for i in range(shards)]
    memory = shards * sum(link.bits // 8 for link in links(record, links_needed))
    return replace(_state(record, per_shard, memory, shards), from_counters=True)


def _state(
    record: FilterRecord,
    filters: list[tuple[int, int, int]],
    memory: int,
    shards: int,
    damaged: tuple[DamagedPart, ...] = (),
) -> FilterState:
    """Return the state of Bloom filters holding ``(shard, items, sub-filters)`` each.

    A check consults every filter of its shard (with a TTL, its two live windows), so the
    rate is per shard that of any of them answering, then the mean over ``shards``. Each
    filter's is the Bloom formula's plus RedisBloom's index excess (:func:`.native_excess`).
    """
    most = max((count for _, _, count in filters), default=1)
    shape = links(record, most)
    per_gen: dict[int, list[tuple[int, float, int]]] = {}  # g: (items, rate, ones) per filter
    missed: dict[int, float] = {}  # per shard: the log of the chance every link misses
    for shard, left, count in filters:  # left: items not yet placed in a link
        for g, link in enumerate(shape[:count]):
            held = left if g == count - 1 else min(left, link.capacity)
            left -= held
            fill = -math.expm1(-link.hash_count * held / link.bits)
            rate = min(1.0, fill**link.hash_count + native_excess(link.bits, link.hash_count, fill))
            missed[shard] = missed.get(shard, 0.0) + math.log1p(-min(rate, 1 - 1e-12))
            per_gen.setdefault(g, []).append((held, rate, round(fill * link.bits)))
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
        estimated_items=sum(items for _, items, _ in filters),
        generations=generations,
        fpr=sum(-math.expm1(log) for log in missed.values()) / max(1, shards),
        total_bits=sum(gen.bits for gen in generations) or record.spec.bits,
        damaged=damaged,
    )


class Blooms:
    """A ``BF.RESERVE``'d filter per shard (with a TTL, its anchor: :mod:`.native.ttl`)."""

    noun = "native Bloom filter"

    def __init__(self, parts: Parts, topology: Topology) -> None:
        self.parts = parts
        self.topology = topology

    def shard_key(self, record: FilterRecord, shard: int) -> str:
        """Return the key of a shard's Bloom filter (or its anchor, with a TTL)."""
        return shard_key(self.parts.key, shard, record.filter_id)

    def check_servers(self) -> None:
        """Refuse servers without ``BF.*``, naming them and what to install (or do)."""
        missing = missing_bloom(self.parts.executor, self.topology)
        record = self.parts.read_record() if missing else None
        if record is not None and record.backend == "bitmap":  # said before the record check
            raise UnsupportedServerError(
                f"The Bloom filter {self.parts.key!r} is a bitmap filter (its record says so),"
                " and BLOOMFILTER_BACKEND = 'native' asks for the servers' own Bloom filters,"
                f" which Redis at {', '.join(missing)} has not (no BF.* commands). Set"
                " BLOOMFILTER_BACKEND = 'auto' (it adopts the filter's backend) or 'bitmap'."
            )
        if record is not None:  # whatever the setting says
            raise UnsupportedServerError(
                f"The Bloom filter {self.parts.key!r} is native (its record says so: its shards"
                " are the servers' own Bloom filters), and Redis at"
                f" {', '.join(missing)} has no Bloom filter commands (BF.*): install"
                f" {INSTALL_HINT} there. No BLOOMFILTER_BACKEND reads its shards without"
                " them: to crawl on bitmaps there, choose another BLOOMFILTER_KEY, or reset"
                f" the filter (scrapy bloom reset --key {self.parts.key!r})."
            )
        if missing:
            raise UnsupportedServerError(
                "BLOOMFILTER_BACKEND = 'native' needs Bloom filter commands (BF.*) on every"
                f" server of the filter {self.parts.key!r}, and Redis at {', '.join(missing)}"
                f" has none: install {INSTALL_HINT}, or set BLOOMFILTER_BACKEND"
                " = 'bitmap' (or 'auto')."
            )

    def prepare(
        self, wanted: FilterRecord, servers: list[health.ServerHealth], markers: list[str | None]
    ) -> FilterRecord | None:
        """Refuse a filter that does not fit, before ``BF.RESERVE`` fails half-way on a server."""
        each = shard_bytes(wanted)
        shards = wanted.spec.shards
        health.check_room(self.parts.key, servers, {}, spread=(shards * each, len(servers)))
        held = Counter(
            self.topology.route(key, shard, None).address
            for shard in range(shards)
            for key in [self.shard_key(wanted, shard)]
        )
        health.check_room(self.parts.key, servers, {a: n * each for a, n in held.items()})
        return None

    def create(self, record: FilterRecord, shards: Iterable[int], replace: bool = False) -> int:
        """Create shards by ``BF.RESERVE`` (or anchors; any there must be ours); return how many."""
        order = [(shard, self.shard_key(record, shard)) for shard in shards]
        rate, capacity, options = reserve_arguments(record)
        reserve = (repr(rate), capacity, *options)
        calls = [
            script_call(native_ttl.CREATE_ANCHOR, key, shard=shard)
            if record.ttl
            else Call(pack_command(b"BF.RESERVE", key, *reserve), key=key, shard=shard)
            for shard, key in order
        ]
        replies = self.parts.executor.run("create the filter's shards", calls, write=True).replies
        existing = []
        for (shard, key), reply in zip(order, replies, strict=True):
            failed = isinstance(reply, BaseException)
            if (failed and "exists" in str(reply)) or (record.ttl and reply != b"created"):
                existing.append(shard)
            elif failed:
                raise self.parts.refusal(reply, key, "create the filter's shards")
        self.missing(record, existing)
        return len(order) - len(existing)

    def recreate(self, record: FilterRecord, shards: Iterable[int]) -> tuple[int, dict[int, str]]:
        """Create lost shards anew: a RedisBloom filter grows within its key, kept whole or lost."""
        return self.create(record, shards, replace=True), {}

    def missing(self, record: FilterRecord, shards: Iterable[int]) -> dict[int, str]:
        """Return the shards whose key is missing; refuse any key of another type."""
        keys = [(shard, self.shard_key(record, shard)) for shard in shards]
        ours = ("none", "string" if record.ttl else NATIVE_TYPE)
        found = dict(zip([s for s, _ in keys], types(self.parts, keys), strict=True))
        foreign = {shard: f"a {kind}" for shard, kind in found.items() if kind not in ours}
        blooms = [(s, k) for s, k in keys if found[s] == NATIVE_TYPE and not record.ttl]
        foreign.update(self._unlike(record, blooms))
        if foreign:
            raise FilterDamagedError(
                f"Where the native Bloom filter {self.parts.key!r} keeps its shards, Redis holds"
                f" {named(self.topology, lambda s: self.shard_key(record, s), foreign)}. It is"
                " never overwritten: remove those keys, or choose another BLOOMFILTER_KEY."
            )
        return {shard: "missing" for shard, kind in found.items() if kind == "none"}

    def _unlike(self, record: FilterRecord, keys: Sequence[tuple[int, str]]) -> dict[int, str]:
        """Return the Bloom filters among ``keys`` not reserved as ``record`` says, and how."""
        calls = [Call(pack_command(b"BF.INFO", key), key=key, shard=shard) for shard, key in keys]
        replies = self.parts.run("check the filter's shards", calls) if calls else []
        with taking_apart("check the filter's shards", self.parts.key):
            infos = [pairs(reply) for reply in replies]
        found = [
            (s, unlike_reserved(record, info)) for (s, _), info in zip(keys, infos, strict=True)
        ]
        return {shard: f"a Bloom filter reserved otherwise: {why}" for shard, why in found if why}

    def misfits(self, record: FilterRecord, shards: Iterable[int]) -> dict[int, str]:
        """Return the shard past the last, if any (:meth:`missing` compared ``BF.INFO``)."""
        past = record.spec.shards
        if types(self.parts, [(past, self.shard_key(record, past))]) == ["none"]:
            return {}
        return {past: f"a shard past the last (the record says {past:,} shards)"}

    def delete(self, record: FilterRecord) -> int:
        """Delete the filter's parts, each only if still its own (see :func:`delete`)."""
        return delete(self.parts, record)


def delete(parts: Parts, record: FilterRecord) -> int:
    """Delete a native filter's parts (a shard key only while of its type); return how many keys."""
    windows = parts.windows(record)  # with a TTL: those whose keys may exist now
    typed = [
        (key, shard, "string" if record.ttl else NATIVE_TYPE)
        for shard in range(record.spec.shards)
        for key in [shard_key(parts.key, shard, record.filter_id)]
    ]
    typed += [
        (native_ttl.window_key(key, w), shard, NATIVE_TYPE)
        for key, shard, _ in list(typed)
        for w in windows
    ]
    script = native_ttl.DELETE_TYPED
    return parts.delete(record, [script_call(script, k, kind, shard=s) for k, s, kind in typed])
