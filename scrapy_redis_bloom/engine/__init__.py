"""The Redis engine: the Bloom filter in sharded Redis bitmaps, knowing nothing of Scrapy.

Modules, from the wire up:

* :mod:`.wire`: Redis commands packed by hand (RESP);
* :mod:`.node`: one server's connection, every reply matched to its command;
* :mod:`.topology`: which server holds which key (server lists, Redis Cluster);
* :mod:`.executor`: runs commands under the retry policy; tells which answers to trust;
* :mod:`.layout`, :mod:`.record`, :mod:`.scripts`: key names and shard headers, the
  config record, the Lua scripts;
* :mod:`.parts`: reading and writing the record, shards and markers;
* :mod:`.health`: server version and memory checks;
* :mod:`.lifecycle`: opening, creating, verifying, recovering and clearing a filter;
* :mod:`.bulk`: ``add_many`` / ``contains_many``;
* :mod:`.counters`, :mod:`.state`, :mod:`.lease`, :mod:`.cache`, :mod:`.events`:
  totals and the capacity warning, fill and memory, worker leases, the near-cache,
  what happened;
* :mod:`.filter`: :class:`~.filter.RedisBloomFilter`, the facade over all of them.

Import the public names from the package root (``scrapy_redis_bloom``).
"""
