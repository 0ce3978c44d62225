"""Lua scripts run by Redis: atomic check-and-add, membership test, record creation.

A script runs atomically, so the check and the add of one element cannot interleave
with another worker's: of any number of workers offering the same element, exactly
one is told it is new. Each element's bits live in one shard key, so a call touches
one key (one Redis Cluster slot).

The server computes the k offsets from ``(x, y)`` by the enhanced double hashing of
:mod:`.hashing` (Lua numbers are doubles, exact for these values below 2**33).
Arguments: ``KEYS[1]`` the shard key; ``ARGV`` = k, shard bits, then one
``(x, y)`` pair per element, all for that shard. Reply: one 0/1 per element, then
1 if this call allocated the shard (so the caller can restore a cleared record).
"""

from __future__ import annotations

# For each (x, y) pair: visit the k offsets (enhanced double hashing), apply BIT_OP to
# each and note whether every bit was already 1. The prologue defines `key`, `created`.
_ELEMENT_LOOP = """
local k, s = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
local seen = 0
for e = 3, #ARGV, 2 do
  local x, y = tonumber(ARGV[e]), tonumber(ARGV[e + 1])
  local all = 1
  if BIT_OP(x) == 0 then all = 0 end
  for i = 1, k - 1 do
    x = (x + y) % s
    y = (y + i) % s
    if BIT_OP(x) == 0 then all = 0 end
  end
  out[#out + 1] = all
  seen = seen + all
end
"""

_REPLY = """
out[#out + 1] = created
return out
"""


def _element_script(prologue: str, bit_op: str, epilogue: str = "") -> str:
    return prologue + _ELEMENT_LOOP.replace("BIT_OP(x)", bit_op) + epilogue + _REPLY


#: Set each element's k bits; reply 1 where all were already set (seen), 0 if new.
#: ``KEYS[2]`` is the shard's counter hash (same hash slot): its ``added`` and
#: ``seen`` fields total the calls' outcomes over all workers.
#: A missing shard is first allocated whole, at its exact size: a string grown bit
#: by bit through SETBIT gets Redis's greedy preallocation instead.
CHECK_AND_ADD = _element_script(
    """
local key = KEYS[1]
local created = 0
if redis.call('EXISTS', key) == 0 then
  redis.call('SETRANGE', key, math.floor((tonumber(ARGV[2]) + 7) / 8) - 1, string.char(0))
  created = 1
end""",
    # '1' as a string: each Lua number passed to Redis costs a number-to-string conversion.
    "redis.call('SETBIT', key, x, '1')",
    """
if seen > 0 then redis.call('HINCRBY', KEYS[2], 'seen', seen) end
if #out > seen then redis.call('HINCRBY', KEYS[2], 'added', #out - seen) end""",
)

#: Read each element's k bits; reply 1 where all are set (probably present).
CONTAINS = _element_script(
    """
local key = KEYS[1]
local created = 0""",
    "redis.call('GETBIT', key, x)",
)


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
