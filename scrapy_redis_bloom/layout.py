"""Where a filter lives in Redis: key names and the fields of its config record.

A filter named ``KEY`` (the ``BLOOMFILTER_KEY`` setting, ``%(spider)s`` filled in) is:

* ``KEY:meta``, a hash: the config record (:data:`RECORD_FIELDS`), written once
  when the filter is created and checked by every worker that opens it;
* ``KEY:g<generation>:<shard>``, strings: the bitmaps, one per shard, each at most
  2**32 bits. Layout 1 has generation 0 only. Growth generations (a scalable
  filter) and time windows (re-crawl after a TTL) get further generation ids, listed
  in the record's ``generations`` field, so they fit beside existing data without
  migrating it;
* ``{KEY:g<generation>:<shard>}:count``, hashes: per shard, how many elements were
  ``added`` and how many check-and-adds found theirs already ``seen``, over all
  workers. The hash tag is the shard key's name, so a counter sits in its shard's
  Redis Cluster slot and one script call updates both;
* ``KEY:workers``, a sorted set: the live workers' leases (see :mod:`.scripts`);
* ``KEY:server``, a string on each server of a multi-server filter: ``i/n``, this
  server's place in the server list the filter was created with.

With several standalone servers, shard ``i`` and its counter live on server
``i mod n``; the record, the registry and server 0's marker live on server 0.
Shard keys carry no ``{hash tag}``: Redis Cluster spreads them over its slots and
hence over its masters, while each element still touches exactly one slot.
"""

from __future__ import annotations

#: Version of the key layout and record format below.
LAYOUT_VERSION = 1

#: Fields of the config record, in the order they are written. Which of them every
#: worker must agree on is :meth:`.engine.FilterRecord.geometry`.
RECORD_FIELDS = (
    "layout", "scheme", "shards", "shard_bits", "hash_count", "servers",
    "bits", "capacity", "generations", "created",
)  # fmt: skip


def meta_key(key: str) -> str:
    """Return the key of the filter's config record."""
    return f"{key}:meta"


def shard_key(key: str, shard: int, generation: int = 0) -> str:
    """Return the key of one shard's bitmap."""
    return f"{key}:g{generation}:{shard}"


def shard_keys(key: str, shards: int, generation: int = 0) -> list[str]:
    """Return the keys of all shards of one generation, in shard order."""
    return [shard_key(key, shard, generation) for shard in range(shards)]


def counter_key(shard_key_name: str) -> str:
    """Return the key of a shard's counters: same Redis Cluster slot as the shard."""
    return f"{{{shard_key_name}}}:count"


def workers_key(key: str) -> str:
    """Return the key of the registry of live workers' leases."""
    return f"{key}:workers"


def server_key(key: str) -> str:
    """Return the key that records a server's place in a multi-server filter."""
    return f"{key}:server"


#: Bytes a Redis string needs beyond its payload: the sds header (at most 9 bytes
#: below 4 GiB) and a NUL, rounded up.
STRING_OVERHEAD = 16


def allocation(size: int) -> int:
    """Return the bytes jemalloc (Redis's allocator) reserves for a ``size``-byte block.

    jemalloc rounds a request up to a size class: 16-byte steps up to 128 bytes, then
    four classes per doubling (160, 192, 224, 256, 320, ...). A string one byte past a
    class costs the next one: an 8 MiB bitmap plus its header takes a 10 MiB block.
    """
    if size <= 128:
        return max(16, -(-size // 16) * 16)
    step = 1 << ((size - 1).bit_length() - 3)
    return -(-size // step) * step


def allocation_classes(limit: int) -> list[int]:
    """Return jemalloc's size classes from ``limit / 64`` up to ``limit``, largest first."""
    classes = list(range(16, 129, 16))
    group = 128
    while group < limit:
        classes += [group + group // 4 * j for j in range(1, 5)]
        group *= 2
    return [size for size in reversed(classes) if limit // 64 <= size <= limit]
