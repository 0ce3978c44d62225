-- Check (and add) items in a native shard's live windows (windows.lua), a RedisBloom
-- filter each. KEYS, ARGV and reply: see engine/native/ttl.py, CHECK.
local anchor = KEYS[1]
local state = redis.call('GET', anchor)
if not state then return {ANCHOR_LOST} end
local newest, before = string.match(state, '^(-?%d+) ([01])$')
if not newest then return {FOREIGN} end
local w, need_prev, need_cur, moves, expire =
  window_plan(tonumber(ARGV[1]), tonumber(newest), tonumber(before))
local cur, prev = anchor .. ':w' .. w, anchor .. ':w' .. (w - 1)
-- A live window of another type is refused, never overwritten: BF.MEXISTS answers 0 there,
-- "new" for every URL it held.
local kinds = {}
for _, key in ipairs({prev, cur}) do
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'none' and kind ~= NATIVE_TYPE then return {WRONG_WINDOW, key, kind} end
  kinds[key] = kind
end
local flags = 0
local has_prev = kinds[prev] == NATIVE_TYPE
if not has_prev and need_prev then
  if ARGV[5] ~= '1' then return {WINDOW_LOST, prev} end
  flags = RECREATED
end
local has_cur = kinds[cur] == NATIVE_TYPE
if not has_cur and need_cur then
  if ARGV[5] ~= '1' then return {WINDOW_LOST, cur} end
  flags = RECREATED
end
local write = ARGV[6] == 'w'
if write and not has_cur then
  if ARGV[4] == '0' then
    redis.call('BF.RESERVE', cur, ARGV[2], ARGV[3], 'NONSCALING')
  else
    redis.call('BF.RESERVE', cur, ARGV[2], ARGV[3], 'EXPANSION', ARGV[4])
  end
  redis.call('EXPIREAT', cur, expire)
  has_cur = true
end
if write and moves then redis.call('SET', anchor, w .. ' ' .. (has_prev and 1 or 0)) end
local before_hits = has_prev and redis.call('BF.MEXISTS', prev, unpack(ARGV, 7)) or nil
local now_hits = nil
if write then
  -- Only what the window before lacks: an item seen again is not renewed (forgotten by 2T).
  local fresh, at = {}, {}
  for i = 7, #ARGV do
    if before_hits == nil or before_hits[i - 6] ~= 1 then
      fresh[#fresh + 1] = ARGV[i]
      at[#at + 1] = i - 6
    end
  end
  now_hits = {}
  if #fresh > 0 then
    local added = redis.call('BF.INSERT', cur, 'NOCREATE', 'ITEMS', unpack(fresh))
    for j = 1, #fresh do now_hits[at[j]] = added[j] end
  end
elseif has_cur then
  now_hits = redis.call('BF.MEXISTS', cur, unpack(ARGV, 7))
end
local out = {flags}
for i = 1, #ARGV - 6 do
  local seen = before_hits ~= nil and before_hits[i] == 1
  if now_hits ~= nil then
    if write then seen = seen or now_hits[i] == 0 else seen = seen or now_hits[i] == 1 end
  end
  out[i + 1] = seen and 1 or 0
end
return out
