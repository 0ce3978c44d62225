-- The worker registry: a sorted set of worker ids scored by lease expiry (ms, server
-- clock). KEYS[1] the registry; ARGV worker id, TTL in ms, and the action: renew,
-- release, count, list, claim, hold or unclaim (see engine/scripts.py, LEASE).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl, action, claim = tonumber(ARGV[2]), ARGV[3], '(clearing)'
if action == 'list' then
  local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
  for i = #live, 1, -1 do
    if live[i] == claim then table.remove(live, i) end
  end
  return live
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local clearing = redis.call('ZSCORE', KEYS[1], claim)
if action == 'renew' and clearing then return -1 end
if action == 'renew' or action == 'hold' then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  if redis.call('PTTL', KEYS[1]) < 2 * ttl then redis.call('PEXPIRE', KEYS[1], 2 * ttl) end
elseif action == 'release' then
  redis.call('ZREM', KEYS[1], ARGV[1])
end
local others = redis.call('ZCARD', KEYS[1])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then others = others - 1 end
if action == 'claim' then
  if others == 0 then
    redis.call('ZADD', KEYS[1], now + ttl, claim)
    if redis.call('PTTL', KEYS[1]) < 2 * ttl then redis.call('PEXPIRE', KEYS[1], 2 * ttl) end
  end
  return others
end
if action == 'hold' and clearing then redis.call('ZADD', KEYS[1], now + ttl, claim) end
if action == 'unclaim' then redis.call('ZREM', KEYS[1], claim) end
if clearing then others = others - 1 end
return others
