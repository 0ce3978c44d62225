-- Read what a bulk batch needs of a blocked shard (bitmap/snapshot.take): its
-- length, and its header followed by the runs of blocks its elements touch, in one string.
-- KEYS[1] the shard; ARGV[1] the runs, each two big-endian u32: first block, blocks.
local key, runs = KEYS[1], ARGV[1]
local out = {redis.call('GETRANGE', key, 0, HEADER_BYTES - 1)}
for at = 1, #runs, 8 do
    local first, count = struct.unpack('>I4>I4', runs, at)
    local start = HEADER_BYTES + first * BLOCK_BYTES
    out[#out + 1] = redis.call('GETRANGE', key, start, start + count * BLOCK_BYTES - 1)
end
return {redis.call('STRLEN', key), table.concat(out)}
