"""The bitmap backend: the filter's bits in Redis strings, set by Lua or by ``BITFIELD``.

:mod:`.filter` is :class:`~.filter.RedisBloomFilter`; :mod:`.fastpath` the hot path
without a script; :mod:`.bulk` ``add_many`` / ``contains_many``, with
:mod:`.snapshot` (a shard's bytes read, answered in Python by :mod:`.local`, written back).
"""
