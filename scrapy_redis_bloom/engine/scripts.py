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

from scrapy_redis_bloom.core.generations import Growth
from scrapy_redis_bloom.core.layout import HEADER_BITS, HEADER_BYTES, IDENTITY_BYTES
from scrapy_redis_bloom.transport.wire import Script

#: Reply of the check-and-add scripts when the shard's header is not the expected one.
MISMATCH = 2


#: Flags in a check-and-add reply (its second item): this call started a generation;
#: a shard is past its last generation's capacity (it cannot grow further); a lost
#: generation or window was recreated empty (``BLOOMFILTER_ON_LOSS = "recreate"``).
GREW, FULL, RECREATED = 1, 2, 4


def check_and_add(growth: Growth, one: bool = False) -> Script:
    """Return the script that checks (and adds) elements of one shard, for a geometry.

    ``one``: the hot path's script, for exactly one element: it sets the bits of the
    newest generation with ``SETBIT`` (k cheap calls) and builds no tables, where the
    bulk path's sets those of many elements in a few ``BITFIELD`` calls. The hot path
    runs it only where it cannot do without (:mod:`.fastpath`): a shard that has grown
    or nears its growth, and filters with re-crawl windows.

    ``KEYS[1]``: the shard's key ``{KEY:<i>}:g0``; its other generations and windows
    are named after it, in the same Redis Cluster slot. ``ARGV``: the shard's
    identity; ``w`` (add) or ``r`` (check only); ``1`` to recreate a lost generation
    or window empty, ``0`` to report it; then four numbers per element: its seeds of
    generation 0 (x, y of the hashing scheme) and of later ones (see
    :func:`.generations.seed_arguments`).

    Reply: ``{0, flags, generations, answer...}``, one answer per element, 1 when it
    was (probably) there already, 0 when not (with ``w``, it is now); from the hot
    path's script, the answer alone when there is nothing else to report; or
    ``{MISMATCH, key}`` when ``key`` is missing or is not this filter's (nothing was
    written). An element is "there" when every one of its bits is set in some
    generation (of the window or the one before). Adds go to the newest generation,
    which is started first when the one before holds its capacity: decided here,
    atomically, so workers crossing the boundary together start it once.
    """
    gens = growth.generations
    ttl = growth.ttl
    # Items in the newest generation are counted where it may grow or is per window.
    counted = growth.expansion > 0 or ttl > 0
    table = {
        "M": ", ".join(str(gen.bits) for gen in gens),
        "K": ", ".join(str(gen.hash_count) for gen in gens),
        "C": ", ".join(str(gen.capacity) for gen in gens),
        "B": ", ".join(str(gen.span) for gen in gens),
        "W": ", ".join(str(gen.seed_range) for gen in gens),
    }
    # Where the shard's bits are: the shard itself, or its windows (anchor in KEYS[1]).
    if ttl:
        where = f"""
local anchor = redis.call('GETRANGE', KEYS[1], 0, {HEADER_BYTES - 1})
if string.sub(anchor, 1, {IDENTITY_BYTES}) ~= id then return {{{MISMATCH}, KEYS[1]}} end
local before, newest = u16(anchor), u32(anchor)
local w = math.floor(tonumber(redis.call('TIME')[1]) / {ttl})
local root = string.sub(KEYS[1], 1, -3)
expire = (w + 2) * {ttl}
local cur = {{base = root .. 'w' .. w .. ':g'}}
local prev = {{base = root .. 'w' .. (w - 1) .. ':g'}}
-- Which windows must exist: the newest one started, and the one before it if it did.
local need_cur = newest == w
local need_prev = newest == w - 1 or (newest == w and before == 1)
if not load(prev, need_prev, false) then return {{{MISMATCH}, bad}} end
if not load(cur, need_cur, write) then return {{{MISMATCH}, bad}} end
if write and newest ~= w then
  redis.call('SETRANGE', KEYS[1], {IDENTITY_BYTES}, pack(prev.G and 1 or 0, w))
end
local views = {{prev, cur}}"""
    else:
        where = f"""
local cur = {{base = string.sub(KEYS[1], 1, -2)}}
if not load(cur, true, false, true) then return {{{MISMATCH}, bad}} end
local views = {{cur}}"""
    body = _one() if one else _many()
    first = _first_generation(growth) if one and not ttl else ""
    return Script(f"""{first}
local id, write, recreate = ARGV[1], ARGV[2] == 'w', ARGV[3] == '1'
local M = {{{table["M"]}}}
local K = {{{table["K"]}}}
local C = {{{table["C"]}}}
local B = {{{table["B"]}}}
local W = {{{table["W"]}}}
local LAST = {len(gens)}
local COUNTED = {"true" if counted else "false"}
local H = {HEADER_BITS}
local expire = nil
local flags = 0
local bad = nil
-- A header's state after the identity: u16 then u32, big-endian (as BITFIELD reads them).
local function u16(head)
  local a, b = string.byte(head, {IDENTITY_BYTES + 1}, {IDENTITY_BYTES + 2})
  return (a or 0) * 256 + (b or 0)
end
local function u32(head)
  local a, b, c, d = string.byte(head, {IDENTITY_BYTES + 3}, {IDENTITY_BYTES + 6})
  return (((a or 0) * 256 + (b or 0)) * 256 + (c or 0)) * 256 + (d or 0)
end
local function pack(high, low)
  return string.char(math.floor(high / 256) % 256, high % 256, math.floor(low / 16777216) % 256,
    math.floor(low / 65536) % 256, math.floor(low / 256) % 256, low % 256)
end
-- Allocate generation g whole, with the header. Its first write is the SETRANGE, which
-- Redis refuses when out of memory: a DEL first would count as the script's first write
-- and let the allocation pass maxmemory. (A stale key is left only by a recreation.)
local function allocate(key, g)
  if redis.call('EXISTS', key) == 1 then redis.call('DEL', key) end
  redis.call('SETRANGE', key, {HEADER_BYTES} + math.ceil(M[g + 1] / 8) - 1, string.char(0))
  redis.call('SETRANGE', key, 0, id)
  if expire then redis.call('EXPIREAT', key, expire) end
end
-- Read a filter's header (a shard's, or a window's) and check its generations, each of
-- which must carry the id. ``needed``: a missing generation 0 is a loss (else: nothing
-- there yet); ``create``: start generation 0 when there is none; ``shard``: it is the
-- shard's own key, whose loss is always reported (the filter's recovery handles it).
local function load(view, needed, create, shard)
  local g0 = view.base .. '0'
  local head = redis.call('GETRANGE', g0, 0, {HEADER_BYTES - 1})
  if head == '' then
    if needed and (shard or not recreate) then bad = g0 return false end
    if needed then flags = bit.bor(flags, {RECREATED}) end
    if not create then return true end
    allocate(g0, 0)
    head = id
  elseif string.sub(head, 1, {IDENTITY_BYTES}) ~= id then bad = g0 return false end
  view.G, view.count, view.dirty = 1, 0, false
  if COUNTED then view.G, view.count = math.max(u16(head), 1), u32(head) end
  for g = 1, view.G - 1 do
    local key = view.base .. g
    local found = redis.call('GETRANGE', key, 0, {IDENTITY_BYTES - 1})
    if found == '' and recreate and write then
      allocate(key, g)
      flags = bit.bor(flags, {RECREATED})
    elseif found ~= id and not (found == '' and recreate) then bad = key return false end
  end
  return true
end
{where}
-- An element's seeds (ARGV from e) in generation g, by the hashing scheme: the first bit
-- of its block in the string, and x, y, z inside the block of b bits (unblocked, the block
-- is the generation, and z is 0). Its bits: x, then x = (x + y) % b, y = (y + i + z) % b.
local function seeds(g, e)
  local b, x, y = B[g + 1]
  if g == 0 then x, y = tonumber(ARGV[e]), tonumber(ARGV[e + 1])
  else x, y = tonumber(ARGV[e + 2]) % M[g + 1], tonumber(ARGV[e + 3]) % W[g + 1] end
  local start = x % b
  return H + x - start, start, y % b, math.floor(y / b), b
end
-- Whether every bit of an element (ARGV from e) is set in generation g of ``key``;
-- GETBIT stops at the first clear bit.
local function has(key, g, e)
  local base, x, y, z, b = seeds(g, e)
  if redis.call('GETBIT', key, base + x) == 0 then return false end
  for i = 1, K[g + 1] - 1 do
    x = (x + y) % b
    y = (y + i + z) % b
    if redis.call('GETBIT', key, base + x) == 0 then return false end
  end
  return true
end
{body}
""")


