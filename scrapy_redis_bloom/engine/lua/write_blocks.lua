-- Write back the blocks a bulk batch changed in a blocked shard (bitmap/snapshot.take),
-- queued in the MULTI of the WATCH that read them. KEYS[1] the shard; ARGV[1] the runs,
-- each two big-endian u32: first block, blocks; ARGV[2] their bytes, run after run.
local key, runs, bytes = KEYS[1], ARGV[1], ARGV[2]
local from = 1
for at = 1, #runs, 8 do
    local first, count = struct.unpack('>I4>I4', runs, at)
    local size = count * BLOCK_BYTES
    redis.call('SETRANGE', key, HEADER_BYTES + first * BLOCK_BYTES, string.sub(bytes, from, from + size - 1))
    from = from + size
end
return #runs / 8
