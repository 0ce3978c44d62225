-- Where the shard's bits are, with re-crawl windows (windows.lua): in the windows'
-- generations {KEY:<i>}:w<w>:g<g>. The shard's key KEYS[1] is then their anchor, a header
-- alone whose state holds whether the window before the newest existed then (u16) and
-- the newest window started (u32).
local anchor = redis.call('GETRANGE', KEYS[1], 0, HEADER_BYTES - 1)
if string.sub(anchor, 1, IDENTITY_BYTES) ~= id then return {MISMATCH, KEYS[1]} end
local w, need_prev, need_cur, moves
w, need_prev, need_cur, moves, expire = window_plan(TTL, u32(anchor), u16(anchor))
local root = string.sub(KEYS[1], 1, -3)
cur = {base = root .. 'w' .. w .. ':g', expire = expire}
prev = {base = root .. 'w' .. (w - 1) .. ':g', expire = expire - TTL}
-- The window before is never started here, only recreated where lost.
if not load(prev, need_prev, write and need_prev) then return {MISMATCH, bad} end
if not load(cur, need_cur, write) then return {MISMATCH, bad} end
if write and moves then
  redis.call('SETRANGE', KEYS[1], IDENTITY_BYTES, pack(prev.G and 1 or 0, w))
end
views = {prev, cur}