def _first_generation(growth: Growth) -> str:
    """Lua: the hot path of a growing shard that has one generation with room in it.

    Until a shard grows (and a filter within its capacity never does), a check is the
    fixed filter's: the identity and state in one ``GETRANGE``, k ``SETBIT``, and the
    count written back for a new element; none of the general path's tables or
    functions. Anything else falls through to the general path below.
    """
    first = growth.generation(0)
    return f"""
local head = redis.call('GETRANGE', KEYS[1], 0, {HEADER_BYTES - 1})
if ARGV[2] == 'w' and string.sub(head, 1, {IDENTITY_BYTES}) == ARGV[1] then
  local a, b, c1, c2, c3, c4 = string.byte(head, {IDENTITY_BYTES + 1}, {HEADER_BYTES})
  local count = ((c1 * 256 + c2) * 256 + c3) * 256 + c4
  if a * 256 + b <= 1 and count < {first.capacity} then
    local key, s = KEYS[1], {first.span}
    local x, y = tonumber(ARGV[4]), tonumber(ARGV[5])
    local start = x % s
    local base, z = {HEADER_BITS} + x - start, math.floor(y / s)
    x, y = start, y % s
    local all = redis.call('SETBIT', key, base + x, '1')
    for i = 1, {first.hash_count - 1} do
      x = (x + y) % s
      y = (y + i + z) % s
      if redis.call('SETBIT', key, base + x, '1') == 0 then all = 0 end
    end
    if all == 0 then
      count = count + 1
      redis.call('SETRANGE', key, {IDENTITY_BYTES}, string.char(0, 1,
        math.floor(count / 16777216) % 256, math.floor(count / 65536) % 256,
        math.floor(count / 256) % 256, count % 256))
    end
    return all
  end
end"""


