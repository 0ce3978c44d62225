"""Checks at open that Redis's ACL lets the filter's user do everything the filter does.

Else a missing permission fails late and opaquely (a Lua error, mid-crawl). ``NOPERM`` comes
before any other reply, so any other means allowed (docs/howto/tls-acl.md#least-privilege).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisClusterException, RedisError

from scrapy_redis_bloom.core.errors import AccessDeniedError, FilterUnavailableError
from scrapy_redis_bloom.transport.executor import Call, Executor, acl_denial
from scrapy_redis_bloom.transport.topology import Cluster, ServerList, Topology
from scrapy_redis_bloom.transport.wire import Arg, Script, pack_command

logger = logging.getLogger(__name__)

#: The script the probe loads and calls by SHA: does nothing, touches nothing.
PROBE_SCRIPT = Script("return 1")
#: Milliseconds a probe key may outlive a probe that could not delete it.
PROBE_TTL_MS = 60_000
#: Suffixes tried per Redis Cluster master to find probe keys in its slots, at most.
MAX_SUFFIXES = 65_536

#: What the filter keeps under each key family, for messages.
RECORD_ROLE = "its record, counters, worker registry and server markers"
SHARD_ROLE = "its shards"


@dataclass(frozen=True, slots=True)
class Probe:
    """A command (its ACL name) sent on a probe key (``keyed`` false: only routed by it)."""

    command: str
    argv: tuple[Arg, ...]
    key: str
    keyed: bool = True


def probe_keys(key: str, suffix: int = 0) -> tuple[str, str]:
    """Return ``KEY:acl-probe`` and ``{KEY:acl-probe}:g0`` (``suffix`` moves their slots)."""
    name = "acl-probe" if suffix == 0 else f"acl-probe-{suffix}"
    return f"{key}:{name}", f"{{{key}:{name}}}:g0"


def probes(record: str, shard: str) -> list[Probe]:
    """Return the commands that check every permission the filter needs, in sending order."""
    ttl = PROBE_TTL_MS
    return [
        # The shards' family: what the hot path, bulk, allocation and figures send.
        Probe("unlink", (b"UNLINK", shard), shard),  # deleted first (a probe cut short) and last
        Probe("getrange", (b"GETRANGE", shard, 0, 25), shard),
        Probe("exists", (b"EXISTS", shard), shard),
        Probe("strlen", (b"STRLEN", shard), shard),
        Probe("type", (b"TYPE", shard), shard),
        Probe("setrange", (b"SETRANGE", shard, 0, b"acl-probe"), shard),
        Probe("pexpire", (b"PEXPIRE", shard, ttl), shard),
        Probe("setbit", (b"SETBIT", shard, 320, 1), shard),
        Probe("getbit", (b"GETBIT", shard, 320), shard),
        Probe("expireat", (b"EXPIREAT", shard, 4_000_000_000), shard),
        Probe("bitfield", (b"BITFIELD", shard, b"SET", b"u1", 321, 1), shard),
        Probe("bitfield_ro", (b"BITFIELD_RO", shard, b"GET", b"u1", 321), shard),
        Probe("bitcount", (b"BITCOUNT", shard, 0, -1), shard),
        Probe("memory|usage", (b"MEMORY", b"USAGE", shard), shard),
        Probe("script|load", (b"SCRIPT", b"LOAD", PROBE_SCRIPT.source), shard, keyed=False),
        Probe("evalsha", (b"EVALSHA", PROBE_SCRIPT.sha, 1, shard), shard),
        Probe("del", (b"DEL", shard), shard),
        Probe("unlink", (b"UNLINK", shard), shard),
        # The record's family: the record and counters (hashes), then as a sorted set
        # (the worker registry), then as a string (a server marker).
        Probe("unlink", (b"UNLINK", record), record),
        Probe("hgetall", (b"HGETALL", record), record),
        Probe("hmget", (b"HMGET", record, b"added", b"seen"), record),
        Probe("hget", (b"HGET", record, b"id"), record),
        Probe("hexists", (b"HEXISTS", record, b"layout"), record),
        Probe("hkeys", (b"HKEYS", record), record),
        Probe("hset", (b"HSET", record, b"state", b"acl-probe"), record),
        Probe("pexpire", (b"PEXPIRE", record, ttl), record),
        Probe("hincrby", (b"HINCRBY", record, b"added", 0), record),
        Probe("type", (b"TYPE", record), record),
        Probe("exists", (b"EXISTS", record), record),
        Probe("script|load", (b"SCRIPT", b"LOAD", PROBE_SCRIPT.source), record, keyed=False),
        Probe("evalsha", (b"EVALSHA", PROBE_SCRIPT.sha, 1, record), record),
        Probe("unlink", (b"UNLINK", record), record),
        Probe("zadd", (b"ZADD", record, 0, b"acl-probe"), record),
        Probe("zrangebyscore", (b"ZRANGEBYSCORE", record, b"-inf", b"+inf"), record),
        Probe("zremrangebyscore", (b"ZREMRANGEBYSCORE", record, b"-inf", b"(0"), record),
        Probe("zscore", (b"ZSCORE", record, b"acl-probe"), record),
        Probe("zrange", (b"ZRANGE", record, 0, -1), record),
        Probe("zrem", (b"ZREM", record, b"acl-probe"), record),
        Probe("set", (b"SET", record, b"acl-probe", b"NX", b"PX", ttl), record),
        Probe("get", (b"GET", record), record),
        Probe("unlink", (b"UNLINK", record), record),
        # No key: the lease script's clock, and the checks at open (optional).
        Probe("time", (b"TIME",), record, keyed=False),
        Probe("info", (b"INFO", b"server"), record, keyed=False),
    ]


@dataclass
class _Target:
    """One server to probe: where it is, how calls reach it, what it refused."""

    address: str
    server: int | None  # a server list's index; None on a cluster (routed by key)
    record: str
    shard: str
    user: str
    commands: dict[str, None] = field(default_factory=dict)  # ordered set
    families: dict[str, None] = field(default_factory=dict)


def check_access(executor: Executor, topology: Topology, key: str) -> None:
    """Refuse (AccessDeniedError, naming the grants per server) a user the filter's ACL fails."""
    targets = _targets(topology, key)
    sent = [(target, probe) for target in targets for probe in probes(target.record, target.shard)]
    calls = [Call(pack_command(*probe.argv), key=probe.key, server=t.server) for t, probe in sent]
    try:  # once: retries would stop opening on a server out of memory, where reads work
        replies = executor.run(
            "check the Redis user's permissions", calls, write=True, timeout=0
        ).replies
    except FilterUnavailableError as exc:
        logger.info(
            "Could not check the Redis ACL permissions of the Bloom filter %r: %s", key, exc
        )
        return
    for (target, probe), reply in zip(sent, replies, strict=True):
        kind = acl_denial(reply)
        if kind is None:
            continue
        if probe.command == "info":  # the filter can do without it (one per server, in order)
            logger.info(
                "Redis at %s does not let its user run INFO (%s): the Bloom filter %r is"
                " used without the checks of the server's version and memory. Grant +info"
                " for them (docs/howto/tls-acl.md#least-privilege).",
                target.address,
                reply,
                key,
            )
        elif kind == "key" and probe.keyed:
            family = f"~{{{key}:*" if probe.key == target.shard else f"~{key}*"
            target.families[family] = None
        else:
            target.commands[probe.command] = None
    refused = [t for t in targets if t.commands or t.families]
    if refused:
        raise _error(key, refused)
    logger.debug(
        "Redis at %s lets its user run every command the Bloom filter %r needs.",
        ", ".join(t.address for t in targets),
        key,
    )


