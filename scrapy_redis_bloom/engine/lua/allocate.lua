-- Allocate a shard whole, at its exact size, with its header: a string grown bit by bit
-- through SETBIT or BITFIELD gets Redis's greedy preallocation instead (up to twice the
-- size). KEYS[1] the shard; ARGV its header, its last byte's index, and ``create`` or
-- ``replace`` (delete whatever is there first). Reply: 0 if the shard is there with this
-- identity, 1 if this call allocated it, -1 if the key holds something else (``create``
-- leaves it alone).
local key = KEYS[1]
if redis.call('GETRANGE', key, 0, IDENTITY_BYTES - 1) == string.sub(ARGV[1], 1, IDENTITY_BYTES)
then return 0 end
if redis.call('EXISTS', key) == 1 then
  if ARGV[3] ~= 'replace' then return -1 end
  redis.call('DEL', key)
end
redis.call('SETRANGE', key, ARGV[2], string.char(0))
redis.call('SETRANGE', key, 0, ARGV[1])
return 1
