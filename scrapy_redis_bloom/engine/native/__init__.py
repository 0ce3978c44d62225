"""The native backend: each shard a server-side Bloom filter (RedisBloom's or Valkey's ``BF.*``).

:mod:`.filter` is :class:`~.filter.NativeBloomFilter`; :mod:`.parts` its shards in
Redis; :mod:`.ttl` its re-crawl windows.
"""
