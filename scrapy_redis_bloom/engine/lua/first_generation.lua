-- The hot path of a growing shard that has one generation with room in it. Until a shard
-- grows (and a filter within its capacity never does), a check is the fixed filter's:
-- the identity and state in one GETRANGE, k SETBIT, and the count written back for a new
-- element; none of the general path's tables or functions. Anything else falls through
-- to the general path (check_and_add.lua). FIRST_AT: a table of FIRST_K slots for the
-- offsets, made at its size.
local head = redis.call('GETRANGE', KEYS[1], 0, HEADER_BYTES - 1)
if ARGV[2] == 'w' and string.sub(head, 1, IDENTITY_BYTES) == ARGV[1] then
  local a, b, c1, c2, c3, c4 = string.byte(head, IDENTITY_BYTES + 1, HEADER_BYTES)
  local count = ((c1 * 256 + c2) * 256 + c3) * 256 + c4
  if a * 256 + b <= 1 and count < FIRST_CAPACITY then
    local key = KEYS[1]
    offsets(tonumber(ARGV[4]), tonumber(ARGV[5]), FIRST_K, FIRST_SPAN, H, FIRST_AT)
    local all = 1
    for i = 1, FIRST_K do
      if redis.call('SETBIT', key, FIRST_AT[i], '1') == 0 then
        all = 0
      end
    end
    if all == 0 then
      count = count + 1
      redis.call('SETRANGE', key, IDENTITY_BYTES, string.char(0, 1,
        math.floor(count / 16777216) % 256, math.floor(count / 65536) % 256,
        math.floor(count / 256) % 256, count % 256))
    end
    return all
  end
end