def _many() -> str:
    """Lua: check (and add) the elements of a bulk call, in batches."""
    return f"""
-- Set the bits of elements (ARGV positions in ``batch``) in generation g, in BITFIELDs of
-- at most PER_BITFIELD elements; put whether all of each one's bits were set in ``seen``.
local PER_BITFIELD = math.floor(7000 / (4 * K[LAST]))
local function set(key, g, batch, seen)
  local k = K[g + 1]
  for first = 1, #batch, PER_BITFIELD do
    local last = math.min(first + PER_BITFIELD - 1, #batch)
    local args, n = {{}}, 0
    for b = first, last do
      local base, x, y, z, s = seeds(g, batch[b])
      args[n + 1], args[n + 2], args[n + 3], args[n + 4] = 'SET', 'u1', base + x, '1'
      n = n + 4
      for i = 1, k - 1 do
        x = (x + y) % s
        y = (y + i + z) % s
        args[n + 1], args[n + 2], args[n + 3], args[n + 4] = 'SET', 'u1', base + x, '1'
        n = n + 4
      end
    end
    local old = redis.call('BITFIELD', key, unpack(args))
    for b = first, last do
      local all = true
      for i = (b - first) * k + 1, (b - first + 1) * k do
        if old[i] == 0 then all = false break end
      end
      seen[batch[b]] = all
    end
  end
end
-- Whether an element is in the older generations (and the window before); with ``w``
-- the newest is left to ``set``, which answers for it.
local function found(e)
  for _, view in ipairs(views) do
    if view.G then
      local top = view.G - 1
      if write and view == cur then top = top - 1 end
      for g = top, 0, -1 do
        if has(view.base .. g, g, e) then return true end
      end
    end
  end
  return false
end
local reply = {{0, 0, 0}}
local e = 4
while e <= #ARGV do
  {_grow()}
  -- A batch the newest generation has room for, even if every element is new: the
  -- next one may start a generation, exactly as one element at a time would.
  local room = #ARGV
  if write and COUNTED and cur.count < C[cur.G] then room = C[cur.G] - cur.count end
  local seen, batch = {{}}, {{}}
  local stop = math.min(#ARGV, e + 4 * room - 1)
  for i = e, stop, 4 do
    seen[i] = found(i)
    if not seen[i] then batch[#batch + 1] = i end
  end
  if write and #batch > 0 then
    set(cur.base .. (cur.G - 1), cur.G - 1, batch, seen)
    for _, i in ipairs(batch) do
      if not seen[i] then cur.count, cur.dirty = cur.count + 1, true end
    end
  end
  for i = e, stop, 4 do reply[#reply + 1] = seen[i] and 1 or 0 end
  e = stop + 1
end
if cur.dirty and COUNTED then
  redis.call('SETRANGE', cur.base .. '0', {IDENTITY_BYTES},
    pack(cur.G, math.min(cur.count, 4294967295)))
end
reply[2], reply[3] = flags, cur.G or 0
return reply"""


