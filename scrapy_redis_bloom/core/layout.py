"""Where a filter lives in Redis: key names and the shard header (layout 2).

Every shard is allocated whole behind a header naming the filter's id and the shard, so one
missing or naming another filter was lost, never mistaken for an empty one. Shard ``i`` of
n servers lives on server ``i mod n``; the record, the counters and the registry on server 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Version of the key layout and record format above.
LAYOUT_VERSION = 2

#: Bytes at the start of every shard before its bits: magic ``SRB``, layout (1 byte),
#: filter id (16), shard index (4, big-endian), hash functions k (2), then zeros.
HEADER_BYTES = 32
HEADER_BITS = HEADER_BYTES * 8
#: The part of the header that identifies the shard: magic to k.
IDENTITY_BYTES = 26
#: Bytes of a filter id.
ID_BYTES = 16
#: The Redis type of a native shard or re-crawl window: a RedisBloom Bloom filter (``BF.*``).
NATIVE_TYPE = "MBbloom--"
_MAGIC = b"SRB" + bytes([LAYOUT_VERSION])


def meta_key(key: str) -> str:
    """Return the key of the filter's config record."""
    return f"{key}:meta"


def shard_key(key: str, shard: int, generation: int = 0) -> str:
    """Return the key of one shard's bitmap."""
    return f"{{{key}:{shard}}}:g{generation}"


def counter_key(key: str) -> str:
    """Return the key of the filter's counters."""
    return f"{key}:count"


def workers_key(key: str) -> str:
    """Return the key of the registry of live workers' leases."""
    return f"{key}:workers"


def server_key(key: str) -> str:
    """Return the key that records a server's place in a multi-server filter."""
    return f"{key}:server"


def server_marker(filter_id: str, server: int, servers: int) -> str:
    """Return what ``KEY:server`` holds on server ``server`` of ``servers``."""
    return f"{filter_id} {server}/{servers}"


def identity(filter_id: str, shard: int, hash_count: int) -> bytes:
    """Return the bytes a shard's header starts with: what the scripts compare."""
    raw = bytes.fromhex(filter_id)
    if len(raw) != ID_BYTES:
        raise ValueError(f"a filter id is {ID_BYTES} bytes as hex, got {filter_id!r}")
    return _MAGIC + raw + shard.to_bytes(4, "big") + hash_count.to_bytes(2, "big")


_MARKER = re.compile(rf"([0-9a-f]{{{2 * ID_BYTES}}}) ([0-9]{{1,9}})/([0-9]{{1,9}})")


def parse_marker(value: str) -> tuple[str, int, int] | None:
    """Read a server marker ``<id> <i>/<n>``: (filter id, i, n); None if ``value`` is not one."""
    found = _MARKER.fullmatch(value)
    if found is None or int(found.group(2)) >= int(found.group(3)):
        return None
    return found.group(1), int(found.group(2)), int(found.group(3))


def header(filter_id: str, shard: int, hash_count: int, state: bytes = b"") -> bytes:
    """Return the whole header every shard of the filter starts with (``state``: its first)."""
    rest = HEADER_BYTES - IDENTITY_BYTES
    if len(state) > rest:
        raise ValueError(f"a header's state is {rest} bytes at most, got {len(state)}")
    return identity(filter_id, shard, hash_count) + state + bytes(rest - len(state))


@dataclass(frozen=True, slots=True)
class Identity:
    """A shard header read back: which filter, which shard, how many hash functions."""

    filter_id: str
    shard: int
    hash_count: int

    @classmethod
    def parse(cls, found: bytes) -> Identity | None:
        """Read a header's identity; None if ``found`` is not a layout-2 shard header."""
        if len(found) != IDENTITY_BYTES or found[:4] != _MAGIC:
            return None
        return cls(
            filter_id=found[4 : 4 + ID_BYTES].hex(),
            shard=int.from_bytes(found[4 + ID_BYTES : 8 + ID_BYTES], "big"),
            hash_count=int.from_bytes(found[8 + ID_BYTES :], "big"),
        )


def describe_identity(found: bytes, filter_id: str, shard: int) -> str:
    """Say what a shard key's first :data:`IDENTITY_BYTES` bytes are, for a message."""
    if not found:
        return "missing"
    parsed = Identity.parse(found)
    if parsed is not None:
        if parsed.filter_id != filter_id:
            return f"shard {parsed.shard} of another filter (id {parsed.filter_id})"
        if parsed.shard != shard:
            return f"this filter's shard {parsed.shard}, not {shard}"
        return f"this filter's shard {shard}, but with k={parsed.hash_count}"
    if not found.strip(b"\0"):
        return "a bitmap without a header (bits written after the shard was lost)"
    return "data that is not a Bloom filter shard"