def users(topology: Topology) -> list[str]:
    """Return the Redis users the filter's clients log in as, each once."""
    return list(dict.fromkeys(_users(topology)))


def _users(topology: Topology) -> list[str]:
    """Return the Redis user of each client (a cluster's one)."""
    if isinstance(topology, Cluster):
        return [_user(getattr(topology.client.nodes_manager, "connection_kwargs", {}))]
    clients = topology.clients if isinstance(topology, ServerList) else ()
    return [_user(client.connection_pool.connection_kwargs) for client in clients]


def _targets(topology: Topology, key: str) -> list[_Target]:
    """Return the servers to probe, each with probe keys that reach it."""
    users = _users(topology)
    if isinstance(topology, Cluster):
        found = []
        for node in topology.primaries():
            record = _on(topology, node.address, lambda n: probe_keys(key, n)[0])
            shard = _on(topology, node.address, lambda n: probe_keys(key, n)[1])
            if record is not None and shard is not None:
                found.append(_Target(node.address, None, record, shard, users[0]))
        return found
    record, shard = probe_keys(key)
    return [
        _Target(node.address, i, record, shard, users[i] if i < len(users) else "")
        for i, node in enumerate(topology.primaries())
    ]


def _on(topology: Topology, address: str, name: Callable[[int], str]) -> str | None:
    """Return the first key ``name(0)``, ``name(1)``... the cluster node ``address`` holds."""
    for suffix in range(MAX_SUFFIXES):
        candidate = name(suffix)
        try:
            if topology.route(candidate, None, None).address == address:
                return candidate
        except (RedisError, RedisClusterException, ValueError):
            return None
    return None


def _user(connection_kwargs: Any) -> str:
    """Return the Redis user a client logs in as (``default`` without a username)."""
    username = connection_kwargs.get("username") if isinstance(connection_kwargs, dict) else None
    return str(username) if username else "default"


def _error(key: str, refused: list[_Target]) -> AccessDeniedError:
    """Return one error naming, per group of servers refusing the same, what to grant."""
    groups: dict[tuple[tuple[str, ...], tuple[str, ...], str], list[str]] = {}
    for target in refused:
        what = (tuple(target.commands), tuple(target.families), target.user)
        groups.setdefault(what, []).append(target.address)
    sentences = []
    for (commands, families, user), addresses in groups.items():
        named = []
        if commands:
            noun = "command" if len(commands) == 1 else "commands"
            named.append(f"the {noun} {', '.join(commands)}")
        if families:
            roles = [
                f"{family} ({SHARD_ROLE if family.startswith('~{') else RECORD_ROLE})"
                for family in families
            ]
            named.append(f"the keys {' and '.join(roles)}")
        grant = " ".join([*(f"+{command}" for command in commands), *families])
        sentences.append(
            f"Redis at {', '.join(addresses)} refuses the Bloom filter {key!r}"
            f" {' and '.join(named)}: its Redis user {user!r} lacks these ACL permissions."
            f" Grant them: ACL SETUSER {user} {grant}."
        )
    return AccessDeniedError(
        " ".join(sentences) + " See docs/howto/tls-acl.md#least-privilege.",
        server="Redis at " + ", ".join(t.address for t in refused),
        commands=tuple(dict.fromkeys(c for t in refused for c in t.commands)),
        keys=tuple(dict.fromkeys(f for t in refused for f in t.families)),
    )
