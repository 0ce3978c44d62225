-- The worker registry: a sorted set of worker ids scored by lease expiry (ms, server
-- clock). KEYS[1] the registry; ARGV worker id, TTL in ms, and the action: renew,
-- release, count, list, claim, hold or unclaim (see engine/scripts.py, LEASE).
-- A claim to clear is the member '(clearing)' .. its worker's id: a claim sent again
-- (its reply lost) finds its own and not another worker. The key has no expiry: an
-- expiry made it the first victim of a volatile-* policy, which then forgot live workers.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl, action, prefix = tonumber(ARGV[2]), ARGV[3], '(clearing)'
local mine = prefix .. ARGV[1]
local function is_claim(member) return string.sub(member, 1, #prefix) == prefix end
if action == 'list' then
  local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
  for i = #live, 1, -1 do
    if is_claim(live[i]) then table.remove(live, i) end
  end
  return live
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
-- Live workers other than this one, and whether another worker's claim is live.
local function others()
  local count, foreign = 0, false
  for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    if is_claim(member) then
      if member ~= mine then foreign = true end
    elseif member ~= ARGV[1] then
      count = count + 1
    end
  end
  return count, foreign
end
local count, foreign = others()
if action == 'renew' and foreign then return -1 end
if action == 'renew' or action == 'hold' then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  if action == 'hold' and redis.call('ZSCORE', KEYS[1], mine) then
    redis.call('ZADD', KEYS[1], now + ttl, mine)
  end
elseif action == 'release' then
  redis.call('ZREM', KEYS[1], ARGV[1])
elseif action == 'unclaim' then
  redis.call('ZREM', KEYS[1], mine)
elseif action == 'claim' then
  if foreign then return count + 1 end
  if count == 0 then redis.call('ZADD', KEYS[1], now + ttl, mine) end
end
return count
