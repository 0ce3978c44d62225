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
-- Allocate generation g of a view whole, with the header (false, ``bad`` set: a foreign
-- key is there), expiring with the view's window. Its first write is the SETRANGE, which
-- Redis refuses when out of memory: a DEL first would count as the script's first write
-- and let the allocation pass maxmemory. (A stale key is left only by a recreation.)
local function allocate(view, g)
  local key = view.base .. g
  local free, exists = takeable(key)
  if not free then return false end
  if exists then redis.call('DEL', key) end
  redis.call('SETRANGE', key, HEADER_BYTES + math.ceil(M[g + 1] / 8) - 1, string.char(0))
  redis.call('SETRANGE', key, 0, id)
  if view.expire then redis.call('EXPIREAT', key, view.expire) end
  return true
end
-- What a lost generation 0 leaves of a window's growth: its header counted the generations,
-- each later one a key of its own. The newest of them still carrying the id gives their
-- number (one more when it is sealed: the one after it was lost too) and, with
-- ``counting``, its items again from its bits, as core/generations.py's
-- Generation.recount. Returns the generations and the newest one's items (1, 0: none).
local function kept(base, counting)
  for g = LAST - 1, 1, -1 do
    local head = redis.call('GETRANGE', base .. g, 0, HEADER_BYTES - 1)
    if string.sub(head, 1, IDENTITY_BYTES) == id then
      if u16(head) ~= 0 then return math.min(g + 2, LAST), 0 end
      if not counting then return g + 1, 0 end
      local m = M[g + 1]
      local ones = math.min(redis.call('BITCOUNT', base .. g, HEADER_BYTES, -1), m - 1)
      local n = -m / D[g + 1] * math.log(1 - ones / m)
      return g + 1, math.min(C[g + 1], math.ceil(n + 4 * math.sqrt(n / K[g + 1])))
    end
  end
  return 1, 0
end
-- Read a filter's header (a shard's, or a window's) and check its generations, each of
-- which must carry the id. ``needed``: a missing generation 0 is a loss (else: nothing
-- there yet, unless later generations are); ``create``: start generation 0 when there is
-- none, keeping the later generations a lost one leaves (not created, they are read
-- without it: ``low``); ``shard``: it is the shard's own key, whose loss is always
-- reported (the filter's recovery handles it).
local function load(view, needed, create, shard)
  local g0 = view.base .. '0'
  local head = redis.call('GETRANGE', g0, 0, HEADER_BYTES - 1)
  view.low = 0
  if unnamed(head) then
    if needed and (shard or not recreate) then bad = g0 return false end
    local G, count = 1, 0
    if COUNTED and (needed or create) then
      G, count = kept(view.base, create)
      -- A window its anchor does not show (an anchor lost too) is new only if it has nothing.
      if G > 1 and not recreate then bad = g0 return false end
    end
    if needed or G > 1 then flags = bit.bor(flags, RECREATED) end
    if create then
      if not allocate(view, 0) then return false end
      if G > 1 then
        redis.call('SETRANGE', g0, IDENTITY_BYTES, pack(G, count))
        local shift = view == prev and KEPT_SHIFT + 4 or KEPT_SHIFT
        flags = bit.bor(flags, bit.lshift(G - 1, shift))
      end
    elseif G == 1 then
      return true
    else
      view.low = 1
    end
    head = id .. pack(G, count)
  elseif string.sub(head, 1, IDENTITY_BYTES) ~= id then bad = g0 return false end
  view.G, view.count, view.dirty = 1, 0, false
  if COUNTED then view.G, view.count = math.max(u16(head), 1), u32(head) end
  for g = 1, view.G - 1 do
    local key = view.base .. g
    local found = redis.call('GETRANGE', key, 0, IDENTITY_BYTES - 1)
    local lost = unnamed(found)
    if lost and recreate and write then
      if not allocate(view, g) then return false end
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
