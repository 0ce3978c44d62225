"""Where a filter lives in Redis: key names and the fields of its config record.

A filter named ``KEY`` (the ``BLOOMFILTER_KEY`` setting, ``%(spider)s`` filled in) is:

* ``KEY:meta``, a hash: the config record (:data:`RECORD_FIELDS`), written once
  when the filter is created and checked by every worker that opens it;
* ``KEY:g<generation>:<shard>``, strings: the bitmaps, one per shard, each at most
  2**32 bits. Layout 1 has generation 0 only. Growth generations (a scalable
  filter) and time windows (re-crawl after a TTL) get further generation ids, listed
  in the record's ``generations`` field, so they fit beside existing data without
  migrating it.

Shard keys carry no ``{hash tag}``: Redis Cluster spreads them over its slots and
hence over its masters, while each element still touches exactly one key.
"""

from __future__ import annotations

#: Version of the key layout and record format below.
LAYOUT_VERSION = 1

#: Fields of the config record that every worker must agree on.
GEOMETRY_FIELDS = ("layout", "scheme", "shards", "shard_bits", "hash_count")

#: All fields of the config record, in the order they are written.
RECORD_FIELDS = (*GEOMETRY_FIELDS, "bits", "capacity", "generations", "created")


def meta_key(key: str) -> str:
    """Return the key of the filter's config record."""
    return f"{key}:meta"


def shard_key(key: str, shard: int, generation: int = 0) -> str:
    """Return the key of one shard's bitmap."""
    return f"{key}:g{generation}:{shard}"


def shard_keys(key: str, shards: int, generation: int = 0) -> list[str]:
    """Return the keys of all shards of one generation, in shard order."""
    return [shard_key(key, shard, generation) for shard in range(shards)]
