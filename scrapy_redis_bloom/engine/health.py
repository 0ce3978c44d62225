"""What the servers can take, read at open from ``INFO`` (a server refusing it is unchecked).

Refused: an old server, a replica, a new filter that does not fit in memory (allocated whole,
it would fail half-way or evict data). Warned: a policy that may evict the filter.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from scrapy_redis_bloom.core.errors import (
    FilterUnavailableError,
    NotEnoughMemoryError,
    ServerListMismatchError,
    UnsupportedServerError,
)
from scrapy_redis_bloom.core.sizing import format_bytes
from scrapy_redis_bloom.engine.parts import text
from scrapy_redis_bloom.transport.executor import Call, Executor, acl_denial
from scrapy_redis_bloom.transport.topology import SENTINEL, Topology
from scrapy_redis_bloom.transport.wire import pack_command

logger = logging.getLogger(__name__)

#: Oldest Redis the filter runs on (Valkey reports the Redis version it is compatible with).
MIN_VERSION = (6, 2)
#: Policies under which Redis may evict keys without an expiry, the filter's shards.
EVICTING_POLICIES = ("allkeys-lru", "allkeys-lfu", "allkeys-random")
#: What also evicts a filter whose bits expire (re-crawl windows): any key with a TTL.
VOLATILE_POLICIES = ("volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl")
#: Share of maxmemory above which a server is said to be nearly full.
NEARLY_FULL = 0.9
#: What to do when a new filter does not fit (:func:`check_room`'s default advice).
SIZING_ADVICE = (
    "Raise maxmemory, free memory, spread the filter over more servers, or size it smaller"
    " (BLOOMFILTER_CAPACITY and BLOOMFILTER_ERROR_RATE, or BLOOMFILTER_BIT)."
)


@dataclass(frozen=True, slots=True)
class ServerHealth:
    """One server's INFO figures (``known`` False when it refused INFO)."""

    address: str
    known: bool
    version: tuple[int, ...] = ()
    used_memory: int = 0
    maxmemory: int = 0
    policy: str = ""
    why_unknown: str = ""
    refused_by_acl: bool = False  # INFO denied: the permission check says so, with the fix
    system_memory: int = 0  # the host's, 0 when Redis does not say
    product: str = ""  # "Redis 7.0.15", "Valkey 9.1.2"
    replica_of: str = ""  # ``host:port`` of its primary when the server is a replica
    run_id: str = ""  # the server process's id: one server may be listed under two names


def info_fields(reply: object) -> dict[str, str]:
    """Return the fields of an ``INFO`` reply, by name."""
    lines = [line.partition(":") for line in text(reply).splitlines()]
    return {name.strip(): value.strip() for name, sep, value in lines if sep and name[:1] != "#"}


def survey(executor: Executor, topology: Topology) -> list[ServerHealth]:
    """Read every server's version and memory (once: a silent one fails what needs it)."""
    found = []
    for i, node in enumerate(topology.primaries()):
        parts = (b"server", b"memory", b"replication")
        calls = [Call(pack_command(b"INFO", part), server=i) for part in parts]
        try:
            replies = executor.run("read INFO", calls, timeout=0).replies
            refused = next((r for r in replies if isinstance(r, BaseException)), None)
        except FilterUnavailableError as exc:  # not an ACL refusal (acl_denial says None)
            refused = exc
        if refused is not None:
            why, denied = str(refused), acl_denial(refused) is not None
            found.append(
                ServerHealth(node.address, known=False, why_unknown=why, refused_by_acl=denied)
            )
            continue
        fields = {name: value for reply in replies for name, value in info_fields(reply).items()}
        if "redis_version" not in fields:  # a reply that is not INFO's: nothing read from it
            why = f"its reply to INFO server names no version ({text(replies[0])[:100]!r})"
            found.append(ServerHealth(node.address, known=False, why_unknown=why))
            continue
        version = tuple(int(p) for p in fields.get("redis_version", "0").split(".") if p.isdigit())
        valkey = fields.get("valkey_version")
        product = f"Valkey {valkey}" if valkey else f"Redis {fields.get('redis_version', '?')}"
        primary = f"{fields.get('master_host', '?')}:{fields.get('master_port', '?')}"
        sentinel = node.address.endswith(SENTINEL)
        found.append(
            ServerHealth(
                address=node.address,
                known=True,
                version=version,
                used_memory=int(fields.get("used_memory", 0)),
                maxmemory=int(fields.get("maxmemory", 0)),
                policy=fields.get("maxmemory_policy", ""),
                system_memory=int(fields.get("total_system_memory", 0)),
                product=product,
                # Sentinel's primary, met in a failover: its connections follow the new one.
                replica_of=primary if fields.get("role") == "slave" and not sentinel else "",
                run_id=fields.get("run_id", ""),
            )
        )
    return found


def check_primaries(servers: list[ServerHealth]) -> None:
    """Refuse a replica, and a server listed twice under two names.

    A replica refuses writes (or, writable, loses them at its next sync); a server listed
    twice would hold two servers' parts and markers, which take each other's place.
    """
    named: dict[str, str] = {}
    for server in servers:
        first = named.setdefault(server.run_id, server.address)  # ("": INFO not read)
        if server.run_id and first != server.address:
            raise ServerListMismatchError(
                f"{first} and {server.address} are one Redis server (run_id {server.run_id}),"
                " listed twice: the filter's parts would take each other's place on it. In a"
                " list of servers, list each server once."
            )
        if server.replica_of:
            raise UnsupportedServerError(
                f"Redis at {server.address} is a replica of {server.replica_of}: the Bloom"
                " filter writes with every check, which a replica refuses (or, writable, loses"
                " at its next sync). Give the filter its primary's address, or its Sentinel's"
                " (docs/howto/topologies.md)."
            )


