-- Read what a bulk batch needs of a blocked shard (bitmap/snapshot.take): its length, its
-- header, then the runs of blocks its elements touch, one string each (returned as they
-- are: concatenating them here costs Redis more than a client with hiredis pays to join
-- them), or with ARGV[2] = '1' the header and the runs in one string (a client without
-- hiredis parses each string of a reply in Python: one is cheaper).
-- KEYS[1] the shard; ARGV[1] the runs, each two big-endian u32: first block, blocks.
local key, runs = KEYS[1], ARGV[1]
local out = {redis.call('STRLEN', key), redis.call('GETRANGE', key, 0, HEADER_BYTES - 1)}
local n = 2
for at = 1, #runs, 8 do
    local first, count = struct.unpack('>I4>I4', runs, at)
    local start = HEADER_BYTES + first * BLOCK_BYTES
    n = n + 1
    out[n] = redis.call('GETRANGE', key, start, start + count * BLOCK_BYTES - 1)
end
if ARGV[2] == '1' then
    return {out[1], table.concat(out, '', 2)}
end
return out
