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
end
out[#out + 1] = created
return out
"""


def _element_script(prologue: str, bit_op: str) -> str:
    return prologue + _ELEMENT_LOOP.replace("BIT_OP(x)", bit_op)


#: Set each element's k bits; reply 1 where all were already set (seen), 0 if new.
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
    "redis.call('SETBIT', key, x, 1)",
)

#: Read each element's k bits; reply 1 where all are set (probably present).
CONTAINS = _element_script(
    """
local key = KEYS[1]
local created = 0""",
    "redis.call('GETBIT', key, x)",
)

#: Write the config record unless one exists; reply with the record in Redis.
#: ``KEYS[1]`` the record key; ``ARGV`` field, value pairs, or none to only read it
#: (an empty reply then means there is no filter).
CREATE_RECORD = """
if #ARGV > 0 and redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV))
end
return redis.call('HGETALL', KEYS[1])
"""