def check_versions(servers: list[ServerHealth]) -> None:
    """Refuse a server older than :data:`MIN_VERSION`."""
    for server in servers:
        if server.known and server.version and server.version < MIN_VERSION:
            have = ".".join(map(str, server.version))
            need = ".".join(map(str, MIN_VERSION))
            named = f" ({server.product})" if server.product.startswith("Valkey") else ""
            raise UnsupportedServerError(
                f"Redis at {server.address} is version {have}{named}; the Bloom filter needs"
                f" Redis {need} or newer."
            )


def check_room(
    key: str,
    servers: list[ServerHealth],
    needs: dict[str, int],
    spread: tuple[int, int] | None = None,
    *,
    freed: dict[str, int] | None = None,
    advice: str = SIZING_ADVICE,
) -> None:
    """Refuse to create a filter whose shards do not fit in a server's memory.

    ``needs``: per address, its new shards' bytes, against what is free; ``spread`` =
    (bytes, servers): the filter spread evenly, against each whole limit. ``freed``: per
    address, the bytes deleted before the shards are written (a filter replaced), free too.
    ``advice``: what to do, said after the figures.
    """
    for server in servers:
        limit = server.maxmemory or server.system_memory  # the memory Redis may use
        if not server.known or not limit:
            continue
        frees = (freed or {}).get(server.address, 0)
        if spread is not None:
            need, room, what = -(-spread[0] // spread[1]), limit, "in all"
        else:
            need, room, what = needs.get(server.address, 0), limit - server.used_memory, "free"
            room += frees
        if need > room:
            source = "maxmemory" if server.maxmemory else "no maxmemory, and the host's memory is"
            replaced = f", {format_bytes(frees)} of it the filter it replaces" if frees else ""
            raise NotEnoughMemoryError(
                f"The Bloom filter {key!r} needs {format_bytes(need)} on Redis at"
                f" {server.address}, which has {source} {format_bytes(limit)}"
                f" ({format_bytes(server.used_memory)} used{replaced},"
                f" {format_bytes(max(room, 0))} {what}). {advice}"
            )


def warn_risks(key: str, servers: list[ServerHealth], expiring: bool = False) -> int:
    """Log what could cost the filter its data; return how many servers may evict it."""
    evicting = 0
    for server in servers:
        if not server.known:
            if server.refused_by_acl:
                continue  # logged by the permission check (access), with the ACL to grant
            logger.info(
                "Could not read INFO from Redis at %s (%s): its version and memory are not"
                " checked for the Bloom filter %r.",
                server.address,
                server.why_unknown,
                key,
            )
            continue
        if server.policy in EVICTING_POLICIES or (expiring and server.policy in VOLATILE_POLICIES):
            evicting += 1
            logger.warning(
                "Redis at %s has maxmemory-policy %s: when it reaches maxmemory it may evict"
                " the Bloom filter %r's shards. A lost shard stops the crawl"
                " (BLOOMFILTER_ON_LOSS = 'raise') or is recreated empty, forgetting the URLs"
                " it held ('recreate'). Use noeviction%s for this Redis.",
                server.address,
                server.policy,
                key,
                " (its bits expire, BLOOMFILTER_TTL, so volatile-* policies evict them too)"
                if expiring
                else " or a volatile-* policy",
            )
        if server.maxmemory and server.used_memory > NEARLY_FULL * server.maxmemory:
            logger.warning(
                "Redis at %s is nearly full: %s used of maxmemory %s. Under %s it will %s.",
                server.address,
                format_bytes(server.used_memory),
                format_bytes(server.maxmemory),
                server.policy or "its policy",
                "evict keys"
                if server.policy != "noeviction"
                else "refuse writes, and the Bloom filter's checks will fail",
            )
    return evicting


def short_of_room(
    key: str, address: str, info: dict[str, str], needs: list[tuple[int, int]]
) -> str:
    """Return the warning for a server the filter's growth takes past maxmemory, or "".

    ``info``: the server's ``INFO memory`` fields; ``needs``: per generation about to be
    started on it (the one a shard just started first), the bytes its shards there take.
    """
    used, limit = int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))
    if not limit or used + sum(need for _, need in needs) <= limit:
        return ""
    policy = info.get("maxmemory_policy", "")
    effect = (
        "refuses writes: the filter's checks fail (BLOOMFILTER_ON_ERROR), and a scrapy-redis"
        " queue in the same Redis loses the requests it cannot push"
        if policy == "noeviction"
        else f"evicts keys (maxmemory-policy {policy or '?'}): the filter's parts"
        " (BLOOMFILTER_ON_LOSS) or a scrapy-redis queue's requests"
    )
    steps = " and ".join(f"{format_bytes(need)} as they start generation {g}" for g, need in needs)
    return (
        f"Redis at {address} has {format_bytes(used)} used of maxmemory {format_bytes(limit)},"
        f" and the Bloom filter {key!r} grows: its shards there take up to {steps}, which passes"
        f" maxmemory. Redis then {effect}. Give Redis more memory, or the filter a Redis of its"
        " own (BLOOMFILTER_REDIS_URL); size the next crawl's filter larger"
        " (BLOOMFILTER_CAPACITY)."
    )