def _one() -> str:
    """Lua: check (and add) the one element of a hot-path call."""
    return f"""
local e = 4
{_grow()}
local seen = false
for _, view in ipairs(views) do
  if view.G and not seen then
    local top = view.G - 1
    if write and view == cur then top = top - 1 end
    for g = top, 0, -1 do
      if has(view.base .. g, g, e) then seen = true break end
    end
  end
end
if not seen and write then
  local g = cur.G - 1
  local key = cur.base .. g
  local base, x, y, z, b = seeds(g, e)
  local all = redis.call('SETBIT', key, base + x, '1')
  for i = 1, K[g + 1] - 1 do
    x = (x + y) % b
    y = (y + i + z) % b
    if redis.call('SETBIT', key, base + x, '1') == 0 then all = 0 end
  end
  seen = all == 1
  if not seen then cur.count, cur.dirty = cur.count + 1, true end
end
if cur.dirty and COUNTED then
  redis.call('SETRANGE', cur.base .. '0', {IDENTITY_BYTES},
    pack(cur.G, math.min(cur.count, 4294967295)))
end
return {{0, flags, cur.G or 0, seen and 1 or 0}}"""


def _grow() -> str:
    """Lua: start the next generation when the newest is full (before writing to it)."""
    return f"""
if write and COUNTED and cur.count >= C[cur.G] then
  if cur.G < LAST then
    allocate(cur.base .. cur.G, cur.G)
    cur.G, cur.count, cur.dirty = cur.G + 1, 0, true
    flags = bit.bor(flags, {GREW})
  else
    flags = bit.bor(flags, {FULL})
  end
end"""


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
#: To clear the filter, ``claim`` counts the others and, if none is live (nor clearing),
#: adds the member ``(clearing)`` in the same step; ``hold`` renews the lease and the
#: claim; ``unclaim`` drops it. While it lives, ``renew`` replies -1 and takes no lease.
LEASE = Script("""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl, action, claim = tonumber(ARGV[2]), ARGV[3], '(clearing)'
if action == 'list' then
  local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
  for i = #live, 1, -1 do
    if live[i] == claim then table.remove(live, i) end
  end
  return live
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local clearing = redis.call('ZSCORE', KEYS[1], claim)
if action == 'renew' and clearing then return -1 end
if action == 'renew' or action == 'hold' then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  if redis.call('PTTL', KEYS[1]) < 2 * ttl then redis.call('PEXPIRE', KEYS[1], 2 * ttl) end
elseif action == 'release' then
  redis.call('ZREM', KEYS[1], ARGV[1])
end
local others = redis.call('ZCARD', KEYS[1])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then others = others - 1 end
if action == 'claim' then
  if others == 0 then
    redis.call('ZADD', KEYS[1], now + ttl, claim)
    if redis.call('PTTL', KEYS[1]) < 2 * ttl then redis.call('PEXPIRE', KEYS[1], 2 * ttl) end
  end
  return others
end
if action == 'hold' and clearing then redis.call('ZADD', KEYS[1], now + ttl, claim) end
if action == 'unclaim' then redis.call('ZREM', KEYS[1], claim) end
if clearing then others = others - 1 end
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

#: Clear bits a scriptless check set in a shard that turned out not to be its filter's
#: (see :meth:`.fastpath.FastPath.strays`), while the shard still carries the id the
#: check found. ``KEYS[1]`` the shard; ``ARGV[1]`` the 8 bytes of the header at byte 4
#: it found; the other ``ARGV`` the bit offsets to clear.
TAKE_BACK = Script("""
if redis.call('GETRANGE', KEYS[1], 4, 11) ~= ARGV[1] then return 0 end
for i = 2, #ARGV do redis.call('SETBIT', KEYS[1], ARGV[i], 0) end
return 1
""")
