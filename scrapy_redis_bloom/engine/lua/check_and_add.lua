-- Check (and add) elements of one shard: what the hot path's script (one.lua) and the
-- bulk path's (many.lua) share. Before it, scripts.py declares the geometry (per
-- generation g + 1: M bits, K hash functions, C capacity, B span, W seed range; LAST
-- generations, COUNTED) and the layout's constants; after it, where the shard's bits
-- are (shard.lua, or windows.lua and bitmap_windows.lua), then the body.
local id, write, recreate = ARGV[1], ARGV[2] == 'w', ARGV[3] == '1'
local expire = nil
local flags = 0
local bad = nil
-- The views of the shard's bits a check consults: the newest (``cur``, where adds go),
-- and with re-crawl windows the window before it (``prev``).
local cur, prev, views = nil, nil, nil
-- A header's state after the identity: u16 then u32, big-endian (as BITFIELD reads them).
local function u16(head)
  local a, b = string.byte(head, IDENTITY_BYTES + 1, IDENTITY_BYTES + 2)
  return (a or 0) * 256 + (b or 0)
end
local function u32(head)
  local a, b, c, d = string.byte(head, IDENTITY_BYTES + 3, IDENTITY_BYTES + 6)
  return (((a or 0) * 256 + (b or 0)) * 256 + (c or 0)) * 256 + (d or 0)
end
local function pack(high, low)
  return string.char(math.floor(high / 256) % 256, high % 256, math.floor(low / 16777216) % 256,
    math.floor(low / 65536) % 256, math.floor(low / 256) % 256, low % 256)
end
-- A key's first bytes with no identity: missing, or a bitmap a scriptless add or count
-- (engine/bitmap/stackpath.py) wrote where the key was lost or not started yet, and as
-- good as missing: its bits were answered for by this script, and allocate() replaces it.
local function unnamed(found)
  return not string.find(string.sub(found, 1, IDENTITY_BYTES), '[^%z]')
end
-- Whether a generation's key may be taken: missing, or a string left by a filter (a header,
-- of a recreated shard's earlier life or of another filter's) or unnamed. Anything else is
-- another program's and is never overwritten (``bad`` names it). Also whether it exists.
local function takeable(key)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'none' then return true, false end
  if kind == 'string' then
    local found = redis.call('GETRANGE', key, 0, IDENTITY_BYTES - 1)
    if unnamed(found) or string.sub(found, 1, 3) == 'SRB' then return true, true end
  end
  bad = key
  return false, true
end
-- Allocate generation g whole, with the header (false, ``bad`` set: a foreign key is there).
-- Its first write is the SETRANGE, which Redis refuses when out of memory: a DEL first
-- would count as the script's first write and let the allocation pass maxmemory. (A stale
-- key is left only by a recreation.)
local function allocate(key, g)
  local free, exists = takeable(key)
  if not free then return false end
  if exists then redis.call('DEL', key) end
  redis.call('SETRANGE', key, HEADER_BYTES + math.ceil(M[g + 1] / 8) - 1, string.char(0))
  redis.call('SETRANGE', key, 0, id)
  if expire then redis.call('EXPIREAT', key, expire) end
  return true
end
-- Read a filter's header (a shard's, or a window's) and check its generations, each of
-- which must carry the id. ``needed``: a missing generation 0 is a loss (else: nothing
-- there yet); ``create``: start generation 0 when there is none; ``shard``: it is the
-- shard's own key, whose loss is always reported (the filter's recovery handles it).
local function load(view, needed, create, shard)
  local g0 = view.base .. '0'
  local head = redis.call('GETRANGE', g0, 0, HEADER_BYTES - 1)
  if unnamed(head) then
    if needed and (shard or not recreate) then bad = g0 return false end
    if needed then flags = bit.bor(flags, RECREATED) end
    if not create then return true end
    if not allocate(g0, 0) then return false end
    head = id
  elseif string.sub(head, 1, IDENTITY_BYTES) ~= id then bad = g0 return false end
  view.G, view.count, view.dirty = 1, 0, false
  if COUNTED then view.G, view.count = math.max(u16(head), 1), u32(head) end
  for g = 1, view.G - 1 do
    local key = view.base .. g
    local found = redis.call('GETRANGE', key, 0, IDENTITY_BYTES - 1)
    local lost = unnamed(found)
    if lost and recreate and write then
      if not allocate(key, g) then return false end
      flags = bit.bor(flags, RECREATED)
    elseif found ~= id and not (lost and recreate) then bad = key return false end
  end
  return true
end
-- The seeds of the element at ARGV[e] .. ARGV[e + 3] in generation g: those of generation
-- 0 as sent; a later generation's, the wide seeds reduced by its number of bits and its
-- seed range (see core/generations.py, seed_arguments). Its bits: offsets() (scheme.lua)
-- with generation g's k, span B and the header's H bits first.
local function seeds(g, e)
  if g == 0 then
    return tonumber(ARGV[e]), tonumber(ARGV[e + 1])
  end
  return tonumber(ARGV[e + 2]) % M[g + 1], tonumber(ARGV[e + 3]) % W[g + 1]
end
-- Whether every bit of an element (ARGV from e) is set in generation g of ``key``; GETBIT
-- stops at the first clear bit. Most elements that are not there stop at their first, so
-- the other offsets are computed only past it. ``at`` is declared with as many slots as
-- the most hash functions of a generation.
local function has(key, g, e)
  local x, y = seeds(g, e)
  offsets(x, y, 1, B[g + 1], H, at)
  if redis.call('GETBIT', key, at[1]) == 0 then return false end
  local k = K[g + 1]
  offsets(x, y, k, B[g + 1], H, at)
  for i = 2, k do
    if redis.call('GETBIT', key, at[i]) == 0 then return false end
  end
  return true
end
