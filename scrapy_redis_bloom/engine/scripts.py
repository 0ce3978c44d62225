"""Lua scripts run by Redis: atomic check-and-add, shard allocation, leases, the record.

A script runs atomically, so the check and the add of one element cannot interleave
with another worker's: of any number of workers offering the same element, exactly
one is told it is new. Each element's bits live in one shard key, so a call touches
one key (one Redis Cluster slot).

Every script that writes bits first compares the shard's header with the identity
the caller expects (filter id and shard index, see :mod:`.layout`) and writes
nothing when they differ: a lost or foreign shard is reported, never written to.

Scripts are called by SHA (``EVALSHA``) and loaded on a ``NOSCRIPT`` reply by the
executor (:mod:`.executor`), on whichever node answered so.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from .layout import HEADER_BITS, IDENTITY_BYTES


@dataclass(frozen=True)
class Script:
    """A Lua script and its SHA1, as ``EVALSHA`` names it."""

    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


#: Reply of the check-and-add scripts when the shard's header is not the expected one.
MISMATCH = 2


def check_and_add(hash_count: int, shard_bits: int) -> Script:
    """Return the hot-path script for one element, with k and S written in.

    ``KEYS[1]``: the shard; ``ARGV``: the shard's identity, x, y. Reply: 1 if every
    bit was already set (seen), 0 if not (they are now), :data:`MISMATCH` if the
    shard is missing or not this filter's (nothing written). The k offsets come
    from (x, y) by the enhanced double hashing of :mod:`..hashing` (Lua numbers are
    doubles, exact for these values below 2**53).
    """
    return Script(f"""
local key = KEYS[1]
if redis.call('GETRANGE', key, 0, {IDENTITY_BYTES - 1}) ~= ARGV[1] then return {MISMATCH} end
local s = {shard_bits}
local x, y = tonumber(ARGV[2]), tonumber(ARGV[3])
local all = 1
if redis.call('SETBIT', key, {HEADER_BITS} + x, '1') == 0 then all = 0 end
for i = 1, {hash_count - 1} do
  x = (x + y) % s
  y = (y + i) % s
  if redis.call('SETBIT', key, {HEADER_BITS} + x, '1') == 0 then all = 0 end
end
return all
""")


#: Allocate a shard whole, at its exact size, with its header: a string grown bit by
#: bit through SETBIT or BITFIELD gets Redis's greedy preallocation instead (up to
#: twice the size). ``KEYS[1]`` the shard; ``ARGV`` its header, its last byte's index,
#: and ``create`` or ``replace`` (delete whatever is there first). Reply: 0 if the
#: shard is there with this identity, 1 if this call allocated it, -1 if the key
#: holds something else (``create`` leaves it alone).
ALLOCATE = Script(f"""
local key = KEYS[1]
if redis.call('GETRANGE', key, 0, {IDENTITY_BYTES - 1}) == string.sub(ARGV[1], 1, {IDENTITY_BYTES})
then return 0 end
if redis.call('EXISTS', key) == 1 then
  if ARGV[3] ~= 'replace' then return -1 end
  redis.call('DEL', key)
end
redis.call('SETRANGE', key, ARGV[2], string.char(0))
redis.call('SETRANGE', key, 0, ARGV[1])
return 1
""")

#: The worker registry, a sorted set of worker ids scored by lease expiry (ms, server
#: clock). ``KEYS[1]`` the registry; ``ARGV`` worker id, TTL in ms, and ``renew``,
#: ``release``, ``count`` or ``list``. Expired leases are dropped first. Reply: the
#: number of OTHER live workers, or with ``list`` the ids of all live workers, soonest
#: expiry first. The registry expires when no worker renews it; a renewal only ever
#: extends that expiry, so a worker with a short TTL cannot cut another's lease.
LEASE = Script("""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
if ARGV[3] == 'list' then
  return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ARGV[3] == 'renew' then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  if redis.call('PTTL', KEYS[1]) < 2 * ttl then redis.call('PEXPIRE', KEYS[1], 2 * ttl) end
elseif ARGV[3] == 'release' then
  redis.call('ZREM', KEYS[1], ARGV[1])
end
local others = redis.call('ZCARD', KEYS[1])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then others = others - 1 end
return others
""")

#: Delete ``KEYS[1]`` only if it is still the filter's part it was proven to be; reply 1
#: if deleted, 0 if it is something else (left alone). ``ARGV``: the kind of part and the
#: proof: a shard's identity, a server marker's value, the record's id (or empty for a
#: record this version cannot read: then only a hash with ``layout`` and ``scheme``).
DELETE_IF_STILL = Script(f"""
local key, kind, proof = KEYS[1], ARGV[1], ARGV[2]
local found = redis.call('TYPE', key)['ok']
if kind == 'shard' then
  if found ~= 'string' or redis.call('GETRANGE', key, 0, {IDENTITY_BYTES - 1}) ~= proof
  then return 0 end
elseif kind == 'marker' then
  if found ~= 'string' or redis.call('GET', key) ~= proof then return 0 end
elseif kind == 'counters' then
  if found ~= 'hash' then return 0 end
  for _, field in ipairs(redis.call('HKEYS', key)) do
    if field ~= 'added' and field ~= 'seen' then return 0 end
  end
elseif kind == 'record' then
  if found ~= 'hash' then return 0 end
  if proof ~= '' then
    if redis.call('HGET', key, 'id') ~= proof then return 0 end
  elseif redis.call('HEXISTS', key, 'layout') == 0 or redis.call('HEXISTS', key, 'scheme') == 0
  then return 0 end
else
  return 0
end
return redis.call('UNLINK', key)
""")

#: Write the config record unless one exists; reply with the record in Redis.
#: ``KEYS[1]`` the record key; ``ARGV`` field, value pairs, or none to only read it
#: (an empty reply then means there is no filter).
CREATE_RECORD = Script("""
if #ARGV > 0 and redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV))
end
return redis.call('HGETALL', KEYS[1])
""")
