"""The engine: a Bloom filter in Redis, knowing nothing of Scrapy.

:mod:`.backend` chooses the backend: :mod:`.bitmap` (bits in Redis strings) or
:mod:`.native` (``BF.*``). Both build on :mod:`.base` (the filter's shared
bookkeeping: near-cache, replies owed, outage accounting, counters), with
:mod:`.lifecycle` (open, create, verify, recover, clear), :mod:`.parts` (the record,
shards and markers in Redis), :mod:`.scripts` (the Lua), :mod:`.counters`,
:mod:`.state` (fill and memory), :mod:`.lease` (worker leases), :mod:`.cache`, and the
server checks of :mod:`.health` and :mod:`.access`.

Import the public names from the package root (``scrapy_redis_bloom``).
"""
