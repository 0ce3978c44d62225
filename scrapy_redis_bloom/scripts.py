"""Lua scripts run by Redis: atomic check-and-add, shard allocation, leases, the record.

A script runs atomically, so the check and the add of one element cannot interleave
with another worker's: of any number of workers offering the same element, exactly
one is told it is new. Each element's bits live in one shard key, so a call touches
one key (one Redis Cluster slot).

The hot-path script computes the k offsets on the server from ``(x, y)`` by the
enhanced double hashing of :mod:`.hashing` (Lua numbers are doubles, exact for these
values below 2**33), so a request sends two numbers, not k offsets. The bulk path
sends the offsets in BITFIELD commands instead (see the engine): Lua costs ~1 µs per
``redis.call``, BITFIELD ~0.2 µs per bit.
"""

from __future__ import annotations

#: Allocate a missing shard whole, at its exact size: a string grown bit by bit
#: through SETBIT or BITFIELD gets Redis's greedy preallocation instead (up to twice
#: the size). ``KEYS[1]`` the shard; ``ARGV[1]`` its last byte's index. Reply: 1 if
#: this call allocated it, else 0.
ALLOCATE = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('SETRANGE', KEYS[1], ARGV[1], string.char(0))
  return 1
end
return 0
"""


def check_and_add_one(hash_count: int, shard_bits: int) -> str:
    """Return the hot-path script for one element, with k and S written in.

    ``KEYS``: the shard; ``ARGV``: x, y. Reply: an integer, 1 if every bit was
    already set (seen), plus 2 if this call allocated the shard. Baking k and S in
    keeps the call to six arguments and the reply to one integer; the caller counts
    the outcome locally and adds it to the counters in Redis in batches.
    """
    return f"""
local key = KEYS[1]
local s = {shard_bits}
local created = 0
if redis.call('EXISTS', key) == 0 then
  redis.call('SETRANGE', key, {(shard_bits + 7) // 8 - 1}, string.char(0))
  created = 2
end
local x, y = tonumber(ARGV[1]), tonumber(ARGV[2])
local all = 1
if redis.call('SETBIT', key, x, '1') == 0 then all = 0 end
for i = 1, {hash_count - 1} do
  x = (x + y) % s
  y = (y + i) % s
  if redis.call('SETBIT', key, x, '1') == 0 then all = 0 end
end
return all + created
"""


#: The worker registry, a sorted set of worker ids scored by lease expiry (ms, server
#: clock). ``KEYS[1]`` the registry; ``ARGV`` worker id, TTL in ms, and ``renew``,
#: ``release`` or ``count``. Expired leases are dropped first. Reply: the number of
#: OTHER live workers. The registry itself expires when no worker renews it.
LEASE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ARGV[3] == 'renew' then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], 2 * ttl)
elseif ARGV[3] == 'release' then
  redis.call('ZREM', KEYS[1], ARGV[1])
end
local others = redis.call('ZCARD', KEYS[1])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then others = others - 1 end
return others
"""

#: The ids of the live workers in the registry (leases not yet expired by the server
#: clock of the node holding it), soonest expiry first. ``KEYS[1]`` the registry.
LIVE_WORKERS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
"""

#: Write the config record unless one exists; reply with the record in Redis.
#: ``KEYS[1]`` the record key; ``ARGV`` field, value pairs, or none to only read it
#: (an empty reply then means there is no filter).
CREATE_RECORD = """
if #ARGV > 0 and redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV))
end
return redis.call('HGETALL', KEYS[1])
"""
